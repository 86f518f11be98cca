"""Run ``python -m sniffer.cli ...`` with cProfile in every thread (bench only).

``SPARSEETY_BENCH_PROFILE=DIR python bench/profiled.py run --port ...``: each
thread's profile is dumped to ``DIR/<pid>/<thread name>.prof`` when it ends (the
daemon joins its threads when it stops). Optionally, with
``SPARSEETY_BENCH_TRACEMALLOC=DIR``, tracemalloc snapshots are taken every 30 s
into ``DIR/snap-N.pickle`` for diffing (what grows per stream).
"""

from __future__ import annotations

import cProfile
import os
import runpy
import sys
import threading
import time
import tracemalloc
from pathlib import Path


def _wrap_threads(out: Path) -> None:
    orig = threading.Thread.run

    def run(self: threading.Thread) -> None:
        prof = cProfile.Profile()
        prof.enable()
        try:
            orig(self)
        finally:
            prof.disable()
            prof.dump_stats(str(out / f"{self.name}.prof"))

    threading.Thread.run = run  # type: ignore[method-assign]


def _snapshots(out: Path, every: float) -> None:
    tracemalloc.start(int(os.environ.get("SPARSEETY_BENCH_TM_FRAMES", "8")))

    def loop() -> None:
        for i in range(10_000):
            time.sleep(every)
            tracemalloc.take_snapshot().dump(str(out / f"snap-{i:03d}.pickle"))

    threading.Thread(target=loop, name="snapshots", daemon=True).start()


def main() -> None:
    prof_dir = os.environ.get("SPARSEETY_BENCH_PROFILE")
    snap_dir = os.environ.get("SPARSEETY_BENCH_TRACEMALLOC")
    main_prof = None
    if prof_dir:
        prof_dir = str(Path(prof_dir) / str(os.getpid()))  # one daemon run per directory
        out = Path(prof_dir)
        out.mkdir(parents=True, exist_ok=True)
        main_prof = cProfile.Profile()
        _wrap_threads(out)
    if snap_dir:
        Path(snap_dir).mkdir(parents=True, exist_ok=True)
        _snapshots(Path(snap_dir), float(os.environ.get("SPARSEETY_BENCH_SNAP_EVERY", "30")))
    sys.argv = ["sparseety", *sys.argv[1:]]
    if main_prof is not None:
        main_prof.enable()
    try:
        runpy.run_module("sniffer.cli", run_name="__main__")
    except SystemExit:
        pass
    finally:
        if main_prof is not None and prof_dir:
            main_prof.disable()
            main_prof.dump_stats(str(Path(prof_dir) / "main.prof"))


if __name__ == "__main__":
    main()
