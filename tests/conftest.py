"""Shared fixtures: a throwaway PostgreSQL server for the tests that check the
store works there too (DESIGN: the same SQLAlchemy models on SQLite and
PostgreSQL); and the rule that CI runs every test.

Tests that need something a developer's machine may lack carry a marker:
``root`` (packet sockets, BPF), ``ebpf`` (loading the eBPF capture program) or
``postgres`` (given automatically to every test that uses ``pg_url``) or
``native`` (the native core, ``sniffer._native``). Where
that need cannot be met they are skipped with the reason — except when the
environment variable ``CI`` is true (``.ci/run`` sets it): there a test with one
of these markers that is skipped before it runs (a ``skipif`` mark, a fixture
that skips) FAILS instead, with the reason, because a CI run that silently
skips the live-capture, eBPF and PostgreSQL tests proves nothing about them.
Skips a test decides while it runs (a kernel feature it probes, no IPv6) stay
skips everywhere.

``SPARSEETY_TEST_PG_URL`` points the tests at an existing server. Otherwise,
as root on a machine with Debian's ``postgresql`` package (``make test``
installs it), a private server is started in a temporary directory, listening
only on a Unix socket, as the ``postgres`` user, and stopped at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

#: Hypothesis times nothing here (tests never time anything; benchmarks live in
#: bench/): CI runs the suite on a loaded 2-core machine, where one example
#: descheduled, or caught by a full collection of the test process, takes past
#: the 200 ms default deadline and fails as "Unreliable test timings", and the
#: first examples' generation can take past the too_slow health check's second.
#: Loaded here, before the test modules: their @settings inherit it.
settings.register_profile("sparseety", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("sparseety")

#: Marker → what the marked tests need, for the CI failure message.
REQUIREMENTS = {
    "root": "root (packet sockets, BPF)",
    "ebpf": "the eBPF capture program",
    "postgres": "a PostgreSQL server",
    "native": "the native core (sniffer._native: pip install . or -e . builds it where cargo is)",
}


def in_ci() -> bool:
    """``CI`` is set to a true value (GitHub Actions, GitLab CI and ``.ci/run`` set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "pg_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if report.when != "setup" or not report.skipped or not in_ci():
        return
    needs = [what for name, what in REQUIREMENTS.items() if item.get_closest_marker(name)]
    if not needs:
        return
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    report.outcome = "failed"
    report.longrepr = (
        f"CI is set, and this test needs {' and '.join(needs)}, which it cannot have here "
        f"({reason.removeprefix('Skipped: ')}). In CI it must run, not be skipped: run the "
        "suite as root after 'make deps' (make test does both)."
    )


def _why_no_pg() -> str | None:
    if os.environ.get("SPARSEETY_TEST_PG_URL"):
        return None
    # imported here: tests/test_ci_rule.py runs a copy of this file on its own
    from tests.pg_server import why_no_server

    why = why_no_server()
    if why is not None:
        return why
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
    from tests.pg_server import throwaway_postgres

    with throwaway_postgres("sparseety-pg-", "-c fsync=off") as server:
        yield server


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
