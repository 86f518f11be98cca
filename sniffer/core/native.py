"""The native core's parsers (``sniffer._native``, issue #25) behind the
interfaces of the Python stages, for tests and measurements.

The Rust ports of ``HttpParser`` (``core/http1.py``), ``SseDecoder`` and
``NdjsonDecoder`` (``core/sse.py``) take and return the same event values.
They are not the default yet: :func:`native_pipeline` builds a ``Pipeline``
whose HTTP stage is the native one, :func:`http_parser`, :func:`sse_decoder`
and :func:`ndjson_decoder` make one of each. ``None`` / :func:`why_unavailable`
when the extension is not built (``scripts/build_native_dev.sh``).

HTTP/2 stays in Python: where the native parser reports that a connection
turns to HTTP/2 (preface, frames of a connection caught mid-way, ``101`` to
``Upgrade: h2c``), :func:`_h2_takeover` gives the connection to a Python
``HttpParser`` held by the native one, which feeds it from then on.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from sniffer.core.events import ConnectionOpened
from sniffer.core.h2 import H2Conn
from sniffer.core.http1 import HttpOutput, HttpParser, _Conn
from sniffer.core.pipeline import Pipeline, PipelineConfig

__all__ = [
    "http_parser",
    "native_module",
    "native_pipeline",
    "ndjson_decoder",
    "sse_decoder",
    "why_unavailable",
]

_module: ModuleType | None = None
_why: str | None = None


def native_module() -> ModuleType | None:
    """``sniffer._native``, or ``None`` when it cannot be imported."""
    global _module, _why
    if _module is None and _why is None:
        try:
            _module = importlib.import_module("sniffer._native")
        except ImportError as exc:
            _why = f"the native extension sniffer._native is not built ({exc})"
    return _module


def why_unavailable() -> str | None:
    """Why the extension cannot be used (``None``: it can)."""
    native_module()
    return _why


def _need() -> ModuleType:
    mod = native_module()
    if mod is None:
        raise ImportError(_why)
    return mod


def http_parser(**kwargs: Any) -> Any:
    """A native ``HttpParser`` (same arguments and interface as the Python one)."""
    return _need().HttpParser(**kwargs)


def sse_decoder(max_line: int | None = None) -> Any:
    mod = _need()
    return mod.SseDecoder() if max_line is None else mod.SseDecoder(max_line)


def ndjson_decoder(max_line: int | None = None) -> Any:
    mod = _need()
    return mod.NdjsonDecoder() if max_line is None else mod.NdjsonDecoder(max_line)


def native_pipeline(config: PipelineConfig | None = None) -> Pipeline:
    """A ``Pipeline`` whose HTTP stage is the native parser (the rest unchanged)."""
    pipe = Pipeline(config)
    cfg = pipe.config
    pipe.http = http_parser(
        max_decoded_bytes=cfg.max_decoded_bytes, max_expansion_ratio=cfg.max_expansion_ratio
    )
    return pipe


def _h2_takeover(
    parser: HttpParser,
    opened: ConnectionOpened,
    opened_held: bool,
    mode: str,
    from_client: bool,
    ts: float,
    data: bytes,
    swapped: bool,
    roles_known: bool,
) -> list[HttpOutput]:
    """Called by the native parser: the connection turns to HTTP/2 with ``data``.
    It becomes a connection of the Python ``parser``, in the state the
    reference would have it in at this point, and the first HTTP/2 bytes are
    parsed as the reference parses them."""
    c = _Conn(opened)
    c.opened = opened if opened_held else None
    c.roles_known = roles_known
    if swapped:
        c.swapped = True
        c.dirs = (c.dirs[1], c.dirs[0])
        c.dirs[0].from_client = False
        c.dirs[1].from_client = True
    parser._conns[opened.conn] = c
    out: list[HttpOutput] = []
    if mode == "preface":
        c.h2 = H2Conn(c.id, stats=parser.h2_stats)
        out.extend(c.h2.data(True, ts, data))
    elif mode == "midstream":
        c.h2 = H2Conn(c.id, midstream=True, stats=parser.h2_stats)
        parser._h2_data(c, from_client, ts, data, out)
    else:  # "upgrade": 101 to Upgrade: h2c; exchange 0 goes on as stream 1
        c.h2 = H2Conn(c.id, upgraded=True, stats=parser.h2_stats)
        if data:
            out.extend(c.h2.data(False, ts, data))
    return out
