"""stats and diff over recorded streams (sniffer.reports.stats / .diff).

Unit part: streams written through StoreWriter with known chunk texts and
capture times. End-to-end part (root: dumpcap): two fixture servers, probe,
replay with two labels, then stats and diff.
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Any

import pytest

from sniffer.core.events import ChunkEvent, StreamClosed, StreamOpened, StreamResponse, StreamState
from sniffer.llm.tokens import TokenizerRegistry
from sniffer.llm.values import RequestSummary
from sniffer.reports.diff import (
    GateError,
    compute_diff,
    diff,
    diff_json,
    evaluate_gates,
    format_diff,
    parse_gate,
)
from sniffer.reports.stats import compute_stats, format_stats, load_outputs, stats, stats_json
from sniffer.store.db import EngineStore
from sniffer.store.writer import StoreWriter, make_engine, open_store

REGISTRY = TokenizerRegistry()


def ids_of(text: str) -> list[int]:
    return REGISTRY.default().encode_batch([text])[0]


class Db:
    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.writer = StoreWriter(self.path)
        self.next_id = 1

    def stream(
        self,
        label: str,
        prompt: str,
        pieces: Sequence[str],
        *,
        t0: float = 1000.0,
        ttft: float = 0.1,
        gap: float = 0.01,
        finish: str = "stop",
        state: StreamState = StreamState.COMPLETE,
        temperature: float = 0.0,
        model: str = "fake",
    ) -> int:
        sid = self.next_id
        self.next_id += 1
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": temperature,
            "stream": True,
        }
        w = self.writer
        w.write(
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
                request=dataclasses.replace(RequestSummary.parse(body), prompt_len=1),
                dialect="openai.chat",
                label=label,
            )
        )
        w.write(StreamResponse(sid, t0 + 0.01, 200, (), "text/event-stream", True))
        ts = t0 + ttft
        for i, text in enumerate(pieces):
            w.write(ChunkEvent(sid, ts + i * gap, i, 0, i + 1, "content", text=text))
        end = ts + len(pieces) * gap
        w.write(ChunkEvent(sid, end, len(pieces), 0, 0, "finish", finish_reason=finish))
        w.write(
            StreamClosed(
                stream=sid,
                ts=end,
                state=state,
                reason="test",
                done_seen=True,
                gap=False,
                t_first_content=ts if pieces else None,
                t_last_chunk=end,
                chunk_count=len(pieces),
                event_count=len(pieces) + 1,
                text_len=sum(map(len, pieces)),
                finish_reasons=((0, finish),),
                usage=None,
                response_body=None,
            )
        )
        return sid

    def close(self) -> str:
        self.writer.close()
        return self.path


A = ["The", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog", "."]
B = [*A[:5], " under", " a", " green", " tree", "."]  # forks at piece 5


def char_to_token(text: str, char: int) -> int:
    """Index of the token holding character ``char`` (the expected fork position)."""
    enc = REGISTRY.default().encode_with_offsets([text])[0]
    return next(i for i, (s, e) in enumerate(enc[1]) if s <= char < e)


def expected_fork(a: list[str], b: list[str]) -> int:
    ta, tb = "".join(a), "".join(b)
    char = next(i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y)
    # the fork is at the first token that differs; with a shared word boundary
    # it is the token holding the first differing character
    ia, ib = ids_of(ta), ids_of(tb)
    k = next(i for i, (x, y) in enumerate(zip(ia, ib, strict=False)) if x != y)
    assert k == char_to_token(ta, char)
    return k


@pytest.fixture
def db(tmp_path: Path) -> Db:
    return Db(tmp_path / "t.db")


def test_stats_groups_variants_and_fork(db: Db) -> None:
    for _ in range(3):
        db.stream("baseline", "p1", A)
    db.stream("sparse", "p1", A)
    db.stream("sparse", "p1", B)
    db.stream("sparse", "p1", B)
    db.stream("baseline", "p2", A)  # alone: not reported
    db.stream("baseline", "p1", A[:3], state=StreamState.TRUNCATED)  # ignored by default
    engine = open_store(db.close())
    report = stats(engine, registry=REGISTRY)
    assert report.singletons == 1
    by_label = {g.label: g for g in report.groups}
    base, sparse = by_label["baseline"], by_label["sparse"]
    assert base.deterministic and base.outputs == 3 and base.fork_position is None
    assert base.common_prefix == len(ids_of("".join(A)))
    assert sparse.distinct == 2 and sparse.outputs == 3
    fork = expected_fork(A, B)
    assert sparse.fork_position == fork == sparse.common_prefix
    assert [v.count for v in sparse.variants] == [2, 1]
    assert sparse.variants[0].preview == "".join(B)
    assert sparse.variants[0].fork is not None and sparse.variants[0].fork.startswith(" under")
    s = report.summary
    assert s["groups"] == 2 and s["deterministic_groups"] == 1 and s["deterministic_ratio"] == 0.5
    assert s["labels"]["baseline"]["deterministic_ratio"] == 1.0
    assert s["labels"]["sparse"]["deterministic_ratio"] == 0.0
    text = format_stats(report)
    assert "2 distinct, fork at token" in text and "1 fully deterministic (50.0%)" in text
    js = stats_json(report)
    json.dumps(js)
    assert {g["label"] for g in js["groups"]} == {"baseline", "sparse"}
    # the truncated stream counts when asked
    full = stats(engine, registry=REGISTRY, include_incomplete=True, labels=["baseline"])
    g = next(g for g in full.groups if g.outputs == 4)
    assert g.distinct == 2 and g.fork_position == len(ids_of("".join(A[:3])))


def test_same_text_with_another_finish_reason_is_not_deterministic(db: Db) -> None:
    """Issue #24: two repeats with the same text, one ended by the model
    (``stop``), one cut at max_tokens (``length``), are two variants, the second
    of cause ``finish_only``; diff's modal output counts the finish reason too."""
    # the first of each side is its minority: the modal output is not the first
    db.stream("baseline", "p1", A, finish="length")
    for _ in range(2):
        db.stream("baseline", "p1", A, finish="stop")
    db.stream("sparse", "p1", A, finish="stop")
    for _ in range(2):
        db.stream("sparse", "p1", A, finish="length")
    engine = open_store(db.close())
    report = stats(engine, registry=REGISTRY)
    by_label = {g.label: g for g in report.groups}
    base = by_label["baseline"]
    assert not base.deterministic and base.distinct == 2 and base.outputs == 3
    assert [v.count for v in base.variants] == [2, 1]
    assert [v.cause for v in base.variants] == [None, "finish_only"]
    assert report.summary["deterministic_groups"] == 0
    assert report.summary["variant_causes"]["finish_only"] == 2
    assert "fully deterministic" in format_stats(report)
    # the modal output of each side is its most frequent (text, finish) pair
    outs = load_outputs(engine, registry=REGISTRY)
    (pair,) = compute_diff(outs, "baseline", "sparse", pairing="modal").pairs
    assert (pair.baseline_finish, pair.candidate_finish) == ("stop", "length")


def test_diff_all_and_modal_pairing(db: Db) -> None:
    for _ in range(2):
        db.stream("baseline", "p1", A, ttft=0.1, gap=0.02)
        db.stream("baseline", "p2", A, ttft=0.1, gap=0.02)
    # candidate: p1 forks, p2 identical; 2 tokens per chunk, faster
    b2 = ["".join(B[i : i + 2]) for i in range(0, len(B), 2)]
    a2 = ["".join(A[i : i + 2]) for i in range(0, len(A), 2)]
    db.stream("sparse", "p1", b2, ttft=0.2, gap=0.02)
    db.stream("sparse", "p1", b2, ttft=0.2, gap=0.02, finish="length")
    db.stream("sparse", "p2", a2, ttft=0.2, gap=0.02)
    db.stream("sparse", "p3", a2)  # no baseline
    engine = open_store(db.close())
    rep = diff(engine, "baseline", "sparse", registry=REGISTRY, pairing="all")
    s = rep.summary
    assert s["prompts"] == 2 and s["pairs"] == 2 * 2 + 2 * 1
    assert s["identical_pairs"] == 2 and s["identical_ratio"] == pytest.approx(2 / 6)
    fork = expected_fork(A, B)
    forked = [p for p in rep.pairs if not p.identical]
    assert {p.first_divergence for p in forked} == {fork}
    ia, ib = ids_of("".join(A)), ids_of("".join(B))
    from sniffer.reports.align import edit_distance

    assert {p.edit_distance for p in forked} == {edit_distance(ia, ib)}
    assert all(p.common_prefix == fork for p in forked)
    assert all(p.length_diff == len(ib) - len(ia) for p in forked)
    assert s["median_first_divergence"] == fork
    assert s["finish_mismatch_ratio"] == pytest.approx(2 / 6)
    assert s["unmatched_candidate_prompts"] == 1 and s["unmatched_baseline_prompts"] == 0
    # TTFT 100 ms vs 200 ms; chunks of two tokens-ish vs one
    assert s["baseline_ttft_ms_p50"] == pytest.approx(100, abs=0.01)
    assert s["ttft_ratio"] == pytest.approx(2.0, rel=1e-3)
    assert s["candidate_tokens_per_chunk_mean"] > s["baseline_tokens_per_chunk_mean"]
    assert s["tokens_per_chunk_ratio"] > 1.5
    # per-token latency: 20 ms per chunk, about 2 tokens per chunk → about half
    assert s["itl_ratio"] < 0.75
    modal = diff(engine, "baseline", "sparse", pairing="modal", registry=REGISTRY)
    assert modal.summary["pairs"] == 2 and modal.summary["identical_pairs"] == 1
    # the default pairs repeats in capture order, never all against all
    index = diff(engine, "baseline", "sparse", registry=REGISTRY)
    assert index.pairing == "index" and index.summary["pairs"] == 2 + 1
    assert index.summary["identical_pairs"] == 1 and index.summary["unpaired_outputs"] == 1
    text = format_diff(rep)
    assert "2 prompts matched, 6 pairs: 2 identical" in text
    json.dumps(diff_json(rep))


def test_gates() -> None:
    g = parse_gate("identical_ratio < 0.95")
    assert (g.metric, g.op, g.value) == ("identical_ratio", "<", 0.95)
    assert parse_gate(" ttft_ratio>=1.2 ").op == ">="
    assert parse_gate("identical_ratio < 95%").value == pytest.approx(0.95)
    assert parse_gate("mean_length_diff != -1e1").value == -10.0
    for bad in (
        "identical_ratio <",
        "__import__('os') < 1",
        "identical_ratio < 1 or 1",
        "nosuch < 1",
        "identical_ratio =< 1",
        "identical_ratio < abc",
    ):
        with pytest.raises(GateError):
            parse_gate(bad)
    summary = {"identical_ratio": 0.9, "median_first_divergence": None, "pairs": 10}
    res = evaluate_gates(
        [
            parse_gate("identical_ratio < 0.95"),
            parse_gate("identical_ratio < 0.5"),
            parse_gate("median_first_divergence < 10"),
            parse_gate("pairs == 10"),
        ],
        summary,
    )
    # no evidence, no pass: a gate on a metric with no value fails, and says why
    assert [r.failed for r in res] == [True, False, True, True]
    assert res[2].actual is None and res[2].reason.startswith("no evidence")
    assert "median_first_divergence has no value" in res[2].reason
    assert res[1].reason == "identical_ratio = 0.9, not < 0.5"


def test_bad_rows_do_not_raise(db: Db) -> None:
    db.stream("baseline", "p", [])
    db.stream("baseline", "p", [])
    engine = open_store(db.close())
    outs = load_outputs(engine, registry=REGISTRY)
    assert [o.text for o in outs] == ["", ""] and outs[0].finish_reason == "stop"
    assert outs[0].ttft is None and outs[0].itl is None
    rep = compute_stats(outs)
    assert rep.groups[0].deterministic
    empty = compute_diff(outs, "baseline", "nobody")
    assert empty.summary["pairs"] == 0 and empty.summary["identical_ratio"] is None
    with pytest.raises(ValueError):
        compute_diff(outs, "a", "b", pairing="best")


def test_fork_in_server_token_ids_when_both_streams_carry_them() -> None:
    """Server ids (logprobs / TGI tokens, as the token pass stores them) place the
    fork in the server's own units; without them the ids are re-tokenized."""
    from sniffer.reports.stats import build_outputs

    def srow(sid: int, label: str) -> dict[str, Any]:
        body = {"inputs": "Say hi", "parameters": {"max_new_tokens": 8}}
        return {"id": sid, "label": label, "model": None, "request_json": json.dumps(body),
                "state": "complete", "dialect": "tgi.generate", "text_kept": True}  # fmt: skip

    pieces = {1: ["Hel", "lo", " world"], 2: ["Hel", "lo", " there"]}
    chunk_rows = [
        (sid, 0, t, 1.0 + i, None) for sid, ps in pieces.items() for i, t in enumerate(ps)
    ]
    server_rows = [
        (1, 0, json.dumps(pieces[1]), json.dumps([11, 12, 13])),
        (2, 0, json.dumps(pieces[2]), json.dumps([11, 12, 14])),
    ]
    rows = [srow(1, "a"), srow(2, "b")]
    outs = build_outputs(rows, chunk_rows, REGISTRY, server_rows)
    assert [o.server_ids for o in outs] == [(11, 12, 13), (11, 12, 14)]
    (pair,) = compute_diff(outs, "a", "b").pairs
    assert pair.token_unit == "server" and pair.first_divergence == 2
    assert pair.first_divergence_char == 6  # "Hello " is shared
    assert (pair.first_divergence_chunk_baseline, pair.first_divergence_chunk_candidate) == (3, 3)
    # re-tokenized, the same fork is at another index ("Hello" is one token here)
    plain = compute_diff(build_outputs(rows, chunk_rows, REGISTRY), "a", "b").pairs[0]
    assert plain.token_unit == "retokenized"
    assert plain.first_divergence == expected_fork(["Hello world"], ["Hello there"]) != 2
    # server tokens that do not spell the text are not trusted
    bad = [(1, 0, json.dumps(["x"]), json.dumps([1])), server_rows[1]]
    assert build_outputs(rows, chunk_rows, REGISTRY, bad)[0].server_ids is None


# ---------------------------------------------------------------------------
# The CLI gate (non-root): the exit code is the verdict a rollout acts on
# ---------------------------------------------------------------------------


@pytest.fixture
def gated_db(db: Db) -> str:
    """Two deployments under their own model names: p1 forks, p2 is identical."""
    for prompt, cand in (("p1", B), ("p2", A)):
        db.stream("dense", prompt, A, model="llama-70b")
        db.stream("sparse", prompt, cand, model="llama-70b-sparse")
    db.stream("sparse", "p3", A, model="llama-70b-sparse")  # no baseline
    return db.close()


def _cli(*args: str) -> Any:
    from click.testing import CliRunner

    from sniffer.cli import main

    return CliRunner().invoke(main, list(args))


def test_cli_gate_pairs_across_model_names_and_any_failing_gate_fails(gated_db: str) -> None:
    base = ["diff", "--db", gated_db, "--baseline", "dense", "--candidate", "sparse"]
    # both gates hold: exit 0
    ok = _cli(*base, "--fail-if", "identical_ratio < 0.5", "--fail-if", "pairs < 2")
    assert ok.exit_code == 0, ok.output
    assert "verdict: PASS" in ok.stdout and "2 prompts matched, 2 pairs" in ok.stdout
    assert "llama-70b→llama-70b-sparse" in ok.stdout  # the model column
    # one of three gates fails: exit 1 (not only when all fail)
    one = _cli(
        *base,
        "--fail-if", "identical_ratio < 0.5",
        "--fail-if", "identical_ratio < 0.95",
        "--fail-if", "pairs < 2",
    )  # fmt: skip
    assert one.exit_code == 1, one.output
    assert "gate identical_ratio < 0.95: FAIL (actual 0.5000) — identical_ratio = 0.5 < 0.95" in (
        one.stdout
    )
    assert "verdict: FAIL (1 of 3 gates failed)" in one.stdout
    js = json.loads(_cli(*base, "--json", "--fail-if", "identical_ratio < 0.95").stdout)
    assert js["verdict"] == {
        "passed": False,
        "gates": 1,
        "failed": 1,
        "reasons": ["identical_ratio < 0.95: identical_ratio = 0.5 < 0.95"],
    }
    assert js["summary"]["unmatched_candidate_prompts"] == 1
    assert js["summary"]["unmatched_ratio"] == pytest.approx(1 / 3)
    assert [u["prompt"] for u in js["unmatched"]["candidate"]] == ["user: p3"]
    # with --match-model the names differ: nothing pairs, and that is no pass
    strict = _cli(*base, "--match-model", "--fail-if", "identical_ratio < 0.95")
    assert strict.exit_code == 1
    assert "no evidence: no pair compared" in strict.stdout


def test_cli_gate_no_evidence_no_pass(gated_db: str) -> None:
    base = ["diff", "--db", gated_db, "--baseline", "dense"]
    # --model narrows both sides to one served name: the candidate has none, no pair
    res = _cli(*base, "--candidate", "sparse", "--fail-if", "min_first_divergence_char > 100",
               "--model", "llama-70b")  # fmt: skip
    assert res.exit_code == 1 and "no evidence: no pair compared" in res.stdout
    res = _cli(*base, "--candidate", "sparse", "--fail-if", "unpaired_outputs > 0")
    assert res.exit_code == 0, res.output
    # an undefined metric: a label against itself never diverges, no fork to measure
    undefined = _cli(
        "diff", "--db", gated_db, "--baseline", "dense", "--candidate", "dense",
        "--fail-if", "median_first_divergence < 3",
    )  # fmt: skip
    assert undefined.exit_code == 1, undefined.output
    assert (
        "no evidence: median_first_divergence has no value (no pair diverged)" in undefined.stdout
    )
    # zero pairs: an unknown candidate label
    zero = _cli(*base, "--candidate", "nobody", "--fail-if", "identical_ratio < 0.95")
    assert zero.exit_code == 1 and "no evidence: no pair compared" in zero.stdout
    assert "no stream is labelled 'nobody'" in zero.stdout
    # fewer pairs than --min-pairs, with and without another gate
    few = _cli(*base, "--candidate", "sparse", "--min-pairs", "3", "--fail-if", "pairs < 0")
    assert few.exit_code == 1 and "only 2 pairs compared (at least 3 required" in few.stdout
    alone = _cli(*base, "--candidate", "sparse", "--min-pairs", "3")
    assert alone.exit_code == 1 and "verdict: FAIL" in alone.stdout
    enough = _cli(*base, "--candidate", "sparse", "--min-pairs", "2")
    assert enough.exit_code == 0, enough.output
    # no gate at all: a report, no verdict
    plain = _cli(*base, "--candidate", "nobody")
    assert plain.exit_code == 0 and "verdict" not in plain.stdout


def test_cli_fork_positions_spans_and_params(db: Db) -> None:
    db.stream("dense", "p1", A, model="m-dense")
    db.stream("sparse", "p1", B, model="m-sparse")
    db.stream("dense", "p1", A, model="m-dense", temperature=0.7)
    db.stream("sparse", "p1", A, model="m-sparse", temperature=0.7)
    path = db.close()
    res = _cli("diff", "--db", path, "--baseline", "dense", "--candidate", "sparse", "--json",
               "--spans")  # fmt: skip
    assert res.exit_code == 0, res.output
    js = json.loads(res.stdout)
    ta, tb = "".join(A), "".join(B)
    char = next(i for i, (x, y) in enumerate(zip(ta, tb, strict=False)) if x != y)
    (forked,) = [p for p in js["pairs"] if not p["identical"]]
    assert forked["first_divergence_char"] == char == len("".join(A[:5])) + 1  # " o" vs " u"
    assert forked["first_divergence"] == expected_fork(A, B)
    assert forked["first_divergence_chunk_baseline"] == 6  # pieces are chunks, 1-based
    assert forked["first_divergence_chunk_candidate"] == 6
    assert forked["token_unit"] == "retokenized"
    assert "re-tokenized" in js["summary"]["first_divergence_unit"]
    # every differing span, with the text of both sides
    spans = forked["spans"]
    assert spans and spans[0]["baseline_chars"][0] <= char
    assert "".join(s["candidate_text"] for s in spans) in tb
    assert any("under" in s["candidate_text"] for s in spans)
    ia, ib = ids_of(ta), ids_of(tb)
    assert (
        spans[0]["baseline_tokens"][0]
        == spans[0]["candidate_tokens"][0]
        == next(i for i, (x, y) in enumerate(zip(ia, ib, strict=False)) if x != y)
    )
    text = _cli("diff", "--db", path, "--baseline", "dense", "--candidate", "sparse", "--spans")
    assert "differing spans" in text.stdout and "where they fork" in text.stdout
    # two rows with the same prompt: the parameter that differs is shown
    assert "temperature=0" in text.stdout and "temperature=0.7" in text.stdout
    assert "m-dense→m-sparse" in text.stdout


def test_cli_configured_tokenizer_that_fails_is_exit_2(gated_db: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-tokenizer")
    for cmd in (
        ["diff", "--db", gated_db, "--baseline", "dense", "--candidate", "sparse"],
        ["stats", "--db", gated_db],
        ["verify", "--db", gated_db],
    ):
        res = _cli(*cmd, "--tokenizer", f"llama-*={missing}")
        assert res.exit_code == 2, (cmd, res.output)
        assert "no such file or directory" in res.output
        res = _cli(*cmd, "--default-tokenizer", missing)
        assert res.exit_code == 2, (cmd, res.output)


# ---------------------------------------------------------------------------
# Real captures replayed under two labels (non-root)
# ---------------------------------------------------------------------------

PCAPS = Path(__file__).resolve().parent.parent / "pcaps"


def _replay_as(name: str, db: str, label: str, writer: Any = None) -> dict[str, Any]:
    from sniffer.runtime.replay import replay

    exp = json.loads((PCAPS / f"{name}.expected.json").read_text(encoding="utf-8"))
    replay(
        PCAPS / f"{name}.pcap",
        db,
        labels={exp["server_port"]: label},
        writer=writer,
        tokens=REGISTRY,
    )
    return exp


@pytest.mark.parametrize(
    ("name", "pairs", "unit"),
    [
        ("dialect_responses_stream", 2, "retokenized"),
        ("dialect_anthropic_stream", 2, "retokenized"),
        ("n2", 2, "retokenized"),
        ("dialect_tgi_stream", 2, "server"),
    ],
)
def test_one_capture_under_two_labels_compares_identical(
    tmp_path: Path, name: str, pairs: int, unit: str
) -> None:
    db = str(tmp_path / "two.db")
    exp = _replay_as(name, db, "a")
    _replay_as(name, db, "b")
    res = _cli("diff", "--db", db, "--baseline", "a", "--candidate", "b", "--json",
               "--fail-if", "identical_ratio < 1")  # fmt: skip
    assert res.exit_code == 0, res.output
    js = json.loads(res.stdout)
    assert js["summary"]["pairs"] == pairs and js["summary"]["identical_ratio"] == 1.0
    assert {p["token_unit"] for p in js["pairs"]} == {unit}
    assert all(p["baseline_choice"] == p["candidate_choice"] for p in js["pairs"])
    complete = [s for s in exp["streams"] if s["state"] == "complete"]
    assert js["summary"]["baseline_incomplete"] == len(exp["streams"]) - len(complete)
    outs = [o for o in load_outputs(open_store(db), registry=REGISTRY) if o.label == "a"]
    if name.startswith(("dialect_responses", "dialect_anthropic")):
        # the output is the whole message: every block's text, in index order
        for s, o in zip(complete, [o for o in outs if o.complete], strict=True):
            blocks = [s["choices"][k]["text"] for k in sorted(s["choices"], key=int)]
            assert o.choice == 0 and o.text == "".join(blocks)
    if name == "n2":  # choice i pairs with choice i, never all against all
        texts = {o.choice: o.text for o in outs}
        assert texts == {int(k): v["text"] for k, v in exp["streams"][0]["choices"].items()}
    if name == "dialect_tgi_stream":  # two different TGI prompts, two fingerprints
        assert js["summary"]["prompts"] == 2


def test_a_clock_that_went_backwards_gives_no_timings(tmp_path: Path) -> None:
    """fault_clock_backwards: the capture clock stepped back 2 s between one
    request and its response (TTFT -1997 ms as captured). Its output's TTFT and
    ITL are left out of diff's figures, counted as such; the texts compare."""
    db = str(tmp_path / "clock.db")
    for label in ("a", "b"):
        _replay_as("faults/fault_clock_backwards", db, label)
    outs = load_outputs(open_store(db), registry=REGISTRY)
    flagged = [o for o in outs if o.clock_backwards]
    assert len(flagged) == 2 and all(o.ttft is None and o.itl is None for o in flagged)
    assert all(o.ttft is not None and o.ttft > 0 for o in outs if not o.clock_backwards)
    res = _cli("diff", "--db", db, "--baseline", "a", "--candidate", "b", "--json")
    js = json.loads(res.stdout)
    for side in js["sides"].values():
        assert side["clock_backwards"] == 1 and side["outputs"] == 3
        assert side["ttft_ms"]["count"] == 2 and side["ttft_ms"]["min"] > 0
    assert js["summary"]["identical_ratio"] == 1.0
    text = _cli("diff", "--db", db, "--baseline", "a", "--candidate", "b").output
    assert "(1 without timings: the capture clock went backwards)" in text
    assert "-1997" not in text


def test_sampled_out_run_is_counted_never_compared(tmp_path: Path) -> None:
    """The daemon's chain: Sampler before the writer. A run with every stream
    sampled out has no text to compare: the gate fails, verify says why."""
    from sniffer.record.sampling import Sampler
    from sniffer.reports.verify import verify_db

    class SamplingWriter(StoreWriter):
        def __init__(self, db: str, sampler: Sampler) -> None:
            super().__init__(db)
            self.sampler = sampler

        def write_many(self, events: Any) -> None:
            super().write_many(self.sampler.filter(list(events)))

    db = str(tmp_path / "sampled.db")
    exp = _replay_as("chat_english", db, "baseline")
    w = SamplingWriter(db, Sampler(0.0))
    _replay_as("chat_english", db, "sampled", writer=w)
    w.close()
    n = len(exp["streams"])
    res = _cli("diff", "--db", db, "--baseline", "baseline", "--candidate", "sampled", "--json",
               "--fail-if", "identical_ratio < 0.95")  # fmt: skip
    assert res.exit_code == 1, res.output
    js = json.loads(res.stdout)
    s = js["summary"]
    assert s["pairs"] == 0 and s["candidate_sampled_out"] == s["candidate_streams"] == n
    assert s["sampled_out_ratio"] == 0.5
    assert js["gates"][0]["reason"].startswith("no evidence")
    assert all(x["sampled_out"] for x in js["not_compared"]["candidate"])
    text = _cli("diff", "--db", db, "--baseline", "baseline", "--candidate", "sampled")
    assert f"text sampled out (--sample-rate), not compared: 0 baseline and {n}" in text.stdout
    st = stats(open_store(db), registry=REGISTRY, labels=["sampled"])
    assert st.groups == [] and st.summary["sampled_out_outputs"] == n
    report = verify_db(open_store(db), REGISTRY, label="sampled")
    assert report.ok and report.not_verifiable == n
    assert all(not v.verifiable for v in report.streams)
    assert report.to_dict()["verified"] == 0
    res = _cli("verify", "--db", db, "--label", "sampled")
    assert res.exit_code == 0 and f"{n} not verifiable (text sampled out)" in res.stdout
    # the kept run verifies, and says how its prompt tokens were counted
    kept = verify_db(open_store(db), REGISTRY, label="baseline")
    assert kept.not_verifiable == 0 and all(v.verifiable for v in kept.streams)
    assert {v.prompt_template for v in kept.streams} == {
        "no chat template in default:deepseek-v4: counted as 'role: content' lines"
    }


# ---------------------------------------------------------------------------
# End to end: two fixture servers, probe, dumpcap, replay, stats, diff
# ---------------------------------------------------------------------------

PERTURB = 5
E2E_PROMPTS = ["Tell me about rivers", "Write a poem about bread", "Why is the sky blue?"]
REPEAT = 3
#: Each deployment under its own served model name, as two deployments are.
#: ("fake-openai" and "fake-tpc3" make the fixture server generate the same
#: words as "fake": style and chunking switches are not part of its text hash.)
DENSE_MODEL, TWIN_MODEL, PRUNED_MODEL = "fake", "fake-openai", "fake-tpc3"


def _can_capture() -> bool:
    import os
    import shutil

    return shutil.which("dumpcap") is not None and os.geteuid() == 0


def _poll(cond: Any, what: str, polls: int = 400) -> None:
    import time

    for _ in range(polls):  # × 0.025 s: a bound only reached when the test fails
        if cond():
            return
        time.sleep(0.025)
    raise AssertionError(f"timed out waiting for {what}")


@dataclass
class Fork:
    """Where the perturbed server's answer leaves the dense one's, computed from
    the fixture server's own generator (independently of any capture)."""

    base_text: str
    pert_text: str
    char: int  # first differing character
    token: int  # index of the (re-tokenized) token holding it
    base_chunk: int  # served chunk (1-based) holding it: one piece per chunk
    pert_chunk: int  # three pieces per chunk


def _expected_fork(prompt: str, model: str = DENSE_MODEL) -> Fork:
    from tests.fixture_server.app import Options, make_plan

    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "stream": True}
    body["temperature"] = 0.0
    base = make_plan(body, True, Options()).choices[0].content
    pert = make_plan(body, True, Options(perturb_after=PERTURB)).choices[0].content
    assert base[:PERTURB] == pert[:PERTURB] and base[PERTURB] != pert[PERTURB]
    text, ptext = "".join(base), "".join(pert)
    char = next(i for i, (x, y) in enumerate(zip(text, ptext, strict=False)) if x != y)
    assert char >= len("".join(base[:PERTURB]))

    def chunk_of(pieces: list[str], per: int) -> int:
        ends = list(accumulate(len(p) for p in pieces))
        piece = next(i for i, end in enumerate(ends) if end > char)
        return piece // per + 1

    return Fork(text, ptext, char, char_to_token(text, char), chunk_of(base, 1), chunk_of(pert, 3))


def _check_stability_and_divergence(db: str, base: str = "baseline", cand: str = "sparse") -> None:
    """What the dense (deterministic) and the perturbed server must show: the
    pairs found across two model names, every fork placed exactly."""
    engine = open_store(db)
    st = stats(engine, registry=REGISTRY)
    assert st.summary["labels"][base] == {
        "groups": len(E2E_PROMPTS),
        "deterministic_groups": len(E2E_PROMPTS),
        "deterministic_ratio": 1.0,
        "outputs": len(E2E_PROMPTS) * REPEAT,
    }
    assert st.summary["labels"][cand]["deterministic_ratio"] == 1.0

    rep = diff(engine, base, cand, registry=REGISTRY)
    assert rep.summary["prompts"] == len(E2E_PROMPTS)
    assert rep.summary["pairs"] == len(E2E_PROMPTS) * REPEAT  # repeat j with repeat j
    assert rep.summary["identical_pairs"] == 0
    assert rep.summary["unmatched_ratio"] == 0.0 and rep.summary["incomplete_ratio"] == 0.0
    assert rep.summary["first_divergence_unit"].startswith("token index in ids re-tokenized")
    by_prompt = {p.prompt: p for p in rep.prompts}
    forks = []
    for prompt in E2E_PROMPTS:
        want = _expected_fork(prompt)
        pr = by_prompt[f"user: {prompt}"]
        assert (pr.model, pr.candidate_model) == (DENSE_MODEL, PRUNED_MODEL)
        assert pr.baseline_text == want.base_text and pr.candidate_text == want.pert_text
        assert pr.first_divergence == want.token and pr.first_divergence_char == want.char
        assert pr.fork_context is not None
        assert pr.fork_context["baseline_after"] == want.base_text[want.char :][:120]
        assert pr.fork_context["candidate_after"] == want.pert_text[want.char :][:120]
        pairs = [p for p in rep.pairs if p.key == pr.key]
        assert len(pairs) == REPEAT
        assert {p.first_divergence for p in pairs} == {want.token}
        assert {p.common_prefix for p in pairs} == {want.token}
        assert {p.first_divergence_char for p in pairs} == {want.char}
        assert {p.first_divergence_chunk_baseline for p in pairs} == {want.base_chunk}
        assert {p.first_divergence_chunk_candidate for p in pairs} == {want.pert_chunk}
        assert {p.token_unit for p in pairs} == {"retokenized"}
        forks.append(want.token)
    assert rep.summary["median_first_divergence"] == sorted(forks)[1]
    # three tokens per chunk on the candidate side
    assert rep.summary["candidate_tokens_per_chunk_mean"] > 2.0
    assert rep.summary["baseline_tokens_per_chunk_mean"] < 1.5
    # the served model names differ: with --match-model nothing pairs
    strict = diff(engine, base, cand, registry=REGISTRY, match_model=True)
    assert strict.summary["pairs"] == 0
    assert strict.summary["unmatched_baseline_prompts"] == len(E2E_PROMPTS)
    assert strict.summary["unmatched_candidate_prompts"] == len(E2E_PROMPTS)


def _drop_server_segments(src: Path, dst: Path, port: int, every: int) -> int:
    """Copy a capture, leaving out every ``every``-th server→client data segment
    of ``port`` (per connection): real bytes, really lost. Returns the count."""
    from scapy.layers.inet import TCP
    from scapy.utils import rdpcap, wrpcap

    kept = []
    seen: dict[int, int] = {}
    dropped = 0
    for pkt in rdpcap(str(src)):
        if TCP in pkt and pkt[TCP].sport == port and len(bytes(pkt[TCP].payload)) > 0:
            n = seen[pkt[TCP].dport] = seen.get(pkt[TCP].dport, 0) + 1
            if n % every == 0:
                dropped += 1
                continue
        kept.append(pkt)
    wrpcap(str(dst), kept)
    return dropped


def _diff_cli(db: str, *args: str) -> Any:
    from click.testing import CliRunner

    from sniffer.cli import main

    return CliRunner().invoke(main, ["diff", "--db", db, *args])


@pytest.mark.root
@pytest.mark.skipif(not _can_capture(), reason="needs root and dumpcap to record loopback")
def test_end_to_end_probe_replay_stats_diff(tmp_path: Path) -> None:
    """Three real servers on loopback, each under its own model name: a dense
    one, an identical twin and a perturbed ("pruned") copy; probe, dumpcap,
    replay with three labels; then the gates a rollout would use."""
    import signal
    import subprocess
    import time

    from click.testing import CliRunner

    from sniffer.cli import main
    from tests.dumpcap import wait_written_after
    from tests.fixture_server import free_port, start_server_process, wait_ready

    port_a = free_port()
    port_b = free_port(lo=19000, hi=19499)
    port_c = free_port(lo=19500, hi=19999)
    servers = [
        start_server_process(port_a),
        start_server_process(port_b),
        start_server_process(port_c, "--perturb-after", str(PERTURB), "--tokens-per-chunk", "3"),
    ]
    pcap = tmp_path / "probe.pcap"
    dumpcap: subprocess.Popen[bytes] | None = None
    try:
        for port in (port_a, port_b, port_c):
            wait_ready(port)
        dumpcap = subprocess.Popen(
            [
                "dumpcap", "-q", "-P", "-i", "lo", "-f",
                f"tcp port {port_a} or tcp port {port_b} or tcp port {port_c}",
                "-w", str(pcap),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _poll(lambda: pcap.exists() and pcap.stat().st_size >= 24, "the pcap header")

        def poke_until_captured(port: int) -> None:
            """Everything sent so far is in the file: a /health exchange (packets
            dumpcap must see) until it wrote one captured after this call."""
            since = time.time()
            wait_written_after(pcap, since, lambda: wait_ready(port), "dumpcap to record")

        poke_until_captured(port_a)  # capture is live
        prompts = tmp_path / "prompts.txt"
        prompts.write_text("\n".join(E2E_PROMPTS) + "\n", encoding="utf-8")
        runner = CliRunner()
        for port, model in ((port_a, DENSE_MODEL), (port_b, TWIN_MODEL), (port_c, PRUNED_MODEL)):
            res = runner.invoke(
                main,
                [
                    "probe", str(prompts), "--url", f"http://127.0.0.1:{port}",
                    "--model", model, "--repeat", str(REPEAT), "-c", "4",
                    "--timeout", "20", "--deadline", "60", "--json",
                ],
            )  # fmt: skip
            assert res.exit_code == 0, res.output
            probed = json.loads(res.output)
            assert probed["ok"] == len(E2E_PROMPTS) * REPEAT
            assert probed["deterministic_ratio"] == 1.0
        poke_until_captured(port_c)  # everything before is on disk
    finally:
        if dumpcap is not None:
            dumpcap.send_signal(signal.SIGINT)
            dumpcap.wait(timeout=10)
        for s in servers:
            s.terminate()
            s.wait(timeout=10)

    db = str(tmp_path / "e2e.db")
    res = CliRunner().invoke(
        main,
        [
            "replay", str(pcap), "--db", db, "-q", "--label", f"{port_a}=dense",
            "--label", f"{port_b}=twin", "--label", f"{port_c}=pruned",
        ],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    _check_stability_and_divergence(db, "dense", "pruned")

    # the identical twin passes the gate, across two model names
    gate = "identical_ratio < 0.95"
    res = _diff_cli(db, "--baseline", "dense", "--candidate", "twin", "--fail-if", gate, "--json")
    assert res.exit_code == 0, res.output
    js = json.loads(res.stdout)
    assert js["summary"]["pairs"] == len(E2E_PROMPTS) * REPEAT
    assert js["summary"]["identical_ratio"] == 1.0 and js["verdict"]["passed"] is True

    # the pruned copy fails it, and the report says where it forked
    html_path = tmp_path / "report.html"
    res = _diff_cli(
        db, "--baseline", "dense", "--candidate", "pruned", "--fail-if", gate,
        "--html", str(html_path), "--spans",
    )  # fmt: skip
    assert res.exit_code == 1, res.output
    assert "gate identical_ratio < 0.95: FAIL" in res.output
    assert "verdict: FAIL (1 of 1 gates failed)" in res.output
    assert "differing spans" in res.output
    page = html_path.read_text(encoding="utf-8")
    assert page.count("<svg") >= 4 and "<script" not in page and "http://" not in page
    assert page.index("FAIL — 1 of 1 gates failed") < page.index("Where they fork")
    fork = _expected_fork(E2E_PROMPTS[0])
    mark = html.escape(fork.base_text[fork.char])
    assert f"<mark>{mark}</mark>" in page
    assert "Time to first token (ms)" in page and ">outputs</text>" in page

    res = _diff_cli(
        db, "--baseline", "dense", "--candidate", "pruned", "--json",
        "--fail-if", "median_first_divergence < 1", "--pairing", "modal",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    js = json.loads(res.stdout)
    assert js["summary"]["pairs"] == len(E2E_PROMPTS)
    forks = sorted(_expected_fork(p).token for p in E2E_PROMPTS)
    assert js["gates"] == [
        {
            "gate": "median_first_divergence < 1",
            "actual": forks[1],
            "failed": False,
            "reason": f"median_first_divergence = {forks[1]}, not < 1",
        }
    ]
    # --match-model: the names differ, nothing pairs, and that is no pass
    res = _diff_cli(db, "--baseline", "dense", "--candidate", "pruned", "--fail-if", gate,
                    "--match-model")  # fmt: skip
    assert res.exit_code == 1 and "no evidence: no pair compared" in res.output
    # an empty candidate (a label nothing was recorded under) is no pass either
    res = _diff_cli(db, "--baseline", "dense", "--candidate", "prunned", "--fail-if", gate)
    assert res.exit_code == 1 and "no evidence" in res.output
    assert "no stream is labelled 'prunned'" in res.output

    # a candidate whose streams all have gaps: counted, not compared, no pass
    lossy = tmp_path / "lossy.pcap"
    assert _drop_server_segments(pcap, lossy, port_c, every=4) > 0
    res = CliRunner().invoke(
        main, ["replay", str(lossy), "--db", db, "-q", "--port", str(port_c),
               "--label", f"{port_c}=gappy"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    res = _diff_cli(db, "--baseline", "dense", "--candidate", "gappy", "--fail-if", gate, "--json")
    assert res.exit_code == 1, res.output
    js = json.loads(res.stdout)
    s = js["summary"]
    assert s["candidate_streams"] > 0 and s["candidate_incomplete"] == s["candidate_streams"]
    assert s["pairs"] == 0 and s["incomplete_ratio"] > 0
    assert js["gates"][0]["reason"].startswith("no evidence")
    assert {x["state"] for x in js["not_compared"]["candidate"]} <= {"gap", "truncated", "error"}
    # the prompts are there on both sides; the candidate's outputs were left out
    assert {u["other_side_not_compared"] for u in js["unmatched"]["baseline"]} == {REPEAT}
    res = _diff_cli(db, "--baseline", "dense", "--candidate", "gappy", "--fail-if",
                    "incomplete_ratio > 0", "--include-incomplete")  # fmt: skip
    assert res.exit_code == 1 and "gate incomplete_ratio > 0: FAIL" in res.output

    res = CliRunner().invoke(main, ["stats", "--db", db, "--label", "dense"])
    assert res.exit_code == 0 and "3 fully deterministic (100.0%)" in res.output


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="live capture needs root (CAP_NET_RAW)")
def test_end_to_end_with_the_daemon_capturing_both_ports(tmp_path: Path) -> None:
    """The acceptance workflow live: `sparseety run` labels two ports, probe drives
    both servers (each under its own model name), then stats and diff pair them
    and find the perturbation's exact fork, and the gate fails."""
    import signal
    import subprocess
    import sys

    from click.testing import CliRunner

    from sniffer.cli import main
    from tests.fixture_server import free_port, start_server_process, wait_ready

    port_a = free_port()
    port_b = free_port(lo=19000, hi=19499)
    db = str(tmp_path / "live.db")
    log = tmp_path / "daemon.log"
    procs = [
        start_server_process(port_a),
        start_server_process(port_b, "--perturb-after", str(PERTURB), "--tokens-per-chunk", "3"),
    ]
    root = Path(__file__).resolve().parent.parent
    try:
        wait_ready(port_a)
        wait_ready(port_b)
        with open(log, "wb") as fh:
            daemon = subprocess.Popen(
                [
                    sys.executable, "-m", "sniffer.cli", "run", "--db", db, "--no-metrics",
                    "--flush-interval", "0.2", "--label", f"{port_a}=baseline",
                    "--label", f"{port_b}=sparse",
                ],
                cwd=root,
                env={**os.environ, "PYTHONPATH": str(root)},
                stderr=fh,
            )  # fmt: skip
        procs.append(daemon)
        _poll(lambda: "capture-active" in log.read_text(errors="replace"), "capture to start")
        prompts = tmp_path / "prompts.txt"
        prompts.write_text("\n".join(E2E_PROMPTS) + "\n", encoding="utf-8")
        for port, model in ((port_a, DENSE_MODEL), (port_b, PRUNED_MODEL)):
            res = CliRunner().invoke(
                main,
                [
                    "probe", str(prompts), "--url", f"http://127.0.0.1:{port}",
                    "--model", model, "--repeat", str(REPEAT), "-c", "4",
                    "--timeout", "20", "--deadline", "60",
                ],
            )  # fmt: skip
            assert res.exit_code == 0, res.output
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0, log.read_text(errors="replace")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)
    _check_stability_and_divergence(db)
    res = _diff_cli(db, "--baseline", "baseline", "--candidate", "sparse",
                    "--fail-if", "identical_ratio < 0.95")  # fmt: skip
    assert res.exit_code == 1 and "verdict: FAIL" in res.output


# ------------------------------------------- SQLite through the stdlib driver

#: Fixtures replayed into the comparison database: several dialects (whole-message
#: ones too), n > 1, server tokens (TGI), logprobs, errors, cut and mid-way streams.
STDLIB_FIXTURES = (
    "chat_english",
    "chat_cjk",
    "n2",
    "include_usage",
    "dialect_responses_stream",
    "dialect_anthropic_stream",
    "dialect_tgi_stream",
    "dialect_ollama_stream",
    "error_midstream",
    "client_abort",
    "keepalive_3",
    "fffd",
)


@pytest.fixture(scope="module")
def replayed_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Every fixture twice under label ``a`` (repeats: groups to compare) and once
    under ``b`` (a singleton each); one extra stream with a different text."""
    db = str(tmp_path_factory.mktemp("stdlib") / "r.db")
    for name in STDLIB_FIXTURES:
        for label in ("a", "a", "b"):
            _replay_as(name, db, label)
    extra = Db(Path(db))
    extra.next_id = 10_000
    extra.stream("a", "p1", A)
    extra.stream("a", "p1", B)
    extra.close()
    return db


def test_stats_through_the_stdlib_driver_is_the_same(replayed_db: str) -> None:
    """``stats`` reads a SQLite file at head without SQLAlchemy (``open_store``):
    outputs, report, text and JSON are what the engine gives, whatever the filters."""
    from sniffer.reports.stats import count_midway
    from sniffer.store.lite import SqliteFile
    from sniffer.store.writer import open_store

    store = open_store(replayed_db)
    assert isinstance(store, SqliteFile)
    engine = EngineStore(make_engine(replayed_db), owned=True)
    cases: list[dict[str, Any]] = [
        {},
        {"include_incomplete": True},
        {"labels": ["a"]},
        {"labels": ["b", "zz"], "include_incomplete": True},
        {"labels": []},
        {"model": "fake"},
        {"node": "nope"},
    ]
    try:
        for kw in cases:
            outs = load_outputs(store, registry=REGISTRY, **kw)
            assert outs == load_outputs(engine, registry=REGISTRY, **kw), kw
            a, b = stats(store, registry=REGISTRY, **kw), stats(engine, registry=REGISTRY, **kw)
            assert stats_json(a) == stats_json(b), kw
            assert format_stats(a) == format_stats(b), kw
            if "node" not in kw:
                assert count_midway(store, labels=kw.get("labels"), model=kw.get("model")) == (
                    count_midway(engine, labels=kw.get("labels"), model=kw.get("model"))
                )
        report = stats(store, registry=REGISTRY, include_incomplete=True)
        assert report.groups and not all(g.deterministic for g in report.groups)
        assert any(o.server_ids for o in load_outputs(store, registry=REGISTRY))
        assert report.summary["midway_left_out"] == count_midway(engine)
    finally:
        store.close()
        engine.close()


def test_stats_encodes_only_the_outputs_it_compares(replayed_db: str, tmp_path: Path) -> None:
    """``stats`` tokenizes only outputs that share their fingerprint (repeats_only):
    the report is the one of encoding everything, and a store without repeats is
    reported without loading the built-in default tokenizer."""
    from sniffer.reports.stats import compute_stats

    engine = EngineStore(make_engine(replayed_db), owned=True)
    for kw in ({}, {"include_incomplete": True}, {"labels": ["b"]}):
        everything = compute_stats(load_outputs(engine, registry=REGISTRY, **kw))
        everything.summary["midway_left_out"] = stats(engine, registry=REGISTRY, **kw).summary[
            "midway_left_out"
        ]
        assert stats_json(stats(engine, registry=REGISTRY, **kw)) == stats_json(everything)
    engine.close()

    db = Db(tmp_path / "single.db")
    db.stream("a", "p1", A)
    db.stream("a", "p2", B)
    fresh = TokenizerRegistry()
    report = stats(open_store(db.close()), registry=fresh)
    assert report.singletons == 2 and not report.groups
    assert fresh._loaded == {}  # nothing to compare: no tokenizer loaded
