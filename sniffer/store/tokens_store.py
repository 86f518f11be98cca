"""Token tables: what the token pass (``sniffer.record.tokenize_pass``) found per stream.

Specified with the capture tables (``sniffer.store.spec``); created, like them,
by the migration chain (``sniffer.store.migrations``), which
:func:`create_token_tables` runs (safe to call repeatedly). The rows are values
(:class:`StreamTokenRow`, :class:`ChoiceTokenRow`, :class:`TokenAnomalyRow`);
every query on these tables, the token pass's included, is written here once on
a ``sniffer.store.db.Store`` (a SQLite file through the standard library's
driver, no SQLAlchemy; or an engine).

``stream_tokens`` — one row per analysed stream (its presence means "done").

    stream_id       streams.id (primary key)
    tokenizer       the tokenizer used: the configured source, or
                    ``"default:deepseek-v4"`` when the model has none configured
    is_default      no tokenizer is configured for the stream's model
    prompt_count    prompt token count (chat template or fallback), NULL when
                    the request carried no prompt
    prompt_ids      JSON list of the prompt's token ids (-1: over redacted text)
    output_count    token count of all choices' full texts
    usage_diff      JSON object {field: server-reported minus counted}
    tokens_per_chunk JSON object {"<tokens>": <text chunks with that many>}
    anomaly_count   anomalies found (listed ones plus capped ones)
    error           the analysis of this stream failed (the message); other
                    columns are then empty. The row still marks it as done.

``choice_tokens`` — one row per (stream, choice) that carried text.

    stream_id, choice
    text_len        characters of the choice's full text (deltas joined by seq)
    text_hash       blake2b-128 hex of its UTF-8 bytes (``surrogatepass``): the
                    stored full text, compared by ``verify`` with the deltas
    token_count     len(output_ids)
    output_ids      JSON list: token ids of the full text; -1 where a token
                    overlaps text that redaction removed (``sniffer.record.redact``)
    chunk_seqs      JSON list: seq of each text chunk of the choice, in seq order
    chunk_counts    JSON list: tokens attributed to each of those chunks. The
                    per-chunk ids are slices of ``output_ids``: chunk k gets
                    ``output_ids[sum(chunk_counts[:k]) : sum(chunk_counts[:k+1])]``
                    (:func:`chunk_token_ids` does it). One row per choice instead
                    of one per chunk: a 72k-chunk replay writes ~1.2k rows here.
    straddles       number of tokens that straddle a chunk boundary
    straddle_seqs   JSON list: seq of the chunk each straddling token starts in
                    (repeated when one chunk starts several)
    tokens_per_chunk JSON object {"<tokens>": <chunks>} of this choice
    server_count    number of server-reported tokens (logprobs), NULL when none
    server_tokens   JSON list of the server-reported token texts
                    (``<REDACTED>`` over redacted text)
    server_ids      JSON list of our ids for them (null where unmapped, -1
                    over redacted text)
    server_mismatch index of the first server token that differs from ours
                    (NULL when they agree or there are none)

``token_anomalies`` — one row per listed anomaly (see ``sniffer.llm.tokens``).

    id, stream_id, choice (-1: the stream), kind, position, detail
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import field
from itertools import repeat
from operator import attrgetter
from typing import Any

import orjson as _orjson

from sniffer.llm.tokens import Anomaly, AnomalyColumns
from sniffer.llm.values import slot_dataclass, slot_init
from sniffer.store import spec
from sniffer.store.db import Store, Transaction, as_bools, in_list
from sniffer.store.lite import PLAIN_HTTP

__all__ = [
    "ChoiceTokenRow",
    "StreamTokenRow",
    "TokenAnomalyRow",
    "chunk_token_ids",
    "create_token_tables",
    "delete_token_rows",
    "insert_token_rows",
    "int_keys",
    "json_or",
    "pending_count",
    "read_pending",
    "read_token_rows",
    "text_hash",
    "write_token_rows",
]

_TABLES = ("stream_tokens", "choice_tokens", "token_anomalies")
_OUTPUT_IDS = attrgetter("output_ids")


@slot_init  # one per choice of every stream the token pass writes
@slot_dataclass(frozen=True, slots=True)
class ChoiceTokenRow:
    """The ``choice_tokens`` row of one choice of a stream."""

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


#: One ``token_anomalies`` row (its stream's id apart): the analysis's own
#: value (``kind``, ``choice``, ``position``, ``detail``). The token pass's
#: rows hold them in columns (``sniffer.llm.tokens.AnomalyColumns``, as the
#: analysis made them): no object per anomaly (a few dozen per stream).
TokenAnomalyRow = Anomaly


@slot_init  # one per stream the token pass writes
@slot_dataclass(frozen=True, slots=True)
class StreamTokenRow:
    """The ``stream_tokens`` row of one stream, with its choices and anomalies."""

    stream_id: int
    tokenizer: str | None
    is_default: bool
    prompt_ids: tuple[int, ...] | None
    usage_diff: dict[str, int] = field(default_factory=dict)
    tokens_per_chunk: dict[int, int] = field(default_factory=dict)
    anomaly_count: int = 0
    error: str | None = None
    choices: tuple[ChoiceTokenRow, ...] = ()
    #: an ``AnomalyColumns`` from the token pass, a tuple when read back
    anomalies: Sequence[TokenAnomalyRow] = ()

    @property
    def output_count(self) -> int:
        return sum(map(len, map(_OUTPUT_IDS, self.choices)))


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


def read_token_rows(store: Store, stream_ids: Iterable[int]) -> dict[int, StreamTokenRow]:
    """The stored token rows of these streams (streams without a row are absent)."""
    ids = list(stream_ids)
    out: dict[int, StreamTokenRow] = {}
    for start in range(0, len(ids), 500):
        part = ids[start : start + 500]
        choices: dict[int, list[ChoiceTokenRow]] = {}
        for row in store.query(
            "SELECT stream_id, choice, text_len, text_hash, output_ids, chunk_seqs, "
            "chunk_counts, straddle_seqs, tokens_per_chunk, server_tokens, server_ids, "
            f"server_mismatch FROM choice_tokens WHERE stream_id IN {in_list(part)} "
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
            f"WHERE stream_id IN {in_list(part)} ORDER BY stream_id, id",
            part,
        ):
            anomalies.setdefault(sid, []).append(
                TokenAnomalyRow(kind, choice, position, detail or "")
            )
        for row in store.query(
            "SELECT stream_id, tokenizer, is_default, prompt_ids, usage_diff, "
            "tokens_per_chunk, anomaly_count, error FROM stream_tokens "
            f"WHERE stream_id IN {in_list(part)}",
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


def create_token_tables(store: Store) -> None:
    """Make sure the token tables exist: they are part of the migration chain, so
    this brings the database to the current schema (``Store.migrate``, under the
    migration lock); a no-op (one query) when it is there already."""
    store.migrate()


_NON_STR_KEYS = _orjson.OPT_NON_STR_KEYS


def _dumps(value: Any) -> str:
    """Compact JSON of a list, tuple or dict (orjson: token id lists are the
    bulk of a token pass's writes). Integer dict keys become strings, as
    ``json`` makes them."""
    try:
        text: str = _orjson.dumps(value, option=_NON_STR_KEYS).decode()
        return text
    except (TypeError, _orjson.JSONEncodeError):  # what orjson refuses, json may take
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


#: orjson's serializer, called inline by the row builders (a call to
#: :func:`_dumps` per JSON column cost a tenth of the writes); what it
#: refuses, they leave to :func:`_dumps`.
_DUMP = _orjson.dumps
_REFUSED = (TypeError, _orjson.JSONEncodeError)


#: The columns of each token table the token pass fills, in table order
#: (``sniffer.store.spec``; the anomaly ids are the database's).
_STREAM_TOKEN_COLUMNS = spec.TABLE_COLUMNS["stream_tokens"]
_CHOICE_TOKEN_COLUMNS = spec.TABLE_COLUMNS["choice_tokens"]
_ANOMALY_COLUMNS = spec.TABLE_COLUMNS["token_anomalies"][1:]


def _stream_values(r: StreamTokenRow) -> tuple[Any, ...]:
    prompt = r.prompt_ids
    usage, per_chunk = r.usage_diff, r.tokens_per_chunk
    try:
        prompt_json = None if prompt is None else _DUMP(prompt).decode()
        usage_json = _DUMP(usage).decode()
        per_chunk_json = _DUMP(per_chunk, option=_NON_STR_KEYS).decode()
    except _REFUSED:
        prompt_json = None if prompt is None else _dumps(prompt)
        usage_json, per_chunk_json = _dumps(usage), _dumps(per_chunk)
    return (
        r.stream_id,
        r.tokenizer,
        r.is_default,
        None if prompt is None else len(prompt),
        prompt_json,
        r.output_count,
        usage_json,
        per_chunk_json,
        r.anomaly_count,
        r.error,
    )


def _choice_values(stream_id: int, c: ChoiceTokenRow) -> tuple[Any, ...]:
    server = c.server_tokens
    columns = (c.output_ids, c.chunk_seqs, c.chunk_counts, c.straddle_seqs)
    try:
        output_ids, seqs, counts, straddles = (
            _DUMP(columns[0]).decode(),
            _DUMP(columns[1]).decode(),
            _DUMP(columns[2]).decode(),
            _DUMP(columns[3]).decode(),
        )
        per_chunk = _DUMP(c.tokens_per_chunk, option=_NON_STR_KEYS).decode()
    except _REFUSED:
        output_ids, seqs, counts, straddles = map(_dumps, columns)
        per_chunk = _dumps(c.tokens_per_chunk)
    return (
        stream_id,
        c.choice,
        c.text_len,
        c.text_hash,
        len(c.output_ids),
        output_ids,
        seqs,
        counts,
        len(c.straddle_seqs),
        straddles,
        per_chunk,
        None if server is None else len(server),
        None if server is None else _dumps(server),
        None if c.server_ids is None else _dumps(c.server_ids),
        c.server_mismatch,
    )


def write_token_rows(tx: Transaction, rows: Sequence[StreamTokenRow]) -> None:
    """Insert the rows of analysed streams in ``tx`` (the caller's transaction):
    positional rows per table, straight through the driver
    (``Transaction.insert_many``: on SQLite several rows per statement; the
    live traffic's streams have some 35 ``token_anomalies`` rows each, one
    statement per row was a quarter of its token pass). The anomaly ids are
    those one statement per row would give.

    Raises one of the store's ``integrity_errors`` when a stream already has a
    row (another pass got there first); the caller rolls back and retries
    without it.
    """
    if not rows:
        return
    _insert_trimmed(
        tx, "stream_tokens", _STREAM_TOKEN_COLUMNS, [_stream_values(r) for r in rows], 1
    )
    _insert_trimmed(
        tx,
        "choice_tokens",
        _CHOICE_TOKEN_COLUMNS,
        [_choice_values(r.stream_id, c) for r in rows for c in r.choices],
        4,
    )
    tx.insert_flat("token_anomalies", _ANOMALY_COLUMNS, _anomaly_values(rows))


def _insert_trimmed(
    tx: Transaction, table: str, columns: tuple[str, ...], rows: list[tuple[Any, ...]], last: int
) -> None:
    """``tx.insert_many`` of ``rows`` in their order, each run of rows whose
    ``last`` values are all None without those columns (NULL all the same):
    sqlite3 binds a None through its adapter (a look-up and a call, about
    1,170 instructions), and nearly every stream row has no ``error``, every
    choice row no server tokens (its last four columns)."""
    keep = len(columns) - last
    nones = (None,) * last
    start = 0
    trimmed = False
    for i, row in enumerate(rows):
        t = row[keep:] == nones
        if t != trimmed and i > start:
            _insert_run(tx, table, columns, rows[start:i], keep if trimmed else None)
            start = i
        trimmed = t
    if start < len(rows):
        _insert_run(tx, table, columns, rows[start:], keep if trimmed else None)


def _insert_run(
    tx: Transaction,
    table: str,
    columns: tuple[str, ...],
    rows: list[tuple[Any, ...]],
    keep: int | None,
) -> None:
    if keep is None:
        tx.insert_many(table, columns, rows)
    else:
        tx.insert_many(table, columns[:keep], [row[:keep] for row in rows])


def _anomaly_values(rows: Sequence[StreamTokenRow]) -> list[Any]:
    """The ``token_anomalies`` rows of ``rows``, their values one after another
    (``Transaction.insert_flat``), made from their columns: the columns of
    every stream joined, then a slice assignment per column (no tuple per
    anomaly; the live traffic's streams have some 35 anomalies each)."""
    sids: list[int] = []
    choices: list[int] = []
    kinds: list[str] = []
    positions: list[int | None] = []
    details: list[str] = []
    for r in rows:
        if r.anomalies:
            a = AnomalyColumns.of(r.anomalies)
            sids += repeat(r.stream_id, len(a.kinds))
            choices += a.choices
            kinds += a.kinds
            positions += a.positions
            details += a.details
    n = len(_ANOMALY_COLUMNS)
    out: list[Any] = [None] * (n * len(sids))
    out[0::n] = sids
    out[1::n] = choices
    out[2::n] = kinds
    out[3::n] = positions
    out[4::n] = details
    return out


def delete_token_rows(store: Store, stream_ids: Iterable[int] | None = None) -> None:
    """Delete the token rows of these streams (all streams when None), in one
    transaction, so that the next pass analyses them again."""
    ids = None if stream_ids is None else list(stream_ids)
    with store.transaction() as tx:
        for table in _TABLES:
            if ids is None:
                tx.run(f"DELETE FROM {table}")
            elif ids:
                tx.run(f"DELETE FROM {table} WHERE {table}.stream_id IN {in_list(ids)}", ids)


# ---------------------------------------------------------------------------
# the token pass's queries (``sniffer.record.tokenize_pass``)
# ---------------------------------------------------------------------------

#: Closed LLM streams without a token row: what the token pass tokenizes.
_PENDING = (
    "FROM streams LEFT OUTER JOIN stream_tokens ON stream_tokens.stream_id = streams.id "
    "WHERE streams.closed_at IS NOT NULL AND streams.state != 'open' "
    f"AND streams.dialect IS NOT NULL AND streams.dialect != '{PLAIN_HTTP}' "
    "AND stream_tokens.stream_id IS NULL"
)

_STREAM_COLUMNS = spec.TABLE_COLUMNS["streams"]


def pending_count(store: Store) -> int:
    """Closed LLM streams without a token row (what the token pass tokenizes)."""
    create_token_tables(store)
    return int(store.scalar(f"SELECT count(*) {_PENDING}") or 0)


def read_pending(
    store: Store,
    size: int,
    *,
    after: int | None = None,
    stream_ids: Sequence[int] | None = None,
) -> tuple[list[dict[str, Any]], list[tuple[Any, ...]]]:
    """One batch of the token pass: up to ``size`` pending streams (whole rows, in
    id order, ids above ``after``, only ``stream_ids`` when given) and their chunk
    tuples ``(stream_id, seq, choice, text, finish_reason, logprobs)`` by stream
    and seq (choice -1 and text "" for NULL); ``([], [])`` when none is left."""
    sql = f"SELECT {', '.join(f'streams.{c}' for c in _STREAM_COLUMNS)} {_PENDING}"
    params: list[Any] = []
    if stream_ids is not None:
        ids = list(stream_ids)
        if not ids:
            return [], []
        sql += f" AND streams.id IN {in_list(ids)}"
        params.extend(ids)
    if after is not None:
        sql += " AND streams.id > ?"
        params.append(after)
    sql += " ORDER BY streams.id LIMIT ?"
    params.append(size)
    srows = [
        as_bools(dict(zip(_STREAM_COLUMNS, row, strict=True)), "streams")
        for row in store.query(sql, params)
    ]
    if not srows:
        return [], []
    ids = [r["id"] for r in srows]
    chunks = store.query(
        "SELECT chunks.stream_id, chunks.seq, coalesce(chunks.choice, -1), "
        "coalesce(chunks.text, ''), chunks.finish_reason, chunks.logprobs FROM chunks "
        f"WHERE chunks.stream_id IN {in_list(ids)} "
        "ORDER BY chunks.stream_id, chunks.seq, chunks.id",
        ids,
    )
    return srows, chunks


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def insert_token_rows(
    store: Store, rows: list[StreamTokenRow]
) -> tuple[list[StreamTokenRow], int, str | None]:
    """Write a batch of token rows in one transaction; on a collision with another
    pass, once more without the streams it already wrote. Returns (the rows
    written, the rows skipped so, the database's error when it refused the batch:
    nothing written)."""
    try:
        with store.transaction() as tx:
            write_token_rows(tx, rows)
        return rows, 0, None
    except store.integrity_errors:
        pass
    except store.errors as exc:
        return [], 0, _error_text(exc)
    ids = [r.stream_id for r in rows]
    try:
        with store.transaction() as tx:
            done = {
                sid
                for (sid,) in tx.execute(
                    "SELECT stream_tokens.stream_id FROM stream_tokens "
                    f"WHERE stream_tokens.stream_id IN {in_list(ids)}",
                    ids,
                )
            }
            todo = [r for r in rows if r.stream_id not in done]
            write_token_rows(tx, todo)
    except store.errors as exc:
        return [], 0, _error_text(exc)
    return todo, len(rows) - len(todo), None


def chunk_token_ids(row: ChoiceTokenRow) -> list[tuple[int, tuple[int, ...]]]:
    """(seq, token ids) of every text chunk of a choice, sliced from ``output_ids``."""
    out: list[tuple[int, tuple[int, ...]]] = []
    pos = 0
    for seq, n in zip(row.chunk_seqs, row.chunk_counts, strict=False):
        out.append((seq, row.output_ids[pos : pos + n]))
        pos += n
    return out
