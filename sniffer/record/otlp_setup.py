"""What the daemon decides about OTLP export before the exporter loads: the
endpoint and headers, from the flags or config keys and the standard
``OTEL_EXPORTER_OTLP_*`` environment, and the error raised when the SDK is
missing. Kept apart from :mod:`sniffer.record.otlp` (re-exported there) so that
a daemon without export imports none of the exporter (``run``'s start-up).
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Iterable, Mapping

__all__ = [
    "INSTALL_HINT",
    "OtlpUnavailable",
    "parse_headers",
    "resolve_endpoint",
    "resolve_headers",
]

INSTALL_HINT = (
    "OTLP export needs the OpenTelemetry SDK: pip install 'sparseety[otlp]' "
    "(opentelemetry-sdk and opentelemetry-exporter-otlp-proto-http)"
)


class OtlpUnavailable(RuntimeError):
    """The OpenTelemetry SDK (or its OTLP/HTTP exporter) is not installed."""


def resolve_endpoint(configured: str, environ: Mapping[str, str] | None = None) -> str:
    """The OTLP/HTTP base URL: ``configured`` (flag or config key), else
    ``OTEL_EXPORTER_OTLP_ENDPOINT``; "" when neither (export off)."""
    env = os.environ if environ is None else environ
    return (configured or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")).strip()


def parse_headers(text: str) -> tuple[tuple[str, str], ...]:
    """``OTEL_EXPORTER_OTLP_HEADERS`` syntax: ``key1=value1,key2=value2``,
    values percent-decoded; malformed entries raise ``ValueError``."""
    out: list[tuple[str, str]] = []
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"OTLP header {item.strip()!r} is not KEY=VALUE")
        out.append((key.lower(), urllib.parse.unquote(value.strip())))
    return tuple(out)


def resolve_headers(
    configured: Iterable[tuple[str, str]], environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Headers sent with every export: ``OTEL_EXPORTER_OTLP_HEADERS`` overridden
    by the configured ones."""
    env = os.environ if environ is None else environ
    headers = dict(parse_headers(env.get("OTEL_EXPORTER_OTLP_HEADERS", "")))
    headers.update((k.lower(), v) for k, v in configured)
    return headers
