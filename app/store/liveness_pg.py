"""Liveness on PostgreSQL: each replica holds a session-level advisory lock keyed by its incarnation, on one
connection kept for the process's life. PostgreSQL drops the lock with the connection: when the process dies
(the kernel closes its socket), when the backend is terminated, or when the network between them breaks for
good (TCP keepalive). Whether a lock is held is read from `pg_locks`, taking nothing.

The key is the two-int4 form (namespace, 28 bits of the incarnation), apart from the bigint keys of
app.store.key_slots; a collision only makes a dead replica look alive, and its time lease then decides.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.store.liveness import Liveness, Lost

log = logging.getLogger("forge.store")

NAMESPACE = 0x466F7267  # "Forg": pg_locks.classid of every replica's lock

HELD = text(
    "SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2"
    " AND classid::bigint = :ns AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def lock_key(incarnation: str) -> int:
    """The advisory lock's second key (pg_locks.objid) for an incarnation (hex)."""
    return int(incarnation[:7], 16)


class PgLiveness(Liveness):
    """Advisory locks on the store's PostgreSQL."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._conn: AsyncConnection | None = None
        self._driver: Any = None  # asyncpg's connection under it: its termination tells us the lock is gone
        self._listener: Any = None

    async def hold(self, incarnation: str, on_lost: Lost) -> None:
        await self.release()
        conn = await self.engine.connect()
        try:
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            # The driver's connection directly: SQLAlchemy's would leave a transaction open on it for good.
            if not await driver.fetchval("SELECT pg_try_advisory_lock($1, $2)", NAMESPACE, lock_key(incarnation)):
                raise RuntimeError(f"the lock of incarnation {incarnation} is held already")
        except BaseException:
            await conn.invalidate()
            await conn.close()
            raise

        def lost(_: Any) -> None:
            log.warning("the connection holding this replica's lock (incarnation %s) ended", incarnation)
            on_lost()

        driver.add_termination_listener(lost)
        self._conn, self._driver, self._listener = conn, driver, lost

    @property
    def pid(self) -> int | None:
        """The server process of the lock's connection (for pg_terminate_backend in tests), or None."""
        return self._driver.get_server_pid() if self._driver is not None and not self._driver.is_closed() else None

    async def release(self) -> None:
        if self._conn is None:
            return
        conn, self._conn = self._conn, None
        if self._listener is not None and not self._driver.is_closed():
            self._driver.remove_termination_listener(self._listener)
        self._driver = self._listener = None
        try:
            await conn.invalidate()  # closes the connection itself, and the lock with it (never back to the pool)
            await conn.close()
        except Exception:  # already gone: so is the lock
            log.debug("closing the lock's connection", exc_info=True)

    async def held(self, incarnations: Sequence[str]) -> set[str] | None:
        if not incarnations:
            return set()
        async with self.engine.connect() as conn:
            keys = set((await conn.execute(HELD, {"ns": NAMESPACE})).scalars())
        return {inc for inc in incarnations if lock_key(inc) in keys}
