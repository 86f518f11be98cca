"""Graceful-restart checkpoints in the database (for server databases).

Adds ``checkpoints``: one row per node, the restart checkpoint a gracefully
stopped sidecar wrote for the next instance on the same node (the streams it
was recording, as JSON). Many sidecars write into one PostgreSQL database, so
the row is keyed by ``node``. (A SQLite database keeps its checkpoint in a
file next to it; the table is there but unused.)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("node", sa.String(255), primary_key=True),
        sa.Column("written_at", sa.Float(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
    )
    op.get_bind().execute(sa.text("UPDATE meta SET value = '3' WHERE key = 'schema_version'"))


def downgrade() -> None:
    op.drop_table("checkpoints")
    op.get_bind().execute(sa.text("UPDATE meta SET value = '2' WHERE key = 'schema_version'"))
