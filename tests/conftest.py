"""Shared fixtures: a throwaway PostgreSQL server for the tests that check the
store works there too (DESIGN: the same SQLAlchemy models on SQLite and
PostgreSQL).

``SPARSEETY_TEST_PG_URL`` points the tests at an existing server. Otherwise,
as root on a machine with Debian's ``postgresql`` package (``make test``
installs it), a private server is started in a temporary directory, listening
only on a Unix socket, as the ``postgres`` user, and stopped at the end.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest


def _pg_bin() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def _why_no_pg() -> str | None:
    if os.environ.get("SPARSEETY_TEST_PG_URL"):
        return None
    if _pg_bin() is None:
        return "no PostgreSQL server binaries (apt-get install postgresql; make test does)"
    if os.geteuid() != 0:
        return "starting a throwaway PostgreSQL server needs root (runuser -u postgres)"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install 'psycopg[binary]')"
    return None


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A PostgreSQL SQLAlchemy URL with an empty database; skips with the reason if none."""
    url = os.environ.get("SPARSEETY_TEST_PG_URL")
    if url:
        yield url
        return
    why = _why_no_pg()
    if why is not None:
        pytest.skip(why)
    bindir = _pg_bin()
    assert bindir is not None
    base = tempfile.mkdtemp(prefix="sparseety-pg-")
    os.chmod(base, 0o755)
    data, sock = os.path.join(base, "data"), os.path.join(base, "sock")
    os.mkdir(sock)
    shutil.chown(base, "postgres")
    shutil.chown(sock, "postgres")

    def as_pg(*cmd: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *cmd],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=120,
        )

    as_pg(f"{bindir}/initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync")
    as_pg(
        f"{bindir}/pg_ctl",
        "-D",
        data,
        "-w",
        "-t",
        "60",
        "-l",
        os.path.join(base, "log"),
        "-o",
        f"-c listen_addresses='' -c unix_socket_directories='{sock}' -c fsync=off",
        "start",
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(sock, ".s.PGSQL.5432")):
            if time.monotonic() > deadline:
                raise RuntimeError("PostgreSQL did not open its socket")
            time.sleep(0.1)
        yield f"postgresql+psycopg://postgres@/postgres?host={sock}"
    finally:
        subprocess.run(
            [
                "runuser",
                "-u",
                "postgres",
                "--",
                f"{bindir}/pg_ctl",
                "-D",
                data,
                "-m",
                "fast",
                "stop",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def fresh_pg_url(pg_url: str) -> Iterator[str]:
    """A new, empty database on the test PostgreSQL server (dropped afterwards)."""
    import uuid

    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    dsn = pg_url.replace("postgresql+psycopg://", "postgresql://", 1)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    base, _, query = pg_url.partition("?")
    url = f"{base.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")
    try:
        yield url
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
