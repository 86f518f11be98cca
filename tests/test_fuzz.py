"""The fuzz campaign (``make fuzz``, scripts/fuzz.py), short: mutated captures
and HTTP/SSE/JSON streams through the recording chain crash nothing, hang
nothing, drop no connection and leave no stream open."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from fuzz import TOKENS, campaign, mutate  # noqa: E402


def test_mutate_keeps_the_capture_header_and_applies_ops() -> None:
    data = bytes(range(64))
    out = mutate(data, [("flip", 0.0, 0)], floor=24)
    assert out[:24] == data[:24] and out != data
    assert TOKENS[0] in mutate(data, [("insert", 0.5, 0)])
    assert len(mutate(data, [("truncate", 0.5, 0)])) < len(data)


def test_short_campaign_finds_nothing(tmp_path: Path) -> None:
    report = campaign(400, timeout=30.0, out=tmp_path, derandomize=True)
    assert report.cases == 400
    assert set(report.by_kind) == {
        "capture",
        "flows",
        "json",
        "upgrade",
        "caps",
        "overlaps",
        "ints",
    }
    assert not report.crashes, report.crashes
    assert report.hangs == 0


def test_every_upgrade_case_gives_the_rows_the_server_streamed() -> None:
    """Each upgrade position (0-3 HTTP/1.1 exchanges before, 0-2 streams after),
    preface side and variant, unmutated and cut at two offsets per write: the
    campaign's oracle holds (the texts per exchange, the h2c errors due)."""
    from fuzz import UPGRADE_VARIANTS, run_upgrade, upgrade_case

    seen = set()
    for seed in range(4 * 3 * 2 * len(UPGRADE_VARIANTS)):
        seen.add(upgrade_case(seed)[0])
        run_upgrade(seed, [], [0.31, 0.77], 1)
    assert seen == set(UPGRADE_VARIANTS)


def test_a_dropped_connection_counts_as_a_crash(monkeypatch: object) -> None:
    import pytest
    from fuzz import Crash, load_corpus, run_flows

    from sniffer.core.streams import StreamAssembler

    corpus = load_corpus(ROOT / "pcaps")

    def broken(self: StreamAssembler, ev: object, out: object = None) -> list[object]:
        raise RecursionError("injected")

    mp = pytest.MonkeyPatch()
    mp.setattr(StreamAssembler, "feed", broken)
    mp.setattr(StreamAssembler, "feed_into", broken)  # what the pipeline calls
    try:
        with pytest.raises(Crash, match="dropped a connection"):
            run_flows(corpus.flows[0], [])
    finally:
        mp.undo()


def test_the_overlap_oracle_sees_a_changed_copy_and_a_lost_flag() -> None:
    """The ``overlaps`` cases' oracle: the same bytes again store the same and
    flag nothing; a changed copy must be seen, flagged and recorded (here the
    flag is taken away: the case fails)."""
    import pytest
    from fuzz import Crash, load_corpus, run_overlaps

    from sniffer.core import streams

    corpus = load_corpus(ROOT / "pcaps")
    k = next(i for i, (_, dirty) in enumerate(corpus.baselines) if not dirty)
    segs, base = corpus.segments[k], corpus.baselines[k]
    run_overlaps(segs, base, [(0.5, 0.2, 0.5, False), (0.9, 0.0, 0.99, False)])
    run_overlaps(segs, base, [(0.5, 0.2, 0.5, True)])
    mp = pytest.MonkeyPatch()
    mp.setattr(streams, "ANOMALY_FLAGS", {})
    try:
        with pytest.raises(Crash, match="no errors row or no flag"):
            run_overlaps(segs, base, [(0.5, 0.2, 0.5, True)])
    finally:
        mp.undo()


def test_ints_cases_catch_an_integer_that_reaches_the_store_unchecked(
    tmp_path: Path, monkeypatch: object
) -> None:
    """The ``ints`` check fails a case whose integer got past a dialect's range
    (here the chat index check widened to 2^70): stored wider than its column."""
    import json

    import pytest
    from fuzz import Crash, IntStore, edge_ints, load_corpus

    import sniffer.llm.dialects.openai as openai

    corpus = load_corpus(ROOT / "pcaps")
    (x,) = [x for x in corpus.exchanges[:40] if x.path == "/v1/chat/completions"][:1]
    first = json.loads(x.items[0])
    assert "index" in first["choices"][0]
    edited = edge_ints(x.items[0], 0, every=True)
    assert edited != x.items[0]
    store = IntStore(str(tmp_path))
    try:
        items = [json.dumps({**first, "choices": [{**first["choices"][0], "index": 2**63}]})]
        store.run(x, items + x.items[1:], x.request)  # the range holds: nothing to report
        mp = pytest.MonkeyPatch()
        mp.setattr(openai, "INDEX_MAX", 2**70)
        try:
            with pytest.raises(Crash, match=r"refused|wider"):
                store.run(x, items + x.items[1:], x.request)
        finally:
            mp.undo()
    finally:
        store.close()


# ----------------------------------------------------------------- diff (issue #25)


def test_segments_reencoded_as_a_capture_read_back_the_same() -> None:
    """The ``diff`` cases' segment mutations are written as a capture file
    (Ethernet, IPv4 and IPv6, TCP): reading it back gives the same segments."""
    import tempfile

    from fuzz_diff import mutate_segments, pcap_of

    from sniffer.capture.pcap import read_capture

    for name in ("chat_english", "ipv6"):
        segs = list(read_capture(ROOT / "pcaps" / f"{name}.pcap"))
        with tempfile.NamedTemporaryFile(suffix=".pcap") as fh:
            fh.write(pcap_of(segs))
            fh.flush()
            back = list(read_capture(fh.name))
        assert [s._replace(ts=0.0) for s in back] == [s._replace(ts=0.0) for s in segs]
        assert all(abs(a.ts - b.ts) < 1e-6 for a, b in zip(back, segs, strict=True))
    data = [i for i, s in enumerate(segs) if s.payload]
    k = data[len(data) // 2]
    frac = (k + 0.5) / len(segs)
    assert mutate_segments(segs, [("drop", frac, 0)]) == segs[:k] + segs[k + 1 :]
    dup = mutate_segments(segs, [("duplicate", frac, 0)])
    assert dup[k + 1] == segs[k] and len(dup) == len(segs) + 1
    over = mutate_segments(segs, [("overlap-changed", frac, 1)])[k + 1]
    assert over.seq == segs[k].seq + 1 and over.payload != segs[k].payload[1:2]
    assert len(mutate_segments(segs, [("truncate", frac, 1)])[k].payload) == 1
    assert mutate_segments(segs, [("cut", frac, 0)]) == segs[:k]
    assert mutate_segments(segs, [("flags", frac, 2)])[k].flags == segs[k].flags ^ 0x04  # RST
    assert mutate_segments(segs, [("seq", frac, 0)])[k].seq == (segs[k].seq - 1) & 0xFFFFFFFF
    later = mutate_segments(segs, [("delay", frac, 2)])
    assert later[:k] == segs[:k] and later[k].ts == segs[k].ts + 400.0


def test_a_difference_between_two_stores_is_named_and_saved(tmp_path: Path) -> None:
    """The comparison of two workers' answers: the same capture stored twice
    gives none; one changed value is named by table, row and column, and the
    case is saved with both dumps."""
    from fuzz_diff import _Runner, first_difference, load_case, save

    runner = _Runner(str(tmp_path), tokens=False)
    case = ("pcap", (ROOT / "pcaps" / "chat_english.pcap").read_bytes())
    a, b = runner.run(case), runner.run(case)
    assert len(a["tables"]["chunks"]) > 10
    assert first_difference(a, b) is None
    rows = b["tables"]["chunks"]
    cols = rows[0].split("\t")
    cells = rows[3].split("\t")
    k = cols.index("text")
    cells[k] = repr("changed")
    rows[3] = "\t".join(cells)
    where = first_difference(a, b)
    assert where is not None and where.startswith("chunks row 3: text: ")
    name = save(tmp_path / "out", 0, case, [a, b], where)
    assert load_case(tmp_path / "out" / name) == case
    assert "'changed'" in (tmp_path / "out" / "diff-0.native.txt").read_text()
    b["summary"] = {**a["summary"], "streams": 7}
    b["tables"] = a["tables"]
    assert first_difference(a, b) == "summary: streams: 1 != 7"


@pytest.mark.parametrize("native_http", [False, True], ids=["default", "native-http"])
def test_short_differential_campaign_finds_no_difference(tmp_path: Path, native_http: bool) -> None:
    """A few dozen ``diff`` cases (fixed series): the pure and the native core
    store every one of them identically (``make fuzz-diff`` runs thousands);
    also with the native HTTP/1 parser in the native worker's pipelines."""
    from sniffer.core.native import why_unavailable

    if why_unavailable() is not None:
        pytest.skip(f"no native core: {why_unavailable()}")
    report = campaign(
        30, timeout=60.0, out=tmp_path, derandomize=True, kinds=("diff",), native_http=native_http
    )
    assert report.cases == 30
    assert {"diff-file", "diff-segments", "diff-flows"} <= set(report.by_kind)
    assert report.by_kind["diff cases that stored chunks"] > 0
    assert not report.crashes, (report.crashes, sorted(p.name for p in tmp_path.iterdir()))
