"""``sparseety probe``, ``stats`` and ``diff``: thin click commands.

Registered on the main group in ``sniffer.cli`` with ``main.add_command``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from .cli_common import (
    db_option,
    library_errors,
    make_registry,
    open_engine,
    tokenizer_options,
)

__all__ = ["diff", "probe", "stats"]


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
    from .probe import ProbeConfig, format_probe, load_prompts, probe_summary, run_probe

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
@tokenizer_options
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
def stats(
    db: str,
    labels: tuple[str, ...],
    model: str | None,
    include_incomplete: bool,
    varying: bool,
    tokenizers: tuple[str, ...],
    default_tokenizer: str | None,
    as_json: bool,
) -> None:
    """Output stability: group repeats of the same request and compare their tokens.

    Streams are grouped by fingerprint (model, normalised prompt, sampling
    parameters, label). Each group with two or more outputs lists its
    distinct outputs (count and first 200 characters), the longest common
    token prefix and the token position where the variants fork. The summary
    gives the share of fully deterministic groups, overall and per label.

    \b
    Example:
      sparseety stats --db sparseety.db --label baseline --varying
    """
    from .reports.stats import format_stats, stats_json
    from .reports.stats import stats as run_stats

    with library_errors():
        engine = open_engine(db)
        report = run_stats(
            engine,
            labels=list(labels) or None,
            model=model,
            registry=make_registry(tokenizers, default_tokenizer),
            include_incomplete=include_incomplete,
        )
    if as_json:
        click.echo(json.dumps(stats_json(report), indent=2, ensure_ascii=False))
    else:
        click.echo(format_stats(report, show_deterministic=not varying))


# ----------------------------------------------------------------------- diff


@click.command()
@db_option
@click.option("--baseline", required=True, metavar="LABEL", help="Label of the reference side.")
@click.option("--candidate", required=True, metavar="LABEL", help="Label of the side under test.")
@click.option(
    "--pairing",
    type=click.Choice(["all", "modal"]),
    default="all",
    show_default=True,
    help="all: every baseline output with every candidate output of the same request; "
    "modal: the most frequent output of each side.",
)
@click.option("--model", help="Only streams of this model.")
@click.option(
    "--include-incomplete", is_flag=True, help="Also truncated, gapped and failed streams."
)
@click.option(
    "--fail-if",
    "gates",
    multiple=True,
    metavar="'METRIC OP NUMBER'",
    help="Exit 1 when this holds, e.g. 'identical_ratio < 0.95'. Repeat. Metrics are the "
    "summary keys of --json.",
)
@click.option(
    "--html", "html_path", type=click.Path(dir_okay=False), help="Write a self-contained report."
)
@click.option("--limit", type=int, default=50, show_default=True, help="Prompts listed in text.")
@tokenizer_options
@click.option("--json", "as_json", is_flag=True, help="The report as JSON.")
def diff(
    db: str,
    baseline: str,
    candidate: str,
    pairing: str,
    model: str | None,
    include_incomplete: bool,
    gates: tuple[str, ...],
    html_path: str | None,
    limit: int,
    tokenizers: tuple[str, ...],
    default_tokenizer: str | None,
    as_json: bool,
) -> None:
    """Compare the token outputs and latency of two labels (baseline vs candidate).

    Streams of the two labels are paired by request fingerprint (model,
    normalised prompt, sampling parameters) and their token-id sequences
    compared: identical or not, first divergence, common prefix, edit
    distance, length and finish-reason differences; per side TTFT,
    inter-token latency and tokens per chunk. --fail-if gates make the exit
    code 1 when a condition holds, so the comparison can gate a rollout.

    \b
    Example:
      sparseety diff --db sparseety.db --baseline baseline --candidate sparse \\
          --fail-if 'identical_ratio < 0.95' --fail-if 'ttft_ratio > 1.2' --html report.html
    """
    from .reports.diff import GateError, diff_json, evaluate_gates, format_diff, parse_gate
    from .reports.diff import diff as run_diff

    try:
        parsed = [parse_gate(g) for g in gates]
    except GateError as exc:
        raise click.BadParameter(str(exc), param_hint="--fail-if") from exc
    with library_errors():
        engine = open_engine(db)
        report = run_diff(
            engine,
            baseline,
            candidate,
            pairing=pairing,
            model=model,
            registry=make_registry(tokenizers, default_tokenizer),
            include_incomplete=include_incomplete,
        )
        results = evaluate_gates(parsed, report.summary)
        if html_path:
            from .reports.html import diff_html
            from .store.files import open_private

            with os.fdopen(open_private(html_path), "w", encoding="utf-8") as fh:  # 0600
                fh.write(diff_html(report, results))
    if as_json:
        click.echo(json.dumps(diff_json(report, results), indent=2, ensure_ascii=False))
    else:
        click.echo(format_diff(report, results, limit=limit))
        if html_path:
            click.echo(f"wrote {html_path}", err=True)
    if report.summary["pairs"] == 0:
        click.echo(
            f"sparseety: no request seen under both labels {baseline!r} and {candidate!r}",
            err=True,
        )
    if any(r.failed for r in results):
        sys.exit(1)
