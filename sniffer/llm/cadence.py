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

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from operator import sub
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
    "cadence_class",
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
    return _split(sorted([max(g, GAP_FLOOR) for g in gaps]))


def _split(s: list[float]) -> tuple[int, float]:
    """:func:`split_threshold` of gaps already floored and sorted."""
    logs = list(map(math.log, s))
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
    if not math.isfinite(total):  # an infinite gap: NaN widths, compared as tuples
        k = max(range(lo + 1, hi + 1), key=lambda i: (logs[i] - logs[i - 1], -abs(i - best_k)))
        return k, math.sqrt(s[k - 1] * s[k])
    # The widest stretch, the one nearest the Otsu split among equals, then
    # the first: the max over (width, -distance) keys above, without a call
    # per candidate (the live metrics classify every output at its close).
    widths = list(map(sub, logs[lo + 1 : hi + 1], logs[lo:hi]))
    widest = max(widths)
    k = lo + 1 + widths.index(widest)
    if widths.count(widest) > 1:
        k = max(
            (i for i, w in enumerate(widths, lo + 1) if w == widest),
            key=lambda i: -abs(i - best_k),
        )
    return k, math.sqrt(s[k - 1] * s[k])


def _median(ordered: list[float]) -> float:
    """``statistics.median`` of a list already sorted (it sorts a copy)."""
    n = len(ordered)
    if n % 2:
        return ordered[n // 2]
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


@dataclass(frozen=True, slots=True)
class _Split:
    """The two classes of one output's gaps (:func:`cadence`'s evidence)."""

    k: int
    threshold: float
    short_p50: float
    long_p50: float
    ratio: float
    short_share: float
    long_gaps: int
    bursty: bool


def _classes(gaps: list[float]) -> _Split:
    """The split of ``gaps`` (at least two) and whether the stream is bursty."""
    ordered = sorted(gaps)
    # max(g, floor) keeps the order: the floored gaps sorted, without a second sort
    floor = GAP_FLOOR
    k, threshold = _split([floor if floor > g else g for g in ordered])
    short_p50 = _median(ordered[:k])
    long_p50 = _median(ordered[k:])
    ratio, short_share, n_long, bursty = _judge(len(gaps), k, short_p50, long_p50)
    return _Split(k, threshold, short_p50, long_p50, ratio, short_share, n_long, bursty)


def _judge(n: int, k: int, short_p50: float, long_p50: float) -> tuple[float, float, int, bool]:
    """(ratio, short share, long gaps, bursty) of ``n`` gaps of which the
    ``k`` shortest are the short class, with the two classes' medians."""
    ratio = long_p50 / max(short_p50, GAP_FLOOR)
    n_long = n - k
    short_share = k / n
    bursty = (
        ratio >= MODE_RATIO
        and short_share >= MIN_SHORT_SHARE
        and n_long >= MIN_LONG_GAPS
        and n_long / n >= MIN_LONG_SHARE
    )
    return ratio, short_share, n_long, bursty


#: ``(k, short_p50, long_p50)`` of the gaps between ``times``, gaps below the
#: floor counted as the floor in the split; None for an infinite gap.
_NativeSplit = Callable[[Sequence[float], float], tuple[int, float, float] | None]


@functools.cache
def _native_split() -> _NativeSplit | None:
    """:func:`_classes`' arithmetic as the native core has it
    (``sniffer._native.cadence_split``: the same values, float for float,
    from one pass in Rust instead of ~50 µs of Python per 100-chunk output),
    or None when the pure core runs (``SPARSEETY_PURE``) or the extension
    lacks it."""
    from sniffer import native_core

    mod = native_core()[0]
    native: _NativeSplit | None = getattr(mod, "cadence_split", None)
    return native


def _gaps(times: Sequence[float]) -> list[float]:
    """The gaps between consecutive times; negative ones (a capture clock
    that went backwards) count as 0."""
    # (``max(0.0, d)`` as a test: the same value, NaN and -0.0 included, for
    # a third of the cost)
    return [d if (d := b - a) > 0.0 else 0.0 for a, b in pairwise(times)]


def cadence_class(times: Sequence[float]) -> str:
    """``cadence(times).cls`` alone (what the live metrics count per closed
    output), without the burst lengths and evidence."""
    n = len(times) - 1  # the gaps between them
    if n < MIN_GAPS:
        return UNKNOWN
    native = _native_split()
    got = native(times, GAP_FLOOR) if native is not None else None
    if got is None:  # the pure core, or an infinite gap
        return BURSTY if _classes(_gaps(times)).bursty else STEADY
    return BURSTY if _judge(n, *got)[3] else STEADY


def cadence(times: Sequence[float], tokens: Sequence[int] | None = None) -> Cadence:
    """The cadence of one output from the capture times of its text chunks (in
    order) and, when known, the tokens each chunk carries (else one each, as
    llama.cpp streams them)."""
    n_chunks = len(times)
    counts = list(tokens) if tokens is not None and len(tokens) == n_chunks else [1] * n_chunks
    total = sum(counts)
    gaps = _gaps(times)
    if len(gaps) < MIN_GAPS:
        return Cadence(
            UNKNOWN,
            len(gaps),
            burst_lengths={1: n_chunks} if n_chunks else {},
            tokens_per_step=total / n_chunks if n_chunks else None,
        )
    c = _classes(gaps)
    threshold = c.threshold
    evidence: dict[str, Any] = {
        "split_ms": threshold * 1000.0,
        "short_share": c.short_share,
        "short_ms_p50": c.short_p50 * 1000.0,
        "long_ms_p50": c.long_p50 * 1000.0,
        "mode_ratio": c.ratio,
        "long_gaps": c.long_gaps,
    }
    if not c.bursty:
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
