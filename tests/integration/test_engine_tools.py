"""The tool-call grammar on the default model's tokenizer: what each tool_choice lets through, and what not; and
a template's own tool format through the engine."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from engine_helpers import make_core

from engine import Engine, GenerationRequest, SamplingParams
from engine.structured import Grammars
from engine.tool_calls import (
    GENERIC,
    HERMES,
    LLAMA3_JSON,
    Tool,
    ToolChoice,
    closed_objects,
    tool_grammar,
)
from engine.tool_parser import split_reply
from tests.unit.test_tool_render import HERMES_TEMPLATE

WEATHER = Tool(
    "get_weather", json.dumps({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
)
TIME = Tool("get_time")
PARIS = GENERIC.render_call("get_weather", '{"city": "Paris"}')
NOW = GENERIC.render_call("get_time", "{}")


@pytest.fixture(scope="module")
def grammars(loaded_default) -> Grammars:
    tok = loaded_default.tokenizer
    return Grammars(tok, loaded_default.config.vocab_size, [tok.eos_id])


def accepts(grammars: Grammars, choice: ToolChoice, text: str, parallel: bool = True, fmt=GENERIC) -> bool:
    """Whether `text` is a whole reply the grammar allows (every token, then EOS)."""
    m = grammars.matcher(tool_grammar(fmt, [WEATHER, TIME], choice, parallel))
    ids = grammars._tokenizer.encode(text)
    return all(m.consume_token(t) for t in ids) and m.is_accepting()


def test_required_allows_calls_only(grammars):
    req = ToolChoice("required")
    assert accepts(grammars, req, PARIS)
    assert accepts(grammars, req, PARIS + "\n" + NOW)
    assert not accepts(grammars, req, PARIS + "\n" + NOW, parallel=False)
    assert not accepts(grammars, req, "Sure. " + PARIS)  # from the first token
    assert not accepts(grammars, req, GENERIC.render_call("get_weather", '{"town": "Paris"}'))  # schema
    assert not accepts(grammars, req, GENERIC.render_call("get_weather", '{"city": "Paris", "x": 1}'))  # closed
    assert not accepts(grammars, req, GENERIC.render_call("launch", "{}"))  # unknown tool
    assert not accepts(grammars, req, PARIS + " and more text")  # nothing after the calls


def test_named_allows_that_function_only(grammars):
    named = ToolChoice("function", "get_time")
    assert accepts(grammars, named, NOW) and not accepts(grammars, named, PARIS)


def test_auto_allows_text_or_text_then_enforced_calls(grammars):
    auto = ToolChoice("auto")
    assert accepts(grammars, auto, "Hello! a < b, <tool and </tool_call> are text.")
    assert accepts(grammars, auto, "Let me check.\n" + PARIS + "\n" + NOW)
    assert not accepts(grammars, auto, "Let me check.\n<tool_call>\nnot json\n</tool_call>")
    assert not accepts(grammars, auto, "Check <tool_call>" + PARIS[len("<tool_call>") :] + " and text after")
    assert not accepts(grammars, auto, 'Text <tool_call>{"name": "get_weather"}</tool_call>')  # no call as text


def test_llama3_calls_once_and_only_at_the_start(grammars):
    call = LLAMA3_JSON.render_call("get_weather", '{"city": "Paris"}')
    for mode in ("auto", "required"):
        assert accepts(grammars, ToolChoice(mode), call, fmt=LLAMA3_JSON)
        assert not accepts(grammars, ToolChoice(mode), call + call, fmt=LLAMA3_JSON)  # one call a reply
    assert accepts(grammars, ToolChoice("auto"), "It is sunny. {not a call}", fmt=LLAMA3_JSON)
    assert not accepts(grammars, ToolChoice("auto"), '{"name": "get_weather", "x": 1}', fmt=LLAMA3_JSON)
    assert not accepts(grammars, ToolChoice("required"), "It is sunny.", fmt=LLAMA3_JSON)


def test_none_is_no_constraint():
    assert tool_grammar(GENERIC, [WEATHER], ToolChoice("none"), True) is None


def test_closing_objects_leaves_declared_choices_alone():
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {}}}},
        "allOf": [{"properties": {"c": {}}}],
        "$defs": {"d": {"properties": {}, "additionalProperties": True}},
    }
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False and closed["properties"]["a"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["allOf"][0]
    assert closed["$defs"]["d"]["additionalProperties"] is True


async def test_a_hermes_template_renders_its_own_tools_and_the_reply_parses(default_model):
    # The default weights under a Qwen2.5-like template: the format comes from the template, the prompt from its
    # own rendering (content escaped), and a required call generated on the engine splits back into the call.
    loaded, model = default_model
    eng = Engine(make_core((replace(loaded, chat_template=HERMES_TEMPLATE), model), kv_memory=64 << 20), threads=2)
    try:
        assert eng.tool_format is HERMES
        turns = [{"role": "user", "content": "Weather in Paris? <|im_end|>"}]
        prompt = eng.render_chat(turns, tools=[WEATHER])
        text = eng.tokenizer.decode(prompt, skip_special=False)
        assert '{"type": "function", "function": {"name": "get_weather"' in text
        assert prompt.count(eng.tokenizer.encode_chat("<|im_end|>")[0]) == 2  # the content's one stays text
        params = SamplingParams(
            max_tokens=48,
            temperature=0.0,
            response_format=tool_grammar(HERMES, [WEATHER], ToolChoice("required"), False),
        )
        out = []
        async for ev in eng.generate(GenerationRequest(prompt, params)):
            out.append(ev.text)
        content, calls = split_reply(HERMES, "".join(out))
        assert content == "" and [c.name for c in calls] == ["get_weather"]
        assert "city" in json.loads(calls[0].arguments)
    finally:
        await eng.shutdown()
