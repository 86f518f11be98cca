"""stats and diff over recorded streams (sniffer.reports.stats / .diff).

Unit part: streams written through StoreWriter with known chunk texts and
capture times. End-to-end part (root: dumpcap): two fixture servers, probe,
replay with two labels, then stats and diff.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from sniffer.events import ChunkEvent, StreamClosed, StreamOpened, StreamResponse, StreamState
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
from sniffer.store.writer import StoreWriter, make_engine
from sniffer.tokens import TokenizerRegistry

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
                request={k: v for k, v in body.items() if k != "messages"} | {"prompt_len": 1},
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
    engine = make_engine(db.close())
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
    engine = make_engine(db.close())
    rep = diff(engine, "baseline", "sparse", registry=REGISTRY)
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
    assert [r.failed for r in res] == [True, False, False, True]
    assert res[2].actual is None


def test_bad_rows_do_not_raise(db: Db) -> None:
    db.stream("baseline", "p", [])
    db.stream("baseline", "p", [])
    engine = make_engine(db.close())
    outs = load_outputs(engine, registry=REGISTRY)
    assert [o.text for o in outs] == ["", ""] and outs[0].finish_reason == "stop"
    assert outs[0].ttft is None and outs[0].itl is None
    rep = compute_stats(outs)
    assert rep.groups[0].deterministic
    empty = compute_diff(outs, "baseline", "nobody")
    assert empty.summary["pairs"] == 0 and empty.summary["identical_ratio"] is None
    with pytest.raises(ValueError):
        compute_diff(outs, "a", "b", pairing="best")
