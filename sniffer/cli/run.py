"""``sparseety run``: the live sidecar daemon (click layer over :mod:`sniffer.runtime.daemon`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from sniffer.cli.common import env_database, few_collections, parse_labels, parse_pairs
from sniffer.runtime.config import (
    OPTIONS,
    Config,
    ConfigError,
    Flag,
    Option,
    load_config,
    render_toml,
)

__all__ = ["build_config", "config_options", "run"]

F = TypeVar("F", bound=Callable[..., Any])


def build_config(config_path: str | None, options: dict[str, Any]) -> tuple[Config, dict[str, Any]]:
    """The effective config: defaults ← TOML file ← ``$SPARSEETY_DB`` (the
    database, as for every command) ← CLI flags. ``options`` are the ``run``
    command's parameters (:attr:`Option.dest <sniffer.runtime.config.Option.dest>`
    → value). Returns the config and the overrides (re-applied on SIGHUP).
    Raises :class:`ConfigError`."""
    overrides: dict[str, Any] = {}
    env_db = env_database()
    if env_db is not None:
        overrides["database"] = env_db
    try:
        for opt in OPTIONS:
            flag = opt.flag
            if flag is not None:
                value = options.get(opt.dest)
                if value is not None:
                    _override(overrides, opt, flag, value)
    except click.BadParameter as exc:
        raise ConfigError(f"{exc.param_hint} {exc.message}") from None
    base = load_config(config_path)
    return base.with_overrides(overrides), overrides


def _override(overrides: dict[str, Any], opt: Option, flag: Flag, value: Any) -> None:
    """Put what ``flag`` was given (``value``, not None) into ``overrides``."""
    if flag.sets is not None:  # a switch
        if value:
            overrides[opt.name] = flag.sets
    elif flag.convert is not None:
        if value:
            try:
                overrides[opt.name] = flag.convert(value)
            except ValueError as exc:
                raise ConfigError(f"{flag.name}: {exc}") from None
    elif not flag.multiple:
        overrides[opt.name] = value
    elif not value:
        pass  # a repeatable flag not given
    elif opt.kind == "labels":
        overrides[opt.name] = parse_labels(value)
    elif flag.form is not None:
        overrides[opt.name] = parse_pairs(value, flag.name, flag.form, header=flag.header)
    else:
        overrides[opt.name] = tuple(value)


def _help(opt: Option, flag: Flag) -> str:
    """The flag's help, with the ``[default: …]`` it shows."""
    shown = flag.shown
    if shown is None:
        default = opt.default
        if flag.sets is not None or default in (None, "", ()):
            shown = ""
        elif isinstance(default, float):
            shown = f"{default:g}"
        elif isinstance(default, tuple):
            shown = ", ".join(map(str, default))
        else:
            shown = str(default)
    if not shown:
        return flag.help
    return f"{flag.help}  [default: {shown}]" if flag.help else f"[default: {shown}]"


def _click_option(opt: Option, flag: Flag) -> Callable[[F], F]:
    """The click option of one :class:`Option`'s flag."""
    names = [flag.name, *([flag.short] if flag.short else []), opt.dest]
    if flag.sets is not None:
        return click.option(*names, is_flag=True, help=_help(opt, flag))
    ptype: Any = None  # text: a converted value (--retention 30d), a string option
    if flag.convert is not None:
        pass
    elif opt.choices:
        ptype = click.Choice(opt.choices)
    elif flag.range is not None:
        ptype = click.FloatRange(*flag.range)
    elif opt.kind in ("int", "ints"):
        ptype = int
    elif opt.kind == "float":
        ptype = float
    return click.option(
        *names,
        type=ptype,
        multiple=flag.multiple,
        metavar=flag.metavar or flag.form,
        help=_help(opt, flag),
    )


def config_options(f: F) -> F:
    """Every option's flag (:data:`~sniffer.runtime.config.OPTIONS`), in field order."""
    for opt in reversed(OPTIONS):
        if opt.flag is not None:
            f = _click_option(opt, opt.flag)(f)
    return f


def _capture_errors() -> tuple[type[Exception], ...]:
    """What a capture that cannot open or go on raises: the eBPF loader (ctypes,
    ~3 ms of start-up) is imported only to match an exception, or to capture
    with it."""
    from sniffer.capture.afpacket import CaptureError
    from sniffer.capture.ebpf import EbpfError

    return CaptureError, EbpfError


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    help="TOML config file (see systemd/sparseety.toml.example). Flags override it.",
)
@config_options
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
    few_collections()
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

    from sniffer.llm.registry import TokenizerLoadError
    from sniffer.record.otlp_setup import OtlpUnavailable
    from sniffer.runtime.daemon import Daemon
    from sniffer.runtime.features import build_features
    from sniffer.runtime.log import Log
    from sniffer.store.files import InsecureDatabaseFile
    from sniffer.store.lite import ReadOnlyStore

    try:
        log = Log(cfg.log_level)
        try:
            features = build_features(cfg, log)
        except (
            InsecureDatabaseFile,
            ReadOnlyStore,
            TokenizerLoadError,
            OtlpUnavailable,
            ValueError,
        ) as exc:
            click.echo(f"sparseety: {exc}", err=True)
            sys.exit(2)
        except OSError as exc:
            click.echo(f"sparseety: cannot serve metrics on {cfg.metrics_listen}: {exc}", err=True)
            sys.exit(1)
        code = Daemon(cfg, overrides=overrides, log=log, features=features).run()
    except _capture_errors() as exc:  # (evaluated only when something is raised)
        click.echo(f"sparseety: cannot capture: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        click.echo(f"sparseety: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)
    sys.exit(code)
