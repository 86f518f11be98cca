"""Writes ``dashboards/sparseety.json``, the Grafana dashboard of a sidecar's metrics.

The JSON is the artifact (provision it, or import it in Grafana); this script is
its source, so that every panel is built the same way: one data-source
variable, the ``node`` and ``label`` filters on every query, rates over
``$__rate_interval``, quantiles from the histograms' buckets by ``le``.
``tests/test_dashboard.py`` checks the JSON is what this script writes, and
evaluates every query against a real Prometheus scraping a live sidecar.

    python dashboards/make_dashboard.py        # rewrites dashboards/sparseety.json

Metric names and labels are those ``sniffer/record/metrics.py`` exposes. The
``node`` label is not in the exposition: the scrape adds it (a target label,
or the ``external_labels`` of a per-node agent; see docs/operating.md), named like
``sparseety run --node``. With the variable at "All" a query also matches
series without it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("sparseety.json")
UID = "sparseety-sidecar"
DS = {"type": "prometheus", "uid": "${datasource}"}
R = "$__rate_interval"
#: every series of a (label, model) metric, filtered by the dashboard's variables
LN = 'label=~"$label", node=~"$node"'
N = 'node=~"$node"'
QUANTILES = ((0.5, "p50"), (0.9, "p90"), (0.99, "p99"))
SPEC_DRAFT = "sparseety_server_spec_draft_tokens_total"
SPEC_ACCEPTED = "sparseety_server_spec_accepted_tokens_total"
SPEC_LENGTH = "sparseety_server_spec_accept_length"
CADENCE = "sparseety_output_cadence_total"


def target(expr: str, legend: str, ref: str, *, fmt: str = "time_series") -> dict[str, Any]:
    return {
        "datasource": DS,
        "expr": expr,
        "legendFormat": legend,
        "range": True,
        "refId": ref,
        "format": fmt,
    }


def quantile(q: float, metric: str, matchers: str, by: str = "le, label") -> str:
    return f"histogram_quantile({q}, sum by ({by}) (rate({metric}_bucket{{{matchers}}}[{R}])))"


def panel(
    title: str,
    description: str,
    targets: list[tuple[str, str]],
    *,
    unit: str = "short",
    kind: str = "timeseries",
    w: int = 12,
    h: int = 8,
    thresholds: list[tuple[float | None, str]] | None = None,
    fmt: str = "time_series",
    minimum: float | None = 0,
    maximum: float | None = None,
) -> dict[str, Any]:
    refs = "ABCDEFGHIJ"
    steps = [{"color": c, "value": v} for v, c in (thresholds or [(None, "green")])]
    defaults: dict[str, Any] = {
        "unit": unit,
        "thresholds": {"mode": "absolute", "steps": steps},
        "color": {"mode": "palette-classic"},
    }
    if minimum is not None:
        defaults["min"] = minimum
    if maximum is not None:
        defaults["max"] = maximum
    p: dict[str, Any] = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"h": h, "w": w, "x": 0, "y": 0},
        "targets": [
            target(expr, legend, refs[i], fmt=fmt) for i, (expr, legend) in enumerate(targets)
        ],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
    }
    if thresholds and kind == "timeseries":
        defaults["custom"] = {"thresholdsStyle": {"mode": "line"}}
    if kind == "heatmap":
        p["fieldConfig"]["defaults"] = {"unit": unit}
        p["options"] = {
            "calculate": False,
            "yAxis": {"unit": unit},
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges"},
            "tooltip": {"show": True, "yHistogram": True},
        }
    if kind == "stat":
        p["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "area",
            "textMode": "auto",
        }
    return p


def spec_acceptance(matchers: str, window: str = R, by: str = "label") -> str:
    """Accepted / drafted tokens over ``window``; no sample where nothing was
    drafted (not a NaN)."""
    return (
        f"sum by ({by}) (rate({SPEC_ACCEPTED}{{{matchers}}}[{window}])) "
        f"/ (sum by ({by}) (rate({SPEC_DRAFT}{{{matchers}}}[{window}])) > 0)"
    )


def row(title: str) -> dict[str, Any]:
    return {
        "type": "row",
        "title": title,
        "collapsed": False,
        "gridPos": {"h": 1, "w": 24, "x": 0, "y": 0},
        "panels": [],
    }


def quantile_panel(
    title: str, what: str, metric: str, quantiles: tuple[tuple[float, str], ...]
) -> dict[str, Any]:
    return panel(
        title,
        f"{what} Quantiles by label, from the `{metric}` histogram's buckets "
        "(interpolated within a bucket).",
        [(quantile(q, metric, LN), "{{label}} " + name) for q, name in quantiles],
        unit="s",
    )


def side_by_side(title: str, metric: str) -> dict[str, Any]:
    targets = []
    for var in ("baseline", "candidate"):
        m = f'label="${var}", {N}'
        for q, name in QUANTILES[:2]:
            targets.append((quantile(q, metric, m), "{{label}} " + name))
    return panel(
        title,
        f"p50 and p90 of `{metric}` for the two labels chosen in the baseline and "
        "candidate variables, on one axis.",
        targets,
        unit="s",
    )


def ratio_stat(title: str, metric: str) -> dict[str, Any]:
    def p50(var: str) -> str:
        return quantile(0.5, metric, f'label="${var}", {N}', by="le")

    return panel(
        title,
        f"Candidate p50 / baseline p50 of `{metric}` (1 = the same; above 1 the "
        "candidate is slower).",
        [(f"{p50('candidate')} / {p50('baseline')}", "candidate / baseline")],
        unit="none",
        kind="stat",
        w=6,
        thresholds=[(None, "green"), (1.1, "orange"), (1.25, "red")],
        minimum=None,
    )


def variable(name: str, label: str, query: str, *, multi: bool) -> dict[str, Any]:
    v: dict[str, Any] = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-values"},
        "refresh": 2,
        "sort": 1,
        "multi": multi,
        "includeAll": multi,
        "hide": 0,
        "regex": "",
        "options": [],
        "current": {},
    }
    if multi:
        v["allValue"] = ".*"
        v["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return v


def dashboard() -> dict[str, Any]:
    classified = f'sum by (label) (rate({CADENCE}{{{LN}, cadence!="unknown"}}[{R}]))'
    sections: list[tuple[dict[str, Any], list[dict[str, Any]]]] = [
        (
            row("Traffic"),
            [
                panel(
                    "Streams closed per second",
                    "Closed streams (any state) per second, by label and node.",
                    [
                        (
                            f"sum by (label, node) (rate(sparseety_streams_total{{{LN}}}[{R}]))",
                            "{{label}} · {{node}}",
                        )
                    ],
                    unit="reqps",
                ),
                panel(
                    "Chunk events per second",
                    "Streamed chunk events (all kinds) per second, by label and node.",
                    [
                        (
                            f"sum by (label, node) "
                            f"(rate(sparseety_chunk_events_total{{{LN}}}[{R}]))",
                            "{{label}} · {{node}}",
                        )
                    ],
                    unit="cps",
                ),
                panel(
                    "Output tokens per second",
                    "Output tokens per second by label and node: counted by the sidecar's "
                    "tokenizer, and as the servers reported them in `usage` (completion).",
                    [
                        (
                            f"sum by (label, node) "
                            f"(rate(sparseety_output_tokens_total{{{LN}}}[{R}]))",
                            "{{label}} · {{node}} (tokenizer)",
                        ),
                        (
                            f"sum by (label, node) (rate(sparseety_server_usage_tokens_total"
                            f'{{{LN}, type="completion"}}[{R}]))',
                            "{{label}} · {{node}} (server usage)",
                        ),
                    ],
                    unit="short",
                ),
                panel(
                    "Open streams and connections",
                    "Streams not yet closed and TCP connections being tracked, by node.",
                    [
                        (f"sum by (node) (sparseety_open_streams{{{N}}})", "{{node}} streams"),
                        (
                            f"sum by (node) (sparseety_open_connections{{{N}}})",
                            "{{node}} connections",
                        ),
                    ],
                ),
            ],
        ),
        (
            row("Latency"),
            [
                quantile_panel(
                    "Time to first token",
                    "Request head to the first chunk carrying content, reasoning or a tool "
                    "call (never the role prelude), capture time.",
                    "gen_ai_server_time_to_first_token_seconds",
                    QUANTILES,
                ),
                quantile_panel(
                    "Inter-chunk latency",
                    "Gap between consecutive output chunks of one choice, capture time.",
                    "sparseety_inter_chunk_seconds",
                    QUANTILES,
                ),
                quantile_panel(
                    "Time per output token",
                    "Per complete stream: (last - first output chunk) / (output tokens - 1).",
                    "gen_ai_server_time_per_output_token_seconds",
                    QUANTILES[:2],
                ),
                quantile_panel(
                    "Request duration",
                    "Request head to the end of the response stream.",
                    "gen_ai_server_request_duration_seconds",
                    QUANTILES[:2],
                ),
                panel(
                    "Tokens per chunk",
                    "Tokens the sidecar's tokenizer attributed to each text-carrying chunk: "
                    "the mean, and the p90 from the histogram.",
                    [
                        (
                            f"sum by (label) (rate(sparseety_tokens_per_chunk_sum{{{LN}}}[{R}])) "
                            f"/ sum by (label) "
                            f"(rate(sparseety_tokens_per_chunk_count{{{LN}}}[{R}]))",
                            "{{label}} mean",
                        ),
                        (quantile(0.9, "sparseety_tokens_per_chunk", LN), "{{label}} p90"),
                    ],
                ),
                panel(
                    "Time to first token: distribution",
                    "Streams per TTFT bucket in each interval (all selected labels).",
                    [
                        (
                            f"sum by (le) "
                            f"(increase(gen_ai_server_time_to_first_token_seconds_bucket"
                            f"{{{LN}}}[{R}]))",
                            "{{le}}",
                        )
                    ],
                    unit="s",
                    kind="heatmap",
                    fmt="heatmap",
                ),
            ],
        ),
        (
            row("Speculative decoding"),
            [
                panel(
                    "Draft and accepted tokens per second",
                    "Draft tokens the servers reported proposing, and how many of them the "
                    "target model accepted, per second by label and source (vLLM "
                    "`metrics.speculative_decoding`, llama.cpp `timings.draft_n` / "
                    "`draft_n_accepted`, SGLang `spec_*`), counted when a stream closes.",
                    [
                        (
                            f"sum by (label, source) (rate({SPEC_DRAFT}{{{LN}}}[{R}]))",
                            "{{label}} · {{source}} drafted",
                        ),
                        (
                            f"sum by (label, source) (rate({SPEC_ACCEPTED}{{{LN}}}[{R}]))",
                            "{{label}} · {{source}} accepted",
                        ),
                    ],
                ),
                panel(
                    "Draft acceptance rate",
                    "Accepted / drafted tokens by label over the interval (streams that "
                    "reported no drafts count for nothing). A drop means the draft model "
                    "(or n-gram lookup) fits this traffic worse: fewer tokens per "
                    "verification step, slower streams.",
                    [(spec_acceptance(LN), "{{label}}")],
                    unit="percentunit",
                    maximum=1,
                ),
                panel(
                    "Mean acceptance length",
                    "Tokens one verification step produced (1 + accepted / steps), the "
                    "mean over the closed streams of the per-stream figure the server "
                    "reported (vLLM `mean_acceptance_length`, SGLang `spec_accept_length`; "
                    "llama.cpp reports no step count), and the p50 of the streams from "
                    "the histogram.",
                    [
                        (
                            f"sum by (label) (rate({SPEC_LENGTH}_sum{{{LN}}}[{R}])) "
                            f"/ (sum by (label) (rate({SPEC_LENGTH}_count{{{LN}}}[{R}])) > 0)",
                            "{{label}} mean",
                        ),
                        (quantile(0.5, SPEC_LENGTH, LN), "{{label}} p50"),
                    ],
                    unit="none",
                ),
                panel(
                    "Acceptance length: distribution",
                    "Streams per acceptance-length bucket (tokens per verification step) "
                    "in each interval (all selected labels).",
                    [
                        (
                            f"sum by (le) (increase({SPEC_LENGTH}_bucket{{{LN}}}[{R}]))",
                            "{{le}}",
                        )
                    ],
                    unit="none",
                    kind="heatmap",
                    fmt="heatmap",
                ),
                panel(
                    "Outputs per second by cadence",
                    "Streamed outputs with text, at their stream's close, by the cadence of "
                    "their text chunks' capture times (`sniffer.llm.cadence`, as `stats` "
                    "reads it): bursty (runs of chunks close together, then a long gap: "
                    "what speculative decoding looks like from a server that streams one "
                    "token per event and reports nothing, e.g. llama.cpp), steady, unknown "
                    "(fewer than 8 gaps).",
                    [
                        (
                            f"sum by (label, cadence) (rate({CADENCE}{{{LN}}}[{R}]))",
                            "{{label}} {{cadence}}",
                        )
                    ],
                ),
                panel(
                    "Bursty share of the outputs",
                    "Bursty / (bursty + steady) outputs by label: 0 for a server that does "
                    "not speculate (or sends each step as one chunk, as vLLM does).",
                    [
                        (
                            f'(sum by (label) (rate({CADENCE}{{{LN}, cadence="bursty"}}[{R}]))'
                            f" or {classified} * 0) / ({classified} > 0)",
                            "{{label}}",
                        )
                    ],
                    unit="percentunit",
                    maximum=1,
                ),
            ],
        ),
        (
            row("Completeness and errors"),
            [
                panel(
                    "Incomplete streams per second, by state",
                    "Streams that did not end complete: client_abort (the client closed), "
                    "truncated, gap (capture lost bytes), error (an error object or a "
                    "recorded pipeline error), midway (the capture began inside the response).",
                    [
                        (
                            f"sum by (label, state) (rate(sparseety_streams_total"
                            f'{{{LN}, state!="complete"}}[{R}]))',
                            "{{label}} {{state}}",
                        )
                    ],
                    unit="reqps",
                ),
                panel(
                    "Incomplete ratio",
                    "Share of the closed streams that did not end complete, by label.",
                    [
                        (
                            f"(sum by (label) (rate(sparseety_streams_total"
                            f'{{{LN}, state!="complete"}}[{R}])) '
                            f"or sum by (label) (rate(sparseety_streams_total{{{LN}}}[{R}])) * 0)"
                            f" / sum by (label) (rate(sparseety_streams_total{{{LN}}}[{R}]))",
                            "{{label}}",
                        )
                    ],
                    unit="percentunit",
                    thresholds=[(None, "green"), (0.05, "red")],
                ),
                panel(
                    "Pipeline errors per second, by stage",
                    "Bad input recorded by the pipeline (never fatal): capture, reassembly, "
                    "http, sse, dialect, store, tokens.",
                    [
                        (
                            f"sum by (stage, node) "
                            f"(rate(sparseety_parse_errors_total{{{N}}}[{R}]))",
                            "{{stage}} · {{node}}",
                        )
                    ],
                    unit="short",
                ),
                panel(
                    "Token anomalies per second, by kind",
                    "Token-layer anomalies: straddle, replacement_char, usage_mismatch, ...",
                    [
                        (
                            f"sum by (label, kind) "
                            f"(rate(sparseety_chunk_anomalies_total{{{LN}}}[{R}]))",
                            "{{label}} {{kind}}",
                        )
                    ],
                ),
            ],
        ),
        (
            row("Capture and pipeline"),
            [
                panel(
                    "Kernel and queue drops per second",
                    "Packets the kernel ring dropped, and packets or batches dropped on a full "
                    "queue. Anything above 0 means streams with gaps.",
                    [
                        (
                            f"sum by (node) (rate(sparseety_kernel_drops_total{{{N}}}[{R}]))",
                            "{{node}} kernel",
                        ),
                        (
                            f"sum by (node) (rate(sparseety_queue_drops_total{{{N}}}[{R}]))",
                            "{{node}} queue",
                        ),
                    ],
                    thresholds=[(None, "green"), (1e-9, "red")],
                ),
                panel(
                    "Packets captured per second",
                    "Packets the capture delivered, by node.",
                    [
                        (
                            f"sum by (node) (rate(sparseety_packets_captured_total{{{N}}}[{R}]))",
                            "{{node}}",
                        )
                    ],
                    unit="pps",
                ),
                panel(
                    "Queue depth",
                    "Items waiting in the capture → pipeline queue.",
                    [(f"max by (node) (sparseety_queue_depth{{{N}}})", "{{node}}")],
                    w=8,
                ),
                panel(
                    "Last flush age",
                    "Seconds since the last successful database flush (a stalled writer "
                    "grows it without bound).",
                    [(f"max by (node) (sparseety_last_flush_age_seconds{{{N}}})", "{{node}}")],
                    unit="s",
                    w=8,
                    thresholds=[(None, "green"), (30, "orange"), (120, "red")],
                ),
                panel(
                    "Sample rate",
                    "Share of streams whose chunk text is stored (summaries and metrics "
                    "always are); raised to 1 while an anomaly boost lasts.",
                    [(f"min by (node) (sparseety_sample_rate{{{N}}})", "{{node}}")],
                    unit="percentunit",
                    w=8,
                ),
                panel(
                    "OTLP export: drops and failures",
                    "Closed streams dropped on a full OTLP export queue, and export batches "
                    "that failed (collector unreachable or refusing), by signal.",
                    [
                        (
                            f"sum by (node) (rate(sparseety_otlp_dropped_total{{{N}}}[{R}]))",
                            "{{node}} dropped",
                        ),
                        (
                            f"sum by (node, signal) "
                            f"(rate(sparseety_otlp_export_failures_total{{{N}}}[{R}]))",
                            "{{node}} {{signal}} failures",
                        ),
                    ],
                    w=24,
                ),
            ],
        ),
        (
            row("Baseline vs candidate: $baseline vs $candidate"),
            [
                side_by_side(
                    "Time to first token: $baseline vs $candidate",
                    "gen_ai_server_time_to_first_token_seconds",
                ),
                side_by_side(
                    "Inter-chunk latency: $baseline vs $candidate",
                    "sparseety_inter_chunk_seconds",
                ),
                ratio_stat("TTFT p50 ratio", "gen_ai_server_time_to_first_token_seconds"),
                ratio_stat("Inter-chunk p50 ratio", "sparseety_inter_chunk_seconds"),
            ],
        ),
    ]
    panels: list[dict[str, Any]] = []
    y = 0
    pid = 1
    for head, items in sections:
        head["gridPos"]["y"] = y
        head["id"] = pid
        pid += 1
        panels.append(head)
        y += 1
        x = 0
        line_h = 0
        for p in items:
            w = p["gridPos"]["w"]
            if x + w > 24:
                x, y = 0, y + line_h
                line_h = 0
            p["gridPos"].update(x=x, y=y)
            p["id"] = pid
            pid += 1
            x += w
            line_h = max(line_h, p["gridPos"]["h"])
            panels.append(p)
        y += line_h
    labels = 'label_values(sparseety_chunk_events_total{node=~"$node"}, label)'
    ttft_labels = (
        'label_values(gen_ai_server_time_to_first_token_seconds_count{node=~"$node"}, label)'
    )
    return {
        "uid": UID,
        "title": "SparSEEty sidecar",
        "description": "What a SparSEEty sidecar records on a serving node: streams, "
        "latency, tokens, speculative decoding, completeness, capture health, baseline vs "
        "candidate.",
        "tags": ["sparseety", "llm", "genai"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "refresh": 1,
                    "hide": 0,
                    "regex": "",
                    "current": {},
                    "options": [],
                },
                variable(
                    "node",
                    "Node",
                    "label_values(sparseety_packets_captured_total, node)",
                    multi=True,
                ),
                variable("label", "Label", labels, multi=True),
                variable("baseline", "Baseline", ttft_labels, multi=False),
                variable("candidate", "Candidate", ttft_labels, multi=False),
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render(), encoding="utf-8")
    sys.stdout.write(f"wrote {OUT}\n")
