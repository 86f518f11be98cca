"""The native core (Rust), built when it can be, with a pure-Python fallback.

``pip install .``, ``pip install -e .`` and ``make install`` build the Rust
extension ``sniffer._native`` (``native/py``, PyO3, release profile) with
setuptools-rust, unless ``SPARSEETY_PURE`` is set. Where setuptools-rust or
cargo is missing, or the build fails, the package installs without it, with a
warning, and the pure-Python stages run (one warning line at run time).
``sparseety --version`` says which core runs.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from setuptools import setup

OPT_OUT = "SPARSEETY_PURE"


def _warn_native(msg: str) -> None:
    print(
        f"sparseety: WARNING: {msg}; installing without the native core "
        "(the pure-Python stages run)",
        file=sys.stderr,
    )


def _rust_extensions() -> list[Any]:
    """The native core, ``sniffer._native`` (optional: a failed build warns)."""
    if os.environ.get(OPT_OUT):
        print(f"sparseety: {OPT_OUT} is set: pure-Python build", file=sys.stderr)
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


setup(rust_extensions=_rust_extensions())
