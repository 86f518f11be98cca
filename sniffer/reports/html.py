"""Self-contained HTML reports of a diff and of stats: inline SVG and CSS, no
scripts, no external assets. Pure: takes a
:class:`~sniffer.reports.diff.DiffReport` (or a
:class:`~sniffer.reports.stats.StatsReport`), returns text.

The stats report: the summary, per label the TTFT and inter-token latency
histograms (one colour per label, axes in ms and outputs), and the groups of
repeated requests with their distinct outputs.

Contents, in reading order: the verdict (each gate, pass or fail, and why —
"no evidence" included); what was compared and what was not (unmatched,
incomplete, sampled-out streams); for every diverged prompt the text of both
sides around the fork, the fork marked; the summary metrics; the divergence map (one row
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

from sniffer.reports.cadence import describe_side, gap_histogram
from sniffer.reports.causes import CAUSES, SOURCE_WORDS
from sniffer.reports.diff import DiffReport, GateResult, PairResult, cause_words, verdict
from sniffer.reports.stats import StatsReport

__all__ = ["MAX_MAP_ROWS", "diff_html", "stats_html"]

MAX_MAP_ROWS = 300
BASE_COLOUR = "#3b6fb6"
CAND_COLOUR = "#d9822b"
SAME_COLOUR = "#b8b8b8"
#: colours of the labels of a stats report, in label order (then again)
LABEL_COLOURS = (BASE_COLOUR, CAND_COLOUR, "#3a9a5b", "#8e5bb5", "#c0392b", "#5d6d7e")

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 6px;
text-align:left;vertical-align:top}th{background:#f4f4f4}.num{text-align:right}
.fail{color:#b00;font-weight:bold}.ok{color:#070}pre{white-space:pre-wrap;margin:0;
font-size:12px;max-width:420px}svg{font-size:11px;font-family:monospace}
.verdict{font-size:20px;padding:10px 14px;border-radius:4px;margin:0 0 12px 0}
.vfail{background:#fde8e8;border:2px solid #b00;color:#800}
.vpass{background:#e6f4e6;border:2px solid #070;color:#050}
.vnone{background:#f4f4f4;border:2px solid #999}
.fork{margin:8px 0 18px 0}.fork pre{max-width:1050px;font-size:13px;background:#fafafa;
border:1px solid #ddd;padding:6px}mark{background:#ffd84d;color:#000;font-weight:bold}
.b{color:#3b6fb6;font-weight:bold}.c{color:#b86412;font-weight:bold}.muted{color:#666}
.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;
vertical-align:middle}
"""


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.4g}"
    return str(x)


def _divergence_map(pairs: Sequence[PairResult], prompts: dict[str, str], unit: str) -> str:
    rows = sorted(pairs, key=lambda p: (p.identical, p.first_divergence or 0))[:MAX_MAP_ROWS]
    if not rows:
        return "<p>No pairs.</p>"
    longest = max(max(p.baseline_tokens, p.candidate_tokens) for p in rows) or 1
    left, width, row_h = 170, 760, 16
    scale = width / longest
    height = len(rows) * row_h + 44
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
    y = height - 22
    for t in _ticks(longest):
        x = left + t * scale
        out.append(f'<text x="{x:.1f}" y="{y}" text-anchor="middle">{t}</text>')
    out.append(
        f'<text x="{left + width / 2:.0f}" y="{height - 4}" text-anchor="middle">'
        f"position in the output ({escape(unit)})</text>"
    )
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


def _axes(out: list[str], left: int, w: int, h: int, top: int, x_label: str, y_label: str) -> None:
    """Axis lines, y ticks (counts) and both axis titles of a bar chart."""
    out.append(f'<line x1="{left}" y1="{h}" x2="{left + w}" y2="{h}" stroke="#555"/>')
    out.append(f'<line x1="{left}" y1="0" x2="{left}" y2="{h}" stroke="#555"/>')
    for t in _ticks(top, 4):
        y = h - t / top * h if top else h
        out.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{left}" y2="{y:.1f}" stroke="#555"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{t}</text>')
    out.append(
        f'<text x="12" y="{h / 2:.0f}" transform="rotate(-90 12 {h / 2:.0f})" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    out.append(
        f'<text x="{left + w / 2:.0f}" y="{h + 32}" text-anchor="middle">{escape(x_label)}</text>'
    )


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
    w, h, left = 600, 160, 56
    bw = w / bins
    legend = "".join(
        f"<span style='background:{colour}'></span>{escape(name)}: {len(vs)} outputs"
        for name, colour, vs in sides
    )
    out = [
        f"<h3>{escape(title)}</h3><p class='legend'>{legend}</p>",
        f'<svg width="{w + left + 20}" height="{h + 52}" role="img" aria-label="{escape(title)}">',
        '<g transform="translate(0,12)">',
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
    for i in range(5):  # x ticks: 5 values across the range, in the unit
        v = lo + span * i / 4 if hi > lo else lo
        x = left + w * i / 4
        out.append(f'<line x1="{x:.1f}" y1="{h}" x2="{x:.1f}" y2="{h + 4}" stroke="#555"/>')
        out.append(f'<text x="{x:.1f}" y="{h + 16}" text-anchor="middle">{v:.3g}</text>')
    _axes(out, left, w, h, top, f"{title} ({unit})", "outputs")
    out.append("</g></svg>")
    return "".join(out)


def _tpc(report: DiffReport) -> str:
    b, c = report.baseline_side.tokens_per_chunk, report.candidate_side.tokens_per_chunk
    keys = sorted(set(b) | set(c))
    if not keys:
        return "<h3>Tokens per chunk</h3><p>No data.</p>"
    tb, tc = sum(b.values()) or 1, sum(c.values()) or 1
    w, h, left = 600, 160, 56
    bw = w / len(keys)
    out = [
        "<h3>Tokens per chunk (share of chunks)</h3>",
        f"<p class='legend'><span style='background:{BASE_COLOUR}'></span>"
        f"{escape(report.baseline)}: {sum(b.values())} chunks"
        f"<span style='background:{CAND_COLOUR}'></span>"
        f"{escape(report.candidate)}: {sum(c.values())} chunks</p>",
        f'<svg width="{w + left + 20}" height="{h + 52}" role="img" aria-label="tokens per chunk">',
        '<g transform="translate(0,12)">',
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
    out.append(f'<line x1="{left}" y1="{h}" x2="{left + w}" y2="{h}" stroke="#555"/>')
    out.append(f'<line x1="{left}" y1="0" x2="{left}" y2="{h}" stroke="#555"/>')
    for pct in (0, 25, 50, 75, 100):
        y = h - pct / 100 * h
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{pct}%</text>')
    out.append(
        f'<text x="12" y="{h / 2:.0f}" transform="rotate(-90 12 {h / 2:.0f})" '
        'text-anchor="middle">share of chunks</text>'
    )
    out.append(
        f'<text x="{left + w / 2:.0f}" y="{h + 32}" text-anchor="middle">tokens in the chunk</text>'
    )
    out.append("</g></svg>")
    return "".join(out)


def _gaps(report: DiffReport) -> str:
    """Every gap between consecutive text chunks, per side, in log-spaced bins
    (share of the side's gaps): a speculative server that streams the tokens of
    one verification step back to back shows two modes, a steady one one."""
    sides = (
        (report.baseline, BASE_COLOUR, report.baseline_side),
        (report.candidate, CAND_COLOUR, report.candidate_side),
    )
    title = "Inter-chunk gaps (every gap between text chunks, log-spaced bins)"
    if not any(side.gaps_ms for _, _, side in sides):
        return f"<h3>{escape(title)}</h3><p>No data.</p>"
    hists = [gap_histogram(side.gaps_ms) for _, _, side in sides]
    n_bins = len(hists[0])
    w, h, left = 600, 160, 56
    bw = w / n_bins
    legend = "".join(
        f"<span style='background:{colour}'></span>{escape(name)}: {len(side.gaps_ms)} gaps, "
        f"{escape(describe_side(side.speculation_summary()))}<br>"
        for name, colour, side in sides
    )
    out = [
        f"<h3>{escape(title)}</h3><p class='legend'>{legend}</p>",
        f'<svg width="{w + left + 20}" height="{h + 52}" role="img" aria-label="inter-chunk gaps">',
        '<g transform="translate(0,12)">',
    ]
    for j, ((name, colour, side), hist) in enumerate(zip(sides, hists, strict=True)):
        total = len(side.gaps_ms) or 1
        for i, (lo, hi, n) in enumerate(hist):
            share = n / total
            bh = share * h
            x = left + i * bw + j * bw / 2
            upper = f"{hi:g}" if hi is not None else "∞"
            out.append(
                f'<rect x="{x:.1f}" y="{h - bh:.1f}" width="{bw / 2 - 1:.1f}" height="{bh:.1f}" '
                f'fill="{colour}"><title>{escape(name)}: {n} gaps of {lo:g}–{upper} ms '
                f"({share:.1%})</title></rect>"
            )
    for i, (lo, _, _) in enumerate(hists[0]):
        out.append(f'<text x="{left + i * bw:.1f}" y="{h + 14}" text-anchor="middle">{lo:g}</text>')
    out.append(f'<line x1="{left}" y1="{h}" x2="{left + w}" y2="{h}" stroke="#555"/>')
    out.append(f'<line x1="{left}" y1="0" x2="{left}" y2="{h}" stroke="#555"/>')
    for pct in (0, 25, 50, 75, 100):
        y = h - pct / 100 * h
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{pct}%</text>')
    out.append(
        f'<text x="12" y="{h / 2:.0f}" transform="rotate(-90 12 {h / 2:.0f})" '
        'text-anchor="middle">share of gaps</text>'
    )
    out.append(
        f'<text x="{left + w / 2:.0f}" y="{h + 32}" text-anchor="middle">gap from (ms)</text>'
    )
    out.append("</g></svg>")
    return "".join(out)


def _verdict(gates: Sequence[GateResult]) -> list[str]:
    v = verdict(gates)
    if v is None:
        return [
            "<div class='verdict vnone'>No verdict: no gate was given "
            "(<code>--fail-if</code>).</div>"
        ]
    if v["passed"]:
        head = f"<div class='verdict vpass'>PASS — all {v['gates']} gates held.</div>"
    else:
        head = (
            f"<div class='verdict vfail'>FAIL — {v['failed']} of {v['gates']} gates failed.</div>"
        )
    out = [head, "<table><tr><th>gate</th><th>actual</th><th>result</th><th>why</th></tr>"]
    for r in gates:
        cls, word = ("fail", "FAIL") if r.failed else ("ok", "pass")
        out.append(
            f"<tr><td>{escape(r.gate.text)}</td><td class='num'>{_fmt(r.actual)}</td>"
            f"<td class='{cls}'>{word}</td><td>{escape(r.reason)}</td></tr>"
        )
    out.append("</table>")
    return out


def _evidence(report: DiffReport) -> list[str]:
    s = report.summary
    b, c = escape(report.baseline), escape(report.candidate)
    out = [
        "<h2>What was compared</h2><table>",
        f"<tr><th></th><th>{b} (baseline)</th><th>{c} (candidate)</th></tr>",
        f"<tr><th>streams</th><td class='num'>{s['baseline_streams']}</td>"
        f"<td class='num'>{s['candidate_streams']}</td></tr>",
        f"<tr><th>incomplete (gap, truncated, error): not compared</th>"
        f"<td class='num'>{s['baseline_incomplete']}</td>"
        f"<td class='num'>{s['candidate_incomplete']}</td></tr>",
        f"<tr><th>text sampled out: not compared</th>"
        f"<td class='num'>{s['baseline_sampled_out']}</td>"
        f"<td class='num'>{s['candidate_sampled_out']}</td></tr>",
        f"<tr><th>prompts seen on this side only</th>"
        f"<td class='num'>{s['unmatched_baseline_prompts']}</td>"
        f"<td class='num'>{s['unmatched_candidate_prompts']}</td></tr>",
        "</table>",
        f"<p>{s['prompts']} prompts on both sides, <b>{s['pairs']} pairs</b> compared "
        f"(pairing {escape(report.pairing)}; key: prompt and parameters"
        f"{' and model' if report.match_model else ', not the model name'}), "
        f"{s['identical_pairs']} identical. Token positions: "
        f"{escape(str(s.get('first_divergence_unit') or '–'))}.</p>",
    ]
    for tag, items in report.unmatched.items():
        if items:
            out.append(f"<p>{escape(tag)} only:</p><ul>")
            out.extend(
                f"<li><code>{escape(u['fingerprint'])}</code> {escape(u['model'] or '-')}: "
                f"{escape(u['prompt'])}"
                + (
                    f" <span class='muted'>(the other side: {u['other_side_not_compared']} "
                    "outputs not compared)</span>"
                    if u["other_side_not_compared"]
                    else ""
                )
                + "</li>"
                for u in items[:50]
            )
            out.append("</ul>")
    return out


def _forks(report: DiffReport) -> list[str]:
    forked = [p for p in report.prompts if p.fork_context is not None]
    if not report.pairs:
        return ["<h2>Where they fork</h2><p>No pair was compared.</p>"]
    if not forked:
        return ["<h2>Where they fork</h2><p>No pair diverged in its text.</p>"]
    b, c = escape(report.baseline), escape(report.candidate)
    out = [
        "<h2>Where they fork</h2><p class='muted'>For every diverged prompt, the pair "
        "that forks earliest: the shared text up to the fork, then what each side said "
        "from it on; the first differing character is <mark>marked</mark>.</p>"
    ]
    context = {p.key: p.fork_context for p in forked}
    fork_pair: dict[str, PairResult] = {}
    for x in report.pairs:
        fc = context.get(x.key)
        if (
            fc is not None
            and x.baseline_stream == fc["baseline_stream"]
            and x.candidate_stream == fc["candidate_stream"]
        ):
            fork_pair[x.key] = x
    for p in forked[:MAX_MAP_ROWS]:
        fc = p.fork_context
        assert fc is not None
        pr = fork_pair.get(p.key)
        where = f"character {fc['char']}"
        if pr is not None:
            where += (
                f", token {_fmt(pr.first_divergence)} ({escape(pr.token_unit)}), served chunk "
                f"{_fmt(pr.first_divergence_chunk_baseline)} of {b} / "
                f"{_fmt(pr.first_divergence_chunk_candidate)} of {c}"
            )
        before = ("…" if fc["before_truncated"] else "") + fc["before"]
        out.append(
            f"<div class='fork'><b>{escape(p.prompt)}</b> <span class='muted'>"
            f"({escape(p.key)}; {escape(p.model or '-')} vs {escape(p.candidate_model or '-')}; "
            f"streams {fc['baseline_stream']}/{fc['candidate_stream']}; fork at {where})</span>"
        )
        for name, cls, after in ((b, "b", fc["baseline_after"]), (c, "c", fc["candidate_after"])):
            head, rest = after[:1], after[1:]
            out.append(
                f"<pre><span class='{cls}'>{name}:</span> {escape(before)}"
                f"<mark>{escape(head) if head else '⟂ end'}</mark>{escape(rest)}"
                f"{'…' if len(after) >= 120 else ''}</pre>"
            )
        out.append("</div>")
    return out


#: Colour of each cause class in the distribution bar.
CAUSE_COLOURS = {
    "retokenization_only": "#8fb8de",
    "near_tie": "#7fbf7f",
    "substantive": "#c0392b",
    "length_only": "#e0b84d",
    "finish_only": "#c9a0dc",
    "sampler_adjusted": "#e3904f",
    "unknown": "#9a9a9a",
}
#: Tokens drawn per side in a surprisal strip.
STRIP_TOKENS = 96


def _causes(report: DiffReport) -> list[str]:
    s = report.summary
    dist: dict[str, int] = s.get("causes") or {}
    differ = sum(dist.values())
    out = [
        "<h2>Why they differ</h2><p class='muted'>The cause of every pair that differs, "
        "from what the streams show: the servers' own logprobs at the fork (near tie "
        f"within {_fmt(report.near_tie_margin)} nats, or substantive), the same text in "
        "other token ids, one side stopping early or for another reason; sampler_adjusted "
        "when a server chose against its own raw logprobs; without logprobs the "
        "reference model's margin at the fork (with --reference-model), else unknown. "
        "'decided by' names the source.</p>"
    ]
    if not differ:
        out.append("<p>No pair differs.</p>")
        return out
    width, x = 760, 0.0
    bar = [f'<svg width="{width + 10}" height="46" role="img" aria-label="causes">']
    for name in CAUSES:
        k = dist.get(name, 0)
        if not k:
            continue
        w = width * k / differ
        bar.append(
            f'<rect x="{x:.1f}" y="2" width="{w:.1f}" height="18" '
            f'fill="{CAUSE_COLOURS[name]}"><title>{name}: {k}</title></rect>'
        )
        x += w
    bar.append(
        f'<text x="0" y="38">{differ} of {len(report.pairs)} pairs differ; '
        + escape(", ".join(f"{n} {dist[n]}" for n in CAUSES if dist.get(n)))
        + "</text></svg>"
    )
    out.append("".join(bar))
    out.append(
        "<p class='legend'>"
        + "".join(
            f"<span style='background:{CAUSE_COLOURS[n]}'></span>{n} {dist.get(n, 0)}"
            for n in CAUSES
        )
        + "</p>"
    )
    prompts = {p.key: p.prompt for p in report.prompts}
    out.append(
        "<table><tr><th>streams</th><th>prompt</th><th>cause</th><th>decided by</th>"
        "<th>evidence</th></tr>"
    )
    rows = [p for p in report.pairs if p.cause is not None][:MAX_MAP_ROWS]
    for p in rows:
        colour = CAUSE_COLOURS.get(p.cause or "", "#fff")
        out.append(
            f"<tr><td>{p.baseline_stream}/{p.candidate_stream}</td>"
            f"<td>{escape(prompts.get(p.key, '')[:80])}</td>"
            f"<td style='background:{colour}'>{escape(p.cause or '')}</td>"
            f"<td>{escape(SOURCE_WORDS.get(p.cause_source or '', '-'))}</td>"
            f"<td>{escape(cause_words(p, report.baseline, report.candidate))}</td></tr>"
        )
    out.append("</table>")
    return out


def _surprisal_colour(v: float, hi: float) -> str:
    t = max(0.0, min(1.0, v / hi)) if hi > 0 else 0.0
    # white (certain) → dark red (surprising)
    r, g, b = 255 - int(80 * t), 255 - int(225 * t), 255 - int(225 * t)
    return f"#{r:02x}{g:02x}{b:02x}"


def _strip(report: DiffReport, pr: PairResult, hi: float) -> str:
    ref = pr.reference or {}
    cell, left = 8, 110
    sides = [(report.baseline, ref["baseline"]), (report.candidate, ref["candidate"])]
    n = max(min(len(sd["logprobs"]), STRIP_TOKENS) for _, sd in sides)
    out = [f'<svg width="{left + max(n, 1) * cell + 160}" height="40" role="img" '
           'aria-label="surprisal strip">']  # fmt: skip
    for row, (name, sd) in enumerate(sides):
        y = 2 + row * 18
        out.append(f'<text x="0" y="{y + 10}">{escape(name[:14])}</text>')
        for i, (tok, lp) in enumerate(zip(sd["tokens"], sd["logprobs"], strict=False)):
            if i >= STRIP_TOKENS:
                break
            out.append(
                f'<rect x="{left + i * cell}" y="{y}" width="{cell - 1}" height="14" '
                f'fill="{_surprisal_colour(-lp, hi)}" stroke="#ddd" stroke-width="0.5">'
                f"<title>{escape(repr(tok))} at {ref['fork_token'] + i}: "
                f"{-lp:.3f} nats</title></rect>"
            )
        fs = sd["fork_surprisal"]
        more = len(sd["logprobs"]) - STRIP_TOKENS
        out.append(
            f'<text x="{left + max(n, 1) * cell + 6}" y="{y + 10}">fork {_fmt(fs)} nats'
            + (f" (+{more} tok)" if more > 0 else "")
            + "</text>"
        )
    out.append(
        f'<line x1="{left - 1}" y1="0" x2="{left - 1}" y2="36" stroke="#b00" '
        'stroke-width="1.5"/></svg>'
    )
    return "".join(out)


def _reference(report: DiffReport) -> list[str]:
    r = report.reference
    if r is None:
        return []
    b, c = escape(report.baseline), escape(report.candidate)
    pf, po = r["preferred_at_fork"], r["preferred_overall"]
    out = [
        f"<h2>Reference model: {escape(str(r['model']))}</h2><p>{r['scored_pairs']} of "
        f"{r['diverged_pairs']} diverged pairs scored ({r['not_scored']} over --max-pairs "
        f"{r['max_pairs']}, {r['errors']} not scorable). At the fork the model prefers "
        f"{b} in {pf['baseline']}, {c} in {pf['candidate']}; overall (mean log-probability "
        f"per token) {b} in {po['baseline']}, {c} in {po['candidate']}.</p>",
        "<p class='legend muted'>Per-token surprisal (−log p, nats) of each side's "
        "continuation from the fork (red line), under the reference model given the prompt "
        "and the common prefix: white is expected, dark red surprising. Hover a cell for "
        "the token.</p>",
    ]
    scored = [p for p in report.pairs if p.reference and "error" not in p.reference]
    hi = 0.0
    for p in scored:
        ref = p.reference or {}
        for side in ("baseline", "candidate"):
            hi = max(hi, *(-v for v in ref[side]["logprobs"][:STRIP_TOKENS]), 0.0)
    prompts = {p.key: p.prompt for p in report.prompts}
    for p in scored[:MAX_MAP_ROWS]:
        ref = p.reference or {}
        out.append(
            f"<div class='fork'><b>{escape(prompts.get(p.key, '')[:100])}</b> <span "
            f"class='muted'>(streams {p.baseline_stream}/{p.candidate_stream}; "
            f"{escape(str(ref['ids']))} ids; fork at token {ref['fork_token']}; prefers "
            f"{escape(str(ref['preferred_at_fork']))} at the fork, "
            f"{escape(str(ref['preferred_overall']))} overall)</span><br>"
            + _strip(report, p, hi)
            + "</div>"
        )
    for p in report.pairs:
        if p.reference and "error" in p.reference:
            out.append(
                f"<p class='muted'>streams {p.baseline_stream}/{p.candidate_stream} not "
                f"scored: {escape(str(p.reference['error']))}</p>"
            )
    return out


def diff_html(report: DiffReport, gates: Sequence[GateResult] = ()) -> str:
    """The whole report as one HTML document."""
    s = report.summary
    b, c = escape(report.baseline), escape(report.candidate)
    unit = str(s.get("first_divergence_unit") or "tokens")
    short_unit = (
        "server token ids"
        if unit.startswith("token index in the server")
        else "re-tokenized tokens"
        if unit.startswith("token index in ids")
        else "characters"
        if unit.startswith("character")
        else "tokens"
    )
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>sparseety diff {b} vs {c}</title><style>{_CSS}</style></head><body>",
        f"<h1>{b} vs {c}</h1>",
        *_verdict(gates),
        *_evidence(report),
        *_forks(report),
        *_causes(report),
    ]
    parts.append("<h2>Summary</h2><table>")
    for k, v in s.items():
        parts.append(f"<tr><th>{escape(k)}</th><td class='num'>{escape(_fmt(v))}</td></tr>")
    parts.append("</table>")
    prompts = {p.key: p.prompt for p in report.prompts}
    parts.append(
        f"<h2>Divergence map</h2><p class='legend'>Positions in {escape(short_unit)}; each row "
        f"a pair (baseline/candidate stream ids).<span style='background:{SAME_COLOUR}'></span>"
        f"shared prefix<span style='background:{BASE_COLOUR}'></span>{b} after the fork"
        f"<span style='background:{CAND_COLOUR}'></span>{c} after the fork"
        "<span style='background:#b00;width:2px'></span>first divergence</p>"
    )
    if len(report.pairs) > MAX_MAP_ROWS:
        parts.append(f"<p>First {MAX_MAP_ROWS} of {len(report.pairs)} pairs, divergent first.</p>")
    parts.append(_divergence_map(report.pairs, prompts, short_unit))
    parts.extend(_reference(report))
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
    parts.append(_gaps(report))
    parts.append(_tpc(report))
    parts.append(
        "<h2>Prompts</h2><table><tr><th>fingerprint</th><th>prompt</th><th>model</th>"
        "<th>pairs</th><th>identical</th><th>fork (token)</th><th>fork (char)</th>"
        f"<th>edit ratio</th><th>{b} (modal)</th><th>{c} (modal)</th></tr>"
    )
    for p in report.prompts:
        model = escape(p.model or "-")
        if p.candidate_model != p.model:
            model += f" → {escape(p.candidate_model or '-')}"
        parts.append(
            f"<tr><td>{escape(p.key)}</td><td>{escape(p.prompt)}</td><td>{model}</td>"
            f"<td class='num'>{p.pairs}</td><td class='num'>{p.identical_pairs}</td>"
            f"<td class='num'>{_fmt(p.first_divergence)}</td>"
            f"<td class='num'>{_fmt(p.first_divergence_char)}</td>"
            f"<td class='num'>{p.median_edit_ratio:.3f}</td>"
            f"<td><pre>{escape(p.baseline_text[:600])}</pre></td>"
            f"<td><pre>{escape(p.candidate_text[:600])}</pre></td></tr>"
        )
    parts.append("</table></body></html>")
    return "\n".join(parts)


def stats_html(report: StatsReport) -> str:
    """The stats report as one HTML document: summary, latency plots per label,
    groups of repeats."""
    s = report.summary
    labels = list(report.latency)
    colours = {lab: LABEL_COLOURS[i % len(LABEL_COLOURS)] for i, lab in enumerate(labels)}
    title = "sparseety stats" + (f": {', '.join(labels)}" if labels else "")
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        "<h2>Summary</h2><table>",
    ]
    for k, v in s.items():
        if isinstance(v, dict):
            v = ", ".join(f"{a}: {_fmt(b)}" for a, b in v.items()) or "–"
        parts.append(f"<tr><th>{escape(k)}</th><td class='num'>{escape(_fmt(v))}</td></tr>")
    parts.append("</table>")
    parts.append("<h2>Latency by label</h2>")
    if labels:
        rows = "".join(
            f"<tr><td>{escape(lab)}</td><td class='num'>{lat.outputs}</td>"
            f"<td class='num'>{_fmt(_median(lat.ttft_ms))}</td>"
            f"<td class='num'>{_fmt(_median(lat.itl_ms))}</td></tr>"
            for lab, lat in report.latency.items()
        )
        parts.append(
            "<table><tr><th>label</th><th>outputs</th><th>TTFT p50 (ms)</th>"
            f"<th>inter-token p50 (ms)</th></tr>{rows}</table>"
        )
    parts.append(
        _histogram(
            "Time to first token",
            "ms",
            [(lab, colours[lab], lat.ttft_ms) for lab, lat in report.latency.items()],
        )
    )
    parts.append(
        _histogram(
            "Inter-token latency (per output)",
            "ms",
            [(lab, colours[lab], lat.itl_ms) for lab, lat in report.latency.items()],
        )
    )
    parts.append(
        "<h2>Repeated requests</h2><table><tr><th>label</th><th>model</th><th>prompt</th>"
        "<th>outputs</th><th>distinct</th><th>common prefix (tokens)</th><th>fork (token)</th>"
        "<th>variants (count: first characters)</th></tr>"
    )
    for g in report.groups:
        variants = "".join(
            f"<pre>{v.count}× {escape(v.preview)}"
            + (f" <span class='muted'>[{escape(v.cause)}]</span>" if v.cause else "")
            + "</pre>"
            for v in g.variants
        )
        mark = "ok" if g.deterministic else "fail"
        parts.append(
            f"<tr><td>{escape(g.label or '-')}</td><td>{escape(g.model or '-')}</td>"
            f"<td>{escape(g.prompt)}</td><td class='num'>{g.outputs}</td>"
            f"<td class='num {mark}'>{g.distinct}</td><td class='num'>{g.common_prefix}</td>"
            f"<td class='num'>{_fmt(g.fork_position)}</td><td>{variants}</td></tr>"
        )
    if not report.groups:
        parts.append("<tr><td colspan='8'>No request was repeated.</td></tr>")
    parts.append("</table></body></html>")
    return "\n".join(parts)


def _median(values: Sequence[float]) -> float | None:
    if not values:
        return None
    xs = sorted(values)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
