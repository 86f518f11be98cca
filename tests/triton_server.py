"""A Triton-compatible KServe v2 gRPC server (grpcio + the service definitions
shipped in ``tritonclient[grpc]``) for the gRPC tests.

``ModelStreamInfer`` answers every request with one response per word of a
deterministic text (``text_output`` BYTES tensor in ``raw_output_contents``,
``triton_final_response`` false), then an empty final response (true), as a
decoupled TensorRT-LLM model does. ``ModelInfer`` answers with the whole text.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc


def words_for(prompt: str, n: int = 6) -> list[str]:
    base = ["alpha", " beta", " gamma", " delta", " épsilon", " 数据", " eta", " theta"]
    k = sum(prompt.encode()) % len(base)
    return [base[(k + i) % len(base)] for i in range(n)]


def _bytes_tensor(*items: bytes) -> bytes:
    return b"".join(len(b).to_bytes(4, "little") + b for b in items)


def _response(
    model: str, rid: str, text: str | None, final: bool
) -> service_pb2.ModelInferResponse:
    r = service_pb2.ModelInferResponse(model_name=model, id=rid)
    r.parameters["triton_final_response"].bool_param = final
    if text is not None:
        out = r.outputs.add()
        out.name = "text_output"
        out.datatype = "BYTES"
        out.shape.append(1)
        r.raw_output_contents.append(_bytes_tensor(text.encode()))
    return r


def _prompt(req: service_pb2.ModelInferRequest) -> str:
    for i, t in enumerate(req.inputs):
        if t.name == "text_input":
            if req.raw_input_contents:
                raw = req.raw_input_contents[i]
                return raw[4:].decode()
            return t.contents.bytes_contents[0].decode()
    return ""


class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    def ModelStreamInfer(
        self, request_iterator: Iterator[service_pb2.ModelInferRequest], context: Any
    ) -> Iterator[service_pb2.ModelStreamInferResponse]:
        for req in request_iterator:
            if req.model_name == "broken":
                yield service_pb2.ModelStreamInferResponse(
                    error_message="model broken is not ready"
                )
                continue
            for w in words_for(_prompt(req)):
                yield service_pb2.ModelStreamInferResponse(
                    infer_response=_response(req.model_name, req.id, w, False)
                )
            yield service_pb2.ModelStreamInferResponse(
                infer_response=_response(req.model_name, req.id, None, True)
            )

    def ModelInfer(
        self, request: service_pb2.ModelInferRequest, context: Any
    ) -> service_pb2.ModelInferResponse:
        r = _response(request.model_name, request.id, "".join(words_for(_prompt(request))), True)
        del r.parameters["triton_final_response"]
        return r


def serve(port: int) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server
