"""Signals of the live daemon: SIGTERM/SIGINT ask it to stop, SIGHUP to reload.

The handlers only call the callbacks they are given (which set flags the main
loop acts on); nothing else runs in signal context.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["HANDLED", "install"]

#: The signals the daemon handles.
HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def install(on_stop: Callable[[], None], on_reload: Callable[[], None]) -> Callable[[], None]:
    """Route SIGTERM/SIGINT to ``on_stop`` and SIGHUP to ``on_reload`` (main thread
    only). Returns a function that puts the previous handlers back."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            on_reload()
        else:
            on_stop()

    old: list[tuple[int, Any]] = [(sig, signal.signal(sig, handler)) for sig in HANDLED]

    def restore() -> None:
        for sig, previous in old:
            with contextlib.suppress(Exception):
                signal.signal(sig, previous)

    return restore
