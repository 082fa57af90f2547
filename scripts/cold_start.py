"""Time from `forge serve` starting to its first chat reply, with an empty numba compile cache (a new machine).

    .venv/bin/python scripts/cold_start.py [--warm] [extra forge serve flags ...]

Starts the server with NUMBA_CACHE_DIR pointed at a fresh empty folder (`--warm`: the folder of a previous run
kept, so the kernels load from it), asks one greedy chat turn over `/v1/chat/completions` as soon as the port
answers, and prints the seconds to the reply and the backend `/ready` reported serving it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import httpx

CACHE = os.path.join(tempfile.gettempdir(), "forge-cold-start-cache")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str]) -> None:
    warm = "--warm" in argv
    extra = [a for a in argv if a != "--warm"]
    cache = CACHE if warm else tempfile.mkdtemp(prefix="forge-numba-")
    os.makedirs(cache, exist_ok=True)
    port, db = _free_port(), tempfile.mkdtemp(prefix="forge-db-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")} | {"NUMBA_CACHE_DIR": cache}
    args = [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--db", f"sqlite+aiosqlite:///{db}/f.db"]
    url = f"http://127.0.0.1:{port}"
    question = [{"role": "user", "content": "What is the capital of France?"}]
    body = {"model": "default", "messages": question, "temperature": 0, "max_tokens": 8}
    start = time.monotonic()
    proc = subprocess.Popen([*args, *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ready_at = None
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"forge serve exited with {proc.returncode}")
            try:
                if ready_at is None and httpx.get(url + "/ready", timeout=5).status_code == 200:
                    ready_at = time.monotonic() - start
                r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        took = time.monotonic() - start
        serving = httpx.get(url + "/ready", timeout=10).json().get("backend")
        print(
            f"ready after {ready_at or took:.1f}s, first reply after {took:.1f}s "
            f"(cache {'kept' if warm else 'empty'}; serving: {serving})"
        )
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main(sys.argv[1:])
