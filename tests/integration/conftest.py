"""Server fixtures for the service tests: a real `python -m app.server` (uvicorn) on 127.0.0.1 with the
default model and a real SQLite file. One shared server for the whole test session, and one with the test MCP
server for the MCP modules; the persistence tests start their own (they kill it)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.postgres import database_url, postgres  # noqa: F401  (fixtures: the store's tests run on both)

REPO = Path(__file__).resolve().parents[2]
API_KEY = "test-api-key"
OTHER_KEY = "test-other-key"  # a second client of the shared server: sees none of API_KEY's sessions
ADMIN_TOKEN = "test-admin-token"
DEFAULT_MAX_TOKENS = 24  # the shared server's cap on /v1 chat replies that leave max_tokens out
READY_TIMEOUT_S = 300.0  # model load takes seconds, more on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    """`python -m app.server` in a subprocess; its output goes to `log_path`."""

    db_path: Path
    log_path: Path
    api_key: str | None = API_KEY
    admin_token: str | None = ADMIN_TOKEN
    keepalive_s: float = 0.05
    env: dict[str, str] = field(default_factory=dict)  # FORGE_* settings without a flag
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    # Ready only once the compiled CPU kernels serve: a cold kernel cache starts on the float32 reference
    # (engine/backend_swap.py), and the tests expect the product's kernels.
    wait_compiled: bool = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def db_url(self) -> str:
        return f"sqlite+aiosqlite:///{self.db_path}"

    def start(self) -> ServerProcess:
        args = [
            sys.executable,
            "-m",
            "app.server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--db",
            self.db_url,
            "--keepalive-s",
            str(self.keepalive_s),
            "--log-level",
            "info",
        ]
        if self.api_key:
            args += ["--api-key", self.api_key, "--api-key", OTHER_KEY]
        if self.admin_token:
            args += ["--admin-token", self.admin_token]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
        env.update(self.env, PYTHONUNBUFFERED="1")
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.wait_ready()
        return self

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode} during start-up:\n{self.log_tail()}")
            try:
                r = httpx.get(self.url + "/ready", timeout=2.0)
                if r.status_code == 200 and (not self.wait_compiled or compiled(r.json())):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill()
        raise RuntimeError(f"server not ready after {READY_TIMEOUT_S}s:\n{self.log_tail()}")

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        """SIGTERM and wait (SIGKILL if it hangs)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    # -- small helpers for tests --------------------------------------------------------------

    @property
    def auth(self) -> dict[str, str]:
        """The headers that open /api, /ws and /v1 on this server."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    def stats(self) -> dict:
        r = httpx.get(self.url + "/admin/api/stats", headers=self.admin_headers(), timeout=10)
        r.raise_for_status()
        return r.json()


def compiled(ready: dict) -> bool:
    """Whether a `/ready` body says no background compile is pending (engine/backend_swap.py)."""
    return (ready.get("background_compile") or {}).get("phase") in (None, "done", "failed")


def wait_idle(server: ServerProcess, timeout: float = 60.0) -> dict:
    """Poll the admin feed until the engine has nothing waiting or running; return those stats."""
    deadline = time.monotonic() + timeout
    while True:
        stats = server.stats()
        eng = stats["engine"]
        if eng["running"] == 0 and eng["waiting"] == 0:
            return stats
        if time.monotonic() > deadline:
            raise AssertionError(f"engine still busy after {timeout}s: {json.dumps(eng)}")
        time.sleep(0.05)


@contextmanager
def serving(tmp: Path, env: dict[str, str], **kw: Any) -> Iterator[ServerProcess]:
    """A server on a new SQLite file in `tmp` (its log beside it) with `env`, stopped however the block ends."""
    srv = ServerProcess(db_path=tmp / "forge.db", log_path=tmp / "server.log", env=env, **kw)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The shared server: API key and admin token set, SSE keep-alive every 0.05 s, a small default reply cap."""
    tmp = tmp_path_factory.mktemp("forge-server")
    with serving(
        tmp,
        {
            "FORGE_DEFAULT_MAX_TOKENS": str(DEFAULT_MAX_TOKENS),
            # what is drafted must not depend on this machine's load (engine/spec_policy.py)
            "FORGE_SPEC_ROW_COST": "0.5",
        },
    ) as srv:
        yield srv


MCP_TOOL_SERVER = REPO / "tests" / "mcp_servers" / "tool_server.py"


@pytest.fixture(scope="session")
def mcp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server running the test MCP server (tests/mcp_servers/tool_server.py) over stdio as `calc`, with a short
    call timeout and a small result cap: one for the MCP tests of every module (test_service_mcp*.py)."""
    tmp = tmp_path_factory.mktemp("forge-mcp")
    with serving(
        tmp,
        {
            "FORGE_MCP": f"calc={sys.executable} {MCP_TOOL_SERVER}",
            "FORGE_MCP_TIMEOUT_S": "2",
            "FORGE_MCP_RESULT_BYTES": "256",
            # what is drafted must not depend on this machine's load (engine/spec_policy.py)
            "FORGE_SPEC_ROW_COST": "0.5",
        },
    ) as srv:
        yield srv


@pytest.fixture(scope="session")
def reference() -> dict:
    """The default model's reference outputs (Hugging Face transformers, float32, greedy)."""
    return json.loads((REPO / "tests" / "fixtures" / "smollm2_reference.json").read_text())


@contextmanager
def post_and_leave(
    server: ServerProcess, path: str, body: dict, headers: dict[str, str] | None = None
) -> Iterator[socket.socket]:
    """POST `body` over a raw socket that never reads the answer; leaving the block closes it."""
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    )
    for k, v in {**server.auth, **(headers or {})}.items():
        head += f"{k}: {v}\r\n"
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
        s.sendall(head.encode() + b"\r\n" + data)
        yield s


def wait_reply_grows(server: ServerProcess, session_id: str, timeout: float = 60.0) -> dict:
    """Poll the session's last stored message until its text grows past what it holds now, still streaming;
    return it. The evidence that a reply goes on (after its client left, say), where a pause would only hope so."""

    def last() -> dict:
        r = httpx.get(f"{server.url}/api/sessions/{session_id}", headers=server.auth, timeout=30)
        r.raise_for_status()
        return r.json()["messages"][-1]

    start = len(last()["content"])
    deadline = time.monotonic() + timeout
    while True:
        reply = last()
        if len(reply["content"]) > start or reply["status"] != "streaming":
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"the reply did not grow in {timeout}s: {reply}")
        time.sleep(0.05)
    assert reply["status"] == "streaming", reply
    return reply


def finished(server: ServerProcess, reason: str) -> int:
    """How many engine requests have finished with `reason` so far."""
    return int(server.stats()["engine"].get("requests_finished", {}).get(reason, 0))
