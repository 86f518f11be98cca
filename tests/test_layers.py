"""The layering contract (``[tool.importlinter]`` in pyproject.toml) holds, and catches a breach.

cli > runtime > reports > record > store | capture > core > llm: a package may
import the ones below it, never one above. The sans-IO stages (core, the
dialects, fingerprint) import no database, network, metrics or CLI library.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LINT = (
    "import sys; from importlinter.cli import lint_imports_command; "
    "lint_imports_command.main(args=['--no-cache'], prog_name='lint-imports')"
)


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run(
        [sys.executable, "-c", LINT],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_contracts_are_kept() -> None:
    r = _lint(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout
    assert "Layers" in r.stdout and "Sans-IO" in r.stdout and "test-only" in r.stdout


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "sniffer", tree / "sniffer", ignore=shutil.ignore_patterns("__pycache__", "*.o")
    )
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


def test_a_core_stage_importing_the_store_breaks_the_layers(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    events = tree / "sniffer" / "core" / "events.py"
    events.write_text(events.read_text() + "\nimport sniffer.store.writer  # noqa\n")
    r = _lint(tree)
    assert r.returncode != 0
    assert "sniffer.core.events -> sniffer.store.writer" in r.stdout


def test_a_dialect_reading_the_clock_breaks_sans_io(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    base = tree / "sniffer" / "llm" / "dialects" / "base.py"
    base.write_text(base.read_text() + "\nimport time  # noqa\n")
    r = _lint(tree)
    assert r.returncode != 0
    assert "sniffer.llm.dialects.base -> time" in r.stdout


def test_a_runtime_module_importing_scapy_breaks_the_test_only_contract(tmp_path: Path) -> None:
    """scapy is a test/scripts extra, not a runtime dependency: the package may not import it."""
    tree = _copy(tmp_path)
    probe = tree / "sniffer" / "runtime" / "probe.py"
    probe.write_text(probe.read_text() + "\nimport scapy.all  # noqa\n")
    r = _lint(tree)
    assert r.returncode != 0
    assert "sniffer.runtime.probe -> scapy" in r.stdout
