"""``sparseety run`` end to end, live on ``lo`` (root): real server, real clients.

Each test starts the fixture server on a free loopback port and the daemon as
a subprocess (``python -m sniffer.cli run …``), drives streaming requests with
httpx and the openai SDK, records what the clients received, stops the daemon
and compares the database with it. Every wait is bounded by a count of short
sleeps or a subprocess timeout; only processes started here are signalled.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from sniffer.capture.afpacket import have_capture_privilege
from sniffer.runtime.capture_thread import BLOCK_TIMEOUT_MS
from tests.fixture_server import free_port, start_server_process, wait_ready

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(
        not have_capture_privilege(),
        reason="live capture needs root or CAP_NET_RAW (packet sockets)",
    ),
]

ROOT = Path(__file__).resolve().parent.parent
STEP = 0.05
READY_STEPS = 400  # × 0.05 s for the daemon to log capture-active


# ---------------------------------------------------------------- processes


@dataclass
class DaemonProc:
    proc: subprocess.Popen[bytes]
    log_path: Path
    db: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def start_daemon(
    tmp_path: Path, *args: str, env: dict[str, str] | None = None, name: str = "d"
) -> DaemonProc:
    db = str(tmp_path / f"{name}.db")
    log_path = tmp_path / f"{name}.log"
    cmd = [sys.executable, "-m", "sniffer.cli", "run", "--db", db, "--flush-interval", "0.2"]
    if "--metrics-listen" not in args and "--no-metrics" not in args:
        cmd += ["--metrics-listen", f"127.0.0.1:{free_port(lo=19000, hi=19999)}"]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    full_env.pop("NOTIFY_SOCKET", None)
    with open(log_path, "wb") as fh:
        proc = subprocess.Popen([*cmd, *args], cwd=ROOT, env=full_env, stderr=fh)
    d = DaemonProc(proc, log_path, db)
    for _ in range(READY_STEPS):
        if "event=capture-active" in d.log():
            return d
        if proc.poll() is not None:
            break
        time.sleep(STEP)
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    raise AssertionError(f"daemon did not become active:\n{d.log()}")


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes this test started; killed (by PID) if still running at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def server(procs: list[subprocess.Popen[bytes]], *opts: str) -> int:
    port = free_port()
    p = start_server_process(port, *opts)
    procs.append(p)
    wait_ready(port, 20)
    return port


def daemon(
    procs: list[subprocess.Popen[bytes]], tmp_path: Path, *args: str, **kw: Any
) -> DaemonProc:
    d = start_daemon(tmp_path, *args, **kw)
    procs.append(d.proc)
    return d


# ---------------------------------------------------------------- clients


@dataclass
class Result:
    prompt: str
    text: str = ""
    complete: bool = False
    error: str | None = None
    chunks: int = 0
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def body(prompt: str, model: str, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "max_tokens": max_tokens,
    }


def httpx_stream(
    port: int,
    prompt: str,
    model: str = "fake-delay2",
    max_tokens: int = 40,
    keepalive: bool = True,
    abort_after: int | None = None,
) -> Result:
    r = Result(prompt)
    started = time.perf_counter()
    headers = {} if keepalive else {"Connection": "close"}
    try:
        with (
            httpx.Client(timeout=30) as c,
            c.stream(
                "POST",
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json=body(prompt, model, max_tokens),
                headers=headers,
            ) as resp,
        ):
            resp.raise_for_status()
            for line in resp.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    # read on to the end of the body (the chunked terminator): a
                    # client that closes here races the server's last write
                    r.complete = True
                    continue
                obj = json.loads(data)
                for ch in obj.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content") or ""
                    if piece:
                        r.text += piece
                        r.chunks += 1
                if abort_after is not None and r.chunks >= abort_after:
                    break  # leaving the block closes the connection mid-stream
    except Exception as exc:
        r.error = f"{type(exc).__name__}: {exc}"
    r.seconds = time.perf_counter() - started
    return r


def openai_stream(
    port: int, prompt: str, model: str = "fake-delay2", max_tokens: int = 40
) -> Result:
    import openai

    r = Result(prompt)
    started = time.perf_counter()
    try:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test", timeout=30
        )
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            stream=True,
            max_tokens=max_tokens,
        )
        for chunk in stream:
            for ch in chunk.choices:
                if ch.delta and ch.delta.content:
                    r.text += ch.delta.content
                    r.chunks += 1
                if ch.finish_reason:
                    r.complete = True
        client.close()
    except Exception as exc:
        r.error = f"{type(exc).__name__}: {exc}"
    r.seconds = time.perf_counter() - started
    return r


def concurrently(jobs: Sequence[Callable[[], Result]], workers: int = 16) -> list[Result]:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(j) for j in jobs]
        return [f.result(timeout=120) for f in futures]


# ---------------------------------------------------------------- database


def q(db: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as c:
        return c.execute(sql, args).fetchall()


def stored(db: str) -> dict[str, dict[str, Any]]:
    """Streams by the prompt of their request: row, text of choice 0, chunk times."""
    out: dict[str, dict[str, Any]] = {}
    cols = "id, request_json, state, gap, label, t_request, t_first_content, t_last_chunk"
    for sid, req, state, gap, label, t_req, t_first, t_last in q(db, f"select {cols} from streams"):
        if not req:
            continue
        prompt = json.loads(req)["messages"][0]["content"]
        chunks = q(db, "select choice, text, ts from chunks where stream_id=? order by seq", sid)
        out[prompt] = {
            "id": sid,
            "state": state,
            "gap": gap,
            "label": label,
            "t_request": t_req,
            "t_first_content": t_first,
            "t_last_chunk": t_last,
            "text": "".join(t or "" for ch, t, _ in chunks if ch == 0),
            "ts": [ts for _, _, ts in chunks],
        }
    return out


def check_exact(
    db: str,
    results: list[Result],
    label: str | None = None,
    states: tuple[str, ...] = ("complete",),
) -> None:
    rows = stored(db)
    for r in results:
        assert r.error is None, r.error
        assert r.complete and r.text, r
        s = rows.get(r.prompt)
        assert s is not None, f"no stream for {r.prompt!r}"
        assert s["state"] in states, s
        assert not s["gap"]
        assert s["text"] == r.text
        assert s["label"] == label
        assert s["ts"] == sorted(s["ts"])
        assert s["t_request"] <= s["t_first_content"] <= s["t_last_chunk"]


# ---------------------------------------------------------------- tests


def test_concurrent_streams_httpx_and_openai(tmp_path: Path, procs: list[Any]) -> None:
    port = server(procs)
    d = daemon(procs, tmp_path, "--port", str(port))
    jobs: list[Callable[[], Result]] = []
    for i in range(8):
        jobs.append(partial(httpx_stream, port, f"httpx prompt {i}", max_tokens=30 + i))
    for i in range(6):
        jobs.append(partial(openai_stream, port, f"openai prompt {i}", max_tokens=25 + i))
    results = concurrently(jobs)
    assert d.stop() == 0
    check_exact(d.db, results)
    active = next(ln for ln in d.log().splitlines() if "event=capture-active" in ln)
    assert "iface=lo" in active and "backend=packet" in active and f"tcp port {port}" in active
    stopped = next(ln for ln in d.log().splitlines() if "event=stopped" in ln)
    assert "queue_dropped=0" in stopped and "kernel_drops=0" in stopped
    # credentials never stored
    assert "sk-test" not in "".join(str(r) for r in q(d.db, "select request_headers from streams"))


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url, timeout=10).text
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _metric(scraped: dict[Any, float], name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels``."""
    return sum(
        v
        for (n, lab), v in scraped.items()
        if n == name and all(dict(lab).get(k) == x for k, x in labels.items())
    )


def test_metrics_scrape_matches_database(tmp_path: Path, procs: list[Any]) -> None:
    port = server(procs)
    mport = free_port(lo=19000, hi=19999)
    d = daemon(
        procs,
        tmp_path,
        "--port",
        str(port),
        "--label",
        f"{port}=baseline",
        "--metrics-listen",
        f"127.0.0.1:{mport}",
    )
    results = concurrently([partial(httpx_stream, port, f"metrics {i}") for i in range(6)])
    assert all(r.complete for r in results)
    url = f"http://127.0.0.1:{mport}/metrics"
    scraped: dict[Any, float] = {}
    for _ in range(200):  # streams flushed and tokenized (token worker: every 2 s)
        scraped = _scrape(url)
        done = _metric(scraped, "gen_ai_client_token_usage_count", gen_ai_token_type="output")
        ticked = _metric(scraped, "sparseety_packets_captured_total")  # set once a tick
        if (
            _metric(scraped, "sparseety_streams_total", state="complete") >= 6
            and done >= 6
            and ticked > 0
        ):
            break
        time.sleep(0.1)
    assert d.stop() == 0
    (complete,) = q(d.db, "select count(*) from streams where state = 'complete'")[0]
    assert complete == 6
    assert _metric(scraped, "sparseety_streams_total", state="complete", label="baseline") == 6
    ttft = q(d.db, "select sum(t_first_content - t_request) from streams")[0][0]
    got = _metric(scraped, "gen_ai_server_time_to_first_token_seconds_sum", label="baseline")
    assert got == pytest.approx(ttft, rel=1e-6, abs=1e-6)
    assert _metric(scraped, "gen_ai_server_time_to_first_token_seconds_count") == 6
    (chars,) = q(d.db, "select sum(text_len) from streams")[0]
    assert _metric(scraped, "sparseety_output_characters_sum") == chars
    (tokens,) = q(d.db, "select sum(output_count) from stream_tokens")[0]
    assert tokens > 0
    assert _metric(scraped, "gen_ai_client_token_usage_sum", gen_ai_token_type="output") == tokens
    assert _metric(scraped, "sparseety_packets_captured_total") > 0


def test_two_servers_two_labels(tmp_path: Path, procs: list[Any]) -> None:
    p1, p2 = server(procs), server(procs)
    d = daemon(
        procs, tmp_path, "--port", str(p1), "--label", f"{p1}=baseline", "--label", f"{p2}=sparse"
    )
    jobs: list[Callable[[], Result]] = []
    for i in range(4):
        jobs.append(partial(httpx_stream, p1, f"base {i}"))
        jobs.append(partial(openai_stream, p2, f"sparse {i}"))
    results = concurrently(jobs)
    assert d.stop() == 0
    check_exact(d.db, [r for r in results if r.prompt.startswith("base")], "baseline")
    check_exact(d.db, [r for r in results if r.prompt.startswith("sparse")], "sparse")


def test_port_reuse_many_short_connections(tmp_path: Path, procs: list[Any]) -> None:
    port = server(procs)
    d = daemon(procs, tmp_path, "--port", str(port))
    results = [
        httpx_stream(port, f"short {i}", model="fake", max_tokens=8, keepalive=False)
        for i in range(40)
    ]
    assert d.stop() == 0
    check_exact(d.db, results)
    conns = q(d.db, "select count(*), count(distinct client_port) from connections")[0]
    assert conns[0] >= 40


def test_client_abort_is_truncated_prefix(tmp_path: Path, procs: list[Any]) -> None:
    port = server(procs)
    d = daemon(procs, tmp_path, "--port", str(port))
    full = httpx_stream(port, "abort me", model="fake-delay20", max_tokens=60)
    part = httpx_stream(port, "abort me", model="fake-delay20", max_tokens=60, abort_after=3)
    assert full.complete and part.error is None and not part.complete
    # the same prompt twice: tell them apart by order
    assert d.stop() == 0
    rows = q(d.db, "select id, state from streams order by id")
    assert [s for _, s in rows] == ["complete", "truncated"]
    text = "".join(
        t
        for (t,) in q(d.db, "select text from chunks where stream_id=? order by seq", rows[1][0])
        if t
    )
    assert text.startswith(part.text) and full.text.startswith(text) and text != full.text


def _ebpf_skip_reason() -> str | None:
    try:
        from sniffer.capture.ebpf import EbpfError, EbpfSource
    except Exception as exc:  # pragma: no cover
        return f"eBPF loader unavailable: {exc}"
    try:
        src = EbpfSource(ports=(free_port(),))
        src.open()
        src.close()
    except EbpfError as exc:
        return f"eBPF object cannot be built/loaded here: {exc}"
    return None


@pytest.fixture
def ebpf_loadable() -> None:
    """Skips (at setup: CI turns that into a failure) when eBPF cannot load here."""
    reason = _ebpf_skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.mark.ebpf
def test_ebpf_backend_end_to_end(tmp_path: Path, procs: list[Any], ebpf_loadable: None) -> None:
    port = server(procs)
    d = daemon(procs, tmp_path, "--backend", "ebpf", "--port", str(port))
    jobs: list[Callable[[], Result]] = []
    for i in range(5):
        jobs.append(partial(httpx_stream, port, f"ebpf httpx {i}"))
        jobs.append(partial(openai_stream, port, f"ebpf openai {i}"))
    results = concurrently(jobs)
    assert d.stop() == 0
    check_exact(d.db, [r for r in results if "httpx" in r.prompt])
    # The openai SDK closes right after [DONE], before the chunked terminator
    # (the server's last write then fails, so the eBPF backend never sees it):
    # every choice finished and [DONE] arrived, so the stream is complete.
    check_exact(d.db, [r for r in results if "openai" in r.prompt])
    assert "backend=ebpf" in d.log()
    assert {c for (c,) in q(d.db, "select distinct capture from streams")} == {"ebpf"}


def test_fail_open_sigkill_mid_traffic(tmp_path: Path, procs: list[Any]) -> None:
    port = server(procs)
    d = daemon(procs, tmp_path, "--port", str(port))
    jobs = [
        (partial(httpx_stream, port, f"kill {i}", model="fake-delay10", max_tokens=80))
        for i in range(20)
    ]
    killed = threading.Event()

    def killer() -> None:
        # kill once rows are being written, while the streams are still running
        for _ in range(400):
            try:
                if q(d.db, "select count(*) from chunks")[0][0] > 0:
                    break
            except sqlite3.Error:
                pass
            time.sleep(0.02)
        d.proc.send_signal(signal.SIGKILL)
        killed.set()

    t = threading.Thread(target=killer)
    t.start()
    results = concurrently(jobs, workers=20)
    t.join(30)
    assert killed.is_set()
    d.proc.wait(10)
    assert d.proc.returncode == -signal.SIGKILL
    # serving went on untouched
    for r in results:
        assert r.error is None and r.complete, r
        assert r.seconds < 20
    ref = httpx_stream(port, "kill 0", model="fake-delay10", max_tokens=80)
    assert results[0].text == ref.text
    assert q(d.db, "pragma integrity_check") == [("ok",)]
    # every committed row is readable
    n_streams = len(q(d.db, "select * from streams"))
    n_chunks = len(q(d.db, "select * from chunks"))
    assert n_streams >= 1 and n_chunks >= 1


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def test_overload_memory_flat_and_loss_counted(tmp_path: Path, procs: list[Any]) -> None:
    port = server(procs)
    d = daemon(
        procs,
        tmp_path,
        "--port",
        str(port),
        "--queue-size",
        "2",
        # a batch per ring block (no gathering) ...
        "--handover",
        "0",
        # ... and slower per batch than the ring hands blocks over (at most
        # BLOCK_TIMEOUT_MS apart): the queue of two fills
        env={"SPARSEETY_TEST_SLOW_PIPELINE_MS": str(2 * BLOCK_TIMEOUT_MS)},
    )
    start_rss = _rss_kb(d.proc.pid)
    samples = [start_rss]
    stop = threading.Event()

    def sampler() -> None:
        for _ in range(2000):
            if stop.is_set():
                return
            samples.append(_rss_kb(d.proc.pid))
            time.sleep(0.05)

    t = threading.Thread(target=sampler)
    t.start()
    try:
        for rnd in range(3):
            jobs = [
                (
                    # 5 ms apart: each stream (1.5 s) spans several ring
                    # blocks, so dropped batches cut streams the pipeline has
                    # open
                    partial(
                        httpx_stream, port, f"load {rnd}.{i}", model="fake-delay5", max_tokens=300
                    )
                )
                for i in range(24)
            ]
            results = concurrently(jobs, workers=24)
            assert all(r.error is None and r.complete for r in results)
    finally:
        stop.set()
        t.join(30)
    assert d.stop() == 0
    assert max(samples) < start_rss + 100 * 1024, (start_rss, max(samples))
    stopped = next(ln for ln in d.log().splitlines() if "event=stopped" in ln)
    dropped = int(stopped.split("queue_dropped=")[1].split()[0])
    assert dropped > 0
    errs = q(d.db, "select stage, message from errors where kind='queue-drop'")
    assert errs and all(stage == "capture" for stage, _ in errs)
    assert sum(int(m.split()[0]) for _, m in errs) == dropped
    assert q(d.db, "select count(*) from streams where gap=1")[0][0] >= 1
    assert q(d.db, "select count(*) from streams where gap=1 and state='complete'")[0][0] == 0
