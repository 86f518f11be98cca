"""Speculative decoding seen in the cadence of a stream, when the server says nothing.

A server that verifies drafted tokens in batches (speculative decoding) but
streams one token per event — llama.cpp, llama-cpp-python — shows it in the
capture times: a run of events a few milliseconds apart (the tokens one
verification step accepted, written out back to back), then a long gap
while the next batch is verified. A server without it streams at one steady
pace. :func:`cadence` reads that from one output's chunk times (pure: no
clock, no I/O):

* the gaps between consecutive text chunks are split in two classes where
  their logarithms separate best (Otsu's threshold: the split that
  maximises the between-class variance, then moved to the widest empty
  stretch between the two classes' medians, see :func:`split_threshold`),
  so the threshold comes from the stream's own gap distribution, not a fixed
  number of milliseconds;
* the stream is ``bursty`` when the two classes are far apart (the long
  gaps' median at least :data:`MODE_RATIO` times the short gaps'), each
  holds enough gaps (:data:`MIN_SHORT_SHARE` of them short, at least
  :data:`MIN_LONG_GAPS` and :data:`MIN_LONG_SHARE` long), else ``steady``;
  ``unknown`` with fewer than :data:`MIN_GAPS` gaps;
* a *burst* is a run of chunks whose gaps are all short (a chunk between two
  long gaps is a burst of one); in a steady stream every chunk is its own;
* the estimated tokens per verification step is the output's tokens divided
  by its bursts (each burst is one step): what vLLM reports as
  ``mean_acceptance_length`` and SGLang as ``spec_accept_length``, and
  ``1 + estimated accepted drafts per step``.

The estimate counts the steps that the server wrote out separately; a server
that packs several events in one write also shows bursts (its evidence says
how far apart the two classes are).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from sniffer.llm.values import SpecDecode

__all__ = [
    "BURSTY",
    "CADENCE_CLASSES",
    "MIN_GAPS",
    "MIN_LONG_GAPS",
    "MIN_LONG_SHARE",
    "MIN_SHORT_SHARE",
    "MODE_RATIO",
    "STEADY",
    "UNKNOWN",
    "Cadence",
    "cadence",
    "describe_side",
    "gap_histogram",
    "spec_of_row",
    "split_threshold",
    "stream_lines",
    "summarize",
]

STEADY = "steady"
BURSTY = "bursty"
UNKNOWN = "unknown"
CADENCE_CLASSES = (STEADY, BURSTY, UNKNOWN)

#: Fewer gaps than this between text chunks: too few to tell.
MIN_GAPS = 8
#: The long gaps' median over the short gaps' median, at least, for ``bursty``.
MODE_RATIO = 4.0
#: Of the gaps, at least this share short for ``bursty``.
MIN_SHORT_SHARE = 0.2
#: At least this many long gaps, and this share of them, for ``bursty``.
MIN_LONG_GAPS = 2
MIN_LONG_SHARE = 0.05
#: Gaps shorter than this (seconds) count as this long in the log-space split
#: (the capture clock's resolution; two events in one segment have gap 0).
GAP_FLOOR = 1e-5


@dataclass(frozen=True, slots=True)
class Cadence:
    """One output's cadence (see the module docstring).

    ``threshold_ms``: gaps at or below it are inside a burst (None when
    steady or unknown). ``burst_lengths``: chunks per burst → bursts.
    ``tokens_per_step``: tokens / bursts (None without chunks).
    ``evidence``: what the class rests on, by name.
    """

    cls: str
    gaps: int
    threshold_ms: float | None = None
    burst_lengths: dict[int, int] = field(default_factory=dict)
    tokens_per_step: float | None = None
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def bursts(self) -> int:
        return sum(self.burst_lengths.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "class": self.cls,
            "gaps": self.gaps,
            "threshold_ms": self.threshold_ms,
            "bursts": self.bursts,
            "burst_lengths": {str(k): v for k, v in sorted(self.burst_lengths.items())},
            "tokens_per_step": self.tokens_per_step,
            "evidence": dict(self.evidence),
        }

    def describe(self) -> str:
        """One line: the class and what it rests on."""
        e = self.evidence
        if self.cls == UNKNOWN:
            return f"unknown ({self.gaps} gaps between text chunks: too few to tell)"
        tps = f"{self.tokens_per_step:.2f}" if self.tokens_per_step is not None else "-"
        return (
            f"{self.cls}: {e['short_share'] * 100:.0f}% of {self.gaps} gaps ≤ "
            f"{e['split_ms']:.2f} ms (p50 {e['short_ms_p50']:.2f} ms) vs p50 "
            f"{e['long_ms_p50']:.2f} ms ({e['mode_ratio']:.1f}x); {self.bursts} bursts, "
            f"longest {max(self.burst_lengths, default=0)}; ~{tps} tokens per step"
        )


def split_threshold(gaps: Sequence[float]) -> tuple[int, float]:
    """Where the sorted ``gaps`` separate best in log space: ``(k, t)``, the
    first ``k`` sorted gaps in the short class, ``t`` the geometric mean of
    the two gaps on either side of the split. Needs two gaps or more.

    Otsu's split (the one that maximises the between-class variance of the
    logarithms) finds the two modes; the split itself is then put in the
    widest empty stretch between the two classes' medians (the largest ratio
    of consecutive sorted gaps there): Otsu alone cuts a mode with a long
    tail (gaps inside a burst from 0.02 to 8 ms, between bursts 500 ms and
    up) through its tail."""
    s = sorted(max(g, GAP_FLOOR) for g in gaps)
    logs = [math.log(g) for g in s]
    n = len(logs)
    total = sum(logs)
    best_k, best = 1, -1.0
    prefix = 0.0
    for k in range(1, n):
        prefix += logs[k - 1]
        mean_a = prefix / k
        mean_b = (total - prefix) / (n - k)
        between = k * (n - k) * (mean_a - mean_b) ** 2
        if between > best:
            best_k, best = k, between
    lo = (best_k - 1) // 2  # the short class's median (lower one when even)
    hi = best_k + (n - best_k) // 2  # the long class's median (upper one when even)
    k = max(range(lo + 1, hi + 1), key=lambda i: (logs[i] - logs[i - 1], -abs(i - best_k)))
    return k, math.sqrt(s[k - 1] * s[k])


def cadence(times: Sequence[float], tokens: Sequence[int] | None = None) -> Cadence:
    """The cadence of one output from the capture times of its text chunks (in
    order) and, when known, the tokens each chunk carries (else one each, as
    llama.cpp streams them)."""
    n_chunks = len(times)
    counts = list(tokens) if tokens is not None and len(tokens) == n_chunks else [1] * n_chunks
    total = sum(counts)
    gaps = [max(0.0, b - a) for a, b in pairwise(times)]
    if len(gaps) < MIN_GAPS:
        return Cadence(
            UNKNOWN,
            len(gaps),
            burst_lengths={1: n_chunks} if n_chunks else {},
            tokens_per_step=total / n_chunks if n_chunks else None,
        )
    k, threshold = split_threshold(gaps)
    ordered = sorted(gaps)
    short, long_ = ordered[:k], ordered[k:]
    short_p50 = statistics.median(short)
    long_p50 = statistics.median(long_)
    ratio = long_p50 / max(short_p50, GAP_FLOOR)
    short_share = len(short) / len(gaps)
    evidence: dict[str, Any] = {
        "split_ms": threshold * 1000.0,
        "short_share": short_share,
        "short_ms_p50": short_p50 * 1000.0,
        "long_ms_p50": long_p50 * 1000.0,
        "mode_ratio": ratio,
        "long_gaps": len(long_),
    }
    bursty = (
        ratio >= MODE_RATIO
        and short_share >= MIN_SHORT_SHARE
        and len(long_) >= MIN_LONG_GAPS
        and len(long_) / len(gaps) >= MIN_LONG_SHARE
    )
    if not bursty:
        return Cadence(
            STEADY,
            len(gaps),
            burst_lengths={1: n_chunks},
            tokens_per_step=total / n_chunks,
            evidence=evidence,
        )
    lengths: dict[int, int] = {}
    run = 1
    for g in gaps:
        if g <= threshold:
            run += 1
        else:
            lengths[run] = lengths.get(run, 0) + 1
            run = 1
    lengths[run] = lengths.get(run, 0) + 1
    bursts = sum(lengths.values())
    return Cadence(
        BURSTY,
        len(gaps),
        threshold_ms=threshold * 1000.0,
        burst_lengths=dict(sorted(lengths.items())),
        tokens_per_step=total / bursts,
        evidence=evidence,
    )


#: Bin edges of :func:`gap_histogram`, in milliseconds (log-spaced: the short
#: and the long mode of a bursty stream fall far apart).
GAP_BINS_MS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0)


def gap_histogram(gaps_ms: Sequence[float]) -> list[tuple[float, float | None, int]]:
    """``(low, high, count)`` per bin of :data:`GAP_BINS_MS` (the last bin open)."""
    edges = GAP_BINS_MS
    counts = [0] * len(edges)
    for g in gaps_ms:
        i = len(edges) - 1
        while i > 0 and g < edges[i]:
            i -= 1
        counts[i] += 1
    return [
        (lo, edges[i + 1] if i + 1 < len(edges) else None, c)
        for i, (lo, c) in enumerate(zip(edges, counts, strict=True))
    ]


# ---------------------------------------------------------------------------
# Per side: the cadence classes and the server-reported figures together
# ---------------------------------------------------------------------------


def summarize(items: Iterable[tuple[Cadence | None, SpecDecode | None]]) -> dict[str, Any]:
    """What one side's outputs say about speculative decoding: how many have
    each cadence class, the share of the classified ones that are bursty, the
    estimated tokens per step (median over classified outputs), and what the
    servers reported (outputs that carry it, pooled acceptance rate =
    accepted / drafted over them, mean reported accept length), with the
    estimate's error against the reported accept length where both exist
    (mean of estimate − reported, and of its absolute value)."""
    classes = dict.fromkeys(CADENCE_CLASSES, 0)
    steps: list[float] = []
    drafted = accepted = 0
    rates: list[float] = []
    lengths: list[float] = []
    errors: list[float] = []
    sources: set[str] = set()
    reported = 0
    for c, sd in items:
        if c is not None:
            classes[c.cls] += 1
            if c.cls != UNKNOWN and c.tokens_per_step is not None:
                steps.append(c.tokens_per_step)
        if sd is None:
            continue
        reported += 1
        sources.add(sd.source)
        if sd.draft_tokens is not None and sd.accepted_tokens is not None:
            drafted += sd.draft_tokens
            accepted += sd.accepted_tokens
        elif sd.acceptance_rate is not None:
            rates.append(sd.acceptance_rate)
        if sd.accept_length is not None:
            lengths.append(sd.accept_length)
            if c is not None and c.cls != UNKNOWN and c.tokens_per_step is not None:
                errors.append(c.tokens_per_step - sd.accept_length)
    classified = classes[STEADY] + classes[BURSTY]
    if drafted:
        rate: float | None = accepted / drafted
    else:
        rate = statistics.fmean(rates) if rates else None
    return {
        "cadence": classes,
        "bursty_ratio": classes[BURSTY] / classified if classified else None,
        "tokens_per_step_p50": statistics.median(steps) if steps else None,
        "spec_streams": reported,
        "spec_sources": sorted(sources),
        "spec_acceptance_rate": rate,
        "spec_accept_length": statistics.fmean(lengths) if lengths else None,
        "estimate_vs_reported": {
            "outputs": len(errors),
            "mean_error": statistics.fmean(errors) if errors else None,
            "mean_abs_error": statistics.fmean(abs(e) for e in errors) if errors else None,
        },
    }


def describe_side(s: Mapping[str, Any]) -> str:
    """One line of :func:`summarize`'s figures."""
    c = s["cadence"]

    def f(x: float | None, spec: str = ".2f") -> str:
        return "-" if x is None else format(x, spec)

    line = (
        f"cadence {c[BURSTY]} bursty / {c[STEADY]} steady / {c[UNKNOWN]} unknown "
        f"(bursty {f(s['bursty_ratio'] and s['bursty_ratio'] * 100, '.0f')}%), "
        f"~{f(s['tokens_per_step_p50'])} tokens per step"
    )
    if s["spec_streams"]:
        line += (
            f"; server-reported ({', '.join(s['spec_sources'])}, {s['spec_streams']} streams): "
            f"acceptance {f(s['spec_acceptance_rate'] and s['spec_acceptance_rate'] * 100, '.1f')}%"
            f", mean accepted length {f(s['spec_accept_length'])}"
        )
        e = s["estimate_vs_reported"]
        if e["outputs"]:
            line += f" (cadence estimate off by {f(e['mean_abs_error'])} on {e['outputs']})"
    else:
        line += "; nothing server-reported"
    return line


def spec_of_row(row: Mapping[str, Any]) -> SpecDecode | None:
    """The server-reported speculative decoding of a ``streams`` row (the
    ``spec_*`` columns of migration 0005)."""
    source = row.get("spec_source")
    if not source:
        return None
    hist = row.get("spec_histogram")
    try:
        bins = json.loads(hist) if isinstance(hist, str) else []
    except ValueError:
        bins = []
    return SpecDecode(
        source=str(source),
        draft_tokens=row.get("spec_draft_tokens"),
        accepted_tokens=row.get("spec_accepted_tokens"),
        steps=row.get("spec_steps"),
        accept_length=row.get("spec_accept_length"),
        acceptance_rate=row.get("spec_accept_rate"),
        histogram=tuple(b for b in bins if isinstance(b, int)) if isinstance(bins, list) else (),
    )


def stream_lines(row: Mapping[str, Any], chunks: Sequence[Mapping[str, Any]]) -> list[str]:
    """What ``show`` prints about one stream's speculative decoding: the
    server-reported figures (when any) and each choice's cadence, from its
    text chunks' capture times."""
    lines: list[str] = []
    sd = spec_of_row(row)
    if sd is not None:
        rate = "-" if sd.acceptance_rate is None else f"{sd.acceptance_rate * 100:.1f}%"
        length = "-" if sd.accept_length is None else f"{sd.accept_length:.2f}"
        lines.append(
            f"speculative decoding reported by {sd.source}: {sd.accepted_tokens} of "
            f"{sd.draft_tokens} drafted tokens accepted ({rate}), {sd.steps} steps, "
            f"mean accepted length {length}"
            + (f", histogram {list(sd.histogram)}" if sd.histogram else "")
        )
    timings = [
        row.get(f"server_{k}") for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")
    ]
    if any(v is not None for v in timings):
        lines.append(
            f"server timings: prompt {timings[0]} tokens in {timings[1]} ms, "
            f"{timings[2]} generated in {timings[3]} ms"
        )
    if row.get("server_rejected"):
        lines.append(f"server figures out of range, not kept: {row['server_rejected']}")
    times: dict[int, list[float]] = {}
    for ch in chunks:
        if ch.get("chunk_index") and ch.get("ts") is not None and (ch.get("choice") or 0) >= 0:
            times.setdefault(int(ch.get("choice") or 0), []).append(float(ch["ts"]))
    for choice, ts in sorted(times.items()):
        lines.append(f"cadence (choice {choice}): {cadence(ts).describe()}")
    return lines
