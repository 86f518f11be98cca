"""Record the benchmark capture: real SSE streams from the fixture server on
loopback, captured by dumpcap. Bounded: a fixed number of streams, a deadline.

    python -m bench.capture [--streams 1200] [--chunks 60] [--out bench/out/bench.pcap]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fixture_server import free_port, start_server_process, wait_ready  # noqa: E402

OUT = REPO / "bench" / "out"


def record(
    path: Path, streams: int = 1500, chunks: int = 60, workers: int = 64, delay_ms: float = 8.0
) -> dict[str, int]:
    """Drive ``streams`` streaming chat requests of ``chunks`` chunks each through
    ``workers`` keep-alive clients while dumpcap records the server port."""
    path.parent.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server_process(port, "--delay-ms", str(delay_ms))
    cap: subprocess.Popen[bytes] | None = None
    try:
        wait_ready(port, timeout=15)
        tmp = path.with_suffix(".tmp.pcap")
        cap = subprocess.Popen(
            ["dumpcap", "-q", "-P", "-i", "lo", "-f", f"tcp port {port}", "-w", str(tmp)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while (not tmp.exists() or tmp.stat().st_size < 24) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        received = [0] * workers
        done = [0] * workers
        stop_at = time.monotonic() + 300

        def worker(w: int) -> None:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
                for i in range(w, streams, workers):
                    if time.monotonic() > stop_at:
                        return
                    body = {
                        "model": "fake-ignoreeos",
                        "messages": [{"role": "user", "content": f"benchmark prompt {i}"}],
                        "stream": True,
                        "max_tokens": chunks,
                    }
                    with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        for line in r.iter_lines():
                            if line.startswith("data: {"):
                                received[w] += 1
                    done[w] += 1

        threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(1.0)
        cap.send_signal(signal.SIGINT)
        cap.wait(timeout=30)
        cap = None
        os.replace(tmp, path)
        return {"port": port, "streams": sum(done), "sse_events": sum(received)}
    finally:
        if cap is not None:
            cap.kill()
            cap.wait()
        server.terminate()
        server.wait(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=1500)
    ap.add_argument("--chunks", type=int, default=60)
    ap.add_argument("--out", type=Path, default=OUT / "bench.pcap")
    ns = ap.parse_args()
    t = time.perf_counter()
    info = record(ns.out, ns.streams, ns.chunks)
    print(f"recorded {ns.out}: {info} in {time.perf_counter() - t:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
