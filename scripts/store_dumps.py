"""Replay every capture in pcaps/ into fresh stores and dump them, to compare two trees.

For each capture, two stores: a file path (the writer on the standard library's
driver) and a ``sqlite:///…?timeout=5`` URL (the writer on a SQLAlchemy engine),
each with the token pass, ``--node n1 -j 1 --label 8000=base``. Each store is
dumped twice: ``sqlite3.Connection.iterdump`` (``.dump``) and the ``sqlite3``
shell's ``.dump`` (``.cli``, in ``sqlite_master`` order), when the shell exists.

    python scripts/store_dumps.py TREE OUTDIR         # dumps of the code in TREE
    python scripts/store_dumps.py --compare DIR1 DIR2  # exit 1 if any dump differs

Make the first set from the tree at the branch point (``git archive BASE | tar -x
-C /tmp/base``), the second from yours: a change that keeps the stored data
leaves every dump byte-identical.
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path


def dump_all(tree: Path, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    caps = sorted(p for p in (tree / "pcaps").rglob("*.pcap*") if p.is_file())
    env = dict(os.environ, PYTHONPATH=str(tree))
    shell = shutil.which("sqlite3")
    for cap in caps:
        name = str(cap.relative_to(tree / "pcaps")).replace("/", "__")
        for mode in ("file", "url"):
            db = out / f"{name}.{mode}.db"
            for suffix in ("", "-wal", "-shm"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)
            target = str(db) if mode == "file" else f"sqlite:///{db}?timeout=5"
            cmd = [sys.executable, "-m", "sniffer", "replay", str(cap), "--db", target]
            cmd += ["--node", "n1", "-j", "1", "-q", "--label", "8000=base"]
            subprocess.run(cmd, env=env, cwd=tree, capture_output=True, check=False)
            conn = sqlite3.connect(db)
            try:
                text = "".join(line + "\n" for line in conn.iterdump())
            finally:
                conn.close()
            (out / f"{name}.{mode}.dump").write_text(text)
            if shell is not None:
                cli = subprocess.run([shell, str(db), ".dump"], capture_output=True, check=True)
                (out / f"{name}.{mode}.cli").write_bytes(cli.stdout)
    return len(caps)


def compare(a: Path, b: Path) -> int:
    names = sorted(p.name for p in a.iterdir() if p.suffix in (".dump", ".cli"))
    differ = [n for n in names if not (b / n).exists() or not filecmp.cmp(a / n, b / n, False)]
    for n in differ:
        print(f"differs: {n}")
    print(f"{len(names)} dumps compared, {len(differ)} differ")
    return 1 if differ or not names else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", action="store_true", help="Compare two dump directories.")
    ap.add_argument("first", type=Path)
    ap.add_argument("second", type=Path)
    args = ap.parse_args()
    if args.compare:
        return compare(args.first, args.second)
    print(f"{dump_all(args.first.resolve(), args.second.resolve())} captures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
