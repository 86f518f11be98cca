"""Every command in the README and in ``docs/`` runs as written.

The convention (``docs/development.md``, "The documents' commands"): a line
starting with ``$ `` inside a ````` ```console ````` block is a command (continued
over lines that end in ``\\``); a ````` ```sql ````` block is a query. A block
right after ``<!-- not run: REASON -->`` is not run (root, a live server, the
network, a large model). A command is expected to exit 0, or the code its
trailing comment names (``# exit 1: a gate failed``).

Each file runs in a fresh directory with links to ``pcaps/``, ``systemd/``
and ``dashboards/``, and ``sparseety`` (and ``python3``) on ``PATH`` running
this tree's code. The README runs first, from an empty directory: its tour
makes ``sparseety.db`` and ``run.db``, which the pages in ``docs/`` then start
from. SQL blocks run through the ``sqlite3`` module on ``sparseety.db``.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))  # docs/_incoming/ is not published
LINKED = ("pcaps", "systemd", "dashboards")

NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>.*?)\s*-->")
FENCE = re.compile(r"^```(?P<lang>\S*)\s*$")
#: The documented exit code: in a trailing shell comment, ``# exit N``.
EXIT = re.compile(r"\s#\s*exit (?P<code>\d+)\b")
#: In a block that is not run as commands, a line that reads like one.
COMMAND_LIKE = re.compile(r"^\s*(\$ |sparseety |make )")


@dataclass(frozen=True)
class Snippet:
    """One command or query of a document."""

    path: Path
    line: int  # 1-based line of its start in the file
    kind: str  # "sh" or "sql"
    text: str
    exit_code: int = 0
    not_run: str | None = None  # the reason, when marked

    def __str__(self) -> str:
        name = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        return f"{name}:{self.line}: {self.text.splitlines()[0]}"


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the fence's line, 1-based
    lang: str
    body: list[str]
    not_run: str | None


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, each with the not-run reason of the
    marker on the line before its fence (blank lines between are allowed)."""
    out: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        j = i - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        marker = NOT_RUN.search(lines[j]) if j >= 0 else None
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        out.append(
            Block(path, i + 1, m["lang"], lines[i + 1 : end], marker["reason"] if marker else None)
        )
        i = end + 1
    return out


def snippets(path: Path) -> list[Snippet]:
    out: list[Snippet] = []
    for b in blocks(path):
        if b.lang == "sql":
            out.append(Snippet(path, b.line + 1, "sql", "\n".join(b.body), not_run=b.not_run))
            continue
        if b.lang != "console":
            continue
        k = 0
        while k < len(b.body):
            if not b.body[k].startswith("$ "):
                k += 1
                continue
            start = k
            parts = [b.body[k][2:]]
            while parts[-1].endswith("\\") and k + 1 < len(b.body):
                k += 1
                parts.append(b.body[k])
            k += 1
            text = "\n".join(parts)
            m = EXIT.search(parts[-1])
            code = int(m["code"]) if m else 0
            out.append(Snippet(path, b.line + 1 + start, "sh", text, code, b.not_run))
    return out


def _workdir(tmp: Path) -> tuple[Path, dict[str, str]]:
    """A directory with the repository's data linked in, and the environment
    that runs this tree's ``sparseety``."""
    tmp.mkdir(parents=True, exist_ok=True)
    for name in LINKED:
        (tmp / name).symlink_to(ROOT / name)
    bin_dir = tmp.parent / f"{tmp.name}-bin"
    bin_dir.mkdir()
    script = bin_dir / "sparseety"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m sniffer.cli "$@"\n')
    script.chmod(0o755)
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARSEETY_")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = str(ROOT)
    return tmp, env


def _run(snippet: Snippet, cwd: Path, env: dict[str, str]) -> str | None:
    """Run one snippet; the failure text, or None when it did what the docs say."""
    if snippet.kind == "sql":
        db = cwd / "sparseety.db"
        if not db.exists():
            return f"{snippet}: no sparseety.db to query"
        conn = sqlite3.connect(db)
        try:
            conn.execute(snippet.text).fetchall()
        except sqlite3.Error as exc:
            return f"{snippet}: {exc}"
        finally:
            conn.close()
        return None
    proc = subprocess.run(
        ["bash", "-c", snippet.text],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != snippet.exit_code:
        return (
            f"{snippet}: exit {proc.returncode}, documented {snippet.exit_code}\n"
            f"{(proc.stdout + proc.stderr)[-1500:]}"
        )
    return None


def _run_all(path: Path, cwd: Path, env: dict[str, str]) -> list[str]:
    return [
        failure
        for s in snippets(path)
        if s.not_run is None and (failure := _run(s, cwd, env)) is not None
    ]


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The README's commands, run once: its directory (holding the tour's
    databases) and the failures."""
    cwd, env = _workdir(tmp_path_factory.mktemp("docs") / "readme")
    return cwd, _run_all(README, cwd, env)


def test_the_readme_runs_as_written(readme_run: tuple[Path, list[str]]) -> None:
    cwd, failures = readme_run
    assert failures == []
    assert (cwd / "sparseety.db").exists() and (cwd / "run.db").exists()
    assert (cwd / "report.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_docs_run_as_written(
    page: Path, readme_run: tuple[Path, list[str]], tmp_path: Path
) -> None:
    tour, _ = readme_run
    cwd, env = _workdir(tmp_path / "page")
    for db in tour.glob("*.db*"):  # the tour's databases, with any -wal/-shm
        shutil.copy2(db, cwd / db.name)
    assert _run_all(page, cwd, env) == []


def test_every_document_follows_the_convention() -> None:
    """Commands sit in console blocks only, each not-run marker is right before
    a block and gives a reason, and the README has commands that run."""
    for path in (README, *PAGES):
        text = path.read_text()
        fenced = {b.line - 1 for b in blocks(path)}  # 0-based fence lines
        lines = text.splitlines()
        for n, line in enumerate(lines):
            if line.lstrip().startswith("<!--") and "not run" in line:
                m = NOT_RUN.search(line)
                assert m and m["reason"], f"{path.name}:{n + 1}: a not-run marker needs a reason"
                nxt = next(k for k in range(n + 1, len(lines)) if lines[k].strip())
                assert nxt in fenced, f"{path.name}:{n + 1}: the marker is not before a block"
        for b in blocks(path):
            if b.lang in ("console", "sql", "toml", "yaml", "text", "json"):
                continue
            stray = [ln for ln in b.body if COMMAND_LIKE.match(ln)]
            assert not stray, f"{path.name}:{b.line}: commands outside a console block: {stray}"
    readme = snippets(README)
    assert sum(s.not_run is None for s in readme) >= 8
    setup = [s.text for s in readme if s.not_run]
    assert setup[:2] == ["make install && sparseety run", "make test"]


def test_the_extraction(tmp_path: Path) -> None:
    """Continuations, documented exit codes, markers and SQL are read as meant."""
    doc = tmp_path / "x.md"
    doc.write_text(
        "text\n\n```console\n$ sparseety diff --db a.db \\\n"
        "    --fail-if 'x < 1'   # exit 1: FAIL\n"
        "output line\n$ echo hi\n```\n\n<!-- not run: needs root -->\n\n```console\n"
        "$ sparseety run\n```\n\n```sql\nSELECT 1;\n```\n\n```toml\n[a]\n```\n"
    )
    got = snippets(doc)
    assert [(s.kind, s.text, s.exit_code, s.not_run, s.line) for s in got] == [
        ("sh", "sparseety diff --db a.db \\\n    --fail-if 'x < 1'   # exit 1: FAIL", 1, None, 4),
        ("sh", "echo hi", 0, None, 7),
        ("sh", "sparseety run", 0, "needs root", 13),
        ("sql", "SELECT 1;", 0, None, 17),
    ]
    cwd, env = _workdir(tmp_path / "w")
    assert _run(Snippet(doc, 1, "sh", "exit 3", 3), cwd, env) is None
    assert "exit 0, documented 1" in (_run(Snippet(doc, 1, "sh", "true", 1), cwd, env) or "")
    assert "no sparseety.db" in (_run(Snippet(doc, 1, "sql", "SELECT 1"), cwd, env) or "")
    out = subprocess.run(
        ["bash", "-c", "command -v sparseety && sparseety --version"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.startswith(str(tmp_path))


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a Markdown file (outside code blocks)."""
    out: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_links_between_the_documents_resolve() -> None:
    """Every relative link of the README and docs/ names a file that exists, and
    its #anchor a heading of that file."""
    bad = []
    for path in (README, *PAGES):
        for m in LINK.finditer(path.read_text()):
            target = m["target"]
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                bad.append(f"{path.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{path.name}: {target} (no such heading)")
    assert bad == []
