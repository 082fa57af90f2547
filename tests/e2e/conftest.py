"""Browser tests: one real Forge server (subprocess, temp SQLite, the real default model) for the
whole run, driven through Debian's Chromium with Playwright's sync API.

Runs in its own pytest invocation (`pytest tests/e2e`): Playwright's sync API and pytest-asyncio's
loop do not share a process. Screenshots go to test-output/screenshots/.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from legacy_db import legacy_database

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "test-output"
SHOTS = OUTPUT / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
ADMIN_TOKEN = "e2e-admin-token"
READY_TIMEOUT_S = 240  # model load + migrations on a busy 2-core machine
UI_TIMEOUT_MS = 90_000  # a reply on a shared 2-core CPU can take a while
# What the UI tests' database held before it was upgraded to reply branches (tests/legacy_db.py): one
# conversation of the keyless server, made by schema 0002.
LEGACY_SESSION = (
    "1e9acy" + "0" * 26,
    "",
    "Lighthouse keeping",
    [
        ("user", "How does a lighthouse keeper trim the wick?", "complete", None, None),
        ("assistant", "With scissors, every evening before the lamp is lit.", "complete", "stop", 12),
        ("user", "And in a storm?", "complete", None, None),
        ("assistant", "The keeper stays up all night", "stopped", "abort", 6),
    ],
)


@dataclass(slots=True)
class Server:
    """The running service under test."""

    base_url: str
    admin_token: str
    log_path: Path
    proc: subprocess.Popen
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.base_url, timeout=60.0)

    def create_session(self, **body: object) -> dict:
        r = self.http.post("/api/sessions", json=body)
        assert r.status_code == 201, r.text
        return r.json()

    def session(self, session_id: str) -> dict:
        r = self.http.get(f"/api/sessions/{session_id}")
        assert r.status_code == 200, r.text
        return r.json()

    def chat(self, session_id: str, content: str) -> list[tuple[str, dict]]:
        """One turn over the SSE API; returns the (event, data) pairs."""
        events: list[tuple[str, dict]] = []
        name = "message"
        with self.http.stream(
            "POST", f"/api/sessions/{session_id}/messages", json={"content": content}, timeout=300.0
        ) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("event:"):
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("data:") and line[5:].strip():
                    events.append((name, json.loads(line[5:])))
        return events

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def run_server(tmp: Path, log_name: str, **env: str) -> Iterator[Server]:
    """`python -m app.server` on a free port with a fresh SQLite file in `tmp` and FORGE_* `env`; waits for /ready."""
    OUTPUT.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log_path = OUTPUT / log_name
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}, **env, "PYTHONUNBUFFERED": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app.server",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--db",
                f"sqlite+aiosqlite:///{tmp / 'forge.db'}",
            ],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    srv = Server(
        base_url=f"http://127.0.0.1:{port}", admin_token=env.get("FORGE_ADMIN_TOKEN", ""), log_path=log_path, proc=proc
    )
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode} before it was ready:\n{srv.log_tail()}")
            try:
                r = srv.http.get("/ready", timeout=2.0)
                # ready once the compiled CPU kernels serve (a cold kernel cache starts on the float32 reference)
                compiling = r.status_code == 200 and (r.json().get("background_compile") or {}).get("phase")
                if r.status_code == 200 and compiling not in ("compiling", "ready"):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server was not ready within {READY_TIMEOUT_S} s:\n{srv.log_tail()}")
            time.sleep(0.5)
        yield srv
    finally:
        srv.http.close()
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The UI tests' server: no API key (the loopback default), an admin token; it starts on a database made by
    the schema before reply branches (LEGACY_SESSION), which it upgrades."""
    shutil.rmtree(SHOTS, ignore_errors=True)  # only this run's screenshots
    tmp = tmp_path_factory.mktemp("e2e-db")
    legacy_database(tmp / "forge.db", [LEGACY_SESSION])
    with run_server(tmp, "e2e-server.log", FORGE_ADMIN_TOKEN=ADMIN_TOKEN) as srv:
        yield srv


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        pytest.skip(f"Debian's Chromium is not installed at {CHROMIUM} (`make chromium` installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture()
def context(browser, server: Server, request: pytest.FixtureRequest) -> Iterator[object]:
    ctx = browser.new_context(base_url=server.base_url, viewport={"width": 1280, "height": 820}, accept_downloads=True)
    ctx.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.base_url)
    ctx.set_default_timeout(UI_TIMEOUT_MS)
    try:
        yield ctx
    finally:
        ctx.close()


@pytest.fixture()
def page(context, request: pytest.FixtureRequest) -> Iterator[object]:
    """A fresh page; uncaught page errors or console errors fail the test; a failing test leaves a screenshot."""
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    # console errors too (CSP violations, failed imports); a refused HTTP request logs one by design
    pg.on(
        "console",
        lambda m: (
            errors.append(m.text) if m.type == "error" and not m.text.startswith("Failed to load resource") else None
        ),
    )
    yield pg
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and not pg.is_closed():
        shot(pg, f"FAILED-{request.node.name}")
    assert not errors, f"errors in the page: {errors}"


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    if rep.when == "call":
        item.rep_call = rep
    return rep


def shot(page, name: str) -> Path:
    """Save a full-page screenshot under test-output/screenshots/."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


class Chat:
    """The chat UI as the tests drive it (selectors are the page's data-testid attributes)."""

    def __init__(self, page, server: Server) -> None:
        self.page = page
        self.server = server

    def open(self, path: str = "/") -> Chat:
        self.page.goto(path)
        self.wait_connected()
        return self

    def wait_connected(self) -> None:
        self.page.wait_for_selector('[data-testid="conn-status"][data-state="open"]')

    @property
    def session_id(self) -> str:
        url = self.page.url
        assert "#/s/" in url, f"no session is open (url {url})"
        return url.rsplit("#/s/", 1)[1]

    def new_session(self) -> str:
        before = self.page.url
        self.page.get_by_test_id("new-session").click()
        self.page.wait_for_function("u => location.href !== u && location.hash.startsWith('#/s/')", arg=before)
        sid = self.session_id
        self.page.wait_for_selector(f'[data-testid="session-item"][data-id="{sid}"][aria-current="page"]')
        return sid

    def set_settings(
        self, *, max_tokens: int | None = None, temperature: float | None = None, system_prompt: str | None = None
    ) -> None:
        panel = self.page.get_by_test_id("settings-panel")
        if not panel.is_visible():
            self.page.get_by_test_id("toggle-settings").click()
        if system_prompt is not None:
            self.page.get_by_test_id("settings-system-prompt").fill(system_prompt)
        if temperature is not None:  # a range input: set it as a user's drag would
            self.page.get_by_test_id("settings-temperature").evaluate(
                "(el, v) => { el.value = v; el.dispatchEvent(new Event('input', {bubbles: true})); }", str(temperature)
            )
        if max_tokens is not None:
            self.page.get_by_test_id("settings-max-tokens").fill(str(max_tokens))
        self.page.get_by_test_id("settings-save").click()
        self.page.get_by_test_id("settings-saved").wait_for(state="visible")
        self.page.get_by_test_id("toggle-settings").click()  # close the panel again

    def send(self, text: str) -> None:
        box = self.page.get_by_test_id("composer-input")
        box.fill(text)
        box.press("Enter")

    def messages(self):
        return self.page.locator('[data-testid="message"]')

    def assistant(self, index: int = -1):
        loc = self.page.locator('[data-testid="message"][data-role="assistant"]')
        return loc.last if index == -1 else loc.nth(index)

    def wait_assistant_count(self, n: int) -> None:
        self.page.wait_for_function(
            "n => document.querySelectorAll('[data-testid=message][data-role=assistant]').length === n", arg=n
        )

    def wait_finished(self, message) -> str:
        """Wait until a reply is no longer streaming; return its status."""
        mid = message.get_attribute("data-id")
        self.page.wait_for_selector(f'[data-testid="message"][data-id="{mid}"]:not([data-status="streaming"])')
        self.page.wait_for_selector('[data-testid="stop"]', state="hidden")
        return self.page.locator(f'[data-testid="message"][data-id="{mid}"]').get_attribute("data-status")

    def displayed(self) -> list[dict]:
        """What the page shows: role, id, status and visible text of each message."""
        return self.page.eval_on_selector_all(
            '[data-testid="message"]',
            """els => els.map(e => ({
            role: e.dataset.role, id: e.dataset.id, status: e.dataset.status,
            text: e.querySelector('[data-testid=message-content]').innerText }))""",
        )

    def copied_text(self, message) -> str:
        """Click the message's Copy button and read the clipboard (the raw stored text)."""
        message.hover()
        message.get_by_test_id("message-copy").click()
        message.locator('[data-testid="message-copy"][data-copied="1"]').wait_for()
        return message.page.evaluate("navigator.clipboard.readText()")


@pytest.fixture(scope="session")
def reference() -> dict:
    """The default model's reference greedy outputs (tests/fixtures)."""
    return json.loads((ROOT / "tests" / "fixtures" / "smollm2_reference.json").read_text())


@pytest.fixture()
def chat(page, server: Server) -> Chat:
    return Chat(page, server)


@pytest.fixture()
def screenshot():
    """screenshot(page, name): save test-output/screenshots/<name>.png."""
    return shot


@pytest.fixture()
def markdown(page, server):
    """The page's Markdown module (web/markdown.js) as `window.md`, in a blank page of the server's origin."""
    page.goto("/static/markdown.js")  # same origin, no app running
    page.evaluate("async () => { window.md = await import('/static/markdown.js'); }")
    return page
