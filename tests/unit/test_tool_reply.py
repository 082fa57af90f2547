"""A reply's OpenAI shape with tools: stream deltas (id, type and name on a call's first delta only, one entry
per call in a delta) and the whole message, and when finish_reason says "tool_calls"."""

from __future__ import annotations

from app.api.tools import ToolReply
from engine.tool_calls import GENERIC

TEXT = "Checking.\n" + GENERIC.render_call("f", '{"a": 1}') + "\n" + GENERIC.render_call("g", "{}")


def test_deltas_carry_content_then_each_call_once_named():
    r = ToolReply(GENERIC)
    cut = TEXT.index('{"a"') + 3  # mid-arguments of the first call
    second = TEXT.index("<tool_call>", cut)
    d1 = r.delta(TEXT[:cut], None)
    split = second + len(GENERIC.head("g")) + 1
    d2 = r.delta(TEXT[cut:split], None)  # the rest of call 0 and the start of call 1 in one delta
    d3 = r.delta(TEXT[split:], "stop")
    assert d1["content"] == "Checking."
    (c0,) = d1["tool_calls"]
    assert c0["index"] == 0 and c0["id"].startswith("call_") and c0["type"] == "function"
    assert c0["function"] == {"name": "f", "arguments": '{"a'}
    assert [c["index"] for c in d2["tool_calls"]] == [0, 1]
    assert "id" not in d2["tool_calls"][0] and "name" not in d2["tool_calls"][0]["function"]
    assert d2["tool_calls"][1]["function"]["name"] == "g" and d2["tool_calls"][1]["id"] != c0["id"]
    args = {0: "", 1: ""}
    for d in (d1, d2, d3):
        for c in d.get("tool_calls", []):
            args[c["index"]] += c["function"]["arguments"]
    assert args == {0: '{"a": 1}', 1: "{}"} and "content" not in d3
    assert r.finish_reason("stop") == "tool_calls" and r.finish_reason("length") == "length"


def test_the_whole_message():
    m = ToolReply(GENERIC).message(TEXT)
    assert m["content"] == "Checking." and [c["function"]["name"] for c in m["tool_calls"]] == ["f", "g"]
    m = ToolReply(GENERIC).message(GENERIC.render_call("f", "{}"))
    assert m["content"] is None
    plain = ToolReply(GENERIC)
    assert plain.message("Just text.") == {"role": "assistant", "content": "Just text."}
    assert plain.finish_reason("stop") == "stop"


def test_a_call_cut_by_a_stop_string_is_not_finished_as_tool_calls():
    r = ToolReply(GENERIC)
    r.delta(GENERIC.head("f") + '{"a": ', "stop")
    assert r.finish_reason("stop") == "stop"
