"""session model: the model a session's turns run on

`sessions.model` names one of the models the server serves (`--model NAME=...`); NULL is the default model, which
every session made before this revision keeps. A plain added column: on SQLite no table is rebuilt, so the FTS5
triggers of 0003 stay as they are.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = 200


def upgrade() -> None:
    op.add_column("sessions", sa.Column("model", sa.String(NAME), nullable=True))


def downgrade() -> None:
    """Sessions go back to the default model."""
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE sessions DROP COLUMN model")  # SQLite >= 3.35, in place (no table rebuild)
    else:
        op.drop_column("sessions", "model")
