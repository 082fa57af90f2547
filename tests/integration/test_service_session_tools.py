"""Tool calling in chat sessions, against the real server and default model: over /ws with the official
`websockets` client (session tools, a reply that calls them, its result, the reply after it, the refusals) and
over REST/SSE with `httpx` (a message's own tools, the result route, the continue stream, export/import)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import jsonschema
import msgspec
import pytest
from websockets.asyncio.client import ClientConnection, connect

from engine import Engine
from engine.call_repeats import canonical
from engine.tool_calls import Tool
from tests.integration.conftest import ServerProcess

TIMEOUT = 180.0
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The current weather in a city", "parameters": WEATHER},
    }
]
ASK = "What is the weather in Paris?"
RESULT = '{"city": "Paris", "sky": "clear", "temperature_c": 21, "wind_kmh": 12, "humidity_pct": 40}'
SETTINGS = {"temperature": 0, "max_tokens": 48, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False}


async def recv(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def until(ws: ClientConnection, kind: str) -> list[dict[str, Any]]:
    events = []
    while True:
        events.append(await recv(ws))
        if events[-1]["type"] in (kind, "error"):
            return events


def streamed_calls(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The calls the `tool_call` events build, checking that a call's first event alone names it."""
    calls: dict[int, dict[str, Any]] = {}
    for ev in events:
        if ev["type"] != "tool_call":
            continue
        if ev["index"] not in calls:
            assert ev["id"].startswith("call_") and ev["name"], "a call's first event names it"
            calls[ev["index"]] = {"id": ev["id"], "type": "function", "function": {"name": ev["name"], "arguments": ""}}
        else:
            assert "id" not in ev and "name" not in ev
        calls[ev["index"]]["function"]["arguments"] += ev["arguments"]
    return [calls[i] for i in sorted(calls)]


def assert_valid(calls: list[dict[str, Any]]) -> None:
    assert calls
    for c in calls:
        assert c["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(c["function"]["arguments"]), WEATHER)


@pytest.fixture(scope="module")
async def engine():
    """The default model in this process: the prompt the server should have rendered, token for token."""
    loaded = await asyncio.to_thread(Engine.load, "default")
    yield loaded
    await loaded.shutdown()


def expected_prompt(engine: Engine, branch: list[dict[str, Any]]) -> int:
    messages = []
    for m in branch:
        msg = {"role": m["role"], "content": m["content"]}
        if m["tool_calls"]:
            msg["tool_calls"] = m["tool_calls"]
        if m["tool_call_id"]:
            msg["tool_call_id"] = m["tool_call_id"]
        messages.append(msg)
    tools = [Tool("get_weather", msgspec.json.encode(WEATHER).decode(), "The current weather in a city")]
    return len(engine.render_chat(messages, tools=tools))


async def test_a_session_calls_its_tools_takes_the_result_and_continues(server: ServerProcess, engine: Engine):
    async with connect(server.ws_url, additional_headers=server.auth) as ws:
        await ws.send(json.dumps({"type": "session.create", "settings": SETTINGS}))
        session = (await recv(ws))["session"]
        assert session["settings"]["tools"] == TOOLS and session["settings"]["tool_choice"] == "required"
        sid = session["id"]

        await ws.send(json.dumps({"type": "message.send", "session_id": sid, "content": ASK}))
        events = await until(ws, "done")
        done = events[-1]
        assert done["type"] == "done", done
        assert (done["status"], done["finish_reason"]) == ("complete", "tool_calls")
        assert_valid(done["tool_calls"])
        assert streamed_calls(events) == done["tool_calls"]
        assert not any(ev["type"] == "delta" and "<tool_call>" in ev["text"] for ev in events)

        await ws.send(json.dumps({"type": "session.open", "session_id": sid}))
        branch = (await until(ws, "history"))[-1]["messages"]
        reply = branch[-1]
        assert (reply["role"], reply["status"], reply["finish_reason"]) == ("assistant", "complete", "tool_calls")
        assert reply["tool_calls"] == done["tool_calls"] and "<tool_call>" not in reply["content"]
        call_id = reply["tool_calls"][0]["id"]

        # refusals: an id that is no call of the reply; continuing before the result; bad tools
        await ws.send(
            json.dumps(
                {
                    "type": "tool.result",
                    "session_id": sid,
                    "tool_call_id": "call_nope",
                    "content": "x",
                    "client_id": "r1",
                }
            )
        )
        err = await recv(ws)
        assert (err["type"], err["code"], err["param"], err["client_id"]) == (
            "error",
            "invalid_parameter",
            "tool_call_id",
            "r1",
        )
        await ws.send(json.dumps({"type": "message.continue", "session_id": sid}))
        err = await recv(ws)
        assert (err["type"], err["param"]) == ("error", "session_id"), err

        # the result, then the reply after it: its prompt is the conversation with the result rendered
        await ws.send(
            json.dumps({"type": "tool.result", "session_id": sid, "tool_call_id": call_id, "content": RESULT})
        )
        created = await recv(ws)
        assert created["type"] == "message.created", created
        result = created["message"]
        assert (result["role"], result["tool_call_id"], result["content"], result["parent_id"]) == (
            "tool",
            call_id,
            RESULT,
            reply["id"],
        )
        await ws.send(
            json.dumps({"type": "tool.result", "session_id": sid, "tool_call_id": call_id, "content": RESULT})
        )
        err = await recv(ws)
        assert (err["type"], err["param"]) == ("error", "tool_call_id") and "already" in err["message"], err

        await ws.send(json.dumps({"type": "message.continue", "session_id": sid}))
        events = await until(ws, "done")
        assert events[-1]["type"] == "done", events[-1]
        assert [ev["message"]["role"] for ev in events if ev["type"] == "message.created"] == ["assistant"]
        next_done = events[-1]
        assert next_done["usage"]["prompt_tokens"] == expected_prompt(engine, branch + [result])
        assert next_done["finish_reason"] == "tool_calls"  # the session still requires a call
        assert_valid(next_done["tool_calls"])


async def test_bad_tools_are_error_events_naming_the_field(server: ServerProcess):
    async with connect(server.ws_url, additional_headers=server.auth) as ws:
        bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]
        await ws.send(json.dumps({"type": "session.create", "settings": {"tools": bad}, "client_id": "c"}))
        err = await recv(ws)
        assert (err["type"], err["code"], err["param"]) == (
            "error",
            "invalid_parameter",
            "settings.tools[0].function.parameters",
        ), err
        await ws.send(json.dumps({"type": "session.create"}))
        sid = (await recv(ws))["session"]["id"]
        for extra, param in [
            ({"tools": bad}, "tools[0].function.parameters"),
            ({"tool_choice": "required"}, "tool_choice"),
            ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
            ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
        ]:
            await ws.send(json.dumps({"type": "message.send", "session_id": sid, "content": "hi", **extra}))
            err = await recv(ws)
            assert (err["type"], err["param"]) == ("error", param), (extra, err)
        await ws.send(json.dumps({"type": "tool.result", "session_id": sid, "tool_call_id": "call_x", "content": "x"}))
        err = await recv(ws)
        assert (err["type"], err["param"]) == ("error", "tool_call_id"), err
        await ws.send(json.dumps({"type": "session.open", "session_id": sid}))
        assert (await until(ws, "history"))[-1]["messages"] == []  # nothing was stored


def sse_events(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.read()
    events, current = [], {}
    for line in r.iter_lines():
        if line == "" and current:
            events.append(current)
            current = {}
        elif line.startswith("data:"):
            current = json.loads(line[5:])
    return events


def test_rest_a_message_brings_its_own_tools_and_the_result_route_continues(server: ServerProcess):
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers=server.auth) as http:
        sid = http.post("/api/sessions", json={"settings": {"temperature": 0, "max_tokens": 96}}).json()["id"]
        weather = {"type": "function", "function": {"name": "get_weather"}}
        with http.stream(
            "POST",
            f"/api/sessions/{sid}/messages",
            json={"content": ASK, "tools": TOOLS, "tool_choice": weather, "parallel_tool_calls": False},
        ) as r:
            events = sse_events(r)
        done = events[-1]
        assert (done["type"], done["finish_reason"]) == ("done", "tool_calls"), done
        assert_valid(done["tool_calls"])
        assert streamed_calls(events) == done["tool_calls"]
        call_id = done["tool_calls"][0]["id"]

        r = http.post(f"/api/sessions/{sid}/tool_results", json={"tool_call_id": "call_other", "content": "x"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_call_id", r.text
        r = http.post(f"/api/sessions/{sid}/tool_results", json={"tool_call_id": call_id})
        assert r.status_code == 400 and r.json()["error"]["param"] == "content", r.text
        r = http.post(f"/api/sessions/{sid}/tool_results", json={"tool_call_id": call_id, "content": RESULT})
        assert r.status_code == 201 and r.json()["role"] == "tool", r.text

        # the session has no tools: the reply after the result is text
        with http.stream("POST", f"/api/sessions/{sid}/continue") as r:
            events = sse_events(r)
        assert events[-1]["type"] == "done" and "tool_calls" not in events[-1], events[-1]
        assert events[-1]["finish_reason"] in ("stop", "length")

        exported = http.get(f"/api/sessions/{sid}/export").json()
        assert [m["role"] for m in exported["messages"]] == ["user", "assistant", "tool", "assistant"]
        assert exported["messages"][1]["tool_calls"] == done["tool_calls"]
        assert exported["messages"][2]["tool_call_id"] == call_id
        copy = http.post("/api/sessions/import", json=exported)
        assert copy.status_code == 201, copy.text
        branch = http.get(f"/api/sessions/{copy.json()['id']}").json()["messages"]
        assert [(m["role"], m["tool_calls"], m["tool_call_id"]) for m in branch] == [
            (m["role"], m["tool_calls"], m["tool_call_id"]) for m in exported["messages"]
        ]
        broken = {
            **exported,
            "messages": [{**m, "tool_call_id": None} if m["role"] == "tool" else m for m in exported["messages"]],
        }
        r = http.post("/api/sessions/import", json=broken)
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages[2].tool_call_id", r.text

        bad = [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]
        r = http.patch(f"/api/sessions/{sid}", json={"settings": {"tools": bad}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "settings.tools[0].function.parameters", r.text


def assert_no_repeats(calls: list[dict[str, Any]]) -> None:
    keys = [(c["function"]["name"], canonical(c["function"]["arguments"])) for c in calls]
    assert calls and len(set(keys)) == len(keys), calls


async def test_a_session_reply_with_parallel_calls_ends_at_the_first_repeat(server: ServerProcess):
    # With parallel calls allowed, the default model writes its call again and again: over /ws and over SSE the
    # reply ends at the first repeat as "tool_calls", and what streamed is what was stored.
    settings = {**SETTINGS, "max_tokens": 128, "parallel_tool_calls": True}
    async with connect(server.ws_url, additional_headers=server.auth) as ws:
        await ws.send(json.dumps({"type": "session.create", "settings": settings}))
        sid = (await recv(ws))["session"]["id"]
        await ws.send(json.dumps({"type": "message.send", "session_id": sid, "content": ASK}))
        events = await until(ws, "done")
        done = events[-1]
        assert (done["type"], done["status"], done["finish_reason"]) == ("done", "complete", "tool_calls"), done
        assert_no_repeats(done["tool_calls"])
        assert_valid(done["tool_calls"])
        assert streamed_calls(events) == done["tool_calls"]
        await ws.send(json.dumps({"type": "session.open", "session_id": sid}))
        stored = (await until(ws, "history"))[-1]["messages"][-1]
        assert stored["tool_calls"] == done["tool_calls"] and stored["finish_reason"] == "tool_calls"

    async with httpx.AsyncClient(base_url=server.url, timeout=TIMEOUT, headers=server.auth) as http:
        sid = (await http.post("/api/sessions", json={"settings": settings})).json()["id"]
        async with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": ASK}) as r:
            assert r.status_code == 200
            lines = [line async for line in r.aiter_lines()]
        events = [json.loads(line[5:]) for line in lines if line.startswith("data:")]
        sse_done = events[-1]
        assert (sse_done["type"], sse_done["finish_reason"]) == ("done", "tool_calls"), sse_done
        assert_no_repeats(sse_done["tool_calls"])
        assert streamed_calls(events) == sse_done["tool_calls"]
        strip = lambda calls: [c["function"] for c in calls]  # ids differ between sessions
        assert strip(sse_done["tool_calls"]) == strip(done["tool_calls"])  # greedy: the same reply both ways
