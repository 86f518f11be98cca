"""The output model the reports share: one choice of one recorded stream.

:func:`sniffer.reports.stats.load_outputs` reads the store into these values
(:func:`~sniffer.reports.stats.build_outputs` from rows); ``stats``, ``diff``,
``causes`` compare them. A plain value: this module imports nothing at run
time, so every report can use it without importing another report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sniffer.llm.logprobs import TokenLogprob
    from sniffer.llm.tokens import LoadedTokenizer
    from sniffer.llm.values import SpecDecode
    from sniffer.reports.cadence import Cadence

__all__ = ["Output"]


@dataclass(slots=True)
class Output:
    """One choice of one recorded stream, with its token ids and timings."""

    stream_id: int
    choice: int
    label: str | None
    model: str | None
    key: str  # fingerprint with the label and the model
    pair_key: str  # fingerprint without the label and the model
    prompt: str  # fingerprint preview
    params: tuple[tuple[str, Any], ...]
    text: str
    ids: tuple[int, ...]
    finish_reason: str | None
    state: str | None
    t_request: float | None
    ttft: float | None  # seconds
    itl: float | None  # seconds per token
    tokens_per_chunk: tuple[int, ...]
    tokenizer: LoadedTokenizer | None = field(default=None, repr=False)
    model_pair_key: str = ""  # fingerprint without the label, with the model
    dialect: str | None = None
    text_kept: bool = True  # False: sampled out, ``text`` is not the answer
    chunk_ends: tuple[int, ...] = ()  # character end of each text chunk, in order
    token_starts: tuple[int, ...] = ()  # character start of each token of ``ids``
    server_ids: tuple[int, ...] | None = None  # the server's own token ids, if known
    server_starts: tuple[int, ...] = ()  # character start of each server token
    #: the server's per-token log-probabilities (and top alternatives), when every
    #: chunk carried them and their bytes spell ``text``; see sniffer.llm.logprobs
    logprobs: tuple[TokenLogprob, ...] | None = field(default=None, repr=False)
    request_json: str | None = field(default=None, repr=False)  # the request body
    cause: str | None = None  # stats: why this variant differs from the modal one
    clock_backwards: bool = False  # flagged: its timings are left out (ttft, itl None)
    chunk_times: tuple[float, ...] = field(default=(), repr=False)  # capture time per text chunk
    #: what the server reported about speculative decoding (streams.spec_*)
    speculative: SpecDecode | None = None
    #: speculative decoding read from the chunk times (sniffer.reports.cadence)
    cadence: Cadence | None = None

    @property
    def complete(self) -> bool:
        return self.state == "complete"
