"""A bounded queue of events for one client (a WebSocket, an SSE stream, a /v1 stream).

A client that lets `limit` events pile up has stalled: the outbox drops what it holds, ends with None
(its consumer stops), refuses everything after, and calls `on_stall` once, which stops the work feeding
it. Memory per client is therefore bounded whatever the client does.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class Outbox:
    def __init__(self, limit: int, on_stall: Callable[[], None]) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.limit = limit
        self.stalled = False
        self._on_stall = on_stall

    def put(self, item: Any) -> None:
        """Queue an event (None: the stream is over). Never blocks."""
        if self.stalled:
            return
        if item is not None and self.queue.qsize() >= self.limit:
            self.stalled = True
            while not self.queue.empty():
                self.queue.get_nowait()
                self.queue.task_done()
            self.queue.put_nowait(None)
            self._on_stall()
            return
        self.queue.put_nowait(item)
