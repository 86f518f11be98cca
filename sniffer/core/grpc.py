"""gRPC over HTTP/2: length-prefixed messages, status trailers, KServe v2 (sans-IO).

Sits between the HTTP parsers and ``streams``: every exchange whose request
``content-type`` is ``application/grpc…`` is taken apart here; everything else
passes through untouched.

* Messages are 5-byte prefixed (compressed flag, big-endian length); a
  compressed message is inflated when ``grpc-encoding`` is ``gzip`` (another
  coding is an error on that exchange).
* ``grpc-status`` / ``grpc-message`` (in the trailers, or a trailers-only
  response) end the call: status 0 is complete, anything else an error with
  the status name and message.
* KServe v2 ``inference.GRPCInferenceService/ModelStreamInfer`` and
  ``ModelInfer`` (Triton, TensorRT-LLM): each ``ModelInferRequest`` on the call
  becomes its own *virtual exchange* (so its own stream row, TTFT and verdict),
  numbered ``(h2 exchange << 16) + k`` for the k-th request of the call, in the
  order the requests were sent. Its request body is a JSON summary
  (``model``, ``id``, ``stream``, ``text_input``, ``parameters``); each
  ``ModelInferResponse`` for it becomes one NDJSON line (``id``, ``model``,
  ``text_output``, ``final``, ``error``) which the ``kserve.infer`` dialect
  turns into chunks. Responses are matched to requests by ``id``, else to the
  oldest open request. ``triton_final_response`` (absent: every response is
  final) ends the virtual exchange.
* Messages of other gRPC services stay one exchange whose response body is
  NDJSON, one line per message: ``{"size": n, "raw": base64}`` (the
  ``grpc.raw`` dialect records them as chunks), then a last line
  ``{"grpc_status": code, "grpc_message": text}``. Given a descriptor set
  (``ProtoCatalog``, from ``protoc --include_imports -o FILE.pb``), a method it
  describes gets each message decoded too: ``"json"`` holds the message as
  protobuf's JSON mapping.

Protobuf is read with the small wire-format reader below (varint,
length-delimited, fixed32/64); no generated classes are needed.
"""

from __future__ import annotations

import base64
import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any

from sniffer.core.events import (
    ConnectionClosed,
    EndReason,
    FlowGap,
    Headers,
    HttpBody,
    HttpEnd,
    HttpError,
    HttpRequest,
    HttpResponse,
    HttpTrailers,
)

KSERVE_SERVICE = "/inference.GRPCInferenceService/"
KSERVE_STREAM = KSERVE_SERVICE + "ModelStreamInfer"
KSERVE_UNARY = KSERVE_SERVICE + "ModelInfer"
TEXT_OUTPUTS = ("text_output", "output", "OUTPUT0")
TEXT_INPUTS = ("text_input", "prompt", "PROMPT", "INPUT0")
NDJSON: Headers = (("content-type", "application/x-ndjson"),)
_MAX_MESSAGE = 64 << 20

GRPC_STATUS = {
    0: "OK",
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    9: "FAILED_PRECONDITION",
    10: "ABORTED",
    11: "OUT_OF_RANGE",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    15: "DATA_LOSS",
    16: "UNAUTHENTICATED",
}

GrpcInput = HttpRequest | HttpResponse | HttpBody | HttpEnd | HttpError | HttpTrailers


# ------------------------------------------------------------------ protobuf


class ProtoError(ValueError):
    pass


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ProtoError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def proto_fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """(field number, value) pairs of one protobuf message: ints for varint and
    fixed fields, bytes for length-delimited ones. ``ProtoError`` if malformed."""
    out: list[tuple[int, int | bytes]] = []
    pos = 0
    n = len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise ProtoError("field number 0")
        if wt == 0:
            v, pos = _varint(buf, pos)
            out.append((num, v))
        elif wt == 2:
            ln, pos = _varint(buf, pos)
            if pos + ln > n:
                raise ProtoError("truncated length-delimited field")
            out.append((num, bytes(buf[pos : pos + ln])))
            pos += ln
        elif wt == 1:
            if pos + 8 > n:
                raise ProtoError("truncated fixed64")
            out.append((num, int.from_bytes(buf[pos : pos + 8], "little")))
            pos += 8
        elif wt == 5:
            if pos + 4 > n:
                raise ProtoError("truncated fixed32")
            out.append((num, int.from_bytes(buf[pos : pos + 4], "little")))
            pos += 4
        else:
            raise ProtoError(f"wire type {wt}")
    return out


def _str(v: int | bytes) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _params(entries: list[bytes]) -> dict[str, Any]:
    """A ``map<string, InferParameter>`` from its entries."""
    out: dict[str, Any] = {}
    for entry in entries:
        key = ""
        value: Any = None
        for num, v in proto_fields(entry):
            if num == 1:
                key = _str(v)
            elif num == 2 and isinstance(v, bytes):
                for pn, pv in proto_fields(v):
                    if pn == 1:
                        value = bool(pv)
                    elif pn in (2, 5):
                        value = pv if isinstance(pv, int) else None
                        if pn == 2 and isinstance(value, int) and value >= 1 << 63:
                            value -= 1 << 64
                    elif pn == 3:
                        value = _str(pv)
                    elif pn == 4 and isinstance(pv, int):
                        value = struct.unpack("<d", pv.to_bytes(8, "little"))[0]
        out[key] = value
    return out


def bytes_elements(raw: bytes) -> list[bytes]:
    """Elements of a BYTES tensor in raw form (4-byte little-endian length each)."""
    out: list[bytes] = []
    pos = 0
    while pos + 4 <= len(raw):
        ln = int.from_bytes(raw[pos : pos + 4], "little")
        pos += 4
        if pos + ln > len(raw):
            raise ProtoError("truncated BYTES element")
        out.append(raw[pos : pos + ln])
        pos += ln
    return out


@dataclass(slots=True)
class InferMessage:
    """The fields of a ``ModelInferRequest`` / ``ModelInferResponse`` we record."""

    model: str = ""
    version: str = ""
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, list[bytes]] = field(default_factory=dict)  # BYTES tensors by name


def parse_infer(buf: bytes, request: bool) -> InferMessage:
    """A ModelInferRequest (``request``) or ModelInferResponse."""
    m = InferMessage()
    params: list[bytes] = []
    tensors: list[tuple[str, str, list[bytes]]] = []  # name, datatype, contents
    raw: list[bytes] = []
    tensor_field = 5
    raw_field = 7 if request else 6
    for num, v in proto_fields(buf):
        if num == 1:
            m.model = _str(v)
        elif num == 2:
            m.version = _str(v)
        elif num == 3:
            m.id = _str(v)
        elif num == 4 and isinstance(v, bytes):
            params.append(v)
        elif num == tensor_field and isinstance(v, bytes):
            name = dtype = ""
            contents: list[bytes] = []
            for tn, tv in proto_fields(v):
                if tn == 1:
                    name = _str(tv)
                elif tn == 2:
                    dtype = _str(tv)
                elif tn == 5 and isinstance(tv, bytes):
                    contents = [c for cn, c in proto_fields(tv) if cn == 8 and isinstance(c, bytes)]
            tensors.append((name, dtype, contents))
        elif num == raw_field and isinstance(v, bytes):
            raw.append(v)
    m.parameters = _params(params)
    for i, (name, dtype, contents) in enumerate(tensors):
        if dtype != "BYTES":
            continue
        if raw:
            m.tensors[name] = bytes_elements(raw[i]) if i < len(raw) else []
        else:
            m.tensors[name] = contents
    return m


def _text(m: InferMessage, names: tuple[str, ...]) -> str | None:
    for name in names:
        if name in m.tensors:
            return "".join(e.decode("utf-8", "replace") for e in m.tensors[name])
    return None


# ------------------------------------------------------------ descriptor set


class ProtoCatalog:
    """Message types of the gRPC methods a ``FileDescriptorSet`` describes.

    ``ProtoCatalog(data)`` takes the serialized set (``protoc --include_imports
    --descriptor_set_out``); ``ValueError`` if it cannot be read."""

    def __init__(self, data: bytes) -> None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

        fds = descriptor_pb2.FileDescriptorSet()
        try:
            fds.ParseFromString(data)
            pool = descriptor_pool.DescriptorPool()
            for f in fds.file:
                pool.Add(f)
            self._methods: dict[str, tuple[Any, Any]] = {}
            for f in fds.file:
                for svc in f.service:
                    name = f"{f.package}.{svc.name}" if f.package else svc.name
                    sd = pool.FindServiceByName(name)
                    for m in sd.methods:
                        self._methods[f"/{name}/{m.name}"] = (
                            message_factory.GetMessageClass(m.input_type),
                            message_factory.GetMessageClass(m.output_type),
                        )
        except Exception as exc:  # protobuf raises several types for a bad set
            raise ValueError(f"not a usable descriptor set: {exc}") from exc

    @property
    def methods(self) -> list[str]:
        return sorted(self._methods)

    def decode(self, path: str, request: bool, msg: bytes) -> dict[str, Any] | None:
        """The message as protobuf's JSON mapping, or None (unknown method, bad bytes)."""
        from google.protobuf import json_format
        from google.protobuf.message import DecodeError

        types = self._methods.get(path)
        if types is None:
            return None
        m = types[0 if request else 1]()
        try:
            m.ParseFromString(msg)
        except DecodeError:
            return None
        out: dict[str, Any] = json_format.MessageToDict(m)
        return out


# --------------------------------------------------------------------- calls


class _Messages:
    """Length-prefixed gRPC messages of one direction of one call."""

    __slots__ = ("buf", "coding", "failed")

    def __init__(self, coding: str) -> None:
        self.buf = bytearray()
        self.coding = coding
        self.failed = False

    def feed(self, data: bytes) -> list[bytes]:
        self.buf += data
        out: list[bytes] = []
        buf = self.buf
        while len(buf) >= 5:
            flag = buf[0]
            ln = int.from_bytes(buf[1:5], "big")
            if ln > _MAX_MESSAGE or flag > 1:
                raise ProtoError(f"bad message prefix (flag {flag}, length {ln})")
            if len(buf) < 5 + ln:
                break
            msg = bytes(buf[5 : 5 + ln])
            del buf[: 5 + ln]
            if flag:
                if self.coding not in ("gzip", "deflate"):
                    raise ProtoError(f"compressed message with grpc-encoding {self.coding!r}")
                try:
                    wbits = 16 + zlib.MAX_WBITS if self.coding == "gzip" else zlib.MAX_WBITS
                    msg = zlib.decompress(msg, wbits)
                except zlib.error as exc:
                    raise ProtoError(f"{self.coding}: {exc}") from exc
            out.append(msg)
        return out


class _Virtual:
    __slots__ = ("ex", "id", "responded")

    def __init__(self, ex: int, rid: str) -> None:
        self.ex = ex
        self.id = rid
        self.responded = False


class _Call:
    __slots__ = (
        "closed",
        "conn",
        "ex",
        "kserve",
        "next_k",
        "open",
        "raw_req",
        "raw_sent",
        "req",
        "req_msgs",
        "resp_msgs",
        "status_seen",
        "stream",
    )

    def __init__(self, req: HttpRequest) -> None:
        self.conn = req.conn
        self.ex = req.exchange
        self.req = req
        path = req.target.split("?", 1)[0]
        self.kserve = path in (KSERVE_STREAM, KSERVE_UNARY)
        self.stream = path == KSERVE_STREAM
        coding = _header(req.headers, "grpc-encoding") or "identity"
        self.req_msgs = _Messages(coding)
        self.resp_msgs = _Messages("identity")
        self.open: list[_Virtual] = []  # KServe requests not finished, in send order
        self.next_k = 0
        self.status_seen = False
        self.closed = False
        self.raw_req: list[bytes] = []  # other services: request messages until sent
        self.raw_sent = False


def _header(headers: Headers, name: str) -> str | None:
    for n, v in headers:
        if n == name:
            return v
    return None


def is_grpc(headers: Headers) -> bool:
    ctype = _header(headers, "content-type") or ""
    return ctype.startswith("application/grpc")


class GrpcSplitter:
    """HTTP events in, HTTP events out: gRPC calls rewritten as described above."""

    def __init__(
        self, text_outputs: tuple[str, ...] = TEXT_OUTPUTS, catalog: ProtoCatalog | None = None
    ) -> None:
        self._calls: dict[tuple[int, int], _Call] = {}
        #: the calls in progress (the same dict for the splitter's life, never
        #: rebound): empty means ``feed`` has nothing to rewrite but requests.
        #: Read by the pipeline once per batch instead of ``active`` per event.
        self.open_calls: dict[tuple[int, int], _Call] = self._calls
        self._catalog = catalog
        self._text_outputs = text_outputs
        self.messages = 0
        self.errors = 0

    @property
    def active(self) -> bool:
        return bool(self._calls)

    def feed(self, ev: object) -> list[Any]:
        t = type(ev)
        if t is HttpRequest:
            assert isinstance(ev, HttpRequest)
            if ev.version == "2" and is_grpc(ev.headers):
                new = _Call(ev)
                self._calls[(ev.conn, ev.exchange)] = new
                if not new.kserve:
                    return [ev]
                return []
            return [ev]
        if not self._calls or t not in _HTTP_TYPES:
            if t is ConnectionClosed and self._calls:
                assert isinstance(ev, ConnectionClosed)
                for key in [k for k in self._calls if k[0] == ev.conn]:
                    del self._calls[key]
            elif t is FlowGap and self._calls:
                assert isinstance(ev, FlowGap)
                if ev.nbytes is not None or ev.reason == "midstream":
                    return self._lost(ev)
            return [ev]
        ex = getattr(ev, "exchange", None)
        found = self._calls.get((getattr(ev, "conn", -1), ex if ex is not None else -1))
        if found is None:
            return [ev]
        call = found
        out: list[Any] = []
        try:
            if t is HttpBody:
                assert isinstance(ev, HttpBody)
                self._body(call, ev, out)
            elif t is HttpResponse:
                assert isinstance(ev, HttpResponse)
                self._response(call, ev, out)
            elif t is HttpTrailers:
                assert isinstance(ev, HttpTrailers)
                if not ev.from_client:
                    self._status(call, ev.ts, ev.headers, out)
            elif t is HttpEnd:
                assert isinstance(ev, HttpEnd)
                self._end(call, ev, out)
            elif t is HttpError:
                assert isinstance(ev, HttpError)
                if call.kserve:
                    for v in call.open:
                        out.append(
                            HttpError(ev.conn, v.ex, ev.ts, ev.from_client, ev.kind, ev.message)
                        )
                else:
                    out.append(ev)
        except ProtoError as exc:
            self._fail(
                call, getattr(ev, "ts", 0.0), getattr(ev, "from_client", False), str(exc), out
            )
        return out

    def _lost(self, ev: FlowGap) -> list[Any]:
        """Bytes of the connection were lost: the message framing of its calls is
        broken (a length prefix may be gone), so they end here as gaps."""
        out: list[Any] = [ev]
        for key in [k for k in self._calls if k[0] == ev.conn]:
            call = self._calls.pop(key)
            if call.kserve:
                for v in call.open:
                    if not v.responded:
                        out.append(HttpResponse(call.conn, v.ex, ev.ts, 200, "", "2", NDJSON))
                    out.append(HttpEnd(call.conn, v.ex, ev.ts, False, EndReason.GAP))
            else:
                out.append(HttpEnd(call.conn, call.ex, ev.ts, False, EndReason.GAP))
        return out

    # ------------------------------------------------------------------ parts

    def _response(self, call: _Call, ev: HttpResponse, out: list[Any]) -> None:
        call.resp_msgs.coding = _header(ev.headers, "grpc-encoding") or "identity"
        if not call.kserve:
            self._raw_request(call, ev.ts, out)
            out.append(
                HttpResponse(ev.conn, ev.exchange, ev.ts, ev.status, ev.reason, ev.version,
                             (*NDJSON, *ev.headers), ev.informational)
            )  # fmt: skip
        if _header(ev.headers, "grpc-status") is not None:  # trailers-only response
            self._status(call, ev.ts, ev.headers, out)

    def _body(self, call: _Call, ev: HttpBody, out: list[Any]) -> None:
        if ev.from_client:
            msgs = call.req_msgs.feed(ev.data)
            self.messages += len(msgs)
            if not call.kserve:
                call.raw_req.extend(msgs)
                return
            for msg in msgs:
                self._infer_request(call, ev.ts, msg, out)
        else:
            msgs = call.resp_msgs.feed(ev.data)
            self.messages += len(msgs)
            if not call.kserve:
                lines = b"".join(
                    json.dumps(self._raw(call, False, m)).encode() + b"\n" for m in msgs
                )
                if lines:
                    out.append(HttpBody(ev.conn, ev.exchange, ev.ts, False, lines))
                return
            for msg in msgs:
                self._infer_response(call, ev.ts, msg, out)

    def _raw(self, call: _Call, request: bool, msg: bytes) -> dict[str, Any]:
        item: dict[str, Any] = {"size": len(msg), "raw": base64.b64encode(msg).decode()}
        if self._catalog is not None:
            decoded = self._catalog.decode(call.req.target.split("?", 1)[0], request, msg)
            if decoded is not None:
                item["json"] = decoded
        return item

    def _raw_request(self, call: _Call, ts: float, out: list[Any]) -> None:
        """A non-KServe call's request messages, as one JSON document (once: the
        stream row opens on it; messages sent after the response began are counted
        only)."""
        if call.raw_sent:
            return
        call.raw_sent = True
        doc = {
            "grpc": call.req.target,
            "messages": [self._raw(call, True, m) for m in call.raw_req],
        }
        out.append(HttpBody(call.conn, call.ex, ts, True, json.dumps(doc).encode()))
        call.raw_req.clear()

    def _infer_request(self, call: _Call, ts: float, msg: bytes, out: list[Any]) -> None:
        m = parse_infer(msg, request=True)
        ex = (call.ex << 16) + call.next_k
        call.next_k += 1
        v = _Virtual(ex, m.id)
        call.open.append(v)
        body: dict[str, Any] = {"model": m.model, "id": m.id, "stream": call.stream}
        if m.version:
            body["model_version"] = m.version
        text = _text(m, TEXT_INPUTS)
        if text is not None:
            body["text_input"] = text
        if m.parameters:
            body["parameters"] = m.parameters
        req = call.req
        out.append(HttpRequest(call.conn, ex, ts, "POST", req.target, "2", req.headers))
        out.append(HttpBody(call.conn, ex, ts, True, json.dumps(body).encode()))
        out.append(HttpEnd(call.conn, ex, ts, True, EndReason.COMPLETE))

    def _infer_response(self, call: _Call, ts: float, msg: bytes, out: list[Any]) -> None:
        error: str | None = None
        inner: bytes | None = msg
        if call.stream:
            inner = None
            for num, val in proto_fields(msg):
                if num == 1:
                    error = _str(val) or None
                elif num == 2 and isinstance(val, bytes):
                    inner = val
        m = parse_infer(inner, request=False) if inner is not None else InferMessage()
        v = next((x for x in call.open if m.id and x.id == m.id), None)
        if v is None and call.open:
            v = call.open[0]
        if v is None:
            self.errors += 1
            out.append(
                HttpError(
                    call.conn, None, ts, False, "grpc", f"response for unknown request {m.id!r}"
                )
            )
            return
        if not v.responded:
            v.responded = True
            out.append(HttpResponse(call.conn, v.ex, ts, 200, "", "2", NDJSON))
        final = m.parameters.get("triton_final_response")
        is_final = True if final is None else bool(final)
        line: dict[str, Any] = {"id": m.id, "model": m.model, "final": is_final}
        text = _text(m, self._text_outputs)
        if text is not None:
            line["text_output"] = text
        if error:
            line["error"] = error
        out.append(HttpBody(call.conn, v.ex, ts, False, json.dumps(line).encode() + b"\n"))
        if is_final or error:
            out.append(HttpEnd(call.conn, v.ex, ts, False, EndReason.COMPLETE))
            call.open.remove(v)

    def _status(self, call: _Call, ts: float, headers: Headers, out: list[Any]) -> None:
        status = _header(headers, "grpc-status")
        if status is None or call.status_seen:
            return
        call.status_seen = True
        digits = status.strip()
        # a status code is a small number (0-16); anything else is UNKNOWN (2)
        code = int(digits) if digits.isascii() and digits.isdigit() and len(digits) <= 9 else 2
        if not call.kserve:
            # The call's end, as the last NDJSON line (grpc.raw: DONE or ERROR).
            end = {"grpc_status": code, "grpc_message": _header(headers, "grpc-message") or ""}
            out.append(HttpBody(call.conn, call.ex, ts, False, json.dumps(end).encode() + b"\n"))
        if code != 0:
            message = _header(headers, "grpc-message") or ""
            text = f"{GRPC_STATUS.get(code, code)}" + (f": {message}" if message else "")
            self.errors += 1
            targets = [v.ex for v in call.open] if call.kserve else [call.ex]
            for ex in targets:
                out.append(HttpError(call.conn, ex, ts, False, "grpc-status", text))

    def _end(self, call: _Call, ev: HttpEnd, out: list[Any]) -> None:
        if ev.from_client:
            if not call.kserve:
                self._raw_request(call, ev.ts, out)
                out.append(ev)
            return
        reason = ev.reason
        if reason is EndReason.COMPLETE and not call.status_seen:
            reason = EndReason.EOF  # a gRPC call ends with its status
        if call.kserve:
            for v in call.open:
                if not v.responded:
                    out.append(HttpResponse(call.conn, v.ex, ev.ts, 200, "", "2", NDJSON))
                # A request the call ended without a final response for: cut.
                left = ev.reason if ev.reason is not EndReason.COMPLETE else EndReason.EOF
                out.append(HttpEnd(call.conn, v.ex, ev.ts, False, left))
            call.open.clear()
        else:
            out.append(HttpEnd(ev.conn, ev.exchange, ev.ts, False, reason))
        self._calls.pop((call.conn, call.ex), None)

    def _fail(self, call: _Call, ts: float, from_client: bool, msg: str, out: list[Any]) -> None:
        self.errors += 1
        targets: list[int | None] = [v.ex for v in call.open] if call.kserve else [call.ex]
        for ex in targets or [None]:  # no request of the call known yet: a connection error
            out.append(HttpError(call.conn, ex, ts, from_client, "grpc", msg))
        if call.kserve:
            for v in call.open:
                out.append(HttpEnd(call.conn, v.ex, ts, False, EndReason.ERROR))
            call.open.clear()
        else:
            out.append(HttpEnd(call.conn, call.ex, ts, False, EndReason.ERROR))
        self._calls.pop((call.conn, call.ex), None)


_HTTP_TYPES = frozenset({HttpBody, HttpResponse, HttpTrailers, HttpEnd, HttpError})
