"""Parallel replay into a SQLite file: workers write part files merged at the end
(``sniffer.store.parts``), the work split by ``sniffer.runtime.replay.Shares``."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import sniffer.runtime.replay as replay_module
import sniffer.store.parts as parts_module
from sniffer.record.chain import RecordingChain, RecordingOptions
from sniffer.runtime.replay import replay
from sniffer.store import spec

ROOT = Path(__file__).resolve().parent.parent
PCAP = ROOT / "pcaps" / "concurrent_4.pcap"


def _dump(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every merged table's rows without the numbering: streams keyed by their
    (client, server, exchange), connections by their endpoints, the rows that
    name a stream by that key; sorted."""
    con = sqlite3.connect(db)
    try:
        skey = {
            r[0]: r[1:]
            for r in con.execute("SELECT id, client, server, exchange, t_request FROM streams")
        }
        ckey = {
            r[0]: r[1:]
            for r in con.execute(
                "SELECT id, client_ip, client_port, server_ip, server_port FROM connections"
            )
        }
        out: dict[str, list[tuple[Any, ...]]] = {}
        for table in parts_module.MERGED:
            cols = spec.TABLE_COLUMNS[table]
            got = []
            for row in con.execute(f"SELECT * FROM {table}"):
                values = dict(zip(cols, row, strict=True))
                if table in ("connections", "streams") or spec.TABLES[table].autoincrement:
                    values.pop("id")
                if "stream_id" in values:
                    values["stream_id"] = skey.get(values["stream_id"])
                if "connection_id" in values:
                    values["connection_id"] = ckey.get(values["connection_id"])
                got.append(tuple(repr(v) for v in values.values()))
            out[table] = sorted(got)
        return out
    finally:
        con.close()


def _chain() -> RecordingChain:
    return RecordingChain.from_config(RecordingOptions())


def test_every_table_is_merged_or_named_as_not_merged() -> None:
    assert set(parts_module.MERGED) | set(parts_module.NOT_MERGED) == set(spec.TABLES)
    assert not set(parts_module.MERGED) & set(parts_module.NOT_MERGED)


@pytest.mark.parametrize("db_form", ["path", "url"])
def test_parallel_replay_into_sqlite_stores_what_one_process_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_form: str
) -> None:
    one, two = tmp_path / "one" / "x.db", tmp_path / "two" / "x.db"
    one.parent.mkdir()
    two.parent.mkdir()
    r1 = replay(PCAP, str(one), chain=_chain(), jobs=1)
    merged: list[dict[str, int]] = []
    real_merge = parts_module.PartMerger.merge

    def spy(self: parts_module.PartMerger, part: str) -> dict[str, int]:
        assert os.path.exists(part)
        found = sqlite3.connect(two).execute("SELECT count(*) FROM streams").fetchone()[0]
        counts = real_merge(self, part)
        merged.append({**counts, "before": found})
        return counts

    monkeypatch.setattr(parts_module.PartMerger, "merge", spy)
    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "")  # restored after the test
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    target = str(two) if db_form == "path" else f"sqlite:///{two}"
    r2 = replay(PCAP, target, chain=_chain(), jobs=2)
    # the parent's pass encodes on one thread: the workers hold the other cores
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert (r2.jobs, r2.streams, r2.chunk_events, r2.tokens) == (
        2,
        r1.streams,
        r1.chunk_events,
        r1.tokens,
    )
    assert r1.tokens > 0
    # Worker 0 writes the database, worker 1 a part (half of the 4 connections);
    # the parent's token rows of each share are a file of their own, merged in
    # share order per kind: worker 1's part once both workers have written,
    # share 0's tokens before share 1's.
    assert len(merged) == 3
    part1 = next(m for m in merged if m["connections"])
    tokens0, tokens1 = (m for m in merged if m is not part1)
    assert (tokens0["streams"], tokens0["stream_tokens"], tokens0["chunks"]) == (0, 2, 0)
    assert part1["connections"] == 2 and part1["streams"] == 2
    assert part1["before"] == 2 and part1["chunks"] > 0 and part1["stream_tokens"] == 0
    assert (tokens1["streams"], tokens1["stream_tokens"], tokens1["chunks"]) == (0, 2, 0)
    assert _dump(two) == _dump(one)
    # the part directory is gone; the worker's ids came from the database's blocks
    assert sorted(p.name for p in two.parent.iterdir() if not p.name.startswith("x.db")) == []
    con = sqlite3.connect(two)
    try:
        next_ids = dict(con.execute("SELECT name, next_id FROM id_blocks"))
        assert con.execute("SELECT max(id) FROM streams").fetchone()[0] < next_ids["streams"]
        assert (
            con.execute("SELECT max(id) FROM connections").fetchone()[0] < next_ids["connections"]
        )
        orphans = con.execute(
            "SELECT count(*) FROM chunks WHERE stream_id NOT IN (SELECT id FROM streams)"
        ).fetchone()[0]
        assert orphans == 0
    finally:
        con.close()


def test_token_inputs_sent_one_stream_at_a_time_store_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers send each closed stream's token inputs to a token process as
    soon as it is ready (``SEND_EVERY`` 1: a batch per stream, in any order
    the two workers interleave): the parent takes share 0's, the second token
    process share 1's, and they store what one process stores."""
    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(replay_module, "SEND_EVERY", 1)
    batches: list[int] = []
    real = RecordingChain.tokenize_inputs

    def spy(self: RecordingChain, inputs: list[Any], **kw: Any) -> Any:
        batches.append(len(inputs))
        return real(self, inputs, **kw)

    monkeypatch.setattr(RecordingChain, "tokenize_inputs", spy)
    one, two = tmp_path / "one.db", tmp_path / "two.db"
    r1 = replay(PCAP, str(one), chain=_chain(), jobs=1)
    assert batches == [4]  # one process: one pass at the end
    batches.clear()
    r2 = replay(PCAP, str(two), chain=_chain(), jobs=2)
    assert sum(batches) == 2, batches  # here: share 0's two streams; share 1's in the helper
    assert (r2.tokens, r2.tokenized_streams) == (r1.tokens, r1.tokenized_streams)
    assert _dump(two) == _dump(one)


def test_truncated_capture_in_parallel_reports_its_error_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut = tmp_path / "cut.pcap"
    data = PCAP.read_bytes()
    cut.write_bytes(data[: len(data) - 37])
    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    r1 = replay(cut, str(tmp_path / "one.db"), chain=_chain(), jobs=1)
    r2 = replay(cut, str(tmp_path / "two.db"), chain=_chain(), jobs=2)
    assert r1.capture_error is not None and r2.capture_error == r1.capture_error
    assert r2.errors == r1.errors
    assert _dump(tmp_path / "two.db") == _dump(tmp_path / "one.db")


def test_a_failed_worker_leaves_no_part_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = replay_module._replay_part

    def failing(path: Any, w: Any, ports: Any, labels: Any, progress: Any, k: int, *a: Any) -> Any:
        if k == 1:
            raise OSError("disk gone")
        return real(path, w, ports, labels, progress, k, *a)

    monkeypatch.setattr(replay_module, "_replay_part", failing)
    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    db = tmp_path / "x.db"
    with pytest.raises(RuntimeError, match=r"replay worker .* failed: OSError: disk gone"):
        replay(PCAP, str(db), chain=_chain(), jobs=2)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("x.db")) == []


def test_a_worker_that_dies_without_a_word_fails_the_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed (or ending) without sending its result is found out by
    its exit once no message comes: the replay fails, nothing waits forever."""
    real = replay_module._replay_part

    def dying(path: Any, w: Any, ports: Any, labels: Any, progress: Any, k: int, *a: Any) -> Any:
        if k == 1:
            os._exit(0)  # not even an exit code to go by
        return real(path, w, ports, labels, progress, k, *a)

    monkeypatch.setattr(replay_module, "_replay_part", dying)
    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(replay_module, "_POLL", 0.05)
    db = tmp_path / "x.db"
    with pytest.raises(RuntimeError, match=r"replay worker .* failed: exit code 0"):
        replay(PCAP, str(db), chain=_chain(), jobs=2)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("x.db")) == []


def test_part_dir_only_for_sqlite_files(tmp_path: Path) -> None:
    assert parts_module.part_dir("postgresql+psycopg://u@h/db") is None
    assert parts_module.part_dir("sqlite://") is None
    assert parts_module.part_dir(":memory:") is None
    made = parts_module.part_dir(str(tmp_path / "x.db"))
    assert made is not None and os.path.dirname(made) == str(tmp_path)
    assert os.stat(made).st_mode & 0o777 == 0o700
    parts_module.remove_parts(made)
    assert not os.path.exists(made)


def test_no_part_dir_means_the_workers_write_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no part directory can be made, the workers write the database itself."""
    monkeypatch.setattr(parts_module.tempfile, "mkdtemp", _refuse)
    assert parts_module.part_dir(str(tmp_path / "x.db")) is None
    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    merged: list[str] = []
    monkeypatch.setattr(parts_module.PartMerger, "merge", lambda self, part: merged.append(part))
    r1 = replay(PCAP, str(tmp_path / "one.db"), chain=_chain(), jobs=1)
    r2 = replay(PCAP, str(tmp_path / "two.db"), chain=_chain(), jobs=2)
    assert merged == [] and (r2.streams, r2.tokens) == (r1.streams, r1.tokens)
    assert _dump(tmp_path / "two.db") == _dump(tmp_path / "one.db")


def _refuse(*_a: Any, **_k: Any) -> str:
    raise PermissionError("read-only directory")
