"""What an operator meets first, from outside: the Procfile under honcho, the refusal to serve a non-loopback
address without keys (and the warning when told to), and /metrics as Prometheus' own promtool reads it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import READY_TIMEOUT_S, REPO, free_port

HONCHO = Path(sys.executable).with_name("honcho")
OPEN_WARNING = "the server is open to anyone"


def _env(tmp: Path, **forge: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    env.update(PYTHONUNBUFFERED="1", FORGE_DATABASE_URL=f"sqlite+aiosqlite:///{tmp / 'forge.db'}", **forge)
    return env


@contextmanager
def honcho(tmp: Path, port: int, **forge: str) -> Iterator[tuple[subprocess.Popen, Path]]:
    """`honcho start` on the repository's Procfile (web on `port`); stopped with SIGTERM as honcho is."""
    if not HONCHO.exists():
        pytest.skip("honcho is not installed (the dev extra has it)")
    log = tmp / "honcho.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(HONCHO), "start", "-f", "Procfile", "-p", str(port)],
            cwd=REPO,
            env=_env(tmp, **forge),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield proc, log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


def _wait_ready(proc: subprocess.Popen, url: str, log: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} during start-up:\n{log.read_text(errors='replace')}")
        try:
            if httpx.get(url + "/ready", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"not ready after {READY_TIMEOUT_S}s:\n{log.read_text(errors='replace')}")


def test_an_open_bind_without_keys_refuses_to_start(tmp_path: Path) -> None:
    # By flag: the server exits before it loads the model or binds anything, and says how to proceed. By
    # environment, through the Procfile: honcho reports the process's failure. The two run side by side.
    by_flag = tmp_path / "by-flag"
    by_flag.mkdir()
    direct = subprocess.Popen(
        [sys.executable, "-m", "app.server", "--host", "0.0.0.0", "--port", str(free_port())],
        cwd=REPO,
        env=_env(by_flag),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with honcho(tmp_path, free_port(), FORGE_HOST="0.0.0.0") as (proc, log):
            assert proc.wait(timeout=120) != 0
        procfile: str | None = log.read_text(errors="replace")
    except pytest.skip.Exception:  # no honcho: the flag's refusal is still checked
        procfile = None
    finally:
        try:
            _, stderr = direct.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            direct.kill()
            direct.communicate()
            raise
    assert direct.returncode != 0
    assert "refusing to serve 0.0.0.0 without API keys" in stderr
    assert "--allow-anonymous" in stderr
    if procfile is None:
        pytest.skip("honcho is not installed (the dev extra has it): the Procfile's refusal is not checked")
    assert "--allow-anonymous" in procfile


def test_procfile_serves_when_told_open_warns_and_metrics_pass_promtool(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with honcho(tmp_path, port, FORGE_HOST="0.0.0.0", FORGE_ALLOW_ANONYMOUS="1", FORGE_SPECULATIVE="off") as (
        proc,
        log,
    ):
        _wait_ready(proc, url, log)
        assert OPEN_WARNING in log.read_text(errors="replace")
        reply = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
            timeout=120,
        )
        assert reply.status_code == 200, reply.text
        metrics = httpx.get(url + "/metrics", timeout=10)
        assert metrics.status_code == 200
    assert "forge_kv_blocks_capacity" in metrics.text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (`make promtool`: Debian's prometheus package)")
    check = subprocess.run(
        [promtool, "check", "metrics"], input=metrics.text, capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_loopback_bind_or_keys_start_quietly(tmp_path: Path) -> None:
    """No warning where nobody else can reach the server, or where everyone needs a key."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with honcho(tmp_path, port, FORGE_API_KEY="k1", FORGE_SPECULATIVE="off") as (proc, log):
        _wait_ready(proc, url, log)
        assert httpx.get(url + "/v1/models", timeout=10).status_code == 401
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer k1"}, timeout=10).status_code == 200
    assert OPEN_WARNING not in log.read_text(errors="replace")
