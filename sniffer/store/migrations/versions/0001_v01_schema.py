"""The v0.1 schema (the baseline); brings a v0.1 database to it in place.

A database written by v0.1 has these tables but no ``alembic_version`` table,
and may lack ``streams.text_kept`` (v0.1 added it with an ALTER when it
opened an older file) or the token tables. This step therefore creates only
what is missing, so it is both the creation of a fresh database and the
upgrade of a v0.1 one. Frozen: the tables are spelled out here, not imported
from ``sniffer.store.models``, which moves on.

Revision ID: 0001
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _tables(md: sa.MetaData) -> list[sa.Table]:
    def c(name: str, type_: Any, **kw: Any) -> sa.Column[Any]:
        return sa.Column(name, type_, **kw)

    s16, s64 = sa.String(16), sa.String(64)
    connections = sa.Table(
        "connections",
        md,
        c("id", Id, primary_key=True, autoincrement=False),
        c("client_ip", s64),
        c("client_port", sa.Integer),
        c("server_ip", s64),
        c("server_port", sa.Integer),
        c("opened_at", sa.Float),
        c("closed_at", sa.Float),
        c("close_reason", s16),
        c("syn_seen", sa.Boolean),
        c("capture", s16),
        c("pid", sa.Integer),
        c("comm", s64),
        c("label", sa.Text),
    )
    streams = sa.Table(
        "streams",
        md,
        c("id", Id, primary_key=True, autoincrement=False),
        c("connection_id", Id),
        c("exchange", sa.Integer),
        c("label", sa.Text),
        c("capture", s16),
        c("pid", sa.Integer),
        c("comm", s64),
        c("client", sa.String(80)),
        c("server", sa.String(80)),
        c("method", sa.Text),
        c("path", sa.Text),
        c("dialect", s64),
        c("model", sa.Text),
        c("is_stream", sa.Boolean),
        c("temperature", sa.Float),
        c("top_p", sa.Float),
        c("max_tokens", sa.BigInteger),
        c("n", sa.Integer),
        c("seed", sa.BigInteger),
        c("prompt_len", sa.Integer),
        c("request_json", sa.Text),
        c("request_headers", sa.Text),
        c("status", sa.Integer),
        c("response_headers", sa.Text),
        c("content_type", sa.Text),
        c("streaming", sa.Boolean),
        c("t_request", sa.Float),
        c("t_response", sa.Float),
        c("t_first_content", sa.Float),
        c("t_last_chunk", sa.Float),
        c("state", s16),
        c("reason", sa.Text),
        c("done_seen", sa.Boolean),
        c("gap", sa.Boolean),
        c("chunk_count", sa.Integer),
        c("event_count", sa.Integer),
        c("text_len", sa.BigInteger),
        c("finish_reasons", sa.Text),
        c("usage", sa.Text),
        c("prompt_tokens", sa.BigInteger),
        c("completion_tokens", sa.BigInteger),
        c("response_body", sa.Text),
        c("request_bytes", sa.BigInteger),
        c("response_bytes", sa.BigInteger),
        c("error", sa.Text),
        c("closed_at", sa.Float),
        c("text_kept", sa.Boolean),
        sa.Index("ix_streams_label_model", "label", "model"),
        sa.Index("ix_streams_t_request", "t_request"),
        sa.Index("ix_streams_state", "state"),
        sa.Index("ix_streams_connection", "connection_id"),
    )
    chunks = sa.Table(
        "chunks",
        md,
        c("id", Id, primary_key=True, autoincrement=True),
        c("stream_id", Id, nullable=False),
        c("seq", sa.Integer, nullable=False),
        c("choice", sa.Integer),
        c("chunk_index", sa.Integer),
        c("kind", s16),
        c("ts", sa.Float),
        *(c(name, sa.Text) for name in ("text", "reasoning", "tool_calls", "finish_reason")),
        *(c(name, sa.Text) for name in ("logprobs", "usage", "raw", "server_tokens")),
        sa.Index("ix_chunks_stream_seq", "stream_id", "seq"),
    )
    errors = sa.Table(
        "errors",
        md,
        c("id", Id, primary_key=True, autoincrement=True),
        c("ts", sa.Float),
        c("stage", sa.String(32)),
        c("kind", s64),
        c("message", sa.Text),
        c("connection_id", Id),
        c("stream_id", Id),
        sa.Index("ix_errors_stream", "stream_id"),
    )
    meta = sa.Table("meta", md, c("key", s64, primary_key=True), c("value", sa.Text))
    stream_tokens = sa.Table(
        "stream_tokens",
        md,
        c("stream_id", Id, primary_key=True, autoincrement=False),
        c("tokenizer", sa.Text),
        c("is_default", sa.Boolean),
        c("prompt_count", sa.Integer),
        c("prompt_ids", sa.Text),
        c("output_count", sa.Integer),
        c("usage_diff", sa.Text),
        c("tokens_per_chunk", sa.Text),
        c("anomaly_count", sa.Integer),
        c("error", sa.Text),
    )
    choice_tokens = sa.Table(
        "choice_tokens",
        md,
        c("stream_id", Id, primary_key=True, autoincrement=False),
        c("choice", sa.Integer, primary_key=True, autoincrement=False),
        c("text_len", sa.Integer),
        c("text_hash", sa.String(32)),
        c("token_count", sa.Integer),
        c("output_ids", sa.Text),
        c("chunk_seqs", sa.Text),
        c("chunk_counts", sa.Text),
        c("straddles", sa.Integer),
        c("straddle_seqs", sa.Text),
        c("tokens_per_chunk", sa.Text),
        c("server_count", sa.Integer),
        c("server_tokens", sa.Text),
        c("server_ids", sa.Text),
        c("server_mismatch", sa.Integer),
    )
    token_anomalies = sa.Table(
        "token_anomalies",
        md,
        c("id", Id, primary_key=True, autoincrement=True),
        c("stream_id", Id, nullable=False),
        c("choice", sa.Integer),
        c("kind", sa.String(32)),
        c("position", sa.Integer),
        c("detail", sa.Text),
        sa.Index("ix_token_anomalies_stream", "stream_id"),
        sa.Index("ix_token_anomalies_kind", "kind"),
    )
    return [
        connections,
        streams,
        chunks,
        errors,
        meta,
        stream_tokens,
        choice_tokens,
        token_anomalies,
    ]


def upgrade() -> None:
    bind = op.get_bind()
    md = sa.MetaData()
    tables = _tables(md)
    for table in tables:
        table.create(bind, checkfirst=True)
    have = {col["name"] for col in sa.inspect(bind).get_columns("streams")}
    if "text_kept" not in have:  # a v0.1 file opened before v0.1 learnt the column
        op.add_column("streams", sa.Column("text_kept", sa.Boolean()))
    meta = md.tables["meta"]
    found = bind.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).first()
    if found is None:
        bind.execute(sa.insert(meta).values(key="schema_version", value="1"))


def downgrade() -> None:
    for table in reversed(_tables(sa.MetaData())):
        op.drop_table(table.name)
