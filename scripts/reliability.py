"""Reliability figures for a live `forge serve` (its own server, on 127.0.0.1, in a temp folder):

  load   64 WebSocket clients x 10 turns (anonymous: one owner, as behind a proxy; --keyed-load: one API key
         each): errors, turns lost, TTFT p50/p95
  crash  SIGKILL with 16 replies streaming, restart: completed turns intact, partials `interrupted`,
         every session usable again
  fuzz   >= 10,000 hostile inputs (scripts/hostile.py): 5xx, dead sockets, server RSS before/after
  slow   50 clients that never read while 4 others stream: server RSS, the others' ITL with and without them

    python scripts/reliability.py [--only load,crash,fuzz,slow] [--json]

A measurement script, not a test: the numbers go in docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from scripts import hostile  # noqa: E402

TIMEOUT_S = 600.0


class Server:
    """`python -m app.server` on a free loopback port; `keys` are its API keys (none: anonymous clients)."""

    def __init__(self, folder: Path, keys: list[str], env: dict[str, str] | None = None) -> None:
        self.folder, self.keys, self.env = folder, keys, env or {}
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
        env.update(self.env, PYTHONUNBUFFERED="1")
        if self.keys:
            env["FORGE_API_KEY"] = ",".join(self.keys)
        log = open(self.folder / "server.log", "ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.server",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                "--db",
                f"sqlite+aiosqlite:///{self.folder / 'forge.db'}",
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.3)
        raise RuntimeError("the server did not get ready")

    def rss_mb(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def auth(self, i: int = 0) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[i % len(self.keys)]}"} if self.keys else {}

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(60)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))], 1)


async def recv(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT_S))


async def new_session(ws: ClientConnection, **settings: Any) -> str:
    await ws.send(json.dumps({"type": "session.create", "settings": {"temperature": 0, **settings}}))
    while (ev := await recv(ws))["type"] != "session":
        pass
    return ev["session"]["id"]


async def turn(ws: ClientConnection, sid: str, content: str) -> tuple[dict[str, Any], float | None, str]:
    """Send one message; (done or error event, ms to the first delta, streamed text)."""
    start = time.monotonic()
    first, text = None, []
    await ws.send(json.dumps({"type": "message.send", "session_id": sid, "content": content}))
    while True:
        ev = await recv(ws)
        if ev["type"] == "delta":
            first = first or (time.monotonic() - start) * 1000
            text.append(ev["text"])
        elif ev["type"] in ("done", "error") and ev.get("session_id") == sid:
            return ev, first, "".join(text)


# -- load ----------------------------------------------------------------------------------------


async def load(folder: Path, clients: int, turns: int, max_tokens: int, keyed: bool = False) -> dict[str, Any]:
    srv = Server(folder, [f"load-key-{i}" for i in range(clients)] if keyed else []).start()
    try:
        ttfts: list[float] = []
        errors: list[str] = []
        done_ok = 0

        async def client(i: int) -> str:
            nonlocal done_ok
            async with connect(srv.url.replace("http", "ws") + "/ws", additional_headers=srv.auth(i)) as ws:
                sid = await new_session(ws, max_tokens=max_tokens)
                for t in range(turns):
                    ev, ttft, _ = await turn(ws, sid, f"Client {i}, question {t}: name a colour.")
                    if ev["type"] == "error" or ev["status"] != "complete":
                        errors.append(ev.get("code") or ev["status"])
                    else:
                        done_ok += 1
                    if ttft is not None:
                        ttfts.append(ttft)
                return sid

        started = time.monotonic()
        sids = await asyncio.gather(*(client(i) for i in range(clients)))
        wall = time.monotonic() - started
        stored_ok = 0
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as http:
            for i, sid in enumerate(sids):
                msgs = (await http.get(f"/api/sessions/{sid}", headers=srv.auth(i))).json()["messages"]
                stored_ok += sum(m["role"] == "assistant" and m["status"] == "complete" for m in msgs)
        return {
            "clients": clients,
            "keys": clients if keyed else 0,
            "turns": clients * turns,
            "max_tokens": max_tokens,
            "errors": len(errors),
            "turns_lost": clients * turns - min(done_ok, stored_ok),
            "ttft_ms_p50": pct(ttfts, 50),
            "ttft_ms_p95": pct(ttfts, 95),
            "wall_s": round(wall, 1),
        }
    finally:
        srv.stop()


# -- crash ---------------------------------------------------------------------------------------


async def crash(folder: Path, replies: int) -> dict[str, Any]:
    keys = [f"crash-key-{i}" for i in range(replies)]
    srv = Server(folder, keys).start()
    ws_url = srv.url.replace("http", "ws") + "/ws"
    http = httpx.AsyncClient(base_url=srv.url, timeout=120)
    sockets = [await connect(ws_url, additional_headers=srv.auth(i)) for i in range(replies)]
    sids, firsts, partial = [], [], [""] * replies
    for i, ws in enumerate(sockets):
        sid = await new_session(ws, max_tokens=4)
        ev, _, text = await turn(ws, sid, "Say hello.")
        assert ev["type"] == "done" and ev["status"] == "complete", ev
        await http.patch(f"/api/sessions/{sid}", json={"settings": {"max_tokens": 400}}, headers=srv.auth(i))
        sids.append(sid)
        firsts.append(text)
    for ws, sid in zip(sockets, sids):
        await ws.send(json.dumps({"type": "message.send", "session_id": sid, "content": "Write a long story."}))

    async def until_delta(i: int) -> None:
        while True:
            ev = await recv(sockets[i])
            if ev["type"] == "delta":
                partial[i] += ev["text"]
                return

    await asyncio.gather(*(until_delta(i) for i in range(replies)))
    await asyncio.sleep(1.0)  # a progress write or two
    srv.stop(signal.SIGKILL)  # mid-stream, all of them
    for ws in sockets:
        try:
            while True:
                ev = await asyncio.wait_for(ws.recv(), 5)
                partial[sockets.index(ws)] += json.loads(ev).get("text", "")
        except (TimeoutError, ConnectionClosed):
            pass
    await http.aclose()

    srv.start()  # same database
    intact = interrupted = prefix_ok = usable = 0
    async with httpx.AsyncClient(base_url=srv.url, timeout=120) as http:
        for i, sid in enumerate(sids):
            msgs = (await http.get(f"/api/sessions/{sid}", headers=srv.auth(i))).json()["messages"]
            intact += [m["status"] for m in msgs[:2]] == ["complete", "complete"] and msgs[1]["content"] == firsts[i]
            last = msgs[-1]
            interrupted += last["status"] == "interrupted"
            prefix_ok += partial[i].startswith(last["content"])
        async with connect(ws_url, additional_headers=srv.auth(0)) as ws:
            pass
        for i, sid in enumerate(sids):
            await http.patch(f"/api/sessions/{sid}", json={"settings": {"max_tokens": 4}}, headers=srv.auth(i))
            async with http.stream(
                "POST", f"/api/sessions/{sid}/messages", json={"content": "Thanks!"}, headers=srv.auth(i)
            ) as r:
                lines = [ln async for ln in r.aiter_lines() if ln.startswith("data: ")]
            usable += json.loads(lines[-1][6:]).get("status") == "complete"
    srv.stop()
    return {
        "streaming_at_kill": replies,
        "completed_turns_intact": intact,
        "partials_interrupted": interrupted,
        "partials_match_what_was_streamed": prefix_ok,
        "sessions_usable_after_restart": usable,
    }


# -- fuzz ----------------------------------------------------------------------------------------


async def fuzz(folder: Path, n: int, seed: int) -> dict[str, Any]:
    srv = Server(folder, ["fuzz-key"], {"FORGE_WS_COMMANDS_PER_S": "100000"}).start()
    try:
        sid = httpx.post(
            srv.url + "/api/sessions",
            headers=srv.auth(),
            timeout=60,
            json={"settings": {"temperature": 0, "max_tokens": 1}},
        ).json()["id"]
        cases = hostile.cases(seed=seed, n=n, session_id=sid)
        # warm-up: first-use allocations (the largest bodies' included) are not growth
        await hostile.run(srv.url, srv.auth(), hostile.largest_cases() + cases[:200])
        before = srv.rss_mb()
        started = time.monotonic()
        tally = await hostile.run(srv.url, srv.auth(), cases)
        alive = httpx.get(srv.url + "/health", timeout=10).status_code == 200
        return {
            "inputs": tally.sent,
            "5xx": tally.server_errors,
            "hangs": tally.hangs,
            "busy_503": tally.busy,
            "dead_sockets": tally.dead_sockets,
            "server_alive": alive,
            "statuses": dict(tally.statuses.most_common(12)),
            "rss_mb_before": round(before, 1),
            "rss_mb_after": round(srv.rss_mb(), 1),
            "wall_s": round(time.monotonic() - started, 1),
            "notes": tally.notes[:5],
        }
    finally:
        srv.stop()


# -- slow readers --------------------------------------------------------------------------------


async def itl_ms(srv: Server, clients: int, max_tokens: int) -> float:
    """Median gap between deltas seen by `clients` normal readers, one long turn each."""
    gaps: list[float] = []

    async def reader(i: int) -> None:
        async with connect(srv.url.replace("http", "ws") + "/ws", additional_headers=srv.auth(i)) as ws:
            sid = await new_session(ws, max_tokens=max_tokens)
            await ws.send(json.dumps({"type": "message.send", "session_id": sid, "content": "Write a long story."}))
            last = None
            while (ev := await recv(ws))["type"] != "done":
                if ev["type"] == "delta":
                    now = time.monotonic()
                    if last is not None:
                        gaps.append((now - last) * 1000)
                    last = now

    await asyncio.gather(*(reader(i) for i in range(clients)))
    return round(statistics.median(gaps), 1)


async def slow(folder: Path, slow_clients: int, readers: int) -> dict[str, Any]:
    srv = Server(folder, ["reader-key", "slow-key"]).start()
    try:
        # A session with a ~100 kB history: every `session.open` of it answers a ~100 kB event.
        big = {
            "forge_export": 1,
            "session": {"title": "big"},
            "messages": [
                {"role": "user" if i % 2 == 0 else "assistant", "content": "lorem ipsum " * 200} for i in range(40)
            ],
        }
        sid = httpx.post(srv.url + "/api/sessions/import", json=big, headers=srv.auth(1), timeout=60).json()["id"]
        baseline = await itl_ms(srv, readers, 64)
        rss_before = peak = srv.rss_mb()
        stop = asyncio.Event()

        async def never_reads() -> None:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", srv.port))
            ws = await connect(
                srv.url.replace("http", "ws") + "/ws", additional_headers=srv.auth(1), sock=sock, max_queue=1
            )
            try:
                while not stop.is_set():  # asks for ~100 kB a second and reads none of it
                    await ws.send(json.dumps({"type": "session.open", "session_id": sid}))
                    await asyncio.sleep(1.0)
            except (ConnectionClosed, OSError):
                pass  # the server gave up on us
            finally:
                ws.transport.abort()

        def open_sockets() -> int:
            return httpx.get(srv.url + "/admin/api/stats", timeout=30).json()["websocket_connections"]

        async def sample() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, srv.rss_mb())
                await asyncio.sleep(0.2)

        flood = [asyncio.create_task(never_reads()) for _ in range(slow_clients)]
        sampler = asyncio.create_task(sample())
        await asyncio.sleep(2.0)
        opened = open_sockets()
        during = await itl_ms(srv, readers, 64)
        deadline = time.monotonic() + 120
        while open_sockets() > 0 and time.monotonic() < deadline:  # the server cuts them off (4008)
            await asyncio.sleep(1.0)
        left = open_sockets()
        stop.set()
        await asyncio.gather(*flood, sampler)
        return {
            "slow_clients": slow_clients,
            "open_while_measuring": opened,
            "still_open_after_120s": left,
            "rss_mb_before": round(rss_before, 1),
            "rss_mb_peak": round(peak, 1),
            "rss_mb_after": round(srv.rss_mb(), 1),
            "others_itl_ms_p50_alone": baseline,
            "others_itl_ms_p50_with_slow_clients": during,
        }
    finally:
        srv.stop()


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="load,crash,fuzz,slow")
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=4, help="per load turn (2 cores: keep it small)")
    p.add_argument("--keyed-load", action="store_true", help="load: one API key per client (default: anonymous)")
    p.add_argument("--fuzz", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="forge-reliability-") as tmp:
        for name in args.only.split(","):
            folder = Path(tmp) / name
            folder.mkdir()
            if name == "load":
                results[name] = await load(folder, args.clients, args.turns, args.max_tokens, args.keyed_load)
            elif name == "crash":
                results[name] = await crash(folder, 16)
            elif name == "fuzz":
                results[name] = await fuzz(folder, args.fuzz, args.seed)
            elif name == "slow":
                results[name] = await slow(folder, 50, 4)
            else:
                raise SystemExit(f"unknown part {name!r}; choose from load, crash, fuzz, slow")
            print(json.dumps({name: results[name]}) if args.json else f"{name}: {results[name]}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
