"""HTTP/2 live on ``lo`` (root): hypercorn serving the fixture app over h2c,
httpx as an HTTP/2 client (prior knowledge, and ``Upgrade: h2c`` by hand), the
daemon capturing; the database must hold what the clients received."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h11
import httpx
import pytest

from sniffer.capture.afpacket import have_capture_privilege
from tests.fixture_server import free_port
from tests.test_live_e2e import (
    ROOT,
    Result,
    body,
    check_exact,
    daemon,
    ebpf_loadable,  # noqa: F401  (fixture)
    q,
    stored,
)

pytestmark = [
    pytest.mark.root,
    pytest.mark.slow,
    pytest.mark.skipif(not have_capture_privilege(), reason="live capture needs root"),
]


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes this test started; killed (by PID) if still running at the end."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def h2_server(procs: list[subprocess.Popen[bytes]]) -> int:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen(
        [sys.executable, "-m", "tests.h2_server", "--port", str(port)], cwd=ROOT, env=env
    )
    procs.append(p)
    for _ in range(400):
        try:
            with httpx.Client(http1=False, http2=True, timeout=2) as c:
                if c.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    return port
        except httpx.HTTPError:
            pass
        if p.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError("hypercorn did not come up")


async def h2_stream(
    client: httpx.AsyncClient, port: int, prompt: str, max_tokens: int = 30
) -> Result:
    r = Result(prompt)
    try:
        async with client.stream(
            "POST",
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json=body(prompt, "fake-delay2", max_tokens),
            headers={"authorization": "Bearer sk-test"},
        ) as resp:
            assert resp.http_version == "HTTP/2"
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    r.complete = True
                    continue
                for ch in json.loads(data).get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content") or ""
                    if piece:
                        r.text += piece
                        r.chunks += 1
    except Exception as exc:
        r.error = f"{type(exc).__name__}: {exc}"
    return r


def h2_streams(port: int, jobs: list[tuple[str, int]]) -> list[Result]:
    """Streams ``(prompt, max_tokens)`` at once on ONE HTTP/2 connection: one
    ``httpx.AsyncClient`` on one event loop.

    Not a sync ``httpx.Client`` shared by threads: httpcore's sync HTTP/2
    connection is not thread-safe. A thread takes its stream id
    (``get_next_available_stream_id``, which only moves once HEADERS are sent)
    and sends HEADERS later, unlocked, so under slow scheduling two threads took
    the same id (or sent HEADERS out of id order, or interleaved HPACK state) and
    the server rightly reset the stream or closed the connection with
    PROTOCOL_ERROR. On one event loop the id is taken and HEADERS queued with no
    ``await`` between them.
    """

    async def run() -> list[Result]:
        async with httpx.AsyncClient(http1=False, http2=True, timeout=30) as client:
            streams = (h2_stream(client, port, p, n) for p, n in jobs)
            return list(await asyncio.wait_for(asyncio.gather(*streams), 120))

    return asyncio.run(run())


def test_h2c_prior_knowledge_concurrent_streams_on_one_connection(
    tmp_path: Path, procs: list[Any]
) -> None:
    port = h2_server(procs)
    d = daemon(procs, tmp_path, "--port", str(port))
    results = h2_streams(port, [(f"h2 prompt {i}", 20 + i) for i in range(6)])
    assert d.stop() == 0
    check_exact(d.db, results)
    rows = q(d.db, "select distinct connection_id from streams where method='POST'")
    assert len(rows) == 1  # six streams, one HTTP/2 connection
    assert "sk-test" not in "".join(str(r) for r in q(d.db, "select request_headers from streams"))


def test_h2c_upgrade(tmp_path: Path, procs: list[Any]) -> None:
    """``Upgrade: h2c`` on a GET (the request becomes stream 1), then a streamed
    chat on stream 3 of the same connection, driven by a real h2 client."""
    port = h2_server(procs)
    d = daemon(procs, tmp_path, "--port", str(port))
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    settings = conn.initiate_upgrade_connection()
    text = ""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(
            b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
            b"Upgrade: h2c\r\nHTTP2-Settings: " + settings + b"\r\n\r\n"
        )
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += s.recv(65536)
        head, rest = buf.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 101"), head
        s.sendall(conn.data_to_send())
        events = list(conn.receive_data(rest))
        payload = json.dumps(body("upgrade prompt", "fake-delay2", 20)).encode()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(
            sid,
            [(":method", "POST"), (":path", "/v1/chat/completions"), (":scheme", "http"),
             (":authority", "x"), ("content-type", "application/json")],
        )  # fmt: skip
        conn.send_data(sid, payload, end_stream=True)
        s.sendall(conn.data_to_send())
        done = False
        raw = b""
        while not done:
            data = s.recv(65536)
            if not data:
                break
            for ev in [*events, *conn.receive_data(data)]:
                if isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    if ev.stream_id == sid:
                        raw += ev.data
                if isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                    done = True
            events = []
            s.sendall(conn.data_to_send())
        conn.close_connection()
        s.sendall(conn.data_to_send())
    for line in raw.decode().splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            for ch in json.loads(line[5:]).get("choices") or []:
                text += (ch.get("delta") or {}).get("content") or ""
    assert d.stop() == 0
    assert text
    rows = q(d.db, "select method, path, state, status from streams order by id")
    assert ("GET", "/health", "complete", 200) in rows, rows
    got = stored(d.db)["upgrade prompt"]
    assert got["text"] == text and got["state"] == "complete"


def sse_text(raw: bytes) -> str:
    """The content deltas of an SSE body, as the client read it."""
    text = ""
    for line in raw.decode().splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            for ch in json.loads(line[5:]).get("choices") or []:
                text += (ch.get("delta") or {}).get("content") or ""
    return text


def h1_chat(s: socket.socket, h1: h11.Connection, port: int, prompt: str) -> str:
    """One HTTP/1.1 streamed chat on a kept-alive socket (h11 client); its text."""
    payload = json.dumps(body(prompt, "fake-delay2", 12)).encode()
    head = [("Host", f"127.0.0.1:{port}"), ("Content-Type", "application/json"),
            ("Content-Length", str(len(payload)))]  # fmt: skip
    s.sendall(
        h1.send(h11.Request(method="POST", target="/v1/chat/completions", headers=head))
        + h1.send(h11.Data(data=payload))
        + h1.send(h11.EndOfMessage())
    )
    raw = b""
    while True:
        ev = h1.next_event()
        if ev is h11.NEED_DATA:
            h1.receive_data(s.recv(65536))
        elif isinstance(ev, h11.Data):
            raw += ev.data
        elif isinstance(ev, h11.EndOfMessage):
            break
    h1.start_next_cycle()
    return sse_text(raw)


@pytest.mark.parametrize("preface_first", [False, True], ids=["preface-after-101", "preface-first"])
def test_h2c_upgrade_as_the_third_request_of_a_keepalive_connection(
    tmp_path: Path, procs: list[Any], preface_first: bool
) -> None:
    """Two HTTP/1.1 chats on one connection (h11), then ``GET /health`` with
    ``Upgrade: h2c`` (hypercorn switches; stream 1 answers it), the client
    preface sent before or after the 101 (hypercorn passes bytes that came
    with the request on to HTTP/2), then a chat on stream 3: four rows of one
    connection, in order, each what the client read."""
    port = h2_server(procs)
    d = daemon(procs, tmp_path, "--port", str(port))
    h1 = h11.Connection(h11.CLIENT)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    settings = conn.initiate_upgrade_connection()
    health = b""
    raw = b""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        texts = [h1_chat(s, h1, port, f"keep-alive {i}") for i in range(2)]
        head = [("Host", f"127.0.0.1:{port}"), ("Connection", "Upgrade, HTTP2-Settings"),
                ("Upgrade", "h2c"), ("HTTP2-Settings", settings.decode())]  # fmt: skip
        s.sendall(
            h1.send(h11.Request(method="GET", target="/health", headers=head))
            + h1.send(h11.EndOfMessage())
        )
        if preface_first:
            s.sendall(conn.data_to_send())
        while h1.their_state is not h11.SWITCHED_PROTOCOL:
            ev = h1.next_event()
            if ev is h11.NEED_DATA:
                h1.receive_data(s.recv(65536))
            else:
                assert isinstance(ev, h11.InformationalResponse) and ev.status_code == 101, ev
        rest, _ = h1.trailing_data
        if not preface_first:
            s.sendall(conn.data_to_send())
        sid = 0
        data = rest
        done = False
        while not done:
            for ev in conn.receive_data(data):
                if isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    if ev.stream_id == 1:
                        health += ev.data
                    elif ev.stream_id == sid:
                        raw += ev.data
                elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == 1:
                    payload = json.dumps(body("over h2", "fake-delay2", 12)).encode()
                    sid = conn.get_next_available_stream_id()
                    conn.send_headers(
                        sid,
                        [(":method", "POST"), (":path", "/v1/chat/completions"),
                         (":scheme", "http"), (":authority", f"127.0.0.1:{port}"),
                         ("content-type", "application/json")],
                    )  # fmt: skip
                    conn.send_data(sid, payload, end_stream=True)
                elif isinstance(ev, h2.events.StreamEnded) and ev.stream_id == sid:
                    done = True
            s.sendall(conn.data_to_send())
            if not done:
                data = s.recv(65536)
                assert data, "server closed"
        conn.close_connection()
        s.sendall(conn.data_to_send())
    assert d.stop() == 0
    assert sid == 3 and json.loads(health) == {"status": "ok"}
    texts.append(sse_text(raw))
    assert all(texts), texts
    rows = q(
        d.db,
        "select connection_id, exchange, method, path, status, state from streams "
        "order by connection_id, exchange",
    )
    assert len({r[0] for r in rows}) == 1, rows
    assert [r[1:] for r in rows] == [
        (0, "POST", "/v1/chat/completions", 200, "complete"),
        (1, "POST", "/v1/chat/completions", 200, "complete"),
        (2, "GET", "/health", 200, "complete"),
        (3, "POST", "/v1/chat/completions", 200, "complete"),
    ]
    got = stored(d.db)
    assert [got[p]["text"] for p in ("keep-alive 0", "keep-alive 1", "over h2")] == texts
    assert not q(d.db, "select kind, message from errors"), q(d.db, "select * from errors")


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_h2c_upgrade_refused_then_accepted_on_one_connection(
    tmp_path: Path, procs: list[Any]
) -> None:
    """curl ``--http2`` offers ``Upgrade: h2c`` on every HTTP/1.1 request: on one
    connection hypercorn refuses it for a chat POST (it has a body: answered in
    HTTP/1.1), accepts it for ``GET /health`` (the 2nd request, now stream 1),
    and the next chat goes on stream 3."""
    port = h2_server(procs)
    d = daemon(procs, tmp_path, "--port", str(port))
    url = f"http://127.0.0.1:{port}"
    outs = [tmp_path / f"body{i}" for i in range(3)]
    chat = ["-H", "content-type: application/json", "--http2"]
    cmd = [
        "curl", "-sS", "--max-time", "30",
        *chat, "-d", json.dumps(body("curl one", "fake-delay2", 10)), "-o", str(outs[0]),
        f"{url}/v1/chat/completions",
        "--next", "--http2", "-o", str(outs[1]), f"{url}/health",
        "--next", *chat, "-d", json.dumps(body("curl two", "fake-delay2", 10)),
        "-o", str(outs[2]), f"{url}/v1/chat/completions",
        "-w", "%{num_connects} %{http_version}\n",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, timeout=60, check=True)
    assert done.stdout.decode().split() == ["0", "2"]  # connection re-used, HTTP/2 at the end
    assert d.stop() == 0
    texts = [sse_text(outs[0].read_bytes()), sse_text(outs[2].read_bytes())]
    assert all(texts) and json.loads(outs[1].read_bytes()) == {"status": "ok"}
    rows = q(
        d.db,
        "select connection_id, exchange, method, path, status, state from streams "
        "order by connection_id, exchange",
    )
    assert len({r[0] for r in rows}) == 1, rows
    errors = q(d.db, "select * from errors")
    reasons = q(d.db, "select exchange, reason from streams")
    assert [r[1:] for r in rows] == [
        (0, "POST", "/v1/chat/completions", 200, "complete"),
        (1, "GET", "/health", 200, "complete"),
        (2, "POST", "/v1/chat/completions", 200, "complete"),
    ], (errors, reasons)
    got = stored(d.db)
    assert [got["curl one"]["text"], got["curl two"]["text"]] == texts
    assert not q(d.db, "select kind, message from errors"), q(d.db, "select * from errors")


@pytest.mark.ebpf
@pytest.mark.usefixtures("ebpf_loadable")
def test_h2c_over_the_ebpf_backend(tmp_path: Path, procs: list[Any]) -> None:
    """The eBPF backend's flows go through the same parser: the bytes say HTTP/2."""
    port = h2_server(procs)
    d = daemon(procs, tmp_path, "--backend", "ebpf", "--port", str(port))
    results = h2_streams(port, [(f"ebpf h2 {i}", 15 + i) for i in range(4)])
    assert d.stop() == 0
    check_exact(d.db, results)
    assert {c for (c,) in q(d.db, "select distinct capture from streams")} == {"ebpf"}
