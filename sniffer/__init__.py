"""SparSEEty: a passive sidecar that records, chunk by chunk and token by token,
what an LLM server streamed back over HTTP.

Sub-packages, in the order the data flows: ``capture`` (packets, eBPF, pcap
files) → ``core`` (reassembly, HTTP/1.1, SSE/NDJSON, streams: sans-IO) →
``llm`` (dialects, tokens, fingerprint) → ``record`` (the recording chain:
metrics, token collector, sampling, redaction) → ``store`` (the database).
``reports`` read the store; ``runtime`` holds the drivers (replay, daemon);
``cli`` is the command line. The layering is checked by ``lint-imports``.
"""

__version__ = "0.1.0"

#: The modules an optional compiled build (mypyc, ``setup.py``) compiles; the
#: pure-Python source of each stays the reference.
COMPILED_MODULES = (
    "sniffer.core.coding",
    "sniffer.core.events",
    "sniffer.core.http1",
    "sniffer.core.pipeline",
    "sniffer.core.reassembly",
    "sniffer.core.sse",
    "sniffer.core.streams",
    "sniffer.capture.packet",
    "sniffer.record.redact",
    "sniffer.llm.dialects.openai",
)


def build_info() -> dict[str, object]:
    """Which build runs: ``{"build": "compiled" | "pure", "compiled": [modules]}``.

    A module counts as compiled when it was loaded from an extension module
    (``.so``/``.pyd``) instead of its ``.py`` source. Imports the hot modules.
    """
    import importlib

    compiled = []
    for name in COMPILED_MODULES:
        origin = getattr(importlib.import_module(name), "__file__", None) or ""
        if not origin.endswith((".py", ".pyc")):
            compiled.append(name)
    return {"build": "compiled" if compiled else "pure", "compiled": compiled}
