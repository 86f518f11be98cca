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

import errno
import grp
import os
import stat

#: The files SQLite keeps beside a WAL-mode database while a connection has it open.
WAL_SUFFIXES = ("-wal", "-shm")
#: Files SQLite keeps next to the database.
SIDECAR_SUFFIXES = (*WAL_SUFFIXES, "-journal")

PRIVATE_MODE = 0o600
GROUP_MODE = 0o640


class InsecureDatabaseFile(Exception):
    """An existing database file is readable by every user (or its path is a symlink)."""


class SymlinkRefused(InsecureDatabaseFile):
    """A path the tool would create or write is a symbolic link."""

    def __init__(self, path: str, what: str = "path") -> None:
        super().__init__(f"{what} {path} is a symbolic link; refusing to follow it")


def _refuse_symlink(path: str, what: str) -> bool:
    """Raise :class:`SymlinkRefused` when ``path`` is a symlink; True when it exists."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    if stat.S_ISLNK(st.st_mode):
        raise SymlinkRefused(path, what)
    return True


def _create_private(path: str, mode: int, gid: int | None) -> bool:
    """Create ``path`` empty with ``mode`` (never through a symlink); False if it existed."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        os.makedirs(parent, mode=0o750 if gid is not None else 0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    except FileExistsError:
        _refuse_symlink(path, "database path")
        return False
    try:
        if gid is not None:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, mode)  # the umask may have removed bits of ``mode``
    finally:
        os.close(fd)
    return True


def ensure_db_file(path: str, *, group: str | None = None) -> None:
    """What every command that opens a SQLite file does first: refuse a symlink
    at the database path or at its ``-wal``/``-shm``/``-journal``, and create a
    missing database file 0600 (0640 and ``group``) before SQLite opens it, so
    that SQLite creates its sidecars with the same mode. An existing file is
    left as it is (``prepare_db_file`` is the daemon's stricter check)."""
    mode = GROUP_MODE if group else PRIVATE_MODE
    gid = _gid(group) if group else None
    for suffix in SIDECAR_SUFFIXES:
        _refuse_symlink(path + suffix, "database file")
    if not _refuse_symlink(path, "database path"):
        _create_private(path, mode, gid)


def cannot_write(path: str) -> bool:
    """Whether this process may not write the SQLite file ``path`` (or its existing
    ``-wal``/``-shm``): the store of another user, readable through a reader
    group (0640 and ``[files] group``) or by everyone (0644), a file on a
    read-only mount, a copy made read-only. The one test of it: the reading
    commands then open the file read-only (``sniffer.store.lite.read_only_uri``),
    the writing ones refuse it with one line (``sniffer.store.lite.ReadOnlyStore``).
    A missing file is not read-only (it is created). The effective ids decide,
    as for the open itself."""
    effective = os.access in os.supports_effective_ids
    return any(
        os.path.exists(p) and not os.access(p, os.W_OK, effective_ids=effective)
        for p in (path, *(path + suffix for suffix in WAL_SUFFIXES))
    )


def open_private(path: str, *, group: str | None = None) -> int:
    """Open ``path`` for writing (created or truncated) as a file only its owner
    can read: 0600 (0640 and ``group``), whatever the umask or the mode of an
    existing file. A symlink at ``path`` is refused. Returns the descriptor.
    Example: ``with os.fdopen(open_private("out.jsonl"), "w") as fh: ...``."""
    mode = GROUP_MODE if group else PRIVATE_MODE
    gid = _gid(group) if group else None
    _refuse_symlink(path, "output path")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SymlinkRefused(path, "output path") from None
        raise
    try:
        if gid is not None:
            os.fchown(fd, -1, gid)
        os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


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
    for suffix in SIDECAR_SUFFIXES:
        _refuse_symlink(path + suffix, "database file")
    st: os.stat_result | None = None
    if _refuse_symlink(path, "database path"):
        st = os.stat(path)
    if st is None and not _create_private(path, mode, gid):
        st = os.stat(path)  # created meanwhile: check it as it is
    if st is not None:
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
    "WAL_SUFFIXES",
    "InsecureDatabaseFile",
    "SymlinkRefused",
    "cannot_write",
    "db_path",
    "ensure_db_file",
    "open_private",
    "prepare_db_file",
    "secure_sidecars",
]
