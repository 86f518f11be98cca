"""The token collector (sniffer.record.token_collector): its own cap is named as
what it is (``tokens-capped``), not reported as bytes lost on the wire."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from sniffer.core.events import ChunkEvent, StoreEvent, StreamClosed, StreamFlag, StreamState
from sniffer.llm.tokens import TokenizerRegistry, analyze_streams
from sniffer.record.chain import RecordingChain, RecordingOptions
from sniffer.record.token_collector import MAX_CHUNKS, TokenCollector
from sniffer.reports.verify import verify_db
from sniffer.runtime.replay import replay
from sniffer.store.queries import get_stream
from sniffer.store.writer import open_store
from tests.test_streams import chat_request, delta, end, head, run, sse

ROOT = Path(__file__).resolve().parent.parent


def _stream(n: int) -> list[StoreEvent]:
    """The store events of a complete chat stream of ``n`` content chunks and a
    usage block counting them (one token each: single letters)."""
    return run(
        [
            *chat_request(),
            head(),
            sse(3.0, *(delta("a") for _ in range(n))),
            sse(4.0, delta(finish_reason="stop")),
            sse(4.1, {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n}}),
            sse(4.2, "[DONE]"),
            end(5.0),
        ]
    )


def test_a_stream_past_the_cap_is_flagged_not_gapped() -> None:
    events = _stream(10)
    collector = TokenCollector(max_chunks=4)
    collector.observe(events)
    (closed,) = [e for e in events if isinstance(e, StreamClosed)]
    assert closed.flags == (StreamFlag.TOKENS_CAPPED,) and not closed.gap
    assert collector.capped_streams == 1
    (s,) = collector.take()
    assert s.capped and not s.gap and len(s.chunks) == 4
    (res,) = analyze_streams(TokenizerRegistry(), [s])
    kinds = {a.kind for a in res.anomalies}
    # no "capture lost bytes", and no judgement on the part not collected
    assert not kinds & {"gap", "usage_mismatch", "finish_missing"}, res.anomalies
    # under the cap: no flag, the usage compared
    whole = _stream(10)
    TokenCollector(max_chunks=MAX_CHUNKS).observe(whole)
    assert [e.flags for e in whole if isinstance(e, StreamClosed)] == [()]


def test_replay_past_the_collector_cap_verifies_with_a_warning(tmp_path: Path) -> None:
    """Through the recording chain and the store: the flag is stored, verify
    reports it as a warning and passes the stream (its chunks are whole)."""
    chain = RecordingChain.from_config(RecordingOptions())
    chain.collector = TokenCollector(max_chunks=3)
    db = str(tmp_path / "c.db")
    replay(ROOT / "pcaps" / "chat_english.pcap", db, chain=chain)
    engine = open_store(db)
    row = get_stream(engine, 1)
    assert row is not None and row["state"] == StreamState.COMPLETE.value
    assert json.loads(row["flags"]) == ["tokens-capped"]
    assert sum(1 for c in row["chunks"] if c["text"]) > 3
    (v,) = verify_db(engine, TokenizerRegistry()).streams
    assert v.ok, v.findings
    assert "tokens-capped" in {f.kind for f in v.findings if f.level == "warn"}
    assert not {f.kind for f in v.findings} & {"gap", "text_mismatch"}


def test_chunk_events_are_kept_up_to_the_cap() -> None:
    events = _stream(6)
    collector = TokenCollector(max_chunks=5)
    collector.observe(events)
    (s,) = collector.take()
    kept = [e for e in events if isinstance(e, ChunkEvent)][:5]
    assert [c.seq for c in s.chunks] == [e.seq for e in kept]


def test_the_cap_holds_at_and_around_block_boundaries() -> None:
    """The cap is tested against the room left beside the packed blocks
    (``_Open.room``): the first ``max_chunks`` chunk events are kept, in any
    batch split, whether the cap falls inside a block or on its edge, and the
    close is flagged exactly when there were more."""
    from sniffer.record.token_collector import _JOIN_EVERY

    for cap in (1, _JOIN_EVERY - 1, _JOIN_EVERY, _JOIN_EVERY + 1, 2 * _JOIN_EVERY):
        for n in (cap - 3, cap - 1, cap, cap + 1, cap + _JOIN_EVERY + 2):
            events = _stream(max(n, 0))
            chunks = [e for e in events if isinstance(e, ChunkEvent)]
            collector = TokenCollector(max_chunks=cap)
            batches = [events[k : k + 7] for k in range(0, len(events), 7)]
            for batch in batches:
                collector.observe(batch)  # (the flagged close replaces its own)
            (s,) = collector.take()
            assert [c.seq for c in s.chunks] == [e.seq for e in chunks[:cap]], (cap, n)
            (close,) = [e for b in batches for e in b if isinstance(e, StreamClosed)]
            over = len(chunks) > cap
            assert s.capped is over and collector.capped_streams == int(over)
            assert close.flags == ((StreamFlag.TOKENS_CAPPED,) if over else ())


def test_chunks_across_blocks_come_out_as_sent() -> None:
    """The collector keeps a stream's chunks in blocks of ``_JOIN_EVERY`` (their
    seqs, choices and lengths packed into arrays at once) and a tail: every chunk,
    in any batch split and at any block boundary, comes out as it was observed,
    finish reasons and logprobs in place."""
    from sniffer.record.token_collector import _JOIN_EVERY

    for n in (_JOIN_EVERY - 1, _JOIN_EVERY, 2 * _JOIN_EVERY + 3):
        events = _stream(n)
        chunk_events = [e for e in events if isinstance(e, ChunkEvent)]
        # several chunks per event, of varied lengths and one with logprobs
        texts = iter(f"t{i}" + "é" * (i % 4) for i in range(len(chunk_events)))
        marked = []
        for i, e in enumerate(chunk_events):
            text = next(texts) if e.text else ""
            logprobs = '{"content": []}' if i == n // 2 else e.logprobs
            marked.append(replace(e, text=text, logprobs=logprobs))
        swap = dict(zip(map(id, chunk_events), marked, strict=True))
        events = [swap.get(id(e), e) for e in events]
        collector = TokenCollector()
        for k in range(0, len(events), 5):  # batches that cut blocks anywhere
            collector.observe(events[k : k + 5])
        (s,) = collector.take()
        got = [(c.seq, c.choice, c.text, c.finish_reason, c.logprobs) for c in s.chunks]
        want = [(e.seq, e.choice, e.text, e.finish_reason, e.logprobs) for e in marked]
        assert got == want
        assert len(s.chunks) == len(marked)


def test_inputs_sent_to_another_process_analyse_as_taken() -> None:
    """Inputs sent without their ``redact`` function (as a parallel replay's
    worker sends them to its token process), ``bind`` gives them the
    receiving collector's: analysed there, they give what the sender's own
    inputs give, redacted spans masked alike."""
    import pickle

    from sniffer.record.redact import Redactor

    events = _stream(4)
    secret = "call me at +1 415 555 0100"
    events = [
        replace(e, text=secret) if isinstance(e, ChunkEvent) and e.text else e for e in events
    ]
    sender, receiver = TokenCollector(redactor=Redactor()), TokenCollector(redactor=Redactor())
    sender.observe(events)
    (taken,) = sender.take()
    assert taken.redact is not None and taken.masks  # the phone number: a masked span
    (sent,) = pickle.loads(pickle.dumps([replace(taken, redact=None)]))
    (bound,) = receiver.bind([sent])
    assert bound.redact is not None and bound.redact(secret) == taken.redact(secret)
    registry = TokenizerRegistry()
    assert analyze_streams(registry, [bound]) == analyze_streams(registry, [taken])
    # without a redactor there is nothing to bind
    (plain,) = TokenCollector().bind([sent])
    assert plain.redact is None


def test_native_block_packing_is_the_pure_one() -> None:
    """``pack_chunk_block`` (the native core's) packs a block of chunks as
    ``_pack_block`` (the pure core's) does: the same bytes of the seqs,
    choices and text lengths (code points, not bytes), the same joined text,
    for any text (non-ASCII, astral, empty, a lone surrogate: joined by
    ``"".join`` itself); what is no ``(seq, choice, text)`` raises."""
    import random

    import pytest

    from sniffer import native_core
    from sniffer.record.token_collector import _JOIN_EVERY, _pack_block

    native = getattr(native_core()[0], "pack_chunk_block", None)
    if native is None:
        pytest.skip("the native core is not built (or SPARSEETY_PURE is set)")
    rnd = random.Random(25)
    alphabet = ["a", " ", "w1.2 ", "é", "中", "😀", "\x00", "\ud800", "\n", ""]
    for _ in range(500):
        tail = [
            (
                rnd.choice([0, 1, rnd.randrange(2**63), -(2**63)]),
                rnd.choice([0, -1, 3, 2**31]),
                "".join(rnd.choice(alphabet) for _ in range(rnd.randrange(6))),
            )
            for _ in range(_JOIN_EVERY)
        ]
        assert native(tail) == _pack_block(tail)
    assert native([]) == (b"", b"", b"", "")
    for bad in ([(1, 2)], [(1, 2, b"x")], [[1, 2, "x"]], [(2**64, 0, "x")]):
        with pytest.raises((TypeError, ValueError, OverflowError)):
            native(bad)
