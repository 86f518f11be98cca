"""``sparseety verify``: exact, gap-aware checks of recorded streams.

Two sources: the database (:func:`verify_db`) and a seed-format JSONL log
(:func:`verify_jsonl`, as written by ``sparseety export --format jsonl`` or by
the old lab, whose records have no ``stream_id``). Both return a
:class:`VerifyReport`; nothing here prints.

Checks per stream (database):

* ``index_gap``      chunk indexes of text chunks run 1, 2, 3 … per (stream, choice)
* ``text_len``       the sum of the delta lengths equals ``streams.text_len``
* ``text_mismatch``  the deltas joined per choice equal the full text the token
                     pass stored (length and hash on ``choice_tokens``)
* ``chunk_count``    ``streams.chunk_count`` equals the stored text chunks
* state              a stream that is not ``complete`` fails with its state as
                     the kind (``gap``, ``truncated``, ``error``, ``open``) and
                     ``streams.reason`` as the detail
* token anomalies    from ``token_anomalies`` (see ``sniffer.llm.tokens``)
* flags              each of ``streams.flags`` (``sniffer.core.events.StreamFlag``)
                     is a finding of its own name: those in ``LOSSY_FLAGS`` (the
                     tool dropped or could not trust data of the stream) fail it

A stream recovered mid-way (state ``midway``: the capture began, or resumed,
inside its response body) is *partial*, not failed: the ``midway`` finding
only warns, and the tail that was recorded gets every other check (chunk
indexes, text, counts, tokens). ``partial`` in the report counts them.

JSONL adds ``delta_len``, ``accumulated_len`` (running length per choice),
``chunk_count``/``text_len`` against the ``stream_done`` record,
``stream_done_missing``, ``not_complete`` (``complete: false``) and
``bad_record`` (a line that is not a JSON object); its token checks run the
token analysis on the logged deltas (no prompt, no usage in the log).

What FAILS a stream (:data:`FAIL_KINDS`): gap, truncated, error, open,
not_complete, stream_done_missing, index_gap, text_len, text_mismatch,
chunk_count, delta_len, accumulated_len, bad_record, finish_missing,
content_after_finish, roundtrip, usage_mismatch, server_token_mismatch, and
the stream flags in ``LOSSY_FLAGS`` (``item-over-cap``).

What only WARNS (everything else): replacement_char, straddle,
multi_token_chunk, unk, tokenizer_default (no tokenizer configured for the
model), tokenizer_error, prompt_template, usage_missing, midway,
server_tokens_invalid, not_tokenized, token_error, unknown_record, and the
other stream flags (``clock-backwards``, ``events-capped``, ``request-cut``,
``after-done``, ``tokens-capped``; a ``tokens-capped`` stream's token rows
cover the start of its text, which is what its text check compares).

Streams whose chunk text was sampled out (``streams.text_kept`` false, see
``sparseety run --sample-rate``) are *not verifiable*: there is no text to
check, so the text, count and token checks are skipped and the stream is
reported as such (``verifiable: false``), not failed. Its state is still
checked (a gap is known without the text).

``finish_missing`` only warns on a stream the stream stage judged complete
after the server's end marker (``done_seen``): some dialects end a stream cut
by a length limit without a finish reason (TGI's final event).

``usage_mismatch`` and ``server_token_mismatch`` fail only when the stream was
tokenized with a tokenizer configured for its model: with the default
tokenizer the server's own tokenizer is unknown, the counts are indicative,
and a difference is a warning.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sniffer.core.flags import FLAG_TEXT, LOSSY_FLAGS, StreamFlag, stream_flags
from sniffer.llm.tokens import (
    ChunkInput,
    StreamInput,
    TokenizerLoadError,
    TokenizerRegistry,
    analyze_streams,
    prompt_method,
)
from sniffer.store import queries
from sniffer.store.db import Store
from sniffer.store.tokens_store import ChoiceTokenRow, StreamTokenRow, TokenAnomalyRow, text_hash

__all__ = [
    "FAIL_KINDS",
    "FIRST_TOKENS",
    "Finding",
    "StreamVerdict",
    "VerifyReport",
    "verify_db",
    "verify_jsonl",
]

FAIL_KINDS = frozenset(
    {
        "gap",
        "truncated",
        "error",
        "open",
        "not_complete",
        "stream_done_missing",
        "index_gap",
        "text_len",
        "text_mismatch",
        "chunk_count",
        "delta_len",
        "accumulated_len",
        "bad_record",
        "finish_missing",
        "content_after_finish",
        "roundtrip",
        "usage_mismatch",
        "server_token_mismatch",
    }
    | {str(f) for f in LOSSY_FLAGS}
)

#: Kinds that fail only when the tokenizer was configured for the model.
_TOKENIZER_DEPENDENT = frozenset({"usage_mismatch", "server_token_mismatch"})

#: Tokens shown per choice with ``tokens=True``.
FIRST_TOKENS = 20

#: Findings listed per (kind, choice) and stream; the rest are counted.
MAX_FINDINGS = 5

Level = Literal["fail", "warn"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing ``verify`` found about a stream: a failure or a warning."""

    kind: str
    level: Level
    choice: int | None  # None or -1: the stream as a whole
    detail: str
    count: int = 1  # anomalies of this (kind, choice) summarised by this finding
    line: int | None = None  # JSONL: the line the finding is about

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "level": self.level,
            "choice": self.choice,
            "detail": self.detail,
            "count": self.count,
            "line": self.line,
        }


@dataclass
class StreamVerdict:
    """``verify``'s verdict on one stream, with its findings."""

    stream_id: int | None
    label: str | None = None
    model: str | None = None
    state: str | None = None
    reason: str | None = None
    done_seen: bool | None = None
    chunks: int = 0
    text_len: int = 0
    prompt_tokens: int | None = None
    tokens: int | None = None  # output tokens, all choices (None: not tokenized)
    tokenizer: str | None = None
    line: int | None = None  # JSONL: first line of the stream
    findings: list[Finding] = field(default_factory=list)
    first_tokens: dict[int, list[tuple[int, str]]] = field(default_factory=dict)
    verifiable: bool = True  # False: the text was sampled out, nothing to check
    partial: bool = False  # True: recovered mid-way (state midway), only its tail was seen
    prompt_template: str | None = None  # how the prompt tokens were counted

    @property
    def ok(self) -> bool:
        return not any(f.level == "fail" for f in self.findings)

    @property
    def failures(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "fail"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warn"]

    def add(
        self,
        kind: str,
        detail: str,
        choice: int | None = None,
        *,
        level: Level | None = None,
        line: int | None = None,
        count: int = 1,
    ) -> None:
        """Add a finding; beyond MAX_FINDINGS of one (kind, choice) only count it."""
        lvl: Level = level if level is not None else ("fail" if kind in FAIL_KINDS else "warn")
        same = [i for i, f in enumerate(self.findings) if f.kind == kind and f.choice == choice]
        if len(same) >= MAX_FINDINGS:
            i = same[-1]
            f = self.findings[i]
            self.findings[i] = Finding(f.kind, f.level, f.choice, f.detail, f.count + count, f.line)
            return
        self.findings.append(Finding(kind, lvl, choice, detail, count, line))

    def to_dict(self) -> dict[str, Any]:
        return {
            "stream_id": self.stream_id,
            "ok": self.ok,
            "label": self.label,
            "model": self.model,
            "state": self.state,
            "reason": self.reason,
            "done_seen": self.done_seen,
            "chunks": self.chunks,
            "text_len": self.text_len,
            "prompt_tokens": self.prompt_tokens,
            "prompt_template": self.prompt_template,
            "verifiable": self.verifiable,
            "partial": self.partial,
            "tokens": self.tokens,
            "tokenizer": self.tokenizer,
            "line": self.line,
            "findings": [f.to_dict() for f in self.findings],
            "first_tokens": {
                str(ch): [{"id": i, "text": t} for i, t in toks]
                for ch, toks in self.first_tokens.items()
            },
        }


@dataclass
class VerifyReport:
    """``verify``'s verdicts on every stream of a source."""

    source: str
    streams: list[StreamVerdict] = field(default_factory=list)
    tokenized: int = 0  # streams the verify run tokenized first

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.streams)

    @property
    def failed(self) -> int:
        return sum(1 for s in self.streams if not s.ok)

    @property
    def not_verifiable(self) -> int:
        """Streams whose text was sampled out (and that did not fail otherwise)."""
        return sum(1 for s in self.streams if s.ok and not s.verifiable)

    @property
    def partial(self) -> int:
        """Streams recovered mid-way (and that did not fail otherwise)."""
        return sum(1 for s in self.streams if s.ok and s.verifiable and s.partial)

    @property
    def warned(self) -> int:
        return sum(1 for s in self.streams if s.warnings)

    def kind_counts(self) -> dict[str, int]:
        """Streams having each finding kind."""
        out: dict[str, int] = {}
        for s in self.streams:
            for kind in {f.kind for f in s.findings}:
                out[kind] = out.get(kind, 0) + 1
        return dict(sorted(out.items()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "ok": self.ok,
            "streams": len(self.streams),
            "verified": len(self.streams) - self.failed - self.not_verifiable - self.partial,
            "failed": self.failed,
            "not_verifiable": self.not_verifiable,
            "partial": self.partial,
            "warned": self.warned,
            "tokenized": self.tokenized,
            "kinds": self.kind_counts(),
            "results": [s.to_dict() for s in self.streams],
        }


# ---------------------------------------------------------------------------
# shared: token anomalies → findings
# ---------------------------------------------------------------------------


#: What the ``tokenizer_default`` finding tells the user to do.
_TOKENIZER_HINT = (
    " (give the server's tokenizer: --tokenizer MODEL=PATH, PATH a tokenizer.json,"
    " its folder or the served .gguf file; or the [tokenizers] config table)"
)


def _add_anomalies(
    v: StreamVerdict,
    anomalies: Sequence[TokenAnomalyRow],
    *,
    is_default: bool,
    skip: frozenset[str] = frozenset(),
    ended_by_marker: bool = False,
) -> None:
    groups: dict[tuple[str, int], list[TokenAnomalyRow]] = {}
    for a in anomalies:
        if a.kind not in skip:
            groups.setdefault((a.kind, a.choice), []).append(a)
    for (kind, choice), items in groups.items():
        level: Level = "fail" if kind in FAIL_KINDS else "warn"
        detail = items[0].detail
        if kind in _TOKENIZER_DEPENDENT and is_default:
            level = "warn"
            detail += " (default tokenizer: the server's tokenizer is unknown)"
        if kind == "finish_missing" and ended_by_marker:
            level = "warn"
            detail += " (the server's end marker was seen)"
        count = len(items)
        more = [a for a in items if a.position is None and a.detail.endswith("more not listed")]
        if more and len(items) > 1:
            count = len(items) - 1 + int(more[0].detail.split()[0])
        v.add(kind, detail, choice, level=level, count=count)


def _first_tokens(
    registry: TokenizerRegistry, model: str | None, choices: Iterable[ChoiceTokenRow], n: int
) -> dict[int, list[tuple[int, str]]]:
    try:
        tok = registry.resolve(model)[1]
    except TokenizerLoadError:
        tok = registry.default()
    return {c.choice: [(i, tok.token_text(i)) for i in c.output_ids[:n]] for c in choices}


def _prompt_method(registry: TokenizerRegistry, model: str | None, raw: Any) -> str | None:
    try:
        info = registry.template_info(model)
        request = json.loads(raw) if isinstance(raw, str) else None
    except (TokenizerLoadError, ValueError):
        return None
    return prompt_method(info, request)


# ---------------------------------------------------------------------------
# database
# ---------------------------------------------------------------------------


def _tokenize(
    store: Store,
    registry: TokenizerRegistry,
    ids: list[int],
    batch: int,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Tokenize the streams among ``ids`` that have no token rows; how many it did.
    None to do loads nothing of the token pass."""
    if not queries.untokenized_count(store, ids):
        return 0
    from sniffer.record.tokenize_pass import tokenize_db

    return tokenize_db(store, registry, batch=batch, stream_ids=ids, progress=progress).streams


def verify_db(
    store: Store,
    registry: TokenizerRegistry,
    *,
    stream_ids: Sequence[int] | None = None,
    label: str | None = None,
    model: str | None = None,
    state: str | None = None,
    tokens: bool = False,
    tokenize: bool = True,
    include_http: bool = False,
    batch: int = 500,
    node: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    tokenize_progress: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Verify the selected streams (all LLM streams when no filter is given).

    With ``tokenize`` (the default), closed streams without token rows are
    tokenized first (:func:`sniffer.record.tokenize_pass.tokenize_db`, which writes
    their rows); without it they get a ``not_tokenized`` warning. ``tokens``
    adds the first :data:`FIRST_TOKENS` tokens of every choice (id and text).
    ``progress(done, total)`` is called after each batch of streams verified,
    ``tokenize_progress(done, total)`` during the tokenization first.

    Example: ``verify_db(open_store("capture.db"), TokenizerRegistry(), label="run1").ok``
    """
    rows = queries.verify_streams(
        store,
        stream_ids=stream_ids,
        label=label,
        model=model,
        state=state,
        include_http=include_http,
        node=node,
    )
    report = VerifyReport(source=store.url)
    if tokenize and rows:
        report.tokenized = _tokenize(
            store, registry, [r["id"] for r in rows], batch, tokenize_progress
        )
    for start in range(0, len(rows), batch):
        part = rows[start : start + batch]
        ids = [r["id"] for r in part]
        by_stream: dict[int, list[tuple[int, int, int, str]]] = {}
        for sid, seq, choice, idx, text in queries.chunk_texts(store, ids):
            by_stream.setdefault(sid, []).append(
                (seq, choice if choice is not None else -1, idx or 0, text or "")
            )
        token_rows = queries.token_rows(store, ids)
        for r in part:
            v = _verify_stream(r, by_stream.get(r["id"], []), token_rows.get(r["id"]))
            if v.prompt_tokens is not None:
                v.prompt_template = _prompt_method(registry, r["model"], r["request_json"])
            if tokens and r["id"] in token_rows:
                v.first_tokens = _first_tokens(
                    registry, r["model"], token_rows[r["id"]].choices, FIRST_TOKENS
                )
            report.streams.append(v)
        if progress is not None:
            progress(start + len(part), len(rows))
    return report


def _verify_stream(
    s: dict[str, Any],
    rows: list[tuple[int, int, int, str]],
    tr: StreamTokenRow | None,
) -> StreamVerdict:
    v = StreamVerdict(
        stream_id=s["id"],
        label=s["label"],
        model=s["model"],
        state=s["state"],
        reason=s["reason"],
        done_seen=bool(s["done_seen"]),
    )
    # state: complete, or why not
    st = s["state"] or "open"
    if st == "midway":
        v.partial = True
        v.add("midway", s["reason"] or "recovered mid-way: only the tail was captured")
    elif st != "complete":
        kind = st if st in ("gap", "truncated", "error", "open") else "not_complete"
        v.add(kind, s["reason"] or f"state {st}")
    elif s["gap"]:
        v.add("gap", "marked complete but bytes were lost")
    for flag in stream_flags(s.get("flags")):
        v.add(str(flag), FLAG_TEXT.get(flag, flag))
    if s.get("text_kept") is False:
        v.verifiable = False
        return v
    # chunk indexes, text, counts
    last: dict[int, int] = {}
    texts: dict[int, list[str]] = {}
    text_chunks = 0
    total = 0
    for seq, choice, idx, text in rows:
        total += len(text)
        if text and choice >= 0:
            texts.setdefault(choice, []).append(text)
        if idx <= 0:
            continue
        text_chunks += 1
        prev = last.get(choice, 0)
        if idx != prev + 1:
            v.add(
                "index_gap",
                f"choice {choice}: chunk_index {idx} after {prev} (seq {seq})",
                choice,
            )
        last[choice] = idx
    v.chunks = text_chunks
    v.text_len = total
    if s["text_len"] is not None and s["text_len"] != total:
        v.add("text_len", f"streams.text_len {s['text_len']}, deltas sum to {total}")
    if s["chunk_count"] is not None and s["chunk_count"] != text_chunks:
        v.add(
            "chunk_count",
            f"streams.chunk_count {s['chunk_count']}, {text_chunks} text chunks stored",
        )
    # tokens
    if tr is None:
        if st != "open":
            v.add("not_tokenized", "no token rows (run 'sparseety tokenize')")
        return v
    v.tokenizer = tr.tokenizer
    if tr.error is not None:
        v.add("token_error", f"token analysis failed: {tr.error}")
        return v
    v.tokens = tr.output_count
    v.prompt_tokens = len(tr.prompt_ids) if tr.prompt_ids else None
    if tr.is_default:
        v.add(
            "tokenizer_default",
            f"no tokenizer configured for model {s['model']!r}; used {tr.tokenizer}"
            f"{_TOKENIZER_HINT}",
        )
    stored = {c.choice: c for c in tr.choices}
    # tokens-capped: the token rows hold the start of each choice's text only
    capped = StreamFlag.TOKENS_CAPPED in stream_flags(s.get("flags"))
    for ch in sorted(set(stored) | set(texts)):
        joined = "".join(texts.get(ch, []))
        c = stored.get(ch)
        if capped and c is not None and c.text_len <= len(joined):
            joined = joined[: c.text_len]
        if c is None:
            v.add("text_mismatch", f"choice {ch}: {len(joined)} characters, no stored text", ch)
        elif c.text_len != len(joined) or c.text_hash != text_hash(joined):
            v.add(
                "text_mismatch",
                f"choice {ch}: deltas join to {len(joined)} characters, stored text has "
                f"{c.text_len}"
                + (" (same length, different text)" if c.text_len == len(joined) else ""),
                ch,
            )
    gapped = any(f.kind in ("gap", "midway") for f in v.findings)
    skip = frozenset({"gap"}) if gapped else frozenset()
    # The server's end marker arrived and the stream stage judged it complete
    # (e.g. TGI's final event cut by max_new_tokens carries no finish_reason):
    # a missing finish_reason is then worth a warning, not a failure.
    # A stream recovered mid-way that ended with the end marker: which choices
    # (blocks) it had before the capture began is unknown, so is a missing finish.
    ended = st in ("complete", "midway") and bool(s["done_seen"])
    _add_anomalies(v, tr.anomalies, is_default=tr.is_default, skip=skip, ended_by_marker=ended)
    return v


# ---------------------------------------------------------------------------
# JSONL (seed format)
# ---------------------------------------------------------------------------


@dataclass
class _JStream:
    """A stream of a JSONL file being read back by ``verify``."""

    verdict: StreamVerdict
    chunks: list[ChunkInput] = field(default_factory=list)
    acc: dict[int, int] = field(default_factory=dict)
    index: dict[int, int] = field(default_factory=dict)
    count: int = 0
    total: int = 0
    done: dict[str, Any] | None = None
    done_line: int | None = None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def verify_jsonl(
    lines: Iterable[str],
    registry: TokenizerRegistry,
    *,
    tokens: bool = False,
    source: str = "-",
) -> VerifyReport:
    """Verify a seed-format JSONL log given as lines (an open file works).

    Records with ``stream_id`` are grouped by it; records without one (old
    seed logs) by order: a ``request_start`` begins a stream, and following
    ``chunk``/``stream_done`` records belong to it. Line numbers start at 1.

    Example: ``with open("logs/token_stream.jsonl") as f: verify_jsonl(f, TokenizerRegistry())``
    """
    report = VerifyReport(source=source)
    order: list[_JStream] = []
    by_id: dict[Any, _JStream] = {}
    current: _JStream | None = None
    anonymous = 0

    def new_stream(sid: Any, lineno: int) -> _JStream:
        nonlocal anonymous
        if sid is None:
            anonymous += 1
        js = _JStream(
            StreamVerdict(
                stream_id=sid if isinstance(sid, int) else None,
                label=None if sid is None or isinstance(sid, int) else str(sid),
                line=lineno,
            )
        )
        order.append(js)
        if sid is not None:
            by_id[sid] = js
        return js

    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            rec = None
            err = f"line {lineno}: not JSON ({exc.msg})"
        else:
            err = f"line {lineno}: not a JSON object"
        if not isinstance(rec, dict):
            target = current if current is not None else new_stream(None, lineno)
            current = target
            target.verdict.add("bad_record", err, line=lineno)
            continue
        event = rec.get("event")
        sid = rec.get("stream_id")
        if event == "request_start":
            if sid is not None and sid in by_id:
                js = by_id[sid]
                js.verdict.add("bad_record", f"line {lineno}: second request_start", line=lineno)
            else:
                js = new_stream(sid, lineno)
            current = js
            js.verdict.model = rec.get("model") if isinstance(rec.get("model"), str) else None
            continue
        if sid is not None:
            js_found = by_id.get(sid)
            js = js_found if js_found is not None else new_stream(sid, lineno)
        elif current is not None:
            js = current
        else:
            js = new_stream(None, lineno)
        current = js
        if event == "chunk":
            _jsonl_chunk(js, rec, lineno)
        elif event == "stream_done":
            if js.done is not None:
                js.verdict.add("bad_record", f"line {lineno}: second stream_done", line=lineno)
            js.done, js.done_line = rec, lineno
        else:
            js.verdict.add("unknown_record", f"line {lineno}: event {event!r}", line=lineno)

    for js in order:
        _jsonl_close(js)
    _jsonl_tokens(registry, order, tokens)
    report.streams = [js.verdict for js in order]
    return report


def _jsonl_chunk(js: _JStream, rec: dict[str, Any], lineno: int) -> None:
    v = js.verdict
    text = rec.get("delta_text")
    if not isinstance(text, str):
        v.add("bad_record", f"line {lineno}: chunk without a delta_text string", line=lineno)
        text = ""
    choice = _int(rec.get("choice_index"))
    choice = 0 if choice is None else choice
    dl = rec.get("delta_len")
    if dl is not None and dl != len(text):
        v.add(
            "delta_len",
            f"line {lineno}: delta_len {dl}, delta_text has {len(text)} characters",
            choice,
            line=lineno,
        )
    prev = js.acc.get(choice, 0)
    expected = prev + len(text)
    acc = rec.get("accumulated_len")
    if acc is not None and acc != expected:
        v.add(
            "accumulated_len",
            f"line {lineno}: accumulated_len {acc}, expected {expected} "
            f"({prev} before + {len(text)})",
            choice,
            line=lineno,
        )
    js.acc[choice] = expected
    idx = rec.get("chunk_index")
    if idx is not None:
        want = js.index.get(choice, 0) + 1
        if idx != want:
            v.add(
                "index_gap",
                f"line {lineno}: chunk_index {idx}, expected {want}",
                choice,
                line=lineno,
            )
        if _int(idx) is not None:
            js.index[choice] = idx
    js.count += 1
    js.total += len(text)
    fr = rec.get("finish_reason")
    js.chunks.append(ChunkInput(lineno, choice, text, fr if isinstance(fr, str) else None, None))


def _jsonl_close(js: _JStream) -> None:
    v = js.verdict
    v.chunks, v.text_len = js.count, js.total
    done = js.done
    if done is None:
        v.add("stream_done_missing", "no stream_done record (stream never closed, or log cut)")
        v.state = "open"
        return
    ln = js.done_line
    cc = done.get("chunk_count")
    if cc is not None and cc != js.count:
        v.add("chunk_count", f"line {ln}: chunk_count {cc}, {js.count} chunk records", line=ln)
    tl = done.get("total_text_len")
    if tl is not None and tl != js.total:
        v.add("text_len", f"line {ln}: total_text_len {tl}, deltas sum to {js.total}", line=ln)
    if done.get("midway") is True:
        v.state = "midway"
        v.partial = True
        v.add("midway", f"line {ln}: stream_done says midway (recovered tail)", line=ln)
    elif done.get("gap") is True:
        v.state = "gap"
        v.add("gap", f"line {ln}: stream_done says gap", line=ln)
    elif done.get("complete") is False:
        v.state = "not_complete"
        v.add("not_complete", f"line {ln}: stream_done says complete=false", line=ln)
    else:
        v.state = "complete"


def _jsonl_tokens(registry: TokenizerRegistry, order: list[_JStream], tokens: bool) -> None:
    inputs: list[StreamInput] = []
    for k, js in enumerate(order):
        cs = list(js.chunks)
        if js.verdict.state == "complete":  # the log says it finished
            cs.append(ChunkInput(10**12, -1, "", "stop", None))
        inputs.append(
            StreamInput(
                stream_id=k,
                model=js.verdict.model,
                request={},
                chunks=cs,
                usage=None,
                gap=js.verdict.state == "gap",
                done_seen=True,
                include_usage_requested=False,
            )
        )
    results = analyze_streams(registry, inputs)
    for js, res in zip(order, results, strict=True):
        v = js.verdict
        v.tokenizer = res.tokenizer
        v.tokens = sum(len(ids) for ids in res.output_ids.values())
        is_default = res.tokenizer == registry.default_name
        if is_default:
            v.add(
                "tokenizer_default",
                f"no tokenizer configured for model {v.model!r}; used {res.tokenizer}"
                f"{_TOKENIZER_HINT}",
            )
        # the log's own state checks already cover gap / incomplete streams
        skip = {"gap"} | ({"finish_missing"} if v.state != "complete" else set())
        _add_anomalies(
            v,
            res.anomalies,
            is_default=is_default,
            skip=frozenset(skip),
        )
        if tokens:
            v.first_tokens = _first_tokens(
                registry,
                v.model,
                [
                    ChoiceTokenRow(ch, 0, "", ids, (), (), (), {})
                    for ch, ids in sorted(res.output_ids.items())
                ],
                FIRST_TOKENS,
            )
