"""The token pass's rows as values, and their reader for a SQLite file, without SQLAlchemy.

The tables and their writer live in ``sniffer.store.tokens_store`` (SQLAlchemy
Core); the values they hold are these dataclasses, kept here so that ``verify``
can read a SQLite file at the schema head through the standard library's driver
(``sniffer.store.lite``) and build the very same values
(:func:`read_token_rows`; a test compares it with ``read_stream_tokens``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson as _orjson

from sniffer.store import spec
from sniffer.store.db import in_list as _in

if TYPE_CHECKING:
    from sniffer.store.db import Store
    from sniffer.store.lite import SqliteFile

__all__ = [
    "ANOMALY_COLUMNS",
    "CHOICE_COLUMNS",
    "STREAM_COLUMNS",
    "ChoiceTokenRow",
    "StreamTokenRow",
    "TokenAnomalyRow",
    "anomaly_values",
    "choice_values",
    "insert_sqlite",
    "int_keys",
    "json_or",
    "read_token_rows",
    "stream_values",
    "text_hash",
]


@dataclass(frozen=True, slots=True)
class ChoiceTokenRow:
    choice: int
    text_len: int
    text_hash: str
    output_ids: tuple[int, ...]
    chunk_seqs: tuple[int, ...]
    chunk_counts: tuple[int, ...]
    straddle_seqs: tuple[int, ...]
    tokens_per_chunk: dict[int, int]
    server_tokens: tuple[str, ...] | None = None
    server_ids: tuple[int | None, ...] | None = None
    server_mismatch: int | None = None


@dataclass(frozen=True, slots=True)
class TokenAnomalyRow:
    choice: int
    kind: str
    position: int | None
    detail: str


@dataclass(frozen=True, slots=True)
class StreamTokenRow:
    stream_id: int
    tokenizer: str | None
    is_default: bool
    prompt_ids: tuple[int, ...] | None
    usage_diff: dict[str, int] = field(default_factory=dict)
    tokens_per_chunk: dict[int, int] = field(default_factory=dict)
    anomaly_count: int = 0
    error: str | None = None
    choices: tuple[ChoiceTokenRow, ...] = ()
    anomalies: tuple[TokenAnomalyRow, ...] = ()

    @property
    def output_count(self) -> int:
        return sum(len(c.output_ids) for c in self.choices)


def text_hash(text: str) -> str:
    """The ``choice_tokens.text_hash`` of a text: blake2b-128 hex of its UTF-8 bytes
    (``surrogatepass``; the token pass stores it, ``verify`` compares it)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def json_or(text: str | None, default: Any) -> Any:
    """The JSON value of ``text``; ``default`` for NULL or text that is not JSON."""
    if text is None:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


def int_keys(d: Any) -> dict[int, int]:
    """A JSON object as ``{int: int}``, sorted by key (entries that are not, dropped)."""
    if not isinstance(d, dict):
        return {}
    out: dict[int, int] = {}
    for k, v in d.items():
        try:
            out[int(k)] = int(v)
        except (TypeError, ValueError):
            continue
    return dict(sorted(out.items()))


def _dumps(value: Any) -> str:
    """Compact JSON of a list, tuple or dict (orjson: token id lists are the
    bulk of a token pass's writes). Integer dict keys become strings, as
    ``json`` makes them."""
    try:
        text: str = _orjson.dumps(value, option=_orjson.OPT_NON_STR_KEYS).decode()
        return text
    except (TypeError, _orjson.JSONEncodeError):  # what orjson refuses, json may take
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


#: The columns the token pass fills, in table order (``sniffer.store.spec``; the
#: anomaly ids are the database's).
STREAM_COLUMNS = spec.TABLE_COLUMNS["stream_tokens"]
CHOICE_COLUMNS = spec.TABLE_COLUMNS["choice_tokens"]
ANOMALY_COLUMNS = spec.TABLE_COLUMNS["token_anomalies"][1:]


def stream_values(r: StreamTokenRow) -> tuple[Any, ...]:
    """The ``stream_tokens`` row of ``r`` (``STREAM_COLUMNS``)."""
    return (
        r.stream_id,
        r.tokenizer,
        r.is_default,
        None if r.prompt_ids is None else len(r.prompt_ids),
        None if r.prompt_ids is None else _dumps(r.prompt_ids),
        r.output_count,
        _dumps(r.usage_diff),
        _dumps(r.tokens_per_chunk),
        r.anomaly_count,
        r.error,
    )


def choice_values(stream_id: int, c: ChoiceTokenRow) -> tuple[Any, ...]:
    """The ``choice_tokens`` row of one choice (``CHOICE_COLUMNS``)."""
    return (
        stream_id,
        c.choice,
        c.text_len,
        c.text_hash,
        len(c.output_ids),
        _dumps(c.output_ids),
        _dumps(c.chunk_seqs),
        _dumps(c.chunk_counts),
        len(c.straddle_seqs),
        _dumps(c.straddle_seqs),
        _dumps(c.tokens_per_chunk),
        None if c.server_tokens is None else len(c.server_tokens),
        None if c.server_tokens is None else _dumps(c.server_tokens),
        None if c.server_ids is None else _dumps(c.server_ids),
        c.server_mismatch,
    )


def anomaly_values(rows: Iterable[StreamTokenRow]) -> list[tuple[Any, ...]]:
    """The ``token_anomalies`` rows of ``rows`` (``ANOMALY_COLUMNS``)."""
    return [
        (r.stream_id, a.choice, a.kind, a.position, a.detail) for r in rows for a in r.anomalies
    ]


def _write_sqlite(tx: Any, rows: list[StreamTokenRow]) -> None:
    from sniffer.store.lite import insert_sql

    if not rows:
        return
    tx.exec_driver_sql(
        insert_sql("stream_tokens", STREAM_COLUMNS), [stream_values(r) for r in rows]
    )
    choice_rows = [choice_values(r.stream_id, c) for r in rows for c in r.choices]
    if choice_rows:
        tx.exec_driver_sql(insert_sql("choice_tokens", CHOICE_COLUMNS), choice_rows)
    anomaly_rows = anomaly_values(rows)
    if anomaly_rows:
        tx.exec_driver_sql(insert_sql("token_anomalies", ANOMALY_COLUMNS), anomaly_rows)


def insert_sqlite(
    store: SqliteFile, rows: list[StreamTokenRow]
) -> tuple[list[StreamTokenRow], int, str | None]:
    """``sniffer.store.tokens_store.insert_token_rows`` on a SQLite file at the
    schema head through the standard library's driver (the same statements and
    values, without importing SQLAlchemy): one transaction; on a collision with
    another pass, once more without the streams it already wrote. Returns (the
    rows written, the rows skipped so, the database's error when it refused the
    batch: nothing written)."""
    import sqlite3

    try:
        with store.begin() as tx:
            _write_sqlite(tx, rows)
        return rows, 0, None
    except sqlite3.IntegrityError:
        pass
    except sqlite3.Error as exc:
        return [], 0, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    ids = [r.stream_id for r in rows]
    try:
        with store.begin() as tx:
            done: set[int] = set()
            for start in range(0, len(ids), 500):
                part = ids[start : start + 500]
                sql = f"SELECT stream_id FROM stream_tokens WHERE stream_id IN {_in(part)}"
                done.update(r[0] for r in tx.execute(sql, part))
            todo = [r for r in rows if r.stream_id not in done]
            _write_sqlite(tx, todo)
    except sqlite3.Error as exc:
        return [], 0, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return todo, len(rows) - len(todo), None


def read_token_rows(store: Store, stream_ids: Iterable[int]) -> dict[int, StreamTokenRow]:
    """The stored token rows of these streams (streams without a row are absent),
    (``sniffer.store.db``: a SQLite file through the standard library's driver, or
    an engine)."""
    ids = list(stream_ids)
    out: dict[int, StreamTokenRow] = {}
    for start in range(0, len(ids), 500):
        part = ids[start : start + 500]
        choices: dict[int, list[ChoiceTokenRow]] = {}
        for row in store.query(
            "SELECT stream_id, choice, text_len, text_hash, output_ids, chunk_seqs, "
            "chunk_counts, straddle_seqs, tokens_per_chunk, server_tokens, server_ids, "
            f"server_mismatch FROM choice_tokens WHERE stream_id IN {_in(part)} "
            "ORDER BY stream_id, choice",
            part,
        ):
            server = json_or(row[9], None)
            server_ids = json_or(row[10], None)
            choices.setdefault(row[0], []).append(
                ChoiceTokenRow(
                    choice=row[1],
                    text_len=row[2] or 0,
                    text_hash=row[3] or "",
                    output_ids=tuple(json_or(row[4], [])),
                    chunk_seqs=tuple(json_or(row[5], [])),
                    chunk_counts=tuple(json_or(row[6], [])),
                    straddle_seqs=tuple(json_or(row[7], [])),
                    tokens_per_chunk=int_keys(json_or(row[8], {})),
                    server_tokens=None if server is None else tuple(server),
                    server_ids=None if server_ids is None else tuple(server_ids),
                    server_mismatch=row[11],
                )
            )
        anomalies: dict[int, list[TokenAnomalyRow]] = {}
        for sid, choice, kind, position, detail in store.query(
            "SELECT stream_id, choice, kind, position, detail FROM token_anomalies "
            f"WHERE stream_id IN {_in(part)} ORDER BY stream_id, id",
            part,
        ):
            anomalies.setdefault(sid, []).append(
                TokenAnomalyRow(choice, kind, position, detail or "")
            )
        for row in store.query(
            "SELECT stream_id, tokenizer, is_default, prompt_ids, usage_diff, "
            "tokens_per_chunk, anomaly_count, error FROM stream_tokens "
            f"WHERE stream_id IN {_in(part)}",
            part,
        ):
            sid = row[0]
            prompt = json_or(row[3], None)
            usage = json_or(row[4], {})
            out[sid] = StreamTokenRow(
                stream_id=sid,
                tokenizer=row[1],
                is_default=bool(row[2]),
                prompt_ids=None if prompt is None else tuple(prompt),
                usage_diff=usage if isinstance(usage, dict) else {},
                tokens_per_chunk=int_keys(json_or(row[5], {})),
                anomaly_count=row[6] or 0,
                error=row[7],
                choices=tuple(choices.get(sid, ())),
                anomalies=tuple(anomalies.get(sid, ())),
            )
    return out
