"""Cause classes on the real llama-cpp-python captures (pcaps/llamacpp/).

llama-cpp-python applies repeat_penalty 1.1 (and top-k/top-p/min-p) at
temperature 0, so the token it streams is not always the top-1 of the raw
``top_logprobs`` it streams with it. The count of such tokens is taken here from
the captured bytes by tshark (TCP payloads, de-chunked and read as SSE by this
file, not by the sniffer) and held against ``sampler_adjusted``; a fork at one
of those positions is ``sampler_adjusted`` (source ``sampler_evidence``), not
``substantive``; a fork where the server did follow its raw logprobs stays
``substantive``. ``diff`` over the real pairs names the source of every cause.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sniffer.cli import main
from sniffer.llm.logprobs import token_starts
from sniffer.reports.causes import SAMPLER_TOLERANCE, classify, sampler_adjusted
from sniffer.reports.stats import Output, load_outputs
from sniffer.runtime.replay import replay
from sniffer.store.writer import open_store

LLAMACPP = Path(__file__).resolve().parent.parent / "pcaps" / "llamacpp"
REAL = sorted(LLAMACPP.glob("llamacpp_*.pcap"))
MARGIN = 0.5

needs_tshark = pytest.mark.skipif(shutil.which("tshark") is None, reason="needs tshark")


def _server_bytes(pcap: Path, stream: int) -> bytes:
    """What the server sent on one TCP stream, as tshark reassembles it."""
    res = subprocess.run(
        ["tshark", "-r", str(pcap), "-q", "-z", f"follow,tcp,raw,{stream}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # the server's side is the tab-indented half of tshark's raw follow output
    return b"".join(bytes.fromhex(x.strip()) for x in res.stdout.splitlines() if x[:1] == "\t")


def _dechunk(raw: bytes) -> bytes:
    _, _, body = raw.partition(b"\r\n\r\n")
    out = bytearray()
    while body:
        size, sep, rest = body.partition(b"\r\n")
        if not sep or int(size, 16) == 0:
            break
        n = int(size, 16)
        out += rest[:n]
        body = rest[n + 2 :]
    return bytes(out)


def _tshark_tokens(pcap: Path) -> list[list[dict[str, Any]]]:
    """Per response with logprobs: the ``logprobs.content`` items, in order."""
    streams = []
    for i in range(
        len(json.loads((LLAMACPP / f"{pcap.stem}.expected.json").read_text())["streams"])
    ):
        items: list[dict[str, Any]] = []
        for line in _dechunk(_server_bytes(pcap, i)).decode("utf-8").split("\n"):
            if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                continue
            for choice in json.loads(line[6:]).get("choices") or []:
                items.extend((choice.get("logprobs") or {}).get("content") or [])
        if items:
            streams.append(items)
    return streams


@pytest.fixture(scope="module")
def real_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Output]]:
    root = tmp_path_factory.mktemp("llamacpp-causes")
    out: dict[str, list[Output]] = {}
    for pcap in REAL:
        db = str(root / f"{pcap.stem}.db")
        replay(pcap, db)
        out[pcap.stem] = load_outputs(open_store(db), repeats_only=True)
    return out


@needs_tshark
def test_adjusted_sampler_positions_match_the_captured_bytes(
    real_outputs: dict[str, list[Output]],
) -> None:
    total = adjusted = 0
    for pcap in REAL:
        want = _tshark_tokens(pcap)
        assert len(want) == 2  # two streams asked for logprobs
        mine = [o for o in real_outputs[pcap.stem] if o.logprobs is not None]
        assert sorted(len(o.logprobs or ()) for o in mine) == sorted(len(w) for w in want)
        n_want = sum(
            1
            for items in want
            for t in items
            if any(a["logprob"] > t["logprob"] + SAMPLER_TOLERANCE for a in t["top_logprobs"])
        )
        assert sum(sampler_adjusted(o.logprobs) for o in mine) == n_want, pcap.stem
        total += sum(len(w) for w in want)
        adjusted += n_want
    # the bundled captures: 13 of their 288 logprob tokens were not the raw top-1
    assert (adjusted, total) == (13, 288)


def _diverted(o: Output, at: int, token: str) -> Output:
    """``o`` up to its token ``at``, then ``token`` (text only, no logprobs): a
    server that took ``token`` there."""
    start = token_starts(o.logprobs or ())[at]
    return dataclasses.replace(
        o, text=o.text[:start] + token, logprobs=None, server_ids=None, ids=(), stream_id=-1
    )


def test_a_fork_where_the_sampler_chose_against_its_raw_logprobs_is_not_substantive(
    real_outputs: dict[str, list[Output]],
) -> None:
    """Every real position where the streamed token is more than the margin below the
    raw top-1: a candidate that took the raw top-1 there (what plain greedy
    decoding on those logprobs does) forks ``sampler_adjusted``, never
    ``substantive``; at a position the server took its raw top-1, a candidate
    taking an alternative more than the margin below is ``substantive``."""
    seen = control = 0
    for outputs in real_outputs.values():
        for o in outputs:
            for i, t in enumerate(o.logprobs or ()):
                assert t.logprob is not None
                top = max(t.top, key=lambda a: a.logprob)
                related = top.text.startswith(t.text) or t.text.startswith(top.text)
                if top.logprob > t.logprob + MARGIN and not related:  # a fork, not a stop
                    why = classify(o, _diverted(o, i, top.text), margin=MARGIN)
                    assert why.cause == "sampler_adjusted", (i, t.text, top.text, why)
                    assert why.source == "sampler_evidence"
                    assert why.evidence["chose_against_raw_logprobs"] == ["reference"]
                    assert why.evidence["reference_view"]["gap"] < -MARGIN
                    seen += 1
                elif top.key == t.key and control < 5:
                    far = [
                        a
                        for a in t.top
                        if a.logprob < t.logprob - MARGIN
                        and a.text
                        and not a.text.startswith(t.text)
                        and not t.text.startswith(a.text)
                    ]
                    if not far:
                        continue
                    why = classify(o, _diverted(o, i, far[0].text), margin=MARGIN)
                    assert why.cause == "substantive", (i, why)
                    assert why.source == "server_logprobs"
                    control += 1
    assert seen == 8  # of the 13 positions, those more than 0.5 nats off (and a fork)
    assert control >= 1


def _tshark_not_top1(stem: str) -> tuple[int, int]:
    """(logprob tokens, of which not the raw top-1) of a capture, from tshark."""
    items = [t for s in _tshark_tokens(LLAMACPP / f"{stem}.pcap") for t in s]
    bad = [
        t
        for t in items
        if any(a["logprob"] > t["logprob"] + SAMPLER_TOLERANCE for a in t["top_logprobs"])
    ]
    return len(items), len(bad)


@needs_tshark
def test_diff_over_the_real_pairs_names_every_source(tmp_path: Path) -> None:
    """``diff`` over the real pairs: every cause's source, and each side's sampler
    (logprob tokens not the top-1 of their own raw logprobs) as tshark counts it."""
    db = str(tmp_path / "ll.db")
    labels = {"llamacpp_plain": "plain", "llamacpp_kvq8": "kvq8", "llamacpp_spec": "spec"}
    for pcap in REAL:
        port = json.loads((LLAMACPP / f"{pcap.stem}.expected.json").read_text())["server_port"]
        res = CliRunner().invoke(
            main,
            ["replay", str(pcap), "--db", db, "-q", "--no-redact",
             "--label", f"{port}={labels[pcap.stem]}"],
        )  # fmt: skip
        assert res.exit_code == 0, res.output
    for cand in ("kvq8", "spec"):
        res = CliRunner().invoke(
            main, ["diff", "--db", db, "--baseline", "plain", "--candidate", cand, "--json"]
        )
        assert res.exit_code == 0, res.output
        js = json.loads(res.stdout)
        got = sorted((p["cause"], p["cause_source"]) for p in js["pairs"] if p["cause"])
        # the pair with logprobs forks at a near tie (0.009 nats apart in the plain
        # server's view); the one without has no evidence
        assert got == [("near_tie", "server_logprobs"), ("unknown", None)], got
        assert js["summary"]["cause_sources"]["server_logprobs"] == 1
        for side, stem in (("baseline", "llamacpp_plain"), ("candidate", f"llamacpp_{cand}")):
            n, bad = _tshark_not_top1(stem)
            assert js["sides"][side]["sampler"] == {
                "logprob_tokens": n, "not_top1_tokens": bad, "adjusted": bad > 0,
            }  # fmt: skip
    text = (
        CliRunner()
        .invoke(main, ["diff", "--db", db, "--baseline", "plain", "--candidate", "spec"])
        .stdout
    )
    assert "baseline  plain: sampler adjusted: 1 of 96 logprob tokens not the top-1" in text
    assert "candidate spec: sampler adjusted: 6 of 96 logprob tokens" in text
