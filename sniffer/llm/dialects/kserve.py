"""KServe v2 gRPC inference (Triton, TensorRT-LLM) and other gRPC calls.

The gRPC stage (``sniffer.core.grpc``) turns each ``ModelInferRequest`` of a
``ModelStreamInfer`` / ``ModelInfer`` call into its own exchange whose
response is NDJSON, one line per ``ModelInferResponse``::

    {"id": "r1", "model": "ensemble", "final": false, "text_output": " Hello"}
    {"id": "r1", "model": "ensemble", "final": true, "error": "…"}

Mapping: ``text_output`` (non-empty) → CONTENT; ``final`` → FINISH
(``finish_reason`` "stop") then a stream-level DONE; ``error`` → ERROR.

``grpc.raw``: messages of any other gRPC service, one NDJSON line each
(``{"size": n, "raw": base64}``, plus ``"json"`` with a descriptor set), kept as
OTHER chunks with the line as ``raw``; the last line ``{"grpc_status": …}`` is
DONE (status 0) or ERROR.
"""

from __future__ import annotations

from typing import Any

from sniffer.llm.dialects._json import JsonDialect
from sniffer.llm.dialects._json import not_a as _not
from sniffer.llm.dialects.base import CONTENT, DONE, ERROR, FINISH, OTHER, STREAM_LEVEL, Delta

__all__ = ["GrpcRaw", "KServeInfer"]


class KServeInfer(JsonDialect):
    name = "kserve.infer"

    def _streamed(self, obj: Any, data: str, event_type: str) -> list[Delta]:
        if type(obj) is not dict:
            raise _not("response", obj, "an object")
        out: list[Delta] = []
        error = obj.get("error")
        if isinstance(error, str) and error:
            return [Delta(STREAM_LEVEL, ERROR, raw=data, error=error)]
        text = obj.get("text_output")
        if text is not None and type(text) is not str:
            raise _not("text_output", text, "a string")
        final = obj.get("final") is True
        if text:
            out.append(Delta(0, CONTENT, text=text, finish_reason="stop" if final else None))
        elif final:
            out.append(Delta(0, FINISH, finish_reason="stop"))
        else:
            out.append(Delta(0, OTHER, raw=data))
        if final:
            out.append(Delta(STREAM_LEVEL, DONE))
        return out

    def _whole(self, obj: Any, body: str) -> list[Delta]:
        return self._streamed(obj, body, "body")


class GrpcRaw(JsonDialect):
    name = "grpc.raw"

    def _streamed(self, obj: Any, data: str, event_type: str) -> list[Delta]:
        if type(obj) is dict and "grpc_status" in obj:
            if obj["grpc_status"] == 0:
                return [Delta(STREAM_LEVEL, DONE, raw=data)]
            message = f"grpc-status {obj['grpc_status']}: {obj.get('grpc_message') or ''}"
            return [Delta(STREAM_LEVEL, ERROR, raw=data, error=message.rstrip(": "))]
        return [Delta(0, OTHER, raw=data)]

    def _whole(self, obj: Any, body: str) -> list[Delta]:
        return [Delta(0, OTHER, raw=body)]
