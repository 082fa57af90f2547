"""Queries over sessions and messages. Every method opens its own short transaction.

Returns plain dicts (the API's JSON shapes) so nothing ORM-bound escapes a session.
"""
from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.db import make_engine, make_sessionmaker
from app.store.models import MESSAGE_STATUSES, ROLES, ChatSession, Message, utcnow

EXPORT_VERSION = 1
_MESSAGE_FIELDS = ("id", "session_id", "position", "role", "content", "status", "finish_reason", "prompt_tokens",
                   "cached_tokens", "completion_tokens", "ttft_ms", "tokens_per_s")


def new_id() -> str:
    return uuid.uuid4().hex


class Store:
    """Sessions and messages in any SQLAlchemy async database (SQLite by default)."""

    def __init__(self, url_or_engine: str | AsyncEngine) -> None:
        self.engine = make_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
        self.sessionmaker = make_sessionmaker(self.engine)

    async def close(self) -> None:
        await self.engine.dispose()

    async def ping(self) -> None:
        """Raise when the database can't be reached."""
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    # -- sessions -------------------------------------------------------------------------

    async def create_session(self, title: str, system_prompt: str | None, settings: dict[str, Any]) -> dict[str, Any]:
        now = utcnow()
        row = ChatSession(id=new_id(), title=title, system_prompt=system_prompt, settings=dict(settings),
                          created_at=now, updated_at=now)
        async with self.sessionmaker.begin() as db:
            db.add(row)
        return row.to_dict()

    async def list_sessions(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Newest first (last activity)."""
        q = select(ChatSession).order_by(ChatSession.updated_at.desc(), ChatSession.created_at.desc(), ChatSession.id)
        if limit is not None:
            q = q.limit(limit)
        async with self.sessionmaker() as db:
            return [s.to_dict() for s in (await db.scalars(q)).all()]

    async def get_session(self, session_id: str) -> dict[str, Any] | None:
        async with self.sessionmaker() as db:
            row = await db.get(ChatSession, session_id)
            return row.to_dict() if row else None

    async def get_history(self, session_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The session and its messages in order, read in one transaction; None when unknown."""
        async with self.sessionmaker() as db:
            row = await db.get(ChatSession, session_id)
            if row is None:
                return None
            msgs = await db.scalars(select(Message).where(Message.session_id == session_id).order_by(Message.position))
            return row.to_dict(), [m.to_dict() for m in msgs.all()]

    async def update_session(self, session_id: str, **fields: Any) -> dict[str, Any] | None:
        """Set title / system_prompt / settings (already checked); None when unknown."""
        assert set(fields) <= {"title", "system_prompt", "settings"}, fields
        async with self.sessionmaker.begin() as db:
            row = await db.get(ChatSession, session_id)
            if row is None:
                return None
            for key, value in fields.items():
                setattr(row, key, dict(value) if key == "settings" else value)
            row.updated_at = utcnow()
        return row.to_dict()

    async def delete_session(self, session_id: str) -> bool:
        async with self.sessionmaker.begin() as db:
            # Explicit, so it holds on databases where ON DELETE CASCADE is off.
            await db.execute(delete(Message).where(Message.session_id == session_id))
            result = await db.execute(delete(ChatSession).where(ChatSession.id == session_id))
            return result.rowcount > 0

    # -- a reply's life -------------------------------------------------------------------

    async def start_reply(self, session_id: str, *, user_content: str | None = None,
                          edit: tuple[str, str] | None = None, keep_through: int | None = None,
                          title: str | None = None
                          ) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any]] | None:
        """In one transaction: optionally edit a message's content (`edit` = (message id, content)),
        drop every message after position `keep_through`, append the user message, append an
        empty assistant reply with status "streaming", touch the session (and set `title`).

        Returns (session, user message or None, assistant message); None when the session is gone.
        """
        now = utcnow()
        async with self.sessionmaker.begin() as db:
            session = await db.get(ChatSession, session_id)
            if session is None:
                return None
            if edit is not None:
                await db.execute(update(Message).where(Message.id == edit[0], Message.session_id == session_id)
                                 .values(content=edit[1], updated_at=now))
            if keep_through is not None:
                await db.execute(delete(Message).where(Message.session_id == session_id, Message.position > keep_through))
            last = await db.scalar(select(func.max(Message.position)).where(Message.session_id == session_id))
            pos = -1 if last is None else last
            user = None
            if user_content is not None:
                pos += 1
                user = Message(id=new_id(), session_id=session_id, position=pos, role="user", content=user_content,
                               status="complete", created_at=now, updated_at=now)
                db.add(user)
            reply = Message(id=new_id(), session_id=session_id, position=pos + 1, role="assistant", content="",
                            status="streaming", created_at=now, updated_at=now)
            db.add(reply)
            session.updated_at = now
            if title is not None:
                session.title = title
        return session.to_dict(), (user.to_dict() if user else None), reply.to_dict()

    async def save_progress(self, message_id: str, content: str, completion_tokens: int) -> None:
        """Store a streaming reply as it stands (also re-asserts status "streaming", see mark_interrupted)."""
        async with self.sessionmaker.begin() as db:
            await db.execute(update(Message).where(Message.id == message_id).values(
                content=content, completion_tokens=completion_tokens, status="streaming", updated_at=utcnow()))

    async def finish_reply(self, message_id: str, *, content: str, status: str, finish_reason: str | None,
                           prompt_tokens: int | None, cached_tokens: int | None, completion_tokens: int | None,
                           ttft_ms: float | None, tokens_per_s: float | None) -> dict[str, Any] | None:
        """Final write of a reply; None when it was deleted meanwhile (session deleted)."""
        assert status in MESSAGE_STATUSES and status != "streaming", status
        async with self.sessionmaker.begin() as db:
            row = await db.get(Message, message_id)
            if row is None:
                return None
            row.content = content
            row.status = status
            row.finish_reason = finish_reason
            row.prompt_tokens = prompt_tokens
            row.cached_tokens = cached_tokens
            row.completion_tokens = completion_tokens
            row.ttft_ms = ttft_ms
            row.tokens_per_s = tokens_per_s
            row.updated_at = utcnow()
        return row.to_dict()

    async def restore(self, session: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        """Put a session back as it was read (title, activity time, exactly these messages): takes back
        a turn the engine refused before producing anything, edits and dropped replies included."""
        async with self.sessionmaker.begin() as db:
            await db.execute(delete(Message).where(Message.session_id == session["id"]))
            result = await db.execute(update(ChatSession).where(ChatSession.id == session["id"]).values(
                title=session["title"], updated_at=datetime.fromisoformat(session["updated_at"])))
            if result.rowcount == 0:
                return  # deleted meanwhile
            for m in messages:
                created = datetime.fromisoformat(m["created_at"])
                db.add(Message(**{k: m[k] for k in _MESSAGE_FIELDS}, created_at=created, updated_at=created))

    async def mark_interrupted(self, older_than_s: float = 0.0) -> int:
        """Mark replies left "streaming" by a dead process as "interrupted"; returns how many.

        A live worker's next progress write sets "streaming" again, so a false positive heals.
        """
        cutoff = utcnow() - timedelta(seconds=older_than_s)
        async with self.sessionmaker.begin() as db:
            result = await db.execute(update(Message).where(Message.status == "streaming", Message.updated_at <= cutoff)
                                      .values(status="interrupted", finish_reason="abort"))
            return result.rowcount

    # -- export / import ------------------------------------------------------------------

    async def export_session(self, session_id: str) -> dict[str, Any] | None:
        found = await self.get_history(session_id)
        if found is None:
            return None
        session, messages = found
        return {"forge_export": EXPORT_VERSION, "session": session, "messages": messages}

    async def import_session(self, data: dict[str, Any]) -> dict[str, Any]:
        """Create a new session (new ids) from an export; raise ValueError naming the first bad field.

        `data["session"]` must already be checked by the caller (title, system_prompt, settings);
        messages are checked here.
        """
        session = data["session"]
        messages = data["messages"]
        now = utcnow()
        sid = new_id()
        rows: list[Message] = []
        for i, m in enumerate(messages):
            where = f"messages[{i}]"
            if not isinstance(m, dict):
                raise ValueError(f"{where} must be an object")
            role, content = m.get("role"), m.get("content")
            if role not in ROLES:
                raise ValueError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}")
            if not isinstance(content, str):
                raise ValueError(f"{where}.content must be a string")
            status = m.get("status", "complete")
            if status not in MESSAGE_STATUSES:
                raise ValueError(f"{where}.status must be one of {', '.join(MESSAGE_STATUSES)}, got {status!r}")
            if status == "streaming":
                status = "interrupted"  # nothing is generating it here
            facts: dict[str, Any] = {}
            for key, kind in (("prompt_tokens", int), ("cached_tokens", int), ("completion_tokens", int),
                              ("ttft_ms", float), ("tokens_per_s", float)):
                v = m.get(key)
                if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0
                                      or (kind is int and not float(v).is_integer())):
                    raise ValueError(f"{where}.{key} must be a non-negative number or null")
                facts[key] = None if v is None else kind(v)
            finish = m.get("finish_reason")
            if finish is not None and not isinstance(finish, str):
                raise ValueError(f"{where}.finish_reason must be a string or null")
            rows.append(Message(id=new_id(), session_id=sid, position=i, role=role, content=content, status=status,
                                finish_reason=finish[:16] if finish else None, created_at=now, updated_at=now, **facts))
        row = ChatSession(id=sid, title=session["title"], system_prompt=session["system_prompt"],
                          settings=dict(session["settings"]), created_at=now, updated_at=now)
        async with self.sessionmaker.begin() as db:
            db.add(row)
            await db.flush()
            db.add_all(rows)
        return row.to_dict()
