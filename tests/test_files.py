"""Database file permissions: creation mode, sidecars SQLite creates, refusal."""

from __future__ import annotations

import grp
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from sniffer.core.events import ConnectionOpened, StreamOpened
from sniffer.store.files import (
    InsecureDatabaseFile,
    db_path,
    prepare_db_file,
    secure_sidecars,
)
from sniffer.store.writer import StoreWriter

T0 = 1_700_000_000.0


def mode_of(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(params=[0o022, 0o077, 0o000], ids=["umask022", "umask077", "umask000"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def other_group() -> grp.struct_group:
    """A group that is not the current process's primary group."""
    mine = os.getgid()
    for g in grp.getgrall():
        if g.gr_gid != mine:
            return g
    pytest.skip("no second group on this system")


def write_some(path: Path) -> StoreWriter:
    w = StoreWriter(str(path))
    w.write(ConnectionOpened(1, T0, ("127.0.0.1", 40000), ("127.0.0.1", 8000), True))
    w.write(
        StreamOpened(1, 1, 0, T0, ("127.0.0.1", 40000), ("127.0.0.1", 8000), "POST", "/", (), "{}")
    )
    w.flush()
    return w


def test_new_database_and_sqlite_sidecars_are_private(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "sub" / "capture.db"
    prepare_db_file(str(path))
    assert mode_of(path) == 0o600
    assert mode_of(path.parent) & 0o077 == 0
    w = write_some(path)
    try:
        for name in ("capture.db", "capture.db-wal", "capture.db-shm"):
            p = path.parent / name
            assert p.exists(), name
            assert mode_of(p) == 0o600, (name, oct(mode_of(p)))
    finally:
        w.close()


def test_group_mode_and_owner_follow_to_sidecars(tmp_path: Path, umask: int) -> None:
    g = other_group()
    path = tmp_path / "capture.db"
    prepare_db_file(str(path), group=g.gr_name)
    assert mode_of(path) == 0o640
    assert os.stat(path).st_gid == g.gr_gid
    w = write_some(path)
    try:
        # SQLite itself gives the sidecars the main file's mode (and group, as root).
        for suffix in ("-wal", "-shm"):
            assert mode_of(f"{path}{suffix}") == 0o640, suffix
            if os.geteuid() == 0:
                assert os.stat(f"{path}{suffix}").st_gid == g.gr_gid, suffix
        secure_sidecars(str(path), group=g.gr_name)
        for suffix in ("", "-wal", "-shm"):
            p = f"{path}{suffix}"
            assert mode_of(p) == 0o640, (suffix, oct(mode_of(p)))
            assert os.stat(p).st_gid == g.gr_gid, suffix
    finally:
        w.close()


def test_numeric_group_and_unknown_group(tmp_path: Path) -> None:
    g = other_group()
    path = tmp_path / "a.db"
    prepare_db_file(str(path), group=str(g.gr_gid))
    assert os.stat(path).st_gid == g.gr_gid
    with pytest.raises(ValueError, match="unknown group 'no-such-group-xyz'"):
        prepare_db_file(str(tmp_path / "b.db"), group="no-such-group-xyz")


def test_world_readable_existing_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "capture.db"
    path.write_bytes(b"")
    os.chmod(path, 0o644)
    with pytest.raises(InsecureDatabaseFile) as info:
        prepare_db_file(str(path))
    msg = str(info.value)
    assert str(path) in msg and "0644" in msg and "--allow-world-readable" in msg
    assert mode_of(path) == 0o644  # refused: untouched
    # Allowed: the file keeps its mode.
    prepare_db_file(str(path), allow_world_readable=True)
    assert mode_of(path) == 0o644


def test_existing_private_file_and_stale_sidecars_are_tightened(tmp_path: Path) -> None:
    path = tmp_path / "capture.db"
    path.write_bytes(b"")
    os.chmod(path, 0o660)
    for suffix, m in (("-wal", 0o644), ("-shm", 0o666)):
        Path(f"{path}{suffix}").write_bytes(b"")
        os.chmod(f"{path}{suffix}", m)
    prepare_db_file(str(path))
    assert mode_of(path) == 0o600
    assert mode_of(f"{path}-wal") == 0o600
    assert mode_of(f"{path}-shm") == 0o600
    assert secure_sidecars(str(path)) == []  # nothing left to fix


def test_secure_sidecars_reports_what_it_changed(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    Path(f"{path}-wal").write_bytes(b"")
    os.chmod(f"{path}-wal", 0o644)
    assert secure_sidecars(str(path)) == [f"{path}-wal"]
    assert mode_of(f"{path}-wal") == 0o600


def test_not_a_regular_file(tmp_path: Path) -> None:
    d = tmp_path / "dir.db"
    d.mkdir()
    os.chmod(d, 0o700)
    with pytest.raises(InsecureDatabaseFile, match="not a regular file"):
        prepare_db_file(str(d))


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("capture.db", "capture.db"),
        ("/var/lib/s/capture.db", "/var/lib/s/capture.db"),
        ("sqlite:///capture.db", "capture.db"),
        ("sqlite:////var/lib/s/c.db", "/var/lib/s/c.db"),
        ("sqlite:////var/lib/s/c.db?timeout=5", "/var/lib/s/c.db"),
        ("sqlite://", None),
        ("sqlite:///:memory:", None),
        (":memory:", None),
        ("postgresql+psycopg://u@h/db", None),
    ],
)
def test_db_path(url: str, path: str | None) -> None:
    assert db_path(url) == path
