"""Branch select and session delete while the session's turn runs on ANOTHER replica (its session lease held by
another store on the same database): `busy`, as a concurrent turn here; another owner's session is not found;
once the lease is released both go through. The service never touches its engine here: a stub stands in."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from app.domain.admission import Admission
from app.domain.chat import ChatService
from app.domain.errors import ServiceError
from app.metrics import Metrics
from app.store import Store
from app.store.migrate import upgrade

ME = "owner-a"


@pytest.fixture
async def stores(database_url: str) -> AsyncIterator[tuple[Store, Store]]:
    upgrade(database_url)
    here, there = Store(database_url), Store(database_url)
    yield here, there
    await here.close()
    await there.close()


async def test_select_and_delete_refuse_while_another_replica_runs_the_turn(stores: tuple[Store, Store]) -> None:
    here, there = stores
    engine: Any = SimpleNamespace(max_num_seqs=4)
    chat = ChatService(engine, here, Metrics(), Admission(4), replica="r1")
    sid = (await here.create_session(ME, "t", None, {})).id
    started = await here.start_reply(sid, ME, parent_id=None, user_content="q", replica="r2")
    assert started is not None
    first = started[1][0].id
    lease = await there.leases.take(sid, "r2")  # a turn of the session runs on r2
    assert lease is not None
    for attempt in (chat.select(sid, ME, first), chat.delete_session(sid, ME)):
        with pytest.raises(ServiceError) as e:
            await attempt
        assert e.value.code == "busy" and e.value.param == "session_id"
    with pytest.raises(ServiceError) as e:
        await chat.delete_session(sid, "someone-else")
    assert e.value.code == "not_found"
    assert await here.leases.holder(sid) == "r2"  # the refusals took nothing
    await there.leases.release(lease)
    session, branch = await chat.select(sid, ME, first)
    assert session.id == sid and branch[0].id == first
    assert await chat.delete_session(sid, ME) is True
    assert await here.get_session(sid, ME) is None
    assert await here.leases.holder(sid) is None
