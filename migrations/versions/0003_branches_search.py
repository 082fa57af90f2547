"""reply branches (message tree), full-text search (SQLite FTS5)

Every stored message keeps its place: a conversation made before branches becomes a single branch
(each message's parent is the one before it, every message is the chosen one of its siblings).

On SQLite, `sessions_fts` (titles) and `messages_fts` (message text) are FTS5 indexes over the tables'
rowids, kept in sync by triggers. A later migration that rebuilds `sessions` or `messages` (Alembic batch
mode copies a table and drops the old one, renumbering rowids and dropping its triggers) must recreate
the triggers and run each index's 'rebuild' command. Other databases search without an index
(app/store/search.py).

Revision ID: 0003
Revises: 0002
Create Date: 2025-03-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# table -> (index, column)
FTS = {"sessions": ("sessions_fts", "title"), "messages": ("messages_fts", "content")}


def upgrade() -> None:
    op.add_column("messages", sa.Column("parent_id", sa.String(32), nullable=True))
    op.add_column("messages", sa.Column("ordinal", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("messages", sa.Column("active", sa.Boolean(), nullable=False, server_default=sa.true()))
    # While (session_id, position) is still unique and indexed: each message's parent is the one before it.
    op.execute(
        "UPDATE messages SET ordinal = position, parent_id = (SELECT p.id FROM messages AS p "
        "WHERE p.session_id = messages.session_id AND p.position = messages.position - 1)"
    )
    with op.batch_alter_table("messages") as batch:  # siblings share a position: it is unique no more
        batch.drop_constraint("uq_messages_session_id", type_="unique")
    op.create_index("ix_messages_parent_id", "messages", ["parent_id"])
    op.create_index("uq_messages_session_id_ordinal", "messages", ["session_id", "ordinal"], unique=True)
    if op.get_bind().dialect.name == "sqlite":
        for table, (index, column) in FTS.items():
            _create_fts(table, index, column)


def _create_fts(table: str, index: str, column: str) -> None:
    op.execute(
        f"CREATE VIRTUAL TABLE {index} USING fts5({column}, content='{table}', content_rowid='rowid', "
        "tokenize='unicode61 remove_diacritics 2')"
    )
    op.execute(
        f"CREATE TRIGGER {index}_insert AFTER INSERT ON {table} BEGIN "
        f"INSERT INTO {index}(rowid, {column}) VALUES (new.rowid, new.{column}); END"
    )
    op.execute(
        f"CREATE TRIGGER {index}_delete AFTER DELETE ON {table} BEGIN "
        f"INSERT INTO {index}({index}, rowid, {column}) VALUES ('delete', old.rowid, old.{column}); END"
    )
    op.execute(
        f"CREATE TRIGGER {index}_update AFTER UPDATE OF {column} ON {table} BEGIN "
        f"INSERT INTO {index}({index}, rowid, {column}) VALUES ('delete', old.rowid, old.{column}); "
        f"INSERT INTO {index}(rowid, {column}) VALUES (new.rowid, new.{column}); END"
    )
    op.execute(f"INSERT INTO {index}({index}) VALUES ('rebuild')")


def downgrade() -> None:
    """Back to one conversation per session: only the chosen branch survives."""
    if op.get_bind().dialect.name == "sqlite":
        for index, _ in FTS.values():
            for event in ("insert", "delete", "update"):
                op.execute(f"DROP TRIGGER IF EXISTS {index}_{event}")
            op.execute(f"DROP TABLE IF EXISTS {index}")
    op.execute("DELETE FROM messages WHERE id NOT IN (" + _CHOSEN + ")")
    op.drop_index("uq_messages_session_id_ordinal", table_name="messages")
    op.drop_index("ix_messages_parent_id", table_name="messages")
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("active")
        batch.drop_column("ordinal")
        batch.drop_column("parent_id")
        batch.create_unique_constraint("uq_messages_session_id", ["session_id", "position"])


# The chosen path of every session: chosen roots, then chosen children of chosen messages.
_CHOSEN = (
    "WITH RECURSIVE chosen(id) AS (SELECT id FROM messages WHERE parent_id IS NULL AND active "
    "UNION ALL SELECT m.id FROM messages AS m JOIN chosen ON m.parent_id = chosen.id WHERE m.active) "
    "SELECT id FROM chosen"
)
