"""Mid-body resync: a body captured from any offset recovers exactly the items
that start after the first provable boundary, and never anything invented."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core.resync import (
    CHUNKED,
    IDENTITY,
    FramingSync,
    ItemSync,
    sniff_item_format,
)
from sniffer.core.sse import NdjsonDecoder, SseDecoder
from sniffer.llm.dialects import guess_dialect

TEXTS = ["Hello", " 世界", "，这是", " a test 😀", "\u00e9t\u00e9", " 1\r\n2", "", " end"]


def _chat_events(sep: bytes = b"\n") -> list[bytes]:
    out = []
    for i, t in enumerate(TEXTS):
        obj = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}],
        }
        if i == len(TEXTS) - 1:
            obj["choices"][0]["finish_reason"] = "stop"
        out.append(b"data: " + json.dumps(obj, ensure_ascii=False).encode() + sep + sep)
    out.append(b"data: [DONE]" + sep + sep)
    return out


def _chunked(pieces: list[bytes]) -> tuple[bytes, list[int]]:
    """Chunked body and the offset where each piece's chunk starts."""
    body = b""
    starts = []
    for p in pieces:
        starts.append(len(body))
        body += f"{len(p):x}".encode() + b"\r\n" + p + b"\r\n"
    return body + b"0\r\n\r\n", starts


def _dechunk(data: bytes) -> tuple[bytes, bytes]:
    """Decode chunked data that starts at a size line (test helper): body, rest."""
    out = b""
    pos = 0
    while True:
        nl = data.index(b"\r\n", pos)
        size = int(data[pos:nl].split(b";")[0], 16)
        pos = nl + 2
        if size == 0:
            return out, data[pos + 2 :]
        out += data[pos : pos + size]
        pos += size + 2


def _feed_split(sync: FramingSync, data: bytes, cuts: list[int]):
    prev = 0
    for c in [*sorted(set(cuts)), len(data)]:
        if c <= prev:
            continue
        got = sync.feed(data[prev:c])
        prev = c
        if got is not None:
            return got, data[c:]
    return sync.finish(), b""


def _sse_datas(body: bytes, at_boundary: bool) -> tuple[list[str], int]:
    isync = ItemSync("sse", at_boundary=at_boundary)
    dec = SseDecoder()
    events = dec.feed(isync.feed(body))
    return [e.data for e in events], isync.skipped


@pytest.mark.parametrize("sep", [b"\n", b"\r\n"])
def test_every_offset_of_a_chunked_sse_body(sep: bytes) -> None:
    pieces = _chat_events(sep)
    body, starts = _chunked(pieces)
    datas = [p.decode().split(sep.decode())[0][len("data: ") :] for p in pieces]
    for off in range(len(body)):
        sync = FramingSync()
        got = sync.feed(body[off:])
        if got is None:
            got = sync.finish()
        later = [i for i, s in enumerate(starts) if s >= off]
        # a chunk is proven by the size line after it: the terminator proves the last
        if not later:
            assert got.framing is None, off
            continue
        first = later[0]
        assert got.framing == CHUNKED, off
        assert got.skipped == starts[first] - off
        decoded, rest = _dechunk(got.rest)
        assert rest == b""
        recovered, skipped = _sse_datas(decoded, at_boundary=True)
        assert skipped == 0
        assert recovered == datas[first:], off


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_start_and_splits(data: st.DataObject) -> None:
    pieces = _chat_events()
    # several events per chunk, as transformers serve packs them
    grouped = [b"".join(pieces[i : i + 2]) for i in range(0, len(pieces), 2)]
    body, starts = _chunked(grouped)
    off = data.draw(st.integers(0, len(body) - 1))
    tail = body[off:]
    cuts = data.draw(st.lists(st.integers(0, len(tail)), max_size=6))
    got, after = _feed_split(FramingSync(), tail, cuts)
    later = [s for s in starts if s >= off]
    if not later:
        assert got.framing is None
        return
    assert got.framing == CHUNKED
    assert off + got.skipped == later[0]
    decoded, _ = _dechunk(got.rest + after)
    recovered, _ = _sse_datas(decoded, at_boundary=True)
    all_datas = [p.decode().split("\n")[0][len("data: ") :] for p in pieces]
    # exactly a suffix of what was sent: nothing invented, nothing reordered
    assert recovered == all_datas[len(all_datas) - len(recovered) :]
    assert len(recovered) >= 1


def test_identity_sse_from_any_offset_yields_whole_events_only() -> None:
    pieces = _chat_events()
    body = b"".join(pieces)
    datas = [p.decode().split("\n")[0][len("data: ") :] for p in pieces]
    ends = []
    pos = 0
    for p in pieces:
        pos += len(p)
        ends.append(pos)
    for off in range(0, len(body), 7):
        sync = FramingSync()
        got = sync.feed(body[off:]) or sync.finish()
        if got.framing is None:
            # nothing itemish left (inside the last event's tail)
            assert sniff_item_format(body[off:]) is None or off > ends[-2]
            continue
        assert got.framing == IDENTITY
        recovered, _ = _sse_datas(got.rest, at_boundary=False)
        # whole events after the first boundary after the start: without chunk
        # framing even an event that begins exactly at the start is not trusted
        # (a start on the last byte of a blank line cannot be known as one: then
        # the next event is skipped too)
        first = next(i for i, e in enumerate(ends) if e > off)
        assert recovered == datas[len(datas) - len(recovered) :], off
        assert len(recovered) == len(datas) - first - (2 if ends[first] == off + 1 else 1), off


def test_ndjson_line_sync() -> None:
    lines = [
        json.dumps({"model": "m", "message": {"role": "assistant", "content": t}, "done": False})
        for t in TEXTS
    ]
    body = ("\n".join(lines) + "\n").encode()
    for off in range(len(body)):
        isync = ItemSync("ndjson", at_boundary=False)
        dec = NdjsonDecoder()
        got = dec.feed(isync.feed(body[off:]))
        assert all(g in lines for g in got)
        # every line that starts strictly after the start offset comes back
        starts = [body.index(ln.encode()) for ln in lines]
        assert got == [ln for ln, s in zip(lines, starts, strict=True) if s > off]
        if off in starts:  # at a proven chunk boundary the line itself is trusted
            trusting = ItemSync("ndjson", at_boundary=True)
            assert NdjsonDecoder().feed(trusting.feed(body[off:])) == lines[starts.index(off) :]


def test_gives_up_after_a_bounded_scan_and_counts_what_it_dropped() -> None:
    sync = FramingSync(max_scan=1024)
    assert sync.feed(b"\x00\x01garbage" * 50) is None
    got = sync.feed(b"x" * 2000)
    assert got is not None and got.framing is None
    assert got.skipped == len(b"\x00\x01garbage") * 50 + 2000


def test_chunked_hint_rules_identity_out_and_identity_hint_rules_chunked_out() -> None:
    body, starts = _chunked(_chat_events())
    only_identity = FramingSync(chunked_hint=False)
    got = only_identity.feed(body[starts[1] :]) or only_identity.finish()
    assert got.framing != CHUNKED
    plain = b"".join(_chat_events())
    only_chunked = FramingSync(chunked_hint=True)
    got = only_chunked.feed(plain[5:]) or only_chunked.finish()
    assert got.framing is None and got.skipped == len(plain) - 5


def test_huge_declared_chunk_is_not_waited_for() -> None:
    sync = FramingSync(max_chunk=4096)
    body, _ = _chunked(_chat_events())
    got = sync.feed(b"\r\nffffffff\r\n" + body)
    assert got is not None and got.framing == CHUNKED
    assert got.skipped == len(b"\r\nffffffff\r\n")


@pytest.mark.parametrize(
    ("event", "data", "want"),
    [
        ("message", '{"object":"chat.completion.chunk","choices":[]}', "openai.chat"),
        ("message", '{"object":"text_completion","choices":[{"text":"x"}]}', "openai.completions"),
        ("message", '{"choices":[{"index":0,"delta":{"content":"x"}}]}', "openai.chat"),
        ("content_block_delta", '{"type":"content_block_delta"}', "anthropic.messages"),
        ("message", '{"type":"message_delta","delta":{}}', "anthropic.messages"),
        ("response.output_text.delta", '{"delta":"x"}', "openai.responses"),
        ("message", '{"type":"response.completed"}', "openai.responses"),
        ("message", '{"token":{"id":5,"text":"x","logprob":-1}}', "tgi.generate"),
        ("ndjson", '{"model":"m","message":{"content":"x"},"done":false}', "ollama.chat"),
        ("ndjson", '{"model":"m","response":"x","done":false}', "ollama.generate"),
        ("message", "[DONE]", None),
        ("message", '{"broken', None),
        ("message", "[" * 5000, None),
        # the strongest proof wins: the event name, then a type tag, then the
        # object tag, then the fields' shape (Ollama, TGI, OpenAI choices)
        ("response.created", '{"type":"message_start"}', "openai.responses"),
        ("message_start", '{"type":"response.created"}', "anthropic.messages"),
        ("message_start", "not json", "anthropic.messages"),
        ("message", '{"type":"message_stop","object":"text_completion"}', "anthropic.messages"),
        ("message", '{"object":"text_completion","choices":[{"delta":{}}]}', "openai.completions"),
        ("message", '{"object":"chat.completion.chunk","done":true,"message":{}}', "openai.chat"),
        ("ndjson", '{"message":{},"response":"x","token":{"id":1,"text":"a"}}', "ollama.chat"),
        ("message", '{"done":false,"response":"x","token":{"id":1,"text":"a"}}', "ollama.generate"),
        ("message", '{"token":{"id":1,"text":"a"},"choices":[{"delta":{}}]}', "tgi.generate"),
        ("message", '{"choices":[{"text":"x","delta":{}}]}', "openai.chat"),
        ("message", '{"type":["message_start"],"choices":[{"text":"x"}]}', "openai.completions"),
        ("message", '{"response":"x"}', None),
    ],
)
def test_guess_dialect(event: str, data: str, want: str | None) -> None:
    assert guess_dialect(event, data) == want
