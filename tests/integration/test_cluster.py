"""Two real replicas (`forge serve`, the default model) on one real PostgreSQL behind a real HAProxy, started by
scripts/cluster.sh: sessions stick to one replica across REST, SSE and WebSocket and both replicas get some; two
turns on one session through different replicas: one is `busy`; a replica whose lock connection is ended from
the database is fenced; a replica SIGKILLed mid-reply has its replies `interrupted` well within its lease,
earlier turns intact, the survivor's live reply untouched, and the session's next turn answered by the survivor;
the killed replica, started again, rejoins and gets its sessions back.

One cluster for the module (its replicas share the numba cache in the tree, so they do not compile again).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from app.store.liveness_pg import NAMESPACE, lock_key
from tests.postgres import unavailable

REPO = Path(__file__).resolve().parents[2]
# Long: a dead replica is found by its free lock (app.store.liveness) in well under a lease, so anything that
# happens before one has passed came from the lock, not the clock.
LEASE_TTL_S = 30.0
START_TIMEOUT_S = 400  # two replicas loading the model on a busy 2-core machine
WAIT_S = 60.0  # how long a state change may take here: leases, a sweep, HAProxy's checks (1 s, two failures)
LONG = "Write a long story about a lighthouse keeper."  # at temperature 0 a reply of hundreds of tokens

pytestmark = pytest.mark.skipif(
    shutil.which("haproxy") is None or unavailable() is not None,
    reason=f"needs HAProxy and PostgreSQL (`make test` installs Debian's haproxy and "
    f"postgresql): {unavailable() or 'haproxy is not installed'}",
)


def _free_ports(n: int) -> int:
    """A port p with p .. p + n - 1 free: the front, then one per replica (as scripts/cluster.sh numbers them)."""
    for _ in range(200):
        base = random.randrange(20000, 60000 - n)
        try:
            for p in range(base, base + n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return base
    raise RuntimeError("no free run of ports")


@dataclass
class Cluster:
    dir: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def replica_url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port + int(name[1:])}"

    def sh(self, *args: str) -> str:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
        env.update(
            FORGE_CLUSTER_DIR=str(self.dir),
            FORGE_CLUSTER_PORT=str(self.port),
            FORGE_PYTHON=sys.executable,
            FORGE_CLUSTER_READY_TIMEOUT_S=str(START_TIMEOUT_S),
            PYTHONUNBUFFERED="1",
            FORGE_SERVE_ARGS=f"--lease-ttl-s {LEASE_TTL_S} --threads 1 --keepalive-s 0.5",
        )
        done = subprocess.run(
            [str(REPO / "scripts" / "cluster.sh"), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S + 60,
        )
        assert done.returncode == 0, f"cluster.sh {' '.join(args)}: {done.stderr}\n{self.logs()}"
        return done.stdout

    def psql(self, sql: str) -> str:
        """One statement on the cluster's database (over its socket), as the `postgres` role; the rows as text."""
        done = subprocess.run(
            [
                "bash",
                "-c",
                'source "$0" && exec "$1/psql" -h "$2" -p "$PG_PORT" -U postgres -d forge -tAc "$3"',
                str(self.dir / "cluster.env"),
                os.environ.get("FORGE_PG_BIN", "/usr/lib/postgresql/15/bin"),
                str(self.dir / "run"),
                sql,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def logs(self, n: int = 30) -> str:
        out = []
        for log in sorted((self.dir / "logs").glob("*.log")):
            lines = log.read_text(errors="replace").splitlines()
            out.append(f"--- {log.name}\n" + "\n".join(line for line in lines[-n:]))
        return "\n".join(out)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix="forge-cluster-"))
    root.chmod(0o755)  # PostgreSQL runs as `postgres` under root and must reach its folder
    c = Cluster(root, _free_ports(3))
    try:
        c.sh("up", "2")
        yield c
    finally:
        try:
            c.sh("down")
        finally:
            shutil.rmtree(root, ignore_errors=True)


def sse(response: httpx.Response) -> Iterator[dict[str, Any]]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield json.loads(line[6:])


def turn(http: httpx.Client, sid: str, content: str, base: str = "") -> tuple[httpx.Response, list[dict[str, Any]]]:
    """One SSE turn to its end: the response (its headers) and its events (empty when refused)."""
    with http.stream("POST", f"{base}/api/sessions/{sid}/messages", json={"content": content}) as r:
        if r.status_code == 200:
            return r, list(sse(r))
        r.read()
        return r, [r.json()]


def new_session(http: httpx.Client, max_tokens: int = 6) -> tuple[str, str]:
    """A session created through the front, and the replica its requests land on."""
    sid = http.post("/api/sessions", json={"settings": {"temperature": 0, "max_tokens": max_tokens}}).json()["id"]
    return sid, home(http, sid)


def home(http: httpx.Client, sid: str, base: str = "") -> str:
    r = http.get(f"{base}/api/sessions/{sid}")
    assert r.status_code == 200, r.text
    return r.headers["X-Forge-Replica"]


def sessions_on(http: httpx.Client, names: tuple[str, ...], max_tokens: int = 6) -> dict[str, str]:
    """A new session homed on each replica in `names` (by consistent hash: 64 tries make a miss ~2**-64)."""
    found: dict[str, str] = {}
    for _ in range(64):
        sid, name = new_session(http, max_tokens)
        found.setdefault(name, sid)
        if all(n in found for n in names):
            return found
    raise AssertionError(f"64 sessions, all on {set(found)}: the front does not spread sessions")


def messages(http: httpx.Client, sid: str, base: str = "") -> list[dict[str, Any]]:
    return http.get(f"{base}/api/sessions/{sid}").json()["messages"]


def test_sessions_stick_to_one_replica_across_rest_sse_and_websocket(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.url, timeout=120) as http:
        homes = sessions_on(http, ("r1", "r2"))  # both replicas get sessions
        for name, sid in homes.items():
            r, events = turn(http, sid, "Hi there!")
            assert r.headers["X-Forge-Replica"] == name and events[-1]["status"] == "complete", events[-1]
            with ws_connect(f"ws://127.0.0.1:{cluster.port}/ws?session={sid}", open_timeout=60) as ws:
                assert ws.response.headers["X-Forge-Replica"] == name
                ws.send(json.dumps({"type": "message.send", "session_id": sid, "content": "Thanks!"}))
                while (ev := json.loads(ws.recv(timeout=120)))["type"] != "done":
                    assert ev["type"] != "error", ev
                assert ev["status"] == "complete"
            assert home(http, sid) == name
            assert [m["role"] for m in messages(http, sid)] == ["user", "assistant"] * 2


def test_two_turns_on_one_session_through_two_replicas_one_is_busy(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.url, timeout=120) as http:
        sid, _ = new_session(http, max_tokens=400)
        r1, r2 = cluster.replica_url("r1"), cluster.replica_url("r2")
        with http.stream("POST", f"{r1}/api/sessions/{sid}/messages", json={"content": LONG}) as first:
            events = sse(first)
            while next(events)["type"] != "delta":
                pass
            second, refused = turn(http, sid, "And another one.", base=r2)  # while the first streams on r1
            assert next(events)["type"] in ("delta", "done")  # it still ran then
            assert http.post(f"{r1}/api/sessions/{sid}/cancel").status_code == 200
        assert first.headers["X-Forge-Replica"] == "r1" and second.headers["X-Forge-Replica"] == "r2"
        assert second.status_code == 409 and refused[0]["error"]["code"] == "busy", refused
        # The first turn stopped, and its lease went with it: the session takes a turn on r2.
        http.patch(f"/api/sessions/{sid}", json={"settings": {"max_tokens": 4}})
        deadline = time.monotonic() + WAIT_S
        while (again := turn(http, sid, "Thanks!", base=r2))[0].status_code == 409:
            assert time.monotonic() < deadline, "the stopped turn's lease was never released"
            time.sleep(0.1)
        assert again[0].status_code == 200 and again[1][-1]["status"] == "complete", again[1][-1]


def test_a_replica_whose_lock_connection_is_ended_stops_its_turn_before_its_session_is_taken(
    cluster: Cluster,
) -> None:
    """Fencing: r1's lock connection is ended from the database's side while it streams. r1 stops the turn
    (`interrupted`), the session takes a turn on r2 at once, never with two replies streaming in it, and the
    cut reply is never written again; r1 joins again under a new lock."""
    with httpx.Client(base_url=cluster.url, timeout=120) as http:
        sid = sessions_on(http, ("r1",), max_tokens=400)["r1"]
        r1, r2 = cluster.replica_url("r1"), cluster.replica_url("r2")
        incarnation = cluster.psql("SELECT incarnation FROM replicas WHERE name = 'r1'")
        cut_events: list[dict[str, Any]] = []
        streaming = threading.Event()

        def cut_turn() -> None:
            url = f"{r1}/api/sessions/{sid}/messages"
            with httpx.Client(timeout=300) as other, other.stream("POST", url, json={"content": LONG}) as r:
                for ev in sse(r):
                    cut_events.append(ev)
                    if ev["type"] == "delta":
                        streaming.set()

        thread = threading.Thread(target=cut_turn)
        thread.start()
        try:
            assert streaming.wait(WAIT_S)
            ended = cluster.psql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                f" AND objsubid = 2 AND classid::bigint = {NAMESPACE} AND objid::bigint = {lock_key(incarnation)}"
            )
            assert ended == "1", ended
            cut_at = time.monotonic()
            while True:  # r2 takes the session as soon as it finds r1's lock free
                with http.stream("POST", f"{r2}/api/sessions/{sid}/messages", json={"content": "Go on."}) as r:
                    if r.status_code == 200:
                        events = sse(r)
                        while (ev := next(events))["type"] != "message.created" or ev["message"]["role"] != "user":
                            pass
                        stored = messages(http, sid, r2)
                        assert http.post(f"{r2}/api/sessions/{sid}/cancel").status_code == 200
                        list(events)
                        break
                    r.read()
                    assert r.status_code == 409 and time.monotonic() - cut_at < LEASE_TTL_S, r.text
                time.sleep(0.02)
            taken_s = time.monotonic() - cut_at
        finally:
            thread.join(300)
        # When r2's turn began, r1's reply was no longer streaming: one streaming reply in the session, r2's.
        assert [m["status"] for m in stored if m["role"] == "assistant"] == ["interrupted", "streaming"], stored
        done = cut_events[-1]
        assert (done["type"], done["status"]) == ("done", "interrupted"), done
        cut_reply = next(m for m in messages(http, sid, r2) if m["id"] == done["message_id"])
        streamed = "".join(e["text"] for e in cut_events if e["type"] == "delta")
        assert cut_reply["status"] == "interrupted" and streamed.startswith(cut_reply["content"])
        assert cut_reply == next(m for m in stored if m["id"] == done["message_id"])  # never written again
        print(f"\nfencing: lock connection ended -> session taken on r2 in {taken_s:.2f} s")

        deadline = time.monotonic() + WAIT_S
        while (again := cluster.psql("SELECT incarnation FROM replicas WHERE name = 'r1'")) == incarnation:
            assert time.monotonic() < deadline, "r1 never joined again"
            time.sleep(0.1)
        ready = httpx.get(r1 + "/ready", timeout=10).json()
        assert (ready["status"], ready["member"]) == ("ready", True) and again


def test_a_killed_replicas_replies_are_interrupted_and_its_sessions_go_on_elsewhere(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.url, timeout=120) as http:
        homes = sessions_on(http, ("r1", "r2"))
        dead, live = homes["r1"], homes["r2"]
        for sid in (dead, live):
            assert turn(http, sid, "Hi there!")[1][-1]["status"] == "complete"
            http.patch(f"/api/sessions/{sid}", json={"settings": {"max_tokens": 400}})
        earlier = messages(http, dead)

        live_events: list[dict[str, Any]] = []
        live_started = threading.Event()

        def live_turn() -> None:
            url = f"{cluster.url}/api/sessions/{live}/messages"
            with httpx.Client(timeout=300) as other, other.stream("POST", url, json={"content": LONG}) as r:
                for ev in sse(r):
                    live_events.append(ev)
                    live_started.set()

        watcher = threading.Thread(target=live_turn)
        watcher.start()
        try:
            with http.stream("POST", f"/api/sessions/{dead}/messages", json={"content": LONG}) as r:
                events = sse(r)
                while (ev := next(events))["type"] != "delta":
                    if ev["type"] == "message.created" and ev["message"]["role"] == "assistant":
                        cut = ev["message"]["id"]
                assert live_started.wait(WAIT_S)
                cluster.sh("kill", "r1")
                killed = time.monotonic()
            # r1's reply is interrupted by the survivor, which finds r1's lock free; the survivor's own reply
            # streams on untouched.
            survivor = cluster.replica_url("r2")
            while (last := messages(http, dead, survivor)[-1])["status"] == "streaming":
                live_reply = next(m for m in reversed(messages(http, live, survivor)) if m["role"] == "assistant")
                assert live_reply["status"] in ("streaming", "complete"), live_reply
                assert time.monotonic() - killed < LEASE_TTL_S, "the killed replica's reply is still 'streaming'"
                time.sleep(0.05)
            interrupted_s = time.monotonic() - killed
            assert (last["id"], last["status"]) == (cut, "interrupted")
            assert messages(http, dead, survivor)[: len(earlier)] == earlier
            # The session's next turn goes through the front to the survivor (HAProxy redispatches a refused
            # connection, then takes r1 out): its lease was freed with the dead replica. The survivor's own
            # reply streams on meanwhile.
            http.patch(f"/api/sessions/{dead}", json={"settings": {"max_tokens": 4}})
            r, events, answered_s = None, [], 0.0
            while True:
                try:
                    with http.stream("POST", f"/api/sessions/{dead}/messages", json={"content": "Still there?"}) as r:
                        if r.status_code == 200:
                            answered_s = time.monotonic() - killed  # its answer began: the turn was taken
                            events = list(sse(r))
                            if events[-1]["type"] == "done":
                                break
                        r.read()
                except httpx.HTTPError:
                    pass
                assert time.monotonic() - killed < LEASE_TTL_S, f"no answer since the kill: {r and r.status_code}"
                time.sleep(0.05)
            print(
                f"\nfailover: kill -> reply interrupted {interrupted_s:.2f} s, next turn answered {answered_s:.2f} s,"
                f" done {time.monotonic() - killed:.2f} s"
            )
            assert r.headers["X-Forge-Replica"] == "r2" and events[-1]["status"] == "complete"
        finally:
            watcher.join(300)
        assert live_events[-1]["type"] == "done" and live_events[-1]["status"] == "complete", live_events[-1]
        stored = next(m for m in reversed(messages(http, live)) if m["role"] == "assistant")
        streamed = "".join(e["text"] for e in live_events if e["type"] == "delta")
        assert (stored["status"], stored["content"]) == ("complete", streamed)

        # Started again, r1 rejoins: it is ready and a member, and its sessions come back to it.
        cluster.sh("start", "r1")
        ready = httpx.get(cluster.replica_url("r1") + "/ready", timeout=10).json()
        assert (ready["status"], ready["replica"], ready["member"]) == ("ready", "r1", True)
        assert home(http, dead) == "r1"
        r, events = turn(http, dead, "Welcome back.")
        assert r.headers["X-Forge-Replica"] == "r1" and events[-1]["status"] == "complete"
        assert len(messages(http, dead)) == len(earlier) + 6
