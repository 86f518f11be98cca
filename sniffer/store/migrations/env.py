"""Alembic environment: runs on the connection ``sniffer.store.schema`` hands over.

The caller has already begun a transaction on that connection and holds the
migration lock inside it (PostgreSQL advisory lock, SQLite ``BEGIN
IMMEDIATE``); Alembic sees an external transaction and leaves the commit to
the caller.
"""

from __future__ import annotations

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection)
with context.begin_transaction():
    context.run_migrations()
