"""`make bench`: run every benchmark script in bench/ and print its figures.

Benchmarks are not tests: they measure and print, and never fail the build on a
figure. Scripts that need root (live capture, eBPF) say so and are skipped
when not root. The figures the issue sets goals for (replay against tshark,
live CPU per chunk event and peak RSS, the zero-drop ceiling, start-up) are
measured with the native and the pure core in the same run and printed at
the end as one table (``bench/figures.py``; also kept in
``bench/out/figures.jsonl``, and as Markdown in ``bench/out/figures.md``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))

from bench.figures import ENV, markdown, summary  # noqa: E402

FIGURES = BENCH / "out" / "figures.jsonl"
ORDER = [
    "bench_startup.py",
    "bench_replay.py",
    "bench_h2.py",
    "bench_tokens.py",
    "bench_verify.py",
    "bench_diff.py",
    "bench_otlp.py",
    "bench_afpacket.py",
    "bench_live.py",
    "bench_ebpf.py",
    "bench_pg_writers.py",
]
NEEDS_ROOT = {
    "bench_afpacket.py",
    "bench_live.py",
    "bench_ebpf.py",
    "bench_replay.py",
    "bench_pg_writers.py",
}


def byte_compile() -> None:
    """Byte-compile the package first, as ``pip install`` does: with
    ``PYTHONDONTWRITEBYTECODE`` set (it is on the development machines) an
    editable tree keeps no ``.pyc``, and every command would compile every
    module it imports at every start (~0.08 s of CPU in a replay), a cost an
    installed package does not pay."""
    import compileall

    compileall.compile_dir(str(BENCH.parent / "sniffer"), quiet=1)
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        print("PYTHONDONTWRITEBYTECODE is set: sniffer/ byte-compiled first (as pip does)")


def main() -> int:
    byte_compile()
    scripts = [BENCH / n for n in ORDER if (BENCH / n).exists()]
    scripts += sorted(p for p in BENCH.glob("bench_*.py") if p.name not in ORDER)
    failed = []
    FIGURES.parent.mkdir(parents=True, exist_ok=True)
    FIGURES.write_text("")
    env = {**os.environ, ENV: str(FIGURES)}
    started = time.perf_counter()
    for script in scripts:
        print(f"\n=== {script.name} ===", flush=True)
        if script.name in NEEDS_ROOT and os.geteuid() != 0:
            print("skipped: needs root (packet capture)")
            continue
        t = time.perf_counter()
        rc = subprocess.call([sys.executable, str(script)], cwd=BENCH.parent, env=env)
        print(f"--- {script.name}: exit {rc}, {time.perf_counter() - t:.1f} s", flush=True)
        if rc:
            failed.append(script.name)
    if failed:
        print(f"\nbenchmarks that did not run to the end: {', '.join(failed)}")
    print(
        f"\n=== summary: native core and pure core (SPARSEETY_PURE=1), same run, "
        f"{os.cpu_count()} CPUs, {time.perf_counter() - started:.0f} s in all ==="
    )
    print(summary(FIGURES))
    FIGURES.with_suffix(".md").write_text(markdown(FIGURES) + "\n")
    print(f"(as Markdown, for the README's table: {FIGURES.with_suffix('.md')})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
