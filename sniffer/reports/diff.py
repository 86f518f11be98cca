"""Baseline vs candidate: do two deployments stream the same tokens, as fast?

Outputs (see :mod:`sniffer.reports.stats`) of the two labels are matched by
the request fingerprint *without* the label. For every fingerprint present on
both sides, pairs are formed:

* ``all`` — every baseline output with every candidate output (repeats give
  n×m pairs; at most :data:`MAX_PAIRS_PER_PROMPT` per prompt, the rest are
  counted in ``skipped_pairs``);
* ``modal`` — the most frequent output of each side (ties: the earliest).

Each pair compares token-id sequences: identical, first divergence position,
common prefix length, Levenshtein distance (:func:`~sniffer.reports.align.edit_distance`,
bit-parallel, computed once per distinct pair of outputs) and its ratio to the
longer length, length difference (candidate − baseline) and finish reasons.

Per side: TTFT, inter-token latency and tokens-per-chunk distributions over the
outputs of matched prompts.

Gates: ``METRIC OP NUMBER`` (OP one of ``< <= > >= == !=``), METRIC a key of
:data:`GATE_METRICS`; a gate *fails* when its comparison holds. A metric with no
value (e.g. ``median_first_divergence`` when every pair is identical) makes no
gate fail; it is reported as undefined. Parsed with a regular expression, never
evaluated.
"""

from __future__ import annotations

import math
import operator
import re
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Engine

from sniffer.llm.tokens import TokenizerRegistry
from sniffer.reports.align import common_prefix, edit_distance, edit_ratio
from sniffer.reports.stats import Output, load_outputs

__all__ = [
    "GATE_METRICS",
    "MAX_PAIRS_PER_PROMPT",
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
]

MAX_PAIRS_PER_PROMPT = 10_000

#: Summary metrics a gate may name (all numbers; some may be undefined).
GATE_METRICS = (
    "prompts",
    "pairs",
    "identical_pairs",
    "identical_ratio",
    "prompts_identical_ratio",
    "median_first_divergence",
    "min_first_divergence",
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
)


@dataclass(slots=True)
class PairResult:
    key: str
    baseline_stream: int
    baseline_choice: int
    candidate_stream: int
    candidate_choice: int
    identical: bool
    first_divergence: int | None
    common_prefix: int
    edit_distance: int
    edit_ratio: float
    baseline_tokens: int
    candidate_tokens: int
    length_diff: int  # candidate − baseline tokens
    baseline_finish: str | None
    candidate_finish: str | None

    @property
    def finish_differs(self) -> bool:
        return self.baseline_finish != self.candidate_finish


@dataclass(slots=True)
class PromptResult:
    key: str
    model: str | None
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

    def add(self, o: Output) -> None:
        self.outputs += 1
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
            "ttft_ms": _dist(self.ttft_ms),
            "itl_ms": _dist(self.itl_ms),
            "tokens_per_chunk_mean": self.tokens_per_chunk_mean(),
            "tokens_per_chunk": {str(k): v for k, v in sorted(self.tokens_per_chunk.items())},
        }


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


def _seq_key(o: Output) -> Any:
    return o.ids if o.tokenizer is not None else o.text


def _modal(outs: Sequence[Output]) -> Output:
    counts = Counter(_seq_key(o) for o in outs)
    best = max(counts.values())
    return next(o for o in outs if counts[_seq_key(o)] == best)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a == 0:
        return None
    return b / a


def compute_diff(
    outputs: Sequence[Output],
    baseline: str,
    candidate: str,
    *,
    pairing: str = "all",
    max_distance: int | None = None,
    max_pairs_per_prompt: int = MAX_PAIRS_PER_PROMPT,
) -> DiffReport:
    """Pair and compare the outputs labelled ``baseline`` and ``candidate`` (pure)."""
    if pairing not in ("all", "modal"):
        raise ValueError(f"pairing must be 'all' or 'modal', not {pairing!r}")
    sides: dict[str, dict[str, list[Output]]] = {baseline: {}, candidate: {}}
    for o in outputs:
        if o.label in sides:
            sides[o.label].setdefault(o.pair_key, []).append(o)
    base, cand = sides[baseline], sides[candidate]
    matched = [k for k in base if k in cand]
    bside, cside = SideStats(baseline), SideStats(candidate)
    prompts: list[PromptResult] = []
    pairs: list[PairResult] = []
    skipped = 0
    for key in matched:
        bo, co = base[key], cand[key]
        for o in bo:
            bside.add(o)
        for o in co:
            cside.add(o)
        if pairing == "modal":
            plan = [(_modal(bo), _modal(co))]
        else:
            plan = [(b, c) for b in bo for c in co]
            if len(plan) > max_pairs_per_prompt:
                skipped += len(plan) - max_pairs_per_prompt
                plan = plan[:max_pairs_per_prompt]
        cache: dict[tuple[Any, Any], tuple[int | None, int, int]] = {}
        mine: list[PairResult] = []
        for b, c in plan:
            kb, kc = _seq_key(b), _seq_key(c)
            got = cache.get((kb, kc))
            if got is None:
                if kb == kc:
                    got = (None, len(b.ids), 0)
                else:
                    cp = common_prefix(b.ids, c.ids)
                    # max(…, 1): texts differ even when no tokenizer gave ids
                    got = (cp, cp, max(1, edit_distance(b.ids, c.ids, max_distance)))
                cache[(kb, kc)] = got
            fd, cp, dist = got
            nb, nc = len(b.ids), len(c.ids)
            mine.append(
                PairResult(
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
                )
            )
        divs = [p.first_divergence for p in mine if p.first_divergence is not None]
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
                median_edit_ratio=statistics.median(p.edit_ratio for p in mine),
                finish_mismatches=sum(1 for p in mine if p.finish_differs),
                baseline_text=mb.text,
                candidate_text=mc.text,
            )
        )
        pairs.extend(mine)
    summary = _summary(
        prompts,
        pairs,
        bside,
        cside,
        unmatched_b=sum(1 for k in base if k not in cand),
        unmatched_c=sum(1 for k in cand if k not in base),
    )
    summary["skipped_pairs"] = skipped
    return DiffReport(baseline, candidate, pairing, prompts, pairs, bside, cside, summary, skipped)


def _summary(
    prompts: Sequence[PromptResult],
    pairs: Sequence[PairResult],
    b: SideStats,
    c: SideStats,
    *,
    unmatched_b: int,
    unmatched_c: int,
) -> dict[str, Any]:
    n = len(pairs)
    divs = [p.first_divergence for p in pairs if p.first_divergence is not None]
    ratios = [p.edit_ratio for p in pairs]
    bt, ct = _quantile(b.ttft_ms, 0.5), _quantile(c.ttft_ms, 0.5)
    bi, ci = _quantile(b.itl_ms, 0.5), _quantile(c.itl_ms, 0.5)
    bk, ck = b.tokens_per_chunk_mean(), c.tokens_per_chunk_mean()
    identical = sum(1 for p in pairs if p.identical)
    return {
        "prompts": len(prompts),
        "pairs": n,
        "identical_pairs": identical,
        "identical_ratio": identical / n if n else None,
        "prompts_identical_ratio": (
            sum(1 for p in prompts if p.identical_pairs == p.pairs) / len(prompts)
            if prompts
            else None
        ),
        "median_first_divergence": statistics.median(divs) if divs else None,
        "min_first_divergence": min(divs) if divs else None,
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
        "unmatched_baseline_prompts": unmatched_b,
        "unmatched_candidate_prompts": unmatched_c,
    }


def diff(
    engine: Engine,
    baseline: str,
    candidate: str,
    *,
    pairing: str = "all",
    model: str | None = None,
    registry: TokenizerRegistry | None = None,
    include_incomplete: bool = False,
    max_distance: int | None = None,
) -> DiffReport:
    """Load both labels' outputs from the store and compare them."""
    outputs = load_outputs(
        engine,
        labels=[baseline, candidate],
        model=model,
        registry=registry,
        include_incomplete=include_incomplete,
    )
    return compute_diff(outputs, baseline, candidate, pairing=pairing, max_distance=max_distance)


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
    failed: bool  # the comparison held: the gate fails (undefined never fails)


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


def evaluate_gates(gates: Sequence[Gate], summary: dict[str, Any]) -> list[GateResult]:
    out: list[GateResult] = []
    for g in gates:
        actual = summary.get(g.metric)
        if not isinstance(actual, int | float) or isinstance(actual, bool):
            out.append(GateResult(g, None, False))
            continue
        out.append(GateResult(g, float(actual), _OPS[g.op](float(actual), g.value)))
    return out


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------


def diff_json(report: DiffReport, gates: Sequence[GateResult] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {
        "baseline": report.baseline,
        "candidate": report.candidate,
        "pairing": report.pairing,
        "summary": report.summary,
        "sides": {
            "baseline": report.baseline_side.summary(),
            "candidate": report.candidate_side.summary(),
        },
        "prompts": [asdict(p) for p in report.prompts],
        "pairs": [dict(asdict(p), finish_differs=p.finish_differs) for p in report.pairs],
    }
    if gates:
        out["gates"] = [
            {"gate": r.gate.text, "actual": r.actual, "failed": r.failed} for r in gates
        ]
    return out


def _f(x: Any, nd: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def format_diff(report: DiffReport, gates: Sequence[GateResult] = (), limit: int = 50) -> str:
    lines: list[str] = [
        f"{report.baseline} vs {report.candidate} (pairing: {report.pairing})",
        f"{'fingerprint':<16} {'base':>4} {'cand':>4} {'pairs':>5} {'ident':>6} "
        f"{'fork':>5} {'edit':>6} {'fin≠':>4}  prompt",
    ]
    for p in report.prompts[:limit]:
        lines.append(
            f"{p.key:<16} {p.baseline_outputs:>4} {p.candidate_outputs:>4} {p.pairs:>5} "
            f"{p.identical_pairs / p.pairs if p.pairs else 0:>6.1%} "
            f"{_f(p.first_divergence):>5} {p.median_edit_ratio:>6.3f} {p.finish_mismatches:>4}  "
            f"{p.prompt[:60]}"
        )
    if len(report.prompts) > limit:
        lines.append(f"… {len(report.prompts) - limit} more prompts (--json for all)")
    s = report.summary
    lines.append("")
    lines.append(
        f"{s['prompts']} prompts matched, {s['pairs']} pairs: {s['identical_pairs']} identical "
        f"({_f(s['identical_ratio'])}); median first divergence "
        f"{_f(s['median_first_divergence'], 1)}; mean edit ratio {_f(s['mean_edit_ratio'])}; "
        f"finish mismatch {_f(s['finish_mismatch_ratio'])}"
    )
    if s["unmatched_baseline_prompts"] or s["unmatched_candidate_prompts"]:
        lines.append(
            f"unmatched prompts: {s['unmatched_baseline_prompts']} baseline only, "
            f"{s['unmatched_candidate_prompts']} candidate only"
        )
    for side, tag in ((report.baseline_side, "baseline"), (report.candidate_side, "candidate")):
        t = _dist(side.ttft_ms)
        i = _dist(side.itl_ms)
        lines.append(
            f"{tag:<9} {side.label}: {side.outputs} outputs, TTFT p50 {_f(t['p50'], 1)} ms "
            f"p90 {_f(t['p90'], 1)} ms, ITL p50 {_f(i['p50'], 2)} ms, "
            f"tokens/chunk {_f(side.tokens_per_chunk_mean(), 2)}"
        )
    lines.append(
        f"ratios (candidate/baseline): TTFT {_f(s['ttft_ratio'])}, ITL {_f(s['itl_ratio'])}, "
        f"tokens/chunk {_f(s['tokens_per_chunk_ratio'])}"
    )
    for r in gates:
        state = "FAIL" if r.failed else ("undefined" if r.actual is None else "ok")
        lines.append(f"gate {r.gate.text}: {state} (actual {_f(r.actual, 4)})")
    return "\n".join(lines)
