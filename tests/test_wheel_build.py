"""The built package (``setup.py``: the native core through setuptools-rust)
installs and runs, and falls back to pure Python where it cannot build.

Builds the wheel from a copy of this tree (``pip wheel``, no build isolation),
installs it into a throwaway venv and, with that venv's Python, from a folder
without the package sources:

* checks ``sparseety --version`` names the native core (where cargo is) and the
  wheel carries no extension module but ``sniffer._native``;
* replays every bundled capture (``scripts/replay_snapshot.py``) with the
  installed package and with this tree's pure-Python core
  (``SPARSEETY_PURE=1``), and requires the stores to be byte-identical: the
  wheel holds every file a replay needs (migrations, package data).

Building the wheel takes minutes: those run when ``CI`` is true (``make
test``, ``.ci/run``) or with ``SPARSEETY_TEST_WHEEL=1``. The fallbacks run
everywhere (a few seconds each): ``SPARSEETY_PURE=1`` gives an editable build
with nothing compiled, and a missing cargo an install without the native core,
with a warning.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sniffer import __version__
from tests.conftest import in_ci

REPO = Path(__file__).resolve().parent.parent

PIP = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]

#: The PEP 517 hooks of the build backend, run in a copy of the tree; prints
#: the name of the editable wheel built into the folder given.
EDITABLE = (
    "import sys; from setuptools import build_meta as b; "
    "out = sys.argv[1]; "  # the hooks rewrite sys.argv
    "print(b.build_editable(out))"
)


def _copy_tree(dst: Path) -> Path:
    ignore = shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.db*", ".*_cache", "target"
    )
    src = dst / "src"
    shutil.copytree(REPO, src, ignore=ignore)
    return src


def _wheel(src: Path, out: Path, **env: str) -> Path:
    # The tree's cargo target folder: the native core's dependencies are built once.
    cargo = {"CARGO_TARGET_DIR": str(REPO / "native" / "target")}
    proc = subprocess.run(
        [*PIP, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)],
        env={**os.environ, **cargo, **env},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = out.glob("sparseety-*.whl")
    return wheel


def _extensions(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return [n for n in zf.namelist() if n.endswith((".so", ".pyd"))]


def _skip_unless_asked() -> None:
    if not (in_ci() or os.environ.get("SPARSEETY_TEST_WHEEL")):
        pytest.skip("builds the wheel (minutes): runs in CI or with SPARSEETY_TEST_WHEEL=1")


def _venv_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("SPARSEETY_PURE", None)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path]]:
    """(venv python, work folder, wheel) with the wheel built from this tree installed."""
    _skip_unless_asked()
    work = tmp_path_factory.mktemp("wheel")
    src = _copy_tree(work)
    wheel = _wheel(src, work / "wheel")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), *PIP[1:], "install", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=300,
    )
    # Run from a folder without the package sources: only the venv's sniffer
    # can be imported.
    run = work / "run"
    run.mkdir()
    shutil.copytree(src / "scripts", run / "scripts")
    yield python, run, wheel


@pytest.mark.slow
@pytest.mark.wheel
@pytest.mark.timeout(1800)
def test_the_wheel_installs_and_names_its_core(installed: tuple[Path, Path, Path]) -> None:
    python, run, wheel = installed
    cargo = shutil.which("cargo") is not None
    assert _extensions(wheel) == (["sniffer/_native.abi3.so"] if cargo else [])
    where = subprocess.run(
        [str(python), "-c", "import sniffer; print(sniffer.__file__)"],
        cwd=run,
        env=_venv_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(python.parent.parent)), where  # the venv's, not this tree's
    version = subprocess.run(
        [str(python), "-m", "sniffer.cli", "--version"],
        cwd=run,
        env=_venv_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    core = "native core " if cargo else "pure core"
    assert version.startswith(f"sparseety, version {__version__}, {core}"), version


@pytest.mark.slow
@pytest.mark.wheel
@pytest.mark.timeout(1800)
def test_the_installed_native_core_stores_what_the_pure_tree_does(
    installed: tuple[Path, Path, Path],
) -> None:
    python, run, _ = installed
    pure_env = {**os.environ, "PYTHONPATH": str(REPO), "SPARSEETY_PURE": "1"}
    snap = [str(run / "scripts" / "replay_snapshot.py"), "--root", str(REPO)]
    procs = [
        subprocess.Popen(
            [sys.executable, *snap, str(run / "snap-pure")],
            cwd=run,
            env=pure_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        ),
        subprocess.Popen(
            [str(python), *snap, str(run / "snap-wheel")],
            cwd=run,
            env=_venv_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        ),
    ]
    for p in procs:
        out, _ = p.communicate(timeout=900)
        assert p.returncode == 0, out[-3000:]
    pure, wheel = run / "snap-pure", run / "snap-wheel"
    names = sorted(os.listdir(pure))
    assert names and names == sorted(os.listdir(wheel))
    _, mismatch, errors = filecmp.cmpfiles(pure, wheel, names, shallow=False)
    assert not mismatch and not errors, f"differ: {mismatch[:20]} {errors[:20]}"


@pytest.mark.slow
@pytest.mark.wheel
@pytest.mark.timeout(1800)
def test_sparseety_pure_gives_a_wheel_without_the_native_core(tmp_path: Path) -> None:
    _skip_unless_asked()
    src = _copy_tree(tmp_path)
    wheel = _wheel(src, tmp_path / "pure", SPARSEETY_PURE="1")
    assert _extensions(wheel) == []
    assert wheel.name.endswith("-py3-none-any.whl")


def test_editable_build_with_sparseety_pure_compiles_nothing(tmp_path: Path) -> None:
    """``SPARSEETY_PURE=1 pip install -e .`` needs no compiler and builds nothing."""
    src = _copy_tree(tmp_path)
    out = tmp_path / "editable"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", EDITABLE, str(out)],
        cwd=src,
        env={**os.environ, "SPARSEETY_PURE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = proc.stdout.strip().splitlines()[-1]
    assert name.endswith("-py3-none-any.whl")
    assert _extensions(out / name) == []
    assert "SPARSEETY_PURE is set: pure-Python build" in proc.stderr
    assert not list((src / "sniffer").rglob("*.so")) and not (src / "build").exists()


def test_without_cargo_the_package_installs_pure_with_a_warning(tmp_path: Path) -> None:
    """No Rust toolchain: the editable build (what ``scripts/install-deps.sh``
    runs) still succeeds, builds no native core and says so."""
    src = _copy_tree(tmp_path)
    out = tmp_path / "editable"
    out.mkdir()
    env = {**os.environ, "CARGO": str(tmp_path / "no-cargo")}
    env.pop("SPARSEETY_PURE", None)
    proc = subprocess.run(
        [sys.executable, "-c", EDITABLE, str(out)],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cargo is not installed" in proc.stderr and "without the native core" in proc.stderr
    assert not list((src / "sniffer").rglob("*.so"))
    (name,) = [p.name for p in out.glob("*.whl")]
    assert _extensions(out / name) == []
