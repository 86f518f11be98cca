"""eBPF syscall capture: record→event logic (no kernel) and live loopback tests (root)."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.capture.ebpf import EbpfError, EbpfSource, default_obj_path
from sniffer.capture.ebpf.loader import (
    D_RECV,
    D_SENT,
    HDR,
    K_CLOSE,
    K_DATA,
    K_EOF,
    K_SHUTDOWN,
    R_CLIENT,
    R_SERVER,
    R_UNKNOWN,
    SEQ_KNOWN,
    _tracefs_ready,
    _try_mount_tracefs,
)
from sniffer.core.events import (
    ConnectionClosed,
    ConnectionOpened,
    FlowAnomaly,
    FlowData,
    FlowEnd,
    FlowEvent,
    FlowGap,
)

EBPF_DIR = Path(__file__).resolve().parent.parent / "sniffer" / "capture" / "ebpf"

# ---------------------------------------------------------------------------
# Record → event logic, fed with synthetic ring records (no kernel needed)
# ---------------------------------------------------------------------------

SK = 0xFFFF8880_12345678
LO = socket.inet_aton("127.0.0.1")


def rec(
    kind: int,
    direction: int,
    offset: int,
    data: bytes = b"",
    *,
    aux: int = 0,
    role: int = R_SERVER,
    lport: int = 8000,
    rport: int = 50000,
    serial: int = 1,
    state: int = 0,
    ts_ns: int = 1_000_000_000,
) -> bytes:
    head = HDR.pack(
        ts_ns, SK, offset, aux, serial, len(data), 42, 43, 7, lport, rport,
        kind, direction, role, socket.AF_INET, state,
        LO.ljust(16, b"\0"), LO.ljust(16, b"\0"), b"server".ljust(16, b"\0"),
    )  # fmt: skip
    return head + data


def feed(src: EbpfSource, records: list[bytes]) -> list[FlowEvent]:
    out: list[FlowEvent] = []
    src._raw.extend(records)
    src._process(out)
    return out


T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def of(events: list[FlowEvent], cls: type[T]) -> list[T]:
    return [e for e in events if isinstance(e, cls)]


def test_server_socket_view_and_close() -> None:
    src = EbpfSource(conn_id_base=100)
    evs = feed(
        src,
        [
            rec(K_DATA, D_RECV, 0, b"GET / HTTP/1.1\r\n\r\n"),
            rec(K_DATA, D_SENT, 0, b"HTTP/1.1 200 OK\r\n", ts_ns=2_000_000_000),
            rec(K_DATA, D_SENT, 17, b"\r\n", ts_ns=2_000_000_000),
            rec(K_SHUTDOWN, D_SENT, 19),
            rec(K_CLOSE, D_SENT, 19, aux=18, state=5),  # FIN_WAIT2 -> CLOSE
        ],
    )
    opened = of(evs, ConnectionOpened)
    assert len(opened) == 1
    o = opened[0]
    assert (o.conn, o.client, o.server, o.syn_seen) == (
        100,
        ("127.0.0.1", 50000),
        ("127.0.0.1", 8000),
        True,
    )
    assert (o.capture, o.pid, o.comm) == ("ebpf", 42, "server")
    data = of(evs, FlowData)
    # the two records of one syscall (same timestamp) are merged
    assert [(d.from_client, d.data) for d in data] == [
        (True, b"GET / HTTP/1.1\r\n\r\n"),
        (False, b"HTTP/1.1 200 OK\r\n\r\n"),
    ]
    ends = of(evs, FlowEnd)
    assert [(e.from_client, e.reason) for e in ends] == [(False, "fin"), (True, "fin")]
    assert of(evs, ConnectionClosed)[0].reason == "fin"
    assert not of(evs, FlowGap)
    assert src.stats()["open_connections"] == 0
    assert src.stats()["connections"] == 1


def test_client_socket_is_inverted_by_port() -> None:
    src = EbpfSource(ports=[8000])
    evs = feed(
        src,
        [
            rec(K_DATA, D_SENT, 0, b"req", lport=50000, rport=8000, role=R_UNKNOWN),
            rec(K_DATA, D_RECV, 0, b"resp", lport=50000, rport=8000, role=R_UNKNOWN),
            rec(K_EOF, D_RECV, 4, lport=50000, rport=8000, role=R_UNKNOWN),
        ],
    )
    o = of(evs, ConnectionOpened)[0]
    assert o.server == ("127.0.0.1", 8000) and o.client == ("127.0.0.1", 50000)
    assert not o.syn_seen
    # a connection that predates the capture starts with a midstream gap each way
    gaps = of(evs, FlowGap)
    assert sorted((g.from_client, g.nbytes, g.reason) for g in gaps) == [
        (False, None, "midstream"),
        (True, None, "midstream"),
    ]
    assert [(d.from_client, d.data) for d in of(evs, FlowData)] == [
        (True, b"req"),
        (False, b"resp"),
    ]
    assert [(e.from_client, e.reason) for e in of(evs, FlowEnd)] == [(False, "fin")]


@pytest.mark.parametrize(
    ("role", "lport", "rport", "server_is_local"),
    [
        (R_SERVER, 50000, 8000, True),  # passive open wins over port order
        (R_CLIENT, 8000, 50000, False),  # active open wins over port order
        (R_UNKNOWN, 8000, 50000, True),  # lower port is the server
        (R_UNKNOWN, 50000, 8000, False),
    ],
)
def test_role_decision(role: int, lport: int, rport: int, server_is_local: bool) -> None:
    src = EbpfSource()
    evs = feed(src, [rec(K_DATA, D_RECV, 0, b"x", role=role, lport=lport, rport=rport)])
    o = of(evs, ConnectionOpened)[0]
    assert o.server[1] == (lport if server_is_local else rport)
    assert of(evs, FlowData)[0].from_client == server_is_local


def test_rst_close_and_reused_socket_address() -> None:
    src = EbpfSource()
    evs = feed(
        src,
        [
            rec(K_DATA, D_RECV, 0, b"a"),
            rec(K_CLOSE, D_SENT, 0, aux=1, state=1),  # ESTABLISHED -> CLOSE: reset
            rec(K_DATA, D_RECV, 0, b"b", serial=2),  # same sk pointer, new socket
        ],
    )
    assert of(evs, ConnectionClosed)[0].reason == "rst"
    assert {e.reason for e in of(evs, FlowEnd)} == {"rst"}
    conns = [o.conn for o in of(evs, ConnectionOpened)]
    assert len(conns) == 2 and conns[0] != conns[1]


def test_trailing_loss_shows_at_close() -> None:
    src = EbpfSource()
    evs = feed(src, [rec(K_DATA, D_SENT, 0, b"abc"), rec(K_CLOSE, D_SENT, 10, aux=0, state=9)])
    gaps = of(evs, FlowGap)
    assert [(g.from_client, g.nbytes, g.reason) for g in gaps] == [(False, 7, "ebpf-lost")]
    assert evs.index(gaps[0]) < evs.index(of(evs, FlowEnd)[0])


def test_overlap_is_trimmed_and_flagged() -> None:
    src = EbpfSource()
    evs = feed(src, [rec(K_DATA, D_RECV, 0, b"abcd"), rec(K_DATA, D_RECV, 2, b"cdef", ts_ns=5)])
    assert b"".join(d.data for d in of(evs, FlowData)) == b"abcdef"
    assert of(evs, FlowAnomaly)[0].kind == "out-of-order"


def test_prereported_loss_is_not_counted_twice() -> None:
    src = EbpfSource()
    feed(src, [rec(K_DATA, D_SENT, 0, b"abc")])
    (c,) = src._conns.values()
    # what _check_counters does when the kernel says 5 bytes of this direction were lost
    out: list[FlowEvent] = []
    c.prereported[D_SENT] += 5
    src._gap(out, c, D_SENT, 0.0, 5)
    evs = feed(src, [rec(K_DATA, D_SENT, 8, b"xyz", ts_ns=7)])
    assert not of(evs, FlowGap)
    assert src.stats()["gap_bytes"] == 5
    evs = feed(src, [rec(K_DATA, D_SENT, 13, b"!", ts_ns=9)])
    assert [g.nbytes for g in of(evs, FlowGap)] == [2]


@settings(max_examples=200, deadline=None)
@given(
    stream=st.binary(min_size=1, max_size=3000),
    cuts=st.lists(st.integers(min_value=1, max_value=2999), max_size=30),
    drops=st.sets(st.integers(min_value=0, max_value=40), max_size=10),
    batch_cuts=st.lists(st.integers(min_value=0, max_value=45), max_size=5),
)
def test_property_records_rebuild_stream_with_exact_gaps(
    stream: bytes, cuts: list[int], drops: set[int], batch_cuts: list[int]
) -> None:
    """Split a direction into records at random offsets, lose some, poll in random
    batches: data + gaps always rebuild the stream exactly, in order."""
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    records = [
        rec(K_DATA, D_SENT, a, stream[a:b], ts_ns=i + 1)
        for i, (a, b) in enumerate(itertools.pairwise(bounds))
    ]
    kept = [r for i, r in enumerate(records) if i not in drops]
    kept.append(rec(K_CLOSE, D_SENT, len(stream), aux=0, state=9, ts_ns=10_000))
    src = EbpfSource()
    evs: list[FlowEvent] = []
    edges = sorted({0, len(kept), *(b for b in batch_cuts if b < len(kept))})
    for a, b in itertools.pairwise(edges):
        evs += feed(src, kept[a:b])
    pos = 0
    for e in evs:
        if isinstance(e, FlowGap):
            assert e.nbytes is not None and e.nbytes > 0
            pos += e.nbytes
        elif isinstance(e, FlowData):
            assert not e.from_client
            assert stream[pos : pos + len(e.data)] == e.data
            pos += len(e.data)
    assert pos == len(stream)
    lost = sum(b - a for i, (a, b) in enumerate(itertools.pairwise(bounds)) if i in drops)
    assert src.stats()["gap_bytes"] == lost
    assert isinstance(evs[-1], ConnectionClosed)


def test_checkpoint_positions_and_adoption_give_an_exact_restart_gap() -> None:
    """A restarted instance's offsets start at 0 again; the sockets' TCP sequence
    numbers (``aux``) tie them to the previous instance's: the same connection
    id goes on, after a gap of exactly the bytes moved while no instance ran."""
    seq_sent, seq_recv = 0xFFFF_FF00, 5000  # the send side wraps during the test
    old = EbpfSource(conn_id_base=7)
    feed(
        old,
        [
            rec(K_DATA, D_RECV, 0, b"POST / HTTP/1.1\r\n\r\n", aux=SEQ_KNOWN | seq_recv),
            rec(K_DATA, D_SENT, 0, b"x" * 200, aux=SEQ_KNOWN | seq_sent),
        ],
    )
    pos = old.checkpoint_positions()
    assert list(pos) == [7]
    p = pos[7]
    assert p["sk"] == SK and p["server_side"] is True
    assert p["local"] == ["127.0.0.1", 8000] and p["remote"] == ["127.0.0.1", 50000]
    assert p["seq"] == [(seq_sent + 200) & 0xFFFFFFFF, seq_recv + 19]
    old.forget([7])
    assert old.finish() == []  # handed over: not closed

    new = EbpfSource(conn_id_base=500)
    assert new.adopt([(7, p)]) == 1
    # the server wrote 300 bytes while no program was attached: the new map's
    # offset 0 is 300 bytes further on
    base = (seq_sent + 500) & 0xFFFFFFFF
    evs = feed(new, [rec(K_DATA, D_SENT, 0, b"tail", aux=SEQ_KNOWN | base, serial=1)])
    assert not of(evs, ConnectionOpened)
    assert [(g.conn, g.from_client, g.nbytes, g.reason) for g in of(evs, FlowGap)] == [
        (7, False, 300, "restart")
    ]
    assert [(d.conn, d.data) for d in of(evs, FlowData)] == [(7, b"tail")]
    # the request direction is still where it was: no gap when it shows up
    evs = feed(new, [rec(K_DATA, D_RECV, 0, b"GET", aux=SEQ_KNOWN | (seq_recv + 19))])
    assert not of(evs, FlowGap)
    # another socket at the same address (reused) is a new connection
    other = EbpfSource(conn_id_base=900)
    other.adopt([(7, {**p, "remote": ["127.0.0.1", 50001]})])
    evs = feed(other, [rec(K_DATA, D_SENT, 0, b"x", aux=SEQ_KNOWN | base)])
    assert [o.conn for o in of(evs, ConnectionOpened)] == [900]


def test_records_without_sequence_numbers_continue_after_a_gap_of_unknown_size() -> None:
    """An object built before records carried TCP sequence numbers (aux 0): the
    adopted socket still continues its connection, after a gap of unknown size,
    and a further checkpoint does not invent a position for it."""
    src = EbpfSource()
    src.adopt([(7, {"sk": SK, "local": ["127.0.0.1", 8000], "remote": ["127.0.0.1", 50000],
                    "server_side": True, "seq": [100, 200]})])  # fmt: skip
    evs = feed(src, [rec(K_DATA, D_SENT, 0, b"tail")])
    assert not of(evs, ConnectionOpened)
    assert [(g.conn, g.nbytes, g.reason) for g in of(evs, FlowGap)] == [(7, None, "restart")]
    assert src.checkpoint_positions()[7]["seq"] == [None, 200]


def test_adopted_socket_not_heard_from_yet_is_handed_over_again() -> None:
    """An instance stopped moments after it started, before an adopted socket
    sent anything: the socket goes to the next instance as it came."""
    pos = {"sk": SK, "local": ["127.0.0.1", 8000], "remote": ["127.0.0.1", 1],
           "server_side": True, "seq": [1, 2]}  # fmt: skip
    src = EbpfSource()
    src.adopt([(7, pos)])
    assert src.checkpoint_positions() == {7: pos}
    src.forget([7])
    assert src.finish() == []


def test_records_after_the_checkpoint_are_left_to_the_next_instance() -> None:
    """The streams go on while an instance stops: records its sockets write
    after the checkpoint (drained by ``finish``) belong to the next instance,
    which counts them in its restart gap. Seen live: they opened a second,
    empty "midway" connection for the handed-over stream."""
    for adopted in (False, True):
        src = EbpfSource(conn_id_base=100)
        if adopted:  # handed over to this instance and not heard from yet
            src.adopt([(7, {"sk": SK, "local": ["127.0.0.1", 8000],
                            "remote": ["127.0.0.1", 50000], "server_side": True,
                            "seq": [1, 2]})])  # fmt: skip
        else:
            feed(src, [rec(K_DATA, D_SENT, 0, b"x" * 10, aux=SEQ_KNOWN | 1)])
        conn = 7 if adopted else 100
        assert list(src.checkpoint_positions()) == [conn]
        src.forget([conn])
        src._raw.append(rec(K_DATA, D_SENT, 10, b"late", aux=SEQ_KNOWN | 1))
        assert src.finish() == []
        assert src.stats()["handed_records"] == 1


def test_adopted_socket_never_heard_of_again_ends_as_gapped() -> None:
    src = EbpfSource()
    src.adopt([(7, {"sk": SK, "local": ["127.0.0.1", 8000], "remote": ["127.0.0.1", 1],
                    "server_side": True, "seq": [1, 2]})])  # fmt: skip
    evs = src.finish()
    assert [(type(e).__name__, e.conn) for e in evs][-1] == ("ConnectionClosed", 7)
    assert [(g.from_client, g.nbytes, g.reason) for g in of(evs, FlowGap)] == [
        (False, None, "restart")
    ]


def test_adopted_socket_silent_for_the_idle_timeout_ends_during_the_run() -> None:
    """A stream that ended while no instance ran leaves no record to see: its
    row is ended as gapped once the socket has been silent for the idle
    timeout, not left open until the daemon stops (days, for a sidecar)."""
    src = EbpfSource(idle_timeout=30.0)
    src.adopt([(7, {"sk": SK, "local": ["127.0.0.1", 8000], "remote": ["127.0.0.1", 1],
                    "server_side": True, "seq": [1, 2]})])  # fmt: skip
    at = src._adopted[SK]["at"]
    out: list[FlowEvent] = []
    src._expire_adopted(out, at + 29.0)
    assert out == []
    src._next_expiry = 0.0
    src._expire_adopted(out, at + 30.0)
    assert [(type(e).__name__, e.conn) for e in out][-1] == ("ConnectionClosed", 7)
    assert [(g.nbytes, g.reason) for g in of(out, FlowGap)] == [(None, "restart")]
    assert src.checkpoint_positions() == {} and src.finish() == []


def test_constructor_validates() -> None:
    with pytest.raises(ValueError):
        EbpfSource(ports=[0])
    with pytest.raises(ValueError):
        EbpfSource(comms=["x" * 16])
    with pytest.raises(ValueError):
        EbpfSource(ring_bytes=3 << 20)


# ---------------------------------------------------------------------------
# Live: real programs on real loopback traffic (root)
# ---------------------------------------------------------------------------

SERVER = textwrap.dedent(
    """
    import os, socket, struct, sys

    mode, nconn = sys.argv[1], int(sys.argv[2])

    def body(n):
        pat = bytes(range(33, 127))
        return (pat * (n // len(pat) + 1))[:n]

    def write_all(c, parts):
        parts = [p for p in parts if p]
        while parts:
            if mode == "writev":
                n = os.writev(c.fileno(), parts)
            elif mode == "sendmsg":
                n = c.sendmsg(parts)
            else:
                n = c.send(parts[0])
            while n:
                k = min(n, len(parts[0]))
                parts[0] = parts[0][k:]
                n -= k
                if not parts[0]:
                    parts.pop(0)

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    s.settimeout(30)
    print(s.getsockname()[1], flush=True)
    for _ in range(nconn):
        c, _ = s.accept()
        c.settimeout(30)
        buf = b""
        while b"\\r\\n\\r\\n" not in buf:
            d = c.recv(65536)
            if not d:
                break
            buf += d
        head = dict(
            line.split(": ", 1) for line in buf.decode().split("\\r\\n")[1:] if ": " in line
        )
        size = int(head.get("X-Size", "10"))
        b = body(size)
        h = f"HTTP/1.1 200 OK\\r\\nContent-Length: {size}\\r\\n\\r\\n".encode()
        write_all(c, [h, b[: size // 3], b[size // 3 :]])
        if head.get("X-Close") == "rst":
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        c.close()
    """
)


def body(n: int) -> bytes:
    pat = bytes(range(33, 127))
    return (pat * (n // len(pat) + 1))[:n]


def response(n: int) -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {n}\r\n\r\n".encode() + body(n)


def request(n: int, close: str = "fin") -> bytes:
    return f"GET /r{n} HTTP/1.1\r\nHost: t\r\nX-Size: {n}\r\nX-Close: {close}\r\n\r\n".encode()


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (BPF programs and tracepoints)"
    if not os.path.exists("/sys/kernel/btf/vmlinux"):
        return "kernel has no BTF (/sys/kernel/btf/vmlinux missing)"
    if not _tracefs_ready():
        _try_mount_tracefs()
    if not _tracefs_ready():
        return "tracefs with syscall tracepoints not available"
    return None


_live_skip = pytest.mark.skipif(_skip_reason() is not None, reason=str(_skip_reason()))


def live(test: F) -> F:
    """A live eBPF test: marked ``ebpf`` (CI fails instead of skipping it) and
    skipped with the reason where the kernel or privileges do not allow it."""
    marked: F = pytest.mark.ebpf(_live_skip(test))
    return marked


@pytest.fixture(scope="module")
def obj() -> str:
    path = default_obj_path()
    if not path.exists():
        subprocess.run(["sh", str(EBPF_DIR / "build.sh")], check=True, timeout=240)
    return str(path)


class Server:
    def __init__(self, tmp: Path, mode: str = "send", nconn: int = 1) -> None:
        script = tmp / "server.py"
        script.write_text(SERVER)
        self.proc = subprocess.Popen(
            [sys.executable, str(script), mode, str(nconn)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.pid = self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    made: list[Server] = []

    def make(mode: str = "send", nconn: int = 1) -> Server:
        d = tmp_path / f"s{len(made)}"
        d.mkdir()
        made.append(Server(d, mode, nconn))
        return made[-1]

    yield make
    for s in made:
        s.stop()


def fetch(port: int, n: int, close: str = "fin") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
        c.sendall(request(n, close))
        chunks = []
        while True:
            try:
                d = c.recv(1 << 20)
            except ConnectionResetError:
                break
            if not d:
                break
            chunks.append(d)
    return b"".join(chunks)


def collect(src: EbpfSource, closed: int, timeout: float = 15.0) -> list[FlowEvent]:
    """Poll until `closed` connections have closed (bounded by `timeout`)."""
    evs: list[FlowEvent] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        evs += src.poll(0.05)
        if len(of(evs, ConnectionClosed)) >= closed:
            break
    return evs


def by_conn(evs: list[FlowEvent]) -> dict[int, dict[bool, bytes]]:
    out: dict[int, dict[bool, bytes]] = {}
    for e in of(evs, FlowData):
        d = out.setdefault(e.conn, {True: b"", False: b""})
        d[e.from_client] += e.data
    return out


def check_exchanges(evs: list[FlowEvent], server: Server, sizes: list[int]) -> None:
    opened = of(evs, ConnectionOpened)
    assert len(opened) == len(sizes)
    data = by_conn(evs)
    seen = []
    for o in opened:
        assert o.server == ("127.0.0.1", server.port)
        assert (o.capture, o.pid, o.syn_seen) == ("ebpf", server.pid, True)
        seen.append((data[o.conn][True], data[o.conn][False]))
    assert sorted(seen) == sorted((request(n), response(n)) for n in sizes)
    assert not of(evs, FlowGap)
    ends = of(evs, FlowEnd)
    assert sorted((e.conn, e.from_client) for e in ends) == sorted(
        (o.conn, fc) for o in opened for fc in (True, False)
    )
    closed = of(evs, ConnectionClosed)
    assert sorted(c.conn for c in closed) == sorted(o.conn for o in opened)
    assert {c.reason for c in closed} == {"fin"}
    for e in ends + closed:  # nothing of a connection after it closed
        assert not [x for x in evs[evs.index(e) :] if isinstance(x, FlowData) and x.conn == e.conn]


@live
@pytest.mark.root
@pytest.mark.timeout(60)
@pytest.mark.parametrize("select", ["pid", "port", "comm"])
def test_live_exact_bytes_both_directions(
    obj: str, servers: Callable[..., Server], select: str
) -> None:
    srv = servers("send", 3)
    options: dict[str, dict[str, Any]] = {
        "pid": {"pids": [srv.pid]},
        "port": {"ports": [srv.port]},
        "comm": {"comms": [Path(sys.executable).name[:15]], "ports": [srv.port]},
    }
    kw = options[select]
    with EbpfSource(obj_path=obj, **kw) as src:
        sizes = [10, 5000, 40000]
        for n in sizes:
            assert fetch(srv.port, n) == response(n)
        evs = collect(src, closed=3)
        stats = src.stats()
    check_exchanges(evs, srv, sizes)
    assert stats["lost_records"] == 0 and stats["connections"] == 3
    assert stats["bytes"] == sum(len(request(n)) + len(response(n)) for n in sizes)


@live
@pytest.mark.root
@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["writev", "sendmsg"])
def test_live_vectored_writes(obj: str, servers: Callable[..., Server], mode: str) -> None:
    srv = servers(mode, 2)
    with EbpfSource(pids=[srv.pid], obj_path=obj) as src:
        for n in (100, 70000):
            assert fetch(srv.port, n) == response(n)
        evs = collect(src, closed=2)
    check_exchanges(evs, srv, [100, 70000])


@live
@pytest.mark.root
@pytest.mark.timeout(60)
def test_live_one_mib_response_spans_many_records(obj: str, servers: Callable[..., Server]) -> None:
    srv = servers("send", 1)
    n = 1 << 20
    with EbpfSource(pids=[srv.pid], obj_path=obj) as src:
        assert fetch(srv.port, n) == response(n)
        evs = collect(src, closed=1)
        stats = src.stats()
    check_exchanges(evs, srv, [n])
    assert stats["records"] >= n // 16384  # split into ring records of 16 KiB
    assert stats["lost_records"] == 0 and stats["gaps"] == 0


@live
@pytest.mark.root
@pytest.mark.timeout(60)
def test_live_only_selected_server(obj: str, servers: Callable[..., Server]) -> None:
    a, b = servers("send", 1), servers("send", 1)
    with EbpfSource(pids=[a.pid], obj_path=obj) as src:
        assert fetch(b.port, 321) == response(321)
        assert fetch(a.port, 123) == response(123)
        evs = collect(src, closed=1)
        evs += src.poll(0.2)
    check_exchanges(evs, a, [123])
    assert all(o.server[1] != b.port and o.client[1] != b.port for o in of(evs, ConnectionOpened))


@live
@pytest.mark.root
@pytest.mark.timeout(60)
def test_live_client_side_view_is_inverted(obj: str, servers: Callable[..., Server]) -> None:
    """Selecting the client process: its sent bytes are the client's."""
    srv = servers("send", 1)
    with EbpfSource(pids=[os.getpid()], ports=[srv.port], exclude_self=False, obj_path=obj) as src:
        assert fetch(srv.port, 777) == response(777)
        evs = collect(src, closed=1)
    (o,) = of(evs, ConnectionOpened)
    assert o.server == ("127.0.0.1", srv.port) and o.pid == os.getpid()
    assert by_conn(evs)[o.conn] == {True: request(777), False: response(777)}
    assert not of(evs, FlowGap)


@live
@pytest.mark.root
@pytest.mark.timeout(60)
def test_live_reset_is_reported(obj: str, servers: Callable[..., Server]) -> None:
    srv = servers("send", 1)
    with EbpfSource(pids=[srv.pid], obj_path=obj) as src:
        fetch(srv.port, 50, close="rst")
        evs = collect(src, closed=1)
    (c,) = of(evs, ConnectionClosed)
    assert c.reason == "rst"
    assert by_conn(evs)[c.conn][True] == request(50, "rst")


@live
@pytest.mark.root
@pytest.mark.timeout(60)
def test_live_ring_overflow_gives_exact_gaps(obj: str, servers: Callable[..., Server]) -> None:
    """A ring too small for the burst: lost bytes come back as exact gaps."""
    srv = servers("send", 1)
    n = 1 << 20
    with EbpfSource(pids=[srv.pid], ring_bytes=64 << 10, obj_path=obj) as src:
        assert fetch(srv.port, n) == response(n)  # nobody reads the ring meanwhile
        evs = collect(src, closed=1)
        stats = src.stats()
    assert stats["lost_records"] > 0
    (o,) = of(evs, ConnectionOpened)
    gaps = [g for g in of(evs, FlowGap) if not g.from_client]
    assert gaps and all(g.reason == "ebpf-lost" and g.nbytes for g in gaps)
    got = by_conn(evs)[o.conn][False]
    assert len(got) + sum(g.nbytes or 0 for g in gaps) == len(response(n))
    assert sum(g.nbytes or 0 for g in gaps) == stats["lost_bytes"]
    # every delivered piece sits where it belongs
    pos, full = 0, response(n)
    for e in evs:
        if isinstance(e, FlowGap) and not e.from_client:
            pos += e.nbytes or 0
        elif isinstance(e, FlowData) and not e.from_client:
            assert full[pos : pos + len(e.data)] == e.data
            pos += len(e.data)
    assert pos == len(full)


def _spy_programs() -> dict[int, str]:
    """The loaded eBPF programs named ``spy_*`` (ours): id → name."""
    out = subprocess.run(
        ["bpftool", "-j", "prog", "show"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    progs = json.loads(out or "[]")
    return {p["id"]: p["name"] for p in progs if p.get("name", "").startswith("spy_")}


@live
@pytest.mark.root
@pytest.mark.timeout(60)
def test_live_clean_detach(obj: str) -> None:
    """The programs this source loaded are gone after its close (another
    process's ``spy_*`` programs, loaded before, are not this test's to check)."""
    before = set(_spy_programs())
    src = EbpfSource(ports=[1], obj_path=obj)
    src.open()
    names = src.program_names
    assert len(names) == 17 and all(n.startswith("spy_") for n in names)
    ours = {i: n for i, n in _spy_programs().items() if i not in before}
    assert sorted(ours.values()) == sorted(names)
    assert "17 tracepoints attached" in src.describe()
    src.close()
    src.close()  # idempotent
    assert src.poll(0.01) == []
    deadline = time.monotonic() + 10
    while set(ours) & set(_spy_programs()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(ours) & set(_spy_programs()) == set()


@live
@pytest.mark.root
def test_live_missing_object_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EbpfError, match="compiled BPF object not found: run make ebpf"):
        EbpfSource(obj_path=str(tmp_path / "nope.o")).open()


def test_missing_btf_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from sniffer.capture.ebpf import loader

    monkeypatch.setattr(loader, "_BTF", "/nonexistent/vmlinux")
    with pytest.raises(EbpfError, match=r"kernel has no BTF \(/nonexistent/vmlinux missing\)"):
        EbpfSource().open()


def test_record_layout_matches_c() -> None:
    """HDR mirrors struct rec_hdr (the C side asserts the offsets at compile time)."""
    import re

    from sniffer.capture.ebpf.loader import HDR_FIELDS

    src = (EBPF_DIR / "sparseety.bpf.c").read_text()
    start = src.index("struct rec_hdr {")
    body = src[start : src.index("};", start)]
    names = tuple(re.findall(r"(\w+)(?:\[\d+\])?;", body))
    assert names == HDR_FIELDS
    assert HDR.size == 112 and "sizeof(struct rec_hdr) == 112" in src
