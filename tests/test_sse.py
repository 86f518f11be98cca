"""WHATWG event-stream and NDJSON decoders: every rule, fed whole and in pieces."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core import native
from sniffer.core.sse import NdjsonDecoder, SseDecoder, SseEvent
from tests.cores import both_cores

#: every test here runs against the Python decoders and the native ones
core = both_cores(
    globals(),
    SseDecoder=lambda: native.NATIVE.SseDecoder,
    NdjsonDecoder=lambda: native.NATIVE.NdjsonDecoder,
)


def ev(
    data: str, event: str = "message", id: str | None = None, retry: int | None = None
) -> SseEvent:
    return SseEvent(event, data, id, retry)


def decode(pieces: Iterable[bytes], **kw: int) -> tuple[list[SseEvent], SseDecoder]:
    d = SseDecoder(**kw)
    out: list[SseEvent] = []
    for piece in pieces:
        out.extend(d.feed(piece))
    out.extend(d.close())
    return out, d


def whole(raw: bytes, **kw: int) -> list[SseEvent]:
    return decode([raw], **kw)[0]


def bytewise(raw: bytes, **kw: int) -> list[SseEvent]:
    return decode([raw[i : i + 1] for i in range(len(raw))], **kw)[0]


def both(raw: bytes) -> list[SseEvent]:
    """Decode fed whole, byte by byte, and split at every offset: all must agree."""
    expected = whole(raw)
    assert bytewise(raw) == expected
    for cut in range(len(raw) + 1):
        assert decode([raw[:cut], raw[cut:]])[0] == expected, cut
    return expected


# -- line ends ----------------------------------------------------------------


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"])
def test_each_line_end(eol: bytes) -> None:
    raw = b"data: a" + eol + b"data: b" + eol + eol + b"data: c" + eol + eol
    assert both(raw) == [ev("a\nb"), ev("c")]


def test_mixed_line_ends() -> None:
    raw = b"event: x\rdata: 1\r\ndata: 2\n\r\ndata: 3\r\rdata: 4\n\n"
    assert both(raw) == [ev("1\n2", "x"), ev("3"), ev("4")]


def test_crlf_split_across_feeds_is_one_line_end() -> None:
    out, _ = decode([b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"])
    assert out == [ev("a\nb")]


def test_cr_then_cr_is_two_line_ends() -> None:
    assert decode([b"data: a\r", b"\r"])[0] == [ev("a")]


def test_lf_cr_is_two_line_ends() -> None:
    assert both(b"data: a\n\rdata: b\n\n") == [ev("a"), ev("b")]


# -- BOM ------------------------------------------------------------------------


def test_bom_stripped_at_start_only() -> None:
    raw = b"\xef\xbb\xbfdata: a\n\n\xef\xbb\xbfdata: b\n\n"
    # the second BOM makes the field name "\ufeffdata": unknown, ignored
    assert both(raw) == [ev("a")]


def test_bom_split_across_feeds() -> None:
    assert decode([b"\xef", b"\xbb", b"\xbfdata: a\n\n"])[0] == [ev("a")]


def test_only_one_bom_stripped() -> None:
    assert both(b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\n") == []


def test_bom_inside_value_kept() -> None:
    assert both(b"data: \xef\xbb\xbfa\n\n") == [ev("\ufeffa")]


# -- fields ---------------------------------------------------------------------


def test_comments_counted_and_ignored() -> None:
    raw = b": ping\n\ndata: a\n: inside\ndata: b\n\n:\n\n"
    out, d = decode([raw])
    assert out == [ev("a\nb")]
    assert d.comments == 3
    assert d.events == 1


def test_one_space_after_colon_dropped() -> None:
    assert both(b"data:a\n\ndata: b\n\ndata:  c\n\ndata:\td\n\n") == [
        ev("a"),
        ev("b"),
        ev(" c"),
        ev("\td"),
    ]


def test_field_without_colon_is_empty_value() -> None:
    # "data" alone appends an empty line; two of them join to "\n"
    assert both(b"data\n\ndata\ndata\n\n") == [ev(""), ev("\n")]


def test_value_may_contain_colons() -> None:
    assert both(b'data: {"a": "b:c"}\n\n') == [ev('{"a": "b:c"}')]


def test_multiline_data_and_trailing_newline() -> None:
    assert both(b"data: a\ndata:\ndata: b\n\n") == [ev("a\n\nb")]


def test_blank_line_without_data_dispatches_nothing_and_resets_type() -> None:
    raw = b"event: x\n\ndata: a\n\nevent: y\nid: 1\nretry: 5\n\n\n\ndata: b\n\n"
    assert both(raw) == [ev("a"), ev("b", id="1")]


def test_event_type() -> None:
    raw = b"event: delta\ndata: 1\n\nevent:\ndata: 2\n\ndata: 3\n\n"
    assert both(raw) == [ev("1", "delta"), ev("2"), ev("3")]


def test_unknown_fields_ignored() -> None:
    assert both(b"foo: bar\nDATA: x\ndata : y\ndata: z\n\n") == [ev("z")]


def test_id_persists_and_resets() -> None:
    raw = (
        b"id: 7\ndata: a\n\n"  # id set
        b"data: b\n\n"  # persists
        b"id: 8\0x\ndata: c\n\n"  # NUL: ignored
        b"id\ndata: d\n\n"  # empty id resets to ""
        b"id: 9\n\ndata: e\n\n"  # set by an event that dispatches nothing
    )
    assert both(raw) == [
        ev("a", id="7"),
        ev("b", id="7"),
        ev("c", id="7"),
        ev("d", id=""),
        ev("e", id="9"),
    ]


def test_retry() -> None:
    raw = (
        b"retry: 3000\ndata: a\n\n"
        b"retry: 12x\ndata: b\n\n"
        b"retry: -1\nretry:\nretry: \xd9\xa3\ndata: c\n\n"  # \xd9\xa3: Arabic-Indic 3
    )
    out, d = decode([raw])
    assert out == [ev("a", retry=3000), ev("b"), ev("c")]
    assert d.retry == 3000
    assert both(raw) == out


def test_data_with_nul_and_unicode() -> None:
    assert both("data: a\0b é 漢\n\n".encode()) == [ev("a\0b é 漢")]


# -- end of body ------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"data: a\n\ndata: b",
        b"data: a\n\ndata: b\n",
        b"data: a\n\ndata: b\r",
        b"data: a\n\nevent: x\n",
    ],
)
def test_event_cut_at_eof_not_dispatched(raw: bytes) -> None:
    out, d = decode([raw])
    assert out == [ev("a")]
    assert d.truncated_event
    assert d.close() == []


@pytest.mark.parametrize("raw", [b"data: a\n\n", b"data: a\n\n: ping", b"data: a\n\n\n", b""])
def test_clean_end(raw: bytes) -> None:
    _, d = decode([raw])
    assert not d.truncated_event


def test_incomplete_utf8_at_eof_is_truncated() -> None:
    out, d = decode([b"data: a\n\ndata: \xe6\xbc"])
    assert out == [ev("a")]
    assert d.truncated_event


def test_feed_after_close_counts_error() -> None:
    d = SseDecoder()
    d.close()
    assert d.feed(b"data: a\n\n") == []
    assert d.errors == 1
    assert d.last_error


# -- UTF-8 ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["漢字のテキスト、中文文本。", "emoji 😀👍🏽 family 👨‍👩‍👧 flag 🇫🇷", "mixé ñ € 𝄞 한국어"],
)
def test_utf8_split_at_every_offset(text: str) -> None:
    raw = f"data: {text}\ndata: {text}\n\n".encode()
    assert both(raw) == [ev(f"{text}\n{text}")]


def test_invalid_utf8_becomes_replacement_char() -> None:
    raw = b"data: a\xffb\xe6\xbcc\xc0\xafd\n\n"
    expected = [ev(raw[6:-2].decode("utf-8", "replace"))]
    assert "\ufffd" in expected[0].data
    assert both(raw) == expected


def test_replacement_char_from_server_is_data() -> None:
    assert both('data: {"content":"\ufffd"}\n\n'.encode()) == [ev('{"content":"\ufffd"}')]


# -- line cap ------------------------------------------------------------------------


def test_line_cap_overflow_drops_event_and_recovers() -> None:
    cap = 64
    long = b"x" * 100
    raw = b"data: ok1\n\ndata: " + long + b"\ndata: tail\n\ndata: ok2\n\n"
    for pieces in (
        [raw],
        [raw[i : i + 7] for i in range(0, len(raw), 7)],
        [bytes([b]) for b in raw],
    ):
        out, d = decode(pieces, max_line=cap)
        assert out == [ev("ok1"), ev("ok2")]
        assert d.errors == 1
        assert d.last_error is not None and "64" in d.last_error
        assert d.events == 2


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6),
)
def test_every_line_over_the_cap_is_counted_once_however_it_is_split(
    lengths: list[int], cuts: list[int]
) -> None:
    """``overlong`` (what the streams stage flags ``item-over-cap``) counts each
    line longer than the cap exactly once, wherever the feeds split it; lines at
    the cap are kept. Both decoders."""
    cap = 16
    lines = [b"data: " + b"x" * n for n in lengths]  # 6 + n characters
    over = sum(1 for line in lines if len(line) > cap)
    raw = b"".join(line + b"\n\n" for line in lines)
    at = sorted({min(c, len(raw)) for c in cuts})
    pieces = [raw[i:j] for i, j in zip([0, *at], [*at, len(raw)], strict=True)]
    out, d = decode(pieces, max_line=cap)
    assert d.overlong == over and d.errors == over
    assert len(out) == len(lines) - over
    nd = NdjsonDecoder(max_line=cap)
    kept = [x for p in pieces for x in nd.feed(p)] + nd.close()
    assert nd.overlong == over and nd.errors == over
    assert kept == [line.decode() for line in lines if len(line) <= cap]


def test_line_cap_exact_length_is_kept() -> None:
    cap = 16
    line = b"data: " + b"y" * (cap - 6)  # exactly cap characters
    for eol in (b"\n", b"\r", b"\r\n"):
        raw = line + eol + eol
        out, d = decode([raw[i : i + 1] for i in range(len(raw))], max_line=cap)
        assert out == [ev("y" * (cap - 6))], eol
        assert d.errors == 0


def test_line_cap_overflow_with_cr_ends_and_comment() -> None:
    raw = b": " + b"z" * 50 + b"\r\rdata: ok\r\r"
    for pieces in ([raw], [raw[i : i + 3] for i in range(0, len(raw), 3)]):
        out, d = decode(pieces, max_line=20)
        assert out == [ev("ok")]
        assert d.errors == 1


def test_overflow_of_unterminated_line_at_eof() -> None:
    out, d = decode([b"data: a\n\n", b"q" * 40, b"q" * 40], max_line=32)
    assert out == [ev("a")]
    assert d.errors == 1
    assert d.truncated_event


# -- fast path equivalence --------------------------------------------------------------


def test_several_events_per_feed_and_pending_fields() -> None:
    d = SseDecoder()
    assert d.feed(b"event: a\n") == []
    assert d.feed(b"data: 1\n\ndata: 2\n\ndata: 3\n") == [ev("1", "a"), ev("2")]
    assert d.feed(b"\ndata: 4\n\n") == [ev("3"), ev("4")]
    assert d.events == 4


def test_typical_server_stream() -> None:
    raw = (
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n'
        b": ping - 2024-01-01 00:00:00\n\n"
        b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n'
        b"data: [DONE]\n\n"
    )
    out = both(raw)
    assert [e.data for e in out][-1] == "[DONE]"
    assert len(out) == 3


# -- property tests -----------------------------------------------------------------------

_text = st.text(
    alphabet=st.characters(
        categories=["L", "M", "N", "P", "S", "Zs", "Cc", "Cf"], exclude_characters="\r\n"
    ),
    max_size=20,
)
_field_name = st.sampled_from(["data", "event", "id", "retry", "x", ""])


@st.composite
def _streams(draw: st.DrawFn) -> bytes:
    """A random event stream: random fields, comments, random line ends."""
    eols = st.sampled_from(["\n", "\r", "\r\n"])
    parts: list[str] = []
    if draw(st.booleans()):
        parts.append("\ufeff")
    for _ in range(draw(st.integers(0, 8))):
        for _ in range(draw(st.integers(0, 4))):
            kind = draw(st.integers(0, 3))
            if kind == 0:
                parts.append(":" + draw(_text))
            elif kind == 1:
                parts.append(draw(_field_name))
            else:
                sep = draw(st.sampled_from([":", ": ", ":  "]))
                parts.append(draw(_field_name) + sep + draw(_text))
            parts.append(draw(eols))
        parts.append(draw(eols))
    if draw(st.booleans()):
        parts.append("data: cut")
    return "".join(parts).encode()


def _split(raw: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(raw) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(raw[last:p])
        last = p
    pieces.append(raw[last:])
    return pieces


def _reference(raw: bytes) -> list[SseEvent]:
    """A direct, line-by-line transcription of the WHATWG algorithm."""
    text = raw.decode("utf-8", "replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    lines: list[str] = []
    cur = ""
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\r":
            lines.append(cur)
            cur = ""
            if i + 1 < len(text) and text[i + 1] == "\n":
                i += 1
        elif c == "\n":
            lines.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    out: list[SseEvent] = []
    data, etype, last_id, retry = "", "", None, None
    for line in lines:
        if line == "":
            if data:
                out.append(SseEvent(etype or "message", data[:-1], last_id, retry))
            data, etype, retry = "", "", None
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            data += value + "\n"
        elif name == "event":
            etype = value
        elif name == "id" and "\0" not in value:
            last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            retry = int(value)
    return out


@settings(max_examples=400, deadline=None)
@given(_streams(), st.lists(st.integers(0, 10_000), max_size=12))
def test_random_splits_decode_like_whole(raw: bytes, cuts: list[int]) -> None:
    expected = whole(raw)
    assert expected == _reference(raw)
    out, d = decode(_split(raw, cuts))
    assert out == expected
    assert d.errors == 0
    assert d.events == len(out)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(0, 10_000), max_size=10))
def test_arbitrary_bytes_never_raise_and_split_invariant(raw: bytes, cuts: list[int]) -> None:
    expected, d1 = decode([raw], max_line=16)
    out, d2 = decode(_split(raw, cuts), max_line=16)
    assert out == expected
    assert (d1.errors, d1.comments, d1.truncated_event) == (
        d2.errors,
        d2.comments,
        d2.truncated_event,
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["message", "delta", "x"]), _text), max_size=10),
    st.lists(st.integers(0, 10_000), max_size=12),
)
def test_serialised_events_round_trip(events: list[tuple[str, str]], cuts: list[int]) -> None:
    raw = "".join(f"event: {t}\ndata: {d}\n\n" for t, d in events).encode()
    out, d = decode(_split(raw, cuts))
    assert out == [ev(data, etype) for etype, data in events]
    assert not d.truncated_event


# -- NDJSON ---------------------------------------------------------------------------------


def nd(pieces: Iterable[bytes], **kw: int) -> tuple[list[str], NdjsonDecoder]:
    d = NdjsonDecoder(**kw)
    out: list[str] = []
    for p in pieces:
        out.extend(d.feed(p))
    out.extend(d.close())
    return out, d


def test_ndjson_lines() -> None:
    raw = b'{"a":1}\n\n  \r\n{"b":2}\r\n{"c":"\xe6\xbc\xa2"}\n'
    expected = ['{"a":1}', '{"b":2}', '{"c":"漢"}']
    assert nd([raw])[0] == expected
    for cut in range(len(raw) + 1):
        assert nd([raw[:cut], raw[cut:]])[0] == expected


def test_ndjson_final_line_without_newline_returned_at_close() -> None:
    d = NdjsonDecoder()
    assert d.feed(b'{"a":1}\n{"done":true}') == ['{"a":1}']
    assert d.close() == ['{"done":true}']
    assert d.lines == 2


def test_ndjson_overflow() -> None:
    raw = b"1\n" + b"x" * 50 + b"\n2\n" + b"y" * 50
    for pieces in ([raw], [bytes([b]) for b in raw]):
        out, d = nd(pieces, max_line=10)
        assert out == ["1", "2"]
        assert d.errors == 2
        assert d.last_error is not None


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.lists(st.integers(0, 10_000), max_size=10))
def test_ndjson_split_invariant(raw: bytes, cuts: list[int]) -> None:
    expected, d1 = nd([raw], max_line=16)
    out, d2 = nd(_split(raw, cuts), max_line=16)
    assert out == expected
    assert d1.errors == d2.errors
