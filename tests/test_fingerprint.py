"""Request fingerprints (sniffer.llm.fingerprint)."""

from __future__ import annotations

import json
from typing import Any

from sniffer.llm.fingerprint import fingerprint, normalise_request


def row(body: Any, label: str | None = "baseline", **cols: Any) -> dict[str, Any]:
    raw = body if isinstance(body, str) or body is None else json.dumps(body)
    return {"request_json": raw, "label": label, **cols}


CHAT = {
    "model": "fake",
    "messages": [{"role": "user", "content": "Hello there"}],
    "temperature": 0,
    "max_tokens": 32,
    "stream": True,
}


def test_same_request_same_key_and_transport_fields_ignored() -> None:
    other = dict(CHAT, stream=False, stream_options={"include_usage": True}, user="u1")
    other["temperature"] = 0.0
    assert fingerprint(row(CHAT)).key == fingerprint(row(other)).key


def test_sampling_parameters_prompt_and_model_matter() -> None:
    base = fingerprint(row(CHAT)).key
    for change in (
        {"temperature": 0.7},
        {"max_tokens": 33},
        {"seed": 1},
        {"top_p": 0.9},
        {"model": "fake-cjk"},
        {"messages": [{"role": "user", "content": "Hello"}]},
        {"messages": [{"role": "system", "content": "Hello there"}]},
    ):
        assert fingerprint(row(dict(CHAT, **change))).key != base, change


def test_label_only_when_asked() -> None:
    a = row(CHAT, label="baseline")
    b = row(CHAT, label="sparse")
    assert fingerprint(a).key != fingerprint(b).key
    assert fingerprint(a, with_label=False).key == fingerprint(b, with_label=False).key
    assert fingerprint(a, with_label=False).label is None
    assert fingerprint(a).label == "baseline"


def test_max_tokens_aliases_and_content_parts() -> None:
    parts = dict(CHAT)
    parts.pop("max_tokens")
    parts["max_completion_tokens"] = 32
    parts["messages"] = [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]
    assert fingerprint(row(parts)).key == fingerprint(row(CHAT)).key
    crlf = dict(CHAT, messages=[{"role": "user", "content": "a\r\nb"}])
    lf = dict(CHAT, messages=[{"role": "user", "content": "a\nb"}])
    assert fingerprint(row(crlf)).key == fingerprint(row(lf)).key


def test_completions_prompt_and_preview() -> None:
    body = {"model": "fake", "prompt": "Once   upon\na time", "max_tokens": 8}
    fp = fingerprint(row(body))
    assert fp.prompt == "Once upon a time"
    assert fp.model == "fake"
    assert dict(fp.params) == {"max_tokens": 8}
    assert normalise_request(body)["prompt"] == "Once   upon\na time"
    chat = fingerprint(row(CHAT))
    assert chat.prompt == "user: Hello there"
    assert dict(chat.params) == {"temperature": 0, "max_tokens": 32}


def test_unparseable_and_missing_bodies_do_not_raise() -> None:
    a = fingerprint(row("{not json", model="m", temperature=0.0))
    b = fingerprint(row("{not json", model="m", temperature=0.0))
    c = fingerprint(row("{other", model="m", temperature=0.0))
    assert a.key == b.key != c.key
    none = fingerprint(row(None, model="m"))
    assert none.model == "m" and none.prompt == ""
    odd = fingerprint(row({"model": 3, "messages": ["x", {"content": None}]}))
    assert odd.model == "3"
    long = fingerprint(row(dict(CHAT, messages=[{"role": "user", "content": "w " * 500}])))
    assert len(long.prompt) <= 120 and long.prompt.endswith("…")
