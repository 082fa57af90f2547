"""Theme and responsive layout: dark/light follow the system setting; on a phone the sidebar is a drawer."""

from __future__ import annotations

import pytest

LUMINANCE = """sel => {
    const [r, g, b] = getComputedStyle(document.querySelector(sel)).backgroundColor.match(/\\d+/g).map(Number);
    return (0.2126 * r + 0.7152 * g + 0.0722 * b) / 255;
}"""


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_theme_follows_the_color_scheme(browser, server, scheme, screenshot):
    ctx = browser.new_context(base_url=server.base_url, color_scheme=scheme, viewport={"width": 1280, "height": 820})
    try:
        page = ctx.new_page()
        page.goto("/")
        page.wait_for_selector('[data-testid="conn-status"][data-state="open"]')
        bg = page.evaluate(LUMINANCE, "body")
        assert (bg > 0.8) if scheme == "light" else (bg < 0.2)
        screenshot(page, f"chat-{scheme}")
        page.goto(f"/admin?token={server.admin_token}")
        page.wait_for_selector('[data-testid="admin-status"][data-state="live"]')
        card = page.evaluate(LUMINANCE, ".card")
        assert (card > 0.8) if scheme == "light" else (card < 0.2)
        screenshot(page, f"admin-{scheme}")
    finally:
        ctx.close()


def test_phone_layout_puts_the_sidebar_in_a_drawer(browser, server, screenshot):
    ctx = browser.new_context(base_url=server.base_url, viewport={"width": 390, "height": 800}, has_touch=True)
    try:
        page = ctx.new_page()
        sid = server.create_session(title="Phone session")["id"]
        page.goto(f"/#/s/{sid}")
        # the closed drawer is hidden (out of the tab order), its connection status with it
        page.wait_for_selector('[data-testid="conn-status"][data-state="open"]', state="attached")
        box = page.get_by_test_id("sidebar").bounding_box()
        assert box["x"] + box["width"] <= 0  # off-canvas
        composer = page.get_by_test_id("composer").bounding_box()
        assert composer["x"] >= 0 and composer["x"] + composer["width"] <= 390  # no horizontal overflow
        assert page.evaluate("document.documentElement.scrollWidth") <= 390

        drawer_open = "() => document.getElementById('sidebar').getBoundingClientRect().x >= 0"
        drawer_closed = "() => document.getElementById('sidebar').getBoundingClientRect().right <= 0"
        page.locator("#open-sidebar").click()
        page.wait_for_function(drawer_open)
        assert page.evaluate("document.activeElement.dataset.testid") == "new-session"  # focus moved into the drawer
        screenshot(page, "chat-phone-drawer")
        page.keyboard.press("Escape")  # closes the drawer and gives focus back to its button
        page.wait_for_function(drawer_closed)
        assert page.evaluate("document.activeElement.id") == "open-sidebar"
        assert page.locator("#open-sidebar").get_attribute("aria-expanded") == "false"

        page.keyboard.press("Enter")
        page.wait_for_function(drawer_open)
        page.locator(f'[data-testid="session-item"][data-id="{sid}"] [data-testid="session-open"]').click()
        page.wait_for_function(drawer_closed)
        assert page.get_by_test_id("session-title").inner_text() == "Phone session"
        screenshot(page, "chat-phone")
    finally:
        ctx.close()
