"""The headline figures of a ``make bench`` run, native core beside pure core.

Each benchmark script calls :func:`note` for the figures the issue sets a goal
for; they go, one JSON line each, to the file named by ``SPARSEETY_BENCH_FIGURES``
(``bench/run_all.py`` sets it; nothing is written without it). At the end of
the run :func:`summary` prints them as one table (figure, native, pure,
tshark where it ran the same work, goal) and :func:`markdown` writes the same
rows as the Markdown table the README's benchmark table is copied from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV = "SPARSEETY_BENCH_FIGURES"

#: The cores a figure is measured with (the pure one: ``SPARSEETY_PURE=1``),
#: and tshark, measured on the same work where a figure compares with it.
CORES = ("native", "pure", "tshark")


def note(figure: str, core: str, value: float | None, unit: str, goal: str = "") -> None:
    """Record one figure (``value`` None: not measured, e.g. the run failed)."""
    path = os.environ.get(ENV)
    if not path:
        return
    rec = {"figure": figure, "core": core, "value": value, "unit": unit, "goal": goal}
    with open(path, "a") as fh:
        fh.write(json.dumps(rec) + "\n")


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "ev/s":
        return f"{value:,.0f} ev/s"
    if unit == "s":
        return f"{value:.3f} s"
    return f"{value:,.1f} {unit}"


def _rows(path: Path) -> dict[str, dict[str, str]]:
    """The figures in ``path``, one row per figure in the order first noted: the
    formatted value per core, and the goal."""
    rows: dict[str, dict[str, str]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            row = rows.setdefault(rec["figure"], {"goal": rec.get("goal", "")})
            row[rec["core"]] = _fmt(rec["value"], rec["unit"])
            if rec.get("goal"):
                row["goal"] = rec["goal"]
    return rows


def _columns(rows: dict[str, dict[str, str]]) -> list[str]:
    """The cores measured in this run (tshark only where a figure has it)."""
    return [c for c in CORES if c != "tshark" or any(c in row for row in rows.values())]


def summary(path: Path) -> str:
    """The figures in ``path`` as a text table: one row per figure."""
    rows = _rows(path)
    if not rows:
        return "no figures were recorded"
    cores = _columns(rows)
    width = max(len(f) for f in rows)
    head = "  ".join(f"{core:>16}" for core in cores)
    out = [f"{'figure':<{width}}  {head}  goal"]
    for figure, row in rows.items():
        cells = "  ".join(f"{row.get(core, '-'):>16}" for core in cores)
        out.append(f"{figure:<{width}}  {cells}  {row['goal']}")
    return "\n".join(out)


def markdown(path: Path) -> str:
    """The same rows as :func:`summary`, as a Markdown table ("" when none)."""
    rows = _rows(path)
    if not rows:
        return ""
    cores = _columns(rows)
    out = [
        "| figure | "
        + " | ".join(f"{core} core" if core != "tshark" else core for core in cores)
        + " | goal |",
        "| --- |" + " --- |" * (len(cores) + 1),
    ]
    for figure, row in rows.items():
        cells = " | ".join(row.get(core, "-") for core in cores)
        out.append(f"| {figure} | {cells} | {row['goal'].replace('<=', '≤').replace('>=', '≥')} |")
    return "\n".join(out)
