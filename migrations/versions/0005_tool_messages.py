"""tool calls and tool results in chat sessions

`messages.tool_calls` holds a reply's calls (OpenAI's `tool_calls`, JSON); `messages.tool_call_id` the call a
tool message (role "tool") answers. Both are null on every message stored before.

Columns are added and dropped without Alembic's batch mode, so SQLite keeps the table (and migration 0003's
FTS5 triggers over its rowids).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CALL_ID = 256
COLUMNS = ("tool_calls", "tool_call_id")


def upgrade() -> None:
    op.add_column("messages", sa.Column("tool_calls", sa.JSON(), nullable=True))
    op.add_column("messages", sa.Column("tool_call_id", sa.String(CALL_ID), nullable=True))


def downgrade() -> None:
    """Tool results leave with their columns (a conversation without them is one a template renders); the calls
    of a reply are lost, its text stays."""
    op.execute("DELETE FROM messages WHERE role = 'tool'")
    for column in reversed(COLUMNS):
        if op.get_bind().dialect.name == "sqlite":
            op.execute(f"ALTER TABLE messages DROP COLUMN {column}")  # SQLite >= 3.35, in place (no table rebuild)
        else:
            op.drop_column("messages", column)
