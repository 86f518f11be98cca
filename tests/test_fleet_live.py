"""Several ``sparseety run`` daemons capturing live on ``lo`` into ONE fresh
PostgreSQL database (root): each daemon has its own ``--node`` and watches its
own server's port; all of them start together against the empty database.

Every stream must be exact (the text the client received, complete, no gap),
every id distinct across the daemons, and the readers' ``--node`` must give
each daemon's streams and nothing else.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from sniffer.capture.afpacket import have_capture_privilege
from sniffer.store import queries
from sniffer.store.writer import open_store
from tests.fixture_server import free_port, start_server_process, wait_ready
from tests.test_live_e2e import Result, concurrently, httpx_stream, openai_stream

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(
        not have_capture_privilege(),
        reason="live capture needs root or CAP_NET_RAW (packet sockets)",
    ),
]

ROOT = Path(__file__).resolve().parent.parent
NODES = ("gpu-01", "gpu-02", "gpu-03")


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes this test started; killed (by PID) if still running at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_daemons_on_three_nodes_into_one_postgresql(
    fresh_pg_url: str, tmp_path: Path, procs: list[Any]
) -> None:
    ports = []
    for _ in NODES:
        port = free_port()
        procs.append(start_server_process(port))
        wait_ready(port, 20)
        ports.append(port)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("NOTIFY_SOCKET", None)
    daemons: list[tuple[subprocess.Popen[bytes], Path]] = []
    for node, port in zip(NODES, ports, strict=True):  # started together, fresh database
        log = tmp_path / f"{node}.log"
        with open(log, "wb") as fh:
            cmd = [sys.executable, "-m", "sniffer.cli", "run", "--db", fresh_pg_url]
            cmd += ["--node", node, "--port", str(port), "--flush-interval", "0.2"]
            cmd += ["--no-metrics"]
            p = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=fh)
        procs.append(p)
        daemons.append((p, log))
    for p, log in daemons:
        for _ in range(600):
            if "event=capture-active" in log.read_text(errors="replace"):
                break
            assert p.poll() is None, log.read_text(errors="replace")
            time.sleep(0.05)
        else:
            raise AssertionError(f"daemon did not become active:\n{log.read_text()}")

    jobs: list[Callable[[], Result]] = []
    for k, port in enumerate(ports):
        for i in range(5):
            jobs.append(partial(httpx_stream, port, f"node {k} httpx {i}", max_tokens=20 + i))
        for i in range(3):
            jobs.append(partial(openai_stream, port, f"node {k} openai {i}", max_tokens=15 + i))
    results = concurrently(jobs, workers=12)
    for p, log in daemons:
        p.send_signal(15)
        assert p.wait(60) == 0, log.read_text(errors="replace")
        assert "UniqueViolation" not in log.read_text(errors="replace")

    store = open_store(fresh_pg_url)
    every = queries.list_streams(store)
    assert len(every) == len(results)
    assert len({s["id"] for s in every}) == len(every)
    conn_node = dict(store.query("SELECT id, node FROM connections"))
    orphans = store.query(
        "SELECT id FROM chunks WHERE stream_id NOT IN (SELECT id FROM streams) LIMIT 1"
    )
    assert orphans == []
    by_prompt = {json.loads(s["request_json"])["messages"][0]["content"]: s for s in every}
    for r in results:
        assert r.error is None and r.complete and r.text, r
        s = by_prompt[r.prompt]
        node = NODES[int(r.prompt.split()[1])]
        assert s["node"] == node and conn_node[s["connection_id"]] == node
        assert s["state"] == "complete" and not s["gap"]
        assert queries.stream_text(store, s["id"]) == {0: r.text}
    store.close()

    for k, node in enumerate(NODES):
        cmd = [sys.executable, "-m", "sniffer.cli", "streams", "--db", fresh_pg_url]
        out = subprocess.run(
            [*cmd, "--node", node, "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        rows = [json.loads(ln) for ln in out.stdout.splitlines()]
        prompts = sorted(json.loads(r["request_json"])["messages"][0]["content"] for r in rows)
        assert prompts == sorted(r.prompt for r in results if r.prompt.split()[1] == str(k))
