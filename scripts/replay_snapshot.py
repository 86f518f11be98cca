#!/usr/bin/env python3
"""Replay every bundled capture and the peer corpus; dump what the store holds.

For a before/after comparison of a change that must not change behaviour:

    PYTHONPATH=/path/to/old/tree python3 scripts/replay_snapshot.py /tmp/before
    PYTHONPATH=$PWD python3 scripts/replay_snapshot.py /tmp/after
    diff -r /tmp/before /tmp/after

For each capture (``pcaps/**/*.pcap`` and the vendored peer corpus
``tests/data/peer-pcaps/zeek-http``, found under the imported ``sniffer``
package's tree or given with ``--root``), it replays the file in one process
(so row ids are deterministic) into a fresh SQLite file, then writes
``NAME.export.jsonl`` (``sparseety export --format jsonl``), ``NAME.summary``
(the replay summary without timings) and ``NAME.TABLE.tsv`` for the streams,
errors, chunks and connections tables. Captures are named by their file name
(so a fixture moved to another folder compares with its old self).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import tempfile
from pathlib import Path
from typing import Any

from click.testing import CliRunner

import sniffer
from sniffer.cli import main as cli_main

TABLES = (
    "streams",
    "errors",
    "chunks",
    "connections",
    "stream_tokens",
    "choice_tokens",
    "token_anomalies",
)


def _untimed(v: Any) -> Any:
    """The replay summary without wall-clock figures and paths."""
    if isinstance(v, dict):
        return {
            k: _untimed(x)
            for k, x in sorted(v.items())
            if "second" not in k and k not in ("path", "db", "file")
        }
    if isinstance(v, list):
        return [_untimed(x) for x in v]
    return v


def captures(root: Path) -> list[Path]:
    found = [p for p in (root / "pcaps").rglob("*.pcap") if p.is_file()]
    for peer in (root / "tests" / "data" / "peer-pcaps", Path("/work/shared/peer-pcaps")):
        if peer.is_dir():
            found += [
                p
                for p in peer.rglob("*")
                if p.is_file() and p.suffix in (".pcap", ".pcapng", ".gz")
            ]
            break
    return sorted(found, key=lambda p: p.name)


def dump(path: Path, out: Path, work: Path) -> None:
    db = work / f"{path.name}.db"
    # As a user runs it (tokens, redaction, defaults), in one process.
    res = CliRunner().invoke(
        cli_main, ["replay", str(path), "--db", str(db), "-q", "-j", "1", "--json"]
    )
    summary = json.loads(res.output)
    (out / f"{path.name}.summary").write_text(repr(_untimed(summary)) + f"\nexit {res.exit_code}\n")
    res = CliRunner().invoke(cli_main, ["export", "--db", str(db), "--format", "jsonl"])
    if res.exit_code != 0:
        raise SystemExit(f"{path}: export failed: {res.output}")
    (out / f"{path.name}.export.jsonl").write_text(res.output)
    con = sqlite3.connect(db)
    try:
        for table in TABLES:
            cur = con.execute(f"SELECT * FROM {table} ORDER BY rowid")
            cols = [c[0] for c in cur.description]
            lines = ["\t".join(cols)]
            lines += ["\t".join(repr(v) for v in row) for row in cur]
            (out / f"{path.name}.{table}.tsv").write_text("\n".join(lines) + "\n")
    finally:
        con.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="folder for the dumps (created)")
    ap.add_argument(
        "--root",
        type=Path,
        default=Path(sniffer.__file__).resolve().parent.parent,
        help="tree whose captures to replay (default: the imported sniffer's tree)",
    )
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    paths = captures(ns.root)
    print(f"sniffer from {Path(sniffer.__file__).parent}; {len(paths)} captures", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="sparseety-snap-") as tmp:
        for path in paths:
            dump(path, ns.out, Path(tmp))
    return 0


if __name__ == "__main__":
    sys.exit(main())
