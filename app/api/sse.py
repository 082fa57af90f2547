"""What the two SSE producers share: reading a queue with keep-alives in between."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from litestar.response import ServerSentEventMessage

from app.api.outbox import Outbox


def keepalive() -> ServerSentEventMessage:
    # data=None: no empty `data:` line (clients would see an empty event; the openai client fails on it).
    return ServerSentEventMessage(comment="keep-alive", data=None)


async def with_keepalives(outbox: Outbox, every_s: float) -> AsyncIterator[Any]:
    """The items of `outbox` up to (not including) a None; a None in between whenever `every_s` passes
    without one (the caller sends a keep-alive comment then)."""
    while True:
        if outbox.queue.empty():
            try:
                # A timeout scope, not wait_for: no task per event on the per-token path.
                async with asyncio.timeout(every_s):
                    item = await outbox.get()
            except TimeoutError:
                yield None
                continue
        else:
            item = await outbox.get()  # ready: returns without suspending
        if item is None:
            return
        yield item
