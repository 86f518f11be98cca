"""Credentials: the one place that decides what is a secret, wherever it travels.

Pure functions (sans-IO). They run whatever the redaction setting says
(``--no-redact`` turns off personal-data redaction, never this):

* **Header names** (:func:`is_credential_header`): ``Authorization``,
  ``Proxy-Authorization``, ``Cookie``, ``Set-Cookie``, ``api-key``,
  ``x-api-key``, and every name containing ``token``, ``secret``, ``key``,
  ``password``, ``passwd``, ``cookie``, ``credential``, ``session`` or
  ``authorization`` (case-insensitive). Such headers are dropped, name and value.
* **Error texts** (:func:`scrub_error_text`): a raw byte string quoted in a
  parser's message (h11's ``illegal header line: bytearray(b'...')``, a bad
  chunk header) becomes ``<N bytes>``: a rejected header line's value never
  reaches ``errors.message``, ``streams.reason`` or ``streams.error``.
* **URLs** (:func:`scrub_url`): the userinfo of ``scheme://user:pass@host``
  becomes ``<CREDENTIAL>@``; the value of a query parameter whose name is a
  credential name (:func:`is_secret_field`, or one of ``key``, ``token``,
  ``sig``, ``signature``, ``auth``, ``code``, ``password``) becomes ``<SECRET>``.
* **JSON body fields** (:func:`scrub_json_secrets`): the value of every field,
  at any depth, whose name suggests a secret (:func:`is_secret_field`:
  after dropping ``_``/``-``/case, the name contains ``password``, ``passwd``,
  ``passphrase``, ``secret``, ``credential``, ``apikey``, ``accesskey``,
  ``privatekey``, ``authorization``, ``cookie``, or is ``pwd``/``auth``, or
  ends in ``token`` with a prefix such as ``access``/``refresh``/``id``/``auth``/
  ``bearer``/``session``/``api``/``csrf``). Every string, number and boolean
  inside that value (an object or array value included) becomes ``"<SECRET>"``.
  The plain ``token``/``tokens`` of LLM APIs (TGI's token object, logprobs)
  are NOT secret names. The scan is iterative (no recursion, any depth) and
  keeps the JSON valid; broken JSON is scanned as far as it goes.
* **Secret-shaped strings** (:data:`SECRET_SHAPES`, applied by
  ``sniffer.record.redact.Redactor`` to prompts, outputs, error bodies and messages):
  OpenAI-style keys ``sk-…`` (16+ characters after the prefix), ``Bearer``
  tokens (8+ characters), AWS access key ids (``AKIA``/``ASIA``/… + 16),
  GitHub tokens (``ghp_``/``gho_``/``ghu_``/``ghs_``/``ghr_``/``github_pat_``),
  Google API keys (``AIza`` + 35), Slack tokens (``xoxb-``…) and JWTs
  (``eyJ….eyJ….…``), each replaced by ``<SECRET>`` (``Bearer <SECRET>``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "CREDENTIAL",
    "SECRET",
    "SECRET_SHAPES",
    "is_credential_header",
    "is_secret_field",
    "scrub_error_text",
    "scrub_headers",
    "scrub_json_secrets",
    "scrub_url",
]

SECRET = "SECRET"
CREDENTIAL = "CREDENTIAL"
_SECRET_MARK = f"<{SECRET}>"

_CREDENTIAL_HEADERS = frozenset(
    {"authorization", "proxy-authorization", "cookie", "set-cookie", "api-key", "x-api-key"}
)
_CREDENTIAL_HEADER_PARTS = (
    "token",
    "secret",
    "key",
    "password",
    "passwd",
    "cookie",
    "credential",
    "session",
    "authorization",
)

_header_cache: dict[str, bool] = {}


def is_credential_header(name: str) -> bool:
    """True for a header name that may carry a credential (case-insensitive)."""
    hit = _header_cache.get(name)
    if hit is None:
        lower = name.lower()
        hit = lower in _CREDENTIAL_HEADERS or any(p in lower for p in _CREDENTIAL_HEADER_PARTS)
        if len(_header_cache) < 4096:
            _header_cache[name] = hit
    return hit


def scrub_headers(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The headers without those :func:`is_credential_header` names: the same
    tuple when it has none (twice per exchange; names known clean cost one
    look-up each, no call, no new tuple)."""
    if type(headers) is tuple:
        known = _header_cache.get
        for n, _ in headers:
            if known(n) is not False:  # a credential, or not known yet
                break
        else:
            return headers
    return tuple([(n, v) for n, v in headers if not is_credential_header(n)])


# ------------------------------------------------------------------ field names

_SECRET_FIELD = re.compile(
    r"password|passwd|passphrase|secret|credential|apikey|accesskey|privatekey"
    r"|authorization|cookie|^pwd$|^auth$"
    r"|(?:access|refresh|id|auth|bearer|session|api|csrf|xsrf|oauth|private|secret)token$"
)
_NAME_DROP = re.compile(r"[^a-z0-9]")
_QUERY_EXTRA = frozenset({"key", "token", "sig", "signature", "auth", "code", "password"})

_field_cache: dict[str, bool] = {}


def _norm(name: str) -> str:
    return _NAME_DROP.sub("", name.lower())


def is_secret_field(name: str) -> bool:
    """True for a JSON field (or query parameter) name that suggests a secret:
    ``api_key``, ``password``, ``client_secret``, ``accessToken`` … (not ``token``,
    ``max_tokens`` or ``top_k``)."""
    hit = _field_cache.get(name)
    if hit is None:
        hit = _SECRET_FIELD.search(_norm(name)) is not None
        if len(_field_cache) < 4096:
            _field_cache[name] = hit
    return hit


# ------------------------------------------------------------------ error texts

# A Python repr of bytes / bytearray, as parsers put it in their messages.
_BYTES_REPR = re.compile(
    r"""(?<![A-Za-z0-9_])(?:bytearray\()?b(?:'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")\)?"""
    r"""|(?<![A-Za-z0-9_])(?:bytearray\()?b['"].*"""
)


def _bytes_len(m: re.Match[str]) -> str:
    """``<N bytes>`` for one quoted repr: N counts the bytes between its
    quotes (an escape is one byte). Only the closing quote and the
    ``bytearray(`` call's parenthesis are cut off: a repr of bytes that end
    in a quote or a parenthesis (``b"a'"``) keeps them."""
    text = m.group()
    start = text.find("b'")
    if start < 0 or 0 <= text.find('b"') < start:
        start = text.find('b"')
    quote = text[start + 1]
    body = text[start + 2 :]
    if start > 0 and body.endswith(")"):  # bytearray(b'…')
        body = body[:-1]
    if body.endswith(quote):  # absent when the message cut the repr short
        body = body[:-1]
    n = len(re.sub(r"\\x[0-9a-fA-F]{2}|\\.", "x", body))
    return f"<{n} bytes>"


def scrub_error_text(message: str) -> str:
    """An error message without the raw bytes a parser quoted in it
    (``illegal header line: bytearray(b'Authorization …')`` →
    ``illegal header line: <31 bytes>``)."""
    if "b'" not in message and 'b"' not in message:
        return message
    return _BYTES_REPR.sub(_bytes_len, message)


# ------------------------------------------------------------------------ URLs

_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)([^/?#@]*)@")
_QUERY_PARAM = re.compile(r"([?&;])([^=&;#]*)=([^&;#]*)")


def _query_param(m: re.Match[str]) -> str:
    name = m.group(2)
    if not m.group(3):
        return m.group()
    from urllib.parse import unquote

    plain = unquote(name)
    if plain.lower() in _QUERY_EXTRA or is_secret_field(plain):
        return f"{m.group(1)}{name}={_SECRET_MARK}"
    return m.group()


def scrub_url(target: str) -> str:
    """A request target or URL without userinfo and credential query values:
    ``http://admin:pw@h/x?api_key=1&q=2`` → ``http://<CREDENTIAL>@h/x?api_key=<SECRET>&q=2``."""
    out = target
    if "@" in out:
        out = _USERINFO.sub(rf"\1<{CREDENTIAL}>@", out, count=1)
    if "=" in out and ("?" in out or ";" in out):
        out = _QUERY_PARAM.sub(_query_param, out)
    return out


# ------------------------------------------------------------------- JSON bodies

_JSON_SCAN = re.compile(
    r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]|-?[0-9][0-9.eE+-]*|true|false|null', re.DOTALL
)
_KEY_HINT = re.compile(
    r"(?i)pass|pwd|secret|credential|api.?key|access.?key|private.?key|auth|cookie|token"
)

#: Usage and limit fields of LLM requests and responses whose names hold the
#: "token" hint but are no secret: a chat request always has one (``max_tokens``),
#: and would otherwise always take the full scan. Matched as whole string tokens
#: (an unescaped opening quote), so removing them can hide no other field's name.
#: The pattern starts with the quote (the look-behind after it: no backslash
#: before the quote), so the regex engine scans for it in C; a leading
#: look-behind is tried at every position (2.5x the cost on a chat request).
_PLAIN_TOKEN_FIELDS = re.compile(
    r'"(?<!\\")(?:max_(?:completion_|new_)?tokens|(?:prompt|completion|total|cached|reasoning)_tokens)"'
)


def _has_hint_word(low: str) -> bool:
    """Whether lower-cased ASCII ``low`` holds one of ``_KEY_HINT``'s words but
    "token" (``…key`` for its three ``….?key``): with "token", a superset of
    its matches at a fraction of the cost (that search takes ~10 us on a
    120-character chat request: an alternation tried at every position; these
    substring tests ~0.2 us, a generator over a tuple of the words ~1 us)."""
    return (
        "key" in low
        or "auth" in low
        or "pass" in low
        or "pwd" in low
        or "secret" in low
        or "credential" in low
        or "cookie" in low
    )


def scrub_json_secrets(text: str) -> tuple[str, int]:
    """``text`` (JSON) with every value under a secret-named field replaced by
    ``"<SECRET>"``; and how many values were replaced. Same object when none."""
    if '"' not in text:
        return text, 0
    if text.isascii():
        low = text.lower()
        if not _has_hint_word(low) and (
            "token" not in low or "token" not in _PLAIN_TOKEN_FIELDS.sub("", text).lower()
        ):
            return text, 0  # no hint, or "token" only in usage and limit fields
    elif _KEY_HINT.search(text) is None:  # Unicode case folding: the regex's own
        return text, 0
    return _scrub_json(text)


def _scrub_json(text: str) -> tuple[str, int]:
    """:func:`scrub_json_secrets` without its pre-checks: the whole text scanned."""
    parts: list[str] = []
    pos = 0
    count = 0
    # Stack of containers: True for an object. ``secret_depth``: the stack depth
    # at which a secret field's value began (-1: not inside one).
    stack: list[bool] = []
    secret_depth = -1
    expect_key = False
    pending_secret = False  # a secret key and its ":" seen, value not yet
    last_key_secret = False
    for m in _JSON_SCAN.finditer(text):
        tok = m.group()
        c = tok[0]
        if c == "{":
            if pending_secret:
                secret_depth = len(stack)
                pending_secret = False
            stack.append(True)
            expect_key = True
            continue
        if c == "[":
            if pending_secret:
                secret_depth = len(stack)
                pending_secret = False
            stack.append(False)
            expect_key = False
            continue
        if c in "}]":
            if stack:
                stack.pop()
            if secret_depth >= 0 and len(stack) <= secret_depth:
                secret_depth = -1
            expect_key = False
            continue
        if c == ":":
            if last_key_secret and secret_depth < 0:
                pending_secret = True
            last_key_secret = False
            continue
        if c == ",":
            expect_key = bool(stack) and stack[-1]
            pending_secret = False
            continue
        # a scalar: a key or a value
        if expect_key and c == '"':
            expect_key = False
            last_key_secret = secret_depth < 0 and is_secret_field(tok[1:-1])
            continue
        if pending_secret or secret_depth >= 0:
            pending_secret = False
            if tok != "null":
                parts.append(text[pos : m.start()])
                parts.append(f'"{_SECRET_MARK}"')
                pos = m.end()
                count += 1
    if not count:
        return text, 0
    parts.append(text[pos:])
    return "".join(parts), count


# ---------------------------------------------------------- secret-shaped text

#: (regex, replacement) of secret-shaped strings; ``\\g<1>`` keeps a prefix.
SECRET_SHAPES: tuple[tuple[str, str], ...] = (
    (r"(?<![A-Za-z0-9_-])sk-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_-]{16,}", _SECRET_MARK),
    (r"(?i:\b(bearer)[ \t]+)[A-Za-z0-9._~+/=-]{8,}", r"\g<1> " + _SECRET_MARK),
    (
        r"(?<![A-Z0-9])(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}(?![A-Z0-9])",
        _SECRET_MARK,
    ),
    (r"(?<![A-Za-z0-9_])(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,})", _SECRET_MARK),
    (r"(?<![A-Za-z0-9_-])AIza[0-9A-Za-z_-]{35}", _SECRET_MARK),
    (r"(?<![A-Za-z0-9_-])xox[abprs]-[A-Za-z0-9-]{10,}", _SECRET_MARK),
    (
        r"(?<![A-Za-z0-9_-])eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
        _SECRET_MARK,
    ),
)
