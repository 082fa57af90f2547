"""Queries over sessions and messages. Every method opens its own short transaction.

Returns plain dicts (the API's JSON shapes) so nothing ORM-bound escapes a session.
"""
from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.db import make_engine, make_sessionmaker
from app.store.models import MESSAGE_STATUSES, ChatSession, Message, utcnow

EXPORT_VERSION = 1
UPDATE_TRIES = 20
_FACTS = ("finish_reason", "prompt_tokens", "cached_tokens", "completion_tokens", "ttft_ms", "tokens_per_s")


class Conflict(Exception):
    """A write kept losing to concurrent writes of the same row (or reused an idempotency key)."""


def new_id() -> str:
    return uuid.uuid4().hex


class Store:
    """Sessions and messages in any SQLAlchemy async database (SQLite by default).

    Every session belongs to an `owner` (app.api.gate.key_id of the API key that made it, "" without
    keys); the methods taking one see only that owner's sessions: another owner's are "not found".
    """

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

    async def create_session(self, owner: str, title: str, system_prompt: str | None,
                             settings: dict[str, Any]) -> dict[str, Any]:
        now = utcnow()
        row = ChatSession(id=new_id(), owner=owner, version=0, title=title, system_prompt=system_prompt,
                          settings=dict(settings), created_at=now, updated_at=now)
        async with self.sessionmaker.begin() as db:
            db.add(row)
        return row.to_dict()

    async def list_sessions(self, owner: str, limit: int | None = None) -> list[dict[str, Any]]:
        """Newest first (last activity)."""
        q = select(ChatSession).where(ChatSession.owner == owner).order_by(ChatSession.updated_at.desc(), ChatSession.created_at.desc(), ChatSession.id)
        if limit is not None:
            q = q.limit(limit)
        async with self.sessionmaker() as db:
            return [s.to_dict() for s in (await db.scalars(q)).all()]

    async def get_session(self, session_id: str, owner: str) -> dict[str, Any] | None:
        async with self.sessionmaker() as db:
            row = await _owned(db, session_id, owner)
            return row.to_dict() if row else None

    async def get_history(self, session_id: str, owner: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The session and its messages in order, read in one transaction; None when unknown."""
        async with self.sessionmaker() as db:
            row = await _owned(db, session_id, owner)
            if row is None:
                return None
            msgs = await db.scalars(select(Message).where(Message.session_id == session_id).order_by(Message.position))
            return row.to_dict(), [m.to_dict() for m in msgs.all()]

    async def update_session(self, session_id: str, owner: str, **fields: Any) -> dict[str, Any] | None:
        """Set title / system_prompt (already checked) and merge `settings` (a partial dict) over the stored
        ones; None when unknown. Concurrent updates all land: each write is conditional on the version it
        read (retried on a lost race), so no merge works from a stale copy. Raises Conflict after
        UPDATE_TRIES lost races."""
        assert set(fields) <= {"title", "system_prompt", "settings"}, fields
        for _ in range(UPDATE_TRIES):
            async with self.sessionmaker.begin() as db:
                row = await _owned(db, session_id, owner)
                if row is None:
                    return None
                values = dict(fields, updated_at=utcnow(), version=row.version + 1)
                if "settings" in fields:
                    values["settings"] = {**row.settings, **fields["settings"]}
                result = await db.execute(
                    update(ChatSession).where(ChatSession.id == session_id, ChatSession.version == row.version)
                    .values(**values).execution_options(synchronize_session=False))
                if result.rowcount == 1:
                    await db.refresh(row)
                    return row.to_dict()
        raise Conflict(f"session {session_id} is being changed by many clients at once")

    async def delete_session(self, session_id: str, owner: str) -> bool:
        async with self.sessionmaker.begin() as db:
            if await _owned(db, session_id, owner) is None:
                return False
            # Explicit, so it holds on databases where ON DELETE CASCADE is off.
            await db.execute(delete(Message).where(Message.session_id == session_id))
            result = await db.execute(delete(ChatSession).where(ChatSession.id == session_id))
            return result.rowcount > 0

    # -- a reply's life -------------------------------------------------------------------

    async def sent_with_key(self, session_id: str, key: str) -> bool:
        """Whether a user message with this idempotency key is already stored in the session."""
        async with self.sessionmaker() as db:
            found = await db.scalar(select(Message.id).where(Message.session_id == session_id,
                                                             Message.idempotency_key == key))
            return found is not None

    async def start_reply(self, session_id: str, owner: str, *, user_content: str | None = None,
                          idempotency_key: str | None = None, edit: tuple[str, str] | None = None,
                          keep_through: int | None = None, title: str | None = None
                          ) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any]] | None:
        """In one transaction: optionally edit a message's content (`edit` = (message id, content)),
        drop every message after position `keep_through`, append the user message, append an
        empty assistant reply with status "streaming", touch the session (and set `title`).

        Returns (session, user message or None, assistant message); None when the session is gone.
        Raises Conflict when `idempotency_key` is already used in the session.
        """
        now = utcnow()
        try:
            return await self._start_reply(session_id, owner, now, user_content, idempotency_key, edit,
                                           keep_through, title)
        except IntegrityError as e:
            if idempotency_key is not None and await self.sent_with_key(session_id, idempotency_key):
                raise Conflict(f"idempotency key {idempotency_key!r} is already used") from None
            raise e

    async def _start_reply(self, session_id: str, owner: str, now: Any, user_content: str | None,
                           idempotency_key: str | None, edit: tuple[str, str] | None, keep_through: int | None,
                           title: str | None) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any]] | None:
        async with self.sessionmaker.begin() as db:
            session = await _owned(db, session_id, owner)
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
                               idempotency_key=idempotency_key, status="complete", created_at=now, updated_at=now)
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

    async def set_status(self, message_id: str, status: str, finish_reason: str | None) -> None:
        """The smallest final write of a reply, for when finish_reply failed."""
        assert status in MESSAGE_STATUSES and status != "streaming", status
        async with self.sessionmaker.begin() as db:
            await db.execute(update(Message).where(Message.id == message_id).values(
                status=status, finish_reason=finish_reason, updated_at=utcnow()))

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

    async def export_session(self, session_id: str, owner: str) -> dict[str, Any] | None:
        found = await self.get_history(session_id, owner)
        if found is None:
            return None
        session, messages = found
        return {"forge_export": EXPORT_VERSION, "session": session, "messages": messages}

    async def import_session(self, owner: str, session: dict[str, Any], messages: list[dict[str, Any]]) -> dict[str, Any]:
        """Create a new session (new ids) from checked fields: `session` has title, system_prompt and
        settings; each message role, content, status and the reply facts (finish_reason, token counts,
        timings). A message left "streaming" by its exporter is stored as "interrupted"."""
        now = utcnow()
        sid = new_id()
        rows = [Message(id=new_id(), session_id=sid, position=i, role=m["role"], content=m["content"],
                        status="interrupted" if m["status"] == "streaming" else m["status"],
                        created_at=now, updated_at=now, **{k: m.get(k) for k in _FACTS})
                for i, m in enumerate(messages)]
        row = ChatSession(id=sid, owner=owner, version=0, title=session["title"],
                          system_prompt=session["system_prompt"], settings=dict(session["settings"]),
                          created_at=now, updated_at=now)
        async with self.sessionmaker.begin() as db:
            db.add(row)
            await db.flush()
            db.add_all(rows)
        return row.to_dict()


async def _owned(db: Any, session_id: str, owner: str) -> ChatSession | None:
    row = await db.get(ChatSession, session_id)
    return row if row is not None and row.owner == owner else None
