"""A turn's event log (app/domain/replay.py): numbering, replay after an event with no gap or duplicate, the
bound, several watchers, the detached window and the grace after the end."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.domain import replay as replay_mod
from app.domain.replay import Replay, Replays


def delta(text: str) -> dict[str, Any]:
    return {"type": "delta", "session_id": "s", "message_id": "m", "text": text}


def turn_start(r: Replay) -> None:
    r.publish({"type": "message.created", "session_id": "s", "message": {"id": "u"}})
    r.publish({"type": "message.created", "session_id": "s", "message": {"id": "m"}})


async def test_events_are_numbered_and_a_late_watcher_gets_exactly_the_rest() -> None:
    r = Replay("s", "k", "m", detached_s=60)
    first: list[Any] = []
    r.attach(first.append, 0, client_id="c1")
    turn_start(r)
    r.publish(delta("Hel"))
    assert [e["seq"] for e in first] == [1, 2, 3] and all(e["client_id"] == "c1" for e in first)
    assert (r.text(), r.text_seq) == ("Hel", 3)
    late: list[Any] = []
    assert r.attach(late.append, 2)
    r.publish(delta("lo"))
    r.publish({"type": "done", "session_id": "s", "message_id": "m"})
    r.publish(None)
    assert [e["seq"] for e in late[:-1]] == [3, 4, 5] and late[-1] is None
    assert all("client_id" not in e for e in late[:-1])
    assert "".join(e["text"] for e in late[:-1] if e["type"] == "delta") == "Hello"
    assert first[-1] is None and r.ended
    ended: list[Any] = []
    assert r.attach(ended.append, 4)  # after the end: the rest, then the end
    assert [e and e["seq"] for e in ended] == [5, None]


async def test_attaching_from_before_the_kept_events_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_mod, "REPLAY_EVENTS", 4)
    r = Replay("s", "k", "m", detached_s=60)
    for i in range(10):
        r.publish(delta(str(i)))
    got: list[Any] = []
    assert not r.attach(got.append, 5) and got == []  # events 6.. kept, 6 is needed: refused with nothing sent
    assert r.attach(got.append, 6) and [e["seq"] for e in got] == [7, 8, 9, 10]
    assert r.text() == "0123456789"  # the text is whole however few events are kept


async def test_nobody_watching_for_the_window_stops_the_turn_and_a_reattach_keeps_it() -> None:
    idle: list[str] = []
    r = Replay("s", "k", "m", detached_s=0.05, on_idle=lambda: idle.append("stop"))
    a: list[Any] = []
    r.attach(a.append, 0)
    r.detach(a.append)
    r.attach(a.append, 0)  # back in time: the timer is off
    await asyncio.sleep(0.1)
    assert idle == []
    b: list[Any] = []
    r.attach(b.append, 0)
    r.detach(a.append)
    await asyncio.sleep(0.1)
    assert idle == []  # someone still watches
    r.detach(b.append)
    await asyncio.sleep(0.1)
    assert idle == ["stop"]


async def test_a_zero_window_stops_at_once_and_an_ended_turn_is_forgotten_after_its_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    idle: list[str] = []
    r = Replay("s", "k", "m", detached_s=0, on_idle=lambda: idle.append("stop"))
    r.attach(idle.append, 0)
    r.detach(idle.append)
    assert idle == ["stop"]
    monkeypatch.setattr(replay_mod, "GRACE_S", 0.01)
    replays = Replays()
    r.on_end = lambda: replays.ended(r)
    replays.add(r)
    assert replays.of_message("s", "m", "k") is r and replays.of_session("s", "other key") is None
    r.publish(None)
    assert replays.of_session("s", "k") is r
    await asyncio.sleep(0.05)
    assert replays.of_session("s", "k") is None
