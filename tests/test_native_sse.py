"""The native SSE and NDJSON decoders (``sniffer._native``, issue #25) against
the Python reference (``sniffer.core.sse``): the same items from every feed,
and the same state (counters, last id, retry, errors, ``idle``, truncation).

Inputs: the response bodies of every bundled capture (as the HTTP stage cut
them, and cut again at random offsets), and hypothesis-generated streams with
every line-ending mix, BOMs anywhere, comments, ids with NUL, retry values,
invalid and split UTF-8, and lines over a small cap.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core import native
from sniffer.core.events import HttpBody
from sniffer.core.http1 import HttpParser
from sniffer.core.sse import NdjsonDecoder, SseDecoder
from tests.test_native_http import CAPTURES, ROOT, flows_of

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(native.why_unavailable() is not None, reason=str(native.why_unavailable())),
]

SSE_STATE = (
    "events",
    "comments",
    "truncated_event",
    "last_event_id",
    "retry",
    "errors",
    "last_error",
    "closed",
    "idle",
    "max_line",
)
NDJSON_STATE = ("lines", "errors", "last_error", "closed", "idle", "max_line")


def state(d: Any, names: Sequence[str]) -> dict[str, Any]:
    return {n: getattr(d, n) for n in names}


def same_sse(pieces: Sequence[bytes], max_line: int | None = None) -> list[Any]:
    py = SseDecoder() if max_line is None else SseDecoder(max_line)
    nat = native.sse_decoder(max_line)
    got: list[Any] = []
    for p in pieces:
        a, b = py.feed(p), nat.feed(p)
        assert a == b
        assert [type(x) for x in a] == [type(x) for x in b]
        assert state(py, SSE_STATE) == state(nat, SSE_STATE)
        got.extend(a)
    assert py.close() == nat.close()
    assert state(py, SSE_STATE) == state(nat, SSE_STATE)
    assert py.feed(b"data: late\n\n") == nat.feed(b"data: late\n\n")
    assert state(py, SSE_STATE) == state(nat, SSE_STATE)
    return got


def same_ndjson(pieces: Sequence[bytes], max_line: int | None = None) -> list[str]:
    py = NdjsonDecoder() if max_line is None else NdjsonDecoder(max_line)
    nat = native.ndjson_decoder(max_line)
    got: list[str] = []
    for p in pieces:
        a, b = py.feed(p), nat.feed(p)
        assert a == b
        assert state(py, NDJSON_STATE) == state(nat, NDJSON_STATE)
        got.extend(a)
    assert py.close() == nat.close()
    assert state(py, NDJSON_STATE) == state(nat, NDJSON_STATE)
    return got


@cache
def bodies_of(path: Path) -> tuple[tuple[bytes, ...], ...]:
    """The decoded response bodies of a capture, piece by piece."""
    parser = HttpParser()
    by_exchange: dict[tuple[int, int], list[bytes]] = defaultdict(list)
    for ev in flows_of(path):
        for hev in parser.feed(ev):
            if type(hev) is HttpBody and not hev.from_client:
                by_exchange[(hev.conn, hev.exchange)].append(hev.data)
    return tuple(tuple(v) for v in by_exchange.values())


def recut(pieces: Sequence[bytes], rng: random.Random) -> list[bytes]:
    data = b"".join(pieces)
    if len(data) < 2:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, 6)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_captured_body_decodes_the_same(path: Path) -> None:
    rng = random.Random(path.name)
    for pieces in bodies_of(path):
        same_sse(pieces)
        same_ndjson(pieces)
        cut = recut(pieces, rng)
        same_sse(cut)
        same_ndjson(cut)
        same_sse(cut, max_line=16)
        same_ndjson(cut, max_line=16)


def test_captured_streams_have_events() -> None:
    """The corpus above is not vacuous: the SSE captures give events."""
    got = [
        e for pieces in bodies_of(ROOT / "pcaps" / "chat_english.pcap") for e in same_sse(pieces)
    ]
    assert len(got) > 5


SSE_ATOMS = [
    b"data:",
    b"data: ",
    b"data",
    b"event: ",
    b"event:delta",
    b"id: 7",
    b"id: a\x00b",
    b"id",
    b"retry: 1500",
    b"retry: 99999999999999999999999",
    b"retry: 12a",
    b"retry:",
    b": ping",
    b":",
    b"other: x",
    b'{"choices":[{"delta":{"content":"hi"}}]}',
    b"[DONE]",
    b"\r",
    b"\n",
    b"\r\n",
    b"\n\n",
    b"\r\r",
    b"\xef\xbb\xbf",
    b"\xe4\xb8",
    b"\xad",
    b"\xf0\x9f\x98",
    b"\x80",
    b"\xff",
    b" ",
    "é漢😀".encode(),
    b"x" * 40,
]

sse_bytes = st.lists(
    st.one_of(
        st.sampled_from(SSE_ATOMS),
        st.binary(max_size=12),
        st.text("0123456789x", max_size=5).map(lambda s: f"retry:{s}\n".encode()),
        st.text("ab: \0\ufeff\r\n", max_size=6).map(lambda s: f"id:{s}".encode()),
    ),
    max_size=40,
).map(b"".join)


@st.composite
def cut_up(draw: st.DrawFn, data_st: st.SearchStrategy[bytes]) -> list[bytes]:
    data = draw(data_st)
    cuts = sorted(set(draw(st.lists(st.integers(0, len(data)), max_size=8))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


@settings(max_examples=800, deadline=None)
@given(cut_up(sse_bytes), st.sampled_from([None, 4, 16, 64]))
def test_sse_streams_give_the_same_events(pieces: list[bytes], max_line: int | None) -> None:
    same_sse(pieces, max_line)


@pytest.mark.parametrize("max_line", [None, 4, 6])
def test_a_truncated_surrogate_is_held_as_cpython_holds_it(max_line: int | None) -> None:
    """CPython's incremental decoder keeps ``ED A0``–``ED BF`` at a feed's end
    for the next feed (the start of an encoded surrogate: invalid, replaced
    then); the native decoder holds it too, so a capped line's length and the
    decoder's idleness agree (found by the property test above)."""
    same_sse([b"data:\xed\xa0"], max_line)
    same_sse([b"data:\xed\xa0", b"\x80 x\n\n"], max_line)
    same_sse([b"data: a\xed", b"\xbf", b"\n\n"], max_line)


def test_whole_event_fast_paths_match_the_line_by_line_path() -> None:
    events = b"".join(b'data: {"i":%d}\n\n' % i for i in range(50))
    whole = same_sse([b"data: x\n\n", events])
    byte_by_byte = same_sse([b"data: x\n\n", *(events[i : i + 1] for i in range(len(events)))])
    assert whole == byte_by_byte and len(whole) == 51


ND_ATOMS = [
    b'{"a":1}',
    b'{"done":true}',
    b"\n",
    b"\r\n",
    b"\r",
    b"   ",
    b"\t",
    b"\x1c",
    "\u00a0\u2028\u3000\u0085".encode(),
    b"\xef\xbb\xbf",
    b"\xe2\x82",
    b"\xac",
    b"\xff",
    b"x" * 30,
]
nd_bytes = st.lists(st.one_of(st.sampled_from(ND_ATOMS), st.binary(max_size=8)), max_size=30).map(
    b"".join
)


@settings(max_examples=600, deadline=None)
@given(cut_up(nd_bytes), st.sampled_from([None, 4, 16]))
def test_ndjson_streams_give_the_same_lines(pieces: list[bytes], max_line: int | None) -> None:
    same_ndjson(pieces, max_line)


def test_whitespace_only_lines_are_what_python_calls_whitespace() -> None:
    """Every code point alone on a line: skipped exactly when ``str.isspace``."""
    text = "".join(f"{chr(c)}\n" for c in range(0x110000) if not 0xD800 <= c < 0xE000 and c != 10)
    lines = same_ndjson([text.encode()])
    assert len(lines) == sum(
        1
        for c in range(0x110000)
        if not 0xD800 <= c < 0xE000 and c != 10 and c != 13 and not chr(c).isspace()
    )


@pytest.mark.parametrize("digits", [1, 12, 13, 23])
def test_retry_digits_cap_is_the_same(digits: int) -> None:
    """A ``retry:`` of more than ``MAX_RETRY_DIGITS`` digits is ignored by both
    decoders (the event keeps the earlier reconnection time)."""
    events = same_sse([b"retry: 7\ndata: a\n\n", f"retry: {'9' * digits}\ndata: b\n\n".encode()])
    assert events[1].retry == (int("9" * digits) if digits <= 12 else None)
