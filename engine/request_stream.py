"""`RequestStream`: the asyncio side of one admitted request, the events the step thread sends it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from engine.types import GenerationEvent


class RequestStream:
    """The events of one admitted request (`Engine.generate`). Closing it, or dropping it, before its
    last final event aborts the request."""

    def __init__(
        self,
        request_id: str,
        samples: int,
        events: asyncio.Queue,
        abort: Callable[[str], None],
        active: set[str],
    ) -> None:
        """`abort(request_id)` ends the request early; `active`, the ids with a consumer, loses this one at the
        end."""
        self._request_id = request_id
        self._remaining = samples
        self._events = events
        self._abort = abort
        self._active = active

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        if not self._remaining:
            raise StopAsyncIteration
        try:
            event = await self._events.get()
        except BaseException:  # cancelled while waiting
            self._close()
            raise
        if isinstance(event, BaseException):
            self._close()
            raise event
        self._remaining -= event.final
        if not self._remaining:
            self._close()
        return event

    async def aclose(self) -> None:
        self._close()

    def _close(self) -> None:
        if self._remaining:
            self._remaining = 0
            self._abort(self._request_id)
        self._active.discard(self._request_id)

    def __del__(self) -> None:
        if self._remaining:
            self._close()
