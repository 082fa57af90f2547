"""Failures the real server can't be made to show on demand, in-process: the app (create_app) on the real
default model with one fault injected per test: a model step that raises, an engine that reports a full
queue, a request body cut short. Plus the conversation rendering around failed replies."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from app.config import Settings
from app.domain.prompt import render
from app.main import create_app
from app.store.records import MessageRecord, SessionRecord
from engine import Engine, EngineOverloaded

SECRET = "secret-detail-4711"


@pytest.fixture(scope="module")
async def engine():
    eng = await asyncio.to_thread(Engine.load, "default")
    yield eng
    await eng.shutdown()


@pytest.fixture(scope="module")
async def client(engine: Engine, tmp_path_factory: pytest.TempPathFactory):
    db = tmp_path_factory.mktemp("faults") / "forge.db"
    app = create_app(Settings(database_url=f"sqlite+aiosqlite:///{db}", log_level="info"), engine=engine)
    async with AsyncTestClient(app, timeout=120, base_url="http://127.0.0.1:8000") as c:
        yield c


@pytest.fixture
def failing_model(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(inputs: Any) -> Any:
        raise RuntimeError(SECRET)

    monkeypatch.setattr(engine.core.runner, "run", broken)


def sse_data(text: str) -> list[Any]:
    return [
        json.loads(line[6:]) if line[6:] != "[DONE]" else "[DONE]"
        for line in text.splitlines()
        if line.startswith("data: ")
    ]


CHAT = {"model": "default", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def test_engine_failure_details_stay_in_the_log_when_a_model_step_raises(
    client: AsyncTestClient, failing_model: None, caplog: pytest.LogCaptureFixture
) -> None:
    sid = (await client.post("/api/sessions", json={})).json()["id"]
    r = await client.post(f"/api/sessions/{sid}/messages", json={"content": "Hello"})
    events = sse_data(r.text)
    error = next(e for e in events if e["type"] == "error")
    assert (error["code"], error["message"]) == ("internal", "generation failed")
    assert events[-1]["type"] == "done" and events[-1]["status"] == "error"

    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 500 and r.json()["error"]["message"] == "generation failed"
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    chunks = sse_data(r.text)
    assert chunks[-1] == "[DONE]" and chunks[-2]["error"]["message"] == "generation failed"
    assert SECRET not in r.text
    assert any(SECRET in rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR)


@pytest.mark.parametrize(
    "path, body",
    [
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/completions", {"model": "default", "prompt": "Hi", "stream": True}),
        ("/v1/chat/completions", CHAT),
    ],
)
async def test_a_full_queue_is_a_503_before_any_stream_when_the_engine_refuses_admission(
    client: AsyncTestClient, engine: Engine, monkeypatch: pytest.MonkeyPatch, path: str, body: dict
) -> None:
    def full(request: Any) -> Any:
        raise EngineOverloaded("4 requests are already waiting")

    monkeypatch.setattr(engine, "generate", full)
    r = await client.post(path, json=body)
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
    sid = (await client.post("/api/sessions", json={})).json()["id"]
    r = await client.post(f"/api/sessions/{sid}/messages", json={"content": "Hello"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
    assert (await client.get(f"/api/sessions/{sid}")).json()["messages"] == []  # nothing stored


async def test_a_body_cut_short_is_not_logged_as_an_error(
    client: AsyncTestClient, caplog: pytest.LogCaptureFixture
) -> None:
    messages = [{"type": "http.request", "body": b'{"model": "def', "more_body": True}, {"type": "http.disconnect"}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(_: dict[str, Any]) -> None:
        pass

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"host", b"127.0.0.1")],
        "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 1),
        "root_path": "",
        "state": {},
    }
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="forge"):
        await client.app(scope, receive, send)
    assert any("client left" in rec.getMessage() for rec in caplog.records)
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]


def _message(role: str, content: str, status: str = "complete") -> MessageRecord:
    return MessageRecord("m", "s", None, 0, role, content, status, *[None] * 8, "")


def test_a_failed_reply_drops_the_question_it_answered(engine: Engine) -> None:
    history = [
        _message("user", "first"),
        _message("assistant", "", "error"),
        _message("user", "second"),
        _message("assistant", "ok"),
        _message("user", "third"),
    ]
    session = SessionRecord("s", "t", None, None, {}, "", "")  # no system prompt
    assert render(engine, session, history) == engine.render_chat(
        [
            {"role": "user", "content": "second"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "third"},
        ]
    )
