"""A turn's event log, so that a reply outlives its connection: every event of the turn is numbered (`seq`) and
kept (the last REPLAY_EVENTS of them) until the turn ends plus GRACE_S, and goes to every client watching the
turn. Clients come and go (a dropped socket, a reload, a second tab); the turn goes on until it ends, is stopped
explicitly, or nobody has watched it for `detached_s` seconds (then `on_idle` stops it).

A client that reattaches names the last event it has (`after`): it gets the kept events after that one, then
every new one, with no gap and no duplicate, because replaying and joining happen in one step of the loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from app.domain.turn import Sink

log = logging.getLogger("forge.chat")

REPLAY_EVENTS = 4096  # events kept per turn: a reattach from further back gets the reply's text instead
GRACE_S = 30.0  # how long an ended turn's events stay, for a client reattaching just as it ended


@dataclass(slots=True)
class Watcher:
    sink: Sink
    client_id: str | None = None  # the command that started the turn: its answers carry this id


@dataclass(slots=True)
class Replay:
    """One turn's numbered events and the clients watching it. `publish` is the turn's sink."""

    session_id: str
    owner: str
    message_id: str  # the reply being generated
    detached_s: float  # nobody watching this long: `on_idle` (0: at once)
    on_idle: Callable[[], None] = lambda: None
    on_end: Callable[[], None] = lambda: None  # after the turn's last event
    seq: int = 0  # the last event's number
    text_seq: int = 0  # the number of the last event that `text()` includes
    ended: bool = False
    events: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=REPLAY_EVENTS))
    watchers: list[Watcher] = field(default_factory=list)
    parts: list[str] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None
    tap: Sink | None = None  # also told each numbered event and the end (app/domain/relay.py: other replicas)

    def publish(self, event: dict[str, Any] | None) -> None:
        """Number the event, keep it and send it to every watcher; None ends the turn (and every watcher)."""
        if event is None:
            self.ended = True
            self._stop_timer()
            if self.tap is not None:
                self.tap(None)
            watchers, self.watchers = self.watchers, []
            for w in watchers:
                _send(w, None)
            self.on_end()
            return
        self.seq += 1
        event["seq"] = self.seq
        if event.get("message_id") == self.message_id and event["type"] == "delta":
            self.parts.append(event.get("text") or "")
            self.text_seq = self.seq
        elif event["type"] == "message.created" and event["message"].get("id") == self.message_id:
            self.text_seq = self.seq  # the reply itself, empty so far: what came before is in the stored history
        self.events.append(event)
        if self.tap is not None:
            self.tap(event)
        for w in list(self.watchers):
            _send(w, event)

    def text(self) -> str:
        """The reply's text up to event `text_seq`."""
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def can_replay(self, after: int) -> bool:
        """Whether every event after `after` is still kept (`after` <= `seq`)."""
        return not self.events or after >= self.events[0]["seq"] - 1

    def attach(self, sink: Sink, after: int, client_id: str | None = None) -> bool:
        """Send `sink` the kept events after number `after`, then every new one (an ended turn's: then None).
        False, and nothing sent, when some of those events are no longer kept. `sink` watching already is
        replaced."""
        if not self.can_replay(after):
            return False
        self._remove(sink)
        watcher = Watcher(sink, client_id)
        for ev in self.events:
            if ev["seq"] > after:
                _send(watcher, ev)
        if self.ended:
            _send(watcher, None)
            return True
        self.watchers.append(watcher)
        self._stop_timer()
        return True

    def detach(self, sink: Sink) -> None:
        """`sink`'s client went away; the turn goes on, for `detached_s` more once nobody watches."""
        self._remove(sink)
        if self.watchers or self.ended or self.timer is not None:
            return
        if self.detached_s <= 0:
            self.on_idle()
        else:
            self.timer = asyncio.get_running_loop().call_later(self.detached_s, self._idle)

    def _idle(self) -> None:
        self.timer = None
        if not self.watchers and not self.ended:
            log.info("nobody watched the reply in session %s for %gs: stopping it", self.session_id, self.detached_s)
            self.on_idle()

    def _remove(self, sink: Sink) -> None:
        self.watchers = [w for w in self.watchers if w.sink != sink]

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _send(w: Watcher, event: dict[str, Any] | None) -> None:
    if event is not None and w.client_id is not None:
        event = {**event, "client_id": w.client_id}
    try:
        w.sink(event)
    except Exception:  # one client's problem must not break the turn or the others
        log.exception("event sink failed")


class Replays:
    """The latest turn's Replay of each session, while it runs and GRACE_S after it ends."""

    def __init__(self) -> None:
        self.by_session: dict[str, Replay] = {}

    def add(self, replay: Replay) -> None:
        self.by_session[replay.session_id] = replay

    def ended(self, replay: Replay) -> None:
        """Forget `replay` GRACE_S from now (unless a newer turn of its session took its place)."""

        def forget() -> None:
            if self.by_session.get(replay.session_id) is replay:
                del self.by_session[replay.session_id]

        asyncio.get_running_loop().call_later(GRACE_S, forget)

    def of_session(self, session_id: str, owner: str) -> Replay | None:
        r = self.by_session.get(session_id)
        return r if r is not None and r.owner == owner else None

    def of_message(self, session_id: str, message_id: str, owner: str) -> Replay | None:
        r = self.of_session(session_id, owner)
        return r if r is not None and r.message_id == message_id else None
