"""The batch token pass: DB in, token rows out, with the real DeepSeek-V4 tokenizer."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sniffer.core.events import ChunkEvent, StreamClosed, StreamFlag, StreamOpened, StreamState
from sniffer.llm.tokens import DEFAULT_NAME, AnomalyColumns, TokenizerRegistry
from sniffer.llm.values import RequestSummary, Usage
from sniffer.record.tokenize_pass import (
    TokenizeResult,
    _write,
    pending_count,
    text_hash,
    tokenize_db,
)
from sniffer.store import spec
from sniffer.store.db import EngineStore, Store
from sniffer.store.lite import INSERT_MANY_ROWS, SqliteFile, insert_sql
from sniffer.store.tokens_store import (
    ChoiceTokenRow,
    StreamTokenRow,
    TokenAnomalyRow,
    _choice_values,
    _stream_values,
    chunk_token_ids,
    read_token_rows,
    write_token_rows,
)
from sniffer.store.writer import StoreWriter, make_engine, open_store

ENGLISH = ["The quick", " brown fox", " jumps over", " the lazy dog.", " Isn't it?"]
CHINESE = ["你好，", "世界！今天", "是星期一。", "我们去公园", "散步吧。"]
EMOJI = ["Family: 👨‍👩", "‍👧‍👦 and ", "flags 🇫🇷🇩🇪", ", thumbs 👍🏽", " done 🎉."]
CODE = [
    "def fib(n",
    ": int) -> int:\n",
    "    if n < 2:\n        return n\n",
    "    return fib(n - 1)",
    "\n",
]

REGISTRY = TokenizerRegistry()


def write_stream(
    w: StoreWriter,
    sid: int,
    pieces: Sequence[str],
    *,
    model: str = "deepseek-v4",
    choice: int = 0,
    finish: str | None = "stop",
    state: StreamState = StreamState.COMPLETE,
    request: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
    gap: bool = False,
    done: bool = True,
    close: bool = True,
    dialect: str | None = "openai.chat",
    indexes: Sequence[int] | None = None,
    chunk_count: int | None = None,
    text_len: int | None = None,
    logprobs: Sequence[str | None] | None = None,
    late: Sequence[str] = (),
    flags: Sequence[StreamFlag] = (),
) -> None:
    """One stream as the pipeline would write it: role prelude, content deltas,
    finish chunk, optional usage chunk, [DONE], close."""
    req = request or {
        "model": model,
        "stream": True,
        "messages": [{"role": "user", "content": "Say something."}],
    }
    w.write(
        StreamOpened(
            sid,
            sid,
            0,
            float(sid),
            ("127.0.0.1", 40000 + sid),
            ("127.0.0.1", 8000),
            "POST",
            "/v1/chat/completions",
            (),
            json.dumps(req),
            RequestSummary(model=model, stream=True),
            dialect,
        )
    )
    seq = 0
    w.write(ChunkEvent(sid, sid + 0.1, seq, choice, 0, "role"))
    idx = list(indexes) if indexes is not None else list(range(1, len(pieces) + 1))
    for k, p in enumerate(pieces):
        seq += 1
        lp = logprobs[k] if logprobs is not None else None
        w.write(
            ChunkEvent(sid, sid + 0.1 + seq / 1000, seq, choice, idx[k], "content", p, logprobs=lp)
        )
    if finish is not None:
        seq += 1
        w.write(ChunkEvent(sid, sid + 0.5, seq, choice, 0, "finish", finish_reason=finish))
    for k, p in enumerate(late):
        seq += 1
        w.write(ChunkEvent(sid, sid + 0.6, seq, choice, len(pieces) + k + 1, "content", p))
    if usage is not None:
        seq += 1
        w.write(ChunkEvent(sid, sid + 0.7, seq, -1, 0, "usage", usage=Usage.parse(usage)))
    if done:
        seq += 1
        w.write(ChunkEvent(sid, sid + 0.8, seq, -1, 0, "done"))
    if close:
        all_text = [*pieces, *late]
        w.write(
            StreamClosed(
                sid,
                sid + 0.9,
                state,
                state.value,
                done,
                gap,
                sid + 0.1,
                sid + 0.8,
                chunk_count if chunk_count is not None else len(all_text),
                seq + 1,
                text_len if text_len is not None else sum(map(len, all_text)),
                ((choice, finish),) if finish else (),
                Usage.parse(usage),
                None,
                flags=tuple(flags),
            )
        )


@pytest.fixture
def store(tmp_path: Any) -> Iterator[Store]:
    s = open_store(str(tmp_path / "t.db"))
    yield s
    s.close()


def test_real_texts_tokenized_per_chunk(store: Store) -> None:
    ds = REGISTRY.default()
    texts = [ENGLISH, CHINESE, EMOJI, CODE]
    with StoreWriter("", engine=store.engine) as w:
        for sid, pieces in enumerate(texts, 1):
            write_stream(w, sid, pieces)
    assert pending_count(store) == 4
    r = tokenize_db(store, REGISTRY)
    assert (r.streams, r.failed, r.batches) == (4, 0, 1)
    assert pending_count(store) == 0
    rows = read_token_rows(store, [1, 2, 3, 4])
    for sid, pieces in enumerate(texts, 1):
        row = rows[sid]
        full = "".join(pieces)
        assert row.tokenizer == DEFAULT_NAME and row.is_default
        assert row.prompt_ids and len(row.prompt_ids) > 3
        (c,) = row.choices
        assert list(c.output_ids) == ds.encode_batch([full])[0]
        assert ds.decode(c.output_ids) == full
        assert c.text_len == len(full) and c.text_hash == text_hash(full)
        per = chunk_token_ids(c)
        assert [seq for seq, _ in per] == list(range(1, len(pieces) + 1))
        assert [t for _, ids in per for t in ids] == list(c.output_ids)
        assert sum(c.tokens_per_chunk.values()) == len(pieces)
        assert len(c.straddle_seqs) == sum(1 for a in row.anomalies if a.kind == "straddle")
    assert r.tokens == sum(len(rows[s].choices[0].output_ids) for s in rows)
    # the emoji stream cuts a ZWJ sequence: a token straddles a chunk boundary
    assert rows[3].choices[0].straddle_seqs
    # a second pass finds nothing to do
    assert tokenize_db(store, REGISTRY).streams == 0


def test_open_and_http_streams_are_skipped_then_picked_up(store: Store) -> None:
    with StoreWriter("", engine=store.engine) as w:
        write_stream(w, 1, ENGLISH, close=False)
        write_stream(w, 2, ENGLISH, dialect=None)
        write_stream(w, 3, ENGLISH)
    r = tokenize_db(store, REGISTRY)
    assert r.streams == 1
    assert set(read_token_rows(store, [1, 2, 3])) == {3}
    with StoreWriter("", engine=store.engine) as w:
        w.write(
            StreamClosed(
                1, 9.0, StreamState.COMPLETE, "x", True, False, None, None, 5, 7, 53, (), None, None
            )
        )
    assert tokenize_db(store, REGISTRY).streams == 1
    assert set(read_token_rows(store, [1, 2, 3])) == {1, 3}


def test_batches_limit_ids_and_progress(store: Store) -> None:
    with StoreWriter("", engine=store.engine) as w:
        for sid in range(1, 8):
            write_stream(w, sid, ENGLISH[: 1 + sid % 5])
    seen: list[tuple[int, int]] = []
    r = tokenize_db(store, REGISTRY, batch=2, limit=5, progress=lambda a, b: seen.append((a, b)))
    assert (r.streams, r.batches) == (5, 3)
    assert seen == [(2, 5), (4, 5), (5, 5)]
    r = tokenize_db(store, REGISTRY, stream_ids=[7])
    assert r.streams == 1
    assert set(read_token_rows(store, range(1, 8))) == {1, 2, 3, 4, 5, 7}


def test_collision_with_another_pass_is_skipped(store: Store) -> None:
    with StoreWriter("", engine=store.engine) as w:
        write_stream(w, 1, ENGLISH)
        write_stream(w, 2, CHINESE)
    from sniffer.record.tokenize_pass import _analyze, build_inputs

    rows = _analyze(REGISTRY, build_inputs(store.select("streams"), store.select("chunks")))
    with store.transaction() as tx:  # "the other pass" wrote stream 1 first
        write_token_rows(tx, rows[:1])
    result = TokenizeResult()
    written = _write(store, rows, result)
    assert [r.stream_id for r in written] == [2] and result.skipped == 1
    assert store.scalar("SELECT count(*) FROM stream_tokens") == 2


def test_usage_and_server_tokens_stored(store: Store) -> None:
    ds = REGISTRY.default()
    pieces = ["Hello", " world", "!"]
    ids = ds.encode_batch(["".join(pieces)])[0]
    toks = [ds.token_text(i) for i in ids]
    lp = [json.dumps({"content": [{"token": t}]}) for t in toks]
    lp[-1] = json.dumps({"content": [{"token": "?"}]})  # the server says "?" at the end
    with StoreWriter("", engine=store.engine) as w:
        write_stream(w, 1, pieces, usage={"prompt_tokens": 1, "completion_tokens": 99}, logprobs=lp)
    tokenize_db(store, REGISTRY)
    row = read_token_rows(store, [1])[1]
    (c,) = row.choices
    assert c.server_tokens == (*tuple(toks[:-1]), "?")
    assert c.server_ids is not None and list(c.server_ids[:-1]) == ids[:-1]
    assert c.server_mismatch == len(ids) - 1
    assert row.usage_diff["completion_tokens"] == 99 - len(ids)
    assert row.usage_diff["prompt_tokens"] == 1 - len(row.prompt_ids or ())
    kinds = sorted({a.kind for a in row.anomalies})
    assert kinds == ["server_token_mismatch", "usage_mismatch"]


def test_stored_json_text_is_compact_with_string_keys(store: Store) -> None:
    # the exact text of the JSON columns (verify and other tools read it back)
    ds = REGISTRY.default()
    pieces = ["hello world", " foo", " bar"]
    with StoreWriter("", engine=store.engine) as w:
        write_stream(w, 1, pieces, usage={"prompt_tokens": 1, "completion_tokens": 3})
    tokenize_db(store, REGISTRY)
    (stream_row,) = store.query(
        "SELECT prompt_ids, usage_diff, tokens_per_chunk FROM stream_tokens"
    )
    (choice_row,) = store.query(
        "SELECT output_ids, chunk_seqs, chunk_counts, straddle_seqs, tokens_per_chunk,"
        " server_tokens, server_ids FROM choice_tokens"
    )
    ids = ds.encode_batch(["".join(pieces)])[0]
    prompt = ds.prompt_ids({"messages": [{"role": "user", "content": "Say something."}]})
    assert tuple(stream_row) == (
        json.dumps(prompt, separators=(",", ":")),
        f'{{"completion_tokens":-1,"prompt_tokens":{1 - len(prompt)}}}',
        '{"1":2,"2":1}',
    )
    assert tuple(choice_row) == (
        json.dumps(ids, separators=(",", ":")),
        "[1,2,3]",
        "[2,1,1]",
        "[]",
        '{"1":2,"2":1}',
        None,
        None,
    )


def test_json_columns_orjson_refuses_are_written_by_json() -> None:
    """A row's JSON columns are made by orjson inline; a value it refuses
    (an integer past 64 bits: a request's token-id prompt may hold one)
    makes the row's columns through ``_dumps`` (``json`` for that value),
    the same texts."""
    from sniffer.store.tokens_store import (
        ChoiceTokenRow,
        StreamTokenRow,
        _choice_values,
        _stream_values,
    )

    big = 2**70
    row = StreamTokenRow(7, "t", True, (big, 1), {"prompt_tokens": -1}, {1: 2})
    values = _stream_values(row)
    assert values[3:5] == (2, f"[{big},1]")
    assert values[6:8] == ('{"prompt_tokens":-1}', '{"1":2}')
    assert _stream_values(replace(row, prompt_ids=None))[3:5] == (None, None)
    choice = ChoiceTokenRow(0, 3, "h", (5, big), (1, 2), (1, 1), (), {1: 2})
    assert _choice_values(7, choice)[4:11] == (
        2,
        f"[5,{big}]",
        "[1,2]",
        "[1,1]",
        0,
        "[]",
        '{"1":2}',
    )


@settings(
    max_examples=25,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    text=st.sampled_from(["".join(t) for t in (ENGLISH, CHINESE, EMOJI, CODE)]),
    cuts=st.lists(st.integers(0, 80), max_size=12),
)
def test_random_splits_through_the_db(tmp_path_factory: Any, text: str, cuts: list[int]) -> None:
    """Deltas cut at random offsets: per-chunk ids concatenate to the full encoding."""
    store = open_store(str(tmp_path_factory.mktemp("p") / "p.db"))
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    pieces = [text[a:b] for a, b in itertools.pairwise(points) if b > a]
    with StoreWriter("", engine=store.engine) as w:
        write_stream(w, 1, pieces)
    assert tokenize_db(store, REGISTRY).streams == 1
    (c,) = read_token_rows(store, [1])[1].choices
    assert list(c.output_ids) == REGISTRY.default().encode_batch([text])[0]
    per = chunk_token_ids(c)
    assert len(per) == len(pieces)
    assert [t for _, ids in per for t in ids] == list(c.output_ids)
    assert c.text_hash == text_hash(text)
    store.close()


def test_token_rows_on_postgresql_match_sqlite(store: Store, fresh_pg_url: str) -> None:
    """The rows go straight through the driver's executemany (positional on
    SQLite, named on psycopg): both databases read back the same rows."""
    ds = REGISTRY.default()
    ids = ds.encode_batch(["Hello world!"])[0]
    lp = [json.dumps({"content": [{"token": ds.token_text(i)}]}) for i in ids]
    pg = open_store(fresh_pg_url)
    try:
        got = []
        for db in (store, pg):
            with StoreWriter("", engine=db.engine) as w:
                write_stream(w, 1, ENGLISH, usage={"prompt_tokens": 1, "completion_tokens": 9})
                write_stream(w, 2, ["Hello", " world", "!"], logprobs=lp)
                write_stream(w, 3, EMOJI, finish=None)
            result = tokenize_db(db, REGISTRY)
            assert result.streams == 3 and not result.write_errors
            got.append(read_token_rows(db, [1, 2, 3]))
        assert got[0] == got[1] and len(got[0]) == 3
        assert got[0][2].choices[0].server_tokens is not None
        assert got[0][1].anomalies and got[0][1].is_default is True
    finally:
        pg.close()


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 3)), max_size=40))
def test_straddle_seqs_repeat_each_chunk_per_straddling_token(
    chunks: list[tuple[int, int]],
) -> None:
    from sniffer.llm.tokens import ChoiceChunks
    from sniffer.record.tokenize_pass import _straddle_seqs

    seqs = [s for s, _ in chunks]
    straddles = [n for _, n in chunks]
    cc = ChoiceChunks(seqs, [1] * len(seqs), straddles, "")
    assert _straddle_seqs(cc) == tuple(s for s, n in chunks for _ in range(n))
    assert _straddle_seqs(None) == ()


def _many_token_rows(streams: int) -> list[StreamTokenRow]:
    """Token rows of ``streams`` streams with 0 to 12 anomalies each (NULL
    positions and an empty detail among them), one or two choices (runs with
    and without server tokens), runs with and without an error."""
    rows = []
    for sid in range(1, streams + 1):
        choices = tuple(
            ChoiceTokenRow(
                choice=ch,
                text_len=sid + ch,
                text_hash=f"{sid:032x}",
                output_ids=tuple(range(sid % 5)),
                chunk_seqs=(0, 1),
                chunk_counts=(sid % 3, sid % 2),
                straddle_seqs=(1,) * (sid % 2),
                tokens_per_chunk={sid % 3: 1},
                server_tokens=("a", "b") if sid % 4 == 0 else None,
                server_ids=(1, None) if sid % 4 == 0 else None,
                server_mismatch=1 if sid % 8 == 0 else None,
            )
            for ch in range(1 + sid % 2)
        )
        anomalies = tuple(
            TokenAnomalyRow(
                "straddle" if k % 3 else "gap", k % 2 - 1, k if k % 4 else None, "d" * k
            )
            for k in range(sid % 13)
        )
        rows.append(
            StreamTokenRow(
                stream_id=sid,
                tokenizer=None if sid % 9 == 0 else "t",
                is_default=sid % 2 == 0,
                prompt_ids=None if sid % 5 == 0 else (sid, 7),
                usage_diff={"completion_tokens": sid % 3},
                tokens_per_chunk={1: sid},
                anomaly_count=len(anomalies),
                error="failed" if sid % 11 == 0 else None,
                choices=choices,
                anomalies=anomalies,
            )
        )
    return rows


def _token_tables(store: Store) -> list[list[Any]]:
    return [
        store.query(f"SELECT * FROM {table} ORDER BY {', '.join(spec.TABLE_COLUMNS[table])}")
        for table in ("stream_tokens", "choice_tokens", "token_anomalies")
    ]


@pytest.mark.parametrize("kind", ["file", "engine"])
def test_token_rows_several_per_statement_as_one_per_row(tmp_path: Any, kind: str) -> None:
    """On SQLite the token rows go in several per statement (``insert_many``:
    ``INSERT_MANY_ROWS`` at most, then smaller statements); the tables, the
    anomaly ids included, are those one ``executemany`` row by row gives, for
    runs of many full statements of every table, in two calls whose runs end
    in smaller statements, on a SQLite file and on an engine."""
    rows = _many_token_rows(230)
    most = INSERT_MANY_ROWS
    assert len(rows) > 2 * most and sum(len(r.choices) for r in rows) > 2 * most
    assert sum(len(r.anomalies) for r in rows) > 999 // 5  # past one 999-parameter statement
    ref = open_store(str(tmp_path / "ref.db"))
    new: Store = open_store(str(tmp_path / "new.db"))
    if kind == "engine":
        new.close()
        new = EngineStore(make_engine(str(tmp_path / "new.db")), owned=True)
    assert isinstance(ref, SqliteFile)
    for store in (ref, new):  # an anomaly row there already: ids go on from it
        with store.transaction() as tx:
            tx.executemany(
                insert_sql("token_anomalies", spec.TABLE_COLUMNS["token_anomalies"][1:]),
                [(999, 0, "gap", None, "before")],
            )
    with ref.transaction() as tx:  # one statement per row (what the pass did before)
        tx.executemany(
            insert_sql("stream_tokens", spec.TABLE_COLUMNS["stream_tokens"]),
            [_stream_values(r) for r in rows],
        )
        tx.executemany(
            insert_sql("choice_tokens", spec.TABLE_COLUMNS["choice_tokens"]),
            [_choice_values(r.stream_id, c) for r in rows for c in r.choices],
        )
        tx.executemany(
            insert_sql("token_anomalies", spec.TABLE_COLUMNS["token_anomalies"][1:]),
            [
                (r.stream_id, a.choice, a.kind, a.position, a.detail)
                for r in rows
                for a in r.anomalies
            ],
        )
    # the token pass's rows hold their anomalies in columns: every other one so
    cols = [
        replace(r, anomalies=AnomalyColumns.of(r.anomalies)) if r.stream_id % 2 else r for r in rows
    ]
    assert sum(isinstance(r.anomalies, AnomalyColumns) for r in cols) == len(rows) // 2
    with new.transaction() as tx:
        write_token_rows(tx, cols[:150])
        write_token_rows(tx, cols[150:])
    got = _token_tables(new)
    assert got == _token_tables(ref)
    anomalies = got[2]
    assert [a[0] for a in anomalies] == list(range(1, len(anomalies) + 1))
    assert read_token_rows(new, [r.stream_id for r in rows]) == {r.stream_id: r for r in rows}
    ref.close()
    new.close()
