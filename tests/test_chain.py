"""The recording chain (sniffer.record.chain): observers, then transforms, then the writer.

One chain, built from a configuration, serves both drivers; these tests drive
it through the replay driver and the CLI, and on its own with a writer.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from sniffer.cli import main
from sniffer.core.events import ChunkEvent, StoreEvent, StreamClosed, StreamOpened
from sniffer.record.chain import RecordingChain, RecordingOptions
from sniffer.record.metrics import Metrics
from sniffer.runtime.config import Config
from sniffer.runtime.replay import CaptureFileError, MissingCapture, replay, replay_files
from sniffer.store.writer import StoreWriter

ROOT = Path(__file__).resolve().parent.parent
PCAP = ROOT / "pcaps" / "chat_english.pcap"
NO_TOKENS = RecordingOptions(tokens=False)


def rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def test_from_config_builds_what_the_configuration_asks_for() -> None:
    plain = RecordingChain.from_config(NO_TOKENS)
    assert plain.sampler is None and plain.collector is None and plain.tokens is None
    assert plain.redactor is not None and plain.redactor.enabled
    assert len(plain.observers) == 0 and len(plain.transforms) == 1

    m = Metrics()
    full = RecordingChain.from_config(
        RecordingOptions(sample_rate=0.5, redact=False, tokens=True), metrics=m
    )
    assert full.sampler is not None and full.collector is not None and full.tokens is not None
    assert full.redactor is not None and not full.redactor.enabled
    assert full.observers[0] == m.observe  # metrics first, then the token collector
    assert len(full.observers) == 2
    assert len(full.transforms) == 2  # sampler, then redactor

    boost = RecordingChain.from_config(RecordingOptions(boost_threshold=3, tokens=False))
    assert boost.sampler is not None


def test_the_daemon_config_is_a_recording_config() -> None:
    chain = RecordingChain.from_config(Config(sample_rate=0.25, tokens=False))
    assert chain.sampler is not None and chain.sampler.rate == 0.25


def test_replay_through_a_chain_samples_out_text_and_keeps_summaries(tmp_path: Path) -> None:
    full, sampled = tmp_path / "full.db", tmp_path / "sampled.db"
    replay(PCAP, str(full), chain=RecordingChain.from_config(NO_TOKENS))
    chain = RecordingChain.from_config(RecordingOptions(sample_rate=0.0, tokens=False))
    r = replay(PCAP, str(sampled), chain=chain)
    summary = "select id, state, chunk_count, text_len, model from streams order by id"
    assert rows(sampled, summary) == rows(full, summary)
    assert r.streams == len(rows(full, "select id from streams")) > 0
    assert rows(full, "select count(*) from chunks")[0][0] > 0
    assert rows(sampled, "select count(*) from chunks") == [(0,)]


def test_replay_observers_see_every_event_before_the_transforms(tmp_path: Path) -> None:
    seen: list[StoreEvent] = []
    chain = RecordingChain.from_config(RecordingOptions(sample_rate=0.0, tokens=False))
    chain.observers.append(seen.extend)
    replay(PCAP, str(tmp_path / "d.db"), chain=chain)
    assert sum(isinstance(e, ChunkEvent) for e in seen) > 0  # sampled out, but observed
    assert sum(isinstance(e, StreamOpened) for e in seen) == sum(
        isinstance(e, StreamClosed) for e in seen
    )


def test_replay_with_metrics_and_tokens_feeds_the_same_metrics_as_live(tmp_path: Path) -> None:
    m = Metrics()
    chain = RecordingChain.from_config(RecordingOptions(), metrics=m)
    r = replay(PCAP, str(tmp_path / "d.db"), chain=chain)
    text = m.render().decode()
    streams = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sparseety_streams_total{")
    )
    assert streams == r.streams > 0
    tokens = sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sparseety_output_tokens_total{")
    )
    assert tokens == r.tokens > 0


def test_replay_refuses_a_chain_and_loose_parts_together(tmp_path: Path) -> None:
    from sniffer.record.redact import Redactor

    with pytest.raises(ValueError, match="through the chain"):
        replay(
            PCAP,
            str(tmp_path / "d.db"),
            chain=RecordingChain.from_config(NO_TOKENS),
            redactor=Redactor(),
        )


def _events() -> list[StoreEvent]:
    from sniffer.capture.pcap import read_capture
    from sniffer.core.pipeline import Pipeline

    pipe = Pipeline()
    out: list[StoreEvent] = []
    reader = read_capture(PCAP)
    for seg in reader:
        out += pipe.feed(seg)
    out += pipe.flush(reader.stats.last_ts or 0.0)
    return out


def test_a_failing_observer_is_reported_and_the_batch_still_written(tmp_path: Path) -> None:
    errors: list[tuple[str, str, str]] = []
    seen: list[StoreEvent] = []

    def broken(_events: list[StoreEvent]) -> None:
        raise RuntimeError("observer bug")

    with StoreWriter(str(tmp_path / "d.db")) as w:
        chain = RecordingChain(
            w,
            observers=[broken, seen.extend],
            on_error=lambda role, name, exc: errors.append((role, name, str(exc))),
        )
        events = _events()
        chain.write(events)
        chain.flush()
    assert errors == [("observer", "broken", "observer bug")]
    assert seen == events
    assert rows(tmp_path / "d.db", "select count(*) from chunks")[0][0] > 0


def test_a_failing_transform_costs_the_batch_never_writes_it_unchanged(tmp_path: Path) -> None:
    errors: list[str] = []

    def broken(_events: list[StoreEvent]) -> list[StoreEvent]:
        raise RuntimeError("transform bug")

    with StoreWriter(str(tmp_path / "d.db")) as w:
        chain = RecordingChain(
            w, transforms=[broken], on_error=lambda role, name, exc: errors.append(role)
        )
        chain.write(_events())
        chain.flush()
    assert errors == ["transform"]
    assert rows(tmp_path / "d.db", "select count(*) from streams") == [(0,)]


def test_without_an_error_hook_failures_propagate(tmp_path: Path) -> None:
    def broken(_events: list[StoreEvent]) -> None:
        raise RuntimeError("observer bug")

    with StoreWriter(str(tmp_path / "d.db")) as w:
        chain = RecordingChain(w, observers=[broken])
        with pytest.raises(RuntimeError, match="observer bug"):
            chain.write(_events())


def test_a_chain_without_a_writer_says_so() -> None:
    with pytest.raises(RuntimeError, match="no writer"):
        RecordingChain().write([])


def test_replay_cli_sample_rate(tmp_path: Path) -> None:
    db = tmp_path / "d.db"
    r = CliRunner().invoke(
        main, ["replay", "-q", "--no-tokens", "--sample-rate", "0", str(PCAP), "--db", str(db)]
    )
    assert r.exit_code == 0, r.output
    assert rows(db, "select count(*) from streams")[0][0] > 0
    assert rows(db, "select count(*) from chunks") == [(0,)]
    bad = CliRunner().invoke(main, ["replay", "--sample-rate", "2", str(PCAP), "--db", str(db)])
    assert bad.exit_code == 2


def test_replay_files_yields_each_file_through_one_chain(tmp_path: Path) -> None:
    """``replay_files`` (what ``sparseety replay`` calls): one result per file
    as it is done, through one chain; a missing file or one that is not a
    capture stops it with the files before it stored, the error naming the file."""
    db = tmp_path / "files.db"
    chain = RecordingChain.from_config(NO_TOKENS)
    seen: list[tuple[str, int, int]] = []
    files = replay_files(
        [str(PCAP), str(PCAP), "nosuch.pcap"],
        str(db),
        chain=chain,
        labels={18036: "x"},  # chat_english's server port
        progress=lambda path, done, total: seen.append((path, done, total)),
    )
    first = next(files)
    assert first.path == str(PCAP) and first.streams == 1
    assert first.summary()["file"] == str(PCAP) and first.summary()["streams"] == 1
    assert next(files).streams == 1
    with pytest.raises(MissingCapture, match=r"^nosuch\.pcap: no such file$"):
        next(files)
    assert rows(db, "SELECT count(*), min(label) FROM streams") == [(2, "x")]
    assert {p for p, _, _ in seen} == {str(PCAP)} and seen[-1][1] == seen[-1][2] > 0
    not_capture = tmp_path / "notes.txt"
    not_capture.write_text("not a capture\n")
    with pytest.raises(CaptureFileError, match=f"^{re.escape(str(not_capture))}: "):
        list(replay_files([str(not_capture)], str(db), chain=chain))


def test_parallel_replay_workers_each_write_through_the_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sniffer.runtime.replay as replay_module

    pcap = ROOT / "pcaps" / "concurrent_4.pcap"
    one, two = tmp_path / "one.db", tmp_path / "two.db"
    opts = RecordingOptions(sample_rate=0.0)
    r1 = replay(pcap, str(one), chain=RecordingChain.from_config(opts), jobs=1)
    monkeypatch.setattr(replay_module, "PARALLEL_MIN_BYTES", 0)
    r2 = replay(pcap, str(two), chain=RecordingChain.from_config(opts), jobs=2)
    assert r2.jobs == 2 and r1.jobs == 1
    assert (r2.streams, r2.tokens, r2.tokenized_streams) == (
        r1.streams,
        r1.tokens,
        r1.tokenized_streams,
    )
    assert r1.tokens > 0
    summary = "select state, chunk_count, text_len from streams order by 1, 2, 3"
    assert rows(two, summary) == rows(one, summary)
    assert rows(two, "select count(*) from chunks") == rows(one, "select count(*) from chunks")
    assert rows(one, "select count(*) from chunks") == [(0,)]
    tok = "select output_count from stream_tokens order by 1"
    assert rows(two, tok) == rows(one, tok)


def _many(copies: int) -> list[StoreEvent]:
    """The capture's events ``copies`` times over, each copy with other stream ids."""
    from dataclasses import replace

    events = _events()
    out: list[StoreEvent] = []
    for k in range(copies):
        out += [
            replace(e, stream=e.stream + 1000 * k) if hasattr(e, "stream") else e for e in events
        ]
    return out


def test_closed_streams_leave_no_per_stream_state_behind(tmp_path: Path) -> None:
    """A daemon closing ~30 streams/s for hours must not grow: once its streams
    have closed and the token pass has run, every per-stream map is empty
    (metrics drop a closed stream's entry when its token figures arrive)."""
    events = _many(5)
    opened = {e.stream for e in events if isinstance(e, StreamOpened)}
    assert opened and {e.stream for e in events if isinstance(e, StreamClosed)} == opened
    m = Metrics()
    chain = RecordingChain.from_config(RecordingOptions(), metrics=m)
    chain.attach(StoreWriter(str(tmp_path / "c.db")))
    for i in range(0, len(events), 7):  # batches as the daemon hands them over
        chain.write(events[i : i + 7])
    chain.flush()
    while chain.tokens_ready:
        chain.tokenize(limit=1, max_chunks=1)
    assert chain.collector is not None and chain.collector.open_streams == 0
    sr = chain.stream_redactor
    assert sr is not None and sr.held == 0
    assert not sr._streams and not sr._removed
    assert m.tracked_streams == 0 and not m._closed
    # label children are cached per label set, not per stream
    assert len(m._children) < 40
    chain.close()


def test_token_batches_are_bounded_by_chunks_past_their_first_stream(tmp_path: Path) -> None:
    events = _many(3)
    chain = RecordingChain.from_config(RecordingOptions())
    chain.attach(StoreWriter(str(tmp_path / "c.db")))
    chain.write(events)
    chain.flush()
    assert chain.collector is not None
    n = chain.tokens_ready
    assert n >= 2
    first = chain.collector.take(limit=100, max_chunks=1)
    assert len(first) == 1  # one stream always goes, however long
    rest = chain.collector.take(limit=100)
    assert len(rest) == n - 1
    chain.close()


def _token_rows(db: Path) -> list[tuple[object, ...]]:
    return rows(
        db,
        "select s.stream_id, s.prompt_ids, c.choice, c.text_len, c.text_hash, c.output_ids "
        "from stream_tokens s join choice_tokens c using (stream_id) order by 1, 3",
    )


def test_the_redactor_hands_its_spans_to_the_collector_with_the_same_rows(
    tmp_path: Path,
) -> None:
    """The redaction transform hands the token collector what it redacted in
    each closed stream (nothing, or per choice its spans): the token rows are
    those the collector's replay of the look-behind gives."""
    from dataclasses import replace

    events = _many(2)
    # the second copy's output carries an email address split over two chunks
    chunks = [e for e in events if isinstance(e, ChunkEvent) and e.stream >= 1000 and e.text]
    assert len(chunks) >= 2
    pii = {id(chunks[0]): "write to bob.smith@exa", id(chunks[1]): "mple.com today "}
    events = [replace(e, text=pii[id(e)]) if id(e) in pii else e for e in events]
    results = []
    for track in (True, False):
        db = tmp_path / f"{track}.db"
        chain = RecordingChain.from_config(RecordingOptions())
        assert chain.stream_redactor is not None and chain.stream_redactor.track_redactions
        chain.stream_redactor.track_redactions = track
        chain.attach(StoreWriter(str(db)))
        chain.write(events)
        chain.flush()
        assert chain.collector is not None
        ready = chain.collector._ready_by_id
        handed = {sid for sid, s in ready.items() if s.handed}
        redacted = {sid for sid, s in ready.items() if s.redactions is not None}
        opened = {e.stream for e in events if isinstance(e, StreamOpened)}
        assert handed == (opened if track else set())
        assert redacted == ({i for i in opened if i >= 1000} if track else set())
        chain.tokenize()
        chain.close()
        results.append(_token_rows(db))
    assert results[0] == results[1] and results[0]
    # the redacted stream's ids are masked where the address was
    masked = [r for r in results[0] if r[0] >= 1000]
    assert masked and "-1" in str(masked[0][5])


def test_a_sampler_before_the_redactor_turns_the_hand_over_off() -> None:
    chain = RecordingChain.from_config(RecordingOptions(sample_rate=0.5))
    assert chain.stream_redactor is not None and not chain.stream_redactor.track_redactions


def test_forgotten_connections_are_freed_without_the_cycle_collector() -> None:
    """The daemon's GC thresholds make full collections rare: a connection the
    reassembly forgets must be freed by reference counting (no cycles), or
    RSS grows by ~1.6 KB per stream until the next full collection."""
    import gc

    from sniffer.capture.pcap import read_capture
    from sniffer.core.pipeline import Pipeline

    segs = list(read_capture(PCAP))
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        pipe = Pipeline()
        for s in segs:
            pipe.feed(s)
        pipe.expire(segs[-1].ts + 5_000)  # idle ones close ...
        pipe.expire(segs[-1].ts + 10_000)  # ... and closed ones are forgotten
        assert pipe.open_connections == 0
        gc.collect()
        kinds = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not kinds & {"_Conn", "_Half"}
    del pipe
