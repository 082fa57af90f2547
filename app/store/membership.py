"""This process as one replica of several: it holds its lock (app.store.liveness) and joins under its name,
frees what replicas whose lock is free held (app.store.reaper: at start and every `watch_s`), renews its lease
by heartbeat, sweeps the replies of replicas whose lease has passed (the backstop for one alive but cut off), and
leaves when it stops.

The heartbeat, the checks and the sweep run as one asyncio task. Losing the lock (its connection ended) or the
lease (it ran out while the database was unreachable, or another process took the name) calls `on_lost` at
once (the owner stops its turns: their sessions may already be another replica's), then joins again as a new
incarnation with a new lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from app.store.leases import Leases, Member, new_incarnation
from app.store.liveness import Liveness
from app.store.reaper import Reaper

log = logging.getLogger("forge.store")

WATCH_S = 0.5  # how often the other replicas' locks are checked: a crash is noticed within this (plus a query)


class Membership:
    """Join on `start`, check the others' locks every `watch_s`, heartbeat every `beat_s` (default: a third of
    the lease), sweep every `sweep_s` (default: the lease), leave on `stop`. Without a `reaper` the lease alone
    tells the living from the dead."""

    def __init__(
        self,
        leases: Leases,
        replica: str,
        address: str = "",
        sweep_s: float | None = None,
        on_lost: Callable[[], None] | None = None,
        beat_s: float | None = None,
        reaper: Reaper | None = None,
        watch_s: float = WATCH_S,
    ) -> None:
        self.leases = leases
        self.replica = replica
        self.address = address
        self.beat_s = beat_s if beat_s is not None else leases.ttl.total_seconds() / 3
        assert 0 < self.beat_s < leases.ttl.total_seconds(), (self.beat_s, leases.ttl)
        self.sweep_s = sweep_s if sweep_s is not None else leases.ttl.total_seconds()
        self.watch_s = watch_s
        self.on_lost = on_lost
        self.reaper = reaper
        self.liveness: Liveness = reaper.liveness if reaper is not None else Liveness()
        self.member: Member | None = None
        self.lost = False  # the lock or the lease is gone and not held again yet: no turn may start
        self.swept = 0  # replies this process has marked interrupted (its start-up's included)
        self._task: asyncio.Task | None = None
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()

    @property
    def holding(self) -> bool:
        """Joined and still holding the lock and lease: this replica's turns are its own."""
        return self.member is not None and not self.lost

    async def start(self) -> Member:
        """Hold the lock and join (taking the name over from an earlier process: its replies are interrupted),
        free what dead replicas held, sweep once, and start the background task."""
        await self._join()
        assert self.member is not None
        self.swept = self.member.took_over + await self._reap() + await self.leases.sweep()
        self._task = asyncio.create_task(self._run(), name=f"forge-replica-{self.replica}")
        return self.member

    async def stop(self) -> None:
        """Stop the task and leave (the session leases go, the lease ends now, the lock is let go)."""
        if self._task is not None:
            # Not cancelled while it talks to the database: a join cut short could commit after the leave and
            # leave a lease behind. Only a database that hangs past a lease is given up on.
            self._stopping.set()
            self._wake.set()
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
        await self.liveness.release()

    async def _join(self) -> None:
        incarnation = new_incarnation()
        await self.liveness.release()
        # The lock before the row that names it: a replica found without its lock is reaped.
        await self.liveness.hold(incarnation, self._lock_lost)
        self.member = await self.leases.join(self.replica, self.address, incarnation)
        self.lost = False

    def _lock_lost(self) -> None:
        self._lose("its lock's connection ended")

    def _lose(self, why: str) -> None:
        if self.lost or self._stopping.is_set():
            return
        log.warning("replica %s: %s; stopping its turns and joining again", self.replica, why)
        self.lost = True
        if self.on_lost is not None:
            self.on_lost()
        self._wake.set()

    async def _reap(self) -> int:
        return await self.reaper.reap() if self.reaper is not None else 0

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + self.beat_s
        next_sweep = loop.time() + self.sweep_s
        tick = min(self.beat_s, self.watch_s) if self.reaper is not None else self.beat_s
        while not self._stopping.is_set():
            try:
                await asyncio.wait_for(self._wake.wait(), tick)
            except TimeoutError:
                pass
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                if self.lost:
                    await self._join()
                    next_beat = loop.time() + self.beat_s
                    continue
                if loop.time() >= next_beat:
                    next_beat = loop.time() + self.beat_s
                    await self._beat()
                self.swept += await self._reap()
                if loop.time() >= next_sweep:
                    next_sweep = loop.time() + self.sweep_s
                    self.swept += await self.leases.sweep()
            except Exception:  # an unreachable database: keep trying; the lease runs out if it stays away
                log.exception("replica %s: heartbeat, check or sweep failed", self.replica)

    async def _beat(self) -> None:
        assert self.member is not None
        if not await self.leases.heartbeat(self.member):
            self._lose("it lost its lease")
