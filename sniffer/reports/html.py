"""A self-contained HTML report of a diff: inline SVG and CSS, no scripts, no
external assets. Pure: takes a :class:`~sniffer.reports.diff.DiffReport`,
returns text.

Contents: the summary metrics and gate results; the divergence map (one row
per pair, baseline bar above candidate bar, drawn to token scale; the shared
prefix grey, the part after the first divergence coloured, a mark at the
fork; the first :data:`MAX_MAP_ROWS` pairs, divergent ones first); histograms
of TTFT and inter-token latency per side and the tokens-per-chunk
distribution; the per-prompt table with each side's modal output.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import Any

from sniffer.reports.diff import DiffReport, GateResult, PairResult

__all__ = ["MAX_MAP_ROWS", "diff_html"]

MAX_MAP_ROWS = 300
BASE_COLOUR = "#3b6fb6"
CAND_COLOUR = "#d9822b"
SAME_COLOUR = "#b8b8b8"

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#f4f4f4}.num{text-align:right}
.fail{color:#b00;font-weight:bold}.ok{color:#070}pre{white-space:pre-wrap;margin:0;
font-size:12px;max-width:420px}svg{font-size:11px;font-family:monospace}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;
vertical-align:middle}
"""


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _divergence_map(pairs: Sequence[PairResult], prompts: dict[str, str]) -> str:
    rows = sorted(pairs, key=lambda p: (p.identical, p.first_divergence or 0))[:MAX_MAP_ROWS]
    if not rows:
        return "<p>No pairs.</p>"
    longest = max(max(p.baseline_tokens, p.candidate_tokens) for p in rows) or 1
    left, width, row_h = 170, 760, 16
    scale = width / longest
    height = len(rows) * row_h + 30
    out = [
        f'<svg width="{left + width + 20}" '
        f'height="{height}" role="img" aria-label="divergence map">'
    ]
    for i, p in enumerate(rows):
        y = 4 + i * row_h
        fork = p.first_divergence
        label = f"{p.baseline_stream}/{p.candidate_stream}"
        title = escape(
            f"{prompts.get(p.key, '')} — baseline stream {p.baseline_stream} "
            f"({p.baseline_tokens} tokens) vs candidate stream {p.candidate_stream} "
            f"({p.candidate_tokens} tokens): "
            + ("identical" if fork is None else f"fork at token {fork}, edit {p.edit_distance}")
        )
        out.append(f"<g><title>{title}</title>")
        out.append(f'<text x="0" y="{y + 10}">{escape(label)}</text>')
        for dy, n, colour in (
            (0, p.baseline_tokens, BASE_COLOUR),
            (7, p.candidate_tokens, CAND_COLOUR),
        ):
            same = n if fork is None else min(fork, n)
            out.append(
                f'<rect x="{left}" y="{y + dy}" width="{same * scale:.1f}" height="6" '
                f'fill="{SAME_COLOUR}"/>'
            )
            if n > same:
                out.append(
                    f'<rect x="{left + same * scale:.1f}" y="{y + dy}" '
                    f'width="{(n - same) * scale:.1f}" height="6" fill="{colour}"/>'
                )
        if fork is not None:
            x = left + fork * scale
            out.append(
                f'<line x1="{x:.1f}" y1="{y - 1}" x2="{x:.1f}" y2="{y + 14}" '
                'stroke="#b00" stroke-width="1.5"/>'
            )
        out.append("</g>")
    y = height - 8
    for t in _ticks(longest):
        x = left + t * scale
        out.append(f'<text x="{x:.1f}" y="{y}" text-anchor="middle">{t}</text>')
    out.append("</svg>")
    return "".join(out)


def _ticks(hi: float, n: int = 6) -> list[int]:
    if hi <= 0:
        return [0]
    step = max(1, 10 ** math.floor(math.log10(hi / n)) if hi / n >= 1 else 1)
    for m in (1, 2, 5, 10):
        if hi / (step * m) <= n:
            step *= m
            break
    return list(range(0, int(hi) + 1, int(step)))


def _histogram(title: str, unit: str, sides: Sequence[tuple[str, str, Sequence[float]]]) -> str:
    values = [v for _, _, vs in sides for v in vs]
    if not values:
        return f"<h3>{escape(title)}</h3><p>No data.</p>"
    lo, hi = min(values), max(values)
    bins = 30
    span = (hi - lo) or 1.0
    counts = []
    for _, _, vs in sides:
        c = [0] * bins
        for v in vs:
            c[min(bins - 1, int((v - lo) / span * bins))] += 1
        counts.append(c)
    top = max(max(c) for c in counts) or 1
    w, h, left = 600, 160, 40
    bw = w / bins
    out = [
        f"<h3>{escape(title)}</h3>",
        f'<svg width="{w + left + 10}" height="{h + 30}" role="img" aria-label="{escape(title)}">',
    ]
    k = len(sides)
    for si, ((name, colour, _vs), c) in enumerate(zip(sides, counts, strict=True)):
        for b, n in enumerate(c):
            if not n:
                continue
            bh = n / top * h
            x = left + b * bw + si * bw / k
            out.append(
                f'<rect x="{x:.1f}" y="{h - bh:.1f}" width="{bw / k:.1f}" height="{bh:.1f}" '
                f'fill="{colour}"><title>{escape(name)}: {n} in '
                f"{lo + b * span / bins:.3g}–{lo + (b + 1) * span / bins:.3g} {unit}"
                f"</title></rect>"
            )
    out.append(f'<line x1="{left}" y1="{h}" x2="{left + w}" y2="{h}" stroke="#555"/>')
    out.append(f'<text x="{left}" y="{h + 14}">{lo:.3g} {escape(unit)}</text>')
    out.append(
        f'<text x="{left + w}" y="{h + 14}" text-anchor="end">{hi:.3g} {escape(unit)}</text>'
    )
    out.append(f'<text x="0" y="10">{top}</text>')
    out.append("</svg>")
    return "".join(out)


def _tpc(report: DiffReport) -> str:
    b, c = report.baseline_side.tokens_per_chunk, report.candidate_side.tokens_per_chunk
    keys = sorted(set(b) | set(c))
    if not keys:
        return "<h3>Tokens per chunk</h3><p>No data.</p>"
    tb, tc = sum(b.values()) or 1, sum(c.values()) or 1
    w, h, left = 600, 160, 40
    bw = w / len(keys)
    out = [
        "<h3>Tokens per chunk (share of chunks)</h3>",
        f'<svg width="{w + left + 10}" height="{h + 30}" role="img" aria-label="tokens per chunk">',
    ]
    for i, k in enumerate(keys):
        for j, (d, tot, colour, name) in enumerate(
            ((b, tb, BASE_COLOUR, report.baseline), (c, tc, CAND_COLOUR, report.candidate))
        ):
            share = d.get(k, 0) / tot
            bh = share * h
            x = left + i * bw + j * bw / 2
            out.append(
                f'<rect x="{x:.1f}" y="{h - bh:.1f}" width="{bw / 2 - 1:.1f}" height="{bh:.1f}" '
                f'fill="{colour}"><title>{escape(name)}: {d.get(k, 0)} chunks of {k} tokens '
                f"({share:.1%})</title></rect>"
            )
        out.append(
            f'<text x="{left + i * bw + bw / 2:.1f}" y="{h + 14}" text-anchor="middle">{k}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def diff_html(report: DiffReport, gates: Sequence[GateResult] = ()) -> str:
    """The whole report as one HTML document."""
    s = report.summary
    b, c = escape(report.baseline), escape(report.candidate)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>sparseety diff {b} vs {c}</title><style>{_CSS}</style></head><body>",
        f"<h1>{b} vs {c}</h1>",
        f"<p>pairing: {escape(report.pairing)}; {s['prompts']} prompts, {s['pairs']} pairs, "
        f"{s['identical_pairs']} identical.</p>",
    ]
    if gates:
        parts.append("<h2>Gates</h2><table><tr><th>gate</th><th>actual</th><th>result</th></tr>")
        for r in gates:
            cls, word = (
                ("fail", "FAIL") if r.failed else ("ok", "undefined" if r.actual is None else "ok")
            )
            parts.append(
                f"<tr><td>{escape(r.gate.text)}</td><td class='num'>{_fmt(r.actual)}</td>"
                f"<td class='{cls}'>{word}</td></tr>"
            )
        parts.append("</table>")
    parts.append("<h2>Summary</h2><table>")
    for k, v in s.items():
        parts.append(f"<tr><th>{escape(k)}</th><td class='num'>{escape(_fmt(v))}</td></tr>")
    parts.append("</table>")
    prompts = {p.key: p.prompt for p in report.prompts}
    parts.append(
        "<h2>Divergence map</h2><p class='legend'>Token positions; each row a pair "
        f"(baseline/candidate stream ids).<span style='background:{SAME_COLOUR}'></span>shared "
        f"prefix<span style='background:{BASE_COLOUR}'></span>{b} after the fork"
        f"<span style='background:{CAND_COLOUR}'></span>{c} after the fork"
        "<span style='background:#b00;width:2px'></span>first divergence</p>"
    )
    if len(report.pairs) > MAX_MAP_ROWS:
        parts.append(f"<p>First {MAX_MAP_ROWS} of {len(report.pairs)} pairs, divergent first.</p>")
    parts.append(_divergence_map(report.pairs, prompts))
    parts.append("<h2>Latency</h2>")
    bs, cs = report.baseline_side, report.candidate_side
    parts.append(
        _histogram(
            "Time to first token",
            "ms",
            [
                (report.baseline, BASE_COLOUR, bs.ttft_ms),
                (report.candidate, CAND_COLOUR, cs.ttft_ms),
            ],
        )
    )
    parts.append(
        _histogram(
            "Inter-token latency (per output)",
            "ms",
            [(report.baseline, BASE_COLOUR, bs.itl_ms), (report.candidate, CAND_COLOUR, cs.itl_ms)],
        )
    )
    parts.append(_tpc(report))
    parts.append(
        "<h2>Prompts</h2><table><tr><th>fingerprint</th><th>prompt</th><th>pairs</th>"
        "<th>identical</th><th>fork</th><th>edit ratio</th>"
        f"<th>{b} (modal)</th><th>{c} (modal)</th></tr>"
    )
    for p in report.prompts:
        parts.append(
            f"<tr><td>{escape(p.key)}</td><td>{escape(p.prompt)}</td>"
            f"<td class='num'>{p.pairs}</td><td class='num'>{p.identical_pairs}</td>"
            f"<td class='num'>{_fmt(p.first_divergence)}</td>"
            f"<td class='num'>{p.median_edit_ratio:.3f}</td>"
            f"<td><pre>{escape(p.baseline_text[:600])}</pre></td>"
            f"<td><pre>{escape(p.candidate_text[:600])}</pre></td></tr>"
        )
    parts.append("</table></body></html>")
    return "\n".join(parts)
