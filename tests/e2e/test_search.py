"""Search from the sidebar: hits in titles and in messages of any branch; choosing a hit opens its session
at that message, switching to its branch when it is not the chosen one."""

from __future__ import annotations

from tests.e2e.conftest import LEGACY_SESSION

GARDEN = {
    "forge_export": 2,
    "session": {"title": "Garden notes"},
    "messages": [
        {"id": "q", "role": "user", "content": "Which plants like deep shade?"},
        {"id": "a1", "parent_id": "q", "role": "assistant", "content": "Ferns and hostas do well there."},
        {
            "id": "a2",
            "parent_id": "q",
            "role": "assistant",
            "content": "Try the quillwort, it loves damp shade.",
            "active": False,
        },
    ],
}


def _search(page, query: str):
    page.get_by_test_id("search-input").fill(query)
    page.wait_for_function("q => document.getElementById('search-status').dataset.query === q", arg=query)
    return page.get_by_test_id("search-hit")


def test_search_finds_a_message_on_another_branch_and_opens_it_there(chat, server, screenshot):
    sid = server.http.post("/api/sessions/import", json=GARDEN).json()["id"]
    page = chat.open().page

    hits = _search(page, "quillwort")
    hits.first.wait_for()
    assert hits.count() == 1 and hits.first.locator("mark").all_inner_texts() == ["quillwort"]
    assert "Garden notes" in hits.first.inner_text()
    assert page.get_by_test_id("session-list").is_hidden()
    assert page.get_by_test_id("search-status").inner_text() == "1 match"
    screenshot(page, "search-results")

    hits.first.click()
    mid = hits.first.get_attribute("data-message-id")
    found = page.locator(f'[data-testid="message"][data-id="{mid}"]')
    found.wait_for()
    page.wait_for_function("id => document.activeElement.dataset.id === id", arg=mid)
    assert chat.session_id == sid
    assert found.get_by_test_id("branch-count").inner_text() == "2/2"
    assert server.session(sid)["messages"][1]["id"] == mid  # its branch is now the chosen one
    screenshot(page, "search-opened-hit")

    # titles are found too (this one came with the database from before branches), case folded
    hits = _search(page, "LIGHTHOUSE keeping")
    hits.first.wait_for()
    assert hits.first.get_attribute("data-message-id") == "" and "Lighthouse keeping" in hits.first.inner_text()
    hits.first.click()
    page.wait_for_function("id => location.hash === '#/s/' + id", arg=LEGACY_SESSION[0])

    assert _search(page, "quillwort hostas").count() == 0  # every word must be in one message
    assert page.get_by_test_id("search-status").inner_text() == "No matches"
    page.get_by_test_id("search-input").press("Escape")
    page.get_by_test_id("session-list").wait_for(state="visible")
    assert page.get_by_test_id("search-input").input_value() == ""
