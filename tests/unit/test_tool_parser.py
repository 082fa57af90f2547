"""The streaming tool-call splitter: any split of a reply into deltas gives the same content, calls, names and
arguments as the whole reply; each call's name comes once, on its first piece."""

from __future__ import annotations

import itertools
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.tool_calls import GENERIC, LLAMA3_JSON, ToolFormat
from engine.tool_parser import ToolCallSplitter, split_reply

MISTRAL_LIKE = ToolFormat("test-list", call_open="", call_close="", separator=", ", begin="[CALLS][", end="]")

REPLIES = [
    ("Hello there.\n", "Hello there.\n", []),
    (
        "I will check.\n\n" + GENERIC.render_call("get_weather", '{"city": "Paris"}'),
        "I will check.",
        [("get_weather", '{"city": "Paris"}')],
    ),
    (
        GENERIC.render_call("a", '{"s": "}{\\"<tool_call>", "n": [1, {"x": []}]}')
        + "\n"
        + GENERIC.render_call("b_2", "{}"),
        "",
        [("a", '{"s": "}{\\"<tool_call>", "n": [1, {"x": []}]}'), ("b_2", "{}")],
    ),
    ("a < b and <tool but not a call", "a < b and <tool but not a call", []),
    (GENERIC.head("cut") + '{"city": "Par', "", [("cut", '{"city": "Par')]),  # max_tokens mid-call
]


def replay(fmt: ToolFormat, deltas: list[str]) -> tuple[str, list[tuple[str, str]], list]:
    s = ToolCallSplitter(fmt)
    pieces = [p for d in deltas for p in s.feed(d)] + s.finish()
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    for p in pieces:
        if p.call is None:
            assert p.content and p.name is None and not p.arguments
            continue
        if p.name is not None:
            assert p.call not in names, "a call's name came twice"
            assert p.call == len(names), "calls are numbered in order from 0"
            names[p.call] = p.name
        else:
            assert p.call in names, "arguments before the call's name"
        args[p.call] = args.get(p.call, "") + p.arguments
    content = "".join(p.content for p in pieces)
    return content, [(names[i], args.get(i, "")) for i in sorted(names)], pieces


def test_whole_replies_split_into_content_and_calls():
    for text, content, calls in REPLIES:
        got_content, got_calls, _ = replay(GENERIC, [text])
        assert (got_content, got_calls) == (content, calls), text
        c, parsed = split_reply(GENERIC, text)
        assert (c, [(x.name, x.arguments) for x in parsed]) == (content, calls)


def test_other_shapes_of_format():
    text = "ok [CALLS][" + MISTRAL_LIKE.render_call("f", '{"a": 1}') + ", " + MISTRAL_LIKE.render_call("g", "{}") + "]"
    assert replay(MISTRAL_LIKE, [text])[:2] == ("ok", [("f", '{"a": 1}'), ("g", "{}")])


def test_a_format_without_a_trigger_calls_only_at_the_start():
    call = LLAMA3_JSON.render_call("f", '{"a": [1]}')
    assert call == '{"name": "f", "parameters": {"a": [1]}}'
    assert replay(LLAMA3_JSON, [call])[:2] == ("", [("f", '{"a": [1]}')])
    assert replay(LLAMA3_JSON, list(call))[:2] == ("", [("f", '{"a": [1]}')])
    assert replay(LLAMA3_JSON, ["Sure: ", call])[:2] == ("Sure: " + call, [])


def test_complete_only_after_whole_calls():
    s = ToolCallSplitter(GENERIC)
    s.feed(GENERIC.head("f") + '{"a": "}')
    assert s.calls and not s.complete  # cut inside a string: a stop string or max_tokens ended it
    s.feed('"}')
    assert s.complete
    s.feed("}\n</tool_call>")
    assert s.complete


def test_parsed_arguments_are_the_json_written():
    text = GENERIC.render_call("f", json.dumps({"q": 'say "hi"\n', "k": [1, 2]}))
    _, calls, _ = replay(GENERIC, [text])
    assert json.loads(calls[0][1]) == {"q": 'say "hi"\n', "k": [1, 2]}


@st.composite
def splits(draw, text: str) -> list[str]:
    cuts = sorted(draw(st.sets(st.integers(0, len(text)), max_size=min(len(text), 40))))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_split_into_deltas_reassembles_exactly(data):
    for fmt, (text, content, calls) in [(GENERIC, r) for r in REPLIES] + [
        (MISTRAL_LIKE, ("x [CALLS][" + MISTRAL_LIKE.render_call("f", '{"a": "]"}') + "]", "x", [("f", '{"a": "]"}')])),
        (LLAMA3_JSON, (LLAMA3_JSON.render_call("f", '{"s": "{}"}'), "", [("f", '{"s": "{}"}')])),
        (LLAMA3_JSON, ("No. " + LLAMA3_JSON.render_call("f", "{}"), "No. " + LLAMA3_JSON.render_call("f", "{}"), [])),
    ]:
        deltas = data.draw(splits(text))
        got_content, got_calls, _ = replay(fmt, deltas)
        assert (got_content, got_calls) == (content, calls)


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab <>/_{}\"\\\n:,tool_call")), max_size=60), st.data())
def test_arbitrary_text_is_never_lost_before_a_call(text, data):
    # Text the grammar would allow in an `auto` reply (it never spells the trigger) comes back whole.
    text = text.replace(GENERIC.trigger, "")
    if GENERIC.trigger in text:
        return
    deltas = data.draw(splits(text))
    assert replay(GENERIC, deltas)[:2] == (text, [])
