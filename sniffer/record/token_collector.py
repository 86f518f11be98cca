"""Collect what the token layer needs from the store events, before redaction.

Token counts and ids must be computed on the text the server sent, while
what is written may be redacted (or, for unsampled streams, not written at
all). So the drivers (replay, daemon) feed every batch of store events to a
``TokenCollector`` *before* the transform; it keeps each open stream's chunk
texts (capped) and, when the stream closes, turns them into a
``tokens.StreamInput`` ready for ``tokenize_pass.tokenize_inputs``.

Pure: no I/O, no clock, no tokenizer call (that happens off the capture path).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from typing import Any

from sniffer.core.events import NOT_LLM, ChunkEvent, StoreEvent, StreamClosed, StreamOpened
from sniffer.llm.tokens import ChunkInput, StreamInput


class _Open:
    __slots__ = ("chunks", "model", "request", "truncated")

    def __init__(self, model: str | None, request: dict[str, Any]) -> None:
        self.model = model
        self.request = request
        self.chunks: list[ChunkInput] = []
        self.truncated = False


class TokenCollector:
    """Open LLM streams' chunk texts; closed streams' ``StreamInput``s, in order."""

    def __init__(self, *, max_open: int = 100_000, max_chunks: int = 200_000) -> None:
        self._open: dict[int, _Open] = {}
        self._ready: deque[StreamInput] = deque()
        self._max_open = max_open
        self._max_chunks = max_chunks
        self.dropped_streams = 0  # not tracked: too many open at once
        self.capped_streams = 0  # more chunks than max_chunks: the rest not tokenized

    def observe(self, events: Iterable[StoreEvent]) -> None:
        opened = self._open
        for ev in events:
            t = type(ev)
            if t is ChunkEvent:
                assert isinstance(ev, ChunkEvent)
                s = opened.get(ev.stream)
                if s is None:
                    continue
                if len(s.chunks) >= self._max_chunks:
                    if not s.truncated:
                        s.truncated = True
                        self.capped_streams += 1
                    continue
                s.chunks.append(
                    ChunkInput(ev.seq, ev.choice, ev.text, ev.finish_reason, ev.logprobs)
                )
            elif t is StreamOpened:
                assert isinstance(ev, StreamOpened)
                if ev.dialect == NOT_LLM:
                    continue
                if len(opened) >= self._max_open:
                    self.dropped_streams += 1
                    continue
                request = _json(ev.request_body)
                model = ev.request.get("model")
                opened[ev.stream] = _Open(
                    model if isinstance(model, str) else None,
                    request if isinstance(request, dict) else {},
                )
            elif t is StreamClosed:
                assert isinstance(ev, StreamClosed)
                s = opened.pop(ev.stream, None)
                if s is None:
                    continue
                usage = _json(ev.usage)
                so = s.request.get("stream_options")
                self._ready.append(
                    StreamInput(
                        stream_id=ev.stream,
                        model=s.model,
                        request=s.request,
                        chunks=s.chunks,
                        usage=usage if isinstance(usage, dict) else None,
                        gap=ev.gap or s.truncated,
                        done_seen=ev.done_seen,
                        include_usage_requested=isinstance(so, dict)
                        and so.get("include_usage") is True,
                    )
                )

    def take(self, limit: int | None = None) -> list[StreamInput]:
        """Closed streams not yet taken, oldest first (at most ``limit``)."""
        out: list[StreamInput] = []
        ready = self._ready
        while ready and (limit is None or len(out) < limit):
            out.append(ready.popleft())
        return out

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def open_streams(self) -> int:
        return len(self._open)


def _json(text: str | None) -> Any:
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None
