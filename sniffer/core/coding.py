"""Content-Encoding (gzip, x-gzip, deflate), undone incrementally (sans-IO).

Shared by the HTTP/1.1 and HTTP/2 parsers.
"""

from __future__ import annotations

import zlib

from sniffer.core.events import Headers


class BodyDecoder:
    """Incremental Content-Encoding decoder (gzip, x-gzip, deflate with or without zlib header)."""

    __slots__ = ("_d", "_raw_fallback", "_started", "coding")

    def __init__(self, coding: str) -> None:
        self.coding = coding
        self._started = False
        self._raw_fallback = coding == "deflate"
        if coding in ("gzip", "x-gzip"):
            self._d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        else:
            self._d = zlib.decompressobj(zlib.MAX_WBITS)

    def feed(self, data: bytes) -> bytes:
        if not self._started and self._raw_fallback:
            self._started = True
            try:
                return self._d.decompress(data)
            except zlib.error:
                # Raw deflate without the zlib header: common in the wild.
                self._d = zlib.decompressobj(-zlib.MAX_WBITS)
                return self._d.decompress(data)
        self._started = True
        return self._d.decompress(data)

    def flush(self) -> bytes:
        try:
            return self._d.flush()
        except zlib.error:
            return b""


def decoder_for(headers: Headers) -> tuple[BodyDecoder | None, str | None]:
    """The body decoder for a message's Content-Encoding, or an error text."""
    codings: list[str] = []
    for name, value in headers:
        if name == "content-encoding":
            codings.extend(c.strip().lower() for c in value.split(",") if c.strip())
    codings = [c for c in codings if c != "identity"]
    if not codings:
        return None, None
    if len(codings) == 1 and codings[0] in ("gzip", "x-gzip", "deflate"):
        return BodyDecoder(codings[0]), None
    return None, f"unsupported content-encoding {', '.join(codings)!r}"
