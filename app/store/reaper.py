"""Freeing what dead replicas held, as soon as their lock is free (app.store.liveness): a replica whose lease
has not passed but whose lock nobody holds is dead. Its lease ends now, its streaming replies are marked
`interrupted` and its session leases and key slots go, in one transaction that names its incarnation (a
process that took the name over meanwhile is left alone).

Checked at start, periodically (app.store.membership) and when a turn finds its session held by another
replica (`free`), so a crash costs a lock check, not a lease.
"""

from __future__ import annotations

from sqlalchemy import delete, select, update

from app.store.leases import Leases, _interrupt, _now
from app.store.liveness import Liveness
from app.store.models import KeySlot, Message, Replica, SessionLease


class Reaper:
    """Ends the membership of replicas whose lock is free."""

    def __init__(self, leases: Leases, liveness: Liveness) -> None:
        self.leases = leases
        self.liveness = liveness
        self.sessionmaker = leases.sessionmaker

    async def reap(self) -> int:
        """Every member (lease not passed) whose lock is free: reaped. Returns how many replies it marked."""
        async with self.sessionmaker() as db:
            now = await _now(db)
            members = (
                await db.execute(select(Replica.name, Replica.incarnation).where(Replica.lease_until > now))
            ).all()
        return await self._reap_dead([(name, inc) for name, inc in members])

    async def free(self, session_id: str) -> bool:
        """The session's lease is held by a replica whose lock is free: reap it. True when the lease went."""
        async with self.sessionmaker() as db:
            now = await _now(db)
            holder = (
                await db.execute(
                    select(Replica.name, Replica.incarnation)
                    .join(SessionLease, SessionLease.replica == Replica.name)
                    .where(SessionLease.session_id == session_id, SessionLease.expires_at > now)
                )
            ).first()
        if holder is None:
            return False
        held = await self.liveness.held([holder.incarnation])
        if held is None or holder.incarnation in held:
            return False
        await self.end(holder.name, holder.incarnation)
        return True

    async def _reap_dead(self, members: list[tuple[str, str]]) -> int:
        if not members:
            return 0
        held = await self.liveness.held([inc for _, inc in members])
        if held is None:
            return 0
        return sum([await self.end(name, inc) for name, inc in members if inc not in held])

    async def end(self, replica: str, incarnation: str) -> int:
        """End `incarnation`'s membership of `replica`, if it is still the one under the name: its lease ends,
        its streaming replies become `interrupted`, its session leases and key slots go. Returns the replies
        marked."""
        async with self.sessionmaker.begin() as db:
            now = await _now(db)
            ended = await db.execute(
                update(Replica)
                .where(Replica.name == replica, Replica.incarnation == incarnation, Replica.lease_until > now)
                .values(lease_until=now)
            )
            if ended.rowcount != 1:
                return 0
            marked = await db.execute(_interrupt(now).where(Message.status == "streaming", Message.replica == replica))
            await db.execute(delete(SessionLease).where(SessionLease.replica == replica))
            await db.execute(delete(KeySlot).where(KeySlot.replica == replica))
            return marked.rowcount
