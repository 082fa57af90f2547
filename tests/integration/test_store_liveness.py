"""Liveness by a held lock (app.store.liveness, app.store.reaper), on SQLite (a file lock) and PostgreSQL (an
advisory lock): a replica in another process, SIGKILLed, is found dead as soon as its lock is free, whatever its
lease says: its replies are interrupted and its sessions free at once. On PostgreSQL, a replica whose lock
connection is ended from the database's side (pg_terminate_backend) is fenced: it is told at once, its reply
writes no longer land once another replica has reaped it, and it joins again under a new lock.

Every lease here lasts an hour: nothing below can have come from a lease running out.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from sqlalchemy import text

from app.store import Store
from app.store.liveness_pg import NAMESPACE, PgLiveness, lock_key
from app.store.membership import Membership
from app.store.migrate import upgrade

REPO = Path(__file__).resolve().parents[2]
ME = "owner-a"
LONG_S = 3600.0
WAIT_S = 30.0  # generous: a busy machine; the lease (an hour) never decides here

# A replica in its own process: joins (holding its lock), starts a reply, takes its session's lease, says so,
# then waits to be killed.
REPLICA = textwrap.dedent(
    """
    import asyncio, sys
    from app.store import Store
    from app.store.membership import Membership

    async def main(url):
        store = Store(url, lease_ttl_s=3600)
        member = Membership(store.leases, "doomed", reaper=store.reaper)
        await member.start()
        s = await store.create_session("owner-a", "t", None, {})
        _, branch = await store.start_reply(s.id, "owner-a", parent_id=None, user_content="q", replica="doomed")
        await store.save_progress({branch[-1].id: ("half a rep", 3)})
        assert await store.leases.take(s.id, "doomed") is not None
        print(s.id, branch[-1].id, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1]))
    """
)


@pytest.fixture
async def replicas(database_url: str) -> AsyncIterator[Callable[[], Store]]:
    upgrade(database_url)
    made: list[Store] = []

    def make() -> Store:
        made.append(Store(database_url, lease_ttl_s=LONG_S))
        return made[-1]

    yield make
    for s in made:
        await s.close()


async def eventually(check: Callable[[], Awaitable[bool]], what: str) -> float:
    """Poll `check` until it holds; returns how long it took."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not await check():
        assert loop.time() - start < WAIT_S, f"never happened: {what}"
        await asyncio.sleep(0.01)
    return loop.time() - start


async def last_reply(store: Store, sid: str) -> tuple[str, str]:
    _, msgs = await store.get_history(sid, ME)  # type: ignore[misc]
    return msgs[-1].status, msgs[-1].content


async def test_a_killed_replica_is_dead_as_soon_as_its_lock_is_free(
    replicas: Callable[[], Store], database_url: str
) -> None:
    live = replicas()
    # No watch of its own during the test: what frees the killed replica's session is the check a turn makes.
    member = Membership(live.leases, "live", reaper=live.reaper, watch_s=3600)
    await member.start()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", REPLICA, database_url], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 120)
        sid, rid = line.split()
        # Alive: its lock is held, so nothing of it is touched, and its session is busy.
        assert await live.reaper.reap() == 0 and await live.reaper.free(sid) is False
        assert await live.leases.take(sid, "live") is None
        assert await last_reply(live, sid) == ("streaming", "half a rep")

        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

        async def taken() -> bool:  # what a turn does: check the holder before answering busy
            if await live.leases.take(sid, "live") is not None:
                return True
            return await live.reaper.free(sid) and await live.leases.take(sid, "live") is not None

        took = await eventually(taken, "the killed replica's session taken")
        print(f"\n{database_url.split(':')[0]}: session taken {took * 1000:.0f} ms after the SIGKILL returned")
        assert await last_reply(live, sid) == ("interrupted", "half a rep")
        alive = {r["name"]: r["alive"] for r in await live.leases.replicas()}
        assert alive == {"live": True, "doomed": False}
        assert member.holding and member.swept == 0  # the check freed it, not this replica's sweep
    finally:
        proc.kill()
        await member.stop()
    assert rid


async def test_the_periodic_check_reaps_a_dead_replica_without_any_turn(
    replicas: Callable[[], Store], database_url: str
) -> None:
    live = replicas()
    member = Membership(live.leases, "live", reaper=live.reaper, watch_s=0.05)
    await member.start()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", REPLICA, database_url], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        sid, _ = (await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 120)).split()
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

        async def interrupted() -> bool:
            return (await last_reply(live, sid))[0] == "interrupted"

        await eventually(interrupted, "the periodic check marking the reply")
        assert member.swept == 1
        assert await live.leases.take(sid, "live") is not None
    finally:
        proc.kill()
        await member.stop()


async def test_start_up_reaps_a_replica_that_died_under_another_name(replicas: Callable[[], Store]) -> None:
    """A restart at another address (another default name): the old name's lock is free, so the new process
    frees its sessions and interrupts its replies as it starts."""
    old, new = replicas(), replicas()
    gone = Membership(old.leases, "127.0.0.1:1", reaper=old.reaper)
    await gone.start()
    sid = (await old.create_session(ME, "t", None, {})).id
    _, branch = await old.start_reply(sid, ME, parent_id=None, user_content="q", replica="127.0.0.1:1")  # type: ignore[misc]
    await old.save_progress({branch[-1].id: ("so far", 2)})
    assert await old.leases.take(sid, "127.0.0.1:1") is not None
    await old.liveness.release()  # the process is gone: its lock with it (its lease an hour ahead)

    member = Membership(new.leases, "127.0.0.1:2", reaper=new.reaper)
    await member.start()
    try:
        assert member.swept == 1
        assert await last_reply(new, sid) == ("interrupted", "so far")
        assert await new.leases.take(sid, "127.0.0.1:2") is not None
    finally:
        await member.stop()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_a_replica_whose_lock_connection_is_ended_is_fenced(replicas: Callable[[], Store]) -> None:
    cut, other = replicas(), replicas()
    lost: list[bool] = []
    victim = Membership(cut.leases, "cut", reaper=cut.reaper, on_lost=lambda: lost.append(victim.holding))
    survivor = Membership(other.leases, "other", reaper=other.reaper, watch_s=0.05)
    first = await victim.start()
    await survivor.start()
    try:
        sid = (await cut.create_session(ME, "t", None, {})).id
        started = await cut.start_reply(sid, ME, parent_id=None, user_content="q", replica="cut")
        assert started is not None
        rid = started[1][-1].id
        assert await cut.save_progress({rid: ("before", 1)}) == set()
        assert await cut.leases.take(sid, "cut") is not None

        assert isinstance(cut.liveness, PgLiveness) and cut.liveness.pid is not None
        async with other.engine.connect() as conn:  # the lock's holder, as the database sees it
            holder = await conn.scalar(
                text(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid::bigint = :ns"
                    " AND objid::bigint = :key AND objsubid = 2 AND granted"
                ),
                {"ns": NAMESPACE, "key": lock_key(first.incarnation)},
            )
            assert holder == cut.liveness.pid
            assert await conn.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": holder})

        async def told() -> bool:
            return bool(lost)

        await eventually(told, "the replica told that its lock is gone")
        assert lost == [False]  # fenced by the time its owner hears of it: no new turn may start

        async def reaped() -> bool:
            return (await last_reply(other, sid))[0] == "interrupted"

        await eventually(reaped, "the other replica reaping the old incarnation")
        # The old turn's writes no longer land: its progress is refused (it stops), its final write too.
        assert await cut.save_progress({rid: ("after", 2)}) == {rid}
        done = await cut.finish_reply(
            rid,
            content="after, finished",
            status="complete",
            finish_reason="stop",
            prompt_tokens=1,
            cached_tokens=0,
            completion_tokens=3,
            ttft_ms=1.0,
            tokens_per_s=1.0,
        )
        assert done is None and await last_reply(other, sid) == ("interrupted", "before")
        assert await other.leases.take(sid, "other") is not None

        async def rejoined() -> bool:
            return victim.holding and victim.member is not None and victim.member.incarnation != first.incarnation

        await eventually(rejoined, "the fenced replica joining again under a new lock")
        assert {r["name"]: r["alive"] for r in await other.leases.replicas()} == {"cut": True, "other": True}
    finally:
        await survivor.stop()
        await victim.stop()
