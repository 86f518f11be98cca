"""``sparseety verify``: replayed fixtures, crafted streams, seed-format JSONL."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from sniffer.cli.verify import tokenize as tokenize_cmd
from sniffer.cli.verify import verify as verify_cmd
from sniffer.core.events import LOSSY_FLAGS, StreamFlag, StreamState
from sniffer.llm.tokens import TokenizerRegistry, TokenizerSpec, default_tokenizer_dir
from sniffer.reports.export import export_jsonl
from sniffer.reports.verify import StreamVerdict, verify_db, verify_jsonl
from sniffer.runtime.replay import replay
from sniffer.store.db import EngineStore, Store
from sniffer.store.writer import StoreWriter, make_engine, open_store
from tests.test_tokenize_pass import CHINESE, EMOJI, ENGLISH, write_stream

PCAPS = Path(__file__).resolve().parent.parent / "pcaps"
REGISTRY = TokenizerRegistry()
#: a registry where "ds-*" models have a configured tokenizer (the same files)
CONFIGURED = TokenizerRegistry([TokenizerSpec("ds-*", str(default_tokenizer_dir()))])


# Every fixture by name: the recordings in pcaps/ and the crafted faults in pcaps/faults/.
FIXTURE_PATHS = {
    p.stem: p for p in PCAPS.rglob("*.pcap") if p.with_suffix(".expected.json").exists()
}


def _expected(name: str) -> dict[str, Any]:
    path = FIXTURE_PATHS[name].with_suffix(".expected.json")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


ALL_FIXTURES = sorted(FIXTURE_PATHS)
COMPLETE = [
    n
    for n in ALL_FIXTURES
    if _expected(n)["streams"]
    and all(
        s["state"] == "complete" and not set(s.get("flags") or ()) & LOSSY_FLAGS
        for s in _expected(n)["streams"]
    )
]
#: Fixtures with a stream complete on the wire that the tool dropped an item of.
LOSSY = [
    n
    for n in ALL_FIXTURES
    if any("item-over-cap" in (s.get("flags") or ()) for s in _expected(n)["streams"])
]


@pytest.fixture(scope="module")
def fixture_dbs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out: dict[str, Path] = {}
    root = tmp_path_factory.mktemp("fx")
    for name in ALL_FIXTURES:
        db = root / f"{name}.db"
        replay(FIXTURE_PATHS[name], str(db))
        out[name] = db
    return out


def kinds(v: StreamVerdict, level: str | None = None) -> set[str]:
    return {f.kind for f in v.findings if level is None or f.level == level}


# --------------------------------------------------------------- fixtures


def test_complete_fixtures_present() -> None:
    assert {"chat_english", "chat_cjk", "fffd", "n2", "include_usage"} <= set(COMPLETE)


@pytest.mark.parametrize("name", COMPLETE)
def test_every_complete_fixture_verifies(fixture_dbs: dict[str, Path], name: str) -> None:
    result = CliRunner().invoke(verify_cmd, ["--db", str(fixture_dbs[name])])
    assert result.exit_code == 0, result.output
    assert "✓" in result.output and "✗" not in result.output
    report = verify_db(open_store(str(fixture_dbs[name])), REGISTRY)
    assert report.ok and report.streams
    for v in report.streams:
        assert "tokenizer_default" in kinds(v, "warn")
        assert v.tokens is not None and v.tokenizer == "default:deepseek-v4"


@pytest.mark.parametrize("name", LOSSY)
def test_a_stream_the_tool_dropped_an_item_of_fails_by_its_flag(
    fixture_dbs: dict[str, Path], name: str
) -> None:
    """cap_sse_line, cap_ndjson_line: complete on the wire, an item over the line
    cap dropped: verify fails that stream on the flag alone, passes the canary."""
    flagged, canary = verify_db(open_store(str(fixture_dbs[name])), REGISTRY).streams
    assert kinds(flagged, "fail") == {"item-over-cap"} and not flagged.ok
    assert flagged.state == "complete" and canary.ok


def test_fault_lost_fails_with_gap(fixture_dbs: dict[str, Path]) -> None:
    report = verify_db(open_store(str(fixture_dbs["fault_lost"])), REGISTRY)
    (v,) = report.streams
    assert not v.ok and "gap" in kinds(v, "fail")
    result = CliRunner().invoke(verify_cmd, ["--db", str(fixture_dbs["fault_lost"])])
    assert result.exit_code == 1 and "gap" in result.output and "✗" in result.output


def test_overlap_mismatch_fails_the_flagged_streams_only(fixture_dbs: dict[str, Path]) -> None:
    """Bytes that arrived twice with different content fail their stream in
    verify (the stored copy may not be what the endpoint read), though its state
    is complete; the clean exchange after them and the canary pass."""
    report = verify_db(open_store(str(fixture_dbs["fault_overlap_mismatch"])), REGISTRY)
    assert [v.state for v in report.streams] == ["complete"] * 4
    flagged = [v for v in report.streams if "overlap-mismatch" in kinds(v, "fail")]
    assert len(flagged) == 2 and all(kinds(v, "fail") == {"overlap-mismatch"} for v in flagged)
    assert sum(v.ok for v in report.streams) == 2 and not report.ok
    # a clock that went backwards only warns: the fixture verifies
    clock = verify_db(open_store(str(fixture_dbs["fault_clock_backwards"])), REGISTRY)
    assert clock.ok
    warned = [
        "clock-backwards" in kinds(v, "warn")
        for v in sorted(clock.streams, key=lambda v: v.stream_id or 0)
    ]
    assert warned == [True, False, False]  # exchange 0 only


def test_client_abort_fails_truncated(fixture_dbs: dict[str, Path]) -> None:
    (v,) = verify_db(open_store(str(fixture_dbs["client_abort"])), REGISTRY).streams
    assert v.state == "truncated"
    assert {"truncated", "finish_missing"} <= kinds(v, "fail")


def test_fffd_warns_replacement_char(fixture_dbs: dict[str, Path]) -> None:
    report = verify_db(open_store(str(fixture_dbs["fffd"])), REGISTRY, tokens=True)
    assert report.ok and len(report.streams) == 2
    for v in report.streams:
        assert "replacement_char" in kinds(v, "warn")
        toks = v.first_tokens[0]
        assert len(toks) == 20 and all(isinstance(i, int) and isinstance(t, str) for i, t in toks)


def test_usage_mismatch_of_fake_server_is_only_a_warning(fixture_dbs: dict[str, Path]) -> None:
    # the fixture server counts one "token" per chunk; DeepSeek counts differ
    (v,) = verify_db(open_store(str(fixture_dbs["include_usage"])), REGISTRY).streams
    assert v.ok and "usage_mismatch" in kinds(v, "warn")


def test_cli_tokens_json_and_usage_errors(fixture_dbs: dict[str, Path]) -> None:
    db = str(fixture_dbs["chat_english"])
    r = CliRunner().invoke(verify_cmd, ["--db", db, "--json", "--tokens"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["ok"] and data["failed"] == 0 and data["results"][0]["first_tokens"]["0"]
    r = CliRunner().invoke(verify_cmd, ["--db", db, "--jsonl", db, "--label", "x"])
    assert r.exit_code == 2
    r = CliRunner().invoke(verify_cmd, ["--db", db, "--stream", "999"])
    assert r.exit_code == 1 and "no stream 999" in r.output
    r = CliRunner().invoke(verify_cmd, ["--db", db, "--tokenizer", "nonsense"])
    assert r.exit_code == 2


# ---------------------------------------------------------- crafted streams


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return open_store(str(tmp_path / "v.db"))


def one(store: Store, registry: TokenizerRegistry = REGISTRY) -> StreamVerdict:
    (v,) = verify_db(store, registry).streams
    return v


def test_clean_crafted_stream(store: Store) -> None:
    with StoreWriter("", engine=store.engine) as w:
        write_stream(w, 1, ENGLISH, model="ds-v4")
    v = one(store, CONFIGURED)
    assert v.ok and v.tokenizer == str(default_tokenizer_dir())
    assert "tokenizer_default" not in kinds(v)
    assert v.chunks == len(ENGLISH) and v.text_len == len("".join(ENGLISH))


def test_fffd_deltas_warn(store: Store) -> None:
    with StoreWriter("", engine=store.engine) as w:
        write_stream(w, 1, ["你", "\ufffd", "\ufffd好", "。"], model="ds-v4")
    v = one(store, CONFIGURED)
    assert v.ok and "replacement_char" in kinds(v, "warn")
    (f,) = [f for f in v.findings if f.kind == "replacement_char"]
    assert f.count == 2 and f.level == "warn"


def test_usage_disagreement(store: Store) -> None:
    with StoreWriter("", engine=store.engine) as w:
        write_stream(w, 1, CHINESE, model="ds-v4", usage={"completion_tokens": 1000})
        write_stream(w, 2, CHINESE, model="other", usage={"completion_tokens": 1000})
    v1, v2 = verify_db(store, CONFIGURED).streams
    assert not v1.ok and kinds(v1, "fail") == {"usage_mismatch"}
    assert v2.ok and {"usage_mismatch", "tokenizer_default"} <= kinds(v2, "warn")


def test_gap_stream(store: Store) -> None:
    with StoreWriter("", engine=store.engine) as w:
        write_stream(
            w,
            1,
            ENGLISH[:2],
            model="ds-v4",
            state=StreamState.GAP,
            gap=True,
            finish=None,
            done=False,
        )
    v = one(store, CONFIGURED)
    assert kinds(v, "fail") == {"gap", "finish_missing"}
    assert sum(1 for f in v.findings if f.kind == "gap") == 1  # not repeated by the token pass


def test_every_stream_flag_is_a_finding_and_lossy_ones_fail(store: Store) -> None:
    """``streams.flags`` comes back from the store; each flag is a finding of its
    name, failing the stream exactly when it is in ``LOSSY_FLAGS``; a flag this
    code does not know (a newer writer's) warns."""
    with StoreWriter("", engine=store.engine) as w:
        for sid, flag in enumerate(StreamFlag, start=1):
            write_stream(w, sid, ENGLISH, model="ds-v4", flags=[flag])
    verdicts = verify_db(store, CONFIGURED).streams
    assert len(verdicts) == len(StreamFlag)
    for flag, v in zip(StreamFlag, verdicts, strict=True):
        assert str(flag) in kinds(v, "fail" if flag in LOSSY_FLAGS else "warn"), v.findings
        assert kinds(v, "fail") == ({str(flag)} if flag in LOSSY_FLAGS else set())
        assert v.ok is (flag not in LOSSY_FLAGS)
    with store.transaction() as tx:
        tx.run("UPDATE streams SET flags = ?", ['["clock-backwards", "newer-flag"]'])
    for v in verify_db(store, CONFIGURED).streams:
        assert {"clock-backwards", "newer-flag"} <= kinds(v, "warn")


def test_index_gap_counts_and_lengths(store: Store) -> None:
    with StoreWriter("", engine=store.engine) as w:
        write_stream(w, 1, ENGLISH[:3], model="ds-v4", indexes=[1, 3, 4])
        write_stream(w, 2, ENGLISH[:3], model="ds-v4", chunk_count=7)
        write_stream(w, 3, ENGLISH[:3], model="ds-v4", text_len=5)
    v1, v2, v3 = verify_db(store, CONFIGURED).streams
    assert kinds(v1, "fail") == {"index_gap"}
    assert "chunk_index 3 after 1" in v1.findings[0].detail
    assert kinds(v2, "fail") == {"chunk_count"}
    assert kinds(v3, "fail") == {"text_len"}


def test_text_changed_after_tokenizing(store: Store) -> None:
    with StoreWriter("", engine=store.engine) as w:
        write_stream(w, 1, ENGLISH, model="ds-v4")
    assert one(store, CONFIGURED).ok
    with store.transaction() as tx:  # same length, different text
        tx.run("UPDATE chunks SET text = ? WHERE seq = 1", ["THE QUICK"])
    v = one(store, CONFIGURED)
    assert kinds(v, "fail") == {"text_mismatch"}


def test_content_after_finish_and_finish_missing(store: Store) -> None:
    with StoreWriter("", engine=store.engine) as w:
        write_stream(w, 1, ENGLISH[:2], model="ds-v4", late=[" extra"])
        write_stream(
            w, 2, ENGLISH[:2], model="ds-v4", finish=None, done=False, state=StreamState.TRUNCATED
        )
        # ended by the server's end marker and judged complete: only a warning
        write_stream(w, 3, ENGLISH[:2], model="ds-v4", finish=None)
    v1, v2, v3 = verify_db(store, CONFIGURED).streams
    assert kinds(v1, "fail") == {"content_after_finish"}
    assert kinds(v2, "fail") == {"truncated", "finish_missing"}
    assert v3.ok and "finish_missing" in kinds(v3, "warn")


def test_server_token_mismatch(store: Store) -> None:
    lp = [json.dumps({"content": [{"token": t}]}) for t in ["Hello", " world", "?"]]
    with StoreWriter("", engine=store.engine) as w:
        write_stream(w, 1, ["Hello", " world", "!"], model="ds-v4", logprobs=lp)
    v = one(store, CONFIGURED)
    assert kinds(v, "fail") == {"server_token_mismatch"}
    assert "at 2" in v.findings[0].detail


def test_not_tokenized_warns(store: Store) -> None:
    with StoreWriter("", engine=store.engine) as w:
        write_stream(w, 1, ENGLISH)
    (v,) = verify_db(store, REGISTRY, tokenize=False).streams
    assert v.ok and kinds(v) == {"not_tokenized"} and v.tokens is None


def test_tokenize_command(tmp_path: Path) -> None:
    db = str(tmp_path / "c.db")
    with StoreWriter(db) as w:
        write_stream(w, 1, EMOJI)
    r = CliRunner().invoke(tokenize_cmd, ["--db", db, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["streams"] == 1
    r = CliRunner().invoke(tokenize_cmd, ["--db", db, "--json"])
    assert json.loads(r.output)["streams"] == 0
    r = CliRunner().invoke(tokenize_cmd, ["--db", db, "--json", "--redo"])
    assert json.loads(r.output)["streams"] == 1


# --------------------------------------------------------------------- JSONL


def test_export_then_verify_jsonl(fixture_dbs: dict[str, Path], tmp_path: Path) -> None:
    for name, ok in [("chat_english", True), ("n2", True), ("fault_lost", False)]:
        buf = io.StringIO()
        export_jsonl(open_store(str(fixture_dbs[name])), buf)
        path = tmp_path / f"{name}.jsonl"
        path.write_text(buf.getvalue(), encoding="utf-8")
        r = CliRunner().invoke(verify_cmd, ["--jsonl", str(path)])
        assert r.exit_code == (0 if ok else 1), r.output
        report = verify_jsonl(buf.getvalue().splitlines(), REGISTRY)
        db_report = verify_db(open_store(str(fixture_dbs[name])), REGISTRY)
        assert [v.tokens for v in report.streams] == [v.tokens for v in db_report.streams]


def _seed_log(broken_line: int | None = None) -> list[str]:
    """An old-lab log: no stream_id, no choice_index; two streams."""
    lines: list[dict[str, Any]] = []
    for text in (ENGLISH, CHINESE):
        lines.append({"event": "request_start", "model": "m", "prompt_len": 1, "stream": True})
        acc = 0
        for k, piece in enumerate(text, 1):
            acc += len(piece)
            lines.append(
                {
                    "event": "chunk",
                    "chunk_index": k,
                    "delta_text": piece,
                    "delta_len": len(piece),
                    "accumulated_len": acc,
                    "finish_reason": "stop" if k == len(text) else None,
                }
            )
        lines.append(
            {
                "event": "stream_done",
                "chunk_count": len(text),
                "total_text_len": acc,
                "complete": True,
            }
        )
    if broken_line is not None:
        lines[broken_line - 1]["accumulated_len"] += 3
    return [json.dumps(r, ensure_ascii=False) for r in lines]


def test_seed_log_without_stream_ids(tmp_path: Path) -> None:
    report = verify_jsonl(_seed_log(), REGISTRY)
    assert report.ok and [v.line for v in report.streams] == [1, 8]
    assert [v.chunks for v in report.streams] == [5, 5]
    path = tmp_path / "seed.jsonl"
    path.write_text("\n".join(_seed_log(broken_line=10)) + "\n", encoding="utf-8")
    r = CliRunner().invoke(verify_cmd, ["--jsonl", str(path)])
    assert r.exit_code == 1
    assert "accumulated_len: line 10: accumulated_len" in r.output
    (bad,) = [v for v in verify_jsonl(_seed_log(broken_line=10), REGISTRY).streams if not v.ok]
    assert bad.line == 8 and kinds(bad, "fail") == {"accumulated_len"}
    assert bad.findings[0].line == 10


def test_seed_log_bad_json_and_missing_done() -> None:
    lines = _seed_log()
    lines[3] = "{not json"
    del lines[-1]
    v1, v2 = verify_jsonl(lines, REGISTRY).streams
    assert {"bad_record", "accumulated_len", "index_gap"} <= kinds(v1, "fail")
    assert any(f.line == 4 for f in v1.findings if f.kind == "bad_record")
    assert kinds(v2, "fail") == {"stream_done_missing"}


# ------------------------------------------- SQLite through the stdlib driver


def test_stdlib_path_gives_the_same_report(fixture_dbs: dict[str, Path]) -> None:
    """``verify`` reads a SQLite file at head without SQLAlchemy (``open_store``):
    the report is the one an engine (``EngineStore``) gives, whatever the filters,
    on every fixture."""
    from sniffer.store.lite import SqliteFile

    cases: list[dict[str, Any]] = [
        {},
        {"tokens": True},
        {"include_http": True},
        {"state": "complete"},
        {"label": "nope"},
        {"node": "nope"},
        {"model": "fake"},
        {"stream_ids": [2, 1, 999]},
        {"stream_ids": []},
        {"tokenize": False, "batch": 1},
    ]
    for name in ALL_FIXTURES:
        store = open_store(str(fixture_dbs[name]))
        assert isinstance(store, SqliteFile)
        engine = EngineStore(make_engine(str(fixture_dbs[name])), owned=True)
        verify_db(engine, REGISTRY, include_http=True)  # token rows written first
        try:
            for kw in cases:
                got = verify_db(store, REGISTRY, **kw).to_dict()
                assert got == verify_db(engine, REGISTRY, **kw).to_dict(), (name, kw)
        finally:
            store.close()
            engine.close()


def test_stdlib_path_tokenizes_what_is_missing(tmp_path: Path) -> None:
    """Streams without token rows are tokenized first on both paths (the stdlib path
    counts them with the token pass's own filter)."""
    from sniffer.record.tokenize_pass import pending_count
    from sniffer.store.lite import SqliteFile
    from sniffer.store.queries import untokenized_count

    reports = []
    for i in range(2):
        db = tmp_path / f"{i}.db"
        for name in ("n2", "fffd", "client_abort", "keepalive_3", "fault_lost"):
            replay(FIXTURE_PATHS[name], str(db))  # no token pass
        engine = EngineStore(make_engine(str(db)), owned=True)
        store = SqliteFile(str(db))
        try:
            listed = verify_db(store, REGISTRY, tokenize=False, include_http=True)
            ids = [v.stream_id for v in listed.streams if v.stream_id is not None]
            assert untokenized_count(store, ids) == pending_count(engine) > 0
            reports.append(verify_db(store if i else engine, REGISTRY).to_dict())
            assert untokenized_count(store, ids) == pending_count(engine) == 0
        finally:
            store.close()
            engine.close()
    assert reports[0]["tokenized"] > 0
    assert reports[0].pop("source").endswith("/0.db")
    assert reports[1].pop("source") == f"sqlite:///{tmp_path / '1.db'}"
    assert reports[0] == reports[1]


def test_token_rows_read_without_sqlalchemy(fixture_dbs: dict[str, Path]) -> None:
    from sniffer.record.tokenize_pass import text_hash as pass_hash
    from sniffer.store.lite import SqliteFile
    from sniffer.store.tokens_store import read_token_rows, text_hash

    for name in ALL_FIXTURES:
        store = SqliteFile(str(fixture_dbs[name]))
        engine = EngineStore(make_engine(str(fixture_dbs[name])), owned=True)
        try:
            ids = [*range(1, 12), 10**6]
            got = read_token_rows(store, ids)
            assert got == read_token_rows(engine, ids), name
        finally:
            store.close()
            engine.close()
    for text in ("", "abc", "中文 🙂", "\ud83d lone surrogate"):
        assert text_hash(text) == pass_hash(text)
