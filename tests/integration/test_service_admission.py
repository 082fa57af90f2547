"""Admission that queues (app/domain/admission.py), from outside: one key sends more generations at once than the
old per-key cap allowed and all of them finish (the shared server); past capacity requests wait with
keep-alives, and only a full queue (429) or a passed deadline (503, the WebSocket `error` with
`retry_after_s`) refuses, with `Retry-After` — on an anonymous server whose per-key cap of 1 makes one
running generation fill it (the queue's fairness is tested on the class, tests/unit/test_admission.py)."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect

from app.store import Store
from tests.integration.conftest import API_KEY, ServerProcess

TIMEOUT = 120
QUEUE_TIMEOUT_S = 3.0
# The holder must outlast the test: no end-of-text tokens, the whole context to fill.
NO_EOS = {"0": -100, "1": -100, "2": -100}


async def test_one_key_runs_many_generations_at_once_and_all_finish(server: ServerProcess) -> None:
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=TIMEOUT)

    async def one(i: int) -> tuple[str, str | None]:
        stream = await client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": f"Say a word about the number {i}."}],
            max_tokens=4,
            temperature=0,
            stream=True,
        )
        text, reason = [], None
        async for chunk in stream:
            if chunk.choices:
                text.append(chunk.choices[0].delta.content or "")
                reason = chunk.choices[0].finish_reason or reason
        return "".join(text), reason

    results = await asyncio.gather(*(one(i) for i in range(40)))  # the old cap refused all but 16 of these
    assert all(reason in ("stop", "length") for _, reason in results)
    assert sum(bool(text) for text, _ in results) == 40
    await client.close()


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("admission")
    srv = ServerProcess(
        db_path=tmp / "forge.db",
        log_path=tmp / "server.log",
        api_key=None,
        env={
            "FORGE_MAX_CONCURRENT_PER_KEY": "1",
            "FORGE_QUEUE_SIZE": "3",
            "FORGE_QUEUE_TIMEOUT_S": str(QUEUE_TIMEOUT_S),
        },
    ).start()
    yield srv
    srv.stop()


def metric(srv: ServerProcess, name: str, **labels: str) -> float:
    """The sample `name` with `labels`: the server's one model's (each series carries its `model`)."""
    text = httpx.get(srv.url + "/metrics", headers=srv.admin_headers(), timeout=10).text
    found = [
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and "model" in s.labels and labels.items() <= s.labels.items()
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


async def until_depth(srv: ServerProcess, depth: int) -> None:
    for _ in range(2000):
        seen = metric(srv, "forge_admission_queue_depth")
        if seen == depth:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the queue never held {depth} (holds {seen})")


async def until_in_use(srv: ServerProcess, units: int) -> None:
    for _ in range(2000):
        seen = metric(srv, "forge_admission_in_use")
        if seen == units:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"admission never held {units} (holds {seen})")


def chat_body(stream: bool, **extra) -> dict:
    return {
        "model": "default",
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "max_tokens": 4,
        "stream": stream,
        **extra,
    }


async def sse_lines(response: httpx.Response):  # type: ignore[no-untyped-def]
    async for line in response.aiter_lines():
        if line:
            yield line


async def test_past_capacity_requests_wait_and_only_a_full_queue_or_the_deadline_refuses(capped) -> None:
    srv = capped
    http = httpx.AsyncClient(base_url=srv.url, timeout=TIMEOUT)
    holder_cm = http.stream(
        "POST", "/v1/chat/completions", json=chat_body(True, max_tokens=8000, logit_bias=NO_EOS, temperature=0)
    )
    holder = await holder_cm.__aenter__()
    assert holder.status_code == 200
    holder_lines = sse_lines(holder)
    assert (await anext(holder_lines)).startswith("data: ")  # admitted: the key's one place is taken
    try:
        # Three streams wait in the queue: 200 at once, keep-alive comments while they wait.
        waiters, waiter_cms = [], []
        for _ in range(3):
            cm = http.stream("POST", "/v1/chat/completions", json=chat_body(True))
            resp = await cm.__aenter__()
            assert resp.status_code == 200
            lines = sse_lines(resp)
            assert await anext(lines) == ": keep-alive"
            waiters.append(lines)
            waiter_cms.append(cm)
        await until_depth(srv, 3)

        # The queue is full: 429 with Retry-After and an OpenAI-style body; nothing waits for it.
        full = await http.post("/v1/chat/completions", json=chat_body(False))
        assert full.status_code == 429 and int(full.headers["Retry-After"]) >= 1
        assert full.json()["error"]["code"] == "queue_full" and full.json()["error"]["type"] == "rate_limit_error"
        full_stream = await http.post("/v1/completions", json={"model": "default", "prompt": "Hi", "stream": True})
        assert full_stream.status_code == 429 and "Retry-After" in full_stream.headers

        # Clients that leave while queued leave the queue: there is room for two more.
        for _ in range(2):
            await waiter_cms.pop(0).__aexit__(None, None, None)
            waiters.pop(0)
        await until_depth(srv, 1)

        # Past the deadline: 503 with Retry-After (plain), an `error` with retry_after_s (WebSocket, nothing
        # stored), the error chunk then [DONE] (a stream that had started with keep-alives).
        async def plain() -> httpx.Response:
            return await http.post("/v1/chat/completions", json=chat_body(False))

        async def socket() -> tuple[dict, list]:
            sid = (await http.post("/api/sessions", json={})).json()["id"]
            async with connect(srv.ws_url) as ws:
                await ws.send(
                    json.dumps({"type": "message.send", "session_id": sid, "content": "Hello", "client_id": "c1"})
                )
                event = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
            return event, (await http.get(f"/api/sessions/{sid}")).json()["messages"]

        async def rest(lines) -> list[str]:  # type: ignore[no-untyped-def]
            return [line async for line in lines if line != ": keep-alive"]

        late, (event, stored), tail = await asyncio.gather(plain(), socket(), rest(waiters[0]))
        assert late.status_code == 503 and int(late.headers["Retry-After"]) >= 1
        assert late.json()["error"]["code"] == "queue_timeout"
        assert event["type"] == "error" and event["code"] == "queue_timeout" and event["client_id"] == "c1"
        assert isinstance(event["retry_after_s"], int) and event["retry_after_s"] >= 1
        assert stored == []  # a refused turn stores nothing
        assert json.loads(tail[0].removeprefix("data: "))["error"]["code"] == "queue_timeout"
        assert tail[1:] == ["data: [DONE]"]
        assert metric(srv, "forge_admission_refused_total", reason="queue_timeout") >= 3
        await waiter_cms[0].__aexit__(None, None, None)

        # The official client waits through keep-alives and gets its answer once the place frees.
        client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=TIMEOUT)
        stream = await client.chat.completions.create(**chat_body(True))
        await until_depth(srv, 1)
        await holder_cm.__aexit__(None, None, None)  # the holder leaves: its place goes to the waiter
        holder_cm = None
        reasons = [c.choices[0].finish_reason async for c in stream if c.choices]
        assert reasons[-1] in ("stop", "length")
        await client.close()
    finally:
        if holder_cm is not None:
            await holder_cm.__aexit__(None, None, None)
        await http.aclose()


async def test_a_turn_stopped_while_queued_leaves_the_queue_and_stores_nothing(capped) -> None:
    srv = capped
    http = httpx.AsyncClient(base_url=srv.url, timeout=TIMEOUT)
    holder_cm = http.stream(
        "POST", "/v1/chat/completions", json=chat_body(True, max_tokens=8000, logit_bias=NO_EOS, temperature=0)
    )
    holder = await holder_cm.__aenter__()
    try:
        holder_lines = sse_lines(holder)  # kept: a collected generator would close the stream
        assert (await anext(holder_lines)).startswith("data: ")  # the key's one place is taken
        sid = (await http.post("/api/sessions", json={})).json()["id"]
        async with connect(srv.ws_url) as ws:
            await ws.send(
                json.dumps({"type": "message.send", "session_id": sid, "content": "Hello", "client_id": "c1"})
            )
            await until_depth(srv, 1)
            await ws.send(json.dumps({"type": "generation.cancel", "session_id": sid, "client_id": "c2"}))
            event = json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))
            assert event == {"type": "generation.cancelled", "session_id": sid, "message_id": None, "client_id": "c2"}
            await until_depth(srv, 0)
        assert (await http.get(f"/api/sessions/{sid}")).json()["messages"] == []
    finally:
        await holder_cm.__aexit__(None, None, None)
        await http.aclose()


async def _until_no_slots(store: Store) -> None:
    """Until the anonymous key holds no slot (released by the server's tasks), at most 30 s."""
    for _ in range(3000):
        if await store.key_slots.held("") == 0:
            return
        await asyncio.sleep(0.01)
    assert await store.key_slots.held("") == 0


async def test_the_per_key_cap_counts_other_replicas_generations(capped) -> None:
    """A generation of the key on another replica (its slot in the shared database) fills the cap of 1: a
    request waits, then runs once that slot is released."""
    srv = capped
    other = Store(srv.db_url)
    try:
        # The earlier tests' generations give their slots back from a task after their answers: wait for that.
        await _until_no_slots(other)
        slot = await other.key_slots.take("", "another-replica", 1, 1)  # "": the owner on a server without keys
        assert slot is not None
        async with httpx.AsyncClient(base_url=srv.url, timeout=TIMEOUT) as http:
            waiting = asyncio.create_task(http.post("/v1/chat/completions", json=chat_body(False)))
            await until_in_use(srv, 1)  # this replica's queue granted it: now it waits for the key's slot ...
            assert not waiting.done()  # ... which the other replica holds, though the engine is free
            assert srv.stats()["engine"]["running"] == 0
            await other.key_slots.release(slot)
            answer = await waiting
        assert answer.status_code == 200 and answer.json()["choices"][0]["finish_reason"] in ("stop", "length")
        await _until_no_slots(other)  # its own slot goes back at the end (a task releases it)
    finally:
        await other.close()
