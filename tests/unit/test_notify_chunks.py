"""Chunking a message under NOTIFY's payload limit and putting it back together (app/store/notify_chunks.py)."""

from __future__ import annotations

from app.store.notify_chunks import PAYLOAD_LIMIT, Reassembler, cut, frame

MIXED = "aé€😀" * 5000  # 1-, 2-, 3- and 4-byte characters: every cut position meets each kind


def test_cut_never_splits_a_character_and_stays_under_the_limit() -> None:
    for limit in (4, 5, 6, 7, 97, 7999):
        pieces = cut(MIXED, limit)
        assert "".join(pieces) == MIXED
        assert all(0 < len(p.encode()) <= limit for p in pieces)
    assert cut("", 10) == [""]


def test_a_large_event_travels_in_chunks_and_comes_back_whole() -> None:
    text = '{"type":"delta","text":"' + MIXED + '"}'
    payloads = frame("s1", 1, text)
    assert len(payloads) > 1
    assert all(len(p.encode()) <= PAYLOAD_LIMIT for p in payloads)
    # some chunk border falls right after a multi-byte character (the cut moved back to its start)
    assert any(not p.split(" ", 4)[4].isascii() for p in payloads)
    r = Reassembler()
    got = [r.add(p) for p in payloads]
    assert got[:-1] == [None] * (len(payloads) - 1)
    assert got[-1] == ("s1", text)


def test_senders_are_put_together_apart_and_small_messages_in_one_chunk() -> None:
    r = Reassembler()
    a, b = frame("a", 1, "x" * 9000), frame("b", 1, "hello")
    assert len(b) == 1
    assert r.add(a[0]) is None
    assert r.add(b[0]) == ("b", "hello")  # another sender's message in between (another transaction)
    assert r.add(a[1]) == ("a", "x" * 9000)


def test_a_repeated_message_is_delivered_once() -> None:
    r = Reassembler()
    one = frame("s", 1, "first")
    assert r.add(one[0]) == ("s", "first")
    assert r.add(one[0]) is None
    assert r.add(frame("s", 2, "second")[0]) == ("s", "second")
    assert r.add(one[0]) is None  # an older one after a newer: never delivered again


def test_a_message_missing_a_chunk_is_dropped_and_the_next_one_comes_through() -> None:
    r = Reassembler()
    first, second = frame("s", 1, "é" * 6000), frame("s", 2, "ok")
    assert len(first) >= 2
    assert r.add(first[0]) is None
    assert r.add(second[0]) == ("s", "ok")  # chunk 1 of message 1 never came
    assert r.add(first[1]) is None
    assert r.dropped == 1
    third = frame("s", 3, "z" * 9000)
    assert r.add(third[1]) is None  # its start was missed: nothing of it is delivered
    assert r.add(third[0]) is None
    assert r.add(frame("s", 4, "next")[0]) == ("s", "next")
