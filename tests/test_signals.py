"""Signal routing of the live daemon (sniffer.runtime.signals)."""

from __future__ import annotations

import os
import signal

from sniffer.runtime import signals


def test_signals_call_their_callbacks_and_restore_puts_the_old_handlers_back() -> None:
    calls: list[str] = []
    before = {sig: signal.getsignal(sig) for sig in signals.HANDLED}
    restore = signals.install(lambda: calls.append("stop"), lambda: calls.append("reload"))
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
    finally:
        restore()
    assert calls == ["reload", "stop", "stop"]
    assert {sig: signal.getsignal(sig) for sig in signals.HANDLED} == before
