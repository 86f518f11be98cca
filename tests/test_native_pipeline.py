"""The native pipeline (reassembly and HTTP/1.1 fused in ``sniffer._native.Core``)
against the pure one, where the fusion could make them part: the last-resort
handler (a bug in a stage after the native call, or raised inside it by the
Python HTTP/2 stage, costs that connection only, recorded where the pure
pipeline records it), whole batches against segment by segment, the eBPF path,
capture gaps, idle sweeps, port changes, checkpoints and adoption.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sniffer.capture.pcap import read_capture
from sniffer.core import native
from sniffer.core.events import (
    ACK,
    FIN,
    PSH,
    SYN,
    CaptureGap,
    HttpBody,
    PipelineError,
    Segment,
    StoreEvent,
    StreamClosed,
)
from sniffer.core.h2 import H2Conn
from sniffer.core.pipeline import Pipeline, PipelineConfig
from tests.test_pipeline import REQUEST, RESPONSE, SERVER, segments

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(native.why_unavailable() is not None, reason=str(native.why_unavailable())),
]

ROOT = Path(__file__).resolve().parent.parent
SRV = ("127.0.0.1", 8000)


def _exchange(port: int, t0: float, step: int = 40) -> list[Segment]:
    """A handshake, the chat request, its SSE reply cut every ``step`` bytes, FINs."""
    cli = ("127.0.0.1", port)
    c, s = 1000, 500_000
    segs = [
        Segment(t0, *cli, *SRV, c, 0, SYN, b""),
        Segment(t0, *SRV, *cli, s, c + 1, SYN | ACK, b""),
        Segment(t0, *cli, *SRV, c + 1, s + 1, ACK | PSH, REQUEST),
    ]
    ack = c + 1 + len(REQUEST)
    for i in range(0, len(RESPONSE), step):
        segs.append(
            Segment(t0 + i / 1e4, *SRV, *cli, s + 1 + i, ack, ACK | PSH, RESPONSE[i : i + step])
        )
    end = s + 1 + len(RESPONSE)
    segs.append(Segment(t0 + 1, *SRV, *cli, end, ack, FIN | ACK, b""))
    segs.append(Segment(t0 + 1, *cli, *SRV, ack, end + 1, FIN | ACK, b""))
    return segs


def _interleaved(n: int = 3) -> list[Segment]:
    per = [_exchange(41000 + k, 1.0 + k / 100) for k in range(n)]
    out: list[Segment] = []
    for i in range(max(map(len, per))):
        out += [p[i] for p in per if i < len(p)]
    return out


def _run(pipe: Pipeline, segs: list[Segment], how: str) -> list[StoreEvent]:
    if how == "segments":
        out = [e for s in segs for e in pipe.feed(s)]
    elif how == "list":
        out = pipe.feed_segments(segs)
    else:
        assert native.NATIVE is not None
        out = pipe.feed_batch(native.NATIVE.segment_batch(segs))
    return out + pipe.flush(100.0)


def _faulty(pipe: Pipeline, conn: int, nth: int) -> None:
    """The streams stage raises on the ``nth`` response body piece of ``conn``.
    A native pipeline hands runs of response bodies to the stage in one call
    (``StreamAssembler.feed_held``): there ``conn``'s are left to ``feed_into``
    (as the bodies the native loop does not take are), which raises."""
    feed = pipe.streams.feed_into
    seen = [0]

    def feed_into(ev: Any, out: list[StoreEvent]) -> None:
        if type(ev) is HttpBody and ev.conn == conn and not ev.from_client:
            seen[0] += 1
            if seen[0] == nth:
                raise RuntimeError("a bug")
        feed(ev, out)

    pipe.streams.feed_into = feed_into  # type: ignore[method-assign]
    held = pipe.streams.feed_held

    def feed_held(core: Any, i: int, stop: int, *args: Any) -> tuple[int, Any]:
        k = i
        while k < stop and core.body(k) is not None and core.body(k).conn != conn:
            k += 1
        return held(core, i, k, *args) if k > i else (i, None)

    pipe.streams.feed_held = feed_held  # type: ignore[method-assign]


@pytest.mark.parametrize("how", ["segments", "list", "batch"])
def test_whole_batches_give_what_segments_give(how: str) -> None:
    segs = _interleaved()
    want = _run(Pipeline(PipelineConfig(native=False)), segs, "segments")
    assert _run(Pipeline(PipelineConfig(native=True)), segs, how) == want
    assert sum(isinstance(e, StreamClosed) for e in want) == 3


#: What the native item loop reads and writes of an exchange (``chunks.rs``).
_LOOP_STATE = (
    "seq",
    "chunk_count",
    "event_count",
    "text_len",
    "t_first",
    "t_last",
    "resp_bytes",
    "done_seen",
    "quiet",
    "invalid",
    "usage",
    "error",
    "chunk_idx",
    "finish",
    "flags",
)


@pytest.mark.parametrize("cut", [29, 37, 45, 55])
def test_open_exchanges_after_a_batch_hold_what_each_body_gave(cut: int) -> None:
    """The native item loop reads an exchange's state at its first body of a
    call and writes it back once, at the end of the call (``chunks::Fed``):
    after one batch of interleaved streams ending mid-way, every open
    exchange holds what the pure stage's holds after the same segments one
    by one (what a later close, a checkpoint or the next call reads)."""
    segs = _interleaved(4)[:cut]
    pure = Pipeline(PipelineConfig(native=False))
    for seg in segs:
        pure.feed(seg)
    nat = Pipeline(PipelineConfig(native=True))
    assert native.NATIVE is not None
    nat.feed_batch(native.NATIVE.segment_batch(segs))

    def state(p: Pipeline) -> dict[Any, tuple[Any, ...]]:
        return {k: tuple(getattr(x, f) for f in _LOOP_STATE) for k, x in p.streams._ex.items()}

    got = state(nat)
    assert got == state(pure)
    assert len(got) == 4 and all(v[0] > 0 for v in got.values())  # every stream fed, open


@pytest.mark.parametrize("how", ["segments", "batch"])
@pytest.mark.parametrize("nth", [1, 3])
def test_a_bug_after_the_native_call_costs_one_connection(how: str, nth: int) -> None:
    segs = _interleaved()
    outs = []
    for is_native in (False, True):
        pipe = Pipeline(PipelineConfig(native=is_native))
        _faulty(pipe, 2, nth)
        outs.append((_run(pipe, segs, "segments" if not is_native else how), pipe.internal_errors))
    assert outs[0] == outs[1]
    out, errors = outs[0]
    (err,) = [e for e in out if isinstance(e, PipelineError)]
    assert (
        errors == 1 and err.conn == 2 and "RuntimeError: a bug (connection dropped)" in err.message
    )
    clean = _run(Pipeline(PipelineConfig(native=False)), segs, "segments")
    closed = [(e.stream, e.state, e.reason) for e in out if isinstance(e, StreamClosed)]
    want = [(e.stream, e.state, e.reason) for e in clean if isinstance(e, StreamClosed)]
    assert [c for c in closed if c[0] != 2] == [c for c in want if c[0] != 2]  # the others intact


def test_response_bodies_reach_the_stage_in_runs_not_as_http_bodies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The core holds the response bodies (``None`` in its outputs) and the
    stage takes each run of them in one call: no ``HttpBody`` of a response
    is made for ``feed_into``, and the store is the pure pipeline's."""
    segs = _interleaved()
    pipe = Pipeline(PipelineConfig(native=True))
    seen: list[Any] = []
    runs: list[int] = []
    feed, held = pipe.streams.feed_into, pipe.streams.feed_held

    def feed_into(ev: Any, out: list[StoreEvent]) -> None:
        seen.append(ev)
        feed(ev, out)

    def feed_held(core: Any, i: int, stop: int, *args: Any) -> tuple[int, Any]:
        j, exc = held(core, i, stop, *args)
        runs.append(j - i)
        return j, exc

    monkeypatch.setattr(pipe.streams, "feed_into", feed_into)
    monkeypatch.setattr(pipe.streams, "feed_held", feed_held)
    out = _run(pipe, segs, "batch")
    assert not [e for e in seen if type(e) is HttpBody and not e.from_client]
    pure = Pipeline(PipelineConfig(native=False))
    feed = pure.streams.feed_into  # what the counting ``feed_into`` calls from now on
    seen.clear()
    monkeypatch.setattr(pure.streams, "feed_into", feed_into)
    assert out == _run(pure, segs, "segments")
    bodies = sum(1 for e in seen if type(e) is HttpBody and not e.from_client)
    assert sum(runs) == bodies and len(runs) < bodies / 4


def test_a_body_of_a_grpc_call_goes_to_the_splitter_as_an_http_body(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While gRPC calls are open every event goes through the splitter; a
    held body of one of its calls is left to it (as an ``HttpBody``), the
    others are still taken in runs."""
    segs = _interleaved()
    pipe = Pipeline(PipelineConfig(native=True))
    seen: list[Any] = []
    monkeypatch.setattr(pipe.grpc, "open_calls", {(2, 0): None})  # conn 2's exchange

    def feed(ev: Any) -> list[Any]:
        seen.append(ev)
        return [ev]

    monkeypatch.setattr(pipe.grpc, "feed", feed)
    out = _run(pipe, segs, "batch")
    assert out == _run(Pipeline(PipelineConfig(native=False)), segs, "segments")
    bodies = {e.conn for e in seen if type(e) is HttpBody and not e.from_client}
    assert bodies == {2}


def _raising_dialect(monkeypatch: pytest.MonkeyPatch, nth: int) -> None:
    """The chat dialect's ``event`` (every item's: the native extraction off)
    raises on its ``nth`` call."""
    from sniffer.llm.dialects.openai import OpenAIChat, _OpenAIBase

    real = _OpenAIBase.event
    calls = [0]

    def event(self: Any, data: str, event_type: str) -> Any:
        calls[0] += 1
        if calls[0] == nth:
            raise RuntimeError("a dialect bug")
        return real(self, data, event_type)

    monkeypatch.setattr(OpenAIChat, "native_chunks", 0)
    monkeypatch.setattr(_OpenAIBase, "event", event)


@pytest.mark.parametrize("how", ["segments", "batch"])
@pytest.mark.parametrize("contain_fails", [False, True])
def test_a_bug_in_a_held_body_is_contained_where_the_pure_stage_contains_it(
    monkeypatch: pytest.MonkeyPatch, how: str, contain_fails: bool
) -> None:
    """A dialect raising on a response body the core held costs its exchange,
    as in the pure pipeline; if containing it raises too, the connection."""
    from sniffer.core.streams import StreamAssembler

    if contain_fails:

        def contain(self: Any, ev: Any, exc: BaseException, out: Any) -> None:
            raise RuntimeError("a bug while containing")

        monkeypatch.setattr(StreamAssembler, "_contain", contain)
    segs = _interleaved()
    outs = []
    for is_native in (False, True):
        _raising_dialect(monkeypatch, 7)
        pipe = Pipeline(PipelineConfig(native=is_native))
        outs.append((_run(pipe, segs, how if is_native else "segments"), pipe.internal_errors))
    assert outs[0] == outs[1]
    out, errors = outs[0]
    (err,) = [e for e in out if isinstance(e, PipelineError)]
    if contain_fails:
        assert errors == 1 and "a bug while containing (connection dropped)" in err.message
    else:
        assert errors == 0 and (err.stage, err.kind) == ("streams", "internal")
        assert err.message == "RuntimeError while handling HttpBody" and err.stream is not None


H2_CAPTURES = sorted((ROOT / "pcaps" / "h2").glob("*.pcap"))


@pytest.mark.parametrize("path", H2_CAPTURES, ids=lambda p: p.name)
def test_a_bug_in_the_python_h2_stage_inside_the_native_call(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP/2 is parsed by the Python stage, called from inside the native call:
    what it raises costs its connection there too, recorded at the same place."""
    real = H2Conn.data
    calls = [0]

    def data(self: H2Conn, from_client: bool, ts: float, data: bytes) -> Any:
        calls[0] += 1
        if calls[0] % 3 == 2:
            raise ValueError("h2 bug")
        return real(self, from_client, ts, data)

    monkeypatch.setattr(H2Conn, "data", data)
    segs = list(read_capture(path))
    outs = []
    for is_native in (False, True):
        calls[0] = 0
        pipe = Pipeline(PipelineConfig(native=is_native))
        outs.append((_run(pipe, segs, "batch" if is_native else "segments"), pipe.internal_errors))
    assert outs[0] == outs[1]
    if calls[0] >= 2:
        assert outs[0][1] > 0


def test_the_ebpf_path_capture_gaps_and_idle_sweeps() -> None:
    segs = _interleaved()
    half = len(segs) // 2
    outs = []
    for is_native in (False, True):
        pipe = Pipeline(PipelineConfig(native=is_native, idle_timeout=0.5))
        out = [e for s in segs[:half] for e in pipe.feed(s)]
        out += pipe.capture_gap(CaptureGap(1.5, 7, "kernel"))
        out += [e for s in segs[half:] for e in pipe.feed(s)]
        out += pipe.expire(50.0)
        out += pipe.flush(100.0)
        outs.append((out, pipe.reassembly_counts(), pipe.open_connections, pipe.open_streams))
    assert outs[0] == outs[1]
    # flow events fed as the eBPF source gives them: the native HTTP parser takes them
    flows = []
    r = Pipeline(PipelineConfig(native=False)).reassembler
    for s in segs:
        flows += r.feed(s)
    flows += r.flush(100.0)
    a = Pipeline(PipelineConfig(native=False))
    b = Pipeline(PipelineConfig(native=True))
    assert a.feed_flows(flows) + a.flush(101.0) == b.feed_flows(flows) + b.flush(101.0)
    assert a.http.stats == b.http.stats


def test_set_ports_and_checkpoint_then_adopt() -> None:
    segs = _interleaved()
    cut = len(segs) // 2
    outs = []
    for is_native in (False, True):
        pipe = Pipeline(PipelineConfig(native=is_native))
        out = [e for s in segs[:cut] for e in pipe.feed(s)]
        entries = pipe.checkpoint(None, 2.0)
        out += pipe.flush(2.0)
        nxt = Pipeline(PipelineConfig(native=is_native, conn_id_base=100, stream_id_base=100))
        n = nxt.adopt(entries, 2.0)
        nxt.set_ports(frozenset({8000}))
        out += [e for s in segs[cut:] for e in nxt.feed(s)]
        nxt.set_ports(frozenset({9999}))
        out += [e for s in segs for e in nxt.feed(s)]
        out += nxt.flush(100.0)
        outs.append((out, entries, n, nxt.skipped, nxt.reassembly_counts()))
    assert outs[0] == outs[1]
    assert outs[0][2] == 3 and outs[0][3] == len(segs)


def test_a_native_pipeline_may_change_threads() -> None:
    """The daemon makes its pipeline on one thread, feeds it on another, and the
    last reference may go anywhere: no native part is bound to a thread."""
    import sys
    import threading

    made: list[Pipeline] = []
    raised: list[object] = []
    hook = sys.unraisablehook
    sys.unraisablehook = raised.append
    try:
        t = threading.Thread(target=lambda: made.append(Pipeline(PipelineConfig(native=True))))
        t.start()
        t.join()
        pipe = made.pop()
        out = _run(pipe, _interleaved(1), "batch")
        assert sum(isinstance(e, StreamClosed) for e in out) == 1
        box = [pipe]
        del pipe
        t = threading.Thread(target=box.clear)
        t.start()
        t.join()
    finally:
        sys.unraisablehook = hook
    assert raised == []


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(segments, max_size=40), st.booleans(), st.lists(st.integers(0, 40), max_size=4))
def test_arbitrary_segments_in_any_batches_store_the_same(
    raw: list[tuple[tuple[str, int], bool, int, int, bytes]], midstream: bool, cuts: list[int]
) -> None:
    """Generated segments (HTTP-ish, TLS, junk, SYN/FIN/RST anywhere): the pure
    pipeline fed one by one, the native one in batches cut anywhere, the same
    store events and counters."""
    segs = []
    for i, ((ip, port), to_server, seq, flags, payload) in enumerate(raw):
        server_ip = "::1" if ":" in ip else "127.0.0.1"
        ends = ((ip, port), (server_ip, SERVER))
        src, dst = ends if to_server else ends[::-1]
        segs.append(Segment(float(i), *src, *dst, seq, 0, flags, payload))
    cfg = {"server_ports": frozenset({SERVER}) if midstream else frozenset()}
    pure = Pipeline(PipelineConfig(native=False, **cfg))
    nat = Pipeline(PipelineConfig(native=True, **cfg))
    want = [e for s in segs for e in pure.feed(s)] + pure.flush(float(len(raw)))
    assert native.NATIVE is not None
    batch = native.NATIVE.segment_batch(segs)
    got: list[StoreEvent] = []
    at = sorted({min(c, len(segs)) for c in cuts})
    for a, b in zip([0, *at], [*at, len(segs)], strict=True):
        got += nat.feed_batch(batch, a, b)
    got += nat.flush(float(len(raw)))
    assert got == want
    assert nat.reassembly_counts() == pure.reassembly_counts()
    assert nat.http.stats == pure.http.stats
    assert (nat.internal_errors, nat.segments) == (pure.internal_errors, pure.segments)
