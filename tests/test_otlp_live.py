"""``sparseety run --otlp-endpoint`` live on ``lo`` (root): real fixture server,
real clients, AF_PACKET capture, real OTLP/HTTP receiver decoding the protobuf.

The spans and metrics the receiver got are checked against the database the
same daemon wrote. Waits are bounded counts of short sleeps.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from sniffer.capture.afpacket import have_capture_privilege
from tests.fixture_server import free_port
from tests.otlp_receiver import Receiver, start_receiver
from tests.test_live_e2e import (
    _metric,
    _scrape,
    check_exact,
    concurrently,
    daemon,
    httpx_stream,
    openai_stream,
    procs,
    q,
    server,
)

__all__ = ["procs"]  # the fixture, re-exported for pytest

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(
        not have_capture_privilege(),
        reason="live capture needs root or CAP_NET_RAW (packet sockets)",
    ),
]


@pytest.fixture
def rx() -> Iterator[Receiver]:
    r = start_receiver()
    yield r
    r.close()


def _config(tmp_path: Path, **otlp: Any) -> str:
    lines = ["[otlp]"]
    for k, v in otlp.items():
        lines.append(f"{k} = {json.dumps(v)}")
    path = tmp_path / "otlp.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_live_streams_become_spans_and_genai_metrics(
    tmp_path: Path, procs: list[Any], rx: Receiver
) -> None:
    port = server(procs)
    d = daemon(
        procs,
        tmp_path,
        "--config",
        _config(tmp_path, timeout=5.0, metrics_interval=1.0),
        "--port",
        str(port),
        "--label",
        f"{port}=baseline",
        "--node",
        "gpu-07",
        "--otlp-endpoint",
        rx.url,
        "--otlp-chunk-events",
    )
    jobs = [partial(httpx_stream, port, f"otlp httpx {i}", max_tokens=20 + i) for i in range(4)]
    jobs += [partial(openai_stream, port, f"otlp openai {i}", max_tokens=15 + i) for i in range(2)]
    results = concurrently(jobs)
    assert d.stop() == 0
    check_exact(d.db, results, label="baseline")
    assert "event=otlp-exporting" in d.log()
    assert "otlp-export-failed" not in d.log()
    assert "event=otlp-stopped spans=6 dropped=0 failed_span_batches=0" in d.log()

    rows = {
        r[0]: r
        for r in q(
            d.db,
            "select s.id, s.model, s.t_request, s.closed_at, s.t_first_content, s.chunk_count,"
            " s.state, t.output_count, t.tokens_per_chunk, s.completion_tokens, s.finish_reasons"
            " from streams s left join stream_tokens t on t.stream_id = s.id",
        )
    }
    assert len(rows) == 6
    spans = {s.attributes["sparseety.stream_id"]: s for s in rx.spans}
    assert set(spans) == set(rows)
    for sid, row in rows.items():
        _, model, t_req, t_end, t_first, nchunks, state, out, tpc, completion, finish = row
        s = spans[sid]
        a = s.attributes
        assert s.name == f"chat {model}"
        assert s.start_ns == int(t_req * 1e9) and s.end_ns == int(t_end * 1e9)
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.request.model"] == model
        assert a["gen_ai.request.stream"] is True
        assert a["gen_ai.response.model"] == model  # as the server named it in its chunks
        assert a["gen_ai.response.id"].startswith("chatcmpl-")
        assert a["gen_ai.response.finish_reasons"] == list(json.loads(finish).values())
        assert a["gen_ai.response.finish_reasons"] in (["stop"], ["length"])
        assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(t_first - t_req)
        assert a["server.address"] == "127.0.0.1" and a["server.port"] == port
        assert a["sparseety.node"] == "gpu-07"
        assert a["sparseety.label"] == "baseline"
        assert a["sparseety.state"] == state == "complete"
        assert a["sparseety.chunk_count"] == nchunks
        assert "error.type" not in a
        # token figures from the daemon's token pass (our tokenizer)
        assert a["sparseety.output_tokens"] == out
        assert sum(a["sparseety.tokens_per_chunk"]) == out
        assert len(a["sparseety.tokens_per_chunk"]) == nchunks
        assert sum(int(k) * v for k, v in json.loads(tpc).items()) == out
        want_out = completion if completion is not None else out
        assert a["gen_ai.usage.output_tokens"] == want_out
        # one span event per text chunk (the flag is on), at capture times in the span
        content = [e for e in s.events if e[2]["sparseety.chunk.kind"] == "content"]
        assert len(content) == nchunks
        assert all(s.start_ns <= e[1] <= s.end_ns for e in s.events)
        assert s.resource["service.instance.id"] == "gpu-07"

    # metrics: the last cumulative points the receiver got (the final export at stop)
    (ttft,) = rx.latest("gen_ai.server.time_to_first_token")
    assert ttft.count == 6
    assert ttft.sum == pytest.approx(sum(r[4] - r[2] for r in rows.values()))
    assert ttft.unit == "s" and ttft.attributes["sparseety.label"] == "baseline"
    (dur,) = rx.latest("gen_ai.server.request.duration")
    assert dur.count == 6
    assert dur.sum == pytest.approx(sum(r[3] - r[2] for r in rows.values()))
    usage = {p.attributes["gen_ai.token.type"]: p for p in rx.latest("gen_ai.client.token.usage")}
    assert usage["output"].count == 6 and usage["output"].unit == "{token}"
    (tpot,) = rx.latest("gen_ai.server.time_per_output_token")
    assert 1 <= tpot.count <= 6


def test_live_unreachable_collector_does_not_touch_capture(
    tmp_path: Path, procs: list[Any]
) -> None:
    port = server(procs)
    dead = f"http://127.0.0.1:{free_port(lo=21000, hi=21999)}"  # nothing listens there
    mport = free_port(lo=19000, hi=19999)
    d = daemon(
        procs,
        tmp_path,
        "--config",
        _config(tmp_path, timeout=1.0, metrics_interval=1.0),
        "--port",
        str(port),
        "--metrics-listen",
        f"127.0.0.1:{mport}",
        "--no-tokens",
        env={"OTEL_EXPORTER_OTLP_ENDPOINT": dead},  # the standard variable turns export on
    )
    results = concurrently([partial(httpx_stream, port, f"dead {i}") for i in range(5)])
    url = f"http://127.0.0.1:{mport}/metrics"
    failures = 0.0
    for _ in range(200):
        failures = _metric(_scrape(url), "sparseety_otlp_export_failures_total")
        if failures >= 2:
            break
        time.sleep(0.1)
    assert failures >= 2
    assert d.stop() == 0
    check_exact(d.db, results)  # capture unaffected: every stream exact
    log = d.log()
    assert f"endpoint={dead}" in log
    lines = [ln for ln in log.splitlines() if "event=otlp-export-failed" in ln]
    # logged once per interval (60 s) and signal, however many batches failed
    assert 1 <= len(lines) <= 2
    assert len({ln.split("signal=")[1].split()[0] for ln in lines}) == len(lines)


def test_live_full_queue_drops_counted_capture_exact(
    tmp_path: Path, procs: list[Any], rx: Receiver
) -> None:
    port = server(procs)
    mport = free_port(lo=19000, hi=19999)
    rx.hold()  # a stalled collector: the export thread waits on its first request
    d = daemon(
        procs,
        tmp_path,
        "--config",
        _config(tmp_path, timeout=30.0, metrics_interval=3600.0),
        "--port",
        str(port),
        "--metrics-listen",
        f"127.0.0.1:{mport}",
        "--no-tokens",
        "--otlp-endpoint",
        rx.url,
        "--otlp-queue-size",
        "1",
    )
    first = httpx_stream(port, "full first")
    assert rx.wait(lambda r: r.arrived.is_set())  # the exporter is stuck on the collector
    results = concurrently([partial(httpx_stream, port, f"full {i}") for i in range(6)])
    url = f"http://127.0.0.1:{mport}/metrics"
    dropped = 0.0
    for _ in range(200):
        dropped = _metric(_scrape(url), "sparseety_otlp_dropped_total")
        if dropped >= 5:
            break
        time.sleep(0.1)
    assert dropped == 5  # 6 closed streams, 1 fits in the queue
    rx.release()
    assert d.stop() == 0
    check_exact(d.db, [first, *results])
    assert len(rx.spans) == 2
