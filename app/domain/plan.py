"""Planning a turn: which messages go to the template, below which stored message the new ones go, and the
session's title when its first message names it. Pure functions over the chosen branch (no store, no engine)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.domain.defaults import DEFAULT_TITLE
from app.domain.errors import ServiceError
from app.domain.tools import check_continue
from app.store.records import MessageRecord, SessionRecord

TITLE_CHARS = 60


@dataclass(slots=True)
class Plan:
    history: list[MessageRecord]  # stored messages that go to the template; the new user message follows them
    parent_id: str | None  # the stored message the new one(s) go below
    user_content: str | None = None  # the new user message
    title: str | None = None
    branches: bool = False  # edit/regenerate: a new branch; the client is sent the chosen branch up to the reply


def title_from(content: str) -> str:
    line = re.sub(r"\s+", " ", content.strip().splitlines()[0] if content.strip() else "").strip()
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1].rstrip() + "…"


def plan_send(session: SessionRecord, messages: list[MessageRecord], content: str) -> Plan:
    """A user message below the chosen branch's last message (the session's first names it)."""
    title = None
    if session.title == DEFAULT_TITLE and not any(m.role == "user" for m in messages):
        title = title_from(content) or None
    return Plan(
        history=list(messages),
        parent_id=messages[-1].id if messages else None,
        user_content=content,
        title=title,
    )


def plan_edit(messages: list[MessageRecord], session_id: str, message_id: str, content: str) -> Plan:
    """A sibling of the user message `message_id` (on the chosen branch) holding `content`."""
    idx = next((i for i, m in enumerate(messages) if m.id == message_id), None)
    if idx is None:
        raise ServiceError(
            "not_found",
            f"message '{message_id}' not found on the chosen branch of session '{session_id}'",
            param="message_id",
        )
    target = messages[idx]
    if target.role != "user":
        raise ServiceError(
            "invalid_parameter",
            f"message '{message_id}' is an {target.role} message; only user messages can be edited",
            param="message_id",
        )
    return Plan(
        history=messages[:idx],
        parent_id=target.parent_id,
        user_content=content,
        branches=True,
    )


def plan_continue(messages: list[MessageRecord]) -> Plan:
    """A reply below the chosen branch's last message: the results of every call of the reply before them."""
    check_continue(messages)
    return Plan(history=list(messages), parent_id=messages[-1].id)


def plan_regenerate(messages: list[MessageRecord]) -> Plan:
    """A sibling of the last reply (if the branch ends with one), below the user message it answered."""
    kept = list(messages)
    if kept and kept[-1].role == "assistant":
        kept.pop()
    if not kept or kept[-1].role not in ("user", "tool"):
        raise ServiceError(
            "invalid_parameter",
            "nothing to regenerate: the session does not end with a user message "
            "(or tool results) or an assistant reply to one",
        )
    return Plan(history=kept, parent_id=kept[-1].id, branches=True)
