"""Rows out of a command: one helper and the output options it reads, as in
sqlite-utils' ``cli.py``.

A listing command takes ``@output_options()`` (``--json``, ``--csv``,
``--column``) and receives one ``output: RowOutput`` argument in their place;
it fetches its rows with one library call and hands them to
:func:`print_rows` with its own text table::

    @output_options()
    def nodes(db: str, output: RowOutput) -> None:
        rows = list_nodes(open_store(db))
        print_rows(rows, output, table=_nodes_table)

``--json`` prints one JSON object per line; ``--csv`` a header and one line
per row; ``--column NAME`` (repeat) keeps those keys, in that order, in either.
Without them the command's table is printed.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["RowOutput", "output_options", "print_rows"]

Row = Mapping[str, Any]


@dataclass(frozen=True)
class RowOutput:
    """How a command prints its rows (from ``--json``/``--csv``/``--column``)."""

    json: bool = False
    csv: bool = False
    columns: tuple[str, ...] = ()


def output_options(json_help: str = "One JSON object per line.") -> Callable[[F], F]:
    """``--json``, ``--csv`` and ``--column`` on a command, handed to it as one
    ``output: RowOutput`` keyword argument."""

    def decorate(f: F) -> F:
        @functools.wraps(f)
        def command(
            *args: Any, as_json: bool, as_csv: bool, columns: tuple[str, ...], **kw: Any
        ) -> Any:
            if as_json and as_csv:
                raise click.UsageError("--json and --csv cannot be combined")
            if columns and not (as_json or as_csv):
                raise click.UsageError("--column needs --json or --csv")
            return f(*args, output=RowOutput(as_json, as_csv, tuple(columns)), **kw)

        options = (
            click.option("--json", "as_json", is_flag=True, help=json_help),
            click.option("--csv", "as_csv", is_flag=True, help="CSV: a header, one line per row."),
            click.option(
                "--column",
                "-c",
                "columns",
                multiple=True,
                metavar="NAME",
                help="Only this column in --json/--csv output (repeat; in this order).",
            ),
        )
        wrapped: Any = command
        for option in reversed(options):
            wrapped = option(wrapped)
        return wrapped

    return decorate


def print_rows(
    rows: Sequence[Row], output: RowOutput, *, table: Callable[[Sequence[Row]], None]
) -> None:
    """Print ``rows`` as ``output`` asks: JSON lines, CSV, or the command's ``table``."""
    if not (output.json or output.csv):
        table(rows)
        return
    columns = _columns(rows, output.columns)
    if output.json:
        for r in rows:
            click.echo(json.dumps(_pick(r, columns) if output.columns else r, default=str))
        return
    from csv import writer as csv_writer

    writer = csv_writer(sys.stdout, lineterminator="\n")
    if columns:
        writer.writerow(columns)
    for r in rows:
        writer.writerow([_cell(r.get(c)) for c in columns])


def _columns(rows: Sequence[Row], wanted: tuple[str, ...]) -> list[str]:
    """``wanted`` checked against the rows' keys, or every key of the first row."""
    if not rows:
        return list(wanted)
    known = list(rows[0])
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise click.UsageError(
            f"no column {', '.join(map(repr, unknown))} (columns: {', '.join(known)})"
        )
    return list(wanted) if wanted else known


def _pick(r: Row, columns: list[str]) -> dict[str, Any]:
    return {c: r.get(c) for c in columns}


def _cell(v: Any) -> Any:
    """A CSV cell: None is empty, containers as JSON."""
    if isinstance(v, dict | list | tuple):
        return json.dumps(v, default=str)
    return v
