#!/usr/bin/env python3
"""Record the HTTP/2 and gRPC fixtures in pcaps/h2/ (root: dumpcap on ``lo``).

* ``h2c_chat``: hypercorn serving the fixture app over h2c, httpx (HTTP/2,
  prior knowledge) sending three concurrent streamed chats on ONE connection;
* ``grpc_stream``: a grpcio KServe v2 server (tests/triton_server.py) and
  ``tritonclient.grpc``'s streaming client: three requests on one
  ``ModelStreamInfer`` call, then a unary ``ModelInfer``.

Ground truth is what the clients received, written to ``NAME.expected-h2.json``
(``streams``: method, path, model, state, text, in request order).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import httpx  # noqa: E402
from record_pcaps import Dumpcap  # noqa: E402

from tests.fixture_server import free_port  # noqa: E402

OUT = ROOT / "pcaps" / "h2"
STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"


def _chat(client: httpx.Client, port: int, prompt: str) -> dict[str, Any]:
    body = {
        "model": "fake",
        "stream": True,
        "max_tokens": 12,
        "messages": [{"role": "user", "content": prompt}],
    }
    text = ""
    with client.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                for ch in json.loads(line[5:]).get("choices") or []:
                    text += (ch.get("delta") or {}).get("content") or ""
    return {
        "method": "POST",
        "path": "/v1/chat/completions",
        "model": "fake",
        "state": "complete",
        "text": text,
        "prompt": prompt,
    }


def h2c_chat() -> tuple[int, list[dict[str, Any]]]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    srv = subprocess.Popen(
        [sys.executable, "-m", "tests.h2_server", "--port", str(port)], cwd=ROOT, env=env
    )
    try:
        for _ in range(200):
            try:
                with httpx.Client(http1=False, http2=True) as c:
                    c.get(f"http://127.0.0.1:{port}/health")
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        cap = Dumpcap(OUT / "h2c_chat.pcap", port)
        with httpx.Client(http1=False, http2=True, timeout=30) as client:
            prompts = [f"h2 fixture {i}" for i in range(3)]
            with ThreadPoolExecutor(3) as pool:
                streams = list(pool.map(lambda p: _chat(client, port, p), prompts))
        cap.stop()
    finally:
        srv.terminate()
        srv.wait(10)
    return port, streams


def grpc_stream() -> tuple[int, list[dict[str, Any]]]:
    import numpy as np
    import tritonclient.grpc as grpcclient

    from tests.triton_server import serve

    port = free_port()
    server = serve(port)
    streams: list[dict[str, Any]] = []
    try:
        cap = Dumpcap(OUT / "grpc_stream.pcap", port)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        got: queue.Queue[Any] = queue.Queue()
        client.start_stream(callback=lambda result, error: got.put((result, error)))

        def inp(prompt: str) -> Any:
            i = grpcclient.InferInput("text_input", [1], "BYTES")
            i.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
            return i

        ids = [f"req-{i}" for i in range(3)]
        for rid in ids:
            client.async_stream_infer("ensemble", [inp(rid)], request_id=rid)
        texts = dict.fromkeys(ids, "")
        finals = 0
        while finals < len(ids):
            result, error = got.get(timeout=30)
            assert error is None, error
            resp = result.get_response()
            if resp.outputs:
                texts[resp.id] += result.as_numpy("text_output")[0].decode()
            if resp.parameters["triton_final_response"].bool_param:
                finals += 1
        client.stop_stream()
        unary = client.infer("ensemble", [inp("unary")], request_id="u1")
        client.close()
        cap.stop()
    finally:
        server.stop(0)
    for rid in ids:
        streams.append(
            {
                "method": "POST",
                "path": STREAM_PATH,
                "model": "ensemble",
                "state": "complete",
                "text": texts[rid],
                "id": rid,
            }
        )
    streams.append(
        {
            "method": "POST",
            "path": "/inference.GRPCInferenceService/ModelInfer",
            "model": "ensemble",
            "state": "complete",
            "text": unary.as_numpy("text_output")[0].decode(),
            "id": "u1",
        }
    )
    return port, streams


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, fn, desc in (
        ("h2c_chat", h2c_chat, "hypercorn h2c, httpx HTTP/2: 3 concurrent chats, 1 connection"),
        ("grpc_stream", grpc_stream, "KServe v2 ModelStreamInfer (3 requests) + ModelInfer"),
    ):
        port, streams = fn()
        os.chmod(OUT / f"{name}.pcap", 0o644)
        doc = {"fixture": name, "description": desc, "server_port": port, "streams": streams}
        (OUT / f"{name}.expected-h2.json").write_text(
            json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
        )
        print(name, port, len(streams))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
