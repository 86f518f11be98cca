"""In-tree PEP 517 backend: setuptools, plus setuptools-rust (the native core,
wheels and editable installs) and mypy (mypyc) for a wheel build.

A wheel build asks for the mypy version the compiled build is tested with, so
that ``pip install .`` compiles the hot modules (see ``setup.py``), and for
setuptools-rust, which builds the native core (an editable install asks for
setuptools-rust only: mypyc never compiles an editable tree). With
``SPARSEETY_PURE`` set, or for an sdist, nothing is added: those builds are
pure Python and need no compiler.
"""

from __future__ import annotations

import os

from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F403 - the PEP 517 hooks

#: The mypy (mypyc) the compiled build and its traps were tested with.
MYPYC_REQUIREMENT = "mypy==2.4.1"
#: Builds the native core (``native/py``, the extension ``sniffer._native``).
RUST_REQUIREMENT = "setuptools-rust>=1.9"


def get_requires_for_build_wheel(config_settings=None):  # type: ignore[no-untyped-def]
    extra = [] if os.environ.get("SPARSEETY_PURE") else [RUST_REQUIREMENT, MYPYC_REQUIREMENT]
    return [*_orig.get_requires_for_build_wheel(config_settings), *extra]


def get_requires_for_build_editable(config_settings=None):  # type: ignore[no-untyped-def]
    extra = [] if os.environ.get("SPARSEETY_PURE") else [RUST_REQUIREMENT]
    return [*_orig.get_requires_for_build_editable(config_settings), *extra]
