"""`--max-concurrent-per-key` across replicas sharing one database: each running generation of an API key holds
a slot row (its units, its replica, an expiry). A take counts the key's live units and inserts only under the cap,
in one transaction serialized per key (PostgreSQL: an advisory lock on the key's hash; SQLite: one writer at a
time). Slots are released at the generation's end, renewed with their replica's heartbeat (app.store.leases) and
swept once expired, so a dead replica's slots free themselves within a lease."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass

from sqlalchemy import delete, func, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from app.store.leases import Leases, _now
from app.store.models import KeySlot


@dataclass(slots=True, frozen=True)
class Slot:
    """Units one generation of `owner` holds on `replica`; `id` releases them."""

    id: str
    owner: str
    replica: str
    units: int


class KeySlots:
    """The per-key cap's slots, as short transactions on the store's database."""

    def __init__(self, leases: Leases) -> None:
        self.leases = leases
        self.sessionmaker = leases.sessionmaker
        self.ttl = leases.ttl

    async def take(self, owner: str, replica: str, units: int, cap: int) -> Slot | None:
        """`units` for one generation of `owner` on `replica`, or None while the key's live units (on every
        replica) leave no room under `cap`. A generation bigger than the cap takes it alone."""
        self.leases.key_slots = True  # from now on the heartbeat renews this replica's slots (none before: no cost)
        async with self.sessionmaker.begin() as db:
            await _lock(db, owner)
            now = await _now(db)
            await db.execute(delete(KeySlot).where(KeySlot.owner == owner, KeySlot.expires_at <= now))
            held = await db.scalar(select(func.coalesce(func.sum(KeySlot.units), 0)).where(KeySlot.owner == owner))
            if held + units > max(cap, units) and held > 0:
                return None
            slot = Slot(uuid.uuid4().hex, owner, replica, units)
            db.add(KeySlot(id=slot.id, owner=owner, replica=replica, units=units, expires_at=now + self.ttl))
            return slot

    async def release(self, slot: Slot) -> bool:
        """Free the slot; False when it was gone already (expired and swept)."""
        async with self.sessionmaker.begin() as db:
            gone = await db.execute(delete(KeySlot).where(KeySlot.id == slot.id))
            return gone.rowcount == 1

    async def held(self, owner: str) -> int:
        """The key's live units on every replica."""
        async with self.sessionmaker() as db:
            now = await _now(db)
            return await db.scalar(
                select(func.coalesce(func.sum(KeySlot.units), 0)).where(
                    KeySlot.owner == owner, KeySlot.expires_at > now
                )
            )


async def _lock(db: AsyncSession, owner: str) -> None:
    """Serialize takes of one key until the transaction ends (PostgreSQL); SQLite has one writer at a time, and
    the delete that starts the take makes this transaction the writer."""
    if db.get_bind().dialect.name == "postgresql":
        key = int.from_bytes(hashlib.blake2b(owner.encode(), digest_size=8).digest(), "big", signed=True)
        await db.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
