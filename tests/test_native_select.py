"""Which core runs: ``SPARSEETY_PURE``, the fallback when the extension cannot
be imported (one warning line), and what ``--version``/``core_name`` say.

Each case runs in a fresh interpreter: the choice is made once, at import.
A missing extension is simulated by ``sys.modules["sniffer._native"] = None``
(an import of it then fails as if the file were not there).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sniffer import __version__

REPO = Path(__file__).resolve().parent.parent
PCAP = REPO / "pcaps" / "chat_english.pcap"

NO_EXTENSION = "import sys; sys.modules['sniffer._native'] = None; "


def run(code: str, tmp_path: Path, pure: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SPARSEETY_PURE", None)
    if pure:
        env["SPARSEETY_PURE"] = "1"
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


#: two replays in one process, then the core that ran
REPLAY_TWICE = (
    "import sniffer; from sniffer.cli import main; "
    "[main.main(['replay', '-q', '--no-tokens', {pcap!r}, '--db', f'r{{i}}.db'], "
    "standalone_mode=False) for i in range(2)]; "
    "print(sniffer.core_name())"
)


def test_a_missing_extension_runs_the_pure_core_with_one_warning(tmp_path: Path) -> None:
    proc = run(NO_EXTENSION + REPLAY_TWICE.format(pcap=str(PCAP)), tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "pure core"
    warnings = [ln for ln in proc.stderr.splitlines() if "event=native-core-unavailable" in ln]
    assert len(warnings) == 1, proc.stderr  # two replays, one line
    assert "level=warning" in warnings[0] and "core=pure" in warnings[0]
    assert "error=" in warnings[0]


def test_sparseety_pure_selects_the_pure_core_silently(tmp_path: Path) -> None:
    code = REPLAY_TWICE.format(pcap=str(PCAP))
    proc = run(code, tmp_path, pure=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "pure core"
    assert "native-core-unavailable" not in proc.stderr
    code = "from sniffer.core.pipeline import Pipeline; print(Pipeline().native)"
    assert run(code, tmp_path, pure=True).stdout.strip() == "False"


def test_version_names_the_core(tmp_path: Path) -> None:
    code = "import sys; sys.argv = ['sparseety', '--version']; from sniffer.cli import main; main()"
    pure = run(code, tmp_path, pure=True).stdout.strip()
    assert pure == f"sparseety, version {__version__}, pure core", pure
    missing = run(NO_EXTENSION + code, tmp_path).stdout.strip()
    assert missing.endswith(", pure core"), missing
    default = run(code, tmp_path).stdout.strip()
    try:
        import sniffer._native as ext
    except ImportError:
        pytest.skip("the native core is not built here")
    assert default == f"sparseety, version {__version__}, native core {ext.__version__}", default
