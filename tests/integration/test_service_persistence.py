"""Sessions survive restarts; SIGTERM stores in-flight replies as "interrupted"; SIGKILL mid-reply leaves
the partial reply stored. These tests start (and kill) servers of their own on one SQLite file."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from app.store import Store
from tests.integration.conftest import ServerProcess


def sse_events(lines) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    events: list[dict[str, Any]] = []
    for line in lines:
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
    return events


def db_reply(db: Path, message_id: str) -> tuple[str, str] | None:
    con = sqlite3.connect(db)
    try:
        row = con.execute("SELECT status, content FROM messages WHERE id = ?", (message_id,)).fetchone()
    finally:
        con.close()
    return row


def test_restart_sigterm_and_sigkill(tmp_path: Path) -> None:
    db = tmp_path / "forge.db"
    first = ServerProcess(db_path=db, log_path=tmp_path / "first.log", api_key=None, admin_token=None).start()
    try:
        with httpx.Client(base_url=first.url, timeout=180) as http:
            sid = http.post("/api/sessions", json={"settings": {"temperature": 0, "max_tokens": 8}}).json()["id"]
            with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Hi there!"}) as r:
                done = sse_events(r.iter_lines())[-1]
            assert done["type"] == "done" and done["status"] == "complete"
            before_restart = http.get(f"/api/sessions/{sid}").json()

            # A reply whose client dropped goes on without it (--detached-turn-s): SIGTERM interrupts it too.
            away_sid = http.post("/api/sessions", json={"settings": {"temperature": 0, "max_tokens": 2000}}).json()[
                "id"
            ]
            endless = {"type": "regex", "pattern": "x{9000}"}  # no end before max_tokens: still running at SIGTERM
            with http.stream(
                "POST",
                f"/api/sessions/{away_sid}/messages",
                json={"content": "A very long story.", "response_format": endless},
            ) as r:
                away = [
                    json.loads(line[6:])
                    for line in itertools.takewhile(lambda line: line != "event: delta", r.iter_lines())
                    if line.startswith("data: ")
                ]

            # SIGTERM mid-reply: the stream ends with the reply stored as "interrupted".
            long_sid = http.post("/api/sessions", json={"settings": {"temperature": 0, "max_tokens": 400}}).json()["id"]
            events: list[dict[str, Any]] = []
            with http.stream(
                "POST",
                f"/api/sessions/{long_sid}/messages",
                json={"content": "Write a long story about a lighthouse keeper."},
            ) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(json.loads(line[6:]))
                        if sum(e["type"] == "delta" for e in events) == 3 and first.proc.poll() is None:
                            first.signal(signal.SIGTERM)
            assert first.wait_exit(60) in (0, -signal.SIGTERM)
    finally:
        first.kill()
    done = events[-1]
    assert (done["type"], done["status"], done["finish_reason"]) == ("done", "interrupted", "abort")
    streamed = "".join(e["text"] for e in events if e["type"] == "delta")
    assert db_reply(db, done["message_id"]) == ("interrupted", streamed)
    assert db_reply(db, [e for e in away if e["type"] == "message.created"][-1]["message"]["id"])[0] == "interrupted"

    second = ServerProcess(db_path=db, log_path=tmp_path / "second.log", api_key=None, admin_token=None).start()
    try:
        with httpx.Client(base_url=second.url, timeout=180) as http:
            listed = [s["id"] for s in http.get("/api/sessions").json()["data"]]
            assert [s for s in listed if s != away_sid] == [long_sid, sid]
            assert http.get(f"/api/sessions/{sid}").json() == before_restart
            interrupted = http.get(f"/api/sessions/{long_sid}").json()["messages"][-1]
            assert (interrupted["status"], interrupted["content"]) == ("interrupted", streamed)

            # The restored conversation goes on.
            with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Thanks!"}) as r:
                assert r.status_code == 200, r.read()
                assert sse_events(r.iter_lines())[-1]["status"] == "complete"
            assert len(http.get(f"/api/sessions/{sid}").json()["messages"]) == 4

            # SIGKILL mid-reply: whatever was stored by then survives.
            with http.stream(
                "POST",
                f"/api/sessions/{long_sid}/messages",
                json={"content": "Now write another long story, about a baker."},
            ) as r:
                received, reply_id, stored = "", None, None
                deadline = time.monotonic() + 120
                for line in r.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    ev = json.loads(line[6:])
                    if ev["type"] == "message.created" and ev["message"]["role"] == "assistant":
                        reply_id = ev["message"]["id"]
                    elif ev["type"] == "delta":
                        received += ev["text"]
                        stored = db_reply(db, reply_id)  # readable while the server writes (WAL)
                        if stored and stored[1]:
                            second.proc.kill()  # SIGKILL: no chance to clean up
                            break
                    assert time.monotonic() < deadline, "no progress write reached the database"
            second.wait_exit(30)
    finally:
        second.kill()
    status, content = db_reply(db, reply_id)  # type: ignore[misc]
    assert status == "streaming" and content
    assert received.startswith(content)  # the stored text is what was streamed, up to the last write

    # The next start marks it: nothing generates it any more.
    async def recover() -> int:
        store = Store(f"sqlite+aiosqlite:///{db}")
        try:
            return await store.mark_interrupted()
        finally:
            await store.close()

    assert asyncio.run(recover()) == 1
    assert db_reply(db, reply_id) == ("interrupted", content)


def test_sigterm_sends_done_to_websockets_before_closing(tmp_path: Path) -> None:
    srv = ServerProcess(
        db_path=tmp_path / "forge.db", log_path=tmp_path / "server.log", api_key=None, admin_token=None
    ).start()
    events: list[dict[str, Any]] = []
    try:
        with ws_connect(srv.ws_url) as ws:
            ws.send(json.dumps({"type": "session.create", "settings": {"temperature": 0, "max_tokens": 400}}))
            sid = json.loads(ws.recv(timeout=60))["session"]["id"]
            ws.send(json.dumps({"type": "message.send", "session_id": sid, "content": "Write a long story."}))
            while not any(e["type"] == "delta" for e in events):
                events.append(json.loads(ws.recv(timeout=60)))
            srv.signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    events.append(json.loads(ws.recv(timeout=60)))
        assert srv.wait_exit(60) in (0, -signal.SIGTERM)
    finally:
        srv.kill()
    done = events[-1]
    assert (done["type"], done["status"], done["finish_reason"]) == ("done", "interrupted", "abort")
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    streamed = "".join(e["text"] for e in events if e["type"] == "delta")
    assert db_reply(tmp_path / "forge.db", done["message_id"]) == ("interrupted", streamed)
