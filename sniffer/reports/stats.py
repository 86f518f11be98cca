"""Output stability: do repeats of the same request give the same tokens?

``stats`` groups recorded outputs by request fingerprint (model, normalised
prompt, sampling parameters and label; see :mod:`sniffer.llm.fingerprint`) and,
for every group with at least two outputs, reports how many distinct outputs
there are, each variant with its count and first 200 characters, the longest
common token prefix and the token position where the variants fork.

An *output* is one choice of one stream: a request with ``n > 1`` gives ``n``
outputs of the same fingerprint. For the Responses and Anthropic APIs
(:data:`WHOLE_MESSAGE_DIALECTS`) the output is the whole message: the text of
every output item / content block, in index order, as one output (choice 0),
not one output per block. Token ids are computed here from the stored chunk
text (per output, chunk texts joined, encoded with the tokenizer the
:class:`~sniffer.llm.tokens.TokenizerRegistry` resolves for the stream's model, no
special tokens). A tokenizer configured for the model (or given as the
default) that fails to load raises :class:`~sniffer.llm.tokens.TokenizerLoadError`:
never a silent fall-back to another tokenizer. When the token pass stored the
server's own token ids for a choice (logprobs, TGI tokens), they ride along
(``Output.server_ids``) for ``diff`` to place forks in the server's units.

Streams whose text was sampled out (``streams.text_kept`` false) give outputs
with ``text_kept=False`` and no text: they are not empty answers, and the
reports leave them out of every text comparison (counted).

``stats`` groups by fingerprint *with* label and model: the label names one
deployment, and one label may serve several models, whose outputs are not
repeats of one request.

This module also holds the loader shared with :mod:`sniffer.reports.diff`:
:func:`load_outputs` reads the store (the only I/O here) and
:func:`build_outputs` turns rows into :class:`~sniffer.reports.output.Output`
values (pure). Latency
figures per output:

* ``ttft`` — ``t_first_content - t_request`` (seconds, capture clock);
* ``tokens_per_chunk`` — tokens attributed to each text chunk (a token belongs
  to the chunk holding its first character), so speculative decoding shows as
  chunks of more than one token;
* ``itl`` — inter-token latency: (last text chunk − first text chunk) divided
  by the tokens that came after the first chunk; ``None`` with fewer than two
  text chunks.

Both are ``None`` for a stream flagged ``clock-backwards`` (the capture clock
went backwards during it: a difference of its times is not a duration);
``Output.clock_backwards`` says so, and the reports count such outputs.

``stats`` compares only outputs that share their fingerprint with another one:
it encodes only those (``build_outputs(..., repeats_only=True)``), so a store
without repeats is reported without loading the built-in default tokenizer
(the outputs it leaves out keep ``ids == ()``; the report is the same).

By default only streams in state ``complete`` count (a cut or gapped stream
would look like a different output); ``include_incomplete`` takes them all,
except streams recovered mid-way (state ``midway``: request and first tokens
never seen), which are always left out and counted (``midway_left_out``).
"""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from sniffer.core.flags import StreamFlag, stream_flags
from sniffer.llm.dialects import WHOLE_MESSAGE_DIALECTS
from sniffer.llm.fingerprint import fingerprint
from sniffer.llm.logprobs import output_logprobs
from sniffer.llm.registry import TokenizerLoadError, TokenizerRegistry
from sniffer.reports.align import longest_common_prefix
from sniffer.reports.cadence import cadence, describe_side, spec_of_row, summarize
from sniffer.reports.output import Output
from sniffer.store import queries
from sniffer.store.db import Store

if TYPE_CHECKING:
    from sniffer.llm.tokens import LoadedTokenizer

__all__ = [
    "PREVIEW_CHARS",
    "Group",
    "Latency",
    "StatsReport",
    "Variant",
    "build_outputs",
    "compute_stats",
    "format_stats",
    "load_outputs",
    "stats",
]

#: Characters of each variant shown in the report.
PREVIEW_CHARS = 200
#: Variants listed per group (the rest are counted).
MAX_VARIANTS = 20


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def _finish_map(value: Any) -> dict[int, str]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    out: dict[int, str] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            try:
                out[int(k)] = str(v)
            except (TypeError, ValueError):
                continue
    return out


def _server_map(rows: Iterable[Sequence[Any]]) -> dict[tuple[int, int], tuple[Any, Any]]:
    out: dict[tuple[int, int], tuple[Any, Any]] = {}
    for sid, choice, texts, ids in rows:
        try:
            t = json.loads(texts) if isinstance(texts, str) else None
            i = json.loads(ids) if isinstance(ids, str) else None
        except ValueError:
            continue
        out[(sid, choice)] = (t, i)
    return out


def _server_tokens(
    got: tuple[Any, Any] | None, text: str
) -> tuple[tuple[int, ...] | None, tuple[int, ...]]:
    """The server's token ids of one output and the character start of each,
    when every reported token maps to an id and their texts spell the output."""
    if got is None:
        return None, ()
    texts, ids = got
    if not isinstance(texts, list) or not isinstance(ids, list) or len(texts) != len(ids):
        return None, ()
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return None, ()
    if not all(isinstance(t, str) for t in texts) or "".join(texts) != text:
        return None, ()
    starts = tuple(accumulate((len(t) for t in texts[:-1]), initial=0))
    return tuple(ids), starts


def _tokenizer(registry: TokenizerRegistry, model: str | None) -> LoadedTokenizer | None:
    """The tokenizer for ``model``; a configured one that fails raises. Only the
    built-in default may be missing (no ids then: text comparison only)."""
    if registry.match(model) is not None or registry.default_source is not None:
        return registry.resolve(model)[1]
    try:
        return registry.default()
    except TokenizerLoadError:
        return None


def _lazy_default(registry: TokenizerRegistry, model: str | None) -> bool:
    """``model`` gets the built-in default tokenizer (none configured for it, no
    default given): the one :func:`_tokenizer` may load late, or not at all."""
    return registry.match(model) is None and registry.default_source is None


#: Text pieces of one choice: (chunk text, capture time) in order.
_Pieces = list[tuple[str, float | None]]


def build_outputs(
    stream_rows: Iterable[Mapping[str, Any]],
    chunk_rows: Iterable[Sequence[Any]],
    registry: TokenizerRegistry,
    server_rows: Iterable[Sequence[Any]] = (),
    *,
    repeats_only: bool = False,
) -> list[Output]:
    """Outputs from ``streams`` rows and chunk tuples ``(stream_id, choice, text,
    ts, finish_reason[, logprobs])`` in (stream_id, seq) order; ``server_rows`` are
    ``(stream_id, choice, server_tokens, server_ids)`` JSON texts of the token
    pass. Pure apart from the registry loading tokenizers on first use (a
    configured tokenizer that fails raises TokenizerLoadError).

    ``repeats_only``: token ids, timings and the tokenizer only for the outputs
    :func:`compute_stats` compares (text kept, fingerprint shared with another
    such output); the others keep ``ids == ()`` and no tokenizer, and the built-in
    default tokenizer loads only if an output to encode needs it."""
    chunks = _Chunks(chunk_rows)
    server = _server_map(server_rows)
    pending: list[tuple[Output, _Pieces]] = []
    toks: dict[str | None, LoadedTokenizer | None] = {}
    for row in stream_rows:
        model = row.get("model")
        if model not in toks and not (repeats_only and _lazy_default(registry, model)):
            toks[model] = _tokenizer(registry, model)
        pending.extend(_stream_outputs(row, chunks, server, toks.get(model)))
    if repeats_only:
        _tokenizers_for_repeats(pending, toks, registry)
    _encode(pending)
    for out, _ in pending:
        times = out.chunk_times
        if out.text_kept and times:
            out.cadence = cadence(times, _cadence_tokens(out, registry))
    return [p[0] for p in pending]


class _Chunks:
    """The chunk rows, gathered per stream and choice: text pieces, the first
    finish reason, and the logprobs of each chunk (text or logprobs) in order."""

    def __init__(self, chunk_rows: Iterable[Sequence[Any]]) -> None:
        self.texts: dict[int, dict[int, _Pieces]] = {}
        self.finishes: dict[int, dict[int, str]] = {}
        self.logprobs: dict[tuple[int, int], list[str | None]] = {}
        cur_sid: Any = None
        cur: dict[int, _Pieces] = {}
        for crow in chunk_rows:
            sid, choice, text, ts, finish = crow[:5]
            if choice is None or choice < 0:
                continue
            if sid != cur_sid:
                cur_sid = sid
                cur = self.texts.setdefault(sid, {})
            lp = crow[5] if len(crow) > 5 else None
            if text or lp is not None:
                self.logprobs.setdefault((sid, choice), []).append(lp)
            if text:
                got = cur.get(choice)
                if got is None:
                    cur[choice] = [(text, ts)]
                else:
                    got.append((text, ts))
            if finish:
                self.finishes.setdefault(sid, {}).setdefault(choice, finish)

    def plan(
        self, sid: int, row: Mapping[str, Any], dialect: Any
    ) -> list[tuple[int, _Pieces, str | None]]:
        """(choice, pieces, finish reason) of each output of stream ``sid``: one
        per choice, or one (choice 0) for a whole-message dialect."""
        by_choice = self.texts.get(sid, {})
        finish = _finish_map(row.get("finish_reasons"))
        for ch, f in self.finishes.get(sid, {}).items():
            finish.setdefault(ch, f)
        if dialect in WHOLE_MESSAGE_DIALECTS:
            order = sorted(set(by_choice) | set(finish))
            merged = [p for ch in order for p in by_choice.get(ch, [])]
            fin = next((finish[ch] for ch in order if ch in finish), None)
            return [(0, merged, fin)]
        choices = sorted(set(by_choice) | set(finish)) or [0]
        return [(ch, by_choice.get(ch, []), finish.get(ch)) for ch in choices]


def _stream_outputs(
    row: Mapping[str, Any],
    chunks: _Chunks,
    server: Mapping[tuple[int, int], tuple[Any, Any]],
    tokenizer: LoadedTokenizer | None,
) -> list[tuple[Output, _Pieces]]:
    """The outputs of one ``streams`` row (not encoded yet), with their pieces."""
    sid = int(row["id"])
    fp = fingerprint(row)
    pfp = fingerprint(row, with_label=False, with_model=False)
    mfp = fingerprint(row, with_label=False)
    dialect = row.get("dialect")
    whole = dialect in WHOLE_MESSAGE_DIALECTS
    kept = row.get("text_kept") is not False  # NULL (older rows): kept
    spec = spec_of_row(row)
    t_req = row.get("t_request")
    t_first = row.get("t_first_content")
    clock = StreamFlag.CLOCK_BACKWARDS in stream_flags(row.get("flags"))
    ttft = t_first - t_req if t_first is not None and t_req is not None else None
    if clock:
        ttft = None  # not a duration: the clock went backwards
    outs = []
    for ch, pieces, fin in chunks.plan(sid, row, dialect):
        text = "".join(p[0] for p in pieces)
        sids, starts = (None, ()) if whole else _server_tokens(server.get((sid, ch)), text)
        chunk_lps = chunks.logprobs.get((sid, ch))
        logprobs = None if whole or not chunk_lps else output_logprobs(chunk_lps, text)
        out = Output(
            stream_id=sid,
            choice=ch,
            label=row.get("label"),
            model=row.get("model"),
            key=fp.key,
            pair_key=pfp.key,
            prompt=fp.prompt,
            params=fp.params,
            text=text,
            ids=(),
            finish_reason=fin,
            state=row.get("state"),
            t_request=t_req,
            ttft=ttft,
            itl=None,
            tokens_per_chunk=(),
            tokenizer=tokenizer,
            model_pair_key=mfp.key,
            dialect=dialect,
            text_kept=kept,
            chunk_ends=tuple(accumulate(len(p[0]) for p in pieces)),
            server_ids=sids,
            server_starts=starts,
            logprobs=logprobs,
            request_json=row.get("request_json"),
            clock_backwards=clock,
            chunk_times=tuple(t for _, t in pieces if t is not None),
            speculative=spec,
        )
        outs.append((out, pieces))
    return outs


def _tokenizers_for_repeats(
    pending: Sequence[tuple[Output, _Pieces]],
    toks: dict[str | None, LoadedTokenizer | None],
    registry: TokenizerRegistry,
) -> None:
    """``repeats_only``: a tokenizer only on the outputs compared (text kept,
    fingerprint shared); the built-in default loads here, if one needs it."""
    shared = Counter(o.key for o, _ in pending if o.text_kept)
    for out, _ in pending:
        if not out.text_kept or shared[out.key] < 2:
            out.tokenizer = None
        elif out.model not in toks:  # the built-in default, left until needed
            out.tokenizer = toks[out.model] = _tokenizer(registry, out.model)
        else:
            out.tokenizer = toks[out.model]


def _encode(pending: Sequence[tuple[Output, _Pieces]]) -> None:
    """Token ids, token starts, tokens per chunk and ITL of every output that
    has a tokenizer and text, encoded in one batch per tokenizer."""
    by_tok: dict[int, list[int]] = {}
    for i, (out, _) in enumerate(pending):
        if out.tokenizer is not None and out.text:
            by_tok.setdefault(id(out.tokenizer), []).append(i)
    for members in by_tok.values():
        tok = pending[members[0]][0].tokenizer
        assert tok is not None
        encoded = tok.encode_with_offsets([pending[i][0].text for i in members])
        for i, (ids, offsets) in zip(members, encoded, strict=True):
            out, pieces = pending[i]
            _place_tokens(out, pieces, ids, [o[0] for o in offsets])


def _place_tokens(out: Output, pieces: _Pieces, ids: Sequence[int], tstarts: Sequence[int]) -> None:
    """Set ``out``'s ids, the tokens of each chunk (a token belongs to the chunk
    holding its first character) and the ITL they give."""
    out.ids = tuple(ids)
    out.token_starts = tuple(tstarts)
    counts: list[int] = []
    lo = 0
    for end in out.chunk_ends:
        hi = bisect_left(tstarts, end, lo)
        counts.append(hi - lo)
        lo = hi
    if counts:
        counts[-1] += len(tstarts) - lo
    out.tokens_per_chunk = tuple(counts)
    t0, t1 = pieces[0][1], pieces[-1][1]
    after_first = len(ids) - counts[0] if counts else 0
    if (
        len(pieces) >= 2
        and t0 is not None
        and t1 is not None
        and after_first > 0
        and not out.clock_backwards
    ):
        out.itl = (t1 - t0) / after_first


def _cadence_tokens(out: Output, registry: TokenizerRegistry) -> list[int] | None:
    """Tokens per text chunk for the cadence estimate: the server's own tokens
    when the stream carried them, else the re-tokenized counts when the
    model's tokenizer is configured, else None (one per chunk: what llama.cpp
    streams; the built-in default tokenizer would miscount another model's)."""
    n = len(out.chunk_times)
    if len(out.chunk_ends) != n:
        return None
    if out.server_ids is not None and len(out.server_starts) == len(out.server_ids):
        counts: list[int] = []
        lo = 0
        for end in out.chunk_ends:
            hi = bisect_left(out.server_starts, end, lo)
            counts.append(hi - lo)
            lo = hi
        counts[-1] += len(out.server_starts) - lo
        return counts
    if registry.match(out.model) is not None and len(out.tokens_per_chunk) == n:
        return list(out.tokens_per_chunk)
    return None


def load_outputs(
    store: Store,
    *,
    labels: Sequence[str] | None = None,
    model: str | None = None,
    registry: TokenizerRegistry | None = None,
    include_incomplete: bool = False,
    node: str | None = None,
    repeats_only: bool = False,
) -> list[Output]:
    """Outputs of the LLM streams in the store (``dialect`` other than ``http``),
    optionally only those with one of ``labels`` / of ``model`` / captured by ``node``.
    ``repeats_only``: see :func:`build_outputs`."""
    rows, chunk_rows, server_rows = queries.output_rows(
        store,
        labels=labels,
        model=model,
        include_incomplete=include_incomplete,
        node=node,
    )
    return build_outputs(
        rows,
        chunk_rows,
        registry or TokenizerRegistry(native_first=False),  # (offsets: the library's)
        server_rows,
        repeats_only=repeats_only,
    )


# ---------------------------------------------------------------------------
# Stability analysis (pure)
# ---------------------------------------------------------------------------


@dataclass(slots=True)
class Variant:
    """One distinct output of a group of repeats, with how often it came."""

    count: int
    tokens: int
    preview: str  # first PREVIEW_CHARS characters
    stream_ids: list[int]  # streams that produced it (first 10)
    fork: str | None  # the text from the fork token on (≤ 40 chars), None if no fork
    #: why it differs from the group's most frequent variant (None for that one);
    #: see sniffer.reports.causes
    cause: str | None = None
    cause_evidence: dict[str, Any] | None = None
    #: which source decided the cause (sniffer.reports.causes.CAUSE_SOURCES)
    cause_source: str | None = None


@dataclass(slots=True)
class Group:
    """The outputs of one fingerprint (the same request repeated) and how they differ."""

    key: str
    label: str | None
    model: str | None
    prompt: str
    params: tuple[tuple[str, Any], ...]
    streams: int
    outputs: int
    distinct: int
    variants: list[Variant]
    common_prefix: int  # longest common token prefix of all outputs
    fork_position: int | None  # token index where variants split; None when deterministic

    @property
    def deterministic(self) -> bool:
        return self.distinct == 1


@dataclass(slots=True)
class Latency:
    """The latency of one label's outputs (every output, repeated or not), in ms:
    TTFT per output, and inter-token latency per output (its chunk span over its
    tokens after the first)."""

    outputs: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)


@dataclass(slots=True)
class StatsReport:
    """What ``stats`` reports: the groups of repeats, a summary, latency."""

    groups: list[Group]
    singletons: int  # fingerprints seen once (not reported)
    summary: dict[str, Any]
    latency: dict[str, Latency] = field(default_factory=dict)  # by label ("-": none)


def _fork_text(o: Output, pos: int) -> str:
    tok = o.tokenizer
    if tok is None or pos >= len(o.ids):
        return ""
    return tok.decode(o.ids[pos : pos + 12])[:40]


def variant_key(o: Output) -> tuple[Any, ...]:
    """What makes two outputs of one prompt the same variant: their tokens (the
    text when they are not tokenized) and their finish reason. The same text
    cut by ``max_tokens`` (``length``) and ended by the model (``stop``) are two
    behaviours, not one repeated (issue #24); ``diff`` picks its modal output
    by the same rule."""
    return (o.ids if o.tokenizer is not None else o.text, o.finish_reason)


def compute_stats(outputs: Sequence[Output], *, near_tie_margin: float = 0.5) -> StatsReport:
    """Group outputs by fingerprint (with label and model) and measure their
    stability. Sampled-out outputs (no text kept) are counted, not grouped.
    Every variant but the most frequent one gets a cause class
    (:func:`sniffer.reports.causes.classify` against the most frequent one)."""
    from sniffer.reports.causes import classify, distribution

    by_key: dict[str, list[Output]] = {}
    sampled_out = 0
    latency: dict[str, Latency] = {}
    for o in outputs:
        lat = latency.setdefault(o.label or "-", Latency())
        lat.outputs += 1
        if o.ttft is not None:
            lat.ttft_ms.append(o.ttft * 1000.0)
        if o.itl is not None:
            lat.itl_ms.append(o.itl * 1000.0)
        if not o.text_kept:
            sampled_out += 1
            continue
        by_key.setdefault(o.key, []).append(o)
    groups: list[Group] = []
    singletons = 0
    all_causes: list[str | None] = []
    for key, members in by_key.items():
        if len(members) < 2:
            singletons += 1
            continue
        counts = Counter(variant_key(o) for o in members)
        firsts: dict[Any, Output] = {}
        sids: dict[Any, list[int]] = {}
        for o in members:
            k = variant_key(o)
            firsts.setdefault(k, o)
            lst = sids.setdefault(k, [])
            if len(lst) < 10 and o.stream_id not in lst:
                lst.append(o.stream_id)
        distinct = len(counts)
        reps = [firsts[k] for k, _ in counts.most_common()]
        lcp = longest_common_prefix([o.ids for o in reps])
        fork = None if distinct == 1 else lcp
        variants = []
        for i, (k, _) in enumerate(counts.most_common()):
            why = None if i == 0 else classify(reps[0], firsts[k], margin=near_tie_margin)
            if why is not None:
                all_causes.append(why.cause)
            if i >= MAX_VARIANTS:
                continue
            variants.append(
                Variant(
                    count=counts[k],
                    tokens=len(firsts[k].ids),
                    preview=firsts[k].text[:PREVIEW_CHARS],
                    stream_ids=sids[k],
                    fork=None if fork is None else _fork_text(firsts[k], fork),
                    cause=None if why is None else why.cause,
                    cause_evidence=None if why is None else (why.evidence or None),
                    cause_source=None if why is None else why.source,
                )
            )
        m0 = members[0]
        groups.append(
            Group(
                key=key,
                label=m0.label,
                model=m0.model,
                prompt=m0.prompt,
                params=m0.params,
                streams=len({o.stream_id for o in members}),
                outputs=len(members),
                distinct=distinct,
                variants=variants,
                common_prefix=lcp,
                fork_position=fork,
            )
        )
    groups.sort(key=lambda g: (g.label or "", g.deterministic, g.prompt))
    summary = _summary(groups, singletons)
    by_label: dict[str, list[Output]] = {}
    for o in outputs:
        if o.text_kept:
            by_label.setdefault(o.label or "", []).append(o)
    summary["speculation"] = {
        label: summarize((o.cadence, o.speculative) for o in outs)
        for label, outs in sorted(by_label.items())
    }
    summary["sampled_out_outputs"] = sampled_out
    summary["variant_causes"] = distribution(all_causes)
    summary["near_tie_margin"] = near_tie_margin
    return StatsReport(groups, singletons, summary, dict(sorted(latency.items())))


def _summary(groups: Sequence[Group], singletons: int) -> dict[str, Any]:
    def part(gs: Sequence[Group]) -> dict[str, Any]:
        det = sum(1 for g in gs if g.deterministic)
        return {
            "groups": len(gs),
            "deterministic_groups": det,
            "deterministic_ratio": det / len(gs) if gs else None,
            "outputs": sum(g.outputs for g in gs),
        }

    out = part(groups)
    out["single_output_fingerprints"] = singletons
    labels: dict[str, list[Group]] = {}
    for g in groups:
        labels.setdefault(g.label or "", []).append(g)
    out["labels"] = {k: part(v) for k, v in sorted(labels.items())}
    return out


def stats(
    store: Store,
    *,
    labels: Sequence[str] | None = None,
    model: str | None = None,
    registry: TokenizerRegistry | None = None,
    include_incomplete: bool = False,
    near_tie_margin: float = 0.5,
    node: str | None = None,
    latency: bool = False,
) -> StatsReport:
    """Load outputs from the store (of one ``node``, or all) and compute their
    stability report. ``latency``: every output is encoded (not only the
    repeats), so that ``report.latency`` has the inter-token latency of all."""
    report = compute_stats(
        load_outputs(
            store,
            labels=labels,
            model=model,
            registry=registry,
            include_incomplete=include_incomplete,
            node=node,
            repeats_only=not latency,  # else only what compute_stats compares is encoded
        ),
        near_tie_margin=near_tie_margin,
    )
    report.summary["midway_left_out"] = count_midway(store, labels=labels, model=model)
    return report


def count_midway(
    store: Store,
    *,
    labels: Sequence[str] | None = None,
    model: str | None = None,
) -> int:
    """LLM streams recovered mid-way (state ``midway``) that stats leaves out."""
    return queries.count_midway(store, labels=labels, model=model)


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------


def stats_json(report: StatsReport) -> dict[str, Any]:
    """A JSON-ready dict of the report."""
    return {
        "summary": report.summary,
        "groups": [
            {
                "fingerprint": g.key,
                "label": g.label,
                "model": g.model,
                "prompt": g.prompt,
                "params": dict(g.params),
                "streams": g.streams,
                "outputs": g.outputs,
                "distinct_outputs": g.distinct,
                "deterministic": g.deterministic,
                "common_prefix_tokens": g.common_prefix,
                "fork_position": g.fork_position,
                "variants": [
                    {
                        "count": v.count,
                        "tokens": v.tokens,
                        "preview": v.preview,
                        "stream_ids": v.stream_ids,
                        "fork_text": v.fork,
                        "cause": v.cause,
                        "cause_evidence": v.cause_evidence,
                        "cause_source": v.cause_source,
                    }
                    for v in g.variants
                ],
            }
            for g in report.groups
        ],
    }


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def format_stats(report: StatsReport, *, show_deterministic: bool = True) -> str:
    """The report as text: one block per group, then the summary."""
    lines: list[str] = []
    for g in report.groups:
        if g.deterministic and not show_deterministic:
            continue
        params = " ".join(f"{k}={json.dumps(v)}" for k, v in g.params)
        lines.append(f"[{g.key}] label={g.label or '-'} model={g.model or '-'} {params}".rstrip())
        lines.append(f"  prompt: {g.prompt}")
        state = (
            "deterministic"
            if g.deterministic
            else f"{g.distinct} distinct, fork at token {g.fork_position}"
        )
        lines.append(
            f"  {g.streams} streams, {g.outputs} outputs: {state}; "
            f"common prefix {g.common_prefix} tokens"
        )
        for v in g.variants:
            fork = f"  fork→{v.fork!r}" if v.fork is not None else ""
            why = f"  [{v.cause}]" if v.cause is not None else ""
            lines.append(
                f"    x{v.count:<4} {v.tokens:>5} tok  {json.dumps(v.preview, ensure_ascii=False)}"
                f"{fork}{why}"
            )
        if g.distinct > len(g.variants):
            lines.append(f"    … {g.distinct - len(g.variants)} more variants")
    s = report.summary
    lines.append(
        f"{s['groups']} groups with ≥ 2 outputs ({s['single_output_fingerprints']} fingerprints "
        f"seen once): {s['deterministic_groups']} fully deterministic "
        f"({_pct(s['deterministic_ratio'])})"
    )
    if s.get("midway_left_out"):
        lines.append(
            f"  {s['midway_left_out']} streams left out: recovered mid-way (capture began inside "
            "the response), request and first tokens unknown"
        )
    if s.get("sampled_out_outputs"):
        lines.append(
            f"  {s['sampled_out_outputs']} outputs left out: their text was sampled out "
            "(--sample-rate), not compared"
        )
    vc = s.get("variant_causes") or {}
    if any(vc.values()):
        lines.append(
            "  why variants differ from the most frequent one: "
            + ", ".join(f"{k} {v}" for k, v in vc.items() if v)
        )
    for label, part in s["labels"].items():
        lines.append(
            f"  {label or '-'}: {part['deterministic_groups']}/{part['groups']} deterministic "
            f"({_pct(part['deterministic_ratio'])}), {part['outputs']} outputs"
        )
    for label, spec in (s.get("speculation") or {}).items():
        lines.append(f"  speculation {label or '-'}: {describe_side(spec)}")
    return "\n".join(lines)
