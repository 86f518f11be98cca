"""The sans-IO core: bytes in, events out.

``events`` (the vocabulary every stage speaks) → ``reassembly`` (TCP segments
to ordered byte flows) → ``http1`` (HTTP/1.1 exchanges) → ``sse`` (SSE and
NDJSON bodies) → ``streams`` (LLM streams and chunks, through
:mod:`sniffer.llm.dialects`); ``pipeline`` composes them. Nothing here opens
a socket or file, reads a clock or logs.
"""
