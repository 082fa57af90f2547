"""deploy/haproxy.cfg under a real HAProxy, in front of two stand-in replicas (plain HTTP servers that name
themselves in X-Forge-Replica): a session sticks to one replica whether its id comes in the path, the
X-Forge-Session header or the `session` query parameter; /v1 goes to the replica with fewer connections, or
follows the header; a replica failing /ready leaves the pool and only its sessions move; it comes back.

No model here: the replicas' own behaviour behind the front is tested with the cluster (scripts/cluster.sh).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
CHANGE_TIMEOUT_S = 30.0  # health checks every 1 s, two to change a server's state: a few seconds, more if loaded

pytestmark = pytest.mark.skipif(
    shutil.which("haproxy") is None,
    reason="HAProxy is not installed (Debian's haproxy package; `make test` installs it)",
)


@dataclass
class StandIn:
    """A replica's HTTP face: 200 to everything (503 on /ready while `failing`), naming itself; /v1/slow waits
    for `release` (a connection held open)."""

    name: str
    failing: bool = False
    release: threading.Event = field(default_factory=threading.Event)
    server: ThreadingHTTPServer | None = None

    def start(self) -> StandIn:
        me = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as two writes

            def _answer(self) -> None:
                if self.path.startswith("/v1/slow"):
                    me.release.wait(CHANGE_TIMEOUT_S)
                status = 503 if self.path == "/ready" and me.failing else 200
                body = me.name.encode()
                self.send_response(status)
                self.send_header("X-Forge-Replica", me.name)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.server_address[1]

    def stop(self) -> None:
        self.release.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(replicas: list[StandIn], stats: Path) -> str:
    """deploy/haproxy.cfg with these replicas between its `servers` marks (as scripts/cluster.sh does), and a
    stats socket to watch the health checks through."""
    text = (REPO / "deploy" / "haproxy.cfg").read_text()
    text = text.replace("global\n", f"global\n    stats socket {stats} mode 600 level admin\n", 1)

    def servers(m: re.Match) -> str:
        backend = text[: m.start()].rsplit("\nbackend ", 1)[1].split()[0]
        how = "check" if backend == "forge_sessions" else "track forge_sessions/{name}"
        lines = "".join(f"    server {r.name} 127.0.0.1:{r.port} {how.format(name=r.name)}\n" for r in replicas)
        return m.group(1) + lines + m.group(2)

    return re.sub(r"( *# servers\n)(?:.*\n)*?( *# end servers\n)", servers, text)


@dataclass
class Front:
    url: str
    stats: Path

    def states(self) -> dict[str, str]:
        """The session backend's servers and their state (UP, DOWN, ...)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.stats))
            s.sendall(b"show stat\n")
            data = b"".join(iter(lambda: s.recv(65536), b"")).decode()
        rows = [r.split(",") for r in data.splitlines() if r and not r.startswith("#")]
        return {
            r[1]: r[17].split()[0] for r in rows if r[0] == "forge_sessions" and r[1] not in ("FRONTEND", "BACKEND")
        }

    def wait_states(self, expected: dict[str, str]) -> None:
        deadline = time.monotonic() + CHANGE_TIMEOUT_S
        while (states := self.states()) != expected:
            assert time.monotonic() < deadline, f"HAProxy says {states}, not {expected}"
            time.sleep(0.1)


@pytest.fixture
def cluster() -> Iterator[tuple[Front, list[StandIn]]]:
    replicas = [StandIn("r1").start(), StandIn("r2").start()]
    tmp = Path(tempfile.mkdtemp(prefix="forge-haproxy-"))
    stats = tmp / "stats.sock"
    (tmp / "haproxy.cfg").write_text(config(replicas, stats))
    port = free_port()
    env = dict(os.environ, FORGE_FRONT=f"127.0.0.1:{port}")
    log = open(tmp / "haproxy.log", "wb")
    proc = subprocess.Popen(
        ["haproxy", "-db", "-f", str(tmp / "haproxy.cfg")], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    log.close()
    front = Front(f"http://127.0.0.1:{port}", stats)
    try:
        deadline = time.monotonic() + CHANGE_TIMEOUT_S
        while not stats.exists():
            assert proc.poll() is None, (tmp / "haproxy.log").read_text()
            assert time.monotonic() < deadline, "HAProxy did not start"
            time.sleep(0.05)
        front.wait_states({"r1": "UP", "r2": "UP"})
        yield front, replicas
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for r in replicas:
            r.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def replica_of(client: httpx.Client, sid: str) -> str:
    """Where each way of naming the session lands; they must agree."""
    answers = {
        "path": client.get(f"/api/sessions/{sid}/messages"),
        "header": client.get("/api/sessions", headers={"X-Forge-Session": sid}),
        "query": client.get("/ws", params={"session": sid}),
        "v1 with header": client.post("/v1/chat/completions", headers={"X-Forge-Session": sid}),
    }
    names = {how: r.headers["X-Forge-Replica"] for how, r in answers.items()}
    assert len(set(names.values())) == 1, (sid, names)
    assert all(r.text == r.headers["X-Forge-Replica"] for r in answers.values())  # passed through untouched
    return names["path"]


def test_sessions_stick_to_a_replica_and_only_a_failed_replicas_sessions_move(cluster) -> None:
    front, (r1, r2) = cluster
    with httpx.Client(base_url=front.url, timeout=30) as client:
        seeded = random.Random(25)  # fixed ids: where each lands is HAProxy's hash, the same every run
        sids = [uuid.UUID(int=seeded.getrandbits(128)).hex for _ in range(24)]
        home = {sid: replica_of(client, sid) for sid in sids}
        assert set(home.values()) == {"r1", "r2"}, "both replicas get sessions"
        assert {sid: replica_of(client, sid) for sid in sids} == home  # and keep them

        r1.failing = True  # r1 fails its health checks: out of the pool
        front.wait_states({"r1": "DOWN", "r2": "UP"})
        moved = {sid: replica_of(client, sid) for sid in sids}
        assert set(moved.values()) == {"r2"}
        r1.failing = False  # back: its sessions return to it, the others never moved
        front.wait_states({"r1": "UP", "r2": "UP"})
        assert {sid: replica_of(client, sid) for sid in sids} == home


def test_v1_without_a_session_goes_to_the_replica_with_fewer_connections(cluster) -> None:
    front, replicas = cluster
    held = {}

    def slow() -> None:
        held["replica"] = httpx.post(front.url + "/v1/slow", timeout=CHANGE_TIMEOUT_S * 2).headers["X-Forge-Replica"]

    waiting = threading.Thread(target=slow)
    waiting.start()
    try:
        busy = None
        deadline = time.monotonic() + CHANGE_TIMEOUT_S
        while busy is None:  # the held connection shows in HAProxy's current sessions of one server
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(str(front.stats))
                s.sendall(b"show stat\n")
                rows = [r.split(",") for r in b"".join(iter(lambda: s.recv(65536), b"")).decode().splitlines()]
            busy = next((r[1] for r in rows if r[0] == "forge_v1" and r[1].startswith("r") and r[4] == "1"), None)
            assert time.monotonic() < deadline, "the slow request never reached a replica"
            time.sleep(0.05)
        with httpx.Client(base_url=front.url, timeout=30) as client:
            others = {client.post("/v1/chat/completions").headers["X-Forge-Replica"] for _ in range(6)}
        assert others == {"r1", "r2"} - {busy}
    finally:
        for r in replicas:
            r.release.set()
        waiting.join(timeout=CHANGE_TIMEOUT_S)
    assert held["replica"] == busy
