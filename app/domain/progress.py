"""Streaming replies' progress, stored together: every reply that moved goes into one transaction, at most
every `interval_s`.

A reply's stored text lags its stream by at most about two intervals (a turn notes its text at most once an
interval; the batch goes out within one more), whatever the number of replies streaming: one write a
replica per interval, not one per reply (a transaction per reply and interval was most of the event loop's
time under many clients: docs/performance.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from app.store import Store

log = logging.getLogger("forge.chat")


class Progress:
    """`note` a streaming reply's text as it grows; `settle` it before its final write; `close` at shutdown."""

    def __init__(self, store: Store, interval_s: float, on_taken: Callable[[set[str]], None] | None = None) -> None:
        self.store, self.interval_s = store, interval_s
        self.on_taken = on_taken  # told the replies a write found no longer streaming (another replica took them)
        self._pending: dict[str, tuple[str, int]] = {}  # message id -> (text, completion tokens)
        self._writing = asyncio.Lock()  # held while a batch is written
        self._task: asyncio.Task | None = None

    def note(self, message_id: str, text: str, completion_tokens: int) -> None:
        """The reply as it stands; stored with the next batch (a later note of the same reply replaces it)."""
        self._pending[message_id] = (text, completion_tokens)
        if self._task is None:
            self._task = asyncio.create_task(self._write_later(), name="reply-progress")

    async def settle(self, message_id: str) -> None:
        """Before a reply's final write: drop what waits to be stored of it, and let a batch being written
        (which may hold it) end first, so that no progress write lands after the final one."""
        self._pending.pop(message_id, None)
        async with self._writing:
            pass

    async def close(self) -> None:
        """Stop the pending batch (the replies' final writes carry their text)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._pending.clear()

    async def _write_later(self) -> None:
        await asyncio.sleep(self.interval_s)
        async with self._writing:
            batch, self._pending, self._task = self._pending, {}, None  # a note from now on starts the next batch
            if not batch:
                return
            try:
                taken = await self.store.save_progress(batch)
            except Exception as e:  # a busy database must not end the replies; their final writes store the lot
                log.warning("could not store the progress of %d replies: %s", len(batch), e)
                return
            if taken and self.on_taken is not None:
                self.on_taken(taken)
