"""Redaction: each built-in pattern with positives and near misses, user patterns,
events, JSON validity, disabled mode."""

from __future__ import annotations

import json
import random
import re
from contextlib import AbstractContextManager, nullcontext
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.core.events import (
    ChunkEvent,
    ConnectionOpened,
    PipelineError,
    StoreEvent,
    StreamClosed,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.llm.values import RequestSummary
from sniffer.record.redact import (
    Redactor,
    StreamRedactor,
    TextWindow,
    apply_spans,
    id_checksum_ok,
    luhn_ok,
    redact_choice_texts,
)

T0 = 1_700_000_000.0

_W = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)


def make_id(first17: str) -> str:
    return first17 + "10X98765432"[sum(int(c) * w for c, w in zip(first17, _W, strict=True)) % 11]


def wrong_id(first17: str) -> str:
    good = make_id(first17)
    bad = "0" if good[-1] != "0" else "1"
    return first17 + bad


VALID_ID = make_id("11010519491231002")  # ends in X
VALID_ID_2 = make_id("44030419900307123")
VALID_CARDS = [
    "4111111111111111",  # Visa test number
    "4111 1111 1111 1111",
    "5500-0000-0000-0004",  # Mastercard
    "378282246310005",  # Amex, 15 digits
    "3782 822463 10005",
    "6011111111111117",  # Discover
    "6212345678901265",  # UnionPay-shaped, Luhn valid
]


def R(s: str, **kw: object) -> str:
    return Redactor(**kw).text(s)  # type: ignore[arg-type]


def test_helpers() -> None:
    assert VALID_ID.endswith("X")
    assert id_checksum_ok(VALID_ID) and id_checksum_ok(VALID_ID.lower())
    assert not id_checksum_ok(wrong_id("11010519491231002"))
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")


# ---------------------------------------------------------------- phones


@pytest.mark.parametrize(
    "phone",
    [
        "13812345678",
        "138 1234 5678",
        "138-1234-5678",
        "+86 13812345678",
        "+8613812345678",
        "0086 138 1234 5678",
        "19912345678",
        "+1 (415) 555-2671",
        "+14155552671",
        "+44 20 7946 0958",
        "+49 151 12345678",
        "+33.1.23.45.67.89",
    ],
)
def test_phone_positives(phone: str) -> None:
    assert R(f"请拨打{phone}联系我") == "请拨打<PHONE>联系我"
    assert R(f"call {phone}.") == "call <PHONE>."


@pytest.mark.parametrize(
    "text",
    [
        "12812345678",  # 12x is not a mobile prefix
        "1381234567",  # 10 digits
        "138123456789",  # 12 digits
        "23812345678",
        "order 123456",
        "+1234",  # too short
        "x+14155552671",  # glued to a letter: an expression, not a number
        "+1234567890123456789",  # more than 15 digits
        "pi is 3.14159265358979",
    ],
)
def test_phone_near_misses(text: str) -> None:
    assert R(text) == text


# ---------------------------------------------------------------- ids


@pytest.mark.parametrize("ident", [VALID_ID, VALID_ID_2, VALID_ID.lower()])
def test_resident_id_positives(ident: str) -> None:
    assert R(f"身份证号{ident}。") == "身份证号<ID>。"
    spaced = f"{ident[:6]} {ident[6:14]} {ident[14:]}"
    assert R(f"ID: {spaced}") == "ID: <ID>"


@pytest.mark.parametrize(
    "text",
    [
        wrong_id("11010519491231002"),  # wrong checksum
        wrong_id("44030419900307123"),
        "11010519491231002",  # 17 digits
        "12345678901234567",  # 17 digits
        make_id("11010519491331002"),  # month 13: not a birth date
        VALID_ID + "1",  # 19 characters
        "A" + VALID_ID,  # glued to a letter
    ],
)
def test_resident_id_near_misses(text: str) -> None:
    out = R(text)
    assert "<ID>" not in out
    assert out == text


# ---------------------------------------------------------------- cards


@pytest.mark.parametrize("card", VALID_CARDS)
def test_card_positives(card: str) -> None:
    assert R(f"my card is {card}, exp 12/29") == "my card is <CARD>, exp 12/29"


def test_card_followed_by_more_digit_groups() -> None:
    assert R("4111 1111 1111 1111 123 is it") == "<CARD> 123 is it"
    assert R("+44 20 7946 0958 13812345678") == "<PHONE> <PHONE>"


@pytest.mark.parametrize(
    "text",
    [
        "4111111111111112",  # Luhn fails
        "4111 1111 1111 1112",
        "1234567812345670",  # Luhn passes, but no card starts with 1
        "1700000000000",  # a millisecond timestamp
        "411111111111",  # 12 digits
        "41111111111111111111",  # 20 digits
        "9111111111111111",
    ],
)
def test_card_near_misses(text: str) -> None:
    assert R(text) == text


# ---------------------------------------------------------------- e-mail, IP


@pytest.mark.parametrize(
    "addr",
    [
        "a@b.cn",
        "john.doe+tag@example.co.uk",
        "x_y-z%1@sub-domain.example.org",
        "13812345678@qq.com",
    ],
)
def test_email_positives(addr: str) -> None:
    assert R(f"<{addr}>") == "<<EMAIL>>"
    assert R(f"邮箱：{addr}。") == "邮箱：<EMAIL>。"


@pytest.mark.parametrize(
    "text", ["user@localhost", "@handle", "a@b", "foo@.com", "name at example dot com", "x@y.c"]
)
def test_email_near_misses(text: str) -> None:
    assert R(text) == text


@pytest.mark.parametrize("ip", ["192.168.1.10", "10.0.0.1", "255.255.255.255", "127.0.0.1"])
def test_ip_positives(ip: str) -> None:
    assert R(f"host {ip}:8080 down") == "host <IP>:8080 down"
    assert R(f"服务器{ip}。") == "服务器<IP>。"
    assert R(f"at {ip}.") == "at <IP>."


@pytest.mark.parametrize(
    "text",
    [
        "version 1.2.3.4.5",
        "999.1.1.1",
        "256.1.1.1",
        "1.2.3",
        "v1.2.3.4",
        "1.2.3.4a",
        "01.2.3.4.5.6",
        "3.14.15.926",  # 926 is not an octet
    ],
)
def test_ip_near_misses(text: str) -> None:
    assert R(text) == text


# ---------------------------------------------------------------- mixed, counts


def test_mixed_text_and_counts() -> None:
    r = Redactor()
    s = (
        f"Name: Li Lei, ID {VALID_ID}, tel 13812345678 / +1 415 555 2671, "
        "mail li.lei@example.com, card 4111-1111-1111-1111, from 192.168.0.7. "
        "Version 1.2.3.4.5 and 17-digit 12345678901234567 stay."
    )
    out = r.text(s)
    assert out == (
        "Name: Li Lei, ID <ID>, tel <PHONE> / <PHONE>, "
        "mail <EMAIL>, card <CARD>, from <IP>. "
        "Version 1.2.3.4.5 and 17-digit 12345678901234567 stay."
    )
    assert dict(r.counts) == {"ID": 1, "PHONE": 2, "EMAIL": 1, "CARD": 1, "IP": 1}
    assert r.text(out) == out  # placeholders are never redacted again


def test_no_digits_no_at_returns_same_object() -> None:
    r = Redactor()
    s = "The quick brown fox — 敏捷的狐狸"
    assert r.text(s) is s
    s2 = "There are 3 apples"
    assert r.text(s2) == s2


# ---------------------------------------------------------------- user patterns


def test_user_patterns() -> None:
    r = Redactor([(r"tk_[A-Za-z0-9]{16,}", "APIKEY"), (r"(?i)project\s+falcon", "")])
    out = r.text("key tk_abcdefghijklmnop1234 for Project  Falcon, call 13812345678")
    assert out == "key <APIKEY> for <REDACTED>, call <PHONE>"
    assert r.counts["APIKEY"] == 1 and r.counts["REDACTED"] == 1 and r.counts["PHONE"] == 1
    # User patterns run on text without digits too.
    assert r.text("project falcon") == "<REDACTED>"


def test_user_pattern_errors() -> None:
    with pytest.raises(ValueError, match=r"invalid redaction pattern '\(unclosed' \(bad\)"):
        Redactor([("(unclosed", "bad")])
    with pytest.raises(ValueError, match="matches the empty string"):
        Redactor([("x*", "empty")])


def test_disabled_changes_nothing() -> None:
    r = Redactor([("secret", "S")], enabled=False)
    s = f"13812345678 a@b.cn {VALID_ID} secret"
    assert r.text(s) is s
    ev = ChunkEvent(1, T0, 0, 0, 1, "content", text=s)
    assert r.event(ev) is ev
    assert r.events([ev]) == [ev]
    assert not r.counts


# ---------------------------------------------------------------- events


def opened(body: str, request: RequestSummary) -> StreamOpened:
    return StreamOpened(
        stream=1,
        conn=1,
        exchange=0,
        ts=T0,
        client=("127.0.0.1", 40000),
        server=("127.0.0.1", 8000),
        method="POST",
        path="/v1/chat/completions",
        request_headers=(("content-type", "application/json"),),
        request_body=body,
        request=request,
        dialect="openai.chat",
    )


def test_stream_opened_body_and_request_fields() -> None:
    body = json.dumps(
        {
            "model": "qwen-1.1.1.1",
            "messages": [
                {"role": "user", "content": "我的手机号是13812345678，邮箱 a@b.cn"},
            ],
            "stop": ["call 13812345678"],
        },
        ensure_ascii=False,
    )
    ev = opened(body, RequestSummary.parse(json.loads(body)))
    out = Redactor().event(ev)
    assert isinstance(out, StreamOpened)
    parsed = json.loads(out.request_body or "")
    assert parsed["messages"][0]["content"] == "我的手机号是<PHONE>，邮箱 <EMAIL>"
    # the typed request holds no free text: the model name is kept as sent
    assert out.request is ev.request
    assert out.request == RequestSummary(model="qwen-1.1.1.1", prompt_len=1)
    assert out.request_headers == ev.request_headers
    assert ev.request_body == body  # the input event is untouched


def test_chunk_fields() -> None:
    ev = ChunkEvent(
        stream=1,
        ts=T0,
        seq=3,
        choice=0,
        chunk_index=2,
        kind="content",
        text="Reach me: 13812345678",
        reasoning="the user gave a@b.cn",
        tool_calls='[{"function":{"arguments":"{\\"ip\\": \\"10.1.2.3\\"}"}}]',
        logprobs='{"content":[{"token":"13812345678"}]}',
        raw='{"x":"4111111111111111"}',
    )
    out = Redactor().event(ev)
    assert isinstance(out, ChunkEvent)
    assert out.text == "Reach me: <PHONE>"
    assert out.reasoning == "the user gave <EMAIL>"
    assert json.loads(out.tool_calls or "")[0]["function"]["arguments"] == '{"ip": "<IP>"}'
    assert json.loads(out.logprobs or "") == {"content": [{"token": "<PHONE>"}]}
    assert out.raw == '{"x":"<CARD>"}'
    assert (out.stream, out.seq, out.chunk_index, out.kind) == (1, 3, 2, "content")


def test_unchanged_events_are_the_same_objects() -> None:
    r = Redactor()
    evs: list[StoreEvent] = [
        ConnectionOpened(1, T0, ("127.0.0.1", 1), ("127.0.0.1", 2), True),
        opened(
            '{"model":"m","messages":[{"role":"user","content":"hi"}]}', RequestSummary(model="m")
        ),
        StreamResponse(1, T0, 200, (), "text/event-stream", True),
        ChunkEvent(1, T0, 0, 0, 1, "content", text="hello"),
        PipelineError(T0, "http", "framing", "bad chunk size"),
    ]
    out = r.events(evs)
    assert all(a is b for a, b in zip(out, evs, strict=True))


def test_stream_closed_and_pipeline_error() -> None:
    closed = StreamClosed(
        stream=1,
        ts=T0,
        state=StreamState.ERROR,
        reason="HTTP 400",
        done_seen=False,
        gap=False,
        t_first_content=None,
        t_last_chunk=None,
        chunk_count=0,
        event_count=1,
        text_len=0,
        finish_reasons=(),
        usage=None,
        response_body='{"choices":[{"message":{"content":"mail a@b.cn"}}]}',
        error="user 13812345678 not allowed",
    )
    out = Redactor().event(closed)
    assert isinstance(out, StreamClosed)
    assert json.loads(out.response_body or "")["choices"][0]["message"]["content"] == "mail <EMAIL>"
    assert out.error == "user <PHONE> not allowed"
    assert out.reason == "HTTP 400"
    perr = PipelineError(T0, "dialect", "invalid", 'bad item {"t":"13812345678"')
    out2 = Redactor().event(perr)
    assert isinstance(out2, PipelineError) and "13812345678" not in out2.message


def test_user_pattern_applies_to_json_text_even_across_syntax() -> None:
    r = Redactor([(r'"secret":\s*"[^"]*"', "S"), (r"acme-[0-9]+", "CUSTOMER")])
    body = '{"model":"m","messages":[{"role":"user","content":"for acme-42"}],"secret": "abc"}'
    out = r.event(opened(body, RequestSummary(model="m")))
    assert isinstance(out, StreamOpened)
    assert out.request_body == (
        '{"model":"m","messages":[{"role":"user","content":"for <CUSTOMER>"}],<S>}'
    )
    assert "abc" not in (out.request_body or "")


# ---------------------------------------------------------------- properties

SAFE = st.text(
    alphabet=st.sampled_from(list("abcdefghij ,.;:!?-\n你好世界")), min_size=0, max_size=30
)
PII = st.sampled_from(
    [
        ("13812345678", "<PHONE>"),
        ("+44 20 7946 0958", "<PHONE>"),
        (VALID_ID, "<ID>"),
        ("4111 1111 1111 1111", "<CARD>"),
        ("jane@example.org", "<EMAIL>"),
        ("172.16.254.1", "<IP>"),
    ]
)


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.tuples(SAFE, PII), max_size=5), tail=SAFE)
def test_property_pii_between_plain_text(
    parts: list[tuple[str, tuple[str, str]]], tail: str
) -> None:
    # Separate each item from its neighbours with a space (a "." or "-" right
    # before a number legitimately changes what it is).
    text = "".join(f"{s} {pii} " for s, (pii, _) in parts) + tail
    expected = "".join(f"{s} {ph} " for s, (_, ph) in parts) + tail
    r = Redactor()
    assert r.text(text) == expected
    assert sum(r.counts.values()) == len(parts)
    assert r.text(expected) == expected


@settings(max_examples=200, deadline=None)
@given(
    doc=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=20) | PII.map(lambda p: p[0]),
        lambda kids: (
            st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4)
        ),
        max_leaves=12,
    )
)
def test_property_json_stays_valid(doc: object) -> None:
    text = json.dumps(doc, ensure_ascii=False)
    r = Redactor()
    out = r.json_text(text)
    assert out is not None
    # Still JSON, and no built-in PII left anywhere in it.
    json.loads(out)
    assert Redactor().text(out) == out


def test_json_numbers_become_quoted_placeholders() -> None:
    r = Redactor()
    doc = '{"phone": 13812345678, "ids": [4111111111111111, 7], "seed": 42, "t": 0.5}'
    out = r.json_text(doc)
    assert json.loads(out or "") == {"phone": "<PHONE>", "ids": ["<CARD>", 7], "seed": 42, "t": 0.5}
    assert r.json_text("13812345678") == '"<PHONE>"'


def test_json_escapes_and_broken_json() -> None:
    r = Redactor()
    # A string with escaped quotes around the number: still one string token.
    doc = json.dumps({"content": 'he said "call 13812345678" \\ ok'})
    out = r.json_text(doc) or ""
    assert json.loads(out) == {"content": 'he said "call <PHONE>" \\ ok'}
    # Cut-off JSON (a truncated body): the unterminated string is redacted as text.
    cut = '{"messages":[{"content":"mail me: a@b.cn or 13812345678'
    assert r.json_text(cut) == '{"messages":[{"content":"mail me: <EMAIL> or <PHONE>'


def test_email_local_part_limits() -> None:
    r = Redactor()
    assert r.text("x" * 65 + "@example.com") == "x" * 65 + "@example.com"
    assert r.text("y" * 64 + "@example.com") == "<EMAIL>"
    assert r.text("a@b.cn,c@d.cn") == "<EMAIL>,<EMAIL>"
    assert r.text("@example.com") == "@example.com"


# ------------------------------------------- logprobs: strings only, never numbers

#: "-0.4111111111111111": the digits after the point are a Luhn-valid card
#: number (4111 1111 1111 1111); the token id and byte values are numbers too.
LOGPROBS = json.dumps(
    {
        "content": [
            {
                "token": " card 4111111111111111",
                "id": 4111111111111111,
                "logprob": -0.4111111111111111,
                "bytes": [52, 49, 49, 49],
                "top_logprobs": [{"token": "x", "logprob": -13.812345678}],
            }
        ]
    },
    separators=(",", ":"),
)


def test_logprobs_numbers_are_never_redacted() -> None:
    """Regression: card-number redaction rewrote digits inside log-probabilities
    (and token ids), so the stored logprobs no longer parsed as numbers and
    diff's cause classes fell to "unknown"."""
    r = Redactor()
    out = r.tokens_json(LOGPROBS)
    assert out is not None
    parsed = json.loads(out)
    entry = parsed["content"][0]
    assert entry["token"] == " card <CARD>"  # the text-bearing string is redacted
    assert entry["id"] == 4111111111111111
    assert entry["logprob"] == -0.4111111111111111
    assert entry["bytes"] == [52, 49, 49, 49]
    assert entry["top_logprobs"][0]["logprob"] == -13.812345678
    assert r.counts == {"CARD": 1}
    # other JSON fields keep the documented number redaction
    assert Redactor().json_text('{"tel":13812345678}') == '{"tel":"<PHONE>"}'


def test_chunk_logprobs_keep_their_numbers_in_both_redaction_steps() -> None:
    from sniffer.record.redact import StreamRedactor

    lp = json.dumps(
        {"content": [{"token": "a", "logprob": -0.4111111111111111, "bytes": [97]}]},
        separators=(",", ":"),
    )
    ev = ChunkEvent(1, T0, 0, 0, 1, "content", "a", logprobs=lp)
    out = Redactor().event(ev)
    assert isinstance(out, ChunkEvent) and out.logprobs == lp
    red = StreamRedactor(Redactor())
    stored = [*red.events([ev]), *red.flush()]
    (chunk,) = [e for e in stored if isinstance(e, ChunkEvent)]
    assert chunk.logprobs == lp


def test_user_patterns_in_logprobs_touch_strings_only() -> None:
    r = Redactor([(r"[0-9]{4}", "NUM")])
    out = r.tokens_json('{"content":[{"token":"pin 1234","logprob":-0.1234567,"bytes":[1234]}]}')
    assert out == '{"content":[{"token":"pin <NUM>","logprob":-0.1234567,"bytes":[1234]}]}'


# ------------------------------------------------- look-behind over chunks


_PIECES = ["138 1234 5678", "a@b.co", "sk-abcdefghijklmnopqrstu", "10.0.0.1", "word", " ", "9", "@"]
_PIECES += ["plain words, no digits ", "x"]


@pytest.mark.parametrize("seed", range(4))
def test_text_window_rescans_only_new_text(seed: int) -> None:
    """TextWindow skips the scan of text an earlier scan found nothing in:
    the same decisions, spans and counts as a window that scans everything
    (a user pattern that never matches makes every scan run), whatever the
    chunk sizes, look-behind and held-chunk bound (forced decisions leave a
    few clean characters, then the next scan must still see the new ones)."""
    rnd = random.Random(seed)
    for _ in range(1000):
        text = "".join(rnd.choice(_PIECES) for _ in range(rnd.randint(0, 40)))
        pieces, pos = [], 0
        while pos < len(text):
            n = rnd.randint(0, 30)
            pieces.append(text[pos : pos + n])
            pos += n
        lookbehind, max_held = rnd.randint(0, 40), rnd.randint(1, 6)
        results = []
        for red in (Redactor(), Redactor([("(?!)", "NEVER")])):
            w = TextWindow(red, lookbehind=lookbehind, max_held=max_held)
            for p in pieces:
                w.push(p)
                w.advance()
            w.advance(final=True)
            results.append((w.decided, w.touched, w.spans, dict(red.counts)))
        assert results[0] == results[1], (pieces, lookbehind, max_held)


_SECRET_PREFIXES = (
    r"sk-|[Bb][Ee][Aa][Rr][Ee][Rr]|A[GIKNRS][A-Z]A|gh[pousr]_|github_pat_|AIza|xox|eyJ"
)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="skKAaBbEeRrGIzNShpousr_tiy-xJ@7 .", max_size=16))
def test_pre_checks_find_what_the_plain_alternation_finds(text: str) -> None:
    """The pre-checks start with one character class (a fast scan); they must
    find something exactly when the plain prefix list (or a digit or "@") does."""
    from sniffer.record.redact import _EDIT_PRE, _SECRET_PRE

    secret = re.search(_SECRET_PREFIXES, text) is not None
    assert (_SECRET_PRE.search(text) is not None) == secret
    assert (_EDIT_PRE.search(text) is not None) == (secret or re.search("[0-9@]", text) is not None)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="skKAaBbEeRrGIzNShpousr_tiy-xJ@7 .\u212a\u0130", max_size=16))
def test_secret_substring_tests_find_every_prefix(text: str) -> None:
    """``_maybe_secret`` (substring tests) is False only where the prefix
    search finds nothing (KELVIN SIGN and dotted I lower to ASCII: only more finds)."""
    from sniffer.record.redact import _SECRET_PRE, _maybe_secret

    if _SECRET_PRE.search(text) is not None:
        assert _maybe_secret(text)
    for prefix in ("sk-", "Bearer", "bEaReR", "AKIA", "ASIA", "AIza", "ghp_", "ghr_",
                   "github_pat_", "xox", "eyJ"):  # fmt: skip
        assert _maybe_secret(text + prefix)
        assert _maybe_secret(prefix + text)


@settings(max_examples=800, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(alphabet="0123456789 .-+()Xxa@:\u0663\u00e9", max_size=12),
            st.sampled_from(
                [
                    "w12.34 ",
                    "1.2.3.4",
                    "1.22.333.4",
                    "9.999.9.9",
                    "12.3456.7.8",
                    "123-456",
                    "123 456",
                    "123  456",
                    "+1",
                    "+ 1",
                    "１２３４５６",
                ]
            ),
        ),
        max_size=8,
    )
)
def test_digit_run_translated_is_the_three_searches(parts: list[str]) -> None:
    """``_digit_run`` on ASCII text (translated bytes, substring tests) says
    what its three searches say, on any text."""
    from sniffer.record.redact import _digit_run, _digit_run_searches

    text = "".join(parts)
    assert _digit_run(text) == _digit_run_searches(text)
    assert _digit_run(text + "é") == _digit_run_searches(text)  # the non-ASCII path


def _old_builtins_may_edit(r: Redactor, s: str) -> bool:
    """``Redactor._builtins_may_edit`` as one search with ``_EDIT_PRE`` (the
    reference the substring tests are held to)."""
    from sniffer.record.redact import _EDIT_PRE, _SECRET_PRE, _digit_run_searches

    if (_EDIT_PRE if r.enabled else _SECRET_PRE).search(s) is None:
        return False
    return not r.enabled or "@" in s or _digit_run_searches(s) or _SECRET_PRE.search(s) is not None


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="skKAaBbEeRrGIzNShpousr_tiy-xJ@7 .0+\u212a", max_size=24))
def test_builtins_may_edit_is_the_one_search(text: str) -> None:
    for r in (Redactor(), Redactor(enabled=False)):
        assert r._builtins_may_edit(text) == _old_builtins_may_edit(r, text)


@settings(max_examples=300, deadline=None)
@given(
    doc=st.recursive(
        st.none()
        | st.booleans()
        | st.integers()
        | st.text(max_size=20)
        | PII.map(lambda p: p[0])
        | st.sampled_from(["prompt 21", "w12.34", "sk-", "a@", "@b.co"]),
        lambda kids: (
            st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4)
        ),
        max_leaves=12,
    ),
    numbers=st.booleans(),
    enabled=st.booleans(),
)
def test_json_text_whole_text_pre_check_changes_nothing(
    doc: object, numbers: bool, enabled: bool
) -> None:
    """json_text skips its per-piece pass when the whole text holds nothing a
    built-in pattern needs: the same text and counts as the pass over every
    piece (the pre-check made always true)."""
    from unittest import mock

    text = json.dumps(doc, ensure_ascii=False)
    fast = Redactor(enabled=enabled)
    got = fast.json_text(text, numbers)
    slow = Redactor(enabled=enabled)
    with mock.patch.object(Redactor, "_builtins_may_edit", lambda self, s: True):
        want = slow.json_text(text, numbers)
    assert got == want
    assert fast.counts == slow.counts
    if got == text:
        assert got is text  # unchanged: the same object


def test_json_text_skips_plain_pieces_but_not_user_patterns_in_tokens() -> None:
    r = Redactor([("oo", "OO")])
    doc = '{"model":"foo","messages":[{"content":"call 138 1234 5678"}],"max_tokens":60}'
    assert r.json_text(doc) == (
        '{"model":"f<OO>","messages":[{"content":"call <PHONE>"}],"max_tokens":60}'
    )
    assert r.tokens_json('[{"token":"foo 13812345678","logprob":-0.5}]') == (
        '[{"token":"f<OO> <PHONE>","logprob":-0.5}]'
    )
    assert Redactor(enabled=False).json_text(
        '{"a":"sk-abcdefghijklmnopqrstuvwx 138 1234 5678"}'
    ) == ('{"a":"<SECRET> 138 1234 5678"}')


def _closed(stream: int, text_len: int) -> StreamClosed:
    return StreamClosed(
        stream, 1.0, StreamState("complete"), "complete", True, False, 0.0, 1.0, 1, 1,
        text_len, ((0, "stop"),), None, None,
    )  # fmt: skip


def _cut(rnd: random.Random, words: list[str]) -> str:
    return "".join(rnd.choice(words) for _ in range(rnd.randint(0, 3)))[: rnd.randint(0, 12)]


@pytest.mark.parametrize("seed", range(6))
def test_stream_redactor_keeps_each_stream_in_order_whatever_the_interleaving(seed: int) -> None:
    """Several choices per stream, stream-level chunks, reasoning that starts
    mid-choice, values split over chunks, streams interleaved, batches of any
    size, some streams never closed (flush): each stream's chunks come out once,
    in the order they came, each choice's stored text and reasoning are what
    redact_choice_texts gives for it, and nothing stays held."""
    rnd = random.Random(seed)
    words = ["138 1234 5678", "a@b.co", "sk-abcdefghijklmnopqrstuvwx", "word ", "", " ", "日本"]
    red = StreamRedactor(Redactor())
    red.track_redactions = True
    events: list[StoreEvent] = []
    pieces: dict[tuple[int, int, str], list[str]] = {}
    streams = {s: 0 for s in range(1, 6)}
    while streams:
        s = rnd.choice(list(streams))
        seq = streams[s]
        if seq >= 40 or rnd.random() < 0.02:
            del streams[s]
            if s != 5:  # stream 5 is never closed: flush gives it out
                events.append(_closed(s, 0))
            continue
        streams[s] = seq + 1
        choice = rnd.choice([0, 0, 1, 2, -1])
        text = _cut(rnd, words)
        reasoning = _cut(rnd, words) if choice >= 0 and seq > 10 and s % 2 else ""
        events.append(ChunkEvent(s, 0.0, seq, choice, seq + 1, "content", text, reasoning))
        if choice >= 0:
            pieces.setdefault((s, choice, "text"), []).append(text)
            pieces.setdefault((s, choice, "reasoning"), []).append(reasoning)
    out: list[StoreEvent] = []
    i = 0
    clean: list[int] = []
    handed: dict[int, dict[int, tuple[list[tuple[int, int]], list[str]]]] = {}
    while i < len(events):
        n = rnd.choice([1, 1, 3, 20])
        out += red.events(events[i : i + n])
        i += n
        some_clean, some_redacted = red.take_redactions()
        clean += some_clean
        handed.update(some_redacted)
    out += red.flush()
    assert red.held == 0
    chunks = [e for e in out if isinstance(e, ChunkEvent)]
    sent = [e for e in events if isinstance(e, ChunkEvent)]
    assert sorted((c.stream, c.seq) for c in chunks) == sorted((c.stream, c.seq) for c in sent)
    for s in range(1, 6):
        assert [c.seq for c in chunks if c.stream == s] == [c.seq for c in sent if c.stream == s]
    for (s, choice, channel), texts in pieces.items():
        stored, spans = redact_choice_texts(Redactor(), texts)
        got = [getattr(c, channel) for c in chunks if c.stream == s and c.choice == choice]
        assert got == stored
        if channel == "text" and s != 5:
            # what the redactor handed over at the close is what the replay finds
            if s in clean:
                assert not spans
            else:
                h_spans, h_repls = handed[s].get(choice, ([], []))
                assert h_spans == spans
                assert apply_spans("".join(texts), h_spans, h_repls) == "".join(stored)
    closed = {e.stream for e in events if isinstance(e, StreamClosed)}
    assert sorted(clean + list(handed)) == sorted(closed) and not set(clean) & set(handed)
    assert handed


#: How a StreamRedactor's chunk loop runs: the native core's pass over a
#: batch (``RedactChunks``, its usual scan included), the Python loop with the
#: native ``redact_clean_cut``, or the Python loop with the reference cut.
MODES = ["native-batch", "native-cut", "reference"]


def _native_core_runs() -> bool:
    from sniffer.record.redact import _native_events

    return _native_events() is not None


def _stream_redactor(mode: str, red: Redactor | None = None) -> StreamRedactor:
    """A StreamRedactor whose chunk loop runs as ``mode`` says (skipped when
    the native core does not run and the mode needs it)."""
    out = StreamRedactor(red if red is not None else Redactor())
    if mode != "reference" and not _native_core_runs():
        pytest.skip("the native core does not run (SPARSEETY_PURE, or not built)")
    if mode != "native-batch":
        out._native_events = None
    else:
        assert out._native_events is not None
    if mode == "reference":
        out._native_cut = None
    return out


def _general_path() -> AbstractContextManager[object]:
    """Every chunk through ``_chunk`` and every release through the general
    steps (no hot choice, so no hot path nor ``_scan``, native or not; no
    ``_final_clean``): the reference the fast paths are compared with."""
    from contextlib import ExitStack
    from unittest import mock

    from sniffer.record import redact

    original_hold = redact._Stream.hold

    def never_hot(self: redact._Stream, c: redact._Choice) -> None:
        original_hold(self, c)
        self.hot = redact._COLD

    stack = ExitStack()
    stack.enter_context(mock.patch.object(redact._Stream, "hold", never_hot))
    stack.enter_context(
        mock.patch.object(redact.StreamRedactor, "_final_clean", lambda self, c: False)
    )
    return stack


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(8))
def test_stream_redactor_hot_path_gives_what_the_general_path_gives(seed: int, mode: str) -> None:
    """The chunk loop's hot path (a stream's hot choice, its limit) gives out
    exactly what the general path (``_chunk`` for every chunk) gives: the
    same events, rewritten the same, in the same order across streams (the
    order is the stored chunk rows' ids), batch by batch; the same counts and
    handed-over redactions. Texts that hit the window's every rule: words,
    values cut over chunks, digit-heavy filler, runs of empty texts longer
    than ``MAX_HELD``, reasoning starting mid-choice, several choices,
    stream-level chunks, JSON fields, closes and streams never closed. In
    each mode: the native pass over a batch, the Python loop with the
    native cut, the Python loop alone (the general path: the Python steps
    alone)."""
    from unittest import mock

    from sniffer.record import redact

    rnd = random.Random(seed)
    words = ["138 1234 5678", "a@b.co", "sk-abcdefghijklmnopqrstuvwx", " word", "", " forest",
             "w12.34 ", "192.168.", "1.10 ", " Apple", "日本", "x" * 70]  # fmt: skip
    # streams 9 and 10: plain ASCII text (the native pass's own scans), a
    # value only in JSON fields
    plain = [" word", "", " forest", "w12.34 ", " Apple", "x" * 70]
    events: list[StoreEvent] = []
    streams = {s: 0 for s in range(1, 11)}
    while streams:
        s = rnd.choice(list(streams))
        seq = streams[s]
        if seq >= 400 or (s < 9 and rnd.random() < 0.004):
            del streams[s]
            if s != 8:  # stream 8 is never closed: flush gives it out
                events.append(_closed(s, 0))
            continue
        streams[s] = seq + 1
        choice = rnd.choice([0] * 12 + [1, -1]) if s % 3 else 0
        text = "" if s == 4 and seq < 300 and seq % 50 else _cut(rnd, plain if s > 8 else words)
        reasoning = _cut(rnd, words) if s == 5 and seq > 30 and rnd.random() < 0.5 else ""
        logprobs = '[{"token":"a 138 1234 5678"}]' if rnd.random() < 0.02 else None
        tool_calls = '[{"a":"tel 138 1234 5678"}]' if rnd.random() < 0.01 else None
        events.append(
            ChunkEvent(s, 0.0, seq, choice, seq + 1, "content", text, reasoning,
                       tool_calls=tool_calls, logprobs=logprobs)
        )  # fmt: skip
    sizes = [rnd.choice([1, 3, 64, 512]) for _ in range(len(events))]

    general_path = redact.StreamRedactor._chunk
    taken: list[int] = []

    def counted(self: StreamRedactor, ev: ChunkEvent, *rest: object) -> None:
        taken.append(1)
        general_path(self, ev, *rest)  # type: ignore[arg-type]

    scan = redact.StreamRedactor._scan
    scans: list[int] = []

    def scan_counted(self: StreamRedactor, *args: object) -> None:
        scans.append(1)
        scan(self, *args)  # type: ignore[arg-type]

    def run(mode: str) -> tuple[tuple[list[list[StoreEvent]], object, object], int, int]:
        taken.clear()
        scans.clear()
        red = _stream_redactor(mode)
        red.track_redactions = True
        outs = []
        i = 0
        with (
            mock.patch.object(redact.StreamRedactor, "_chunk", counted),
            mock.patch.object(redact.StreamRedactor, "_scan", scan_counted),
        ):
            for n in sizes:
                if i >= len(events):
                    break
                outs.append(red.events(events[i : i + n]))
                i += n
        outs.append(red.flush())
        return (outs, dict(red.counts), red.take_redactions()), len(taken), len(scans)

    hot, hot_general, hot_scans = run(mode)
    with _general_path():
        general, all_general, _ = run("reference")
    assert hot == general
    assert sum(len(b) for b in hot[0]) == len(events)
    # the hot path took most chunks (else this compares the general path with itself)
    assert all_general == sum(1 for e in events if isinstance(e, ChunkEvent))
    assert hot_general < all_general * 0.8
    if mode == "native-batch":
        # the native pass scanned windows itself (fewer went to _scan)
        assert hot_scans < run("native-cut")[2]


# ------------------------------------------- digit-heavy text over chunks

#: Values the digit patterns find, near misses, and digit-heavy filler
_DIGIT_VALUES = [
    "13812345678", "138 1234 5678", "138-1234-5678", "+86 13812345678", "0086 138 1234 5678",
    "8613812345678", "+1 (415) 555-2671", "+33.1.23.45.67.89", "+44 20 7946 0958",
    VALID_ID, f"{VALID_ID[:6]} {VALID_ID[6:14]} {VALID_ID[14:]}", wrong_id("11010519491231002"),
    *VALID_CARDS, "4111 1111 1111 1111 123", "4111111111111112", "4123 456 789 011",
    "192.168.1.10", "10.0.0.1", "1.2.3.4.5", "v1.2.3.4", "256.1.1.1", "3.14159265358979",
    "2024-01-15", "12:30", "1,234,567", "123456", "+1234",
]  # fmt: skip
_DIGIT_FILLER = ["w12.34 ", "w517.42 ", " 2023", " 3.14", "-", ".", " ", "+", "9", "12", "x"]


def _full_scan_reference() -> AbstractContextManager[object]:
    """``_digit_run`` made always true: every scan runs the digit patterns
    over the whole text, as before the pre-check existed."""
    from unittest import mock

    return mock.patch("sniffer.record.redact._digit_run", lambda s: True)


def _window(red: Redactor, pieces: list[str], lookbehind: int, max_held: int) -> tuple:
    w = TextWindow(red, lookbehind=lookbehind, max_held=max_held)
    steps = []
    for p in pieces:
        w.push(p)
        w.advance()
        steps.append(len(w.decided))  # when each chunk is decided
    w.advance(final=True)
    return w.decided, w.touched, w.spans, w.replacements, steps, dict(red.counts)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from(_DIGIT_VALUES),
            st.sampled_from(_DIGIT_FILLER),
            st.text(alphabet="0123456789 .-+()Xxa@:", max_size=24),
        ),
        max_size=12,
    )
)
def test_digit_pre_check_finds_every_digit_match(parts: list[str]) -> None:
    """The digit patterns match nothing where ``_digit_run`` finds nothing."""
    from sniffer.record.redact import _DIGITS_RE, _digit_run

    text = "".join(parts)
    if _DIGITS_RE.search(text) is not None:
        assert _digit_run(text)


@pytest.mark.parametrize("value", _DIGIT_VALUES)
def test_digit_values_cut_at_every_offset(value: str) -> None:
    """A digit-heavy value cut into two or three chunks at every offset, after
    and before digit-heavy filler: the same stored texts, decisions (when each
    chunk is decided), spans and counts as a window whose every scan runs the
    digit patterns over all of it; with the value whole in the window, the
    stored text is the redaction of the whole text."""
    before = ["w12.34 ", "w517.42 "] * 3 + ["tel "]
    after = [" ok", " w12.34"] + [" w517.42"] * 10
    n = len(value)
    cuts = [(i,) for i in range(n + 1)] + [(i, j) for i in range(0, n + 1, 3) for j in (i + 1, n)]
    for cut in cuts:
        bounds = [0, *cut, n]
        mid = [value[a:b] for a, b in pairwise(bounds)]
        pieces = before + mid + after
        for lookbehind, max_held in ((128, 256), (30, 256), (20, 4)):
            got = _window(Redactor(), pieces, lookbehind, max_held)
            with _full_scan_reference():
                ref = _window(Redactor(), pieces, lookbehind, max_held)
            assert got == ref, (cut, lookbehind, max_held)
            if lookbehind == 128:
                assert "".join(got[0]) == Redactor().text("".join(pieces))


@pytest.mark.parametrize("seed", range(3))
def test_text_window_on_digit_heavy_text_matches_full_scans(seed: int) -> None:
    """Random digit-heavy chunks (values, filler, cut anywhere): the window
    that skips text its pre-check clears decides what full scans decide,
    chunk by chunk, and redact_choice_texts gives the same."""
    rnd = random.Random(seed)
    words = _DIGIT_VALUES + _DIGIT_FILLER * 3
    for _ in range(300):
        text = "".join(rnd.choice(words) for _ in range(rnd.randint(0, 60)))
        pieces, pos = [], 0
        while pos < len(text):
            k = rnd.randint(0, 12)
            pieces.append(text[pos : pos + k])
            pos += k
        lookbehind, max_held = rnd.choice([(128, 256), (rnd.randint(0, 40), rnd.randint(1, 8))])
        got = _window(Redactor(), pieces, lookbehind, max_held)
        with _full_scan_reference():
            ref = _window(Redactor(), pieces, lookbehind, max_held)
            ref_texts = redact_choice_texts(Redactor(), pieces)
        assert got == ref, (pieces, lookbehind, max_held)
        assert redact_choice_texts(Redactor(), pieces) == ref_texts


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(st.tuples(SAFE, PII), max_size=6),
    tail=SAFE,
    sizes=st.lists(st.integers(0, 200), min_size=1, max_size=40),
)
def test_property_values_split_anywhere_are_stored_redacted(
    parts: list[tuple[str, tuple[str, str]]], tail: str, sizes: list[int]
) -> None:
    """Values between plain text, the text cut into chunks of any size (a
    value's end in a short chunk, its rest in a long one): the stored text is
    the redaction of the whole text, and the spans give it."""
    text = "".join(f"{s} {pii} " for s, (pii, _) in parts) + "filler " * 30 + tail
    expected = "".join(f"{s} {ph} " for s, (_, ph) in parts) + "filler " * 30 + tail
    pieces, pos, i = [], 0, 0
    while pos < len(text):
        k = sizes[i % len(sizes)] or (i % 3)  # some empty chunks, never only those
        pieces.append(text[pos : pos + k])
        pos += k
        i += 1
    w = TextWindow(Redactor())
    for p in pieces:
        w.push(p)
        w.advance()
    w.advance(final=True)
    assert "".join(w.decided) == expected
    assert apply_spans(text, w.spans, w.replacements) == expected
    for stored, piece, touched in zip(w.decided, pieces, w.touched, strict=True):
        assert touched or stored is piece


# ------------------------------------------- the hot choice's usual window


def _native_cut() -> object:
    from sniffer.record.redact import _native_clean_cut

    cut = _native_clean_cut()
    if cut is None:
        pytest.skip("the native core does not run (SPARSEETY_PURE, or not built)")
    return cut


_CUT_WORDS = [
    "w12.34 ", " the", "ask", "s", "k-", "x", "o", "eyJ", "A", "KIA", "gh", "p_", "github_",
    "pat_", "Bea", "rer", "12", "345", "6", " ", "-", "+", "1.", "22.", ".3", "@", "mail",
    "日本", "\ud800", "é", "",
]  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(
    pending=st.lists(
        st.one_of(st.sampled_from(_CUT_WORDS), st.text(max_size=6)), min_size=1, max_size=30
    ),
    start=st.integers(-12, 80),
    cut=st.integers(-40, 200),
    max_held=st.integers(1, 40),
    enabled=st.booleans(),
)
def test_native_clean_cut_is_the_reference_where_it_answers(
    pending: list[str], start: int, cut: int, max_held: int, enabled: bool
) -> None:
    """The native core's ``redact_clean_cut`` gives what ``_clean_cut`` (the
    reference) gives whenever it answers; it answers None only where the
    reference does, or for text that is not ASCII (secret prefixes, digit
    runs, "@" and dotted groups cut over the chunks; lone surrogates). And
    the reference's answer holds: with the window's whole text looked at, an
    answer means the redactor edits nothing in it."""
    from sniffer.record.redact import _clean_cut

    native = _native_cut()
    red = Redactor(enabled=enabled)
    want = _clean_cut(pending, start, cut, max_held, red)
    got = native(pending, start, cut, max_held, enabled)  # type: ignore[operator]
    if got is not None:
        assert got == want
    elif all(t.isascii() for t in pending):
        window = "".join(pending)
        # None for ASCII text: only where a pre-check of the reference's
        # finds something (the dotted group's regex aside)
        assert want is None or re.search(r"\.[0-9]{1,3}\.", window[max(start, 0) :]), (
            pending,
            start,
        )
    whole = _clean_cut(pending, -1, cut, max_held, red)
    if whole is not None:
        assert red.edits("".join(pending))[1] == []


def test_native_clean_cut_answers_plain_text() -> None:
    """The usual window (short words with digits, no run of them) is
    answered natively: the decided chunks and where they end."""
    native = _native_cut()
    pending = ["w12.34 "] * 30  # 210 characters
    assert native(pending, 40, 210 - 128, 256, True) == (11, 77)  # type: ignore[operator]
    assert native(pending, 40, 210 - 128, 20, True) == (11, 77)  # type: ignore[operator]
    assert native(pending, 40, 210 - 128, 10, True) == (20, 140)  # type: ignore[operator]
    assert native(pending, 40, -3, 256, True) == (0, 0)  # type: ignore[operator]
    phone = [*pending, "tel 138 1234 5678"]
    assert native(phone, 40, 82, 256, True) is None  # type: ignore[operator]


_FILLER = "w12.34 "


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "value",
    ["13812345678", "138 1234 5678", "a.b@example.com", "sk-abcdefghijklmnopqrstuvwx",
     "192.168.1.10", VALID_ID, "4111 1111 1111 1111", "Bearer abcdefghijklmnop1234"],
)  # fmt: skip
def test_hot_choice_values_split_over_chunks_at_every_offset_are_redacted(
    value: str, mode: str
) -> None:
    """A value cut in two chunks (at every offset near its start), placed at
    every offset of the hot choice's filler (so that it falls before, on and
    after each scan's boundaries): the stored text is the redaction of the
    whole text; and, the chunks in one batch or one chunk per batch, the
    events come out batch by batch exactly as the general path (``_chunk``
    for every chunk, the Python steps alone) gives them. In each mode (the
    native pass over a batch takes the windows clean of the value, and hands
    the others to ``_scan``)."""
    from unittest import mock

    from sniffer.record import redact

    def run(events: list[StoreEvent], size: int, mode: str | None) -> list[list[StoreEvent]]:
        red = _stream_redactor(mode or "reference")
        red.track_redactions = True
        outs = []
        with nullcontext() if mode else _general_path():
            for i in range(0, len(events), size):
                outs.append(red.events(events[i : i + size]))
        outs.append(red.events([_closed(1, 0)]))
        assert red.held == 0
        return outs

    scans = 0
    original_scan = redact.StreamRedactor._scan

    def counted(self: StreamRedactor, *args: object) -> None:
        nonlocal scans
        scans += 1
        original_scan(self, *args)  # type: ignore[arg-type]

    python_scans = 0  # with the native pass: the scans it handed to _scan

    value = f" {value} "
    # (every cut in a secret prefix's reach, then two more)
    splits = sorted({*range(1, 8), len(value) // 2, len(value) - 1})
    for split in splits:
        # every place in a scan's period (STEP characters, less a chunk): each
        # scan's boundary falls before, inside and after the value's pieces
        for shift in range(64):
            texts = [_FILLER] * 30 + ["x" * shift, value[:split], value[split:]] + [_FILLER] * 40
            texts = [t for t in texts if t]
            events: list[StoreEvent] = [
                ChunkEvent(1, 0.0, i, 0, i + 1, "content", t) for i, t in enumerate(texts)
            ]
            want_text = Redactor().text("".join(texts))
            assert want_text != "".join(texts)
            for size in (len(events), 1) if shift % 7 == 0 else (len(events),):
                with mock.patch.object(redact.StreamRedactor, "_scan", counted):
                    hot = run(events, size, mode)
                    if mode == "native-batch":
                        before = scans
                        run(events, size, "native-cut")
                        python_scans += scans - before
                stored = [e.text for b in hot for e in b if isinstance(e, ChunkEvent)]
                assert "".join(stored) == want_text, (split, shift, size)
                if shift % 7 == 0:
                    assert hot == run(events, size, None), (split, shift, size)
    assert scans  # the hot path's scan ran
    if mode == "native-batch":
        # the native pass scanned the windows clean of the value itself (the
        # others, while the value is in the look-behind, went to _scan) ...
        assert scans - python_scans < python_scans
        # ... and every window of the filler alone
        before = scans
        with mock.patch.object(redact.StreamRedactor, "_scan", counted):
            filler = [ChunkEvent(1, 0.0, i, 0, i + 1, "content", _FILLER) for i in range(100)]
            plain = run(filler, 64, mode)
        assert scans == before
        assert [e for b in plain for e in b if isinstance(e, ChunkEvent)] == filler
