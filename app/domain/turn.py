"""A turn: one reply being generated for a session, and how its events leave it (a `sink`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.domain.admit import Held
from app.store.leases import Lease
from engine.tool_calls import ToolFormat

log = logging.getLogger("forge.chat")

Sink = Callable[[dict[str, Any] | None], None]  # receives events, then None when the turn is over
Queued = Callable[[], None]  # told when a turn has to wait in the admission queue


@dataclass(slots=True)
class Turn:
    """A reply being generated for one session."""

    session_id: str
    owner: str
    message_id: str
    request_id: str
    title: str
    sink: Sink
    client_id: str | None = None
    ticket: Held | None = None  # its admission; released when the generation ends
    tool_format: ToolFormat | None = None  # the reply may call tools: read as content and calls
    lease: Lease | None = None  # its session's lease in the store (replicas); released when the reply is stored
    task: asyncio.Task | None = None
    cancelled: bool = False
    fenced: bool = False  # stopped because its replica lost its lock or lease, or its reply was taken from it
    done: bool = False
    replay: Any = None  # its numbered events and watchers: app.domain.replay.Replay (which imports this module)
    model: Any = None  # its hold on the model it runs on (app.domain.models.ModelLease): engine and admission

    def abort(self) -> None:
        """Ask its model's engine to stop generating it (ends within a step)."""
        if self.model is not None:
            self.model.engine.abort(self.request_id)

    def emit(self, event: dict[str, Any]) -> None:
        if self.client_id is not None:
            event["client_id"] = self.client_id
        try:
            self.sink(event)
        except Exception:  # a consumer's problem must not break the turn
            log.exception("event sink failed for session %s", self.session_id)
