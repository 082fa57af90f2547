"""Bounded per client: the command rate and the sessions one socket may watch (shared server), and a
WebSocket reader that stops reading (its own server with a small outbox): its turn is stopped and
stored "stopped", its socket closed with 4008, and the server goes on serving everyone else."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.integration.conftest import ServerProcess

TIMEOUT = 120


async def recv(ws) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(await asyncio.wait_for(ws.recv(), TIMEOUT))


async def test_commands_past_the_rate_are_refused_and_the_socket_stays_usable(server: ServerProcess) -> None:
    async with connect(server.ws_url, additional_headers=server.auth) as ws:
        for i in range(100):  # far above 20/s with bursts of 40
            await ws.send(json.dumps({"type": "ping", "client_id": str(i)}))
        answers = [await recv(ws) for _ in range(100)]
        limited = [a for a in answers if a["type"] == "error"]
        assert limited and all(a["code"] == "rate_limited" for a in limited)
        assert len(limited) < 100 and [a["client_id"] for a in answers] == [str(i) for i in range(100)]
        await asyncio.sleep(1.0)
        await ws.send(json.dumps({"type": "ping"}))
        assert await recv(ws) == {"type": "pong"}


async def test_one_socket_watches_a_bounded_number_of_sessions(server: ServerProcess) -> None:
    async with connect(server.ws_url, additional_headers=server.auth) as ws:
        answers = []
        for i in range(66):
            await ws.send(json.dumps({"type": "session.create", "title": f"s{i}"}))
            answers.append(await recv(ws))
            await asyncio.sleep(0.05)  # within the command rate
        assert [a["type"] for a in answers[:64]] == ["session"] * 64
        assert [(a["type"], a["code"]) for a in answers[64:]] == [("error", "rate_limited")] * 2


@pytest.fixture(scope="module")
def small_outbox(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("outbox")
    srv = ServerProcess(
        db_path=tmp / "forge.db",
        log_path=tmp / "server.log",
        env={"FORGE_OUTBOX_EVENTS": "16", "FORGE_WS_COMMANDS_PER_S": "100000", "FORGE_DETACHED_TURN_S": "0"},
    ).start()
    yield srv
    srv.stop()


def _tiny_window(port: int) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the server's writes back up quickly
    s.connect(("127.0.0.1", port))
    return s


async def test_a_reader_that_stops_reading_is_cut_off(small_outbox: ServerProcess) -> None:
    srv = small_outbox
    http = httpx.AsyncClient(base_url=srv.url, headers=srv.auth, timeout=60)
    sid = (await http.post("/api/sessions", json={"settings": {"max_tokens": 400}})).json()["id"]
    slow = await connect(srv.ws_url, additional_headers=srv.auth, sock=_tiny_window(srv.port), max_queue=1)
    await slow.send(json.dumps({"type": "message.send", "session_id": sid, "content": "Write a long story."}))
    with pytest.raises(ConnectionClosed) as closed:
        for _ in range(40_000):  # every ping queues a pong that nobody reads; the server's close ends this
            await slow.send(json.dumps({"type": "ping", "client_id": "x" * 200}))
        while True:  # what was already on the way, then the close frame
            await asyncio.wait_for(slow.recv(), TIMEOUT)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 4008
    for _ in range(1200):  # up to a minute: the stored reply follows the abort, however busy the machine
        reply = (await http.get(f"/api/sessions/{sid}")).json()["messages"][-1]
        if reply["status"] != "streaming":
            break
        await asyncio.sleep(0.05)
    assert (reply["status"], reply["finish_reason"]) == ("stopped", "abort")  # the turn was stopped and stored
    assert (await http.get("/health")).status_code == 200
    await http.aclose()
    async with connect(srv.ws_url, additional_headers=srv.auth) as ws:  # everyone else is served as before
        await ws.send(json.dumps({"type": "ping"}))
        assert await recv(ws) == {"type": "pong"}
