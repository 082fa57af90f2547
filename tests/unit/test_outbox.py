"""The per-client outbox: bounded in events and in bytes; a stall drops what waits and ends the stream."""

from __future__ import annotations

import asyncio

from app.api.outbox import Outbox


def drain(box: Outbox) -> list:
    return [box.queue.get_nowait()[0] for _ in range(box.queue.qsize())]


def test_a_reader_that_falls_behind_is_cut_off_once() -> None:
    stalls = []
    box = Outbox(limit=3, limit_bytes=1 << 20, on_stall=lambda: stalls.append(1))
    for i in range(3):
        box.put(i, 10)
    assert not box.stalled and box.bytes == 30
    box.put(3, 10)  # the fourth waiting event: stalled
    box.put(4, 10)
    box.put(None)
    assert box.stalled and stalls == [1]
    assert drain(box) == [None]  # what waited is dropped; the consumer sees the end


def test_bytes_bound_too_but_one_large_event_may_pass_alone() -> None:
    stalls = []
    box = Outbox(limit=100, limit_bytes=100, on_stall=lambda: stalls.append(1))
    box.put("history", 5000)  # nothing waits: it goes through
    assert not box.stalled
    assert asyncio.run(box.get()) == "history" and box.bytes == 0
    box.put("a", 60)
    box.put("b", 60)  # 120 bytes waiting > 100
    assert box.stalled and stalls == [1] and drain(box) == [None]


def test_the_end_of_a_stream_is_always_queued() -> None:
    box = Outbox(limit=1, limit_bytes=10, on_stall=lambda: None)
    box.put("x", 1)
    box.put(None)  # not an event: never counts as falling behind
    assert not box.stalled and drain(box) == ["x", None]
