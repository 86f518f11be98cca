"""In-tree PEP 517 backend: setuptools, plus mypy (mypyc) for a wheel build.

A wheel build asks for the mypy version the compiled build is tested with, so
that ``pip install .`` compiles the hot modules (see ``setup.py``). With
``SPARSEETY_PURE`` set, or for an editable install or an sdist, nothing is
added: those builds are pure Python and need no compiler.
"""

from __future__ import annotations

import os

from setuptools import build_meta as _orig
from setuptools.build_meta import *  # noqa: F403 - the PEP 517 hooks

#: The mypy (mypyc) the compiled build and its traps were tested with.
MYPYC_REQUIREMENT = "mypy==2.4.1"


def get_requires_for_build_wheel(config_settings=None):  # type: ignore[no-untyped-def]
    extra = [] if os.environ.get("SPARSEETY_PURE") else [MYPYC_REQUIREMENT]
    return [*_orig.get_requires_for_build_wheel(config_settings), *extra]
