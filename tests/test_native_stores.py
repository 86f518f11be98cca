"""Both cores write byte-identical stores: every bundled capture (``pcaps/``
and its subfolders: faults, security, HTTP/2, llama.cpp; the peer corpus
under ``tests/data/peer-pcaps``) replayed in-process into SQLite, once with
every stage pure (``PipelineConfig(native=False)``) and once with every
stage native (``native=True``: fused reassembly and HTTP/1.1, SSE/NDJSON),
then the two databases compared as SQL dumps (every table, every row), and
the replay summaries (counters) alike.

Needs the extension: skipped without it, a failure in CI (``native`` marker).
"""

from __future__ import annotations

import functools
import sqlite3
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

import sniffer.runtime.replay as replay_mod
from sniffer.core import native
from sniffer.core.pipeline import PipelineConfig
from sniffer.record.chain import RecordingChain, RecordingOptions

pytestmark = [
    pytest.mark.native,
    pytest.mark.skipif(native.why_unavailable() is not None, reason=str(native.why_unavailable())),
]

ROOT = Path(__file__).resolve().parent.parent
SUFFIXES = (".pcap", ".pcapng", ".gz")
CAPTURES = sorted(
    p
    for base in (ROOT / "pcaps", ROOT / "tests" / "data" / "peer-pcaps")
    for p in base.rglob("*")
    if p.is_file() and p.suffix in SUFFIXES
)


def test_every_bundled_capture_is_replayed() -> None:
    under = {p.relative_to(ROOT).parts[1] for p in CAPTURES if p.parts[-2] != "pcaps"}
    assert {"faults", "h2", "llamacpp"} <= under
    assert any("peer-pcaps" in p.parts for p in CAPTURES)
    assert sum(1 for p in CAPTURES if p.relative_to(ROOT).parts[0] == "pcaps") == sum(
        1 for p in (ROOT / "pcaps").rglob("*.pcap")
    )
    assert len(CAPTURES) >= 100, len(CAPTURES)


def _replay(path: Path, db: Path, is_native: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``sniffer replay`` of ``path`` into ``db`` with one core; the summary."""
    with monkeypatch.context() as m:
        m.setattr(replay_mod, "PipelineConfig", functools.partial(PipelineConfig, native=is_native))
        chain = RecordingChain.from_config(RecordingOptions(tokens=False))
        result = replay_mod.replay(path, str(db), chain=chain, node="test")
    summary = asdict(result)
    for k in ("seconds", "path"):
        summary.pop(k, None)
    return summary


def _dump(db: Path) -> list[str]:
    con = sqlite3.connect(db)
    try:
        return list(con.iterdump())
    finally:
        con.close()


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: str(p.relative_to(ROOT)))
def test_both_cores_store_the_same(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pure = _replay(path, tmp_path / "pure.db", False, monkeypatch)
    nat = _replay(path, tmp_path / "native.db", True, monkeypatch)
    a, b = _dump(tmp_path / "pure.db"), _dump(tmp_path / "native.db")
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        assert x == y, f"statement {i} differs"
    assert len(a) == len(b)
    assert pure == nat
