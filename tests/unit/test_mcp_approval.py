"""Approval of MCP calls in a message's rounds (app/domain/mcp/rounds.py): a session that asks has each call wait for
the user's decision (allow once, always allow, deny) unless its tool is allowed; Stop and a decision that never comes
end the wait with an error result."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from app.domain.mcp import rounds as rounds_module
from app.domain.mcp.rounds import DENIED, STOPPED, Rounds


def make(allowed: set[str] | None) -> tuple[Rounds, list[dict[str, Any] | None]]:
    """Rounds that only ask (no store, registry or turns behind them), and the events they send."""
    seen: list[dict[str, Any] | None] = []
    r = Rounds("s1", "owner", seen.append, None, {"calc__add"}, None, None, None, None, 4)  # type: ignore[arg-type]
    r.allowed = allowed
    return r, seen


async def asked(r: Rounds) -> asyncio.Task:
    """Start asking about call c1 and wait until the question is out."""
    task = asyncio.create_task(r._approval("m1", "c1", "calc__add", '{"a": 2, "b": 40}'))
    r.task = task  # Stop applies while the round's task runs
    while r.asking is None:
        await asyncio.sleep(0)
    return task


async def test_a_session_that_does_not_ask_or_an_allowed_tool_runs_at_once():
    for allowed in (None, {"calc__add"}):
        r, seen = make(allowed)
        assert await r._approval("m1", "c1", "calc__add", "{}") is None and seen == []


async def test_the_question_then_once_always_or_deny():
    for decision, expected in (("once", None), ("always", None), ("deny", DENIED)):
        r, seen = make(set())
        task = await asked(r)
        assert seen == [
            {
                "type": "tool.approval",
                "session_id": "s1",
                "message_id": "m1",
                "tool_call_id": "c1",
                "name": "calc__add",
                "arguments": '{"a": 2, "b": 40}',
            }
        ]
        assert not r.approve("c2", "once")  # another call awaits nothing
        assert r.approve("c1", decision)
        assert await task == expected
        assert r.asking is None and not r.approve("c1", "once")  # answered once only
        assert r.allowed == ({"calc__add"} if decision == "always" else set())


async def test_stop_while_a_call_waits_and_a_decision_that_never_comes(monkeypatch: pytest.MonkeyPatch):
    r, _ = make(set())
    task = await asked(r)
    assert r.stop()
    assert await task == STOPPED

    monkeypatch.setattr(rounds_module, "APPROVAL_WAIT_S", 0.05)
    r, _ = make(set())
    task = await asked(r)
    assert (await task).startswith("error: the call was not approved within")
    assert r.asking is None and not r.approve("c1", "once")
