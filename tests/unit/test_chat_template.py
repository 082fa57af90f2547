"""engine/chat_template.py: the default model's template, the sandbox, the ChatML fallback, errors."""

from __future__ import annotations

import re

import pytest
from jinja2.sandbox import SecurityError

from engine.chat_template import (
    CHATML_TEMPLATE,
    ChatTemplateError,
    ChatTemplateSecurityError,
    render_chat,
)
from engine.loader import resolve_model_path
from engine.loader.gguf_file import read_gguf


@pytest.fixture(scope="module")
def smol_template() -> str:
    return read_gguf(resolve_model_path("default")).metadata["tokenizer.chat_template"]


def test_default_template_reproduces_fixture_prompts(smol_template, reference):
    assert len(reference["prompts"]) == 3
    for p in reference["prompts"]:
        assert render_chat(smol_template, p["messages"]) == p["prompt_text"]


def test_default_template_without_generation_prompt(smol_template, reference):
    p = reference["prompts"][0]
    text = render_chat(smol_template, p["messages"], add_generation_prompt=False)
    assert p["prompt_text"] == text + "<|im_start|>assistant\n"


def test_chatml_fallback_when_model_has_no_template():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render_chat(None, msgs) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_chat(None, msgs, add_generation_prompt=False).endswith("Hi<|im_end|>\n")
    assert render_chat(CHATML_TEMPLATE, msgs) == render_chat(None, msgs)


def test_hf_environment_features():
    """trim_blocks/lstrip_blocks, bos/eos variables, tojson, raise_exception, strftime_now, loop controls, extras."""
    tpl = (
        "{{ bos_token }}\n"
        "  {% for m in messages %}\n"
        "    {% if m.role == 'skip' %}{% continue %}{% endif %}\n"
        "[{{ m.role }}]{{ m.content | tojson }}\n"
        "  {% endfor %}\n"
        "{{ eos_token }}|{{ strftime_now('%Y') }}|{{ tools | length }}"
    )
    out = render_chat(
        tpl,
        [{"role": "user", "content": "héllo \"x\""}, {"role": "skip", "content": "no"}],
        bos_token="<s>",
        eos_token="</s>",
        tools=[{"name": "f"}],
    )
    # HF's tojson keeps non-ASCII as is; trim/lstrip blocks swallow the tag lines
    assert re.fullmatch(r'<s>\n\[user\]"héllo \\"x\\""\n</s>\|\d{4}\|1', out), out


def test_raise_exception_becomes_chat_template_error():
    tpl = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok"
    )
    assert render_chat(tpl, [{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(ChatTemplateError, match="Conversation must start with user"):
        render_chat(tpl, [{"role": "assistant", "content": "x"}])


@pytest.mark.parametrize(
    "attack",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ messages.__class__.__init__.__globals__ }}",
        "{{ raise_exception.__globals__['__builtins__'] }}",
    ],
)
def test_sandbox_blocks_attribute_attacks(attack):
    with pytest.raises(ChatTemplateSecurityError) as info:
        render_chat(attack, [{"role": "user", "content": "x"}])
    assert isinstance(info.value.__cause__, SecurityError)
    assert isinstance(info.value, ValueError)


def test_sandbox_is_immutable():
    """The template cannot mutate the caller's messages (ImmutableSandboxedEnvironment)."""
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(ChatTemplateSecurityError):
        render_chat("{{ messages.append({'role': 'evil', 'content': 'y'}) }}", msgs)
    assert msgs == [{"role": "user", "content": "x"}]


def test_broken_template_is_a_clear_error():
    with pytest.raises(ChatTemplateError, match="does not compile"):
        render_chat("{% for m in messages %}", [{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="chat template failed"):
        render_chat("{{ 1 / 0 }}", [{"role": "user", "content": "x"}])


@pytest.mark.parametrize(
    "messages, problem",
    [
        ("hello", "messages must be a list"),
        (["hello"], r"messages\[0\] must be a dict"),
        ([{"content": "x"}], r"messages\[0\]\.role must be a non-empty string"),
        (
            [{"role": "user", "content": "x"}, {"role": "user", "content": 3}],
            r"messages\[1\]\.content must be a string, got int",
        ),
        ([{"role": "user"}], r"messages\[0\]\.content must be a string, got NoneType"),
    ],
)
def test_bad_messages_name_the_problem(messages, problem):
    with pytest.raises(ChatTemplateError, match=problem):
        render_chat(None, messages)


def test_tool_call_turn_may_have_no_content():
    tpl = "{% for m in messages %}{{ m.role }}:{{ m.tool_calls | length if m.tool_calls else m.content }};{% endfor %}"
    msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]
    assert render_chat(tpl, msgs, add_generation_prompt=False) == "user:x;assistant:1;"
