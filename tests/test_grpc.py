"""gRPC over HTTP/2 (sniffer.core.grpc) and the kserve.infer / grpc.raw dialects.

Wire bytes come from real ``h2`` endpoints carrying gRPC messages built with
the KServe v2 classes tritonclient ships (service_pb2)."""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sniffer.core.events import ChunkEvent, PipelineError, StreamClosed, StreamOpened, StreamState
from sniffer.core.grpc import ProtoError, bytes_elements, parse_infer, proto_fields
from tests.test_h2 import Peers, of, run

service_pb2 = pytest.importorskip("tritonclient.grpc.service_pb2")

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
UNARY = "/inference.GRPCInferenceService/ModelInfer"


def frame(msg: bytes, compressed: bool = False) -> bytes:
    if compressed:
        msg = gzip.compress(msg)
    return bytes([1 if compressed else 0]) + len(msg).to_bytes(4, "big") + msg


def call(p: Peers, path: str, extra: list[tuple[str, str]] | None = None) -> int:
    sid = p.c.get_next_available_stream_id()
    p.c.send_headers(
        sid,
        [(":method", "POST"), (":path", path), (":scheme", "http"), (":authority", "a"),
         ("content-type", "application/grpc"), ("te", "trailers"), *(extra or [])],
    )  # fmt: skip
    p.pump()
    return sid


def infer_request(rid: str, prompt: str = "hi") -> bytes:
    r = service_pb2.ModelInferRequest(model_name="trtllm", id=rid)
    t = r.inputs.add()
    t.name, t.datatype = "text_input", "BYTES"
    t.shape.append(1)
    raw = prompt.encode()
    r.raw_input_contents.append(len(raw).to_bytes(4, "little") + raw)
    r.parameters["max_tokens"].int64_param = 8
    return r.SerializeToString()


def infer_response(rid: str, text: str | None, final: bool | None, stream: bool = True) -> bytes:
    r = service_pb2.ModelInferResponse(model_name="trtllm", id=rid)
    if final is not None:
        r.parameters["triton_final_response"].bool_param = final
    if text is not None:
        o = r.outputs.add()
        o.name, o.datatype = "text_output", "BYTES"
        o.shape.append(1)
        o.contents.bytes_contents.append(text.encode())
    if not stream:
        return r.SerializeToString()
    return service_pb2.ModelStreamInferResponse(infer_response=r).SerializeToString()


def respond(p: Peers, sid: int, encoding: str | None = None) -> None:
    h = [(":status", "200"), ("content-type", "application/grpc")]
    if encoding:
        h.append(("grpc-encoding", encoding))
    p.s.send_headers(sid, h)
    p.pump()


def status(p: Peers, sid: int, code: int = 0, message: str | None = None) -> None:
    h = [("grpc-status", str(code))]
    if message:
        h.append(("grpc-message", message))
    p.s.send_headers(sid, h, end_stream=True)
    p.pump()


def test_stream_infer_interleaved_requests_each_get_a_row_in_send_order() -> None:
    p = Peers()
    sid = call(p, STREAM)
    p.c.send_data(sid, frame(infer_request("a", "first")) + frame(infer_request("b", "second")))
    p.pump()
    respond(p, sid)
    for w in ("x1", "x2"):
        p.s.send_data(sid, frame(infer_response("b", "B" + w, False)))
        p.s.send_data(sid, frame(infer_response("a", "A" + w, False)))
        p.pump()
    p.s.send_data(sid, frame(infer_response("a", None, True)))
    p.s.send_data(sid, frame(infer_response("b", "!", True)))
    p.c.end_stream(sid)
    p.pump()
    status(p, sid)
    out = run(p.wire)
    ops = of(out, StreamOpened)
    assert [o.dialect for o in ops] == ["kserve.infer", "kserve.infer"]
    assert [json.loads(o.request_body or "")["id"] for o in ops] == ["a", "b"]
    first = json.loads(ops[0].request_body or "")
    assert first["text_input"] == "first" and first["parameters"] == {"max_tokens": 8}
    assert ops[0].request.model == "trtllm"
    texts: dict[int, str] = {}
    for c in of(out, ChunkEvent):
        texts[c.stream] = texts.get(c.stream, "") + c.text
    assert texts == {ops[0].stream: "Ax1Ax2", ops[1].stream: "Bx1Bx2!"}
    closed = of(out, StreamClosed)
    assert all(c.state is StreamState.COMPLETE for c in closed), closed
    assert not of(out, PipelineError)


def test_unary_model_infer_gzip_and_status() -> None:
    p = Peers()
    sid = call(p, UNARY, [("grpc-encoding", "gzip")])
    p.c.send_data(sid, frame(infer_request("u"), compressed=True), end_stream=True)
    p.pump()
    respond(p, sid, "gzip")
    p.s.send_data(sid, frame(infer_response("u", "whole text", None, stream=False), True))
    p.pump()
    status(p, sid)
    out = run(p.wire)
    (op,) = of(out, StreamOpened)
    assert json.loads(op.request_body or "")["stream"] is False
    assert [c.text for c in of(out, ChunkEvent) if c.text] == ["whole text"]
    (closed,) = of(out, StreamClosed)
    assert closed.state is StreamState.COMPLETE


def test_grpc_status_error_ends_open_requests_with_it() -> None:
    p = Peers()
    sid = call(p, STREAM)
    p.c.send_data(sid, frame(infer_request("a")))
    p.pump()
    respond(p, sid)
    p.s.send_data(sid, frame(infer_response("a", "par", False)))
    p.pump()
    status(p, sid, 14, "backend gone")
    out = run(p.wire)
    (closed,) = of(out, StreamClosed)
    assert closed.state is StreamState.ERROR
    assert closed.error is not None and "UNAVAILABLE: backend gone" in closed.error


def test_error_message_in_stream_response() -> None:
    p = Peers()
    sid = call(p, STREAM)
    p.c.send_data(sid, frame(infer_request("a")))
    p.pump()
    respond(p, sid)
    err = service_pb2.ModelStreamInferResponse(error_message="model not ready")
    p.s.send_data(sid, frame(err.SerializeToString()))
    p.pump()
    status(p, sid)
    out = run(p.wire)
    (closed,) = of(out, StreamClosed)
    assert closed.state is StreamState.ERROR and closed.error == "model not ready"


def test_other_service_messages_are_raw_chunks() -> None:
    p = Peers()
    sid = call(p, "/my.pkg.Router/Route")
    p.c.send_data(sid, frame(b"\x0a\x03abc"), end_stream=True)
    p.pump()
    respond(p, sid)
    p.s.send_data(sid, frame(b"\x08\x01") + frame(b"\x08\x02\x10\x03"))
    p.pump()
    status(p, sid)
    out = run(p.wire)
    (op,) = of(out, StreamOpened)
    assert op.dialect == "grpc.raw" and op.path == "/my.pkg.Router/Route"
    req = json.loads(op.request_body or "")
    assert req["messages"] == [{"size": 5, "raw": base64.b64encode(b"\x0a\x03abc").decode()}]
    raws = [json.loads(c.raw or "") for c in of(out, ChunkEvent)]
    assert raws[-1] == {"grpc_status": 0, "grpc_message": ""}
    raws = raws[:-1]
    assert [r["size"] for r in raws] == [2, 4]
    (closed,) = of(out, StreamClosed)
    assert closed.state is StreamState.COMPLETE and closed.done_seen
    assert base64.b64decode(raws[1]["raw"]) == b"\x08\x02\x10\x03"


def test_bad_message_prefix_is_an_error_other_streams_go_on() -> None:
    p = Peers()
    bad = call(p, STREAM)
    p.c.send_data(bad, b"\x07\xff\xff\xff\xff garbage")
    p.pump()
    good = call(p, UNARY)
    p.c.send_data(good, frame(infer_request("g")), end_stream=True)
    p.pump()
    respond(p, good)
    p.s.send_data(good, frame(infer_response("g", "ok", None, stream=False)))
    p.pump()
    status(p, good)
    out = run(p.wire)
    assert any(e.kind == "grpc" for e in of(out, PipelineError))
    assert [c.text for c in of(out, ChunkEvent) if c.text] == ["ok"]


def test_parse_infer_reads_what_service_pb2_wrote() -> None:
    m = parse_infer(infer_request("r9", "héllo"), request=True)
    assert (m.model, m.id, m.tensors["text_input"]) == ("trtllm", "r9", ["héllo".encode()])
    assert m.parameters == {"max_tokens": 8}
    assert bytes_elements(b"\x01\x00\x00\x00a\x02\x00\x00\x00bc") == [b"a", b"bc"]


@given(st.binary(max_size=200))
def test_proto_reader_never_raises_anything_else(data: bytes) -> None:
    try:
        proto_fields(data)
        parse_infer(data, request=False)
    except ProtoError:
        pass


def test_configured_output_tensor_name() -> None:
    from sniffer.core.events import ConnectionClosed, ConnectionOpened, FlowData
    from sniffer.core.pipeline import Pipeline, PipelineConfig
    from tests.test_h2 import CLIENT, SERVER

    p = Peers()
    sid = call(p, UNARY)
    p.c.send_data(sid, frame(infer_request("u")), end_stream=True)
    p.pump()
    respond(p, sid)
    r = service_pb2.ModelInferResponse(model_name="m", id="u")
    o = r.outputs.add()
    o.name, o.datatype = "generated", "BYTES"
    o.contents.bytes_contents.append(b"custom")
    p.s.send_data(sid, frame(r.SerializeToString()))
    p.pump()
    status(p, sid)
    flows = [ConnectionOpened(1, 0.5, CLIENT, SERVER, True)]
    flows += [FlowData(1, 1.0 + i, fc, d) for i, (fc, d) in enumerate(p.wire)]
    flows.append(ConnectionClosed(1, 99.0, "fin"))
    default = Pipeline().feed_flows(flows)
    assert not [c.text for c in of(default, ChunkEvent) if c.text]
    configured = Pipeline(PipelineConfig(grpc_text_outputs=("generated",))).feed_flows(flows)
    assert [c.text for c in of(configured, ChunkEvent) if c.text] == ["custom"]


def _demo_descriptor_set() -> bytes:
    """``package demo; message Ping {string text = 1; int32 n = 2;}
    service Router {rpc Route(Ping) returns (Ping);}`` as a FileDescriptorSet."""
    from google.protobuf import descriptor_pb2

    f = descriptor_pb2.FileDescriptorProto(name="demo.proto", package="demo", syntax="proto3")
    m = f.message_type.add(name="Ping")
    m.field.add(name="text", number=1, type=9, label=1)  # TYPE_STRING, LABEL_OPTIONAL
    m.field.add(name="n", number=2, type=5, label=1)  # TYPE_INT32
    svc = f.service.add(name="Router")
    svc.method.add(name="Route", input_type=".demo.Ping", output_type=".demo.Ping")
    return descriptor_pb2.FileDescriptorSet(file=[f]).SerializeToString()


def _ping(text: str, n: int) -> bytes:
    raw = text.encode()
    return b"\x0a" + bytes([len(raw)]) + raw + b"\x10" + bytes([n])


def _router_wire() -> list[tuple[bool, bytes]]:
    p = Peers()
    sid = call(p, "/demo.Router/Route")
    p.c.send_data(sid, frame(_ping("hello", 1)), end_stream=True)
    p.pump()
    respond(p, sid)
    p.s.send_data(sid, frame(_ping("world", 2)) + frame(_ping("again", 3)))
    p.pump()
    status(p, sid)
    return p.wire


def _to_pcap(wire: list[tuple[bool, bytes]], path: str, sport: int = 50051) -> None:
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    seq = {True: 1000, False: 9000}
    ports = {True: (41000, sport), False: (sport, 41000)}
    pkts = []

    def pkt(fc: bool, flags: str, payload: bytes = b"") -> None:
        src, dst = ports[fc]
        p = (
            Ether()
            / IP(src="127.0.0.1", dst="127.0.0.1")
            / TCP(sport=src, dport=dst, flags=flags, seq=seq[fc], ack=seq[not fc])
            / payload
        )
        p.time = 1.0 + len(pkts) / 1000
        seq[fc] += len(payload) + (1 if ("S" in flags or "F" in flags) else 0)
        pkts.append(p)

    pkt(True, "S")
    pkt(False, "SA")
    pkt(True, "A")
    for fc, data in wire:
        for i in range(0, len(data), 1400):
            pkt(fc, "PA", data[i : i + 1400])
    pkt(True, "FA")
    pkt(False, "FA")
    pkt(True, "A")
    wrpcap(path, pkts)


def test_descriptor_set_decodes_other_services(tmp_path: Any) -> None:
    from sniffer.core.events import ConnectionClosed, ConnectionOpened, FlowData
    from sniffer.core.pipeline import Pipeline, PipelineConfig
    from tests.test_h2 import CLIENT, SERVER

    wire = _router_wire()
    flows = [ConnectionOpened(1, 0.5, CLIENT, SERVER, True)]
    flows += [FlowData(1, 1.0 + i, fc, d) for i, (fc, d) in enumerate(wire)]
    flows.append(ConnectionClosed(1, 99.0, "fin"))
    out = Pipeline(PipelineConfig(proto_descriptors=_demo_descriptor_set())).feed_flows(flows)
    (op,) = of(out, StreamOpened)
    assert json.loads(op.request_body or "")["messages"][0]["json"] == {"text": "hello", "n": 1}
    decoded = [json.loads(c.raw or "").get("json") for c in of(out, ChunkEvent)][:-1]
    assert decoded == [{"text": "world", "n": 2}, {"text": "again", "n": 3}]


def test_cli_replay_with_proto(tmp_path: Any) -> None:
    import sqlite3

    from click.testing import CliRunner

    from sniffer.cli import main as cli

    pcap = str(tmp_path / "router.pcap")
    _to_pcap(_router_wire(), pcap)
    pb = tmp_path / "demo.pb"
    pb.write_bytes(_demo_descriptor_set())
    db = str(tmp_path / "r.db")
    res = CliRunner().invoke(
        cli, ["replay", pcap, "--db", db, "--proto", str(pb), "--no-tokens", "-q"]
    )
    assert res.exit_code == 0, res.output
    with sqlite3.connect(db) as c:
        (dialect,) = c.execute("select dialect from streams").fetchone()
        raws = [json.loads(r) for (r,) in c.execute("select raw from chunks order by seq")][:-1]
    assert dialect == "grpc.raw"
    assert [r["json"] for r in raws] == [{"text": "world", "n": 2}, {"text": "again", "n": 3}]
    bad = tmp_path / "bad.pb"
    bad.write_bytes(b"\xff\xff not a descriptor set")
    res = CliRunner().invoke(cli, ["replay", pcap, "--db", db, "--proto", str(bad)])
    assert res.exit_code == 2 and "--proto" in res.output
