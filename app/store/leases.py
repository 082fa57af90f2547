"""State that must hold across `forge serve` processes sharing one database: which replicas are alive, and the
one turn a session may run at a time.

A replica joins with a lease (`lease_until`) and renews it by heartbeat; a session's turn takes a lease of the
session (owner replica, expiry, a token) atomically, renewed with its replica's heartbeat and released by its
token when the turn ends. A replica that dies stops renewing: once its lease has passed, its sessions can be
taken again and `sweep` marks its streaming replies `interrupted`. A live replica's replies are never touched.

Times are the database's clock on PostgreSQL (replicas on several machines need not agree on the time) and
this process's on SQLite (one machine).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, or_, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.store.models import REPLICA_NAME_CHARS, KeySlot, Message, Replica, SessionLease, iso, utcnow

LEASE_TTL_S = 10.0  # a heartbeat every LEASE_TTL_S / 3 leaves two missed beats before a replica counts as dead


@dataclass(slots=True)
class Member:
    """One process's membership under a replica name (`Leases.join`)."""

    replica: str
    incarnation: str
    took_over: int = 0  # streaming replies of an earlier process under the name, marked interrupted at join


@dataclass(slots=True, frozen=True)
class Lease:
    """A session's turn, held by `replica`; `token` releases it."""

    session_id: str
    replica: str
    token: str
    expires_at: datetime


class Leases:
    """Replicas' liveness and session leases, as short transactions on the store's database."""

    def __init__(self, sessionmaker: async_sessionmaker, ttl_s: float = LEASE_TTL_S) -> None:
        assert ttl_s > 0, ttl_s
        self.sessionmaker = sessionmaker
        self.ttl = timedelta(seconds=ttl_s)
        self.key_slots = False  # set by the first key slot taken (app.store.key_slots): only then renewed and swept

    # -- replicas -------------------------------------------------------------------------

    async def join(self, replica: str, address: str = "", incarnation: str | None = None) -> Member:
        """Start `replica`'s membership with a fresh lease (as `incarnation`: the key of the lock it holds,
        app.store.liveness; default a new one). A name is one process at a time: joining takes the name over
        from an earlier process (a restart), whose streaming replies are marked `interrupted` and whose session
        leases go at once; that process's heartbeat fails from now on."""
        _check_name(replica)
        member = Member(replica, incarnation or new_incarnation())
        async with self.sessionmaker.begin() as db:
            now = await _now(db)
            values = dict(
                name=replica,
                address=address[:REPLICA_NAME_CHARS],
                incarnation=member.incarnation,
                started_at=now,
                heartbeat_at=now,
                lease_until=now + self.ttl,
            )
            insert = _insert(db, Replica).values(**values)
            await db.execute(insert.on_conflict_do_update(index_elements=["name"], set_=values))
            marked = await db.execute(_interrupt(now).where(Message.status == "streaming", Message.replica == replica))
            await db.execute(delete(SessionLease).where(SessionLease.replica == replica))
            await db.execute(delete(KeySlot).where(KeySlot.replica == replica))
            member.took_over = marked.rowcount
        return member

    async def heartbeat(self, member: Member) -> bool:
        """Renew the member's lease and every session lease and key slot (app.store.key_slots) its replica holds.
        False when its lease had already passed or another process took its name over: other replicas may have
        swept its replies and taken its sessions, so it should stop its turns and `join` again."""
        async with self.sessionmaker.begin() as db:
            now = await _now(db)
            renewed = await db.execute(
                update(Replica)
                .where(
                    Replica.name == member.replica, Replica.incarnation == member.incarnation, Replica.lease_until > now
                )
                .values(heartbeat_at=now, lease_until=now + self.ttl)
            )
            if renewed.rowcount != 1:
                return False
            await db.execute(
                update(SessionLease).where(SessionLease.replica == member.replica).values(expires_at=now + self.ttl)
            )
            if self.key_slots:
                await db.execute(
                    update(KeySlot).where(KeySlot.replica == member.replica).values(expires_at=now + self.ttl)
                )
            return True

    async def leave(self, member: Member) -> None:
        """A clean stop: the member's session leases go and its lease ends now."""
        async with self.sessionmaker.begin() as db:
            now = await _now(db)
            mine = (Replica.name == member.replica, Replica.incarnation == member.incarnation)
            ended = await db.execute(update(Replica).where(*mine).values(lease_until=now))
            if ended.rowcount == 1:
                await db.execute(delete(SessionLease).where(SessionLease.replica == member.replica))
                await db.execute(delete(KeySlot).where(KeySlot.replica == member.replica))

    async def replicas(self) -> list[dict[str, Any]]:
        """Every replica that has joined, by name, with `alive` (its lease not passed yet)."""
        async with self.sessionmaker() as db:
            now = await _now(db)
            rows = (await db.scalars(select(Replica).order_by(Replica.name))).all()
            return [
                {
                    "name": r.name,
                    "address": r.address,
                    "started_at": iso(r.started_at),
                    "heartbeat_at": iso(r.heartbeat_at),
                    "lease_until": iso(r.lease_until),
                    "alive": _aware(r.lease_until) > now,
                }
                for r in rows
            ]

    # -- session leases -------------------------------------------------------------------

    async def take(self, session_id: str, replica: str) -> Lease | None:
        """The session's turn for `replica`, or None while another turn (on any replica, this one included)
        holds an unexpired lease. One statement: of two replicas taking at once, one gets it."""
        async with self.sessionmaker.begin() as db:
            now = await _now(db)
            token, expires_at = uuid.uuid4().hex, now + self.ttl
            values = dict(session_id=session_id, replica=replica, token=token, taken_at=now, expires_at=expires_at)
            insert = _insert(db, SessionLease).values(**values)
            taken = await db.execute(
                insert.on_conflict_do_update(
                    index_elements=["session_id"],
                    set_={k: v for k, v in values.items() if k != "session_id"},
                    where=SessionLease.expires_at <= now,
                ).returning(SessionLease.token)
            )
            if taken.scalar_one_or_none() != token:
                return None
            return Lease(session_id, replica, token, expires_at)

    async def release(self, lease: Lease) -> bool:
        """End the turn of `lease`; False when it was no longer held by it (it expired and was taken again)."""
        async with self.sessionmaker.begin() as db:
            gone = await db.execute(
                delete(SessionLease).where(
                    SessionLease.session_id == lease.session_id, SessionLease.token == lease.token
                )
            )
            return gone.rowcount == 1

    async def holder(self, session_id: str) -> str | None:
        """The replica whose turn holds the session now, or None."""
        async with self.sessionmaker() as db:
            now = await _now(db)
            return await db.scalar(
                select(SessionLease.replica).where(SessionLease.session_id == session_id, SessionLease.expires_at > now)
            )

    # -- the sweep ------------------------------------------------------------------------

    async def sweep(self) -> int:
        """Mark `interrupted` every streaming reply whose replica's lease has passed (or that names no replica:
        stored before replicas existed); drop expired session leases. Returns how many replies it marked."""
        async with self.sessionmaker.begin() as db:
            now = await _now(db)
            alive = select(Replica.name).where(Replica.lease_until > now)
            marked = await db.execute(
                _interrupt(now).where(
                    Message.status == "streaming", or_(Message.replica.is_(None), Message.replica.not_in(alive))
                )
            )
            await db.execute(delete(SessionLease).where(SessionLease.expires_at <= now))
            if self.key_slots:
                await db.execute(delete(KeySlot).where(KeySlot.expires_at <= now))
            return marked.rowcount

    async def streaming(self, replica: str) -> list[str]:
        """The ids of the replies `replica` is streaming, as stored."""
        async with self.sessionmaker() as db:
            return list(
                (
                    await db.scalars(
                        select(Message.id).where(and_(Message.status == "streaming", Message.replica == replica))
                    )
                ).all()
            )


def new_incarnation() -> str:
    """A process's incarnation under its replica name: 32 hex digits."""
    return uuid.uuid4().hex


def _interrupt(now: datetime) -> Any:
    return (
        update(Message)
        .values(status="interrupted", finish_reason="abort", updated_at=now)
        .execution_options(synchronize_session=False)
    )


def _check_name(replica: str) -> None:
    if not replica or len(replica) > REPLICA_NAME_CHARS or not replica.isprintable():
        raise ValueError(f"a replica name is 1 to {REPLICA_NAME_CHARS} printable characters, not {replica!r}")


def _insert(db: AsyncSession, table: type) -> Any:
    """INSERT with ON CONFLICT for the dialects Forge runs on."""
    name = db.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"leases need PostgreSQL or SQLite, not {name}")


async def _now(db: AsyncSession) -> datetime:
    """The database's clock on PostgreSQL (one clock for every replica), else this process's."""
    if db.get_bind().dialect.name == "postgresql":
        return await db.scalar(text("SELECT now()"))
    return utcnow()


def _aware(dt: datetime) -> datetime:
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)
