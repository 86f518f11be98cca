"""The fixture server (over real loopback HTTP) and the consistency of pcaps/."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixture_server import free_port, start_server_process, wait_ready
from tests.fixture_server.app import (
    Options,
    build_events,
    generate_pieces,
    make_plan,
    options_for_model,
    pieces_to_tokens,
    spec_steps,
    step_pauses,
)

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[1]
PCAPS = REPO / "pcaps"
MESSAGES = [{"role": "user", "content": "Say something."}]


def _server(*options: str) -> Iterator[str]:
    port = free_port()
    proc = start_server_process(port, *options)
    try:
        wait_ready(port, 20)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:
            proc.kill()
            proc.wait(5)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    yield from _server()


@pytest.fixture(scope="module")
def perturbed_llamacpp() -> Iterator[str]:
    yield from _server("--style", "llamacpp", "--perturb-after", "7")


def events_of(text: str) -> list[str]:
    """Data of each SSE event; asserts the framing is well-formed."""
    sep = "\r\n" if "\r\n" in text else "\n"
    assert text.endswith(sep + sep), "stream must end with a complete event"
    out = []
    for block in text[: -2 * len(sep)].split(sep + sep):
        lines = block.split(sep)
        data = [ln[len("data: ") :] for ln in lines if ln.startswith("data: ")]
        comments = [ln for ln in lines if ln.startswith(":")]
        assert len(data) + len(comments) == len(lines), f"bad lines in {block!r}"
        if data:
            out.append("\n".join(data))
    return out


def stream(url: str, body: dict[str, Any], path: str = "/v1/chat/completions") -> httpx.Response:
    with httpx.Client(timeout=10) as client:
        resp = client.post(url + path, json=body)
        resp.read()
        return resp


def chat(url: str, model: str = "fake", **extra: Any) -> tuple[httpx.Response, list[Any]]:
    body = {"model": model, "messages": MESSAGES, "stream": True, **extra}
    resp = stream(url, body)
    assert resp.status_code == 200
    return resp, [e if e == "[DONE]" else json.loads(e) for e in events_of(resp.text)]


def contents(events: list[Any], choice: int = 0) -> list[str]:
    out = []
    for e in events:
        if isinstance(e, dict):
            for c in e.get("choices") or []:
                if c["index"] == choice and "content" in c.get("delta", {}):
                    out.append(c["delta"]["content"])
    return out


# ---------------------------------------------------------------------------
# HTTP behaviour
# ---------------------------------------------------------------------------


def test_openai_stream_is_well_formed(base: str) -> None:
    resp, events = chat(base, max_tokens=10)
    assert resp.headers["content-type"].startswith("text/event-stream")
    assert resp.headers["transfer-encoding"] == "chunked"
    assert events[-1] == "[DONE]"
    first = events[0]["choices"][0]
    assert first["delta"] == {"role": "assistant", "content": ""}
    finish = events[-2]["choices"][0]
    assert finish["delta"] == {} and finish["finish_reason"] == "length"
    texts = contents(events)[1:]  # without the role prelude's ""
    assert len(texts) == 10 and all(texts)
    assert all(len(e["choices"]) == 1 for e in events[:-1])


def test_output_is_deterministic_and_max_tokens_truncates(base: str) -> None:
    a = stream(base, {"model": "fake", "messages": MESSAGES, "stream": True, "seed": 3})
    b = stream(base, {"model": "fake", "messages": MESSAGES, "stream": True, "seed": 3})
    assert a.content == b.content
    _, full = chat(base, seed=3)
    _, short = chat(base, seed=3, max_tokens=5)
    full_text, short_text = "".join(contents(full)), "".join(contents(short))
    assert full[-2]["choices"][0]["finish_reason"] == "stop"
    assert full_text.startswith(short_text) and len(short_text) < len(full_text)
    _, other = chat(base, seed=4)
    assert "".join(contents(other)) != full_text


def test_n2_interleaves_one_choice_per_chunk(base: str) -> None:
    _, events = chat(base, n=2, max_tokens=6)
    indices = [e["choices"][0]["index"] for e in events if isinstance(e, dict)]
    assert indices[:4] == [0, 1, 0, 1]
    assert all(len(e["choices"]) == 1 for e in events if isinstance(e, dict))
    t0, t1 = "".join(contents(events, 0)), "".join(contents(events, 1))
    assert t0 and t1 and t0 != t1
    finishes = {e["choices"][0]["index"] for e in events[:-1] if e["choices"][0]["finish_reason"]}
    assert finishes == {0, 1}


def test_include_usage_chunk_has_empty_choices(base: str) -> None:
    _, events = chat(base, max_tokens=8, stream_options={"include_usage": True})
    assert events[-1] == "[DONE]"
    usage = events[-2]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 8
    _, plain = chat(base, max_tokens=8)
    assert all("usage" not in e for e in plain if isinstance(e, dict))


def test_transformers_style_by_model_name(base: str) -> None:
    _, events = chat(base, "fake-transformers", max_tokens=12)
    assert "[DONE]" not in events
    last = events[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 12
    assert all(e["choices"][0]["delta"]["role"] == "assistant" for e in events)
    plan = make_plan(
        {"model": "fake-transformers", "messages": MESSAGES, "max_tokens": 12}, True, Options()
    )
    assert any(len(write) > 1 for write in build_events(plan))


def test_llamacpp_style_and_perturb_from_cli(base: str, perturbed_llamacpp: str) -> None:
    resp, events = chat(perturbed_llamacpp, max_tokens=30)
    assert resp.headers["connection"] == "close"
    assert resp.text.startswith(": ping")
    assert "\r\n\r\n" in resp.text
    assert events[-1] == "[DONE]"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant"}
    pieces = contents(events)
    assert "" in pieces  # llama-cpp-python's held-back deltas
    # same words as the default server until piece 7, then different
    _, ref = chat(base, "fake-llamacpp", max_tokens=30)
    ref_pieces = [p for p in contents(ref) if p]
    got = [p for p in pieces if p]
    assert got[:7] == ref_pieces[:7]
    assert got[7] != ref_pieces[7]


def test_perturb_after_by_model_name(base: str) -> None:
    _, ref = chat(base, max_tokens=20)
    _, pert = chat(base, "fake-perturb4", max_tokens=20)
    a, b = contents(ref)[1:], contents(pert)[1:]
    assert len(a) == len(b) == 20
    assert a[:4] == b[:4] and a[4] != b[4]


def test_tokens_per_chunk(base: str) -> None:
    _, one = chat(base, max_tokens=9)
    _, three = chat(base, "fake-tpc3", max_tokens=9)
    a, b = contents(one)[1:], contents(three)[1:]
    assert len(b) == 3 and "".join(a) == "".join(b)
    assert b[0] == "".join(a[:3])


def test_reasoning_then_content_and_tool_calls(base: str) -> None:
    _, events = chat(base, "fake-reasoning", max_tokens=40)
    kinds = []
    for e in events[1:-2]:
        delta = e["choices"][0]["delta"]
        kinds.append("r" if "reasoning_content" in delta else "c")
    assert kinds[0] == "r" and "c" in kinds
    assert kinds == sorted(kinds, key=lambda k: k == "c")  # all reasoning first
    _, tools = chat(base, "fake-tools")
    calls = [
        tc
        for e in tools
        if isinstance(e, dict) and e["choices"]
        for tc in e["choices"][0]["delta"].get("tool_calls", [])
    ]
    assert calls[0]["function"]["name"] and calls[0]["id"].startswith("call_")
    args = "".join(c["function"]["arguments"] for c in calls)
    assert isinstance(json.loads(args), dict)
    assert tools[-2]["choices"][0]["finish_reason"] == "tool_calls"


def test_fail_after_sends_error_object_then_ends(base: str) -> None:
    _, events = chat(base, "fake-fail3", max_tokens=20)
    assert "error" in events[-1] and events[-1]["error"]["type"] == "server_error"
    assert "[DONE]" not in events
    assert len(contents(events)) == 1 + 3  # prelude + 3 content chunks
    assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])


def test_draft_mode_reports_speculative_decoding_on_the_last_chunk(base: str) -> None:
    """vLLM's ``metrics.speculative_decoding`` on the usage chunk (or the
    finish chunk without include_usage), llama.cpp's ``timings`` on the last
    chunk: consistent with each other and with the tokens streamed."""
    usage = {"stream_options": {"include_usage": True}}
    _, vllm = chat(base, "fake-draft4-accept75", max_tokens=24, **usage)
    assert vllm[-1] == "[DONE]" and vllm[-2]["choices"] == []
    sd = vllm[-2]["metrics"]["speculative_decoding"]
    tokens = vllm[-2]["usage"]["completion_tokens"]
    assert tokens == 24
    # one chunk per verification step, each its accepted drafts + 1 tokens
    assert len(contents(vllm)) - 1 == sd["num_spec_steps"]
    assert sd["num_spec_tokens"] == 4
    assert sd["num_draft_tokens"] == 4 * sd["num_spec_steps"]
    assert sum(sd["acceptance_histogram"]) == sd["num_spec_steps"]
    accepted = sum(k * n for k, n in enumerate(sd["acceptance_histogram"]))
    assert accepted == sd["num_accepted_draft_tokens"]
    # every step yields its accepted drafts plus the target model's token
    assert sd["num_spec_steps"] + accepted == tokens
    assert sd["draft_acceptance_rate"] == accepted / sd["num_draft_tokens"] == 0.75
    assert sd["mean_acceptance_length"] == 1 + accepted / sd["num_spec_steps"]
    assert all("metrics" not in e for e in vllm[:-2])

    _, bare = chat(base, "fake-draft4-accept75", max_tokens=24)
    assert bare[-2]["choices"][0]["finish_reason"] == "length"
    assert bare[-2]["metrics"] == vllm[-2]["metrics"]

    _, llama = chat(base, "fake-llamacpp-draft4-accept40", max_tokens=24)
    t = llama[-2]["timings"]
    assert llama[-2]["choices"][0]["finish_reason"] == "length"
    assert t["predicted_n"] == len(contents(llama)) == 24  # (no "" role prelude)
    steps = t["draft_n"] // 4
    assert t["draft_n"] == 4 * steps and steps + t["draft_n_accepted"] == 24
    assert 0.3 < t["draft_n_accepted"] / t["draft_n"] < 0.45
    assert all("timings" not in e for e in llama[:-2] if isinstance(e, dict))

    plan = make_plan(
        {"model": "fake-llamacpp-draft4-accept40", "messages": MESSAGES, "max_tokens": 24},
        True,
        Options(),
    )
    writes = build_events(plan)
    pauses = step_pauses(plan, writes)
    # the writes holding a step's first token, and only those, wait
    firsts = [0, *accumulate(1 + a for a in spec_steps(24, 4, 40))][:-1]
    token, waiting = 0, []
    for write, pause in zip(writes, pauses, strict=True):
        n = sum(1 for e in write if isinstance(e, dict) and contents([e]))
        if pause:
            assert n == 1
            waiting.append(token)
        token += n
    assert waiting == firsts and len(firsts) == steps

    _, plain = chat(base, "fake", max_tokens=24, **usage)
    assert not any("metrics" in e or "timings" in e for e in plain if isinstance(e, dict))
    # a failed stream ends before the chunk that would report it
    _, failed = chat(base, "fake-draft4-fail3", max_tokens=24, **usage)
    assert not any("metrics" in e for e in failed if isinstance(e, dict))
    body = {"model": "fake-llamacpp-draft2", "messages": MESSAGES, "max_tokens": 10}
    assert stream(base, body).json()["timings"]["draft_n_accepted"] > 0


@given(st.integers(0, 300), st.integers(1, 16), st.integers(0, 100))
def test_spec_steps_add_up(tokens: int, k: int, pct: int) -> None:
    steps = spec_steps(tokens, k, pct)
    assert sum(1 + a for a in steps) == tokens
    assert all(0 <= a <= k for a in steps)
    # the running total of accepted drafts tracks pct percent of the drafted
    # ones, except at the cut last step
    for i in range(len(steps) - 1):
        assert sum(steps[: i + 1]) == pct * k * (i + 1) // 100


def test_fffd_mode_splits_multibyte_pieces(base: str) -> None:
    _, plain = chat(base, "fake-cjk", max_tokens=40)
    _, fffd = chat(base, "fake-cjk-fffd", max_tokens=40)
    assert "\ufffd" not in "".join(contents(plain))
    pieces = contents(fffd)
    assert any(p.startswith("\ufffd") for p in pieces)
    assert pieces[1].replace("\ufffd", "") in contents(plain)[1]


def test_non_streaming_and_completions(base: str) -> None:
    body = {"model": "fake-emoji", "messages": MESSAGES, "max_tokens": 12}
    resp = stream(base, body)
    assert int(resp.headers["content-length"]) == len(resp.content)
    msg = resp.json()["choices"][0]["message"]["content"]
    _, events = chat(base, "fake-emoji", max_tokens=12)
    assert msg == "".join(contents(events))
    comp = stream(
        base,
        {"model": "fake", "prompt": "Once", "stream": True, "max_tokens": 5},
        "/v1/completions",
    )
    chunks = [json.loads(e) for e in events_of(comp.text) if e != "[DONE]"]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert sum(1 for c in chunks if c["choices"][0]["text"]) == 5


def test_keep_alive_models_health_and_errors(base: str) -> None:
    with httpx.Client(base_url=base, timeout=10) as client:
        ports = []
        for _ in range(2):
            with client.stream(
                "POST", "/v1/chat/completions", json={"model": "fake", "messages": MESSAGES}
            ) as resp:
                resp.read()
                ports.append(resp.extensions["network_stream"].get_extra_info("client_addr"))
        assert ports[0] == ports[1]
        assert client.get("/health").json() == {"status": "ok"}
        ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
        assert "fake-cjk" in ids
        assert client.get("/nope").status_code == 404
        bad = client.post("/v1/chat/completions", content=b"{not json")
        assert bad.status_code == 400 and "error" in bad.json()
        assert client.post("/v1/chat/completions", json={"model": "x"}).status_code == 400


# ---------------------------------------------------------------------------
# Generation (pure functions)
# ---------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    flavour=st.sampled_from(["english", "cjk", "emoji", "code", "mixed"]),
    key=st.text(max_size=20),
    count=st.integers(1, 60),
    data=st.data(),
)
def test_perturb_keeps_prefix_and_changes_piece_p(
    flavour: str, key: str, count: int, data: st.DataObject
) -> None:
    p = data.draw(st.integers(0, count - 1))
    base = generate_pieces(flavour, key, count)
    pert = generate_pieces(flavour, key, count, p)
    assert len(base) == len(pert) == count
    assert pert[:p] == base[:p] and pert[p] != base[p]
    assert generate_pieces(flavour, key, count) == base


@settings(max_examples=60, deadline=None)
@given(key=st.text(max_size=10), count=st.integers(1, 40))
def test_tokens_keep_text_except_fffd_splits(key: str, count: int) -> None:
    pieces = generate_pieces("mixed", key, count)
    assert "".join(pieces_to_tokens(pieces, key, "openai", False)) == "".join(pieces)
    llama = pieces_to_tokens(pieces, key, "llamacpp", True)
    assert "".join(llama) == "".join(pieces) and len(llama) >= len(pieces)
    split = pieces_to_tokens(pieces, key, "openai", True)
    i = 0
    for piece in pieces:
        if split[i] == piece:
            i += 1
            continue
        # split inside its first multi-byte character, each half decoded alone
        first, second = split[i], split[i + 1]
        ch = next(c for c in piece if ord(c) >= 0x80)
        assert first.endswith("\ufffd") and second.startswith("\ufffd")
        assert first[:-1] + ch + second.lstrip("\ufffd") == piece
        i += 2
    assert i == len(split)


def test_model_name_options() -> None:
    opts, key = options_for_model("fake-cjk-tpc2-perturb5-llamacpp-x", Options())
    assert (opts.flavour, opts.tokens_per_chunk, opts.perturb_after, opts.style) == (
        "cjk",
        2,
        5,
        "llamacpp",
    )
    assert key == "fake-cjk-x"
    assert options_for_model("gpt-4o", Options(style="transformers")) == (
        Options(style="transformers"),
        "gpt-4o",
    )


# ---------------------------------------------------------------------------
# pcaps/: every expected.json agrees with the bytes in its capture
# ---------------------------------------------------------------------------

# The recordings in pcaps/ and the crafted faults in pcaps/faults/, by name.
EXPECTED_FILES = {p.name.removesuffix(".expected.json"): p for p in PCAPS.rglob("*.expected.json")}
SELF_CHECKED = sorted(
    p.name.removesuffix(".expected.json")
    for p in EXPECTED_FILES.values()
    if p.name.removesuffix(".expected.json")
    not in ("fault_lost", "fault_midstream", "fault_truncated_file")
    # crafted by scripts/craft_dialect_pcaps.py and craft_midway.py, not by this server
    and not p.name.startswith(("dialect_", "midway_"))
    # synthesized by scripts/craft_faults.py (security, h2c and cap groups; h2c is
    # HTTP/2, and a cap fixture's expected text is what the sniffer keeps past its
    # caps, not the whole wire: checked against the crafting script's own record)
    and not p.name.startswith(("sec_", "h2c_", "cap_"))
)


@pytest.mark.parametrize("name", SELF_CHECKED)
def test_pcap_matches_expected(name: str) -> None:
    sys.path.insert(0, str(REPO / "scripts"))
    from craft_faults import parse_responses, server_bytes
    from record_pcaps import summarize_stream
    from scapy.utils import rdpcap

    expected = EXPECTED_FILES[name]
    pcap = expected.with_name(f"{name}.pcap")
    assert pcap.stat().st_size < 300_000
    exp = json.loads(expected.read_text(encoding="utf-8"))
    pkts = list(rdpcap(str(pcap)))
    by_port: dict[int, list[dict[str, Any]]] = {}
    for s in exp["streams"]:
        by_port.setdefault(s["client_port"], []).append(s)
    for port, streams in by_port.items():
        data, _ = server_bytes(pkts, exp["server_port"], port, lambda s: True)
        resps = parse_responses(data)
        assert len(resps) >= len(streams)
        for s, r in zip(streams, resps, strict=False):
            chat = s["path"].endswith("/chat/completions")
            if s["stream"]:
                got = summarize_stream(r.body, chat)
                assert got["done"] == s["done_seen"]
                for k, c in s["choices"].items():
                    text = got["choices"][int(k)]["text"]
                    if s["check_text"]:
                        assert text == c["text"]
                        assert got["choices"][int(k)]["chunks"] == c["chunks"]
                    else:
                        assert text.startswith(c["text_prefix"])
            else:
                body = json.loads(r.body)
                for k, c in s["choices"].items():
                    msg = body["choices"][int(k)]
                    assert (msg["message"]["content"] if chat else msg["text"]) == c["text"]
