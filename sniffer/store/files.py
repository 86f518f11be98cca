"""Permissions of the SQLite database file and its -wal / -shm sidecars.

The database holds prompts and model output: it must not be readable by other
users. SQLite creates the ``-wal`` and ``-shm`` files with the permission bits
(and, when running as root, the owner and group) of the main database file, so
the key step is to create the main file with mode 0600 (0640 plus a group for
a reader group) BEFORE SQLite opens it; :func:`secure_sidecars` then fixes any
sidecar that an older run or a different umask left behind.

Call order in the daemon and the CLI::

    prepare_db_file(path, group=cfg.group, allow_world_readable=flag)
    engine = make_engine(path)          # SQLite creates -wal/-shm from the main mode
    secure_sidecars(path, group=cfg.group)

An existing world-readable database is refused with :class:`InsecureDatabaseFile`
unless ``allow_world_readable`` (CLI ``--allow-world-readable``) is given.
"""

from __future__ import annotations

import grp
import os
import stat

#: Files SQLite keeps next to the database.
SIDECAR_SUFFIXES = ("-wal", "-shm", "-journal")

PRIVATE_MODE = 0o600
GROUP_MODE = 0o640


class InsecureDatabaseFile(Exception):
    """An existing database file is readable by every user."""


def db_path(url_or_path: str) -> str | None:
    """The file behind a SQLite URL or plain path; None for in-memory or non-SQLite."""
    if "://" not in url_or_path:
        return None if url_or_path in ("", ":memory:") else url_or_path
    if not url_or_path.startswith("sqlite"):
        return None
    rest = url_or_path.split("://", 1)[1]
    if not rest.startswith("/"):
        return None
    path = rest[1:].split("?", 1)[0]
    return None if path in ("", ":memory:") else path


def _gid(group: str) -> int:
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ValueError(f"unknown group {group!r} for the database file") from None


def _apply(path: str, mode: int, gid: int | None) -> None:
    if gid is not None:
        os.chown(path, -1, gid)
    os.chmod(path, mode)


def secure_sidecars(path: str, *, group: str | None = None) -> list[str]:
    """Set mode 0600 (0640 and the group, when given) on the existing ``-wal``,
    ``-shm`` and ``-journal`` files of ``path``; returns the files changed."""
    mode = GROUP_MODE if group else PRIVATE_MODE
    gid = _gid(group) if group else None
    changed: list[str] = []
    for suffix in SIDECAR_SUFFIXES:
        side = path + suffix
        try:
            st = os.stat(side)
        except FileNotFoundError:
            continue
        if stat.S_IMODE(st.st_mode) != mode or (gid is not None and st.st_gid != gid):
            _apply(side, mode, gid)
            changed.append(side)
    return changed


def prepare_db_file(
    path: str, *, group: str | None = None, allow_world_readable: bool = False
) -> None:
    """Create the database file with safe permissions, or check an existing one.

    Missing file: created empty (SQLite treats an empty file as a new
    database) with mode 0600, or 0640 and ``group`` (a name or a numeric gid);
    missing parent directories are created 0700 (0750 with a group).
    Existing file: refused with :class:`InsecureDatabaseFile` when it is
    world-readable, unless ``allow_world_readable``; otherwise its mode is set
    to 0600 / 0640 (a world-readable file that is allowed keeps its mode).
    Existing sidecars get the same treatment (:func:`secure_sidecars`).
    Example: ``prepare_db_file("/var/lib/sparseety/capture.db", group="sparseety-read")``.
    """
    mode = GROUP_MODE if group else PRIVATE_MODE
    gid = _gid(group) if group else None
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is None:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            os.makedirs(parent, mode=0o750 if group else 0o700, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:  # created meanwhile: check it like an existing one
            prepare_db_file(path, group=group, allow_world_readable=allow_world_readable)
            return
        try:
            if gid is not None:
                os.fchown(fd, -1, gid)
            os.fchmod(fd, mode)  # the umask may have removed bits of ``mode``
        finally:
            os.close(fd)
    else:
        if not stat.S_ISREG(st.st_mode):
            raise InsecureDatabaseFile(f"database path {path} is not a regular file")
        current = stat.S_IMODE(st.st_mode)
        if current & stat.S_IROTH:
            if not allow_world_readable:
                raise InsecureDatabaseFile(
                    f"database file {path} is world-readable (mode {current:04o}); it holds "
                    f"prompts and model output. Run `chmod {mode:04o} {path}` "
                    "or pass --allow-world-readable to use it as it is"
                )
        elif current != mode or (gid is not None and st.st_gid != gid):
            _apply(path, mode, gid)
    if st is not None and stat.S_IMODE(st.st_mode) & stat.S_IROTH:
        return  # allowed world-readable database: its sidecars follow it, not us
    secure_sidecars(path, group=group)


__all__ = [
    "GROUP_MODE",
    "PRIVATE_MODE",
    "SIDECAR_SUFFIXES",
    "InsecureDatabaseFile",
    "db_path",
    "prepare_db_file",
    "secure_sidecars",
]
