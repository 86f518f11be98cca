"""Graceful-restart checkpoints kept in a server database (``checkpoints`` table).

A sidecar stopped with streams under way hands them to the next instance on
the same node (see :mod:`sniffer.runtime.daemon`). With SQLite the hand-over is
a private file next to the database; with a server database (PostgreSQL, where
a fleet of sidecars writes into one database) it is this table, one row per
``node``.

Example::

    save_checkpoint(engine, "gpu-07", {"version": 1, "entries": [...]})
    doc = take_checkpoint(engine, "gpu-07")  # the document, and the row is gone
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlalchemy import Engine

__all__ = ["save_checkpoint", "take_checkpoint"]


def save_checkpoint(engine: Engine, node: str, doc: dict[str, Any]) -> None:
    """Replace ``node``'s checkpoint with ``doc`` (JSON-ready), in one transaction."""
    from sqlalchemy import delete, insert

    from sniffer.store.models import checkpoints

    written_at = float(doc.get("written_at") or time.time())
    with engine.begin() as conn:
        conn.execute(delete(checkpoints).where(checkpoints.c.node == node))
        conn.execute(
            insert(checkpoints).values(node=node, written_at=written_at, payload=json.dumps(doc))
        )


def take_checkpoint(engine: Engine, node: str) -> dict[str, Any] | None:
    """``node``'s checkpoint, deleted in the same transaction (an instance
    adopts it once), or None. Raises ``ValueError`` for a payload that is not a
    JSON object (the row is deleted all the same)."""
    from sqlalchemy import delete, select

    from sniffer.store.models import checkpoints

    with engine.begin() as conn:
        row = conn.execute(select(checkpoints.c.payload).where(checkpoints.c.node == node)).first()
        if row is None:
            return None
        conn.execute(delete(checkpoints).where(checkpoints.c.node == node))
    doc = json.loads(row[0])
    if not isinstance(doc, dict):
        raise ValueError("checkpoint payload is not a JSON object")
    return doc
