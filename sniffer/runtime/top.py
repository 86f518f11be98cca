"""``sparseety top``: a live view of what a sidecar records, refreshed every second.

A frame is built from two sources. The database (through the read queries of
:mod:`sniffer.store.live`): the open streams with their label, model, age,
chunks so far, tokens per second (the stored text tokenized with the model's
tokenizer) and TTFT; per label, the last minute's closed streams (stream rate,
states, TTFT, inter-chunk latency and tokens-per-second quantiles); the
pipeline errors recorded in the last minute. And, when the daemon's metrics
listener is given, its ``/metrics``: what only the daemon knows (kernel,
queue and OTLP drops, queue depth, last flush age, sample rate, open
connections), totals and their increase over the last minute.

:class:`TopSource` builds :class:`Frame` values; :func:`render` draws one with
rich (a table per section, drops and errors in red), :func:`render_plain` as
plain text (no colour, no box lines) for scripts; :func:`run` is the
interactive loop (one frame a second, the keys of :data:`KEYS`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import select
import sys
import time
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sniffer.store.live import (
    chunk_figures,
    open_streams,
    output_chunk_times,
    output_texts,
    recent_errors,
    recent_streams,
)

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from sniffer.llm.tokens import TokenizerRegistry
    from sniffer.store.db import Store

__all__ = [
    "DAEMON_METRICS",
    "KEYS",
    "SORTS",
    "WINDOW",
    "Frame",
    "LabelRow",
    "MetricsReading",
    "OpenRow",
    "TopSource",
    "View",
    "metrics_url",
    "quantiles",
    "render",
    "render_plain",
    "run",
    "scrape",
]

#: Seconds of history the per-label figures and the metric increases cover.
WINDOW = 60.0
#: Open streams' text is tokenized up to this many characters.
MAX_TOKENIZE_CHARS = 200_000
#: The newest closed streams of the window whose chunk times give the ITL.
MAX_ITL_STREAMS = 500
#: Sort orders of the open-streams table, in the order the ``s`` key cycles.
SORTS = ("age", "chunks", "tok/s", "ttft", "label", "model", "id")
KEYS = "s sort · r reverse · / filter · esc clear · q quit"
QS = (0.5, 0.9, 0.99)

#: The daemon's figures read from /metrics (names as sniffer.record.metrics
#: exposes them; tests/test_top.py checks they are all there).
DAEMON_METRICS = {
    "kernel_drops": "sparseety_kernel_drops_total",
    "queue_drops": "sparseety_queue_drops_total",
    "otlp_dropped": "sparseety_otlp_dropped_total",
    "otlp_failures": "sparseety_otlp_export_failures_total",
    "parse_errors": "sparseety_parse_errors_total",
    "packets": "sparseety_packets_captured_total",
    "queue_depth": "sparseety_queue_depth",
    "flush_age": "sparseety_last_flush_age_seconds",
    "sample_rate": "sparseety_sample_rate",
    "open_connections": "sparseety_open_connections",
    "open_streams": "sparseety_open_streams",
}
#: Of those, the counters (shown with their increase over the window).
COUNTERS = ("kernel_drops", "queue_drops", "otlp_dropped", "otlp_failures", "parse_errors")


def quantiles(values: Sequence[float], qs: Sequence[float] = QS) -> tuple[float, ...] | None:
    """Quantiles by linear interpolation between order statistics (numpy's
    default); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    n = len(xs)
    out = []
    for q in qs:
        pos = q * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        out.append(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))
    return tuple(out)


# -------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class OpenRow:
    """An open stream: ``age`` from its request to now, ``ttft`` from its
    request to its first output chunk (None before it), ``tokens`` of its
    stored text (None when not tokenized), ``tokens_per_s`` over the span of
    its output chunks."""

    id: int
    label: str
    model: str
    node: str
    age: float
    chunks: int
    tokens: int | None
    tokens_per_s: float | None
    ttft: float | None


@dataclass(frozen=True, slots=True)
class LabelRow:
    """The streams of one label closed in the window. ``ttft``, ``itl``,
    ``tokens_per_s``: p50, p90, p99 (seconds; tokens per second per stream)."""

    label: str
    streams: int
    per_second: float
    states: dict[str, int]
    ttft: tuple[float, ...] | None
    itl: tuple[float, ...] | None
    tokens_per_s: tuple[float, ...] | None

    @property
    def incomplete(self) -> int:
        return sum(n for s, n in self.states.items() if s != "complete")


@dataclass(frozen=True, slots=True)
class MetricsReading:
    """The daemon's figures: ``values`` now (a counter with labels: summed;
    ``parse_errors`` by stage in ``errors_by_stage``) and ``increase`` of the
    counters over the window (None until two readings span some time)."""

    url: str
    values: dict[str, float]
    errors_by_stage: dict[str, float]
    increase: dict[str, float] | None
    span: float


@dataclass(frozen=True, slots=True)
class Frame:
    now: float
    source: str
    node: str | None
    open: list[OpenRow]
    labels: list[LabelRow]
    errors: dict[str, int]  # pipeline errors recorded in the window, by stage
    metrics: MetricsReading | None = None
    metrics_error: str | None = None
    window: float = WINDOW


@dataclass
class View:
    """What the keys change: the sort order of the open streams, its direction,
    and a filter (a substring of the label or model)."""

    sort: str = "age"
    reverse: bool = False
    filter: str = ""
    editing: str | None = None  # the filter being typed, after "/"

    def handle(self, key: str) -> bool:
        """Apply one key; True when it asks to quit."""
        if self.editing is not None:
            if key in ("\r", "\n"):
                self.filter, self.editing = self.editing, None
            elif key == "\x1b":
                self.editing = None
            elif key in ("\x7f", "\b"):
                self.editing = self.editing[:-1]
            elif key.isprintable():
                self.editing += key
            return False
        if key in ("q", "Q", "\x03"):
            return True
        if key == "s":
            self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        elif key == "S":
            self.sort = SORTS[(SORTS.index(self.sort) - 1) % len(SORTS)]
        elif key == "r":
            self.reverse = not self.reverse
        elif key == "/":
            self.editing = self.filter
        elif key == "\x1b":
            self.filter = ""
        return False

    def rows(self, rows: Sequence[OpenRow]) -> list[OpenRow]:
        """The open streams to show: filtered, then sorted. The natural
        direction of each order: the oldest, busiest, fastest, slowest-to-start
        first; labels, models and ids ascending; ``reverse`` flips it."""
        f = self.filter.lower()
        kept = [r for r in rows if not f or f in r.label.lower() or f in r.model.lower()]
        key: Callable[[OpenRow], Any]
        descending = True
        if self.sort == "age":
            key = lambda r: (r.age, -r.id)  # noqa: E731
        elif self.sort == "chunks":
            key = lambda r: (r.chunks, -r.id)  # noqa: E731
        elif self.sort == "tok/s":
            key = lambda r: (r.tokens_per_s if r.tokens_per_s is not None else -1.0, -r.id)  # noqa: E731
        elif self.sort == "ttft":
            key = lambda r: (r.ttft if r.ttft is not None else -1.0, -r.id)  # noqa: E731
        else:
            descending = False
            name = {"label": "label", "model": "model", "id": "id"}[self.sort]
            key = lambda r: (getattr(r, name), r.id)  # noqa: E731
        return sorted(kept, key=key, reverse=descending != self.reverse)


# ------------------------------------------------------------------- metrics


def metrics_url(listen: str) -> str:
    """``HOST:PORT`` (as ``run --metrics-listen``) or a URL → the /metrics URL."""
    if "://" in listen:
        if urllib.parse.urlparse(listen).path in ("", "/"):
            return listen.rstrip("/") + "/metrics"
        return listen
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"metrics address {listen!r} is not HOST:PORT or a URL")
    return f"http://{host or '127.0.0.1'}:{port}/metrics"


def scrape(url: str, timeout: float = 0.8) -> tuple[dict[str, float], dict[str, float]]:
    """The daemon's figures from one scrape of ``url``: by the keys of
    :data:`DAEMON_METRICS` (samples of one metric summed over their labels),
    and the parse errors by stage."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as resp:
        text = resp.read().decode("utf-8", "replace")
    by_name = {v: k for k, v in DAEMON_METRICS.items()}
    values: dict[str, float] = {}
    stages: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = by_name.get(sample.name)
            if key is None:
                continue
            values[key] = values.get(key, 0.0) + sample.value
            if key == "parse_errors":
                stage = sample.labels.get("stage", "?")
                stages[stage] = stages.get(stage, 0.0) + sample.value
    return values, stages


class _MetricsHistory:
    """Readings of the last :data:`WINDOW` seconds, for the counters' increase."""

    def __init__(self, url: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.url = url
        self._clock = clock
        self._readings: deque[tuple[float, dict[str, float]]] = deque()

    def read(self) -> MetricsReading:
        values, stages = scrape(self.url)
        t = self._clock()
        self._readings.append((t, values))
        while len(self._readings) > 2 and t - self._readings[1][0] >= WINDOW:
            self._readings.popleft()
        t0, first = self._readings[0]
        increase = None
        if t > t0:
            increase = {k: max(0.0, values.get(k, 0.0) - first.get(k, 0.0)) for k in COUNTERS}
        return MetricsReading(self.url, values, stages, increase, t - t0)


# -------------------------------------------------------------------- source


class TopSource:
    """Builds frames from a store and, optionally, a daemon's /metrics.
    ``window``: seconds of closed streams and errors the per-label figures cover."""

    def __init__(
        self,
        store: Store,
        *,
        source: str,
        node: str | None = None,
        registry: TokenizerRegistry | None = None,
        metrics: str | None = None,
        window: float = WINDOW,
    ) -> None:
        self.store = store
        self.window = window
        self.source = source
        self.node = node
        self.registry = registry
        self._metrics = _MetricsHistory(metrics) if metrics else None
        self._tokens: dict[int, tuple[int, int]] = {}  # stream → (chars, tokens)

    def warm(self) -> None:
        """Load the default tokenizer now (about a second of CPU), rather than
        when the first open stream has text to count."""
        if self.registry is not None:
            with contextlib.suppress(Exception):
                self.registry.default()

    def frame(self, now: float | None = None) -> Frame:
        now = time.time() if now is None else now
        reading: MetricsReading | None = None
        problem: str | None = None
        if self._metrics is not None:
            try:
                reading = self._metrics.read()
            except (OSError, ValueError) as exc:
                problem = f"{self._metrics.url}: {getattr(exc, 'reason', None) or exc}"
        since = now - self.window
        errors: dict[str, int] = {}
        for stage, _kind, _ts in recent_errors(self.store, since=since, node=self.node):
            errors[stage] = errors.get(stage, 0) + 1
        return Frame(
            now=now,
            source=self.source,
            node=self.node,
            open=self._open_rows(now),
            labels=self._label_rows(now),
            errors=errors,
            metrics=reading,
            metrics_error=problem,
            window=self.window,
        )

    def _open_rows(self, now: float) -> list[OpenRow]:
        rows = open_streams(self.store, now=now, node=self.node)
        ids = [r["id"] for r in rows]
        figures = chunk_figures(self.store, ids)
        tokens = self._count_tokens(rows, figures)
        self._tokens = {sid: v for sid, v in self._tokens.items() if sid in figures}
        out = []
        for r in rows:
            f = figures.get(r["id"], {})
            first, last = f.get("first"), f.get("last")
            t_req = r["t_request"]
            n = tokens.get(r["id"])
            rate = None
            if n is not None and first is not None and last is not None and last > first:
                rate = n / (last - first)
            out.append(
                OpenRow(
                    id=int(r["id"]),
                    label=r["label"] or "-",
                    model=r["model"] or "-",
                    node=r["node"] or "-",
                    age=max(0.0, now - t_req) if t_req is not None else 0.0,
                    chunks=int(f.get("chunks", 0)),
                    tokens=n,
                    tokens_per_s=rate,
                    ttft=first - t_req if first is not None and t_req is not None else None,
                )
            )
        return out

    def _count_tokens(
        self, rows: list[dict[str, Any]], figures: dict[int, dict[str, Any]]
    ) -> dict[int, int]:
        """Tokens of each open stream's text so far (recounted when it grew)."""
        out: dict[int, int] = {}
        if self.registry is None:
            return out
        stale = []
        for r in rows:
            chars = figures.get(r["id"], {}).get("chars", 0)
            cached = self._tokens.get(r["id"])
            if cached is not None and cached[0] == chars:
                out[r["id"]] = cached[1]
            elif chars:
                stale.append(r)
            else:
                out[r["id"]] = 0
        texts = output_texts(self.store, [r["id"] for r in stale])
        for r in stale:
            text = texts.get(r["id"], "")[:MAX_TOKENIZE_CHARS]
            try:
                _name, tok = self.registry.resolve(r["model"])
                n = len(tok.encode_batch([text])[0]) if text else 0
            except Exception:  # a tokenizer that cannot load: no token figures
                continue
            chars = figures.get(r["id"], {}).get("chars", 0)
            self._tokens[r["id"]] = (chars, n)
            out[r["id"]] = n
        return out

    def _label_rows(self, now: float) -> list[LabelRow]:
        rows = recent_streams(self.store, since=now - self.window, node=self.node)
        times = output_chunk_times(self.store, [r["id"] for r in rows[:MAX_ITL_STREAMS]])
        gaps: dict[int, list[float]] = {}
        for (sid, _choice), ts in times.items():
            gaps.setdefault(sid, []).extend(b - a for a, b in itertools.pairwise(ts))
        by_label: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_label.setdefault(r["label"] or "-", []).append(r)
        out = []
        for label in sorted(by_label):
            rs = by_label[label]
            states: dict[str, int] = {}
            ttft: list[float] = []
            itl: list[float] = []
            rates: list[float] = []
            for r in rs:
                states[r["state"]] = states.get(r["state"], 0) + 1
                t_req, first, last = r["t_request"], r["t_first_content"], r["t_last_chunk"]
                if r["state"] != "midway" and t_req is not None and first is not None:
                    ttft.append(first - t_req)
                itl.extend(gaps.get(r["id"], ()))
                n = r["output_tokens"]
                if n and first is not None and last is not None and last > first:
                    rates.append(n / (last - first))
            out.append(
                LabelRow(
                    label=label,
                    streams=len(rs),
                    per_second=len(rs) / self.window,
                    states=states,
                    ttft=quantiles(ttft),
                    itl=quantiles(itl),
                    tokens_per_s=quantiles(rates),
                )
            )
        return out


# ------------------------------------------------------------------- drawing


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}" if x >= 0.01 else f"{x * 1000:.1f}"


def _qs(x: tuple[float, ...] | None) -> str:
    return "-" if x is None else "/".join(_ms(v) for v in x)


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _age(x: float) -> str:
    if x < 60:
        return f"{x:.1f}s"
    m, s = divmod(int(x), 60)
    return f"{m}m{s:02d}s" if m < 60 else f"{m // 60}h{m % 60:02d}m"


def _n(x: float) -> str:
    return f"{x:.0f}" if float(x).is_integer() else f"{x:.3g}"


def _health(frame: Frame) -> list[tuple[str, str, bool]]:
    """(name, value, bad) items of the health line; bad ones are highlighted."""
    items: list[tuple[str, str, bool]] = []
    m = frame.metrics
    if m is not None:
        v, inc = m.values, m.increase
        for key, name in (
            ("kernel_drops", "kernel drops"),
            ("queue_drops", "queue drops"),
            ("otlp_dropped", "OTLP drops"),
            ("otlp_failures", "OTLP failures"),
        ):
            if key not in v:
                continue
            total = v[key]
            recent = f" (+{_n(inc[key])}/min)" if inc is not None else ""
            items.append((name, f"{_n(total)}{recent}", total > 0))
        if "queue_depth" in v:
            items.append(("queue", _n(v["queue_depth"]), False))
        if "flush_age" in v:
            items.append(("last flush", f"{v['flush_age']:.1f}s ago", v["flush_age"] > 30))
        if "sample_rate" in v:
            items.append(("sample rate", f"{v['sample_rate']:.0%}", v["sample_rate"] < 1))
        if "open_connections" in v:
            items.append(("connections", _n(v["open_connections"]), False))
    errors = sum(frame.errors.values())
    detail = ", ".join(f"{s} {n}" for s, n in sorted(frame.errors.items()))
    items.append(
        (
            f"errors ({frame.window:.0f} s)",
            f"{errors}" + (f" ({detail})" if detail else ""),
            errors > 0,
        )
    )
    return items


def _title(frame: Frame, view: View) -> str:
    clock = datetime.fromtimestamp(frame.now).strftime("%H:%M:%S")
    node = f" · node {frame.node}" if frame.node else ""
    if frame.metrics is not None:
        metrics = f" · metrics {frame.metrics.url}"
    elif frame.metrics_error is not None:
        metrics = " · metrics unreachable"
    else:
        metrics = " · no metrics (--metrics HOST:PORT)"
    shown = f" · filter {view.filter!r}" if view.filter else ""
    return f"sparseety top · {frame.source}{node}{metrics} · {clock}{shown}"


def _open_table(frame: Frame, view: View, max_rows: int | None, plain: bool) -> Any:
    from rich import box
    from rich.table import Table

    rows = view.rows(frame.open)
    arrow = "▲" if view.reverse else "▼"
    if plain:
        arrow = "(reversed)" if view.reverse else ""
    title = f"open streams: {len(rows)}" + (f" of {len(frame.open)}" if view.filter else "")
    title += f" · sort {view.sort} {arrow}".rstrip()
    t = Table(
        title=title,
        title_justify="left",
        box=None if plain else box.SIMPLE_HEAD,
        pad_edge=False,
        expand=False,
    )
    for name, justify in (
        ("id", "right"),
        ("label", "left"),
        ("model", "left"),
        ("age", "right"),
        ("chunks", "right"),
        ("tok/s", "right"),
        ("ttft ms", "right"),
    ):
        style = "bold" if name.split()[0] == view.sort.split()[0] and not plain else None
        t.add_column(name, justify=justify, header_style=style, no_wrap=True)  # type: ignore[arg-type]
    shown = rows if max_rows is None else rows[:max_rows]
    for r in shown:
        t.add_row(
            str(r.id),
            r.label,
            r.model,
            _age(r.age),
            str(r.chunks),
            _rate(r.tokens_per_s),
            _ms(r.ttft),
        )
    if len(shown) < len(rows):
        t.caption = f"… {len(rows) - len(shown)} more"
    return t


def _label_table(frame: Frame, plain: bool) -> Any:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    t = Table(
        title=f"per label, last {frame.window:.0f} s (p50/p90/p99)",
        title_justify="left",
        box=None if plain else box.SIMPLE_HEAD,
        pad_edge=False,
    )
    for name in (
        "label",
        "streams/s",
        "streams",
        "incomplete",
        "ttft ms",
        "itl ms",
        "tok/s",
    ):
        t.add_column(name, justify="left" if name == "label" else "right", no_wrap=True)
    for r in frame.labels:
        bad = {s: n for s, n in sorted(r.states.items()) if s != "complete"}
        incomplete = Text(
            ", ".join(f"{s} {n}" for s, n in bad.items()) or "0",
            style="bold red" if bad and not plain else "",
        )
        tps = "-" if r.tokens_per_s is None else "/".join(f"{v:.0f}" for v in r.tokens_per_s)
        t.add_row(
            r.label,
            f"{r.per_second:.2f}",
            str(r.streams),
            incomplete,
            _qs(r.ttft),
            _qs(r.itl),
            tps,
        )
    if not frame.labels:
        t.add_row("(no stream closed in the last minute)", "", "", "", "", "", "")
    return t


def render(
    frame: Frame,
    view: View,
    *,
    height: int | None = None,
    width: int = 120,
    plain: bool = False,
) -> Any:
    """One frame as a rich renderable (``plain``: no colour nor box lines)."""
    from rich.console import Group
    from rich.text import Text

    parts: list[Any] = [Text(_title(frame, view), style="" if plain else "bold")]
    # the health items, packed into lines of the width (an item is never split)
    line = Text()
    for name, value, bad in _health(frame):
        item = f"{name} {value}"
        if line.plain and len(line.plain) + 3 + len(item) > width:
            parts.append(line)
            line = Text()
        if line.plain:
            line.append(" · ")
        line.append(f"{name} ")
        line.append(value, style="bold red" if bad and not plain else "")
    parts.append(line)
    if frame.metrics_error:
        parts.append(Text(f"metrics: {frame.metrics_error}", style="" if plain else "yellow"))
    labels = _label_table(frame, plain)
    max_rows = None
    if height is not None:
        # what the other parts take: title, health, blank lines, the label
        # table (title, header, rows), the open table's title and header, keys
        used = len(parts) + 4 + len(frame.labels) + 1 + 4 + 2
        max_rows = max(1, height - used)
    parts += [Text(""), _open_table(frame, view, max_rows, plain), Text(""), labels]
    if not plain:
        editing = view.editing
        keys = f"filter: {editing}_  (enter apply · esc cancel)" if editing is not None else KEYS
        parts.append(Text(keys, style="dim"))
    return Group(*parts)


def render_plain(frame: Frame, view: View, width: int = 120) -> str:
    """One frame as plain text (what ``--once`` prints when stdout is not a terminal)."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, no_color=True, color_system=None, highlight=False)
    console.print(render(frame, view, width=width, plain=True))
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


# ---------------------------------------------------------------- terminal


@contextlib.contextmanager
def _cbreak(fd: int) -> Iterator[None]:
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _read_keys(fd: int, timeout: float) -> list[str] | None:
    """The keys typed within ``timeout`` seconds (None: none). Several keys may
    come in one read (a paste, tmux send-keys); an escape sequence (arrows,
    function keys) is dropped whole; end of input reads as ``q``."""
    ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
    if not ready:
        return None
    data = os.read(fd, 256).decode("utf-8", "replace")
    if not data:
        return ["q"]
    keys: list[str] = []
    i = 0
    while i < len(data):
        ch = data[i]
        if ch == "\x1b" and i + 1 < len(data) and data[i + 1] in "[O":
            i += 2
            while i < len(data) and not ("@" <= data[i] <= "~"):
                i += 1  # parameters of the sequence, up to its final byte
            i += 1
            continue
        keys.append(ch)
        i += 1
    return keys


def run(
    source: TopSource,
    view: View,
    *,
    console: Console | None = None,
    interval: float = 1.0,
    max_frames: int | None = None,
) -> int:
    """The live view on the terminal until ``q`` (or ``max_frames``); frames shown."""
    from rich.console import Console
    from rich.live import Live

    console = console or Console()
    fd = sys.stdin.fileno()
    shown = 0
    with _cbreak(fd), Live(console=console, screen=True, auto_refresh=False) as live:
        while max_frames is None or shown < max_frames:
            started = time.monotonic()
            frame = source.frame()
            live.update(_fit(frame, view, console), refresh=True)
            shown += 1
            if shown == 1:
                source.warm()  # after the first frame: the screen is not blank meanwhile
            while True:
                left = interval - (time.monotonic() - started)
                keys = _read_keys(fd, left)
                if keys is None:
                    if time.monotonic() - started >= interval:
                        break
                    continue
                for key in keys:
                    if view.handle(key):
                        return shown
                live.update(_fit(frame, view, console), refresh=True)
    return shown


def _fit(frame: Frame, view: View, console: Console) -> RenderableType:
    size = console.size
    return render(frame, view, height=size.height, width=size.width)
