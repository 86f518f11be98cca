"""Replay throughput vs tshark's HTTP body extraction on the same capture.

Records bench/out/bench.pcap first if it is missing (real SSE streams from the
fixture server on loopback; needs root for dumpcap). Runs, in the same run of
this script: tshark, ``sparseety replay`` with the default jobs and with
``--jobs 1`` (tokens and redaction on, default settings; ``--no-tokens`` adds
the same two without tokenization), each with the native core and with the
pure one (``SPARSEETY_PURE=1``; ``--no-pure`` leaves those out). Prints, best
of ``--runs`` by wall time: wall and CPU seconds (user + sys of the process
and its workers), the speed-up over tshark (wall and CPU), and the cost per
chunk event (µs of wall and of CPU); and, measured before each run, the
parallel headroom: how much faster two processes finish a fixed amount of
work than one (:func:`parallel_headroom`). The issue's targets (issue #25): replay
with the default jobs >= 5x tshark (stretch 8x), in one process >= 3x. On a
shared machine trust the CPU columns more than the wall ones.

    python bench/bench_replay.py [--capture FILE] [--runs 3] [--no-tokens] [--no-pure]
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
from bench.figures import note  # noqa: E402
from sniffer.capture.pcap import read_capture  # noqa: E402
from sniffer.runtime.replay import default_jobs  # noqa: E402


def _server_port(path: Path) -> int:
    for seg in read_capture(path):
        if seg.flags & 0x02 and not seg.flags & 0x10:  # SYN
            return seg.dport
    raise SystemExit(f"{path}: no SYN found")


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _spin() -> float:
    """A fixed amount of pure-Python CPU work; returns its CPU seconds."""
    t = time.process_time()
    x = 0
    for i in range(3_000_000):
        x += i
    return time.process_time() - t


def parallel_headroom() -> float:
    """How many CPUs' worth of work two processes get done at once right now,
    against one (2.0: two free CPUs; 1.0: none to spare). On a machine shared
    with other sessions (Linux autogroups share the CPUs per session, not per
    process), a second replay worker may add no speed at all: then ``-j``
    wall figures say nothing about parallel replay, only the CPU ones do."""
    t0 = time.perf_counter()
    _spin()
    one = time.perf_counter() - t0
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        _spin()
        os._exit(0)
    _spin()
    os.waitpid(pid, 0)
    both = time.perf_counter() - t0
    return 2 * one / both if both > 0 else 0.0


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


# A driver: one optional measurement per flag, printed in order (C901).
def main() -> int:  # noqa: C901
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capture", type=Path, default=OUT / "bench.pcap")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--no-tokens", action="store_true", help="also time both replays with --no-tokens"
    )
    ap.add_argument("--no-pure", action="store_true", help="leave out the pure core's replays")
    ap.add_argument(
        "--python",
        help="Interpreter that replays, with its installed sparseety (e.g. a venv holding the "
        "built wheel). Default: this one, on this tree's source.",
    )
    ns = ap.parse_args()
    ns.capture = ns.capture.resolve()  # the replays run in a scratch folder
    # Where the replay's sniffer comes from: this tree, or what --python has installed.
    env = dict(os.environ)
    if ns.python:
        env.pop("PYTHONPATH", None)
    else:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.pop("SPARSEETY_PURE", None)
    pure_env = {**env, "SPARSEETY_PURE": "1"}
    python = ns.python or sys.executable
    info = "import sniffer as s; print(s.core_name(), s.__file__)"
    for label, e in (("", env), (" (SPARSEETY_PURE=1)", pure_env)):
        running = subprocess.run(
            [python, "-c", info],
            env=e,
            cwd=tempfile.gettempdir(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        print(f"core{label}: {running}", flush=True)
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
    jobs = default_jobs()
    variants = {
        "tshark http.file_data": tshark,
        f"replay (default -j{jobs})": base,
        "replay -j1": [*base, "-j", "1"],
    }
    if ns.no_tokens:
        variants[f"replay -j{jobs} --no-tokens"] = [*base, "--no-tokens"]
        variants["replay -j1 --no-tokens"] = [*base, "-j", "1", "--no-tokens"]
    if not ns.no_pure:
        for name in [n for n in variants if n.startswith("replay")]:
            variants[f"pure {name}"] = variants[name]
    best: dict[str, tuple[float, float]] = {}
    events = 0
    streams = 0
    headroom: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(ns.runs):
            headroom.append(parallel_headroom())
            for i, (name, cmd) in enumerate(variants.items()):
                db = os.path.join(tmp, f"r{run}-{i}.db")
                replays = name.startswith(("replay", "pure"))
                if replays:
                    cmd = [*cmd, "--db", db]
                e = pure_env if name.startswith("pure") else env
                wall, cpu = _timed(cmd, env=e, cwd=tmp)
                if name not in best or wall < best[name][0]:
                    best[name] = (wall, cpu)
                if replays:
                    with sqlite3.connect(db) as con:
                        events = con.execute("select count(*) from chunks").fetchone()[0]
                        streams = con.execute(
                            "select count(*) from streams where dialect != 'http'"
                        ).fetchone()[0]
                    for f in Path(tmp).glob(f"{Path(db).name}*"):
                        f.unlink()
    print(
        f"capture: {ns.capture} ({packets:,} packets, {streams:,} LLM streams, "
        f"{events:,} chunk events); best of {ns.runs} runs by wall, {os.cpu_count()} CPUs"
    )
    print(
        "parallel headroom (2 processes vs 1, per run): "
        + ", ".join(f"{h:.2f}x" for h in headroom)
        + ("   (below 1.5x: other work holds the CPUs; trust the CPU columns)"
           if min(headroom) < 1.5 else "")
    )  # fmt: skip
    tw, tc = best["tshark http.file_data"]
    print(
        f"{'':33s} {'wall s':>7s} {'cpu s':>7s} {'x tshark':>8s} {'x (cpu)':>8s} "
        f"{'µs/event':>9s} {'cpu µs/ev':>9s}"
    )
    for name, (wall, cpu) in best.items():
        per = f"{1e6 * wall / events:9.1f} {1e6 * cpu / events:9.1f}" if events else ""
        print(f"{name:33s} {wall:7.2f} {cpu:7.2f} {tw / wall:8.2f} {tc / cpu:8.2f} {per}")
    for name in variants:
        if name.startswith(("replay", "pure")) and "no-tokens" not in name:
            goal = ">= 3x" if name.endswith("-j1") else ">= 5x (stretch 8x)"
            print(f"speed-up vs tshark, {name}: {tw / best[name][0]:.2f}x   (target {goal})")
    for core, prefix in (("native", ""), ("pure", "pure ")):
        for figure, name, goal in (
            (f"replay x tshark, default -j{jobs}", f"replay (default -j{jobs})", ">= 5x (8x)"),
            ("replay x tshark, one process", "replay -j1", ">= 3x"),
        ):
            got = best.get(prefix + name)
            note(figure, core, tw / got[0] if got else None, "x", goal)
            note(f"{figure} (CPU)", core, tc / got[1] if got else None, "x", goal)
        got = best.get(f"{prefix}replay -j1")
        if got and events:
            note("replay CPU per chunk event, one process", core, 1e6 * got[1] / events, "µs")
    # The seconds behind the ratios, tshark's beside (same capture, same run).
    for figure, name in (
        (f"replay of the benchmark capture, default -j{jobs} (wall)", f"replay (default -j{jobs})"),
        ("replay of the benchmark capture, one process (wall)", "replay -j1"),
    ):
        for core, prefix in (("native", ""), ("pure", "pure ")):
            got = best.get(prefix + name)
            note(figure, core, got[0] if got else None, "s")
        note(figure, "tshark", tw, "s")
    if ns.no_tokens:
        for on, off in ((f"replay (default -j{jobs})", f"replay -j{jobs} --no-tokens"),
                        ("replay -j1", "replay -j1 --no-tokens")):  # fmt: skip
            t_on, t_off = best[on][0], best[off][0]
            print(
                f"tokenization adds {100 * (t_on - t_off) / t_off:.0f}% to {on} time   "
                "(target <= 25%)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
