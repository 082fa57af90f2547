"""Which tool results and continues a session's chosen branch allows (app.domain.tools), and how a turn's
conversation with calls and results goes to the template (app.domain.prompt.render)."""

from __future__ import annotations

import pytest

from app.domain.errors import ServiceError
from app.domain.plan import plan_continue, plan_regenerate
from app.domain.prompt import render
from app.domain.tools import check_continue, check_result

CALLS = [{"id": f"call_{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in (1, 2)]


def _branch(*results: str, status: str = "complete") -> list[dict]:
    branch = [
        {"id": "u", "role": "user", "content": "hi", "status": "complete"},
        {"id": "a", "role": "assistant", "content": "", "status": status, "tool_calls": CALLS},
    ]
    return branch + [
        {"id": f"t{r}", "role": "tool", "content": "ok", "status": "complete", "tool_call_id": r} for r in results
    ]


def _refused(fn, *args) -> ServiceError:
    with pytest.raises(ServiceError) as e:
        fn(*args)
    return e.value


def test_a_result_answers_an_open_call_of_the_last_reply_once():
    assert check_result(_branch(), "call_1")["id"] == "a"
    assert check_result(_branch("call_1"), "call_2")["id"] == "a"
    assert _refused(check_result, _branch("call_1"), "call_1").param == "tool_call_id"  # already answered
    assert _refused(check_result, _branch(), "call_9").param == "tool_call_id"  # not a call of the reply
    assert _refused(check_result, _branch(status="stopped"), "call_1").param == "tool_call_id"
    later = _branch() + [{"id": "u2", "role": "user", "content": "never mind", "status": "complete"}]
    assert _refused(check_result, later, "call_1").param == "tool_call_id"  # the branch moved on
    assert _refused(check_result, [], "call_1").param == "tool_call_id"


def test_the_reply_continues_once_every_call_has_its_result():
    assert _refused(check_continue, _branch()).param == "session_id"
    assert "call_2" in _refused(check_continue, _branch("call_1")).message
    check_continue(_branch("call_1", "call_2"))
    plan = plan_continue(_branch("call_1", "call_2"))
    assert plan.parent_id == "tcall_2" and plan.user_content is None and not plan.branches
    assert (
        plan_regenerate(
            _branch("call_1", "call_2") + [{"id": "a2", "role": "assistant", "content": "Done.", "status": "complete"}]
        ).parent_id
        == "tcall_2"
    )


class _Engine:
    max_context = 100

    def render_chat(self, messages, add_generation_prompt=True, tools=None):
        self.seen = (messages, tools)
        return [1, 2, 3]


def test_render_passes_calls_and_results_and_keeps_a_reply_that_only_calls():
    engine = _Engine()
    assert render(engine, {"system_prompt": None}, _branch("call_1", "call_2"), tools=["T"]) == [1, 2, 3]
    messages, tools = engine.seen
    assert tools == ["T"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1]["tool_calls"] == CALLS and "tool_call_id" not in messages[1]
    assert [m["tool_call_id"] for m in messages[2:]] == ["call_1", "call_2"]
