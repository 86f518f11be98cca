"""SparSEEty: a passive sidecar that records, chunk by chunk and token by token,
what an LLM server streamed back over HTTP."""

__version__ = "0.1.0"
