"""`--max-concurrent-per-key` across replicas at the admitter (app.domain.admit): two replicas (two stores and two
admitters on one database, as two processes) share a key's cap; a request at the cap waits in its queue and runs
when the other replica's generation ends, or gets queue_timeout at the queue's deadline."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from app.domain.admission import Admission
from app.domain.admit import Admitter, Place
from app.domain.errors import ServiceError
from app.metrics import Metrics
from app.store import Store
from app.store.migrate import upgrade

KEY = "key-a"


@pytest.fixture
async def stores(database_url: str) -> AsyncIterator[tuple[Store, Store]]:
    upgrade(database_url)
    one, two = Store(database_url), Store(database_url)
    yield one, two
    await one.close()
    await two.close()


def admitter(store: Store, replica: str, cap: int = 1, timeout_s: float = 30.0) -> Admitter:
    return Admitter(Admission(4, timeout_s=timeout_s, per_owner=cap), Metrics(), store.key_slots, replica)


async def test_a_key_at_its_cap_elsewhere_waits_then_runs(stores: tuple[Store, Store]) -> None:
    r1, r2 = admitter(stores[0], "r1"), admitter(stores[1], "r2")
    first = await r1.admit(KEY)
    assert isinstance(first, Place) and first.granted
    told: list[bool] = []
    waiting = asyncio.create_task(r2.admit(KEY, queued=lambda: told.append(True)))
    other = await r2.admit("key-b")  # other keys are not held up
    assert other.granted
    for _ in range(1000):  # until r2's request is told it waits (at most 10 s)
        if told:
            break
        await asyncio.sleep(0.01)
    assert not waiting.done() and told == [True]  # the engine has room, the key has none (on r1)
    r1.release(first)
    second = await asyncio.wait_for(waiting, 10)
    assert second.granted and await stores[0].key_slots.held(KEY) == 1
    r2.release(second)
    r2.release(other)
    for _ in range(1500):  # the slot is released by a task (at most 30 s)
        if await stores[0].key_slots.held(KEY) == 0:
            break
        await asyncio.sleep(0.02)
    assert await stores[0].key_slots.held(KEY) == 0
    assert r2.admission.in_use == 0


async def test_a_key_at_its_cap_elsewhere_times_out(stores: tuple[Store, Store]) -> None:
    r1, r2 = admitter(stores[0], "r1"), admitter(stores[1], "r2", timeout_s=0.3)
    first = await r1.admit(KEY)
    with pytest.raises(ServiceError) as e:
        await r2.admit(KEY)
    assert e.value.code == "queue_timeout"
    assert r2.admission.in_use == 0 and r2.admission.depth == 0  # its place in the engine was given back
    r1.release(first)


async def test_no_cap_no_database(stores: tuple[Store, Store]) -> None:
    plain = Admitter(Admission(4), Metrics(), stores[0].key_slots, "r1")
    held = await plain.admit(KEY)
    assert not isinstance(held, Place) and held.granted
    assert await stores[0].key_slots.held(KEY) == 0
    plain.release(held)
