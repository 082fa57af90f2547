"""SQLAlchemy tables: chat sessions and their messages (with the reply's usage facts); the replicas serving
them and the one-turn-per-session leases they hold (app.store.leases)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Boolean, DateTime, Float, ForeignKey, Index, Integer, MetaData, String, Text, text, true
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

MESSAGE_STATUSES = ("streaming", "complete", "stopped", "error", "interrupted")
CALL_ID_CHARS = 256
REPLICA_NAME_CHARS = 200
MODEL_NAME_CHARS = 200  # a session's model, by the name the server serves it under

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


def iso(dt: datetime) -> str:
    """ISO 8601 in UTC; SQLite hands datetimes back without their zone."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.isoformat()


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class ChatSession(Base):
    __tablename__ = "sessions"
    __table_args__ = (Index("ix_sessions_owner_updated_at", "owner", "updated_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(32), server_default="")  # app.api.gate.key_id of the key that made it
    version: Mapped[int] = mapped_column(Integer, server_default="0")  # bumped by every update (no lost updates)
    title: Mapped[str] = mapped_column(String(200))
    system_prompt: Mapped[str | None] = mapped_column(Text, nullable=True)
    settings: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    model: Mapped[str | None] = mapped_column(String(MODEL_NAME_CHARS), nullable=True)  # None: the default model


class Message(Base):
    """One message of a session's tree: regenerating a reply or editing a user message adds a sibling (same
    parent); `active` marks the chosen one of each group of siblings, and the chosen messages from the root
    down are the conversation the next turn continues (app.store.tree)."""

    __tablename__ = "messages"
    __table_args__ = (
        Index("uq_messages_session_id_ordinal", "session_id", "ordinal", unique=True),
        Index("uq_messages_session_id_idempotency_key", "session_id", "idempotency_key", unique=True),
        # Only the few replies being streamed: what the sweep (app.store.leases) looks through.
        Index(
            "ix_messages_streaming",
            "replica",
            sqlite_where=text("status = 'streaming'"),
            postgresql_where=text("status = 'streaming'"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    session_id: Mapped[str] = mapped_column(String(32), ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    # No foreign key to messages.id on purpose: SQLite's table rebuilds (Alembic batch mode) would cascade
    # a self-reference's deletes into the copy. Parents are in the same session; only sessions are deleted.
    parent_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    ordinal: Mapped[int] = mapped_column(Integer)  # storage order in the session: parents first, siblings oldest first
    position: Mapped[int] = mapped_column(Integer)  # depth: the message's index along its branch
    active: Mapped[bool] = mapped_column(Boolean, server_default=true())
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    idempotency_key: Mapped[str | None] = mapped_column(String(64), nullable=True)  # user messages sent with one
    status: Mapped[str] = mapped_column(String(16))
    finish_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    cached_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    completion_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ttft_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # Last write; a streaming reply is rewritten about every 0.5 s (app/domain/progress.py) while tokens arrive.
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # The replica generating a reply (its --replica-name); None for replies stored before replicas existed.
    replica: Mapped[str | None] = mapped_column(String(REPLICA_NAME_CHARS), nullable=True)
    # A reply that called tools: its calls as OpenAI's `tool_calls` ([{id, type, function: {name, arguments}}]).
    tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)
    # A tool message (role "tool"): the call it answers.
    tool_call_id: Mapped[str | None] = mapped_column(String(CALL_ID_CHARS), nullable=True)


class Replica(Base):
    """A `forge serve` process sharing the database. Alive while `lease_until` is ahead of the database's
    clock; it renews the lease by heartbeat, and once the lease has passed its streaming replies are swept.
    `incarnation` tells the process now under the name from an earlier one (a restart takes the name over)."""

    __tablename__ = "replicas"

    name: Mapped[str] = mapped_column(String(REPLICA_NAME_CHARS), primary_key=True)
    address: Mapped[str] = mapped_column(String(REPLICA_NAME_CHARS), server_default="")
    incarnation: Mapped[str] = mapped_column(String(32))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    heartbeat_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    lease_until: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class SessionLease(Base):
    """The one turn a session may run at a time, across replicas: held by `replica` until `expires_at`
    (renewed with the replica's heartbeat), released by the holder's `token` at the turn's end. No foreign
    key: a lease on a deleted session just runs out."""

    __tablename__ = "session_leases"

    session_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    replica: Mapped[str] = mapped_column(String(REPLICA_NAME_CHARS), index=True)
    token: Mapped[str] = mapped_column(String(32))
    taken_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class KeySlot(Base):
    """`units` of the engine one API key's generation holds on `replica`, when `--max-concurrent-per-key` must
    hold across replicas (app.store.key_slots): released at the generation's end, renewed with the replica's
    heartbeat, swept once expired."""

    __tablename__ = "key_slots"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), index=True)
    replica: Mapped[str] = mapped_column(String(REPLICA_NAME_CHARS), index=True)
    units: Mapped[int] = mapped_column(Integer, server_default="1")
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
