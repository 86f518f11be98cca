"""The long commands show progress the way ``replay`` does: a bar on stderr
when stderr is a terminal (a real pseudo-terminal here), nothing when it is
not or with ``--quiet``; stdout carries only the command's output either way.

The store is made large by replaying fixture captures and then copying their
streams (with their chunks) under new ids, a few hundred streams in all."""

from __future__ import annotations

import contextlib
import os
import pty
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PCAPS = ROOT / "pcaps"
COPIES = 60
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run(args: list[str], *, tty: bool) -> tuple[int, str, str]:
    """Run ``python -m sniffer.cli ARGS``; stderr on a pseudo-terminal when ``tty``."""
    cmd = [sys.executable, "-m", "sniffer.cli", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    if not tty:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
        return r.returncode, r.stdout, r.stderr
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, cwd=ROOT, env=env
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the other side closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=300)
    reader.join(30)
    os.close(master)
    return proc.returncode, out.decode(), _ANSI.sub("", b"".join(chunks).decode(errors="replace"))


@pytest.fixture(scope="module")
def large_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("progress") / "large.db"
    for name in ("concurrent_4", "keepalive_3", "chat_english"):
        code, _, err = run(["replay", str(PCAPS / f"{name}.pcap"), "--db", str(db), "-q",
                            "--no-tokens"], tty=False)  # fmt: skip
        assert code == 0, err
    # closed (not only committed) before the tests copy the file: the last
    # connection's close checkpoints the WAL into it
    with contextlib.closing(sqlite3.connect(db)) as c, c:
        cols = [r[1] for r in c.execute("pragma table_info(streams)")]
        ccols = [r[1] for r in c.execute("pragma table_info(chunks)") if r[1] != "id"]
        (top,) = c.execute("select max(id) from streams").fetchone()
        base = [r[0] for r in c.execute("select id from streams")]
        for k in range(1, COPIES + 1):
            off = k * (top + 1)
            other = ", ".join(cols[1:])
            c.execute(
                f"insert into streams (id, {other}) select id + ?, {other} from streams "
                f"where id in ({', '.join(map(str, base))})",
                (off,),
            )
            rest = ", ".join(x for x in ccols if x != "stream_id")
            c.execute(
                f"insert into chunks (stream_id, {rest}) select stream_id + ?, {rest} from chunks "
                f"where stream_id in ({', '.join(map(str, base))})",
                (off,),
            )
    return db


def streams(db: Path) -> int:
    with sqlite3.connect(db) as c:
        return int(c.execute("select count(*) from streams").fetchone()[0])


def test_the_store_is_large(large_db: Path) -> None:
    assert streams(large_db) >= 8 * (COPIES + 1)


@pytest.mark.parametrize(
    ("args", "label"),
    [
        (["export", "--format", "jsonl"], "export"),
        (["export", "--format", "csv"], "export"),
        (["tokenize"], "tokenize"),
        (["verify"], "verify"),
    ],
)
def test_long_commands_show_progress_on_a_terminal_only(
    large_db: Path, tmp_path: Path, args: list[str], label: str
) -> None:
    db = tmp_path / "copy.db"
    db.write_bytes(large_db.read_bytes())
    # stderr a pipe: no bar, and the output is the same as with one
    code, plain_out, plain_err = run([*args, "--db", str(db)], tty=False)
    db.write_bytes(large_db.read_bytes())
    tty_code, tty_out, tty_err = run([*args, "--db", str(db)], tty=True)
    assert code == tty_code, (plain_err, tty_err)
    assert label not in plain_err and "%" not in plain_err
    assert re.search(rf"{label}\s.*100%", tty_err), tty_err
    assert plain_out == tty_out  # the bar never goes to stdout
    db.write_bytes(large_db.read_bytes())
    _, _, quiet_err = run([*args, "--db", str(db), "--quiet"], tty=True)
    assert "%" not in quiet_err, quiet_err


def test_verify_shows_the_tokenize_pass_then_the_checks(large_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "copy.db"
    db.write_bytes(large_db.read_bytes())
    _, _, err = run(["verify", "--db", str(db)], tty=True)
    lines = [ln for ln in re.split(r"[\r\n]", err) if "100%" in ln]
    assert any(ln.lstrip().startswith("tokenize") for ln in lines), err
    assert any(ln.lstrip().startswith("verify") for ln in lines), err
    assert err.index("tokenize") < err.rindex("verify")


def test_prune_and_vacuum_show_progress(large_db: Path, tmp_path: Path) -> None:
    db = tmp_path / "copy.db"
    db.write_bytes(large_db.read_bytes())
    prune = ["prune", "--older-than", "1s", "--db", str(db), "--batch", "50"]
    code, out, err = run(prune, tty=True)
    assert code == 0, err
    assert re.search(r"prune\s.*100%", err), err
    assert re.search(r"vacuum\s.*100%", err), err
    assert streams(db) == 0
    m = re.search(r"vacuum: (\d+) pages freed", out)
    assert m and int(m.group(1)) > 0, out
    db.write_bytes(large_db.read_bytes())
    code, out2, err2 = run(prune, tty=False)
    assert code == 0 and "%" not in err2
    assert out2.splitlines()[0] == out.splitlines()[0]  # the same deletions
