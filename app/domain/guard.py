"""Which turns may start: at most one reply generating per session, none once the server is shutting down.

Within this process a dict says which sessions are busy; across replicas sharing the database, a turn also holds
the session's lease in the store (app.store.leases), renewed by the replica's heartbeat (app.store.membership)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from app.domain.errors import ServiceError
from app.domain.turn import Turn
from app.store.leases import Lease, Leases
from app.store.reaper import Reaper

log = logging.getLogger("forge.chat")

RELEASE_TRIES = 3


class Guard:
    """The running turns by session, and the sessions whose turn is being set up (or waits to be admitted):
    both count as busy."""

    def __init__(
        self,
        leases: Leases | None = None,
        replica: str | None = None,
        reaper: Reaper | None = None,
        holding: Callable[[], bool] | None = None,
    ) -> None:
        self.turns: dict[str, Turn] = {}  # session id -> running turn
        self.reserved: set[str] = set()
        self.shutting_down = False
        self.leases = leases if replica is not None else None  # None: the in-process check alone
        self.replica = replica
        self.reaper = reaper  # frees a session held by a dead replica before a turn is refused as busy
        self.holding = holding  # False while this replica has lost its lock or lease: its sessions may be taken

    def check_open(self) -> None:
        """ServiceError("unavailable") once the server is shutting down."""
        if self.shutting_down:
            raise ServiceError("unavailable", "the server is shutting down")

    def check_holding(self) -> None:
        """ServiceError("unavailable") while this replica is not holding its lock and lease (it is joining
        again): another replica may take its sessions meanwhile."""
        if self.holding is not None and not self.holding():
            raise ServiceError("unavailable", "this replica is rejoining its database; retry", retry_after_s=1)

    def busy(self, session_id: str) -> bool:
        return session_id in self.turns or session_id in self.reserved

    @contextmanager
    def reserve(self, session_id: str) -> Iterator[None]:
        """Hold `session_id` while its turn is set up; refused (unavailable, busy) as a new turn would be."""
        self.check_open()
        if self.busy(session_id):
            raise ServiceError(
                "busy", f"a reply is already being generated in session '{session_id}'", param="session_id"
            )
        self.reserved.add(session_id)
        try:
            yield
        finally:
            self.reserved.discard(session_id)

    async def take(self, session_id: str) -> Lease | None:
        """The session's lease in the store for a turn of this replica (None without leases); ServiceError("busy")
        while a turn on any replica holds it. Call inside `reserve`."""
        if self.leases is None or self.replica is None:
            return None
        self.check_holding()
        lease = await self.leases.take(session_id, self.replica)
        if lease is None and self.reaper is not None and await self.reaper.free(session_id):
            lease = await self.leases.take(session_id, self.replica)  # its holder was dead
        if lease is None:
            raise ServiceError(
                "busy",
                f"a reply is already being generated in session '{session_id}' (on another replica)",
                param="session_id",
            )
        return lease

    async def give_back(self, lease: Lease | None) -> None:
        """Release a lease `take` returned, retried a few times: the replica's heartbeat renews every lease it
        holds, so one left behind keeps its session busy until the replica stops."""
        if lease is None or self.leases is None:
            return
        for attempt in range(RELEASE_TRIES):
            try:
                await self.leases.release(lease)
                return
            except Exception:
                log.exception("could not release the lease of session %s (attempt %d)", lease.session_id, attempt + 1)
                await asyncio.sleep(0.2 * (attempt + 1))

    def running(self, session_id: str, owner: str) -> Turn | None:
        """The running turn of one of `owner`'s sessions."""
        turn = self.turns.get(session_id)
        return turn if turn is not None and turn.owner == owner and not turn.done else None

    def forget(self, turn: Turn) -> None:
        """The turn's session is free again."""
        if self.turns.get(turn.session_id) is turn:
            del self.turns[turn.session_id]
