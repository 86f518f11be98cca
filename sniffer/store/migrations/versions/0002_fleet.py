"""Fleet: the node of every row, and collision-free id blocks.

Adds ``node`` to ``connections``, ``streams`` and ``errors`` (NULL in rows
written before), an index on ``streams (node, t_request)``, and the
``id_blocks`` counter table from which writers reserve connection and stream
ids, started one past the largest id already in the database.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("connections", "streams", "errors"):
        op.add_column(table, sa.Column("node", sa.String(255)))
    op.create_index("ix_streams_node", "streams", ["node", "t_request"])
    id_blocks = op.create_table(
        "id_blocks",
        sa.Column("name", sa.String(32), primary_key=True),
        sa.Column("next_id", sa.BigInteger(), nullable=False),
    )
    bind = op.get_bind()
    rows = []
    for table in ("connections", "streams"):
        top = bind.execute(sa.text(f"SELECT max(id) FROM {table}")).scalar()
        rows.append({"name": table, "next_id": int(top or 0) + 1})
    op.bulk_insert(id_blocks, rows)
    bind.execute(sa.text("UPDATE meta SET value = '2' WHERE key = 'schema_version'"))


def downgrade() -> None:
    op.drop_table("id_blocks")
    op.drop_index("ix_streams_node", "streams")
    for table in ("errors", "streams", "connections"):
        op.drop_column(table, "node")
