"""Reply branches in the UI: Regenerate and Edit keep the old versions behind a ‹ i/n › switch, and the
choice survives a reload, an export and an import; a conversation stored before branches existed (the
server upgraded its database at start) shows as it was."""

from __future__ import annotations

from legacy_db import message_id

from tests.e2e.conftest import LEGACY_SESSION

FRANCE, GERMANY = "What is the capital of France?", "What is the capital of Germany?"


def _count(message) -> str:
    return message.get_by_test_id("branch-count").inner_text()


def _wait_shown(page, ids: list[str]) -> None:
    page.wait_for_function(
        "ids => JSON.stringify([...document.querySelectorAll('[data-testid=message]')]"
        ".map(e => e.dataset.id)) === JSON.stringify(ids)",
        arg=ids,
    )


def test_versions_of_replies_and_questions_survive_reload_export_and_import(chat, server, screenshot):
    page = chat.open().page
    sid = chat.new_session()
    chat.set_settings(max_tokens=6, temperature=0)
    chat.send(FRANCE)
    first = chat.assistant()
    first.wait_for()
    chat.wait_finished(first)
    first_id = first.get_attribute("data-id")
    assert first.get_by_test_id("branches").count() == 0  # one version: no switch

    first.hover()
    first.get_by_test_id("message-regenerate").click()
    page.wait_for_function(
        "old => { const a = document.querySelector('[data-testid=message][data-role=assistant]');"
        " return a && a.dataset.id !== old; }",
        arg=first_id,
    )
    second = chat.assistant()
    chat.wait_finished(second)
    assert _count(second) == "2/2"
    second.get_by_test_id("branch-prev").click()
    user_id = chat.messages().first.get_attribute("data-id")
    _wait_shown(page, [user_id, first_id])
    assert _count(chat.assistant()) == "1/2"

    # editing the question makes a second version of it, with its own reply
    user = chat.messages().first
    user.hover()
    user.get_by_test_id("message-edit").click()
    user.get_by_test_id("edit-input").fill(GERMANY)
    user.get_by_test_id("edit-submit").click()
    page.wait_for_function(
        "old => { const m = document.querySelector('[data-testid=message]');"
        " return m && m.dataset.id !== old && m.querySelector('[data-testid=branch-count]'); }",
        arg=user_id,
    )
    chat.wait_finished(chat.assistant())
    edited = chat.displayed()
    assert edited[0]["text"] == GERMANY and _count(chat.messages().first) == "2/2"
    assert chat.assistant().get_by_test_id("branches").count() == 0
    screenshot(page, "branches-edited-question")

    page.reload()
    chat.wait_connected()
    _wait_shown(page, [m["id"] for m in edited])
    assert chat.displayed() == edited and _count(chat.messages().first) == "2/2"

    # back to the first question: below it, the reply chosen there before (the first version)
    chat.messages().first.get_by_test_id("branch-prev").click()
    _wait_shown(page, [user_id, first_id])
    chosen = chat.displayed()
    assert chosen[0]["text"] == FRANCE and [_count(m) for m in chat.messages().all()] == ["1/2", "1/2"]
    page.reload()
    chat.wait_connected()
    _wait_shown(page, [user_id, first_id])
    assert [m["id"] for m in server.session(sid)["messages"]] == [user_id, first_id]
    screenshot(page, "branches-after-reload")

    # an export holds every version and the choice; its import shows the same
    export = server.http.get(f"/api/sessions/{sid}/export").json()
    assert export["forge_export"] == 2 and len(export["messages"]) == 5
    copy = server.http.post("/api/sessions/import", json=export).json()
    page.goto(f"/#/s/{copy['id']}")
    page.wait_for_function("() => document.querySelectorAll('[data-testid=branch-count]').length === 2")
    assert [(m["role"], m["text"]) for m in chat.displayed()] == [(m["role"], m["text"]) for m in chosen]
    assert [_count(m) for m in chat.messages().all()] == ["1/2", "1/2"]


def test_a_conversation_stored_before_branches_shows_as_it_was(chat, server):
    sid, _, title, messages = LEGACY_SESSION
    page = chat.open(f"/#/s/{sid}").page
    _wait_shown(page, [message_id(sid, i) for i in range(len(messages))])
    shown = chat.displayed()
    assert [(m["role"], m["text"].strip(), m["status"]) for m in shown] == [m[:3] for m in messages]
    assert page.get_by_test_id("branches").count() == 0
    assert page.get_by_test_id("session-title").inner_text() == title
    assert server.session(sid)["messages"][-1]["finish_reason"] == "abort"
