"""Every integer a dialect reads off the wire is held to the range of what it
becomes (issue #24: a chat chunk whose ``choices[].index`` was 2^63 stopped the
recording): indices to ``chunks.choice`` (32-bit), counts to the 64-bit count
columns, token ids to the tokenizers' 32-bit ids, request fields to their
columns. An integer out of range makes its item INVALID (an error row on the
stream), never a number clamped into range; the next item of the same
dialect instance is read as usual.

Each case puts one value, spelled as JSON text, at one integer position of one
dialect's item; every value is tried at every position: the edges of every
width, negative, huge (past the 4300 digits Python converts), floats (1e400
parses as infinity) and booleans.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from sniffer.core.sse import SseDecoder
from sniffer.llm.dialects.anthropic import AnthropicMessages
from sniffer.llm.dialects.base import INVALID, Delta, Dialect
from sniffer.llm.dialects.ollama import OllamaChat, OllamaGenerate
from sniffer.llm.dialects.openai import OpenAIChat, OpenAICompletions
from sniffer.llm.dialects.responses import OpenAIResponses
from sniffer.llm.dialects.tgi import TgiGenerate
from sniffer.llm.values import (
    COUNT_RANGE,
    INDEX_RANGE,
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    INT64_MIN,
    REQUEST_RANGES,
    TOKEN_ID_RANGE,
    RequestSummary,
)

#: (JSON text, the value json.loads gives)
EDGES: list[tuple[str, Any]] = [
    ("0", 0),
    ("1", 1),
    (str(INT32_MAX), INT32_MAX),
    (str(INT32_MAX + 1), INT32_MAX + 1),
    (str(2**32 - 1), 2**32 - 1),
    (str(2**32), 2**32),
    (str(INT64_MAX), INT64_MAX),
    (str(INT64_MAX + 1), INT64_MAX + 1),
    (str(2**64), 2**64),
    ("-1", -1),
    (str(INT32_MIN), INT32_MIN),
    (str(INT64_MIN - 1), INT64_MIN - 1),
    ("1" + "0" * 400, 10**400),
    ("9" * 5000, None),  # Python refuses to convert it: broken JSON
    ("1e400", float("inf")),
    ("-1e400", float("-inf")),
    ("2.0", 2.0),
    ("true", True),
    ("false", False),
]

V = "__V__"


@dataclass(frozen=True)
class Case:
    """One integer position: ``template`` with ``V`` where the value goes,
    fed to a new ``make()`` as a streamed item (``body`` False) or a whole
    body; ``read`` finds the typed value in the deltas (None: not typed)."""

    name: str
    make: Callable[[], Dialect]
    template: str
    bounds: tuple[int, int]
    read: Callable[[list[Delta]], Any] | None = None
    body: bool = False
    event_type: str = "message"
    #: what a value that is not an integer means here: "invalid" (it must be
    #: an integer) or "ignored" (read as absent)
    non_int: str = "ignored"
    #: items sent first (to set up a block, a message)
    before: tuple[str, ...] = ()


def _choice(deltas: list[Delta]) -> int:
    return next(d.choice for d in deltas if d.kind != INVALID)


def _usage(attr: str) -> Callable[[list[Delta]], Any]:
    def read(deltas: list[Delta]) -> Any:
        u = next((d.usage for d in deltas if d.usage is not None), None)
        return None if u is None else getattr(u, attr)

    return read


ANTHROPIC_START = (
    '{"type":"message_start","message":{"id":"m","model":"x","usage":{"input_tokens":1}}}'
)

CASES = [
    Case(
        "openai.chat choices[].index",
        OpenAIChat,
        '{"choices":[{"index":__V__,"delta":{"content":"x"}}]}',
        INDEX_RANGE,
        _choice,
        non_int="invalid",
    ),
    Case(
        "openai.chat body choices[].index",
        OpenAIChat,
        '{"choices":[{"index":__V__,"message":{"content":"x"},"finish_reason":"stop"}]}',
        INDEX_RANGE,
        _choice,
        body=True,
        non_int="invalid",
    ),
    Case(
        "openai.chat n>1 choices[1].index",
        OpenAIChat,
        '{"choices":[{"index":0,"delta":{"content":"a"}},{"index":__V__,"delta":{"content":"b"}}]}',
        INDEX_RANGE,
        lambda ds: ds[1].choice,
        non_int="invalid",
    ),
    Case(
        "openai.completions choices[].index",
        OpenAICompletions,
        '{"choices":[{"index":__V__,"text":"x"}]}',
        INDEX_RANGE,
        _choice,
        non_int="invalid",
    ),
    Case(
        "openai usage.prompt_tokens",
        OpenAIChat,
        '{"choices":[],"usage":{"prompt_tokens":__V__,"completion_tokens":1}}',
        COUNT_RANGE,
        _usage("prompt_tokens"),
    ),
    Case(
        "openai usage.completion_tokens (on a choice)",
        OpenAIChat,
        '{"choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"completion_tokens":__V__}}',
        COUNT_RANGE,
        _usage("completion_tokens"),
    ),
    Case(
        "openai usage.total_tokens",
        OpenAIChat,
        '{"choices":[],"usage":{"prompt_tokens":1,"total_tokens":__V__}}',
        COUNT_RANGE,
        _usage("total_tokens"),
    ),
    Case(
        "openai usage.prompt_tokens_details.cached_tokens",
        OpenAIChat,
        '{"choices":[],"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":__V__}}}',
        COUNT_RANGE,
    ),
    Case(
        "openai usage.completion_tokens_details.reasoning_tokens",
        OpenAICompletions,
        '{"choices":[],"usage":{"completion_tokens_details":{"reasoning_tokens":__V__}}}',
        COUNT_RANGE,
        _usage("reasoning_tokens"),
    ),
    Case(
        "openai logprobs token id",
        OpenAIChat,
        '{"choices":[{"index":0,"delta":{"content":"x"},'
        '"logprobs":{"content":[{"token":"x","logprob":-1,"id":__V__,"top_logprobs":[]}]}}]}',
        TOKEN_ID_RANGE,
    ),
    Case(
        "openai logprobs top_logprobs token id",
        OpenAICompletions,
        '{"choices":[{"index":0,"text":"x","logprobs":[{"token":"x","logprob":-1,'
        '"top_logprobs":[{"token":"y","logprob":-2,"token_id":__V__}]}]}]}',
        TOKEN_ID_RANGE,
    ),
    Case(
        "responses output_index",
        OpenAIResponses,
        '{"type":"response.output_text.delta","output_index":__V__,"delta":"x"}',
        INDEX_RANGE,
        _choice,
        non_int="invalid",
    ),
    Case(
        "responses output_index of an event not modelled",
        OpenAIResponses,
        '{"type":"response.content_part.added","output_index":__V__,"part":{}}',
        INDEX_RANGE,
        # not an index at all: the event is stream-level
        lambda ds: ds[0].choice if ds[0].choice >= 0 else None,
    ),
    Case(
        "responses usage.input_tokens",
        OpenAIResponses,
        '{"type":"response.completed","response":{"status":"completed",'
        '"usage":{"input_tokens":__V__,"output_tokens":2}}}',
        COUNT_RANGE,
        _usage("prompt_tokens"),
    ),
    Case(
        "responses body usage.output_tokens",
        OpenAIResponses,
        '{"status":"completed","output":[{"type":"message","content":'
        '[{"type":"output_text","text":"x"}]}],"usage":{"output_tokens":__V__}}',
        COUNT_RANGE,
        _usage("completion_tokens"),
        body=True,
    ),
    Case(
        "responses logprobs token id",
        OpenAIResponses,
        '{"type":"response.output_text.delta","output_index":0,"delta":"x",'
        '"logprobs":[{"token":"x","logprob":-1,"id":__V__}]}',
        TOKEN_ID_RANGE,
    ),
    Case(
        "anthropic content_block_delta index",
        AnthropicMessages,
        '{"type":"content_block_delta","index":__V__,"delta":{"type":"text_delta","text":"x"}}',
        INDEX_RANGE,
        _choice,
        non_int="invalid",
    ),
    Case(
        "anthropic content_block_start index",
        AnthropicMessages,
        '{"type":"content_block_start","index":__V__,"content_block":{"type":"text","text":"x"}}',
        INDEX_RANGE,
        _choice,
        non_int="invalid",
    ),
    Case(
        "anthropic content_block_stop index",
        AnthropicMessages,
        '{"type":"content_block_stop","index":__V__}',
        INDEX_RANGE,
        _choice,
        non_int="invalid",
    ),
    Case(
        "anthropic message_start usage.input_tokens",
        AnthropicMessages,
        '{"type":"message_start","message":{"id":"m","model":"x","usage":{"input_tokens":__V__}}}',
        COUNT_RANGE,
        _usage("prompt_tokens"),
    ),
    Case(
        "anthropic message_delta usage.output_tokens",
        AnthropicMessages,
        '{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":__V__}}',
        COUNT_RANGE,
        _usage("completion_tokens"),
        before=(ANTHROPIC_START,),
    ),
    Case(
        "anthropic usage.cache_read_input_tokens",
        AnthropicMessages,
        '{"type":"message_start","message":{"id":"m","model":"x",'
        '"usage":{"input_tokens":1,"cache_read_input_tokens":__V__}}}',
        COUNT_RANGE,
    ),
    Case(
        "anthropic body usage.output_tokens",
        AnthropicMessages,
        '{"type":"message","content":[{"type":"text","text":"x"}],"stop_reason":"end_turn",'
        '"usage":{"input_tokens":1,"output_tokens":__V__}}',
        COUNT_RANGE,
        _usage("completion_tokens"),
        body=True,
    ),
    Case(
        "tgi token.id",
        TgiGenerate,
        '{"index":1,"token":{"id":__V__,"text":"x","logprob":-1,"special":false},'
        '"generated_text":null,"details":null}',
        TOKEN_ID_RANGE,
    ),
    Case(
        "tgi details.generated_tokens",
        TgiGenerate,
        '{"index":1,"token":{"id":1,"text":"x","logprob":-1,"special":false},'
        '"generated_text":"x","details":{"finish_reason":"length","generated_tokens":__V__}}',
        COUNT_RANGE,
        _usage("completion_tokens"),
    ),
    Case(
        "tgi body details.tokens[].id",
        TgiGenerate,
        '{"generated_text":"x","details":{"finish_reason":"length","input_length":__V__,'
        '"tokens":[{"id":__V__,"text":"x","logprob":-1,"special":false}]}}',
        (0, TOKEN_ID_RANGE[1]),  # both: the narrower range decides
        _usage("prompt_tokens"),
        body=True,
    ),
    Case(
        "ollama.generate eval_count",
        OllamaGenerate,
        '{"model":"m","response":"","done":true,"done_reason":"stop","eval_count":__V__}',
        COUNT_RANGE,
        _usage("completion_tokens"),
        event_type="ndjson",
    ),
    Case(
        "ollama.chat total_duration",
        OllamaChat,
        '{"model":"m","message":{"role":"assistant","content":""},"done":true,'
        '"done_reason":"stop","prompt_eval_count":1,"total_duration":__V__}',
        COUNT_RANGE,
        event_type="ndjson",
    ),
    Case(
        "ollama.chat tool_calls[].function.index",
        OllamaChat,
        '{"model":"m","message":{"role":"assistant","content":"","tool_calls":'
        '[{"function":{"index":__V__,"name":"f","arguments":{}}}]},"done":false}',
        INDEX_RANGE,
        event_type="ndjson",
    ),
]


def _feed(case: Case, item: str) -> list[Delta]:
    dialect = case.make()
    for before in case.before:
        assert all(d.kind != INVALID for d in dialect.event(before, case.event_type))
    if case.body:
        return dialect.body(item)
    return dialect.event(item, case.event_type)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize(("text", "value"), EDGES, ids=[t[:12] for t, _ in EDGES])
def test_every_wire_integer_is_held_to_its_range(case: Case, text: str, value: Any) -> None:
    item = case.template.replace(V, text)
    deltas = _feed(case, item)
    invalid = [d for d in deltas if d.kind == INVALID]
    if value is None:  # not a number Python reads: broken JSON
        assert [d.kind for d in deltas] == [INVALID]
        return
    lo, hi = case.bounds
    is_int = type(value) is int
    if type(value) in (int, float) and not lo <= value <= hi:
        # a number past the range (an integer, or infinity): the whole item is
        # bad input, kept as it came, with the reason
        assert [d.kind for d in deltas] == [INVALID], deltas
        assert invalid[0].raw == item
        assert invalid[0].error
        assert "out of range" in invalid[0].error or (is_int and value < 0 and lo == 0)
    elif not is_int and case.non_int == "invalid":
        assert [d.kind for d in deltas] == [INVALID]
    else:
        assert not invalid, invalid[0].error
        if case.read is not None:
            assert case.read(deltas) == (value if is_int else None)
    # the same dialect reads a good item afterwards: one bad item costs that item
    follow = case.template.replace(V, "1")
    assert all(d.kind != INVALID for d in _feed(case, follow))


@pytest.mark.parametrize(("text", "value"), EDGES, ids=[t[:12] for t, _ in EDGES])
@pytest.mark.parametrize("field", ["n", "seed", "max_tokens", "top_k", "top_logprobs"])
def test_request_fields_are_held_to_their_columns(field: str, text: str, value: Any) -> None:
    """A request field wider than its column is left out (None) and named in
    ``out_of_range`` (the streams stage records an error row for it)."""
    import json

    try:
        body = json.loads('{"model":"m","messages":[],"' + field + '":' + text + "}")
    except ValueError:
        assert value is None
        return
    r = RequestSummary.parse(body)
    got = getattr(r, field)
    lo, hi = REQUEST_RANGES[field]
    if type(value) is int and lo <= value <= hi:
        assert got == value and r.out_of_range == ()
    elif type(value) is int:
        assert got is None and r.out_of_range == (field,)
    else:
        assert got is None and r.out_of_range == ()


def test_the_ranges_fit_the_columns_they_land_in() -> None:
    """Each bound is the width of the column its value is stored in
    (``sniffer.store.models``): PostgreSQL ``Integer`` is 32-bit, ``BigInteger``
    64-bit (SQLite's INTEGER is 64-bit for both)."""
    from sqlalchemy import BigInteger, Integer

    from sniffer.store.models import chunks, streams

    width = {Integer: (INT32_MIN, INT32_MAX), BigInteger: (INT64_MIN, INT64_MAX)}

    def column(col: Any) -> tuple[int, int]:
        return width[type(col.type)]

    assert INDEX_RANGE[1] == column(chunks.c.choice)[1]
    assert COUNT_RANGE[1] == column(streams.c.prompt_tokens)[1]
    assert COUNT_RANGE[1] == column(streams.c.completion_tokens)[1]
    for field in ("n", "max_tokens", "seed", "prompt_len"):
        assert REQUEST_RANGES[field] == column(streams.c[field]), field


# ------------------------------------------------------------------ core stages


def test_sse_retry_of_any_length_is_not_an_error() -> None:
    """``retry:`` with more digits than Python converts (4300) is ignored; the
    events around it are dispatched."""
    dec = SseDecoder()
    events = dec.feed(b"retry: " + b"9" * 5000 + b"\ndata: a\n\nretry: 1500\ndata: b\n\n")
    assert [e.data for e in events] == ["a", "b"]
    assert dec.retry == 1500


@pytest.mark.parametrize(
    ("status", "ok"), [("200", True), ("99999999999999999999", False), ("-20", False)]
)
def test_h2_status_must_be_three_digits(status: str, ok: bool) -> None:
    """``:status`` is a three-digit code (RFC 9113 §8.3.2): a wider one (it
    would not fit ``streams.status``) is a broken response with an error row,
    not a number."""
    import h2.config

    from sniffer.core.events import PipelineError, StreamResponse
    from tests.test_h2 import CHAT, Peers, run

    p = Peers()
    p.s.config = h2.config.H2Configuration(
        client_side=False, header_encoding=None, validate_outbound_headers=False
    )
    sid = p.request(CHAT)
    p.s.send_headers(sid, [(":status", status), ("content-type", "text/event-stream")])
    p.s.send_data(sid, b"data: [DONE]\n\n", end_stream=True)
    p.pump()
    out = run(p.wire)
    statuses = [e.status for e in out if isinstance(e, StreamResponse)]
    if ok:
        assert statuses == [200]
    else:
        assert all(s is None or 100 <= s <= 999 for s in statuses)
        assert any("status" in e.message for e in out if isinstance(e, PipelineError))


@pytest.mark.parametrize("status", ["0", "14", "9" * 5000, "99999999999"])
def test_grpc_status_of_any_length_is_a_code(status: str) -> None:
    """A ``grpc-status`` trailer wider than a status code (Python will not
    convert one of 5000 digits) is UNKNOWN, and the call ends with it."""
    import h2.config

    from sniffer.core.events import StreamClosed, StreamState
    from tests.test_h2 import Peers, run

    p = Peers()
    p.s.config = h2.config.H2Configuration(
        client_side=False, header_encoding=None, validate_outbound_headers=False
    )
    sid = p.c.get_next_available_stream_id()
    p.c.send_headers(
        sid,
        [(":method", "POST"), (":path", "/demo.Router/Ping"), (":scheme", "http"),
         (":authority", "a"), ("content-type", "application/grpc"), ("te", "trailers")],
    )  # fmt: skip
    p.c.send_data(sid, b"\x00\x00\x00\x00\x02\x08\x01", end_stream=True)
    p.pump()
    p.s.send_headers(sid, [(":status", "200"), ("content-type", "application/grpc")])
    p.s.send_data(sid, b"\x00\x00\x00\x00\x02\x08\x02")
    p.s.send_headers(sid, [("grpc-status", status)], end_stream=True)
    p.pump()
    out = run(p.wire)
    (closed,) = [e for e in out if isinstance(e, StreamClosed)]
    if status == "0":
        assert closed.state is StreamState.COMPLETE
    else:
        assert closed.state is StreamState.ERROR
        expected = "UNAVAILABLE" if status == "14" else "UNKNOWN"
        assert closed.error is not None and expected in closed.error


def test_a_token_spelled_id_is_not_a_token_id() -> None:
    """OpenAI completions' ``top_logprobs`` map token strings to
    log-probabilities: a token spelled ``id`` or ``token_id`` there is text,
    not an integer to hold to a range."""
    item = (
        '{"choices":[{"index":0,"text":"id","logprobs":{"tokens":["id"],'
        '"token_logprobs":[-0.1],"top_logprobs":[{"id":-0.1,"token_id":-2.5}],'
        '"text_offset":[0]}}]}'
    )
    (delta,) = OpenAICompletions().event(item, "message")
    assert delta.kind != INVALID and delta.text == "id"
