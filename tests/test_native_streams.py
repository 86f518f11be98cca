"""The streams stage's native item loop (``sniffer._native.body_chunks``) against
the Python one (``StreamAssembler._response_body`` and ``_deltas``): random
SSE and NDJSON bodies of every item kind a dialect meets — chunks with and without a
model, several choices, usage, logprobs, tool calls, broken JSON, error
events, ``[DONE]`` and items after it, keep-alive comments — cut at random
offsets, through a native and a pure stage; both must give the same events,
the same stats and the same closed stream. ``max_quiet_events`` is drawn small
so that the cap on quiet events is crossed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core import native as core_native
from sniffer.core.events import (
    ConnectionOpened,
    EndReason,
    HttpBody,
    HttpEnd,
    HttpRequest,
    HttpResponse,
    StoreEvent,
)
from sniffer.core.http1 import HttpOutput
from sniffer.core.streams import StreamAssembler

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(
        core_native.why_unavailable() is not None,
        reason=f"the native core is not available ({core_native.why_unavailable()})",
    ),
]

CLIENT = ("127.0.0.1", 40000)
SERVER = ("127.0.0.1", 8001)

texts = st.sampled_from(["", "Hel", "lo ", "\ufffd", "日本", "a\nb", "💡", " 42", "x" * 40])


@st.composite
def chat_items(draw: st.DrawFn, completions: bool) -> str:
    """One SSE event (its ``data:`` lines and blank line, maybe a comment)."""
    kind = draw(
        st.sampled_from(
            ["delta"] * 6
            + ["role", "finish", "usage", "usage_on_choice", "done", "broken", "empty"]
            + ["error", "error_event", "array", "logprobs", "tools", "comment", "other"]
        )
    )
    index = draw(st.sampled_from([0, 0, 0, 1]))
    model = draw(st.sampled_from([None, None, "m-1", "m-2"]))
    base: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk"}
    if model is not None:
        base["model"] = model

    def choice(**fields: Any) -> dict[str, Any]:
        c: dict[str, Any] = {"index": index, "finish_reason": None}
        if completions:
            c["text"] = fields.pop("content", "")
        else:
            c["delta"] = fields.pop("delta", {"content": fields.pop("content", "")})
        c.update(fields)
        return c

    data: str
    if kind == "delta":
        data = json.dumps({**base, "choices": [choice(content=draw(texts))]})
    elif kind == "role":
        data = json.dumps({**base, "choices": [choice(delta={"role": "assistant", "content": ""})]})
    elif kind == "finish":
        data = json.dumps({**base, "choices": [choice(finish_reason="stop", delta={})]})
    elif kind == "usage":
        data = json.dumps(
            {**base, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}}
        )
    elif kind == "usage_on_choice":
        data = json.dumps({**base, "choices": [choice(content="u")], "usage": {"prompt_tokens": 1}})
    elif kind == "done":
        data = "[DONE]"
    elif kind == "broken":
        data = '{"choices": [' + draw(texts)
    elif kind == "empty":
        data = ""
    elif kind == "error":
        data = json.dumps({"error": {"message": draw(st.sampled_from(["", "overloaded"]))}})
    elif kind == "error_event":
        return "event: error\ndata: upstream went away\n\n"
    elif kind == "array":
        data = "[1, 2]"
    elif kind == "logprobs":
        lp = {"content": [{"token": "a", "logprob": -0.25, "top_logprobs": []}]}
        data = json.dumps({**base, "choices": [choice(content="a", logprobs=lp)]})
    elif kind == "tools":
        calls = [{"index": 0, "id": "t", "function": {"name": "f", "arguments": "{}"}}]
        data = json.dumps({**base, "choices": [choice(delta={"tool_calls": calls})]})
    elif kind == "comment":
        return ": ping\n\n"
    else:
        data = json.dumps({"object": "keep-alive"})
    return "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


ANTHROPIC = [
    'event: message_start\ndata: {"type":"message_start","message":{"id":"m","model":"c",'
    '"usage":{"input_tokens":3}}}\n\n',
    'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    '"content_block":{"type":"text","text":""}}\n\n',
    'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
    '"delta":{"type":"text_delta","text":"Hi"}}\n\n',
    'event: ping\ndata: {"type": "ping"}\n\n',
    'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    '"usage":{"output_tokens":2}}\n\n',
    'event: message_stop\ndata: {"type":"message_stop"}\n\n',
    "event: content_block_delta\ndata: {broken\n\n",
]

OLLAMA = [
    '{"model":"m","message":{"role":"assistant","content":"Hi"},"done":false}',
    '{"model":"m","message":{"role":"assistant","content":" 日本"},"done":false}',
    '{"model":"m","message":{"role":"assistant","content":""},"done":true,'
    '"done_reason":"stop","prompt_eval_count":3,"eval_count":2}',
    '{"error":"model not found"}',
    "{broken",
    "",
    "   ",
]

PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "anthropic": "/v1/messages",
    "ollama": "/api/chat",
}


def ndjson(item: str) -> str:
    """An SSE event of :func:`chat_items` as an NDJSON line (its data)."""
    lines = [ln[6:] for ln in item.split("\n") if ln.startswith("data: ")]
    return "".join(lines) + "\n"


@st.composite
def bodies(draw: st.DrawFn) -> tuple[str, bool, bytes, list[int]]:
    """(dialect, NDJSON body?, body, cut offsets)."""
    dialect = draw(st.sampled_from(sorted(PATHS)))
    lines = dialect == "ollama" or draw(st.integers(0, 4)) == 0
    if dialect == "anthropic":
        items = draw(st.lists(st.sampled_from(ANTHROPIC), max_size=25))
        lines = False
    elif dialect == "ollama":
        items = [ln + "\n" for ln in draw(st.lists(st.sampled_from(OLLAMA), max_size=20))]
    else:
        items = draw(st.lists(chat_items(dialect == "completions"), max_size=30))
        if lines:
            items = [ndjson(item) for item in items]
    body = "".join(items).encode()
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=8)))
    return dialect, lines, body, cuts


def run(
    native: bool, dialect: str, body: bytes, cuts: list[int], max_quiet: int, lines: bool = False
) -> Any:
    a = StreamAssembler(native=native, max_quiet_events=max_quiet)
    ctype = "application/x-ndjson" if lines else "text/event-stream"
    request = json.dumps({"model": "m", "stream": True, "messages": []}).encode()
    events: list[HttpOutput] = [
        ConnectionOpened(1, 0.5, CLIENT, SERVER, True),
        HttpRequest(1, 0, 1.0, "POST", PATHS[dialect], "1.1", (("host", "x"),)),
        HttpBody(1, 0, 1.0, True, request),
        HttpEnd(1, 0, 1.0, True, EndReason.COMPLETE),
        HttpResponse(1, 0, 2.0, 200, "OK", "1.1", (("content-type", ctype),)),
    ]
    ts = 3.0
    for lo, hi in zip([0, *cuts], [*cuts, len(body)], strict=True):
        # the clock goes back once in a while (a flag both must raise alike)
        ts = ts - 0.5 if (lo * 7) % 5 == 0 and lo else ts + 0.25
        events.append(HttpBody(1, 0, ts, False, body[lo:hi]))
    events.append(HttpEnd(1, 0, ts + 1.0, False, EndReason.COMPLETE))
    out: list[StoreEvent] = []
    for ev in events:
        a.feed_into(ev, out)
    return out, a.stats


@settings(max_examples=400, deadline=None)
@given(bodies(), st.sampled_from([0, 1, 3, 10_000]))
def test_the_native_sse_loop_gives_what_the_python_one_gives(
    case: tuple[str, bool, bytes, list[int]], max_quiet: int
) -> None:
    dialect, lines, body, cuts = case
    nat = run(True, dialect, body, cuts, max_quiet, lines)
    ref = run(False, dialect, body, cuts, max_quiet, lines)
    assert nat[0] == ref[0]
    assert nat[1] == ref[1]


def test_a_long_stream_in_one_body_event() -> None:
    """Every kind of item in one body (one native call), the cap crossed."""
    items = [
        json.dumps({"model": "m", "choices": [{"index": i % 2, "delta": {"content": f"t{i}"}}]})
        for i in range(50)
    ]
    items += ["{broken", "", "[DONE]", '{"late": 1}', "{after broken"]
    body = "".join(f"data: {d}\n\n" for d in items).encode()
    for max_quiet in (0, 2, 100):
        nat = run(True, "chat", body, [], max_quiet)
        ref = run(False, "chat", body, [], max_quiet)
        assert nat == ref
        kinds = [getattr(e, "kind", None) for e in nat[0]]
        assert kinds.count("content") == 50
    # the broken item before [DONE] is a dialect error; the one after it is
    # stored as it came (after_done), not parsed
    assert nat[1].errors.get("dialect") == 1
    assert kinds.count("after_done") == 2


class Boom(Exception):
    pass


def test_a_dialect_that_raises_costs_its_exchange_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in a dialect (here on its third item) inside the native call:
    the state up to it is written back and the stage records the error as the
    Python loop does."""
    from sniffer.llm.dialects.anthropic import AnthropicMessages

    real = AnthropicMessages.event
    calls = {"n": 0}

    def event(self: Any, data: str, event_type: str) -> Any:
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            raise Boom("dialect bug")
        return real(self, data, event_type)

    monkeypatch.setattr(AnthropicMessages, "event", event)
    body = "".join(ANTHROPIC[:5]).encode()
    calls["n"] = 0
    nat = run(True, "anthropic", body, [], 100)
    calls["n"] = 0
    ref = run(False, "anthropic", body, [], 100)
    assert nat == ref
    assert any(getattr(e, "stage", None) == "streams" or "Boom" in str(e) for e in nat[0])


def test_the_default_pipeline_runs_the_native_loop() -> None:
    """The native loop is what a default (native) pipeline runs, not a path
    only this module's tests take; a pure pipeline runs the Python one."""
    from sniffer.core.pipeline import Pipeline, PipelineConfig

    assert Pipeline().streams._body_chunks is not None
    assert Pipeline(PipelineConfig(native=False)).streams._body_chunks is None


def test_native_chunk_events_are_the_objects_the_class_makes() -> None:
    """The native loop makes each ``ChunkEvent`` from its type's allocator and
    its slots' descriptors, not through the class call: the same type,
    values, equality, hash and frozen slots; tracked by the cycle collector
    as the class call's are; and no reference kept or lost (a text is held
    by its event only, and freed with it)."""
    import dataclasses
    import gc
    import sys

    from sniffer.core.events import ChunkEvent

    def item(t: str) -> str:
        return json.dumps({"model": "m", "choices": [{"index": 0, "delta": {"content": t}}]})

    body = "".join(f"data: {item(t)}\n\n" for t in ["uniq-1", "uniq-2", "uniq-3"]).encode()
    out, _ = run(True, "chat", body, [], 100)
    made = [e for e in out if type(e) is ChunkEvent and e.kind == "content"]
    assert [e.text for e in made] == ["uniq-1", "uniq-2", "uniq-3"]
    for ev in made:
        twin = ChunkEvent(*[getattr(ev, f.name) for f in dataclasses.fields(ChunkEvent)])
        assert ev == twin and hash(ev) == hash(twin) and repr(ev) == repr(twin)
        assert gc.is_tracked(ev) and gc.is_tracked(twin)
        assert dataclasses.replace(ev, text="x").text == "x"
        with pytest.raises(dataclasses.FrozenInstanceError):
            ev.text = "y"  # type: ignore[misc]
    del twin, ev
    text = made[0].text
    assert sys.getrefcount(text) == 3  # the event, ``text`` and the call's argument
    del made
    out.clear()
    assert sys.getrefcount(text) == 2  # freed with its event


def test_an_exchange_of_another_type_is_read_and_written_through_getattr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The native loop reads an exact ``_Exchange``'s slots where their
    descriptors keep them and writes them through the descriptors; any other
    object (here a subclass that logs its attribute reads) goes through
    ``getattr`` / ``setattr``. Both give what the Python loop gives."""
    from sniffer.core import streams

    reads: list[str] = []  # the attributes the native loop read
    inside = [False]

    class Logged(streams._Exchange):
        __slots__ = ()

        def __getattribute__(self, name: str) -> Any:
            if inside[0]:
                reads.append(name)
            return super().__getattribute__(name)

    loop = streams.body_chunks()

    def logged_loop(*args: Any) -> Any:
        inside[0] = True
        try:
            return loop(*args)
        finally:
            inside[0] = False

    items = [
        json.dumps({"model": "m", "choices": [{"index": i % 2, "delta": {"content": f"t{i}"}}]})
        for i in range(6)
    ] + ["{broken", "[DONE]", "late"]
    body = "".join(f"data: {d}\n\n" for d in items).encode()
    cuts = [30, 31, 200, len(body) - 5]
    exact = run(True, "chat", body, cuts, 100)
    ref = run(False, "chat", body, cuts, 100)
    assert exact == ref
    monkeypatch.setattr(streams, "body_chunks", lambda: logged_loop)
    monkeypatch.setattr(streams, "_Exchange", Logged)
    assert run(True, "chat", body, cuts, 100) == ref
    for name in ("decoder", "dialect", "seq", "text_len", "t_first", "t_last", "chunk_idx"):
        assert name in reads


def test_an_unset_slot_raises_what_getattr_raises() -> None:
    """An exchange slot that is unset raises AttributeError in the native
    loop as ``getattr`` does, before any event is made; set again, the loop
    reads and writes it."""
    from sniffer.core.native import body_chunks

    a = StreamAssembler(native=True)
    request = json.dumps({"model": "m", "stream": True, "messages": []}).encode()
    opening: list[HttpOutput] = [
        ConnectionOpened(1, 0.5, CLIENT, SERVER, True),
        HttpRequest(1, 0, 1.0, "POST", PATHS["chat"], "1.1", (("host", "x"),)),
        HttpBody(1, 0, 1.0, True, request),
        HttpEnd(1, 0, 1.0, True, EndReason.COMPLETE),
        HttpResponse(1, 0, 2.0, 200, "OK", "1.1", (("content-type", "text/event-stream"),)),
    ]
    for ev in opening:
        a.feed(ev)
    x = a._ex[(1, 0)]
    chunk = json.dumps({"model": "m", "choices": [{"index": 0, "delta": {"content": "hi"}}]})
    data = f"data: {chunk}\n\n".encode()
    del x.text_len
    with pytest.raises(AttributeError) as want:
        _ = x.text_len
    out: list[Any] = []
    with pytest.raises(AttributeError) as got:
        body_chunks()(x, 3.0, data, out, 100)
    assert str(got.value) == str(want.value)
    assert out == [] and x.seq == 0
    x.text_len = 0
    assert body_chunks()(x, 3.0, data, out, 100) == (1, 0, None)
    assert (x.seq, x.chunk_count, x.text_len, x.t_first, x.t_last) == (1, 1, 2, 3.0, 3.0)
    assert x.chunk_idx == {0: 1} and out[0].text == "hi"
