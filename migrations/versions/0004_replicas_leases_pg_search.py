"""replicas and session leases (several `forge serve` processes on one database), PostgreSQL text search

`replicas` holds each process's lease (renewed by heartbeat); `session_leases` the one turn a session may run,
across processes; `messages.replica` the process streaming a reply, so a sweep marks `interrupted` only the
replies of replicas whose lease has passed. A partial index keeps the sweep to the replies being streamed.

On PostgreSQL, search gets GIN indexes over `to_tsvector('forge_search', ...)` of titles and message text:
`forge_search` is the `simple` configuration (no stemming, no stop words, like SQLite's unicode61) with accents
folded by the `unaccent` dictionary (a trusted extension: the database's owner may create it). The queries in
app/store/search.py use the same expressions, so the planner finds these indexes.

Columns are added and dropped without Alembic's batch mode, so SQLite keeps the tables (and migration 0003's
FTS5 triggers over their rowids).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = 200
STREAMING = sa.text("status = 'streaming'")
# index -> (table, column)
PG_SEARCH = {"ix_sessions_search": ("sessions", "title"), "ix_messages_search": ("messages", "content")}


def upgrade() -> None:
    op.create_table(
        "replicas",
        sa.Column("name", sa.String(NAME), nullable=False),
        sa.Column("address", sa.String(NAME), nullable=False, server_default=""),
        sa.Column("incarnation", sa.String(32), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_replicas"),
    )
    op.create_table(
        "session_leases",
        sa.Column("session_id", sa.String(32), nullable=False),
        sa.Column("replica", sa.String(NAME), nullable=False),
        sa.Column("token", sa.String(32), nullable=False),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("session_id", name="pk_session_leases"),
    )
    op.create_index("ix_session_leases_replica", "session_leases", ["replica"])
    op.add_column("messages", sa.Column("replica", sa.String(NAME), nullable=True))
    op.create_index(
        "ix_messages_streaming", "messages", ["replica"], sqlite_where=STREAMING, postgresql_where=STREAMING
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute("CREATE EXTENSION IF NOT EXISTS unaccent")
        op.execute("CREATE TEXT SEARCH CONFIGURATION forge_search (COPY = pg_catalog.simple)")
        op.execute(
            "ALTER TEXT SEARCH CONFIGURATION forge_search ALTER MAPPING FOR asciiword, asciihword, "
            "hword_asciipart, word, hword, hword_part WITH unaccent, simple"
        )
        for index, (table, column) in PG_SEARCH.items():
            op.execute(f"CREATE INDEX {index} ON {table} USING gin (to_tsvector('forge_search', {column}))")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for index in PG_SEARCH:
            op.execute(f"DROP INDEX IF EXISTS {index}")
        op.execute("DROP TEXT SEARCH CONFIGURATION IF EXISTS forge_search")
        # unaccent stays: other objects of the database may use it.
    op.drop_index("ix_messages_streaming", table_name="messages")
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE messages DROP COLUMN replica")  # SQLite >= 3.35, in place (no table rebuild)
    else:
        op.drop_column("messages", "replica")
    op.drop_index("ix_session_leases_replica", table_name="session_leases")
    op.drop_table("session_leases")
    op.drop_table("replicas")
