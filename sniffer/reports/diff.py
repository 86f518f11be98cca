"""Baseline vs candidate: do two deployments stream the same tokens, as fast?

Outputs (see :mod:`sniffer.reports.stats`: one per stream and choice; the
whole message for the Responses and Anthropic APIs) of the two labels are
matched by the request fingerprint *without* the label and *without* the
served model name (two deployments are addressed by different names;
``match_model`` puts the name back in the key). Everything else that changes
the answer stays in the key (prompt, system prompt, sampling parameters, max
tokens, n, seed, tools, response format).

What is compared, and what is only counted:

* streams that are not complete (gap, truncated, error, open, midway) are counted per
  side (``baseline_incomplete``, ``incomplete_ratio``) and left out of the
  pairs unless ``include_incomplete``;
* streams whose text was sampled out (``streams.text_kept`` false) are
  counted (``baseline_sampled_out``, ``sampled_out_ratio``) and never
  compared: they are not empty answers;
* prompts seen on one side only are listed per side (``unmatched``) and
  counted (``unmatched_baseline_prompts``, ``unmatched_ratio``).

Pairing, per fingerprint present on both sides:

* ``index`` (default) — choice i with choice i; repeats of a request pair in
  capture order (the j-th baseline output with the j-th candidate output of
  the same choice); outputs left over are counted in ``unpaired_outputs``;
* ``modal`` — per choice index, the most frequent output of each side (ties:
  the earliest);
* ``all`` — every baseline output with every candidate output (repeats give
  n×m pairs; at most :data:`MAX_PAIRS_PER_PROMPT` per prompt, the rest are
  counted in ``skipped_pairs``).

Each pair: identical (same text, and the same token ids), where they fork —
``first_divergence_char`` (character index), ``first_divergence_chunk_baseline``
/ ``_candidate`` (the served text chunk holding that character, 1-based, in
the output's chunk order) and ``first_divergence`` (token index) — common
prefix, Levenshtein distance (:func:`~sniffer.reports.align.edit_distance`,
computed once per distinct pair of outputs) and its ratio to the longer
length, length difference (candidate − baseline) and finish reasons. Token
positions are in the server's own token ids when both outputs carry them
(logprobs, TGI tokens, as stored by the token pass: ``token_unit`` "server"),
else in ids re-tokenized from the text (``"retokenized"``, the tokenizer is
named in the summary), else in characters (``"char"``, no tokenizer). With
``spans``, every differing span of the two token sequences is listed.

Per side: TTFT, inter-token latency and tokens-per-chunk distributions over the
outputs of matched prompts.

Gates: ``METRIC OP NUMBER`` (OP one of ``< <= > >= == !=``), METRIC a key of
:data:`GATE_METRICS`; a gate *fails* when its comparison holds. No evidence, no
pass: a gate also fails when fewer than ``min_pairs`` (default 1) pairs were
compared, and when its metric has no value (e.g. ``median_first_divergence``
when no pair diverged); its reason then starts with "no evidence". Parsed with
a regular expression, never evaluated.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
import statistics
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

from sniffer.llm.reference import ReferenceModel, ScoreJob
from sniffer.llm.tokens import TokenizerRegistry
from sniffer.llm.values import SpecDecode
from sniffer.reports.align import common_prefix, edit_distance, edit_ratio
from sniffer.reports.cadence import Cadence, describe_side, summarize
from sniffer.reports.causes import (
    CAUSE_SOURCES,
    CAUSES,
    DEFAULT_NEAR_TIE_MARGIN,
    SOURCE_WORDS,
    classify,
    distribution,
    reference_cause,
    sampler_adjusted,
    source_distribution,
)
from sniffer.reports.output import Output
from sniffer.reports.stats import load_outputs
from sniffer.store.db import Store

__all__ = [
    "GATE_METRICS",
    "MAX_PAIRS_PER_PROMPT",
    "PAIRINGS",
    "SPECULATION_METRICS",
    "DiffReport",
    "Gate",
    "GateError",
    "GateResult",
    "PairResult",
    "PromptResult",
    "SideStats",
    "compute_diff",
    "diff",
    "diff_json",
    "evaluate_gates",
    "format_diff",
    "parse_gate",
    "verdict",
]

MAX_PAIRS_PER_PROMPT = 10_000
PAIRINGS = ("index", "modal", "all")
#: Characters of each side shown around a fork (before and after it).
CONTEXT_CHARS = 120
#: Differing spans listed per pair (the rest are counted).
MAX_SPANS = 200
#: Characters of text given per span and side.
SPAN_TEXT = 200

#: Per-side speculative-decoding figures a gate may name, as
#: ``baseline_NAME`` / ``candidate_NAME`` (see sniffer.reports.cadence.summarize):
#: the share of outputs whose cadence is bursty, the estimated tokens per
#: verification step, and what the server reported: accepted / drafted tokens
#: and the mean tokens per step.
SPECULATION_METRICS = (
    "bursty_ratio",
    "tokens_per_step_p50",
    "spec_acceptance_rate",
    "spec_accept_length",
)

#: Summary metrics a gate may name (all numbers; some may be undefined).
GATE_METRICS = (
    "prompts",
    "pairs",
    "identical_pairs",
    "identical_ratio",
    "prompts_identical_ratio",
    "median_first_divergence",
    "min_first_divergence",
    "median_first_divergence_char",
    "min_first_divergence_char",
    "mean_common_prefix",
    "mean_edit_distance",
    "mean_edit_ratio",
    "median_edit_ratio",
    "max_edit_ratio",
    "mean_length_diff",
    "mean_abs_length_diff",
    "finish_mismatch_ratio",
    "baseline_ttft_ms_p50",
    "candidate_ttft_ms_p50",
    "ttft_ratio",
    "baseline_itl_ms_p50",
    "candidate_itl_ms_p50",
    "itl_ratio",
    "baseline_tokens_per_chunk_mean",
    "candidate_tokens_per_chunk_mean",
    "tokens_per_chunk_ratio",
    "unmatched_baseline_prompts",
    "unmatched_candidate_prompts",
    "unmatched_ratio",
    "baseline_streams",
    "candidate_streams",
    "baseline_incomplete",
    "candidate_incomplete",
    "incomplete_ratio",
    "baseline_sampled_out",
    "candidate_sampled_out",
    "sampled_out_ratio",
    "unpaired_outputs",
    *(f"{c}_pairs" for c in CAUSES),
    *(f"{c}_ratio" for c in CAUSES),
    "reference_scored_pairs",
    "candidate_preferred_at_fork_ratio",
    *(f"{side}_{m}" for side in ("baseline", "candidate") for m in SPECULATION_METRICS),
)

#: Why a metric can have no value (the "no evidence" reason of a gate on it).
_UNDEFINED_WHY = {
    "median_first_divergence": "no pair diverged",
    "min_first_divergence": "no pair diverged",
    "median_first_divergence_char": "no pair diverged in its text",
    "min_first_divergence_char": "no pair diverged in its text",
    "ttft_ratio": "a side has no TTFT (or the baseline's is 0)",
    "itl_ratio": "a side has no inter-token latency (or the baseline's is 0)",
    "tokens_per_chunk_ratio": "a side has no tokenized chunk",
    "unmatched_ratio": "neither label has a comparable stream",
    "incomplete_ratio": "neither label has a stream",
    "sampled_out_ratio": "neither label has a stream",
    "reference_scored_pairs": "no --reference-model",
    "candidate_preferred_at_fork_ratio": "no pair scored by a --reference-model",
    **{
        f"{side}_{m}": why
        for side in ("baseline", "candidate")
        for m, why in (
            ("bursty_ratio", "no output of that side has enough chunks for a cadence"),
            ("tokens_per_step_p50", "no output of that side has enough chunks for a cadence"),
            ("spec_acceptance_rate", "that side's server reported no speculative decoding"),
            ("spec_accept_length", "that side's server reported no accept length"),
        )
    },
    **{
        f"{c}_ratio": "the cause of some diverged pairs is unknown (no logprobs at the fork)"
        for c in CAUSES
        if c != "unknown"
    },
}


@dataclass(slots=True)
class PairResult:
    key: str
    baseline_stream: int
    baseline_choice: int
    candidate_stream: int
    candidate_choice: int
    identical: bool
    first_divergence: int | None  # token index (unit: token_unit)
    common_prefix: int
    edit_distance: int
    edit_ratio: float
    baseline_tokens: int
    candidate_tokens: int
    length_diff: int  # candidate − baseline tokens
    baseline_finish: str | None
    candidate_finish: str | None
    first_divergence_char: int | None = None  # character index of the first difference
    first_divergence_chunk_baseline: int | None = None  # served chunk (1-based) holding it
    first_divergence_chunk_candidate: int | None = None
    token_unit: str = "retokenized"  # "server", "retokenized" or "char"
    spans: list[dict[str, Any]] | None = None  # every differing span (with spans=True)
    #: why they differ (sniffer.reports.causes.CAUSES); None when identical
    cause: str | None = None
    cause_evidence: dict[str, Any] | None = None  # what the class rests on
    #: reference-model attribution (diff --reference-model); None when not scored
    reference: dict[str, Any] | None = None
    #: which source decided the cause (sniffer.reports.causes.CAUSE_SOURCES): the
    #: outputs, the servers' logprobs, sampler evidence or the reference model
    cause_source: str | None = None

    @property
    def finish_differs(self) -> bool:
        return self.baseline_finish != self.candidate_finish


@dataclass(slots=True)
class PromptResult:
    key: str
    model: str | None  # the baseline's served model
    prompt: str
    baseline_outputs: int
    candidate_outputs: int
    pairs: int
    identical_pairs: int
    first_divergence: int | None  # earliest over the pairs
    median_edit_ratio: float
    finish_mismatches: int
    baseline_text: str  # modal output text of each side (for the report)
    candidate_text: str
    candidate_model: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    first_divergence_char: int | None = None  # earliest over the pairs
    #: the pair with the earliest fork: both sides' text around it (see _context)
    fork_context: dict[str, Any] | None = None


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(slots=True)
class SideStats:
    label: str
    outputs: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    itl_ms: list[float] = field(default_factory=list)
    tokens_per_chunk: dict[int, int] = field(default_factory=dict)  # tokens → chunks
    streams: int = 0  # streams of this label (all states)
    incomplete: int = 0  # of which not complete (gap, truncated, error, open, midway)
    sampled_out: int = 0  # of which the text was sampled out
    clock_backwards: int = 0  # outputs whose timings are left out (flagged clock-backwards)

    #: (cadence, server-reported speculative decoding) of each output
    speculation: list[tuple[Cadence | None, SpecDecode | None]] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)  # every gap between text chunks
    #: tokens streamed with logprobs, and of those the ones not the top-1 of their
    #: own raw logprobs (an adjusted sampler: sniffer.reports.causes.sampler_adjusted)
    logprob_tokens: int = 0
    not_top1_tokens: int = 0

    def add(self, o: Output) -> None:
        self.outputs += 1
        if o.logprobs is not None:
            self.logprob_tokens += len(o.logprobs)
            self.not_top1_tokens += sampler_adjusted(o.logprobs)
        self.clock_backwards += o.clock_backwards
        self.speculation.append((o.cadence, o.speculative))
        times = o.chunk_times
        self.gaps_ms.extend(max(0.0, b - a) * 1000.0 for a, b in pairwise(times))
        if o.ttft is not None:
            self.ttft_ms.append(o.ttft * 1000.0)
        if o.itl is not None:
            self.itl_ms.append(o.itl * 1000.0)
        for n in o.tokens_per_chunk:
            self.tokens_per_chunk[n] = self.tokens_per_chunk.get(n, 0) + 1

    def tokens_per_chunk_mean(self) -> float | None:
        chunks = sum(self.tokens_per_chunk.values())
        if not chunks:
            return None
        return sum(n * c for n, c in self.tokens_per_chunk.items()) / chunks

    def summary(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "outputs": self.outputs,
            "streams": self.streams,
            "incomplete": self.incomplete,
            "sampled_out": self.sampled_out,
            "clock_backwards": self.clock_backwards,
            "ttft_ms": _dist(self.ttft_ms),
            "itl_ms": _dist(self.itl_ms),
            "tokens_per_chunk_mean": self.tokens_per_chunk_mean(),
            "tokens_per_chunk": {str(k): v for k, v in sorted(self.tokens_per_chunk.items())},
            "speculation": self.speculation_summary(),
            "sampler": {
                "logprob_tokens": self.logprob_tokens,
                "not_top1_tokens": self.not_top1_tokens,
                # None: no logprobs, nothing to tell
                "adjusted": (self.not_top1_tokens > 0) if self.logprob_tokens else None,
            },
        }

    def speculation_summary(self) -> dict[str, Any]:
        return summarize(self.speculation)


def _dist(values: Sequence[float]) -> dict[str, float | int | None]:
    return {
        "count": len(values),
        "p50": _quantile(values, 0.5),
        "p90": _quantile(values, 0.9),
        "p99": _quantile(values, 0.99),
        "mean": statistics.fmean(values) if values else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
    }


@dataclass(slots=True)
class DiffReport:
    baseline: str
    candidate: str
    pairing: str
    prompts: list[PromptResult]
    pairs: list[PairResult]
    baseline_side: SideStats
    candidate_side: SideStats
    summary: dict[str, Any]
    skipped_pairs: int = 0
    #: prompts seen on one side only: {"baseline": [...], "candidate": [...]}
    unmatched: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: streams not compared: {"baseline": [...], "candidate": [...]} (id, state, reason)
    excluded: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    match_model: bool = False
    #: the two outputs of each pair (same order as ``pairs``), for attribution
    pair_outputs: list[tuple[Output, Output]] = field(default_factory=list, repr=False)
    near_tie_margin: float = DEFAULT_NEAR_TIE_MARGIN
    #: reference-model attribution summary (None when not asked for)
    reference: dict[str, Any] | None = None


def _seq_key(o: Output) -> Any:
    """An output's text, server ids and finish reason: the modal output is the
    most frequent of these (finish reasons count, as in ``stats``'s variants)."""
    return (o.text, o.server_ids, o.finish_reason)


def _modal(outs: Sequence[Output]) -> Output:
    counts = Counter(_seq_key(o) for o in outs)
    best = max(counts.values())
    return next(o for o in outs if counts[_seq_key(o)] == best)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return b / a


def _units(o: Output, server: bool, tok: Any) -> tuple[Sequence[Any], Sequence[int], str]:
    """The sequence compared for ``o``, the character start of each element, the unit.

    ``tok`` is the tokenizer both sides are counted in (the baseline's): an
    output whose own ids come from another tokenizer is re-encoded with it."""
    if server and o.server_ids is not None:
        return o.server_ids, o.server_starts, "server"
    if tok is None:
        return o.text, range(len(o.text)), "char"
    if o.tokenizer is tok:
        return o.ids, o.token_starts, "retokenized"
    ids, offsets = tok.encode_with_offsets([o.text])[0] if o.text else ([], [])
    return tuple(ids), [x[0] for x in offsets], "retokenized"


def _chunk_of(o: Output, char: int) -> int | None:
    """The served text chunk (1-based) holding character ``char``; None past the end."""
    i = bisect_right(o.chunk_ends, char)
    return i + 1 if i < len(o.chunk_ends) else None


def _start(starts: Sequence[int], i: int, text: str) -> int:
    return starts[i] if i < len(starts) else len(text)


def _spans(
    b: Output,
    c: Output,
    bs: Sequence[Any],
    cs: Sequence[Any],
    bst: Sequence[int],
    cst: Sequence[int],
) -> list[dict[str, Any]]:
    matcher = difflib.SequenceMatcher(None, bs, cs, autojunk=False)
    out: list[dict[str, Any]] = []
    ops = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    for tag, i1, i2, j1, j2 in ops[:MAX_SPANS]:
        b0, b1 = _start(bst, i1, b.text), _start(bst, i2, b.text)
        c0, c1 = _start(cst, j1, c.text), _start(cst, j2, c.text)
        out.append(
            {
                "op": tag,
                "baseline_tokens": [i1, i2],
                "candidate_tokens": [j1, j2],
                "baseline_chars": [b0, b1],
                "candidate_chars": [c0, c1],
                "baseline_text": b.text[b0:b1][:SPAN_TEXT],
                "candidate_text": c.text[c0:c1][:SPAN_TEXT],
            }
        )
    if len(ops) > MAX_SPANS:
        out.append({"op": "more", "count": len(ops) - MAX_SPANS})
    return out


def _compare(b: Output, c: Output, max_distance: int | None, spans: bool) -> tuple[Any, ...]:
    server = b.server_ids is not None and c.server_ids is not None
    tok = b.tokenizer if b.tokenizer is not None else c.tokenizer
    bs, bst, unit = _units(b, server, tok)
    cs, cst, _ = _units(c, server, tok)
    char = None if b.text == c.text else common_prefix(b.text, c.text)
    if char is None and tuple(bs) == tuple(cs):
        return (None, len(bs), 0, None, unit, None, len(bs), len(cs))
    cp = common_prefix(bs, cs)
    dist = max(1, edit_distance(bs, cs, max_distance))
    sp = _spans(b, c, bs, cs, bst, cst) if spans else None
    return (cp, cp, dist, char, unit, sp, len(bs), len(cs))


def _context(b: Output, c: Output, char: int) -> dict[str, Any]:
    lo = max(0, char - CONTEXT_CHARS)
    return {
        "char": char,
        "baseline_stream": b.stream_id,
        "candidate_stream": c.stream_id,
        "before": b.text[lo:char],
        "before_truncated": lo > 0,
        "baseline_after": b.text[char : char + CONTEXT_CHARS],
        "candidate_after": c.text[char : char + CONTEXT_CHARS],
    }


def _plan(
    bo: Sequence[Output], co: Sequence[Output], pairing: str, cap: int
) -> tuple[list[tuple[Output, Output]], int, int]:
    """(pairs, unpaired outputs, skipped pairs) for one prompt."""
    if pairing == "all":
        plan = [(b, c) for b in bo for c in co]
        skipped = max(0, len(plan) - cap)
        return plan[:cap], 0, skipped
    by_b: dict[int, list[Output]] = {}
    by_c: dict[int, list[Output]] = {}
    for o in bo:
        by_b.setdefault(o.choice, []).append(o)
    for o in co:
        by_c.setdefault(o.choice, []).append(o)
    plan = []
    unpaired = 0
    for ch in sorted(set(by_b) | set(by_c)):
        xb, xc = by_b.get(ch, []), by_c.get(ch, [])
        if not xb or not xc:
            unpaired += len(xb) + len(xc)
        elif pairing == "modal":
            plan.append((_modal(xb), _modal(xc)))
        else:
            plan.extend(zip(xb, xc, strict=False))
            unpaired += abs(len(xb) - len(xc))
    return plan, unpaired, 0


def _excluded(o: Output) -> dict[str, Any]:
    return {
        "stream": o.stream_id,
        "choice": o.choice,
        "state": o.state,
        "sampled_out": not o.text_kept,
        "prompt": o.prompt,
    }


def compute_diff(
    outputs: Sequence[Output],
    baseline: str,
    candidate: str,
    *,
    pairing: str = "index",
    max_distance: int | None = None,
    max_pairs_per_prompt: int = MAX_PAIRS_PER_PROMPT,
    include_incomplete: bool = False,
    match_model: bool = False,
    spans: bool = False,
    near_tie_margin: float = DEFAULT_NEAR_TIE_MARGIN,
) -> DiffReport:
    """Pair and compare the outputs labelled ``baseline`` and ``candidate`` (pure).

    ``outputs`` may hold streams in any state: incomplete ones are counted and
    compared only with ``include_incomplete``; sampled-out ones are counted
    and never compared."""
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be one of {', '.join(PAIRINGS)}, not {pairing!r}")
    bside, cside = SideStats(baseline), SideStats(candidate)
    sides: dict[str, dict[str, list[Output]]] = {baseline: {}, candidate: {}}
    stats_of = {baseline: bside, candidate: cside}
    excluded: dict[str, list[dict[str, Any]]] = {"baseline": [], "candidate": []}
    left_out: dict[str, dict[str, int]] = {baseline: {}, candidate: {}}  # key → outputs
    seen: set[tuple[str, int]] = set()
    for o in outputs:
        if o.label not in sides:
            continue
        st = stats_of[o.label]
        first = (o.label, o.stream_id) not in seen
        if first:
            seen.add((o.label, o.stream_id))
            st.streams += 1
            if not o.complete:
                st.incomplete += 1
            if not o.text_kept:
                st.sampled_out += 1
        key = o.model_pair_key if match_model else o.pair_key
        # a stream recovered mid-way (its request and first tokens unseen) is
        # never compared, even with include_incomplete
        if not o.text_kept or not (o.complete or include_incomplete) or o.state == "midway":
            if first:
                excluded["baseline" if o.label == baseline else "candidate"].append(_excluded(o))
            left_out[o.label][key] = left_out[o.label].get(key, 0) + 1
            continue
        sides[o.label].setdefault(key, []).append(o)
    base, cand = sides[baseline], sides[candidate]
    matched = [k for k in base if k in cand]
    prompts: list[PromptResult] = []
    pairs: list[PairResult] = []
    pair_outputs: list[tuple[Output, Output]] = []
    skipped = 0
    unpaired = 0
    cache: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for key in matched:
        bo, co = base[key], cand[key]
        for o in bo:
            bside.add(o)
        for o in co:
            cside.add(o)
        plan, lost, skip = _plan(bo, co, pairing, max_pairs_per_prompt)
        unpaired += lost
        skipped += skip
        mine: list[PairResult] = []
        fork_pair: tuple[Output, Output, int] | None = None
        for b, c in plan:
            ck = (_seq_key(b), _seq_key(c), id(b.tokenizer), id(c.tokenizer))
            got = cache.get(ck)
            if got is None:
                got = _compare(b, c, max_distance, spans)
                cache[ck] = got
            fd, cp, dist, char, unit, sp, nb, nc = got
            pr = PairResult(
                key=key,
                baseline_stream=b.stream_id,
                baseline_choice=b.choice,
                candidate_stream=c.stream_id,
                candidate_choice=c.choice,
                identical=fd is None,
                first_divergence=fd,
                common_prefix=cp,
                edit_distance=dist,
                edit_ratio=edit_ratio(dist, nb, nc),
                baseline_tokens=nb,
                candidate_tokens=nc,
                length_diff=nc - nb,
                baseline_finish=b.finish_reason,
                candidate_finish=c.finish_reason,
                first_divergence_char=char,
                first_divergence_chunk_baseline=None if char is None else _chunk_of(b, char),
                first_divergence_chunk_candidate=None if char is None else _chunk_of(c, char),
                token_unit=unit,
                spans=sp,
            )
            why = classify(b, c, margin=near_tie_margin, tokens_equal=fd is None)
            pr.cause = why.cause
            pr.cause_evidence = why.evidence or None
            pr.cause_source = why.source
            mine.append(pr)
            pair_outputs.append((b, c))
            if char is not None and (fork_pair is None or char < fork_pair[2]):
                fork_pair = (b, c, char)
        divs = [p.first_divergence for p in mine if p.first_divergence is not None]
        chars = [p.first_divergence_char for p in mine if p.first_divergence_char is not None]
        mb, mc = _modal(bo), _modal(co)
        prompts.append(
            PromptResult(
                key=key,
                model=bo[0].model,
                prompt=bo[0].prompt,
                baseline_outputs=len(bo),
                candidate_outputs=len(co),
                pairs=len(mine),
                identical_pairs=sum(1 for p in mine if p.identical),
                first_divergence=min(divs) if divs else None,
                median_edit_ratio=statistics.median(p.edit_ratio for p in mine) if mine else 0.0,
                finish_mismatches=sum(1 for p in mine if p.finish_differs),
                baseline_text=mb.text,
                candidate_text=mc.text,
                candidate_model=co[0].model,
                params=dict(bo[0].params),
                first_divergence_char=min(chars) if chars else None,
                fork_context=None if fork_pair is None else _context(*fork_pair),
            )
        )
        pairs.extend(mine)
    unmatched = {
        "baseline": [
            _unmatched(k, v, left_out[candidate].get(k, 0))
            for k, v in base.items()
            if k not in cand
        ],
        "candidate": [
            _unmatched(k, v, left_out[baseline].get(k, 0)) for k, v in cand.items() if k not in base
        ],
    }
    summary = _summary(prompts, pairs, bside, cside, unmatched)
    summary["skipped_pairs"] = skipped
    summary["unpaired_outputs"] = unpaired
    summary["first_divergence_unit"] = _unit_name(pairs, outputs)
    summary.update(
        cause_summary([p.cause for p in pairs], near_tie_margin, [p.cause_source for p in pairs])
    )
    return DiffReport(
        baseline,
        candidate,
        pairing,
        prompts,
        pairs,
        bside,
        cside,
        summary,
        skipped,
        unmatched,
        excluded,
        match_model,
        pair_outputs,
        near_tie_margin,
    )


def cause_summary(
    causes: Sequence[str | None], margin: float, sources: Sequence[str | None] = ()
) -> dict[str, Any]:
    """``causes`` (count per class), ``cause_sources`` (classes per deciding
    source), ``near_tie_margin``, ``<class>_pairs`` and ``<class>_ratio`` (of
    all pairs). A class's ratio has no value while some diverged pair's cause
    is unknown (no evidence), except ``unknown_ratio``."""
    n = len(causes)
    dist = distribution(causes)
    out: dict[str, Any] = {
        "causes": dist,
        "cause_sources": source_distribution(sources),
        "near_tie_margin": margin,
    }
    for name, k in dist.items():
        out[f"{name}_pairs"] = k
    for name, k in dist.items():
        known = n > 0 and (name == "unknown" or dist["unknown"] == 0)
        out[f"{name}_ratio"] = k / n if known else None
    return out


def _unmatched(key: str, outs: Sequence[Output], other_not_compared: int) -> dict[str, Any]:
    """A prompt seen on one side only; ``other_not_compared``: outputs of the other
    side with this prompt that were left out (incomplete or sampled out)."""
    o = outs[0]
    return {
        "fingerprint": key,
        "model": o.model,
        "prompt": o.prompt,
        "params": dict(o.params),
        "outputs": len(outs),
        "other_side_not_compared": other_not_compared,
    }


def _unit_name(pairs: Sequence[PairResult], outputs: Sequence[Output]) -> str | None:
    """What ``first_divergence`` counts, in words (None without pairs)."""
    units = {p.token_unit for p in pairs}
    if not units:
        return None
    names = sorted({o.tokenizer.name for o in outputs if o.tokenizer is not None})
    words = {
        "server": "token index in the server's own token ids (logprobs / TGI tokens)",
        "retokenized": "token index in ids re-tokenized from the text with "
        + (", ".join(names) or "the tokenizer"),
        "char": "character index (no tokenizer)",
    }
    if len(units) == 1:
        return words[next(iter(units))]
    return "mixed: " + "; ".join(f"{u} = {words[u]}" for u in sorted(units))


def _summary(
    prompts: Sequence[PromptResult],
    pairs: Sequence[PairResult],
    b: SideStats,
    c: SideStats,
    unmatched: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    n = len(pairs)
    divs = [p.first_divergence for p in pairs if p.first_divergence is not None]
    chars = [p.first_divergence_char for p in pairs if p.first_divergence_char is not None]
    ratios = [p.edit_ratio for p in pairs]
    bt, ct = _quantile(b.ttft_ms, 0.5), _quantile(c.ttft_ms, 0.5)
    bi, ci = _quantile(b.itl_ms, 0.5), _quantile(c.itl_ms, 0.5)
    bk, ck = b.tokens_per_chunk_mean(), c.tokens_per_chunk_mean()
    identical = sum(1 for p in pairs if p.identical)
    ub, uc = len(unmatched["baseline"]), len(unmatched["candidate"])
    all_prompts = len(prompts) + ub + uc
    streams = b.streams + c.streams
    return {
        "prompts": len(prompts),
        "pairs": n,
        "identical_pairs": identical,
        "identical_ratio": identical / n if n else None,
        "prompts_identical_ratio": (
            sum(1 for p in prompts if p.pairs and p.identical_pairs == p.pairs)
            / sum(1 for p in prompts if p.pairs)
            if any(p.pairs for p in prompts)
            else None
        ),
        "median_first_divergence": statistics.median(divs) if divs else None,
        "min_first_divergence": min(divs) if divs else None,
        "median_first_divergence_char": statistics.median(chars) if chars else None,
        "min_first_divergence_char": min(chars) if chars else None,
        "mean_common_prefix": statistics.fmean(p.common_prefix for p in pairs) if n else None,
        "mean_edit_distance": statistics.fmean(p.edit_distance for p in pairs) if n else None,
        "mean_edit_ratio": statistics.fmean(ratios) if n else None,
        "median_edit_ratio": statistics.median(ratios) if n else None,
        "max_edit_ratio": max(ratios) if n else None,
        "mean_length_diff": statistics.fmean(p.length_diff for p in pairs) if n else None,
        "mean_abs_length_diff": (
            statistics.fmean(abs(p.length_diff) for p in pairs) if n else None
        ),
        "finish_mismatch_ratio": (sum(1 for p in pairs if p.finish_differs) / n if n else None),
        "baseline_ttft_ms_p50": bt,
        "candidate_ttft_ms_p50": ct,
        "ttft_ratio": _ratio(bt, ct),
        "baseline_itl_ms_p50": bi,
        "candidate_itl_ms_p50": ci,
        "itl_ratio": _ratio(bi, ci),
        "baseline_tokens_per_chunk_mean": bk,
        "candidate_tokens_per_chunk_mean": ck,
        "tokens_per_chunk_ratio": _ratio(bk, ck),
        "unmatched_baseline_prompts": ub,
        "unmatched_candidate_prompts": uc,
        "unmatched_ratio": (ub + uc) / all_prompts if all_prompts else None,
        "baseline_streams": b.streams,
        "candidate_streams": c.streams,
        "baseline_incomplete": b.incomplete,
        "candidate_incomplete": c.incomplete,
        "incomplete_ratio": (b.incomplete + c.incomplete) / streams if streams else None,
        "baseline_sampled_out": b.sampled_out,
        "candidate_sampled_out": c.sampled_out,
        "sampled_out_ratio": (b.sampled_out + c.sampled_out) / streams if streams else None,
        **{
            f"{tag}_{m}": spec[m]
            for tag, spec in (
                ("baseline", b.speculation_summary()),
                ("candidate", c.speculation_summary()),
            )
            for m in SPECULATION_METRICS
        },
    }


def diff(
    store: Store,
    baseline: str,
    candidate: str,
    *,
    pairing: str = "index",
    model: str | None = None,
    registry: TokenizerRegistry | None = None,
    include_incomplete: bool = False,
    max_distance: int | None = None,
    match_model: bool = False,
    spans: bool = False,
    near_tie_margin: float = DEFAULT_NEAR_TIE_MARGIN,
    node: str | None = None,
    baseline_node: str | None = None,
    candidate_node: str | None = None,
) -> DiffReport:
    """Load both labels' outputs from the store (every state: incomplete streams
    are counted even when not compared) and compare them.

    ``node`` keeps only the streams one sidecar captured; ``baseline_node`` /
    ``candidate_node`` select each side's node (a baseline on one node and a
    candidate on another). A side given by its node alone may have an empty
    label (``""``: every label of that node). When both sides then have the
    same name, they are told apart as ``LABEL@NODE``.
    """
    b_node = baseline_node or node
    c_node = candidate_node or node
    if b_node == c_node and baseline and candidate:
        outputs = load_outputs(
            store,
            labels=[baseline, candidate],
            model=model,
            registry=registry,
            include_incomplete=True,
            node=b_node,
        )
    else:
        if not (baseline or b_node) or not (candidate or c_node):
            raise ValueError("each side needs a label or a node")
        b_name, c_name = baseline or b_node or "", candidate or c_node or ""
        if b_name == c_name:
            if b_node == c_node:
                raise ValueError("the baseline and the candidate select the same streams")
            b_name, c_name = f"{b_name}@{b_node or '*'}", f"{c_name}@{c_node or '*'}"
        outputs = []
        for side, label, side_node in ((b_name, baseline, b_node), (c_name, candidate, c_node)):
            part = load_outputs(
                store,
                labels=[label] if label else None,
                model=model,
                registry=registry,
                include_incomplete=True,
                node=side_node,
            )
            for o in part:
                o.label = side
            outputs.extend(part)
        baseline, candidate = b_name, c_name
    return compute_diff(
        outputs,
        baseline,
        candidate,
        pairing=pairing,
        max_distance=max_distance,
        include_incomplete=include_incomplete,
        match_model=match_model,
        spans=spans,
        near_tie_margin=near_tie_margin,
    )


# ---------------------------------------------------------------------------
# Reference-model attribution
# ---------------------------------------------------------------------------

#: Pairs scored by the reference model by default (``diff --max-pairs``).
DEFAULT_MAX_REFERENCE_PAIRS = 100


def attribute(
    report: DiffReport,
    model: ReferenceModel,
    *,
    max_pairs: int = DEFAULT_MAX_REFERENCE_PAIRS,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Score both sides of the diverged pairs (text differs) with a reference
    model (see :mod:`sniffer.llm.reference`): fills ``pair.reference`` of at
    most ``max_pairs`` pairs, in report order (pairs with the same request and
    outputs are scored once), and returns (and stores in ``report.reference``)
    the summary: pairs scored and left out, how often each side is preferred
    at the fork and overall."""
    jobs: list[ScoreJob] = []
    by_key: dict[tuple[Any, ...], ScoreJob] = {}
    chosen: list[tuple[PairResult, ScoreJob]] = []
    diverged = [
        (p, o)
        for p, o in zip(report.pairs, report.pair_outputs, strict=True)
        if p.first_divergence_char is not None
    ]
    for pr, (b, c) in diverged:
        key = (
            b.request_json,
            b.text,
            c.text,
            b.logprobs is None,
            c.logprobs is None,
            b.finish_reason,
            c.finish_reason,
        )
        job = by_key.get(key)
        if job is None:
            if len(jobs) >= max_pairs:
                continue
            job = ScoreJob(
                b.request_json,
                b.text,
                c.text,
                b.logprobs,
                c.logprobs,
                b.finish_reason,
                c.finish_reason,
            )
            by_key[key] = job
            jobs.append(job)
        chosen.append((pr, job))
    model.score(jobs, progress)
    at_fork: Counter[str] = Counter()
    overall: Counter[str] = Counter()
    errors = 0
    decided = 0
    for pr, job in chosen:
        pr.reference = job.result
        r = job.result or {}
        if "error" in r:
            errors += 1
            continue
        if pr.cause == "unknown":
            why = reference_cause(r, report.near_tie_margin)
            if why is not None:
                ev = dict(pr.cause_evidence or {})
                if "why" in ev:  # what the servers' logprobs lacked
                    ev["server_evidence"] = ev.pop("why")
                ev.update(why.evidence)
                pr.cause, pr.cause_evidence, pr.cause_source = why.cause, ev, why.source
                decided += 1
        at_fork[str(r.get("preferred_at_fork"))] += 1
        overall[str(r.get("preferred_overall"))] += 1
    scored = len(chosen) - errors
    summary: dict[str, Any] = {
        "model": model.source,
        "diverged_pairs": len(diverged),
        "scored_pairs": scored,
        "distinct_scored": len(jobs),
        "not_scored": len(diverged) - len(chosen),
        "errors": errors,
        "max_pairs": max_pairs,
        "preferred_at_fork": {k: at_fork.get(k, 0) for k in ("baseline", "candidate", "tie")},
        "preferred_overall": {k: overall.get(k, 0) for k in ("baseline", "candidate", "tie")},
        "candidate_preferred_at_fork_ratio": (
            at_fork.get("candidate", 0) / scored if scored else None
        ),
        "causes_decided": decided,  # unknown to the servers' logprobs, decided here
    }
    report.summary.update(
        cause_summary(
            [p.cause for p in report.pairs],
            report.near_tie_margin,
            [p.cause_source for p in report.pairs],
        )
    )
    report.reference = summary
    report.summary["reference_scored_pairs"] = scored
    report.summary["candidate_preferred_at_fork_ratio"] = summary[
        "candidate_preferred_at_fork_ratio"
    ]
    return summary


# ---------------------------------------------------------------------------
# Gates
# ---------------------------------------------------------------------------


class GateError(ValueError):
    """A --fail-if expression that does not parse or names an unknown metric."""


_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}
_GATE = re.compile(
    r"^\s*([a-z_][a-z0-9_]*)\s*(<=|>=|==|!=|<|>)\s*"
    r"([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(%?)\s*$"
)


@dataclass(frozen=True, slots=True)
class Gate:
    metric: str
    op: str
    value: float
    text: str


@dataclass(frozen=True, slots=True)
class GateResult:
    gate: Gate
    actual: float | None
    failed: bool  # the comparison held, or there is no evidence to judge it
    reason: str = ""  # why, in words ("no evidence: …" when not judged)


def parse_gate(text: str) -> Gate:
    """``"identical_ratio < 0.95"`` → Gate. A trailing ``%`` divides by 100."""
    m = _GATE.match(text)
    if m is None:
        raise GateError(f"{text!r} is not 'METRIC OP NUMBER' (OP one of < <= > >= == !=)")
    metric, op, number, pct = m.groups()
    if metric not in GATE_METRICS:
        raise GateError(f"unknown metric {metric!r}; one of: {', '.join(GATE_METRICS)}")
    value = float(number) / (100.0 if pct else 1.0)
    return Gate(metric, op, value, text.strip())


def _num(x: float) -> str:
    return f"{x:.6g}"


def evaluate_gates(
    gates: Sequence[Gate], summary: dict[str, Any], *, min_pairs: int = 1
) -> list[GateResult]:
    """Judge every gate against a diff summary. No evidence, no pass: with
    fewer than ``min_pairs`` pairs, or when the gate's metric has no value, the
    gate fails and its reason says "no evidence"."""
    out: list[GateResult] = []
    pairs = summary.get("pairs")
    n = pairs if isinstance(pairs, int) and not isinstance(pairs, bool) else 0
    for g in gates:
        raw = summary.get(g.metric)
        actual = float(raw) if isinstance(raw, int | float) and not isinstance(raw, bool) else None
        if n < min_pairs:
            what = "no pair" if n == 0 else f"only {n} pair{'s' if n != 1 else ''}"
            reason = f"no evidence: {what} compared (at least {min_pairs} required, --min-pairs)"
            out.append(GateResult(g, actual, True, reason))
        elif actual is None:
            why = _UNDEFINED_WHY.get(g.metric, "nothing to measure")
            out.append(GateResult(g, None, True, f"no evidence: {g.metric} has no value ({why})"))
        elif _OPS[g.op](actual, g.value):
            out.append(
                GateResult(g, actual, True, f"{g.metric} = {_num(actual)} {g.op} {_num(g.value)}")
            )
        else:
            out.append(
                GateResult(
                    g, actual, False, f"{g.metric} = {_num(actual)}, not {g.op} {_num(g.value)}"
                )
            )
    return out


def verdict(results: Sequence[GateResult]) -> dict[str, Any] | None:
    """``{"passed", "gates", "failed", "reasons"}``; None when no gate was given."""
    if not results:
        return None
    failed = [r for r in results if r.failed]
    return {
        "passed": not failed,
        "gates": len(results),
        "failed": len(failed),
        "reasons": [f"{r.gate.text}: {r.reason}" for r in failed],
    }


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------


def diff_json(report: DiffReport, gates: Sequence[GateResult] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {
        "baseline": report.baseline,
        "candidate": report.candidate,
        "pairing": report.pairing,
        "match_model": report.match_model,
        "summary": report.summary,
        "sides": {
            "baseline": report.baseline_side.summary(),
            "candidate": report.candidate_side.summary(),
        },
        "unmatched": report.unmatched,
        "not_compared": report.excluded,
        "reference": report.reference,
        "prompts": [asdict(p) for p in report.prompts],
        "pairs": [
            {k: v for k, v in asdict(p).items() if k != "spans" or v is not None}
            | {"finish_differs": p.finish_differs}
            for p in report.pairs
        ],
    }
    if gates:
        out["gates"] = [
            {"gate": r.gate.text, "actual": r.actual, "failed": r.failed, "reason": r.reason}
            for r in gates
        ]
        out["verdict"] = verdict(gates)
    return out


def _f(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _differing_params(prompts: Sequence[PromptResult]) -> dict[str, str]:
    """Per fingerprint, the parameters that differ between rows with the same prompt."""
    by_text: dict[str, list[PromptResult]] = {}
    for p in prompts:
        by_text.setdefault(p.prompt, []).append(p)
    out: dict[str, str] = {}
    for rows in by_text.values():
        if len(rows) < 2:
            continue
        names = sorted({k for r in rows for k in r.params})
        differ = [k for k in names if len({repr(r.params.get(k)) for r in rows}) > 1]
        for r in rows:
            out[r.key] = " ".join(f"{k}={r.params.get(k, '-')}" for k in differ)
    return out


def _model_cell(p: PromptResult) -> str:
    b, c = p.model or "-", p.candidate_model or "-"
    return b if b == c else f"{b}→{c}"


def _one_line(text: str) -> str:
    return text.replace("\n", "⏎").replace("\r", "")


def _view_words(name: str, v: dict[str, Any]) -> str:
    lp = v.get("chosen_logprob")
    head = f"{name} chose {v['chosen']!r}" + ("" if lp is None else f" ({lp:.3f})")
    if v.get("in_top_k"):
        return f"{head}, the other {v['other']!r} {v['other_logprob']:.3f} (gap {v['gap']:.3f})"
    if v.get("in_top_k") is False:
        return f"{head}, the other not in its top-{v['top_k']}"
    if v.get("gap_at_least") is not None:
        return f"{head}, any other ≥ {v['gap_at_least']:.3f} below"
    return head


def _cause_lines(report: DiffReport, limit: int) -> list[str]:
    s = report.summary
    causes = s.get("causes") or {}
    if not report.pairs:
        return []
    ident = sum(1 for p in report.pairs if p.cause is None)
    dist = ", ".join(f"{k} {v}" for k, v in causes.items() if v) or "none"
    srcs = s.get("cause_sources") or {}
    by = ", ".join(f"{SOURCE_WORDS[k]} {srcs[k]}" for k in CAUSE_SOURCES if srcs.get(k))
    out = [
        "",
        f"why they differ (near-tie margin {_f(report.near_tie_margin, 2)} nats): {dist}; "
        f"{ident} pairs identical" + (f"; decided by {by}" if by else ""),
    ]
    shown = 0
    for pr in report.pairs:
        if pr.cause is None:
            continue
        if shown >= limit:
            out.append("  … more pairs (--json for all)")
            break
        shown += 1
        words = cause_words(pr, report.baseline, report.candidate)
        src = f" [{SOURCE_WORDS[pr.cause_source]}]" if pr.cause_source else ""
        out.append(
            f"  {pr.key} streams {pr.baseline_stream}/{pr.candidate_stream} choice "
            f"{pr.baseline_choice}: {pr.cause}{src}" + (" — " + words if words else "")
        )
    return out


def cause_words(pr: PairResult, baseline: str, candidate: str) -> str:
    """What a pair's cause rests on, in words (empty for identical pairs)."""
    ev = pr.cause_evidence or {}
    words = []
    if "fork_token" in ev:
        words.append(f"at logprob token {ev['fork_token']}")
    for k, name in (("reference_view", baseline), ("other_view", candidate)):
        if k in ev:
            words.append(_view_words(name, ev[k]))
    if pr.cause == "length_only":
        early = baseline if ev.get("stopped_early") == "reference" else candidate
        words.append(
            f"{early} stopped early (finish {pr.baseline_finish or '-'}/"
            f"{pr.candidate_finish or '-'})"
        )
    if pr.cause == "finish_only":
        words.append(f"finish {pr.baseline_finish or '-'} vs {pr.candidate_finish or '-'}")
    if pr.cause == "retokenization_only":
        words.append("same text, other token ids")
    if pr.cause == "sampler_adjusted":
        adj = ev.get("sampler_adjusted_positions") or {}
        sides = {"reference": baseline, "other": candidate}
        words.append(
            "the raw logprobs favour the other token, but the sampler is adjusted ("
            + ", ".join(f"{sides.get(k, k)}: {n} tokens not its own top-1" for k, n in adj.items())
            + "): not substantive"
        )
    if ev.get("why"):
        words.append(ev["why"])
    if ev.get("server_evidence"):
        words.append(f"servers: {ev['server_evidence']}")
    rv = ev.get("reference_model_view")
    if rv is not None:
        gap = rv.get("gap")
        words.append(
            f"reference model surprisal at the fork {baseline} "
            f"{_f(rv.get('baseline_fork_surprisal'))} vs {candidate} "
            f"{_f(rv.get('candidate_fork_surprisal'))} nats"
            + ("" if gap is None else f" (gap {gap:.3f})")
        )
    return "; ".join(words)


def _reference_lines(report: DiffReport, limit: int) -> list[str]:
    r = report.reference
    assert r is not None
    pf, po = r["preferred_at_fork"], r["preferred_overall"]
    out = [
        "",
        f"reference model {r['model']}: {r['scored_pairs']} of {r['diverged_pairs']} diverged "
        f"pairs scored ({r['not_scored']} over --max-pairs {r['max_pairs']}, {r['errors']} "
        f"not scorable); prefers at the fork {report.baseline} {pf['baseline']}, "
        f"{report.candidate} {pf['candidate']}; overall (mean log-prob per token) "
        f"{report.baseline} {po['baseline']}, {report.candidate} {po['candidate']}",
    ]
    shown = 0
    for pr in report.pairs:
        ref = pr.reference
        if ref is None:
            continue
        if shown >= limit:
            out.append("  … more pairs (--json for all)")
            break
        shown += 1
        head = f"  {pr.key} streams {pr.baseline_stream}/{pr.candidate_stream}"
        if "error" in ref:
            out.append(f"{head}: not scored: {ref['error']}")
            continue
        b, c = ref["baseline"], ref["candidate"]
        where = f"fork at token {ref['fork_token']}"
        if ref.get("fork_scoring") == "text":
            where += (
                f", scored on text: fork at char {ref.get('fork_char')} from the word at "
                f"char {ref.get('scored_from_char')}"
            )
        out.append(
            f"{head} ({ref['ids']} ids, {where}): "
            f"surprisal at the fork {report.baseline} {b['fork_token']!r} "
            f"{_f(ref['baseline_fork_surprisal'])} vs {report.candidate} "
            f"{c['fork_token']!r} {_f(ref['candidate_fork_surprisal'])} nats → prefers "
            f"{ref['preferred_at_fork']}; cumulative log-prob {_f(b['cumulative_logprob'], 2)} "
            f"({b['scored_tokens']} tok) vs {_f(c['cumulative_logprob'], 2)} "
            f"({c['scored_tokens']} tok), overall {ref['preferred_overall']}"
        )
        for side, name in ((b, report.baseline), (c, report.candidate)):
            top = ", ".join(
                f"{h['token']!r}@{h['index']} {h['surprisal']:.2f}"
                for h in side["highest_surprisal"]
            )
            out.append(f"      {name:>12} highest surprisal: {top or '-'}")
    return out


def format_diff(
    report: DiffReport, gates: Sequence[GateResult] = (), limit: int = 50, spans: bool = False
) -> str:
    lines = _prompt_lines(report, limit)
    lines.extend(_fork_lines(report, limit))
    lines.extend(_cause_lines(report, limit))
    if report.reference is not None:
        lines.extend(_reference_lines(report, limit))
    if spans:
        lines.extend(_span_lines(report))
    lines.append("")
    lines.extend(_summary_lines(report, limit))
    lines.extend(_gate_lines(gates))
    return "\n".join(lines)


def _prompt_lines(report: DiffReport, limit: int) -> list[str]:
    """The header and one row per prompt (the first ``limit``)."""
    s = report.summary
    params = _differing_params(report.prompts)
    show_params = any(params.values())
    mw = min(40, max([5, *(len(_model_cell(p)) for p in report.prompts[:limit])]))
    lines: list[str] = [
        f"{report.baseline} vs {report.candidate} (pairing: {report.pairing}; key: prompt + "
        f"parameters{' + model' if report.match_model else ', not the model name'})",
        f"{'fingerprint':<16} {'model':<{mw}} {'base':>4} {'cand':>4} {'pairs':>5} {'ident':>6} "
        f"{'token':>5} {'char':>5} {'chunk':>5} {'edit':>6} {'fin≠':>4}  "
        + ("params  " if show_params else "")
        + "prompt",
    ]
    first_chunk: dict[str, int | None] = {}
    for pr in report.pairs:
        if pr.first_divergence_char is not None:
            cur = first_chunk.get(pr.key)
            ch = pr.first_divergence_chunk_baseline
            if pr.key not in first_chunk or (ch is not None and (cur is None or ch < cur)):
                first_chunk[pr.key] = ch
    for p in report.prompts[:limit]:
        lines.append(
            f"{p.key:<16} {_model_cell(p)[:mw]:<{mw}} {p.baseline_outputs:>4} "
            f"{p.candidate_outputs:>4} {p.pairs:>5} "
            f"{p.identical_pairs / p.pairs if p.pairs else 0:>6.1%} "
            f"{_f(p.first_divergence):>5} {_f(p.first_divergence_char):>5} "
            f"{_f(first_chunk.get(p.key)):>5} {p.median_edit_ratio:>6.3f} "
            f"{p.finish_mismatches:>4}  "
            + (f"{params.get(p.key, '')}  " if show_params else "")
            + f"{p.prompt[:60]}"
        )
    if len(report.prompts) > limit:
        lines.append(f"… {len(report.prompts) - limit} more prompts (--json for all)")
    if s.get("first_divergence_unit"):
        lines.append(
            f"token = first divergence as {s['first_divergence_unit']}; char = character "
            "index; chunk = served text chunk (1-based) of the baseline holding that character"
        )
    return lines


def _fork_lines(report: DiffReport, limit: int) -> list[str]:
    """Where each prompt's outputs fork: the text before, then each side."""
    lines: list[str] = []
    forked = [p for p in report.prompts if p.fork_context is not None][:limit]
    if forked:
        lines.append("")
        lines.append("where they fork (text before the fork, then each side from it):")
        for p in forked:
            fc = p.fork_context
            assert fc is not None
            lines.append(
                f"  {p.key} char {fc['char']} (streams {fc['baseline_stream']}/"
                f"{fc['candidate_stream']}): …{_one_line(fc['before'][-60:])}"
            )
            lines.append(f"    {report.baseline:>12} ▶ {_one_line(fc['baseline_after'][:60])}")
            lines.append(f"    {report.candidate:>12} ▶ {_one_line(fc['candidate_after'][:60])}")
    return lines


def _span_lines(report: DiffReport) -> list[str]:
    """The differing token spans of every pair (``--spans``)."""
    lines = ["", "differing spans (token ranges [start, end) of each side):"]
    for pr in report.pairs:
        if not pr.spans:
            continue
        lines.append(
            f"  {pr.key} streams {pr.baseline_stream}/{pr.candidate_stream} choice "
            f"{pr.baseline_choice} ({pr.token_unit}):"
        )
        for sp in pr.spans:
            if sp["op"] == "more":
                lines.append(f"    … {sp['count']} more spans")
                continue
            b0, b1 = sp["baseline_tokens"]
            c0, c1 = sp["candidate_tokens"]
            lines.append(
                f"    {sp['op']:<7} [{b0}, {b1}) {sp['baseline_text'][:40]!r} → "
                f"[{c0}, {c1}) {sp['candidate_text'][:40]!r}"
            )
    return lines


def _summary_lines(report: DiffReport, limit: int) -> list[str]:
    """Totals, what was not compared and why, latency and speculation per side."""
    s = report.summary
    lines: list[str] = []
    lines.append(
        f"{s['prompts']} prompts matched, {s['pairs']} pairs: {s['identical_pairs']} identical "
        f"({_f(s['identical_ratio'])}); median first divergence "
        f"{_f(s['median_first_divergence'], 1)} (char {_f(s['median_first_divergence_char'], 1)}); "
        f"mean edit ratio {_f(s['mean_edit_ratio'])}; "
        f"finish mismatch {_f(s['finish_mismatch_ratio'])}"
    )
    lines.append(
        f"unmatched prompts: {s['unmatched_baseline_prompts']} baseline only, "
        f"{s['unmatched_candidate_prompts']} candidate only (ratio {_f(s['unmatched_ratio'])})"
    )
    for tag, items in report.unmatched.items():
        other = "candidate" if tag == "baseline" else "baseline"
        for u in items[:limit]:
            why = (
                f" ({other}: {u['other_side_not_compared']} outputs not compared)"
                if u["other_side_not_compared"]
                else ""
            )
            lines.append(
                f"  {tag} only: {u['fingerprint']} {u['model'] or '-'} {u['prompt'][:60]}{why}"
            )
    lines.append(
        f"not compared: {s['baseline_incomplete']} of {s['baseline_streams']} baseline and "
        f"{s['candidate_incomplete']} of {s['candidate_streams']} candidate streams incomplete "
        f"(ratio {_f(s['incomplete_ratio'])})"
        + ("" if s["unpaired_outputs"] == 0 else f"; {s['unpaired_outputs']} outputs unpaired")
    )
    for name, n in (
        (report.baseline, s["baseline_streams"]),
        (report.candidate, s["candidate_streams"]),
    ):
        if n == 0:
            lines.append(f"no stream is labelled {name!r}")
    if s["baseline_sampled_out"] or s["candidate_sampled_out"]:
        lines.append(
            f"text sampled out (--sample-rate), not compared: {s['baseline_sampled_out']} "
            f"baseline and {s['candidate_sampled_out']} candidate streams"
        )
    for side, tag in ((report.baseline_side, "baseline"), (report.candidate_side, "candidate")):
        t = _dist(side.ttft_ms)
        i = _dist(side.itl_ms)
        lines.append(
            f"{tag:<9} {side.label}: {side.outputs} outputs, TTFT p50 {_f(t['p50'], 1)} ms "
            f"p90 {_f(t['p90'], 1)} ms, ITL p50 {_f(i['p50'], 2)} ms, "
            f"tokens/chunk {_f(side.tokens_per_chunk_mean(), 2)}"
            + (
                f" ({side.clock_backwards} without timings: the capture clock went backwards)"
                if side.clock_backwards
                else ""
            )
        )
    for side, tag in ((report.baseline_side, "baseline"), (report.candidate_side, "candidate")):
        lines.append(f"{tag:<9} {side.label}: {describe_side(side.speculation_summary())}")
    for side, tag in ((report.baseline_side, "baseline"), (report.candidate_side, "candidate")):
        if side.logprob_tokens:
            lines.append(
                f"{tag:<9} {side.label}: sampler "
                + ("adjusted" if side.not_top1_tokens else "greedy on its logprobs")
                + f": {side.not_top1_tokens} of {side.logprob_tokens} logprob tokens not the "
                "top-1 of their own raw logprobs"
            )
    lines.append(
        f"ratios (candidate/baseline): TTFT {_f(s['ttft_ratio'])}, ITL {_f(s['itl_ratio'])}, "
        f"tokens/chunk {_f(s['tokens_per_chunk_ratio'])}"
    )
    return lines


def _gate_lines(gates: Sequence[GateResult]) -> list[str]:
    """One line per gate, then the verdict."""
    lines: list[str] = []
    for r in gates:
        state = "FAIL" if r.failed else "ok"
        lines.append(f"gate {r.gate.text}: {state} (actual {_f(r.actual, 4)}) — {r.reason}")
    v = verdict(gates)
    if v is not None:
        lines.append(
            "verdict: PASS (every gate held)"
            if v["passed"]
            else f"verdict: FAIL ({v['failed']} of {v['gates']} gates failed)"
        )
    return lines
