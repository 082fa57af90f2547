"""The tool-call grammar on the default model's tokenizer: what each tool_choice lets through, and what not; and
a template's own tool format through the engine."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace

import pytest
from engine_helpers import Result, collect, make_core
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine, GenerationRequest, SamplingParams, tool_render
from engine.call_repeats import canonical
from engine.chat_template import render_chat
from engine.speculative import SpecConfig
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


ADD = Tool(
    "add",
    json.dumps(
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}
    ),
)
NO_REPEAT_CASES = [
    {"temperature": 0.0},
    {"temperature": 0.0, "logprobs": 2},
    {"temperature": 0.0, "speculative": "ngram"},
    {"temperature": 0.8, "seed": 3, "n": 3},
    {"temperature": 0.8, "seed": 5, "n": 2, "logprobs": 0, "speculative": "ngram"},
]


async def test_a_reply_ends_before_its_first_repeated_call(default_model):
    # The grammar allows any number of calls and the default model writes the same one again until max_tokens: the
    # engine ends each sample on the repeat, with none of its text or tokens out, greedy or sampled, with n,
    # logprobs and drafts.
    eng = Engine(make_core(default_model, kv_memory=64 << 20, speculative=SpecConfig(row_cost=0.0)), threads=2)
    tools = [WEATHER, ADD]
    grammar = tool_grammar(GENERIC, tools, ToolChoice("required"), True)
    dropped = 0
    try:
        for ask in ("What is the weather in Tokyo?", "What is 2 + 40?"):
            prompt = eng.render_chat([{"role": "user", "content": ask}], tools=tools)
            for kw in NO_REPEAT_CASES:
                params = SamplingParams(max_tokens=128, response_format=grammar, tool_format=GENERIC, **kw)
                text: dict[int, str] = defaultdict(str)
                ids: dict[int, list[int]] = defaultdict(list)
                lps: dict[int, list] = defaultdict(list)
                final = {}
                async for ev in eng.generate(GenerationRequest(prompt, params)):
                    text[ev.index] += ev.text
                    ids[ev.index] += ev.token_ids
                    lps[ev.index] += ev.logprobs or []
                    if ev.final:
                        final[ev.index] = ev
                assert sorted(final) == list(range(params.n))
                for i, ev in final.items():
                    # greedy repeats itself (stop); a sampled reply may also write new calls until max_tokens
                    assert ev.finish_reason in (("stop",) if params.temperature == 0 else ("stop", "length"))
                    content, calls = split_reply(GENERIC, text[i])
                    whole = calls if ev.finish_reason == "stop" else calls[:-1]  # max_tokens may cut the last one
                    keys = [(c.name, canonical(c.arguments)) for c in whole]
                    assert content == "" and calls and len(set(keys)) == len(keys), (kw, text[i])
                    assert all(isinstance(json.loads(c.arguments), dict) for c in whole)
                    assert eng.tokenizer.decode(ids[i]).startswith(text[i])  # the tokens out are the text's
                    assert len(lps[i]) == (len(ids[i]) if params.logprobs is not None else 0)
                    cut = ev.usage.completion_tokens - len(ids[i])
                    if cut:  # a repeat was dropped: at most one call's tokens were spent on it
                        dropped += 1
                        longest = max(
                            len(eng.tokenizer.encode("\n" + GENERIC.render_call(c.name, c.arguments))) for c in calls
                        )
                        assert cut <= longest + 2, (cut, text[i])
        assert dropped, "no sample repeated a call: the case this guards against did not come up"
    finally:
        await eng.shutdown()


@pytest.fixture(scope="module")
def repeat_core(default_model):
    """A core with the weather and add tools' prompt: (core, prompt ids)."""
    core = make_core(default_model, kv_memory=64 << 20, speculative=SpecConfig(row_cost=0.0))
    messages, extra = tool_render.prepare(
        GENERIC, [{"role": "user", "content": "Weather in Tokyo, and 2 + 40?"}], [WEATHER, ADD]
    )
    tok = core.tokenizer
    text = render_chat(
        core.loaded.chat_template,
        messages,
        add_generation_prompt=True,
        bos_token=tok.bos_token,
        eos_token=tok.eos_token,
        **extra,
    )
    return core, tok.encode_chat(text)


@settings(max_examples=8, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.3]),
    n=st.integers(1, 3),
    speculative=st.sampled_from(["off", "ngram"]),
)
def test_no_sample_repeats_a_call_over_seeds_and_temperatures(repeat_core, seed, temperature, n, speculative):
    core, prompt = repeat_core
    grammar = tool_grammar(GENERIC, [WEATHER, ADD], ToolChoice("required"), True)
    params = SamplingParams(
        max_tokens=96,
        temperature=temperature,
        seed=seed,
        n=n,
        speculative=speculative,
        response_format=grammar,
        tool_format=GENERIC,
    )
    core.add_request(GenerationRequest(list(prompt), params))
    results: dict[tuple[str, int], Result] = {}
    while core.has_work():
        collect(core.step(), results)
    assert len(results) == n
    for r in results.values():
        assert r.final is not None and r.final.finish_reason in ("stop", "length")
        _, calls = split_reply(GENERIC, r.text)
        whole = calls if r.final.finish_reason == "stop" else calls[:-1]
        keys = [(c.name, canonical(c.arguments)) for c in whole]
        assert calls and len(set(keys)) == len(keys), r.text
        assert core.tokenizer.decode(r.token_ids).startswith(r.text)
