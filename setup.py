"""Optional compiled builds: the native core (Rust) and the hot modules (mypyc),
each with a pure-Python fallback.

The native core: ``pip install .``, ``pip install -e .`` and ``make install``
build the Rust extension ``sniffer._native`` (``native/py``, PyO3, release
profile) with setuptools-rust, unless ``SPARSEETY_PURE`` is set. Where
setuptools-rust or cargo is missing, or the build fails, the package installs
without it, with a warning, and the pure-Python stages run (one warning line
at run time).

The hot modules:

``pip install .`` (a wheel) compiles the modules listed in
``sniffer.COMPILED_MODULES`` with mypyc when all of these hold:

* the environment variable ``SPARSEETY_PURE`` is unset or empty (set it, e.g.
  ``SPARSEETY_PURE=1 pip install .``, to opt out);
* mypyc is importable (``buildsys/sparseety_build.py`` asks pip for the mypy
  version the traps were tested with, unless ``SPARSEETY_PURE`` is set);
* a C compiler works.

Anything else, or any failure while generating or compiling the C code, gives
the pure-Python package with a warning: the ``.py`` sources are always in the
wheel and the compiled modules are built from the very same files. Editable
installs (``pip install -e``) always stay pure. At run time,
``sniffer.build_info()`` and ``sparseety --version`` say which build runs.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
OPT_OUT = "SPARSEETY_PURE"
#: setup.py commands that produce an installable build (not metadata, not editable).
BUILDING = {"bdist_wheel", "build", "build_ext", "install"}


def _hot_modules() -> list[str]:
    """``sniffer.COMPILED_MODULES``, read from the source (nothing imported)."""
    import ast

    tree = ast.parse((ROOT / "sniffer" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "COMPILED_MODULES" for t in node.targets
        ):
            return [str(v) for v in ast.literal_eval(node.value)]
    raise RuntimeError("sniffer/__init__.py: COMPILED_MODULES not found")


def _warn(msg: str) -> None:
    warnings.warn(f"sparseety: {msg}; building the pure-Python package", stacklevel=1)
    print(f"sparseety: WARNING: {msg}; building the pure-Python package", file=sys.stderr)


def _wanted() -> bool:
    if os.environ.get(OPT_OUT):
        print(f"sparseety: {OPT_OUT} is set: pure-Python build", file=sys.stderr)
        return False
    commands = set(sys.argv[1:])
    if "editable_wheel" in commands or "develop" in commands:
        return False  # editable installs stay pure: the tree is the running code
    return bool(commands & BUILDING)


def _rust_extensions() -> list[Any]:
    """The native core, ``sniffer._native`` (optional: a failed build warns)."""
    if os.environ.get(OPT_OUT):
        return []
    try:
        from setuptools_rust import Binding, RustExtension
    except ImportError:
        _warn_native("setuptools-rust is not installed (pip install setuptools-rust)")
        return []
    if shutil.which(os.environ.get("CARGO", "cargo")) is None:
        _warn_native("cargo is not installed (the Rust toolchain, https://rustup.rs)")
        return []
    return [
        RustExtension(
            "sniffer._native",
            path="native/py/Cargo.toml",
            binding=Binding.PyO3,
            py_limited_api="cp311",  # pyo3's abi3-py311: one build for 3.11 and later
            debug=False,  # the release profile, editable installs too
            optional=True,  # a failed build leaves the package without it
        )
    ]


def _warn_native(msg: str) -> None:
    print(
        f"sparseety: WARNING: {msg}; installing without the native core "
        "(the pure-Python stages run)",
        file=sys.stderr,
    )


def _ext_modules() -> list[Any]:
    if not _wanted():
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("mypyc is not installed (pip install mypy)")
        return []
    paths = [m.replace(".", "/") + ".py" for m in _hot_modules()]
    cwd = os.getcwd()
    try:
        os.chdir(ROOT)  # mypyc names modules from paths relative to the tree
        return list(mypycify(paths, opt_level="3", debug_level="0"))
    except (Exception, SystemExit) as exc:  # mypy errors end in SystemExit
        _warn(f"mypyc could not compile {', '.join(paths)}: {exc}")
        return []
    finally:
        os.chdir(cwd)


class OptionalBuildExt(build_ext):
    """``build_ext`` whose failure (no compiler, a compile error) leaves a pure build."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            self._fallback(exc)

    def build_extensions(self) -> None:
        try:
            super().build_extensions()
        except Exception as exc:
            self._fallback(exc)

    def _fallback(self, exc: BaseException) -> None:
        _warn(f"compiling the hot modules failed ({type(exc).__name__}: {exc})")
        for ext in list(self.extensions):
            for path in (self.get_ext_fullpath(ext.name),):
                if os.path.exists(path):
                    os.unlink(path)  # never ship half a compiled build
        self.extensions = []
        self.distribution.ext_modules = []


setup(
    ext_modules=_ext_modules(),
    rust_extensions=_rust_extensions(),
    cmdclass={"build_ext": OptionalBuildExt},
)
