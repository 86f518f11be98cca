"""The ``sparseety`` command line: a thin click layer over the library.

Every command parses options, calls one library function and prints. Library
errors become a one-line message and a non-zero exit code (2 for usage errors).
"""

from __future__ import annotations

import functools
import gc
import json
import os
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any, TextIO

import click

from sniffer import __version__, core_name
from sniffer.cli import exiting
from sniffer.cli.common import (
    db_option,
    fail,
    few_collections,
    library_errors,
    make_registry,
    node_option,
    open_store,
    parse_labels,
    parse_pairs,
    progress_bar,
    quiet_option,
    tokenizer_options,
)
from sniffer.cli.output import RowOutput, output_options, print_rows


def _ts(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%H:%M:%S.%f")[:-3]


def _ms(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "-"
    return f"{(a - b) * 1000:.1f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


class _LazyGroup(click.Group):
    """A group whose commands in ``LAZY_COMMANDS`` are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in LAZY_COMMANDS:
            import importlib

            command = getattr(importlib.import_module(LAZY_COMMANDS[cmd_name]), cmd_name)
            assert isinstance(command, click.Command)
            self.add_command(command)
        return command


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(
    __version__,
    prog_name="sparseety",
    message="%(prog)s, version %(version)s, " + core_name(),
)
def main() -> None:
    """SparSEEty: record, token by token, what an LLM server streamed back.

    \b
    Passive: it sniffs loopback HTTP (or replays a capture file), reassembles
    TCP, parses HTTP/1.1 and SSE/NDJSON bodies, extracts every streamed chunk
    of OpenAI-compatible APIs and stores it in SQLite.

    \b
    Quick start:
      sparseety replay capture.pcap --db sparseety.db
      sparseety streams --db sparseety.db
      sparseety show 1 --db sparseety.db
      sparseety export --db sparseety.db --format jsonl > events.jsonl
    """


# --------------------------------------------------------------------- replay


@main.command()
@click.argument("captures", nargs=-1, required=True, type=click.Path(dir_okay=False))
@db_option
@click.option("--port", "ports", multiple=True, type=int, help="Only these TCP ports (repeat).")
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="PORT=NAME",
    help="Label streams whose server port is PORT (e.g. 8000=baseline). Repeat.",
)
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(1, 64),
    default=None,
    help="Worker processes for large files (connections are split between them). "
    "Default: CPUs, at most 4.",
)
@click.option("--no-tokens", is_flag=True, help="Skip tokenization (run 'tokenize' later).")
@tokenizer_options
@click.option(
    "--no-redact",
    is_flag=True,
    help="No PII redaction (phones, IDs, e-mails, cards, IPs); credentials are still removed.",
)
@click.option(
    "--redact-pattern",
    "redact_patterns",
    multiple=True,
    metavar="NAME=REGEX",
    help="Also replace matches of REGEX by <NAME> (repeat).",
)
@click.option(
    "--sample-rate",
    type=click.FloatRange(0, 1),
    default=None,
    help="Share of streams whose chunk text is stored (summaries always), as in 'run'.  "
    "[default: 1]",
)
@click.option(
    "--node",
    metavar="NAME",
    help="Node name stored on every row, as 'run --node'.  [default: the host name]",
)
@click.option(
    "--proto",
    "proto_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Protobuf descriptor set (protoc --include_imports -o FILE.pb): decode the "
    "messages of the gRPC methods it describes.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="Print the summary as CSV, one line per file.")
@click.option(
    "--otlp-endpoint",
    metavar="URL",
    help="Also export spans and GenAI metrics over OTLP/HTTP to this collector base URL, "
    "as 'run' does (one process; needs pip install 'sparseety[otlp]').",
)
@click.option("--otlp-chunk-events", is_flag=True, help="One span event per chunk.")
def replay(
    captures: tuple[str, ...],
    db: str,
    ports: tuple[int, ...],
    labels: tuple[str, ...],
    jobs: int | None,
    no_tokens: bool,
    tokenizers: tuple[str, ...],
    default_tokenizer: str | None,
    no_redact: bool,
    redact_patterns: tuple[str, ...],
    sample_rate: float | None,
    node: str | None,
    proto_file: str | None,
    quiet: bool,
    as_json: bool,
    as_csv: bool = False,
    otlp_endpoint: str | None = None,
    otlp_chunk_events: bool = False,
) -> None:
    """Replay pcap/pcapng files (gzip ok) through the pipeline into the database.

    Every TCP connection is looked at and HTTP is recognised by its bytes,
    whatever the port; --port only narrows it. A truncated or corrupt file is
    processed up to the bad offset, stored, and reported (exit code 1).

    \b
    Example:
      sparseety replay pcaps/chat_english.pcap --db sparseety.db --label 8000=baseline
      sparseety replay pcaps/*.pcap --db sparseety.db -q --csv > replay.csv
    """
    few_collections()
    from sniffer.record.chain import RecordingChain, RecordingOptions
    from sniffer.runtime.replay import MissingCapture, replay_files

    if as_json and as_csv:
        raise click.UsageError("--json and --csv cannot be combined")
    label_map = parse_labels(labels)
    patterns = parse_pairs(redact_patterns, "--redact-pattern", "NAME=REGEX")
    if no_redact:
        click.echo(
            "sparseety: redaction is OFF: text is stored as captured "
            "(credentials are still removed)",
            err=True,
        )
    options = RecordingOptions(
        sample_rate=1.0 if sample_rate is None else sample_rate,
        redact=not no_redact,
        redact_patterns=patterns,
        tokens=not no_tokens,
    )
    proto = _read_proto(proto_file)
    with library_errors():
        registry = None if no_tokens else make_registry(tokenizers, default_tokenizer)
        otlp = _replay_otlp(otlp_endpoint, otlp_chunk_events, wait_tokens=not no_tokens)
        recording = RecordingChain.from_config(options, tokens=registry, otlp=otlp)
    if otlp is not None:
        click.get_current_context().call_on_close(lambda: _close_otlp(otlp))
    failed = False
    summaries = []
    bars = _FileBars(enabled=not quiet and sys.stderr.isatty())
    try:
        with library_errors():
            files = replay_files(
                captures,
                db,
                chain=recording,
                ports=frozenset(ports),
                labels=label_map,
                jobs=jobs,
                node=node,
                proto=proto,
                progress=bars.progress,
            )
            try:
                for r in files:
                    bars.close()
                    summaries.append(r.summary())
                    failed = failed or bool(r.capture_error)
                    if not (as_json or as_csv):
                        _print_replay(r, db, tokens=registry is not None)
            except MissingCapture as exc:
                fail(str(exc), 2)
    finally:
        bars.close()
    if as_json:
        click.echo(json.dumps(summaries if len(summaries) > 1 else summaries[0], indent=2))
    elif as_csv:
        print_rows(summaries, RowOutput(csv=True), table=lambda rows: None)
    if failed:
        sys.exit(1)


def _read_proto(proto_file: str | None) -> bytes | None:
    """The descriptor set ``--proto`` names, checked."""
    if proto_file is None:
        return None
    from sniffer.core.grpc import ProtoCatalog

    with open(proto_file, "rb") as fh:
        proto = fh.read()
    try:
        ProtoCatalog(proto)
    except ValueError as exc:
        raise click.BadParameter(f"{proto_file}: {exc}", param_hint="--proto") from exc
    return proto


class _FileBars:
    """One progress bar per capture file on a terminal's stderr."""

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None
        self._path: str | None = None
        self._done = 0

    def progress(self, path: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if path != self._path:
            self.close()
            self._path, self._done = path, 0
            self._bar = click.progressbar(
                length=max(total, 1),
                label=os.path.basename(path),
                file=sys.stderr,
                show_percent=True,
            )
            self._bar.__enter__()
        self._bar.length = max(total, 1)
        self._bar.update(done - self._done)
        self._done = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


def _print_replay(r: Any, db: str, *, tokens: bool) -> None:
    """The text summary of one replayed file."""
    path = r.path
    states = ", ".join(f"{k} {v}" for k, v in sorted(r.states.items())) or "none"
    click.echo(
        f"{path}: {r.packets} packets, {r.streams} streams ({states}), "
        f"{r.chunk_events} chunk events, {r.errors} errors"
    )
    click.echo(
        f"  {r.seconds:.2f} s: {r.packets_per_second:,.0f} packets/s, "
        f"{r.events_per_second:,.0f} chunk events/s → {db}"
    )
    if tokens:
        click.echo(
            f"  tokens: {r.tokens:,} in {r.tokenized_streams:,} streams, "
            f"{r.token_anomalies:,} anomalies ({r.token_seconds:.2f} s)"
        )
    if r.redactions:
        click.echo(f"  redacted: {r.redactions:,} matches")
    tcp = ", ".join(f"{k} {v:,}" for k, v in r.reassembly.items() if v)
    if tcp:
        click.echo(f"  tcp reassembly: {tcp}")
    if r.capture_error:
        click.echo(f"  capture error: {r.capture_error} (everything before it was stored)")


# -------------------------------------------------------------------- streams


def _replay_otlp(endpoint: str | None, chunk_events: bool, *, wait_tokens: bool) -> Any:
    """The OTLP exporter replay was asked for (flag, else $OTEL_EXPORTER_OTLP_ENDPOINT)."""
    if not (endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")).strip():
        return None  # export off: the exporter's module (and prometheus_client) stays unloaded
    from sniffer.record.otlp import (
        OtlpExporter,
        OtlpOptions,
        OtlpUnavailable,
        resolve_endpoint,
        resolve_headers,
    )

    url = resolve_endpoint(endpoint or "")
    if not url:
        return None

    def log(level: str, event: str, **fields: Any) -> None:
        extra = " ".join(f"{k}={v}" for k, v in fields.items())
        click.echo(f"sparseety: {level}: {event} {extra}", err=True)

    try:
        return OtlpExporter(
            OtlpOptions(
                endpoint=url,
                headers=resolve_headers(()),
                node=socket.gethostname(),
                chunk_events=chunk_events,
                block=True,
            ),
            log=log,
            wait_tokens=wait_tokens,
        )
    except OtlpUnavailable as exc:
        fail(str(exc), 2)


def _close_otlp(otlp: Any) -> None:
    """Export what is left (when the command ends, whatever its exit code)."""
    otlp.close()


@main.command()
@db_option
@click.option("--label", help="Only streams with this label.")
@click.option("--model", help="Only streams of this model.")
@click.option("--state", help="complete, truncated, gap, error, open or midway.")
@click.option("--all", "show_all", is_flag=True, help="Include non-LLM HTTP exchanges.")
@click.option("--limit", type=int, help="At most this many streams.")
@output_options()
@node_option
def streams(
    db: str,
    node: str | None,
    label: str | None,
    model: str | None,
    state: str | None,
    show_all: bool,
    limit: int | None,
    output: RowOutput,
) -> None:
    """List captured streams, one line each.

    \b
    Columns: id, label, state, model, path, status, choices' chunks, characters,
    TTFT (ms from request to first content), duration (ms), spec (the share
    of drafted tokens the server reported accepting, when it reported
    speculative decoding: vLLM, llama.cpp, SGLang), finish reasons.
    A stream recovered mid-way (the capture began inside its response) is in
    state midway, its path shown as "(mid-way)", with no TTFT; its duration
    runs from the point where it was picked up.

    \b
    Example:
      sparseety streams --db sparseety.db --state gap
      sparseety streams --db postgresql+psycopg://sparseety@db/sparseety --node gpu-07
      sparseety streams --db sparseety.db --csv -c id -c state -c model
    """
    from sniffer.store.lite import PLAIN_HTTP
    from sniffer.store.queries import list_streams

    with library_errors():
        store = open_store(db)
        rows = list_streams(store, label=label, model=model, state=state, node=node)
        if not show_all:
            rows = [r for r in rows if (r.get("dialect") or PLAIN_HTTP) != PLAIN_HTTP]
        if limit is not None:
            rows = rows[:limit]
        print_rows(rows, output, table=functools.partial(_streams_table, show_all=show_all))


def _streams_table(rows: Sequence[Mapping[str, Any]], *, show_all: bool) -> None:
    from sniffer.core.flags import StreamFlag, stream_flags

    if not rows:
        click.echo("no streams" + ("" if show_all else " (try --all for every HTTP exchange)"))
        return
    header = (
        f"{'id':>6} {'label':<9} {'state':<9} {'model':<18} {'path':<22} {'st':>3} "
        f"{'chunks':>6} {'chars':>7} {'ttft_ms':>8} {'dur_ms':>8} {'spec':>5} finish"
    )
    click.echo(header)
    midway = 0
    clock = 0
    for r in rows:
        path = r.get("path") or "-"
        ttft = _ms(r.get("t_first_content"), r.get("t_request"))
        dur = _ms(r.get("t_last_chunk"), r.get("t_request"))
        if StreamFlag.CLOCK_BACKWARDS in stream_flags(r.get("flags")):
            clock += 1  # a difference of its times is no duration
            ttft = dur = "(clock)"
        if r.get("state") == "midway":
            midway += 1
            path = r.get("path") or "(mid-way)"
        finish = r.get("finish_reasons") or ""
        with suppress(ValueError):
            finish = ",".join(str(v) for v in json.loads(finish).values()) if finish else ""
        click.echo(
            f"{r['id']:>6} {(r.get('label') or '-')[:9]:<9} {(r.get('state') or '-'):<9} "
            f"{(r.get('model') or '-')[:18]:<18} {path[:22]:<22} "
            f"{r.get('status') or '-':>3} {r.get('chunk_count') or 0:>6} "
            f"{r.get('text_len') or 0:>7} "
            f"{ttft:>8} {dur:>8} {_pct(r.get('spec_accept_rate')):>5} {finish}"
        )
    if clock:
        click.echo(
            f"{clock} stream(s) flagged clock-backwards: the capture clock went backwards "
            "during them; TTFT and duration not shown"
        )
    if midway:
        click.echo(
            f"{midway} stream(s) recovered mid-way: the capture began inside the response; "
            "request unknown, only the tail recorded, no TTFT"
        )


# ----------------------------------------------------------------------- show


@main.command()
@click.argument("stream_id", type=int)
@db_option
@click.option("--json", "as_json", is_flag=True, help="The stream row and its chunks as JSON.")
@click.option("--raw", is_flag=True, help="Show raw event data of chunks we do not model.")
@node_option
def show(stream_id: int, db: str, as_json: bool, raw: bool, node: str | None) -> None:
    """Show one stream: request, response, and every chunk with its capture time.

    \b
    Example:
      sparseety show 12 --db sparseety.db
    """
    from sniffer.core.flags import FLAG_TEXT, stream_flags
    from sniffer.reports.cadence import stream_lines
    from sniffer.store.queries import get_stream

    with library_errors():
        s = get_stream(open_store(db), stream_id)
    if s is None:
        fail(f"no stream {stream_id} in {db}")
        return
    if node is not None and s.get("node") != node:
        fail(f"stream {stream_id} was captured by node {s.get('node')!r}, not {node!r}")
        return
    if as_json:
        click.echo(json.dumps(s, indent=2, default=str))
        return
    chunks = s.pop("chunks", [])
    errors = s.pop("errors", [])
    t0 = s.get("t_request")
    click.echo(
        f"stream {s['id']}  {s.get('client')} → {s.get('server')}  "
        f"{s.get('method')} {s.get('path')}  label={s.get('label') or '-'}  "
        f"node={s.get('node') or '-'}"
    )
    click.echo(
        f"  model={s.get('model')} stream={s.get('is_stream')} temperature={s.get('temperature')} "
        f"n={s.get('n')} max_tokens={s.get('max_tokens')} dialect={s.get('dialect')}"
    )
    click.echo(
        f"  status={s.get('status')} content-type={s.get('content_type')} state={s.get('state')} "
        f"({s.get('reason')}) done={bool(s.get('done_seen'))} gap={bool(s.get('gap'))}"
    )
    flags = stream_flags(s.get("flags"))
    if flags:
        click.echo(f"  flags: {', '.join(f'{f} ({FLAG_TEXT.get(f, f)})' for f in flags)}")
    click.echo(
        f"  request at {_ts(t0)}  headers +{_ms(s.get('t_response'), t0)} ms  first content "
        f"+{_ms(s.get('t_first_content'), t0)} ms  last chunk +{_ms(s.get('t_last_chunk'), t0)} ms"
    )
    click.echo(
        f"  {s.get('chunk_count')} text chunks, {s.get('event_count')} events, "
        f"{s.get('text_len')} characters, usage={s.get('usage')}"
    )
    for line in stream_lines(s, chunks):
        click.echo(f"  {line}")
    if s.get("error"):
        click.echo(f"  error: {s['error']}")
    for e in errors:
        click.echo(f"  ! {e.get('stage')}/{e.get('kind')}: {e.get('message')}")
    if chunks:
        click.echo(f"  {'seq':>4} {'+ms':>9} {'ch':>3} {'idx':>4} {'kind':<10} text")
    for c in chunks:
        text = c.get("text") or c.get("reasoning") or ""
        extra = ""
        if c.get("finish_reason"):
            extra += f" [finish={c['finish_reason']}]"
        if c.get("tool_calls"):
            extra += f" [tool_calls={c['tool_calls']}]"
        if c.get("usage"):
            extra += f" [usage={c['usage']}]"
        if raw and c.get("raw"):
            extra += f" [raw={c['raw']}]"
        click.echo(
            f"  {c['seq']:>4} {_ms(c.get('ts'), t0):>9} {c.get('choice'):>3} "
            f"{c.get('chunk_index'):>4} {c.get('kind'):<10} {json.dumps(text, ensure_ascii=False)}"
            f"{extra}"
        )


# --------------------------------------------------------------------- export


@main.command()
@db_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "csv"]),
    default="jsonl",
    show_default=True,
    help="jsonl: the seed's event log with stream identity; csv: one row per stream.",
)
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False), help="File to write (default stdout)."
)
@click.option("--label", help="Only streams with this label.")
@click.option("--stream", "stream_ids", multiple=True, type=int, help="Only this stream (repeat).")
@node_option
@quiet_option
def export(
    db: str,
    fmt: str,
    output: str | None,
    label: str | None,
    stream_ids: tuple[int, ...],
    node: str | None,
    quiet: bool,
) -> None:
    """Export streams: the seed-compatible JSONL event log, or a CSV summary.

    \b
    JSONL records: request_start, chunk (one per chunk that carries text),
    stream_done; records of one stream in capture order.

    \b
    Example:
      sparseety export --db sparseety.db --format jsonl -o logs/token_stream.jsonl
    """
    from sniffer.reports.export import export_csv, export_jsonl

    with library_errors():
        store = open_store(db)
        ids = list(stream_ids) or None
        fh: TextIO
        if output:
            from sniffer.store.files import open_private

            fh = os.fdopen(open_private(output), "w", encoding="utf-8")  # 0600, no symlink
        else:
            fh = sys.stdout
        try:
            run = export_jsonl if fmt == "jsonl" else export_csv
            with progress_bar(quiet, "export") as progress:
                n = run(store, fh, stream_ids=ids, label=label, node=node, progress=progress)
        finally:
            if output:
                fh.close()
    if output:
        click.echo(f"wrote {n} records to {output}", err=True)


# --------------------------------------------------------------------- errors


@main.command()
@db_option
@click.option("--limit", type=int, default=50, show_default=True)
@output_options()
@node_option
def errors(db: str, limit: int, node: str | None, output: RowOutput) -> None:
    """List recorded pipeline errors (bad input is recorded, never fatal).

    \b
    Example:
      sparseety errors --db sparseety.db --limit 20
      sparseety errors --db sparseety.db --csv -c stage -c kind -c message
    """
    from sniffer.store.queries import list_errors

    with library_errors():
        rows = list_errors(open_store(db), limit=limit, node=node)
    print_rows(rows, output, table=_errors_table)


def _errors_table(rows: Sequence[Mapping[str, Any]]) -> None:
    if not rows:
        click.echo("no errors")
    for e in rows:
        click.echo(
            f"{_ts(e.get('ts'))} {e.get('stage')}/{e.get('kind')} conn={e.get('connection_id')} "
            f"stream={e.get('stream_id')}: {e.get('message')}"
        )


# ---------------------------------------------------------------------- nodes


@main.command()
@db_option
@output_options()
def nodes(db: str, output: RowOutput) -> None:
    """List the sidecars (nodes) that wrote streams to the database.

    \b
    Example:
      sparseety nodes --db postgresql+psycopg://sparseety@db/sparseety
      sparseety nodes --db sparseety.db --csv
    """
    from sniffer.store.queries import list_nodes

    with library_errors():
        rows = list_nodes(open_store(db))
    print_rows(rows, output, table=_nodes_table)


def _nodes_table(rows: Sequence[Mapping[str, Any]]) -> None:
    if not rows:
        click.echo("no streams")
        return
    click.echo(f"{'node':<24} {'streams':>8}  first request         last request")
    for r in rows:
        click.echo(
            f"{(r['node'] or '-')[:24]:<24} {r['streams']:>8}  {_ts(r['first'])}  {_ts(r['last'])}"
        )


# ---------------------------------------------------------------------- prune


@main.command()
@db_option
@click.option(
    "--older-than",
    required=True,
    metavar="AGE",
    help="Delete streams whose request is older than AGE: 90s, 30m, 12h, 7d, 2w.",
)
@click.option("--batch", type=click.IntRange(1, 100_000), default=500, show_default=True)
@click.option("--no-vacuum", is_flag=True, help="Do not return the freed pages to the OS.")
@node_option
@quiet_option
def prune(
    db: str, older_than: str, batch: int, no_vacuum: bool, node: str | None, quiet: bool
) -> None:
    """Delete old streams (with their chunks, token rows and errors) in small
    transactions, then run an incremental vacuum.

    \b
    Example:
      sparseety prune --older-than 7d --db /var/lib/sparseety/sparseety.db
    """
    import time

    from sniffer.store.retention import parse_age, vacuum
    from sniffer.store.retention import prune as run_prune

    try:
        age = parse_age(older_than)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    with library_errors():
        store = open_store(db, writes=True)
        with progress_bar(quiet, "prune") as progress:
            r = run_prune(store, age, now=time.time(), batch=batch, node=node, progress=progress)
        click.echo(
            f"deleted {r.streams} streams, {r.chunks} chunks, {r.errors} errors, "
            f"{r.connections} connections in {r.batches} batches"
        )
        if not no_vacuum:
            with progress_bar(quiet, "vacuum") as progress:
                v = vacuum(store, progress=progress)
            if v.incremental:
                click.echo(f"vacuum: {v.freed_pages} pages freed ({v.page_size} bytes each)")


#: Commands that live in their own modules: loaded when named on the command
#: line (or listed by ``--help``), so that ``replay`` does not import ``run``'s
#: configuration machinery nor the report modules' (issue #16: start-up).
LAZY_COMMANDS = {
    "run": "sniffer.cli.run",
    "verify": "sniffer.cli.verify",
    "tokenize": "sniffer.cli.verify",
    "probe": "sniffer.cli.compare",
    "stats": "sniffer.cli.compare",
    "diff": "sniffer.cli.compare",
    "top": "sniffer.cli.top",
}


def entry_point() -> None:
    """The ``sparseety`` console script: ``main`` plus a quiet exit when the
    reader of stdout goes away (``sparseety export | head``), and a quick one
    otherwise (``_exit_quickly``)."""
    try:
        try:
            main()
        except SystemExit as exc:
            _exit_quickly(exc)
            raise
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's final flush must not fail again
        sys.exit(141)


def _exit_quickly(exc: SystemExit) -> None:
    """Have the process end without the interpreter's teardown, when nothing needs it.

    A command's work is done when ``main`` raises ``SystemExit``: this arms
    :mod:`sniffer.cli.exiting`, which ends the process once the ``atexit``
    handlers have run and the standard streams are flushed, before Python
    frees every module and object one by one (issue #16). It leaves the normal
    exit when another thread is still running (Python joins non-daemon threads
    at exit), the exit code is not a number (``sys.exit("message")`` prints
    it), or a profiler or tracer runs (``python -m cProfile``, coverage: they
    write their results after the command returns).
    """
    code = exc.code
    if code is None:
        code = 0
    if (
        type(code) is not int
        or threading.active_count() > 1
        or sys.getprofile() is not None
        or sys.gettrace() is not None
    ):
        return
    # What the command's frames still held (kept alive by this exception's
    # traceback) and what reference cycles hold (a sqlite3 connection and its
    # statement cache, a SQLAlchemy engine's pool) is finalized now, as the
    # teardown would have: the last connection to a SQLite file, closed,
    # checkpoints its WAL and removes the -wal file, so the database is again
    # the one file users copy.
    exc.__traceback__ = None
    exc.__context__ = None
    gc.collect()
    exiting.arm(code)


if __name__ == "__main__":
    entry_point()
