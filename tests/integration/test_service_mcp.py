"""MCP tools in chat sessions, against a real server (`python -m app.server` with `--mcp` settings) running the
test MCP server (tests/mcp_servers/tool_server.py) over stdio, and the default model: the server runs the calls a
reply makes, stores them and their results, and continues the reply by itself; errors, a hang, a crash, a huge
result and Stop all end as error results, never a stuck turn. Driven over /ws and REST/SSE."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

from tests.integration.conftest import ServerProcess

TIMEOUT = 60.0
MCP_TOOLS = ["calc__add", "calc__fail", "calc__hang", "calc__crash", "calc__huge"]
# The continuation has no tool choice left (tool_choice none): each message is one round, then a final answer.
SETTINGS = {
    "temperature": 0,
    "max_tokens": 48,
    "mcp_tools": MCP_TOOLS,
    "tool_choice": "none",
    "parallel_tool_calls": False,
}
STOPPED = "error: the call was stopped by the user"


def forced(tool: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool}}


async def recv(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def rounds(
    ws: ClientConnection, sid: str, content: str, tool: str, decision: str | None = None
) -> list[dict[str, Any]]:
    """Send a message forcing a call of `tool`; the events until the reply after the tool's result is done.
    A call that asks for approval gets `decision` (None: no call may ask)."""
    await ws.send(
        json.dumps({"type": "message.send", "session_id": sid, "content": content, "tool_choice": forced(tool)})
    )
    events = []
    while True:
        events.append(await recv(ws))
        assert events[-1]["type"] != "error", events[-1]
        if events[-1]["type"] == "tool.approval":
            assert decision is not None, events[-1]
            call_id = events[-1]["tool_call_id"]
            await ws.send(
                json.dumps({"type": "tool.approve", "session_id": sid, "tool_call_id": call_id, "decision": decision})
            )
        if sum(e["type"] == "done" for e in events) == 2:
            return events


async def branch(ws: ClientConnection, sid: str) -> list[dict[str, Any]]:
    await ws.send(json.dumps({"type": "session.open", "session_id": sid}))
    while True:
        ev = await recv(ws)
        if ev["type"] == "history":
            return ev["messages"]


def ran_after(events: list[dict[str, Any]]) -> int | None:
    """Where the call started running (its `tool.running`), after its approval when asked; None: it never ran."""
    kinds = [e["type"] for e in events]
    if "tool.running" not in kinds:
        return None
    at = kinds.index("tool.running")
    assert "tool.approval" not in kinds or kinds.index("tool.approval") < at, kinds
    return at


def check_round(events: list[dict[str, Any]], stored: list[dict[str, Any]], tool: str) -> str:
    """One message's round as events and as stored: the call, its result below it, the reply after; the result."""
    first, second = [e for e in events if e["type"] == "done"]
    assert (first["status"], first["finish_reason"]) == ("complete", "tool_calls")
    call = first["tool_calls"][0]
    assert call["function"]["name"] == tool
    running = [e for e in events if e["type"] == "tool.running"]
    asked = [e for e in events if e["type"] == "tool.approval"]
    denied = bool(asked) and ran_after(events) is None
    assert [(e["tool_call_id"], e["name"], e["message_id"]) for e in running] == (
        [] if denied else [(call["id"], tool, first["message_id"])]
    )
    results = [e["message"] for e in events if e["type"] == "message.created" and e["message"]["role"] == "tool"]
    assert [r["tool_call_id"] for r in results] == [call["id"]]
    assert second["status"] == "complete" and second["finish_reason"] in ("stop", "length")
    user, reply, result, final = stored[-4:]
    assert (user["role"], reply["role"], result["role"], final["role"]) == ("user", "assistant", "tool", "assistant")
    assert reply["tool_calls"] == first["tool_calls"] and reply["id"] == first["message_id"]
    assert result["parent_id"] == reply["id"] and result["content"] == results[0]["content"]
    assert final["parent_id"] == result["id"] and final["id"] == second["message_id"] and final["status"] == "complete"
    return result["content"]


async def test_ws_rounds_results_errors_hang_crash_and_huge(mcp_server: ServerProcess):
    async with connect(mcp_server.ws_url, additional_headers=mcp_server.auth) as ws:
        await ws.send(json.dumps({"type": "session.create", "settings": SETTINGS}))
        session = (await recv(ws))["session"]
        assert session["settings"]["mcp_tools"] == MCP_TOOLS
        sid = session["id"]

        events = await rounds(ws, sid, "What is 2 plus 40?", "calc__add")
        stored = await branch(ws, sid)
        args = json.loads(stored[-3]["tool_calls"][0]["function"]["arguments"])
        assert check_round(events, stored, "calc__add") == str(args["a"] + args["b"])

        events = await rounds(ws, sid, "Try the failing tool.", "calc__fail")
        assert check_round(events, await branch(ws, sid), "calc__fail").startswith("error:")

        events = await rounds(ws, sid, "Now wait.", "calc__hang")  # cut by the 2 s timeout
        assert "did not answer within 2 s" in check_round(events, await branch(ws, sid), "calc__hang")

        events = await rounds(ws, sid, "Crash it.", "calc__crash")  # the server was restarted after the hang
        assert check_round(events, await branch(ws, sid), "calc__crash").startswith("error: the tool crash failed")

        events = await rounds(ws, sid, "Get the huge result.", "calc__huge")  # restarted again after the crash
        huge = check_round(events, await branch(ws, sid), "calc__huge")
        assert huge.endswith("[result truncated: 256 of 100000 bytes]") and len(huge) < 320

    stats = httpx.get(mcp_server.url + "/admin/api/stats", headers=mcp_server.admin_headers(), timeout=10).json()
    calc = stats["mcp"][0]
    tools = {t["name"]: t for t in calc["tools"]}
    assert (calc["name"], calc["state"], calc["starts"]) == ("calc", "ready", 3)  # after the hang, after the crash
    assert (tools["calc__add"]["calls"], tools["calc__add"]["errors"]) == (1, 0)
    assert tools["calc__hang"]["errors"] == 1 and tools["calc__add"]["mean_ms"] is not None
    metrics = httpx.get(mcp_server.url + "/metrics", headers=mcp_server.admin_headers(), timeout=10).text
    assert 'forge_mcp_tool_calls_total{outcome="timeout",server="calc",tool="hang"} 1.0' in metrics
    assert 'forge_mcp_server_ready{server="calc",state="ready"} 1.0' in metrics


async def test_stop_interrupts_a_running_call(mcp_server: ServerProcess):
    async with connect(mcp_server.ws_url, additional_headers=mcp_server.auth) as ws:
        await ws.send(json.dumps({"type": "session.create", "settings": SETTINGS}))
        sid = (await recv(ws))["session"]["id"]
        body = {"type": "message.send", "session_id": sid, "content": "Wait.", "tool_choice": forced("calc__hang")}
        await ws.send(json.dumps(body))
        while (ev := await recv(ws))["type"] != "tool.running":
            assert ev["type"] != "error", ev
        await ws.send(json.dumps({"type": "generation.cancel", "session_id": sid}))
        seen = []
        while not any(e["type"] == "message.created" for e in seen) or not any(
            e["type"] == "generation.cancelled" for e in seen
        ):
            seen.append(await recv(ws))
        result = next(e["message"] for e in seen if e["type"] == "message.created")
        assert (result["role"], result["content"]) == ("tool", STOPPED)
        stored = await branch(ws, sid)
        assert stored[-1]["id"] == result["id"]  # no reply continues after a stopped call
        # The session is free again at once: a new message gets its reply
        await ws.send(
            json.dumps({"type": "message.send", "session_id": sid, "content": "Hello", "tool_choice": "none"})
        )
        while (ev := await recv(ws))["type"] != "done":
            assert ev["type"] != "error", ev
        assert ev["status"] == "complete"


async def test_approval_once_deny_always_then_regenerate_and_edit(mcp_server: ServerProcess):
    settings = {**SETTINGS, "mcp_tools": ["calc__add"], "mcp_approval": True}
    async with connect(mcp_server.ws_url, additional_headers=mcp_server.auth) as ws:
        await ws.send(json.dumps({"type": "session.create", "settings": settings}))
        sid = (await recv(ws))["session"]["id"]

        # Asked first: nothing runs before the decision, and a client (re)opening the session is asked too
        body = {"type": "message.send", "session_id": sid, "content": "What is 2 plus 40?"}
        await ws.send(json.dumps({**body, "tool_choice": forced("calc__add")}))
        events = []
        while (events := [*events, await recv(ws)])[-1]["type"] != "tool.approval":
            assert events[-1]["type"] not in ("error", "tool.running"), events[-1]
        asked = events[-1]
        assert asked["name"] == "calc__add" and json.loads(asked["arguments"]).keys() == {"a", "b"}
        await ws.send(json.dumps({"type": "session.open", "session_id": sid}))
        while (ev := await recv(ws))["type"] != "tool.approval":
            assert ev["type"] in ("session", "history"), ev
        assert ev == asked
        wrong = {"type": "tool.approve", "session_id": sid, "tool_call_id": "call_nope", "decision": "once"}
        await ws.send(json.dumps(wrong))
        assert (ev := await recv(ws))["type"] == "error" and (ev["code"], ev["param"]) == ("not_found", "tool_call_id")
        approve = {"type": "tool.approve", "session_id": sid, "tool_call_id": asked["tool_call_id"]}
        await ws.send(json.dumps({**approve, "decision": "once"}))
        while sum(e["type"] == "done" for e in events) < 2:  # the reply with the call, then the one after it
            events.append(await recv(ws))
            assert events[-1]["type"] != "error", events[-1]
        stored = await branch(ws, sid)
        args = json.loads(stored[-3]["tool_calls"][0]["function"]["arguments"])
        assert check_round(events, stored, "calc__add") == str(args["a"] + args["b"])

        # "Allow once" asks again; deny gives the model an error result and the reply goes on
        events = await rounds(ws, sid, "Add them again.", "calc__add", decision="deny")
        assert check_round(events, await branch(ws, sid), "calc__add") == "error: the call was denied by the user"

        # "Always allow" stores the tool in the session; its next call runs without asking
        events = await rounds(ws, sid, "And once more.", "calc__add", decision="always")
        assert check_round(events, await branch(ws, sid), "calc__add").isdigit()
        updated = [e["session"] for e in events if e["type"] == "session"]
        assert updated and updated[-1]["settings"]["mcp_allowed"] == ["calc__add"]
        events = await rounds(ws, sid, "One last time.", "calc__add")  # asserts no tool.approval comes
        stored = await branch(ws, sid)
        assert check_round(events, stored, "calc__add").isdigit()

        # Regenerating the reply after a round: a sibling of it, generated anew from the same result
        user, reply, result, final = stored[-4:]
        await ws.send(json.dumps({"type": "message.regenerate", "session_id": sid}))
        while (ev := await recv(ws))["type"] != "done":
            assert ev["type"] != "error", ev
            if ev["type"] == "history":
                assert [m["id"] for m in ev["messages"][-3:]] == [user["id"], reply["id"], result["id"]]
        assert ev["status"] == "complete" and ev["finish_reason"] in ("stop", "length")
        again = (await branch(ws, sid))[-1]
        assert again["id"] == ev["message_id"] and again["parent_id"] == result["id"]
        assert set(again["siblings"]) == {final["id"], again["id"]}

        # Editing the message that started the round: a new branch (the old one, calls and results, is kept)
        edit = {"type": "message.edit", "session_id": sid, "message_id": user["id"], "content": "Say hi."}
        await ws.send(json.dumps(edit))
        while (ev := await recv(ws))["type"] != "done":
            assert ev["type"] != "error", ev
        assert ev["status"] == "complete"
        edited = await branch(ws, sid)
        assert edited[-2]["content"] == "Say hi." and user["id"] in edited[-2]["siblings"]
        assert edited[-1]["id"] == ev["message_id"] and edited[-1]["parent_id"] == edited[-2]["id"]


def sse(response: httpx.Response) -> list[dict[str, Any]]:
    events, kind = [], None
    for line in response.iter_lines():
        if line.startswith("event: "):
            kind = line.removeprefix("event: ")
        elif line.startswith("data: ") and kind is not None:
            events.append({"event": kind, **json.loads(line.removeprefix("data: "))})
    return events


def test_rest_sse_round_settings_export_and_v1(mcp_server: ServerProcess):
    with httpx.Client(base_url=mcp_server.url, headers=mcp_server.auth, timeout=TIMEOUT) as http:
        r = http.post("/api/sessions", json={"settings": {**SETTINGS, "mcp_tools": ["calc__add"]}})
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        bad = http.patch(f"/api/sessions/{sid}", json={"settings": {"mcp_tools": ["no-namespace"]}})
        assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("settings.mcp_tools")
        body = {"content": "What is 2 plus 40?", "tool_choice": forced("calc__add")}
        with http.stream("POST", f"/api/sessions/{sid}/messages", json=body) as r:
            assert r.status_code == 200
            events = sse(r)  # one stream for both rounds: it ends after the final answer
        kinds = [e["event"] for e in events]
        assert kinds.count("done") == 2 and "tool.running" in kinds and kinds[-1] == "done"
        stored = http.get(f"/api/sessions/{sid}").json()["messages"]
        args = json.loads(stored[-3]["tool_calls"][0]["function"]["arguments"])
        assert check_round([{"type": e["event"], **e} for e in events], stored, "calc__add") == str(
            args["a"] + args["b"]
        )
        exported = http.get(f"/api/sessions/{sid}/export").json()
        assert exported["session"]["settings"]["mcp_tools"] == ["calc__add"]
        imported = http.post("/api/sessions/import", json=exported)
        assert imported.status_code == 201 and imported.json()["settings"]["mcp_tools"] == ["calc__add"]

        # /v1 keeps client-executed tools: the call comes back to the caller, nothing runs it
        before = {
            t["name"]: t["calls"]
            for t in http.get("/admin/api/stats", headers=mcp_server.admin_headers()).json()["mcp"][0]["tools"]
        }
        tool = {
            "type": "function",
            "function": {
                "name": "calc__add",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            },
        }
        r = http.post(
            "/v1/chat/completions",
            json={
                "model": "default",
                "messages": [{"role": "user", "content": "2+40?"}],
                "tools": [tool],
                "tool_choice": "required",
                "max_tokens": 64,
                "parallel_tool_calls": False,
                "temperature": 0,
            },
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert (
            choice["finish_reason"] == "tool_calls"
            and choice["message"]["tool_calls"][0]["function"]["name"] == "calc__add"
        )
        after = {
            t["name"]: t["calls"]
            for t in http.get("/admin/api/stats", headers=mcp_server.admin_headers()).json()["mcp"][0]["tools"]
        }
        assert after == before
