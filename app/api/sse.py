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
        try:
            item = await asyncio.wait_for(outbox.get(), every_s)
        except asyncio.TimeoutError:
            yield None
            continue
        if item is None:
            return
        yield item
