"""Replay throughput vs tshark's HTTP body extraction on the same capture.

Records bench/out/bench.pcap first if it is missing (real SSE streams from the
fixture server on loopback; needs root for dumpcap). Prints both times, the
ratio and the rates; the issue's target is replay >= 3x faster than tshark.

    python bench/bench_replay.py [--capture FILE] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.capture import OUT, record  # noqa: E402
from sniffer.capture.pcap import read_capture  # noqa: E402


def _server_port(path: Path) -> int:
    for seg in read_capture(path):
        if seg.flags & 0x02 and not seg.flags & 0x10:  # SYN
            return seg.dport
    raise SystemExit(f"{path}: no SYN found")


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _timed(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one child process."""
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0, _children_cpu() - cpu0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capture", type=Path, default=OUT / "bench.pcap")
    ap.add_argument("--runs", type=int, default=3)
    ns = ap.parse_args()
    if not ns.capture.exists():
        print(f"recording {ns.capture} …", flush=True)
        record(ns.capture)
    if shutil.which("tshark") is None:
        print("tshark not installed: apt-get install tshark")
        return 1
    reader = read_capture(ns.capture)
    packets = sum(1 for _ in reader)
    port = _server_port(ns.capture)
    tshark = [
        "tshark", "-r", str(ns.capture), "-d", f"tcp.port=={port},http",
        "-Y", "http", "-T", "fields", "-e", "http.file_data",
    ]  # fmt: skip
    best: dict[str, tuple[float, float]] = {}
    events = 0
    streams = 0
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(ns.runs):
            db = os.path.join(tmp, f"r{run}.db")
            ours = [
                sys.executable,
                "-m",
                "sniffer.cli",
                "replay",
                "-q",
                "--json",
                str(ns.capture),
                "--db",
                db,
            ]
            for name, cmd in (("tshark", tshark), ("sparseety", ours)):
                wall, cpu = _timed(cmd)
                if name not in best or wall < best[name][0]:
                    best[name] = (wall, cpu)
            out = subprocess.run(
                [sys.executable, "-m", "sniffer.cli", "streams", "--db", db, "--json"],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            streams = len(out.stdout.splitlines())
            import sqlite3

            with sqlite3.connect(db) as con:
                events = con.execute("select count(*) from chunks").fetchone()[0]
    tw, tc = best["tshark"]
    ow, oc = best["sparseety"]
    print(
        f"capture: {ns.capture} ({packets:,} packets, {streams:,} LLM streams, "
        f"{events:,} chunk events)"
    )
    print(f"{'':24s} {'wall s':>8s} {'cpu s':>8s} {'packets/s':>12s} {'events/s':>12s}")
    print(f"{'tshark http.file_data':24s} {tw:8.2f} {tc:8.2f} {packets / tw:12,.0f} {'':>12s}")
    print(
        f"{'sparseety replay→SQLite':24s} {ow:8.2f} {oc:8.2f} {packets / ow:12,.0f} "
        f"{events / ow:12,.0f}"
    )
    print(f"speed-up (best of {ns.runs}, wall): {tw / ow:.2f}x   (target >= 3x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
