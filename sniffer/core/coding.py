"""Content-Encoding (gzip, x-gzip, deflate), undone incrementally and capped (sans-IO).

Shared by the HTTP/1.1 and HTTP/2 parsers.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # importing the caps loads no event type (the daemon's config reads them)
    from sniffer.core.events import Headers

__all__ = [
    "MAX_DECODED_BYTES",
    "MAX_EXPANSION_RATIO",
    "RATIO_FLOOR",
    "BodyDecoder",
    "DecodeLimit",
    "decoder_for",
]


#: Decompression caps per exchange (``HttpParser`` arguments): decoded bytes at
#: most, and decoded/encoded ratio at most once past ``RATIO_FLOOR`` decoded bytes.
MAX_DECODED_BYTES = 32 << 20
MAX_EXPANSION_RATIO = 100
RATIO_FLOOR = 1 << 20


class DecodeLimit(zlib.error):
    """A body expanded past a decompression cap (recorded as a ``decode`` error)."""


class BodyDecoder:
    """Incremental Content-Encoding decoder (gzip, x-gzip, deflate with or without
    zlib header), capped: it never produces more than ``max_bytes`` in all, nor
    more than ``max_ratio`` times the encoded bytes seen (after the first
    ``RATIO_FLOOR`` bytes), so a bomb costs at most that much work; past a cap
    ``feed`` raises :class:`DecodeLimit` and decoding of the message stops."""

    __slots__ = (
        "_d",
        "_raw_fallback",
        "_started",
        "coding",
        "max_bytes",
        "max_ratio",
        "n_in",
        "n_out",
    )

    def __init__(
        self,
        coding: str,
        max_bytes: int = MAX_DECODED_BYTES,
        max_ratio: float = MAX_EXPANSION_RATIO,
    ) -> None:
        self.coding = coding
        self.max_bytes = max_bytes
        self.max_ratio = max_ratio
        self.n_in = 0
        self.n_out = 0
        self._started = False
        self._raw_fallback = coding == "deflate"
        if coding in ("gzip", "x-gzip"):
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        else:
            self._d = zlib.decompressobj(zlib.MAX_WBITS)

    def _allowed(self) -> int:
        by_ratio = max(RATIO_FLOOR, int(self.n_in * self.max_ratio))
        return min(self.max_bytes, by_ratio) - self.n_out

    def _run(self, data: bytes) -> bytes:
        allowed = self._allowed()
        if allowed <= 0:
            raise self._limit()
        out = self._d.decompress(data, allowed)
        self.n_out += len(out)
        if self._d.unconsumed_tail:
            raise self._limit()
        return out

    def _limit(self) -> DecodeLimit:
        if self.n_out >= self.max_bytes:
            return DecodeLimit(f"decoded body over the cap of {self.max_bytes} bytes")
        return DecodeLimit(
            f"body expands more than {self.max_ratio:g}:1 "
            f"({self.n_in} encoded bytes gave {self.n_out}); decoding stopped"
        )

    def feed(self, data: bytes) -> bytes:
        self.n_in += len(data)
        if not self._started and self._raw_fallback:
            self._started = True
            try:
                return self._run(data)
            except DecodeLimit:
                raise
            except zlib.error:
                # Raw deflate without the zlib header: common in the wild.
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
                self.n_out = 0
                return self._run(data)
        self._started = True
        return self._run(data)

    def flush(self) -> bytes:
        try:
            allowed = self._allowed()
            return self._d.flush(allowed) if allowed > 0 else b""
        except zlib.error:
            return b""


def decoder_for(
    headers: Headers, max_bytes: int = MAX_DECODED_BYTES, max_ratio: float = MAX_EXPANSION_RATIO
) -> tuple[BodyDecoder | None, str | None]:
    """The body decoder for a message's Content-Encoding, or an error text."""
    codings: list[str] = []
    for name, value in headers:
        if name == "content-encoding":
            codings.extend(c.strip().lower() for c in value.split(",") if c.strip())
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return None, None
    if len(codings) == 1 and codings[0] in ("gzip", "x-gzip", "deflate"):
        return BodyDecoder(codings[0], max_bytes, max_ratio), None
    return None, f"unsupported content-encoding {', '.join(codings)!r}"
