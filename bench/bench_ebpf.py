"""Throughput of the eBPF syscall capture on loopback traffic (needs root).

A server subprocess writes ``count`` chunks of ``size`` bytes to each of
``conns`` connections opened by a client subprocess; this process only reads
the ring through ``EbpfSource`` (selected by the server's pid), so its CPU
time is the cost of delivering the records as flow events.

    python bench/bench_ebpf.py            # all scenarios
    python bench/bench_ebpf.py --quick    # smaller counts

Each scenario is bounded (60 s); a row reports records and flow events per
second, delivered MB/s, lost records (kernel ring reserve failures) and the
reader's CPU seconds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sniffer.capture.ebpf import EbpfSource
from sniffer.core.events import ConnectionClosed, FlowData

SERVER = textwrap.dedent(
    """
    import socket, sys, time
    size, count, conns, rate = map(int, sys.argv[1:5])
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    s.settimeout(60)
    print(s.getsockname()[1], flush=True)
    sys.stdin.readline()  # go
    chunk = b"x" * size
    for _ in range(conns):
        c, _ = s.accept()
        c.recv(100)
        t0 = time.monotonic()
        for i in range(count):
            c.sendall(chunk)
            if rate and i % 64 == 63:  # paced: sleep off any lead over the schedule
                lead = t0 + (i + 1) / rate - time.monotonic()
                if lead > 0:
                    time.sleep(lead)
        c.close()
    """
)

CLIENT = textwrap.dedent(
    """
    import socket, sys
    port, conns = int(sys.argv[1]), int(sys.argv[2])
    for _ in range(conns):
        c = socket.create_connection(("127.0.0.1", port), timeout=60)
        c.sendall(b"GET / HTTP/1.1\\r\\n\\r\\n")
        while c.recv(1 << 20):
            pass
        c.close()
    """
)


@dataclass
class Row:
    name: str
    seconds: float
    records: int
    events: int
    nbytes: int
    lost: int
    cpu: float
    complete: bool


def run(
    name: str,
    size: int,
    count: int,
    conns: int,
    ring: int,
    rate: int = 0,
    *,
    tmp: Path,
    limit: float = 60.0,
) -> Row:
    (tmp / "server.py").write_text(SERVER)
    (tmp / "client.py").write_text(CLIENT)
    server = subprocess.Popen(
        [sys.executable, str(tmp / "server.py"), str(size), str(count), str(conns), str(rate)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdin is not None
    port = int(server.stdout.readline())
    client = None
    try:
        with EbpfSource(pids=[server.pid], ring_bytes=ring) as src:
            cpu0 = time.process_time()
            t0 = time.monotonic()
            server.stdin.write("go\n")
            server.stdin.flush()
            client = subprocess.Popen(
                [sys.executable, str(tmp / "client.py"), str(port), str(conns)]
            )
            events = closed = nbytes = 0
            while time.monotonic() - t0 < limit and closed < conns:
                for ev in src.poll(0.1):
                    events += 1
                    if isinstance(ev, FlowData):
                        nbytes += len(ev.data)
                    elif isinstance(ev, ConnectionClosed):
                        closed += 1
            seconds = time.monotonic() - t0
            cpu = time.process_time() - cpu0
            st = src.stats()
    finally:
        for p in (client, server):
            if p is not None:
                if p.poll() is None:
                    p.kill()
                p.wait(timeout=10)
    expected = conns * (size * count + len(b"GET / HTTP/1.1\r\n\r\n"))
    return Row(
        name, seconds, st["records"], events, nbytes, st["lost_records"], cpu, nbytes == expected
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller counts")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("bench_ebpf: needs root")
    k = 10 if args.quick else 1
    mib = 1 << 20
    scenarios = [
        ("sse-like 200 B writes", 200, 200_000 // k, 1, 8 * mib),
        ("4 KiB writes", 4096, 50_000 // k, 1, 8 * mib),
        ("64 KiB writes", 65536, 4_000 // k, 1, 8 * mib),
        ("64 KiB writes, 64M ring", 65536, 4_000 // k, 1, 64 * mib),
        ("1000 short connections", 2000, 1, 1000 // k, 8 * mib),
    ]
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_ebpf_{os.getpid()}"
    tmp.mkdir(exist_ok=True)
    rows = [run(*sc, tmp=tmp) for sc in scenarios]
    # Paced SSE-like writes, doubling the rate: where does loss begin?
    for rate in (2_000, 8_000, 32_000, 64_000):
        rows.append(run(f"200 B writes @{rate}/s", 200, rate * 2 // k, 1, 8 * mib, rate, tmp=tmp))
    load = os.getloadavg()[0]
    print(f"{os.cpu_count()} CPUs, load {load:.1f}; reader selects the server by pid; MB = 1e6 B")
    head = (
        f"{'scenario':<24} {'s':>6} {'records/s':>10} {'events/s':>10} {'MB/s':>8} "
        f"{'lost':>5} {'cpu s':>6} {'cpu s/GB':>8} {'complete':>8}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.name:<24} {r.seconds:>6.2f} {r.records / r.seconds:>10.0f} "
            f"{r.events / r.seconds:>10.0f} {r.nbytes / r.seconds / 1e6:>8.1f} {r.lost:>5} "
            f"{r.cpu:>6.2f} {r.cpu / max(r.nbytes, 1) * 1e9:>8.2f} {r.complete!s:>8}"
        )


if __name__ == "__main__":
    main()
