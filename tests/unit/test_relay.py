"""Live events across replicas (app/domain/relay.py), over an in-memory channel: a mirror on the other replica
numbers the events alike and its watchers get byte-identical events; a repeated message is ignored, a gap ends
the mirror (its watchers fall back on the stored reply), a turn seen from its middle is not mirrored."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from app.domain import relay as relay_mod
from app.domain.relay import Relay
from app.domain.replay import Replay, Replays


@dataclass
class Wire:
    """Delivers what one relay sends to another, as the NOTIFY channel would; `hold` keeps them back."""

    to: Relay | None = None
    sent: list[str] = field(default_factory=list)
    hold: bool = False

    def send(self, text: str) -> None:
        self.sent.append(text)
        if not self.hold and self.to is not None:
            self.to.received("a", text)

    async def close(self) -> None:
        pass


def pair() -> tuple[Relay, Relay, Wire]:
    a, b = Relay(Replays()), Relay(Replays())
    wire = Wire(to=b)
    a.channel = wire
    return a, b, wire


def start(a: Relay, text: str = "") -> Replay:
    r = Replay("s", "k", "m", detached_s=60)
    a.replays.add(r)
    a.tap(r)
    r.publish({"type": "message.created", "session_id": "s", "message": {"id": "m", "content": text}})
    return r


def delta(text: str) -> dict[str, Any]:
    return {"type": "delta", "session_id": "s", "message_id": "m", "text": text, "t": 0.1}


async def test_the_mirror_gets_the_same_events_with_the_same_numbers() -> None:
    a, b, _ = pair()
    here: list[Any] = []
    r = start(a)
    r.attach(here.append, 0)
    r.publish(delta("Grüße "))
    mirror = b.replays.of_message("s", "m", "k")
    assert mirror is not None and mirror.seq == 2
    there: list[Any] = []
    assert mirror.attach(there.append, 1)  # as Last-Event-ID: 1 would
    for piece in ("🙂", " ok"):
        r.publish(delta(piece))
    assert mirror.text() == r.text() == "Grüße 🙂 ok"
    assert [json.dumps(e, ensure_ascii=False) for e in there] == [json.dumps(e, ensure_ascii=False) for e in here[1:]]
    assert b.replays.of_message("s", "m", "other-owner") is None
    r.publish(None)
    assert here[-1] is None and there[-1] is None and mirror.ended and not b.mirrors
    assert a.live == 0


async def test_a_repeated_event_is_ignored_and_a_gap_ends_the_mirror() -> None:
    a, b, wire = pair()
    r = start(a)
    there: list[Any] = []
    mirror = b.replays.of_message("s", "m", "k")
    assert mirror is not None
    mirror.attach(there.append, 0)
    r.publish(delta("x"))
    b.received("a", wire.sent[-1])  # delivered twice
    assert [e["seq"] for e in there] == [1, 2]
    wire.hold = True
    r.publish(delta("lost"))
    wire.hold = False
    r.publish(delta("y"))
    assert there[-1] is None  # its watchers stop; a reattach reads the stored reply
    assert b.replays.of_message("s", "m", "k") is None and not b.mirrors


async def test_a_turn_first_seen_in_its_middle_is_not_mirrored() -> None:
    a, b, wire = pair()
    wire.hold = True
    r = start(a)
    wire.hold = False
    r.publish(delta("x"))
    assert b.replays.of_message("s", "m", "k") is None


async def test_a_gap_in_the_channel_ends_every_mirror() -> None:
    a, b, _ = pair()
    start(a)
    mirror = b.replays.of_message("s", "m", "k")
    assert mirror is not None
    there: list[Any] = []
    mirror.attach(there.append, 0)
    b.gap()
    assert there[-1] is None and not b.mirrors


async def test_a_replica_fallen_silent_has_its_mirrors_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_mod, "BEAT_S", 0.01)
    monkeypatch.setattr(relay_mod, "STALE_S", 0.05)
    a, b, _ = pair()
    b.start(Wire())
    try:
        start(a)  # ...and then nothing more: no event, no beat (its process died)
        mirror = b.replays.of_message("s", "m", "k")
        assert mirror is not None
        ended = asyncio.Event()
        mirror.attach(lambda ev: ended.set() if ev is None else None, 0)
        await asyncio.wait_for(ended.wait(), 5.0)
        assert not b.mirrors and b.replays.of_message("s", "m", "k") is None
    finally:
        await b.close()
