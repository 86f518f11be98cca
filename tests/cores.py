"""Run a test module against both cores: the pure-Python stages and the
native ones (``sniffer._native``), by swapping the module's names for the
classes under test.

    CORE = both_cores(globals(), HttpParser=lambda: native.http_parser)

makes an autouse, module-scoped fixture (hypothesis accepts it) parametrized
``pure``/``native``: under ``native`` the module's ``HttpParser`` is the native
class for the duration of its tests. The native case carries the ``native``
marker (skipped without the extension, a failure in CI).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sniffer.core import native


def both_cores(namespace: dict[str, Any], **natives: Callable[[], Any]) -> Any:
    why = native.why_unavailable()
    params = [
        pytest.param("pure", id="pure"),
        pytest.param(
            "native",
            id="native",
            marks=[pytest.mark.native, pytest.mark.skipif(why is not None, reason=str(why))],
        ),
    ]

    @pytest.fixture(scope="module", autouse=True, params=params)
    def core(request: pytest.FixtureRequest) -> Iterator[str]:
        saved = {name: namespace[name] for name in natives}
        if request.param == "native":
            for name, make in natives.items():
                namespace[name] = make()
        try:
            yield str(request.param)
        finally:
            namespace.update(saved)

    return core
