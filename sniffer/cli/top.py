"""``sparseety top``: the live view on a node (click layer over :mod:`sniffer.runtime.top`)."""

from __future__ import annotations

import sys

import click

from sniffer.cli.common import (
    db_option,
    env_database,
    fail,
    library_errors,
    make_registry,
    open_store,
    tokenizer_options,
)

__all__ = ["top"]


@click.command()
@db_option
@click.option("--node", metavar="NAME", help="Only streams this sidecar captured.")
@click.option(
    "--metrics",
    "metrics_listen",
    metavar="HOST:PORT|URL",
    help="The daemon's metrics listener ('run --metrics-listen'): drops, queue depth, "
    "last flush, sample rate. Default: the [metrics] listen of --config, else none.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, exists=True),
    help="The daemon's TOML config: its database (unless --db is given), node and "
    "metrics listener.",
)
@click.option(
    "--sort",
    type=click.Choice(["age", "chunks", "tok/s", "ttft", "label", "model", "id"]),
    default="age",
    show_default=True,
    help="Initial order of the open streams ('s' cycles, 'r' reverses).",
)
@click.option(
    "--filter",
    "filter_text",
    default="",
    help="Only open streams whose label or model contains this ('/' changes it).",
)
@click.option(
    "--once",
    is_flag=True,
    help="Print one frame and exit (plain text unless stdout is a terminal).",
)
@click.option(
    "--interval",
    type=click.FloatRange(0.2, 60),
    default=1.0,
    show_default=True,
    help="Seconds between frames.",
)
@tokenizer_options
def top(
    db: str,
    node: str | None,
    metrics_listen: str | None,
    config_path: str | None,
    sort: str,
    filter_text: str,
    once: bool,
    interval: float,
    tokenizers: tuple[str, ...],
    default_tokenizer: str | None,
) -> None:
    """A live view of the node, refreshed every second.

    \b
    Open streams: label, model, age, chunks so far, tokens/s (the stored text
    with the model's tokenizer), TTFT. Per label, the streams closed in the
    last minute: stream rate, incomplete ones by state, TTFT, inter-chunk
    latency and tokens/s (p50/p90/p99). From the daemon's /metrics when
    given: kernel, queue and OTLP drops, queue depth, last flush, sample
    rate. Drops and errors are shown in red.

    \b
    Keys: s / S next / previous sort order, r reverse, / filter by label or
    model (enter applies, esc cancels; esc clears it), q quit.

    \b
    Example:
      sparseety top --db /var/lib/sparseety/sparseety.db --metrics 127.0.0.1:9464
      sparseety top --config /etc/sparseety/sparseety.toml
      sparseety top --db sparseety.db --once > frame.txt
    """
    from sniffer.runtime.top import TopSource, View, metrics_url, render, render_plain

    if config_path is not None:
        from sniffer.runtime.config import ConfigError, load_config

        try:
            cfg = load_config(config_path)
        except ConfigError as exc:
            fail(str(exc), 2)
        ctx = click.get_current_context()
        if (
            ctx.get_parameter_source("db")
            in (
                click.core.ParameterSource.DEFAULT,
                click.core.ParameterSource.DEFAULT_MAP,
            )
            and env_database() is None
        ):
            db = cfg.database
        if metrics_listen is None and cfg.metrics:
            metrics_listen = cfg.metrics_listen
    if not once and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise click.UsageError("top needs a terminal; use --once to print one frame")
    url = None
    if metrics_listen:
        try:
            url = metrics_url(metrics_listen)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--metrics") from None
    view = View(sort=sort, filter=filter_text)
    registry = make_registry(tokenizers, default_tokenizer)
    with library_errors():
        source = TopSource(open_store(db), source=db, node=node, registry=registry, metrics=url)
        if once:
            frame = source.frame()
            if sys.stdout.isatty():
                from rich.console import Console

                console = Console()
                console.print(render(frame, view, width=console.size.width))
            else:
                click.echo(render_plain(frame, view), nl=False)
            return
        from sniffer.runtime.top import run

        run(source, view, interval=interval)
