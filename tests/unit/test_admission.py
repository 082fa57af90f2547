"""The admission queue (app/domain/admission.py) on its own: grants in order of a round-robin across owners,
bounded, with deadlines on a fake clock, and waiters that leave. No timing: grants happen on release."""

from __future__ import annotations

import asyncio

import pytest

from app.domain.admission import Admission, QueueFull, QueueTimeout


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_within_capacity_everyone_is_admitted_at_once() -> None:
    adm = Admission(capacity=3)
    tickets = [adm.enter("local") for _ in range(3)]  # one owner may use the whole engine
    assert all(t.granted for t in tickets) and adm.in_use == 3 and adm.depth == 0
    waiting = adm.enter("local")
    assert not waiting.granted and adm.depth == 1
    adm.release(tickets[0])
    assert waiting.granted and adm.depth == 0 and adm.in_use == 3
    adm.release(tickets[0])  # twice is harmless
    assert adm.in_use == 3


async def test_a_flooding_owner_does_not_starve_another() -> None:
    adm = Admission(capacity=2)
    running = [adm.enter("flood"), adm.enter("flood")]
    flood = [adm.enter("flood") for _ in range(50)]
    late = adm.enter("late")  # arrives behind fifty of the flood's
    order: list[str] = []
    for _ in range(4):  # each release admits the next waiter in the rotation
        adm.release(running.pop(0))
        granted = next(t for t in flood + [late] if t.granted and t not in running)
        running.append(granted)
        order.append(granted.owner)
        if granted in flood:
            flood.remove(granted)
    assert late.granted
    assert order.index("late") <= 1  # at most one of the flood's went first
    assert order.count("flood") == 3 and adm.depth == len(flood)


async def test_round_robin_alternates_between_waiting_owners() -> None:
    adm = Admission(capacity=1)
    holder = adm.enter("x")
    a = [adm.enter("a") for _ in range(3)]
    b = [adm.enter("b") for _ in range(3)]
    order = []
    current = holder
    for _ in range(6):
        adm.release(current)
        current = next(t for t in a + b if t.granted and not t.released)
        order.append(current.owner)
    assert order == ["a", "b", "a", "b", "a", "b"]
    assert [a.index(t) for t in a] == [0, 1, 2]  # an owner's own requests keep their order


async def test_a_full_queue_refuses_with_a_retry_after() -> None:
    adm = Admission(capacity=1, queue_size=2)
    adm.enter("a")
    adm.enter("a")
    adm.enter("b")
    with pytest.raises(QueueFull) as refused:
        adm.enter("c")
    assert refused.value.retry_after_s >= 1 and adm.depth == 2 and adm.stats.refused_full == 1


async def test_no_queue_at_all_refuses_past_capacity() -> None:
    adm = Admission(capacity=1, queue_size=0)
    adm.enter("a")
    with pytest.raises(QueueFull):
        adm.enter("a")


async def test_a_waiter_past_its_deadline_is_refused_and_leaves_the_queue() -> None:
    clock = Clock()
    adm = Admission(capacity=1, timeout_s=5.0, clock=clock)
    holder = adm.enter("a")
    ticket = adm.enter("b")
    clock.now += 5.0  # the deadline has passed before the waiter looks
    with pytest.raises(QueueTimeout) as refused:
        await adm.wait(ticket)
    assert 1 <= refused.value.retry_after_s <= 5
    assert adm.depth == 0 and not ticket.granted and adm.stats.refused_timeout == 1
    adm.release(holder)
    assert adm.in_use == 0  # nothing was granted to the refused ticket


async def test_a_waiter_is_admitted_when_a_place_frees() -> None:
    adm = Admission(capacity=1)
    holder = adm.enter("a")
    ticket = adm.enter("b")
    waiter = asyncio.ensure_future(adm.wait(ticket))
    await asyncio.sleep(0)
    assert not waiter.done()
    adm.release(holder)
    await waiter
    assert ticket.granted and adm.held_by("b") == 1


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    adm = Admission(capacity=1)
    holder = adm.enter("a")
    gone = adm.enter("b")
    after = adm.enter("c")
    waiter = asyncio.ensure_future(adm.wait(gone))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert adm.depth == 1 and adm.stats.withdrawn == 1
    adm.release(holder)
    assert after.granted and not gone.granted


async def test_a_grant_to_a_waiter_that_left_is_given_back() -> None:
    adm = Admission(capacity=1)
    holder = adm.enter("a")
    ticket = adm.enter("b")
    adm.release(holder)  # granted, but its waiter goes away before using it
    adm.withdraw(ticket)
    assert adm.in_use == 0 and adm.enter("c").granted


async def test_the_per_owner_cap_queues_an_owners_extra_requests_and_not_others() -> None:
    adm = Admission(capacity=4, per_owner=1)
    first = adm.enter("a")
    second = adm.enter("a")
    other = adm.enter("b")
    assert first.granted and not second.granted and other.granted  # b overtakes a's capped request
    adm.release(first)
    assert second.granted


async def test_owners_waiting_at_their_cap_do_not_fill_the_queue_for_others() -> None:
    adm = Admission(capacity=4, queue_size=1, per_owner=1)
    adm.enter("a")
    capped = adm.enter("a")
    assert not capped.granted and adm.depth == 1  # the queue is full, with a request that waits for its owner
    assert adm.enter("b").granted  # room in the engine: b is admitted, not refused


async def test_a_request_with_several_samples_costs_several_places() -> None:
    adm = Admission(capacity=4)
    big = adm.enter("a", cost=3)
    small = adm.enter("b", cost=2)
    assert big.granted and not small.granted  # 3 + 2 > 4
    huge = Admission(capacity=4).enter("a", cost=100)  # bigger than the engine: runs alone
    assert huge.granted and huge.cost == 4
    adm.release(big)
    assert small.granted and adm.in_use == 2


def test_settings_are_checked() -> None:
    for bad in (
        {"capacity": 0},
        {"capacity": 1, "queue_size": -1},
        {"capacity": 1, "timeout_s": 0},
        {"capacity": 1, "per_owner": 0},
    ):
        with pytest.raises(ValueError):
            Admission(**bad)
