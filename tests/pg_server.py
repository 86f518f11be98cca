"""A throwaway PostgreSQL server on a Unix socket, for the tests and benchmarks.

Needs root (the server runs as Debian's ``postgres`` user through ``runuser``)
and Debian's server binaries (``apt-get install postgresql``; ``make deps``
installs them). Nothing listens on TCP; the data directory is removed on exit.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager


def pg_bin() -> str | None:
    """The newest installed server's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def why_no_server() -> str | None:
    """Why :func:`throwaway_postgres` cannot start a server here, or None."""
    if pg_bin() is None:
        return "no PostgreSQL server binaries (apt-get install postgresql; make test does)"
    if os.geteuid() != 0:
        return "starting a throwaway PostgreSQL server needs root (runuser -u postgres)"
    return None


def _as_pg(*cmd: str, timeout: float = 120) -> None:
    subprocess.run(
        ["runuser", "-u", "postgres", "--", *cmd],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=timeout,
    )


@contextmanager
def throwaway_postgres(prefix: str = "sparseety-pg-", *options: str) -> Iterator[str]:
    """Start a server (``options``: extra ``-c name=value`` settings), yield its
    SQLAlchemy URL (database ``postgres``), stop it and remove its files."""
    why = why_no_server()
    if why is not None:
        raise RuntimeError(why)
    bindir = pg_bin()
    base = tempfile.mkdtemp(prefix=prefix)
    try:
        os.chmod(base, 0o755)
        data, sock = os.path.join(base, "data"), os.path.join(base, "sock")
        os.mkdir(sock)
        shutil.chown(base, "postgres")
        shutil.chown(sock, "postgres")
        _as_pg(f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
        opts = " ".join([f"-c listen_addresses='' -c unix_socket_directories='{sock}'", *options])
        log = os.path.join(base, "log")
        _as_pg(f"{bindir}/pg_ctl", "-D", data, "-w", "-t", "60", "-l", log, "-o", opts, "start")
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(os.path.join(sock, ".s.PGSQL.5432")):
                if time.monotonic() > deadline:
                    raise RuntimeError("PostgreSQL did not open its socket")
                time.sleep(0.1)
            yield f"postgresql+psycopg://postgres@/postgres?host={sock}"
        finally:
            # the server may already be gone; its files go anyway
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                _as_pg(f"{bindir}/pg_ctl", "-D", data, "-m", "fast", "stop", timeout=60)
    finally:
        shutil.rmtree(base, ignore_errors=True)
