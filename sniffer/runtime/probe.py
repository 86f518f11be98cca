"""An active, bounded load generator for when there is no organic traffic.

``probe`` sends each prompt of a prompt file ``repeat`` times to one or more
OpenAI-compatible URLs, streaming, and reads the answers. It only sends: the
sniffer (``sparseety run`` or a capture replayed later) records the traffic.
It also keeps what it received, so on its own it reports output stability per
URL and prompt, and whether the URLs agree.

Bounds: at most ``max_requests`` requests in total (a larger plan is refused
with :class:`ProbeError` before anything is sent), a per-request ``timeout``,
and a ``deadline`` (seconds) after which no new request starts. Requests go out
in rounds (repeat → prompt → URL), so that every URL sees every prompt early.

Prompt files: JSON Lines or plain text, one prompt per line (blank lines and,
in plain text, lines starting with ``#`` skipped). A JSONL line is a string (a
user message), or an object with ``messages`` (chat) or ``prompt``
(completions) and optionally other request fields (``max_tokens``, ``seed``,
…) that override the command-line defaults. The file is JSONL when every
non-blank line is a JSON string or object.

Stream parsing reuses the sniffer's own sans-IO stages: the WHATWG SSE decoder
and the OpenAI dialect.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from sniffer.core.sse import SseDecoder
from sniffer.llm.dialects.base import CONTENT, ERROR, INVALID, OUTPUT_KINDS
from sniffer.llm.dialects.openai import OpenAIChat, OpenAICompletions

__all__ = [
    "MAX_REQUESTS",
    "ProbeConfig",
    "ProbeError",
    "ProbeRequest",
    "ProbeResult",
    "ProbeRun",
    "StreamParser",
    "endpoint_url",
    "format_probe",
    "load_prompts",
    "parse_prompts",
    "plan_requests",
    "probe_summary",
    "run_probe",
]

#: Default cap on the total number of requests of one probe run.
MAX_REQUESTS = 10_000
#: Characters of an error body kept.
MAX_ERROR_BODY = 2000


class ProbeError(Exception):
    """A probe that cannot run: bad prompt file, plan over the cap, bad URL."""


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    urls: tuple[str, ...]
    model: str
    repeat: int = 1
    concurrency: int = 1
    max_tokens: int | None = None
    temperature: float | None = 0.0
    timeout: float = 60.0
    deadline: float | None = None  # seconds from start; no request starts after it
    max_requests: int = MAX_REQUESTS


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    url: str  # the full endpoint URL
    base: str  # the URL as given
    prompt_index: int
    repeat: int
    body: dict[str, Any]


@dataclass(slots=True)
class ProbeResult:
    request: ProbeRequest
    status: int | None = None
    text: str = ""
    chunks: int = 0  # events that carried output
    finish_reason: str | None = None
    ttft: float | None = None  # seconds to the first output chunk
    elapsed: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200


@dataclass(slots=True)
class ProbeRun:
    results: list[ProbeResult]
    planned: int
    skipped: int  # not started: deadline passed
    seconds: float
    prompts: list[str] = field(default_factory=list)  # previews, by prompt index


# ---------------------------------------------------------------------------
# Prompts and plan (pure)
# ---------------------------------------------------------------------------


def _as_request(item: Any, lineno: int) -> dict[str, Any]:
    if isinstance(item, str):
        return {"messages": [{"role": "user", "content": item}]}
    if isinstance(item, dict):
        if isinstance(item.get("messages"), list) or isinstance(item.get("prompt"), str | list):
            return dict(item)
        raise ProbeError(f"line {lineno}: an object needs 'messages' (a list) or 'prompt'")
    raise ProbeError(f"line {lineno}: expected a JSON string or object")


def parse_prompts(text: str) -> list[dict[str, Any]]:
    """Prompt file text → request fragments (``messages`` or ``prompt`` plus overrides)."""
    lines = [(i, ln) for i, ln in enumerate(text.splitlines(), 1) if ln.strip()]
    parsed: list[tuple[int, Any]] = []
    jsonl = bool(lines)
    for i, ln in lines:
        s = ln.strip()
        if not s.startswith(("{", '"')):
            jsonl = False
            break
        try:
            parsed.append((i, json.loads(s)))
        except ValueError:
            jsonl = False
            break
    if jsonl:
        return [_as_request(item, i) for i, item in parsed]
    return [
        {"messages": [{"role": "user", "content": ln.strip()}]}
        for _, ln in lines
        if not ln.lstrip().startswith("#")
    ]


def load_prompts(path: str | Path) -> list[dict[str, Any]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProbeError(f"{path}: {exc}") from exc
    prompts = parse_prompts(text)
    if not prompts:
        raise ProbeError(f"{path}: no prompts")
    return prompts


def endpoint_url(base: str, chat: bool) -> str:
    """The endpoint for a base URL: kept when it already names ``…/completions``,
    else ``/v1/chat/completions`` (``/v1/completions`` for prompts) is appended
    (after ``/v1`` when the URL ends there)."""
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ProbeError(f"{base!r} is not an http(s) URL")
    path = parts.path.rstrip("/")
    if path.endswith("/completions"):
        return base
    tail = "chat/completions" if chat else "completions"
    path = f"{path}/{tail}" if path.endswith("/v1") else f"{path}/v1/{tail}"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def plan_requests(prompts: Sequence[dict[str, Any]], config: ProbeConfig) -> list[ProbeRequest]:
    """Every request of the run, in sending order (repeat → prompt → URL)."""
    if not config.urls:
        raise ProbeError("no URL given")
    if config.repeat < 1:
        raise ProbeError("repeat must be >= 1")
    total = len(prompts) * config.repeat * len(config.urls)
    if total > config.max_requests:
        raise ProbeError(
            f"{total} requests planned, more than the cap of {config.max_requests} "
            "(raise --max-requests)"
        )
    bodies: list[tuple[dict[str, Any], bool]] = []
    for p in prompts:
        body: dict[str, Any] = {"model": config.model}
        if config.temperature is not None:
            body["temperature"] = config.temperature
        if config.max_tokens is not None:
            body["max_tokens"] = config.max_tokens
        body.update(p)
        body["stream"] = True
        bodies.append((body, "messages" in p))
    endpoints = {(u, chat): endpoint_url(u, chat) for u in config.urls for chat in (True, False)}
    out: list[ProbeRequest] = []
    for r in range(config.repeat):
        for i, (body, chat) in enumerate(bodies):
            for u in config.urls:
                out.append(ProbeRequest(endpoints[(u, chat)], u, i, r, body))
    return out


def prompt_preview(fragment: dict[str, Any], width: int = 60) -> str:
    if "messages" in fragment:
        msgs = fragment["messages"]
        last = msgs[-1] if msgs else {}
        content = last.get("content") if isinstance(last, dict) else last
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    else:
        p = fragment.get("prompt")
        text = p if isinstance(p, str) else json.dumps(p, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# ---------------------------------------------------------------------------
# Stream parsing (sans-IO)
# ---------------------------------------------------------------------------


class StreamParser:
    """Response body bytes → output text, chunk count, finish reason, first-output time.

    ``feed(data, now)``: ``now`` is the caller's clock reading when ``data``
    arrived (this class reads no clock).
    """

    def __init__(self, chat: bool = True) -> None:
        self._sse = SseDecoder()
        self._dialect = OpenAIChat() if chat else OpenAICompletions()
        self._parts: list[str] = []
        self.chunks = 0
        self.finish_reason: str | None = None
        self.first_output: float | None = None
        self.error: str | None = None

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def feed(self, data: bytes, now: float) -> None:
        for ev in self._sse.feed(data):
            self._event(ev.data, ev.event, now)

    def close(self, now: float) -> None:
        for ev in self._sse.close():
            self._event(ev.data, ev.event, now)

    def _event(self, data: str, event: str, now: float) -> None:
        for d in self._dialect.event(data, event):
            if d.kind in OUTPUT_KINDS:
                if self.first_output is None:
                    self.first_output = now
                self.chunks += 1
            if d.kind == CONTENT and d.choice == 0:
                self._parts.append(d.text)
            if d.finish_reason is not None and d.choice == 0 and self.finish_reason is None:
                self.finish_reason = d.finish_reason
            if d.kind in (ERROR, INVALID) and self.error is None:
                self.error = d.error or d.raw or d.kind


# ---------------------------------------------------------------------------
# Running (the I/O part)
# ---------------------------------------------------------------------------


def _send(client: httpx.Client, req: ProbeRequest, timeout: float) -> ProbeResult:
    res = ProbeResult(req)
    parser = StreamParser(chat="messages" in req.body)
    t0 = time.perf_counter()
    try:
        with client.stream("POST", req.url, json=req.body, timeout=timeout) as resp:
            res.status = resp.status_code
            if resp.status_code != 200:
                body = resp.read()[:MAX_ERROR_BODY].decode("utf-8", "replace")
                res.error = f"HTTP {resp.status_code}: {body.strip()[:200]}"
            else:
                for data in resp.iter_bytes():
                    parser.feed(data, time.perf_counter())
                    if time.perf_counter() - t0 > timeout:
                        res.error = f"timed out after {timeout:g} s"
                        break
                parser.close(time.perf_counter())
    except httpx.HTTPError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    res.elapsed = time.perf_counter() - t0
    res.text = parser.text
    res.chunks = parser.chunks
    res.finish_reason = parser.finish_reason
    if parser.first_output is not None:
        res.ttft = parser.first_output - t0
    if res.error is None and parser.error is not None:
        res.error = f"stream error: {parser.error}"
    return res


def run_probe(
    prompts: Sequence[dict[str, Any]],
    config: ProbeConfig,
    *,
    progress: Callable[[int, int], None] | None = None,
    client: httpx.Client | None = None,
) -> ProbeRun:
    """Send the planned requests with ``config.concurrency`` workers; returns
    every result in plan order. Stops starting requests at the deadline."""
    plan = plan_requests(prompts, config)
    workers = max(1, min(config.concurrency, 256))
    own = client is None
    http = client or httpx.Client(
        limits=httpx.Limits(max_connections=workers, max_keepalive_connections=workers),
        headers={"Accept": "text/event-stream"},
    )
    started = time.monotonic()
    results: dict[int, ProbeResult] = {}
    lock = threading.Lock()
    done = 0
    skipped = 0
    try:
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe") as pool:
            running: dict[Future[ProbeResult], int] = {}
            it: Iterable[tuple[int, ProbeRequest]] = enumerate(plan)
            pending = iter(it)
            exhausted = False
            while running or not exhausted:
                while not exhausted and len(running) < workers:
                    nxt = next(pending, None)
                    if nxt is None:
                        exhausted = True
                        break
                    if config.deadline is not None and time.monotonic() - started > config.deadline:
                        skipped = len(plan) - nxt[0]
                        exhausted = True
                        break
                    running[pool.submit(_send, http, nxt[1], config.timeout)] = nxt[0]
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    i = running.pop(fut)
                    with lock:
                        results[i] = fut.result()
                        done += 1
                    if progress is not None:
                        progress(done, len(plan))
    finally:
        if own:
            http.close()
    return ProbeRun(
        results=[results[i] for i in sorted(results)],
        planned=len(plan),
        skipped=skipped,
        seconds=time.monotonic() - started,
        prompts=[prompt_preview(p) for p in prompts],
    )


# ---------------------------------------------------------------------------
# Summary (pure)
# ---------------------------------------------------------------------------


def _first_diff(a: str, b: str) -> int | None:
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def probe_summary(run: ProbeRun) -> dict[str, Any]:
    """What probe received: per (URL, prompt) stability, and agreement across URLs."""
    groups: dict[tuple[str, int], list[ProbeResult]] = {}
    for r in run.results:
        groups.setdefault((r.request.base, r.request.prompt_index), []).append(r)
    rows: list[dict[str, Any]] = []
    modal: dict[int, dict[str, str]] = {}
    for (url, pi), rs in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ok = [r for r in rs if r.ok]
        counts = Counter(r.text for r in ok)
        ttfts = [r.ttft * 1000 for r in ok if r.ttft is not None]
        top = counts.most_common(1)[0][0] if counts else ""
        modal.setdefault(pi, {})[url] = top
        rows.append(
            {
                "url": url,
                "prompt_index": pi,
                "prompt": run.prompts[pi] if pi < len(run.prompts) else "",
                "requests": len(rs),
                "ok": len(ok),
                "errors": sorted({r.error for r in rs if r.error})[:3],
                "distinct_outputs": len(counts),
                "deterministic": len(counts) == 1,
                "modal_count": counts.most_common(1)[0][1] if counts else 0,
                "modal_preview": top[:120],
                "chunks_mean": statistics.fmean(r.chunks for r in ok) if ok else None,
                "ttft_ms_p50": statistics.median(ttfts) if ttfts else None,
                "finish_reasons": dict(Counter(r.finish_reason or "-" for r in ok)),
            }
        )
    across: list[dict[str, Any]] = []
    for pi, by_url in sorted(modal.items()):
        if len(by_url) < 2:
            continue
        urls = list(by_url)
        ref = by_url[urls[0]]
        across.append(
            {
                "prompt_index": pi,
                "agree": all(by_url[u] == ref for u in urls[1:]),
                "first_difference_char": {u: _first_diff(ref, by_url[u]) for u in urls[1:]},
            }
        )
    ok_all = sum(1 for r in run.results if r.ok)
    with_repeats = [r for r in rows if r["ok"] >= 2]
    return {
        "planned": run.planned,
        "sent": len(run.results),
        "ok": ok_all,
        "errors": len(run.results) - ok_all,
        "skipped_after_deadline": run.skipped,
        "seconds": run.seconds,
        "requests_per_second": len(run.results) / run.seconds if run.seconds > 0 else None,
        "deterministic_ratio": (
            sum(1 for r in with_repeats if r["deterministic"]) / len(with_repeats)
            if with_repeats
            else None
        ),
        "groups": rows,
        "across_urls": across,
    }


def format_probe(summary: dict[str, Any]) -> str:
    lines = [f"{'url':<28} {'#':>3} {'ok':>4} {'distinct':>8} {'chunks':>7} {'ttft_ms':>8}  prompt"]
    for g in summary["groups"]:
        ttft = "-" if g["ttft_ms_p50"] is None else f"{g['ttft_ms_p50']:.1f}"
        chunks = "-" if g["chunks_mean"] is None else f"{g['chunks_mean']:.1f}"
        lines.append(
            f"{g['url'][:28]:<28} {g['prompt_index']:>3} {g['ok']:>4} {g['distinct_outputs']:>8} "
            f"{chunks:>7} {ttft:>8}  {g['prompt']}"
        )
        for e in g["errors"]:
            lines.append(f"    error: {e}")
    for a in summary["across_urls"]:
        if not a["agree"]:
            where = ", ".join(
                f"{u}: char {c}" for u, c in a["first_difference_char"].items() if c is not None
            )
            lines.append(f"prompt {a['prompt_index']}: URLs disagree ({where})")
    det = summary["deterministic_ratio"]
    lines.append(
        f"{summary['sent']}/{summary['planned']} requests sent, {summary['ok']} ok, "
        f"{summary['errors']} errors, {summary['skipped_after_deadline']} skipped (deadline); "
        f"{summary['seconds']:.2f} s; deterministic (url, prompt) groups: "
        + ("-" if det is None else f"{100 * det:.1f}%")
    )
    return "\n".join(lines)
