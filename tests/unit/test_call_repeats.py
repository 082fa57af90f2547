"""No repeated tool calls: crafted replies fed to `CallRepeats` in every split, a repeat arriving token by token.
What leaves is always a prefix of the reply without its repeat, a repeat's text and items never leave, and the
sample stops on the character that completes the repeat."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.call_repeats import CallRepeats, canonical
from engine.tool_calls import GENERIC, ToolFormat
from engine.tool_parser import Call, split_reply

MISTRAL_LIKE = ToolFormat("test-list", call_open="", call_close="", separator=", ", begin="[CALLS][", end="]")

PARIS = ("get_weather", '{"city": "Paris"}')
TOKYO = ("get_weather", '{"city": "Tokyo"}')
NOW = ("get_time", "{}")


def reply(fmt: ToolFormat, calls: list[tuple[str, str]], lead: str = "") -> str:
    return lead + fmt.begin + fmt.separator.join(fmt.render_call(n, a) for n, a in calls) + fmt.end


def run(fmt: ToolFormat, deltas: list[str]) -> tuple[list[str], list[list[int]], CallRepeats[int], int | None]:
    """Feed `deltas` (item: the delta index); text and items out after each, the guard, the delta it stopped on."""
    g: CallRepeats[int] = CallRepeats(fmt)
    texts, items, stopped_at = [], [], None
    for i, d in enumerate(deltas):
        text, out = g.push(d, i)
        texts.append(text)
        items.append(out)
        if g.stopped and stopped_at is None:
            stopped_at = i
    if stopped_at is None:
        text, out = g.finish()
        texts.append(text)
        items.append(out)
    return texts, items, g, stopped_at


def test_a_repeat_arriving_char_by_char_never_leaves_and_stops_at_its_last_argument_char():
    first = reply(GENERIC, [PARIS])
    whole = reply(GENERIC, [PARIS, PARIS, NOW])
    texts, items, g, stopped_at = run(GENERIC, list(whole))
    assert g.stopped
    repeat_args_end = len(first) + len(GENERIC.separator + GENERIC.head(PARIS[0]) + PARIS[1])
    assert stopped_at == repeat_args_end - 1  # the character that closes the repeat's arguments
    out = ""
    for t in texts:
        out += t
        assert first.startswith(out), "only the first call's text ever leaves"
    assert out == first
    sent = [i for got in items for i in got]
    assert sent == list(range(len(first)))  # the repeat's pieces (items) are dropped with its text
    assert split_reply(GENERIC, out) == ("", [Call(*PARIS)])


def test_a_call_of_a_new_function_leaves_as_soon_as_its_name_is_known():
    whole = reply(GENERIC, [PARIS, NOW])
    texts, _, g, _ = run(GENERIC, list(whole))
    assert not g.stopped and "".join(texts) == whole
    named = len(reply(GENERIC, [PARIS]) + GENERIC.separator + GENERIC.head(NOW[0]))
    out = ""
    for i, t in enumerate(texts[:-1]):
        out += t
        if i + 1 == named:  # the head's last character names it: everything so far goes
            assert out == whole[:named]
        if i + 1 < named:
            assert len(out) <= len(reply(GENERIC, [PARIS])), "the separator and head are held until the name tells"


def test_a_call_of_a_function_already_called_goes_out_whole_when_its_arguments_differ():
    whole = reply(GENERIC, [PARIS, TOKYO])
    texts, _, g, _ = run(GENERIC, list(whole))
    assert not g.stopped and "".join(texts) == whole
    second_args_end = len(reply(GENERIC, [PARIS]) + GENERIC.separator + GENERIC.head(TOKYO[0]) + TOKYO[1])
    out = "".join(texts[: second_args_end - 1])
    assert out == reply(GENERIC, [PARIS]), "held while it could still be the same call"
    assert "".join(texts[:second_args_end]) == whole[:second_args_end]


def test_the_same_arguments_in_another_order_or_spacing_are_a_repeat():
    a = ("add", '{"a": 1, "b": [2, {"c": "x"}]}')
    for again in ('{"b": [2, {"c": "x"}], "a": 1}', '{"a":1,"b":[2,{"c":"x"}]}'):
        texts, _, g, _ = run(GENERIC, list(reply(GENERIC, [a, ("add", again)])))
        assert g.stopped and "".join(texts) == reply(GENERIC, [a])
    texts, _, g, _ = run(GENERIC, list(reply(GENERIC, [a, ("add", '{"a": 1, "b": [2, {"c": "y"}]}')])))
    assert not g.stopped
    assert canonical('{"b": 1, "a": "\\u00e9"}') == '{"a":"é","b":1}'
    assert canonical("{not json") == "{not json"


def test_a_reply_cut_mid_call_gets_what_was_held_from_finish():
    whole = reply(GENERIC, [PARIS])
    cut = whole + GENERIC.separator + GENERIC.head(PARIS[0]) + '{"city": "Pa'  # max_tokens inside a likely repeat
    g: CallRepeats[int] = CallRepeats(GENERIC)
    out, items = "", []
    for i, ch in enumerate(cut):
        text, got = g.push(ch, i)
        out, items = out + text, items + got
    assert out == whole and not g.stopped
    text, got = g.finish("r")  # the detokenizer's held-back rest comes last
    assert out + text == cut + "r" and items + got == list(range(len(cut)))


def test_empty_pieces_keep_their_place_among_the_items():
    g: CallRepeats[str] = CallRepeats(GENERIC)
    first = reply(GENERIC, [PARIS])
    assert g.push(first, "call") == (first, ["call"])
    assert g.push(GENERIC.separator, "sep") == ("", [])
    assert g.push("", "eos") == ("", [])  # after held text: waits its turn
    assert g.finish() == (GENERIC.separator, ["sep", "eos"])


def splits(text: str) -> st.SearchStrategy[list[str]]:
    return st.sets(st.integers(1, len(text) - 1), max_size=len(text) // 2).map(
        lambda cuts: [text[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(text)])]
    )


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    fmt=st.sampled_from([GENERIC, MISTRAL_LIKE]),
    lead=st.sampled_from(["", "Checking. ", "If a < b <tool then: "]),
)
def test_any_split_gives_the_calls_before_the_first_repeat(data, fmt: ToolFormat, lead: str):
    calls = [PARIS, NOW, TOKYO, NOW, PARIS]
    whole = reply(fmt, calls, lead if fmt is GENERIC else "")
    kept = reply(fmt, calls[:3], lead if fmt is GENERIC else "")[: -len(fmt.end) or None]
    deltas = data.draw(splits(whole))
    texts, items, g, stopped_at = run(fmt, deltas)
    assert g.stopped and stopped_at is not None
    out = "".join(texts)
    assert out == kept
    content, got = split_reply(fmt, out)
    assert [(c.name, c.arguments) for c in got] == calls[:3] and content == lead.rstrip() * (fmt is GENERIC)
    starts = [sum(len(d) for d in deltas[:i]) for i in range(len(deltas))]
    sent = [i for got_items in items for i in got_items]
    assert sent == [i for i, start in enumerate(starts) if start < len(kept)], "the deltas with kept text, in order"
