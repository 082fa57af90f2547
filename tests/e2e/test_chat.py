"""The chat UI against the real service and the real default model: sessions, streaming,
Stop, Regenerate, Edit-and-resend, Copy, settings, stats, reload, reconnect (a reply goes on through both).

Greedy (temperature 0) replies are compared with the reference outputs in tests/fixtures.
"""

from __future__ import annotations

import json
import re
import time

from tests.e2e.conftest import UI_TIMEOUT_MS

FRANCE = 0  # fixture prompt: "What is the capital of France?" -> EOS after 8 tokens
FACTORIAL = 1  # fixture prompt: a Python function, 32 tokens, opens a ``` fence
LONG_PROMPT = "Write a long story about a dragon who learns to fly."

RESUMED_TOKENS = 80  # long enough to be cut mid-reply, short enough to finish soon
STREAMING_TEXT = (
    "() => { const m = document.querySelector('[data-testid=message][data-role=assistant]"
    "[data-status=streaming] [data-testid=message-content]'); return m && m.textContent.length > 0; }"
)
NO_STREAMING = "() => !document.querySelector('[data-testid=message][data-status=streaming]')"


def _prompt(reference: dict, i: int) -> tuple[str, str, int]:
    p = reference["prompts"][i]
    return p["messages"][-1]["content"], p["generated_text_skip_special"], p["n_generated"]


def _record_growth(page) -> None:
    """Record the streaming reply's visible length at every DOM change, in window.__growth."""
    page.evaluate("""() => {
        window.__growth = [];
        new MutationObserver(() => {
            const m = document.querySelector(
                '[data-testid=message][data-role=assistant][data-status=streaming] [data-testid=message-content]');
            if (m) window.__growth.push(m.textContent.length);
        }).observe(document.getElementById('messages'),
                   {subtree: true, childList: true, characterData: true, attributes: true});
    }""")


def test_send_streams_the_reply_token_by_token_and_stores_it(chat, server, reference, screenshot):
    question, expected, n_tokens = _prompt(reference, FRANCE)
    deltas: list[str] = []  # the `delta` events the page's socket receives

    def on_socket(ws) -> None:
        ws.on("framereceived", lambda frame: deltas.append(frame) if '"type":"delta"' in str(frame) else None)

    chat.page.on("websocket", on_socket)
    page = chat.open().page
    sid = chat.new_session()
    chat.set_settings(max_tokens=24, temperature=0)
    stored = server.session(sid)
    assert stored["settings"]["max_tokens"] == 24 and stored["settings"]["temperature"] == 0

    # Shift+Enter is a new line, not a send
    box = page.get_by_test_id("composer-input")
    box.fill("first line")
    box.press("Shift+Enter")
    box.press_sequentially("second line")
    assert box.input_value() == "first line\nsecond line"
    assert chat.messages().count() == 0
    box.fill("")

    _record_growth(page)
    chat.send(question)
    reply = chat.assistant()
    reply.wait_for()
    assert chat.wait_finished(reply) == "complete"
    screenshot(page, "chat-reply")

    # Streamed: the reply reached the page in several `delta` events and was on screen while still streaming.
    # (How many of its lengths the screen shows depends on timing: the UI draws at most once a frame.)
    growth = page.evaluate("window.__growth")
    assert len(deltas) >= 2, f"the reply came in {len(deltas)} delta event(s)"
    assert any(n > 0 for n in growth), f"the reply was never on screen while streaming: {growth}"
    assert box.input_value() == ""

    stored = server.session(sid)
    user, assistant = stored["messages"]
    assert (user["role"], user["content"]) == ("user", question)
    assert assistant["role"] == "assistant" and assistant["status"] == "complete"
    assert assistant["content"] == expected  # greedy: the reference output
    assert assistant["completion_tokens"] == n_tokens

    shown = chat.displayed()
    assert [(m["role"], m["id"]) for m in shown] == [("user", user["id"]), ("assistant", assistant["id"])]
    assert shown[0]["text"] == question
    assert shown[1]["text"].strip() == expected
    assert chat.copied_text(reply) == expected

    stats = reply.get_by_test_id("message-stats")
    assert stats.locator("[data-stat=tokens]").inner_text() == f"{assistant['completion_tokens']} tokens"
    assert stats.locator("[data-stat=cached]").inner_text() == (
        f"{assistant['cached_tokens']} / {assistant['prompt_tokens']} cached"
    )
    assert stats.locator("[data-stat=tokens-per-s]").inner_text() == f"{assistant['tokens_per_s']:.1f} tok/s"

    # the server titled the session from the first message; the sidebar shows it
    title = stored["title"]
    assert title != "New chat"
    item = page.locator(f'[data-testid="session-item"][data-id="{sid}"]')
    assert item.get_by_test_id("session-name").inner_text() == title
    assert page.get_by_test_id("session-title").inner_text() == title


def test_stop_ends_the_reply_and_keeps_the_partial_text(chat, server, screenshot):
    page = chat.open().page
    sid = chat.new_session()
    chat.set_settings(max_tokens=400, temperature=0)
    chat.send(LONG_PROMPT)
    reply = chat.assistant()
    reply.wait_for()
    page.wait_for_function(
        "() => { const m = document.querySelector("
        "'[data-testid=message][data-role=assistant][data-status=streaming] "
        "[data-testid=message-content]'); return m && m.textContent.length > 0; }"
    )
    assert page.get_by_test_id("send").is_hidden()
    page.get_by_test_id("stop").click()
    assert chat.wait_finished(reply) == "stopped"
    assert reply.get_by_test_id("message-status").inner_text() == "Stopped"
    assert page.get_by_test_id("send").is_visible()
    screenshot(page, "chat-stopped")

    stored = server.session(sid)["messages"][-1]
    assert stored["status"] == "stopped" and stored["finish_reason"] == "abort"
    assert 0 < stored["completion_tokens"] < 400
    assert chat.copied_text(reply) == stored["content"]


def test_regenerate_replaces_the_last_reply(chat, server, reference):
    question, expected, _ = _prompt(reference, FRANCE)
    page = chat.open().page
    sid = chat.new_session()
    chat.set_settings(max_tokens=24, temperature=0)
    chat.send(question)
    first = chat.assistant()
    first.wait_for()
    chat.wait_finished(first)
    first_id = first.get_attribute("data-id")

    first.hover()
    first.get_by_test_id("message-regenerate").click()
    page.wait_for_function(
        "old => { const a = [...document.querySelectorAll('[data-testid=message][data-role=assistant]')];"
        " return a.length === 1 && a[0].dataset.id !== old; }",
        arg=first_id,
    )
    second = chat.assistant()
    assert chat.wait_finished(second) == "complete"

    stored = server.session(sid)["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[1]["id"] == second.get_attribute("data-id") != first_id
    assert stored[1]["content"] == expected  # greedy again: the same text, a new message
    # the same prompt again: its leading blocks come from the prefix cache, and the stats say so
    assert stored[1]["cached_tokens"] > 0
    cached = second.get_by_test_id("message-stats").locator("[data-stat=cached]").inner_text()
    assert cached == f"{stored[1]['cached_tokens']} / {stored[1]['prompt_tokens']} cached"


def test_edit_and_resend_replaces_the_rest_of_the_conversation(chat, server, reference):
    question, expected, _ = _prompt(reference, FRANCE)
    page = chat.open().page
    sid = chat.new_session()
    chat.set_settings(max_tokens=12, temperature=0)
    chat.send("What is the capital of Germany?")
    old_reply = chat.assistant()
    old_reply.wait_for()
    chat.wait_finished(old_reply)
    old_reply_id = old_reply.get_attribute("data-id")

    user = chat.messages().first
    user.hover()
    user.get_by_test_id("message-edit").click()
    edit = user.get_by_test_id("edit-input")
    edit.fill(question)
    user.get_by_test_id("edit-submit").click()
    page.wait_for_function(
        "old => { const a = [...document.querySelectorAll('[data-testid=message][data-role=assistant]')];"
        " return a.length === 1 && a[0].dataset.id !== old; }",
        arg=old_reply_id,
    )
    assert chat.wait_finished(chat.assistant()) == "complete"

    stored = server.session(sid)["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant"]
    assert stored[0]["content"] == question
    assert stored[1]["id"] != old_reply_id
    assert stored[1]["content"] == expected  # the reply to the edited question
    shown = chat.displayed()
    assert [m["id"] for m in shown] == [stored[0]["id"], stored[1]["id"]]
    assert shown[0]["text"] == question


def test_reload_and_switching_sessions_show_the_stored_history(chat, server, reference, screenshot):
    question, expected, _ = _prompt(reference, FRANCE)
    page = chat.open().page
    other = chat.new_session()
    sid = chat.new_session()
    chat.set_settings(max_tokens=24, temperature=0)
    chat.send(question)
    reply = chat.assistant()
    reply.wait_for()
    chat.wait_finished(reply)
    before = chat.displayed()

    page.reload()
    chat.wait_connected()
    page.wait_for_function("n => document.querySelectorAll('[data-testid=message]').length === n", arg=len(before))
    assert chat.session_id == sid
    assert chat.displayed() == before
    stored = server.session(sid)["messages"]
    assert [m["id"] for m in before] == [m["id"] for m in stored]
    screenshot(page, "chat-after-reload")

    # another session is empty; coming back shows the history again
    page.locator(f'[data-testid="session-item"][data-id="{other}"] [data-testid="session-open"]').click()
    page.wait_for_function("id => location.hash === '#/s/' + id", arg=other)
    page.wait_for_function("() => document.querySelectorAll('[data-testid=message]').length === 0")
    assert page.get_by_test_id("empty-state").is_visible()
    page.locator(f'[data-testid="session-item"][data-id="{sid}"] [data-testid="session-open"]').click()
    page.wait_for_function("n => document.querySelectorAll('[data-testid=message]').length === n", arg=len(before))
    assert chat.displayed() == before


def test_code_in_a_reply_renders_as_a_code_block(chat, server, reference, screenshot):
    question, expected, n_tokens = _prompt(reference, FACTORIAL)
    assert expected.startswith("```python\n")
    page = chat.open().page
    sid = chat.new_session()
    chat.set_settings(max_tokens=n_tokens, temperature=0)
    chat.send(question)
    reply = chat.assistant()
    reply.wait_for()
    assert chat.wait_finished(reply) == "complete"
    stored = server.session(sid)["messages"][-1]
    assert stored["content"] == expected and stored["finish_reason"] == "length"
    assert reply.get_by_test_id("message-status").inner_text() == "Max tokens reached"

    block = reply.locator(".code-block")
    assert block.count() == 1
    assert block.locator(".code-lang").inner_text() == "python"
    code = block.locator("pre > code")
    assert code.get_attribute("class") == "hljs language-python"
    assert code.text_content() == expected.removeprefix("```python\n")  # the fence is open: code to the end
    # highlighted by highlight.js: keywords, the function's name and numbers in their own colours
    assert code.locator(".hljs-keyword").all_inner_texts()[:4] == ["def", "if", "return", "else"]
    assert code.locator(".hljs-title").first.inner_text() == "factorial"
    colours = {
        code.locator(sel).first.evaluate("e => getComputedStyle(e).color")
        for sel in (".hljs-keyword", ".hljs-title", ".hljs-number")
    }
    assert len(colours | {code.evaluate("e => getComputedStyle(e).color")}) == 4
    block.get_by_test_id("code-copy").click()
    block.get_by_test_id("code-copy").filter(has_text="Copied").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == code.text_content()
    screenshot(page, "chat-code-block")


def test_sidebar_rename_delete_and_export(chat, server, page):
    chat.open()
    keep = chat.new_session()
    doomed = chat.new_session()

    item = page.locator(f'[data-testid="session-item"][data-id="{keep}"]')
    item.hover()
    item.get_by_test_id("session-rename").click()
    field = page.get_by_test_id("session-rename-input")
    field.fill("Trip planning")
    field.press("Enter")
    item.get_by_test_id("session-name").filter(has_text="Trip planning").wait_for()
    assert server.session(keep)["title"] == "Trip planning"

    gone = page.locator(f'[data-testid="session-item"][data-id="{doomed}"]')
    gone.hover()
    gone.get_by_test_id("session-delete").click()  # first click asks
    assert server.http.get(f"/api/sessions/{doomed}").status_code == 200
    gone.get_by_test_id("session-delete").click()  # second click deletes
    gone.wait_for(state="detached")
    assert server.http.get(f"/api/sessions/{doomed}").status_code == 404
    assert "#/s/" not in page.url  # the open session was deleted

    item.get_by_test_id("session-open").click()
    page.wait_for_function("id => location.hash === '#/s/' + id", arg=keep)
    with page.expect_download() as dl:
        page.get_by_test_id("export-session").click()
    data = json.loads(open(dl.value.path(), encoding="utf-8").read())
    assert data == server.http.get(f"/api/sessions/{keep}/export").json()
    assert data["forge_export"] == 2 and data["session"]["title"] == "Trip planning"


def test_settings_errors_are_shown(chat, server, page):
    chat.open()
    sid = chat.new_session()
    page.get_by_test_id("toggle-settings").click()
    page.get_by_test_id("settings-top-p").fill("0")
    page.get_by_test_id("settings-save").click()
    assert "Top p" in page.get_by_test_id("settings-error").inner_text()

    page.get_by_test_id("settings-top-p").fill("0.9")
    page.get_by_test_id("settings-max-tokens").fill("99999999")  # the server refuses it
    page.get_by_test_id("settings-save").click()
    page.get_by_test_id("settings-error").filter(has_text="max_tokens").wait_for()
    assert server.session(sid)["settings"]["max_tokens"] != 99999999

    page.get_by_test_id("settings-max-tokens").fill("64")
    page.get_by_test_id("settings-system-prompt").fill("You are terse.")
    page.get_by_test_id("settings-save").click()
    page.get_by_test_id("settings-saved").wait_for(state="visible")
    stored = server.session(sid)
    assert stored["settings"]["max_tokens"] == 64 and stored["settings"]["top_p"] == 0.9
    assert stored["system_prompt"] == "You are terse."
    assert page.get_by_test_id("settings-error").inner_text() == ""


def test_socket_drop_reconnects_and_the_reply_goes_on(chat, server, page, screenshot):
    routes = []

    def proxy(ws) -> None:
        routes.append((ws, ws.connect_to_server()))

    # /ws or /ws?session=<id> (a reconnect names its session, for a proxy to route it to its replica)
    page.route_web_socket(re.compile(r"/ws(\?[^/]*)?$"), proxy)
    chat.open()
    sid = chat.new_session()
    chat.set_settings(max_tokens=RESUMED_TOKENS, temperature=0)
    chat.send(LONG_PROMPT)
    chat.assistant().wait_for()
    page.wait_for_function(STREAMING_TEXT)
    assert len(routes) == 1
    reply_id = chat.assistant().get_attribute("data-id")
    to_page, to_server = routes[0]
    to_page.close(code=4000, reason="test: connection lost")
    to_server.close(code=4000, reason="test: connection lost")

    page.wait_for_selector('[data-testid="conn-status"]:not([data-state="open"])')
    screenshot(page, "chat-reconnecting")
    chat.wait_connected()
    assert len(routes) == 2
    # the server kept generating; the page reattaches and shows the reply to its end
    assert chat.wait_finished(page.locator(f'[data-testid="message"][data-id="{reply_id}"]')) == "complete"
    stored = server.session(sid)["messages"]
    assert [m["status"] for m in stored] == ["complete", "complete"]
    shown = chat.displayed()
    assert [(m["id"], m["status"]) for m in shown] == [(m["id"], m["status"]) for m in stored]
    assert chat.copied_text(chat.assistant()) == stored[1]["content"]
    assert page.get_by_test_id("send").is_visible()


def test_reload_mid_reply_shows_it_going_on(chat, server, page):
    chat.open()
    sid = chat.new_session()
    chat.set_settings(max_tokens=RESUMED_TOKENS, temperature=0)
    chat.send(LONG_PROMPT)
    chat.assistant().wait_for()
    page.wait_for_function(STREAMING_TEXT)
    reply_id = chat.assistant().get_attribute("data-id")
    page.reload()
    chat.wait_connected()
    reply = page.locator(f'[data-testid="message"][data-id="{reply_id}"]')
    reply.wait_for()
    assert chat.wait_finished(reply) == "complete"
    stored = server.session(sid)["messages"][-1]
    assert (stored["id"], stored["status"]) == (reply_id, "complete")
    assert chat.copied_text(reply) == stored["content"]  # the text after the reload joins the text before it


def test_import_button_opens_the_imported_session(chat, server, page):
    source = server.create_session(title="Exported elsewhere")["id"]
    export = server.http.get(f"/api/sessions/{source}/export").json()
    export["messages"] = [
        {"role": "user", "content": "Hello there", "status": "complete"},
        {
            "role": "assistant",
            "content": "Hi! *How* can I help?",
            "status": "complete",
            "finish_reason": "stop",
            "prompt_tokens": 30,
            "cached_tokens": 16,
            "completion_tokens": 9,
            "ttft_ms": 120.0,
            "tokens_per_s": 25.0,
        },
    ]
    chat.open()
    page.set_input_files("#import-file", files=[{"name": "notes.txt", "mimeType": "text/plain", "buffer": b"not json"}])
    page.get_by_test_id("toast").filter(has_text="notes.txt is not a JSON export").wait_for()

    page.set_input_files(
        "#import-file",
        files=[{"name": "chat.json", "mimeType": "application/json", "buffer": json.dumps(export).encode()}],
    )
    page.wait_for_function("() => document.querySelectorAll('[data-testid=message]').length === 2")
    sid = chat.session_id
    assert sid != source
    stored = server.session(sid)
    assert stored["title"] == "Exported elsewhere"
    shown = chat.displayed()
    assert [m["id"] for m in shown] == [m["id"] for m in stored["messages"]]
    assert shown[0]["text"] == "Hello there"
    assert chat.assistant().locator("em").inner_text() == "How"
    assert chat.assistant().get_by_test_id("message-stats").inner_text().split() == [
        "9",
        "tokens",
        "·",
        "25.0",
        "tok/s",
        "·",
        "16",
        "/",
        "30",
        "cached",
        "·",
        "TTFT",
        "120",
        "ms",
    ]


def test_sending_without_a_session_creates_one(chat, server, page):
    chat.open()
    assert "#/s/" not in page.url
    chat.send(LONG_PROMPT)
    reply = chat.assistant()
    reply.wait_for()
    sid = chat.session_id
    page.get_by_test_id("stop").click()  # the default settings allow a long reply: stop it
    assert chat.wait_finished(reply) == "stopped"
    stored = server.session(sid)["messages"]
    assert [(m["role"], m["status"]) for m in stored] == [("user", "complete"), ("assistant", "stopped")]
    assert stored[0]["content"] == LONG_PROMPT
    assert page.locator(f'[data-testid="session-item"][data-id="{sid}"][aria-current="page"]').count() == 1


def test_a_session_list_read_before_a_new_session_does_not_drop_it(chat, page):
    # The page asks for the session list when it loads and again when its socket opens. On a busy server one of
    # those answers, read before the user made a new session, can arrive after it: the list must keep the new
    # (open) session, not fall back to the older list.
    stale = []  # (route, the server's answer read at once, before the new session exists); given to the page later
    lists = []

    def answer_late(route) -> None:
        if route.request.method != "GET":
            route.continue_()
            return
        lists.append(route)
        if len(lists) == 1:  # the access probe (web/auth.js): every request waits for it
            route.continue_()
        else:
            stale.append((route, route.fetch()))

    page.route("**/api/sessions", answer_late)
    chat.open()
    deadline = time.monotonic() + UI_TIMEOUT_MS / 1000
    while len(stale) < 2:  # the load's list and the socket's
        assert time.monotonic() < deadline, f"the page asked for the list {len(stale)} time(s)"
        page.wait_for_timeout(50)
    sid = chat.new_session()
    current = f'[data-testid="session-item"][data-id="{sid}"][aria-current="page"]'
    for route, answer in stale:  # each stale answer redraws the list: it still shows the new session, open
        drawn = page.locator('[data-testid="session-item"]').first.element_handle()
        route.fulfill(response=answer)
        page.wait_for_function("el => !el.isConnected", arg=drawn)
        assert page.locator(current).count() == 1, chat.page.eval_on_selector_all(
            '[data-testid="session-item"]', "els => els.map(e => e.dataset.id)"
        )


def _long_reply(chat):
    """A new session's reply to LONG_PROMPT, streaming (greedy, up to 400 tokens): (page, session id, reply, its id)."""
    page = chat.open().page
    sid = chat.new_session()
    chat.set_settings(max_tokens=400, temperature=0)
    chat.send(LONG_PROMPT)
    reply = chat.assistant()
    reply.wait_for()
    return page, sid, reply, reply.get_attribute("data-id")


def _stop_and_match(chat, server, page, reply, other, sid: str, reply_id: str) -> None:
    """Stop the reply from `page`; `other` shows it stopped, with exactly the stored text."""
    page.get_by_test_id("stop").click()
    assert chat.wait_finished(reply) == "stopped"
    other.wait_for_selector(f'[data-testid="message"][data-id="{reply_id}"][data-status="stopped"]')
    stored = server.session(sid)["messages"][-1]
    assert chat.copied_text(other.locator(f'[data-testid="message"][data-id="{reply_id}"]')) == stored["content"]
    other.close()


def test_a_second_tab_follows_a_reply_streaming_in_another(chat, server, context):
    page, sid, reply, reply_id = _long_reply(chat)
    other = context.new_page()
    other.goto(f"/#/s/{sid}")
    other.wait_for_selector('[data-testid="conn-status"][data-state="open"]')
    # the reply streams to the first tab; the second one follows its stored progress
    other.wait_for_selector(f'[data-testid="message"][data-id="{reply_id}"][data-status="streaming"]')
    other.wait_for_function(
        "id => document.querySelector(`[data-testid=message][data-id=\"${id}\"] [data-testid=message-content]`)"
        ".textContent.length > 0",
        arg=reply_id,
    )
    assert other.get_by_test_id("stop").is_visible()
    _stop_and_match(chat, server, page, reply, other, sid, reply_id)


def test_a_stored_copy_arriving_after_the_live_one_does_not_replace_it(chat, server, context):
    # A tab opening a session asks for the stored history over REST until its socket is open; the socket's
    # history (a reply going on as far as it got, its deltas after that) can come first. The stored copy,
    # a few flushes behind, must not then replace the live one: the deltas after it would leave a gap.
    page, sid, reply, reply_id = _long_reply(chat)
    other = context.new_page()
    held = []  # the REST request, answered only once the socket's history is on the page
    other.route(f"**/api/sessions/{sid}", lambda route: held.append(route))
    sockets = []  # the first socket is refused, so that the page opens the session over REST meanwhile

    def socket(ws) -> None:
        sockets.append(ws)
        ws.close() if len(sockets) == 1 else ws.connect_to_server()

    other.route_web_socket("**/ws*", socket)
    other.goto(f"/#/s/{sid}")
    other.wait_for_selector('[data-testid="conn-status"][data-state="open"]')
    content = f'[data-testid=message][data-id="{reply_id}"] [data-testid=message-content]'
    shown = "sel => (document.querySelector(sel)?.textContent || '').length"
    other.wait_for_function(f"sel => ({shown})(sel) > 0", arg=content)
    assert len(held) == 1
    held[0].continue_()
    at = other.evaluate(shown, content)
    other.wait_for_function(f"([sel, n]) => ({shown})(sel) > n", arg=[content, at])  # deltas after the answer
    _stop_and_match(chat, server, page, reply, other, sid, reply_id)
