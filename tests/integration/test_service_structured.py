"""Structured output and the speculative override through the service: the official `openai` client's
`response_format`, and the WebSocket `message.send` field, against the real server and model."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import jsonschema
import openai
import pytest
from structured_cases import PROMPT, SCHEMAS
from websockets.asyncio.client import connect

from tests.integration.conftest import API_KEY, ServerProcess
from tests.integration.test_service_ws import create_session, recv_until, stored


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=600)


async def test_json_schemas_through_the_openai_client_validate(server: ServerProcess) -> None:
    # One seeded sample per schema here; the engine tests sample each schema with five seeds.
    aclient = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=600)

    async def one(i: int, name: str, schema: dict):
        return await aclient.chat.completions.create(
            model="default",
            messages=[
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": PROMPT.format(name=name)},
            ],
            temperature=1.0,
            seed=100 + i,
            max_tokens=96,
            response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}},
        )

    replies = await asyncio.gather(*(one(i, name, schema) for i, (name, schema) in enumerate(SCHEMAS.items())))
    await aclient.close()
    for (name, schema), r in zip(SCHEMAS.items(), replies):
        for choice in r.choices:
            assert choice.finish_reason == "stop", f"{name}: {choice.message.content!r}"
            jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_and_regex_on_completions_and_streams(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "A cat as JSON, two fields."}],
        temperature=0,
        max_tokens=48,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    pattern = r"(yes|no)\. [A-Z][a-z]{2,12}\."
    stream = client.completions.create(
        model="default",
        prompt="Is water wet? Answer:",
        max_tokens=20,
        temperature=1.0,
        seed=3,
        stream=True,
        extra_body={"response_format": {"type": "regex", "pattern": pattern}},
    )
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    assert re.fullmatch(pattern, text), text


def nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def test_bad_constraints_are_400s_naming_the_param(server: ServerProcess) -> None:
    url = server.url + "/v1/chat/completions"
    base = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    schema = "response_format.json_schema.schema"
    cases = [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {}}}},
            "response_format",
            "not",
        ),
        ({"type": "grammar", "lark": "start: nothing_here"}, "response_format", "nothing_here"),
        ({"type": "xml"}, "response_format.type", "xml"),
        ({"type": "regex"}, "response_format.pattern", "pattern"),
        ({"type": "regex", "pattern": ""}, "response_format.pattern", "pattern"),
        ({"type": "json_object", "schema": {}}, "response_format.schema", "schema"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, schema, "schema"),
        # Hostile sizes are refused before anything is compiled.
        ({"type": "json_schema", "json_schema": {"name": "deep", "schema": nested(40)}}, schema, "levels deep"),
        (
            {"type": "json_schema", "json_schema": {"name": "big", "schema": {"enum": ["x" * 1000] * 100}}},
            schema,
            "KiB",
        ),
        ({"type": "grammar", "lark": "start: " + " | ".join(['"w"'] * 20_000)}, "response_format.lark", "lark"),
    ]
    for fmt, param, words in cases:
        for stream in (False, True):
            r = httpx.post(
                url, json={**base, "response_format": fmt, "stream": stream}, headers=server.auth, timeout=60
            )
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["param"] == param and words in err["message"], err
    # JSON nested past what any body may hold is refused by the decoder, still a 400.
    deep = '{"type": "json_schema", "json_schema": {"name": "d", "schema": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}}"
    body = json.dumps(base)[:-1] + ', "response_format": ' + deep + "}"
    r = httpx.post(url, content=body, headers={**server.auth, "Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"], r.text


async def test_websocket_message_send_honours_response_format(server: ServerProcess) -> None:
    async with connect(server.ws_url, additional_headers=server.auth) as ws:
        session = await create_session(ws, settings={"temperature": 1.0, "max_tokens": 24})
        sid = session["id"]
        pattern = "(red|green|blue) (cat|dog)"
        await ws.send(
            json.dumps(
                {
                    "type": "message.send",
                    "session_id": sid,
                    "content": "A pet?",
                    "response_format": {"type": "regex", "pattern": pattern},
                }
            )
        )
        events = await recv_until(ws, "done", sid)
        reply = [e for e in events if e["type"] == "message.created" and e["message"]["role"] == "assistant"][0]
        text = "".join(e["text"] for e in events if e["type"] == "delta")
        assert re.fullmatch(pattern, text) and events[-1]["finish_reason"] == "stop"
        assert stored(server, sid)[-1]["content"] == text and stored(server, sid)[-1]["id"] == reply["message"]["id"]
        before = len(stored(server, sid))
        await ws.send(
            json.dumps(
                {
                    "type": "message.send",
                    "session_id": sid,
                    "content": "Again",
                    "response_format": {"type": "regex", "pattern": "(unclosed"},
                }
            )
        )
        err = (await recv_until(ws, "error"))[-1]
        assert err["param"] == "response_format" and "unclosed" in err["message"]
        assert len(stored(server, sid)) == before  # refused before anything was stored


def test_sse_message_api_takes_response_format(server: ServerProcess) -> None:
    sid = httpx.post(
        server.url + "/api/sessions",
        json={"settings": {"temperature": 0, "max_tokens": 32}},
        headers=server.auth,
        timeout=30,
    ).json()["id"]
    body = {
        "content": "Name a color.",
        "response_format": {"type": "json_schema", "json_schema": {"name": "color", "schema": SCHEMAS["enum"]}},
    }
    with httpx.stream(
        "POST", f"{server.url}/api/sessions/{sid}/messages", json=body, headers=server.auth, timeout=120
    ) as r:
        assert r.status_code == 200
        text = "".join(
            json.loads(line[5:])["text"] for line in r.iter_lines() if line.startswith("data:") and '"delta"' in line
        )
    jsonschema.validate(json.loads(text), SCHEMAS["enum"])
    r = httpx.post(
        f"{server.url}/api/sessions/{sid}/messages",
        headers=server.auth,
        timeout=30,
        json={"content": "x", "response_format": {"type": "grammar", "lark": "start: /[/"}},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    assert len(stored(server, sid)) == 2  # the refused send stored nothing


def test_speculation_counters_reach_metrics_and_per_request_override(
    server: ServerProcess, client: openai.OpenAI
) -> None:
    code = "def f(x):\n    y = x + 1\n    return y\n"
    before = server.stats()["engine"]
    r = client.chat.completions.create(
        model="default",
        temperature=0,
        max_tokens=40,
        messages=[{"role": "user", "content": f"Repeat exactly:\n{code}"}],
    )
    off = client.chat.completions.create(
        model="default",
        temperature=0,
        max_tokens=40,
        extra_body={"speculative": "off"},
        messages=[{"role": "user", "content": f"Repeat exactly:\n{code}"}],
    )
    assert r.choices[0].message.content == off.choices[0].message.content
    after = server.stats()["engine"]
    assert after["spec_drafted_tokens"] > before["spec_drafted_tokens"]
    metrics = httpx.get(server.url + "/metrics", headers=server.admin_headers(), timeout=30).text
    for name in (
        "forge_spec_drafted_tokens_total",
        "forge_spec_accepted_tokens_total",
        "forge_spec_acceptance_rate",
        "forge_spec_mean_accepted_length",
    ):
        assert name in metrics
