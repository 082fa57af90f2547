"""What the SSE producers share: turn events into an outbox, and reading it with keep-alives in between."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from litestar.response import ServerSentEventMessage

from app.api.outbox import Outbox

_TICK = object()  # the keep-alive timer's marker in an outbox


def event_sink(outbox: Outbox) -> Callable[[dict[str, Any] | None], None]:
    """A turn's event sink feeding `outbox`: each event as (type, JSON, seq), sized by its JSON; None ends it."""

    def sink(ev: dict[str, Any] | None) -> None:
        if ev is None:
            outbox.put(None)
        else:
            data = json.dumps(ev, ensure_ascii=False)
            outbox.put((ev["type"], data, ev.get("seq")), len(data))

    return sink


def keepalive() -> ServerSentEventMessage:
    # data=None: no empty `data:` line (clients would see an empty event; the openai client fails on it).
    return ServerSentEventMessage(comment="keep-alive", data=None)


async def with_keepalives(outbox: Outbox, every_s: float) -> AsyncIterator[Any]:
    """The items of `outbox` up to (not including) a None; a None in between when a tick of a timer that runs
    every `every_s` finds that nothing came since the tick before (the caller sends a keep-alive comment then):
    a quiet stream gets one within 2 x `every_s`. One timer for the stream, not one per item: a timeout around
    every wait was ~13% of the event loop's time on a streamed token."""
    loop = asyncio.get_running_loop()
    came = True  # an item since the last tick
    timer: asyncio.TimerHandle

    def tick() -> None:
        nonlocal came, timer
        if not came and outbox.queue.empty():  # items waiting need no keep-alive
            outbox.queue.put_nowait((_TICK, 0))
        came = False
        timer = loop.call_later(every_s, tick)

    timer = loop.call_later(every_s, tick)
    try:
        while True:
            item = await outbox.get()
            if item is _TICK:
                yield None
                continue
            came = True
            if item is None:
                return
            yield item
    finally:
        timer.cancel()
