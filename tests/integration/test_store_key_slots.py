"""`--max-concurrent-per-key` across replicas (app.store.key_slots), on SQLite and PostgreSQL: a key's slots
under its cap, released, renewed with the heartbeat, a dead replica's expiring; two replicas (two stores on one
database) sharing the cap. A dead replica's lease is 50 ms, a live one's an hour: nothing waits on a live one."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import datetime

import pytest
from sqlalchemy import select

from app.store import Store
from app.store.migrate import upgrade
from app.store.models import KeySlot

KEY, OTHER = "key-a", "key-b"
LONG_S, SHORT_S = 3600.0, 0.05


@pytest.fixture
async def replicas(database_url: str) -> AsyncIterator[Callable[..., Store]]:
    upgrade(database_url)
    made: list[Store] = []

    def make(ttl_s: float = LONG_S) -> Store:
        made.append(Store(database_url, lease_ttl_s=ttl_s))
        return made[-1]

    yield make
    for s in made:
        await s.close()


async def test_cap_release_and_other_keys(replicas: Callable[..., Store]) -> None:
    slots = replicas().key_slots
    a = [await slots.take(KEY, "r1", 1, 2) for _ in range(2)]
    assert all(a)
    assert await slots.take(KEY, "r1", 1, 2) is None  # the N+1th
    assert await slots.take(OTHER, "r1", 1, 2) is not None  # the cap is per key
    assert await slots.held(KEY) == 2
    assert await slots.release(a[0]) is True  # type: ignore[arg-type]
    assert await slots.release(a[0]) is False  # type: ignore[arg-type]
    assert await slots.take(KEY, "r1", 1, 2) is not None
    assert await slots.take(KEY, "r1", 1, 2) is None


async def test_units_and_a_generation_bigger_than_the_cap(replicas: Callable[..., Store]) -> None:
    slots = replicas().key_slots
    big = await slots.take(KEY, "r1", 3, 2)  # bigger than the cap: runs alone
    assert big is not None and await slots.held(KEY) == 3
    assert await slots.take(KEY, "r1", 1, 2) is None
    await slots.release(big)
    one = await slots.take(KEY, "r1", 1, 2)
    assert one is not None
    assert await slots.take(KEY, "r1", 2, 2) is None  # 1 + 2 > 2
    assert await slots.take(KEY, "r1", 1, 2) is not None


async def test_two_replicas_share_the_cap(replicas: Callable[..., Store]) -> None:
    r1, r2 = replicas(), replicas()
    m1, m2 = await r1.leases.join("r1"), await r2.leases.join("r2")
    got = await asyncio.gather(*(s.key_slots.take(KEY, n, 1, 3) for s, n in [(r1, "r1"), (r2, "r2")] * 4))
    assert sum(g is not None for g in got) == 3  # eight takes at once on two replicas: exactly the cap
    taken = [g for g in got if g is not None]
    assert await r2.key_slots.take(KEY, "r2", 1, 3) is None
    await r1.key_slots.release(taken[0])
    assert await r2.key_slots.take(KEY, "r2", 1, 3) is not None
    await r1.leases.leave(m1)  # a clean stop frees the replica's slots
    assert await r2.key_slots.held(KEY) == sum(1 for g in taken[1:] if g.replica == "r2") + 1
    await r2.leases.leave(m2)
    assert await r2.key_slots.held(KEY) == 0


async def test_a_dead_replicas_slots_expire_a_live_ones_are_renewed(replicas: Callable[..., Store]) -> None:
    dead, live = replicas(SHORT_S), replicas()
    await dead.leases.join("dead")
    m = await live.leases.join("live")
    assert await dead.key_slots.take(KEY, "dead", 1, 1) is not None
    assert await live.key_slots.take(KEY, "live", 1, 1) is None
    await asyncio.sleep(SHORT_S * 3)
    mine = await live.key_slots.take(KEY, "live", 1, 1)  # the dead one's expired: the take deletes it
    assert mine is not None
    assert await live.leases.heartbeat(m) is True  # renews the live replica's slot with its lease
    await dead.leases.sweep()
    assert await live.key_slots.held(KEY) == 1
    assert await dead.key_slots.take(KEY, "dead", 1, 1) is None


async def expiry(store: Store, slot_id: str) -> datetime:
    async with store.sessionmaker() as db:
        return await db.scalar(select(KeySlot.expires_at).where(KeySlot.id == slot_id))


async def test_the_heartbeat_renews_slots_only_once_one_was_taken(replicas: Callable[..., Store]) -> None:
    store = replicas()
    m = await store.leases.join("r1")
    assert store.leases.key_slots is False  # no cap used yet: the heartbeat leaves key_slots alone
    slot = await store.key_slots.take(KEY, "r1", 1, 1)
    assert slot is not None and store.leases.key_slots is True
    before = await expiry(store, slot.id)
    await asyncio.sleep(0.01)
    assert await store.leases.heartbeat(m) is True
    assert await expiry(store, slot.id) > before
