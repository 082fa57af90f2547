"""Tool calling through the official `openai` client against the real server and default model: every tool_choice,
parallel calls, streamed deltas reassembled, n, seeds, logprobs, speculation, and the refusals."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest

from engine.call_repeats import canonical
from tests.integration.conftest import API_KEY, ServerProcess

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The current weather in a city", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "description": "The time now, anywhere"}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": {"type": "object", "properties": {}, "additionalProperties": False}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_ONLY = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=600)


def assert_valid(calls) -> None:
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
        assert c.type == "function" and c.id.startswith("call_")


def reassemble(stream) -> dict[int, dict]:
    """Choices of a stream, from the deltas alone, checking OpenAI's shape on the way."""
    out: dict[int, dict] = {}
    for chunk in stream:
        for ch in chunk.choices:
            o = out.setdefault(ch.index, {"content": "", "calls": {}, "finish": None})
            o["content"] += ch.delta.content or ""
            for tc in ch.delta.tool_calls or []:
                if tc.index not in o["calls"]:
                    assert tc.id and tc.type == "function" and tc.function.name, "a call's first delta names it"
                    o["calls"][tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
                else:
                    assert tc.id is None and tc.function.name is None, "id and name come on the first delta only"
                o["calls"][tc.index]["arguments"] += tc.function.arguments or ""
            if ch.finish_reason:
                o["finish"] = ch.finish_reason
    return out


def test_required_is_one_valid_call_from_the_first_token(client):
    r = client.chat.completions.create(
        model="default",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=64,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert len(choice.message.tool_calls) == 1
    assert_valid(choice.message.tool_calls)


def test_a_named_function_is_the_one_called(client):
    r = client.chat.completions.create(
        model="default",
        messages=ASK,
        tools=TOOLS,
        parallel_tool_calls=False,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=32,
    )
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and [c.function.name for c in calls] == ["get_time"]
    assert json.loads(calls[0].function.arguments) == {}


def test_auto_is_text_or_valid_calls_and_none_lists_no_tools(client):
    for content in ["hello", "What is the weather in Paris? Call get_weather."]:
        r = client.chat.completions.create(
            model="default", messages=[{"role": "user", "content": content}], tools=TOOLS, temperature=0, max_tokens=48
        )
        m = r.choices[0].message
        if m.tool_calls:
            assert r.choices[0].finish_reason == "tool_calls"
            assert_valid(m.tool_calls)
        else:
            assert m.content and "<tool_call>" not in m.content
    with_tools = client.chat.completions.create(model="default", messages=ASK, tools=TOOLS, max_tokens=1)
    none = client.chat.completions.create(
        model="default", messages=ASK, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=24
    )
    plain = client.chat.completions.create(model="default", messages=ASK, temperature=0, max_tokens=24)
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content
    assert none.usage.prompt_tokens < with_tools.usage.prompt_tokens
    assert none.choices[0].message.content == plain.choices[0].message.content  # no tools rendered, no constraint


def test_streamed_deltas_reassemble_to_the_whole_reply(client, server: ServerProcess):
    kw = {
        "model": "default",
        "messages": ASK,
        "tools": TOOLS,
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 64,
        "parallel_tool_calls": False,
    }
    whole = client.chat.completions.create(**kw).choices[0]
    for extra in ({"speculative": "off"}, {"speculative": "ngram"}):
        accepted = server.stats()["engine"]["spec_accepted_tokens"]
        got = reassemble(client.chat.completions.create(**kw, stream=True, extra_body=extra))[0]
        if extra["speculative"] == "ngram":  # steps brought several tokens: the call copies the prompt's names
            assert server.stats()["engine"]["spec_accepted_tokens"] > accepted
        assert got["finish"] == whole.finish_reason == "tool_calls"
        assert got["content"] == ""
        assert [(c["name"], c["arguments"]) for c in got["calls"].values()] == [
            (c.function.name, c.function.arguments) for c in whole.message.tool_calls
        ]


def no_repeats(calls: list[tuple[str, str]]) -> None:
    keys = [(name, canonical(args)) for name, args in calls]
    assert calls and len(set(keys)) == len(keys), calls


REPEATED = [  # with parallel calls allowed, the default model writes these calls again and again
    ("What is the weather in Tokyo?", "required"),
    ("What time is it in Paris, Tokyo and Lima?", {"type": "function", "function": {"name": "get_time"}}),
]


@pytest.mark.parametrize(("ask", "choice"), REPEATED, ids=["required", "named"])
def test_a_reply_ends_at_its_first_repeated_call(client, ask: str, choice):
    kw = {
        "model": "default",
        "messages": [{"role": "user", "content": ask}],
        "tools": TOOLS,
        "tool_choice": choice,
        "temperature": 0,
        "max_tokens": 128,
        "n": 2,
    }
    whole = client.chat.completions.create(**kw)
    want = []
    for c in whole.choices:
        assert c.finish_reason == "tool_calls", c
        calls = [(t.function.name, t.function.arguments) for t in c.message.tool_calls]
        no_repeats(calls)
        assert_valid(c.message.tool_calls)
        assert len({t.id for t in c.message.tool_calls}) == len(calls)
        want.append(calls)
    assert whole.usage.completion_tokens < 2 * 128  # the engine stopped each sample at the repeat
    for extra in ({"speculative": "off"}, {"speculative": "ngram"}):
        got = reassemble(client.chat.completions.create(**kw, stream=True, extra_body=extra))
        assert sorted(got) == [0, 1]
        for i, o in got.items():
            assert o["finish"] == "tool_calls" and o["content"] == ""
            assert sorted(o["calls"]) == list(range(len(o["calls"])))  # no index skipped: nothing dropped was sent
            assert [(c["name"], c["arguments"]) for c in o["calls"].values()] == want[i]
            assert len({c["id"] for c in o["calls"].values()}) == len(want[i])
    lp = client.chat.completions.create(**{**kw, "n": 1}, logprobs=True, top_logprobs=1).choices[0]
    assert lp.finish_reason == "tool_calls"
    assert [(t.function.name, t.function.arguments) for t in lp.message.tool_calls] == want[0]
    tokens = "".join(t.token for t in lp.logprobs.content)
    assert tokens.count("<tool_call>") == len(want[0])  # no logprobs for the dropped repeat's tokens


async def test_sampled_replies_never_repeat_a_call(server: ServerProcess):
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=600)

    async def one(seed: int, stream: bool) -> list[tuple[str | None, list[tuple[str, str]]]]:
        kw = {
            "model": "default",
            "messages": [{"role": "user", "content": "What is 2 + 40? And the weather in Tokyo?"}],
            "tools": TOOLS,
            "tool_choice": "required",
            "temperature": 0.8,
            "seed": seed,
            "n": 3,
            "max_tokens": 128,
        }
        if not stream:
            r = await aclient.chat.completions.create(**kw)
            return [
                (c.finish_reason, [(t.function.name, t.function.arguments) for t in c.message.tool_calls])
                for c in r.choices
            ]
        out: dict[int, tuple[str | None, dict[int, list[str]]]] = {}
        async for chunk in await aclient.chat.completions.create(**kw, stream=True):
            for ch in chunk.choices:
                finish, calls = out.setdefault(ch.index, (None, {}))
                for tc in ch.delta.tool_calls or []:
                    calls.setdefault(tc.index, ["", ""])
                    calls[tc.index][0] += tc.function.name or ""
                    calls[tc.index][1] += tc.function.arguments or ""
                out[ch.index] = (ch.finish_reason or finish, calls)
        return [(f, [(n, a) for n, a in c.values()]) for f, c in (out[i] for i in sorted(out))]

    try:
        replies = await asyncio.gather(*(one(seed, stream) for seed in range(3) for stream in (False, True)))
    finally:
        await aclient.close()
    for plain, streamed in zip(replies[::2], replies[1::2]):
        assert plain == streamed  # seeded: the stream's deltas build the same calls
        for finish, calls in plain:
            assert finish in ("tool_calls", "length")
            no_repeats(calls if finish == "tool_calls" else calls[:-1])  # max_tokens may cut the last one
    assert any(finish == "tool_calls" for r in replies for finish, _ in r)


async def test_sampled_calls_all_validate_with_n_and_seeds(server: ServerProcess):
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=600)

    async def one(seed: int):
        return await aclient.chat.completions.create(
            model="default",
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1.0,
            seed=seed,
            n=3,
            max_tokens=64,
        )

    replies = await asyncio.gather(*(one(seed) for seed in range(4)))  # 12 seeded streams (seed, index)
    await aclient.close()
    seen = set()
    for r in replies:
        assert len(r.choices) == 3
        for choice in r.choices:
            assert choice.finish_reason == "tool_calls", choice
            assert len(choice.message.tool_calls) == 1
            assert_valid(choice.message.tool_calls)
            seen.add(choice.message.tool_calls[0].function.arguments)
    assert len(seen) > 1, "twelve seeded samples gave one call"


def test_logprobs_come_with_the_calls(client):
    r = client.chat.completions.create(
        model="default",
        messages=ASK,
        tools=TOOLS,
        tool_choice=WEATHER_ONLY,
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=64,
        logprobs=True,
        top_logprobs=2,
    )
    choice = r.choices[0]
    assert choice.message.tool_calls and choice.logprobs.content
    text = "".join(t.token for t in choice.logprobs.content)
    assert choice.message.tool_calls[0].function.arguments in text


def test_a_round_trip_with_a_tool_result(client):
    call = client.chat.completions.create(
        model="default",
        messages=ASK,
        tools=TOOLS,
        tool_choice=WEATHER_ONLY,
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=64,
    )
    msg = call.choices[0].message
    history = [
        *ASK,
        msg.model_dump(),  # as the SDK dumps it: nulls included
        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": '{"temperature": 21, "sky": "clear"}'},
    ]
    r = client.chat.completions.create(model="default", messages=history, tools=TOOLS, temperature=0, max_tokens=48)
    assert r.usage.prompt_tokens > call.usage.prompt_tokens + 30  # the call and its result are in the prompt
    assert r.usage.prompt_tokens_details.cached_tokens >= 128  # the tools' system prompt is reused
    m, finish = r.choices[0].message, r.choices[0].finish_reason
    if finish == "tool_calls":  # another call: whole and valid
        assert m.tool_calls
        assert_valid(m.tool_calls)
    else:  # text, with no call markup left in it
        assert finish in ("stop", "length") and not m.tool_calls
        assert m.content and "<tool_call>" not in m.content
    assert_valid(m.tool_calls or [])


def test_the_model_card_names_its_tool_format(client):
    assert client.models.list().data[0].model_extra["tool_format"] == "generic"


REFUSALS = [
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "properties": {"a": {"type": "string", "not": {"const": "x"}}},
                        },
                    },
                }
            ]
        },
        "tools[0].function.parameters",
    ),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
        "tools[0].function.parameters",
    ),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": "always"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [TOOLS[0], TOOLS[0]]}, "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": TOOLS, "response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [*ASK, {"role": "tool", "tool_call_id": "call_1", "content": "21C"}]}, "messages[1].tool_call_id"),
    ({"messages": [*ASK, {"role": "assistant", "content": None}]}, "messages[1].content"),
    ({"messages": [{"role": "user", "content": "hi", "tool_call_id": "x"}]}, "messages[0].tool_call_id"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, "tools"),
]


@pytest.mark.parametrize(("extra", "param"), REFUSALS, ids=[p for _, p in REFUSALS])
def test_refusals_name_the_field(server: ServerProcess, extra: dict, param: str):
    body = {"model": "default", "messages": ASK, "max_tokens": 4, **extra}
    r = httpx.post(server.url + "/v1/chat/completions", json=body, headers=server.auth, timeout=120)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
