#!/usr/bin/env python3
"""Replay captures with two source trees and compare what each one stores, byte for byte.

For every capture (default: every ``pcaps/*.pcap``) and each tree, this runs
``python -m sniffer.cli replay --json`` into a fresh SQLite database, then
``export --format jsonl``, and dumps every table of the database (all columns,
in row order). It compares, between the trees:

* the export (JSONL) and every table dump, byte for byte;
* the replay summary (``--json``), without its timing fields;
* the exit code.

Example (the tree before a refactor against this one)::

    git archive HEAD~3 | (mkdir -p /tmp/base && tar -x -C /tmp/base)
    python3 scripts/compare_replay.py --baseline /tmp/base

Exit code 0 when every capture matches, 1 otherwise (the differences are
printed). Tokenization is part of a replay; pass ``--no-tokens`` to skip it.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

#: Summary fields that measure time, not what was stored.
TIMING = ("seconds", "packets_per_second", "chunk_events_per_second")

HERE = Path(__file__).resolve().parent.parent


def _cli(tree: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=tree, HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "sniffer.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        check=False,
    )


def _tables(db: str) -> dict[str, str]:
    out: dict[str, str] = {}
    con = sqlite3.connect(db)
    try:
        query = "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
        names = [r[0] for r in con.execute(query)]
        for name in names:
            rows = con.execute(f'SELECT * FROM "{name}" ORDER BY rowid').fetchall()
            out[name] = "\n".join(json.dumps(r, ensure_ascii=False) for r in rows)
    finally:
        con.close()
    return out


def record(tree: str, capture: str, workdir: str, extra: list[str]) -> dict[str, object]:
    """Everything one tree stores and says for one capture."""
    db = os.path.join(workdir, "replay.db")
    r = _cli(tree, "replay", "-q", "--json", os.path.abspath(capture), "--db", db, *extra)
    try:
        summary = json.loads(r.stdout)
    except ValueError:
        summary = {"unparsed stdout": r.stdout, "stderr": r.stderr}
    if isinstance(summary, dict):
        for key in TIMING:
            summary.pop(key, None)
        summary.pop("file", None)
    export = _cli(tree, "export", "--db", db, "--format", "jsonl")
    return {
        "exit_code": r.returncode,
        "summary": json.dumps(summary, sort_keys=True),
        "export": export.stdout,
        "export_exit_code": export.returncode,
        **{f"table {k}": v for k, v in _tables(db).items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="source tree of the reference version")
    ap.add_argument("--candidate", default=str(HERE), help="source tree to check (default: this)")
    ap.add_argument("--no-tokens", action="store_true", help="replay with --no-tokens")
    ap.add_argument("captures", nargs="*", help="default: pcaps/*.pcap of the candidate tree")
    ns = ap.parse_args()
    captures = ns.captures or sorted(glob.glob(os.path.join(ns.candidate, "pcaps", "*.pcap")))
    extra = ["--no-tokens"] if ns.no_tokens else []
    failed = 0
    for capture in captures:
        results = []
        for tree in (ns.baseline, ns.candidate):
            with tempfile.TemporaryDirectory(prefix="sparseety-cmp-") as tmp:
                results.append(record(tree, capture, tmp, extra))
        base, cand = results
        diffs = [k for k in sorted(set(base) | set(cand)) if base.get(k) != cand.get(k)]
        digest = hashlib.sha256(
            "".join(f"{k}\0{cand[k]}\0" for k in sorted(cand)).encode()
        ).hexdigest()[:12]
        name = os.path.basename(capture)
        if diffs:
            failed += 1
            print(f"DIFFER {name}: {', '.join(diffs)}")
        else:
            n_export = str(cand["export"]).count("\n")
            print(f"same   {name}: exit {cand['exit_code']}, {n_export} export lines, sha {digest}")
    print(f"{len(captures) - failed}/{len(captures)} captures byte-identical")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
