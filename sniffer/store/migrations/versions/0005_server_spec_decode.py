"""Server-reported speculative decoding and timings, per stream.

Adds to ``streams`` what the server said about the request
(``sniffer.llm.values.SpecDecode`` and ``ServerTimings``, read by the OpenAI
dialect from vLLM's ``metrics.speculative_decoding``, llama.cpp's
``timings`` and SGLang's ``meta_info``): ``spec_source`` (``vllm``,
``llama.cpp``, ``sglang``), ``spec_draft_tokens``, ``spec_accepted_tokens``,
``spec_steps``, ``spec_accept_length`` (mean tokens per verification step),
``spec_accept_rate``, ``spec_histogram`` (JSON list: steps by accepted
count), ``server_prompt_n``, ``server_prompt_ms``, ``server_predicted_n``,
``server_predicted_ms``, and ``server_rejected`` (JSON list of the fields
the server sent out of range). NULL when the server reported nothing (and
in rows written before).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

COLUMNS = (
    ("spec_source", sa.String(32)),
    ("spec_draft_tokens", sa.BigInteger()),
    ("spec_accepted_tokens", sa.BigInteger()),
    ("spec_steps", sa.BigInteger()),
    ("spec_accept_length", sa.Float()),
    ("spec_accept_rate", sa.Float()),
    ("spec_histogram", sa.Text()),
    ("server_prompt_n", sa.BigInteger()),
    ("server_prompt_ms", sa.Float()),
    ("server_predicted_n", sa.BigInteger()),
    ("server_predicted_ms", sa.Float()),
    ("server_rejected", sa.Text()),
)


def upgrade() -> None:
    for name, type_ in COLUMNS:
        op.add_column("streams", sa.Column(name, type_))
    op.get_bind().execute(sa.text("UPDATE meta SET value = '5' WHERE key = 'schema_version'"))


def downgrade() -> None:
    for name, _ in reversed(COLUMNS):
        op.drop_column("streams", name)
    op.get_bind().execute(sa.text("UPDATE meta SET value = '4' WHERE key = 'schema_version'"))
