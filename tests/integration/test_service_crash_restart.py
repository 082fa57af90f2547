"""A crash never strands a conversation (SQLite, one server at a time): a real server SIGKILLed while 16 SSE
clients stream long replies, then started again on the same database, once at the same address (its name taken
over) and once at another port (another name: the old one's file lock is free, so it is found dead at start).
Both times, at /ready: 16/16 cut replies are `interrupted`, each stored text a prefix of what its client
received, and 16/16 sessions take a new turn at the first try (none `busy`).
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import time
from pathlib import Path

import httpx

from tests.integration.conftest import ServerProcess, free_port

STREAMS = 16
ENDLESS = {"type": "regex", "pattern": "x{9000}"}  # no end before the kill, whatever the model prefers
WAIT_S = 120.0  # generous: 16 replies share 2 busy cores


def stored(db: Path, message_ids: list[str]) -> dict[str, tuple[str, str]]:
    con = sqlite3.connect(db)
    try:
        marks = ",".join("?" * len(message_ids))
        rows = con.execute(f"SELECT id, status, content FROM messages WHERE id IN ({marks})", message_ids).fetchall()
    finally:
        con.close()
    return {r[0]: (r[1], r[2]) for r in rows}


async def stream_then_kill(srv: ServerProcess, db: Path) -> tuple[list[str], dict[str, str]]:
    """16 sessions streaming; SIGKILL once every reply has some text stored. Returns the sessions and each
    reply's text as its client received it (read to the end of the cut stream)."""
    received: dict[str, str] = {}
    replies: list[str] = []
    async with httpx.AsyncClient(base_url=srv.url, timeout=WAIT_S) as http:
        sids = []
        for _ in range(STREAMS):
            r = await http.post("/api/sessions", json={"settings": {"temperature": 0, "max_tokens": 4000}})
            sids.append(r.json()["id"])

        async def one(sid: str) -> None:
            body = {"content": "Go on.", "response_format": ENDLESS}
            try:
                async with http.stream("POST", f"/api/sessions/{sid}/messages", json=body) as r:
                    rid = None
                    async for line in r.aiter_lines():
                        if not line.startswith("data: "):
                            continue
                        ev = json.loads(line[6:])
                        if ev["type"] == "message.created" and ev["message"]["role"] == "assistant":
                            rid = ev["message"]["id"]
                            replies.append(rid)
                            received[rid] = ""
                        elif ev["type"] == "delta":
                            received[ev["message_id"]] += ev["text"]
                    assert rid is not None
            except httpx.HTTPError:  # the server died mid-stream: what was read is kept
                pass

        tasks = [asyncio.create_task(one(sid)) for sid in sids]
        deadline = time.monotonic() + WAIT_S
        while len(replies) < STREAMS or not all(c for _, c in stored(db, replies).values()):
            assert time.monotonic() < deadline, f"not all {STREAMS} replies stored text: {stored(db, replies)}"
            await asyncio.sleep(0.05)
        srv.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        srv.wait_exit(30)
        await asyncio.wait_for(asyncio.gather(*tasks), WAIT_S)
    return sids, received


async def next_turns(srv: ServerProcess, sids: list[str], ready_at: float) -> list[float]:
    """A short new turn in every session at once; each must be taken at the first try. Returns the seconds
    from /ready to each turn's reply being created."""
    async with httpx.AsyncClient(base_url=srv.url, timeout=WAIT_S) as http:

        async def one(sid: str) -> float:
            await http.patch(f"/api/sessions/{sid}", json={"settings": {"max_tokens": 2}})
            async with http.stream("POST", f"/api/sessions/{sid}/messages", json={"content": "Thanks."}) as r:
                if r.status_code != 200:
                    raise AssertionError(f"session {sid}: {r.status_code} {(await r.aread()).decode()}")
                created, last = None, None
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        last = json.loads(line[6:])
                        if (
                            created is None
                            and last["type"] == "message.created"
                            and last["message"]["role"] == "assistant"
                        ):
                            created = time.monotonic() - ready_at
                assert last is not None and last["type"] == "done" and last["status"] == "complete", last
                assert created is not None
                return created

        return list(await asyncio.gather(*(one(sid) for sid in sids)))


def check_restart(srv: ServerProcess, db: Path, sids: list[str], received: dict[str, str], label: str) -> None:
    ready_at = time.monotonic()  # srv.start() returned on the first 200 from /ready
    rows = stored(db, list(received))
    assert len(rows) == STREAMS
    for rid, (status, content) in rows.items():
        assert status == "interrupted", (rid, status)
        assert content and received[rid].startswith(content), (rid, content[:40], received[rid][:40])
    waits = asyncio.run(next_turns(srv, sids, ready_at))
    print(f"\n{label}: {STREAMS}/{STREAMS} interrupted at /ready; new turns in {min(waits):.2f}-{max(waits):.2f} s")
    assert max(waits) < WAIT_S


def test_sigkill_with_16_streaming_then_restart_at_the_same_and_another_address(tmp_path: Path) -> None:
    db = tmp_path / "forge.db"

    def server(port: int, name: str) -> ServerProcess:
        return ServerProcess(db_path=db, log_path=tmp_path / f"{name}.log", api_key=None, admin_token=None, port=port)

    port = free_port()
    first = server(port, "first").start()
    try:
        sids, received = asyncio.run(stream_then_kill(first, db))
    finally:
        first.kill()

    same = server(port, "same-address").start()
    try:
        check_restart(same, db, sids, received, "same address")
        sids, received = asyncio.run(stream_then_kill(same, db))
    finally:
        same.kill()

    moved = server(free_port(), "another-port").start()
    try:
        check_restart(moved, db, sids, received, "another port")
    finally:
        moved.stop()
