"""The headline figures of a ``make bench`` run, native core beside pure core.

Each benchmark script calls :func:`note` for the figures the issue sets a goal
for; they go, one JSON line each, to the file named by ``SPARSEETY_BENCH_FIGURES``
(``bench/run_all.py`` sets it; nothing is written without it). At the end of
the run :func:`summary` prints them as one table (figure, native, pure, goal),
from which the README's benchmark table is written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV = "SPARSEETY_BENCH_FIGURES"

#: The cores a figure is measured with (the pure one: ``SPARSEETY_PURE=1``).
CORES = ("native", "pure")


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


def summary(path: Path) -> str:
    """The figures in ``path`` as a table: one row per figure, in the order first noted."""
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
    if not rows:
        return "no figures were recorded"
    width = max(len(f) for f in rows)
    out = [f"{'figure':<{width}}  {'native':>16}  {'pure':>16}  goal"]
    for figure, row in rows.items():
        cells = "  ".join(f"{row.get(core, '-'):>16}" for core in CORES)
        out.append(f"{figure:<{width}}  {cells}  {row['goal']}")
    return "\n".join(out)
