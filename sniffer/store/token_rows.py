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

from sniffer.store.db import in_list as _in

if TYPE_CHECKING:
    from sniffer.store.db import Store

__all__ = [
    "ChoiceTokenRow",
    "StreamTokenRow",
    "TokenAnomalyRow",
    "int_keys",
    "json_or",
    "read_token_rows",
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
