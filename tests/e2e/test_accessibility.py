"""Accessibility: the chat and admin pages are axe-clean in light and dark mode (axe-core in Chromium),
and a whole chat works from the keyboard alone, with a visible focus ring at every stop."""

from __future__ import annotations

import pytest
from axe_playwright_python.sync_playwright import Axe

LONG_PROMPT = "Write a long story about a dragon who learns to fly."

RICH_REPLY = """## A reply with everything

Some **bold**, *emphasis*, `inline code`, a [link](https://example.com/docs) and a list:

1. first
2. second
   - nested

> A quoted line.

| Language | Typing |
|----------|-------:|
| Python   | dynamic |
| Rust     | static |

```python
def greet(name: str, times: int = 3) -> None:
    \"\"\"Say hello.\"\"\"
    for _ in range(times):  # a comment
        print(f"Hello, {name}!" * 2)
```

```javascript
const answer = [1, 2, 3].map((x) => x * 42); // a comment
export default { answer, ok: true, name: "forge" };
```
"""

EXPORT = {
    "forge_export": 2,
    "session": {
        "title": "Accessibility sample",
        "system_prompt": None,
        "settings": {"temperature": 0.0, "top_p": 1.0, "max_tokens": 64},
    },
    "messages": [
        {"id": "q1", "role": "user", "content": "Show me Markdown and code.", "status": "complete"},
        {
            "id": "r1",
            "parent_id": "q1",
            "role": "assistant",
            "content": "An earlier version.",
            "status": "complete",
            "active": False,
        },
        {
            "id": "r2",
            "parent_id": "q1",
            "role": "assistant",
            "content": RICH_REPLY,
            "status": "complete",
            "finish_reason": "length",
            "prompt_tokens": 40,
            "cached_tokens": 16,
            "completion_tokens": 64,
            "ttft_ms": 120.0,
            "tokens_per_s": 25.0,
        },
        {"id": "q2", "parent_id": "r2", "role": "user", "content": "And stop halfway?", "status": "complete"},
        {
            "id": "r3",
            "parent_id": "q2",
            "role": "assistant",
            "content": "Sure, here is half",
            "status": "stopped",
            "finish_reason": "abort",
            "prompt_tokens": 60,
            "cached_tokens": 48,
            "completion_tokens": 5,
            "ttft_ms": 90.0,
            "tokens_per_s": 20.0,
        },
    ],
}


def _violations(page) -> list[str]:
    found = Axe().run(page).response["violations"]
    return [f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']][:6]}" for v in found]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_chat_and_admin_pages_are_axe_clean(browser, server, scheme, screenshot):
    r = server.http.post("/api/sessions/import", json=EXPORT)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    ctx = browser.new_context(base_url=server.base_url, color_scheme=scheme, viewport={"width": 1280, "height": 820})
    try:
        page = ctx.new_page()
        page.goto("/")
        page.wait_for_selector('[data-testid="conn-status"][data-state="open"]')
        page.wait_for_selector('[data-testid="session-item"]')
        assert _violations(page) == [], "the empty chat page"

        page.goto(f"/#/s/{sid}")
        page.wait_for_function("() => document.querySelectorAll('[data-testid=message]').length === 4")
        page.get_by_test_id("toggle-settings").click()
        page.get_by_test_id("settings-panel").wait_for(state="visible")
        # the sample shows highlighted code, a table, a quote, stats and a status badge
        reply = page.locator('[data-testid="message"][data-role="assistant"]').first
        assert reply.locator(".hljs-keyword").count() >= 4 and reply.locator(".hljs-comment").count() == 2
        assert reply.locator("table").count() == 1 and reply.locator("blockquote").count() == 1
        assert page.locator('[data-testid="message-status"]:visible').all_inner_texts() == [
            "Max tokens reached",
            "Stopped",
        ]
        assert reply.get_by_test_id("branch-count").inner_text() == "2/2"  # a reply with an earlier version
        page.get_by_test_id("search-input").fill("markdown")
        page.get_by_test_id("search-hit").first.wait_for()
        screenshot(page, f"a11y-chat-{scheme}")
        assert _violations(page) == [], "a conversation with versions, search hits and the settings drawer open"

        page.goto(f"/admin?token={server.admin_token}")
        page.wait_for_selector('[data-testid="admin-status"][data-state="live"]')
        assert page.locator("h1").count() == 1
        screenshot(page, f"a11y-admin-{scheme}")
        assert _violations(page) == [], "the admin page"
    finally:
        ctx.close()


def _focused(page) -> dict:
    """The focused element: its test id (or id) and whether a focus indicator is drawn."""
    return page.evaluate("""() => {
        const el = document.activeElement;
        const style = getComputedStyle(el);
        // the composer's textarea shows focus on its box; everything else has an outline
        const ring = el.id === 'input'
            ? getComputedStyle(el.closest('.composer-box')).boxShadow !== 'none'
            : style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) >= 2;
        return {id: el.dataset.testid || el.id || el.tagName, ring};
    }""")


def _tab_to(page, target: str, key: str = "Tab", limit: int = 40) -> list[str]:
    """Press Tab (or Shift+Tab) until `target` has focus; every stop on the way must show a focus ring.
    Returns the ids of the stops."""
    stops = []
    for _ in range(limit):
        page.keyboard.press(key)
        f = _focused(page)
        assert f["ring"], f"no visible focus indicator on {f['id']} (after {stops})"
        stops.append(f["id"])
        if f["id"] == target:
            return stops
    raise AssertionError(f"{target} was not reached with {key}: {stops}")


def test_a_whole_chat_works_from_the_keyboard(chat, server, page, screenshot):
    chat.open()
    # the first stop on the page is New chat; Enter creates a session and puts the cursor in the composer
    assert _tab_to(page, "new-session", limit=1) == ["new-session"]
    before = page.url
    page.keyboard.press("Enter")
    page.wait_for_function("u => location.href !== u && location.hash.startsWith('#/s/')", arg=before)
    sid = chat.session_id
    page.wait_for_function("() => document.activeElement.id === 'input'")

    # settings: open with Enter (focus moves in), change max tokens, Enter saves, Escape closes (focus back)
    stops = _tab_to(page, "toggle-settings", key="Shift+Tab")
    assert stops == ["conversation", "toggle-settings"]
    page.keyboard.press("Enter")
    page.get_by_test_id("settings-panel").wait_for(state="visible")
    assert _focused(page)["id"] == "settings-system-prompt"
    _tab_to(page, "settings-max-tokens")
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.type("400")
    page.keyboard.press("Enter")
    page.get_by_test_id("settings-saved").wait_for(state="visible")
    assert server.session(sid)["settings"]["max_tokens"] == 400
    page.keyboard.press("Escape")
    page.get_by_test_id("settings-panel").wait_for(state="hidden")
    assert _focused(page) == {"id": "toggle-settings", "ring": True}

    # send with Enter, stop with Escape
    _tab_to(page, "composer-input")
    page.keyboard.type(LONG_PROMPT)
    page.keyboard.press("Enter")
    reply = chat.assistant()
    reply.wait_for()
    page.wait_for_function(
        "() => document.querySelector('[data-testid=message][data-role=assistant] "
        "[data-testid=message-content]').textContent.length > 0"
    )
    page.keyboard.press("Escape")
    assert chat.wait_finished(reply) == "stopped"
    first_id = reply.get_attribute("data-id")

    # the message actions are the stops just before the composer: Regenerate, then Copy, of the reply
    assert _tab_to(page, "message-regenerate", key="Shift+Tab") == ["message-regenerate"]
    page.keyboard.press("Enter")
    page.wait_for_function(
        "old => { const a = [...document.querySelectorAll('[data-testid=message][data-role=assistant]')];"
        " return a.length === 1 && a[0].dataset.id !== old && a[0].dataset.status === 'streaming'; }",
        arg=first_id,
    )
    # the regenerated reply took the old one's place, and the focus went to the composer: Escape stops it
    page.wait_for_function("() => document.activeElement.id === 'input'")
    page.wait_for_function(
        "() => document.querySelector('[data-testid=message][data-role=assistant] "
        "[data-testid=message-content]').textContent.length > 0"
    )
    page.keyboard.press("Escape")
    second = chat.assistant()
    assert chat.wait_finished(second) == "stopped"
    stored = server.session(sid)["messages"]
    assert [(m["role"], m["status"]) for m in stored] == [("user", "complete"), ("assistant", "stopped")]
    assert stored[1]["id"] == second.get_attribute("data-id") != first_id

    assert _tab_to(page, "message-copy", key="Shift+Tab") == ["message-regenerate", "message-copy"]
    page.keyboard.press("Enter")
    second.locator('[data-testid="message-copy"][data-copied="1"]').wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == stored[1]["content"]

    # Edit opens an editor in place with the focus in it; Escape cancels and gives the focus back
    _tab_to(page, "message-edit", key="Shift+Tab")
    page.keyboard.press("Enter")
    user = chat.messages().first
    assert _focused(page)["id"] == "edit-input"
    screenshot(page, "keyboard-edit")
    page.keyboard.press("Escape")
    user.get_by_test_id("edit-input").wait_for(state="detached")
    assert _focused(page) == {"id": "message-edit", "ring": True}
    assert user.get_by_test_id("message-content").inner_text() == LONG_PROMPT


def test_search_and_the_version_switch_work_from_the_keyboard(server, page, chat, screenshot):
    sample = {**EXPORT, "session": {"title": "Keyboard versions"}}
    sample["messages"] = [
        dict(m, content=m["content"] + " xylograph") if m["id"] == "r1" else m for m in EXPORT["messages"]
    ]
    sid = server.http.post("/api/sessions/import", json=sample).json()["id"]
    chat.open()
    # New chat, then the search box; Enter searches and moves to the first hit
    assert _tab_to(page, "search-input", limit=2) == ["new-session", "search-input"]
    page.keyboard.type("xylograph")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.activeElement.dataset.testid === 'search-hit'")
    assert _focused(page)["ring"]
    # Enter opens the hit: the earlier version of the reply, which becomes the chosen one, with the focus on it
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => document.activeElement.dataset.testid === 'message'"
        " && document.activeElement.textContent.includes('xylograph')"
    )
    assert chat.session_id == sid and _focused(page)["ring"]
    reply = page.locator('[data-testid="message"][data-position="1"]')
    assert reply.get_by_test_id("branch-count").inner_text() == "1/2"

    # the switch: "previous" is unavailable at 1/2 but keeps its place in the tab order; "next" goes to 2/2
    # and keeps the focus, so the arrows can be pressed again
    assert _tab_to(page, "branch-next") == ["branch-prev", "branch-next"]
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => document.querySelector('[data-position=\"1\"] [data-testid=branch-count]').textContent === '2/2'"
    )
    page.wait_for_function("() => document.activeElement.dataset.testid === 'branch-next'")
    assert _focused(page)["ring"] and page.locator('[data-testid="message"]').count() == 4
    screenshot(page, "keyboard-version-switch")
    _tab_to(page, "branch-prev", key="Shift+Tab")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelectorAll('[data-testid=message]').length === 2")
    assert server.session(sid)["messages"][1]["content"].endswith("xylograph")

    # Escape in the search box clears it and brings the session list back
    _tab_to(page, "search-input", key="Shift+Tab")
    page.keyboard.press("Escape")
    page.get_by_test_id("session-list").wait_for(state="visible")
    assert page.get_by_test_id("search-input").input_value() == "" and _focused(page)["id"] == "search-input"
