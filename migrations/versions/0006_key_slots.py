"""key slots: `--max-concurrent-per-key` across replicas sharing the database

`key_slots` holds the units of the engine each API key's running generations hold, by replica, until
`expires_at` (renewed with the replica's heartbeat). Only a server started with the cap writes here.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = 200


def upgrade() -> None:
    op.create_table(
        "key_slots",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("owner", sa.String(64), nullable=False),
        sa.Column("replica", sa.String(NAME), nullable=False),
        sa.Column("units", sa.Integer(), server_default="1", nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_key_slots"),
    )
    op.create_index("ix_key_slots_owner", "key_slots", ["owner"])
    op.create_index("ix_key_slots_replica", "key_slots", ["replica"])


def downgrade() -> None:
    op.drop_index("ix_key_slots_replica", table_name="key_slots")
    op.drop_index("ix_key_slots_owner", table_name="key_slots")
    op.drop_table("key_slots")
