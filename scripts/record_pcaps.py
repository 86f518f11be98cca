#!/usr/bin/env python3
"""Record the pcap fixtures in pcaps/ from REAL loopback traffic.

For every fixture: start the fixture server (subprocess, free port in 18000-18999),
start ``dumpcap`` on ``lo`` filtered to that port, drive a real client (httpx and
the official ``openai`` SDK, through a transport that tees the bytes the client
received), stop dumpcap (SIGINT, by PID) and the server, then write
``pcaps/NAME.pcap`` and ``pcaps/NAME.expected.json``. Ground truth comes from what
the client received, never from the sniffer. The format is documented in
pcaps/README.md.

Usage: ``python scripts/record_pcaps.py [--only NAME ...] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.dumpcap import (  # noqa: E402
    free_udp_port,
    marker_filter,
    send_marker,
    strip_markers,
    wait_written_after,
)
from tests.fixture_server import free_port, start_server_process, wait_ready  # noqa: E402

MAX_PCAP_BYTES = 300_000
PROMPT = [{"role": "user", "content": "Tell me something about packets."}]


# ---------------------------------------------------------------------------
# What the client received
# ---------------------------------------------------------------------------


@dataclass
class Exchange:
    """One HTTP exchange as the client saw it (bytes after de-chunking)."""

    method: str
    path: str
    request: dict[str, Any]
    status: int
    content_type: str
    client_port: int
    body: bytearray = field(default_factory=bytearray)
    eof: bool = False  # the client read the body to its end
    closed: bool = False


def make_tee_transport(mod: Any) -> type:
    """A transport class for ``mod`` (``httpx``, or ``httpx2`` that the openai SDK
    uses) that records every exchange and the body bytes the client read."""

    class TeeStream(mod.SyncByteStream):
        def __init__(self, inner: Any, ex: Exchange) -> None:
            self.inner = inner
            self.ex = ex

        def __iter__(self) -> Iterator[bytes]:
            for chunk in self.inner:
                self.ex.body += chunk
                yield chunk
            self.ex.eof = True

        def close(self) -> None:
            self.ex.closed = True
            self.inner.close()

    class TeeTransport(mod.BaseTransport):
        def __init__(self, log: list[Exchange], lock: threading.Lock) -> None:
            self.inner = mod.HTTPTransport()
            self.log = log
            self.lock = lock

        def handle_request(self, request: Any) -> Any:
            content = request.read()
            resp = self.inner.handle_request(request)
            ns = resp.extensions.get("network_stream")
            addr = ns.get_extra_info("client_addr") if ns is not None else None
            ex = Exchange(
                method=request.method,
                path=request.url.path,
                request=json.loads(content) if content else {},
                status=resp.status_code,
                content_type=resp.headers.get("content-type", ""),
                client_port=int(addr[1]) if addr else 0,
            )
            with self.lock:
                self.log.append(ex)
            return mod.Response(
                resp.status_code,
                headers=resp.headers,
                stream=TeeStream(resp.stream, ex),
                extensions=resp.extensions,
            )

        def close(self) -> None:
            self.inner.close()

    return TeeTransport


TeeTransport = make_tee_transport(httpx)


# ---------------------------------------------------------------------------
# Ground truth from the bytes
# ---------------------------------------------------------------------------

_LINE = re.compile(r"\r\n|\r|\n")


def sse_events(body: bytes) -> list[str]:
    """Data of every dispatched SSE event (WHATWG rules; an event cut at EOF is dropped)."""
    text = body.decode("utf-8", "replace")
    if text.startswith("\ufeff"):
        text = text[1:]
    pieces = _LINE.split(text)
    complete = pieces[:-1]  # the last piece is an unterminated line (often "")
    events: list[str] = []
    data: list[str] | None = None
    for line in complete:
        if line == "":
            if data is not None:
                events.append("\n".join(data))
            data = None
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            data = [*(data or []), value]
    return events


def summarize_stream(body: bytes, chat: bool) -> dict[str, Any]:
    """Per-choice text, chunk counts, finish reasons, usage, [DONE] and errors."""
    choices: dict[int, dict[str, Any]] = {}
    usage: Any = None
    done = False
    error: Any = None
    events = sse_events(body)
    for data in events:
        if data == "[DONE]":
            done = True
            continue
        try:
            obj = json.loads(data)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        if "error" in obj:
            error = obj["error"]
            continue
        if obj.get("usage"):
            usage = obj["usage"]
        for ch in obj.get("choices") or []:
            idx = int(ch.get("index", 0))
            c = choices.setdefault(
                idx,
                {"text": "", "finish_reason": None, "chunks": 0, "reasoning": "", "tools": {}},
            )
            if chat:
                delta = ch.get("delta") or {}
                piece = delta.get("content") or ""
                c["reasoning"] += delta.get("reasoning_content") or ""
                for tc in delta.get("tool_calls") or []:
                    t = c["tools"].setdefault(
                        int(tc.get("index", 0)), {"id": None, "name": None, "arguments": ""}
                    )
                    t["id"] = tc.get("id") or t["id"]
                    fn = tc.get("function") or {}
                    t["name"] = fn.get("name") or t["name"]
                    t["arguments"] += fn.get("arguments") or ""
            else:
                piece = ch.get("text") or ""
            if piece:
                c["text"] += piece
                c["chunks"] += 1
            if ch.get("finish_reason"):
                c["finish_reason"] = ch["finish_reason"]
    return {
        "choices": choices,
        "usage": usage,
        "done": done,
        "error": error,
        "events": len(events),
    }


def _choice_json(c: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "text": c["text"],
        "finish_reason": c["finish_reason"],
        "chunks": c["chunks"],
    }
    if c.get("reasoning"):
        out["reasoning"] = c["reasoning"]
    if c.get("tools"):
        out["tool_calls"] = [c["tools"][k] for k in sorted(c["tools"])]
    return out


def expected_stream(ex: Exchange) -> dict[str, Any]:
    """The expected.json entry for one exchange, from what the client received."""
    req = ex.request
    chat = ex.path.endswith("/chat/completions")
    streaming = req.get("stream") is True and ex.content_type.startswith("text/event-stream")
    entry: dict[str, Any] = {
        "method": ex.method,
        "path": ex.path,
        "model": req.get("model"),
        "stream": req.get("stream") is True,
        "status": ex.status,
        "client_port": ex.client_port,
    }
    if streaming:
        s = summarize_stream(bytes(ex.body), chat)
        choices = {str(k): _choice_json(v) for k, v in sorted(s["choices"].items())}
        finished = bool(choices) and all(c["finish_reason"] for c in choices.values())
        if s["error"] is not None or ex.status >= 400:
            state = "error"
        elif finished and (ex.eof or s["done"]):
            # the openai SDK stops reading at [DONE] (before the last chunk marker)
            state = "complete"
        else:
            state = "truncated"  # the client hung up (or the server cut) before the end
        entry.update(
            state=state,
            gap=False,
            done_seen=s["done"],
            choices=choices,
            usage=s["usage"],
            sse_events=s["events"],
        )
        if s["error"] is not None:
            entry["error"] = s["error"]
        entry["check_text"] = state != "truncated"
        if state == "truncated":
            for c in choices.values():
                c["text_prefix"] = c.pop("text")
                c["chunks_min"] = c.pop("chunks")
    else:
        body = json.loads(bytes(ex.body)) if ex.body else {}
        choices = {}
        for ch in body.get("choices") or []:
            msg = ch.get("message") or {}
            text = (msg.get("content") if chat else ch.get("text")) or ""
            c = {"text": text, "finish_reason": ch.get("finish_reason"), "chunks": 1 if text else 0}
            if msg.get("reasoning_content"):
                c["reasoning"] = msg["reasoning_content"]
            choices[str(ch.get("index", 0))] = c
        entry.update(
            state="complete" if ex.status < 400 and ex.eof else "error",
            gap=False,
            done_seen=False,
            choices=choices,
            usage=body.get("usage"),
            check_text=True,
        )
        if "error" in body:
            entry["error"] = body["error"]
    return entry


# ---------------------------------------------------------------------------
# Capture
# ---------------------------------------------------------------------------


def syn_order(pcap: Path, server_port: int) -> list[int]:
    """Client ports in the order their SYN appears in the capture."""
    out = subprocess.run(
        [
            "tshark",
            "-r",
            str(pcap),
            "-Y",
            f"tcp.flags.syn==1 && tcp.flags.ack==0 && tcp.dstport=={server_port}",
            "-T",
            "fields",
            "-e",
            "tcp.srcport",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    ports: list[int] = []
    for p in out:
        if int(p) not in ports:
            ports.append(int(p))
    return ports


def http_requests(pcap: Path) -> list[str]:
    """``METHOD URI`` of every HTTP request tshark decodes in the capture."""
    out = subprocess.run(
        [
            "tshark",
            "-r",
            str(pcap),
            "-Y",
            "http.request",
            "-T",
            "fields",
            "-e",
            "http.request.method",
            "-e",
            "http.request.uri",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [" ".join(line.split("\t")) for line in out.splitlines() if line.strip()]


class Dumpcap:
    """``dumpcap -i lo -f "tcp port PORT or udp dst port MARKER" -P -w FILE -q``,
    started and stopped by PID. dumpcap writes its capture a block at a time and a
    SIGINT drops the blocks not yet written, so :meth:`stop` first sends marker
    datagrams until one is in the file (then every packet captured before is
    too) and strips them afterwards (``tests/dumpcap.py``)."""

    def __init__(self, path: Path, port: int) -> None:
        self.path = path
        self.marker_port = free_udp_port()
        self.proc = subprocess.Popen(
            [
                "dumpcap",
                "-i",
                "lo",
                "-f",
                marker_filter(port, self.marker_port),
                "-P",
                "-w",
                str(path),
                "-q",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise RuntimeError(f"dumpcap exited: {err.strip()}")
            if path.exists() and path.stat().st_size >= 24:  # pcap global header written
                break
            time.sleep(0.02)
        else:
            self._interrupt()
            raise TimeoutError("dumpcap did not start capturing within 10 s")
        time.sleep(0.3)  # margin: the header is written once the filter is attached

    def stop(self) -> None:
        """Stop once every packet of the traffic is in the file, then strip the markers."""
        time.sleep(0.3)  # let FIN/ACKs reach the capture
        since = time.time()
        try:
            if self.proc.poll() is None:
                wait_written_after(
                    self.path,
                    since,
                    lambda: send_marker(self.marker_port),
                    "dumpcap to write the capture's last packets",
                )
        finally:
            self._interrupt()
        strip_markers(self.path, self.marker_port)

    def _interrupt(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stderr:
            self.proc.stderr.close()


# ---------------------------------------------------------------------------
# Clients
# ---------------------------------------------------------------------------


@dataclass
class Ctx:
    base_url: str  # http://127.0.0.1:PORT
    log: list[Exchange] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def httpx_client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            transport=TeeTransport(self.log, self.lock),
            timeout=httpx.Timeout(20.0),
            headers={"Authorization": "Bearer sk-test"},
        )

    def openai_client(self) -> Any:
        import openai

        # openai>=3 is built on httpx2 (an httpx fork); older releases on httpx
        mod: Any
        try:
            import httpx2 as mod
        except ImportError:
            mod = httpx
        transport = make_tee_transport(mod)(self.log, self.lock)
        return openai.OpenAI(
            base_url=self.base_url + "/v1",
            api_key="sk-test",
            max_retries=0,
            timeout=20.0,
            http_client=mod.Client(transport=transport),
        )


def chat_body(model: str, stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": PROMPT, "stream": stream, **extra}


def stream_all(client: httpx.Client, path: str, body: dict[str, Any]) -> None:
    with client.stream("POST", path, json=body) as resp:
        for _ in resp.iter_bytes():
            pass


def drive_sdk_chat(model: str, **extra: Any) -> Callable[[Ctx], None]:
    def run(ctx: Ctx) -> None:
        client = ctx.openai_client()
        try:
            stream = client.chat.completions.create(
                model=model, messages=PROMPT, stream=True, **extra
            )
            for _ in stream:
                pass
        finally:
            client.close()

    return run


def drive_httpx(path: str, *bodies: dict[str, Any]) -> Callable[[Ctx], None]:
    """Every body in turn on ONE httpx client (keep-alive when the server allows)."""

    def run(ctx: Ctx) -> None:
        with ctx.httpx_client() as client:
            for body in bodies:
                if body.get("stream"):
                    stream_all(client, path, body)
                else:
                    client.post(path, json=body).read()

    return run


def drive_sdk_completions(ctx: Ctx) -> None:
    client = ctx.openai_client()
    try:
        for _ in client.completions.create(
            model="fake", prompt="Once upon a time", stream=True, max_tokens=30
        ):
            pass
    finally:
        client.close()


def drive_sdk_nonstream(ctx: Ctx) -> None:
    client = ctx.openai_client()
    try:
        client.chat.completions.create(model="fake", messages=PROMPT, max_tokens=24)
    finally:
        client.close()


def drive_keepalive(ctx: Ctx) -> None:
    with ctx.httpx_client() as client:
        stream_all(client, "/v1/chat/completions", chat_body("fake", max_tokens=48))
        client.post(
            "/v1/chat/completions", json=chat_body("fake-cjk", stream=False, max_tokens=12)
        ).read()
        stream_all(
            client,
            "/v1/chat/completions",
            {
                "model": "fake-emoji",
                "messages": [{"role": "user", "content": "Third request on this connection."}],
                "stream": True,
                "max_tokens": 40,
            },
        )


def drive_concurrent(ctx: Ctx) -> None:
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            with ctx.httpx_client() as client:
                body = {
                    "model": "fake-delay5",
                    "messages": [{"role": "user", "content": f"Concurrent request number {i}."}],
                    "stream": True,
                    "max_tokens": 24,
                }
                stream_all(client, "/v1/chat/completions", body)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    if errors:
        raise errors[0]


def drive_reasoning_tools(ctx: Ctx) -> None:
    client = ctx.openai_client()
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
            },
        }
    ]
    try:
        for model in ("fake-reasoning", "fake-reasoning-tools"):
            for _ in client.chat.completions.create(
                model=model, messages=PROMPT, stream=True, tools=tools, max_tokens=40
            ):
                pass
    finally:
        client.close()


def drive_abort(ctx: Ctx) -> None:
    with (
        ctx.httpx_client() as client,
        client.stream(
            "POST",
            "/v1/chat/completions",
            json=chat_body("fake-delay20-ignoreeos", max_tokens=300),
        ) as resp,
    ):
        content_events = 0
        for line in resp.iter_lines():
            if '"content":"' in line and '"content":""' not in line:
                content_events += 1
            if content_events >= 6:
                break
    # leaving the block closes the response before its end: the client hangs up


@dataclass
class Fixture:
    name: str
    description: str
    drive: Callable[[Ctx], None]
    server_args: tuple[str, ...] = ()
    host: str = "127.0.0.1"


FIXTURES: list[Fixture] = [
    Fixture(
        "chat_english",
        "openai SDK, chat stream, English text, role prelude, finish, [DONE]",
        drive_sdk_chat("fake", max_tokens=40),
    ),
    Fixture(
        "chat_cjk",
        "httpx, chat stream of Chinese text",
        drive_httpx("/v1/chat/completions", chat_body("fake-cjk", max_tokens=40)),
    ),
    Fixture(
        "chat_emoji",
        "httpx, chat stream of emoji (ZWJ sequences, flags, skin tones) and words",
        drive_httpx("/v1/chat/completions", chat_body("fake-emoji", max_tokens=40)),
    ),
    Fixture(
        "chat_code",
        "openai SDK, chat stream of Python code (newlines, indentation, a tab)",
        drive_sdk_chat("fake-code", max_tokens=60),
    ),
    Fixture(
        "chat_mixed_tpc3",
        "httpx, mixed flavour, 3 tokens per chunk (speculative-decoding-like chunks)",
        drive_httpx("/v1/chat/completions", chat_body("fake-mixed-tpc3", max_tokens=45)),
    ),
    Fixture(
        "completions",
        "openai SDK, /v1/completions stream (choices[].text)",
        drive_sdk_completions,
    ),
    Fixture(
        "nonstream_chat",
        "openai SDK, non-streaming chat completion (Content-Length JSON body)",
        drive_sdk_nonstream,
    ),
    Fixture(
        "keepalive_3",
        "httpx Client reused: stream, non-stream, stream on ONE connection",
        drive_keepalive,
    ),
    Fixture(
        "concurrent_4",
        "4 threads, 4 connections streaming at the same time (5 ms between chunks)",
        drive_concurrent,
    ),
    Fixture(
        "n2",
        "httpx, chat stream with n=2: choices interleaved, one choice per chunk",
        drive_httpx("/v1/chat/completions", chat_body("fake", n=2, max_tokens=20)),
    ),
    Fixture(
        "transformers_style",
        "server --style transformers: no [DONE], usage in the finish chunk, "
        "several events per write",
        drive_httpx("/v1/chat/completions", chat_body("fake", max_tokens=30)),
        ("--style", "transformers"),
    ),
    Fixture(
        "llamacpp_style",
        "server --style llamacpp: ': ping' comments, CRLF, \"\" deltas, [DONE], "
        "Connection: close after each stream (2 exchanges, 2 connections)",
        drive_httpx(
            "/v1/chat/completions",
            chat_body("fake", max_tokens=30),
            chat_body("fake-cjk", max_tokens=20),
        ),
        ("--style", "llamacpp"),
    ),
    Fixture(
        "include_usage",
        "openai SDK, stream_options.include_usage: usage chunk with choices [] then [DONE]",
        drive_sdk_chat("fake", max_tokens=20, stream_options={"include_usage": True}),
    ),
    Fixture(
        "reasoning_tools",
        "openai SDK, two requests: reasoning_content then content; reasoning then "
        "tool_calls (the SDK stops reading at [DONE], so each gets its own connection)",
        drive_reasoning_tools,
    ),
    Fixture(
        "error_midstream",
        "httpx, error object mid-stream after 5 chunks, then the stream ends (no [DONE])",
        drive_httpx("/v1/chat/completions", chat_body("fake-fail5", max_tokens=40)),
    ),
    Fixture(
        "fffd",
        "httpx, CJK and emoji with some deltas split inside a UTF-8 character (U+FFFD)",
        drive_httpx(
            "/v1/chat/completions",
            chat_body("fake-cjk-fffd", max_tokens=40),
            chat_body("fake-emoji-fffd", max_tokens=40),
        ),
    ),
    Fixture(
        "client_abort",
        "httpx, client closes the response after 6 content chunks (20 ms apart)",
        drive_abort,
    ),
    Fixture(
        "ipv6",
        "server on ::1, openai SDK chat stream over IPv6",
        drive_sdk_chat("fake", max_tokens=30),
        host="::1",
    ),
]


def record(fx: Fixture, out_dir: Path, attempts: int = 3) -> dict[str, Any]:
    last: Exception | None = None
    for _ in range(attempts):
        try:
            return _record_once(fx, out_dir)
        except (AssertionError, RuntimeError, TimeoutError, httpx.HTTPError) as exc:
            last = exc
            print(f"  {fx.name}: retrying after {exc!r}", file=sys.stderr)
    raise RuntimeError(f"{fx.name}: failed {attempts} times") from last


def _record_once(fx: Fixture, out_dir: Path) -> dict[str, Any]:
    port = free_port(fx.host)
    server = start_server_process(port, *fx.server_args, host=fx.host)
    host_url = f"[{fx.host}]" if ":" in fx.host else fx.host
    ctx = Ctx(base_url=f"http://{host_url}:{port}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_pcap = Path(tmp) / f"{fx.name}.pcap"
        os.chmod(tmp, 0o777)  # dumpcap may drop privileges before writing
        try:
            wait_ready(port, 10, fx.host)  # before capturing: the probe stays out of the pcap
            cap = Dumpcap(tmp_pcap, port)
            try:
                fx.drive(ctx)
            finally:
                cap.stop()
        finally:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(5)
        size = tmp_pcap.stat().st_size
        assert size < MAX_PCAP_BYTES, f"{fx.name}: pcap is {size} bytes"
        order = syn_order(tmp_pcap, port)
        requests = http_requests(tmp_pcap)
        for ex in ctx.log:
            assert ex.client_port in order, f"{fx.name}: no SYN for client port {ex.client_port}"
        # connection order (SYN order), then exchange order on the connection
        by_port: dict[int, list[Exchange]] = {}
        for ex in ctx.log:
            by_port.setdefault(ex.client_port, []).append(ex)
        ordered = [(i, ex) for p in order for i, ex in enumerate(by_port.get(p, []))]
        assert len(ordered) == len(ctx.log)
        assert len(requests) == len(ctx.log), (
            f"{fx.name}: tshark sees {len(requests)} requests, client made {len(ctx.log)}"
        )
        streams = []
        for i, ex in ordered:
            entry = expected_stream(ex)
            entry["exchange"] = i
            streams.append(entry)
        expected = {
            "fixture": fx.name,
            "description": fx.description,
            "server_host": fx.host,
            "server_port": port,
            "streams": streams,
            "errors_min": 0,
            "extra_streams_max": 0,
        }
        shutil.copyfile(tmp_pcap, out_dir / f"{fx.name}.pcap")
    write_expected(out_dir / f"{fx.name}.expected.json", expected)
    return expected


def write_expected(path: Path, expected: dict[str, Any]) -> None:
    path.write_text(json.dumps(expected, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="fixture names to record (default: all)")
    ap.add_argument("--out", type=Path, default=REPO / "pcaps")
    ns = ap.parse_args(argv)
    ns.out.mkdir(parents=True, exist_ok=True)
    wanted = set(ns.only or [f.name for f in FIXTURES])
    unknown = wanted - {f.name for f in FIXTURES}
    if unknown:
        print(f"unknown fixtures: {sorted(unknown)}", file=sys.stderr)
        return 2
    for fx in FIXTURES:
        if fx.name not in wanted:
            continue
        exp = record(fx, ns.out)
        states = ",".join(s["state"] for s in exp["streams"])
        size = (ns.out / f"{fx.name}.pcap").stat().st_size
        print(f"{fx.name:20s} {size:7d} B  streams: {states}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
