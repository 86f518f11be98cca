"""The recorded HTTP/2 and gRPC captures in pcaps/h2/ replay to what the
clients received (``NAME.expected-h2.json``, written by
scripts/record_h2_pcaps.py from the clients' side), plus crafted faults on
them: a lost frame, a capture starting mid-connection."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from sniffer.capture.pcap import read_capture
from sniffer.core.events import Segment, StreamClosed, StreamOpened, StreamState
from sniffer.core.pipeline import Pipeline
from sniffer.runtime.replay import replay

H2 = Path(__file__).resolve().parent.parent / "pcaps" / "h2"
FIXTURES = sorted(H2.glob("*.pcap"))


def _rows(db: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as c:
        rows = c.execute(
            "select id, method, path, model, state, request_json from streams "
            "order by connection_id, exchange"
        ).fetchall()
        out = []
        for sid, method, path, model, state, req in rows:
            text = "".join(
                t or ""
                for (t,) in c.execute(
                    "select text from chunks where stream_id=? and chunk_index>0 order by seq",
                    (sid,),
                )
            )
            out.append((method, path, model, state, text, req))
        return out


def test_there_are_h2_fixtures() -> None:
    assert {p.stem for p in FIXTURES} >= {"h2c_chat", "grpc_stream"}


@pytest.mark.parametrize("pcap", FIXTURES, ids=[p.stem for p in FIXTURES])
def test_h2_fixture_replays_to_what_the_client_received(pcap: Path, tmp_path: Path) -> None:
    exp = json.loads(pcap.with_suffix(".expected-h2.json").read_text())
    db = str(tmp_path / "f.db")
    replay(pcap, db)
    rows = [r for r in _rows(db) if r[0] == "POST"]
    want = exp["streams"]
    if "prompt" in want[0]:  # concurrent chats: the request order is the capture's
        order = {json.loads(r[5])["messages"][0]["content"]: r for r in rows}
        rows = [order[w["prompt"]] for w in want]
    assert [r[:5] for r in rows] == [
        (w["method"], w["path"], w["model"], w["state"], w["text"]) for w in want
    ]


def _segments(pcap: Path) -> list[Segment]:
    return list(read_capture(pcap))


def _run(segs: list[Segment]) -> list[Any]:
    p = Pipeline()
    out: list[Any] = []
    for s in segs:
        out.extend(p.feed(s))
    out.extend(p.flush(segs[-1].ts + 1))
    return out


def test_lost_server_segment_gaps_one_stream_others_go_on() -> None:
    """Drop one server data segment in the middle of the h2c capture: the stream
    whose frames it carried is never complete; the connection goes on."""
    segs = _segments(H2 / "h2c_chat.pcap")
    server_port = json.loads((H2 / "h2c_chat.expected-h2.json").read_text())["server_port"]
    data = [i for i, s in enumerate(segs) if s.sport == server_port and s.payload]
    victim = data[len(data) // 2]
    out = _run(segs[:victim] + segs[victim + 1 :])
    closed = [e for e in out if isinstance(e, StreamClosed)]
    assert any(c.state is StreamState.GAP for c in closed)
    assert any(c.state is StreamState.COMPLETE for c in closed) or len(closed) >= 3


def test_capture_starting_mid_connection() -> None:
    """Start the gRPC capture after its first server data: what can still be
    decoded is; undecodable headers are recorded errors, never a crash."""
    segs = _segments(H2 / "grpc_stream.pcap")
    port = json.loads((H2 / "grpc_stream.expected-h2.json").read_text())["server_port"]
    first = next(i for i, s in enumerate(segs) if s.sport == port and s.payload)
    out = _run(segs[first + 1 :])
    assert not any(
        isinstance(e, StreamClosed) and e.state is StreamState.COMPLETE and e.gap for e in out
    )
    assert any(isinstance(e, StreamOpened) for e in out) or any(
        type(e).__name__ == "PipelineError" for e in out
    )
