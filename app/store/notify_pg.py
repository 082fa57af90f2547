"""Messages between the replicas of one PostgreSQL database: `LISTEN`/`NOTIFY` on one channel.

Two connections of their own, kept for the process's life: one sends (`pg_notify`, in autocommit, every message
queued during one turn of the event loop in one statement, so in one transaction and in order), one listens
(asyncpg's `add_listener`). Messages are chunked under NOTIFY's payload limit (app.store.notify_chunks). Every
replica gets every message, its own too: those are left out here.

Nothing is stored: a message sent while a connection is down is lost. The listener then says so (`on_gap`), so
whoever relies on the messages can tell a gap from silence.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.store.notify_chunks import Reassembler, frame

log = logging.getLogger("forge.store")

CHANNEL = "forge_events"
RECONNECT_S = 1.0  # between tries to listen again after the listening connection ended
MAX_QUEUED = 100_000  # chunks waiting to be sent: past this the database is not keeping up, and they are dropped
SEND = "SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p"

Received = Callable[[str, str], None]  # (sender, message)


class PgNotify:
    """`send` a message to every other replica; `on_message(sender, text)` is called for theirs, in the order
    each sender sent them; `on_gap()` when messages may have been lost (the listener reconnected)."""

    def __init__(self, engine: AsyncEngine, on_message: Received, on_gap: Callable[[], None]) -> None:
        self.engine = engine
        self.on_message, self.on_gap = on_message, on_gap
        self.sender = uuid.uuid4().hex[:16]  # this process: its own messages come back and are left out
        self.sent = 0
        self._queue: list[str] = []
        self._flush: asyncio.Task | None = None
        self._out: tuple[AsyncConnection, Any] | None = None
        self._in: tuple[AsyncConnection, Any] | None = None
        self._reassembler = Reassembler()
        self._listening: asyncio.Task | None = None
        self._closed = False

    async def start(self) -> None:
        """Listen (before anything is sent, so no message of a turn starting now is missed)."""
        await self._listen()

    def send(self, text: str) -> None:
        """Queue `text` for every other replica; sent with everything else queued in this turn of the loop."""
        if self._closed:
            return
        self.sent += 1
        self._queue.extend(frame(self.sender, self.sent, text))
        if len(self._queue) > MAX_QUEUED:
            log.warning("dropping %d queued notifications: the database is not keeping up", len(self._queue))
            self._queue.clear()  # the listeners see the numbers jump, and drop what depends on them
        if self._flush is None or self._flush.done():
            self._flush = asyncio.create_task(self._send_queued(), name="notify-send")

    async def close(self) -> None:
        """Send what is queued, then close both connections."""
        if self._flush is not None:
            await asyncio.gather(self._flush, return_exceptions=True)
        self._closed = True
        if self._listening is not None:
            self._listening.cancel()
            await asyncio.gather(self._listening, return_exceptions=True)
        for held in (self._out, self._in):
            if held is not None:
                await _drop(held[0])
        self._out = self._in = None

    async def _send_queued(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            try:
                if self._out is None or self._out[1].is_closed():
                    self._out = await _connect(self.engine)
                await self._out[1].execute(SEND, CHANNEL, batch)
            except Exception as e:  # the listeners notice the gap in the numbers
                log.warning("could not send %d notifications: %s", len(batch), e)
                if self._out is not None:
                    await _drop(self._out[0])
                    self._out = None

    async def _listen(self) -> None:
        conn, driver = await _connect(self.engine)
        try:
            await driver.add_listener(CHANNEL, self._received)
        except BaseException:
            await _drop(conn)
            raise
        driver.add_termination_listener(lambda _: self._lost())
        self._in = (conn, driver)

    def _received(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        whole = self._reassembler.add(payload)
        if whole is None or whole[0] == self.sender:
            return
        try:
            self.on_message(*whole)
        except Exception:  # one bad message must not stop the listener
            log.exception("a notification could not be handled")

    def _lost(self) -> None:
        if self._closed:
            return
        log.warning("the connection listening for other replicas' events ended; listening again")
        self._reassembler.forget()
        self.on_gap()
        if self._listening is None or self._listening.done():
            self._listening = asyncio.get_running_loop().create_task(self._relisten(), name="notify-listen")

    async def _relisten(self) -> None:
        if self._in is not None:
            await _drop(self._in[0])
            self._in = None
        while not self._closed:
            try:
                await self._listen()
                self.on_gap()  # what was sent between the loss and now is gone
                return
            except Exception as e:
                log.warning("could not listen again: %s", e)
                await asyncio.sleep(RECONNECT_S)


async def _connect(engine: AsyncEngine) -> tuple[AsyncConnection, Any]:
    conn = await engine.connect()
    raw = await conn.get_raw_connection()
    # The driver's connection directly: SQLAlchemy's would leave a transaction open on it for good.
    return conn, raw.driver_connection


async def _drop(conn: AsyncConnection) -> None:
    try:
        await conn.invalidate()  # never back to the pool: it listens, or it broke
        await conn.close()
    except Exception:
        log.debug("closing a notification connection", exc_info=True)
