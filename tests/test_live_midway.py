"""Late starts and restarts, live on ``lo`` (root): long streams from the real
fixture server to real httpx clients, with ``sparseety run`` started (or
restarted) while they are under way.

Every chunk the clients received after capture became active must be recorded,
in order, as the tail of the right stream (a ``midway`` row: the capture began
inside its response), and nothing a client did not receive may be recorded.
Waits are bounded counts of short sleeps; only processes started here are
signalled.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.test_live_e2e import daemon, ebpf_loadable, procs, q, server  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.root, pytest.mark.slow]

#: Streams under way when the daemon starts; tokens each; ms between tokens.
N_STREAMS = 6
TOKENS = 90
DELAY_MS = 100
#: Slack for the wall clock the test reads against the server's monotonic
#: sleeps (a few ms of NTP slew over a stream at most).
MARGIN = 0.05
#: The fixture server's model: every stream runs to max_tokens, one token per write.
MODEL = f"fake-ignoreeos-delay{DELAY_MS}"


@dataclass
class Timed:
    prompt: str
    pieces: list[tuple[float, str]] = field(default_factory=list)  # (wall time, text)
    complete: bool = False
    error: str | None = None
    sent: float = 0.0  # wall time just before the request was sent

    @property
    def text(self) -> str:
        return "".join(t for _, t in self.pieces)

    def earliest(self, k: int) -> float:
        """The earliest time the server can have sent piece ``k`` (0-based):
        it answers after the request and sleeps ``DELAY_MS`` before every
        write but the first, one token a write. A piece's receipt time only
        bounds its sending from above: a client thread descheduled on a
        loaded machine reads a piece sent before capture began long after."""
        return self.sent + k * DELAY_MS / 1000

    def sent_after(self, t: float) -> list[str]:
        """The pieces certainly sent after ``t`` (a suffix of the pieces)."""
        return [p for k, (_, p) in enumerate(self.pieces) if self.earliest(k) >= t]


def timed_stream(port: int, prompt: str, out: Timed, tokens: int = TOKENS) -> None:
    """One chat stream, each content piece stamped with the wall clock at receipt
    (and the request with the time just before it was sent)."""
    try:
        with httpx.Client(timeout=60) as c:
            out.sent = time.time()
            with c.stream(
                "POST",
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": prompt}],
                    "stream": True,
                    "max_tokens": tokens,
                },
            ) as resp:
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        out.complete = True
                        continue
                    for ch in json.loads(data).get("choices") or []:
                        piece = (ch.get("delta") or {}).get("content") or ""
                        if piece:
                            out.pieces.append((time.time(), piece))
    except Exception as exc:
        out.error = f"{type(exc).__name__}: {exc}"


def start_streams(
    port: int, tag: str, tokens: int = TOKENS
) -> tuple[list[Timed], list[threading.Thread]]:
    results = [Timed(f"{tag} stream {i} about rivers") for i in range(N_STREAMS)]
    threads = [
        threading.Thread(target=timed_stream, args=(port, r.prompt, r, tokens), daemon=True)
        for r in results
    ]
    for t in threads:
        t.start()
    return results, threads


def wait_first_chunks(results: list[Timed], n: int = 3) -> None:
    for _ in range(400):
        if all(len(r.pieces) >= n for r in results):
            return
        time.sleep(0.05)
    raise AssertionError("streams did not start")


def midway_rows(db: str) -> list[dict[str, Any]]:
    rows = []
    for sid, _state, gap, client, model, dialect, t_first, method in q(
        db,
        "select id, state, gap, client, model, dialect, t_first_content, method from streams "
        "where state = 'midway'",
    ):
        chunks = q(db, "select text, ts from chunks where stream_id=? order by seq", sid)
        rows.append(
            {
                "id": sid,
                "gap": gap,
                "client": client,
                "model": model,
                "dialect": dialect,
                "t_first_content": t_first,
                "method": method,
                "pieces": [(ts, t) for t, ts in chunks if t],
            }
        )
    return rows


def check_tails(results: list[Timed], rows: list[dict[str, Any]], t_active: float) -> int:
    """Each client's stream has exactly one midway row whose text is a suffix of
    what the client received and holds every piece the server sent after
    ``t_active`` (+ margin), in order. Returns the pieces recorded."""
    recorded = 0
    for r in results:
        assert r.error is None and r.complete, r
        after = r.sent_after(t_active + MARGIN)
        assert after, "the stream ended before capture began: test too fast"
        mine = [
            row
            for row in rows
            if row["pieces"]
            and r.text.endswith("".join(t for _, t in row["pieces"]))
            and len(row["pieces"]) >= len(after)
        ]
        assert len(mine) == 1, (r.prompt, [len(x["pieces"]) for x in rows])
        row = mine[0]
        got = [t for _, t in row["pieces"]]
        # never invented: the recorded pieces are the client's last pieces, in order
        assert got == [t for _, t in r.pieces][len(r.pieces) - len(got) :]
        # every piece sent after capture became active is there
        assert got[len(got) - len(after) :] == after
        assert row["dialect"] == "openai.chat" and row["model"] == MODEL
        assert row["gap"] and row["t_first_content"] is None and row["method"] is None
        recorded += len(got)
    return recorded


def test_daemon_started_late_records_the_tail_of_every_stream(
    tmp_path: Path,
    procs: list[Any],  # noqa: F811
) -> None:
    port = server(procs)
    results, threads = start_streams(port, "late")
    wait_first_chunks(results)
    d = daemon(procs, tmp_path, "--port", str(port))
    # daemon() returns once the capture-active line is in the log (polled every
    # 50 ms): capture was active before this moment
    t_active = time.time()
    for t in threads:
        t.join(60)
    assert d.stop() == 0
    rows = midway_rows(d.db)
    assert len(rows) == N_STREAMS, q(d.db, "select id, state, client, reason from streams")
    recorded = check_tails(results, rows, t_active)
    total = sum(len(r.pieces) for r in results)
    assert 0 < recorded < total


#: Restarts in the live restart test (SPARSEETY_RESTARTS to measure more).
RESTARTS = int(os.environ.get("SPARSEETY_RESTARTS", "2"))
#: Tokens of each stream of the restart test: 15 before the first stop, 10
#: seen by every later instance, and room for restart windows of ~6 s each
#: (at 100 ms a token; eBPF's take ~3 s, up to 10 s on a loaded machine).
RESTART_TOKENS = 15 + 70 * RESTARTS + 10


def rows_by_prompt(db: str) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for sid, req, state, gap, reason in q(
        db,
        "select id, request_json, state, gap, reason from streams where request_json is not null",
    ):
        prompt = json.loads(req)["messages"][0]["content"]
        chunks = q(db, "select seq, text from chunks where stream_id=? order by seq", sid)
        out.setdefault(prompt, []).append(
            {
                "id": sid,
                "state": state,
                "gap": gap,
                "reason": reason,
                "texts": [t for _, t in chunks if t],
            }
        )
    return out


@pytest.mark.parametrize("backend", ["packet", pytest.param("ebpf", marks=pytest.mark.ebpf)])
def test_graceful_restart_continues_the_same_rows(
    tmp_path: Path,
    procs: list[Any],  # noqa: F811
    request: pytest.FixtureRequest,
    backend: str,
) -> None:
    """SIGTERM + start, twice, in the middle of long streams: each stream is ONE
    row whose chunks are everything the client received except what was sent
    while no daemon ran, and that gap is exact (bytes) and recorded. With eBPF
    the gap is sized by the sockets' own sequence numbers (the program's byte
    offsets start again at 0 in every instance)."""
    if backend == "ebpf":
        request.getfixturevalue("ebpf_loadable")
    port = server(procs)
    args = ("--backend", backend, "--port", str(port))
    d = daemon(procs, tmp_path, *args)
    # a stream outlives every restart window (eBPF start-up, loading and
    # attaching the program, takes longer than opening a packet socket)
    results, threads = start_streams(port, "restart", RESTART_TOKENS)
    windows: list[tuple[float, float]] = []  # (SIGTERM sent, capture active again)
    logs = []
    seen = 15  # chunks each stream has before the first stop
    for k in range(RESTARTS):
        # every instance records some chunks before it is stopped
        wait_first_chunks(results, seen)
        t_stop = time.time()
        assert d.stop() == 0
        logs.append(d.log())
        (tmp_path / f"instance{k}.log").write_text(logs[-1])  # kept for a post-mortem
        (tmp_path / f"checkpoint{k}.json").write_bytes(Path(d.db + ".checkpoint.json").read_bytes())
        assert "event=checkpoint-written" in logs[-1], logs[-1]
        d = daemon(procs, tmp_path, *args)
        windows.append((t_stop, time.time()))
        assert "event=checkpoint-adopted" in d.log()
        seen = min(len(r.pieces) for r in results) + 10
    for t in threads:
        t.join(60)
    # the streams must outlive the last restart window, or nothing is left to hand over
    late = [r.prompt for r in results if not r.pieces or r.pieces[-1][0] <= windows[-1][1]]
    assert not late, f"streams ended before capture was active again: windows {windows}"
    assert d.stop() == 0
    rows = rows_by_prompt(d.db)
    # no second row for any stream (a recovered body would be a midway row)
    assert not q(d.db, "select id, client, reason from streams where state = 'midway'")
    missed_chunks, missed_bytes = [], []
    for r in results:
        assert r.error is None and r.complete, r
        assert len(rows.get(r.prompt, [])) == 1, rows.get(r.prompt)  # one row, never two
        row = rows[r.prompt][0]
        assert row["state"] == "gap" and row["gap"], row
        got = row["texts"]
        sent = [t for _, t in r.pieces]
        # what a daemon was certainly capturing: received (so sent) before a
        # SIGTERM, or sent at the earliest after capture was active again
        certain = [
            t
            for k, (ts, t) in enumerate(r.pieces)
            if all(
                ts < stop - MARGIN or r.earliest(k) > active + MARGIN for stop, active in windows
            )
        ]
        # recorded pieces = the client's pieces minus those of the restart windows, in order
        it = iter(sent)
        assert all(any(g == s for s in it) for g in got), "recorded out of order or invented"
        assert len(got) >= len(certain), (row["reason"], got, sent, windows, r.pieces)
        missed_chunks.append(len(sent) - len(got))
        assert "bytes" in row["reason"]
        # one gap per restart, or fewer: a stream silent through an instance
        # that lived a moment is handed over again, and its gap spans both
        gaps = int(row["reason"].split(" gap")[0].rsplit(" ", 1)[1])
        assert 1 <= gaps <= RESTARTS, row["reason"]
        missed_bytes.append(int(row["reason"].split("(")[1].split()[0]))
    print(
        f"\n{backend}: restart cost over {RESTARTS} restarts x {N_STREAMS} streams "
        f"({DELAY_MS} ms per chunk): chunks lost per stream {missed_chunks}, "
        f"bytes lost per stream {missed_bytes}, windows "
        f"{[round(b - a, 2) for a, b in windows]} s"
    )


@pytest.mark.ebpf
def test_ebpf_daemon_started_late_records_the_tail_of_every_stream(
    tmp_path: Path,
    procs: list[Any],  # noqa: F811
    ebpf_loadable: None,  # noqa: F811
) -> None:
    """The same late start with the eBPF backend: sockets first seen mid-way
    (their byte offsets unknown) are resynchronised the same way."""
    port = server(procs)
    results, threads = start_streams(port, "ebpf late")
    wait_first_chunks(results)
    d = daemon(procs, tmp_path, "--backend", "ebpf", "--port", str(port))
    t_active = time.time()
    for t in threads:
        t.join(60)
    assert d.stop() == 0
    rows = midway_rows(d.db)
    assert len(rows) == N_STREAMS, q(d.db, "select id, state, client, reason from streams")
    check_tails(results, rows, t_active)
