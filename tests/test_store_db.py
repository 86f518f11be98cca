"""Queries written once on a ``Store`` (``sniffer.store.db``) give the same answers on
a SQLite file (the standard library's driver) and on PostgreSQL (an engine):
``top``'s live queries, the token pass's, retention's, and the commands on them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sniffer.cli.main import main
from sniffer.llm.tokens import TokenizerRegistry
from sniffer.record.tokenize_pass import tokenize_db
from sniffer.runtime.replay import replay
from sniffer.store import live
from sniffer.store.db import EngineStore, Store
from sniffer.store.lite import SqliteFile
from sniffer.store.retention import prune, vacuum
from sniffer.store.tokens_store import (
    delete_token_rows,
    insert_token_rows,
    pending_count,
    read_pending,
    read_token_rows,
)
from sniffer.store.writer import StoreWriter, open_store
from tests.test_tokenize_pass import ENGLISH, write_stream

PCAPS = Path(__file__).resolve().parent.parent / "pcaps"
CAPTURES = ("keepalive_3.pcap", "n2.pcap", "concurrent_4.pcap", "faults/fault_lost.pcap")
REGISTRY = TokenizerRegistry()


def fill(target: str) -> None:
    """The same rows in either database: replayed captures (no token pass) and one
    stream left open, with chunks (what ``top`` shows as under way)."""
    for name in CAPTURES:
        replay(PCAPS / name, target, node="n1")
    with StoreWriter(target, node="n2") as w:
        write_stream(w, 900, ENGLISH, close=False)


@pytest.fixture
def stores(tmp_path: Path, fresh_pg_url: str) -> Iterator[tuple[Store, Store, str]]:
    lite = str(tmp_path / "s.db")
    for target in (lite, fresh_pg_url):
        fill(target)
    a, b = open_store(lite), open_store(fresh_pg_url)
    assert isinstance(a, SqliteFile) and isinstance(b, EngineStore) and b.name == "postgresql"
    yield a, b, fresh_pg_url
    a.close()
    b.close()


def test_live_queries_agree(stores: tuple[Store, Store, str]) -> None:
    a, b, _ = stores
    for node in (None, "n1", "n2", "none"):
        opened = live.open_streams(a, now=2e9, node=node, max_age=1e10)
        assert opened == live.open_streams(b, now=2e9, node=node, max_age=1e10), node
        recent = live.recent_streams(a, since=0, node=node)
        assert recent == live.recent_streams(b, since=0, node=node), node
        errors = live.recent_errors(a, since=0, node=node)
        assert errors == live.recent_errors(b, since=0, node=node), node
        assert (opened or recent or errors) or node == "none"
    ids = [r["id"] for r in live.recent_streams(a, since=0)] + [900, 10**6]
    figures = live.chunk_figures(a, ids)
    assert figures == live.chunk_figures(b, ids)
    assert figures[900]["chunks"] == len(ENGLISH)
    assert live.output_texts(a, ids) == live.output_texts(b, ids)
    assert live.output_texts(a, [900]) == {900: "".join(ENGLISH)}
    assert live.output_chunk_times(a, ids) == live.output_chunk_times(b, ids)
    assert live.chunk_figures(a, []) == live.output_texts(b, []) == {}


def test_token_pass_queries_agree(stores: tuple[Store, Store, str]) -> None:
    a, b, _ = stores
    assert pending_count(a) == pending_count(b) > 3
    assert read_pending(a, 2, after=1) == read_pending(b, 2, after=1)
    assert read_pending(a, 5, stream_ids=[]) == read_pending(b, 5, stream_ids=[]) == ([], [])
    for store in (a, b):
        r = tokenize_db(store, REGISTRY, batch=3)
        assert r.streams > 3 and not r.write_errors and not r.failed
    assert pending_count(a) == pending_count(b) == 0
    ids = sorted(sid for (sid,) in a.query("SELECT id FROM streams"))
    assert ids == sorted(sid for (sid,) in b.query("SELECT id FROM streams"))
    rows = read_token_rows(a, [*ids, 10**9])
    assert rows == read_token_rows(b, [*ids, 10**9]) and len(rows) > 3
    # a second writer of the same rows: skipped, not an error, on both
    some = [rows[i] for i in sorted(rows)[:2]]
    for store in (a, b):
        assert insert_token_rows(store, some) == ([], 2, None)
    first = sorted(rows)[0]
    for store in (a, b):
        delete_token_rows(store, [first])
    assert pending_count(a) == pending_count(b) == 1
    for store in (a, b):
        delete_token_rows(store)
    assert pending_count(a) == pending_count(b) == len(rows)


def test_retention_agrees(stores: tuple[Store, Store, str]) -> None:
    a, b, _ = stores
    for store in (a, b):
        tokenize_db(store, REGISTRY)
    results = []
    for store in (a, b):
        seen: list[tuple[int, int]] = []

        def progress(done: int, total: int, seen: list[tuple[int, int]] = seen) -> None:
            seen.append((done, total))

        first = prune(store, 0, now=2e9, node="n1", batch=2, max_batches=3, progress=progress)
        assert not first.done and first.batches == 3
        rest = prune(store, 0, now=2e9, node="n1", batch=2)
        counts = {
            t: store.scalar(f"SELECT count(*) FROM {t}")
            for t in ("streams", "chunks", "errors", "connections", "stream_tokens")
        }
        results.append((first, rest, counts, seen))
    assert results[0] == results[1]
    first, rest, counts, _ = results[0]
    assert counts["streams"] == 1  # the open stream of node n2
    assert rest.done and first.streams + rest.streams > 3
    assert vacuum(b).incremental is False and vacuum(b).freed_pages == 0
    assert vacuum(a).incremental


def test_commands_on_postgresql_print_what_they_print_on_sqlite(
    stores: tuple[Store, Store, str],
) -> None:
    a, _, url = stores
    assert isinstance(a, SqliteFile)
    runner = CliRunner()
    for args in (
        ["tokenize", "-q", "--json"],
        ["tokenize", "-q", "--redo", "--stream", "1", "--json"],
        ["export", "-q"],
        ["export", "-q", "--format", "csv"],
        ["errors", "--json"],
        ["prune", "-q", "--older-than", "1s", "--node", "n1", "--no-vacuum"],
    ):
        out = []
        for db in (a.path, url):
            r = runner.invoke(main, [*args[:1], "--db", db, *args[1:]])
            assert r.exit_code == 0, (args, r.output)
            out.append(r.output)
        assert out[0] == out[1], args
