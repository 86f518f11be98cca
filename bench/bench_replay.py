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
import sqlite3
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


def _timed(cmd: list[str], **kw: object) -> tuple[float, float]:
    """Wall and CPU seconds of one child process."""
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    subprocess.run(
        cmd,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        **kw,  # type: ignore[call-overload]
    )
    return time.perf_counter() - t0, _children_cpu() - cpu0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capture", type=Path, default=OUT / "bench.pcap")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--python",
        help="Interpreter that replays, with its installed sparseety (e.g. a venv holding the "
        "compiled wheel). Default: this one, on this tree's source.",
    )
    ns = ap.parse_args()
    ns.capture = ns.capture.resolve()  # the replays run in a scratch folder
    # Where the replay's sniffer comes from: this tree, or what --python has installed.
    env = dict(os.environ)
    if ns.python:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    python = ns.python or sys.executable
    build = subprocess.run(
        [python, "-c", "import sniffer; print(sniffer.build_info()['build'], sniffer.__file__)"],
        env=env,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    print(f"build: {build}", flush=True)
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
    base = [python, "-m", "sniffer.cli", "replay", "-q", "--json", str(ns.capture)]
    variants = {
        "tshark http.file_data": tshark,
        "replay -j1 --no-tokens": [*base, "-j", "1", "--no-tokens"],
        "replay -j1 (tokens on)": [*base, "-j", "1"],
        "replay --no-tokens": [*base, "--no-tokens"],
        "replay (tokens on)": base,
    }
    best: dict[str, tuple[float, float]] = {}
    events = 0
    streams = 0
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(ns.runs):
            for name, cmd in variants.items():
                db = os.path.join(tmp, f"r{run}-{len(best)}.db")
                if name.startswith("replay"):
                    cmd = [*cmd, "--db", db]
                wall, cpu = _timed(cmd, env=env, cwd=tmp)
                if name not in best or wall < best[name][0]:
                    best[name] = (wall, cpu)
                if name.startswith("replay"):
                    with sqlite3.connect(db) as con:
                        events = con.execute("select count(*) from chunks").fetchone()[0]
                        streams = con.execute(
                            "select count(*) from streams where dialect != 'http'"
                        ).fetchone()[0]
                    os.remove(db)
    print(
        f"capture: {ns.capture} ({packets:,} packets, {streams:,} LLM streams, "
        f"{events:,} chunk events); best of {ns.runs} runs, {os.cpu_count()} CPUs"
    )
    print(f"{'':26s} {'wall s':>8s} {'cpu s':>8s} {'packets/s':>12s} {'events/s':>12s}")
    for name, (wall, cpu) in best.items():
        print(
            f"{name:26s} {wall:8.2f} {cpu:8.2f} {packets / wall:12,.0f} "
            f"{events / wall if name.startswith('replay') else 0:12,.0f}"
        )
    tw = best["tshark http.file_data"][0]
    for name in ("replay -j1 --no-tokens", "replay --no-tokens", "replay (tokens on)"):
        print(f"speed-up vs tshark, {name}: {tw / best[name][0]:.2f}x   (target >= 3x)")
    for suffix in (" -j1", ""):
        off = best[f"replay{suffix} --no-tokens"][0]
        on = best[f"replay{suffix} (tokens on)"][0]
        print(
            f"tokenization adds {100 * (on - off) / off:.0f}% to replay{suffix} time   "
            "(target <= 25%)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
