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


def test_model_name_only_in_the_key_when_asked() -> None:
    dense = row(dict(CHAT, model="llama-70b"))
    sparse = row(dict(CHAT, model="llama-70b-sparse"), label="sparse")
    a, b = fingerprint(dense, with_label=False), fingerprint(sparse, with_label=False)
    assert a.key != b.key  # with the model (stats, --match-model)
    a = fingerprint(dense, with_label=False, with_model=False)
    b = fingerprint(sparse, with_label=False, with_model=False)
    assert a.key == b.key and (a.model, b.model) == ("llama-70b", "llama-70b-sparse")
    # everything else that changes the answer still separates requests
    for change in ({"temperature": 0.5}, {"seed": 7}, {"n": 2}, {"max_tokens": 5}):
        c = fingerprint(row(dict(CHAT, model="x", **change)), with_label=False, with_model=False)
        assert c.key != a.key, change


def _key(body: dict[str, Any]) -> str:
    return fingerprint(row(body), with_label=False, with_model=False).key


def test_tgi_inputs_and_parameters() -> None:
    a = {"inputs": "What is Deep Learning?", "parameters": {"max_new_tokens": 20}}
    b = {"inputs": "What is Machine Learning?", "parameters": {"max_new_tokens": 20}}
    assert _key(a) != _key(b)  # two different TGI prompts never share a fingerprint
    assert _key(a) != _key({**a, "parameters": {"max_new_tokens": 21}})
    assert _key(a) != _key({**a, "parameters": {"max_new_tokens": 20, "seed": 3}})
    assert _key(a) != _key({**a, "parameters": {"max_new_tokens": 20, "do_sample": True}})
    # asking for details does not change the text
    assert _key(a) == _key({**a, "parameters": {"max_new_tokens": 20, "details": True}})
    assert _key(a) == _key({**a, "stream": True})
    fp = fingerprint(row(a))
    assert fp.prompt == "What is Deep Learning?" and dict(fp.params) == {"max_tokens": 20}
    # max_new_tokens and max_tokens are one parameter
    assert _key({"prompt": "x", "max_tokens": 20}) == _key(
        {"prompt": "x", "parameters": {"max_new_tokens": 20}}
    )


def test_ollama_prompt_messages_options_and_system() -> None:
    gen = {"model": "llama3.2", "prompt": "Why is the sky blue?", "options": {"num_predict": 8}}
    assert _key(gen) != _key({**gen, "prompt": "Why is grass green?"})
    assert _key(gen) != _key({**gen, "options": {"num_predict": 8, "temperature": 0.1}})
    assert _key(gen) != _key({**gen, "options": {"num_predict": 9}})
    assert _key(gen) != _key({**gen, "system": "Answer in French."})
    assert _key(gen) != _key({**gen, "format": "json"})
    assert fingerprint(row({**gen, "system": "Be brief."})).prompt.startswith("system: Be brief.")
    chat = {"model": "qwen3", "messages": [{"role": "user", "content": "hi"}]}
    assert _key(chat) != _key({**chat, "options": {"seed": 1}})
    assert _key(chat) != _key({**chat, "messages": [{"role": "user", "content": "hello"}]})


def test_responses_and_anthropic_prompts() -> None:
    resp = {"model": "gpt-4.1-mini", "input": "Say hello", "max_output_tokens": 30}
    assert _key(resp) != _key({**resp, "input": "Say goodbye"})
    assert _key(resp) != _key({**resp, "instructions": "Be terse."})
    assert _key(resp) != _key({**resp, "text": {"format": {"type": "json_object"}}})
    assert _key(resp) == _key({"model": "m", "prompt": "Say hello", "max_tokens": 30})
    items = {**resp, "input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}]}]}
    assert _key(items) != _key({**items, "instructions": "Be terse."})
    claude = {
        "model": "claude-sonnet-4-5",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Write a haiku about rain."}],
        "max_tokens": 64,
    }
    assert _key(claude) != _key({**claude, "system": "Be long."})
    assert _key(claude) != _key({**claude, "stop_sequences": ["\n"]})
    assert _key(claude) != _key({**claude, "thinking": {"type": "enabled", "budget_tokens": 9}})
    assert _key({**claude, "stop_sequences": ["x"]}) == _key({**claude, "stop": ["x"]})
    completion = {"model": "m", "prompt": "Once upon", "max_tokens": 8}
    assert _key(completion) != _key({**completion, "prompt": "Once upon a"})
    assert _key(completion) != _key({**completion, "suffix": "end"})
