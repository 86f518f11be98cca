"""OTLP export (sniffer.record.otlp): the real SDK sending to a real OTLP/HTTP
receiver on 127.0.0.1 that decodes the protobuf (tests/otlp_receiver.py).

Store events are built here (they are what the pipeline hands the chain);
tests/test_otlp_live.py does the same with ``sparseety run`` capturing live.
"""

from __future__ import annotations

import dataclasses
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sniffer.core.events import (
    ChunkEvent,
    StoreEvent,
    StreamClosed,
    StreamOpened,
    StreamResponse,
    StreamState,
)
from sniffer.llm.values import RequestSummary, Usage
from sniffer.record.chain import RecordingChain
from sniffer.record.metrics import Metrics
from sniffer.record.otlp import (
    DURATION_BUCKETS,
    SCHEMA_URL,
    TOKEN_BUCKETS,
    TPOT_BUCKETS,
    TTFT_BUCKETS,
    OtlpExporter,
    OtlpOptions,
    OtlpUnavailable,
    parse_headers,
    resolve_endpoint,
    resolve_headers,
)
from sniffer.runtime.config import Config, ConfigError, parse_config
from tests.otlp_receiver import Receiver, start_receiver

ROOT = Path(__file__).resolve().parent.parent
SPAN_KIND_CLIENT = 3
STATUS_ERROR = 2


@pytest.fixture
def rx() -> Iterator[Receiver]:
    r = start_receiver()
    yield r
    r.close()


USAGE_7_3 = Usage.parse({"prompt_tokens": 7, "completion_tokens": 3})


def stream_events(
    sid: int,
    *,
    t0: float = 1000.0,
    model: str = "llama-70b",
    status: int = 200,
    state: StreamState = StreamState.COMPLETE,
    chunks: int = 3,
    usage: Usage | None = USAGE_7_3,
    dialect: str | None = "openai.chat",
    label: str | None = "baseline",
) -> list[StoreEvent]:
    ev: list[StoreEvent] = [
        StreamOpened(
            stream=sid,
            conn=sid,
            exchange=0,
            ts=t0,
            client=("127.0.0.1", 40000 + sid),
            server=("127.0.0.1", 8000),
            method="POST",
            path="/v1/chat/completions",
            request_headers=(),
            request_body=f'{{"model":"{model}","stream":true}}',
            request=RequestSummary(model=model, stream=True),
            dialect=dialect,
            label=label,
        ),
        StreamResponse(
            stream=sid,
            ts=t0 + 0.05,
            status=status,
            headers=(),
            content_type="text/event-stream",
            streaming=True,
        ),
    ]
    for i in range(chunks):
        ev.append(
            ChunkEvent(
                stream=sid,
                ts=t0 + 0.2 + 0.1 * i,
                seq=i,
                choice=0,
                chunk_index=i + 1,
                kind="content",
                text=f"w{i} ",
            )
        )
    ev.append(
        StreamClosed(
            stream=sid,
            ts=t0 + 0.2 + 0.1 * chunks,
            state=state,
            reason="finished" if state is StreamState.COMPLETE else "server error",
            done_seen=state is StreamState.COMPLETE,
            gap=False,
            t_first_content=t0 + 0.2 if chunks else None,
            t_last_chunk=t0 + 0.2 + 0.1 * (chunks - 1) if chunks else None,
            chunk_count=chunks,
            event_count=chunks,
            text_len=3 * chunks,
            finish_reasons=((0, "stop"),) if state is StreamState.COMPLETE else (),
            usage=usage,
            response_body=None,
            response_id=f"chatcmpl-{sid}",
            response_model=f"{model}-served",
        )
    )
    return ev


def exporter(url: str, **kw: Any) -> tuple[OtlpExporter, list[tuple[Any, ...]], Metrics]:
    logs: list[tuple[Any, ...]] = []
    metrics = Metrics()
    wait_tokens = kw.pop("wait_tokens", False)
    opts = OtlpOptions(endpoint=url, node="node-a", metrics_interval=3600.0, **kw)
    ex = OtlpExporter(
        opts,
        log=lambda level, event, **f: logs.append((level, event, f)),
        metrics=metrics,
        wait_tokens=wait_tokens,
    )
    return ex, logs, metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    v = metrics.registry.get_sample_value(name, labels)
    return 0.0 if v is None else v


# ---------------------------------------------------------------- spans and metrics


def test_span_per_closed_stream_with_genai_attributes(rx: Receiver) -> None:
    ex, logs, _ = exporter(rx.url, chunk_events=True)
    ex.observe(stream_events(1))
    ex.observe(stream_events(2, t0=2000.0, model="llama-70b-sparse", label="sparse"))
    ex.close()
    assert logs == [
        (
            "info",
            "otlp-stopped",
            {"spans": 2, "dropped": 0, "failed_span_batches": 0, "failed_metric_batches": 0},
        )
    ]
    spans = {s.attributes["sparseety.stream_id"]: s for s in rx.spans}
    assert set(spans) == {1, 2}
    s = spans[1]
    assert s.name == "chat llama-70b"
    assert s.kind == SPAN_KIND_CLIENT
    assert s.start_ns == 1000 * 10**9
    assert s.end_ns == int(1000.5 * 1e9)
    assert s.schema_url == SCHEMA_URL and s.scope == "sparseety"
    assert s.resource["service.name"] == "sparseety"
    assert s.resource["service.instance.id"] == "node-a"
    a = s.attributes
    assert a["gen_ai.operation.name"] == "chat"
    assert "gen_ai.provider.name" not in a  # an OpenAI-compatible API does not say who runs it
    assert a["gen_ai.request.model"] == "llama-70b"
    assert a["gen_ai.response.model"] == "llama-70b-served"
    assert a["gen_ai.response.id"] == "chatcmpl-1"
    assert a["gen_ai.request.stream"] is True
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert a["gen_ai.usage.input_tokens"] == 7
    assert a["gen_ai.usage.output_tokens"] == 3
    assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.2)
    assert a["server.address"] == "127.0.0.1" and a["server.port"] == 8000
    assert "error.type" not in a
    assert a["sparseety.label"] == "baseline"
    assert a["sparseety.node"] == "node-a"
    assert a["sparseety.state"] == "complete"
    assert a["sparseety.gap"] is False
    assert a["sparseety.chunk_count"] == 3
    assert s.status_code != STATUS_ERROR
    # per-chunk events, at the capture times
    assert [e[0] for e in s.events] == ["sparseety.chunk"] * 3
    assert [e[1] for e in s.events] == [int((1000.2 + 0.1 * i) * 1e9) for i in range(3)]
    assert [e[2]["sparseety.chunk.index"] for e in s.events] == [1, 2, 3]
    assert spans[2].name == "chat llama-70b-sparse"
    assert spans[2].attributes["sparseety.label"] == "sparse"


def test_chunk_events_off_by_default(rx: Receiver) -> None:
    ex, _, _ = exporter(rx.url)
    ex.observe(stream_events(1))
    ex.close()
    (s,) = rx.spans
    assert s.events == []


def test_genai_metrics_units_buckets_and_values(rx: Receiver) -> None:
    ex, _, _ = exporter(rx.url)
    ex.observe(stream_events(1))
    ex.observe(
        stream_events(
            2, t0=2000.0, chunks=5, usage=Usage.loads('{"prompt_tokens":9,"completion_tokens":5}')
        )
    )
    ex.close()
    want = {
        "gen_ai.server.time_to_first_token": ("s", TTFT_BUCKETS),
        "gen_ai.server.time_per_output_token": ("s", TPOT_BUCKETS),
        "gen_ai.server.request.duration": ("s", DURATION_BUCKETS),
        "gen_ai.client.token.usage": ("{token}", TOKEN_BUCKETS),
    }
    for name, (unit, buckets) in want.items():
        points = rx.latest(name)
        assert points, name
        for p in points:
            assert p.unit == unit
            assert p.bounds == list(buckets)
            assert p.schema_url == SCHEMA_URL
            assert p.attributes["gen_ai.request.model"] == "llama-70b"
            assert p.attributes["gen_ai.operation.name"] == "chat"
    # buckets are the spec's explicit boundaries
    assert TOKEN_BUCKETS[-1] == 67108864 and DURATION_BUCKETS[-1] == 81.92
    (ttft,) = rx.latest("gen_ai.server.time_to_first_token")
    assert ttft.count == 2 and ttft.sum == pytest.approx(0.4)
    (dur,) = rx.latest("gen_ai.server.request.duration")
    assert dur.count == 2 and dur.sum == pytest.approx(0.5 + 0.7)
    (tpot,) = rx.latest("gen_ai.server.time_per_output_token")
    # (last - first output chunk) / (output tokens - 1): 0.2/2 and 0.4/4
    assert tpot.count == 2 and tpot.sum == pytest.approx(0.1 + 0.1)
    usage = {p.attributes["gen_ai.token.type"]: p for p in rx.latest("gen_ai.client.token.usage")}
    assert usage["input"].count == 2 and usage["input"].sum == 16
    assert usage["output"].count == 2 and usage["output"].sum == 8


@pytest.mark.parametrize(
    ("path", "items", "rid", "model"),
    [
        (
            "/v1/chat/completions",
            [
                '{"id":"chatcmpl-9","model":"llama-70b-0425","choices":'
                '[{"index":0,"delta":{"content":"Hi"}}]}'
            ],
            "chatcmpl-9",
            "llama-70b-0425",
        ),
        (
            "/v1/messages",
            [
                '{"type":"message_start","message":{"id":"msg_1","type":"message",'
                '"role":"assistant","model":"claude-x-2025","content":[]}}',
                '{"type":"ping"}',
            ],
            "msg_1",
            "claude-x-2025",
        ),
        (
            "/v1/responses",
            [
                '{"type":"response.created","response":{"id":"resp_7",'
                '"model":"gpt-x","status":"in_progress"}}'
            ],
            "resp_7",
            "gpt-x",
        ),
        (
            "/api/chat",
            ['{"model":"llama3","message":{"content":"a"},"done":false}'],
            None,
            "llama3",
        ),
    ],
)
def test_dialects_name_the_reply_id_and_model(
    path: str, items: list[str], rid: str | None, model: str
) -> None:
    from sniffer.llm.dialects import select_dialect

    d = select_dialect("POST", path, {"model": "m", "stream": True})
    assert d is not None
    for item in items:
        d.event(item, "message")
    assert (getattr(d, "response_id", None), getattr(d, "response_model", None)) == (rid, model)


def test_whole_reply_is_not_streamed(rx: Receiver) -> None:
    ev = stream_events(1, chunks=1)
    opened, resp, chunk, closed = ev
    assert isinstance(opened, StreamOpened) and isinstance(resp, StreamResponse)
    assert isinstance(closed, StreamClosed)
    ev = [
        dataclasses.replace(opened, request=RequestSummary(model="llama-70b", stream=False)),
        dataclasses.replace(resp, streaming=False, content_type="application/json"),
        chunk,
        closed,
    ]
    ex, _, _ = exporter(rx.url)
    ex.observe(ev)
    ex.close()
    (s,) = rx.spans
    a = s.attributes
    assert a["gen_ai.request.stream"] is False
    assert "gen_ai.response.time_to_first_chunk" not in a  # not streamed
    assert rx.latest("gen_ai.server.time_to_first_token") == []


def test_error_stream_has_error_type_and_status(rx: Receiver) -> None:
    ex, _, _ = exporter(rx.url)
    ex.observe(stream_events(1, status=500, state=StreamState.ERROR, chunks=0, usage=None))
    ex.close()
    (s,) = rx.spans
    assert s.attributes["error.type"] == "500"
    assert s.status_code == STATUS_ERROR
    assert s.attributes["sparseety.state"] == "error"
    (dur,) = rx.latest("gen_ai.server.request.duration")
    assert dur.attributes["error.type"] == "500"
    assert rx.latest("gen_ai.server.time_to_first_token") == []  # successful responses only


def test_anthropic_names_its_provider_and_non_llm_exchanges_have_no_span(
    rx: Receiver,
) -> None:
    ex, _, _ = exporter(rx.url)
    ex.observe(stream_events(1, dialect="anthropic.messages", model="claude-x"))
    ex.observe(stream_events(2, dialect=None, model="x"))  # e.g. a health check
    ex.close()
    (s,) = rx.spans
    assert s.attributes["gen_ai.provider.name"] == "anthropic"


def test_span_waits_for_token_figures_from_the_token_pass(rx: Receiver) -> None:
    ex, _, _ = exporter(rx.url, wait_tokens=True)
    ex.observe(stream_events(1, usage=None))
    ex.observe(stream_events(2, t0=2000.0, usage=None))
    ex.observe_tokens(1, output_tokens=4, prompt_tokens=11, tokens_per_chunk=[1, 2, 1])
    ex.close()  # stream 2 never got figures: exported without them at close
    spans = {s.attributes["sparseety.stream_id"]: s.attributes for s in rx.spans}
    assert spans[1]["sparseety.tokens_per_chunk"] == [1, 2, 1]
    assert spans[1]["gen_ai.usage.output_tokens"] == 4  # no server usage: our count
    assert spans[1]["gen_ai.usage.input_tokens"] == 11
    assert "sparseety.tokens_per_chunk" not in spans[2]
    assert "gen_ai.usage.output_tokens" not in spans[2]


def test_chain_feeds_the_exporter_and_its_token_pass(rx: Receiver, tmp_path: Path) -> None:
    """The exporter as an observer of the real recording chain (real tokenizer)."""
    from sniffer.store.writer import StoreWriter

    writer = StoreWriter(f"sqlite:///{tmp_path / 'c.db'}")
    ex, _, _ = exporter(rx.url, wait_tokens=True)
    chain = RecordingChain(writer, tokens=_registry(), otlp=ex)
    assert ex.observe in chain.observers
    chain.write(stream_events(1))
    chain.flush()
    chain.tokenize()
    chain.close()
    ex.close()
    (s,) = rx.spans
    tpc = s.attributes["sparseety.tokens_per_chunk"]
    assert len(tpc) == 3 and all(n >= 1 for n in tpc)
    assert s.attributes["sparseety.output_tokens"] == sum(tpc)


def _registry() -> Any:
    from sniffer.llm.tokens import TokenizerRegistry

    return TokenizerRegistry([])


# ---------------------------------------------------------------- failures


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_collector_counted_and_logged_once() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    ex, logs, metrics = exporter(url, timeout=0.5)
    for i in range(3):
        ex.observe(stream_events(i + 1, t0=1000.0 + i))
    ex.close()
    assert ex.failures["traces"] >= 1
    assert ex.exported_spans == 0
    assert sample(metrics, "sparseety_otlp_export_failures_total", signal="traces") >= 1
    failed = [f for _, event, f in logs if event == "otlp-export-failed"]
    # one line per signal per interval (60 s), however many batches failed
    assert len([f for f in failed if f["signal"] == "traces"]) == 1
    assert len([f for f in failed if f["signal"] == "metrics"]) <= 1
    assert failed[0]["endpoint"] == url


def test_refused_batches_are_failures(rx: Receiver) -> None:
    rx.status = 400  # a collector refusing the data (not retryable)
    ex, logs, metrics = exporter(rx.url, timeout=2.0)
    ex.observe(stream_events(1))
    ex.close()
    assert sample(metrics, "sparseety_otlp_export_failures_total", signal="traces") == 1
    assert [e for _, e, _ in logs].count("otlp-export-failed") >= 1


def test_full_queue_drops_are_counted_and_observe_never_blocks(rx: Receiver) -> None:
    rx.hold()  # the collector stalls: the export thread waits on its first request
    ex, _, metrics = exporter(rx.url, queue_size=1, timeout=30.0)
    ex.observe(stream_events(1))
    assert rx.wait(lambda r: r.arrived.is_set())
    for i in range(2, 8):  # 6 more closed streams: one fits in the queue
        ex.observe(stream_events(i, t0=1000.0 + i))
    assert ex.dropped == 5
    assert sample(metrics, "sparseety_otlp_dropped_total") == 5
    rx.release()
    ex.close()
    assert sorted(s.attributes["sparseety.stream_id"] for s in rx.spans) == [1, 2]


# ---------------------------------------------------------------- configuration


def test_endpoint_and_headers_from_the_standard_environment() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20abc,x-tenant=t1",
    }
    assert resolve_endpoint("", env) == "http://collector:4318"
    assert resolve_endpoint("http://other:4318", env) == "http://other:4318"
    assert resolve_endpoint("", {}) == ""
    assert resolve_headers((("X-Tenant", "t2"),), env) == {
        "authorization": "Bearer abc",
        "x-tenant": "t2",
    }
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        parse_headers("novalue")


def test_headers_reach_the_collector(rx: Receiver) -> None:
    ex, _, _ = exporter(rx.url, headers={"x-tenant": "fleet-1"})
    ex.observe(stream_events(1))
    ex.close()
    assert rx.headers and all(h.get("x-tenant") == "fleet-1" for h in rx.headers)


def test_config_table_and_node() -> None:
    cfg = parse_config(
        {
            "node": "gpu-07",
            "otlp": {
                "endpoint": "http://127.0.0.1:4318",
                "headers": {"x-tenant": "a"},
                "chunk_events": True,
                "queue_size": 10,
                "timeout": 2,
                "metrics_interval": 5,
            },
        }
    )
    assert cfg.node == "gpu-07"
    assert cfg.otlp_endpoint == "http://127.0.0.1:4318"
    assert cfg.otlp_headers == (("x-tenant", "a"),)
    assert cfg.otlp_chunk_events and cfg.otlp_queue_size == 10
    assert Config().node == socket.gethostname()
    assert Config().otlp_endpoint == ""
    with pytest.raises(ConfigError, match="otlp endpoint"):
        parse_config({"otlp": {"endpoint": "collector:4318"}})
    with pytest.raises(ConfigError, match="unknown key"):
        parse_config({"otlp": {"endpont": "http://x"}})


def test_cli_flags_reach_the_config() -> None:
    from sniffer.cli.run import build_config

    cfg, _ = build_config(
        None,
        {
            "node": "n9",
            "otlp_endpoint": "http://127.0.0.1:4318",
            "otlp_headers": ("x-a=1",),
            "otlp_chunk_events": True,
            "otlp_queue_size": 7,
        },
    )
    assert (cfg.node, cfg.otlp_endpoint, cfg.otlp_headers) == (
        "n9",
        "http://127.0.0.1:4318",
        (("x-a", "1"),),
    )
    assert cfg.otlp_chunk_events and cfg.otlp_queue_size == 7


# ---------------------------------------------------------------- optional dependency


def test_missing_sdk_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)
    with pytest.raises(OtlpUnavailable, match=re.escape("pip install 'sparseety[otlp]'")):
        OtlpExporter(OtlpOptions(endpoint="http://127.0.0.1:4318"))


def test_cli_without_sdk_exits_with_the_install_line(tmp_path: Path) -> None:
    """`sparseety run --otlp-endpoint` in a process where the SDK cannot be imported."""
    code = (
        "import sys; sys.modules['opentelemetry.sdk.trace'] = None\n"
        "from sniffer.cli import entry_point\n"
        "sys.argv = ['sparseety', 'run', '--db', sys.argv[1], '--no-metrics', "
        "'--no-tokens', '--otlp-endpoint', 'http://127.0.0.1:4318']\n"
        "entry_point()\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "x.db")],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert "pip install 'sparseety[otlp]'" in p.stderr


def test_daemon_code_does_not_import_the_sdk_when_otlp_is_off() -> None:
    code = (
        "import sys\n"
        "import sniffer.cli.run, sniffer.runtime.features, sniffer.record.chain\n"
        "import sniffer.record.otlp\n"
        "bad = [m for m in sys.modules if m.startswith('opentelemetry')]\n"
        "assert not bad, bad\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr


# ---------------------------------------------------------------- docs collector config


def _docs_collector_config() -> dict[str, Any]:
    text = (ROOT / "docs" / "operating.md").read_text()
    m = re.search(r"<!-- otelcol-config -->\s*```yaml\n(.*?)```", text, re.S)
    assert m, "docs/operating.md has no collector configuration block"
    cfg = yaml.safe_load(m.group(1))
    assert isinstance(cfg, dict)
    return cfg


def test_docs_collector_config_is_valid_and_consistent() -> None:
    cfg = _docs_collector_config()
    receivers, exporters = cfg["receivers"], cfg["exporters"]
    processors = cfg.get("processors", {})
    assert "http" in receivers["otlp"]["protocols"]
    assert receivers["otlp"]["protocols"]["http"]["endpoint"].endswith(":4318")
    pipes = cfg["service"]["pipelines"]
    assert {"traces", "metrics"} <= set(pipes)
    for name, pipe in pipes.items():
        for r in pipe["receivers"]:
            assert r in receivers, (name, r)
        for p in pipe.get("processors", []):
            assert p in processors, (name, p)
        for e in pipe["exporters"]:
            assert e in exporters, (name, e)
        assert "debug" in pipe["exporters"]
    assert any(e.startswith("prometheusremotewrite") for e in pipes["metrics"]["exporters"])
    assert any(e.startswith(("otlp/tempo", "clickhouse")) for e in pipes["traces"]["exporters"])


# ---------------------------------------------------------------- replay


def test_replay_exports_like_the_daemon(rx: Receiver, tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "r.db"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "sniffer.cli",
            "replay",
            str(ROOT / "pcaps" / "chat_english.pcap"),
            "--db",
            str(db),
            "--otlp-endpoint",
            rx.url,
            "--otlp-chunk-events",
            "-q",
        ],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr
    with sqlite3.connect(db) as c:
        sid, model, t_req, t_end, nchunks = c.execute(
            "select id, model, t_request, closed_at, chunk_count from streams"
        ).fetchone()
        (out,) = c.execute("select output_count from stream_tokens").fetchone()
    (s,) = rx.spans
    assert s.name == f"chat {model}"
    assert s.attributes["sparseety.stream_id"] == sid
    assert (s.start_ns, s.end_ns) == (int(t_req * 1e9), int(t_end * 1e9))
    assert s.attributes["sparseety.chunk_count"] == nchunks
    assert sum(s.attributes["sparseety.tokens_per_chunk"]) == out
    assert len([e for e in s.events if e[2]["sparseety.chunk.kind"] == "content"]) == nchunks
    (dur,) = rx.latest("gen_ai.server.request.duration")
    assert dur.count == 1 and dur.sum == pytest.approx(t_end - t_req)


# ---------------------------------------------------------------- reload


def test_reload_keeps_node_and_otlp_settings_and_says_so(tmp_path: Path) -> None:
    import io
    import threading

    from sniffer.runtime.config import load_config
    from sniffer.runtime.daemon import Daemon
    from sniffer.runtime.log import Log
    from sniffer.runtime.notify import Notifier
    from tests.test_daemon import PORT, SEGMENTS, FakeSource, start, wait_for

    cfg_path = tmp_path / "s.toml"
    db = str(tmp_path / "d.db")
    cfg_path.write_text(
        f"node = 'a'\n[capture]\nports = [{PORT}]\n[store]\ndatabase = '{db}'\n"
        "[otlp]\nqueue_size = 10\n"
    )
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
    # the two values only (a bare "10" is in /tmp/pytest-of-root/pytest-102/…,
    # the database's path: the reload then named database among its keys)
    changed = cfg_path.read_text().replace("node = 'a'", "node = 'b'")
    cfg_path.write_text(changed.replace("queue_size = 10", "queue_size = 20"))
    d.request_reload()
    assert wait_for(lambda: "event=reloaded" in log.getvalue())
    gate.set()
    assert r.stop() == 0
    assert (d.config.node, d.config.otlp_queue_size) == ("a", 10)
    assert "event=reload-needs-restart keys=node,otlp_queue_size" in log.getvalue()


def test_server_spec_decode_on_spans_and_metrics(rx: Receiver) -> None:
    """A stream whose server reported speculative decoding (vLLM's metrics)
    carries it as ``sparseety.spec.*`` span attributes and in the two
    per-request histograms."""
    spec = {
        "num_spec_steps": 3,
        "num_draft_tokens": 9,
        "num_accepted_draft_tokens": 5,
        "mean_acceptance_length": 1 + 5 / 3,
        "draft_acceptance_rate": 5 / 9,
        "acceptance_histogram": [0, 1, 2, 0],
    }
    from sniffer.llm.dialects.openai import server_stats

    raw = {"prompt_tokens": 7, "completion_tokens": 3, "metrics": {"speculative_decoding": spec}}
    usage = Usage.parse(raw)
    assert usage is not None
    ex, _, _ = exporter(rx.url)
    ex.observe(stream_events(1, usage=server_stats(usage)))
    ex.observe(stream_events(2, t0=2000.0))  # no speculative decoding reported
    ex.close()
    spans = {s.attributes["sparseety.stream_id"]: s.attributes for s in rx.spans}
    a = spans[1]
    assert a["sparseety.spec.source"] == "vllm"
    assert (a["sparseety.spec.draft_tokens"], a["sparseety.spec.accepted_tokens"]) == (9, 5)
    assert a["sparseety.spec.steps"] == 3
    assert a["sparseety.spec.accept_length"] == pytest.approx(1 + 5 / 3)
    assert a["sparseety.spec.acceptance_rate"] == pytest.approx(5 / 9)
    assert not any(k.startswith("sparseety.spec.") for k in spans[2])
    (length,) = rx.latest("sparseety.server.spec.accept_length")
    (rate,) = rx.latest("sparseety.server.spec.acceptance_rate")
    assert length.attributes["sparseety.spec.source"] == "vllm"
    assert (length.count, length.sum) == (1, pytest.approx(1 + 5 / 3))
    assert (rate.count, rate.sum) == (1, pytest.approx(5 / 9))
