"""Every capture in pcaps/ replays, through the real pipeline into a real SQLite
file, to the result its ``.expected.json`` states (ground truth from the client
that made the traffic, see pcaps/README.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sniffer.replay import replay
from sniffer.store.queries import count_rows, get_stream, list_streams
from sniffer.store.writer import make_engine

PCAPS = Path(__file__).resolve().parent.parent / "pcaps"
# The recordings in pcaps/ and the crafted faults in pcaps/faults/.
FIXTURES = sorted(
    (p for p in PCAPS.rglob("*.pcap") if p.with_suffix(".expected.json").exists()),
    key=lambda p: p.stem,
)


def _expected(pcap: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(pcap.with_suffix(".expected.json").read_text())
    return data


def test_there_are_fixtures() -> None:
    assert len(FIXTURES) >= 20


@pytest.mark.parametrize("pcap", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_fixture_replays_to_expected(pcap: Path, tmp_path: Path) -> None:
    exp = _expected(pcap)
    db = str(tmp_path / "f.db")
    result = replay(pcap, db)
    engine = make_engine(db)
    rows = list_streams(engine)
    by_port: dict[int, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (r["connection_id"], r["exchange"])):
        by_port.setdefault(int(r["client"].rsplit(":", 1)[1]), []).append(r)
    for want in sorted(exp["streams"], key=lambda w: (w["client_port"], w["exchange"])):
        # Exchanges of one connection in order; a capture that began mid-connection
        # has not seen (and so not numbered) the first ones.
        key = (want["client_port"], want["exchange"])
        where = f"{pcap.name} {key}"
        candidates = by_port.get(want["client_port"], [])
        while candidates and (
            candidates[0]["method"] != want["method"]
            or candidates[0]["path"] != want["path"]
            or (want.get("model") is not None and candidates[0]["model"] != want["model"])
        ):
            candidates.pop(0)
        assert candidates, f"{where}: no stream like {want['method']} {want['path']}"
        got = candidates.pop(0)
        if want.get("status") is not None:
            assert got["status"] == want["status"], where
        accept = want.get("accept_states") or [want["state"]]
        assert got["state"] in accept, (where, got["reason"])
        if want.get("gap") is not None:
            assert bool(got["gap"]) == want["gap"], where
        if want.get("done_seen") is not None:
            assert bool(got["done_seen"]) == want["done_seen"], where
        detail = get_stream(engine, got["id"])
        assert detail is not None
        texts: dict[int, str] = {}
        chunks: dict[int, int] = {}
        for c in detail["chunks"]:
            if c["chunk_index"]:
                texts[c["choice"]] = texts.get(c["choice"], "") + (c["text"] or "")
                chunks[c["choice"]] = chunks.get(c["choice"], 0) + 1
        finishes = json.loads(got["finish_reasons"] or "{}")
        for choice, w in (want.get("choices") or {}).items():
            ci = int(choice)
            if want.get("check_text", True):
                assert texts.get(ci, "") == w["text"], (where, ci)
                if w.get("chunks") is not None:
                    assert chunks.get(ci, 0) == w["chunks"], (where, ci)
                if w.get("finish_reason") is not None:
                    assert finishes.get(str(ci)) == w["finish_reason"], (where, ci)
            elif w.get("text_prefix") is not None:
                assert texts.get(ci, "").startswith(w["text_prefix"]) or w[
                    "text_prefix"
                ].startswith(texts.get(ci, "")), (where, ci)
        usage = want.get("usage")
        if usage:
            assert got["prompt_tokens"] == usage.get("prompt_tokens"), where
            assert got["completion_tokens"] == usage.get("completion_tokens"), where
    extra = len(rows) - len(exp["streams"])
    assert extra <= exp.get("extra_streams_max", 0), [r["path"] for r in rows]
    assert count_rows(engine)["errors"] >= exp.get("errors_min", 0)
    if exp.get("capture_error"):
        assert result.capture_error is not None
