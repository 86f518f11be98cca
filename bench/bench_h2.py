"""Benchmark of the HTTP/2 and gRPC stages (sans-IO, in memory).

Builds one h2c connection with real ``h2`` endpoints (client and server):
``--streams`` concurrent OpenAI chat streams of ``--chunks`` SSE events each,
interleaved frame by frame; then the same chats over HTTP/1.1 keep-alive
(chunked SSE), and a KServe v2 ``ModelStreamInfer`` call with ``--streams``
requests of ``--chunks`` responses each (gRPC messages built with
tritonclient's generated classes when installed). Each wire is fed to
``Pipeline.feed_flows`` ``--repeat`` times; prints MB/s and chunk events/s
(median).

    python bench/bench_h2.py [--streams 200] [--chunks 100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import h2.config
import h2.connection
import h2.events
import h2.settings

from sniffer.core.events import ChunkEvent, ConnectionClosed, ConnectionOpened, FlowData, FlowEvent
from sniffer.core.pipeline import Pipeline

C, S = ("127.0.0.1", 40000), ("127.0.0.1", 8000)


def _chunk(i: int, k: int) -> bytes:
    choice = {"index": 0, "delta": {"content": f" w{k}"}, "finish_reason": None}
    obj = {"id": f"c{i}", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def h2_wire(streams: int, chunks: int, grpc: bool = False) -> list[tuple[bool, bytes]]:
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    s = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    wire: list[tuple[bool, bytes]] = []

    def pump() -> None:
        while True:
            cb, sb = c.data_to_send(), s.data_to_send()
            if cb:
                wire.append((True, cb))
                for ev in s.receive_data(cb):
                    if isinstance(ev, h2.events.DataReceived) and ev.stream_id:
                        s.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            if sb:
                wire.append((False, sb))
                for ev in c.receive_data(sb):
                    if isinstance(ev, h2.events.DataReceived) and ev.stream_id:
                        c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            if not cb and not sb:
                return

    c.initiate_connection()
    s.initiate_connection()
    s.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max(100, streams)})
    pump()
    body = json.dumps(
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    )
    sids = []
    for _ in range(streams):
        sid = c.get_next_available_stream_id()
        sids.append(sid)
        c.send_headers(sid, [(":method", "POST"), (":path", "/v1/chat/completions"),
                             (":scheme", "http"), (":authority", "a"),
                             ("content-type", "application/json")])  # fmt: skip
        c.send_data(sid, body.encode(), end_stream=True)
        pump()
        s.send_headers(sid, [(":status", "200"), ("content-type", "text/event-stream")])
    pump()
    for k in range(chunks):
        for i, sid in enumerate(sids):
            s.send_data(sid, _chunk(i, k))
        pump()
    for sid in sids:
        s.send_data(sid, b"data: [DONE]\n\n", end_stream=True)
    pump()
    return wire


def h1_wire(streams: int, chunks: int) -> list[tuple[bool, bytes]]:
    body = json.dumps(
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    )
    wire: list[tuple[bool, bytes]] = []
    for i in range(streams):
        wire.append((True, (f"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\n"
                            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
                            + body).encode()))  # fmt: skip
        wire.append((False, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                            b"transfer-encoding: chunked\r\n\r\n"))  # fmt: skip
        for k in range(chunks):
            d = _chunk(i, k)
            wire.append((False, b"%x\r\n%s\r\n" % (len(d), d)))
        d = b"data: [DONE]\n\n"
        wire.append((False, b"%x\r\n%s\r\n0\r\n\r\n" % (len(d), d)))
    return wire


def grpc_wire(streams: int, chunks: int) -> list[tuple[bool, bytes]] | None:
    try:
        from tritonclient.grpc import service_pb2
    except ImportError:
        return None
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    s = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    wire: list[tuple[bool, bytes]] = []
    c.initiate_connection()
    s.initiate_connection()
    for conn, fc in ((c, True), (s, False)):
        wire.append((fc, conn.data_to_send()))
    s.receive_data(wire[0][1])
    c.receive_data(wire[1][1])
    c.data_to_send(), s.data_to_send()
    c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    wire.append((True, c.data_to_send()))
    s.receive_data(wire[-1][1])
    wire.append((False, s.data_to_send()))
    c.receive_data(wire[-1][1])
    c.increment_flow_control_window(2**30)
    s.increment_flow_control_window(2**30)
    path = "/inference.GRPCInferenceService/ModelStreamInfer"
    c.send_headers(1, [(":method", "POST"), (":path", path), (":scheme", "http"),
                       (":authority", "a"), ("content-type", "application/grpc")])  # fmt: skip

    def frame(m: bytes) -> bytes:
        return b"\x00" + len(m).to_bytes(4, "big") + m

    for i in range(streams):
        req = service_pb2.ModelInferRequest(model_name="ensemble", id=f"r{i}")
        c.send_data(1, frame(req.SerializeToString()))
    wire.append((True, c.data_to_send()))
    s.receive_data(wire[-1][1])
    s.send_headers(1, [(":status", "200"), ("content-type", "application/grpc")])
    for k in range(chunks):
        for i in range(streams):
            r = service_pb2.ModelInferResponse(model_name="ensemble", id=f"r{i}")
            r.parameters["triton_final_response"].bool_param = k == chunks - 1
            o = r.outputs.add()
            o.name, o.datatype = "text_output", "BYTES"
            o.shape.append(1)
            t = f" w{k}".encode()
            r.raw_output_contents.append(len(t).to_bytes(4, "little") + t)
            m = service_pb2.ModelStreamInferResponse(infer_response=r).SerializeToString()
            s.send_data(1, frame(m))
        wire.append((False, s.data_to_send()))
    s.send_headers(1, [("grpc-status", "0")], end_stream=True)
    wire.append((False, s.data_to_send()))
    return wire


def run(wire: list[tuple[bool, bytes]], repeat: int) -> tuple[float, float, int]:
    nbytes = sum(len(b) for _, b in wire)
    times, events = [], 0
    for _ in range(repeat):
        flows: list[FlowEvent] = [ConnectionOpened(1, 0.0, C, S, True)]
        flows += [FlowData(1, 1.0 + i * 1e-6, fc, b) for i, (fc, b) in enumerate(wire)]
        flows.append(ConnectionClosed(1, 9.0, "fin"))
        p = Pipeline()
        t = time.perf_counter()
        out = p.feed_flows(flows)
        times.append(time.perf_counter() - t)
        events = sum(1 for e in out if isinstance(e, ChunkEvent))
    med = statistics.median(times)
    return nbytes / med / 1e6, events / med, events


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--chunks", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    cases = [
        ("HTTP/2 h2c, interleaved", h2_wire(a.streams, a.chunks)),
        ("HTTP/1.1 keep-alive, chunked", h1_wire(a.streams, a.chunks)),
        ("gRPC KServe ModelStreamInfer", grpc_wire(a.streams, a.chunks)),
    ]
    print(f"{a.streams} streams x {a.chunks} chunks, median of {a.repeat}")
    for name, wire in cases:
        if wire is None:
            print(f"{name:32s} skipped (tritonclient[grpc] not installed)")
            continue
        mbs, eps, n = run(wire, a.repeat)
        print(f"{name:32s} {mbs:7.1f} MB/s  {eps:9.0f} chunk events/s  ({n} events)")


if __name__ == "__main__":
    main()
