"""Live events on every replica: each turn's numbered events (app/domain/replay.py) go to the other replicas,
where a mirror of the turn's Replay takes them with the same numbers. A client on any replica then watches a
turn the same way (WS `session.open` / `turn.resume`, SSE with `Last-Event-ID`), and gets the same events,
numbered alike, as a client of the replica generating it.

The messages travel through a `Channel` (on PostgreSQL: app.store.notify_pg); on SQLite there is one process
and no relay. A mirror starts with a turn's first event: a replica that joined mid-turn has no mirror of it, and
its clients read the stored reply as before. A mirror whose events come with a gap, or whose replica fell
silent (no event and no beat for STALE_S: it died), ends, and its clients fall back on the stored reply.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from app.domain.replay import Replay, Replays
from app.store import Store
from app.store.notify_pg import PgNotify

log = logging.getLogger("forge.chat")

BEAT_S = 1.0  # a replica with turns running says it is alive this often, events or not
STALE_S = 5.0  # a replica not heard from this long is taken for dead: its mirrors end

_ENCODER = msgspec.json.Encoder()


class Channel(Protocol):
    """Messages to every other replica, delivered in the order each sender sent them."""

    def send(self, text: str) -> None: ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class Mirror:
    sender: str  # the process generating the turn
    replay: Replay


@dataclass(slots=True)
class Relay:
    """Sends this replica's turns' events (`tap`) and keeps mirrors of other replicas' turns in `replays`
    (`received`). `gap()`: messages may have been lost, so every mirror ends."""

    replays: Replays
    channel: Channel | None = None
    mirrors: dict[str, Mirror] = field(default_factory=dict)  # message id -> the mirror of its turn
    heard: dict[str, float] = field(default_factory=dict)  # sender -> when it was last heard from
    live: int = 0  # this replica's turns not ended
    _task: asyncio.Task | None = None

    def start(self, channel: Channel) -> None:
        self.channel = channel
        self._task = asyncio.create_task(self._beat(), name="relay-beat")

    async def close(self) -> None:
        """After the turns ended: send what is queued, stop listening."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.channel is not None:
            await self.channel.close()
        self.gap()

    # -- this replica's turns ----------------------------------------------------------------

    def tap(self, replay: Replay) -> None:
        """Send the events of `replay` (a turn starting here) to the other replicas."""
        head = {"k": "e", "s": replay.session_id, "o": replay.owner, "m": replay.message_id}
        end = _ENCODER.encode({"k": "x", "m": replay.message_id}).decode()
        self.live += 1

        def send(event: dict[str, Any] | None) -> None:
            if self.channel is None:
                return
            try:
                if event is None:
                    self.live -= 1
                    self.channel.send(end)
                else:
                    self.channel.send(_ENCODER.encode({**head, "e": event}).decode())
            except Exception:  # the turn goes on here whatever happens to its mirrors
                log.exception("could not relay an event of session %s", replay.session_id)

        replay.tap = send

    # -- other replicas' turns -----------------------------------------------------------------

    def received(self, sender: str, text: str) -> None:
        """A message of another replica's relay."""
        self.heard[sender] = _now()
        msg = msgspec.json.decode(text)
        kind = msg.get("k")
        if kind == "e":
            self._event(sender, msg)
        elif kind == "x":
            mirror = self.mirrors.pop(msg["m"], None)
            if mirror is not None:
                mirror.replay.publish(None)

    def _event(self, sender: str, msg: dict[str, Any]) -> None:
        event, message_id = msg["e"], msg["m"]
        seq = event["seq"]
        mirror = self.mirrors.get(message_id)
        if mirror is None:
            if seq != 1:  # joined mid-turn: its earlier events are not here
                return
            current = self.replays.by_session.get(msg["s"])
            if current is not None and not current.ended and not self._mirrored(current):
                log.warning("session %s runs a turn here and on another replica; not mirroring", msg["s"])
                return
            replay = Replay(msg["s"], msg["o"], message_id, detached_s=0)
            replay.on_end = lambda: self.replays.ended(replay)
            mirror = self.mirrors[message_id] = Mirror(sender, replay)
            self.replays.add(replay)
        replay = mirror.replay
        if seq <= replay.seq:  # had it already
            return
        if seq != replay.seq + 1:
            log.warning(
                "events %d-%d of session %s were lost; its watchers here stop",
                replay.seq + 1,
                seq - 1,
                replay.session_id,
            )
            self._drop(message_id)
            return
        replay.seq = seq - 1  # `publish` numbers it again: the same number
        replay.publish(event)

    def _mirrored(self, replay: Replay) -> bool:
        return any(m.replay is replay for m in self.mirrors.values())

    def _drop(self, message_id: str) -> None:
        """End a mirror that can no longer follow its turn; its clients then read the stored reply."""
        mirror = self.mirrors.pop(message_id, None)
        if mirror is None:
            return
        replay = mirror.replay
        if self.replays.by_session.get(replay.session_id) is replay:
            del self.replays.by_session[replay.session_id]
        replay.on_end = lambda: None
        replay.publish(None)

    def gap(self) -> None:
        """Messages may have been lost (a reconnect): no mirror can trust its events any more."""
        for message_id in list(self.mirrors):
            self._drop(message_id)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(BEAT_S)
            if self.live > 0 and self.channel is not None:
                self.channel.send('{"k":"b"}')
            now = _now()
            for message_id, mirror in list(self.mirrors.items()):
                if now - self.heard.get(mirror.sender, now) > STALE_S:
                    log.warning("replica of session %s fell silent; its watchers here stop", mirror.replay.session_id)
                    self._drop(message_id)


def _now() -> float:
    return asyncio.get_running_loop().time()


async def open_relay(replays: Replays, store: Store) -> Relay | None:
    """A started relay for `store`'s database, or None where one process serves it (SQLite)."""
    if store.engine.dialect.name != "postgresql":
        return None
    relay = Relay(replays)
    channel = PgNotify(store.engine, relay.received, relay.gap)
    await channel.start()
    relay.start(channel)
    return relay
