"""What the store hands out for sessions and messages: typed, frozen records, detached from the ORM (nothing
database-bound escapes a transaction). The domain reads their attributes; `to_dict()` is their JSON shape, which
the HTTP layer and the turns' events send as it is (docs/api.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.store.models import ChatSession, Message, iso


@dataclass(slots=True, frozen=True)
class SessionRecord:
    """A chat session as stored: `model` None is the default model; times are ISO 8601 in UTC."""

    id: str
    title: str
    system_prompt: str | None
    model: str | None
    settings: dict[str, Any]  # sampling and tool settings, as stored (a copy: the record is the caller's)
    created_at: str
    updated_at: str

    @classmethod
    def of(cls, row: ChatSession) -> SessionRecord:
        """The record of a loaded row, read now (inside its transaction)."""
        return cls(
            row.id,
            row.title,
            row.system_prompt,
            row.model,
            dict(row.settings),
            iso(row.created_at),
            iso(row.updated_at),
        )

    def to_dict(self) -> dict[str, Any]:
        """The session's JSON shape (its keys in this order)."""
        return {
            "id": self.id,
            "title": self.title,
            "system_prompt": self.system_prompt,
            "model": self.model,
            "settings": dict(self.settings),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass(slots=True, frozen=True)
class MessageRecord:
    """One message of a session's tree as stored, with its reply facts (None where it has none); `siblings`: the
    ids of the messages sharing its parent, itself included, oldest first, where the store read them (a chosen
    branch, a new tool message), else None."""

    id: str
    session_id: str
    parent_id: str | None
    position: int  # depth along its branch
    role: str
    content: str
    status: str
    finish_reason: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    ttft_ms: float | None
    tokens_per_s: float | None
    tool_calls: list[dict[str, Any]] | None  # OpenAI's `tool_calls`, on a reply that called tools
    tool_call_id: str | None  # on a tool message: the call it answers
    created_at: str
    siblings: list[str] | None = None

    @classmethod
    def of(cls, row: Message, siblings: Sequence[str] | None = None) -> MessageRecord:
        """The record of a loaded row, read now (inside its transaction), with its `siblings` when known."""
        return cls(
            row.id,
            row.session_id,
            row.parent_id,
            row.position,
            row.role,
            row.content,
            row.status,
            row.finish_reason,
            row.prompt_tokens,
            row.cached_tokens,
            row.completion_tokens,
            row.ttft_ms,
            row.tokens_per_s,
            row.tool_calls,
            row.tool_call_id,
            iso(row.created_at),
            list(siblings) if siblings is not None else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The message's JSON shape (its keys in this order; `siblings` last, only where read)."""
        out: dict[str, Any] = {
            "id": self.id,
            "session_id": self.session_id,
            "parent_id": self.parent_id,
            "position": self.position,
            "role": self.role,
            "content": self.content,
            "status": self.status,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_ms": self.ttft_ms,
            "tokens_per_s": self.tokens_per_s,
            "tool_calls": self.tool_calls,
            "tool_call_id": self.tool_call_id,
            "created_at": self.created_at,
        }
        if self.siblings is not None:
            out["siblings"] = list(self.siblings)
        return out
