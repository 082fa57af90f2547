"""Whether a replica's process is alive, from a lock it holds for its whole life: the database (PostgreSQL: a
session-level advisory lock on one dedicated connection) or the kernel (SQLite: a file lock beside the database)
drops the lock the moment the process dies, so a free lock is a dead replica, with no clock to wait for.

Each lock is keyed by the replica's incarnation (one process under its name, app.store.leases). A replica that
is alive but cut off from the database keeps its lock only as long as its connection lives; the time lease
stays the backstop for what a lock cannot see.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Lost = Callable[[], None]  # told, on the event loop, that the held lock is gone (its connection ended)


class Liveness:
    """Holds this process's lock and tells which incarnations' locks are held. The base class cannot tell
    (an in-memory database: one process): every incarnation counts as alive and the time lease decides."""

    async def hold(self, incarnation: str, on_lost: Lost) -> None:
        """Take `incarnation`'s lock for as long as this process lives (until `release`); `on_lost` is told if
        it is lost. Raises RuntimeError when the lock is held already (an incarnation's key collides)."""

    async def release(self) -> None:
        """Let go of the lock `hold` took (a clean stop, or before holding a new incarnation's)."""

    async def held(self, incarnations: Sequence[str]) -> set[str] | None:
        """Those of `incarnations` whose lock is held now (their process lives), or None: cannot tell."""
        return None

    async def close(self) -> None:
        await self.release()
