"""A reply outlives its connection (app/domain/replay.py): dropped WebSocket and SSE clients reattach and get
exactly the rest of the reply (greedy: byte-identical to an uninterrupted one), two sockets watch one turn, a
turn nobody watches is stopped after --detached-turn-s, a stop while detached, and a restart while detached."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.integration.conftest import ServerProcess
from tests.integration.test_service_sse import parse_sse
from tests.integration.test_service_ws import create_session, recv, recv_until, stored

PROMPT = "Write a short poem about the sea."
GREEDY = {"temperature": 0, "max_tokens": 48}
LONG = {"temperature": 0, "max_tokens": 2000}
ENDLESS = {"type": "regex", "pattern": "x{9000}"}  # with LONG: no end before the test stops it


def seqs(events: list[dict[str, Any]]) -> list[int]:
    return [e["seq"] for e in events if "seq" in e]


def text_of(events: list[dict[str, Any]], mid: str) -> str:
    return "".join(e["text"] for e in events if e["type"] == "delta" and e["message_id"] == mid)


@pytest.fixture(scope="module")
def uninterrupted(server: ServerProcess) -> str:
    """The greedy reply to PROMPT, nobody dropping."""

    async def run() -> str:
        async with connect(server.ws_url, additional_headers=server.auth) as ws:
            sid = (await create_session(ws, settings=GREEDY))["id"]
            await ws.send(json.dumps({"type": "message.send", "session_id": sid, "content": PROMPT}))
            events = await recv_until(ws, "done", sid)
            assert events[-1]["status"] == "complete"
            return text_of(events, events[-1]["message_id"])

    return asyncio.run(run())


async def test_dropped_socket_reattaches_with_no_gap_and_a_second_watcher_follows(
    server: ServerProcess, uninterrupted: str
) -> None:
    a = await connect(server.ws_url, additional_headers=server.auth)
    sid = (await create_session(a, settings=GREEDY))["id"]
    await a.send(json.dumps({"type": "message.send", "session_id": sid, "content": PROMPT, "client_id": "x"}))
    first = await recv_until(a, "delta", sid)
    mid = first[-1]["message_id"]
    assert seqs(first) == list(range(1, len(first) + 1)) and all(e["client_id"] == "x" for e in first)
    async with connect(server.ws_url, additional_headers=server.auth) as b:  # a second tab opens the session
        await b.send(json.dumps({"type": "session.open", "session_id": sid}))
        assert (await recv(b))["type"] == "session"
        history = await recv(b)
        await a.close()  # the first tab drops: the reply goes on for the second
        assert history["type"] == "history"
        reply = history["messages"][-1]
        assert reply["id"] == mid
        follow = await recv_until(b, "done", sid)
    assert all("client_id" not in e for e in follow)  # the command was the other socket's
    if "seq" in history:  # still generating when opened: its text so far, then the rest, numbered on
        assert reply["status"] == "streaming"
        assert seqs(follow) == list(range(history["seq"] + 1, history["seq"] + 1 + len(follow)))
    assert reply["content"] + text_of(follow, mid) == uninterrupted
    assert follow[-1]["status"] == "complete"
    # A third client kept the first's copy: turn.resume after its last event gives the rest of it.
    async with connect(server.ws_url, additional_headers=server.auth) as c:
        await c.send(
            json.dumps(
                {
                    "type": "turn.resume",
                    "session_id": sid,
                    "message_id": mid,
                    "after_seq": first[-1]["seq"],
                    "client_id": "r",
                }
            )
        )
        ack = await recv(c)
        assert (ack["type"], ack["message_id"], ack["client_id"]) == ("turn.resumed", mid, "r")
        rest = await recv_until(c, "done", sid)
        assert seqs(rest) == list(range(first[-1]["seq"] + 1, rest[-1]["seq"] + 1))
        assert text_of(first, mid) + text_of(rest, mid) == uninterrupted
        await c.send(json.dumps({"type": "turn.resume", "session_id": sid, "after_seq": 10**9, "client_id": "y"}))
        err = await recv(c)
        assert (err["type"], err["code"], err["param"]) == ("error", "invalid_parameter", "after_seq")
        # Reopened after its end: the stored history alone, nothing replayed after it
        await c.send(json.dumps({"type": "session.open", "session_id": sid}))
        await c.send(json.dumps({"type": "ping"}))
        answers = [await recv(c) for _ in range(3)]
        assert [a["type"] for a in answers] == ["session", "history", "pong"] and "seq" not in answers[1]
        assert answers[1]["messages"][-1]["content"] == uninterrupted
    assert stored(server, sid)[-1]["content"] == uninterrupted


def test_dropped_sse_stream_resumes_from_last_event_id(server: ServerProcess, uninterrupted: str) -> None:
    with httpx.Client(base_url=server.url, timeout=180, headers=server.auth) as http:
        sid = http.post("/api/sessions", json={"settings": GREEDY}).json()["id"]
        lines = []
        with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": PROMPT}) as r:
            it = r.iter_lines()
            for line in it:
                lines.append(line)
                if line.startswith("event: delta") and sum(ln == "event: delta" for ln in lines) == 2:
                    break
            for line in it:  # to the end of that event
                lines.append(line)
                if line == "":
                    break
            it.close()
        before, _ = parse_sse(lines)
        mid = before[-1]["data"]["message_id"]
        last = before[-1]["id"]
        assert [int(e["id"]) for e in before] == list(range(1, len(before) + 1))
        path = f"/api/sessions/{sid}/messages/{mid}/events"
        with http.stream("GET", path, headers={"Last-Event-ID": last}) as r:
            assert r.status_code == 200
            after, _ = parse_sse(list(r.iter_lines()))
        assert [int(e["id"]) for e in after] == list(range(int(last) + 1, int(last) + 1 + len(after)))
        data = [e["data"] for e in before + after]
        assert text_of(data, mid) == uninterrupted and data[-1]["type"] == "done"
        # ?after= works the same; an ended turn (kept for a grace, or only stored) ends with its `done`
        with http.stream("GET", path, params={"after": 0}) as r:
            again = [e["data"] for e in parse_sse(list(r.iter_lines()))[0]]
        assert again[-1]["type"] == "done" and again[-1]["status"] == "complete"
        assert text_of(again, mid) == uninterrupted or again[0]["message"]["content"] == uninterrupted
        for params, headers in (
            ({"after": "x"}, {}),
            ({"after": -1}, {}),
            ({}, {"Last-Event-ID": "abc"}),
            ({"after": 10**9}, {}),
        ):
            r = http.get(path, params=params, headers=headers)
            if "done" in r.text:  # the turn's events are no longer kept: an ended turn's answer ignores `after`
                continue
            assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
        assert http.get(f"/api/sessions/{sid}/messages/nope/events").status_code == 404


async def test_stop_while_detached(server: ServerProcess) -> None:
    ws = await connect(server.ws_url, additional_headers=server.auth)
    sid = (await create_session(ws, settings=LONG))["id"]
    await ws.send(
        json.dumps(
            {
                "type": "message.send",
                "session_id": sid,
                "content": "Tell me a very long story.",
                "response_format": ENDLESS,
            }
        )
    )
    mid = (await recv_until(ws, "delta", sid))[-1]["message_id"]
    await ws.close()
    async with connect(server.ws_url, additional_headers=server.auth) as b:
        await b.send(json.dumps({"type": "session.open", "session_id": sid}))
        history = (await recv_until(b, "history", sid))[-1]
        assert history["messages"][-1]["status"] == "streaming"  # nobody watched, and it went on
        r = httpx.post(f"{server.url}/api/sessions/{sid}/cancel", headers=server.auth, timeout=30)
        assert r.json() == {"cancelled": True}
        done = (await recv_until(b, "done", sid))[-1]
    assert (done["message_id"], done["status"], done["finish_reason"]) == (mid, "stopped", "abort")
    reply = stored(server, sid)[-1]
    assert reply["status"] == "stopped" and 0 < reply["completion_tokens"] < LONG["max_tokens"]


@pytest.fixture(scope="module")
def short_window(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("detached")
    srv = ServerProcess(
        db_path=tmp / "forge.db", log_path=tmp / "server.log", env={"FORGE_DETACHED_TURN_S": "1"}
    ).start()
    yield srv
    srv.stop()


async def test_nobody_reattaching_stops_the_reply(short_window: ServerProcess) -> None:
    srv = short_window
    ws = await connect(srv.ws_url, additional_headers=srv.auth)
    sid = (await create_session(ws, settings=LONG))["id"]
    await ws.send(
        json.dumps(
            {
                "type": "message.send",
                "session_id": sid,
                "content": "Tell me a very long story.",
                "response_format": ENDLESS,
            }
        )
    )
    await recv_until(ws, "delta", sid)
    await ws.close()
    deadline = time.monotonic() + 60
    while (reply := stored(srv, sid)[-1])["status"] == "streaming" and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert (reply["status"], reply["finish_reason"]) == ("stopped", "abort")
    assert 0 < reply["completion_tokens"] < LONG["max_tokens"]
