"""Tool calling through the official `openai` client against the real server and default model: every tool_choice,
parallel calls, streamed deltas reassembled, n, seeds, logprobs, speculation, and the refusals."""

from __future__ import annotations

import asyncio
import json

import httpx
import jsonschema
import openai
import pytest

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


def test_parallel_calls_have_distinct_indexes_and_ids(client):
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "What time is it in Paris, Tokyo and Lima?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=90,
        stream=True,
    )
    got = reassemble(stream)[0]
    calls = got["calls"]
    assert len(calls) >= 2, got
    assert sorted(calls) == list(range(len(calls)))
    assert len({c["id"] for c in calls.values()}) == len(calls)
    complete = [c for c in calls.values() if c["arguments"] == "{}"]
    assert len(complete) >= len(calls) - 1  # the last one may be cut by max_tokens


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
    m = r.choices[0].message
    assert m.content or m.tool_calls
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
