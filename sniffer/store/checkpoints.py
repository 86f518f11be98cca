"""Graceful-restart checkpoints kept in a server database (``checkpoints`` table).

A sidecar stopped with streams under way hands them to the next instance on
the same node (see :mod:`sniffer.runtime.daemon`). With SQLite the hand-over is
a private file next to the database; with a server database (PostgreSQL, where
a fleet of sidecars writes into one database) it is this table, one row per
``node``.

Example::

    save_checkpoint(store, "gpu-07", {"version": 1, "entries": [...]})
    doc = take_checkpoint(store, "gpu-07")  # the document, and the row is gone
"""

from __future__ import annotations

import json
import time
from typing import Any

from sniffer.store.db import Store

__all__ = ["save_checkpoint", "take_checkpoint"]


def save_checkpoint(store: Store, node: str, doc: dict[str, Any]) -> None:
    """Replace ``node``'s checkpoint with ``doc`` (JSON-ready), in one transaction."""
    written_at = float(doc.get("written_at") or time.time())
    with store.transaction() as tx:
        tx.execute("DELETE FROM checkpoints WHERE checkpoints.node = ?", [node])
        tx.execute(
            "INSERT INTO checkpoints (node, written_at, payload) VALUES (?, ?, ?)",
            [node, written_at, json.dumps(doc)],
        )


def take_checkpoint(store: Store, node: str) -> dict[str, Any] | None:
    """``node``'s checkpoint, deleted in the same transaction (an instance
    adopts it once), or None. Raises ``ValueError`` for a payload that is not a
    JSON object (the row is deleted all the same)."""
    with store.transaction() as tx:
        rows = tx.execute(
            "SELECT checkpoints.payload FROM checkpoints WHERE checkpoints.node = ?", [node]
        )
        if not rows:
            return None
        tx.execute("DELETE FROM checkpoints WHERE checkpoints.node = ?", [node])
    doc = json.loads(rows[0][0])
    if not isinstance(doc, dict):
        raise ValueError("checkpoint payload is not a JSON object")
    return doc
