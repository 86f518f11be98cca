"""The database schema: SQLAlchemy Core tables on one ``MetaData``.

Core tables (not ORM classes) because the chunk insert is the hot path. Only
portable types are used, so the same schema runs on SQLite (the embedded
default, WAL mode) and on PostgreSQL (one central database for a fleet).
JSON values are stored as text. Times are capture timestamps: float seconds
since the Unix epoch (UTC).

``connections`` — one row per TCP connection (or eBPF socket).

    id              connection id assigned by the pipeline (ConnectionOpened.conn)
    client_ip, client_port, server_ip, server_port
    opened_at       first packet seen
    closed_at       NULL while open
    close_reason    "fin", "rst", "idle", "eof"
    syn_seen        the handshake was captured (client/server roles are certain)
    capture         "packet" or "ebpf"
    pid, comm       owning process (eBPF capture only)
    label           free-form run label
    node            the sidecar that captured it (``--node``, default the host name)

``streams`` — one row per HTTP request/response exchange.

    id              stream id assigned by the pipeline (StreamOpened.stream)
    connection_id   connections.id
    exchange        0, 1, 2 … per connection
    label, capture, pid, comm
    client, server  "IP:PORT" ("[IPv6]:PORT" for IPv6)
    method, path
    dialect         "openai.chat", "openai.completions", "anthropic", … or "http"
                    (``PLAIN_HTTP``: not an LLM stream, ``StreamOpened.dialect`` None)
    model, is_stream, temperature, top_p, max_tokens, n, seed, prompt_len
                    from the request body (is_stream is the request's "stream";
                    max_tokens also takes max_completion_tokens / max_output_tokens;
                    prompt_len is the number of messages, or 1 for a prompt)
    request_json    the request body as sent (text)
    request_headers JSON list of [name, value] pairs, credentials removed
    status, response_headers (JSON, credentials removed), content_type
    streaming       the response body is SSE / NDJSON
    t_request       request head captured
    t_response      response head captured
    t_first_content first chunk carrying content, reasoning or a tool call (TTFT)
    t_last_chunk    last chunk event
    state           "open" until the stream ends, then "complete", "truncated",
                    "gap" or "error"
    reason          why that state (human-readable)
    done_seen       "data: [DONE]" (or the dialect's end marker) was seen
    gap             bytes were lost: never reported complete
    chunk_count     chunk events that carried text
    event_count     all chunk events
    text_len        characters of content, all choices
    finish_reasons  JSON object {"<choice>": "<finish_reason>"}
    usage           JSON text of the last usage object
    prompt_tokens, completion_tokens
                    from usage (prompt_tokens/completion_tokens,
                    input_tokens/output_tokens or Ollama's
                    prompt_eval_count/eval_count: ``sniffer.llm.values.Usage``)
    response_body   the body of a non-streaming reply (capped upstream)
    request_bytes, response_bytes
                    body bytes after de-chunking and content decoding
    error           error message (HTTP error body, error event, framing)
    closed_at       when the stream ended (NULL while open)
    text_kept       False when sampling dropped the chunk text (``--sample-rate``):
                    the stream has no text to compare; NULL in rows written
                    before the column existed (read as kept)
    node            the sidecar that captured it (``--node``, default the host name)
    flags           JSON list of what the tool noticed that the state does not say
                    (``sniffer.core.events.StreamFlag``: data it dropped or could
                    not trust, odd input it kept), in the order first seen; NULL
                    when none (and in rows written before the column existed)
    spec_*          what the server reported about speculative decoding
                    (``sniffer.llm.values.SpecDecode``): spec_source (vllm,
                    llama.cpp, sglang), spec_draft_tokens, spec_accepted_tokens,
                    spec_steps (verification steps), spec_accept_length (mean
                    tokens per step), spec_accept_rate (accepted / drafted),
                    spec_histogram (JSON list: steps that accepted 0, 1, …
                    drafted tokens); NULL when it reported nothing
    server_*        the server's own timings (llama.cpp ``timings``:
                    server_prompt_n, server_prompt_ms, server_predicted_n,
                    server_predicted_ms) and server_rejected (JSON list of the
                    fields above the server sent out of range)

``chunks`` — one row per streamed event per choice (or a whole non-streaming body).

    id              autoincrement
    stream_id       streams.id
    seq             0, 1, 2 … per stream, in capture order
    choice          choice index (n > 1), output_index or block index; -1 for
                    stream-level events (usage-only chunk, [DONE], errors)
    chunk_index     1, 2, 3 … per (stream, choice) for chunks carrying text, else 0
    kind            "role", "content", "reasoning", "tool_call", "finish",
                    "usage", "error", "done", "other", "invalid", "after_done"
                    (an item after the end marker, kept in raw: not the answer)
    ts              capture time of the packet that completed the event
    text            content delta (what a client appends)
    reasoning       reasoning delta
    tool_calls, logprobs, usage
                    JSON text, as the server sent it
    finish_reason
    raw             the event data as received, for kinds that are not modelled
    server_tokens   JSON list of server-reported tokens (TGI token objects)

``errors`` — every recorded pipeline error (bad input never stops capture).

    id, ts, stage ("capture", "reassembly", "http", "sse", "dialect", "store"),
    kind, message, connection_id, stream_id, node

``id_blocks`` — one row per kind of id the pipeline assigns ("connections",
"streams"): ``next_id`` is the first id nobody has reserved yet. Writers
reserve blocks of ids from it (``sniffer.store.ids``), so that any number of
concurrent writers never hand out the same connection or stream id.

``checkpoints`` — the graceful-restart checkpoint of a sidecar stopped with
streams under way, one row per node (server databases; a SQLite database keeps
it in a file next to it): ``node``, ``written_at``, ``payload`` (JSON).
Written on SIGTERM, read and deleted by the next instance on that node.

``meta`` — key/value pairs; ``schema_version`` is the schema's version
(informative: the migration chain's revision in ``alembic_version`` is what
``sniffer.store.schema`` checks).

Foreign keys are not declared: rows arrive in batches from several stages and a
capture may start mid-connection, so referential order is not guaranteed.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

from sniffer.store.lite import PLAIN_HTTP as _PLAIN_HTTP

SCHEMA_VERSION = 6

#: ``streams.dialect`` of an exchange that is not an LLM stream (plain HTTP):
#: the store's spelling of ``StreamOpened.dialect is None`` (defined in ``lite``,
#: which the writers import without SQLAlchemy).
PLAIN_HTTP = _PLAIN_HTTP

metadata = MetaData()

#: 64-bit ids on PostgreSQL; plain INTEGER on SQLite so that an integer primary
#: key stays the rowid alias (BIGINT would lose SQLite's autoincrement).
Id = BigInteger().with_variant(Integer(), "sqlite")

connections = Table(
    "connections",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=False),
    Column("client_ip", String(64)),
    Column("client_port", Integer),
    Column("server_ip", String(64)),
    Column("server_port", Integer),
    Column("opened_at", Float),
    Column("closed_at", Float),
    Column("close_reason", String(16)),
    Column("syn_seen", Boolean),
    Column("capture", String(16)),
    Column("pid", Integer),
    Column("comm", String(64)),
    Column("label", Text),
    Column("node", String(255)),
)

streams = Table(
    "streams",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=False),
    Column("connection_id", Id),
    Column("exchange", Integer),
    Column("label", Text),
    Column("capture", String(16)),
    Column("pid", Integer),
    Column("comm", String(64)),
    Column("client", String(80)),
    Column("server", String(80)),
    Column("method", Text),
    Column("path", Text),
    Column("dialect", String(64)),
    Column("model", Text),
    Column("is_stream", Boolean),
    Column("temperature", Float),
    Column("top_p", Float),
    Column("max_tokens", BigInteger),
    Column("n", Integer),
    Column("seed", BigInteger),
    Column("prompt_len", Integer),
    Column("request_json", Text),
    Column("request_headers", Text),
    Column("status", Integer),
    Column("response_headers", Text),
    Column("content_type", Text),
    Column("streaming", Boolean),
    Column("t_request", Float),
    Column("t_response", Float),
    Column("t_first_content", Float),
    Column("t_last_chunk", Float),
    Column("state", String(16)),
    Column("reason", Text),
    Column("done_seen", Boolean),
    Column("gap", Boolean),
    Column("chunk_count", Integer),
    Column("event_count", Integer),
    Column("text_len", BigInteger),
    Column("finish_reasons", Text),
    Column("usage", Text),
    Column("prompt_tokens", BigInteger),
    Column("completion_tokens", BigInteger),
    Column("response_body", Text),
    Column("request_bytes", BigInteger),
    Column("response_bytes", BigInteger),
    Column("error", Text),
    Column("closed_at", Float),
    Column("text_kept", Boolean),
    Column("node", String(255)),
    Column("flags", Text),
    Column("spec_source", String(32)),
    Column("spec_draft_tokens", BigInteger),
    Column("spec_accepted_tokens", BigInteger),
    Column("spec_steps", BigInteger),
    Column("spec_accept_length", Float),
    Column("spec_accept_rate", Float),
    Column("spec_histogram", Text),
    Column("server_prompt_n", BigInteger),
    Column("server_prompt_ms", Float),
    Column("server_predicted_n", BigInteger),
    Column("server_predicted_ms", Float),
    Column("server_rejected", Text),
    Index("ix_streams_label_model", "label", "model"),
    Index("ix_streams_t_request", "t_request"),
    Index("ix_streams_state", "state"),
    Index("ix_streams_connection", "connection_id"),
    Index("ix_streams_node", "node", "t_request"),
)

chunks = Table(
    "chunks",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("stream_id", Id, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("choice", Integer),
    Column("chunk_index", Integer),
    Column("kind", String(16)),
    Column("ts", Float),
    Column("text", Text),
    Column("reasoning", Text),
    Column("tool_calls", Text),
    Column("finish_reason", Text),
    Column("logprobs", Text),
    Column("usage", Text),
    Column("raw", Text),
    Column("server_tokens", Text),
    Index("ix_chunks_stream_seq", "stream_id", "seq"),
)

errors = Table(
    "errors",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("ts", Float),
    Column("stage", String(32)),
    Column("kind", String(64)),
    Column("message", Text),
    Column("connection_id", Id),
    Column("stream_id", Id),
    Column("node", String(255)),
    Index("ix_errors_stream", "stream_id"),
)

id_blocks = Table(
    "id_blocks",
    metadata,
    Column("name", String(32), primary_key=True),
    Column("next_id", BigInteger, nullable=False),
)

checkpoints = Table(
    "checkpoints",
    metadata,
    Column("node", String(255), primary_key=True),
    Column("written_at", Float, nullable=False),
    Column("payload", Text, nullable=False),
)

meta = Table(
    "meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text),
)

__all__ = [
    "SCHEMA_VERSION",
    "checkpoints",
    "chunks",
    "connections",
    "errors",
    "id_blocks",
    "meta",
    "metadata",
    "streams",
]
