"""Sessions REST and the SSE stream of a turn, with `httpx`, against the real server and model."""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

import httpx
import pytest

from tests.integration.conftest import ServerProcess, post_and_leave, wait_idle, wait_reply_grows


@pytest.fixture(scope="module")
def http(server: ServerProcess):
    with httpx.Client(base_url=server.url, timeout=180, headers=server.auth) as client:
        yield client


def parse_sse(lines: list[str]) -> tuple[list[dict[str, Any]], int]:
    """Events as {"event", "id", "data"} and the number of comment lines."""
    events, current, comments = [], {}, 0
    for line in lines:
        if line == "":
            if current:
                events.append(current)
            current = {}
        elif line.startswith(":"):
            comments += 1
        else:
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            current[field] = json.loads(value) if field == "data" else value
    return events, comments


def stream_lines(http: httpx.Client, path: str, body: dict | None = None) -> list[str]:
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return list(r.iter_lines())


def new_session(http: httpx.Client, **fields: Any) -> dict[str, Any]:
    r = http.post("/api/sessions", json=fields)
    assert r.status_code == 201, r.text
    return r.json()


def test_turn_events_arrive_in_order_with_ids(http: httpx.Client) -> None:
    sid = new_session(http, settings={"temperature": 0, "max_tokens": 10})["id"]
    lines = stream_lines(http, f"/api/sessions/{sid}/messages", {"content": "Hello! Who are you?"})
    assert "data:" not in [ln.strip() for ln in lines]  # keep-alives are comments, never empty data
    events, _ = parse_sse(lines)
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["message.created", "message.created"]
    assert kinds[-1] == "done" and kinds.count("done") == 1
    assert set(kinds[2:-1]) <= {"delta", "session"} and "delta" in kinds
    assert [int(e["id"]) for e in events] == list(range(1, len(events) + 1))
    assert all(e["data"]["type"] == e["event"] for e in events)
    user, reply = events[0]["data"]["message"], events[1]["data"]["message"]
    assert (user["role"], reply["role"], reply["status"]) == ("user", "assistant", "streaming")
    text = "".join(e["data"]["text"] for e in events if e["event"] == "delta")
    done = events[-1]["data"]
    assert (done["session_id"], done["message_id"], done["status"]) == (sid, reply["id"], "complete")
    assert done["usage"]["completion_tokens"] > 0 and done["timings"]["ttft_ms"] > 0

    session = http.get(f"/api/sessions/{sid}").json()
    assert session["title"] == "Hello! Who are you?"  # named after its first message
    stored = session["messages"]
    assert [(m["id"], m["content"], m["status"]) for m in stored] == [
        (user["id"], "Hello! Who are you?", "complete"),
        (reply["id"], text, "complete"),
    ]
    assert stored[1]["prompt_tokens"] == done["usage"]["prompt_tokens"]
    assert stored[1]["ttft_ms"] == done["timings"]["ttft_ms"]


def test_keepalive_comments_during_a_long_prefill(http: httpx.Client) -> None:
    sid = new_session(http, settings={"temperature": 0, "max_tokens": 2})["id"]
    long_text = "Please read this carefully. " + "All work and no play makes Jack a dull boy. " * 60
    events, comments = parse_sse(stream_lines(http, f"/api/sessions/{sid}/messages", {"content": long_text}))
    assert comments >= 1
    assert events[-1]["event"] == "done"


def test_disconnect_leaves_the_generation_running_until_stopped(server: ServerProcess, http: httpx.Client) -> None:
    before = wait_idle(server)["engine"]["kv_blocks_used"]
    sid = new_session(http, settings={"temperature": 0, "max_tokens": 400})["id"]
    with http.stream(
        "POST", f"/api/sessions/{sid}/messages", json={"content": "Write a very long poem about mountains."}
    ) as r:
        deltas = 0
        lines = r.iter_lines()  # kept referenced: a closed line iterator closes the response too
        for line in lines:
            if line == "event: delta":
                deltas += 1
            if deltas == 2:
                break
        mid = server.stats()
        assert mid["engine"]["running"] == 1
        assert [s["id"] for s in mid["active_sessions"] if s["status"] == "generating"] == [sid]
        lines.close()
    wait_reply_grows(server, sid)  # the reply goes on without its client ...
    assert server.stats()["engine"]["running"] == 1
    assert http.post(f"/api/sessions/{sid}/cancel").json() == {"cancelled": True}  # ... until it is stopped
    after = wait_idle(server)  # the sequence is gone ...
    assert after["engine"]["kv_blocks_used"] == before  # ... and its blocks are free
    deadline = time.monotonic() + 60  # the stored reply follows the abort: however busy the machine
    while True:
        reply = http.get(f"/api/sessions/{sid}").json()["messages"][-1]
        if reply["status"] != "streaming" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert (reply["status"], reply["finish_reason"]) == ("stopped", "abort")
    assert 2 <= reply["completion_tokens"] < 400 and reply["content"]
    assert not [s for s in server.stats()["active_sessions"] if s["id"] == sid]


def stored_reply(http: httpx.Client, session_id: str) -> dict[str, Any]:
    """The session's last message once there is one and it is no longer streaming."""
    deadline = time.monotonic() + 60
    while True:
        messages = http.get(f"/api/sessions/{session_id}").json()["messages"]
        if messages and messages[-1]["status"] != "streaming":
            return messages[-1]
        assert time.monotonic() < deadline, messages
        time.sleep(0.05)


def test_client_gone_before_the_stream_starts_leaves_the_turn_running(
    server: ServerProcess, http: httpx.Client
) -> None:
    sid = new_session(http, settings={"temperature": 0, "max_tokens": 300})["id"]
    # Hold the database's write lock so the server, having read the request, waits in storing the user
    # message; the client leaves meanwhile: the turn starts with its client already gone.
    con = sqlite3.connect(server.db_path, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        with post_and_leave(server, f"/api/sessions/{sid}/messages", {"content": "Write a very long poem."}):
            server.stats()  # a round trip: the server has read the request body by now
        server.stats()  # ... and has seen the client go
    finally:
        con.execute("ROLLBACK")
        con.close()
    deadline = time.monotonic() + 60  # it starts without its client, and goes on until stopped
    while not http.post(f"/api/sessions/{sid}/cancel").json()["cancelled"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    reply = stored_reply(http, sid)
    assert reply["role"] == "assistant"
    assert (reply["status"], reply["finish_reason"]) == ("stopped", "abort")
    assert reply["completion_tokens"] < 300


def test_session_operations(http: httpx.Client) -> None:
    a = new_session(
        http, title="first", system_prompt="You answer in one word.", settings={"temperature": 0, "max_tokens": 6}
    )
    b = new_session(http)
    assert b["title"] == "New chat" and b["settings"] == {"temperature": 0.7, "top_p": 0.95, "max_tokens": 512}
    ids = [s["id"] for s in http.get("/api/sessions").json()["data"]]
    assert ids.index(b["id"]) < ids.index(a["id"])  # newest first

    r = http.patch(f"/api/sessions/{a['id']}", json={"title": "renamed", "settings": {"max_tokens": 5}})
    assert r.status_code == 200
    assert r.json()["title"] == "renamed" and r.json()["settings"] == {"temperature": 0, "top_p": 0.95, "max_tokens": 5}
    ids = [s["id"] for s in http.get("/api/sessions").json()["data"]]
    assert ids.index(a["id"]) < ids.index(b["id"])  # activity moves it to the top

    events, _ = parse_sse(stream_lines(http, f"/api/sessions/{a['id']}/messages", {"content": "Sky colour?"}))
    first_reply = "".join(e["data"]["text"] for e in events if e["event"] == "delta")
    user_id = events[0]["data"]["message"]["id"]

    events, _ = parse_sse(stream_lines(http, f"/api/sessions/{a['id']}/regenerate"))
    assert events[0]["event"] == "history" and events[-1]["data"]["status"] == "complete"
    assert "".join(e["data"]["text"] for e in events if e["event"] == "delta") == first_reply

    events, _ = parse_sse(
        stream_lines(http, f"/api/sessions/{a['id']}/messages/{user_id}/edit", {"content": "Grass colour?"})
    )
    edited_reply = "".join(e["data"]["text"] for e in events if e["event"] == "delta")
    session = http.get(f"/api/sessions/{a['id']}").json()
    assert [(m["role"], m["content"]) for m in session["messages"]] == [
        ("user", "Grass colour?"),
        ("assistant", edited_reply),
    ]
    assert session["messages"][0]["siblings"] == [user_id, session["messages"][0]["id"]]

    # back to the first question's branch, with its two replies
    r = http.post(f"/api/sessions/{a['id']}/messages/{user_id}/select")
    assert r.status_code == 200
    assert [(m["content"], len(m["siblings"])) for m in r.json()["messages"]] == [("Sky colour?", 2), (first_reply, 2)]
    assert http.get(f"/api/sessions/{a['id']}").json()["messages"] == r.json()["messages"]
    assert http.post(f"/api/sessions/{a['id']}/messages/{'0' * 32}/select").status_code == 404

    export = http.get(f"/api/sessions/{a['id']}/export").json()
    assert export["forge_export"] == 2 and export["session"]["id"] == a["id"] and len(export["messages"]) == 5
    r = http.post("/api/sessions/import", json=export)
    assert r.status_code == 201
    copy = http.get(f"/api/sessions/{r.json()['id']}").json()
    assert copy["id"] != a["id"] and copy["title"] == "renamed" and copy["system_prompt"] == "You answer in one word."
    original = http.get(f"/api/sessions/{a['id']}").json()["messages"]
    assert [(m["role"], m["content"], m["status"], len(m["siblings"])) for m in copy["messages"]] == [
        (m["role"], m["content"], m["status"], len(m["siblings"])) for m in original
    ]
    # a file exported before branches (version 1: one conversation, in order) imports as one branch
    r = http.post("/api/sessions/import", json={"forge_export": 1, "session": export["session"], "messages": original})
    old = http.get(f"/api/sessions/{r.json()['id']}").json()["messages"]
    assert [(m["role"], m["content"], m["siblings"] == [m["id"]]) for m in old] == [
        (m["role"], m["content"], True) for m in original
    ]

    assert http.delete(f"/api/sessions/{a['id']}").status_code == 204
    assert http.get(f"/api/sessions/{a['id']}").status_code == 404
    assert http.get(f"/api/sessions/{a['id']}/export").status_code == 404
    assert http.get(f"/api/sessions/{copy['id']}").status_code == 200  # the copy is independent
