"""The batch token pass: tokenize closed streams that have no token row yet.

Runs off the capture path: the daemon calls :func:`tokenize_db` periodically
from its own thread, ``sparseety replay`` after the capture (unless
``--no-tokens``), ``sparseety tokenize`` and ``sparseety verify`` on demand.

Each batch (``batch`` streams, 500 by default) is: one query for the stream
rows, one for their chunks, one :func:`sniffer.llm.tokens.analyze_streams` call
(the tokenizers' Rust batch encoders), one transaction writing the rows of
``sniffer.store.tokens_store``. Streams are taken in id order with keyset
pagination, so a pass always ends, even if a batch cannot be written.

Which streams: closed (``closed_at`` set, ``state`` not ``open``), of an LLM
dialect (``dialect`` not ``http``), without a ``stream_tokens`` row. A stream
whose analysis raises gets a row with ``error`` set (it is not retried by the
next pass; :func:`sniffer.store.tokens_store.delete_token_rows` re-queues it).

Two passes running at once (daemon thread and a CLI command) are safe: a
batch whose insert collides with rows the other pass wrote is retried once
without those streams.

Pure except the database: no clock, no logging, no printing.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, groupby, repeat
from operator import attrgetter, is_not, itemgetter, or_
from typing import Any

from sniffer.llm.logprobs import parse_server_tokens
from sniffer.llm.tokens import (
    AnomalyColumns,
    ChoiceChunks,
    ChunkColumns,
    ChunkInput,
    LoadedTokenizer,
    StreamInput,
    StreamTokens,
    TokenizerLoadError,
    TokenizerRegistry,
    analyze_streams,
    gc_paused,
    kind_counts,
)
from sniffer.llm.values import Usage, include_usage, json_or_none
from sniffer.store.db import Store
from sniffer.store.tokens_store import (
    ChoiceTokenRow,
    StreamTokenRow,
    create_token_tables,
    insert_token_rows,
    pending_count,
    read_pending,
    text_hash,
)

__all__ = [
    "TokenizeResult",
    "build_inputs",
    "pending_count",
    "text_hash",
    "to_rows",
    "tokenize_db",
]

#: progress(streams done, streams pending at the start)
Progress = Callable[[int, int], None]


@dataclass
class TokenizeResult:
    """What a token pass did (streams, tokens, anomalies, batches)."""

    streams: int = 0  # streams given a token row by this pass
    failed: int = 0  # of which the analysis raised (row with ``error``)
    tokens: int = 0  # output tokens counted
    prompt_tokens: int = 0
    chunks: int = 0  # text chunks attributed
    anomalies: int = 0
    batches: int = 0
    skipped: int = 0  # streams another pass wrote first
    write_errors: list[str] = field(default_factory=list)  # batches the database refused
    anomaly_kinds: dict[str, int] = field(default_factory=dict)


def build_inputs(
    stream_rows: Sequence[dict[str, Any]], chunk_rows: Sequence[dict[str, Any]]
) -> list[StreamInput]:
    """StreamInputs from ``streams`` rows and their ``chunks`` rows (any order).

    ``request`` is the parsed ``request_json`` (the stored request fields lack
    messages and prompt); unparseable bodies give ``{}`` (no prompt tokens).
    """
    by_stream: dict[int, list[ChunkInput]] = {}
    for c in chunk_rows:
        by_stream.setdefault(c["stream_id"], []).append(
            ChunkInput(
                c["seq"],
                c["choice"] if c["choice"] is not None else -1,
                c["text"] or "",
                c["finish_reason"],
                c["logprobs"],
            )
        )
    for cs in by_stream.values():
        cs.sort(key=_seq)
    return _inputs(stream_rows, by_stream)


def _seq(c: ChunkInput) -> int:
    return c.seq


def _inputs(
    stream_rows: Sequence[dict[str, Any]], by_stream: Mapping[int, Sequence[ChunkInput]]
) -> list[StreamInput]:
    out: list[StreamInput] = []
    for s in stream_rows:
        request = json_or_none(s.get("request_json"))
        if not isinstance(request, dict):
            request = {}
        usage = Usage.loads(s.get("usage"))
        cs = by_stream.get(s["id"], [])
        out.append(
            StreamInput(
                stream_id=s["id"],
                model=s.get("model"),
                request=request,
                chunks=cs,
                usage=usage,
                gap=bool(s.get("gap")),
                done_seen=bool(s.get("done_seen")),
                include_usage_requested=include_usage(request),
            )
        )
    return out


#: the stream id of a chunk tuple (a C-level key: called once per chunk)
_STREAM_ID = itemgetter(0)


def _inputs_from_tuples(
    stream_rows: Sequence[dict[str, Any]], chunk_rows: Sequence[tuple[Any, ...]]
) -> list[StreamInput]:
    by_stream: dict[int, Sequence[ChunkInput]] = {
        sid: _columns(list(group)) for sid, group in groupby(chunk_rows, key=_STREAM_ID)
    }
    return _inputs(stream_rows, by_stream)


def _columns(rows: list[tuple[Any, ...]]) -> ChunkColumns:
    """(stream_id, seq, choice, text, finish_reason, logprobs) rows of one
    stream, as chunk columns (no object per chunk)."""
    _, seqs, choices, texts, finishes, logprobs = zip(*rows, strict=True)
    flagged = map(or_, map(is_not, finishes, repeat(None)), map(is_not, logprobs, repeat(None)))
    extra = {i: (finishes[i], logprobs[i]) for i in compress(range(len(rows)), flagged)}
    return ChunkColumns(seqs, choices, list(map(len, texts)), "".join(texts), extra)


def _tokenizer_for(registry: TokenizerRegistry, model: str | None) -> LoadedTokenizer:
    try:
        return registry.resolve(model)[1]
    except TokenizerLoadError:
        return registry.default()


#: What a masked token id is stored as (no tokenizer has a negative id).
MASKED_ID = -1
#: What a masked server token text is stored as.
MASKED_TEXT = "<REDACTED>"

_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_TEXT_DETAILS = frozenset({"roundtrip", "server_token_mismatch", "server_tokens_invalid"})


def _overlaps(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[bool]:
    return [any(a < e and s < b for s, e in spans) for a, b in offsets]


def _mask_output(
    tok: LoadedTokenizer, text: str, ids: tuple[int, ...], spans: Sequence[tuple[int, int]]
) -> tuple[int, ...]:
    """``ids`` (the encoding of ``text``) with every token that overlaps a
    redacted span masked; all masked if the encoding cannot be matched."""
    enc_ids, offsets = tok.encode_with_offsets([text])[0]
    if tuple(enc_ids) != tuple(ids):
        return tuple([MASKED_ID] * len(ids))
    hit = _overlaps(offsets, spans)
    return tuple([MASKED_ID if h else i for i, h in zip(ids, hit, strict=True)])


def _mask_prompt(tok: LoadedTokenizer, inp: StreamInput, ids: tuple[int, ...]) -> tuple[int, ...]:
    """The prompt's ids with the tokens over redacted text masked."""
    redact = inp.redact
    assert redact is not None
    plan = tok._prompt_plan(inp.request)
    if plan is None:
        return ids
    texts = [seg for seg in plan.segments if isinstance(seg, str)]
    spans = [redact(t) for t in texts]
    if not any(spans):
        return ids
    encoded = iter(tok._encode(texts, plan.add_special_tokens))
    span_of = iter(spans)
    out: list[int] = []
    plain: list[int] = []
    for seg in plan.segments:
        if isinstance(seg, str):
            enc = next(encoded)
            hit = _overlaps(enc.offsets, next(span_of))
            plain.extend(enc.ids)
            out.extend(MASKED_ID if h else i for i, h in zip(enc.ids, hit, strict=True))
        else:
            plain.extend(seg)
            out.extend(seg)
    if tuple(plain) != tuple(ids):
        return tuple([MASKED_ID] * len(ids))
    return tuple(out)


def _mask_server(
    texts: tuple[str, ...], redact: Any, extra: Sequence[tuple[int, int]]
) -> list[bool]:
    """Which server tokens overlap a redacted span of their joined text."""
    joined = "".join(texts)
    spans = list(redact(joined)) + list(extra)
    if not spans:
        return [False] * len(texts)
    offsets = []
    pos = 0
    for t in texts:
        offsets.append((pos, pos + len(t)))
        pos += len(t)
    return _overlaps(offsets, spans)


def to_rows(registry: TokenizerRegistry, inp: StreamInput, st: StreamTokens) -> StreamTokenRow:
    """The token rows of one analysed stream.

    With redaction (``inp.redact`` set by the ``TokenCollector``), nothing that
    redaction removed is stored: ids of tokens overlapping a redacted span of
    the output (``inp.masks``) or of the prompt are stored as ``MASKED_ID``
    (-1); server token texts over redacted text as ``MASKED_TEXT`` with id -1;
    ``text_len``/``text_hash`` describe the text as stored; anomaly details
    that quote text lose their quotes. Counts keep their length.
    """
    per_choice = st.per_choice
    anomalies = AnomalyColumns.of(st.anomalies)
    mismatch: dict[int, int | None] = {}
    if st.server_tokens:  # (only a choice the server reported tokens of can mismatch)
        for kind, ch, position in zip(
            anomalies.kinds, anomalies.choices, anomalies.positions, strict=True
        ):
            if kind == "server_token_mismatch" and ch not in mismatch:
                mismatch[ch] = position
    masks = inp.masks or {}
    stored = inp.stored_texts or {}
    redact = inp.redact
    masked_any = False
    tok: LoadedTokenizer | None = None
    choices: list[ChoiceTokenRow] = []
    for ch in sorted(st.output_ids):
        ids = st.output_ids[ch]
        cc = per_choice.get(ch)
        text = cc.text if cc is not None else ""
        seqs = tuple(cc.seqs) if cc is not None else ()
        counts = tuple(cc.counts) if cc is not None else ()
        spans = masks.get(ch)
        if spans:
            tok = tok or _tokenizer_for(registry, inp.model)
            ids = _mask_output(tok, text, ids, spans)
            masked_any = True
        server_texts = st.server_tokens.get(ch)
        server_ids: tuple[int | None, ...] | None = None
        if server_texts is not None:
            tok = tok or _tokenizer_for(registry, inp.model)
            reported = []
            for logprobs in _logprobs(inp.chunks, ch):
                reported.extend(parse_server_tokens(logprobs) or [])
            server_ids = tuple(tok.server_token_id(t) for t in reported)
            if redact is not None:
                joined_matches = "".join(server_texts) == text
                hit = _mask_server(server_texts, redact, spans if spans and joined_matches else ())
                if any(hit):
                    masked_any = True
                    server_texts = tuple(
                        MASKED_TEXT if h else t for t, h in zip(server_texts, hit, strict=True)
                    )
                    server_ids = tuple(
                        MASKED_ID if k < len(hit) and hit[k] else i
                        for k, i in enumerate(server_ids)
                    )
        stored_text = stored.get(ch, text)
        choices.append(
            ChoiceTokenRow(  # (positional: a keyword call costs a dict unpacked)
                ch,  # choice
                len(stored_text),  # text_len
                text_hash(stored_text),
                ids,  # output_ids
                seqs,  # chunk_seqs
                counts,  # chunk_counts
                _straddle_seqs(cc),
                cc.tokens_per_chunk if cc is not None else {},
                server_texts,  # server_tokens
                server_ids,
                mismatch.get(ch),  # server_mismatch
            )
        )
    prompt_ids = st.prompt_ids
    if redact is not None and inp.mask_prompt and prompt_ids:
        tok = tok or _tokenizer_for(registry, inp.model)
        masked = _mask_prompt(tok, inp, prompt_ids)
        if masked != prompt_ids:
            masked_any = True
            prompt_ids = masked
    if masked_any:
        kinds = anomalies.kinds
        anomalies = AnomalyColumns(
            kinds,
            anomalies.choices,
            anomalies.positions,
            [
                _QUOTED.sub("'…'", d) if k in _TEXT_DETAILS else d
                for k, d in zip(kinds, anomalies.details, strict=True)
            ],
        )
    return StreamTokenRow(  # (positional: a keyword call costs a dict unpacked)
        st.stream_id,
        st.tokenizer,
        st.tokenizer == registry.default_name,  # is_default
        prompt_ids,
        dict(st.usage_diff),
        dict(st.tokens_per_chunk),
        len(anomalies),  # anomaly_count
        None,  # error
        tuple(choices),
        anomalies,  # the analysis's columns are the rows
    )


def _straddle_seqs(cc: ChoiceChunks | None) -> tuple[int, ...]:
    """The seq of each straddling token's chunk (repeated per token)."""
    if cc is None:
        return ()
    straddles = cc.straddles
    total = sum(straddles)  # (a C pass over small ints: no comparison per chunk)
    if not total:
        return ()
    # the usual: only a chunk's last token can reach past it, one per chunk
    seqs = tuple(compress(cc.seqs, straddles))
    if len(seqs) == total:
        return seqs
    return tuple(chain.from_iterable(map(repeat, cc.seqs, straddles)))


def _logprobs(chunks: Sequence[ChunkInput], choice: int) -> list[str]:
    """The logprobs texts of a choice's chunks, in the order given."""
    if isinstance(chunks, ChunkColumns):
        choices = chunks.choices
        extra = chunks.extra
        return [
            lp for i in sorted(extra) if (lp := extra[i][1]) is not None and choices[i] == choice
        ]
    return [c.logprobs for c in chunks if c.choice == choice and c.logprobs is not None]


def _error_row(registry: TokenizerRegistry, inp: StreamInput, exc: BaseException) -> StreamTokenRow:
    return StreamTokenRow(
        stream_id=inp.stream_id,
        tokenizer=None,
        is_default=registry.match(inp.model) is None,
        prompt_ids=None,
        error=f"{type(exc).__name__}: {exc}"[:2000],
    )


def _analyze(registry: TokenizerRegistry, inputs: Sequence[StreamInput]) -> list[StreamTokenRow]:
    """Rows for every input; a stream whose analysis raises gets an error row."""
    try:
        results = analyze_streams(registry, inputs)
        return [to_rows(registry, i, r) for i, r in zip(inputs, results, strict=True)]
    except Exception:  # bad input never stops the pass: find the culprit one by one
        pass
    out: list[StreamTokenRow] = []
    for inp in inputs:
        try:
            out.append(to_rows(registry, inp, analyze_streams(registry, [inp])[0]))
        except Exception as exc:
            out.append(_error_row(registry, inp, exc))
    return out


def _write(
    store: Store, rows: list[StreamTokenRow], result: TokenizeResult
) -> list[StreamTokenRow]:
    """Write a batch (``sniffer.store.tokens_store.insert_token_rows``: once more
    without the streams another pass wrote first). Returns the rows written."""
    written, skipped, error = insert_token_rows(store, rows)
    result.skipped += skipped
    if error is not None:
        result.write_errors.append(error)
    return written


def tokenize_db(
    store: Store,
    registry: TokenizerRegistry,
    *,
    batch: int = 500,
    limit: int | None = None,
    stream_ids: Sequence[int] | None = None,
    progress: Progress | None = None,
) -> TokenizeResult:
    """Tokenize every closed LLM stream without a token row (at most ``limit``;
    only ``stream_ids`` when given). Returns what was done.

    Example: ``tokenize_db(open_store("capture.db"), TokenizerRegistry())``.
    """
    create_token_tables(store)
    batch = max(1, batch)
    result = TokenizeResult()
    total = pending_count(store) if stream_ids is None else len(stream_ids)
    if limit is not None:
        total = min(total, limit)
    last_id: int | None = None
    done = 0
    while limit is None or done < limit:
        size = batch if limit is None else min(batch, limit - done)
        srows, crows = read_pending(store, size, after=last_id, stream_ids=stream_ids)
        if not srows:
            break
        last_id = srows[-1]["id"]
        with gc_paused():
            inputs = _inputs_from_tuples(srows, crows)
            _account(result, _write(store, _analyze(registry, inputs), result))
            del inputs  # freed before the collector runs again
        done += len(srows)
        if progress is not None:
            progress(min(done, total), total)
    return result


def _account(result: TokenizeResult, rows: list[StreamTokenRow]) -> None:
    result.batches += 1
    for r in rows:
        result.streams += 1
        if r.error is not None:
            result.failed += 1
            continue
        result.tokens += r.output_count
        result.prompt_tokens += len(r.prompt_ids or ())
        result.chunks += sum(map(len, map(_CHUNK_SEQS, r.choices)))
        result.anomalies += r.anomaly_count
        kinds = result.anomaly_kinds
        for kind, n in kind_counts(r.anomalies).items():
            kinds[kind] = kinds.get(kind, 0) + n


_CHUNK_SEQS = attrgetter("chunk_seqs")

#: Stores whose token tables :func:`tokenize_inputs` has checked.
_MIGRATED: weakref.WeakSet[Store] = weakref.WeakSet()


def tokenize_inputs(
    store: Store,
    registry: TokenizerRegistry,
    inputs: Sequence[StreamInput],
    *,
    batch: int = 500,
) -> tuple[TokenizeResult, list[StreamTokenRow]]:
    """Tokenize streams collected from the event stream (``TokenCollector``: the
    text as the server sent it, before redaction) and write their token rows.
    Returns what was done and the rows written (for metrics).

    The schema check (``create_token_tables``) runs once per store: the
    daemon's token worker calls this every few seconds with the same store."""
    if store not in _MIGRATED:
        create_token_tables(store)
        _MIGRATED.add(store)
    result = TokenizeResult()
    written: list[StreamTokenRow] = []
    with gc_paused():
        for i in range(0, len(inputs), max(1, batch)):
            rows = _write(store, _analyze(registry, inputs[i : i + max(1, batch)]), result)
            _account(result, rows)
            written.extend(rows)
    return result, written
