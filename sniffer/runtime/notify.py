"""systemd's notify protocol: readiness, status, reloading/stopping and the watchdog.

Best effort: without ``$NOTIFY_SOCKET`` (not under systemd) every call is a
no-op, and a failed send is never fatal.
"""

from __future__ import annotations

import os
import socket

__all__ = ["Notifier", "sd_notify"]


def sd_notify(state: str, socket_path: str | None = None) -> bool:
    """Send ``state`` (e.g. ``"READY=1"``) to systemd's notify socket.

    ``socket_path`` defaults to ``$NOTIFY_SOCKET``; a leading ``@`` means the
    abstract namespace. Returns False (and does nothing) when there is no
    socket or sending fails: notification is best effort, never fatal.
    """
    path = socket_path if socket_path is not None else os.environ.get("NOTIFY_SOCKET")
    if not path or not (path.startswith("/") or path.startswith("@")):
        return False
    addr = "\0" + path[1:] if path.startswith("@") else path
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(state.encode("utf-8", "replace"))
    except OSError:
        return False
    return True


class Notifier:
    """sd_notify for one daemon run: readiness, status and the watchdog.

    The watchdog interval comes from ``$WATCHDOG_USEC`` (honoured only when
    ``$WATCHDOG_PID`` is unset or this process); pings are sent at half of it.
    """

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.socket_path = env.get("NOTIFY_SOCKET") or None
        self.watchdog_interval: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        wpid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not wpid or wpid == str(os.getpid())):
            self.watchdog_interval = int(usec) / 1e6 / 2
        self._next_ping = 0.0
        self.sent = 0

    @property
    def enabled(self) -> bool:
        return self.socket_path is not None

    def notify(self, *states: str) -> bool:
        if self.socket_path is None:
            return False
        ok = sd_notify("\n".join(states), self.socket_path)
        self.sent += ok
        return ok

    def watchdog(self, now: float) -> None:
        """Ping the watchdog if it is due (``now`` is a monotonic time)."""
        if self.watchdog_interval is None or now < self._next_ping:
            return
        self._next_ping = now + self.watchdog_interval
        self.notify("WATCHDOG=1")
