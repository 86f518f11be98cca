"""Cause classes (sniffer.reports.causes) on crafted logprob streams: one pair per
class, through the store, ``diff`` (text, JSON, gates, HTML) and ``stats``."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sniffer.cli import main
from sniffer.core.events import ChunkEvent, StreamClosed, StreamOpened, StreamResponse, StreamState
from sniffer.llm.logprobs import (
    ServerToken,
    output_logprobs,
    parse_logprobs,
    read_logprobs,
    token_starts,
)
from sniffer.llm.tokens import TokenizerRegistry
from sniffer.llm.values import RequestSummary
from sniffer.reports.causes import classify
from sniffer.reports.diff import compute_diff
from sniffer.reports.stats import build_outputs, compute_stats
from sniffer.store.writer import StoreWriter

REGISTRY = TokenizerRegistry()

#: a token: (text, logprob, [(alternative, logprob), ...])
Tok = tuple[str, float | None, Sequence[tuple[str, float]]]


def lp_json(tok: Tok) -> str:
    text, lp, top = tok
    item: dict[str, Any] = {"token": text, "logprob": lp, "bytes": list(text.encode())}
    item["top_logprobs"] = [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top]
    return json.dumps({"content": [item]})


def T(text: str, lp: float | None = -0.1, top: Sequence[tuple[str, float]] = ()) -> Tok:
    return (text, lp, top)


class Writer:
    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.w = StoreWriter(self.path)
        self.sid = 0

    def stream(
        self,
        label: str,
        prompt: str,
        toks: Sequence[Tok],
        *,
        finish: str = "stop",
        logprobs: bool = True,
        model: str = "m",
    ) -> int:
        self.sid += 1
        sid = self.sid
        body = {"model": model, "messages": [{"role": "user", "content": prompt}],
                "temperature": 0, "stream": True, "logprobs": logprobs}  # fmt: skip
        t0 = 100.0 + sid
        self.w.write(
            StreamOpened(
                stream=sid,
                conn=sid,
                exchange=0,
                ts=t0,
                client=("127.0.0.1", 40000 + sid),
                server=("127.0.0.1", 8000),
                method="POST",
                path="/v1/chat/completions",
                request_headers=(),
                request_body=json.dumps(body),
                request=RequestSummary(model=model),
                dialect="openai.chat",
                label=label,
            )
        )
        self.w.write(StreamResponse(sid, t0, 200, (), "text/event-stream", True))
        for i, tok in enumerate(toks):
            self.w.write(
                ChunkEvent(
                    sid,
                    t0 + 0.1 + i * 0.01,
                    i,
                    0,
                    i + 1,
                    "content",
                    text=tok[0],
                    logprobs=lp_json(tok) if logprobs else None,
                )
            )
        end = t0 + 1.0
        self.w.write(ChunkEvent(sid, end, len(toks), 0, 0, "finish", finish_reason=finish))
        self.w.write(
            StreamClosed(
                stream=sid,
                ts=end,
                state=StreamState.COMPLETE,
                reason="test",
                done_seen=True,
                gap=False,
                t_first_content=t0 + 0.1,
                t_last_chunk=end,
                chunk_count=len(toks),
                event_count=len(toks) + 1,
                text_len=sum(len(t[0]) for t in toks),
                finish_reasons=((0, finish),),
                usage=None,
                response_body=None,
            )
        )
        return sid

    def close(self) -> str:
        self.w.close()
        return self.path


HEAD = [T("The"), T(" cat"), T(" sat")]

#: prompt → (baseline tokens, candidate tokens, candidate finish, expected cause)
CASES: dict[str, tuple[list[Tok], list[Tok], str, str | None]] = {
    # the candidate's " in" is 0.05 nats below the baseline's " on" in its top-k
    "near tie": (
        [*HEAD, T(" on", -0.70, [(" on", -0.70), (" in", -0.75)]), T(" a")],
        [*HEAD, T(" in", -0.69, [(" in", -0.69), (" on", -0.72)]), T(" a")],
        "stop",
        "near_tie",
    ),
    # " under" is not in the baseline's top-2, nor " on" in the candidate's
    "outside top-k": (
        [*HEAD, T(" on", -0.05, [(" on", -0.05), (" in", -3.5)]), T(" a")],
        [*HEAD, T(" under", -0.2, [(" under", -0.2), (" near", -2.0)]), T(" a")],
        "stop",
        "substantive",
    ),
    # in the top-k on both sides, but 4 nats below
    "far below": (
        [*HEAD, T(" on", -0.02, [(" on", -0.02), (" by", -4.0)]), T(" the")],
        [*HEAD, T(" by", -0.03, [(" by", -0.03), (" on", -4.2)]), T(" the")],
        "stop",
        "substantive",
    ),
    "stopped early": ([*HEAD, T(" down"), T(".")], [*HEAD], "stop", "length_only"),
    "other finish": ([*HEAD, T(".")], [*HEAD, T(".")], "length", "finish_only"),
    "same": ([*HEAD, T(".")], [*HEAD, T(".")], "stop", None),
}


def _store(tmp_path: Path, *, no_logprobs: str | None = None) -> str:
    w = Writer(tmp_path / "c.db")
    for prompt, (b, c, fin, _) in CASES.items():
        w.stream("dense", prompt, b, logprobs=prompt != no_logprobs)
        w.stream("sparse", prompt, c, finish=fin, logprobs=prompt != no_logprobs)
    return w.close()


def _diff(db: str, *args: str) -> Any:
    res = CliRunner().invoke(
        main, ["diff", "--db", db, "--baseline", "dense", "--candidate", "sparse", *args]
    )
    return res


def test_each_class_from_crafted_logprob_streams(tmp_path: Path) -> None:
    db = _store(tmp_path)
    res = _diff(db, "--json")
    assert res.exit_code == 0, res.output
    js = json.loads(res.stdout)
    by_prompt = {p["key"]: p["prompt"].removeprefix("user: ") for p in js["prompts"]}
    got = {by_prompt[p["key"]]: p["cause"] for p in js["pairs"]}
    assert got == {k: v[3] for k, v in CASES.items()}
    s = js["summary"]
    assert s["causes"] == {"retokenization_only": 0, "near_tie": 1, "substantive": 2,
                           "length_only": 1, "finish_only": 1, "sampler_adjusted": 0,
                           "unknown": 0}  # fmt: skip
    assert s["substantive_ratio"] == pytest.approx(2 / 6) and s["unknown_ratio"] == 0.0
    # the evidence: the two chosen tokens and their log-probabilities in each server's view
    tie = next(p for p in js["pairs"] if p["cause"] == "near_tie")
    ev = tie["cause_evidence"]
    assert ev["fork_token"] == 3 and ev["char"] == len("The cat sat ")
    assert ev["reference_view"]["gap"] == pytest.approx(0.05)
    assert ev["other_view"]["gap"] == pytest.approx(0.03)
    out = next(p for p in js["pairs"] if by_prompt[p["key"]] == "outside top-k")
    assert out["cause_evidence"]["reference_view"]["in_top_k"] is False
    assert out["cause_evidence"]["reference_view"]["gap_at_least"] == pytest.approx(3.45)

    # a wider margin turns the "far below" fork into a near tie
    wide = json.loads(_diff(db, "--json", "--near-tie-margin", "5").stdout)
    assert wide["summary"]["causes"]["near_tie"] == 2
    assert wide["summary"]["near_tie_margin"] == 5.0

    # text: the distribution and one line per pair that differs
    text = _diff(db).stdout
    assert "why they differ (near-tie margin 0.50 nats): near_tie 1, substantive 2, " in text
    assert "dense chose ' on' (-0.700), the other ' in' -0.750 (gap 0.050)" in text
    assert "sparse stopped early" in text

    # gates on a cause ratio
    res = _diff(db, "--fail-if", "substantive_ratio > 0.02")
    assert res.exit_code == 1 and "gate substantive_ratio > 0.02: FAIL" in res.stdout
    assert _diff(db, "--fail-if", "substantive_ratio > 0.5").exit_code == 0

    # HTML: the distribution, per pair
    page_path = tmp_path / "r.html"
    assert _diff(db, "--html", str(page_path)).exit_code == 0
    page = page_path.read_text(encoding="utf-8")
    assert "Why they differ" in page and "near_tie" in page and "substantive" in page


def test_no_logprobs_is_unknown_and_a_ratio_gate_has_no_evidence(tmp_path: Path) -> None:
    db = _store(tmp_path, no_logprobs="far below")
    js = json.loads(_diff(db, "--json").stdout)
    s = js["summary"]
    assert s["causes"]["unknown"] == 1 and s["causes"]["substantive"] == 1
    assert s["unknown_ratio"] == pytest.approx(1 / 6)
    assert s["substantive_ratio"] is None and s["near_tie_ratio"] is None
    unknown = next(p for p in js["pairs"] if p["cause"] == "unknown")
    assert unknown["cause_evidence"]["why"] == "no logprobs at the fork"
    # no evidence, no pass: the unknown pair might be substantive
    res = _diff(db, "--fail-if", "substantive_ratio > 0.5")
    assert res.exit_code == 1
    assert "no evidence: substantive_ratio has no value (the cause of some" in res.stdout
    assert _diff(db, "--fail-if", "unknown_ratio > 0.5").exit_code == 0


def _outputs(pairs: dict[int, tuple[str, list[Tok] | None]], server: Any = ()) -> list[Any]:
    rows = []
    chunk_rows = []
    for sid, (label, toks) in pairs.items():
        body = {"model": "m", "messages": [{"role": "user", "content": "p"}]}
        rows.append({"id": sid, "label": label, "model": "m", "request_json": json.dumps(body),
                     "state": "complete", "dialect": "openai.chat", "text_kept": True})  # fmt: skip
        for i, tok in enumerate(toks or []):
            chunk_rows.append(
                (sid, 0, tok[0], 1.0 + i, None, lp_json(tok) if toks is not None else None)
            )
    return build_outputs(rows, chunk_rows, REGISTRY, server)


def test_retokenization_only_when_server_ids_differ_on_the_same_text() -> None:
    toks = [T("Hel"), T("lo")]
    server = [(1, 0, json.dumps(["Hel", "lo"]), json.dumps([11, 12])),
              (2, 0, json.dumps(["Hello"]), json.dumps([13]))]  # fmt: skip
    outs = _outputs({1: ("a", toks), 2: ("b", toks)}, server)
    (pair,) = compute_diff(outs, "a", "b").pairs
    assert not pair.identical and pair.cause == "retokenization_only"


def test_one_sided_logprobs_and_the_probability_bound() -> None:
    # only the baseline sent logprobs; its alternative " in" begins the candidate's text
    base = [*HEAD, T(" on", -0.7, [(" on", -0.7), (" i", -0.9), (" in", -0.8)])]
    outs = _outputs({1: ("a", base), 2: ("b", None)})
    outs[1].text = "The cat sat in"
    why = classify(outs[0], outs[1])
    assert why.cause == "near_tie"
    assert why.evidence["reference_view"]["other"] == " in"  # the longest that matches
    # no alternatives: a chosen token with p = 0.99 puts every other below log(0.01)
    sure = [*HEAD, T(" on", math.log(0.99))]
    outs = _outputs({1: ("a", sure), 2: ("b", None)})
    outs[1].text = "The cat sat in"
    why = classify(outs[0], outs[1])
    assert why.cause == "substantive"
    gap = why.evidence["reference_view"]["gap_at_least"]
    assert gap == pytest.approx(math.log(0.99) - math.log(0.01))
    # p = 0.5: the bound says nothing (another token may have had 0.5 too)
    flat = [*HEAD, T(" on", math.log(0.5))]
    outs = _outputs({1: ("a", flat), 2: ("b", None)})
    outs[1].text = "The cat sat in"
    assert classify(outs[0], outs[1]).cause == "unknown"


def test_one_parse_gives_both_views_of_a_chunks_logprobs() -> None:
    chat = read_logprobs(
        json.dumps({"content": [{"token": "a", "logprob": -0.5, "bytes": [97], "id": 7}]})
    )
    lps = chat.tokens()
    assert lps is not None and [(t.text, t.logprob, t.raw, t.id) for t in lps] == [
        ("a", -0.5, b"a", 7)
    ]
    assert chat.server_tokens() == [ServerToken("a", 7, b"a")]
    # an id alone, or plain ids, name the server's token but carry no log-probability
    only_id = read_logprobs('{"id": 5}')
    assert only_id.tokens() is None and only_id.server_tokens() == [ServerToken("token_id:5", 5)]
    ids = read_logprobs("[1, 2]")
    assert ids.tokens() is None and [t.id for t in ids.server_tokens() or []] == [1, 2]
    comp = read_logprobs(json.dumps({"tokens": ["x", "y"], "token_logprobs": [-1.0, -2.0]}))
    assert [t.logprob for t in comp.tokens() or []] == [-1.0, -2.0]
    assert comp.server_tokens() == [ServerToken("x"), ServerToken("y")]
    for empty in ("null", "{}"):
        assert read_logprobs(empty).tokens() == [] and read_logprobs(empty).server_tokens() == []
    for bad in ("{bad", '{"x": 1}', '{"content": true, "refusal": true}'):
        assert read_logprobs(bad).tokens() is None and read_logprobs(bad).server_tokens() is None


def test_logprob_parsing_shapes_and_bytes() -> None:
    chat = parse_logprobs(lp_json(T(" a", -0.5, [(" a", -0.5), (" b", -1.0)])))
    assert (
        chat is not None
        and chat[0].logprob == -0.5
        and [a.text for a in chat[0].top]
        == [
            " a",
            " b",
        ]
    )
    comp = parse_logprobs(
        json.dumps(
            {
                "tokens": ["x", "y"],
                "token_logprobs": [-0.1, None],
                "top_logprobs": [{"x": -0.1, "z": -2.0}, None],
            }
        )
    )
    assert comp is not None and comp[1].logprob is None and len(comp[0].top) == 2
    tgi = parse_logprobs(json.dumps({"id": 5, "text": "hi", "logprob": -0.3, "special": False}))
    assert tgi is not None and tgi[0].id == 5
    assert parse_logprobs("{bad") is None and parse_logprobs('{"x": 1}') is None
    # a token ending inside a character: "é" split in two byte tokens, the first with ""
    e = "é".encode()
    parts = [
        json.dumps({"content": [{"token": "\ufffd", "logprob": -1, "bytes": [e[0]]}]}),
        json.dumps({"content": [{"token": "\ufffd", "logprob": -1, "bytes": [e[1]]}]}),
        json.dumps({"content": [{"token": "!", "logprob": -1, "bytes": [33]}]}),
    ]
    toks = output_logprobs(parts, "é!")
    assert toks is not None and token_starts(toks) == [0, 0, 1]
    assert output_logprobs(parts, "e!") is None  # bytes that do not spell the text


def test_stats_explains_variants_with_the_same_classes(tmp_path: Path) -> None:
    """Repeats of one temperature-0 request to one server: the variants' causes."""
    w = Writer(tmp_path / "s.db")
    tie_a, tie_b = CASES["near tie"][0], CASES["near tie"][1]
    far = CASES["outside top-k"][1]
    for toks in (tie_a, tie_a, tie_a, tie_b, far):
        w.stream("node", "one prompt", toks)
    db = w.close()
    res = CliRunner().invoke(main, ["stats", "--db", db, "--json"])
    assert res.exit_code == 0, res.output
    js = json.loads(res.stdout)
    (g,) = js["groups"]
    assert [(v["count"], v["cause"]) for v in g["variants"]] == [
        (3, None),
        (1, "near_tie"),
        (1, "substantive"),
    ]
    assert js["summary"]["variant_causes"]["near_tie"] == 1
    text = CliRunner().invoke(main, ["stats", "--db", db]).stdout
    assert "[near_tie]" in text and "why variants differ from the most frequent one:" in text
    outs = compute_stats([]).summary
    assert outs["variant_causes"]["unknown"] == 0


def test_an_unreadable_alternative_proves_nothing() -> None:
    """A logprob mangled on the way (e.g. digits redacted as a card number) is not
    read as "the other token is outside the top-k"."""
    base = [*HEAD, T(" on", -0.7, [(" on", -0.7), (" up", -3.0)])]
    cand = [*HEAD, T(" in", -0.7, [(" in", -0.7), (" at", -3.0)])]
    outs = _outputs({1: ("a", base), 2: ("b", cand)})
    assert classify(outs[0], outs[1]).cause == "substantive"
    mangled = json.loads(lp_json(base[-1]))
    mangled["content"][0]["top_logprobs"][1]["logprob"] = "-3.<CARD>"
    lps = parse_logprobs(json.dumps(mangled))
    assert lps is not None and lps[0].top_complete is False and len(lps[0].top) == 1
    outs[0].logprobs = (*(outs[0].logprobs or ())[:3], lps[0])
    outs[1].logprobs = None
    assert classify(outs[0], outs[1]).cause == "unknown"


def test_an_adjusted_sampler_is_named_not_called_substantive() -> None:
    """A server whose chosen tokens are not always the top-1 of their own raw
    logprobs (llama-cpp-python's repeat_penalty at temperature 0): a fork
    where its raw logprobs favour the other side's token by more than the
    margin is ``sampler_adjusted``, not ``substantive``; the same fork from a
    plain greedy server stays substantive."""
    base = [*HEAD, T(" in", -0.3, [(" in", -0.3), (" on", -1.5)])]
    # the candidate chose " on" although its raw logprobs put " in" 1.2 nats higher
    penalised = T(" on", -1.5, [(" in", -0.3), (" on", -1.5)])
    outs = _outputs({1: ("a", base), 2: ("b", [*HEAD, penalised])})
    why = classify(outs[0], outs[1], margin=0.5)
    assert why.cause == "sampler_adjusted", why
    assert why.evidence["sampler_adjusted_positions"] == {"other": 1}
    assert why.evidence["other_view"]["gap"] == pytest.approx(-1.2)
    # a greedy candidate (always its own top-1) choosing against a 1.2-nat gap
    # in the baseline's raw logprobs: a substantive fork
    greedy = T(" on", -0.3, [(" on", -0.3), (" in", -1.5)])
    outs = _outputs({1: ("a", base), 2: ("b", [*HEAD, greedy])})
    assert classify(outs[0], outs[1], margin=0.5).cause == "substantive"


def test_every_cause_names_its_source(tmp_path: Path) -> None:
    js = json.loads(_diff(_store(tmp_path), "--json").stdout)
    by_prompt = {p["key"]: p["prompt"].removeprefix("user: ") for p in js["prompts"]}
    got = {by_prompt[p["key"]]: (p["cause"], p["cause_source"]) for p in js["pairs"]}
    assert got == {
        "near tie": ("near_tie", "server_logprobs"),
        "outside top-k": ("substantive", "server_logprobs"),
        "far below": ("substantive", "server_logprobs"),
        "stopped early": ("length_only", "outputs"),
        "other finish": ("finish_only", "outputs"),
        "same": (None, None),
    }
    assert js["summary"]["cause_sources"] == {
        "outputs": 2, "server_logprobs": 3, "sampler_evidence": 0, "reference_model": 0,
    }  # fmt: skip
    text = _diff(_store(tmp_path / "t")).stdout
    assert "; decided by the outputs 2, server logprobs 3" in text
    assert ": near_tie [server logprobs] — at logprob token 3" in text
    page_path = tmp_path / "r.html"
    assert _diff(_store(tmp_path / "h"), "--html", str(page_path)).exit_code == 0
    page = page_path.read_text(encoding="utf-8")
    assert "<th>decided by</th>" in page and "<td>server logprobs</td>" in page
    # stats: a variant's cause names its source too
    w = Writer(tmp_path / "s.db")
    for toks in (CASES["near tie"][0], CASES["near tie"][0], CASES["near tie"][1]):
        w.stream("node", "one prompt", toks)
    st = json.loads(CliRunner().invoke(main, ["stats", "--db", w.close(), "--json"]).stdout)
    assert [v["cause_source"] for v in st["groups"][0]["variants"]] == [None, "server_logprobs"]


class _Scorer:
    """A stand-in reference model: fixed fork surprisals per candidate text."""

    source = "stand-in"

    def __init__(self, surprisals: dict[str, tuple[float, float]]) -> None:
        self.surprisals = surprisals

    def score(self, jobs: Sequence[Any], progress: Any = None) -> None:
        for job in jobs:
            got = self.surprisals.get(job.candidate_text)
            if got is None:
                job.result = {"error": "not scorable"}
                continue
            fb, fc = got
            side = {"fork_token": "x", "cumulative_logprob": -1.0, "scored_tokens": 1,
                    "highest_surprisal": []}  # fmt: skip
            job.result = {
                "baseline": side, "candidate": side,
                "model": self.source, "ids": "retokenized", "fork_token": 3,
                "baseline_fork_surprisal": fb, "candidate_fork_surprisal": fc,
                "preferred_at_fork": "baseline" if fb < fc else "candidate",
                "preferred_overall": "baseline",
            }  # fmt: skip


def test_without_server_logprobs_the_reference_model_decides(tmp_path: Path) -> None:
    """A pair the servers' logprobs leave unknown gets near_tie or substantive from
    the reference model's margin at the fork (the same --near-tie-margin), says so
    (cause_source "reference_model"), and the cause summary and gates follow; a
    pair the servers decided keeps its class; an unscorable pair stays unknown."""
    from sniffer.reports.diff import attribute, diff, evaluate_gates, format_diff, parse_gate
    from sniffer.store.writer import open_store

    w = Writer(tmp_path / "r.db")
    tie_b, tie_c = CASES["near tie"][0], CASES["near tie"][1]
    far_b, far_c = CASES["far below"][0], CASES["far below"][1]
    w.stream("dense", "tie", tie_b, logprobs=False)
    w.stream("sparse", "tie", tie_c, logprobs=False)
    w.stream("dense", "far", far_b, logprobs=False)
    w.stream("sparse", "far", far_c, logprobs=False)
    w.stream("dense", "served", CASES["outside top-k"][0])
    w.stream("sparse", "served", CASES["outside top-k"][1])
    w.stream("dense", "lost", [*HEAD, T(" up")], logprobs=False)
    w.stream("sparse", "lost", [*HEAD, T(" off")], logprobs=False)
    engine = open_store(w.close())
    report = diff(engine, "dense", "sparse", registry=REGISTRY, near_tie_margin=0.5)
    assert report.summary["causes"]["unknown"] == 3
    assert report.summary["substantive_ratio"] is None  # no evidence yet
    scorer = _Scorer({"The cat sat in a": (1.0, 1.3), "The cat sat by the": (0.2, 3.0),
                      "The cat sat under a": (0.1, 9.0)})  # fmt: skip
    summary = attribute(report, scorer)  # type: ignore[arg-type]
    assert summary["causes_decided"] == 2 and summary["errors"] == 1
    prompt_of = {p.key: p.prompt.removeprefix("user: ") for p in report.prompts}
    got = {prompt_of[p.key]: (p.cause, p.cause_source) for p in report.pairs}
    assert got == {
        "tie": ("near_tie", "reference_model"),  # 0.3 nats apart ≤ 0.5
        "far": ("substantive", "reference_model"),  # 2.8 nats apart
        "served": ("substantive", "server_logprobs"),  # the servers' logprobs decided
        "lost": ("unknown", None),  # the reference could not score it
    }
    far = next(p for p in report.pairs if prompt_of[p.key] == "far")
    ev = far.cause_evidence or {}
    assert ev["server_evidence"] == "no logprobs at the fork" and "why" not in ev
    assert ev["reference_model_view"]["gap"] == pytest.approx(2.8)
    s = report.summary
    assert s["causes"]["near_tie"] == 1 and s["causes"]["substantive"] == 2
    assert s["causes"]["unknown"] == 1
    assert s["cause_sources"]["reference_model"] == 2
    assert s["cause_sources"]["server_logprobs"] == 1
    text = format_diff(report)
    assert "substantive [reference model] — " in text
    assert "servers: no logprobs at the fork; reference model surprisal at the fork " in text
    assert "dense 0.200 vs sparse 3.000 nats (gap 2.800)" in text
    # every pair scored: a gate on a cause ratio now has evidence
    report = diff(engine, "dense", "sparse", registry=REGISTRY, near_tie_margin=0.5)
    scorer.surprisals["The cat sat off"] = (0.5, 0.6)
    attribute(report, scorer)  # type: ignore[arg-type]
    assert report.summary["unknown_ratio"] == 0.0
    (gate,) = evaluate_gates([parse_gate("substantive_ratio > 0.4")], report.summary)
    assert gate.actual == pytest.approx(2 / 4) and gate.failed
