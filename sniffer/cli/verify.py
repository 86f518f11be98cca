"""``sparseety verify`` and ``sparseety tokenize``: thin click commands.

Registered on the main group in ``sniffer.cli`` with ``main.add_command``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from sniffer.cli.common import (
    db_option,
    fail,
    library_errors,
    make_registry,
    node_option,
    open_store,
    parse_tokenizer_specs,
    progress_bar,
    quiet_option,
    tokenizer_options,
)

__all__ = ["parse_tokenizer_specs", "tokenize", "verify"]


# ------------------------------------------------------------------- tokenize


@click.command()
@db_option
@tokenizer_options
@click.option("--batch", type=click.IntRange(1), default=500, show_default=True)
@click.option("--limit", type=click.IntRange(1), help="At most this many streams.")
@click.option(
    "--redo",
    is_flag=True,
    help="Delete existing token rows first (of --stream, else of every stream).",
)
@click.option("--stream", "stream_ids", multiple=True, type=int, help="Only this stream (repeat).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@quiet_option
def tokenize(
    db: str,
    tokenizers: tuple[str, ...],
    default_tokenizer: str | None,
    batch: int,
    limit: int | None,
    redo: bool,
    stream_ids: tuple[int, ...],
    as_json: bool,
    quiet: bool,
) -> None:
    """Tokenize closed streams that have no token rows yet.

    Per stream and choice it stores prompt and output token ids, the ids of
    every chunk, straddling tokens, server-reported tokens, usage against own
    counts and anomalies. The daemon and replay run the same pass.

    \b
    Example:
      sparseety tokenize --db sparseety.db --tokenizer 'deepseek-*=/models/ds'
    """
    from sniffer.record.tokenize_pass import tokenize_db
    from sniffer.store.tokens_store import create_token_tables, delete_token_rows

    with library_errors():
        registry = make_registry(tokenizers, default_tokenizer)
        store = open_store(db, writes=True)
        create_token_tables(store)
        if redo:
            delete_token_rows(store, list(stream_ids) or None)
        with progress_bar(quiet, "tokenize") as progress:
            r = tokenize_db(
                store,
                registry,
                batch=batch,
                limit=limit,
                stream_ids=list(stream_ids) or None,
                progress=progress,
            )
    summary = {
        "streams": r.streams,
        "failed": r.failed,
        "skipped": r.skipped,
        "tokens": r.tokens,
        "prompt_tokens": r.prompt_tokens,
        "chunks": r.chunks,
        "anomalies": r.anomaly_kinds,
        "write_errors": r.write_errors,
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(r.anomaly_kinds.items())) or "none"
        click.echo(
            f"tokenized {r.streams} streams ({r.failed} failed): {r.tokens} output tokens, "
            f"{r.prompt_tokens} prompt tokens, {r.chunks} chunks; anomalies: {kinds}"
        )
        for e in r.write_errors:
            click.echo(f"  write error: {e}")
    if r.write_errors or r.failed:
        sys.exit(1)


# --------------------------------------------------------------------- verify


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def _short(findings: list[Any]) -> str:
    parts = []
    for f in findings:
        n = f" x{f.count}" if f.count > 1 else ""
        ch = f" [choice {f.choice}]" if f.choice is not None and f.choice >= 0 else ""
        parts.append(f"{f.kind}{n}{ch}")
    return ", ".join(parts)


def _first_per_kind(findings: list[Any]) -> list[str]:
    """One entry per kind: the first finding's detail and the total count."""
    first: dict[str, Any] = {}
    count: dict[str, int] = {}
    for f in findings:
        first.setdefault(f.kind, f)
        count[f.kind] = count.get(f.kind, 0) + f.count
    return [f"{k}{f' x{count[k]}' if count[k] > 1 else ''}: {f.detail}" for k, f in first.items()]


def _human(report: Any, show_tokens: bool, verbose: bool) -> None:
    for v in report.streams:
        who = f"stream {v.stream_id}" if v.stream_id is not None else f"line {v.line}"
        if v.label:
            who += f" ({v.label})"
        tok = f"{v.tokens} tokens" if v.tokens is not None else "not tokenized"
        if not v.verifiable:
            mark = _mark(v.ok) if not v.ok else "–"
            head = (
                f"{mark} {who} {v.model or '-'} {v.state or '-'}: text sampled out, not verifiable"
            )
            if v.failures:
                head += " — " + "; ".join(_first_per_kind(v.failures))
            click.echo(head)
            continue
        mark = "◐" if v.ok and v.partial else _mark(v.ok)
        head = f"{mark} {who} {v.model or '-'} {v.state or '-'}: {v.chunks} chunks, {tok}"
        if v.partial:
            head += " (partial: recovered mid-way, only its tail was captured)"
        if v.prompt_tokens is not None and v.prompt_template:
            head += f", prompt {v.prompt_tokens} tokens ({v.prompt_template})"
        if v.failures:
            head += " — " + "; ".join(_first_per_kind(v.failures))
        if v.warnings:
            head += f" (warn: {_short(v.warnings)})"
        click.echo(head)
        if verbose:
            for f in v.warnings:
                click.echo(f"    warn {f.kind}: {f.detail}")
        if show_tokens:
            for ch, toks in v.first_tokens.items():
                shown = " ".join(f"{i}:{json.dumps(t, ensure_ascii=False)}" for i, t in toks)
                click.echo(f"    choice {ch} first {len(toks)} tokens: {shown}")
    kinds = ", ".join(f"{k} {n}" for k, n in report.kind_counts().items()) or "none"
    nv = report.not_verifiable
    part = report.partial
    click.echo(
        f"{len(report.streams)} streams: "
        f"{len(report.streams) - report.failed - nv - part} verified, "
        f"{report.failed} failed, "
        + (f"{part} partial (recovered mid-way), " if part else "")
        + (f"{nv} not verifiable (text sampled out), " if nv else "")
        + f"{report.warned} with warnings; kinds (streams): {kinds}"
    )


@click.command()
@db_option
@click.option("--stream", "stream_ids", multiple=True, type=int, help="Only this stream (repeat).")
@click.option("--label", help="Only streams with this label.")
@click.option("--model", help="Only streams of this model.")
@click.option(
    "--state",
    help="Only streams in this state (complete, truncated, gap, error, open, midway).",
)
@click.option(
    "--jsonl",
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
    help="Verify a seed-format JSONL log instead of the database ('-' for stdin).",
)
@click.option("--tokens", "show_tokens", is_flag=True, help="Show the first 20 tokens per choice.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--verbose", "-v", is_flag=True, help="Show the detail of every warning.")
@click.option(
    "--no-tokenize",
    is_flag=True,
    help="Do not tokenize streams without token rows first (they get a warning).",
)
@click.option("--all", "include_http", is_flag=True, help="Include non-LLM HTTP exchanges.")
@node_option
@tokenizer_options
@quiet_option
def verify(
    db: str,
    node: str | None,
    stream_ids: tuple[int, ...],
    label: str | None,
    model: str | None,
    state: str | None,
    jsonl: str | None,
    show_tokens: bool,
    as_json: bool,
    verbose: bool,
    no_tokenize: bool,
    include_http: bool,
    tokenizers: tuple[str, ...],
    default_tokenizer: str | None,
    quiet: bool,
) -> None:
    """Verify recorded streams: exact, gap-aware checks, chunk by chunk and token by token.

    \b
    Checks: chunk indexes contiguous per choice; delta lengths sum to the
    stored text length and the deltas join to the stored text; the summary's
    chunk count equals the chunks stored; the stream is complete (finish seen,
    [DONE] when sent, no gap, no abort) or why not; token anomalies.
    FAIL: gap, truncated, error, open, index gaps, length/count/text
    mismatches, finish missing, content after finish, roundtrip, usage or
    server token mismatch (only with a tokenizer configured for the model).
    WARN: replacement_char, straddle, multi_token_chunk, unk, tokenizer default.
    Exit code 0 when everything verifies, 1 when something fails, 2 on usage errors.

    \b
    Examples:
      sparseety verify --db sparseety.db
      sparseety verify --db sparseety.db --stream 12 --tokens
      sparseety verify --jsonl logs/token_stream.jsonl
    """
    from sniffer.reports.verify import verify_db, verify_jsonl

    if jsonl is not None and (stream_ids or label or model or state or node):
        raise click.UsageError(
            "--jsonl cannot be combined with --stream/--label/--model/--state/--node"
        )
    with library_errors():
        registry = make_registry(tokenizers, default_tokenizer)
        if jsonl is not None:
            if jsonl == "-":
                report = verify_jsonl(sys.stdin, registry, tokens=show_tokens, source="-")
            else:
                with open(jsonl, encoding="utf-8", errors="replace") as fh:
                    report = verify_jsonl(fh, registry, tokens=show_tokens, source=jsonl)
        else:
            store = open_store(db)
            # tokenizing writes token rows: on a store this user may only read,
            # the streams without them get the not_tokenized warning instead
            tokenize = not no_tokenize and not store.read_only
            with (
                progress_bar(quiet, "tokenize") as tokenize_progress,
                progress_bar(quiet, "verify") as progress,
            ):
                report = verify_db(
                    store,
                    registry,
                    stream_ids=list(stream_ids) or None,
                    label=label,
                    model=model,
                    state=state,
                    tokens=show_tokens,
                    tokenize=tokenize,
                    include_http=include_http,
                    node=node,
                    progress=progress,
                    tokenize_progress=tokenize_progress,
                )
            found = {v.stream_id for v in report.streams}
            missing = [s for s in stream_ids if s not in found]
            if missing:
                fail(f"no stream {', '.join(map(str, missing))} in {db}")
    if not report.streams:
        where = jsonl if jsonl is not None else os.fspath(db)
        fail(f"nothing to verify in {where} (no stream matched)")
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2, ensure_ascii=False))
    else:
        _human(report, show_tokens, verbose)
    sys.exit(0 if report.ok else 1)
