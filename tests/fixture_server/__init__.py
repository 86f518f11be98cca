"""Deterministic OpenAI-compatible streaming server for tests, benchmarks and pcaps.

Run it: ``python -m tests.fixture_server --host 127.0.0.1 --port 8000 [options]``.
From Python: :func:`start_server_process` (a subprocess), :func:`run_server_in_thread`
(uvicorn in a thread of this process) and :func:`wait_ready`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from .app import FLAVOURS, STYLES, Options, make_app

__all__ = [
    "FLAVOURS",
    "STYLES",
    "Options",
    "ServerThread",
    "free_port",
    "make_app",
    "run_server_in_thread",
    "start_server_process",
    "wait_ready",
]

REPO_ROOT = Path(__file__).resolve().parents[2]


def free_port(host: str = "127.0.0.1", lo: int = 18000, hi: int = 18999) -> int:
    """A TCP port in [lo, hi] that nothing listens on right now (probed by binding)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    start = lo + (os.getpid() * 7919 + int(time.monotonic() * 1000)) % (hi - lo + 1)
    for i in range(hi - lo + 1):
        port = lo + (start - lo + i) % (hi - lo + 1)
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {lo}..{hi}")


def wait_ready(port: int, timeout: float = 10.0, host: str = "127.0.0.1") -> None:
    """Poll ``GET /health`` until it answers 200; TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    request = f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1.0) as s:
                s.sendall(request)
                reply = s.recv(64)
            if reply.startswith(b"HTTP/1.1 200"):
                return
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"fixture server on {host}:{port} not ready after {timeout}s ({last})")


def start_server_process(
    port: int, *options: str, host: str = "127.0.0.1", quiet: bool = True
) -> subprocess.Popen[bytes]:
    """Start ``python -m tests.fixture_server`` on ``host:port`` with CLI ``options``
    (e.g. ``"--style", "llamacpp"``). Call :func:`wait_ready` next; stop it with
    ``proc.terminate(); proc.wait()``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-m", "tests.fixture_server", "--host", host, "--port", str(port)]
    return subprocess.Popen(
        [*cmd, *options],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL if quiet else None,
        stderr=subprocess.DEVNULL if quiet else None,
    )


@dataclass
class ServerThread:
    server: uvicorn.Server
    thread: threading.Thread
    host: str
    port: int

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self, timeout: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)


def run_server_in_thread(
    port: int, options: Options | None = None, host: str = "127.0.0.1", timeout: float = 10.0
) -> ServerThread:
    """Serve the app with uvicorn in a daemon thread; returns once it answers."""
    config = uvicorn.Config(
        make_app(options), host=host, port=port, log_level="warning", access_log=False
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"fixture-server-{port}", daemon=True)
    thread.start()
    handle = ServerThread(server, thread, host, port)
    try:
        wait_ready(port, timeout, host)
    except TimeoutError:
        handle.stop()
        raise
    return handle
