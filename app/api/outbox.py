"""A bounded queue of events for one client (a WebSocket, an SSE stream, a /v1 stream).

A client that lets `limit` events, or `limit_bytes` of them, pile up has stalled: the outbox drops what
it holds, ends with None (its consumer stops), refuses everything after, and calls `on_stall` once,
which stops the work feeding it. Memory per client is therefore bounded whatever the client does (one
event larger than `limit_bytes`, e.g. a long history, may still pass while nothing else waits).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class Outbox:
    def __init__(self, limit: int, limit_bytes: int, on_stall: Callable[[], None]) -> None:
        self.queue: asyncio.Queue[tuple[Any, int]] = asyncio.Queue()
        self.limit, self.limit_bytes = limit, limit_bytes
        self.bytes = 0
        self.stalled = False
        self._on_stall = on_stall

    def put(self, item: Any, size: int = 0) -> None:
        """Queue an event of about `size` bytes (None: the stream is over). Never blocks."""
        if self.stalled:
            return
        waiting = self.queue.qsize()
        if item is not None and waiting and (waiting >= self.limit or self.bytes + size > self.limit_bytes):
            self.stalled = True
            while not self.queue.empty():
                self.queue.get_nowait()
                self.queue.task_done()
            self.bytes = 0
            self.queue.put_nowait((None, 0))
            self._on_stall()
            return
        self.bytes += size
        self.queue.put_nowait((item, size))

    async def get(self) -> Any:
        """The next event (None once the stream is over); the caller marks it done with `queue.task_done()`."""
        item, size = await self.queue.get()
        self.bytes -= size
        return item
