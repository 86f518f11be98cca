"""Every capture in pcaps/ (and pcaps/faults/) replays, through the real pipeline
into a real SQLite file, to the result its ``.expected.json`` states (ground
truth from the client that made the traffic, see pcaps/README.md).

EVERY field of every expected file is compared (``KNOWN_*`` below lists them
all; a field this test does not know fails it, so a new field gets a
comparison, not silence).
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from sniffer.capture.pcap import read_capture
from sniffer.core.events import ConnectionOpened, HttpBody, HttpResponse, stream_flags
from sniffer.core.pipeline import Pipeline
from sniffer.core.sse import SseDecoder
from sniffer.runtime.replay import replay
from sniffer.store.queries import count_rows, get_stream, list_errors, list_streams
from sniffer.store.writer import open_store

PCAPS = Path(__file__).resolve().parent.parent / "pcaps"
# The recordings in pcaps/, pcaps/llamacpp/ and pcaps/llama-server/, and the crafted
# faults in pcaps/faults/.
FIXTURES = sorted(
    (p for p in PCAPS.rglob("*.pcap") if p.with_suffix(".expected.json").exists()),
    key=lambda p: p.stem,
)

KNOWN_TOP = {
    "fixture",
    "description",
    "base",
    "server_host",
    "server_port",
    "streams",
    "errors_min",
    "extra_streams_max",
    "capture_error",
    "error_kinds",
    "reassembly",
    "server",
}
KNOWN_STREAM = {
    "method",
    "path",
    "model",
    "stream",
    "status",
    "client_port",
    "exchange",
    "state",
    "accept_states",
    "gap",
    "done_seen",
    "choices",
    "usage",
    "server_usage",
    "sse_events",
    "error",
    "check_text",
    "ttft_ms",
    "flags",
    "stream_errors",
    "quiet_events",
    "request",
    "after_done",
    "speculative",
    "timings",  # llama-server: the last timings object the client received
    "spec_truth",  # per-step truth the cadence is held to: tests/test_llama_server.py
}
KNOWN_CHOICE = {
    "text",
    "finish_reason",
    "chunks",
    "reasoning",
    "tool_calls",
    "text_prefix",
    "chunks_min",
}


def _expected(pcap: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(pcap.with_suffix(".expected.json").read_text())
    return data


def test_there_are_fixtures() -> None:
    assert len(FIXTURES) >= 20
    assert all(
        p.parent in (PCAPS, PCAPS / "faults", PCAPS / "llamacpp", PCAPS / "llama-server")
        for p in FIXTURES
    )
    assert {p.stem for p in FIXTURES if p.parent == PCAPS / "faults"} >= {
        "fault_lost",
        "fault_truncated_file",
    }


def sse_events_by_exchange(pcap: Path) -> dict[tuple[int, int], int]:
    """(client port, exchange) → SSE events with data that the sniffer's own
    HTTP and SSE stages find in each event-stream response of the capture."""
    pipe = Pipeline()
    reader = read_capture(pcap)
    events: list[object] = []
    for seg in reader:
        for flow in pipe.reassembler.feed(seg):
            events.extend(pipe.http.feed(flow))
    for flow in pipe.reassembler.flush(reader.stats.last_ts or 0.0):
        events.extend(pipe.http.feed(flow))
    ports: dict[int, int] = {}
    decoders: dict[tuple[int, int], SseDecoder] = {}
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for ev in events:
        if isinstance(ev, ConnectionOpened):
            ports[ev.conn] = ev.client[1]
        elif isinstance(ev, HttpResponse) and not ev.informational:
            ctype = dict(ev.headers).get("content-type", "")
            if ctype.startswith("text/event-stream"):
                decoders[(ev.conn, ev.exchange)] = SseDecoder()
        elif isinstance(ev, HttpBody) and not ev.from_client:
            dec = decoders.get((ev.conn, ev.exchange))
            if dec is not None:
                key = (ports[ev.conn], ev.exchange)
                counts[key] += sum(1 for e in dec.feed(ev.data) if e.data)
    return dict(counts)


def stored_speculative(row: dict[str, Any]) -> dict[str, Any]:
    """The server-reported speculative decoding and timings a stream row holds
    (migration 0005), in the shape of the expected files' ``speculative``."""
    timings = {
        k: row[f"server_{k}"] for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms")
    }
    return {
        "source": row["spec_source"],
        "draft_tokens": row["spec_draft_tokens"],
        "accepted_tokens": row["spec_accepted_tokens"],
        "steps": row["spec_steps"],
        "accept_length": row["spec_accept_length"],
        "acceptance_rate": row["spec_accept_rate"],
        "histogram": json.loads(row["spec_histogram"]) if row["spec_histogram"] else None,
        "timings": timings if any(v is not None for v in timings.values()) else None,
        "rejected": json.loads(row["server_rejected"]) if row["server_rejected"] else None,
    }


def stored_choices(detail: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """What the store holds per choice: text and text chunks, reasoning, tool calls."""
    out: dict[int, dict[str, Any]] = {}
    for c in detail["chunks"]:
        ch = out.setdefault(c["choice"], {"text": "", "chunks": 0, "reasoning": "", "tools": {}})
        if c["chunk_index"]:
            ch["text"] += c["text"] or ""
            ch["chunks"] += 1
        ch["reasoning"] += c["reasoning"] or ""
        for tc in json.loads(c["tool_calls"]) if c["tool_calls"] else []:
            t = ch["tools"].setdefault(
                int(tc.get("index", 0)), {"id": None, "name": None, "arguments": ""}
            )
            t["id"] = tc.get("id") or t["id"]
            fn = tc.get("function") or {}
            t["name"] = fn.get("name") or t["name"]
            t["arguments"] += fn.get("arguments") or ""
    return out


# One check per field of the expected-result file, in its order (C901).
@pytest.mark.parametrize("pcap", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_fixture_replays_to_expected(pcap: Path, tmp_path: Path) -> None:  # noqa: C901
    exp = _expected(pcap)
    assert set(exp) <= KNOWN_TOP, set(exp) - KNOWN_TOP
    assert exp["fixture"] == pcap.stem
    assert exp["description"].strip()
    if "server" in exp:  # real recordings: which server and options made the traffic
        assert exp["server"]["software"] and isinstance(exp["server"]["speculative"], bool)
        assert exp["server"]["served_model"] == exp["streams"][0]["model"]
    if exp.get("base"):
        assert (PCAPS / f"{exp['base']}.pcap").exists()
    db = str(tmp_path / "f.db")
    result = replay(pcap, db)
    engine = open_store(db)
    rows = list_streams(engine)
    sse_counts = sse_events_by_exchange(pcap)
    by_port: dict[int, list[dict[str, Any]]] = {}
    for r in sorted(rows, key=lambda r: (r["connection_id"], r["exchange"])):
        by_port.setdefault(int(r["client"].rsplit(":", 1)[1]), []).append(r)
    first_exchange: dict[int, int] = {}
    for want in exp["streams"]:
        port = want["client_port"]
        first_exchange[port] = min(first_exchange.get(port, want["exchange"]), want["exchange"])
    for want in sorted(exp["streams"], key=lambda w: (w["client_port"], w["exchange"])):
        assert set(want) <= KNOWN_STREAM, set(want) - KNOWN_STREAM
        # Exchanges of one connection in order; a capture that began mid-connection
        # has not seen (and so not numbered) the first ones.
        key = (want["client_port"], want["exchange"])
        where = f"{pcap.name} {key}"
        check = want.get("check_text", True)
        candidates = by_port.get(want["client_port"], [])
        while candidates and (
            candidates[0]["method"] != want["method"]
            or candidates[0]["path"] != want["path"]
            or (want.get("model") is not None and candidates[0]["model"] != want["model"])
        ):
            candidates.pop(0)
        assert candidates, f"{where}: no stream like {want['method']} {want['path']}"
        got = candidates.pop(0)
        exchange = want["exchange"] - first_exchange[want["client_port"]]
        assert got["exchange"] == exchange, where
        host, port = got["server"].rsplit(":", 1)
        assert (host.strip("[]"), int(port)) == (exp["server_host"], exp["server_port"]), where
        assert got["model"] == want["model"], where
        # the request's "stream" field; for APIs that stream by endpoint or by
        # default (TGI /generate_stream, Ollama) it has none: then the response shows it
        asked = got["is_stream"] if got["is_stream"] is not None else got["streaming"]
        # (a request whose head was rejected has no parsed body: no flag to compare)
        if check or got["is_stream"] is not None:
            assert bool(asked) == want["stream"], where
        if want.get("status") is not None:
            assert got["status"] == want["status"], where
        accept = want.get("accept_states") or [want["state"]]
        assert want["state"] in accept, where
        assert got["state"] in accept, (where, got["reason"])
        for flag in ("gap", "done_seen"):
            if want[flag] is not None:
                assert bool(got[flag]) == want[flag], (where, flag)
            else:
                assert not check, (
                    f"{where}: {flag} null means 'not checked' (check_text false only)"
                )
        detail = get_stream(engine, got["id"])
        assert detail is not None
        stored = stored_choices(detail)
        finishes = json.loads(got["finish_reasons"] or "{}")
        wanted = want.get("choices") or {}
        if check:
            # no choice beyond the expected ones carries output
            extra = {
                ci
                for ci, s in stored.items()
                if str(ci) not in wanted and (s["text"] or s["reasoning"] or s["tools"])
            }
            assert not extra, (where, extra)
        for choice, w in wanted.items():
            assert set(w) <= KNOWN_CHOICE, set(w) - KNOWN_CHOICE
            ci = int(choice)
            s = stored.get(ci, {"text": "", "chunks": 0, "reasoning": "", "tools": {}})
            tools = [s["tools"][i] for i in sorted(s["tools"])]
            if check:
                assert s["text"] == w["text"], (where, ci)
                assert s["chunks"] == w["chunks"], (where, ci)
                assert finishes.get(str(ci)) == w["finish_reason"], (where, ci)
                assert s["reasoning"] == w.get("reasoning", ""), (where, ci)
                assert tools == w.get("tool_calls", []), (where, ci)
            else:
                prefix = w["text_prefix"]
                # the pipeline kept some text, and it agrees with the client's
                assert prefix and s["text"], (where, ci)
                assert s["text"].startswith(prefix) or prefix.startswith(s["text"]), (where, ci)
                assert s["chunks"] >= w["chunks_min"], (where, ci)
                if w.get("finish_reason") is not None:
                    assert finishes.get(str(ci)) == w["finish_reason"], (where, ci)
                if "reasoning" in w:
                    assert s["reasoning"] == w["reasoning"], (where, ci)
                if "tool_calls" in w:
                    assert tools == w["tool_calls"], (where, ci)
        got_usage = json.loads(got["usage"]) if got["usage"] else None
        usage = want["usage"]
        if "timings" in want:
            # llama-server: its timings object is kept inside the usage JSON, as received
            got_timings = got_usage.pop("timings", None) if got_usage else None
            assert got_timings == want["timings"], where
            got_usage = got_usage or None
        if "server_usage" in want:
            # crafted dialect fixtures: usage normalised, the server's own object beside it
            if want["server_usage"] is not None:
                assert got_usage == want["server_usage"], where
            else:  # no usage object on the wire (TGI): the store keeps what it derived
                derived = {k: v for k, v in (usage or {}).items() if v is not None}
                assert got_usage == (derived or None), where
            usage = usage or {}
            assert got["prompt_tokens"] == usage.get("prompt_tokens"), where
            assert got["completion_tokens"] == usage.get("completion_tokens"), where
        elif usage is not None:
            assert got_usage == usage, where
            assert got["prompt_tokens"] == usage.get("prompt_tokens"), where
            assert got["completion_tokens"] == usage.get("completion_tokens"), where
        elif check:
            assert got_usage is None, where
        if "error" in want:
            assert got["error"] == want["error"]["message"], where
        elif check:
            assert got["error"] is None, where
        if "speculative" in want:
            assert stored_speculative(got) == want["speculative"], where
        elif check:  # the server reported nothing: nothing stored
            assert set(stored_speculative(got).values()) == {None}, where
        if "sse_events" in want:
            assert sse_counts.get((want["client_port"], exchange), 0) == want["sse_events"], where
        if want.get("ttft_ms") is not None:
            assert got["t_first_content"] is not None, where
            ttft_ms = (got["t_first_content"] - got["t_request"]) * 1000
            assert ttft_ms == pytest.approx(want["ttft_ms"], abs=0.0011), where
        elif "ttft_ms" in want and check:
            assert got["t_first_content"] is None, where
        _check_caps(want, got, detail, where)
        # the stream's flags, in the order first seen; an exact entry has none unless said
        if "flags" in want or check:
            assert stream_flags(got["flags"]) == want.get("flags", []), where
    extra = len(rows) - len(exp["streams"])
    assert extra <= exp.get("extra_streams_max", 0), [r["path"] for r in rows]
    assert count_rows(engine)["errors"] >= exp.get("errors_min", 0)
    if "error_kinds" in exp:  # "stage:kind" → how many errors rows, exactly
        got_kinds = Counter(f"{e['stage']}:{e['kind']}" for e in list_errors(engine))
        for key, n in exp["error_kinds"].items():
            assert got_kinds.get(key, 0) == n, (pcap.name, key, got_kinds)
    for kind, n in exp.get("reassembly", {}).items():  # the TCP counters, exactly
        assert result.reassembly[kind] == n, (pcap.name, kind, result.reassembly)
    if exp.get("capture_error"):
        assert result.capture_error is not None


def _check_caps(
    want: dict[str, Any], got: dict[str, Any], detail: dict[str, Any], where: str
) -> None:
    """The fields of the cap fixtures (scripts/craft_faults.py, ``cap_*``)."""
    if "flags" in want:
        assert json.loads(got["flags"] or "[]") == want["flags"], where
    if "stream_errors" in want:
        kinds = sorted(f"{e['stage']}/{e['kind']}" for e in detail["errors"])
        assert kinds == sorted(want["stream_errors"]), (where, detail["errors"])
    if "quiet_events" in want:
        # every event carrying no output is counted, stored or not
        (capped,) = [e for e in detail["errors"] if e["kind"] == "events-capped"]
        assert f" of {want['quiet_events']} events" in capped["message"], where
    for name, value in (want.get("request") or {}).items():
        assert got[name] == value, (where, name)
    if "after_done" in want:
        apart = [c["raw"] for c in detail["chunks"] if c["kind"] == "after_done"]
        assert apart == want["after_done"], where
        assert all(not c["text"] for c in detail["chunks"] if c["kind"] == "after_done")


def test_ttft_in_expected_files_is_what_the_capture_shows() -> None:
    """The ``ttft_ms`` values are scripts/measure_ttft.py's reading of the captures
    (scapy, not the sniffer), not hand-edited or copied from the pipeline."""
    sys.path.insert(0, str(PCAPS.parent / "scripts"))
    import measure_ttft

    assert measure_ttft.main(["--check"]) == 0
    # gzip-encoded bodies are not read by that route (measure_ttft.py says so)
    compressed = {
        ("sec_gzip_bomb", 40102, 1),
        ("cap_sse_line", 40201, 0),
        ("cap_ndjson_line", 40203, 0),
    }
    measured = [
        s
        for p in FIXTURES
        for s in _expected(p)["streams"]
        if s.get("check_text", True)
        and s["state"] == "complete"
        and (p.stem, s["client_port"], s["exchange"]) not in compressed
    ]
    assert measured and all("ttft_ms" in s for s in measured)
