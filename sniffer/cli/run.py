"""``sparseety run``: the live sidecar daemon (click layer over :mod:`sniffer.runtime.daemon`)."""

from __future__ import annotations

import sys
from typing import Any

import click

from sniffer.cli.common import DB_ENV, env_database, parse_labels, parse_pairs
from sniffer.runtime.config import (
    BACKENDS,
    DEFAULT_DATABASE,
    LOG_LEVELS,
    Config,
    ConfigError,
    load_config,
    render_toml,
)

__all__ = ["build_config", "run"]


def build_config(config_path: str | None, options: dict[str, Any]) -> tuple[Config, dict[str, Any]]:
    """The effective config: defaults ← TOML file ← ``$SPARSEETY_DB`` (the
    database, as for every command) ← CLI flags. Returns it and the overrides
    (re-applied on SIGHUP). Raises :class:`ConfigError`."""
    overrides: dict[str, Any] = {}
    env_db = env_database()
    if env_db is not None:
        overrides["database"] = env_db
    for key in (
        "interface",
        "backend",
        "database",
        "flush_interval",
        "batch_size",
        "queue_size",
        "ring_blocks",
        "block_size",
        "idle_timeout",
        "log_level",
        "node",
        "metrics_listen",
        "sample_rate",
        "default_tokenizer",
        "db_group",
        "node",
        "otlp_endpoint",
        "otlp_queue_size",
        "grpc_proto",
    ):
        if options.get(key) is not None:
            overrides[key] = options[key]
    for flag, key, value in (
        ("no_metrics", "metrics", False),
        ("metrics_public", "metrics_public", True),
        ("no_redact", "redact", False),
        ("no_tokens", "tokens", False),
        ("allow_world_readable", "allow_world_readable", True),
        ("otlp_chunk_events", "otlp_chunk_events", True),
    ):
        if options.get(flag):
            overrides[key] = value
    if options.get("retention"):
        from sniffer.store.retention import parse_age

        try:
            overrides["retention_days"] = parse_age(options["retention"]) / 86400.0
        except ValueError as exc:
            raise ConfigError(f"--retention: {exc}") from None
    try:
        for key, flag, form in (
            ("redact_patterns", "--redact-pattern", "NAME=REGEX"),
            ("tokenizers", "--tokenizer", "PATTERN=SOURCE"),
            ("otlp_headers", "--otlp-header", "NAME=VALUE"),
        ):
            if options.get(key):
                overrides[key] = parse_pairs(options[key], flag, form, header=key == "otlp_headers")
        if options.get("labels"):
            overrides["labels"] = parse_labels(options["labels"])
    except click.BadParameter as exc:
        raise ConfigError(f"{exc.param_hint} {exc.message}") from None
    for key in ("ports", "pids", "comms"):
        if options.get(key):
            overrides[key] = tuple(options[key])
    base = load_config(config_path)
    return base.with_overrides(overrides), overrides


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="TOML config file (see systemd/sparseety.toml.example). Flags override it.",
)
@click.option("--interface", "-i", help="Interface to capture on.  [default: lo]")
@click.option(
    "--port", "ports", multiple=True, type=int, help="Server port (repeat).  [default: 8000]"
)
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="PORT=NAME",
    help="Label stored on every stream whose server port is PORT (repeat); PORT is captured.",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    help="packet: AF_PACKET ring + kernel BPF filter; ebpf: syscall tracing.  [default: packet]",
)
@click.option("--pid", "pids", multiple=True, type=int, help="ebpf: only this process (repeat).")
@click.option("--comm", "comms", multiple=True, help="ebpf: only this process name (repeat).")
@click.option(
    "--db",
    "database",
    help=f"SQLite file or SQLAlchemy URL.  [default: ${DB_ENV}, else the config file's, "
    f"else {DEFAULT_DATABASE}]",
)
@click.option(
    "--node",
    metavar="NAME",
    help="This sidecar's name, stored on every row (readers filter by it with --node); "
    "for many sidecars writing to one database.  [default: the host name]",
)
@click.option("--flush-interval", type=float, help="Seconds between writes at most.  [default: 1]")
@click.option("--batch-size", type=int, help="Rows per write at most.  [default: 5000]")
@click.option(
    "--queue-size", type=int, help="Capture→pipeline queue length, in batches.  [default: 1024]"
)
@click.option("--ring-blocks", type=int, help="packet: ring blocks.  [default: 32]")
@click.option("--block-size", type=int, help="packet: bytes per ring block.  [default: 524288]")
@click.option(
    "--idle-timeout", type=float, help="Seconds before an idle connection closes.  [default: 300]"
)
@click.option("--log-level", type=click.Choice(LOG_LEVELS), help="[default: info]")
@click.option(
    "--metrics-listen", metavar="HOST:PORT", help="Prometheus /metrics.  [default: 127.0.0.1:9464]"
)
@click.option("--no-metrics", is_flag=True, help="Do not serve /metrics.")
@click.option(
    "--metrics-public", is_flag=True, help="Allow a non-loopback --metrics-listen address."
)
@click.option(
    "--sample-rate",
    type=click.FloatRange(0, 1),
    help="Share of streams whose chunk text is stored (summaries always).  [default: 1]",
)
@click.option("--no-redact", is_flag=True, help="No PII redaction (credentials are still removed).")
@click.option(
    "--redact-pattern",
    "redact_patterns",
    multiple=True,
    metavar="NAME=REGEX",
    help="Also replace REGEX matches by <NAME> (repeat).",
)
@click.option("--retention", metavar="AGE", help="Delete streams older than AGE (e.g. 30d).")
@click.option("--no-tokens", is_flag=True, help="Do not tokenize streams.")
@click.option(
    "--tokenizer",
    "tokenizers",
    multiple=True,
    metavar="PATTERN=SOURCE",
    help="Tokenizer for models matching PATTERN: a dir, tokenizer.json or cached hub id (repeat).",
)
@click.option("--default-tokenizer", metavar="SOURCE", help="[default: DeepSeek-V4]")
@click.option("--db-group", metavar="GROUP", help="Database files 0640 with this group.")
@click.option(
    "--allow-world-readable",
    is_flag=True,
    help="Start even if the database file is world-readable.",
)
@click.option(
    "--otlp-endpoint",
    metavar="URL",
    help="Export spans and GenAI metrics over OTLP/HTTP to this collector base URL "
    "(e.g. http://127.0.0.1:4318); default: $OTEL_EXPORTER_OTLP_ENDPOINT, else off. "
    "Needs: pip install 'sparseety[otlp]'.",
)
@click.option(
    "--otlp-header",
    "otlp_headers",
    multiple=True,
    metavar="NAME=VALUE",
    help="Header sent with every OTLP export (repeat; adds to $OTEL_EXPORTER_OTLP_HEADERS).",
)
@click.option(
    "--otlp-chunk-events", is_flag=True, help="One span event per streamed chunk (off by default)."
)
@click.option(
    "--otlp-queue-size",
    type=int,
    help="Closed streams waiting for OTLP export; beyond it they are dropped and counted.  "
    "[default: 4096]",
)
@click.option(
    "--proto",
    "grpc_proto",
    metavar="FILE.pb",
    help="Protobuf descriptor set: decode the messages of the gRPC methods it describes.",
)
@click.option("--print-config", is_flag=True, help="Print the effective config as TOML and exit.")
def run(config_path: str | None, print_config: bool, **options: Any) -> None:
    """Record live: capture the LLM server's traffic and store every streamed chunk.

    \b
    Passive and fail-open: it never sits in the request path. SIGTERM/SIGINT
    flush everything and close open streams as truncated; SIGHUP reloads the
    config file. Logs go to stderr; under systemd (Type=notify) it reports
    READY=1, STATUS= and WATCHDOG=1. Needs root or CAP_NET_RAW (ebpf: CAP_BPF
    and CAP_PERFMON).

    \b
    Examples:
      sparseety run                                   # lo, port 8000, ./sparseety.db
      sparseety run --port 8000 --label 8000=baseline --port 8001 --label 8001=sparse
      sparseety run --config /etc/sparseety/sparseety.toml
      sparseety run --backend ebpf --comm python3 --port 8000
      sparseety run --config my.toml --print-config
      sparseety run --node gpu-07 --otlp-endpoint http://collector:4318
    """
    try:
        cfg, overrides = build_config(config_path, options)
        if cfg.grpc_proto:
            from sniffer.runtime.daemon import read_proto

            read_proto(cfg.grpc_proto)  # an unusable descriptor set stops here
    except ConfigError as exc:
        click.echo(f"sparseety: config error: {exc}", err=True)
        sys.exit(2)
    if print_config:
        click.echo(render_toml(cfg), nl=False)
        return

    from sniffer.capture.afpacket import CaptureError
    from sniffer.capture.ebpf import EbpfError
    from sniffer.llm.tokens import TokenizerLoadError
    from sniffer.record.otlp import OtlpUnavailable
    from sniffer.runtime.daemon import Daemon
    from sniffer.runtime.features import build_features
    from sniffer.runtime.log import Log
    from sniffer.store.files import InsecureDatabaseFile

    try:
        log = Log(cfg.log_level)
        try:
            features = build_features(cfg, log)
        except (InsecureDatabaseFile, TokenizerLoadError, OtlpUnavailable, ValueError) as exc:
            click.echo(f"sparseety: {exc}", err=True)
            sys.exit(2)
        except OSError as exc:
            click.echo(f"sparseety: cannot serve metrics on {cfg.metrics_listen}: {exc}", err=True)
            sys.exit(1)
        code = Daemon(cfg, overrides=overrides, log=log, features=features).run()
    except (CaptureError, EbpfError) as exc:
        click.echo(f"sparseety: cannot capture: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        click.echo(f"sparseety: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)
    sys.exit(code)
