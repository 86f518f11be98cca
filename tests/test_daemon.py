"""The daemon's wiring, driven by a fake capture source fed from a fixture pcap.

No packet socket, no root: the source hands out the segments of
``pcaps/concurrent_4.pcap`` in batches. Waits are bounded by counts of short
sleeps and by events the test controls, never by measuring time.
"""

from __future__ import annotations

import io
import json
import os
import queue
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sniffer.capture.pcap import read_capture
from sniffer.core.events import (
    CaptureGap,
    ChunkEvent,
    ConnectionClosed,
    ConnectionOpened,
    FlowData,
    FlowEnd,
    FlowGap,
    Segment,
    StoreEvent,
    StreamClosed,
)
from sniffer.runtime.capture_thread import HANDOVER_POLLS, CaptureThread
from sniffer.runtime.config import Config
from sniffer.runtime.daemon import SLOW_ENV, Daemon
from sniffer.runtime.log import Log
from sniffer.runtime.notify import Notifier, sd_notify
from sniffer.runtime.stats import DaemonStats

ROOT = Path(__file__).resolve().parent.parent
PCAP = ROOT / "pcaps" / "concurrent_4.pcap"
EXPECTED = json.loads((ROOT / "pcaps" / "concurrent_4.expected.json").read_text())
PORT = EXPECTED["server_port"]
SEGMENTS: list[Segment] = list(read_capture(PCAP))
WAIT_STEPS = 1000  # × 0.01 s: only reached when a test fails


def wait_for(cond: Any, steps: int = WAIT_STEPS) -> bool:
    for _ in range(steps):
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


class FakeSource:
    """Hands out ``items`` ``per`` at a time once ``gate`` is set; then nothing."""

    def __init__(
        self,
        items: list[Any],
        per: int = 10,
        gate: threading.Event | None = None,
        fail_after: int | None = None,
    ) -> None:
        self.items = list(items)
        self.per = per
        self.gate = gate
        self.fail_after = fail_after
        self.polls = 0
        self.opened = self.closed = False
        self.exhausted = threading.Event()

    def open(self) -> None:
        self.opened = True

    def poll(self, timeout: float) -> list[Any]:
        self.polls += 1
        if self.fail_after is not None and self.polls > self.fail_after:
            raise OSError("interface went away")
        if self.gate is not None and not self.gate.is_set():
            self.gate.wait(timeout)
            return []
        if not self.items:
            self.exhausted.set()
            time.sleep(timeout)
            return []
        batch, self.items = self.items[: self.per], self.items[self.per :]
        if not self.items:
            self.exhausted.set()
        return batch

    def describe(self) -> str:
        return "fake source"

    def stats(self) -> dict[str, int]:
        return {"kernel_drops": 0}

    def close(self) -> None:
        self.closed = True


class Running:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.code: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.code = self.daemon.run()
        except BaseException as exc:
            self.error = exc

    def stop(self) -> int:
        self.daemon.request_stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "daemon did not stop"
        if self.error is not None:
            raise self.error
        assert self.code is not None
        return self.code


def start(daemon: Daemon) -> Running:
    r = Running(daemon)
    r.thread.start()
    assert wait_for(lambda: daemon.started.is_set() or r.error is not None)
    if r.error is not None:
        raise r.error
    return r


def make(
    tmp_path: Path,
    source: FakeSource,
    log: io.StringIO | None = None,
    *,
    features: bool = False,
    **cfg: Any,
) -> tuple[Daemon, str]:
    """A daemon on ``source`` writing ``tmp_path/d.db``; with ``features``, the
    ones ``sparseety run`` builds for it (``build_features``)."""
    from sniffer.runtime.features import build_features

    db = str(tmp_path / "d.db")
    config = Config(database=db, ports=(PORT,), flush_interval=0.05, **cfg)
    logger = Log("debug", log if log is not None else io.StringIO())
    d = Daemon(
        config,
        log=logger,
        source_factory=lambda _cfg, _base: source,
        notifier=Notifier({}),
        install_signals=False,
        features=build_features(config, logger) if features else None,
    )
    return d, db


def rows(db: str, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as c:
        return c.execute(sql).fetchall()


def stream_texts(db: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for sid, port in rows(db, "select id, client from streams"):
        text = "".join(
            t for (t,) in rows(db, f"select text from chunks where stream_id={sid} order by seq")
        )
        out[int(port.rsplit(":", 1)[1])] = text
    return out


def expected_texts() -> dict[int, str]:
    return {s["client_port"]: s["choices"]["0"]["text"] for s in EXPECTED["streams"]}


@pytest.fixture(autouse=True)
def _no_slow(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(SLOW_ENV, raising=False)
    yield


# ---------------------------------------------------------------- whole daemon


def test_records_every_stream_with_labels(tmp_path: Path) -> None:
    src = FakeSource(SEGMENTS, per=7)
    log = io.StringIO()
    d, db = make(tmp_path, src, log, labels={PORT: "baseline"})
    r = start(d)
    assert src.exhausted.wait(30)
    assert wait_for(lambda: d.stats.items >= len(SEGMENTS))
    assert r.stop() == 0
    assert src.opened and src.closed
    assert stream_texts(db) == expected_texts()
    states = rows(db, "select state, gap, label from streams")
    assert states == [("complete", 0, "baseline")] * 4
    for (sid,) in rows(db, "select id from streams"):
        ts = [t for (t,) in rows(db, f"select ts from chunks where stream_id={sid} order by seq")]
        assert ts == sorted(ts)
    lines = log.getvalue().splitlines()
    active = [ln for ln in lines if "event=capture-active" in ln]
    assert len(active) == 1
    assert "backend=packet" in active[0] and f"ports={PORT}" in active[0]
    assert 'source="fake source"' in active[0]
    stopped = [ln for ln in lines if "event=stopped" in ln]
    assert len(stopped) == 1 and "queue_dropped=0" in stopped[0]


def test_stop_hands_open_streams_to_the_next_instance(tmp_path: Path) -> None:
    """SIGTERM with streams under way writes the restart checkpoint and leaves
    their rows open; the next instance adopts them and, fed the rest of the
    capture (nothing missed in between), finishes the SAME rows, complete."""
    half = len(SEGMENTS) // 2
    src = FakeSource(SEGMENTS[:half], per=5)
    d, db = make(tmp_path, src)
    r = start(d)
    assert src.exhausted.wait(30)
    assert wait_for(lambda: d.stats.items >= half)
    assert r.stop() == 0
    assert rows(db, "select state, gap from streams") == [("open", 0)] * 4
    checkpoint = Path(db + ".checkpoint.json")
    assert checkpoint.stat().st_mode & 0o777 == 0o600  # private, like the database
    doc = json.loads(checkpoint.read_text())
    assert len(doc["entries"]) == 4
    assert {e["http"]["clean"] for e in doc["entries"]} == {True}  # one event per segment
    ids = rows(db, "select id from streams order by id")
    log = io.StringIO()
    src2 = FakeSource(SEGMENTS[half:], per=5)
    d2, _ = make(tmp_path, src2, log)
    r2 = start(d2)
    assert src2.exhausted.wait(30)
    assert wait_for(lambda: d2.stats.items >= len(SEGMENTS) - half)
    assert r2.stop() == 0
    assert not checkpoint.exists()
    assert "event=checkpoint-adopted" in log.getvalue() and "streams=4" in log.getvalue()
    assert rows(db, "select id from streams order by id") == ids  # no second row
    assert rows(db, "select state, gap from streams") == [("complete", 0)] * 4
    assert stream_texts(db) == expected_texts()


def test_a_stale_checkpoint_closes_its_rows_as_gapped(tmp_path: Path) -> None:
    half = len(SEGMENTS) // 2
    src = FakeSource(SEGMENTS[:half], per=5)
    d, db = make(tmp_path, src)
    r = start(d)
    assert src.exhausted.wait(30)
    assert wait_for(lambda: d.stats.items >= half)
    assert r.stop() == 0
    checkpoint = Path(db + ".checkpoint.json")
    assert checkpoint.stat().st_mode & 0o777 == 0o600  # private, like the database
    doc = json.loads(checkpoint.read_text())
    doc["written_at"] -= 3600
    checkpoint.write_text(json.dumps(doc))
    log = io.StringIO()
    d2, _ = make(tmp_path, FakeSource([], per=5), log)
    assert start(d2).stop() == 0
    assert "event=checkpoint-stale" in log.getvalue()
    got = rows(db, "select state, gap, reason from streams")
    assert got == [("gap", 1, "sidecar restarted; checkpoint stale")] * 4
    full = expected_texts()
    for port, text in stream_texts(db).items():
        assert full[port].startswith(text)


def test_stop_hands_open_streams_over_through_postgresql(fresh_pg_url: str) -> None:
    """With a PostgreSQL store the checkpoint is this node's row of the
    ``checkpoints`` table (a fleet shares the database: another node's
    checkpoint is not touched): the next instance on the node reads and
    deletes it and finishes the SAME rows."""
    from sqlalchemy import create_engine, text

    from sniffer.store.checkpoints import save_checkpoint
    from sniffer.store.db import EngineStore

    def pg_rows(sql: str) -> list[tuple[Any, ...]]:
        with engine.connect() as c:
            return [tuple(r) for r in c.execute(text(sql)).all()]

    def make_pg(source: FakeSource, log: io.StringIO) -> Daemon:
        config = Config(database=fresh_pg_url, ports=(PORT,), flush_interval=0.05, node="gpu-1")
        return Daemon(
            config,
            log=Log("debug", log),
            source_factory=lambda _cfg, _base: source,
            notifier=Notifier({}),
            install_signals=False,
        )

    engine = create_engine(fresh_pg_url)
    half = len(SEGMENTS) // 2
    src = FakeSource(SEGMENTS[:half], per=5)
    d = make_pg(src, io.StringIO())
    r = start(d)
    assert src.exhausted.wait(30)
    assert wait_for(lambda: d.stats.items >= half)
    assert r.stop() == 0
    assert pg_rows("select state, gap from streams") == [("open", False)] * 4
    (payload,) = pg_rows("select payload from checkpoints where node = 'gpu-1'")[0]
    assert len(json.loads(payload)["entries"]) == 4
    save_checkpoint(EngineStore(engine), "gpu-2", {"entries": []})  # another sidecar's
    ids = pg_rows("select id from streams order by id")
    log = io.StringIO()
    src2 = FakeSource(SEGMENTS[half:], per=5)
    d2 = make_pg(src2, log)
    r2 = start(d2)
    assert src2.exhausted.wait(30)
    assert wait_for(lambda: d2.stats.items >= len(SEGMENTS) - half)
    assert r2.stop() == 0
    assert "event=checkpoint-adopted" in log.getvalue() and "streams=4" in log.getvalue()
    assert pg_rows("select node from checkpoints") == [("gpu-2",)]
    assert pg_rows("select id from streams order by id") == ids  # no second row
    assert pg_rows("select state, gap from streams") == [("complete", False)] * 4
    texts = {
        int(client.rsplit(":", 1)[1]): "".join(
            t for (t,) in pg_rows(f"select text from chunks where stream_id={sid} order by seq")
        )
        for sid, client in pg_rows("select id, client from streams")
    }
    assert texts == expected_texts()
    engine.dispose()


def test_rows_are_written_before_stop(tmp_path: Path) -> None:
    src = FakeSource(SEGMENTS, per=50)
    d, db = make(tmp_path, src)
    r = start(d)
    assert src.exhausted.wait(30)
    # flush_interval 0.05: rows show up while the daemon runs
    assert wait_for(lambda: len(rows(db, "select id from streams where state='complete'")) == 4)
    assert r.stop() == 0


BIG_INT = ROOT / "pcaps" / "faults" / "sec_big_int.pcap"
BIG_INT_EXPECTED = json.loads(BIG_INT.with_suffix(".expected.json").read_text())


def test_integers_past_the_columns_cost_their_rows_only(tmp_path: Path) -> None:
    """Issue #24: one integer >= 2^63 from a server made the sidecar exit
    ("Python int too large to convert to C long"). Live, from the capture with
    such integers on one connection and a canary stream on another: every
    stream is stored, each bad item is an error row, the daemon keeps running
    and stops with 0. A row that still reaches the writer with an integer wider
    than its column (injected here by a transform) is refused alone: an error
    row and a log line, not the end of the batch."""
    segments = list(read_capture(BIG_INT))
    src = FakeSource(segments, per=3)
    log = io.StringIO()
    db = str(tmp_path / "d.db")
    config = Config(database=db, ports=(BIG_INT_EXPECTED["server_port"],), flush_interval=0.05)
    d = Daemon(
        config,
        log=Log("debug", log),
        source_factory=lambda _cfg, _base: src,
        notifier=Notifier({}),
        install_signals=False,
    )
    injected: list[int] = []

    def inject(events: list[StoreEvent]) -> list[StoreEvent]:
        chunks = [e for e in events if isinstance(e, ChunkEvent)]
        if chunks and not injected:
            injected.append(chunks[0].stream)
            bad = ChunkEvent(chunks[0].stream, chunks[0].ts, 10_000, 2**63, 1, "content", "x")
            return [*events, bad]
        return events

    d.chain.transforms.append(inject)
    r = start(d)
    assert src.exhausted.wait(30)
    assert wait_for(lambda: d.stats.items >= len(segments))
    closed = "select id from streams where closed_at is not null"
    assert wait_for(lambda: len(rows(db, closed)) == 5)
    assert r.thread.is_alive()  # still capturing
    assert r.stop() == 0
    texts = {
        (int(client.rsplit(":", 1)[1]), exchange): text
        for client, exchange, text in rows(
            db,
            "select client, exchange, group_concat(text, '') from "
            "(select s.client, s.exchange, s.id, c.text from streams s join chunks c "
            "on c.stream_id = s.id where c.chunk_index > 0 order by s.id, c.seq) group by id",
        )
    }
    for want in BIG_INT_EXPECTED["streams"]:
        key = (want["client_port"], want["exchange"])
        assert texts.get(key, "") == want["choices"]["0"]["text"], key
    kinds = [k for (k,) in rows(db, "select kind from errors order by id")]
    assert kinds.count("invalid") == 4 and kinds.count("out-of-range") == 1
    assert kinds.count("row-rejected") == 1
    assert rows(db, "select stream_id from errors where kind='row-rejected'") == [(injected[0],)]
    assert "event=store-rejected rows=1" in log.getvalue()
    assert "store_rejected=1" in log.getvalue()


def test_overload_drops_batches_counts_them_and_marks_gaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    src = FakeSource(SEGMENTS, per=4)
    log = io.StringIO()
    d, db = make(tmp_path, src, log, queue_size=2)
    # The first batch's processing waits in a sink until the source has handed
    # out everything: the queue (2 batches) overflows for certain.
    first = threading.Event()

    def sink(_events: list[StoreEvent]) -> None:
        if not first.is_set():
            first.set()
            src.exhausted.wait(30)
            gate.set()

    d.add_sink(sink)
    monkeypatch.setenv(SLOW_ENV, "1")
    r = start(d)
    assert src.exhausted.wait(30)
    assert wait_for(lambda: d.stats.queue_gaps >= 1)
    assert r.stop() == 0
    s = d.stats
    assert s.queue_dropped > 0 and s.queue_drop_batches > 0
    assert s.max_queue <= 2
    # the loss is stored and the open streams are marked
    errs = rows(db, "select stage, kind, message from errors where kind='queue-drop'")
    assert errs and all(stage == "capture" for stage, _, _ in errs)
    assert sum(int(m.split()[0]) for _, _, m in errs) == s.queue_dropped
    # (streams still under way at the stop are handed to the next instance in
    # the restart checkpoint, their gap with them)
    cp = Path(db + ".checkpoint.json")
    handed = [e for e in json.loads(cp.read_text())["entries"]] if cp.exists() else []
    gapped = rows(db, "select count(*) from streams where gap=1")[0][0]
    assert gapped + sum(1 for e in handed if e["gap"]) >= 1
    assert rows(db, "select count(*) from streams where state='complete' and gap=1")[0][0] == 0
    stopped = next(ln for ln in log.getvalue().splitlines() if "event=stopped" in ln)
    assert f"queue_dropped={s.queue_dropped}" in stopped


def test_sinks_see_everything_and_transform_shapes_what_is_written(tmp_path: Path) -> None:
    src = FakeSource(SEGMENTS, per=9)
    d, db = make(tmp_path, src)
    seen: list[StoreEvent] = []
    d.add_sink(seen.extend)

    def broken(_events: list[StoreEvent]) -> None:
        raise RuntimeError("sink bug")

    d.add_sink(broken)
    d.chain.transforms.append(lambda evs: [e for e in evs if not isinstance(e, ChunkEvent)])
    r = start(d)
    assert src.exhausted.wait(30)
    assert wait_for(lambda: d.stats.items >= len(SEGMENTS))
    assert r.stop() == 0
    assert sum(isinstance(e, ChunkEvent) for e in seen) >= 4 * 24
    assert sum(isinstance(e, StreamClosed) for e in seen) == 4
    assert d.stats.sink_errors >= 1
    assert rows(db, "select count(*) from chunks")[0][0] == 0
    assert rows(db, "select count(*) from streams where state='complete'")[0][0] == 4


def test_capture_failure_stops_with_exit_1(tmp_path: Path) -> None:
    src = FakeSource(SEGMENTS, per=10, fail_after=3)
    log = io.StringIO()
    d, db = make(tmp_path, src, log)
    r = Running(d)
    r.thread.start()
    r.thread.join(30)
    assert not r.thread.is_alive()
    assert r.code == 1
    assert "event=capture-failed" in log.getvalue()
    assert "interface went away" in log.getvalue()
    # what was captured before is stored
    assert rows(db, "select count(*) from streams")[0][0] >= 1


def test_sighup_reload_applies_labels(tmp_path: Path) -> None:
    cfg_path = tmp_path / "s.toml"
    db = str(tmp_path / "d.db")
    cfg_path.write_text(
        f"[capture]\nports = [{PORT}]\nhandover = 1.0\n[store]\ndatabase = '{db}'\n"
        f"flush_interval = 0.05\n[labels]\n{PORT} = 'before'\n"
    )
    from sniffer.runtime.config import load_config

    gate = threading.Event()
    src = FakeSource(SEGMENTS, per=10, gate=gate)
    log = io.StringIO()
    d = Daemon(
        load_config(cfg_path),
        log=Log("info", log),
        source_factory=lambda _c, _b: src,
        notifier=Notifier({}),
        install_signals=False,
    )
    r = start(d)
    assert d._capture is not None and d._capture.handover == 1.0
    text = cfg_path.read_text().replace("'before'", "'after'")
    cfg_path.write_text(text.replace("handover = 1.0", "handover = 0.25"))
    d.request_reload()
    assert wait_for(lambda: dict(d.config.labels) == {PORT: "after"})
    assert d._capture.handover == 0.25  # the running capture thread's, at once
    gate.set()
    assert src.exhausted.wait(30)
    assert wait_for(lambda: d.stats.items >= len(SEGMENTS))
    assert r.stop() == 0
    assert rows(db, "select distinct label from streams") == [("after",)]
    assert "event=reloaded" in log.getvalue()
    assert d.stats.capture_restarts == 0  # labels alone restart nothing


class _TailSource(FakeSource):
    """Gives nothing to its capture thread and ``items`` (once) when polled
    from elsewhere: the last ring block a replaced source hands over only
    after its thread stopped polling."""

    def poll(self, timeout: float) -> list[Any]:
        self.polls += 1
        if threading.current_thread().name == "sparseety-capture" or not self.items:
            time.sleep(min(timeout, 0.01))
            return []
        batch, self.items = self.items, []
        return batch


def test_capture_restart_keeps_what_the_old_source_still_held(tmp_path: Path) -> None:
    """A reload that restarts the capture reads the old source once its
    thread has stopped (for one block timeout) and processes what it held."""
    from sniffer.runtime.config import load_config

    cfg_path = tmp_path / "s.toml"
    db = str(tmp_path / "d.db")
    cfg_path.write_text(
        f"[capture]\nports = [{PORT}]\n[store]\ndatabase = '{db}'\nflush_interval = 0.05\n"
    )
    old, new = _TailSource(SEGMENTS), FakeSource([])
    sources = iter([old, new])
    d = Daemon(
        load_config(cfg_path),
        log=Log("info", io.StringIO()),
        source_factory=lambda _c, _b: next(sources),
        notifier=Notifier({}),
        install_signals=False,
    )
    r = start(d)
    assert wait_for(lambda: old.polls >= 2)
    assert d.stats.items == 0  # its capture thread got nothing
    # a ring setting: the capture source is replaced
    text = cfg_path.read_text()
    cfg_path.write_text(text.replace("[capture]\n", "[capture]\nring_blocks = 16\n"))
    d.request_reload()
    assert wait_for(lambda: d.stats.capture_restarts == 1)
    assert wait_for(lambda: d.stats.items >= len(SEGMENTS))
    assert r.stop() == 0
    assert old.closed and not old.items
    assert rows(db, "select count(*) from streams")[0][0] >= 1


def test_reload_with_bad_config_keeps_running(tmp_path: Path) -> None:
    cfg_path = tmp_path / "s.toml"
    cfg_path.write_text(f"[capture]\nports = [{PORT}]\n[store]\ndatabase = '{tmp_path / 'd.db'}'\n")
    from sniffer.runtime.config import load_config

    src = FakeSource([], per=10)
    log = io.StringIO()
    d = Daemon(
        load_config(cfg_path),
        log=Log("info", log),
        source_factory=lambda _c, _b: src,
        notifier=Notifier({}),
        install_signals=False,
    )
    r = start(d)
    cfg_path.write_text("[capture]\nportz = 1\n")
    d.request_reload()
    assert wait_for(lambda: "event=reload-failed" in log.getvalue())
    assert d.config.ports == (PORT,)
    assert r.stop() == 0


# ---------------------------------------------------------------- capture thread


def _thread(ebpf: bool = False, size: int = 1) -> tuple[CaptureThread, queue.Queue[list[Any]]]:
    q: queue.Queue[list[Any]] = queue.Queue(maxsize=size)
    t = CaptureThread(FakeSource([]), q, DaemonStats(), Log("error", io.StringIO()), ebpf)
    return t, q


def test_queue_full_drops_batch_and_sends_marker_first() -> None:
    t, q = _thread()
    a, b, c, e = SEGMENTS[0:3], SEGMENTS[3:8], SEGMENTS[8:10], SEGMENTS[10:12]
    t.offer(list(a))
    t.offer(list(b))  # full: dropped
    t.offer([*c, CaptureGap(c[-1].ts, 7, "kernel")])  # dropped too, with a kernel gap
    assert t.stats.queue_dropped == len(b) + len(c) + 7
    assert t.stats.queue_drop_batches == 2
    assert q.get_nowait() == a
    t.offer(list(e))
    got = q.get_nowait()
    assert got[0] == CaptureGap(c[-1].ts, len(b) + len(c) + 7, "queue")
    assert got[1:] == e
    assert not t.loss.pending


def test_marker_alone_goes_through_when_nothing_new_arrives() -> None:
    t, q = _thread()
    t.offer(SEGMENTS[0:2])
    t.offer(SEGMENTS[2:4])
    q.get_nowait()
    t.offer([])  # an empty poll still delivers the pending marker
    assert q.get_nowait() == [CaptureGap(SEGMENTS[3].ts, 2, "queue")]
    t.offer([])
    assert q.empty()


def test_ebpf_drop_keeps_structure_and_turns_data_into_gaps() -> None:
    t, q = _thread(ebpf=True)
    t.offer([FlowData(1, 1.0, True, b"x")])
    opened = ConnectionOpened(2, 2.0, ("127.0.0.1", 5), ("127.0.0.1", 80), True, "ebpf")
    t.offer(
        [
            opened,
            FlowData(2, 2.1, True, b"abc"),
            FlowData(2, 2.2, False, b"hello"),
            FlowData(2, 2.3, False, b"!!"),
            FlowEnd(2, 2.4, False, "fin"),
            ConnectionClosed(2, 2.5, "fin"),
            FlowData(1, 2.6, False, b"zz"),
        ]
    )
    assert t.stats.queue_dropped == 4
    q.get_nowait()
    t.offer([])
    got = q.get_nowait()
    assert got[0] == CaptureGap(2.6, 4, "queue")
    rest = got[1:]
    assert rest[0] == opened
    # gaps of conn 2 come before its end, with exact byte counts
    assert FlowGap(2, 2.3, False, 7, "overflow") in rest
    assert FlowGap(2, 2.1, True, 3, "overflow") in rest
    assert rest.index(FlowGap(2, 2.3, False, 7, "overflow")) < rest.index(
        FlowEnd(2, 2.4, False, "fin")
    )
    assert rest[-1] == FlowGap(1, 2.6, False, 2, "overflow")


class _ScriptedSource(FakeSource):
    """Each poll returns the next of ``polls`` (then nothing) and moves the
    fake clock on by ``step`` seconds; raises once the script is out if
    ``fail`` (a broken source)."""

    def __init__(self, polls: list[list[Any]], step: float, fail: bool = False) -> None:
        super().__init__([])
        self.script = list(polls)
        self.step = step
        self.fail = fail
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def poll(self, timeout: float) -> list[Any]:
        self.polls += 1
        self.now += self.step
        if self.script:
            return self.script.pop(0)
        if self.fail:
            raise OSError("interface went away")
        self.exhausted.set()
        time.sleep(min(timeout, 0.01))
        return []


def _gathering(
    src: _ScriptedSource, handover: float
) -> tuple[CaptureThread, queue.Queue[list[Any]]]:
    q: queue.Queue[list[Any]] = queue.Queue(maxsize=100)
    t = CaptureThread(
        src, q, DaemonStats(), Log("error", io.StringIO()), False, handover, clock=src.clock
    )
    return t, q


def _queued(q: queue.Queue[list[Any]]) -> list[list[Any]]:
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out


def test_capture_thread_gathers_polls_for_the_handover_time() -> None:
    # a poll every 0.3 s (of the fake clock), packets in most: a batch holds
    # what came from its first packets' poll until 1 s after, in order
    s = SEGMENTS
    src = _ScriptedSource([[s[0]], [s[1], s[2]], [], [s[3]], [s[4]], [], [], [s[5]]], 0.3)
    t, q = _gathering(src, 1.0)
    t.start()
    assert src.exhausted.wait(30)
    t.join(5)
    # polls at 0.3 (due 1.3), 0.6, 0.9, 1.2, 1.5 -> handed over; then 2.4 (due 3.4), stop
    assert _queued(q) == [[s[0], s[1], s[2], s[3], s[4]], [s[5]]]
    assert t.stats.queue_dropped == 0


def test_capture_thread_hands_over_every_handover_polls_and_at_its_end() -> None:
    # the clock stands still: only the poll count hands batches over, and a
    # stop queues what was gathered (nothing is left behind)
    polls = [[seg] for seg in SEGMENTS[: 2 * HANDOVER_POLLS + 3]]
    src = _ScriptedSource(polls, 0.0)
    t, q = _gathering(src, 10.0)
    t.start()
    assert src.exhausted.wait(30)
    t.join(5)
    got = _queued(q)
    assert [len(b) for b in got] == [HANDOVER_POLLS, HANDOVER_POLLS, 3]
    assert [seg for b in got for seg in b] == SEGMENTS[: 2 * HANDOVER_POLLS + 3]


def test_capture_thread_without_handover_queues_each_poll() -> None:
    s = SEGMENTS
    src = _ScriptedSource([[s[0]], [s[1], s[2]], [], [s[3]]], 0.0)
    t, q = _gathering(src, 0.0)
    t.start()
    assert src.exhausted.wait(30)
    t.join(5)
    assert _queued(q) == [[s[0]], [s[1], s[2]], [s[3]]]


def test_capture_thread_queues_what_it_gathered_when_the_source_breaks() -> None:
    s = SEGMENTS
    src = _ScriptedSource([[s[0]], [s[1]]], 0.1, fail=True)
    t, q = _gathering(src, 10.0)
    t.start()
    t.thread.join(30)
    assert not t.thread.is_alive()
    assert t.error == "OSError: interface went away"
    assert _queued(q) == [[s[0], s[1]]]


# ---------------------------------------------------------------- sd_notify


def _dgram(addr: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(addr)
    s.settimeout(5)
    return s


def test_sd_notify_abstract_and_path(tmp_path: Path) -> None:
    name = f"sparseety-test-{os.getpid()}-{id(tmp_path)}"
    with _dgram("\0" + name) as s:
        assert sd_notify("READY=1\nSTATUS=ok", "@" + name)
        assert s.recv(100) == b"READY=1\nSTATUS=ok"
    path = str(tmp_path / "notify")
    with _dgram(path) as s:
        assert sd_notify("WATCHDOG=1", path)
        assert s.recv(100) == b"WATCHDOG=1"


def test_sd_notify_without_socket_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sd_notify("READY=1") is False
    assert sd_notify("READY=1", "/nonexistent/dir/sock") is False
    assert sd_notify("READY=1", "relative") is False


def test_notifier_watchdog_interval_and_pid(tmp_path: Path) -> None:
    path = str(tmp_path / "n")
    with _dgram(path) as s:
        n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000"})
        assert n.watchdog_interval == 1.0
        n.watchdog(100.0)
        n.watchdog(100.5)  # not due
        n.watchdog(101.0)
        assert [s.recv(100), s.recv(100)] == [b"WATCHDOG=1", b"WATCHDOG=1"]
        s.settimeout(0.01)
        with pytest.raises(TimeoutError):
            s.recv(100)
    other = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_interval is None


def test_daemon_notifies_ready_status_and_stopping(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    with _dgram(path) as s:
        src = FakeSource(SEGMENTS, per=50)
        d, _db = make(tmp_path, src)
        d.notifier = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"})
        r = start(d)
        assert src.exhausted.wait(30)
        got = [s.recv(4096).decode()]
        assert got[0].startswith("READY=1\nSTATUS=capturing")
        for _ in range(20):
            got.append(s.recv(4096).decode())
            if got[-1] == "WATCHDOG=1":
                break
        assert "WATCHDOG=1" in got
        assert r.stop() == 0
        msgs = []
        s.settimeout(0.5)
        for _ in range(200):
            try:
                msgs.append(s.recv(4096).decode())
            except TimeoutError:
                break
        assert any(m.startswith("STOPPING=1") for m in msgs)


def test_log_lines_are_logfmt_and_journal_prefixed(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    Log("info", out)("info", "capture-active", iface="lo", filter="tcp port 1", skip=None)
    Log("info", out)("debug", "hidden")
    line = out.getvalue().strip()
    assert line.startswith("ts=")
    assert line.endswith('level=info event=capture-active iface=lo filter="tcp port 1"')
    monkeypatch.setenv("JOURNAL_STREAM", "8:1234")
    out = io.StringIO()
    Log("info", out)("error", "store-failed", error='say "no"')
    assert out.getvalue() == '<3>level=error event=store-failed error="say \\"no\\""\n'


# ------------------------------------------------------------ build_features


def _conversation(port: int, prompt: str, pieces: list[str]) -> list[Any]:
    """A whole keep-alive-free chat stream as captured segments (handshake to FIN)."""
    from sniffer.core.events import ACK, FIN, PSH, SYN, Segment

    c, s = ("127.0.0.1", 45001), ("127.0.0.1", port)
    body = json.dumps(
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": prompt}]}
    ).encode()
    req = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    events = [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in pieces]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks = [
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    ]
    for e in [*(json.dumps(e) for e in events), "[DONE]"]:
        data = f"data: {e}\n\n".encode()
        chunks.append(b"%x\r\n%s\r\n" % (len(data), data))
    chunks.append(b"0\r\n\r\n")
    cseq, sseq, ts = 1000, 5000, 100.0
    segs = [
        Segment(ts, *c, *s, cseq, 0, SYN, b""),
        Segment(ts, *s, *c, sseq, cseq + 1, SYN | ACK, b""),
        Segment(ts, *c, *s, cseq + 1, sseq + 1, ACK | PSH, req),
    ]
    cseq += 1 + len(req)
    sseq += 1
    for i, ch in enumerate(chunks):
        segs.append(Segment(ts + 0.01 * (i + 1), *s, *c, sseq, cseq, ACK | PSH, ch))
        sseq += len(ch)
    segs.append(Segment(ts + 1, *s, *c, sseq, cseq, ACK | FIN, b""))
    segs.append(Segment(ts + 1, *c, *s, cseq, sseq + 1, ACK | FIN, b""))
    return segs


def test_features_redact_what_is_stored_but_tokenize_what_was_sent(tmp_path: Path) -> None:
    from sniffer.llm.tokens import TokenizerRegistry

    pieces = ["Call me at ", "+86 138 0013 8000", " or mail ", "ann@example.com", "."]
    segs = _conversation(PORT, "my id is alice@example.org", pieces)
    src = FakeSource(segs, per=3)
    d, db = make(tmp_path, src, features=True, metrics=False)
    feats = d.features
    assert feats is not None and d.chain is feats.chain
    r = start(d)
    assert wait_for(src.exhausted.is_set)
    assert r.stop() == 0
    text = "".join(t for (t,) in rows(db, "select text from chunks where chunk_index > 0"))
    assert text == "Call me at <PHONE> or mail <EMAIL>."
    (request,) = rows(db, "select request_json from streams")[0]
    assert "alice@example.org" not in request and "<EMAIL>" in request
    # Token rows: computed on the original text, not on the placeholders.
    (count,) = rows(db, "select output_count from stream_tokens")[0]
    original = "".join(pieces)
    assert count == len(TokenizerRegistry().default().encode_batch([original])[0])
    assert feats.redactor.counts["PHONE"] == 1 and feats.redactor.counts["EMAIL"] == 2


def test_features_sampling_keeps_summaries_and_drops_text(tmp_path: Path) -> None:
    src = FakeSource(_conversation(PORT, "hello", ["a", "b"]), per=4)
    d, db = make(tmp_path, src, features=True, metrics=False, sample_rate=0.0, tokens=False)
    r = start(d)
    assert wait_for(src.exhausted.is_set)
    assert r.stop() == 0
    assert rows(db, "select state, chunk_count, text_len from streams") == [("complete", 2, 2)]
    assert rows(db, "select count(*) from chunks") == [(0,)]


def test_features_encode_tokens_in_one_thread_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the token pass on, ``build_features`` turns HF tokenizers' thread
    pool off (the pass is background work: one thread costs less CPU); a
    value the user set is kept, and without tokens nothing is set."""
    from sniffer.runtime.features import TOKENIZERS_PARALLELISM

    monkeypatch.delenv(TOKENIZERS_PARALLELISM, raising=False)
    make(tmp_path, FakeSource([]), features=True, metrics=False, tokens=False)
    assert TOKENIZERS_PARALLELISM not in os.environ
    make(tmp_path, FakeSource([]), features=True, metrics=False)
    assert os.environ[TOKENIZERS_PARALLELISM] == "false"
    monkeypatch.setenv(TOKENIZERS_PARALLELISM, "true")
    make(tmp_path, FakeSource([]), features=True, metrics=False)
    assert os.environ[TOKENIZERS_PARALLELISM] == "true"


def test_features_refuse_a_world_readable_database(tmp_path: Path) -> None:
    from sniffer.store.files import InsecureDatabaseFile

    db = tmp_path / "d.db"
    db.write_bytes(b"")
    os.chmod(db, 0o644)
    with pytest.raises(InsecureDatabaseFile):
        make(tmp_path, FakeSource([]), features=True, metrics=False, tokens=False)


def test_ebpf_repeated_drops_count_each_byte_once() -> None:
    """A batch dropped while a loss marker is pending adds only its own items."""
    t, q = _thread(ebpf=True)
    t.offer([FlowData(1, 1.0, True, b"x")])  # fills the queue
    t.offer([FlowData(2, 2.0, True, b"abc")])  # dropped
    t.offer([FlowData(2, 2.1, True, b"de")])  # dropped, with the pending marker in front
    assert t.stats.queue_dropped == 2
    q.get_nowait()
    t.offer([])
    assert q.get_nowait() == [CaptureGap(2.1, 2, "queue"), FlowGap(2, 2.1, True, 5, "overflow")]
