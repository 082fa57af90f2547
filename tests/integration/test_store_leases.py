"""What replicas sharing one database agree on (app.store.leases), on SQLite and PostgreSQL: the one turn per
session, replicas' leases, and the sweep that interrupts only the replies of replicas whose lease has passed;
a process's membership (app.store.membership): heartbeat, periodic sweep, rejoining, leaving.

Each replica is its own Store (its own engine and connections, as in its own process). Nothing here waits on
a short lease while a live one must keep up: a live replica's lease lasts an hour, a dead one's 50 ms.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import text

from app.store import Store
from app.store.leases import Lease
from app.store.membership import Membership
from app.store.migrate import upgrade

ME = "owner-a"
LONG_S, SHORT_S = 3600.0, 0.05


@pytest.fixture
async def replicas(database_url: str) -> AsyncIterator[Callable[..., Store]]:
    """Makes stores on one migrated database: `replicas(ttl_s)`."""
    upgrade(database_url)
    made: list[Store] = []

    def make(ttl_s: float = LONG_S) -> Store:
        made.append(Store(database_url, lease_ttl_s=ttl_s))
        return made[-1]

    yield make
    for s in made:
        await s.close()


async def reply(store: Store, replica: str | None) -> tuple[str, str]:
    """A new session with a reply streaming on `replica`: (session id, reply id)."""
    s = await store.create_session(ME, "t", None, {})
    started = await store.start_reply(s.id, ME, parent_id=None, user_content="q", replica=replica)
    assert started is not None
    r = started[1][-1]
    await store.save_progress({r.id: ("half a rep", 3)})
    return s.id, r.id


async def statuses(store: Store, session_ids: list[str]) -> list[tuple[str, str]]:
    out = []
    for sid in session_ids:
        _, msgs = await store.get_history(sid, ME)  # type: ignore[misc]
        out.append((msgs[-1].status, msgs[-1].content))
    return out


async def test_one_turn_per_session_across_replicas(replicas: Callable[..., Store]) -> None:
    a, b = replicas(), replicas()
    sid = (await a.create_session(ME, "t", None, {})).id
    lease = await a.leases.take(sid, "a")
    assert isinstance(lease, Lease) and (lease.session_id, lease.replica) == (sid, "a")
    assert await b.leases.take(sid, "b") is None  # another replica
    assert await a.leases.take(sid, "a") is None  # the same replica: still one turn
    assert await b.leases.holder(sid) == "a"
    assert await a.leases.take("another-session", "a") is not None  # leases are per session

    assert await a.leases.release(lease) is True
    assert await a.leases.release(lease) is False  # released once
    assert await b.leases.holder(sid) is None
    again = await b.leases.take(sid, "b")
    assert again is not None and again.token != lease.token
    assert await a.leases.release(lease) is False  # a stale token never releases another turn's lease
    assert await b.leases.holder(sid) == "b"


async def test_concurrent_takes_from_many_replicas_give_exactly_one_turn(replicas: Callable[..., Store]) -> None:
    stores = [replicas() for _ in range(6)]
    sid = (await stores[0].create_session(ME, "t", None, {})).id
    for _ in range(3):  # a few rounds: each has one winner, who releases for the next
        won = [
            x
            for x in await asyncio.gather(*(s.leases.take(sid, f"r{i}") for i, s in enumerate(stores)))
            if x is not None
        ]
        assert len(won) == 1, won
        assert await stores[0].leases.holder(sid) == won[0].replica
        assert await stores[1].leases.release(won[0])


async def test_a_dead_replicas_leases_lapse_and_only_its_replies_are_swept(replicas: Callable[..., Store]) -> None:
    live, dead = replicas(LONG_S), replicas(SHORT_S)
    me = await live.leases.join("live", "127.0.0.1:1")
    await dead.leases.join("dead", "127.0.0.1:2")
    mine = [await reply(live, "live") for _ in range(2)]
    theirs = [await reply(dead, "dead") for _ in range(2)]
    legacy = await reply(live, None)  # stored before replicas existed: no replica vouches for it
    held = await dead.leases.take(theirs[0][0], "dead")  # (its 50 ms may pass at once: nothing checks it held)
    assert held is not None

    await asyncio.sleep(SHORT_S * 4)  # the dead replica never beats again
    assert await live.leases.heartbeat(me) is True
    assert await live.leases.sweep() == 3
    assert await statuses(live, [s for s, _ in mine]) == [("streaming", "half a rep")] * 2  # untouched
    assert await statuses(live, [s for s, _ in [*theirs, legacy]]) == [("interrupted", "half a rep")] * 3
    assert await live.leases.sweep() == 0
    assert sorted(await live.leases.streaming("live")) == sorted(r for _, r in mine)

    taken = await live.leases.take(theirs[0][0], "live")  # its session is free for a new turn
    assert taken is not None and await dead.leases.release(held) is False
    alive = {r["name"]: r["alive"] for r in await live.leases.replicas()}
    assert alive == {"live": True, "dead": False}


async def test_heartbeat_renews_the_replicas_session_leases(replicas: Callable[..., Store]) -> None:
    store = replicas(LONG_S)
    me = await store.leases.join("r", "")
    sid = (await store.create_session(ME, "t", None, {})).id
    lease = await store.leases.take(sid, "r")
    assert lease is not None
    await asyncio.sleep(0.01)
    assert await store.leases.heartbeat(me) is True
    async with store.engine.connect() as conn:
        renewed = (
            await conn.execute(text("SELECT expires_at FROM session_leases WHERE session_id = :s"), {"s": sid})
        ).scalar_one()
    if isinstance(renewed, str):  # SQLite keeps datetimes as text
        renewed = datetime.fromisoformat(renewed).replace(tzinfo=UTC)
    assert renewed > lease.expires_at


async def test_a_restart_under_the_same_name_takes_it_over(replicas: Callable[..., Store]) -> None:
    before, after = replicas(), replicas()
    old = await before.leases.join("r1", "127.0.0.1:1")
    other = await before.leases.join("r2", "127.0.0.1:2")
    left = await reply(before, "r1")
    others = await reply(before, "r2")
    assert await before.leases.take(left[0], "r1") is not None

    new = await after.leases.join("r1", "127.0.0.1:1")  # the process restarted (the old one was SIGKILLed)
    assert new.took_over == 1 and new.incarnation != old.incarnation
    assert await statuses(after, [left[0], others[0]]) == [("interrupted", "half a rep"), ("streaming", "half a rep")]
    assert await after.leases.take(left[0], "r1") is not None  # the old process's turn is gone
    assert await before.leases.heartbeat(old) is False  # were it still running, it learns it lost the name
    assert await after.leases.heartbeat(new) is True and await before.leases.heartbeat(other) is True


async def test_leaving_ends_the_lease_and_frees_the_sessions(replicas: Callable[..., Store]) -> None:
    a, b = replicas(), replicas()
    me = await a.leases.join("a", "")
    watcher = await b.leases.join("b", "")
    sid, _ = await reply(a, "a")
    assert await a.leases.take(sid, "a") is not None
    await a.leases.leave(me)
    assert await b.leases.take(sid, "b") is not None
    assert await a.leases.heartbeat(me) is False
    assert {r["name"]: r["alive"] for r in await b.leases.replicas()} == {"a": False, "b": True}
    assert await b.leases.sweep() == 1  # whatever it left streaming (a clean stop finishes its turns first)
    assert await b.leases.heartbeat(watcher) is True


async def test_replica_names_are_checked() -> None:
    store = Store("sqlite+aiosqlite:///:memory:")  # refused before any query
    try:
        for name in ["", "x" * 201, "tab\there", "new\nline"]:
            with pytest.raises(ValueError, match="replica name"):
                await store.leases.join(name)
    finally:
        await store.close()


async def eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30.0) -> None:
    """Poll `check` until it holds (the heartbeat task runs on its own clock)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.02)


async def test_membership_beats_sweeps_rejoins_after_losing_its_name_and_leaves(replicas: Callable[..., Store]) -> None:
    beating, dead, usurper = replicas(LONG_S), replicas(SHORT_S), replicas(LONG_S)
    await dead.leases.join("dead")
    before = await reply(dead, "dead")  # left by a replica that died before this one started
    await asyncio.sleep(SHORT_S * 4)
    lost: list[bool] = []
    member = Membership(
        beating.leases, "r1", "127.0.0.1:1", sweep_s=0.1, on_lost=lambda: lost.append(True), beat_s=0.05
    )
    first = await member.start()
    try:
        assert member.swept == 1 and await statuses(beating, [before[0]]) == [("interrupted", "half a rep")]

        async def renewed() -> bool:
            return next(r for r in await beating.leases.replicas() if r["name"] == "r1")["heartbeat_at"] != beat0

        beat0 = next(r for r in await beating.leases.replicas() if r["name"] == "r1")["heartbeat_at"]
        await eventually(renewed, "a heartbeat")

        await dead.leases.join("dead")
        later = await reply(dead, "dead")  # dies while this replica runs: the periodic sweep finds it

        async def swept() -> bool:
            return await statuses(beating, [later[0]]) == [("interrupted", "half a rep")]

        await eventually(swept, "the periodic sweep")

        await usurper.leases.join("r1")  # another process takes the name: the next beat finds the lease lost

        async def rejoined() -> bool:
            return bool(lost) and member.member is not None and member.member.incarnation != first.incarnation

        await eventually(rejoined, "losing the lease and joining again")
    finally:
        await member.stop()
    assert {r["name"]: r["alive"] for r in await usurper.leases.replicas()}["r1"] is False
