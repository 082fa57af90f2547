"""Which tool results and continues a session's chosen branch allows (app.domain.tools), and how a turn's
conversation with calls and results goes to the template (app.domain.prompt.render)."""

from __future__ import annotations

import pytest

from app.domain.errors import ServiceError
from app.domain.plan import plan_continue, plan_regenerate
from app.domain.prompt import render
from app.domain.tools import check_continue, check_result
from app.store.records import MessageRecord, SessionRecord

NO_PROMPT = SessionRecord("s", "t", None, None, {}, "", "")  # a session without a system prompt
CALLS = [{"id": f"call_{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in (1, 2)]


def _message(
    id: str, role: str, content: str, status: str = "complete", calls: list | None = None, call_id: str | None = None
) -> MessageRecord:
    return MessageRecord(id, "s", None, 0, role, content, status, *[None] * 6, calls, call_id, "")


def _branch(*results: str, status: str = "complete") -> list[MessageRecord]:
    branch = [_message("u", "user", "hi"), _message("a", "assistant", "", status, CALLS)]
    return branch + [_message(f"t{r}", "tool", "ok", call_id=r) for r in results]


def _refused(fn, *args) -> ServiceError:
    with pytest.raises(ServiceError) as e:
        fn(*args)
    return e.value


def test_a_result_answers_an_open_call_of_the_last_reply_once():
    assert check_result(_branch(), "call_1").id == "a"
    assert check_result(_branch("call_1"), "call_2").id == "a"
    assert _refused(check_result, _branch("call_1"), "call_1").param == "tool_call_id"  # already answered
    assert _refused(check_result, _branch(), "call_9").param == "tool_call_id"  # not a call of the reply
    assert _refused(check_result, _branch(status="stopped"), "call_1").param == "tool_call_id"
    later = _branch() + [_message("u2", "user", "never mind")]
    assert _refused(check_result, later, "call_1").param == "tool_call_id"  # the branch moved on
    assert _refused(check_result, [], "call_1").param == "tool_call_id"


def test_the_reply_continues_once_every_call_has_its_result():
    assert _refused(check_continue, _branch()).param == "session_id"
    assert "call_2" in _refused(check_continue, _branch("call_1")).message
    check_continue(_branch("call_1", "call_2"))
    plan = plan_continue(_branch("call_1", "call_2"))
    assert plan.parent_id == "tcall_2" and plan.user_content is None and not plan.branches
    assert plan_regenerate(_branch("call_1", "call_2") + [_message("a2", "assistant", "Done.")]).parent_id == "tcall_2"


class _Engine:
    max_context = 100

    def render_chat(self, messages, add_generation_prompt=True, tools=None):
        self.seen = (messages, tools)
        return [1, 2, 3]


def test_render_passes_calls_and_results_and_keeps_a_reply_that_only_calls():
    engine = _Engine()
    assert render(engine, NO_PROMPT, _branch("call_1", "call_2"), tools=["T"]) == [1, 2, 3]
    messages, tools = engine.seen
    assert tools == ["T"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1]["tool_calls"] == CALLS and "tool_call_id" not in messages[1]
    assert [m["tool_call_id"] for m in messages[2:]] == ["call_1", "call_2"]
