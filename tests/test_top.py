"""``sparseety top``: frames built from replayed fixture captures (checked
against their expected files and the stored rows), the keys, the plain text of
``--once``, the daemon's figures from a real /metrics listener; and, as root,
the live view driven under tmux the way a person uses it, against a live
sidecar recording a real server."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sniffer.capture.afpacket import have_capture_privilege
from sniffer.core.events import StreamClosed
from sniffer.llm.tokens import TokenizerRegistry
from sniffer.record.metrics import Metrics
from sniffer.runtime.replay import replay
from sniffer.runtime.top import (
    DAEMON_METRICS,
    SORTS,
    OpenRow,
    TopSource,
    View,
    metrics_url,
    quantiles,
    render_plain,
)
from sniffer.store.writer import StoreWriter, open_store
from tests.test_live_e2e import procs  # noqa: F401  (fixture)

ROOT = Path(__file__).resolve().parent.parent
PCAPS = ROOT / "pcaps"
#: fixture capture → label given to its server port
REPLAYED = {
    "concurrent_4": "baseline",
    "include_usage": "baseline",
    "keepalive_3": "candidate",
    "error_midstream": "candidate",
    "client_abort": "candidate",
}


def expected(name: str) -> dict[str, Any]:
    return json.loads((PCAPS / f"{name}.expected.json").read_text(encoding="utf-8"))


def rows(db: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as c:
        return c.execute(sql, args).fetchall()


@pytest.fixture(scope="module")
def registry() -> TokenizerRegistry:
    return TokenizerRegistry()


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory, registry: TokenizerRegistry) -> str:
    db = str(tmp_path_factory.mktemp("top") / "replayed.db")
    for name, label in REPLAYED.items():
        replay(
            PCAPS / f"{name}.pcap",
            db,
            labels={expected(name)["server_port"]: label},
            tokens=registry,
        )
    return db


def whole_history(db: str) -> tuple[float, float]:
    """A ``now`` just after the last stream closed, and a window covering them all."""
    (first, last) = rows(db, "select min(t_request), max(closed_at) from streams")[0]
    return last + 1.0, last + 1.0 - first + 1.0


# ------------------------------------------------------------- per label


def test_label_rows_from_replayed_captures(replayed: str, registry: TokenizerRegistry) -> None:
    now, window = whole_history(replayed)
    frame = TopSource(
        open_store(replayed), source=replayed, registry=registry, window=window
    ).frame(now)
    by_label = {r.label: r for r in frame.labels}
    assert set(by_label) == {"baseline", "candidate"}
    for label in ("baseline", "candidate"):
        names = [n for n, lab in REPLAYED.items() if lab == label]
        streams = [s for n in names for s in expected(n)["streams"]]
        row = by_label[label]
        assert row.streams == len(streams)
        states: dict[str, int] = {}
        for s in streams:
            states[s["state"]] = states.get(s["state"], 0) + 1
        assert row.states == states
        assert row.incomplete == sum(n for s, n in states.items() if s != "complete")
        assert row.per_second == pytest.approx(len(streams) / window)
        # TTFT: the expected files' ttft_ms, measured from the captures by
        # scripts/measure_ttft.py (not by the sniffer), rounded to the microsecond
        ttfts = [s["ttft_ms"] / 1000 for s in streams if s.get("ttft_ms") is not None]
        got = quantiles(ttfts)
        assert got is not None and row.ttft is not None
        measured = {
            sid: t
            for sid, t in rows(
                replayed,
                "select id, t_first_content - t_request from streams where label = ? "
                "and t_first_content is not null",
                label,
            )
        }
        assert row.ttft == pytest.approx(quantiles(list(measured.values())), abs=1e-9)
        for a, b in zip(row.ttft, got, strict=True):
            if len(ttfts) == len(measured):
                assert a == pytest.approx(b, abs=2e-6)
        # ITL: gaps between consecutive output chunks of each choice, as stored
        gaps = []
        for (sid,) in rows(replayed, "select id from streams where label = ?", label):
            by_choice: dict[int, list[float]] = {}
            for choice, ts in rows(
                replayed,
                "select choice, ts from chunks where stream_id = ? and kind in "
                "('content', 'reasoning', 'tool_call') order by seq",
                sid,
            ):
                by_choice.setdefault(choice, []).append(ts)
            for ts in by_choice.values():
                gaps += [b - a for a, b in itertools.pairwise(ts)]
        assert row.itl == pytest.approx(quantiles(gaps), abs=1e-12)
        assert row.tokens_per_s is not None and row.tokens_per_s[0] > 0


def test_the_window_keeps_only_recent_streams(replayed: str) -> None:
    (last,) = rows(replayed, "select max(closed_at) from streams")[0]
    engine = open_store(replayed)
    frame = TopSource(engine, source=replayed, window=60).frame(last + 30)
    recent = rows(
        replayed,
        "select label, count(*) from streams where closed_at >= ? and dialect != 'http' "
        "group by label",
        last - 30,
    )
    assert {r.label: r.streams for r in frame.labels} == dict(recent)
    assert TopSource(engine, source=replayed).frame(last + 3600).labels == []


def test_node_filter(replayed: str) -> None:
    now, window = whole_history(replayed)
    engine = open_store(replayed)
    assert TopSource(engine, source="x", node="no-such-node", window=window).frame(now).labels == []
    (node,) = rows(replayed, "select node from streams limit 1")[0]
    assert TopSource(engine, source="x", node=node, window=window).frame(now).labels


# ---------------------------------------------------------- open streams


class _NoClose(StoreWriter):
    """Writes everything but the streams' close: they stay open in the store,
    as while the daemon is still recording them."""

    def write_many(self, events: Any) -> None:
        super().write_many([e for e in events if not isinstance(e, StreamClosed)])


def test_open_streams(tmp_path: Path, registry: TokenizerRegistry) -> None:
    db = str(tmp_path / "open.db")
    exp = expected("chat_english")
    with _NoClose(db) as w:
        replay(PCAPS / "chat_english.pcap", "", writer=w, labels={exp["server_port"]: "dense"})
    (sid, t_request) = rows(db, "select id, t_request from streams")[0]
    (first, last) = rows(
        db, "select min(ts), max(ts) from chunks where kind = 'content' and stream_id = ?", sid
    )[0]
    now = last + 2.5
    frame = TopSource(open_store(db), source=db, registry=registry).frame(now)
    assert frame.labels == []  # nothing closed
    (row,) = frame.open
    choice = exp["streams"][0]["choices"]["0"]
    assert (row.id, row.label, row.model) == (sid, "dense", exp["streams"][0]["model"])
    assert row.chunks == choice["chunks"]
    assert row.ttft == pytest.approx(exp["streams"][0]["ttft_ms"] / 1000, abs=2e-6)
    assert row.age == pytest.approx(now - t_request)
    _, tok = registry.resolve(row.model)
    tokens = len(tok.encode_batch([choice["text"]])[0])
    assert row.tokens == tokens
    assert row.tokens_per_s == pytest.approx(tokens / (last - first))
    # without a tokenizer: chunks and TTFT, no token figures
    bare = TopSource(open_store(db), source=db).frame(now).open[0]
    assert (bare.chunks, bare.tokens, bare.tokens_per_s) == (row.chunks, None, None)
    # a stream open for longer than an hour was left by a daemon that stopped
    assert TopSource(open_store(db), source=db).frame(t_request + 3601).open == []


# ------------------------------------------------------------------ keys


def _row(i: int, label: str, model: str, age: float, chunks: int, tps: float | None) -> OpenRow:
    return OpenRow(i, label, model, "n", age, chunks, None, tps, 0.01 * i)


ROWS = [
    _row(1, "dense", "m-b", 9.0, 10, 50.0),
    _row(2, "sparse", "m-a", 3.0, 40, None),
    _row(3, "dense", "m-c", 5.0, 20, 80.0),
]


def ids(view: View) -> list[int]:
    return [r.id for r in view.rows(ROWS)]


def test_sort_keys_reverse_and_filter() -> None:
    view = View()
    assert view.sort == "age" and ids(view) == [1, 3, 2]  # the oldest first
    seen = {}
    for _ in SORTS:
        seen[view.sort] = ids(view)
        assert not view.handle("s")
    assert view.sort == "age"  # 's' cycles through every order
    assert seen == {
        "age": [1, 3, 2],
        "chunks": [2, 3, 1],
        "tok/s": [3, 1, 2],  # unknown last
        "ttft": [3, 2, 1],
        "label": [1, 3, 2],
        "model": [2, 1, 3],
        "id": [1, 2, 3],
    }
    view.handle("S")
    assert view.sort == "id"
    view.handle("r")
    assert ids(view) == [3, 2, 1]
    view.handle("r")
    for key in "/spa":
        assert not view.handle(key)
    assert view.editing == "spa" and ids(view) == [1, 2, 3]  # applied on enter only
    view.handle("\r")
    assert view.filter == "spa" and ids(view) == [2]
    view.handle("/")
    view.handle("\x7f")
    view.handle("\x7f")
    view.handle("\x7f")
    for key in "m-c\r":
        view.handle(key)
    assert ids(view) == [3]  # the model matches too
    view.handle("\x1b")
    assert view.filter == "" and ids(view) == [1, 2, 3]
    view.handle("/")
    view.handle("x")
    view.handle("\x1b")  # esc while typing cancels
    assert view.editing is None and view.filter == ""
    assert view.handle("q") is True


def test_quantiles() -> None:
    assert quantiles([]) is None
    assert quantiles([3.0]) == (3.0, 3.0, 3.0)
    assert quantiles([1.0, 2.0, 3.0, 4.0], (0.0, 0.5, 1.0)) == (1.0, 2.5, 4.0)


# ------------------------------------------------------- --once, the CLI


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sniffer.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def test_once_prints_one_plain_frame(replayed: str) -> None:
    r = cli("top", "--once", env={"SPARSEETY_DB": replayed})
    assert r.returncode == 0, r.stderr
    assert "\x1b[" not in r.stdout  # plain text: stdout is not a terminal
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"sparseety top · {replayed}")
    assert any(line.startswith("open streams: 0") for line in lines)
    assert any(line.startswith("per label, last 60 s") for line in lines)
    # the replayed streams are older than a minute: none in the window
    assert "(no stream closed in the last minute)" in r.stdout


def test_plain_frame_lists_rows(replayed: str) -> None:
    now, window = whole_history(replayed)
    frame = TopSource(open_store(replayed), source="db", window=window).frame(now)
    text = render_plain(frame, View())
    table = text[text.index("per label") :].splitlines()
    header = table[1].split()
    assert header == ["label", "streams/s", "streams", "incomplete", "ttft", "ms", "itl", "ms",
                      "tok/s"]  # fmt: skip
    baseline = next(line for line in table if line.startswith("baseline"))
    candidate = next(line for line in table if line.startswith("candidate"))
    assert baseline.split()[2] == str(len(expected("concurrent_4")["streams"]) + 1)
    assert "error 1" in candidate and "truncated 1" in candidate


def test_cli_errors() -> None:
    r = cli("top", "--db", "/nonexistent/x.db", "--once")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "no database" in r.stderr
    r = cli("top", "--db", "/nonexistent/x.db")  # no terminal, no --once
    assert r.returncode == 2 and "--once" in r.stderr
    r = cli("top", "--metrics", "nonsense", "--once")
    assert r.returncode == 2 and "--metrics" in r.stderr
    r = cli("top", "--help")
    assert r.returncode == 0 and "Example:" in r.stdout and "sparseety top" in r.stdout


# ------------------------------------------------------------- /metrics


def test_daemon_metric_names_are_exposed() -> None:
    m = Metrics()
    m.add_otlp_failure("traces")
    m.observe([])
    text = m.render().decode()
    exposed = set(re.findall(r"^([a-z_:]+?)(?:\{| )", text, re.M))
    missing = {name for name in DAEMON_METRICS.values() if name not in exposed}
    # parse errors by stage exist once an error was counted; the rest always
    assert missing <= {"sparseety_parse_errors_total"}, missing
    assert "sparseety_parse_errors" in text  # its HELP/TYPE lines: the family exists


def test_health_from_a_real_metrics_listener(replayed: str) -> None:
    m = Metrics()
    with m.serve("127.0.0.1", 0) as server:
        m.add_kernel_drops(3)
        m.set_queue_depth(7)
        m.set_sample_rate(0.5)
        source = TopSource(
            open_store(replayed), source="db", metrics=metrics_url(f"127.0.0.1:{server.port}")
        )
        first = source.frame()
        assert first.metrics is not None and first.metrics_error is None
        assert first.metrics.values["kernel_drops"] == 3
        assert first.metrics.values["queue_depth"] == 7
        m.add_kernel_drops(2)
        m.add_queue_drops(1)
        time.sleep(0.05)  # two readings, some time apart: increases
        second = source.frame()
        assert second.metrics is not None and second.metrics.increase is not None
        assert second.metrics.increase["kernel_drops"] == 2
        assert second.metrics.increase["queue_drops"] == 1
        text = render_plain(second, View())
        assert "kernel drops 5 (+2/min)" in text
        assert "queue 7" in text and "sample rate 50%" in text
    gone = source.frame()  # the daemon went away: shown, not fatal
    assert gone.metrics is None and gone.metrics_error
    assert "metrics unreachable" in render_plain(gone, View())


def test_metrics_url() -> None:
    assert metrics_url("127.0.0.1:9464") == "http://127.0.0.1:9464/metrics"
    assert metrics_url("[::1]:9464") == "http://[::1]:9464/metrics"
    assert metrics_url("http://h:1") == "http://h:1/metrics"
    assert metrics_url("http://h:1/m") == "http://h:1/m"
    with pytest.raises(ValueError):
        metrics_url("nonsense")


# --------------------------------------------------------- live, under tmux


class Tmux:
    """A detached tmux session on a private socket, running one command."""

    def __init__(self, tmp: Path, command: list[str], width: int = 150, height: int = 45) -> None:
        self.socket = str(tmp / "tmux.sock")
        self.session = "top"
        self._tmux(
            "new-session", "-d", "-s", self.session, "-x", str(width), "-y", str(height),
            "env", "-u", "COLUMNS", "-u", "LINES", f"PYTHONPATH={ROOT}", "TERM=xterm-256color",
            *command,
        )  # fmt: skip

    def _tmux(self, *args: str) -> str:
        r = subprocess.run(
            ["tmux", "-S", self.socket, *args], capture_output=True, text=True, timeout=20
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", self.session, *keys)

    def screen(self, escapes: bool = False) -> str:
        return self._tmux("capture-pane", "-p", *(["-e"] if escapes else []), "-t", self.session)

    def kill(self) -> None:
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=20)

    def wait(self, check: Any, what: str, timeout: float = 30.0) -> str:
        """The screen once ``check(screen)`` holds (polled; bounded)."""
        deadline = time.monotonic() + timeout
        screen = self.screen()
        while not check(screen):
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not on the screen after {timeout}s:\n{screen}")
            time.sleep(0.2)
            screen = self.screen()
        return screen


def open_ids(screen: str) -> list[int]:
    """The ids of the open-streams table, top to bottom."""
    lines = screen.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("open streams:"))
    out: list[int] = []
    for line in lines[start + 1 :]:
        m = re.match(r"\s*(\d+)\s", line)
        if m:
            out.append(int(m.group(1)))
        elif out or line.startswith("per label"):
            break
    return out


@pytest.fixture
def tmux_sessions() -> Iterator[list[Tmux]]:
    made: list[Tmux] = []
    yield made
    for t in made:
        t.kill()


def _slow_streams(port: int, models: list[str], stop: threading.Event) -> threading.Thread:
    """One slow stream per model, oldest first: each started once the one before
    has its answer's head (its request was sent, so its stream is the older
    whatever the threads' scheduling), then a second apart; read to the end."""

    def go() -> None:
        def one(model: str, answered: threading.Event) -> None:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": f"slow {model}"}],
                "stream": True,
                "max_tokens": 200,
            }
            try:
                with (
                    httpx.Client(timeout=60) as c,
                    c.stream(
                        "POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body
                    ) as r,
                ):
                    answered.set()
                    for _ in r.iter_lines():
                        if stop.is_set():
                            return
            finally:
                answered.set()  # a failed request does not hold the next one back

        threads = []
        for model in models:
            answered = threading.Event()
            t = threading.Thread(target=one, args=(model, answered), daemon=True)
            t.start()
            threads.append(t)
            answered.wait(60)
            if stop.wait(1.0):
                break
        for t in threads:
            t.join(60)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.skipif(
    not have_capture_privilege(), reason="live capture needs root or CAP_NET_RAW (packet sockets)"
)
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_top_under_tmux_against_a_live_sidecar(
    tmp_path: Path,
    procs: list[Any],  # noqa: F811
    tmux_sessions: list[Tmux],
) -> None:
    from tests.fixture_server import free_port
    from tests.test_dashboard import bad_request
    from tests.test_live_e2e import daemon, httpx_stream, server

    port = server(procs)
    mport = free_port(lo=19000, hi=19499)
    d = daemon(
        procs,
        tmp_path,
        "--port", str(port), "--label", f"{port}=dense",
        "--metrics-listen", f"127.0.0.1:{mport}",
        # a ring that outlasts a few seconds of a starved capture thread on a
        # loaded machine (256 blocks retired every 20 ms), so the slow streams
        # below are not cut by kernel drops while the test watches them
        "--ring-blocks", "256", "--block-size", "65536",
    )  # fmt: skip
    # a closed stream for the per-label table, and a recorded error
    done = httpx_stream(port, "quick one", model="fake-delay2", max_tokens=20)
    assert done.complete, done
    bad_request(port)
    # three slow streams (~150 ms a token, 30 s), one after the other: the
    # oldest is model ...-c, then -a, then -b
    models = ["fake-delay150-c", "fake-delay150-a", "fake-delay150-b"]
    stop = threading.Event()
    exit_file = tmp_path / "top.exit"  # top's exit code, written by the shell around it
    t = Tmux(
        tmp_path,
        ["sh", "-c", f'"$@"; echo $? > {exit_file}', "sh",
         sys.executable, "-m", "sniffer.cli", "top", "--db", d.db,
         "--metrics", f"127.0.0.1:{mport}"],
    )  # fmt: skip
    tmux_sessions.append(t)
    t.wait(lambda s: "open streams: 0" in s, "the first frame")
    time.sleep(1.5)  # not an assertion: top loads its tokenizer after the first frame
    clients = _slow_streams(port, models, stop)
    try:
        screen = t.wait(lambda s: all(m in s for m in models), "three open streams")
        by_model = {
            model: sid
            for sid, model in rows(d.db, "select id, model from streams where state = 'open'")
        }
        assert set(by_model) == set(models)
        oldest_first = [by_model[m] for m in models]
        assert open_ids(screen) == oldest_first, screen  # sort: age, the oldest first
        assert "sort age" in screen
        assert re.search(r"^\s*dense\s+\d", screen, re.M), screen  # the closed one, per label
        assert f"metrics http://127.0.0.1:{mport}/metrics" in screen
        assert "kernel drops " in screen and "queue drops " in screen
        # the recorded http error, in red
        t.wait(lambda s: re.search(r"errors \(60 s\) \d+ \(.*http 1", s), "the http error")
        coloured = t.screen(escapes=True)
        assert re.search(r"\x1b\[[0-9;]*31[0-9;]*m\d+ \([^)]*http 1", coloured), coloured
        # sorted by model: 's' five times (age → chunks → tok/s → ttft → label → model)
        t.keys("s", "s", "s", "s", "s")
        screen = t.wait(lambda s: "sort model" in s, "sort by model")
        assert open_ids(screen) == [by_model[m] for m in sorted(models)]
        t.keys("r")
        screen = t.wait(lambda s: "sort model ▲" in s, "reversed")
        assert open_ids(screen) == [by_model[m] for m in sorted(models, reverse=True)]
        # filter: '/' then text then enter
        t.keys("/", "-", "a", "Enter")
        screen = t.wait(lambda s: "filter '-a'" in s, "the filter")
        assert open_ids(screen) == [by_model["fake-delay150-a"]]
        # chunks grow while we watch (a live view, not one frame)
        first_chunks = _chunks_of(screen, by_model["fake-delay150-a"])
        t.wait(
            lambda s: _chunks_of(s, by_model["fake-delay150-a"]) > first_chunks,
            "the chunk count growing",
        )
        t.keys("q")
        deadline = time.monotonic() + 10
        while not exit_file.exists() or not exit_file.read_text().strip():
            assert time.monotonic() < deadline, f"q did not end top:\n{t.screen()}"
            time.sleep(0.1)
        assert exit_file.read_text().strip() == "0", t.screen()
    except AssertionError as exc:
        log = "\n".join(ln for ln in d.log().splitlines() if "level=debug" not in ln)
        raise AssertionError(f"{exc}\n--- daemon log:\n{log[-3000:]}") from None
    finally:
        stop.set()
        clients.join(60)
    assert d.stop() == 0


def _chunks_of(screen: str, sid: int) -> int:
    for line in screen.splitlines():
        cells = line.split()
        if cells and cells[0] == str(sid):
            return int(cells[4])
    return -1
