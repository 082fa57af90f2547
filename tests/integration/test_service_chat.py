"""ChatService in-process with the real model: the paths a shared server can't reach on demand (a full
engine queue, a database write that fails), each through a real seam."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.domain.admission import Admission
from app.domain.chat import ChatService
from app.domain.errors import ServiceError
from app.metrics import Metrics
from app.store import Store
from app.store.migrate import upgrade
from engine import Engine, GenerationRequest, SamplingParams

ME = "owner"
GREEDY = {"temperature": 0, "top_p": 1.0, "max_tokens": 4}


@pytest.fixture(scope="module")
async def tight_engine():
    """One running sequence at a time and one waiting slot: easy to fill."""
    engine = await asyncio.to_thread(Engine.load, "default", kv_memory="64MiB", max_waiting=1, max_num_seqs=1)
    yield engine
    await engine.shutdown()


@pytest.fixture
async def store(tmp_path: Path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}"
    await asyncio.to_thread(upgrade, url)
    s = Store(url)
    yield s
    await s.close()


async def run_turn(chat: ChatService, sid: str, content: str, **kw) -> list:
    events: list = []
    turn = await chat.send(sid, ME, content, sink=events.append, **kw)
    if turn is not None:
        await asyncio.wait_for(turn.task, 120)
    return events


async def test_turns_the_engine_refuses_are_refused_before_anything_is_stored(
    tight_engine: Engine, store: Store
) -> None:
    chat = ChatService(tight_engine, store, Metrics())
    sid = (await store.create_session(ME, "New chat", None, GREEDY)).id
    events = await run_turn(chat, sid, "Hello there")
    assert events[-2]["type"] == "done" and events[-2]["status"] == "complete"
    before = await store.get_history(sid, ME)
    assert before is not None and before[0].title == "Hello there" and len(before[1]) == 2

    prompt = tight_engine.render_chat([{"role": "user", "content": "Write a long story about a cat."}])
    running = tight_engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=300, temperature=0)))
    await anext(running)  # the only running slot
    waiting = tight_engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=300, temperature=0)))
    try:
        for start in (
            lambda sink: chat.send(sid, ME, "Another question", sink=sink),
            lambda sink: chat.edit(sid, ME, before[1][0].id, "An edited question", sink=sink),
            lambda sink: chat.regenerate(sid, ME, sink=sink),
        ):
            events = []
            with pytest.raises(ServiceError) as refused:
                await start(events.append)
            assert refused.value.code == "overloaded" and events == []
            assert await store.get_history(sid, ME) == before  # exactly as it was: messages, title, times
            assert sid not in chat.turns and chat.admission.in_use == 0
    finally:
        await running.aclose()
        await waiting.aclose()

    for _ in range(1000):  # the aborts reach the engine within a step
        stats = tight_engine.stats()
        if stats["waiting"] == 0 and stats["running"] == 0:
            break
        await asyncio.sleep(0.01)
    events = await run_turn(chat, sid, "Another question")
    assert events[-2]["type"] == "done" and events[-2]["status"] == "complete"
    _, messages = await store.get_history(sid, ME)  # type: ignore[misc]
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]


@pytest.mark.parametrize("failures", [1, 99])
async def test_a_failed_final_save_is_told_and_stored_when_the_store_raises(
    tight_engine: Engine, store: Store, monkeypatch: pytest.MonkeyPatch, failures: int
) -> None:
    real = store.finish_reply
    calls = []

    async def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) <= failures:
            raise OSError("disk I/O error")
        return await real(*args, **kwargs)

    monkeypatch.setattr(store, "finish_reply", flaky)
    chat = ChatService(tight_engine, store, Metrics())
    sid = (await store.create_session(ME, "t", None, GREEDY)).id
    events = await run_turn(chat, sid, "Hello")
    done = events[-2]
    stored = (await store.get_history(sid, ME))[1][-1]  # type: ignore[index]
    assert done["type"] == "done" and stored.id == done["message_id"]
    if failures == 1:  # the retry stored it
        assert done["status"] == stored.status == "complete"
    else:  # the client hears that the reply is lost, and the database says the same
        assert events[-3]["type"] == "error" and events[-3]["code"] == "internal"
        assert done["status"] == stored.status == "error"


async def test_a_repeated_idempotency_key_stores_the_message_once(tight_engine: Engine, store: Store) -> None:
    chat = ChatService(tight_engine, store, Metrics())
    sid = (await store.create_session(ME, "t", None, GREEDY)).id
    first = await run_turn(chat, sid, "Hello", idempotency_key="k-1", client_id="a")
    again = await run_turn(chat, sid, "Hello", idempotency_key="k-1", client_id="b")
    _, messages = await store.get_history(sid, ME)  # type: ignore[misc]
    assert [m.role for m in messages] == ["user", "assistant"]
    assert again == [
        {"type": "history", "session_id": sid, "messages": [m.to_dict() for m in messages], "client_id": "b"},
        None,
    ]
    assert first[-2]["message_id"] == messages[1].id
    other = await run_turn(chat, sid, "Hello", idempotency_key="k-2")
    assert other[-2]["status"] == "complete"
    assert len((await store.get_history(sid, ME))[1]) == 4  # type: ignore[index]


@pytest.fixture
async def engine4():
    """Room for the admission's four places, so only admission decides who runs."""
    engine = await asyncio.to_thread(Engine.load, "default", kv_memory="64MiB", max_num_seqs=4)
    yield engine
    await engine.shutdown()


async def test_the_per_key_cap_queues_a_keys_extra_turns(engine4: Engine, store: Store) -> None:
    chat = ChatService(engine4, store, Metrics(), Admission(capacity=4, per_owner=1))
    a = (await store.create_session(ME, "a", None, dict(GREEDY, max_tokens=50))).id
    b = (await store.create_session(ME, "b", None, GREEDY)).id
    turn = await chat.send(a, ME, "Count to fifty.", sink=lambda ev: None)
    queued = asyncio.Event()
    b_events: list = []
    waiting = asyncio.ensure_future(chat.send(b, ME, "Hello", sink=b_events.append, queued=queued.set))
    await asyncio.wait_for(queued.wait(), 120)  # over the key's cap: it waits, nothing stored yet
    assert not waiting.done() and b_events == [] and (await store.get_history(b, ME))[1] == []  # type: ignore[index]
    other_owner = (await store.create_session("someone-else", "c", None, GREEDY)).id
    events: list = []
    t2 = await chat.send(other_owner, "someone-else", "Hello", sink=events.append)  # another key is not limited
    chat.cancel(a, ME)
    t3 = await asyncio.wait_for(waiting, 120)  # the key's place came back: admitted
    await asyncio.wait_for(asyncio.gather(turn.task, t2.task, t3.task), 120)
    assert events[-2]["status"] == "complete" and b_events[-2]["status"] == "complete"
    assert chat.admission.in_use == 0 and chat.admission.depth == 0
