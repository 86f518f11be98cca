"""probe (sniffer.runtime.probe): prompt files, plan and bounds, SSE parsing, live runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from sniffer.cli import main
from sniffer.runtime.probe import (
    ProbeConfig,
    ProbeError,
    StreamParser,
    endpoint_url,
    format_probe,
    load_prompts,
    parse_prompts,
    plan_requests,
    probe_summary,
    run_probe,
)
from tests.fixture_server import ServerThread, free_port, run_server_in_thread
from tests.fixture_server.app import Options


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[ServerThread, ServerThread]]:
    a = run_server_in_thread(free_port())
    b = run_server_in_thread(free_port(lo=19000, hi=19499), Options(perturb_after=3))
    yield a, b
    a.stop()
    b.stop()


def test_parse_prompts_plain_and_jsonl() -> None:
    plain = parse_prompts("first prompt\n\n# a comment\n  second  \n")
    assert plain == [
        {"messages": [{"role": "user", "content": "first prompt"}]},
        {"messages": [{"role": "user", "content": "second"}]},
    ]
    jl = parse_prompts(
        '"just text"\n{"prompt": "complete me", "max_tokens": 5}\n'
        '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}\n'
    )
    assert jl[0] == {"messages": [{"role": "user", "content": "just text"}]}
    assert jl[1] == {"prompt": "complete me", "max_tokens": 5}
    assert len(jl[2]["messages"]) == 2
    # one line that is not JSON makes the whole file plain text
    mixed = parse_prompts('{"prompt": "x"}\nhello\n')
    assert mixed[0]["messages"][0]["content"] == '{"prompt": "x"}'
    with pytest.raises(ProbeError):
        parse_prompts('{"nothing": 1}\n')


def test_load_prompts_errors(tmp_path: Path) -> None:
    with pytest.raises(ProbeError):
        load_prompts(tmp_path / "missing.txt")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ProbeError):
        load_prompts(empty)


def test_endpoint_url() -> None:
    assert endpoint_url("http://h:8000", True) == "http://h:8000/v1/chat/completions"
    assert endpoint_url("http://h:8000/", False) == "http://h:8000/v1/completions"
    assert endpoint_url("http://h:8000/v1", True) == "http://h:8000/v1/chat/completions"
    assert endpoint_url("http://h/x/v1/completions", True) == "http://h/x/v1/completions"
    with pytest.raises(ProbeError):
        endpoint_url("ftp://h", True)
    with pytest.raises(ProbeError):
        endpoint_url("localhost:8000", True)


def test_plan_order_overrides_and_cap() -> None:
    prompts = parse_prompts('"a"\n{"prompt": "b", "temperature": 0.5, "stream": false}\n')
    cfg = ProbeConfig(urls=("http://x:1", "http://y:2"), model="m", repeat=2, max_tokens=7)
    plan = plan_requests(prompts, cfg)
    assert len(plan) == 8
    assert [(r.repeat, r.prompt_index, r.base) for r in plan[:4]] == [
        (0, 0, "http://x:1"),
        (0, 0, "http://y:2"),
        (0, 1, "http://x:1"),
        (0, 1, "http://y:2"),
    ]
    assert plan[0].body == {
        "model": "m",
        "temperature": 0.0,
        "max_tokens": 7,
        "messages": [{"role": "user", "content": "a"}],
        "stream": True,
    }
    assert plan[2].url == "http://x:1/v1/completions"
    assert plan[2].body["temperature"] == 0.5 and plan[2].body["stream"] is True
    with pytest.raises(ProbeError, match="cap"):
        plan_requests(
            prompts, ProbeConfig(urls=("http://x:1",), model="m", repeat=6, max_requests=10)
        )
    with pytest.raises(ProbeError):
        plan_requests(prompts, ProbeConfig(urls=(), model="m"))


def _sse(chunks: list[dict[str, object]]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks) + (
        b"data: [DONE]\n\n"
    )


STREAM = _sse(
    [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"content": "Hel"}}]},
        {"choices": [{"index": 0, "delta": {"content": "lo ✨"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
)


@given(st.lists(st.integers(0, len(STREAM)), max_size=8))
def test_stream_parser_any_split(cuts: list[int]) -> None:
    p = StreamParser()
    bounds = [0, *sorted(cuts), len(STREAM)]
    for i, (a, b) in enumerate(pairwise(bounds)):
        p.feed(STREAM[a:b], float(i))
    p.close(99.0)
    assert p.text == "Hello ✨"
    assert p.chunks == 2
    assert p.finish_reason == "stop"
    assert p.error is None
    assert p.first_output is not None and p.first_output <= len(bounds)


def test_stream_parser_bad_input_is_an_error_value() -> None:
    p = StreamParser()
    p.feed(b"data: {not json\n\ndata: " + json.dumps({"error": {"message": "boom"}}).encode(), 0.0)
    p.feed(b"\n\n", 1.0)
    assert p.error is not None and p.text == ""


def test_run_probe_against_two_servers(servers: tuple[ServerThread, ServerThread]) -> None:
    a, b = servers
    prompts = parse_prompts("one\ntwo\n")
    cfg = ProbeConfig(urls=(a.base_url, b.base_url), model="fake", repeat=3, concurrency=3)
    seen: list[int] = []
    run = run_probe(prompts, cfg, progress=lambda done, total: seen.append(done))
    assert len(run.results) == run.planned == 12 and run.skipped == 0
    assert seen == list(range(1, 13))
    assert all(r.ok and r.text and r.finish_reason == "stop" for r in run.results)
    assert all(r.ttft is not None and 0 <= r.ttft <= r.elapsed for r in run.results)
    s = probe_summary(run)
    assert s["ok"] == 12 and s["errors"] == 0 and s["deterministic_ratio"] == 1.0
    assert [a["agree"] for a in s["across_urls"]] == [False, False]
    assert all(
        c is not None and c > 0
        for a in s["across_urls"]
        for c in a["first_difference_char"].values()
    )
    assert "12/12 requests sent, 12 ok" in format_probe(s)


def test_run_probe_errors_and_deadline(servers: tuple[ServerThread, ServerThread]) -> None:
    a, _ = servers
    prompts = parse_prompts("x\n")
    bad = run_probe(prompts, ProbeConfig(urls=(a.base_url + "/v1/nope/completions",), model="fake"))
    assert bad.results[0].status == 404 and not bad.results[0].ok
    refused = run_probe(prompts, ProbeConfig(urls=(f"http://127.0.0.1:{free_port()}",), model="m"))
    assert refused.results[0].status is None and "ConnectError" in (refused.results[0].error or "")
    late = run_probe(prompts, ProbeConfig(urls=(a.base_url,), model="fake", repeat=5, deadline=-1))
    assert late.results == [] and late.skipped == 5


def test_cli_probe(servers: tuple[ServerThread, ServerThread], tmp_path: Path) -> None:
    a, _ = servers
    f = tmp_path / "p.jsonl"
    f.write_text('{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}\n', "utf-8")
    res = CliRunner().invoke(
        main, ["probe", str(f), "--url", a.base_url, "--model", "fake", "-n", "2"]
    )
    assert res.exit_code == 0, res.output
    assert "2/2 requests sent, 2 ok" in res.output
    res = CliRunner().invoke(
        main,
        [
            "probe",
            str(f),
            "--url",
            a.base_url,
            "--model",
            "fake",
            "-n",
            "20",
            "--max-requests",
            "5",
        ],
    )
    assert res.exit_code == 1 and "more than the cap of 5" in res.output
    res = CliRunner().invoke(
        main,
        ["probe", str(f), "--url", f"http://127.0.0.1:{free_port()}", "--model", "m", "--json"],
    )
    assert res.exit_code == 1 and json.loads(res.output)["errors"] == 1
