"""Benchmark of the live AF_PACKET source on ``lo`` (needs root or CAP_NET_RAW).

A generator process injects TCP frames into ``lo`` through its own packet socket
at a fixed rate. The frames carry a bad IPv4 header checksum, so the IP layer
drops them after the packet taps saw them: no socket answers, and the exact
number sent is known. The capture runs in this process and reports, per
backend and rate: frames captured, kernel drops, and CPU seconds per packet
of the capture process (parsing into Segments included).

    python bench/bench_afpacket.py                       # default rate ladder
    python bench/bench_afpacket.py --rates 50000 200000 --seconds 2 --backend recv

The generator and the capture are pinned to different CPUs when there are two
or more. Everything is bounded: each step sends at most rate × seconds frames
and the drain after it stops after 2 s without packets.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import struct
import sys
import time
from dataclasses import dataclass

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sniffer.capture.afpacket import AfPacketSource
from sniffer.core.events import CaptureGap, Segment


def make_frame(port: int, payload_len: int) -> bytearray:
    """Ethernet + IPv4 (bad checksum) + TCP(PSH|ACK) to ``port`` + payload."""
    payload = b"d" * payload_len
    total = 20 + 20 + len(payload)
    eth = b"\0" * 12 + b"\x08\x00"
    ip = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        0,
        total,
        1,
        0,
        64,
        6,
        0xDEAD,  # wrong on purpose
        socket.inet_aton("127.0.0.1"),
        socket.inet_aton("127.0.0.1"),
    )
    tcp = struct.pack("!HHIIBBHHH", 40000, port, 0, 0, 0x50, 0x18, 65535, 0, 0)
    return bytearray(eth + ip + tcp + payload)


def generator(port: int, rate: int, count: int, payload_len: int, cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    frame = make_frame(port, payload_len)
    seq_off = 14 + 20 + 4
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0) as tx:
        tx.bind(("lo", 0))
        send = tx.send
        pack_into = struct.pack_into
        start = time.perf_counter()
        burst = 32
        sent = 0
        while sent < count:
            for _ in range(min(burst, count - sent)):
                pack_into("!I", frame, seq_off, sent)
                send(frame)
                sent += 1
            ahead = sent / rate - (time.perf_counter() - start)
            if ahead > 0.0005:
                time.sleep(ahead)


@dataclass
class Result:
    backend: str
    rate: int
    sent: int
    captured: int
    drops: int
    cpu_s: float
    wall_s: float
    gen_rate: float

    def row(self) -> str:
        per = self.cpu_s / self.captured * 1e6 if self.captured else float("nan")
        return (
            f"{self.backend:10s} {self.rate:>9,d} {self.gen_rate:>11,.0f} {self.sent:>9,d} "
            f"{self.captured:>9,d} {self.drops:>8,d} {per:>9.2f}"
        )


def run_step(backend: str, rate: int, seconds: float, payload_len: int, cpus: list[int]) -> Result:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    count = int(rate * seconds)
    src = AfPacketSource("lo", (port,), use_ring=backend == "tpacket_v3")
    src.open()
    cap_cpu = cpus[0] if cpus else None
    gen_cpu = cpus[1] if len(cpus) > 1 else None
    if cap_cpu is not None:
        os.sched_setaffinity(0, {cap_cpu})
    gen = mp.Process(target=generator, args=(port, rate, count, payload_len, gen_cpu))
    captured = 0
    drops = 0
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    gen.start()
    t_gen_end: float | None = None
    idle_since: float | None = None
    while True:
        batch = src.poll(0.05)
        for item in batch:
            if type(item) is Segment:
                captured += 1
            elif type(item) is CaptureGap:
                drops += item.dropped
        now = time.perf_counter()
        if t_gen_end is None and not gen.is_alive():
            t_gen_end = now
        if batch:
            idle_since = None
        elif t_gen_end is not None:
            idle_since = idle_since or now
            if now - idle_since > 0.3 or now - t_gen_end > 2.0:
                break
        if now - t0 > seconds * 10 + 10:
            break
    cpu = time.process_time() - cpu0
    wall = (t_gen_end or time.perf_counter()) - t0
    gen.join(5)
    st = src.stats()
    drops += sum(i.dropped for i in src.poll(0) if isinstance(i, CaptureGap))
    assert drops == st.kernel_drops, (drops, st)
    src.close()
    if cpus:
        os.sched_setaffinity(0, set(cpus))
    return Result(backend, rate, count, captured, drops, cpu, wall, count / wall)


def drain_step(backend: str, count: int, payload_len: int) -> str:
    """Pure capture cost: inject ``count`` frames while nobody reads, then time
    draining them (the kernel work is done by then; this is user space only)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = AfPacketSource("lo", (port,), use_ring=backend == "tpacket_v3")
    src.open()
    frame = make_frame(port, payload_len)
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0) as tx:
        tx.bind(("lo", 0))
        for i in range(count):
            struct.pack_into("!I", frame, 14 + 20 + 4, i)
            tx.send(frame)
    segs = 0
    cpu0 = time.process_time()
    for _ in range(count + 10):
        batch = src.poll(0)
        if not batch:
            break
        segs += sum(1 for i in batch if type(i) is Segment)
    cpu = time.process_time() - cpu0
    st = src.stats()
    src.close()
    return (
        f"{backend:10s} drained {segs:,d} of {count:,d} (kernel drops {st.kernel_drops:,d}): "
        f"{cpu / segs * 1e6:.2f} us/pkt = {segs / cpu:,.0f} pkt/s per CPU"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", type=int, nargs="+", default=[25_000, 50_000, 100_000, 200_000])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--payload", type=int, default=200, help="TCP payload bytes per frame")
    ap.add_argument("--backend", choices=["tpacket_v3", "recv", "both"], default="both")
    ap.add_argument(
        "--drain", type=int, default=100_000, help="frames for the drain step (0: skip)"
    )
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))[:2]
    backends = ["tpacket_v3", "recv"] if args.backend == "both" else [args.backend]
    print(f"cpus={cpus} payload={args.payload}B seconds={args.seconds}")
    print(
        f"{'backend':10s} {'target/s':>9s} {'achieved/s':>11s} {'sent':>9s} "
        f"{'captured':>9s} {'drops':>8s} {'cpu us/pkt':>9s}"
    )
    for backend in backends:
        for rate in args.rates:
            res = run_step(backend, rate, args.seconds, args.payload, cpus)
            print(res.row(), flush=True)
    if args.drain:
        for backend in backends:
            print(drain_step(backend, args.drain, args.payload), flush=True)


if __name__ == "__main__":
    main()
