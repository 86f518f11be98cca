"""SparSEEty: a passive sidecar that records, chunk by chunk and token by token,
what an LLM server streamed back over HTTP.

Sub-packages, in the order the data flows: ``capture`` (packets, eBPF, pcap
files) → ``core`` (reassembly, HTTP/1.1, SSE/NDJSON, streams: sans-IO) →
``llm`` (dialects, tokens, fingerprint) → ``record`` (the recording chain:
metrics, token collector, sampling, redaction) → ``store`` (the database).
``reports`` read the store; ``runtime`` holds the drivers (replay, daemon);
``cli`` is the command line. The layering is checked by ``lint-imports``.
"""

from types import ModuleType

__version__ = "0.1.0"

#: Set (non-empty) at run time: the pure-Python stages run instead of the native
#: core; at build time (``SPARSEETY_PURE=1 pip install .``): no native core is built.
PURE_ENV = "SPARSEETY_PURE"

_native_loaded: tuple[ModuleType | None, str | None] | None = None


def native_core() -> tuple[ModuleType | None, str | None]:
    """(the native core's extension module ``sniffer._native``, None) when it
    runs; (None, why not) when it cannot be imported; (None, None) when
    ``SPARSEETY_PURE`` selects the pure-Python stages. Loaded once."""
    global _native_loaded
    if _native_loaded is None:
        import os

        if os.environ.get(PURE_ENV):
            _native_loaded = (None, None)
        else:
            try:
                from sniffer import _native
            except ImportError as exc:
                _native_loaded = (None, f"{type(exc).__name__}: {exc}")
            else:
                _native_loaded = (_native, None)
    return _native_loaded


def core_name() -> str:
    """Which core runs the per-packet path: "native core x.y.z" or "pure core"."""
    mod = native_core()[0]
    return f"native core {mod.__version__}" if mod is not None else "pure core"
