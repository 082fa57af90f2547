"""The WebSocket protocol (/ws) with the `websockets` client against the real server and model."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from engine import Engine, GenerationRequest, SamplingParams
from tests.integration.conftest import OTHER_KEY, ServerProcess, wait_idle, wait_reply_grows

TIMEOUT = 180.0
GREEDY = {"temperature": 0, "max_tokens": 12}


@pytest.fixture(scope="module")
async def cold_engine():
    """A second engine in this process whose prefix cache is empty: the "cold run" reference."""
    engine = await asyncio.to_thread(Engine.load, "default")
    yield engine
    await engine.shutdown()


async def cold_reply(engine: Engine, messages: list[dict[str, str]], max_tokens: int) -> tuple[str, int]:
    # Forget the earlier turns' blocks: this run computes every prompt token.
    await engine.reset_prefix_cache()
    prompt = engine.render_chat(messages)
    text = []
    req = GenerationRequest(prompt, SamplingParams(max_tokens=max_tokens, temperature=0))
    async for ev in engine.generate(req):
        text.append(ev.text)
        if ev.final:
            assert ev.usage.cached_tokens == 0  # really cold
    return "".join(text), len(prompt)


async def recv(ws: ClientConnection) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def recv_until(ws: ClientConnection, kind: str, session_id: str | None = None) -> list[dict[str, Any]]:
    """Events up to and including the first of type `kind` (for `session_id`, when given)."""
    events = []
    while True:
        ev = await recv(ws)
        events.append(ev)
        if ev["type"] == kind and (session_id is None or ev.get("session_id") == session_id):
            return events


async def create_session(ws: ClientConnection, **fields: Any) -> dict[str, Any]:
    await ws.send(json.dumps({"type": "session.create", **fields}))
    ev = await recv(ws)
    assert ev["type"] == "session", ev
    return ev["session"]


def deltas_text(events: list[dict[str, Any]], message_id: str) -> str:
    return "".join(e["text"] for e in events if e["type"] == "delta" and e["message_id"] == message_id)


def stored(server: ServerProcess, session_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{server.url}/api/sessions/{session_id}", timeout=30, headers=server.auth)
    r.raise_for_status()
    return r.json()["messages"]


async def test_three_turns_reuse_the_cache_and_match_a_cold_run(server: ServerProcess, cold_engine: Engine) -> None:
    questions = ["What is the capital of France?", "And what is the capital of Germany?", "Which of the two is bigger?"]
    history: list[dict[str, str]] = []
    async with connect(server.ws_url, additional_headers=server.auth) as ws:
        session = await create_session(ws, settings=GREEDY)
        sid = session["id"]
        for turn, question in enumerate(questions):
            await ws.send(json.dumps({"type": "message.send", "session_id": sid, "content": question}))
            events = await recv_until(ws, "done", sid)
            created = [e for e in events if e["type"] == "message.created"]
            assert [(e["message"]["role"], e["message"]["status"]) for e in created] == [
                ("user", "complete"),
                ("assistant", "streaming"),
            ]
            assert created[0]["message"]["content"] == question
            reply_id = created[1]["message"]["id"]
            assert all(e["session_id"] == sid for e in events if e["type"] != "session")
            done = events[-1]
            assert done["message_id"] == reply_id and done["status"] == "complete"
            text = deltas_text(events, reply_id)
            history.append({"role": "user", "content": question})
            expected, prompt_len = await cold_reply(cold_engine, history, GREEDY["max_tokens"])
            assert text == expected, f"turn {turn + 1}: warm reply differs from a cold run"
            assert done["usage"]["prompt_tokens"] == prompt_len
            if turn > 0:
                assert done["usage"]["cached_tokens"] > 0, f"turn {turn + 1} did not reuse the history's KV blocks"
            history.append({"role": "assistant", "content": text})

    messages = stored(server, sid)
    assert [(m["role"], m["content"]) for m in messages] == [(h["role"], h["content"]) for h in history]
    replies = [m for m in messages if m["role"] == "assistant"]
    assert all(m["status"] == "complete" and m["completion_tokens"] > 0 for m in replies)
    assert replies[1]["cached_tokens"] > 0 and replies[2]["cached_tokens"] > 0


async def test_cancel_mid_reply_stores_a_stopped_partial(server: ServerProcess) -> None:
    async with connect(server.ws_url, additional_headers=server.auth) as ws:
        sid = (await create_session(ws, settings={"temperature": 0, "max_tokens": 400}))["id"]
        await ws.send(
            json.dumps(
                {
                    "type": "message.send",
                    "session_id": sid,
                    "content": "Write a very long story about a dragon who learns to cook.",
                }
            )
        )
        events = []
        while sum(e["type"] == "delta" for e in events) < 3:
            events.append(await recv(ws))
        await ws.send(json.dumps({"type": "generation.cancel", "session_id": sid, "client_id": "c1"}))
        events += await recv_until(ws, "done", sid)
    done = events[-1]
    assert (done["status"], done["finish_reason"]) == ("stopped", "abort")
    assert 3 <= done["usage"]["completion_tokens"] < 400
    reply_id = done["message_id"]
    text = deltas_text(events, reply_id)
    reply = stored(server, sid)[-1]
    assert (reply["id"], reply["status"], reply["content"]) == (reply_id, "stopped", text)
    assert text


async def test_malformed_messages_get_errors_and_the_socket_keeps_working(server: ServerProcess) -> None:
    async with connect(server.ws_url, additional_headers=server.auth) as ws:
        bad = [
            ("{not json", "bad_request", None),
            ("[1, 2]", "bad_request", None),
            (json.dumps({"no": "type"}), "bad_request", "type"),
            (json.dumps({"type": "launch.rocket"}), "bad_request", "type"),
            (json.dumps({"type": "message.send", "session_id": 42, "content": "x"}), "bad_request", "session_id"),
            (json.dumps({"type": "message.send", "session_id": "0" * 32, "content": "x"}), "not_found", "session_id"),
            (
                json.dumps({"type": "session.create", "settings": {"temperature": 9}}),
                "invalid_parameter",
                "settings.temperature",
            ),
            (json.dumps({"type": "session.open", "session_id": "nope", "extra": 1}), "bad_request", "extra"),
        ]
        for raw, code, param in bad:
            await ws.send(raw)
            ev = await recv(ws)
            assert ev["type"] == "error" and ev["code"] == code, (raw, ev)
            assert ev.get("param") == param, (raw, ev)
            assert ev["message"]
        await ws.send(b'{"type": "ping"}')  # binary frame
        assert (await recv(ws))["code"] == "bad_request"
        await ws.send(json.dumps({"type": "ping", "client_id": "p1"}))
        assert await recv(ws) == {"type": "pong", "client_id": "p1"}
        session = await create_session(ws, title="still works")
        await ws.send(json.dumps({"type": "session.open", "session_id": session["id"]}))
        assert (await recv(ws))["type"] == "session"
        history = await recv(ws)
        assert history == {"type": "history", "session_id": session["id"], "messages": []}


async def test_oversized_frame_closes_with_1009(server: ServerProcess) -> None:
    async with connect(server.ws_url, max_size=None, additional_headers=server.auth) as ws:
        await ws.send(json.dumps({"type": "message.send", "session_id": "x", "content": "a" * (1 << 20)}))
        with pytest.raises(ConnectionClosed) as exc:
            await recv(ws)
    assert exc.value.rcvd is not None and exc.value.rcvd.code == 1009
    r = httpx.get(server.url + "/health", timeout=10)
    assert r.status_code == 200


async def test_one_socket_drives_two_sessions_and_busy_is_refused(server: ServerProcess) -> None:
    async with connect(server.ws_url, additional_headers=server.auth) as ws:
        a = (await create_session(ws, settings={"temperature": 0, "max_tokens": 6}))["id"]
        b = (await create_session(ws, settings={"temperature": 0, "max_tokens": 6}))["id"]
        await ws.send(
            json.dumps({"type": "message.send", "session_id": a, "content": "Name a colour.", "client_id": "A"})
        )
        await ws.send(
            json.dumps({"type": "message.send", "session_id": b, "content": "Name a fruit.", "client_id": "B"})
        )
        await ws.send(json.dumps({"type": "message.send", "session_id": a, "content": "again", "client_id": "A2"}))
        events, done = [], set()
        while len(done) < 2:
            ev = await recv(ws)
            events.append(ev)
            if ev["type"] == "done":
                done.add(ev["session_id"])
    assert done == {a, b}
    busy = [e for e in events if e["type"] == "error"]
    assert [(e["code"], e["session_id"], e["client_id"]) for e in busy] == [("busy", a, "A2")]
    for ev in events:
        if ev["type"] in ("delta", "done", "message.created"):
            assert ev["session_id"] in (a, b)
            assert ev["client_id"] == ("A" if ev["session_id"] == a else "B")
    for sid in (a, b):
        msgs = stored(server, sid)
        assert [m["role"] for m in msgs] == ["user", "assistant"] and msgs[1]["status"] == "complete"


async def test_regenerate_and_edit_keep_branches_and_the_chosen_one_is_the_prompt(
    server: ServerProcess, cold_engine: Engine
) -> None:
    settings = {"temperature": 0, "max_tokens": 8}
    async with connect(server.ws_url, additional_headers=server.auth) as ws:
        sid = (await create_session(ws, settings=settings))["id"]
        await ws.send(json.dumps({"type": "message.send", "session_id": sid, "content": "What is 2 + 2?"}))
        first = await recv_until(ws, "done", sid)
        user_id, r1 = first[0]["message"]["id"], first[1]["message"]["id"]
        first_text = deltas_text(first, r1)

        await ws.send(json.dumps({"type": "message.regenerate", "session_id": sid}))
        regen = await recv_until(ws, "done", sid)
        assert regen[0]["type"] == "history" and [m["id"] for m in regen[0]["messages"]] == [user_id]
        r2 = regen[1]["message"]
        assert regen[1]["type"] == "message.created" and r2["role"] == "assistant"
        assert (r2["parent_id"], r2["siblings"]) == (user_id, [r1, r2["id"]])  # the old reply is kept
        assert deltas_text(regen, r2["id"]) == first_text  # greedy: the same reply again

        await ws.send(
            json.dumps({"type": "message.edit", "session_id": sid, "message_id": user_id, "content": "What is 3 + 3?"})
        )
        edit = await recv_until(ws, "done", sid)
        (edited,) = edit[0]["messages"]
        assert edit[0]["type"] == "history" and edited["content"] == "What is 3 + 3?"
        assert edited["siblings"] == [user_id, edited["id"]]  # the old question is kept too
        await ws.send(
            json.dumps(
                {"type": "message.edit", "session_id": sid, "message_id": edit[-1]["message_id"], "content": "x"}
            )
        )
        err = await recv(ws)
        assert (err["type"], err["code"], err["param"]) == ("error", "invalid_parameter", "message_id")

        # back to the first question: below it, the regenerated reply is still the chosen one
        await ws.send(json.dumps({"type": "branch.select", "session_id": sid, "message_id": user_id, "client_id": "b"}))
        chosen = await recv(ws)
        assert (chosen["type"], chosen["client_id"]) == ("history", "b")
        assert [(m["id"], m["siblings"]) for m in chosen["messages"]] == [
            (user_id, [user_id, edited["id"]]),
            (r2["id"], [r1, r2["id"]]),
        ]
        async with connect(server.ws_url, additional_headers={"Authorization": f"Bearer {OTHER_KEY}"}) as theirs:
            await theirs.send(json.dumps({"type": "branch.select", "session_id": sid, "message_id": edited["id"]}))
            assert (await recv(theirs))["code"] == "not_found"
        assert stored(server, sid) == chosen["messages"]  # another key neither sees nor switches the branch

        # the next turn's prompt is the chosen branch: the same reply and prompt as a cold run of it
        await ws.send(json.dumps({"type": "message.send", "session_id": sid, "content": "And 2 + 3?"}))
        await ws.send(json.dumps({"type": "branch.select", "session_id": sid, "message_id": r1}))
        follow = await recv_until(ws, "done", sid)
        assert [e["code"] for e in follow if e["type"] == "error"] == ["busy"]  # no switching while it streams
        reply = follow[-1]
        expected, prompt_len = await cold_reply(
            cold_engine,
            [
                {"role": "user", "content": "What is 2 + 2?"},
                {"role": "assistant", "content": first_text},
                {"role": "user", "content": "And 2 + 3?"},
            ],
            settings["max_tokens"],
        )
        assert (deltas_text(follow, reply["message_id"]), reply["usage"]["prompt_tokens"]) == (expected, prompt_len)
    msgs = stored(server, sid)
    assert [m["id"] for m in msgs[:2]] == [user_id, r2["id"]] and [m["role"] for m in msgs[2:]] == ["user", "assistant"]
    export = httpx.get(f"{server.url}/api/sessions/{sid}/export", headers=server.auth, timeout=30).json()
    assert len(export["messages"]) == 7 and {r1, edited["id"]} <= {m["id"] for m in export["messages"]}


async def test_closing_the_socket_leaves_the_reply_running_until_stopped(server: ServerProcess) -> None:
    before = wait_idle(server)["engine"]["kv_blocks_used"]
    ws = await connect(server.ws_url, additional_headers=server.auth)
    sid = (await create_session(ws, settings={"temperature": 0, "max_tokens": 400}))["id"]
    await ws.send(
        json.dumps({"type": "message.send", "session_id": sid, "content": "Tell me a very long story about the sea."})
    )
    while (await recv(ws))["type"] != "delta":
        pass
    assert server.stats()["engine"]["running"] == 1
    await ws.close()
    await asyncio.to_thread(wait_reply_grows, server, sid)  # the reply goes on without its client ...
    assert server.stats()["engine"]["running"] == 1
    r = httpx.post(f"{server.url}/api/sessions/{sid}/cancel", headers=server.auth, timeout=30)
    assert r.json() == {"cancelled": True}  # ... until it is stopped
    after = wait_idle(server)
    assert after["engine"]["kv_blocks_used"] == before
    for _ in range(1200):  # up to a minute: the stored reply follows the abort, however busy the machine
        reply = stored(server, sid)[-1]
        if reply["status"] != "streaming":
            break
        await asyncio.sleep(0.05)
    assert reply["status"] == "stopped" and reply["finish_reason"] == "abort"
    assert 0 < reply["completion_tokens"] < 400


async def test_cancel_from_another_socket_is_acknowledged(server: ServerProcess) -> None:
    async with (
        connect(server.ws_url, additional_headers=server.auth) as owner,
        connect(server.ws_url, additional_headers=server.auth) as other,
    ):
        sid = (await create_session(owner, settings={"temperature": 0, "max_tokens": 400}))["id"]
        await owner.send(
            json.dumps(
                {"type": "message.send", "session_id": sid, "content": "Write a very long story about a lighthouse."}
            )
        )
        started = await recv_until(owner, "delta", sid)
        reply_id = started[1]["message"]["id"]
        await other.send(json.dumps({"type": "generation.cancel", "session_id": sid, "client_id": "k"}))
        assert await recv(other) == {
            "type": "generation.cancelled",
            "session_id": sid,
            "message_id": reply_id,
            "client_id": "k",
        }
        done = (await recv_until(owner, "done", sid))[-1]
    assert (done["message_id"], done["status"]) == (reply_id, "stopped")
