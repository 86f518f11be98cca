"""The CI rule of tests/conftest.py: with ``CI`` true, a root, eBPF or PostgreSQL
test that cannot run fails with the reason; elsewhere it is skipped with it.

Runs a real pytest in a subprocess on a scratch folder holding a copy of the
suite's conftest.py and a few tests that skip the way the real ones do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

CONFTEST = Path(__file__).resolve().parent / "conftest.py"

SAMPLE = """
import pytest

@pytest.fixture
def pg_url():
    pytest.skip("no PostgreSQL server binaries")

@pytest.mark.root
@pytest.mark.skipif(True, reason="live capture needs root or CAP_NET_RAW")
def test_root_marked():
    pass

@pytest.mark.ebpf
@pytest.mark.skipif(True, reason="kernel has no BTF")
def test_ebpf_marked():
    pass

def test_uses_pg(pg_url):
    pass

@pytest.mark.skipif(True, reason="an ordinary optional tool is missing")
def test_unmarked_skip():
    pass

@pytest.mark.root
def test_root_skips_while_running():
    pytest.skip("kernel lacks a feature this test probes")

@pytest.mark.root
def test_root_that_runs():
    pass
"""


def run(tmp_path: Path, ci: str | None) -> dict[str, tuple[str, str]]:
    """Outcome (passed/skipped/failed) and message per test name."""
    folder = tmp_path / f"ci-{ci}"
    folder.mkdir()
    shutil.copy(CONFTEST, folder / "conftest.py")
    (folder / "test_sample.py").write_text(SAMPLE)
    (folder / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    root: r\n    ebpf: e\n    postgres: p\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    report = folder / "report.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert report.exists(), proc.stdout + proc.stderr
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        kind, message = "passed", ""
        for child in case:
            if child.tag in ("skipped", "failure", "error"):
                kind = "skipped" if child.tag == "skipped" else "failed"
                message = (child.get("message") or "") + (child.text or "")
        out[case.get("name", "")] = (kind, message)
    assert (proc.returncode != 0) == any(k == "failed" for k, _ in out.values()), proc.stdout
    return out


@pytest.mark.timeout(240)
def test_outside_ci_requirement_tests_skip_with_their_reason(tmp_path: Path) -> None:
    got = run(tmp_path, None)
    assert got["test_root_marked"] == ("skipped", got["test_root_marked"][1])
    assert "needs root or CAP_NET_RAW" in got["test_root_marked"][1]
    assert got["test_ebpf_marked"][0] == "skipped" and "BTF" in got["test_ebpf_marked"][1]
    assert got["test_uses_pg"][0] == "skipped" and "PostgreSQL" in got["test_uses_pg"][1]
    assert got["test_root_that_runs"][0] == "passed"
    # "false" is not true
    assert run(tmp_path, "false")["test_root_marked"][0] == "skipped"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ci", ["true", "1"])
def test_in_ci_requirement_tests_fail_with_their_reason(tmp_path: Path, ci: str) -> None:
    got = run(tmp_path, ci)
    for name, need, reason in [
        ("test_root_marked", "root", "needs root or CAP_NET_RAW"),
        ("test_ebpf_marked", "eBPF", "kernel has no BTF"),
        ("test_uses_pg", "PostgreSQL", "no PostgreSQL server binaries"),  # marked automatically
    ]:
        kind, message = got[name]
        assert kind == "failed", (name, got[name])
        assert "CI is set" in message and need in message and reason in message, message
    # Only the requirement tests: other skips stay skips, and so do skips a
    # test decides while it runs.
    assert got["test_unmarked_skip"][0] == "skipped"
    assert got["test_root_skips_while_running"][0] == "skipped"
    assert got["test_root_that_runs"][0] == "passed"
