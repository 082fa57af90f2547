"""session owners, session versions, idempotency keys

Revision ID: 0002
Revises: 0001
Create Date: 2025-02-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Sessions made before keys existed belong to "" (the keyless server); no key reaches them.
    op.add_column("sessions", sa.Column("owner", sa.String(32), nullable=False, server_default=""))
    op.add_column("sessions", sa.Column("version", sa.Integer(), nullable=False, server_default="0"))
    op.create_index("ix_sessions_owner_updated_at", "sessions", ["owner", "updated_at"])
    op.add_column("messages", sa.Column("idempotency_key", sa.String(64), nullable=True))
    op.create_index(
        "uq_messages_session_id_idempotency_key", "messages", ["session_id", "idempotency_key"], unique=True
    )


def downgrade() -> None:
    op.drop_index("uq_messages_session_id_idempotency_key", table_name="messages")
    with op.batch_alter_table("messages") as batch:
        batch.drop_column("idempotency_key")
    op.drop_index("ix_sessions_owner_updated_at", table_name="sessions")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("version")
        batch.drop_column("owner")
