"""Stream flags: what the tool noticed about a stream that its state does not say.

Adds ``streams.flags`` (JSON list of ``sniffer.core.events.StreamFlag`` names,
NULL when there are none and in rows written before): data the tool dropped
or could not trust (an item line over the cap, TCP overlaps with different
bytes, an event cap), and odd input it kept (a capture clock that went
backwards). ``verify`` fails a stream on the flags that mean lost data.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("streams", sa.Column("flags", sa.Text()))
    op.get_bind().execute(sa.text("UPDATE meta SET value = '4' WHERE key = 'schema_version'"))


def downgrade() -> None:
    op.drop_column("streams", "flags")
    op.get_bind().execute(sa.text("UPDATE meta SET value = '3' WHERE key = 'schema_version'"))
