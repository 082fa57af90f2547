"""Queries over sessions and messages. Every method opens its own short transaction.

Returns records (app.store.records: typed, frozen, detached) so nothing ORM-bound escapes a session.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from sqlalchemy import bindparam, delete, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.store.db import make_engine, make_sessionmaker
from app.store.key_slots import KeySlots
from app.store.leases import LEASE_TTL_S, Leases
from app.store.locks import make_liveness
from app.store.models import MESSAGE_STATUSES, ChatSession, Message, utcnow
from app.store.reaper import Reaper
from app.store.records import MessageRecord, SessionRecord
from app.store.search import search
from app.store.tree import choose, chosen_branch

EXPORT_VERSION = 2  # 1: one conversation (no branches); still imported
UPDATE_TRIES = 20
_FACTS = (
    "finish_reason",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "ttft_ms",
    "tokens_per_s",
    "tool_calls",
    "tool_call_id",
)


class Conflict(Exception):
    """A write kept losing to concurrent writes of the same row (or reused an idempotency key)."""


def new_id() -> str:
    return uuid.uuid4().hex


class Store:
    """Sessions and messages in any SQLAlchemy async database (SQLite by default).

    Every session belongs to an `owner` (app.api.gate.key_id of the API key that made it, "" without
    keys); the methods taking one see only that owner's sessions: another owner's are "not found".
    `leases` holds what replicas sharing the database agree on (app.store.leases).
    """

    def __init__(self, url_or_engine: str | AsyncEngine, lease_ttl_s: float = LEASE_TTL_S) -> None:
        self.engine = make_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
        self.sessionmaker = make_sessionmaker(self.engine)
        self.leases = Leases(self.sessionmaker, lease_ttl_s)
        self.key_slots = KeySlots(self.leases)  # used only with --max-concurrent-per-key
        self.liveness = make_liveness(self.engine)  # this process's lock, and who else holds one
        self.reaper = Reaper(self.leases, self.liveness)

    async def close(self) -> None:
        await self.liveness.close()
        await self.engine.dispose()

    async def ping(self) -> None:
        """Raise when the database can't be reached."""
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    # -- sessions -------------------------------------------------------------------------

    async def create_session(
        self, owner: str, title: str, system_prompt: str | None, settings: dict[str, Any], model: str | None = None
    ) -> SessionRecord:
        now = utcnow()
        row = ChatSession(id=new_id(), owner=owner, version=0, title=title, system_prompt=system_prompt, model=model)
        row.settings, row.created_at, row.updated_at = dict(settings), now, now
        async with self.sessionmaker.begin() as db:
            await db.execute(insert(ChatSession).values(**_given(row)))
        return SessionRecord.of(row)

    async def list_sessions(self, owner: str, limit: int | None = None) -> list[SessionRecord]:
        """Newest first (last activity)."""
        q = (
            select(ChatSession)
            .where(ChatSession.owner == owner)
            .order_by(ChatSession.updated_at.desc(), ChatSession.created_at.desc(), ChatSession.id)
        )
        if limit is not None:
            q = q.limit(limit)
        async with self.sessionmaker() as db:
            return [SessionRecord.of(s) for s in (await db.scalars(q)).all()]

    async def get_session(self, session_id: str, owner: str) -> SessionRecord | None:
        async with self.sessionmaker() as db:
            row = await _owned(db, session_id, owner)
            return SessionRecord.of(row) if row else None

    async def get_history(self, session_id: str, owner: str) -> tuple[SessionRecord, list[MessageRecord]] | None:
        """The session and its chosen branch (app.store.tree), read in one transaction; None when unknown."""
        async with self.sessionmaker() as db:
            row = await _owned(db, session_id, owner)
            if row is None:
                return None
            return SessionRecord.of(row), chosen_branch(await _messages(db, session_id))

    async def select(
        self, session_id: str, owner: str, message_id: str
    ) -> tuple[SessionRecord, list[MessageRecord]] | None:
        """Choose the branch through `message_id` (it and its ancestors become the chosen ones of their
        siblings; below it, the choices made before stay). Returns the session and its new chosen branch;
        None when the owner's session holds no such message."""
        async with self.sessionmaker.begin() as db:
            row = await _owned(db, session_id, owner)
            rows = await _messages(db, session_id) if row is not None else []
            if row is None or not choose(rows, message_id):
                return None
            return SessionRecord.of(row), chosen_branch(rows)

    async def update_session(self, session_id: str, owner: str, **fields: Any) -> SessionRecord | None:
        """Set title / system_prompt / model (already checked) and merge `settings` (a partial dict) over the stored
        ones; None when unknown. Concurrent updates all land: each write is conditional on the version it
        read (retried on a lost race), so no merge works from a stale copy. Raises Conflict after
        UPDATE_TRIES lost races."""
        assert set(fields) <= {"title", "system_prompt", "settings", "model"}, fields
        for _ in range(UPDATE_TRIES):
            async with self.sessionmaker.begin() as db:
                row = await _owned(db, session_id, owner)
                if row is None:
                    return None
                values = dict(fields, updated_at=utcnow(), version=row.version + 1)
                if "settings" in fields:
                    values["settings"] = {**row.settings, **fields["settings"]}
                result = await db.execute(
                    update(ChatSession)
                    .where(ChatSession.id == session_id, ChatSession.version == row.version)
                    .values(**values)
                    .execution_options(synchronize_session=False)
                )
                if result.rowcount == 1:
                    await db.refresh(row)
                    return SessionRecord.of(row)
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
            found = await db.scalar(
                select(Message.id).where(Message.session_id == session_id, Message.idempotency_key == key)
            )
            return found is not None

    async def start_reply(
        self,
        session_id: str,
        owner: str,
        *,
        parent_id: str | None,
        user_content: str | None = None,
        idempotency_key: str | None = None,
        title: str | None = None,
        replica: str | None = None,
    ) -> tuple[SessionRecord, list[MessageRecord]] | None:
        """In one transaction: below message `parent_id` (None: a first message), optionally add a user
        message, then an empty assistant reply with status "streaming" generated by `replica` (its name, for
        the sweep of app.store.leases); each new message becomes the
        chosen one of its siblings (and `parent_id` and its ancestors the chosen ones of theirs). Touch
        the session (and set `title`).

        Returns the session and its new chosen branch (the reply last, the user message before it);
        None when the session is gone. Raises Conflict when `idempotency_key` is already used in the
        session, ValueError when `parent_id` is not one of its messages.
        """
        try:
            return await self._start_reply(session_id, owner, parent_id, user_content, idempotency_key, title, replica)
        except IntegrityError as e:
            if idempotency_key is not None and await self.sent_with_key(session_id, idempotency_key):
                raise Conflict(f"idempotency key {idempotency_key!r} is already used") from None
            raise e

    async def _start_reply(
        self,
        session_id: str,
        owner: str,
        parent_id: str | None,
        user_content: str | None,
        idempotency_key: str | None,
        title: str | None,
        replica: str | None,
    ) -> tuple[SessionRecord, list[MessageRecord]] | None:
        now = utcnow()
        async with self.sessionmaker.begin() as db:
            session = await _owned(db, session_id, owner)
            if session is None:
                return None
            rows = await _messages(db, session_id)
            below = next((r for r in rows if r.id == parent_id), None)
            if parent_id is not None and below is None:
                raise ValueError(f"message {parent_id!r} is not in session {session_id!r}")
            ordinal = max((r.ordinal for r in rows), default=-1)
            added = [dict(role="assistant", content="", status="streaming", replica=replica)]
            if user_content is not None:
                added.insert(
                    0, dict(role="user", content=user_content, idempotency_key=idempotency_key, status="complete")
                )
            for fields in added:
                ordinal += 1
                msg = Message(
                    id=new_id(),
                    session_id=session_id,
                    parent_id=below.id if below else None,
                    ordinal=ordinal,
                    position=below.position + 1 if below else 0,
                    active=True,
                    created_at=now,
                    updated_at=now,
                    **fields,
                )
                db.add(msg)
                rows.append(msg)
                below = msg
            choose(rows, msg.id)  # the reply just added
            session.updated_at = now
            if title is not None:
                session.title = title
            return SessionRecord.of(session), chosen_branch(rows)

    async def add_tool_result(
        self, session_id: str, owner: str, *, parent_id: str, tool_call_id: str, content: str
    ) -> tuple[SessionRecord, MessageRecord] | None:
        """In one transaction: a tool message (role "tool", status "complete") answering `tool_call_id`, below
        message `parent_id` (the chosen branch's last), as the chosen one of its siblings; touch the session.
        Returns the session and the new message; None when the session or `parent_id` is gone."""
        now = utcnow()
        async with self.sessionmaker.begin() as db:
            session = await _owned(db, session_id, owner)
            if session is None:
                return None
            rows = await _messages(db, session_id)
            below = next((r for r in rows if r.id == parent_id), None)
            if below is None:
                return None
            msg = Message(
                id=new_id(),
                session_id=session_id,
                parent_id=below.id,
                ordinal=max(r.ordinal for r in rows) + 1,
                position=below.position + 1,
                active=True,
                role="tool",
                content=content,
                status="complete",
                tool_call_id=tool_call_id,
                created_at=now,
                updated_at=now,
            )
            db.add(msg)
            rows.append(msg)
            choose(rows, msg.id)
            session.updated_at = now
            siblings = [r.id for r in rows if r.parent_id == below.id]
            return SessionRecord.of(session), MessageRecord.of(msg, siblings)

    async def save_progress(self, replies: Mapping[str, tuple[str, int]]) -> set[str]:
        """Store streaming replies as they stand, message id -> (text, completion tokens), in one transaction.
        Only replies still "streaming" are written: one another replica has marked `interrupted` (it found this
        one dead) is no longer this turn's. Returns the ids that were not written (taken, or deleted)."""
        if not replies:
            return set()
        table = Message.metadata.tables[Message.__tablename__]
        # Core, not the ORM's bulk update: a row deleted meanwhile (its session deleted) is skipped, not an error.
        stmt = (
            update(table)
            .where(table.c.id == bindparam("message_id"), table.c.status == "streaming")
            .values(content=bindparam("text"), completion_tokens=bindparam("tokens"), updated_at=utcnow())
        )
        rows = [{"message_id": m, "text": content, "tokens": n} for m, (content, n) in replies.items()]
        async with self.sessionmaker.begin() as db:
            await db.execute(stmt, rows)
            # executemany's row counts are not reliable across drivers: ask which are still streaming.
            kept = set(
                (
                    await db.scalars(select(Message.id).where(Message.id.in_(replies), Message.status == "streaming"))
                ).all()
            )
        return set(replies) - kept

    async def finish_reply(
        self,
        message_id: str,
        *,
        content: str,
        status: str,
        finish_reason: str | None,
        prompt_tokens: int | None,
        cached_tokens: int | None,
        completion_tokens: int | None,
        ttft_ms: float | None,
        tokens_per_s: float | None,
        tool_calls: list[dict[str, Any]] | None = None,
    ) -> MessageRecord | None:
        """Final write of a reply (`tool_calls`: the calls it made); None when it was deleted meanwhile (session
        deleted) or is no longer "streaming" (another replica found this one dead and marked it `interrupted`:
        it keeps what was stored then)."""
        assert status in MESSAGE_STATUSES and status != "streaming", status
        async with self.sessionmaker.begin() as db:
            row = await db.get(Message, message_id, with_for_update=True)  # a concurrent reap waits, or wins
            if row is None or row.status != "streaming":
                return None
            row.content = content
            row.status = status
            row.finish_reason = finish_reason
            row.prompt_tokens = prompt_tokens
            row.cached_tokens = cached_tokens
            row.completion_tokens = completion_tokens
            row.ttft_ms = ttft_ms
            row.tokens_per_s = tokens_per_s
            row.tool_calls = tool_calls
            row.updated_at = utcnow()
        return MessageRecord.of(row)

    async def set_status(self, message_id: str, status: str, finish_reason: str | None) -> None:
        """The smallest final write of a reply, for when finish_reply failed."""
        assert status in MESSAGE_STATUSES and status != "streaming", status
        async with self.sessionmaker.begin() as db:
            await db.execute(
                update(Message)
                .where(Message.id == message_id, Message.status == "streaming")
                .values(status=status, finish_reason=finish_reason, updated_at=utcnow())
            )

    async def mark_interrupted(self, older_than_s: float = 0.0) -> int:
        """Mark replies left "streaming" by a dead process as "interrupted"; returns how many. For one process
        on its database: with replicas, `leases.sweep` marks only those of replicas whose lease has passed.

        Only for a process that knows none of them is its own: a reply marked here stays marked.
        """
        cutoff = utcnow() - timedelta(seconds=older_than_s)
        async with self.sessionmaker.begin() as db:
            result = await db.execute(
                update(Message)
                .where(Message.status == "streaming", Message.updated_at <= cutoff)
                .values(status="interrupted", finish_reason="abort")
            )
            return result.rowcount

    # -- export / import ------------------------------------------------------------------

    async def export_session(self, session_id: str, owner: str) -> dict[str, Any] | None:
        """The session and every message of every branch, parents before children (docs/api.md#export)."""
        async with self.sessionmaker() as db:
            row = await _owned(db, session_id, owner)
            if row is None:
                return None
            messages = [{**MessageRecord.of(m).to_dict(), "active": m.active} for m in await _messages(db, session_id)]
            return {"forge_export": EXPORT_VERSION, "session": SessionRecord.of(row).to_dict(), "messages": messages}

    async def import_session(
        self, owner: str, session: dict[str, Any], messages: list[dict[str, Any]]
    ) -> SessionRecord:
        """Create a new session (new ids) from checked fields: `session` has title, system_prompt, settings and
        model (None: the default); each message role, content, status, the reply facts (finish_reason, token counts,
        timings), `parent` (the index of an earlier message, or None) and `active` (the chosen one of
        its siblings). A message left "streaming" by its exporter is stored as "interrupted"."""
        now = utcnow()
        sid = new_id()
        rows: list[Message] = []
        for i, m in enumerate(messages):
            parent = rows[m["parent"]] if m["parent"] is not None else None
            rows.append(
                Message(
                    id=new_id(),
                    session_id=sid,
                    parent_id=parent.id if parent else None,
                    ordinal=i,
                    position=parent.position + 1 if parent else 0,
                    active=m["active"],
                    role=m["role"],
                    content=m["content"],
                    status="interrupted" if m["status"] == "streaming" else m["status"],
                    created_at=now,
                    updated_at=now,
                    **{k: m.get(k) for k in _FACTS},
                )
            )
        row = ChatSession(
            id=sid,
            owner=owner,
            version=0,
            title=session["title"],
            system_prompt=session["system_prompt"],
            settings=dict(session["settings"]),
            model=session.get("model"),
            created_at=now,
            updated_at=now,
        )
        async with self.sessionmaker.begin() as db:
            db.add(row)
            await db.flush()
            db.add_all(rows)
        return SessionRecord.of(row)

    # -- search ---------------------------------------------------------------------------

    async def search(self, owner: str, query: str, limit: int) -> list[dict[str, Any]]:
        """The owner's sessions whose title, and messages (of any branch) whose text, hold every word of
        `query` (plain text, never query syntax); see app.store.search."""
        async with self.sessionmaker() as db:
            return await search(db, owner, query, limit)


def _given(row: ChatSession) -> dict[str, Any]:
    """A new session's columns for its INSERT: `model` only when one is chosen (a database before migration 0007
    has no such column, and tests make sessions there)."""
    return {c.key: getattr(row, c.key) for c in ChatSession.__table__.columns if c.key != "model" or row.model}


async def _messages(db: Any, session_id: str) -> list[Message]:
    return list(
        (await db.scalars(select(Message).where(Message.session_id == session_id).order_by(Message.ordinal))).all()
    )


async def _owned(db: Any, session_id: str, owner: str) -> ChatSession | None:
    row = await db.get(ChatSession, session_id)
    return row if row is not None and row.owner == owner else None
