"""The daemon's log: logfmt lines on stderr (``level=info event=capture-active iface=lo …``).

Under systemd (``$JOURNAL_STREAM`` set) each line starts with a ``<N>`` syslog
priority and carries no timestamp (journald adds one).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from typing import Any, TextIO

__all__ = ["Log", "warn_pure_fallback"]

_LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_SYSLOG = {"debug": 7, "info": 6, "warning": 4, "error": 3}


def _fmt_value(value: Any) -> str:
    s = value if isinstance(value, str) else str(value)
    if s and not any(c in s for c in ' ="\\') and s.isprintable():
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class Log:
    """logfmt lines to a stream (stderr): ``level=… event=… key=value …``."""

    def __init__(self, level: str = "info", stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.journal = bool(os.environ.get("JOURNAL_STREAM"))
        self.level = level
        self._lock = threading.Lock()

    @property
    def level(self) -> str:
        return self._level

    @level.setter
    def level(self, value: str) -> None:
        self._level = value
        self._threshold = _LEVELS.get(value, 20)

    def __call__(self, level: str, event: str, **fields: Any) -> None:
        if _LEVELS[level] < self._threshold:
            return
        parts = [] if self.journal else [f"ts={time.strftime('%Y-%m-%dT%H:%M:%S%z')}"]
        parts += [f"level={level}", f"event={event}"]
        parts += [f"{k}={_fmt_value(v)}" for k, v in fields.items() if v is not None]
        line = " ".join(parts)
        if self.journal:
            line = f"<{_SYSLOG[level]}>{line}"
        with self._lock, contextlib.suppress(Exception):
            self.stream.write(line + "\n")
            self.stream.flush()


_fallback_warned = False


def warn_pure_fallback(log: Log | None = None) -> None:
    """One warning line per process when the native core cannot be imported
    (the pure-Python stages run instead); nothing when it runs or when
    ``SPARSEETY_PURE`` chose the pure core."""
    global _fallback_warned
    from sniffer.core.native import UNAVAILABLE

    if UNAVAILABLE is None or _fallback_warned:
        return
    _fallback_warned = True
    (log or Log("warning"))("warning", "native-core-unavailable", core="pure", error=UNAVAILABLE)
