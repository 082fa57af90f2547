"""Tools and tool turns into chat messages: Forge's generic format (the default model's) and a template's own
(Hermes), and how a model's format is chosen."""

from __future__ import annotations

import json

from engine.chat_template import render_chat
from engine.tool_calls import GENERIC, HERMES, LLAMA3_JSON, Tool
from engine.tool_render import format_for, prepare

TOOL = Tool("get_weather", json.dumps({"type": "object", "properties": {"city": {"type": "string"}}}), "Weather now")
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
TURNS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            CALL,
            {**CALL, "id": "call_2", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "21C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "25C"},
]
# A cut-down Qwen2.5 template: tools in the system turn, calls as <tool_call> blocks, results as tool_response.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n{% elif m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}"
    "<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}\n"
    "</tool_call>{% endfor %}<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
)


def test_generic_lists_the_tools_in_the_system_message_and_renders_the_turns():
    messages, extra = prepare(GENERIC, TURNS, [TOOL])
    assert extra == {}
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    system = messages[0]["content"]
    assert system.startswith("Be brief.\n\n") and '"name": "get_weather"' in system and "<tool_call>" in system
    assert messages[2]["content"] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
    )
    assert messages[3]["content"] == "<tool_response>\n21C\n</tool_response>\n<tool_response>\n25C\n</tool_response>"
    assert all(isinstance(m["content"], str) for m in messages)


def test_generic_without_tools_keeps_the_history_and_adds_no_system_prompt():
    messages, _ = prepare(GENERIC, TURNS[1:], None)
    assert messages[0] == {"role": "user", "content": "Weather in Paris and Rome?"}
    assert "<tool_call>" in messages[1]["content"]


def test_hermes_hands_tools_and_calls_to_the_template():
    messages, extra = prepare(HERMES, TURNS, [TOOL])
    text = render_chat(HERMES_TEMPLATE, messages, add_generation_prompt=False, **extra)
    assert '{"type": "function", "function": {"name": "get_weather", "description": "Weather now"' in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>' in text
    assert "<tool_response>\n25C\n</tool_response>" in text


# A cut-down Llama 3.1 template: one call a turn as bare JSON with "parameters", results as ipython turns.
LLAMA3_TEMPLATE = (
    "{% for m in messages %}{% if m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}"
    "<|eot_id|>{% elif 'tool_calls' in m %}{% set tool_call = m.tool_calls[0].function %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{{ '{\"name\": \"' + tool_call.name + '\", ' }}"
    "{{ '\"parameters\": ' }}{{ tool_call.arguments | tojson }}}<|eot_id|>{% else %}"
    "<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endif %}{% endfor %}"
    "{% if tools %}{% for t in tools %}{{ t | tojson }}{% endfor %}{% endif %}"
)


def test_llama3_renders_its_own_calls_as_the_grammar_writes_them():
    assert format_for(LLAMA3_TEMPLATE, lambda s: True) is LLAMA3_JSON
    messages, extra = prepare(LLAMA3_JSON, [TURNS[1], {**TURNS[2], "tool_calls": [CALL]}, TURNS[3]], [TOOL])
    text = render_chat(LLAMA3_TEMPLATE, messages, add_generation_prompt=False, **extra)
    assert LLAMA3_JSON.render_call("get_weather", '{"city": "Paris"}') + "<|eot_id|>" in text
    assert "ipython<|end_header_id|>\n\n21C" in text and '"name": "get_weather", "description"' in text


def test_a_format_is_chosen_per_template():
    assert format_for(None, lambda s: True) is GENERIC
    assert format_for("{{ messages }}", lambda s: True) is GENERIC
    assert format_for(HERMES_TEMPLATE, lambda s: True) is HERMES
    assert format_for(HERMES_TEMPLATE, lambda s: False) is GENERIC  # a marker that is a special token
