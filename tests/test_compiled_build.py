"""The optional compiled build (mypyc, ``setup.py``) behaves like the pure one.

Builds the wheel from a copy of this tree (``pip wheel``, no build isolation:
the test environment's mypy compiles), installs it into a throwaway venv and,
with that venv's Python:

* checks ``sniffer.build_info()`` and ``sparseety --version`` say "compiled";
* runs the core pipeline tests (reassembly, HTTP/1.1, SSE, streams, pipeline,
  pcap, the peer corpus) against the compiled modules;
* replays every bundled capture with both builds (``scripts/replay_snapshot.py``)
  and requires the stores to be byte-identical.

The wheel also carries the native core (``sniffer._native``, Rust) where
cargo is: both compiled paths coexist, and the mypyc modules run beside it.

It also checks the fallbacks: ``SPARSEETY_PURE=1`` gives a pure wheel (no
native core either), and a broken C compiler a wheel without mypyc modules.
A few minutes: it runs when ``CI`` is true (``make
test``, ``.ci/run``) or with ``SPARSEETY_TEST_COMPILED=1``
(``make test-compiled``); it is skipped, with the reason, where mypyc or a C
compiler is missing.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import in_ci

REPO = Path(__file__).resolve().parent.parent

# Building a wheel compiles the mypyc modules and the native core: minutes.
pytestmark = [pytest.mark.slow, pytest.mark.compiled, pytest.mark.timeout(1800)]

PIP = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]

#: The core pipeline tests run against the compiled modules.
CORE_TESTS = [
    "tests/test_reassembly.py",
    "tests/test_reassembly_props.py",
    "tests/test_http1.py",
    "tests/test_http1_heads.py",
    "tests/test_sse.py",
    "tests/test_streams.py",
    "tests/test_pipeline.py",
    "tests/test_pcap.py",
    "tests/test_peer_pcaps.py",
    "tests/test_packet.py",
    "tests/test_redact.py",
    "tests/test_chain.py",
    "tests/test_dialect_openai.py",
    "tests/test_dialects_more.py",
    "tests/test_fixtures.py",
]


def _why_not() -> str | None:
    if not (in_ci() or os.environ.get("SPARSEETY_TEST_COMPILED")):
        return "builds a compiled wheel (minutes): runs in CI or with SPARSEETY_TEST_COMPILED=1"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc is not installed (pip install mypy): no compiled build to test"
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc}): no compiled build to test"
    return None


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


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """(venv python, work folder) with the compiled wheel installed."""
    why = _why_not()
    if why is not None:
        pytest.skip(why)
    work = tmp_path_factory.mktemp("compiled")
    src = _copy_tree(work)
    wheel = _wheel(src, work / "wheel")
    assert any("sniffer/core/" in n for n in _extensions(wheel)), "the wheel is not compiled"
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), *PIP[1:], "install", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=300,
    )
    # Tests run from a folder without the package sources: only the venv's
    # (compiled) sniffer can be imported.
    run = work / "run"
    run.mkdir()
    for name in ("tests", "pcaps", "scripts", "pyproject.toml"):
        p = src / name
        (shutil.copytree if p.is_dir() else shutil.copy)(p, run / name)
    yield python, run


def _venv_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def test_build_info_says_compiled(compiled: tuple[Path, Path]) -> None:
    python, run = compiled
    out = subprocess.run(
        [str(python), "-c", "import sniffer; print(sniffer.__file__, sniffer.build_info())"],
        cwd=run,
        env=_venv_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "'build': 'compiled'" in out and str(run) not in out
    if shutil.which("cargo") is not None:  # the native core was built beside the mypyc modules
        assert "'core': 'native core " in out
    version = subprocess.run(
        [str(python), "-m", "sniffer.cli", "--version"],
        cwd=run,
        env=_venv_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "(compiled build)" in version
    assert "native core" in version or shutil.which("cargo") is None


def test_core_pipeline_tests_pass_compiled(compiled: tuple[Path, Path]) -> None:
    python, run = compiled
    proc = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *CORE_TESTS],
        cwd=run,
        env=_venv_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-2000:]


def test_replay_is_byte_identical(compiled: tuple[Path, Path]) -> None:
    python, run = compiled
    pure_env = {**os.environ, "PYTHONPATH": str(REPO)}
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
            [str(python), *snap, str(run / "snap-compiled")],
            cwd=run,
            env=_venv_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        ),
    ]
    for p in procs:
        out, _ = p.communicate(timeout=900)
        assert p.returncode == 0, out[-3000:]
    pure, comp = run / "snap-pure", run / "snap-compiled"
    names = sorted(os.listdir(pure))
    assert names and names == sorted(os.listdir(comp))
    _, mismatch, errors = filecmp.cmpfiles(pure, comp, names, shallow=False)
    assert not mismatch and not errors, f"differ: {mismatch[:20]} {errors[:20]}"


def test_opt_out_and_broken_compiler_give_a_pure_wheel(
    compiled: tuple[Path, Path], tmp_path: Path
) -> None:
    src = _copy_tree(tmp_path)
    assert _extensions(_wheel(src, tmp_path / "pure", SPARSEETY_PURE="1")) == []
    shutil.rmtree(src / "build", ignore_errors=True)
    nocc = _extensions(_wheel(src, tmp_path / "nocc", CC="false", LDSHARED="false"))
    assert [n for n in nocc if not n.startswith("sniffer/_native")] == []  # no mypyc module


def test_editable_build_stays_pure(tmp_path: Path) -> None:
    """``pip install -e`` never compiles the mypyc modules and asks for no mypy
    (it builds the native core in place, asking for setuptools-rust; with
    ``SPARSEETY_PURE=1``, as here, it asks for nothing and builds nothing: no
    compiler needed; runs everywhere, a few seconds)."""
    src = _copy_tree(tmp_path)
    hooks = (
        "import json, sys; sys.path.insert(0, 'buildsys'); import sparseety_build as b; "
        "out = sys.argv[1]; "  # the hooks rewrite sys.argv
        "reqs = b.get_requires_for_build_editable(); "
        "name = b.build_editable(out); "
        "print(json.dumps([reqs, name]))"
    )
    out = tmp_path / "editable"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", hooks, str(out)],
        cwd=src,
        env={**os.environ, "SPARSEETY_PURE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reqs, name = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not any(r.startswith(("mypy", "setuptools-rust")) for r in reqs)
    assert name.endswith("-py3-none-any.whl")
    assert _extensions(out / name) == []
    assert not list((src / "sniffer").rglob("*.so")) and not (src / "build").exists()


def test_without_cargo_the_package_installs_pure_with_a_warning(tmp_path: Path) -> None:
    """No Rust toolchain: the editable build (what ``scripts/install-deps.sh``
    runs) still succeeds, builds no native core and says so."""
    src = _copy_tree(tmp_path)
    hooks = (
        "import sys; sys.path.insert(0, 'buildsys'); import sparseety_build as b; "
        "out = sys.argv[1]; print(b.build_editable(out))"
    )
    out = tmp_path / "editable"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", hooks, str(out)],
        cwd=src,
        env={**os.environ, "CARGO": str(tmp_path / "no-cargo")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "cargo is not installed" in proc.stderr and "without the native core" in proc.stderr
    assert not list((src / "sniffer").rglob("*.so"))
    (name,) = [p.name for p in out.glob("*.whl")]
    assert _extensions(out / name) == []
