"""MCP tools in the browser, against a server of their own running the test MCP server (tests/mcp_servers/
tool_server.py) over stdio: the chat UI asks before each call (the UI's sessions opt into approval), shows each call
as a card with its arguments and result, remembers "always allow" for the session, and Stop interrupts a running
call; the admin page lists the servers and their tools' calls."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from axe_playwright_python.sync_playwright import Axe

from tests.e2e.conftest import UI_TIMEOUT_MS, Chat, Server, run_server

TOOL_SERVER = Path(__file__).resolve().parents[1] / "mcp_servers" / "tool_server.py"
ADMIN_TOKEN = "e2e-mcp-admin-token"
STOPPED = "error: the call was stopped by the user"
DENIED = "error: the call was denied by the user"
# Approval prompts the page has shown since the observer was installed (a prompt shown and answered at once by a
# client still counts).
COUNT_PROMPTS = """() => {
    window.prompts = 0;
    const ASK = '[data-testid=tool-approval]';
    const asks = n => n.nodeType === 1 && (n.matches(ASK) || n.querySelector(ASK));
    new MutationObserver(records => {
        for (const r of records) for (const n of r.addedNodes) if (asks(n)) window.prompts++;
    }).observe(document.body, {childList: true, subtree: true});
}"""


@pytest.fixture(scope="module")
def mcp_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One round per message (FORGE_MCP_ROUNDS=1): with a forced tool every reply calls it, so one message makes two
    calls, the reply's and its continuation's."""
    tmp = tmp_path_factory.mktemp("e2e-mcp")
    with run_server(
        tmp,
        "e2e-mcp-server.log",
        FORGE_ADMIN_TOKEN=ADMIN_TOKEN,
        FORGE_MCP=f"calc={sys.executable} {TOOL_SERVER}",
        FORGE_MCP_ROUNDS="1",
    ) as srv:
        yield srv


@pytest.fixture()
def mcp_page(browser, mcp_server: Server) -> Iterator[object]:
    """A fresh page of the MCP server; errors in the page fail the test."""
    ctx = browser.new_context(base_url=mcp_server.base_url, viewport={"width": 1280, "height": 820})
    ctx.set_default_timeout(UI_TIMEOUT_MS)
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(
        "console",
        lambda m: (
            errors.append(m.text) if m.type == "error" and not m.text.startswith("Failed to load resource") else None
        ),
    )
    try:
        yield page
    finally:
        ctx.close()
    assert not errors, f"errors in the page: {errors}"


def forced(tool: str) -> dict:
    return {"type": "function", "function": {"name": tool}}


def use_tool(server: Server, sid: str, tool: str) -> None:
    """Every reply of session `sid` calls MCP tool `tool` (and only it)."""
    settings = {"mcp_tools": [tool], "tool_choice": forced(tool), "temperature": 0, "max_tokens": 48}
    r = server.http.patch(f"/api/sessions/{sid}", json={"settings": {**settings, "parallel_tool_calls": False}})
    assert r.status_code == 200, r.text


def card(page, i: int):
    """The i-th tool call card of the open session."""
    return page.locator('[data-testid="tool-call"]').nth(i)


def answer(page, i: int, decision: str) -> None:
    """Wait until the i-th card asks, then click `decision` (once, always, deny)."""
    c = card(page, i)
    c.get_by_test_id("tool-approval").wait_for()
    c.get_by_test_id(f"tool-{decision}").click()


def result(page, i: int) -> str:
    pre = card(page, i).get_by_test_id("tool-result").locator("pre")
    pre.wait_for()
    return pre.inner_text()


def test_calls_ask_first_then_show_results_deny_always_allow_and_stop(mcp_server, mcp_page, screenshot):
    page = mcp_page
    chat = Chat(page, mcp_server).open()
    sid = chat.new_session()
    assert mcp_server.session(sid)["settings"]["mcp_approval"] is True  # the UI's sessions ask
    use_tool(mcp_server, sid, "calc__add")

    chat.send("What is 2 plus 40?")
    first = card(page, 0)
    first.get_by_test_id("tool-approval").wait_for()
    assert first.get_by_test_id("tool-name").inner_text() == "calc__add"
    args = json.loads(first.get_by_test_id("tool-arguments").inner_text())
    assert set(args) == {"a", "b"}
    assert page.get_by_test_id("stop").is_visible()  # a call awaiting approval can be stopped
    screenshot(page, "mcp-approval")
    found = Axe().run(page).response["violations"]
    assert not found, [f"{v['id']}: {[n['target'] for n in v['nodes']][:6]}" for v in found]
    # a reloaded page is asked again, and follows the round from there
    page.reload()
    chat.wait_connected()
    first.get_by_test_id("tool-approval").wait_for()
    first.get_by_test_id("tool-once").click()
    assert result(page, 0) == str(args["a"] + args["b"])

    # the reply went on by itself: its continuation calls again, and "allow once" asks again; deny it
    answer(page, 1, "deny")
    assert result(page, 1) == DENIED
    page.get_by_test_id("send").wait_for()  # the message's round is over
    assert card(page, 0).get_by_test_id("tool-result").count() == 1  # earlier results stay in their cards

    # "always allow": this call runs, and so does the next one, without asking
    page.evaluate(COUNT_PROMPTS)
    chat.send("Add them again.")
    answer(page, 2, "always")
    assert result(page, 2).isdigit()
    assert result(page, 3).isdigit()
    page.get_by_test_id("send").wait_for()
    assert page.evaluate("window.prompts") == 1
    assert mcp_server.session(sid)["settings"]["mcp_allowed"] == ["calc__add"]

    # Stop while a call runs: its result says so, and nothing continues
    use_tool(mcp_server, sid, "calc__hang")
    chat.send("Wait for it.")
    answer(page, 4, "once")
    card(page, 4).get_by_test_id("tool-running").wait_for()
    page.get_by_test_id("stop").click()
    assert result(page, 4) == STOPPED
    page.get_by_test_id("send").wait_for()
    assert page.locator('[data-testid="tool-call"]').count() == 5
    screenshot(page, "mcp-cards")


def test_admin_lists_servers_tools_calls_and_last_error(mcp_server, mcp_page, screenshot):
    page = mcp_page
    sid = mcp_server.create_session(
        settings={"mcp_tools": ["calc__crash"], "tool_choice": "none", "temperature": 0, "max_tokens": 48}
    )["id"]
    body = {"content": "Crash it.", "tool_choice": forced("calc__crash")}
    with mcp_server.http.stream("POST", f"/api/sessions/{sid}/messages", json=body, timeout=300.0) as r:
        assert r.status_code == 200
        assert sum(line == "event: done" for line in r.iter_lines()) == 2  # the call's reply, the one after it

    page.goto(f"/admin?token={ADMIN_TOKEN}")
    row = page.locator('[data-testid="admin-mcp-server"][data-name="calc"]')
    row.wait_for()
    stats = mcp_server.http.get("/admin/api/stats", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    calc = next(s for s in stats["mcp"] if s["name"] == "calc")
    assert calc["state"] == "failed" and calc["error"]  # the crash: restarted on its next use
    assert row.get_attribute("data-state") == "failed"
    assert row.get_by_test_id("admin-mcp-tool-count").inner_text() == str(len(calc["tools"])) != "0"
    assert row.get_by_test_id("admin-mcp-starts").inner_text() == str(calc["starts"])
    assert row.get_by_test_id("admin-mcp-error").inner_text() == calc["error"]
    crash = page.locator('[data-testid="admin-mcp-tool"][data-name="calc__crash"]')
    assert crash.get_by_test_id("admin-mcp-calls").inner_text() == "1"
    assert crash.get_by_test_id("admin-mcp-errors").inner_text() == "1"
    assert "ms" in crash.inner_text()  # its latency
    tools = page.locator('[data-testid="admin-mcp-tool"]')
    assert tools.count() == len(calc["tools"])
    page.get_by_test_id("admin-mcp").scroll_into_view_if_needed()
    screenshot(page, "admin-mcp")


def test_settings_drawer_chooses_the_sessions_mcp_tools(mcp_server, mcp_page):
    page = mcp_page
    chat = Chat(page, mcp_server).open()
    sid = chat.new_session()
    page.get_by_test_id("toggle-settings").click()
    group = page.get_by_test_id("settings-mcp")
    box = group.get_by_role("checkbox", name="calc__add")
    box.wait_for()
    listed = mcp_server.http.get("/api/mcp/tools").json()["data"]
    assert group.get_by_role("checkbox").count() == len(listed)
    assert not box.is_checked()
    found = Axe().run(page).response["violations"]
    assert not found, [f"{v['id']}: {[n['target'] for n in v['nodes']][:6]}" for v in found]

    box.check()
    page.get_by_test_id("settings-save").click()
    stored = wait_settings(mcp_server, sid, lambda s: s.get("mcp_tools") == ["calc__add"])
    assert stored["mcp_approval"] is True  # the drawer's save left the other settings alone

    box.uncheck()
    page.get_by_test_id("settings-save").click()
    wait_settings(mcp_server, sid, lambda s: not s.get("mcp_tools"))


def wait_settings(server: Server, sid: str, ok: Callable[[dict], bool], timeout_s: float = 10.0) -> dict:
    """The session's stored settings once `ok` holds of them (a save is a request the page sends on its own)."""
    deadline = time.monotonic() + timeout_s
    while True:
        settings = server.session(sid)["settings"]
        if ok(settings) or time.monotonic() > deadline:
            assert ok(settings), settings
            return settings
        time.sleep(0.1)
