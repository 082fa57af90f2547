"""A server with API keys: the UI asks for the key once, keeps it for the tab, and works with it (REST with
a bearer header, the WebSocket with the key as a subprotocol)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import UI_TIMEOUT_MS, Server, run_server, shot

KEY = "e2e+key/~=?"  # the WebSocket carries it base64url-encoded


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with run_server(
        tmp_path_factory.mktemp("e2e-keyed"), "e2e-keyed-server.log", FORGE_API_KEY=f"other-key,{KEY}"
    ) as srv:
        yield srv


def test_the_key_is_asked_once_and_kept_for_the_tab(browser, keyed: Server) -> None:
    ctx = browser.new_context(base_url=keyed.base_url)
    ctx.set_default_timeout(UI_TIMEOUT_MS)
    page = ctx.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on(
        "console",
        lambda m: (
            errors.append(m.text) if m.type == "error" and not m.text.startswith("Failed to load resource") else None
        ),
    )  # the refused probes log that
    try:
        page.goto("/")
        dialog = page.get_by_test_id("auth-dialog")
        dialog.wait_for()
        shot(page, "auth-dialog")
        assert page.get_by_test_id("conn-status").get_attribute("data-state") != "open"  # nothing without a key
        page.get_by_test_id("auth-key").fill("wrong")
        page.get_by_test_id("auth-submit").click()
        page.get_by_test_id("auth-error").get_by_text("not accepted").wait_for()
        page.get_by_test_id("auth-key").fill("ünïcode")
        page.get_by_test_id("auth-submit").click()
        page.get_by_test_id("auth-error").get_by_text("printable ASCII").wait_for()
        page.get_by_test_id("auth-key").fill(KEY)
        page.get_by_test_id("auth-submit").click()
        page.wait_for_selector('[data-testid="conn-status"][data-state="open"]')  # the WebSocket took the key
        assert not dialog.is_visible()
        page.get_by_test_id("new-session").click()  # REST took it too
        page.wait_for_selector('[data-testid="session-item"]')
        sid = page.locator('[data-testid="session-item"]').first.get_attribute("data-id")
        assert keyed.http.get(f"/api/sessions/{sid}", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200

        page.reload()  # same tab: no question
        page.wait_for_selector('[data-testid="conn-status"][data-state="open"]')
        page.wait_for_selector(f'[data-testid="session-item"][data-id="{sid}"]')
        assert page.get_by_test_id("auth-dialog").count() == 0

        other = ctx.new_page()  # another tab asks again
        other.goto("/")
        other.get_by_test_id("auth-dialog").wait_for()
        other.close()
    finally:
        ctx.close()
    assert not errors, f"errors in the page: {errors}"
