"""The table specification: every table, column and index of the store, once.

Plain Python, no SQLAlchemy (the writers import it at start-up). Derived from it:
the SQLAlchemy Core tables (``sniffer.store.models``), the SQLite DDL a new file is
created with and the statement text of the writers (``sniffer.store.lite``), the
column lists the writers fill (``sniffer.store.writer``, ``sniffer.store.tokens_store``).
The migration chain (``sniffer.store.migrations``) stays frozen, spelled out on its
own: a test holds the derived DDL against what the chain leaves in a new file, so
a new column is one line here plus its migration.

Each column and index records the revision that added it: SQLite appends a column
added by ``ALTER TABLE … ADD COLUMN`` to the stored ``CREATE TABLE`` text, and a
new file must hold the very text the chain leaves (:func:`sqlite_ddl`).

Types (``Col.type``): ``id`` (64-bit on PostgreSQL, INTEGER on SQLite so that an
integer primary key stays the rowid alias), ``int``, ``bigint``, ``float``,
``bool`` (0/1 on SQLite, read back as ``bool``), ``text``, ``str`` (VARCHAR of
``length``). JSON values are stored as text. Times are capture timestamps: float
seconds since the Unix epoch (UTC).

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

The token tables (``stream_tokens``, ``choice_tokens``, ``token_anomalies``) are
documented in ``sniffer.store.tokens_store``.

Foreign keys are not declared: rows arrive in batches from several stages and a
capture may start mid-connection, so referential order is not guaranteed.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "BOOLEAN_COLUMNS",
    "SCHEMA_VERSION",
    "TABLES",
    "TABLE_COLUMNS",
    "Col",
    "Idx",
    "TableSpec",
    "columns_in",
    "quote",
    "sqlite_ddl",
]


#: The schema's version, stored in ``meta.schema_version`` (informative: the
#: migration chain's revision in ``alembic_version`` is what
#: ``sniffer.store.schema`` checks).
SCHEMA_VERSION = 6


class Col(NamedTuple):
    """One column: ``type`` as above; ``group`` names the write that fills it
    (streams: ``""`` at the request, ``"response"`` with the response head,
    ``"close"`` and ``"server"`` with the close); ``rev`` the migration that added it."""

    name: str
    type: str
    length: int | None = None
    nullable: bool = True
    group: str = ""
    rev: str = "0001"


class Idx(NamedTuple):
    name: str
    columns: tuple[str, ...]
    rev: str = "0001"


class TableSpec(NamedTuple):
    """One table: its columns in table order, its primary key, whether an integer
    primary key is numbered by the database (``autoincrement``), its indexes (in
    the order the migration chain leaves them in a new SQLite file) and the
    migration that created it."""

    name: str
    columns: tuple[Col, ...]
    primary_key: tuple[str, ...]
    autoincrement: bool = False
    indexes: tuple[Idx, ...] = ()
    rev: str = "0001"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


def _cols(type_: str, *names: str, group: str = "", rev: str = "0001") -> tuple[Col, ...]:
    return tuple(Col(n, type_, group=group, rev=rev) for n in names)


CONNECTIONS = TableSpec(
    "connections",
    (
        Col("id", "id", nullable=False),
        Col("client_ip", "str", 64),
        Col("client_port", "int"),
        Col("server_ip", "str", 64),
        Col("server_port", "int"),
        Col("opened_at", "float"),
        Col("closed_at", "float"),
        Col("close_reason", "str", 16),
        Col("syn_seen", "bool"),
        Col("capture", "str", 16),
        Col("pid", "int"),
        Col("comm", "str", 64),
        Col("label", "text"),
        Col("node", "str", 255, rev="0002"),
    ),
    ("id",),
)

STREAMS = TableSpec(
    "streams",
    (
        Col("id", "id", nullable=False),
        Col("connection_id", "id"),
        Col("exchange", "int"),
        Col("label", "text"),
        Col("capture", "str", 16),
        Col("pid", "int"),
        Col("comm", "str", 64),
        Col("client", "str", 80),
        Col("server", "str", 80),
        Col("method", "text"),
        Col("path", "text"),
        Col("dialect", "str", 64),
        Col("model", "text"),
        Col("is_stream", "bool"),
        Col("temperature", "float"),
        Col("top_p", "float"),
        Col("max_tokens", "bigint"),
        Col("n", "int"),
        Col("seed", "bigint"),
        Col("prompt_len", "int"),
        Col("request_json", "text"),
        Col("request_headers", "text"),
        Col("status", "int", group="response"),
        Col("response_headers", "text", group="response"),
        Col("content_type", "text", group="response"),
        Col("streaming", "bool", group="response"),
        Col("t_request", "float"),
        Col("t_response", "float", group="response"),
        Col("t_first_content", "float", group="close"),
        Col("t_last_chunk", "float", group="close"),
        Col("state", "str", 16, group="close"),
        Col("reason", "text", group="close"),
        Col("done_seen", "bool", group="close"),
        Col("gap", "bool", group="close"),
        Col("chunk_count", "int", group="close"),
        Col("event_count", "int", group="close"),
        Col("text_len", "bigint", group="close"),
        Col("finish_reasons", "text", group="close"),
        Col("usage", "text", group="close"),
        Col("prompt_tokens", "bigint", group="close"),
        Col("completion_tokens", "bigint", group="close"),
        Col("response_body", "text", group="close"),
        Col("request_bytes", "bigint", group="close"),
        Col("response_bytes", "bigint", group="close"),
        Col("error", "text", group="close"),
        Col("closed_at", "float", group="close"),
        Col("text_kept", "bool"),
        Col("node", "str", 255, rev="0002"),
        Col("flags", "text", group="close", rev="0004"),
        Col("spec_source", "str", 32, group="server", rev="0005"),
        *_cols(
            "bigint",
            "spec_draft_tokens",
            "spec_accepted_tokens",
            "spec_steps",
            group="server",
            rev="0005",
        ),
        *_cols("float", "spec_accept_length", "spec_accept_rate", group="server", rev="0005"),
        Col("spec_histogram", "text", group="server", rev="0005"),
        Col("server_prompt_n", "bigint", group="server", rev="0005"),
        Col("server_prompt_ms", "float", group="server", rev="0005"),
        Col("server_predicted_n", "bigint", group="server", rev="0005"),
        Col("server_predicted_ms", "float", group="server", rev="0005"),
        Col("server_rejected", "text", group="server", rev="0005"),
    ),
    ("id",),
    indexes=(
        Idx("ix_streams_state", ("state",)),
        Idx("ix_streams_t_request", ("t_request",)),
        Idx("ix_streams_connection", ("connection_id",)),
        Idx("ix_streams_label_model", ("label", "model")),
        Idx("ix_streams_node", ("node", "t_request"), rev="0002"),
    ),
)

CHUNKS = TableSpec(
    "chunks",
    (
        Col("id", "id", nullable=False),
        Col("stream_id", "id", nullable=False),
        Col("seq", "int", nullable=False),
        Col("choice", "int"),
        Col("chunk_index", "int"),
        Col("kind", "str", 16),
        Col("ts", "float"),
        *_cols("text", "text", "reasoning", "tool_calls", "finish_reason", "logprobs"),
        *_cols("text", "usage", "raw", "server_tokens"),
    ),
    ("id",),
    autoincrement=True,
    indexes=(Idx("ix_chunks_stream_seq", ("stream_id", "seq")),),
)

ERRORS = TableSpec(
    "errors",
    (
        Col("id", "id", nullable=False),
        Col("ts", "float"),
        Col("stage", "str", 32),
        Col("kind", "str", 64),
        Col("message", "text"),
        Col("connection_id", "id"),
        Col("stream_id", "id"),
        Col("node", "str", 255, rev="0002"),
    ),
    ("id",),
    autoincrement=True,
    indexes=(Idx("ix_errors_stream", ("stream_id",)),),
)

META = TableSpec("meta", (Col("key", "str", 64, nullable=False), Col("value", "text")), ("key",))

STREAM_TOKENS = TableSpec(
    "stream_tokens",
    (
        Col("stream_id", "id", nullable=False),
        Col("tokenizer", "text"),
        Col("is_default", "bool"),
        Col("prompt_count", "int"),
        Col("prompt_ids", "text"),
        Col("output_count", "int"),
        Col("usage_diff", "text"),
        Col("tokens_per_chunk", "text"),
        Col("anomaly_count", "int"),
        Col("error", "text"),
    ),
    ("stream_id",),
)

CHOICE_TOKENS = TableSpec(
    "choice_tokens",
    (
        Col("stream_id", "id", nullable=False),
        Col("choice", "int", nullable=False),
        Col("text_len", "int"),
        Col("text_hash", "str", 32),
        Col("token_count", "int"),
        *_cols("text", "output_ids", "chunk_seqs", "chunk_counts"),
        Col("straddles", "int"),
        *_cols("text", "straddle_seqs", "tokens_per_chunk"),
        Col("server_count", "int"),
        *_cols("text", "server_tokens", "server_ids"),
        Col("server_mismatch", "int"),
    ),
    ("stream_id", "choice"),
)

TOKEN_ANOMALIES = TableSpec(
    "token_anomalies",
    (
        Col("id", "id", nullable=False),
        Col("stream_id", "id", nullable=False),
        Col("choice", "int"),
        Col("kind", "str", 32),
        Col("position", "int"),
        Col("detail", "text"),
    ),
    ("id",),
    autoincrement=True,
    indexes=(
        Idx("ix_token_anomalies_kind", ("kind",)),
        Idx("ix_token_anomalies_stream", ("stream_id",)),
    ),
)

ID_BLOCKS = TableSpec(
    "id_blocks",
    (Col("name", "str", 32, nullable=False), Col("next_id", "bigint", nullable=False)),
    ("name",),
    rev="0002",
)

CHECKPOINTS = TableSpec(
    "checkpoints",
    (
        Col("node", "str", 255, nullable=False),
        Col("written_at", "float", nullable=False),
        Col("payload", "text", nullable=False),
    ),
    ("node",),
    rev="0003",
)

#: Every table, in the order the migration chain creates them.
TABLES: dict[str, TableSpec] = {
    t.name: t
    for t in (
        CONNECTIONS,
        STREAMS,
        CHUNKS,
        ERRORS,
        META,
        STREAM_TOKENS,
        CHOICE_TOKENS,
        TOKEN_ANOMALIES,
        ID_BLOCKS,
        CHECKPOINTS,
    )
}

#: Columns of every table, in table order.
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {name: t.names for name, t in TABLES.items()}

#: Boolean columns of every table (stored 0/1 on SQLite; read back as ``bool``).
BOOLEAN_COLUMNS: dict[str, frozenset[str]] = {
    name: frozenset(c.name for c in t.columns if c.type == "bool") for name, t in TABLES.items()
}


def columns_in(table: str, *groups: str) -> tuple[str, ...]:
    """The columns of ``table`` a write of these ``groups`` fills, in table order."""
    return tuple(c.name for c in TABLES[table].columns if c.group in groups)


#: Our column names that SQLAlchemy quotes for SQLite and PostgreSQL (reserved
#: words); the DDL test holds the list.
_RESERVED = frozenset({"key"})


def quote(name: str) -> str:
    """A column name as SQLAlchemy writes it in a statement."""
    return f'"{name}"' if name in _RESERVED else name


_SQLITE_TYPES = {
    "id": "INTEGER",
    "int": "INTEGER",
    "bigint": "BIGINT",
    "float": "FLOAT",
    "bool": "BOOLEAN",
    "text": "TEXT",
}


def _sqlite_column(c: Col, key: tuple[str, ...]) -> str:
    type_ = f"VARCHAR({c.length})" if c.type == "str" else _SQLITE_TYPES[c.type]
    not_null = " NOT NULL" if not c.nullable or c.name in key else ""
    return f"{quote(c.name)} {type_}{not_null}"


def _create_table(t: TableSpec) -> str:
    """``CREATE TABLE`` text as SQLAlchemy renders it for SQLite (one column a
    line), with the columns later migrations added appended to the text of the
    last original column, as ``ALTER TABLE … ADD COLUMN`` leaves it."""
    lines = [_sqlite_column(c, t.primary_key) for c in t.columns if c.rev <= t.rev]
    added = [_sqlite_column(c, t.primary_key) for c in t.columns if c.rev > t.rev]
    if added:
        lines[-1] = ", ".join((lines[-1], *added))
    lines.append(f"PRIMARY KEY ({', '.join(quote(k) for k in t.primary_key)})")
    return f"CREATE TABLE {t.name} (\n\t" + ", \n\t".join(lines) + "\n)"


def _create_index(t: TableSpec, ix: Idx) -> str:
    return f"CREATE INDEX {ix.name} ON {t.name} ({', '.join(ix.columns)})"


def sqlite_ddl(revisions: tuple[str, ...]) -> tuple[str, ...]:
    """The statements of the schema at the last of ``revisions`` in the order the
    chain leaves them in ``sqlite_master``: per revision, the indexes it adds to
    older tables, then the tables it creates, each followed by its indexes."""
    out: list[str] = []
    for rev in revisions:
        for t in TABLES.values():
            if t.rev < rev:
                out += [_create_index(t, ix) for ix in t.indexes if ix.rev == rev]
        for t in TABLES.values():
            if t.rev == rev:
                out.append(_create_table(t))
                out += [_create_index(t, ix) for ix in t.indexes if ix.rev == rev]
    return tuple(out)
