"""Values made without their Python ``__init__`` (``native/py/src/slots.rs``):
``sniffer._native.SlotFiller`` and the native core's HTTP heads and flow
events are the objects the class call makes, and ``slot_init``'s ``__init__``
(one native call for every field while the native core runs) gives what the
pure core's gives.

* every class the native core makes or fills: the same fields, equality,
  hash, repr, ``dataclasses.replace``, still frozen, defaults where values
  stop, default factories called per instance;
* what the filler refuses (another type's instance, a wrong count, a class
  whose construction does more than set its slots);
* the heads of hostile requests (oversized heads, bytes 0x80-0xff, NUL,
  obs-fold, a bare LF) through the native and the Python HTTP parser: the
  same values, field by field;
* the pure core's ``__init__`` (a subprocess with ``SPARSEETY_PURE``) makes
  equal values.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sniffer.core import native
from sniffer.core.events import (
    ChunkEvent,
    ConnectionClosed,
    ConnectionOpened,
    EndReason,
    FlowAnomaly,
    FlowData,
    FlowEnd,
    FlowGap,
    HttpAnomaly,
    HttpEnd,
    HttpError,
    HttpRequest,
    HttpResponse,
    HttpResync,
    StreamClosed,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.core.http1 import HttpParser
from sniffer.llm.tokens import StreamTokens
from sniffer.llm.values import RequestSummary, Usage

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(native.why_unavailable() is not None, reason=str(native.why_unavailable())),
]

ROOT = Path(__file__).resolve().parent.parent

H = (("host", "x"), ("content-type", "application/json"), ("x-odd", "\x00\xff é"))

#: one value of every class the native core makes or slot_init fills, given in full
SAMPLES: list[tuple[type, tuple[Any, ...]]] = [
    (ConnectionOpened, (1, 1.5, ("10.0.0.1", 5000), ("10.0.0.2", 8000), True, "ebpf", 7, "x")),
    (ConnectionClosed, (1, 2.5, "fin")),
    (FlowEnd, (1, 2.0, True, "rst")),
    (FlowGap, (1, 2.0, False, None, "kernel-drop")),
    (FlowAnomaly, (1, 2.0, True, "overlap-mismatch", "d", 10, 3)),
    (HttpRequest, (3, 0, 1.25, "POST", "/v1/chat/completions?x=1", "1.1", H)),
    (HttpResponse, (3, 0, 1.5, 200, "OK", "1.1", H, False)),
    (HttpEnd, (3, 0, 1.75, False, EndReason.GAP)),
    (HttpError, (3, None, 1.0, True, "framing", "bad chunk line")),
    (HttpResync, (3, 1, 1.0, "chunked", 12, True, None, 2)),
    (HttpAnomaly, (3, 0, 1.0, False, "overlap-mismatch", "", -1, 0)),
    (
        StreamOpened,
        (
            9,
            3,
            0,
            1.25,
            ("10.0.0.1", 5000),
            ("10.0.0.2", 8000),
            "POST",
            "/v1/chat/completions",
            H,
            '{"model": "m"}',
            RequestSummary(model="m", n=2),
            "openai.chat",
            "lab",
            "packet",
            None,
            None,
            False,
        ),
    ),
    (StreamResponse, (9, 1.5, 200, H, "text/event-stream", True)),
    (
        ChunkEvent,
        (9, 1.6, 0, 0, 1, "content", "hi", "", None, None, None, None, None, None),
    ),
    (
        StreamClosed,
        (
            9,
            2.0,
            StreamState.COMPLETE,
            "complete",
            True,
            False,
            1.6,
            1.9,
            3,
            5,
            12,
            ((0, "stop"),),
            None,
            None,
            None,
            10,
            200,
            "id",
            "m",
            (),
        ),
    ),
    (RequestSummary, ("m", True, 0.5, None, None, 10, 1, None, None, None, 2, True, ("n",))),
]


def _fields(value: Any) -> tuple[Any, ...]:
    return tuple(getattr(value, f.name) for f in dataclasses.fields(value))


@pytest.mark.parametrize(("cls", "values"), SAMPLES, ids=lambda v: getattr(v, "__name__", ""))
def test_made_is_the_class_call(cls: type, values: tuple[Any, ...]) -> None:
    assert len(values) == len(dataclasses.fields(cls))
    filler = native.NATIVE.SlotFiller(cls)
    assert len(filler) == len(values)
    made = filler.make(*values)
    called = cls(*values)
    assert type(made) is cls
    assert made == called and _fields(made) == values
    assert hash(made) == hash(called)
    assert repr(made) == repr(called)
    first = dataclasses.fields(cls)[0].name
    assert dataclasses.replace(made, **{first: values[0]}) == called
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, first, values[0])


def test_made_takes_the_defaults_after_the_values_given() -> None:
    filler = native.NATIVE.SlotFiller(ConnectionOpened)
    made = filler.make(1, 1.5, ("a", 1), ("b", 2), False)
    assert made == ConnectionOpened(1, 1.5, ("a", 1), ("b", 2), False)
    assert (made.capture, made.pid, made.comm) == ("packet", None, None)
    summary = native.NATIVE.SlotFiller(RequestSummary).make()
    assert summary == RequestSummary()
    with pytest.raises(TypeError, match="field values"):
        native.NATIVE.SlotFiller(HttpEnd).make(1, 0, 1.0)  # no default for from_client
    with pytest.raises(TypeError, match="field values"):
        native.NATIVE.SlotFiller(ConnectionClosed).make(1, 2.0, "fin", "more")


def test_fill_checks_the_instance_and_the_count() -> None:
    filler = native.NATIVE.SlotFiller(ConnectionClosed)
    other = FlowEnd(1, 2.0, True, "fin")
    with pytest.raises(TypeError):
        filler.fill(other, 1, 2.0, "fin")  # the descriptor refuses another type's instance
    assert other == FlowEnd(1, 2.0, True, "fin")
    closed = ConnectionClosed(1, 2.0, "fin")
    with pytest.raises(TypeError, match="field values"):
        filler.fill(closed, 1, 2.0)
    with pytest.raises(TypeError):
        filler.fill(None, 1, 2.0, "fin")


def test_refuses_classes_it_cannot_make() -> None:
    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class PostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class OwnNew:
        a: int

        def __new__(cls, *args: Any, **kwargs: Any) -> OwnNew:
            return super().__new__(cls)

    @dataclasses.dataclass(frozen=True, slots=True)
    class Empty:
        pass

    for cls, why in (
        (NoSlots, "not a slot"),
        (PostInit, "__post_init__"),
        (OwnNew, "__new__"),
        (Empty, "no field"),
    ):
        with pytest.raises(TypeError, match=why):
            native.NATIVE.SlotFiller(cls)
    with pytest.raises(TypeError):
        native.NATIVE.SlotFiller(FlowData)  # a NamedTuple: no dataclass fields


def test_slot_init_fills_natively_with_keywords_and_defaults() -> None:
    # keywords, defaults and positional values through the one native call
    ev = HttpResponse(conn=1, exchange=2, ts=3.0, status=204, reason="", version="1.1", headers=())
    assert ev.informational is False
    assert _fields(ev) == (1, 2, 3.0, 204, "", "1.1", (), False)

    # a field with a default factory gets a new value per instance
    def tokens(stream: int, **more: Any) -> StreamTokens:
        return StreamTokens(stream, "t", (), {}, (), {}, {}, (), {}, **more)

    a, b = tokens(1), tokens(2)
    assert a.per_choice == {} and b.per_choice == {} and a.per_choice is not b.per_choice
    given = {0: None}
    assert tokens(3, per_choice=given).per_choice is given
    with pytest.raises(TypeError):
        HttpEnd(1, 0, 1.0, True)  # type: ignore[call-arg]  # a missing argument, as before


_PURE_VALUES = """
import dataclasses, json, sys
from sniffer import native_core
from sniffer.core.events import ConnectionOpened, HttpRequest, StreamClosed, StreamState
from sniffer.llm.values import RequestSummary
assert native_core()[0] is None
values = [
    HttpRequest(3, 0, 1.25, "POST", "/x", "1.1", (("host", "x"),)),
    ConnectionOpened(1, 1.5, ("a", 1), ("b", 2), True),
    RequestSummary.parse({"model": "m", "n": 2, "temperature": 1, "max_completion_tokens": 5}),
    StreamClosed(1, 2.0, StreamState.GAP, "gap", False, True, None, None, 0, 0, 0, (), None, None),
]
print(json.dumps([repr(v) for v in values]))
"""


def test_the_pure_cores_init_makes_equal_values() -> None:
    env = {**os.environ, "SPARSEETY_PURE": "1", "PYTHONPATH": str(ROOT)}
    got = subprocess.run(
        [sys.executable, "-c", _PURE_VALUES], env=env, capture_output=True, text=True, check=True
    )
    pure = json.loads(got.stdout)
    here = [
        HttpRequest(3, 0, 1.25, "POST", "/x", "1.1", (("host", "x"),)),
        ConnectionOpened(1, 1.5, ("a", 1), ("b", 2), True),
        RequestSummary.parse({"model": "m", "n": 2, "temperature": 1, "max_completion_tokens": 5}),
        StreamClosed(
            1, 2.0, StreamState.GAP, "gap", False, True, None, None, 0, 0, 0, (), None, None
        ),
    ]
    assert pure == [repr(v) for v in here]
    assert here[2].temperature == 1.0 and type(here[2].temperature) is float


def _flow(data: bytes, reply: bytes) -> list[Any]:
    opened = ConnectionOpened(1, 1.0, ("10.0.0.1", 5000), ("10.0.0.2", 8000), True)
    return [
        opened,
        FlowData(1, 1.1, True, data),
        FlowData(1, 1.2, False, reply),
        FlowEnd(1, 1.3, True, "fin"),
        FlowEnd(1, 1.4, False, "fin"),
        ConnectionClosed(1, 1.5, "fin"),
    ]


HOSTILE_HEADS = [
    # bytes 0x80-0xff and NUL in values, a space before the colon, obs-fold, bare LF
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-bin: \x80\xfe\xff\x00z\r\n"
    b"x-fold: a\r\n  b\r\ncontent-length: 2\r\n\r\n{}",
    b"GET /\xff\xfe?q=\x00 HTTP/1.1\nhost: x\nx-bare: lf\n\n",
    # an oversized head (past the parser's cap): an error, no request
    b"GET / HTTP/1.1\r\n" + b"x-big: " + b"a" * 70_000 + b"\r\n\r\n",
    # a thousand small headers, names of every byte a token allows
    b"GET / HTTP/1.1\r\n"
    + b"".join(b"x-%d!#$%%&'*+.^_`|~: v%d\r\n" % (i, i) for i in range(1000))
    + b"\r\n",
]
REPLY = b"HTTP/1.1 200 \xe9t\xe9\r\nx-r: \xff\x00\r\ncontent-length: 0\r\n\r\n"


@pytest.mark.parametrize("head", HOSTILE_HEADS, ids=range(len(HOSTILE_HEADS)))
def test_hostile_heads_native_and_python_give_the_same_values(head: bytes) -> None:
    py, nat = HttpParser(), native.http_parser()
    want = [ev for fe in _flow(head, REPLY) for ev in py.feed(fe)]
    got = [ev for fe in _flow(head, REPLY) for ev in nat.feed(fe)]
    assert [type(e) for e in got] == [type(e) for e in want]
    for g, w in zip(got, want, strict=True):
        assert g == w
        if dataclasses.is_dataclass(g):
            assert _fields(g) == _fields(w)
    assert any(type(e) in (HttpRequest, HttpError) for e in got)


def test_usage_values_still_compare() -> None:
    # a value whose class keeps the generated __init__ next to one of slot_init's
    usage = Usage(prompt_tokens=1, completion_tokens=2, raw='{"prompt_tokens": 1}')
    closed = dataclasses.replace(SAMPLES[-2][0](*SAMPLES[-2][1]), usage=usage)
    assert closed.usage == usage and closed.state is StreamState.COMPLETE
