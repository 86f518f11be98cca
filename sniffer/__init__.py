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
