"""Speculative decoding seen in the cadence of a stream, when the server says
nothing: the reports' side (per-side summaries, the report lines, the gap
histogram, the server-reported figures of a stored row). The cadence of one
output itself (:func:`cadence`, its classes and thresholds) is pure and lives
in :mod:`sniffer.llm.cadence`, where the metrics of the recording chain use it
too; it is re-exported here.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sniffer.llm.cadence import (
    BURSTY,
    CADENCE_CLASSES,
    MIN_GAPS,
    MIN_LONG_GAPS,
    MIN_LONG_SHARE,
    MIN_SHORT_SHARE,
    MODE_RATIO,
    STEADY,
    UNKNOWN,
    Cadence,
    cadence,
    split_threshold,
)
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
    ``spec_*`` columns of migration 0005).

    llama.cpp reports no step count, but each of its decoding steps emits the
    token it sampled plus the drafted tokens it accepted, so its steps are
    exactly ``predicted_n − draft_n_accepted`` (``server_predicted_n`` when
    the row has it) and its accept length ``predicted_n / steps``: filled in
    here when the server sent neither (the store keeps what came on the wire)."""
    source = row.get("spec_source")
    if not source:
        return None
    hist = row.get("spec_histogram")
    try:
        bins = json.loads(hist) if isinstance(hist, str) else []
    except ValueError:
        bins = []
    steps, length = row.get("spec_steps"), row.get("spec_accept_length")
    predicted, accepted = row.get("server_predicted_n"), row.get("spec_accepted_tokens")
    if (
        steps is None
        and length is None
        and source == "llama.cpp"
        and isinstance(predicted, int)
        and isinstance(accepted, int)
        and 0 <= accepted < predicted
    ):
        steps = predicted - accepted
        length = predicted / steps
    return SpecDecode(
        source=str(source),
        draft_tokens=row.get("spec_draft_tokens"),
        accepted_tokens=accepted,
        steps=steps,
        accept_length=length,
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
