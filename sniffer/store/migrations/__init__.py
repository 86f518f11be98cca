"""Alembic migrations of the store's schema, run by ``sniffer.store.schema``.

They ship inside the package and run programmatically (``env.py`` takes the
connection from ``config.attributes``): no ``alembic.ini`` is needed at run
time. Each file in ``versions/`` is a frozen snapshot of one step; never edit
a released one, add the next. ``0001`` is the v0.1 schema (with the
``streams.text_kept`` column that v0.1 added on open) and also brings a v0.1
database, which has no ``alembic_version`` table, to that revision in place.
"""
