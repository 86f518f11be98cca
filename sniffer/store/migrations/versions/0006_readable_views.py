"""Views for people who query the database by hand.

Creates ``streams_readable`` (each stream with ISO times or timestamps,
``ttft_ms`` and ``duration_ms``) and ``chunks_readable`` (each chunk with its
stream's node, label and model), from the statements in
``sniffer.store.views`` (documented in ``docs/schema.md``). SQLite and
PostgreSQL only; other dialects get no views. Views hold no rows: nothing
stored changes.

A later migration that rebuilds ``streams`` or ``chunks`` (SQLite's batch
mode copies a table) must drop these views first and re-create them after.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from sniffer.store.views import NAMES, VIEWS

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    bind = op.get_bind()
    for sql in VIEWS.get(bind.dialect.name, ()):
        op.execute(sql)
    bind.execute(sa.text("UPDATE meta SET value = '6' WHERE key = 'schema_version'"))


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name in VIEWS:
        for name in reversed(NAMES):
            op.execute(f"DROP VIEW {name}")
    bind.execute(sa.text("UPDATE meta SET value = '5' WHERE key = 'schema_version'"))
