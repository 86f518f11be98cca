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

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

__all__ = [
    "BURSTY",
    "CADENCE_CLASSES",
    "GAP_FLOOR",
    "MIN_GAPS",
    "MIN_LONG_GAPS",
    "MIN_LONG_SHARE",
    "MIN_SHORT_SHARE",
    "MODE_RATIO",
    "STEADY",
    "UNKNOWN",
    "Cadence",
    "cadence",
    "split_threshold",
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
