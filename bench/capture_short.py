"""Record a capture of many short streams: the traffic of ``bench_live.py``'s
short part (one connection per stream, ``events`` SSE events each, 16 at a
time), captured by dumpcap on loopback. Replayed offline through the daemon's
processing thread (the live-path harness) it gives the fixed cost of a stream
(its open and close) without the live benchmark's noise: most of such a
capture's CPU is per stream.

    python -m bench.capture_short [--streams 2000] [--events 5] [--out bench/out/short.pcap]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_live import _short_streams  # noqa: E402
from tests.fixture_server import free_port  # noqa: E402


def _wait_listening(port: int, timeout: float = 30.0) -> None:
    """Return once something accepts connections on ``port`` (the server's start)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def record(path: Path, streams: int, events: int, concurrency: int = 16) -> int:
    """Serve ``bench_live``'s paced SSE server, capture its port with dumpcap
    while ``streams`` short streams run; the chunk events the clients read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    port = free_port()
    live = REPO / "bench" / "bench_live.py"
    server = subprocess.Popen([sys.executable, str(live), "--serve", str(port)], cwd=REPO)
    cap: subprocess.Popen[bytes] | None = None
    try:
        _wait_listening(port)
        cap = subprocess.Popen(
            ["dumpcap", "-q", "-P", "-i", "lo", "-f", f"tcp port {port}", "-w", str(path)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.5)  # dumpcap's start
        got = asyncio.run(_short_streams(port, streams, events, concurrency))
        time.sleep(1.0)  # the last packets written
        return got
    finally:
        if cap is not None:
            cap.terminate()
            cap.wait(10)
        server.terminate()
        server.wait(10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=2000)
    p.add_argument("--events", type=int, default=5, help="SSE events per stream")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "out" / "short.pcap")
    a = p.parse_args()
    got = record(a.out, a.streams, a.events)
    print(f"{a.out}: {a.streams} streams, {got} chunk events read by the clients")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
