"""This process as one replica of several: it joins under its name, renews its lease by heartbeat, sweeps the
replies of replicas whose lease has passed (at start and periodically), and leaves when it stops.

The heartbeat and sweep run as one asyncio task. A heartbeat that finds the lease lost (it ran out while the
database was unreachable, or another process took the name) calls `on_lost` (the owner stops its turns: their
sessions may already be another replica's) and joins again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from app.store.leases import Leases, Member

log = logging.getLogger("forge.store")


class Membership:
    """Join on `start`, heartbeat every `beat_s` (default: a third of the lease), sweep every `sweep_s` (default:
    the lease), leave on `stop`."""

    def __init__(
        self,
        leases: Leases,
        replica: str,
        address: str = "",
        sweep_s: float | None = None,
        on_lost: Callable[[], None] | None = None,
        beat_s: float | None = None,
    ) -> None:
        self.leases = leases
        self.replica = replica
        self.address = address
        self.beat_s = beat_s if beat_s is not None else leases.ttl.total_seconds() / 3
        assert 0 < self.beat_s < leases.ttl.total_seconds(), (self.beat_s, leases.ttl)
        self.sweep_s = sweep_s if sweep_s is not None else leases.ttl.total_seconds()
        self.on_lost = on_lost
        self.member: Member | None = None
        self.swept = 0  # replies this process has marked interrupted (its start-up's included)
        self._task: asyncio.Task | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> Member:
        """Join (taking the name over from an earlier process: its replies are interrupted), sweep once, and
        start the heartbeat task."""
        self.member = await self.leases.join(self.replica, self.address)
        self.swept = self.member.took_over + await self.leases.sweep()
        self._task = asyncio.create_task(self._run(), name=f"forge-replica-{self.replica}")
        return self.member

    async def stop(self) -> None:
        """Stop beating and leave (the session leases go, the lease ends now)."""
        if self._task is not None:
            # Not cancelled while it talks to the database: a join cut short could commit after the leave and
            # leave a lease behind. Only a database that hangs past a lease is given up on.
            self._stopping.set()
            try:
                await asyncio.wait_for(self._task, self.leases.ttl.total_seconds())
            except TimeoutError:
                log.warning("replica %s: the heartbeat did not stop within a lease", self.replica)
            self._task = None
        if self.member is not None:
            try:
                await self.leases.leave(self.member)
            except Exception:  # the database may be gone too; the lease then simply runs out
                log.exception("replica %s could not leave cleanly", self.replica)
            self.member = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_sweep = loop.time() + self.sweep_s
        while True:
            try:
                await asyncio.wait_for(self._stopping.wait(), self.beat_s)
                return
            except TimeoutError:
                pass
            try:
                await self._beat()
                if loop.time() >= next_sweep:
                    next_sweep = loop.time() + self.sweep_s
                    self.swept += await self.leases.sweep()
            except Exception:  # an unreachable database: keep trying; the lease runs out if it stays away
                log.exception("replica %s: heartbeat or sweep failed", self.replica)

    async def _beat(self) -> None:
        assert self.member is not None
        if await self.leases.heartbeat(self.member):
            return
        log.warning("replica %s lost its lease; stopping its turns and joining again", self.replica)
        if self.on_lost is not None:
            self.on_lost()
        self.member = await self.leases.join(self.replica, self.address)
