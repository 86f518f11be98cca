"""``sparseety probe``, ``stats`` and ``diff``: thin click commands.

Registered on the main group in ``sniffer.cli`` with ``main.add_command``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import click

from sniffer.cli.common import (
    db_option,
    library_errors,
    make_registry,
    node_option,
    open_store,
    progress_bar,
    tokenizer_options,
)

__all__ = ["diff", "probe", "stats"]


def near_tie_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--near-tie-margin",
        type=click.FloatRange(0.0),
        default=0.5,
        show_default=True,
        metavar="NATS",
        help="Two tokens whose log-probabilities at the fork (the servers' own logprobs) "
        "are within this many nats make the pair a near_tie.",
    )(f)


# ---------------------------------------------------------------------- probe


@click.command()
@click.argument("prompts", type=click.Path(dir_okay=False))
@click.option(
    "--url",
    "urls",
    multiple=True,
    required=True,
    help="Server base URL (http://127.0.0.1:8000) or full endpoint URL. Repeat.",
)
@click.option("--model", required=True, help="Model name sent in every request.")
@click.option("--repeat", "-n", type=click.IntRange(1), default=1, show_default=True)
@click.option("--concurrency", "-c", type=click.IntRange(1, 256), default=1, show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), help="max_tokens of every request.")
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--timeout", type=float, default=60.0, show_default=True, help="Seconds per request.")
@click.option(
    "--deadline", type=float, help="Seconds; no request starts after this (default none)."
)
@click.option(
    "--max-requests",
    type=click.IntRange(1),
    default=10_000,
    show_default=True,
    help="Refuse plans larger than this.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def probe(
    prompts: str,
    urls: tuple[str, ...],
    model: str,
    repeat: int,
    concurrency: int,
    max_tokens: int | None,
    temperature: float,
    timeout: float,
    deadline: float | None,
    max_requests: int,
    quiet: bool,
    as_json: bool,
) -> None:
    """Send each prompt of a file REPEAT times to each URL (streaming) and summarise.

    An active, bounded load generator for when there is no organic traffic:
    it only sends; a running sniffer (or a capture replayed later) records.
    PROMPTS is JSON Lines (strings, or objects with "messages" or "prompt"
    and optional request fields) or plain text, one prompt per line. Exit
    code 1 when a request failed.

    \b
    Example:
      sparseety probe prompts.txt --url http://127.0.0.1:8000 \\
          --url http://127.0.0.1:8001 --model my-model --repeat 5 -c 4
    """
    from sniffer.runtime.probe import (
        ProbeConfig,
        format_probe,
        load_prompts,
        probe_summary,
        run_probe,
    )

    with library_errors():
        items = load_prompts(prompts)
        config = ProbeConfig(
            urls=urls,
            model=model,
            repeat=repeat,
            concurrency=concurrency,
            max_tokens=max_tokens,
            temperature=temperature,
            timeout=timeout,
            deadline=deadline,
            max_requests=max_requests,
        )
        bar: Any = None
        if not quiet and sys.stderr.isatty():
            total = len(items) * repeat * len(urls)
            bar = click.progressbar(length=total, label="probe", file=sys.stderr)
            bar.__enter__()
        done = [0]

        def progress(n: int, _total: int) -> None:
            if bar is not None:
                bar.update(n - done[0])
                done[0] = n

        try:
            run = run_probe(items, config, progress=progress)
        finally:
            if bar is not None:
                bar.__exit__(None, None, None)
        summary = probe_summary(run)
    if as_json:
        click.echo(json.dumps(summary, indent=2, ensure_ascii=False))
    else:
        click.echo(format_probe(summary))
    if summary["errors"]:
        sys.exit(1)


# ---------------------------------------------------------------------- stats


@click.command()
@db_option
@click.option("--label", "labels", multiple=True, help="Only streams with this label (repeat).")
@click.option("--model", help="Only streams of this model.")
@click.option(
    "--include-incomplete", is_flag=True, help="Also truncated, gapped and failed streams."
)
@click.option("--varying", is_flag=True, help="List only groups with more than one output.")
@near_tie_option
@node_option
@tokenizer_options
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False),
    help="Also write a self-contained report: TTFT and inter-token latency histograms "
    "per label, and the groups.",
)
def stats(
    db: str,
    node: str | None,
    labels: tuple[str, ...],
    model: str | None,
    include_incomplete: bool,
    varying: bool,
    near_tie_margin: float,
    tokenizers: tuple[str, ...],
    default_tokenizer: str | None,
    as_json: bool,
    html_path: str | None = None,
) -> None:
    """Output stability: group repeats of the same request and compare their tokens.

    Streams are grouped by fingerprint (label, served model, normalised
    prompt, sampling parameters): repeats of one request to one deployment.
    Streams whose text was sampled out are counted, not compared. Each group
    with two or more outputs lists its distinct outputs (count and first 200
    characters), the longest common token prefix and the token position where
    the variants fork, and why each variant differs from the most frequent
    one (the cause classes of diff: near_tie, substantive, ... from the
    servers' logprobs). The summary gives the share of fully deterministic
    groups, overall and per label, and the causes of the variants.

    \b
    Example:
      sparseety stats --db sparseety.db --label baseline --varying
      sparseety stats --db sparseety.db --html stats.html
    """
    from sniffer.reports.stats import format_stats, stats_json
    from sniffer.reports.stats import stats as run_stats

    # stats encodes every output it compares with offsets: the library's
    # tokenizer, loaded at once (not after a native reading it would not use)
    registry = make_registry(tokenizers, default_tokenizer, native_first=False)
    with library_errors():
        report = run_stats(
            open_store(db),
            labels=list(labels) or None,
            model=model,
            registry=registry,
            include_incomplete=include_incomplete,
            near_tie_margin=near_tie_margin,
            node=node,
            latency=bool(html_path),
        )
        if html_path:
            from sniffer.reports.html import stats_html
            from sniffer.store.files import open_private

            with os.fdopen(open_private(html_path), "w", encoding="utf-8") as fh:  # 0600
                fh.write(stats_html(report))
    if as_json:
        click.echo(json.dumps(stats_json(report), indent=2, ensure_ascii=False))
    else:
        click.echo(format_stats(report, show_deterministic=not varying))
    if html_path:
        click.echo(f"wrote {html_path}", err=True)


# ----------------------------------------------------------------------- diff


@click.command()
@db_option
@click.option(
    "--baseline",
    metavar="LABEL",
    help="Label of the reference side (may be left out when --baseline-node names it).",
)
@click.option(
    "--candidate",
    metavar="LABEL",
    help="Label of the side under test (may be left out when --candidate-node names it).",
)
@click.option(
    "--node",
    metavar="NAME",
    help="Only streams captured by this sidecar, on both sides; default: every node.",
)
@click.option(
    "--baseline-node",
    metavar="NAME",
    help="Only the baseline streams captured by this node (overrides --node for that side).",
)
@click.option(
    "--candidate-node",
    metavar="NAME",
    help="Only the candidate streams captured by this node (overrides --node for that side).",
)
@click.option(
    "--pairing",
    type=click.Choice(["index", "modal", "all"]),
    default="index",
    show_default=True,
    help="index: choice i with choice i, repeats in capture order; modal: the most frequent "
    "output of each side per choice; all: every baseline output with every candidate output "
    "of the same request.",
)
@click.option(
    "--match-model",
    is_flag=True,
    help="Pair only requests sent to the same served model name (by default the label "
    "identifies a side and the model name is not part of the pairing key).",
)
@click.option(
    "--model", help="Only streams of this served model name (on both sides; see --match-model)."
)
@click.option(
    "--include-incomplete",
    is_flag=True,
    help="Also compare truncated, gapped and failed streams (they are always counted).",
)
@click.option(
    "--fail-if",
    "gates",
    multiple=True,
    metavar="'METRIC OP NUMBER'",
    help="Exit 1 when this holds, e.g. 'identical_ratio < 0.95'. Repeat. Metrics are the "
    "numeric summary keys of --json. A gate whose metric has no value, or with fewer "
    "pairs than --min-pairs, fails too (no evidence, no pass).",
)
@click.option(
    "--min-pairs",
    type=click.IntRange(0),
    default=None,
    metavar="N",
    help="Gates fail with fewer than N compared pairs  [default: 1 when a gate is given]. "
    "Given alone, it is a gate of its own.",
)
@click.option(
    "--spans", "show_spans", is_flag=True, help="List every differing span of every pair."
)
@click.option(
    "--html", "html_path", type=click.Path(dir_okay=False), help="Write a self-contained report."
)
@click.option("--limit", type=int, default=50, show_default=True, help="Prompts listed in text.")
@near_tie_option
@click.option(
    "--reference-model",
    "reference_model",
    metavar="DIR",
    help="A local Hugging Face causal LM (a directory or an already cached id; never "
    "downloaded) that scores both sides of every diverged pair from the common prefix "
    "(needs torch: pip install 'sparseety[reference]').",
)
@click.option(
    "--max-pairs",
    type=click.IntRange(1),
    default=100,
    show_default=True,
    metavar="N",
    help="Diverged pairs scored by --reference-model (the rest are counted).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@tokenizer_options
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
def diff(
    db: str,
    baseline: str | None,
    candidate: str | None,
    node: str | None,
    baseline_node: str | None,
    candidate_node: str | None,
    pairing: str,
    match_model: bool,
    model: str | None,
    include_incomplete: bool,
    gates: tuple[str, ...],
    min_pairs: int | None,
    show_spans: bool,
    html_path: str | None,
    limit: int,
    near_tie_margin: float,
    reference_model: str | None,
    max_pairs: int,
    quiet: bool,
    tokenizers: tuple[str, ...],
    default_tokenizer: str | None,
    as_json: bool,
) -> None:
    """Compare the token outputs and latency of two labels (baseline vs candidate).

    Streams of the two labels are paired by request fingerprint (normalised
    prompt, system prompt, sampling parameters, max tokens, n, seed, tools,
    response format; not the served model name unless --match-model): choice
    i with choice i. Each pair: identical or not, where they fork (character,
    served chunk and token index; server token ids when the stream carries
    them), common prefix, edit distance, length and finish-reason
    differences; per side TTFT, inter-token latency and tokens per chunk.
    Incomplete and sampled-out streams and prompts seen on one side only are
    counted and shown, never compared as empty text.

    Every pair that differs gets a cause: retokenization_only, near_tie,
    substantive (from the servers' logprobs at the fork), sampler_adjusted (a
    server chose against its own raw logprobs there), length_only,
    finish_only, or unknown (no logprobs), and the source that decided it.
    --reference-model DIR scores both sides of the diverged pairs with a local
    model (surprisal at the fork, log-probability of each continuation, the
    side it prefers) and decides near_tie / substantive for the pairs the
    servers' logprobs leave unknown.
    Over a database shared by many sidecars, --node keeps one node's streams
    and --baseline-node / --candidate-node pick each side's node: a baseline
    on one node and a candidate on another is a normal diff (the label may
    then be left out: the node names the side).

    --fail-if gates make the exit code 1 when a condition holds, so the
    comparison can gate a rollout. No evidence, no pass: a gate also fails
    when its metric has no value or fewer than --min-pairs pairs were compared.
    Exit code 2: bad usage, or a configured tokenizer that does not load.

    \b
    Example:
      sparseety diff --db sparseety.db --baseline dense --candidate sparse \\
          --fail-if 'identical_ratio < 0.95' --fail-if 'ttft_ratio > 1.2' --html report.html
      sparseety diff --db sparseety.db --baseline dense --candidate sparse \\
          --fail-if 'substantive_ratio > 0.02' --reference-model ./dense-model
      sparseety diff --db postgresql+psycopg://sparseety@db/sparseety \\
          --baseline-node gpu-01 --candidate-node gpu-02
    """
    from sniffer.reports.diff import GateError, diff_json, evaluate_gates, format_diff, parse_gate
    from sniffer.reports.diff import diff as run_diff

    try:
        parsed = [parse_gate(g) for g in gates]
    except GateError as exc:
        raise click.BadParameter(str(exc), param_hint="--fail-if") from exc
    if not (baseline or baseline_node or node) or not (candidate or candidate_node or node):
        raise click.UsageError(
            "give --baseline and --candidate labels, or the nodes of the sides "
            "(--baseline-node / --candidate-node)"
        )
    if min_pairs is not None and not parsed:
        parsed = [parse_gate(f"pairs < {min_pairs}")]  # --min-pairs alone: a gate of its own
    registry = make_registry(tokenizers, default_tokenizer)
    ref: Any = None
    if reference_model:
        from sniffer.llm.reference import ReferenceModel, ReferenceModelError

        try:
            ref = ReferenceModel(reference_model)
        except ReferenceModelError as exc:
            click.echo(f"sparseety: {exc}", err=True)
            sys.exit(2)
    with library_errors():
        report = run_diff(
            open_store(db),
            baseline or "",
            candidate or "",
            node=node,
            baseline_node=baseline_node,
            candidate_node=candidate_node,
            pairing=pairing,
            model=model,
            registry=registry,
            include_incomplete=include_incomplete,
            match_model=match_model,
            spans=show_spans,
            near_tie_margin=near_tie_margin,
        )
        if ref is not None:
            from sniffer.reports.diff import attribute

            with progress_bar(quiet, "reference model") as progress:
                attribute(report, ref, max_pairs=max_pairs, progress=progress)
        results = evaluate_gates(
            parsed, report.summary, min_pairs=1 if min_pairs is None else min_pairs
        )
        if html_path:
            from sniffer.reports.html import diff_html
            from sniffer.store.files import open_private

            with os.fdopen(open_private(html_path), "w", encoding="utf-8") as fh:  # 0600
                fh.write(diff_html(report, results))
    if as_json:
        click.echo(json.dumps(diff_json(report, results), indent=2, ensure_ascii=False))
    else:
        click.echo(format_diff(report, results, limit=limit, spans=show_spans))
        if html_path:
            click.echo(f"wrote {html_path}", err=True)
    if report.summary["pairs"] == 0:
        click.echo(
            f"sparseety: no request seen under both labels {report.baseline!r} "
            f"and {report.candidate!r}",
            err=True,
        )
    if any(r.failed for r in results):
        sys.exit(1)
