"""gRPC live on ``lo`` (root): a grpcio KServe v2 server, ``tritonclient.grpc``'s
streaming client, the daemon capturing. One ``ModelStreamInfer`` call carries
several inference requests: each request id must be its own stream row, in
send order, with the text the client received."""

from __future__ import annotations

import queue
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from sniffer.capture.afpacket import have_capture_privilege
from tests.fixture_server import free_port
from tests.test_h2_live import procs  # noqa: F401  (fixture)
from tests.test_live_e2e import daemon, q
from tests.triton_server import serve, words_for

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(not have_capture_privilege(), reason="live capture needs root"),
]


def _input(prompt: str) -> grpcclient.InferInput:
    inp = grpcclient.InferInput("text_input", [1], "BYTES")
    inp.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    return inp


def test_model_stream_infer_each_request_is_a_row(tmp_path: Path, procs: Any) -> None:  # noqa: F811
    port = free_port()
    server = serve(port)
    try:
        d = daemon(procs, tmp_path, "--port", str(port))
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        got: queue.Queue[Any] = queue.Queue()
        client.start_stream(callback=lambda result, error: got.put((result, error)))
        prompts = [f"grpc prompt {i}" for i in range(4)]
        for i, p in enumerate(prompts):
            client.async_stream_infer(
                "ensemble", [_input(p)], request_id=f"req-{i}",
                outputs=[grpcclient.InferRequestedOutput("text_output")],
            )  # fmt: skip
        texts: dict[str, str] = {f"req-{i}": "" for i in range(4)}
        finals = 0
        while finals < 4:
            result, error = got.get(timeout=30)
            assert error is None, error
            resp = result.get_response()
            if resp.outputs:
                texts[resp.id] += result.as_numpy("text_output")[0].decode()
            if resp.parameters["triton_final_response"].bool_param:
                finals += 1
        client.stop_stream()
        unary = client.infer("ensemble", [_input("unary prompt")], request_id="u1")
        unary_text = unary.as_numpy("text_output")[0].decode()
        client.close()
        assert d.stop() == 0
    finally:
        server.stop(0)
    assert texts == {f"req-{i}": "".join(words_for(p)) for i, p in enumerate(prompts)}
    assert unary_text == "".join(words_for("unary prompt"))
    rows = q(
        d.db,
        "select id, dialect, model, state, path from streams"
        " where dialect='kserve.infer' order by id",
    )
    assert [r[2] for r in rows] == ["ensemble"] * 5
    assert all(r[3] == "complete" for r in rows), rows
    assert [r[4] for r in rows] == ["/inference.GRPCInferenceService/ModelStreamInfer"] * 4 + [
        "/inference.GRPCInferenceService/ModelInfer"
    ]
    stored = []
    for sid, *_ in rows:
        chunks = q(d.db, "select text, ts from chunks where stream_id=? order by seq", sid)
        stored.append("".join(t or "" for t, _ in chunks))
        first = q(d.db, "select t_request, t_first_content from streams where id=?", sid)[0]
        assert first[0] <= first[1]
    assert stored == [texts[f"req-{i}"] for i in range(4)] + [unary_text]


def test_other_grpc_service_decoded_with_proto(tmp_path: Path, procs: Any) -> None:  # noqa: F811
    """A grpcio service with no generated code (raw bytes handlers), the daemon
    given its descriptor set with ``--proto``: each message stored as JSON."""
    from concurrent import futures

    import grpc

    from tests.test_grpc import _demo_descriptor_set, _ping

    def route(request: bytes, context: Any) -> bytes:
        return _ping("pong " + request[2 : 2 + request[1]].decode(), 7)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler(
        "demo.Router", {"Route": grpc.unary_unary_rpc_method_handler(route)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = free_port()
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    pb = tmp_path / "demo.pb"
    pb.write_bytes(_demo_descriptor_set())
    try:
        d = daemon(procs, tmp_path, "--port", str(port), "--proto", str(pb))
        with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
            reply = ch.unary_unary("/demo.Router/Route")(_ping("hi", 1), timeout=10)
        assert reply == _ping("pong hi", 7)
        assert d.stop() == 0
    finally:
        server.stop(0)
    rows = q(d.db, "select id, dialect, state, request_json from streams")
    assert len(rows) == 1 and rows[0][1] == "grpc.raw" and rows[0][2] == "complete", rows
    import json

    assert json.loads(rows[0][3])["messages"][0]["json"] == {"text": "hi", "n": 1}
    raws = [
        json.loads(r)
        for (r,) in q(d.db, "select raw from chunks where stream_id=? order by seq", rows[0][0])
    ]
    assert raws[0]["json"] == {"text": "pong hi", "n": 7}
    assert raws[1] == {"grpc_status": 0, "grpc_message": ""}
