"""ChatService in-process with the real model: the paths a shared server can't reach on demand."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.chat import ChatService
from app.metrics import Metrics
from app.store import Store
from app.store.migrate import upgrade
from engine import Engine, GenerationRequest, SamplingParams


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


async def test_turns_the_engine_refuses_leave_nothing_stored(tight_engine: Engine, store: Store) -> None:
    # The service's own queue check passes (limit 1000); the engine's (limit 1) refuses.
    chat = ChatService(tight_engine, store, Metrics(), max_waiting=1000)
    session = await store.create_session("New chat", None, {"temperature": 0, "top_p": 1.0, "max_tokens": 4})
    sid = session["id"]
    events: list = []
    turn = await chat.send(sid, "Hello there", sink=events.append)
    await asyncio.wait_for(turn.task, 120)
    assert events[-2]["type"] == "done" and events[-2]["status"] == "complete"
    before = await store.get_history(sid)
    assert before is not None and before[0]["title"] == "Hello there" and len(before[1]) == 2

    prompt = tight_engine.render_chat([{"role": "user", "content": "Write a long story about a cat."}])
    busy = [tight_engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=300, temperature=0)))
            for _ in range(2)]
    await anext(busy[0])  # running, the only slot
    queued = asyncio.create_task(anext(busy[1]))  # waiting behind it
    try:
        for _ in range(500):
            if tight_engine.stats()["waiting"] == 1:
                break
            await asyncio.sleep(0.01)
        assert tight_engine.stats()["waiting"] == 1

        refused = []
        for start in (lambda sink: chat.send(sid, "Another question", sink=sink),
                      lambda sink: chat.edit(sid, before[1][0]["id"], "An edited question", sink=sink),
                      lambda sink: chat.regenerate(sid, sink=sink)):
            events = []
            turn = await start(events.append)
            await asyncio.wait_for(turn.task, 60)
            refused.append(events)
            assert await store.get_history(sid) == before  # exactly as it was: messages, title, times
            assert sid not in chat.turns
    finally:
        queued.cancel()
        await asyncio.gather(queued, return_exceptions=True)
        for gen in busy:
            await gen.aclose()

    for events in refused:
        assert events[-1] is None  # the sink was told the turn is over
        kinds = [e["type"] for e in events[:-1]]
        assert "message.created" in kinds and kinds[-1] == "error" and "done" not in kinds
        assert events[-2]["code"] == "overloaded" and events[-2]["message_id"]

    # With room again (the aborts reach the engine within a step), the turn goes through.
    for _ in range(1000):
        stats = tight_engine.stats()
        if stats["waiting"] == 0 and stats["running"] == 0:
            break
        await asyncio.sleep(0.01)
    events = []
    turn = await chat.send(sid, "Another question", sink=events.append)
    await asyncio.wait_for(turn.task, 120)
    assert events[-2]["type"] == "done" and events[-2]["status"] == "complete"
    _, messages = await store.get_history(sid)  # type: ignore[misc]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
