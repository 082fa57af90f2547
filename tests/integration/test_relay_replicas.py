"""Live events on every replica (app/domain/relay.py over PostgreSQL's LISTEN/NOTIFY): two real servers on one
real PostgreSQL; a reply streams on A while clients watch it on B, each reached at its own port (so which replica
serves whom is known): a WebSocket that opens the session, one that resumes the turn from its start, and an SSE
stream resumed with `Last-Event-ID`. Each gets the same events, numbered alike, byte for byte, as the same kind of
client on A, and gets them while the reply streams (not the stored copy at its end). The lag behind A's own
client is measured per event and printed; only a generous bound is asserted (the machine may be busy).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.integration.conftest import ServerProcess
from tests.postgres import Postgres

PROMPT = "Write a long story about a lighthouse keeper."  # at temperature 0, longer than MAX_TOKENS
MAX_TOKENS = 130
WAIT_S = 120.0  # the whole reply, generous: two servers share a busy 2-core machine
LAG_BOUND_S = 2.0  # the target is 0.2 s at p95; asserted generously, printed as measured


@dataclass
class PgServer(ServerProcess):
    """A server on a PostgreSQL database, under a replica name of its own."""

    database: str = ""

    @property
    def db_url(self) -> str:
        return self.database


@pytest.fixture(scope="module")
def replicas(postgres: Postgres, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[PgServer, PgServer]]:
    url = postgres.database()
    logs = tmp_path_factory.mktemp("relay")
    servers = [
        PgServer(
            db_path=logs / "unused.db",
            log_path=logs / f"{name}.log",
            api_key=None,
            admin_token=None,
            env={"FORGE_REPLICA_NAME": name},
            database=url,
        )
        for name in ("a", "b")
    ]
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda s: s.start(), servers))
        yield servers[0], servers[1]
    finally:
        for s in servers:
            s.stop()


@dataclass
class Seen:
    """What one client received: each event's number, arrival time and raw text (a frame, or SSE data)."""

    events: dict[int, tuple[float, str]] = field(default_factory=dict)
    text: str = ""  # the reply: the content it was first shown with, then its deltas
    live_from: int = 0  # events after this one came live (those before were replayed)
    done_at: float | None = None

    def add(self, seq: int, raw: str, ev: dict[str, Any], message_id: str) -> None:
        assert seq not in self.events, f"event {seq} twice"
        self.events[seq] = (time.monotonic(), raw)
        if ev.get("type") == "delta" and ev.get("message_id") == message_id:
            self.text += ev.get("text") or ""
        if ev.get("type") == "done":
            self.done_at = time.monotonic()


async def ws_watch(base: str, send: dict[str, Any], message_id: str, seen: Seen) -> None:
    """A WebSocket client sending `send` (session.open or turn.resume) and reading until the reply's `done`."""
    async with connect(base.replace("http", "ws") + "/ws") as ws:
        await ws.send(json.dumps(send))
        while seen.done_at is None:
            raw = await ws.recv()
            assert isinstance(raw, str)
            ev = json.loads(raw)
            if ev["type"] == "history":  # session.open: the reply as far as it got, the rest follows
                reply = next(m for m in ev["messages"] if m["id"] == message_id)
                assert reply["status"] == "streaming", "the reply ended before the watcher came"
                seen.text, seen.live_from = reply["content"], ev["seq"]
            elif ev["type"] == "turn.resumed":
                seen.live_from = ev["seq"]
            elif "seq" in ev:
                seen.add(ev["seq"], raw, ev, message_id)


async def sse_watch(base: str, sid: str, message_id: str, after: int, seen: Seen) -> None:
    """An SSE client resuming the reply's events after `after` (Last-Event-ID), until `done`."""
    seen.live_from = after
    url = f"{base}/api/sessions/{sid}/messages/{message_id}/events"
    headers = {"Last-Event-ID": str(after)}
    async with httpx.AsyncClient(timeout=WAIT_S) as http, http.stream("GET", url, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        seq = None
        async for line in r.aiter_lines():
            if line.startswith("id:"):
                seq = int(line[3:].strip())
            elif line.startswith("data:") and seq is not None:
                data = line[5:].strip()
                seen.add(seq, data, json.loads(data), message_id)
                seq = None
                if seen.done_at is not None:
                    return


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, round(0.95 * len(ordered)) - 1)]


async def stream_and_watch(a: str, b: str) -> dict[str, Seen]:
    async with httpx.AsyncClient(base_url=a, timeout=30) as http:
        settings = {"temperature": 0, "max_tokens": MAX_TOKENS}
        sid = (await http.post("/api/sessions", json={"settings": settings})).json()["id"]
    seen = {k: Seen() for k in ("a.sender", "a.resume", "b.resume", "b.open", "a.sse", "b.sse")}
    watchers: list[asyncio.Task] = []
    async with connect(a.replace("http", "ws") + "/ws") as ws:
        await ws.send(json.dumps({"type": "message.send", "client_id": "c1", "session_id": sid, "content": PROMPT}))
        message_id = ""
        async with asyncio.timeout(WAIT_S):
            while seen["a.sender"].done_at is None:
                raw = await ws.recv()
                assert isinstance(raw, str)
                ev = json.loads(raw)
                assert ev["type"] != "error", ev
                if ev["type"] == "message.created" and ev["message"]["role"] == "assistant":
                    message_id = ev["message"]["id"]
                    # Every watcher comes as the reply starts: A's own and B's side by side, from the same event on.
                    resume = {"type": "turn.resume", "session_id": sid, "message_id": message_id, "after_seq": 0}
                    watchers += [
                        asyncio.create_task(ws_watch(a, resume, message_id, seen["a.resume"])),
                        asyncio.create_task(ws_watch(b, resume, message_id, seen["b.resume"])),
                        asyncio.create_task(
                            ws_watch(b, {"type": "session.open", "session_id": sid}, message_id, seen["b.open"])
                        ),
                        asyncio.create_task(sse_watch(a, sid, message_id, ev["seq"], seen["a.sse"])),
                        asyncio.create_task(sse_watch(b, sid, message_id, ev["seq"], seen["b.sse"])),
                    ]
                if "seq" in ev:
                    seen["a.sender"].add(ev["seq"], raw, ev, message_id)
            await asyncio.gather(*watchers)
    return seen


def test_a_reply_streaming_on_one_replica_is_watched_live_on_the_other(replicas: tuple[PgServer, PgServer]) -> None:
    a, b = replicas
    seen = asyncio.run(stream_and_watch(a.url, b.url))
    sender = seen["a.sender"]
    deltas = sum(1 for _, raw in sender.events.values() if '"type":"delta"' in raw)
    assert deltas >= 50, f"only {deltas} deltas: too short a reply to measure"

    # The same text everywhere, and the same events numbered alike: byte for byte against A's same kind of client.
    for name in ("a.resume", "b.resume", "b.open", "a.sse", "b.sse"):
        assert seen[name].text == sender.text, name
    assert [raw for _, raw in seen["b.resume"].events.values()] == [raw for _, raw in seen["a.resume"].events.values()]
    assert list(seen["b.resume"].events) == list(range(1, max(sender.events) + 1))
    assert [raw for _, raw in seen["b.sse"].events.values()] == [raw for _, raw in seen["a.sse"].events.values()]
    opened = seen["b.open"]
    assert [raw for _, raw in opened.events.values()] == [
        raw for seq, (_, raw) in seen["a.resume"].events.items() if seq > opened.live_from
    ]

    # Live: B's clients got most of the reply's deltas before it ended, not the stored copy at its end.
    assert sender.done_at is not None
    for name in ("b.resume", "b.open", "b.sse"):
        early = sum(1 for t, raw in seen[name].events.values() if t < sender.done_at and '"delta"' in raw)
        assert early >= deltas // 2, (name, early, deltas)

    # The lag behind A's own client, per event that came live to both.
    report = []
    for name in ("b.resume", "b.sse"):
        other = seen[name]
        lags = [
            other.events[seq][0] - t
            for seq, (t, _) in sender.events.items()
            if seq > max(other.live_from, seen["a.resume"].live_from) and seq in other.events
        ]
        assert len(lags) >= 50, (name, len(lags))
        report.append(f"{name}: p95 {p95(lags) * 1000:.1f} ms over {len(lags)} events (max {max(lags) * 1000:.1f})")
        assert p95(lags) < LAG_BOUND_S, report[-1]
    print("\nlag of B's watchers behind A's: " + "; ".join(report))


def test_the_relay_is_off_on_sqlite(tmp_path: Path) -> None:
    """One process on SQLite: no relay and no connection of its own (app.domain.relay.open_relay)."""
    from app.domain.relay import open_relay
    from app.domain.replay import Replays
    from app.store import Store

    async def check() -> None:
        store = Store(f"sqlite+aiosqlite:///{tmp_path / 'forge.db'}")
        try:
            assert await open_relay(Replays(), store) is None
        finally:
            await store.close()

    asyncio.run(check())
