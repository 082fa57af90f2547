"""Tool calls in the chat UI: tools pasted in the settings drawer, a reply that calls one shows as a compact card
(the function's name, its arguments pretty-printed), and the result a client posts shows in the same card."""

from __future__ import annotations

import json

from axe_playwright_python.sync_playwright import Axe

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "The weather in a city", "parameters": WEATHER},
    }
]
RESULT = {"city": "Paris", "sky": "clear", "temperature_c": 21}


def test_a_call_and_its_result_show_as_a_card(chat, server, page, screenshot):
    chat.open()
    sid = chat.new_session()
    chat.set_settings(max_tokens=96, temperature=0)
    # a list that is not JSON is refused in the drawer, before anything is sent
    page.get_by_test_id("toggle-settings").click()
    page.get_by_test_id("settings-tools").fill("[{not json")
    page.get_by_test_id("settings-save").click()
    assert "JSON list" in page.get_by_test_id("settings-error").inner_text()
    page.get_by_test_id("settings-tools").fill(json.dumps(TOOLS))
    page.get_by_test_id("settings-save").click()
    page.get_by_test_id("settings-saved").wait_for(state="visible")
    page.get_by_test_id("toggle-settings").click()
    assert server.session(sid)["settings"]["tools"][0]["function"]["name"] == "get_weather"
    # every reply must call it, once
    r = server.http.patch(
        f"/api/sessions/{sid}", json={"settings": {"tool_choice": "required", "parallel_tool_calls": False}}
    )
    assert r.status_code == 200, r.text

    chat.send("What is the weather in Paris?")
    reply = chat.assistant()
    reply.wait_for()
    assert chat.wait_finished(reply) == "complete"
    card = reply.get_by_test_id("tool-call")
    assert card.count() == 1
    assert card.get_by_test_id("tool-name").inner_text() == "get_weather"
    arguments = card.get_by_test_id("tool-arguments").inner_text()
    assert json.loads(arguments)["city"] and "\n" in arguments  # pretty-printed
    assert card.get_by_test_id("tool-pending").inner_text() == "Waiting for the result"
    assert "<tool_call>" not in reply.get_by_test_id("message-content").inner_text()

    call_id = server.session(sid)["messages"][-1]["tool_calls"][0]["id"]
    assert card.get_attribute("data-call-id") == call_id
    r = server.http.post(
        f"/api/sessions/{sid}/tool_results", json={"tool_call_id": call_id, "content": json.dumps(RESULT)}
    )
    assert r.status_code == 201, r.text
    page.reload()
    chat.wait_connected()
    result = chat.assistant().get_by_test_id("tool-call").get_by_test_id("tool-result")
    result.wait_for()
    assert json.loads(result.locator("pre").inner_text()) == RESULT
    screenshot(page, "tool-call-card")
    found = Axe().run(page).response["violations"]
    assert not found, [f"{v['id']}: {[n['target'] for n in v['nodes']][:6]}" for v in found]
