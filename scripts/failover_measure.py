"""Failover of a SIGKILLed replica, measured N times (docs/scale-out.md, "Failures"): two replicas on one
PostgreSQL behind HAProxy (scripts/cluster.sh, in a temporary folder); each round streams a long reply on each
replica, SIGKILLs r1, and times (from the kill) the cut reply becoming `interrupted` (read on r2) and the cut
session's next turn answered through the front; the survivor's reply must end `complete`, as streamed. Then r1
is started again for the next round.

    .venv/bin/python scripts/failover_measure.py [--rounds 10] [--port 18080]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
LONG = "Write a long story about a lighthouse keeper."


def sh(root: Path, port: int, *args: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    env.update(
        FORGE_CLUSTER_DIR=str(root),
        FORGE_CLUSTER_PORT=str(port),
        FORGE_PYTHON=sys.executable,
        FORGE_SERVE_ARGS="--threads 1 --keepalive-s 0.5",
    )
    subprocess.run([str(REPO / "scripts" / "cluster.sh"), *args], env=env, check=True, capture_output=True)


def sse(r: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def session_on(http: httpx.Client, name: str) -> str:
    for _ in range(64):
        sid = http.post("/api/sessions", json={"settings": {"temperature": 0, "max_tokens": 300}}).json()["id"]
        if http.get(f"/api/sessions/{sid}").headers["X-Forge-Replica"] == name:
            return sid
    raise RuntimeError(f"no session homed on {name}")


def last_status(base: str, sid: str) -> str:
    return httpx.get(f"{base}/api/sessions/{sid}", timeout=30).json()["messages"][-1]["status"]


def round_(front: str, r2: str, root: Path, port: int) -> tuple[float, float]:
    with httpx.Client(base_url=front, timeout=300) as http:
        dead, live = session_on(http, "r1"), session_on(http, "r2")
        live_events: list[dict[str, Any]] = []
        started = threading.Event()

        def live_turn() -> None:
            with (
                httpx.Client(timeout=300) as c,
                c.stream("POST", f"{front}/api/sessions/{live}/messages", json={"content": LONG}) as r,
            ):
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        live_events.append(json.loads(line[6:]))
                        started.set()

        t = threading.Thread(target=live_turn)
        t.start()
        with http.stream("POST", f"/api/sessions/{dead}/messages", json={"content": LONG}) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and json.loads(line[6:])["type"] == "delta":
                    break
            started.wait(120)
            sh(root, port, "kill", "r1")
            killed = time.monotonic()
        while last_status(r2, dead) == "streaming":
            time.sleep(0.02)
        interrupted = time.monotonic() - killed
        http.patch(f"/api/sessions/{dead}", json={"settings": {"max_tokens": 2}})
        while True:
            try:
                with http.stream("POST", f"/api/sessions/{dead}/messages", json={"content": "Still there?"}) as r:
                    if r.status_code == 200:
                        answered = time.monotonic() - killed
                        sse(r)
                        break
                    r.read()
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        t.join(300)
        done = live_events[-1]
        streamed = "".join(e["text"] for e in live_events if e["type"] == "delta")
        stored = http.get(f"/api/sessions/{live}").json()["messages"][-1]
        assert done["type"] == "done" and done["status"] == "complete", done
        assert (stored["status"], stored["content"]) == ("complete", streamed), "the survivor's reply was touched"
    return interrupted, answered


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--port", type=int, default=18080)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="forge-failover-"))
    root.chmod(0o755)
    front, r2 = f"http://127.0.0.1:{args.port}", f"http://127.0.0.1:{args.port + 2}"
    rows = []
    try:
        sh(root, args.port, "up", "2")
        for i in range(args.rounds):
            rows.append(round_(front, r2, root, args.port))
            print(f"round {i + 1}: interrupted {rows[-1][0]:.2f} s, next turn answered {rows[-1][1]:.2f} s", flush=True)
            sh(root, args.port, "start", "r1")
    finally:
        sh(root, args.port, "down")
        shutil.rmtree(root, ignore_errors=True)
    for k, what in enumerate(("reply interrupted", "next turn answered")):
        xs = sorted(r[k] for r in rows)
        p95 = xs[min(len(xs) - 1, round(0.95 * (len(xs) - 1)))]
        print(f"{what}: median {statistics.median(xs):.2f} s, p95 {p95:.2f} s, max {xs[-1]:.2f} s (n={len(xs)})")


if __name__ == "__main__":
    main()
