"""Writes the OpenAI items of a capture to a file for
``native/core/examples/extract_bench.rs`` (callgrind of the native chunk
extraction alone, without Python around it).

Each item is one byte (``C`` chat, ``P`` completions), a little-endian u32
length and the item's UTF-8 text, in replay order. The items are collected
from the pure core's dialects (``bench_native_openai._items``; the native
core would take them before any dialect sees them, so this sets
``SPARSEETY_PURE=1`` itself).

    python bench/dump_openai_items.py [--capture bench/out/bench.pcap] [--out items.bin]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ["SPARSEETY_PURE"] = "1"  # before sniffer is imported
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

import bench_native_openai  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capture", type=Path, default=REPO / "bench" / "out" / "bench.pcap")
    ap.add_argument("--out", type=Path, default=Path("items.bin"))
    ns = ap.parse_args()
    n = 0
    with ns.out.open("wb") as f:
        for chat, items in bench_native_openai._items(ns.capture):
            for data, _ in items:
                raw = data.encode()
                f.write(b"C" if chat else b"P")
                f.write(len(raw).to_bytes(4, "little"))
                f.write(raw)
                n += 1
    print(f"{n:,} items → {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
