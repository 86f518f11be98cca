"""Metrics: hand-built event sequences, and a real scrape after replaying the
fixture captures, checked against the database."""

from __future__ import annotations

import glob
import json
import os
import re
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from prometheus_client import Counter, Histogram, disable_created_metrics, enable_created_metrics
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.parser import text_string_to_metric_families

from sniffer.capture.pcap import read_capture
from sniffer.core.events import (
    REASSEMBLY_KINDS,
    ChunkEvent,
    ConnectionClosed,
    ConnectionOpened,
    PipelineError,
    StoreEvent,
    StreamClosed,
    StreamFlag,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.core.pipeline import Pipeline, PipelineConfig
from sniffer.llm.cadence import cadence
from sniffer.llm.dialects import WHOLE_MESSAGE_DIALECTS
from sniffer.llm.tokens import TokenizerRegistry
from sniffer.llm.values import RequestSummary, Usage
from sniffer.record.chain import RecordingChain, RecordingOptions
from sniffer.record.metrics import Metrics, check_bind_host, stream_state
from sniffer.reports.stats import load_outputs
from sniffer.runtime.replay import replay
from sniffer.store.writer import StoreWriter, open_store

T0 = 1_700_000_000.0
CLIENT = ("127.0.0.1", 40000)
SERVER = ("127.0.0.1", 8000)
PCAPS = sorted(
    glob.glob(
        os.path.join(os.path.dirname(__file__), "..", "pcaps", "**", "*.pcap"), recursive=True
    )
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str | bytes) -> Samples:
    """{(sample name, sorted labels): value} from an exposition text."""
    if isinstance(text, bytes):
        text = text.decode()
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def total(smp: Samples, name: str, **match: str) -> float:
    """Sum of the samples called ``name`` whose labels include ``match``."""
    return sum(
        v
        for (n, labels), v in smp.items()
        if n == name and all((k, val) in labels for k, val in match.items())
    )


def by_label(smp: Samples, name: str, key: str) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for (n, labels), v in smp.items():
        if n == name:
            out[dict(labels)[key]] += v
    return dict(out)


def opened(
    sid: int, ts: float, model: str | None = "m", label: str | None = "a", conn: int = 1
) -> StreamOpened:
    return StreamOpened(
        stream=sid,
        conn=conn,
        exchange=sid,
        ts=ts,
        client=CLIENT,
        server=SERVER,
        method="POST",
        path="/v1/chat/completions",
        request_headers=(),
        request_body="{}",
        request=RequestSummary(model=model),
        dialect="openai.chat",
        label=label,
    )


def closed(
    sid: int,
    ts: float,
    state: StreamState = StreamState.COMPLETE,
    reason: str = "complete",
    t_first: float | None = None,
    text_len: int = 0,
    usage: Usage | None = None,
) -> StreamClosed:
    return StreamClosed(
        stream=sid,
        ts=ts,
        state=state,
        reason=reason,
        done_seen=True,
        gap=state is StreamState.GAP,
        t_first_content=t_first,
        t_last_chunk=ts,
        chunk_count=0,
        event_count=0,
        text_len=text_len,
        finish_reasons=(),
        usage=usage,
        response_body=None,
    )


def chat_stream(sid: int, t: float, model: str = "m", label: str = "a") -> list[StoreEvent]:
    """Role prelude at +0.05 (not TTFT), content at +0.2, +0.25, +0.4, finish, usage."""
    return [
        opened(sid, t, model, label),
        StreamResponse(sid, t + 0.01, 200, (), "text/event-stream", True),
        ChunkEvent(sid, t + 0.05, 0, 0, 0, "role"),
        ChunkEvent(sid, t + 0.2, 1, 0, 1, "content", text="Hel"),
        ChunkEvent(sid, t + 0.25, 2, 0, 2, "content", text="lo"),
        ChunkEvent(sid, t + 0.4, 3, 0, 3, "content", text=" you"),
        ChunkEvent(sid, t + 0.4, 4, 0, 0, "finish", finish_reason="stop"),
        ChunkEvent(sid, t + 0.41, 5, -1, 0, "usage", usage=Usage.parse({"prompt_tokens": 7})),
        closed(
            sid,
            t + 0.5,
            t_first=t + 0.2,
            text_len=9,
            usage=Usage.parse({"prompt_tokens": 7, "completion_tokens": 3}),
        ),
    ]


# ----------------------------------------------------------------- hand-built


def test_ttft_skips_role_prelude_and_inter_chunk_per_choice() -> None:
    m = Metrics()
    m.observe(chat_stream(1, T0))
    smp = samples(m.render())
    key = {"label": "a", "model": "m"}
    assert total(smp, "gen_ai_server_time_to_first_token_seconds_count", **key) == 1
    assert total(smp, "gen_ai_server_time_to_first_token_seconds_sum", **key) == pytest.approx(0.2)
    # 0.1 < 0.2 <= 0.25: in the 0.25 bucket, not the 0.1 one
    assert total(smp, "gen_ai_server_time_to_first_token_seconds_bucket", le="0.1") == 0
    assert total(smp, "gen_ai_server_time_to_first_token_seconds_bucket", le="0.25") == 1
    assert total(smp, "sparseety_inter_chunk_seconds_count", **key) == 2
    assert total(smp, "sparseety_inter_chunk_seconds_sum", **key) == pytest.approx(0.2)
    assert total(smp, "gen_ai_server_request_duration_seconds_sum", **key) == pytest.approx(0.5)
    assert total(smp, "sparseety_output_characters_sum", **key) == 9
    assert total(smp, "sparseety_streams_total", state="complete", **key) == 1
    assert total(smp, "sparseety_chunk_events_total", **key) == 6
    assert total(smp, "sparseety_server_usage_tokens_total", type="prompt") == 7
    assert total(smp, "sparseety_server_usage_tokens_total", type="completion") == 3
    assert m.tracked_streams == 0


def test_interleaved_choices_each_have_their_own_chunk_gaps() -> None:
    m = Metrics()
    evs: list[StoreEvent] = [
        opened(1, T0),
        StreamResponse(1, T0, 200, (), "text/event-stream", True),
        ChunkEvent(1, T0 + 1.0, 0, 0, 1, "content", text="a"),
        ChunkEvent(1, T0 + 1.1, 1, 1, 1, "content", text="b"),
        ChunkEvent(1, T0 + 1.5, 2, 0, 2, "content", text="c"),
        ChunkEvent(1, T0 + 1.6, 3, 1, 2, "reasoning", reasoning="d"),
        closed(1, T0 + 2, t_first=T0 + 1.0, text_len=3),
    ]
    m.observe(evs)
    smp = samples(m.render())
    assert total(smp, "sparseety_inter_chunk_seconds_count") == 2
    assert total(smp, "sparseety_inter_chunk_seconds_sum") == pytest.approx(1.0)
    assert total(smp, "gen_ai_server_time_to_first_token_seconds_sum") == pytest.approx(1.0)


def cadence_stream(sid: int, times: list[float], *, dialect: str = "openai.chat") -> list[Any]:
    """A streamed reply whose content chunks arrive at ``times`` (offsets from
    T0 + 1), choice ``i % 2`` for chunk i when the dialect is a whole-message one."""
    whole = dialect == "anthropic.messages"
    evs: list[Any] = [
        replace(opened(sid, T0), dialect=dialect),
        StreamResponse(sid, T0 + 0.5, 200, (), "text/event-stream", True),
    ]
    for i, t in enumerate(times):
        choice = i // ((len(times) + 1) // 2) if whole else 0
        evs.append(ChunkEvent(sid, T0 + 1 + t, i, choice, i + 1, "content", text="x"))
    evs.append(ChunkEvent(sid, T0 + 1 + times[-1], len(times), 0, 0, "finish"))
    evs.append(closed(sid, T0 + 2 + times[-1], t_first=T0 + 1, text_len=len(times)))
    return evs


def test_cadence_classes_of_outputs_at_their_close() -> None:
    """Bursts of 4 chunks 0.1 ms apart with 30 ms between them (what llama.cpp
    with speculative decoding streams): bursty; one chunk every 20 ms (a
    little jitter): steady; 5 chunks: unknown. Not counted: a non-streamed
    reply, chunks without text, a stream whose capture clock went backwards."""
    bursty = [step * 0.03 + j * 0.0001 for step in range(6) for j in range(4)]
    steady = [i * 0.02 + (0.001 if i % 3 else 0.0) for i in range(24)]
    m = Metrics()
    m.observe(cadence_stream(1, bursty))
    m.observe(cadence_stream(2, steady))
    m.observe(cadence_stream(3, [0.0, 0.01, 0.02, 0.03, 0.04]))
    # whole-message dialect: its two blocks' chunks are one output (bursty),
    # not two of 12 chunks each
    m.observe(cadence_stream(4, bursty, dialect="anthropic.messages"))
    m.observe(
        [
            opened(5, T0),
            StreamResponse(5, T0 + 0.7, 200, (), "application/json", False),
            ChunkEvent(5, T0 + 0.8, 0, 0, 1, "content", text="whole"),
            closed(5, T0 + 0.9, text_len=5),
        ]
    )
    m.observe(
        [
            opened(6, T0),
            StreamResponse(6, T0 + 0.7, 200, (), "text/event-stream", True),
            ChunkEvent(6, T0 + 0.8, 0, 0, 0, "role"),
            ChunkEvent(6, T0 + 0.9, 1, 0, 0, "finish", finish_reason="stop"),
            closed(6, T0 + 1.0),
        ]
    )
    backwards = cadence_stream(7, bursty)
    backwards[-1] = replace(backwards[-1], flags=(StreamFlag.CLOCK_BACKWARDS,))
    m.observe(backwards)
    smp = samples(m.render())
    got = by_label(smp, "sparseety_output_cadence_total", "cadence")
    assert got == {"bursty": 2, "steady": 1, "unknown": 1}
    assert total(smp, "sparseety_output_cadence_total", label="a", model="m") == 4


def test_cadence_keeps_the_first_chunks_of_a_long_output() -> None:
    from sniffer.record.metrics import MAX_CADENCE_CHUNKS

    # steady for the first MAX_CADENCE_CHUNKS chunks, bursty after them
    n = MAX_CADENCE_CHUNKS
    times = [i * 0.02 for i in range(n)]
    times += [times[-1] + 0.05 * (1 + k // 4) + (k % 4) * 1e-4 for k in range(400)]
    m = Metrics()
    m.observe(cadence_stream(1, times))
    assert by_label(samples(m.render()), "sparseety_output_cadence_total", "cadence") == {
        "steady": 1
    }


def test_non_streaming_reply_has_no_ttft_but_a_duration() -> None:
    m = Metrics()
    m.observe(
        [
            opened(1, T0),
            StreamResponse(1, T0 + 0.7, 200, (), "application/json", False),
            ChunkEvent(1, T0 + 0.7, 0, 0, 1, "content", text="whole answer"),
            closed(1, T0 + 0.7, t_first=T0 + 0.7, text_len=12),
        ]
    )
    smp = samples(m.render())
    assert total(smp, "gen_ai_server_time_to_first_token_seconds_count") == 0
    assert total(smp, "gen_ai_server_request_duration_seconds_count") == 1
    assert total(smp, "gen_ai_server_request_duration_seconds_sum") == pytest.approx(0.7)


def test_ttft_from_summary_when_chunks_were_not_seen() -> None:
    m = Metrics()
    evs = [e for e in chat_stream(1, T0) if not isinstance(e, ChunkEvent)]
    m.observe(evs)
    smp = samples(m.render())
    assert total(smp, "gen_ai_server_time_to_first_token_seconds_sum") == pytest.approx(0.2)
    assert total(smp, "sparseety_inter_chunk_seconds_count") == 0


def test_states_and_batches_split_anywhere() -> None:
    evs: list[StoreEvent] = [ConnectionOpened(1, T0, CLIENT, SERVER, True)]
    evs += chat_stream(1, T0)
    evs += [opened(2, T0 + 1), closed(2, T0 + 2, StreamState.TRUNCATED, "client closed (fin)")]
    evs += [opened(3, T0 + 1), closed(3, T0 + 2, StreamState.TRUNCATED, "connection reset")]
    evs += [opened(4, T0 + 1), closed(4, T0 + 2, StreamState.GAP, "response bytes lost")]
    evs += [opened(5, T0 + 1), closed(5, T0 + 2, StreamState.ERROR, "HTTP 500")]
    evs += [
        PipelineError(T0, "http", "framing", "x", 1, 5),
        PipelineError(T0, "sse", "line", "y", 1, 5),
        PipelineError(T0, "sse", "line", "y", 1, 5),
        PipelineError(T0, "weird-stage", "z", "w"),
    ]
    evs.append(ConnectionClosed(1, T0 + 3, "fin"))
    whole = Metrics()
    whole.observe(evs)
    expected = samples(whole.render())
    for cut in range(0, len(evs) + 1, 3):
        m = Metrics()
        m.observe(evs[:cut])
        m.observe(evs[cut:])
        got = samples(m.render())
        for k, v in expected.items():
            if k[0] != "sparseety_last_flush_age_seconds":
                assert got[k] == pytest.approx(v), k
    states = by_label(expected, "sparseety_streams_total", "state")
    assert states == {"complete": 1, "client_abort": 1, "truncated": 1, "gap": 1, "error": 1}
    stages = by_label(expected, "sparseety_parse_errors_total", "stage")
    assert stages == {"http": 1, "sse": 2, "other": 1}


def test_stream_state_mapping() -> None:
    assert (
        stream_state(closed(1, T0, StreamState.TRUNCATED, "client closed the connection (rst)"))
        == "client_abort"
    )
    assert stream_state(closed(1, T0, StreamState.TRUNCATED, "capture ended")) == "truncated"
    assert stream_state(closed(1, T0, StreamState.COMPLETE)) == "complete"


def test_bounded_models_and_none_labels() -> None:
    m = Metrics(max_models=3)
    evs: list[StoreEvent] = []
    for i in range(6):
        evs += [opened(i, T0, model=f"model-{i}"), closed(i, T0 + 1)]
    evs += [opened(10, T0, model=None, label=None), closed(10, T0 + 1)]
    evs += [opened(11, T0, model="model-0", label="b"), closed(11, T0 + 1)]
    evs += [opened(12, T0, model="model-1"), closed(12, T0 + 1)]  # known: stays itself
    m.observe(evs)
    smp = samples(m.render())
    got = {
        (dict(labels)["label"], dict(labels)["model"]): v
        for (n, labels), v in smp.items()
        if n == "sparseety_streams_total"
    }
    assert got == {
        ("a", "model-0"): 1,
        ("a", "model-1"): 2,
        ("a", "model-2"): 1,
        ("a", "other"): 3,
        ("none", "none"): 1,
        ("b", "model-0"): 1,
    }


def test_label_sets_found_by_what_opens_name_stay_bounded() -> None:
    """An open finds its label set by the label and model it names, without
    bounding them again; what is bounded to ``other`` is bounded each time
    (no look-up kept per unbounded name), and ``None`` and ``"none"`` name
    the same label set."""
    m = Metrics(max_models=2, max_labels=2)
    evs: list[StoreEvent] = []
    sid = 0
    for label, model in [("a", "m0"), ("a", "m1"), ("a", None), ("b", "none"), ("b", None)]:
        for _ in range(3):
            sid += 1
            evs += [opened(sid, T0, model=model, label=label), closed(sid, T0 + 1)]
    for i in range(50):  # past the bounds: every one another name
        sid += 1
        evs += [opened(sid, T0, model=f"x{i}", label=f"l{i % 7}"), closed(sid, T0 + 1)]
        sid += 1
        evs += [opened(sid, T0, model=f"y{i}"), closed(sid, T0 + 1)]
    m.observe(evs)
    named = m._named
    assert sum(len(models) for models in named.values()) <= 2 * 2 * 2 * 2
    assert named["a"]["m0"] is named["a"]["m0"] and named["a"].get(None) is None
    assert named["b"]["none"] is named["b"][None]
    got = {
        (dict(labels)["label"], dict(labels)["model"]): v
        for (n, labels), v in samples(m.render()).items()
        if n == "sparseety_streams_total"
    }
    assert got == {
        ("a", "m0"): 3,
        ("a", "m1"): 3,
        ("a", "other"): 53,
        ("b", "none"): 6,
        ("other", "x0"): 1,
        ("other", "x1"): 1,
        ("other", "other"): 48,
    }


def test_unknown_streams_and_never_closed_streams_are_bounded() -> None:
    m = Metrics()
    m.observe([closed(99, T0)])  # closed without being seen open
    m.observe([ChunkEvent(98, T0, 0, 0, 1, "content", text="x")])
    smp = samples(m.render())
    assert total(smp, "sparseety_streams_total", label="none", model="none") == 1
    assert total(smp, "sparseety_chunk_events_total", label="none") == 1
    assert total(smp, "sparseety_streams_evicted_total") == 0
    import sniffer.record.tracker as mod

    old = mod.MAX_OPEN_STREAMS
    mod.MAX_OPEN_STREAMS = 10
    try:
        m2 = Metrics()
        m2.observe([opened(i, T0) for i in range(25)])
        assert m2.tracked_streams == 10
        # the oldest went, and were counted; their later events are a stranger's
        m2.observe([ChunkEvent(0, T0 + 1, 0, 0, 1, "content", text="x"), closed(0, T0 + 2)])
        m2.observe([closed(24, T0 + 2)])
        smp2 = samples(m2.render())
        assert total(smp2, "sparseety_streams_evicted_total") == 15
        assert total(smp2, "sparseety_chunk_events_total", label="none", model="none") == 1
        assert total(smp2, "sparseety_streams_total", label="none", model="none") == 1
        assert m2.tracked_streams == 9
    finally:
        mod.MAX_OPEN_STREAMS = old


def test_observe_tokens() -> None:
    m = Metrics()
    m.observe(chat_stream(1, T0, model="x", label="L"))
    # content chunks at +0.2 … +0.4; 5 output tokens → 0.2 s / 4 per token
    m.observe_tokens(
        1,
        output_tokens=5,
        prompt_tokens=12,
        tokens_per_chunk=[1, 2, 2],
        anomalies={"straddle": 2, "usage_mismatch": 1, "unk": 0},
    )
    m.observe_tokens(777, output_tokens=4, label="L2", model="y")  # not seen: given labels
    smp = samples(m.render())
    key = {"label": "L", "model": "x"}
    assert total(smp, "sparseety_output_tokens_total", **key) == 5
    assert total(smp, "sparseety_prompt_tokens_total", **key) == 12
    assert total(smp, "gen_ai_client_token_usage_sum", gen_ai_token_type="output", **key) == 5
    assert total(smp, "gen_ai_client_token_usage_sum", gen_ai_token_type="input", **key) == 12
    assert total(smp, "gen_ai_server_time_per_output_token_seconds_sum") == pytest.approx(0.05)
    assert total(smp, "gen_ai_server_time_per_output_token_seconds_count") == 1
    assert total(smp, "sparseety_tokens_per_chunk_count", **key) == 3
    assert total(smp, "sparseety_tokens_per_chunk_sum", **key) == 5
    assert total(smp, "sparseety_tokens_per_chunk_bucket", le="1.0", **key) == 1
    assert by_label(smp, "sparseety_chunk_anomalies_total", "kind") == {
        "straddle": 2,
        "usage_mismatch": 1,
    }
    assert total(smp, "sparseety_output_tokens_total", label="L2", model="y") == 4


def test_observe_tokens_children_made_at_first_use_per_label_set() -> None:
    """The token children of a label set are kept between calls, each made at
    the first figure it takes: a label set's first call without prompt
    tokens exposes no prompt series, a later call with them does, and every
    call lands in its own label set's series."""
    m = Metrics()
    m.observe_tokens(1, output_tokens=3, label="A", model="x")
    smp = samples(m.render())
    assert total(smp, "sparseety_output_tokens_total", label="A", model="x") == 3
    assert not [s for s in smp if s[0] == "sparseety_prompt_tokens_total"]
    assert not [s for s in smp if s[0].startswith("sparseety_tokens_per_chunk")]
    assert not [s for s in smp if s[0] == "sparseety_chunk_anomalies_total"]
    m.observe_tokens(
        2,
        output_tokens=4,
        prompt_tokens=7,
        chunks_by_tokens={1: 2, 3: 1},
        anomalies={"straddle": 2, "unk": 0},
        label="A",
        model="x",
    )
    m.observe_tokens(3, output_tokens=5, anomalies={"straddle": 1}, label="B", model="x")
    m.observe_tokens(4, prompt_tokens=1, tokens_per_chunk=[2], anomalies={"straddle": 4},
                     label="A", model="x")  # fmt: skip
    smp = samples(m.render())
    a = {"label": "A", "model": "x"}
    assert total(smp, "sparseety_output_tokens_total", **a) == 7
    assert total(smp, "sparseety_output_tokens_total", label="B", model="x") == 5
    assert total(smp, "sparseety_prompt_tokens_total", **a) == 8
    assert total(smp, "gen_ai_client_token_usage_sum", gen_ai_token_type="input", **a) == 8
    assert total(smp, "sparseety_tokens_per_chunk_count", **a) == 4
    assert total(smp, "sparseety_tokens_per_chunk_sum", **a) == 7
    assert total(smp, "sparseety_chunk_anomalies_total", kind="straddle", **a) == 6
    assert total(smp, "sparseety_chunk_anomalies_total", kind="straddle", label="B") == 1
    assert not [s for s in smp if ("kind", "unk") in s[1]]
    assert not [
        s for s in smp if s[0] == "sparseety_prompt_tokens_total" and ("label", "B") in s[1]
    ]


def test_daemon_figures_and_flush_age_at_scrape_time() -> None:
    now = [1000.0]
    m = Metrics(clock=lambda: now[0])
    m.set_open(3, 2)
    m.set_queue_depth(17)
    m.add_packets(1500)
    m.add_packets(500)
    m.add_kernel_drops(4)
    m.add_queue_drops(2)
    m.add_kernel_drops(0)
    m.set_sample_rate(0.25)
    m.add_redactions({"PHONE": 2, "EMAIL": 1})
    now[0] = 1012.0
    smp = samples(m.render())
    assert total(smp, "sparseety_open_connections") == 3
    assert total(smp, "sparseety_open_streams") == 2
    assert total(smp, "sparseety_queue_depth") == 17
    assert total(smp, "sparseety_packets_captured_total") == 2000
    assert total(smp, "sparseety_kernel_drops_total") == 4
    assert total(smp, "sparseety_queue_drops_total") == 2
    assert total(smp, "sparseety_sample_rate") == 0.25
    assert by_label(smp, "sparseety_redactions_total", "kind") == {"PHONE": 2, "EMAIL": 1}
    assert total(smp, "sparseety_last_flush_age_seconds") == 12.0  # since start
    m.mark_flush(1010.0)
    now[0] = 1015.5
    assert total(samples(m.render()), "sparseety_last_flush_age_seconds") == 5.5


def test_reassembly_counters_from_the_pipeline_through_the_daemon_hook() -> None:
    """The pipeline's TCP counters reach /metrics: one family by kind (every
    kind there from the start), lost bytes apart; the daemon's once-a-second
    hook adds what grew, and a new pipeline (its totals start again) counts on."""
    from types import SimpleNamespace

    from sniffer.runtime.features import _gauges
    from tests.test_pipeline import LENGTHS, REQUEST, RESPONSE, _conversation, _in_order

    m = Metrics()
    smp = samples(m.render())
    assert by_label(smp, "sparseety_reassembly_events_total", "kind") == dict.fromkeys(
        REASSEMBLY_KINDS, 0.0
    )
    assert total(smp, "sparseety_reassembly_lost_bytes_total") == 0
    stats = SimpleNamespace(items=0, kernel_dropped=0, queue_dropped=0)
    daemon = SimpleNamespace(stats=stats, open_connections=0, open_streams=0, queue_depth=0)
    hook = _gauges(m)
    counts = [{"retransmission": 2, "overlap-mismatch": 1, "gap": 1, "lost-bytes": 40}]
    daemon.reassembly_counts = lambda: counts[-1]
    hook(daemon)
    hook(daemon)  # nothing grew: nothing added
    counts.append({"retransmission": 5, "overlap-mismatch": 1, "gap": 1, "lost-bytes": 40})
    hook(daemon)
    counts.append({"retransmission": 1, "overlap-mismatch": 0, "gap": 0, "lost-bytes": 0})
    hook(daemon)  # a new pipeline
    got = by_label(samples(m.render()), "sparseety_reassembly_events_total", "kind")
    assert {k: v for k, v in got.items() if v} == {
        "retransmission": 6,
        "overlap-mismatch": 1,
        "gap": 1,
    }
    assert total(samples(m.render()), "sparseety_reassembly_lost_bytes_total") == 40
    # and what a real pipeline counts, by the same names
    sends = _in_order(REQUEST, RESPONSE, [50])
    sends.insert(3, (False, 0, RESPONSE[:50]))  # an exact retransmission
    pipe = Pipeline()
    _conversation(sends, LENGTHS, pipe)
    m2 = Metrics()
    m2.add_reassembly(pipe.reassembly_counts())
    got = by_label(samples(m2.render()), "sparseety_reassembly_events_total", "kind")
    assert got == {**dict.fromkeys(REASSEMBLY_KINDS, 0.0), "retransmission": 1.0}


def test_registries_are_independent() -> None:
    a, b = Metrics(), Metrics()
    a.add_packets(5)
    assert total(samples(a.render()), "sparseety_packets_captured_total") == 5
    assert total(samples(b.render()), "sparseety_packets_captured_total") == 0


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.1", "example.org", ""])
def test_refuses_public_bind(host: str) -> None:
    with pytest.raises(ValueError, match="--metrics-public"):
        check_bind_host(host)
    with pytest.raises(ValueError):
        Metrics().serve(host, 0)
    check_bind_host(host, allow_public=True)  # allowed when asked


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "localhost"])
def test_loopback_hosts_are_accepted(host: str) -> None:
    check_bind_host(host)


def test_serve_on_ipv6_loopback() -> None:
    m = Metrics()
    m.add_packets(3)
    with m.serve("::1", 0) as server:
        assert server.url.startswith("http://[::1]:")
        r = httpx.get(server.url, timeout=10)
    assert r.status_code == 200
    assert total(samples(r.text), "sparseety_packets_captured_total") == 3


# ------------------------------------------------------- replay vs database


def pipeline_events(path: str) -> list[StoreEvent]:
    """The events sniffer.runtime.replay stores, from a pipeline of our own (the
    captures are small: replay never sweeps idle connections on them)."""
    reader = read_capture(path)
    pipe = Pipeline(PipelineConfig())
    out: list[StoreEvent] = []
    last = 0.0
    for seg in reader:
        out += pipe.feed(seg)
        last = seg.ts
    out += pipe.flush(reader.stats.last_ts or last)
    if reader.error is not None:
        out.append(PipelineError(last, "capture", "file", str(reader.error)))
    assert reader.stats.packets < 0x4000
    return out


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Metrics, int]]:
    assert len(PCAPS) >= 20
    db = str(tmp_path_factory.mktemp("metrics") / "replay.db")
    m = Metrics(max_models=40)  # every fixture's model keeps its own label value
    packets = 0
    # The sec_* captures carry planted credentials: what they store is redacted
    # (shorter text) while metrics count what was sent, by design (issue 12).
    for path in [p for p in PCAPS if not os.path.basename(p).startswith("sec_")]:
        result = replay(path, db)
        packets += result.packets
        evs = pipeline_events(path)
        m.observe(evs)
        m.add_packets(result.packets)
    yield db, m, packets


def scrape(m: Metrics) -> Samples:
    with m.serve("127.0.0.1", 0) as server:
        assert server.host == "127.0.0.1" and server.port > 0
        r = httpx.get(server.url, timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return samples(r.text)


def test_scrape_after_replay_matches_the_database(replayed: tuple[str, Metrics, int]) -> None:
    db, m, packets = replayed
    smp = scrape(m)
    con = sqlite3.connect(db)
    q = con.execute

    # Streams by state (client aborts split off the truncated ones).
    db_states: dict[str, float] = defaultdict(float)
    for state, reason, n in q("SELECT state, reason, count(*) FROM streams GROUP BY 1, 2"):
        key = state
        if state == "truncated" and reason.startswith("client closed"):
            key = "client_abort"
        db_states[key] += n
    assert by_label(smp, "sparseety_streams_total", "state") == dict(db_states)
    assert db_states["client_abort"] >= 1 and db_states["gap"] >= 1 and db_states["error"] >= 1

    # Streams by model (fewer than 20 models: none collapses to "other").
    db_models = {
        (model if model is not None else "none"): float(n)
        for model, n in q("SELECT model, count(*) FROM streams GROUP BY model")
    }
    assert len(db_models) > 5
    assert by_label(smp, "sparseety_streams_total", "model") == db_models

    # TTFT: streamed responses with a first output chunk (not one before the
    # request: a capture clock that went backwards, fault_clock_backwards)
    n_ttft, sum_ttft = q(
        "SELECT count(*), sum(t_first_content - t_request) FROM streams "
        "WHERE streaming AND t_first_content >= t_request"
    ).fetchone()
    assert q("SELECT count(*) FROM streams WHERE t_first_content < t_request").fetchone()[0]
    assert n_ttft > 20
    assert total(smp, "gen_ai_server_time_to_first_token_seconds_count") == n_ttft
    assert total(smp, "gen_ai_server_time_to_first_token_seconds_sum") == pytest.approx(
        sum_ttft, rel=1e-9, abs=1e-9
    )

    # End-to-end duration: every closed stream whose request time is known (not
    # one recovered mid-way), but those flagged clock-backwards; output
    # characters: every closed stream.
    n_closed, sum_dur = q(
        "SELECT count(*), sum(closed_at - t_request) FROM streams "
        "WHERE state NOT IN ('open', 'midway') "
        "AND coalesce(flags, '') NOT LIKE '%clock-backwards%'"
    ).fetchone()
    (chars,) = q("SELECT sum(text_len) FROM streams WHERE state != 'open'").fetchone()
    assert db_states["midway"] >= 1
    assert total(smp, "gen_ai_server_request_duration_seconds_count") == n_closed
    assert total(smp, "gen_ai_server_request_duration_seconds_sum") == pytest.approx(
        sum_dur, rel=1e-9
    )
    assert total(smp, "sparseety_output_characters_sum") == chars

    # Inter-chunk gaps: per (stream, choice) of streamed responses, output chunks.
    n_gaps, sum_gaps = q(
        "SELECT sum(n - 1), sum(t1 - t0) FROM ("
        " SELECT count(*) AS n, min(c.ts) AS t0, max(c.ts) AS t1 FROM chunks c"
        " JOIN streams s ON s.id = c.stream_id"
        " WHERE s.streaming AND c.kind IN ('content', 'reasoning', 'tool_call')"
        " GROUP BY c.stream_id, c.choice)"
    ).fetchone()
    assert n_gaps > 100
    assert total(smp, "sparseety_inter_chunk_seconds_count") == n_gaps
    assert total(smp, "sparseety_inter_chunk_seconds_sum") == pytest.approx(sum_gaps, rel=1e-9)

    # Chunk events, server-reported usage, errors by stage, packets.
    assert (
        total(smp, "sparseety_chunk_events_total") == q("SELECT count(*) FROM chunks").fetchone()[0]
    )
    prompt, completion = q(
        "SELECT coalesce(sum(prompt_tokens), 0), coalesce(sum(completion_tokens), 0) FROM streams"
    ).fetchone()
    assert prompt > 0 and completion > 0
    assert total(smp, "sparseety_server_usage_tokens_total", type="prompt") == prompt
    assert total(smp, "sparseety_server_usage_tokens_total", type="completion") == completion
    db_errors = {stage: float(n) for stage, n in q("SELECT stage, count(*) FROM errors GROUP BY 1")}
    assert by_label(smp, "sparseety_parse_errors_total", "stage") == db_errors
    assert total(smp, "sparseety_packets_captured_total") == packets

    # Cadence classes: what stats reads from the stored chunks, for the outputs
    # of the closed streamed responses (not flagged clock-backwards).
    counted = {
        sid
        for (sid,) in q(
            "SELECT id FROM streams WHERE streaming AND state != 'open' "
            "AND coalesce(flags, '') NOT LIKE '%clock-backwards%'"
        )
    }
    want_cadence: dict[str, float] = defaultdict(float)
    for out in load_outputs(open_store(db), include_incomplete=True):
        if out.stream_id in counted and out.cadence is not None:
            want_cadence[out.cadence.cls] += 1
    # (stats leaves out the streams recovered mid-way; their outputs' cadence
    # from the stored chunk times, the same way)
    midway: dict[tuple[int, int], list[float]] = defaultdict(list)
    for sid, dialect, choice, ts in q(
        "SELECT s.id, s.dialect, c.choice, c.ts FROM chunks c JOIN streams s ON s.id = c.stream_id"
        " WHERE s.state = 'midway' AND s.streaming AND c.text != '' AND c.choice >= 0"
        " ORDER BY s.id, c.choice, c.seq"
    ):
        if sid in counted:
            midway[(sid, 0 if dialect in WHOLE_MESSAGE_DIALECTS else choice)].append(ts)
    assert len(midway) >= 5
    for times in midway.values():
        want_cadence[cadence(times).cls] += 1
    assert want_cadence["steady"] > 10 and want_cadence["unknown"] > 10
    assert by_label(smp, "sparseety_output_cadence_total", "cadence") == dict(want_cadence)
    assert m.tracked_streams == 0
    con.close()


def test_same_events_as_the_store(tmp_path: Path) -> None:
    """Our pipeline run yields exactly the events replay writes (tee'd writer)."""
    path = next(p for p in PCAPS if p.endswith("chat_english.pcap"))
    seen: list[StoreEvent] = []

    class Tee(StoreWriter):
        def write_many(self, events: object) -> None:
            evs = list(events)  # type: ignore[call-overload]
            seen.extend(evs)
            super().write_many(evs)

    with Tee(str(tmp_path / "t.db")) as w:
        replay(path, "", writer=w)
    assert seen == pipeline_events(path)


# ------------------------------------- our counters/histograms vs prometheus_client's

Feed = list[tuple[str, Any]]  # ("events", batch) or ("tokens", (stream, kwargs))


class _Recording(Metrics):
    """Metrics keeping the token figures the recording chain hands over."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, dict[str, Any]]] = []

    def observe_tokens(self, stream: int, **kw: Any) -> None:
        self.calls.append((stream, kw))
        super().observe_tokens(stream, **kw)


@pytest.fixture(scope="module")
def real_feed(tmp_path_factory: pytest.TempPathFactory) -> Feed:
    """Every fixture capture's pipeline events (batches of 64) and, after each
    capture, the token figures the chain's token pass gives its streams."""
    tmp = tmp_path_factory.mktemp("feed")
    tokens = TokenizerRegistry()  # loaded once for every capture
    feed: Feed = []
    for i, path in enumerate(PCAPS):
        events = pipeline_events(path)
        rec = _Recording()
        chain = RecordingChain.from_config(RecordingOptions(), metrics=rec, tokens=tokens)
        chain.attach(StoreWriter(str(tmp / f"{i}.db")))
        chain.write(list(events))
        chain.flush()
        for _ in range(len(events) + 1):  # bounded: each pass takes at least one stream
            if not chain.tokens_ready:
                break
            chain.tokenize(limit=4)
        chain.close()
        feed += [("events", events[j : j + 64]) for j in range(0, len(events), 64)]
        feed += [("tokens", call) for call in rec.calls]
    figures = [item[1] for kind, item in feed if kind == "tokens"]
    assert len(figures) > 50
    assert sum(sum(kw["chunks_by_tokens"].values()) for kw in figures) > 1000
    assert any(len(kw["chunks_by_tokens"]) > 2 for kw in figures)
    assert any(kw["anomalies"] for kw in figures)
    return feed


def reference_metrics(monkeypatch: pytest.MonkeyPatch) -> Metrics:
    """A Metrics whose counters and histograms are prometheus_client's own."""
    import sniffer.record.metrics as mod

    def histogram(
        name: str, doc: str, labelnames: Any, *, buckets: Any, registry: Any, lock: Any
    ) -> Histogram:
        return Histogram(name, doc, labelnames, buckets=buckets, registry=registry)

    def counter(name: str, doc: str, labelnames: Any, *, registry: Any, lock: Any) -> Counter:
        return Counter(name, doc, labelnames, registry=registry)

    with monkeypatch.context() as mp:
        mp.setattr(mod, "_Histogram", histogram)
        mp.setattr(mod, "_Counter", counter)
        ref = Metrics()
    assert isinstance(ref.inter_chunk, Histogram) and isinstance(ref.chunk_events, Counter)
    return ref


def per_chunk(kw: dict[str, Any]) -> dict[str, Any]:
    """Token figures with the chain's ``chunks_by_tokens`` (a distribution) as
    the ``tokens_per_chunk`` value per chunk it stands for (a chunk order)."""
    if "chunks_by_tokens" not in kw:
        return kw
    out = {k: v for k, v in kw.items() if k != "chunks_by_tokens"}
    out["tokens_per_chunk"] = [n for n, k in kw["chunks_by_tokens"].items() for _ in range(k)]
    return out


def feed_both(feed: Feed, *metrics: Metrics) -> None:
    """The feed into each of ``metrics``: the token figures as the chain gives
    them, or, to prometheus_client's histograms (``reference_metrics``), with a
    value per chunk: the distribution's bucket look-ups must give what one
    ``observe`` per chunk gives."""
    for m in metrics:
        reference = isinstance(m.tokens_per_chunk, Histogram)
        for kind, item in feed:
            if kind == "events":
                m.observe(item)
            else:
                stream, kw = item
                m.observe_tokens(stream, **(per_chunk(kw) if reference else kw))
        m.add_packets(7)
        m.add_redactions({"EMAIL": 2})
        m.add_reassembly({"retransmission": 4, "overlap-mismatch": 1, "lost-bytes": 10})


def masked(text: bytes) -> tuple[str, list[float]]:
    """The exposition without the wall-clock figures (``_created`` values and
    the flush age), and those ``_created`` values."""
    created: list[float] = []

    def keep(m: re.Match[str]) -> str:
        created.append(float(m.group(2)))
        return m.group(1) + " T"

    out = re.sub(r"^(\S+_created(?:\{.*\})?) (\S+)$", keep, text.decode(), flags=re.M)
    out = re.sub(r"^(sparseety_last_flush_age_seconds) \S+$", r"\1 X", out, flags=re.M)
    return out, created


def test_exposition_is_prometheus_clients_on_real_events(
    real_feed: Feed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our plain-number counters and histograms expose exactly what
    prometheus_client's Counter/Histogram fed the same observations expose:
    the text (and OpenMetrics) exposition, line for line, but for the
    wall-clock ``_created`` values, which are creation times in both."""
    t0 = time.time()
    ref = reference_metrics(monkeypatch)
    new = Metrics()
    assert not isinstance(new.inter_chunk, Histogram)
    feed_both(real_feed, new, ref)
    t1 = time.time()
    new_text, new_created = masked(new.render())
    ref_text, ref_created = masked(ref.render())
    assert new_text == ref_text
    assert len(new_created) == len(ref_created) > 20
    assert all(t0 <= t <= t1 for t in new_created)
    new_om, _ = masked(openmetrics_latest(new.registry))
    ref_om, _ = masked(openmetrics_latest(ref.registry))
    assert new_om == ref_om
    # and as parsed samples, every per-chunk family has values
    smp = samples(new.render())
    for name in (
        "sparseety_chunk_events_total",
        "sparseety_inter_chunk_seconds_count",
        "sparseety_tokens_per_chunk_count",
        "gen_ai_client_token_usage_count",
        "sparseety_chunk_anomalies_total",
    ):
        assert total(smp, name) > 0, name
    ref_smp = samples(ref.render())
    assert {k for k in smp} == {k for k in ref_smp}
    for k, v in smp.items():
        if not k[0].endswith("_created") and k[0] != "sparseety_last_flush_age_seconds":
            assert v == ref_smp[k], k


def _without_native(m: Metrics) -> Metrics:
    """``m`` counting a batch's chunks (``_chunk``) and gaps (``observe_all``)
    in Python, as the pure core does."""
    m._observe_all = None
    m._native = None
    return m


def test_batch_splits_and_cores_expose_the_same() -> None:
    """A batch's chunk counts and inter-chunk gaps are handed to their label
    set's children at the batch's end (``_Pending``): the exposition is the
    same, line for line, whatever the batch split (one event per batch:
    what each chunk's own call gave; each capture in one batch), and whether
    the gaps are counted by the native core or by the pure Python loop
    (float for float)."""
    # (each capture's batches apart: its stream ids start again at 1)
    captures = [pipeline_events(path) for path in PCAPS]
    by_batch, by_event, whole, pure = Metrics(), Metrics(), Metrics(), _without_native(Metrics())
    for m, size in ((by_batch, 64), (by_event, 1), (whole, 10**9), (pure, 64)):
        for events in captures:
            for j in range(0, len(events), size):
                m.observe(events[j : j + size])
    text = masked(by_batch.render())[0]
    smp = samples(by_batch.render())
    assert total(smp, "sparseety_inter_chunk_seconds_count") > 1000
    assert len(by_label(smp, "sparseety_chunk_events_total", "model")) > 3
    for m in (by_event, whole, pure):
        assert masked(m.render())[0] == text


def test_gaps_native_and_python_agree_float_for_float() -> None:
    """``hist_observe_all`` (the native core's) counts and sums what
    ``_HistogramChild.observe_all`` (the reference) does: the same buckets,
    bounds included, and the same sum bit for bit (added in order)."""
    import random

    from sniffer import native_core
    from sniffer.record.metrics import INTER_CHUNK_BUCKETS, _HistogramChild

    native = getattr(native_core()[0], "hist_observe_all", None)
    if native is None:
        pytest.skip("the native core is not built (or SPARSEETY_PURE is set)")
    rnd = random.Random(25)
    bounds = (*map(float, INTER_CHUNK_BUCKETS), float("inf"))
    edges = [0.0, -0.0, -1.0, float("inf"), *bounds[:-1], *(b * (1 + 1e-16) for b in bounds[:-1])]
    for _ in range(300):
        values = [
            rnd.choice(edges) if rnd.random() < 0.2 else rnd.uniform(0, 0.1) ** rnd.randint(1, 3)
            for _ in range(rnd.randint(0, 300))
        ]
        ref, new = _HistogramChild(bounds), _HistogramChild(bounds)
        ref.sum = new.sum = rnd.uniform(0, 1000)
        ref.observe_all(values)
        new.sum = native(new.bounds, new.counts, new.sum, values)
        assert new.counts == ref.counts
        assert new.sum.hex() == ref.sum.hex()
        if len(values) > 50:
            one = _HistogramChild(bounds)  # each value alone, as observe gives
            for v in values:
                one.observe(v)
            two = _HistogramChild(bounds)
            two.observe_all(values)
            assert (two.counts, two.sum.hex()) == (one.counts, one.sum.hex())
    with pytest.raises(ValueError):
        native(bounds, [0], 0.0, [1.0])


def test_a_failing_event_keeps_the_chunks_counted_before_it() -> None:
    """An event that raises mid-batch (a close whose reason is no string)
    still leaves the chunks before it counted, as when each was counted at
    once."""
    m = Metrics()
    events = chat_stream(1, T0)
    bad = replace(closed(1, T0 + 0.5), state=StreamState.TRUNCATED, reason=cast(str, None))
    with pytest.raises(AttributeError):
        m.observe([*events[:-1], bad, *chat_stream(2, T0)])
    smp = samples(m.render())
    assert total(smp, "sparseety_chunk_events_total") == 6
    assert total(smp, "sparseety_inter_chunk_seconds_count") == 2
    m.observe(chat_stream(3, T0))  # and the next batch counts from there
    smp = samples(m.render())
    assert total(smp, "sparseety_chunk_events_total") == 12
    assert total(smp, "sparseety_inter_chunk_seconds_count") == 4


def test_edge_values_land_in_the_same_buckets(monkeypatch: pytest.MonkeyPatch) -> None:
    """Values on bucket bounds, zero, past the last bound; negative counts raise."""
    ref = reference_metrics(monkeypatch)
    new = Metrics()
    values = [0, 1, 2, 3, 4, 5, 6, 7, 8, 16, 17, 64, 65, 10**9]
    for m in (new, ref):
        m.observe_tokens(1, output_tokens=0, prompt_tokens=4194305, tokens_per_chunk=values)
        m.observe_tokens(2, output_tokens=1, prompt_tokens=0, tokens_per_chunk=[0.5, 63.9])
        with pytest.raises(ValueError):
            m.observe([closed(3, T0, usage=Usage.parse({"prompt_tokens": -2}))])
    assert masked(new.render())[0] == masked(ref.render())[0]


def test_created_series_follow_prometheus_clients_switch() -> None:
    m = Metrics()
    m.observe(chat_stream(1, T0))
    m.add_packets(1)
    assert b"sparseety_inter_chunk_seconds_created{" in m.render()
    disable_created_metrics()
    try:
        text = m.render()
    finally:
        enable_created_metrics()
    assert b"_created" not in text
    assert b"sparseety_inter_chunk_seconds_count{" in text


def test_scrapes_while_observing(real_feed: Feed) -> None:
    """A scrape (HTTP server thread) runs while the capture and token threads
    observe: every scrape parses, counts never go backwards, and each
    histogram's count is its +Inf bucket."""
    m = Metrics()
    stop = threading.Event()
    first = threading.Event()
    seen: list[float] = []
    errors: list[BaseException] = []

    def scraper() -> None:
        # Scrapes until told to stop, then once more: at least one scrape
        # before the feeds (``first``), one after them, and as many during
        # them as the scheduler gives (how many is not what is tested).
        try:
            for _ in range(10_000):
                done = stop.is_set()
                smp = samples(m.render())
                seen.append(total(smp, "sparseety_chunk_events_total"))
                first.set()
                for (name, labels), v in smp.items():
                    if name.endswith("_count"):
                        inf = (name[: -len("_count")] + "_bucket", (*labels, ("le", "+Inf")))
                        assert smp[(inf[0], tuple(sorted(inf[1])))] == v
                if done:
                    return
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            first.set()

    thread = threading.Thread(target=scraper)
    thread.start()
    try:
        assert first.wait(60)
        for _ in range(3):
            feed_both(real_feed, m)
    finally:
        stop.set()
        thread.join(timeout=60)
    assert not errors
    assert len(seen) >= 2 and seen == sorted(seen)
    assert seen[0] == 0 and seen[-1] > 0  # one scrape before the feeds, one after


# ------------------------------------------------- server-reported speculative decoding

SPEC_FIXTURES = ("dialect_spec_vllm", "dialect_spec_llamacpp", "dialect_spec_sglang")


def test_server_spec_decode_counters_match_what_the_servers_sent() -> None:
    """The draft and accepted tokens the servers reported (the crafted
    fixtures' expected files: what was put on the wire) are counted per
    source, and each reported mean accept length observed once."""
    m = Metrics()
    want_draft: dict[str, float] = defaultdict(float)
    want_accepted: dict[str, float] = defaultdict(float)
    want_lengths: dict[str, list[float]] = defaultdict(list)
    pcaps = Path(__file__).resolve().parent.parent / "pcaps"
    for name in SPEC_FIXTURES:
        m.observe(pipeline_events(str(pcaps / f"{name}.pcap")))
        for s in json.loads((pcaps / f"{name}.expected.json").read_text())["streams"]:
            spec = s["speculative"]
            want_draft[spec["source"]] += spec["draft_tokens"] or 0
            want_accepted[spec["source"]] += spec["accepted_tokens"] or 0
            if spec["accept_length"] is not None:
                want_lengths[spec["source"]].append(spec["accept_length"])
    smp = samples(m.render())
    assert by_label(smp, "sparseety_server_spec_draft_tokens_total", "source") == want_draft
    assert {k: v for k, v in want_accepted.items() if v} == by_label(
        smp, "sparseety_server_spec_accepted_tokens_total", "source"
    )
    for source, lengths in want_lengths.items():
        key = {"source": source}
        assert total(smp, "sparseety_server_spec_accept_length_count", **key) == len(lengths)
        assert total(smp, "sparseety_server_spec_accept_length_sum", **key) == pytest.approx(
            sum(lengths)
        )
    assert set(want_lengths) == {"vllm", "sglang"}  # llama.cpp reports no steps


def test_label_set_children_across_states_models_and_a_midway_close() -> None:
    """The children a label set's streams feed are found once per label set
    (``_LabelSet``): each state, the duration and output histograms and the
    cadence classes still land under the stream's own labels, a midway close
    that names its model under that model, in the order they first came."""
    evs: list[StoreEvent] = [ConnectionOpened(1, T0, CLIENT, SERVER, True)]
    evs += chat_stream(1, T0)
    evs += [opened(2, T0 + 1), closed(2, T0 + 2, StreamState.ERROR, "HTTP 500", text_len=3)]
    evs += chat_stream(3, T0 + 3)
    evs += [
        opened(4, T0 + 4, model=None),
        StreamResponse(4, T0 + 4, None, (), "text/event-stream", True),
        replace(closed(4, T0 + 5, StreamState.MIDWAY, "started mid-way"), response_model="r"),
    ]
    evs += [opened(5, T0 + 6, model="n"), closed(5, T0 + 5, StreamState.COMPLETE)]  # clock back
    m = Metrics()
    for k in range(0, len(evs), 4):  # batches of four events
        m.observe(evs[k : k + 4])
    text = m.render().decode()
    smp = samples(text)
    states = {
        (dict(labels)["model"], dict(labels)["state"]): v
        for (n, labels), v in smp.items()
        if n == "sparseety_streams_total"
    }
    assert states == {
        ("m", "complete"): 2,
        ("m", "error"): 1,
        ("r", "midway"): 1,
        ("n", "complete"): 1,
    }
    dur = "gen_ai_server_request_duration_seconds_count"
    assert total(smp, dur, model="m") == 3
    assert total(smp, dur, model="r") == 0  # no request head: no duration
    assert total(smp, dur, model="n") == 0  # the close before the open
    chars = "sparseety_output_characters_count"
    assert [total(smp, chars, model=x) for x in ("m", "r", "n")] == [3, 1, 1]
    # "Hello you" twice, and 3
    assert total(smp, "sparseety_output_characters_sum", model="m") == 3 + 2 * 9
    # label sets in the order their first close came
    order = [
        line.split('state="')[1].split('"')[0] + "/" + line.split('model="')[1].split('"')[0]
        for line in text.splitlines()
        if line.startswith("sparseety_streams_total{")
    ]
    assert order == ["complete/m", "error/m", "midway/r", "complete/n"]
