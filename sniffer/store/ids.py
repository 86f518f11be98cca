"""Connection and stream ids that never collide, whatever the number of writers.

The pipeline numbers connections and streams itself (the rows of one stream
reference its id before anything is written), so ids cannot come from an
autoincrement column. Instead every writer *reserves blocks* of ids from the
``id_blocks`` table — the hi/lo ("pooled") scheme of ORMs, with the database
as the single source of truth:

    UPDATE id_blocks SET next_id = next_id + :size WHERE name = :kind RETURNING next_id

One statement in its own short transaction. PostgreSQL serialises concurrent
updates of the row (the second waits for the first's commit, then re-reads
the new value), SQLite takes its write lock: each caller gets a range nobody
else will ever get, on any number of concurrent sidecars, replay workers or
restarts (ids are never reused, since ``next_id`` only grows and survives
restarts in the database). A PostgreSQL ``SEQUENCE`` would serve too, but
hands out fixed-size blocks (``INCREMENT BY``) and has no SQLite
equivalent; the counter row gives variable block sizes with one code path
on both databases.

Block sizes start small (a short replay leaves few unused ids behind: ids
stay dense in the common one-writer case) and double on each refill up to
:data:`MAX_BLOCK`, so a busy daemon reserves rarely (every 65,536 ids at
most). Ids unused when a process stops are simply skipped. The driver calls
:meth:`IdBlocks.prefetch` off the hot path (after each flush), which reserves
the next block while half of the current one is still unused, so that the
pipeline, which calls the allocator, normally never waits for the database.

When the database is unreachable and the ids in hand run out, the allocator
raises :class:`IdsUnavailable` instead of guessing an id another writer may
use: the pipeline records that as a dropped segment or connection (an error
row and a counter), capture goes on, and numbering resumes with the next
block once the database answers. Rows could not be written meanwhile anyway.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from operator import length_hint

from sniffer.store.db import Store

#: First block a writer reserves, and the largest.
FIRST_BLOCK = 64
MAX_BLOCK = 65536

#: The kinds of ids reserved (rows of ``id_blocks``).
KINDS = ("connections", "streams")


#: Move one ``id_blocks`` row on; returns its new ``next_id`` (SQLite and PostgreSQL).
_RESERVE = (
    "UPDATE id_blocks SET next_id=(id_blocks.next_id + ?) "
    "WHERE id_blocks.name = ? RETURNING id_blocks.next_id"
)


def reserve(store: Store, kind: str, size: int) -> range:
    """Reserve ``size`` consecutive ids of ``kind`` (one short transaction) in the
    store (``sniffer.store.db``)."""
    if kind not in KINDS:
        raise ValueError(f"unknown id kind {kind!r}")
    with store.transaction() as tx:
        rows = tx.execute(_RESERVE, (size, kind))
    if len(rows) != 1:
        raise LookupError(f"{len(rows)} id_blocks rows named {kind!r}")
    end = int(rows[0][0])
    return range(end - size, end)


def peek(store: Store, kind: str) -> int:
    """The next id of ``kind`` nobody has reserved yet (informative only)."""
    found = store.query("SELECT id_blocks.next_id FROM id_blocks WHERE id_blocks.name = ?", [kind])
    if len(found) != 1:
        raise LookupError(f"{len(found)} id_blocks rows named {kind!r}")
    return int(found[0][0])


class IdsUnavailable(RuntimeError):
    """No id left in hand and no block could be reserved (the database is unreachable)."""


class IdBlocks:
    """A callable handing out ids of one kind from reserved blocks (thread-safe).

    Example: ``ids = IdBlocks(store, "streams"); first = ids(); second = ids()``.
    """

    def __init__(
        self,
        store: Store,
        kind: str,
        *,
        first: int = FIRST_BLOCK,
        max_block: int = MAX_BLOCK,
    ) -> None:
        self.store = store
        self.kind = kind
        self._size = max(1, first)
        self._max = max(self._size, max_block)
        self._lock = threading.Lock()
        self._current: range = range(0)
        #: the ids of ``_current`` not handed out yet (a range iterator: its
        #: ``next`` is one C call, atomic under the GIL, so the usual call
        #: takes no lock)
        self._ids: Iterator[int] = iter(self._current)
        self._spare: range | None = None
        #: blocks reserved, and failed prefetches (the database was unreachable)
        self.blocks = 0
        self.prefetch_failures = 0
        self.failures = 0  # calls that found no id (IdsUnavailable)

    def _reserve(self) -> range:
        block = reserve(self.store, self.kind, self._size)
        self.blocks += 1
        self._size = min(self._size * 2, self._max)
        return block

    def __call__(self) -> int:
        value = next(self._ids, None)
        if value is not None:
            return value
        with self._lock:
            value = next(self._ids, None)  # (another thread may have moved on)
            if value is not None:
                return value
            if self._spare is not None:
                self._current, self._spare = self._spare, None
            else:
                try:
                    self._current = self._reserve()
                except Exception as exc:
                    self.failures += 1
                    raise IdsUnavailable(
                        f"no {self.kind} id left and none could be reserved: "
                        f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    ) from exc
            value = self._current[0]
            self._ids = iter(self._current[1:])
            return value

    def _used(self) -> int:
        """Ids of the current block handed out."""
        return len(self._current) - length_hint(self._ids)

    @property
    def remaining(self) -> int:
        """Ids left without another reservation."""
        return length_hint(self._ids) + (len(self._spare) if self._spare else 0)

    def prefetch(self) -> bool:
        """Reserve the next block now if half of the current one is used.

        Never raises: a database error is counted and retried on the next call
        (the ids in hand keep the pipeline going meanwhile). True if a block
        was reserved.
        """
        with self._lock:
            if self._spare is not None or self._used() * 2 < len(self._current):
                return False
            try:
                self._spare = self._reserve()
            except Exception:
                self.prefetch_failures += 1
                return False
            return True


__all__ = [
    "FIRST_BLOCK",
    "KINDS",
    "MAX_BLOCK",
    "IdBlocks",
    "IdsUnavailable",
    "peek",
    "reserve",
]
