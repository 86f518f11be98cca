#!/usr/bin/env python3
"""Craft captures that begin in the middle of a streamed response, with their
expected results: what a sidecar started late (or restarted) must recover.

For every dialect (OpenAI chat and completions, Responses, Anthropic Messages,
TGI, Ollama) one capture ``pcaps/faults/midway_NAME.pcap`` holds several
keep-alive connections on loopback, each carrying the same two exchanges (a
stream, then the same stream again), each cut at a different offset inside the
first response body:

* ``size``: inside a chunk-size line (its second byte);
* ``data``: in the middle of a chunk's data;
* ``utf8``: inside a UTF-8 sequence (the second byte of the first multi-byte
  character of a chunk), where the dialect's text has one;
* ``between``: exactly between two chunks (at a chunk-size line's first byte);
* ``crlf``: between the CR and the LF that end a chunk.

The capture keeps only the packets from the cut on (the one that holds the
cut is trimmed to start there: a capture that began at that byte), so the
handshake, the request and the response head were never seen.

Ground truth, computed here from the bytes put on the wire (not from the
sniffer): the server writes one SSE event or NDJSON line per HTTP chunk, so
what can be recovered is exactly the events whose chunk-size line starts at or
after the cut (a chunk whose start was not captured cannot be framed with
certainty: its bytes are dropped). The text, reasoning and chunk counts are
read from those events by the per-API readers below, themselves checked
against the full exchange's ground truth (``craft_dialect_pcaps``). The
finish reason, the end marker and usage come from the last events, which every
cut here leaves in place. The recovered stream is a row in state ``midway``,
``gap`` true, request fields (method, path, status) null, the model the
recovered events name (null when none does: Anthropic names it in
message_start only, TGI never), and no TTFT. The second exchange on the
connection is parsed normally and is ``complete``.

Usage: ``python scripts/craft_midway.py [--out DIR]``; then run
``scripts/measure_ttft.py`` (it fills ``ttft_ms`` of the complete streams).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scapy.layers.inet import TCP
from scapy.packet import Packet, Raw
from scapy.utils import wrpcap

sys.path.insert(0, str(Path(__file__).resolve().parent))

import craft_dialect_pcaps as cdp

REPO = Path(__file__).resolve().parents[1]
FAULTS_DIR = REPO / "pcaps" / "faults"

# ---------------------------------------------------------------------------
# OpenAI chat and completions exchanges (the others come from craft_dialect_pcaps)
# ---------------------------------------------------------------------------

CHAT_PIECES = [
    "Hello",
    " 世界",
    "，这是",
    " a test 😀",
    " été",
    " 🇯🇵 flags",
    " and",
    " more",
    " text",
    " here",
    ".",
]


def openai_chat() -> cdp.Exchange:
    ex = cdp.Exchange(
        "/v1/chat/completions",
        {"model": "llama-70b", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        "text/event-stream; charset=utf-8",
        [],
        True,
    )
    events: list[tuple[str | None, str]] = []

    def chunk(delta: dict[str, Any], finish: str | None = None) -> None:
        obj = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1767225600,
            "model": "llama-70b",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        events.append((None, cdp.js(obj)))

    chunk({"role": "assistant", "content": ""})
    for p in CHAT_PIECES:
        chunk({"content": p})
        ex.choice(0).add_text(p)
    chunk({}, "stop")
    events.append((None, "[DONE]"))
    ex.writes = cdp.sse(events)
    ex.sse_events = len(events)
    ex.choice(0).finish_reason = "stop"
    ex.done_seen = True
    return ex


def openai_completions() -> cdp.Exchange:
    ex = cdp.Exchange(
        "/v1/completions",
        {"model": "llama-70b", "prompt": "Once", "stream": True},
        "text/event-stream; charset=utf-8",
        [],
        True,
    )
    events: list[tuple[str | None, str]] = []
    for i, p in enumerate(CHAT_PIECES):
        obj = {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1767225600,
            "model": "llama-70b",
            "choices": [
                {
                    "index": 0,
                    "text": p,
                    "logprobs": None,
                    "finish_reason": "length" if i == len(CHAT_PIECES) - 1 else None,
                }
            ],
        }
        events.append((None, cdp.js(obj)))
        ex.choice(0).add_text(p)
    events.append((None, "[DONE]"))
    ex.writes = cdp.sse(events)
    ex.sse_events = len(events)
    ex.choice(0).finish_reason = "length"
    ex.done_seen = True
    return ex


# ---------------------------------------------------------------------------
# Per-API readers: (choice, text, reasoning) pieces of one item
# ---------------------------------------------------------------------------

Piece = tuple[int, str, str]


def _sse_item(write: bytes) -> tuple[str, str]:
    event, data = "message", ""
    for line in write.decode().split("\n"):
        if line.startswith("event:"):
            event = line[6:].lstrip(" ")
        elif line.startswith("data:"):
            data = line[5:].removeprefix(" ")
    return event, data


def read_chat(write: bytes) -> list[Piece]:
    _, data = _sse_item(write)
    if data == "[DONE]":
        return []
    obj = json.loads(data)
    return [(c["index"], c["delta"].get("content") or "", "") for c in obj["choices"]]


def read_completions(write: bytes) -> list[Piece]:
    _, data = _sse_item(write)
    if data == "[DONE]":
        return []
    return [(c["index"], c["text"], "") for c in json.loads(data)["choices"]]


def read_responses(write: bytes) -> list[Piece]:
    event, data = _sse_item(write)
    obj = json.loads(data)
    if event == "response.output_text.delta":
        return [(obj["output_index"], obj["delta"], "")]
    if event == "response.reasoning_summary_text.delta":
        return [(obj["output_index"], "", obj["delta"])]
    return []


def read_anthropic(write: bytes) -> list[Piece]:
    event, data = _sse_item(write)
    obj = json.loads(data)
    if event != "content_block_delta":
        return []
    delta = obj["delta"]
    if delta["type"] == "text_delta":
        return [(obj["index"], delta["text"], "")]
    if delta["type"] == "thinking_delta":
        return [(obj["index"], "", delta["thinking"])]
    return []


def read_tgi(write: bytes) -> list[Piece]:
    _, data = _sse_item(write)
    tok = json.loads(data)["token"]
    return [] if tok["special"] else [(0, tok["text"], "")]


def read_ollama(write: bytes) -> list[Piece]:
    obj = json.loads(write)
    if "message" in obj:
        return [(0, obj["message"].get("content", ""), obj["message"].get("thinking", ""))]
    return [(0, obj.get("response", ""), obj.get("thinking", ""))]


def tail_choices(
    ex: cdp.Exchange, reader: Callable[[bytes], list[Piece]], first: int
) -> dict[str, dict[str, Any]]:
    """The choices as recorded from write ``first`` on (text, chunks, reasoning,
    finish reason of the full exchange)."""
    got: dict[int, cdp.Choice] = {}
    for w in ex.writes[first:]:
        for ci, text, reasoning in reader(w):
            ch = got.setdefault(ci, cdp.Choice())
            ch.add_text(text)
            ch.reasoning += reasoning
    known = set(ex.choices)
    if reader is read_anthropic:
        # message_delta's stop_reason names no block: it ends the blocks the
        # tail's events name (content_block_start/delta/stop "index"), no others
        known = {
            json.loads(_sse_item(w)[1]).get("index")
            for w in ex.writes[first:]
            if _sse_item(w)[0].startswith("content_block_")
        }
    out = {}
    for ci in sorted(set(got) | (known if first else set(ex.choices))):
        ch = got.get(ci, cdp.Choice())
        ch.finish_reason = ex.choices[ci].finish_reason if ci in ex.choices else None
        out[str(ci)] = ch.json()
    return out


def tail_model(ex: cdp.Exchange, first: int) -> str | None:
    """The model the first recovered item naming one names (top level: OpenAI
    chunks, Ollama; ``message``: Anthropic message_start; ``response``: the
    Responses lifecycle events, ``response.completed`` among them), or None
    when no item from write ``first`` on names one (TGI never does)."""
    for w in ex.writes[first:]:
        try:
            obj = json.loads(w) if ex.path.startswith("/api/") else json.loads(_sse_item(w)[1])
        except ValueError:
            continue  # [DONE]
        if not isinstance(obj, dict):
            continue
        for holder in (obj, obj.get("message"), obj.get("response")):
            if isinstance(holder, dict) and isinstance(holder.get("model"), str):
                return str(holder["model"])
    return None


def check_reader(ex: cdp.Exchange, reader: Callable[[bytes], list[Piece]]) -> None:
    """The reader gives back the full exchange's ground truth from all its writes."""
    full = tail_choices(ex, reader, 0)
    want = {str(k): c.json() for k, c in sorted(ex.choices.items())}
    assert full == want, (ex.path, full, want)


# ---------------------------------------------------------------------------
# Cuts and captures
# ---------------------------------------------------------------------------


def chunk_offsets(ex: cdp.Exchange) -> tuple[int, list[int]]:
    """Length of the response head, and the offset (from the head's start) of
    each body write's chunk-size line."""
    writes = cdp.response_writes(ex)
    head = len(writes[0])
    starts, pos = [], head
    for w in writes[1:-1]:
        starts.append(pos)
        pos += len(w)
    return head, starts


def cuts(ex: cdp.Exchange) -> list[tuple[str, int, int]]:
    """(kind, offset into the server's bytes, index of the first recoverable write).
    Every cut leaves the last four writes (finish, usage, end marker) in place."""
    _, starts = chunk_offsets(ex)
    n = len(ex.writes)
    k = max(1, (n - 4) // 2)  # a chunk in the middle
    size_line = f"{len(ex.writes[k]):x}\r\n".encode()
    out = [
        ("size", starts[k] + 1, k + 1),
        ("data", starts[k] + len(size_line) + len(ex.writes[k]) // 2, k + 1),
        ("between", starts[k], k),
        ("crlf", starts[k] - 1, k),
    ]
    for i in range(1, n - 4):
        body = ex.writes[i]
        multi = next((j for j, b in enumerate(body) if b >= 0xC0), None)
        if multi is not None:
            at = starts[i] + len(f"{len(body):x}\r\n") + multi + 1
            out.append(("utf8", at, i + 1))
            break
    return out


def conversation(ex: cdp.Exchange, cport: int, port: int, t0: float, seed: int) -> cdp.Conversation:
    conv = cdp.Conversation(cport, port, t0, 1_000_000 + cport, 2_000_000_000 + cport)
    conv.handshake()
    for _ in range(2):
        conv.request(cdp.request_bytes(ex, port))
        conv.response([(0.01, w) for w in cdp.response_writes(ex)])
    conv.close()
    return conv


def cut_capture(conv: cdp.Conversation, port: int, offset: int) -> list[Packet]:
    """The packets a capture that began at server byte ``offset`` sees."""
    isn_s = None
    kept: list[Packet] = []
    started = False
    for p in conv.pkts:
        t = p[TCP]
        from_server = t.sport == port
        if from_server and "S" in str(t.flags):
            isn_s = t.seq + 1
        if not started:
            if not from_server or isn_s is None or Raw not in p:
                continue
            rel = (t.seq - isn_s) % cdp.MOD
            data = bytes(p[Raw].load)
            if rel + len(data) <= offset:
                continue
            skip = offset - rel
            assert skip >= 0
            q = p.copy()
            q[TCP].seq = (t.seq + skip) % cdp.MOD
            q[Raw].load = data[skip:]
            kept.append(q)
            started = True
            continue
        kept.append(p)
    return kept


DIALECTS: list[
    tuple[str, str, int, Callable[[], cdp.Exchange], Callable[[bytes], list[Piece]], bool]
] = [
    # name, description, server port, exchange, reader, model in every item
    (
        "openai_chat",
        "OpenAI chat completions (CJK, emoji, flags)",
        8000,
        openai_chat,
        read_chat,
        True,
    ),
    ("openai_completions", "OpenAI completions", 8000, openai_completions, read_completions, True),
    (
        "responses",
        "OpenAI Responses (reasoning summary, then text)",
        8000,
        cdp.responses_text,
        read_responses,
        False,
    ),
    (
        "anthropic",
        "Anthropic Messages (thinking block, then text)",
        8001,
        cdp.anthropic_thinking,
        read_anthropic,
        False,
    ),
    (
        "tgi",
        "TGI /generate_stream ('data:' without a space)",
        8080,
        lambda: cdp.tgi_stream(True, len(cdp.TGI_TOKENS)),
        read_tgi,
        False,
    ),
    (
        "ollama_generate",
        "Ollama /api/generate NDJSON",
        11434,
        lambda: cdp.ollama_generate(True),
        read_ollama,
        True,
    ),
    (
        "ollama_chat",
        "Ollama /api/chat NDJSON (thinking, then content)",
        11434,
        lambda: cdp.ollama_chat(True),
        read_ollama,
        True,
    ),
]


def recovered_usage(ex: cdp.Exchange, name: str) -> tuple[Any, Any]:
    """(usage, server_usage) of the recovered tail: what the events after the cut
    carry. Anthropic splits usage between message_start (input tokens, not
    captured) and message_delta (output tokens)."""
    if name == "anthropic":
        for w in ex.writes:
            event, data = _sse_item(w)
            if event == "message_delta":
                usage = json.loads(data)["usage"]
                return (
                    {
                        "prompt_tokens": usage.get("input_tokens"),
                        "completion_tokens": usage["output_tokens"],
                    },
                    usage,
                )
    return ex.usage, ex.server_usage


def build(
    name: str,
    desc: str,
    port: int,
    make: Callable[[], cdp.Exchange],
    reader: Callable[[bytes], list[Piece]],
    model_in_items: bool,
    seed: int,
) -> tuple[list[Packet], dict[str, Any]]:
    ex = make()
    check_reader(ex, reader)
    pkts: list[Packet] = []
    streams: list[dict[str, Any]] = []
    usage, server_usage = recovered_usage(ex, name)
    kinds = []
    for i, (kind, offset, first) in enumerate(cuts(ex)):
        cport = 42000 + seed * 20 + i
        conv = conversation(ex, cport, port, cdp.T0 + seed * 10 + i, seed)
        pkts += cut_capture(conv, port, offset)
        kinds.append(f"{kind}@{offset}")
        model = tail_model(ex, first)
        assert model == ex.request.get("model") or not model_in_items, (name, model)
        streams.append(
            {
                "method": None,
                "path": None,
                "model": model,
                "stream": True,
                "status": None,
                "client_port": cport,
                "state": "midway",
                "gap": True,
                "done_seen": ex.done_seen,
                "choices": tail_choices(ex, reader, first),
                "usage": usage,
                "server_usage": server_usage,
                "check_text": True,
                "exchange": 0,
                "ttft_ms": None,
            }
        )
        streams.append(cdp.expected_stream(ex, cport, 1))
    pkts.sort(key=lambda p: float(p.time))
    return pkts, {
        "fixture": f"midway_{name}",
        "description": f"{desc}: captures that begin inside the first response body of "
        f"each connection (cuts {', '.join(kinds)}), then a second exchange on the same "
        "keep-alive connection",
        "server_host": cdp.HOST,
        "server_port": port,
        "streams": streams,
        "errors_min": 0,
        "extra_streams_max": 0,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=FAULTS_DIR)
    ns = ap.parse_args(argv)
    ns.out.mkdir(parents=True, exist_ok=True)
    random.seed(0)
    for seed, (name, desc, port, make, reader, model_in_items) in enumerate(DIALECTS):
        pkts, expected = build(name, desc, port, make, reader, model_in_items, seed)
        pcap = ns.out / f"midway_{name}.pcap"
        wrpcap(str(pcap), pkts)
        exp = ns.out / f"midway_{name}.expected.json"
        exp.write_text(json.dumps(expected, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"midway_{name:20s} {len(pkts):4d} packets  {len(expected['streams'])} streams")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
