"""Redaction of personal data in prompts and model output, before anything is stored.

Sans-IO: strings and events in, strings and events out.

Built-in patterns, each replaced by a typed placeholder:

=========== ===================================================================
``<EMAIL>`` e-mail addresses (ASCII ``local@domain.tld``)
``<ID>``     Chinese resident ID numbers: 18 characters, area code, a valid
             birth date (1800–2099), sequence, and the ISO 7064 MOD 11-2 check
             character (``X`` allowed); optional space/dash between the 6-8-4
             groups. A wrong checksum is left intact.
``<CARD>``   payment card numbers: 13–19 digits, first digit 2–6 (Visa,
             Mastercard, Amex, Discover, JCB, UnionPay, Diners), contiguous or in
             space/dash-separated groups, that pass the Luhn check. An 18-digit
             number shaped like a resident ID is never taken for a card.
``<PHONE>``  mainland-China mobile numbers (``1[3-9]X XXXX XXXX``, optional
             ``+86``/``0086``/``86`` prefix, space/dash separators) and
             international numbers written with a leading ``+`` (8–15 digits,
             separators space, dot, dash, parentheses)
``<IP>``     IPv4 addresses in text (each octet 0–255 without a leading zero;
             not part of a longer dotted run such as ``1.2.3.4.5``, not glued
             to letters as in ``v1.2.3.4``)
=========== ===================================================================

plus user patterns ``(regex, name)``, replaced by ``<NAME>`` (``<REDACTED>``
when the name is empty), applied after the built-in ones in the given order.

Cost: the pre-checks are substring tests (C scans of a few instructions per
character), not regex scans: a string without "@", a secret prefix or the
digit runs a digit pattern needs (``_digit_run``: ASCII text translated once)
skips all built-in patterns after them (a 192-character window of ``" tok"``
words: ~8k instructions, against ~78k for the one-class regex search that
stopped at every ``k``). A 4 KB request body with such digits costs about
150 µs (the regex engine's scan costs ~8 ns per character); one without is
left as it is after the pre-checks. User patterns always run.

Always on, whatever ``enabled`` says (credentials are never stored, see
``sniffer.credentials``): secret-shaped strings (``sk-…``, ``Bearer …``, AWS
key ids, GitHub/Google/Slack tokens, JWTs) → ``<SECRET>``; in JSON text, the
values of secret-named fields at any depth → ``"<SECRET>"``; raw bytes quoted
in error messages → ``<N bytes>``.

Across chunks (:class:`StreamRedactor`, the recording chain's step): each
choice's text and reasoning keep a look-behind of :data:`LOOKBEHIND`
characters before they are written, so a value split over chunks is caught
(values up to that long). The placeholder goes into the chunk where the value
starts; the following chunks lose their part of it. A chunk a redaction
touched keeps no token strings (logprobs/TGI token texts → ``<REDACTED>``,
bytes null, ids -1, alternatives dropped; ``raw`` dropped).
``StreamClosed.text_len`` becomes the stored text's length.

Token ids — the choice made: **mask the ids that overlap a redacted span**
(rather than store the ids of the redacted text). Counts, per-chunk shares,
usage comparisons and anomalies are computed on the text as sent (the
``TokenCollector`` sees events before this step); what is stored replaces
every token id overlapping a redacted span by -1 (output, prompt, server
ids) and server token texts by ``<REDACTED>``. The collector replays the
same look-behind (:func:`redact_choice_texts`) so the token pass knows the
exact spans and the stored text (for ``text_hash``), and ``verify`` does not
fail a stream because redaction changed it.

What it does not catch:

* A value longer than :data:`LOOKBEHIND` split over chunks; tool-call argument
  fragments split over chunks (each is redacted on its own).
* JSON escapes. ``request_body``, ``tool_calls``, ``raw``, ``logprobs`` and
  ``response_body`` are redacted as JSON text (:meth:`Redactor.json_text`;
  in ``logprobs`` only the strings, never a number: :meth:`Redactor.tokens_json`):
  inside string literals, and numbers in value position (``{"tel":
  13812345678}`` becomes ``{"tel": "<PHONE>"}``), so valid JSON stays valid.
  A digit written as a ``\\u0031`` escape is not seen. A USER pattern runs
  over the whole JSON text; one that matches JSON syntax (quotes, braces) is
  still applied — the text is removed as asked — and may leave the stored
  JSON invalid: write user patterns that match inside string values.
"""

from __future__ import annotations

import copy
import re
from bisect import bisect_right
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import cache
from itertools import accumulate, repeat
from typing import Any, Protocol

from sniffer.core.credentials import (
    SECRET,
    SECRET_SHAPES,
    scrub_error_text,
    scrub_json_secrets,
)
from sniffer.core.events import ChunkEvent, PipelineError, StoreEvent, StreamClosed, StreamOpened

EMAIL = "EMAIL"
ID = "ID"
CARD = "CARD"
PHONE = "PHONE"
IP = "IP"
REDACTED = "REDACTED"

#: Secret-shaped strings (``sniffer.credentials.SECRET_SHAPES``), and a cheap
#: pre-check that any of them may be present: ``sk-``, ``[Bb]earer`` (any case
#: after the B), ``A[GIKNRS][A-Z]A``, ``AIza``, ``gh[pousr]_``, ``github_pat_``,
#: ``xox`` or ``eyJ``. Only whether it finds something counts. Like
#: ``_DIGITS_RE`` it starts with ONE character class, a rare character of each
#: prefix, which the regex engine scans for in C; each alternative then checks
#: the rest around it (a leading alternation is tried at every character, about
#: six times the cost on plain text).
_SECRETS = tuple((re.compile(p), r) for p, r in SECRET_SHAPES)
_SECRET_PRE_ALTS = (
    r"(?<=sk)-|(?<=[Bb])[Ee][Aa][Rr][Ee][Rr]|(?<=A)(?:[GIKNRS][A-Z]A|Iza)"
    r"|(?<=gh[pousr]_)|(?<=github_)pat_|(?<=x)ox|(?<=eyJ)"
)
_SECRET_PRE = re.compile(f"[ABJ_bkx](?:{_SECRET_PRE_ALTS})")
#: The longest text ``_SECRET_PRE`` finds (``github_pat_``).
_SECRET_PRE_MAX = 11
#: ``_SECRET_PRE`` or a digit or "@" in one search: where an edit may start
#: when personal-data redaction is on (``json_text``'s look at each piece).
_EDIT_PRE = re.compile(f"[0-9@ABJ_bkx](?:(?<=[0-9@])|{_SECRET_PRE_ALTS})")


def _maybe_secret(s: str) -> bool:
    """False when ``_SECRET_PRE`` surely finds nothing in ``s``: none of its
    prefixes is there (each alternative's text as a substring test, a few
    guarded by a character they all hold). A substring test is a C scan of a
    few instructions per character; the regex's scan stops at every ``b``,
    ``k``, ``x``, ``_``, ``A``, ``B`` or ``J`` to try its alternatives (~400
    instructions per character of ``" tok tok"``, ~140 on English prose)."""
    return (
        "sk-" in s
        or "xox" in s
        or "eyJ" in s
        or (
            "A" in s
            and ("AG" in s or "AI" in s or "AK" in s or "AN" in s or "AR" in s or "AS" in s)
        )
        or (
            "_" in s
            and (
                "ghp_" in s
                or "gho_" in s
                or "ghu_" in s
                or "ghs_" in s
                or "ghr_" in s
                or "github_pat_" in s
            )
        )
        # [Bb][Ee][Aa][Rr][Ee][Rr]: lower() keeps ASCII letters in place (a
        # character it turns into several, or into ASCII, can only add a find)
        or (("b" in s or "B" in s) and "bearer" in s.lower())
    )


#: What every match of ``_DIGITS_RE`` holds (``_digit_run``): three digits,
#: at most one space or dash, three digits (a resident ID's first six, a
#: card's first digits or first groups, a mobile number's first seven, which
#: the 86/0086 forms hold too), three dots between digits (an IP), or a "+"
#: and a digit (an international or +86 number). Text without any
#: (``w12.34``, a year, a price, ``2024-01-15``) has nothing the digit patterns
#: can match. Three searches: each is a fast scan in C for its first
#: character (the IP's starts at its dots), one pattern with the three as
#: alternatives costs twice as much on digit-heavy text.
_SIX_DIGITS = re.compile(r"[0-9]{3}[ -]?[0-9]{3}")
_DOTTED = re.compile(r"\.(?<=[0-9]\.)[0-9]{1,3}\.[0-9]{1,3}\.[0-9]")
_PLUS_DIGIT = re.compile(r"\+[0-9]")
#: ASCII text's bytes with every digit made "0" and a dash a space (what
#: ``_SIX_DIGITS`` and ``_PLUS_DIGIT`` look for become substrings).
_DIGIT_CLASSES = bytes.maketrans(b"0123456789-", b"0000000000 ")
#: The longest text (with its look-behind) that ``Redactor.may_edit`` needs
#: to see whole: an IP's ``1.234.567.8``, or the secret prefix ``github_pat_``.
_WINDOW_PRE_MAX = max(_SECRET_PRE_MAX, 11)


def _digit_run(s: str) -> bool:
    """Whether ``s`` holds what every match of ``_DIGITS_RE`` holds (False:
    the digit patterns surely match nothing in it).

    ASCII text is translated once (``_DIGIT_CLASSES``, a C loop) and the
    searches become substring tests: ``000`` then ``000000``/``000 000``,
    ``+0``, and for the dotted quad its first inner group (``.0.``, ``.00.``,
    ``.000.``) before the regex itself. The regexes' scans stop at every digit
    (~240 instructions per character of ``w12.34 w12.35``); this costs ~6
    times less. Other text takes the three searches (``[0-9]`` is ASCII only).
    """
    if s.isascii():
        t = s.encode("ascii").translate(_DIGIT_CLASSES)
        if 48 not in t:  # no digit ("0" as an int: a bytes needle costs a TypeError)
            return False
        u = t.decode("ascii")  # (str's substring tests take no such detour)
        return (
            ("000" in u and ("000000" in u or "000 000" in u))
            or ("+" in u and "+0" in u)
            or ((".0." in u or ".00." in u or ".000." in u) and _DOTTED.search(s) is not None)
        )
    return _digit_run_searches(s)


def _digit_run_searches(s: str) -> bool:
    """:func:`_digit_run` by its three searches (any text)."""
    return (
        _SIX_DIGITS.search(s) is not None
        or _DOTTED.search(s) is not None
        or ("+" in s and _PLUS_DIGIT.search(s) is not None)
    )


#: An edit of a text: (start, end, replacement), start/end in ORIGINAL coordinates.
Edit = tuple[int, int, str]


def _merge(cur: str, edits: list[Edit], new: list[tuple[int, int, str]]) -> tuple[str, list[Edit]]:
    """Apply ``new`` (sorted, non-overlapping, in ``cur`` coordinates) to ``cur``,
    the result of ``edits`` on some original text; returns the new text and the
    edits composed in original coordinates (an edit that touches an earlier
    placeholder absorbs it)."""
    if not new:
        return cur, edits
    placed: list[tuple[int, int, int, int]] = []  # (cur start, cur end, orig start, orig end)
    d = 0
    for o_s, o_e, text in edits:
        c_s = o_s + d
        placed.append((c_s, c_s + len(text), o_s, o_e))
        d += len(text) - (o_e - o_s)
    n = len(placed)
    regions: list[list[Any]] = []
    j = 0
    for ns, ne, repl in new:
        ms, me = ns, ne
        while j < n and placed[j][1] <= ns:
            j += 1
        k = j
        while k < n and placed[k][0] < ne:
            ms = min(ms, placed[k][0])
            me = max(me, placed[k][1])
            k += 1
        if regions and ms < regions[-1][1]:
            regions[-1][1] = max(regions[-1][1], me)
            regions[-1][2].append((ns, ne, repl))
        else:
            regions.append([ms, me, [(ns, ne, repl)]])
    out: list[Edit] = []
    pieces: list[str] = []
    pos = 0
    pi = 0
    delta = 0  # cur position minus original position, before the current region
    for ms, me, subs in regions:
        while pi < n and placed[pi][1] <= ms:
            c_s, c_e, o_s, o_e = placed[pi]
            out.append((o_s, o_e, cur[c_s:c_e]))
            delta += (c_e - c_s) - (o_e - o_s)
            pi += 1
        merged = 0
        while pi < n and placed[pi][0] < me:
            c_s, c_e, o_s, o_e = placed[pi]
            merged += (c_e - c_s) - (o_e - o_s)
            pi += 1
        parts: list[str] = []
        p = ms
        for ns, ne, repl in subs:
            parts.append(cur[p:ns])
            parts.append(repl)
            p = ne
        parts.append(cur[p:me])
        text = "".join(parts)
        o_s = ms - delta
        out.append((o_s, o_s + (me - ms) - merged, text))
        delta += merged
        pieces.append(cur[pos:ms])
        pieces.append(text)
        pos = me
    while pi < n:
        c_s, c_e, o_s, o_e = placed[pi]
        out.append((o_s, o_e, cur[c_s:c_e]))
        pi += 1
    pieces.append(cur[pos:])
    return "".join(pieces), out


# The pattern starts with ONE character class, [0-9+], and each alternative
# then checks that first character and what precedes it with look-behinds:
# Python's regex engine only scans for a first character in C when the
# pattern starts with a class or a literal (a branch of classes or a leading
# look-behind defeats it and costs about ten times as much on plain text).

_DOMAIN = (
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
    r"\.[A-Za-z]{2,24}(?![A-Za-z0-9-])"
)
#: From the "@": the local part is found by walking back (a pattern starting at
#: the local part would be tried at every letter of the text).
_EMAIL_AT = re.compile("@" + _DOMAIN)
_LOCAL_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._%+-")
_LOCAL_MAX = 64

_ID_BODY = (
    r"[0-9]{5}[ -]?(?:18|19|20)[0-9]{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12][0-9]|3[01])"
    r"[ -]?[0-9]{3}[0-9Xx]"
)
_MOBILE = r"1[3-9][0-9](?:[ -]?[0-9]{4}){2}(?![0-9])"
_CARD_BODY = r"(?:[0-9]{12,18}|[0-9]{3}(?:[ -][0-9]{3,6}){2,4})(?![0-9])"
#: 8–15 digits in all (E.164); a trailing group that runs on into a dotted
#: number ("… 0958 172.16.254.1") is left out by the look-ahead.
_INTL_BODY = r"[1-9](?:[ .()-]{0,2}[0-9]){7,14}(?![0-9]|\.[0-9])"
_IP_BODY = r"[0-9]{0,2}(?:\.[0-9]{1,3}){3}(?![0-9A-Za-z]|\.[0-9])"  # octets checked after

_DIGITS_RE = re.compile(
    "[0-9+](?:"
    + "|".join(
        (
            rf"(?<=[1-9])(?<![0-9A-Za-z].){_ID_BODY}(?![0-9A-Za-z])",
            rf"(?<=[2-6])(?<![0-9+].){_CARD_BODY}",
            r"(?<=1)(?<![0-9+].)[3-9][0-9](?:[ -]?[0-9]{4}){2}(?![0-9])",
            rf"(?<=\+)(?<![0-9A-Za-z+].)86[ -]?{_MOBILE}",
            rf"(?<=0)(?<![0-9+].)086[ -]?{_MOBILE}",
            rf"(?<=8)(?<![0-9+].)6[ -]?{_MOBILE}",
            rf"(?<=\+)(?<![0-9A-Za-z+].){_INTL_BODY}",
            rf"(?<=[0-9])(?<![0-9A-Za-z.].){_IP_BODY}",
        )
    )
    + ")"
)
# Classifiers for a match of _DIGITS_RE (the context was checked already).
_ID_SHAPE = re.compile(rf"[1-9]{_ID_BODY}")
_CARD_SHAPE = re.compile(rf"[2-6]{_CARD_BODY}")
_CN_SHAPE = re.compile(rf"(?:(?:\+|00)?86[ -]?)?{_MOBILE}")
_IP_SHAPE = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3}){3}")
_GROUP_SPLIT = re.compile("[ -]")

#: A JSON string literal, or a JSON number in value position WITH the ":",
#: "[" or "," before it (one leading character class keeps the scan fast).
_JSON_TOKEN = re.compile(
    r'["\:\[,](?:(?<=")[^"\\]*(?:\\.[^"\\]*)*"'
    r"|(?<=[:\[,])[ \t\r\n]*-?[0-9][0-9.eE+-]*(?=[ \t\r\n]*[,\]}]))"
)
_JSON_NUMBER = re.compile(r"[ \t\r\n]*-?[0-9][0-9.eE+-]*[ \t\r\n]*")

_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"
_SEPARATORS = str.maketrans("", "", " -.()+")


def id_checksum_ok(value: str) -> bool:
    """The ISO 7064 MOD 11-2 check character of an 18-character resident ID."""
    v = value.translate(_SEPARATORS).upper()
    if len(v) != 18 or not v[:17].isdigit():
        return False
    total = sum(int(c) * w for c, w in zip(v[:17], _ID_WEIGHTS, strict=True))
    return _ID_CHECK[total % 11] == v[17]


def luhn_ok(digits: str) -> bool:
    """The Luhn check of a digit string (separators already removed)."""
    total = 0
    for i, c in enumerate(reversed(digits)):
        d = ord(c) - 48
        if i & 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _octets_ok(value: str) -> bool:
    for part in value.split("."):
        if int(part) > 255 or (len(part) > 1 and part[0] == "0"):
            return False
    return True


#: The event types (exactly these) :meth:`Redactor.event` may rewrite: it
#: returns any other event as it is (the native pass of
#: :meth:`StreamRedactor.events` hands those on without a call).
_REWRITTEN = (ChunkEvent, StreamOpened, StreamClosed, PipelineError)

#: :meth:`Redactor._short_text`'s bounds: the texts it keeps, their length
_CLEAN_MAX = 1024
_CLEAN_MAX_LEN = 200


class Redactor:
    """Replaces personal data in text and in store events.

    ``extra`` is a sequence of ``(regex, name)`` user patterns; ``enabled=False``
    makes every method return its input unchanged (``--no-redact``).
    ``counts`` holds replacements made, by placeholder name.
    Example: ``Redactor([(r"sk-[A-Za-z0-9]{20,}", "APIKEY")]).text(s)``.
    """

    def __init__(self, extra: Sequence[tuple[str, str]] = (), *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.counts: Counter[str] = Counter()
        self._extra: list[tuple[re.Pattern[str], str, str]] = []
        for pattern, name in extra:
            try:
                compiled = re.compile(pattern)
            except re.error as exc:
                msg = f"invalid redaction pattern {pattern!r} ({name}): {exc}"
                raise ValueError(msg) from None
            if compiled.match(""):
                msg = f"redaction pattern {pattern!r} ({name}) matches the empty string"
                raise ValueError(msg)
            label = name.strip().strip("<>") or REDACTED
            self._extra.append((compiled, label, f"<{label}>"))
        #: short texts :meth:`text` gave back as they were, and so always will
        #: (no edit, nothing counted): a stream's close reason is one of a few
        #: texts ("complete" …), redacted once each instead of at every close
        self._clean: set[str] = set()

    def clone(self) -> Redactor:
        """The same patterns and setting, with counts of its own."""
        other = copy.copy(self)
        other.counts = Counter()
        other._clean = set()
        return other

    def _short_text(self, s: str) -> str:
        """:meth:`text` of a short text that comes again and again (a close's
        reason): one look-up once it is known to need no edit."""
        if s in self._clean:
            return s
        out = self.text(s)
        if out is s and len(s) <= _CLEAN_MAX_LEN and len(self._clean) < _CLEAN_MAX:
            self._clean.add(s)
        return out

    # ------------------------------------------------------------------ text

    def _digits(self, m: re.Match[str]) -> str:
        value = m.group()
        first = value[0]
        if first == "+" or _CN_SHAPE.fullmatch(value):
            kind = PHONE  # an international number, or a mainland mobile
        elif _ID_SHAPE.fullmatch(value):
            if not id_checksum_ok(value):
                return value  # a wrong checksum: not an ID, and never a card
            kind = ID
        elif _CARD_SHAPE.fullmatch(value):
            return self._card(value)
        elif _IP_SHAPE.fullmatch(value):
            if not _octets_ok(value):
                return value
            kind = IP
        else:  # pragma: no cover - every alternative has a classifier above
            return value
        self.counts[kind] += 1
        return f"<{kind}>"

    def _email_edits(self, s: str) -> list[tuple[int, int, str]]:
        out: list[tuple[int, int, str]] = []
        pos = 0
        for m in _EMAIL_AT.finditer(s):
            at = m.start()
            start = at
            floor = max(pos, at - _LOCAL_MAX)
            while start > floor and s[start - 1] in _LOCAL_CHARS:
                start -= 1
            if start == at or (start == floor and floor > pos and s[floor - 1] in _LOCAL_CHARS):
                continue  # no local part, or one longer than 64 characters
            out.append((start, m.end(), f"<{EMAIL}>"))
            self.counts[EMAIL] += 1
            pos = m.end()
        return out

    def _card(self, value: str) -> str:
        """``<CARD>`` for a valid card number; for grouped digits also a valid
        number made of the leading groups ("4111 1111 1111 1111 123" → the
        first four groups), the rest kept."""
        if value.isdigit():
            if luhn_ok(value) and not (len(value) == 18 and _ID_SHAPE.fullmatch(value)):
                self.counts[CARD] += 1
                return f"<{CARD}>"
            return value
        groups = _GROUP_SPLIT.split(value)
        seps = _GROUP_SPLIT.findall(value)
        for k in range(len(groups), 2, -1):
            digits = "".join(groups[:k])
            if 13 <= len(digits) <= 19 and luhn_ok(digits):
                if len(digits) == 18 and _ID_SHAPE.fullmatch(value):
                    return value  # a resident ID with a wrong checksum, not a card
                self.counts[CARD] += 1
                rest = "".join(sep + g for sep, g in zip(seps[k - 1 :], groups[k:], strict=True))
                return f"<{CARD}>{rest}"
        return value

    def edits(self, s: str, *, user: bool = True) -> tuple[str, list[Edit]]:
        """``s`` redacted, and the edits that made it: ``(start, end, replacement)``
        with start/end in ``s``, sorted and non-overlapping. Order: secret-shaped
        strings (always), then, when enabled, the built-in personal-data patterns
        and (``user``) the user patterns, each pass on the result of the last."""
        if not s:
            return s, []
        cur = s
        edits: list[Edit] = []
        if _maybe_secret(s) and _SECRET_PRE.search(s) is not None:
            for compiled, repl in _SECRETS:
                new = [(m.start(), m.end(), m.expand(repl)) for m in compiled.finditer(cur)]
                if new:
                    self.counts[SECRET] += len(new)
                    cur, edits = _merge(cur, edits, new)
        if not self.enabled:
            return cur, edits
        if "@" in cur:
            cur, edits = _merge(cur, edits, self._email_edits(cur))
        if _digit_run(cur):
            new = []
            for m in _DIGITS_RE.finditer(cur):
                repl = self._digits(m)
                if repl != m.group():
                    new.append((m.start(), m.end(), repl))
            cur, edits = _merge(cur, edits, new)
        if user:
            for compiled, label, placeholder in self._extra:
                new = [(m.start(), m.end(), placeholder) for m in compiled.finditer(cur)]
                if new:
                    self.counts[label] += len(new)
                    cur, edits = _merge(cur, edits, new)
        return (s if not edits else cur), edits

    def may_edit(self, s: str) -> bool:
        """False when :meth:`edits` surely leaves ``s`` as it is: no secret
        prefix, no "@" nor the digits a digit pattern needs (``_digit_run``,
        when enabled), no user pattern to run."""
        return bool(self._extra) or self._builtins_may_edit(s)

    def _builtins_may_edit(self, s: str) -> bool:
        """:meth:`may_edit` for the built-in patterns alone: whether
        :meth:`edits` would look further than its pre-checks. False holds
        for every piece of ``s`` too: each test here finds nothing in a piece
        of a text it finds nothing in (the regexes' look-behinds are positive).
        Plain text costs the substring tests of ``_maybe_secret`` and
        ``_digit_run`` (a search with ``_EDIT_PRE`` cost 5–15 times more)."""
        if self.enabled and ("@" in s or _digit_run(s)):
            return True
        return _maybe_secret(s) and _SECRET_PRE.search(s) is not None

    def _edit_pre(self) -> re.Pattern[str]:
        """What the built-in patterns need to find before they can match."""
        return _EDIT_PRE if self.enabled else _SECRET_PRE

    def _builtins(self, s: str) -> str:
        return self.edits(s, user=False)[0]

    def text(self, s: str) -> str:
        """``s`` with secrets (always) and personal data (when enabled) replaced
        (the same object when nothing matched)."""
        if not s:
            return s
        return self.edits(s)[0]

    def _opt(self, s: str | None) -> str | None:
        return self.text(s) if s else s

    def json_text(self, s: str | None, numbers: bool = True) -> str | None:
        """JSON text, redacted so that it stays valid JSON.

        Values of secret-named fields are replaced first (at any depth, see
        ``sniffer.credentials.scrub_json_secrets``; always, like secret-shaped
        strings). Built-in patterns apply inside string literals, and (unless
        ``numbers`` is false) to numbers in value position (a match there
        becomes a quoted placeholder); text outside tokens (all of it, when the
        JSON is broken) is redacted as plain text. User patterns then run over
        the whole text.
        """
        if not s:
            return s
        scrubbed, n = scrub_json_secrets(s)
        if n:
            self.counts[SECRET] += n
            s = scrubbed
        # numbers=False: user patterns run inside the strings too, not over the text
        users = not numbers and bool(self._extra)
        # Nothing a built-in pattern needs in the whole text (a chat request's
        # "max_tokens":60 or "prompt 21": digits, no run of them), so in none
        # of its pieces: the text as it is, without a call per piece.
        if (self.enabled and users) or self._builtins_may_edit(s):
            pre = self._edit_pre()
            parts: list[str] = []
            pos = 0
            builtins = self._builtins if numbers else self.text
            # A piece ``pre`` finds nothing in is left as it is without the call
            # (the usual key, short value, brace): unless user patterns run in it.
            look = None if users else pre.search
            for m in _JSON_TOKEN.finditer(s):
                start, end = m.span()
                if start > pos:
                    gap = s[pos:start]
                    parts.append(gap if look and look(gap) is None else builtins(gap))
                tok = m.group()
                if tok[0] == '"':
                    inner = tok[1:-1]
                    red = inner if look and look(inner) is None else builtins(inner)
                    parts.append(tok if red is inner else f'"{red}"')
                elif not numbers:  # a delimiter, then a number, kept
                    parts.append(tok)
                else:  # a delimiter, then a number
                    num = tok[1:].strip()
                    red = builtins(num)
                    parts.append(tok if red is num else tok.replace(num, f'"{red}"'))
                pos = end
            tail = s[pos:]
            if pos == 0 and _JSON_NUMBER.fullmatch(tail) and not numbers:
                parts.append(tail)
            elif pos == 0 and _JSON_NUMBER.fullmatch(tail):  # a bare number document
                num = tail.strip()
                red = builtins(num)
                parts.append(tail if red is num else tail.replace(num, f'"{red}"'))
            else:
                parts.append(tail if look and look(tail) is None else builtins(tail))
            out = "".join(parts)
            if out == s:
                out = s
        else:
            out = s
        if not self.enabled or not numbers:
            return out
        for compiled, label, placeholder in self._extra:
            new, n = compiled.subn(placeholder, out)
            if n:
                self.counts[label] += n
                out = new
        return out

    def tokens_json(self, s: str | None) -> str | None:
        """Server token JSON (logprobs): its strings (token texts) redacted as
        by :meth:`json_text` (user patterns too, inside the strings only), its
        numbers (log-probabilities, token ids, byte values) never. A 16-digit
        run inside a log-probability such as ``-0.4111111111111111`` passes the
        Luhn check as often as any number does; taking it for a card number
        corrupted the stored logprobs."""
        return self.json_text(s, numbers=False)

    # ---------------------------------------------------------------- events

    def event(self, ev: StoreEvent) -> StoreEvent:
        """The event with its text fields redacted (the same object when unchanged).

        ``StreamOpened``: ``request_body`` (its typed ``request`` holds no free
        text); ``ChunkEvent``: ``text``, ``reasoning``,
        ``tool_calls``, ``logprobs``, ``raw``; ``StreamClosed``: ``response_body``
        and ``error``; ``PipelineError``: ``message``. Headers are not touched
        here: credentials are removed upstream and again by the store writer.
        Secret-shaped strings, secret-named JSON fields and raw bytes quoted in
        error texts are removed even when personal-data redaction is off.
        Any other event (of a type not in ``_REWRITTEN``, a subclass too) is
        returned as it is.
        """
        t = type(ev)
        if t not in _REWRITTEN:
            return ev
        if t is ChunkEvent:
            assert isinstance(ev, ChunkEvent)
            text = self.text(ev.text)
            reasoning = self.text(ev.reasoning)
            tool_calls = self.json_text(ev.tool_calls)
            logprobs = self.json_text(ev.logprobs, False)  # tokens_json, without a call more
            raw = self.json_text(ev.raw)
            if (
                text is ev.text
                and reasoning is ev.reasoning
                and tool_calls is ev.tool_calls
                and logprobs is ev.logprobs
                and raw is ev.raw
            ):
                return ev
            return replace(
                ev,
                text=text,
                reasoning=reasoning,
                tool_calls=tool_calls,
                logprobs=logprobs,
                raw=raw,
            )
        if t is StreamOpened:
            assert isinstance(ev, StreamOpened)
            # ev.request holds no free text: the model name and typed numbers
            body = self.json_text(ev.request_body)
            if body is ev.request_body:
                return ev
            return replace(ev, request_body=body)
        if t is StreamClosed:
            assert isinstance(ev, StreamClosed)
            response_body = self.json_text(ev.response_body)
            error = self._opt(scrub_error_text(ev.error) if ev.error else ev.error)
            reason = self._short_text(scrub_error_text(ev.reason))
            if response_body is ev.response_body and error is ev.error and reason == ev.reason:
                return ev
            return replace(ev, response_body=response_body, error=error, reason=reason)
        if t is PipelineError:
            assert isinstance(ev, PipelineError)
            message = self.text(scrub_error_text(ev.message))
            return ev if message == ev.message else replace(ev, message=message)
        return ev

    def events(self, events: Iterable[StoreEvent]) -> list[StoreEvent]:
        """Every event through :meth:`event`, in order."""
        return [self.event(ev) for ev in events]


#: Characters of a choice's text kept back (not yet written) so that a value
#: split over chunks is still seen whole: values up to this long are caught.
LOOKBEHIND = 128
#: Events of one choice kept back at most (many empty-text chunks in a row).
MAX_HELD = 256
#: The window is scanned once this many characters beyond the look-behind
#: have arrived (so each character is scanned ~3 times, not once per chunk).
STEP = 64
_LABEL = re.compile(r"<([^<>\s]+)>")
#: What replaces the token strings of a chunk whose text was redacted.
MASK = f"<{REDACTED}>"


class TextWindow:
    """The bounded look-behind over ONE text channel of one choice.

    ``push`` adds the next chunk's text; ``advance`` decides (redacts) every
    chunk that can no longer be part of a value still being written: once
    ``lookbehind + STEP`` characters are pending (or ``max_held`` chunks), the
    pending texts are redacted together, and a chunk is decided when at least
    ``lookbehind`` characters follow it and no redacted span crosses its end
    (``final``: decide them all). ``decided`` then holds, per chunk, its stored
    text and ``touched`` whether a redaction touched it (an untouched chunk's
    stored text is the very string pushed); ``spans`` the redacted spans in
    the coordinates of the choice's whole ORIGINAL text. The result depends on
    the sequence of texts only, so a token pass that replays the same chunks
    gets exactly the stored texts.
    """

    __slots__ = (
        "base",
        "clear",
        "decided",
        "lookbehind",
        "max_held",
        "pending",
        "pending_len",
        "redactor",
        "replacements",
        "scan_at",
        "spans",
        "touched",
    )

    def __init__(
        self, redactor: Redactor, *, lookbehind: int = LOOKBEHIND, max_held: int = MAX_HELD
    ) -> None:
        self.redactor = redactor
        self.lookbehind = lookbehind
        self.max_held = max_held
        #: pending characters from which advance() scans (below it, it returns at once)
        self.scan_at = lookbehind + STEP
        self.pending: list[str] = []
        self.pending_len = 0
        #: leading pending characters known to hold nothing an edit could start
        #: from (scanned by may_edit; 0 when unknown)
        self.clear = 0
        self.decided: list[str] = []
        self.touched: list[bool] = []
        self.base = 0
        self.spans: list[tuple[int, int]] = []
        #: what each span was replaced by (the stored text is the original with
        #: every span replaced by its replacement)
        self.replacements: list[str] = []

    def push(self, text: str) -> None:
        self.pending.append(text)
        self.pending_len += len(text)

    # The look-behind's states in one place, per chunk on the recording path: kept whole (C901).
    def advance(self, final: bool = False) -> None:  # noqa: C901
        pending = self.pending
        if not pending:
            return
        if not self.pending_len:  # only empty texts: nothing to look behind for
            self._decide_untouched(len(pending))
            return
        if not final and self.pending_len < self.scan_at and len(pending) <= self.max_held:
            return  # not enough new text to decide anything worth a scan
        window = "".join(pending) if len(pending) > 1 else pending[0]
        if not window:
            self._decide_untouched(len(pending))
            self.pending_len = 0
            return
        red = self.redactor
        saved = red.counts
        # The text before ``clear`` was scanned by an earlier call and nothing
        # there could start an edit: only what came since needs a look (from a
        # secret prefix's length before it, for one that straddles the two).
        start = self.clear - _WINDOW_PRE_MAX + 1
        # (may_edit(), one call less: this runs at every scan)
        if red._extra or red._builtins_may_edit(window[start:] if start > 0 else window):
            red.counts = Counter()  # counted below, once a chunk is decided
            try:
                _, edits = red.edits(window)
            finally:
                red.counts = saved
            self.clear = 0
        else:
            edits = []
            self.clear = self.pending_len
        ends = list(accumulate(map(len, pending)))
        if not edits:
            # Nothing to redact (the usual case): the same decisions as below,
            # without the per-chunk loops.
            if final:
                k = len(pending)
            else:
                k = bisect_right(ends, len(window) - self.lookbehind)
                k = max(k, len(pending) - self.max_held)
            if k <= 0:
                return
            limit = ends[k - 1]
            self._decide_untouched(k)
            self.base += limit
            self.pending_len -= limit
            self.clear = max(0, self.clear - limit)
            return
        if final:
            k = len(pending)
        else:
            cut = len(window) - self.lookbehind
            for s0, e0, _ in edits:
                if s0 < cut < e0:
                    cut = s0
            # the last chunk ending by the cut whose end no edit crosses (from
            # the last one ending by the cut down: usually that one)
            k = bisect_right(ends, cut)
            while k and any(s0 < ends[k - 1] < e0 for s0, e0, _ in edits):
                k -= 1
            k = max(k, len(pending) - self.max_held)
        if k <= 0:
            return
        limit = ends[k - 1]
        # Edits wholly inside the decided prefix (a forced decision may cut one:
        # its part inside the prefix is still removed).
        start = 0
        ei = 0
        n_edits = len(edits)
        decided = self.decided
        touched = self.touched
        for i in range(k):
            end = ends[i]
            if ei >= n_edits or edits[ei][0] >= end:
                decided.append(pending[i])
                touched.append(False)
                start = end
                continue
            parts: list[str] = []
            pos = start
            j = ei
            while j < n_edits and edits[j][0] < end:
                s0, e0, repl = edits[j]
                lo = max(s0, start)
                if lo > pos:
                    parts.append(window[pos:lo])
                if s0 >= start:
                    parts.append(repl)
                pos = max(pos, min(e0, end))
                if e0 > end:
                    break
                j += 1
            if pos < end:
                parts.append(window[pos:end])
            decided.append("".join(parts))
            touched.append(True)
            # edits that ended inside this chunk are done
            while ei < n_edits and edits[ei][1] <= end:
                ei += 1
            start = end
        for s0, e0, repl in edits:
            if s0 < limit:
                self.spans.append((self.base + s0, self.base + min(e0, limit)))
                self.replacements.append(repl)
                saved.update(_LABEL.findall(repl))
        self.base += limit
        self.pending_len -= limit
        self.clear = 0
        del pending[:k]

    def _decide_untouched(self, k: int) -> None:
        """The first ``k`` pending texts, decided as they are."""
        pending = self.pending
        self.decided += pending[:k]
        self.touched += repeat(False, k)
        del pending[:k]

    def take(self, n: int) -> tuple[list[str], list[bool]]:
        """The first ``n`` decided texts and their touched flags, removed."""
        texts = self.decided[:n]
        touched = self.touched[:n]
        del self.decided[:n]
        del self.touched[:n]
        return texts, touched


def _mask_tokens_json(text: str | None) -> str | None:
    """Server token JSON (logprobs, TGI tokens) with every token string, byte
    list, id and alternative masked: what a redacted chunk may keep."""
    if text is None:
        return None
    import json

    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return json.dumps(MASK)
    stack: list[Any] = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in list(node.items()):
                if k in ("token", "text") and isinstance(v, str):
                    node[k] = MASK
                elif k == "bytes":
                    node[k] = None
                elif k == "id" and isinstance(v, int):
                    node[k] = -1
                elif k == "top_logprobs" and isinstance(v, list):
                    node[k] = []
                elif isinstance(v, (dict, list)):
                    stack.append(v)
        elif isinstance(node, list):
            stack.extend(x for x in node if isinstance(x, (dict, list)))
    try:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    except (ValueError, RecursionError):
        return json.dumps(MASK)


class _Choice:
    """The held chunk events of one (stream, choice) and its two look-behinds."""

    __slots__ = ("choice", "events", "given", "index", "limit", "ready", "reasoning", "text")

    def __init__(self, redactor: Redactor, index: int, choice: int | None) -> None:
        self.index = index  # creation order among all choices (flush releases in it)
        self.choice = choice  # the chunk events' choice index (None: ``_COLD``)
        self.events: list[ChunkEvent] = []  # taken in, text not decided yet
        self.ready: list[ChunkEvent] = []  # decided (as stored), behind earlier events
        self.given = 0  # events given out so far
        self.text = TextWindow(redactor)
        #: the redactor's hot path takes a chunk with text without a look at
        #: the window while ``text.pending_len`` stays below it (``_arm``)
        self.limit = 0
        #: made at the choice's first reasoning text: until then every event's
        #: reasoning is "" and decided at once, untouched
        self.reasoning: TextWindow | None = None

    def taken(self) -> int:
        """Events taken in so far."""
        return self.given + len(self.ready) + len(self.events)


class _Run:
    """Consecutive held chunk events of one stream from one source: the next
    events of ``choice`` up to its ``end``-th taken in (-1 while the run is the
    stream's last and still growing), or, when ``choice`` is None, stream-level
    chunk events (already redacted, waiting behind the runs before them)."""

    __slots__ = ("choice", "end", "events")

    def __init__(self, choice: _Choice | None) -> None:
        self.choice = choice
        self.end = -1
        self.events: list[StoreEvent] = []


class _Stream:
    """A stream's choices and its held chunk events, in the order they came, as runs."""

    __slots__ = ("choices", "hot", "last", "runs")

    def __init__(self) -> None:
        self.choices: dict[int, _Choice] = {}
        self.runs: deque[_Run] = deque()
        #: the choice whose run is last (None: no run, or a stream-level one)
        self.last: _Choice | None = None
        #: ``last`` while it has no reasoning window, else ``_COLD`` (whose
        #: choice no event has): the redactor's hot path tests one attribute
        self.hot: _Choice = _COLD

    def hold(self, c: _Choice) -> None:
        """Start a run for ``c``, whose event just came after another source's."""
        runs = self.runs
        if runs:
            self._close(runs[-1])
        runs.append(_Run(c))
        self.last = c
        self.hot = c if c.reasoning is None else _COLD

    def hold_level(self, ev: StoreEvent) -> None:
        """A stream-level chunk event, redacted, behind the held ones (runs is not empty)."""
        runs = self.runs
        tail = runs[-1]
        if tail.choice is not None:
            self._close(tail)
            tail = _Run(None)
            runs.append(tail)
            self.last = None
            self.hot = _COLD
        tail.events.append(ev)

    @staticmethod
    def _close(run: _Run) -> None:
        if run.choice is not None and run.end < 0:
            run.end = run.choice.taken()

    def drain(self, out: list[StoreEvent]) -> None:
        """Give out the decided events that no undecided one precedes."""
        runs = self.runs
        while runs:
            run = runs[0]
            c = run.choice
            if c is None:
                out += run.events
                runs.popleft()
                continue
            ready = c.ready
            k = len(ready) if run.end < 0 else min(len(ready), run.end - c.given)
            if k:
                if k == len(ready):
                    out += ready
                    ready.clear()
                else:
                    out += ready[:k]
                    del ready[:k]
                c.given += k
            if run.end < 0:
                if not c.events:  # all given: nothing of the stream is held
                    runs.popleft()
                    self.last = None
                    self.hot = _COLD
                return
            if c.given < run.end:
                return
            runs.popleft()


class StreamRedactor:
    """The recording chain's redaction step: :class:`Redactor` per event, plus a
    bounded look-behind per (stream, choice) for chunk text and reasoning.

    A chunk event of a choice is held until :class:`TextWindow` has decided its
    text and reasoning (``LOOKBEHIND`` characters later, or when the stream
    closes), then written with the redacted text: a value split over chunks
    gets its placeholder in the chunk where it starts and is removed from the
    chunks after. A stream's chunk events come out in the order they went in
    (a stream-level chunk waits behind its stream's held ones). A chunk whose
    text a redaction touched keeps no token strings: its
    ``logprobs``/``server_tokens`` are masked (token texts → ``<REDACTED>``,
    bytes → null, ids → -1, alternatives dropped) and ``raw`` dropped.
    ``StreamClosed.text_len`` is the length of the text as stored.
    Sans-IO; ``counts`` are the wrapped redactor's.

    Cost: an event is appended to its choice's held list and its text to the
    look-behind; the stream's order is kept as runs of one source (one run for
    the usual stream of one choice), not per event. Every ``STEP`` characters
    or so the window is scanned and the decided events are given out together.
    With the native core, :meth:`events` is one call per batch
    (``RedactChunks``: the hot path and the usual scan without a Python step
    per chunk; ~1.8k instructions per chunk event less on the live traffic);
    the Python loop is its reference and runs for user patterns.
    """

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self._streams: dict[int, _Stream] = {}
        self._made = 0  # choices made so far
        self._removed: dict[int, int] = {}  # stream → text characters removed
        #: hand what was redacted in each closed stream's chunk text over to
        #: :meth:`take_redactions` (the token collector's masks)
        self.track_redactions = False
        #: streams closed since the last ``take_redactions()`` whose chunk text
        #: (every choice) had nothing redacted
        self._clean: list[int] = []
        #: the others: stream → choice → its spans and their replacements
        self._redactions: dict[int, dict[int, ChoiceRedactions]] = {}
        #: the native core's :func:`_clean_cut` (None: the pure core runs)
        self._native_cut = _native_clean_cut()
        #: the native core's pass of :meth:`events` over a batch (None: the
        #: pure core runs)
        self._native_events = _native_events()

    @property
    def counts(self) -> Counter[str]:
        return self.redactor.counts

    @property
    def held(self) -> int:
        """Chunk events taken in and not yet given out."""
        n = 0
        for s in self._streams.values():
            for c in s.choices.values():
                n += len(c.events) + len(c.ready)
            for run in s.runs:
                n += len(run.events)
        return n

    def events(self, events: Iterable[StoreEvent]) -> list[StoreEvent]:
        out: list[StoreEvent] = []
        red = self.redactor
        native = self._native_events
        if native is not None and type(events) is list and not red._extra:
            # The same loop, its hot path (and the usual scan) in one call;
            # every other step calls back the ones below.
            native(events, self._streams, out, red.enabled, self._chunk, self._other, self._scan)
            return out
        streams = self._streams
        chunk = self._chunk
        for ev in events:
            # (``type(ev) is``: mypy narrows on it, and no assert per chunk)
            if type(ev) is ChunkEvent:
                try:
                    s = streams[ev.stream]
                except KeyError:  # (a stream's first chunk: once per stream)
                    chunk(ev, None, out)
                    continue
                c = s.hot
                text = ev.text
                if c.choice == ev.choice and text and not ev.reasoning:
                    # Hot path: the next chunk with text of the choice whose
                    # run is the stream's last, no reasoning in the choice (so
                    # nothing decided waits in its text window: _release takes
                    # all it decides). What _chunk does for it, in fewer steps.
                    c.events.append(ev)
                    tw = c.text
                    tw.pending.append(text)
                    n = tw.pending_len = tw.pending_len + len(text)
                    if n < c.limit:
                        continue  # tw.advance() would decide nothing
                    self._scan(c, s, out)
                    continue
                chunk(ev, s, out)
            else:
                self._other(ev, out)
        return out

    def _other(self, ev: StoreEvent, out: list[StoreEvent]) -> None:
        """An event that is not exactly a :class:`ChunkEvent`, taken in."""
        if type(ev) is StreamClosed:
            self._closed(ev, out)
        else:
            out.append(self.redactor.event(ev))

    def _scan(self, c: _Choice, s: _Stream, out: list[StoreEvent]) -> None:
        """The hot path's ``_release(c, False)``, ``s.drain(out)`` and
        ``_arm(c)`` (``c`` is ``s.hot``: no reasoning window), in fewer steps
        when the window's new text holds nothing a built-in pattern needs (and
        there are no user patterns): the usual window. No edit can touch it
        then, so ``advance()`` decides by lengths alone (the chunks with
        ``lookbehind`` characters after them, untouched: :func:`_clean_cut`,
        or the native core's ``redact_clean_cut``) and ``_release`` hands the
        decided events on as they came: here without the ``decided`` and
        ``touched`` lists, ``take`` and the second look at what was decided.
        Any other window takes the steps themselves (which redo the
        pre-checks: a window with digits or an "@" is rare, and costs a regex
        scan anyway)."""
        tw = c.text
        pending = tw.pending
        n = tw.pending_len
        red = self.redactor
        if not red._extra and not tw.decided and (n >= tw.scan_at or len(pending) > tw.max_held):
            # advance() scans from ``clear`` less a secret prefix's length
            start = tw.clear - _WINDOW_PRE_MAX + 1
            cut = n - tw.lookbehind
            native = self._native_cut
            got = None if native is None else native(pending, start, cut, tw.max_held, red.enabled)
            if got is None:
                got = _clean_cut(pending, start, cut, tw.max_held, red)
            if got is not None:
                k, limit = got
                if not k:
                    tw.clear = n
                    s.drain(out)  # (_release would hand nothing on)
                else:
                    tw.base += limit
                    n = tw.pending_len = n - limit
                    tw.clear = n
                    del pending[:k]
                    events = c.events
                    done = events[:k]
                    del events[:k]
                    # _release's look at the JSON fields, then drain()'s
                    # hand-over when c's run is the stream's only one
                    for ev in done:
                        if ev.tool_calls or ev.logprobs or ev.raw:
                            self._ready_json(c, done)
                            s.drain(out)
                            break
                    else:
                        runs = s.runs
                        if len(runs) == 1 and not c.ready:
                            out += done
                            c.given += k
                            if not events:
                                runs.popleft()
                                s.last = None
                                s.hot = _COLD
                        else:
                            c.ready += done
                            s.drain(out)
                c.limit = min(tw.scan_at, n + tw.max_held - len(pending) + 1)  # _arm
                return
        self._release(c, False)
        s.drain(out)
        _arm(c)

    def _ready_json(self, c: _Choice, events: list[ChunkEvent]) -> None:
        """``events`` (decided, texts untouched, no reasoning) onto ``c.ready``,
        their JSON fields redacted."""
        ready = c.ready
        for ev in events:
            if ev.tool_calls or ev.logprobs or ev.raw:
                ready.append(self._redacted(ev, ev.text, False, ev.reasoning, False))
            else:
                ready.append(ev)

    def _chunk(self, ev: ChunkEvent, s: _Stream | None, out: list[StoreEvent]) -> None:
        """A chunk event taken in (``s``: its stream's state, if any), what is
        decided of its stream given out."""
        red = self.redactor
        choice = ev.choice
        if choice < 0:
            new = red.event(ev)
            assert isinstance(new, ChunkEvent)
            self._account(ev, new)
            if s is not None and s.runs:
                s.hold_level(new)
            else:
                out.append(new)
            return
        if s is None:
            s = self._streams[ev.stream] = _Stream()
        c = s.choices.get(choice)
        if c is None:
            c = s.choices[choice] = _Choice(red, self._made, choice)
            self._made += 1
        c.events.append(ev)
        if s.last is not c:
            s.hold(c)
        tw = c.text
        text = ev.text
        tw.pending.append(text)
        tw.pending_len += len(text)
        rw = c.reasoning
        reasoning = ev.reasoning
        if rw is None:
            if reasoning:
                rw = self._start_reasoning(c)
                s.hot = _COLD  # (s.last is c)
                rw.pending.append(reasoning)
                rw.pending_len += len(reasoning)
        elif reasoning or rw.pending:
            rw.pending.append(reasoning)
            rw.pending_len += len(reasoning)
        else:
            # No reasoning text, none pending: decided at once, as advance() would
            rw.decided.append(reasoning)
            rw.touched.append(False)
        n = tw.pending_len
        if n and n < tw.scan_at and len(tw.pending) <= tw.max_held and not tw.decided:
            # The text window's advance() would decide nothing, so _release
            # would release nothing; only the reasoning window's own step is
            # left (the same as its advance()).
            if rw is not None and rw.pending and _due(rw):
                rw.advance()
        else:
            self._release(c, False)
            s.drain(out)
        if rw is None:
            _arm(c)

    def _closed(self, ev: StreamClosed, out: list[StoreEvent]) -> None:
        """A stream's close: its held chunk events decided and given out, then
        the close (``text_len`` as stored); what was redacted noted."""
        red = self.redactor
        streams = self._streams
        found: dict[int, ChoiceRedactions] | None = None
        s = streams.pop(ev.stream, None)
        if s is not None:
            for choice, c in s.choices.items():
                self._release(c, True)
                tw = c.text
                if tw.spans:
                    if found is None:
                        found = {}
                    found[choice] = (tw.spans, tw.replacements)
            s.drain(out)
        if self.track_redactions:
            if found is None:
                self._clean.append(ev.stream)
            else:
                self._redactions[ev.stream] = found
        removed = self._removed.pop(ev.stream, 0)
        closed = red.event(ev)
        assert isinstance(closed, StreamClosed)
        if removed:
            closed = replace(closed, text_len=max(0, closed.text_len - removed))
        out.append(closed)

    def take_redactions(self) -> tuple[list[int], dict[int, dict[int, ChoiceRedactions]]]:
        """What the streams closed since the last call had redacted in their
        chunk text (with ``track_redactions`` set): the streams with nothing
        redacted, and for the others, per choice, the redacted spans of the
        choice's original text and their replacements (see :func:`apply_spans`)."""
        clean, redactions = self._clean, self._redactions
        self._clean, self._redactions = [], {}
        return clean, redactions

    def flush(self) -> list[StoreEvent]:
        """Everything still held (end of capture without stream closes)."""
        out: list[StoreEvent] = []
        choices = [c for s in self._streams.values() for c in s.choices.values()]
        choices.sort(key=_made_at)  # redaction counts in the order choices came
        for c in choices:
            self._release(c, True)
        for s in self._streams.values():
            s.drain(out)
        self._streams.clear()
        return out

    def forget(self, streams: Iterable[int]) -> list[StoreEvent]:
        """What is held of ``streams`` (streams the recording chain's tracker
        evicted: their close may never come), decided and given out as at
        :meth:`flush`; nothing is kept of them after."""
        out: list[StoreEvent] = []
        for stream in streams:
            self._removed.pop(stream, None)
            s = self._streams.pop(stream, None)
            if s is None:
                continue
            for c in sorted(s.choices.values(), key=_made_at):
                self._release(c, True)
            s.drain(out)
        return out

    @staticmethod
    def _start_reasoning(c: _Choice) -> TextWindow:
        """The reasoning window of ``c``, at its first reasoning text: the events
        held before it had "" reasoning, decided untouched."""
        rw = c.reasoning = TextWindow(c.text.redactor)
        k = len(c.events) - 1  # held before this event
        rw.decided += repeat("", k)
        rw.touched += repeat(False, k)
        return rw

    def _account(self, old: ChunkEvent, new: ChunkEvent) -> None:
        if new.text is not old.text and len(new.text) != len(old.text):
            self._removed[old.stream] = (
                self._removed.get(old.stream, 0) + len(old.text) - len(new.text)
            )

    def _release(self, c: _Choice, final: bool) -> None:
        """Move ``c``'s events whose text and reasoning are decided to ``c.ready``, as stored."""
        tw, rw = c.text, c.reasoning
        if final and rw is None and self._final_clean(c):
            return
        # advance() only where it would do something (the same test it starts
        # with, _due() inlined: this runs often)
        if tw.pending and (
            final
            or not tw.pending_len
            or tw.pending_len >= tw.scan_at
            or len(tw.pending) > tw.max_held
        ):
            tw.advance(final)
        if rw is None:
            n = len(tw.decided)  # every held event's reasoning is "", decided
        else:
            if rw.pending and (final or _due(rw)):
                rw.advance(final)
            n = min(len(tw.decided), len(rw.decided))
        if not n:
            return
        events = c.events[:n]
        del c.events[:n]
        ready = c.ready
        if rw is None and True not in tw.touched:  # (every decided text: n of them)
            # The usual case: texts untouched (each the string that came),
            # reasoning "": only the JSON fields may need a look (the usual
            # chunk has none: the events go as they are, in one extend).
            tw.decided.clear()
            tw.touched.clear()
            for ev in events:
                if ev.tool_calls or ev.logprobs or ev.raw:
                    break
            else:
                ready += events
                return
            self._ready_json(c, events)
            return
        texts, t_hits = tw.take(n)
        if rw is None:
            reasonings: Iterable[str] = (ev.reasoning for ev in events)
            r_hits: Iterable[bool] = repeat(False)
        else:
            reasonings, r_hits = rw.take(n)
        for ev, text, t_hit, reasoning, r_hit in zip(
            events, texts, t_hits, reasonings, r_hits, strict=False
        ):
            ready.append(self._redacted(ev, text, t_hit, reasoning, r_hit))

    def _final_clean(self, c: _Choice) -> bool:
        """``_release(c, True)`` (``c`` without a reasoning window, no user
        patterns) when its window's new text holds nothing a built-in pattern
        needs (:func:`_clean_cut`, or the native core's): what
        ``advance(True)`` then decides (every held text, untouched) handed
        on as ``_release`` hands it, without the ``decided`` and ``touched``
        lists. The usual stream's close. False when it is not that window
        (nothing changed: the general steps take it)."""
        red = self.redactor
        loop = self._native_events
        if loop is not None and not red._extra and loop.final_clean(c, red.enabled):
            return True  # (the usual close: no JSON field in the held events)
        tw = c.text
        pending = tw.pending
        if red._extra or tw.decided or len(c.events) != len(pending):
            return False
        n = tw.pending_len
        if n:  # (else only empty texts, or none: advance() decides them without a look)
            start = tw.clear - _WINDOW_PRE_MAX + 1
            native = self._native_cut
            got = None if native is None else native(pending, start, n, tw.max_held, red.enabled)
            if got is None:
                got = _clean_cut(pending, start, n, tw.max_held, red)
            if got is None or got[0] != len(pending):
                return False
            limit = got[1]
            tw.base += limit
            tw.pending_len = n - limit
            tw.clear = max(0, n - limit)
        pending.clear()
        events = c.events
        if not events:
            return True
        c.events = []
        for ev in events:
            if ev.tool_calls or ev.logprobs or ev.raw:
                self._ready_json(c, events)
                return True
        c.ready += events
        return True

    def _redacted(
        self, ev: ChunkEvent, text: str, t_hit: bool, reasoning: str, r_hit: bool
    ) -> ChunkEvent:
        """``ev`` as stored, given its decided text and reasoning."""
        if (
            text is ev.text
            and reasoning is ev.reasoning
            and not (t_hit or r_hit or ev.tool_calls or ev.logprobs or ev.raw)
        ):
            # Texts untouched and no JSON field to look at (json_text of None
            # or "" is the value itself): as it came.
            return ev
        red = self.redactor
        # (json_text of None or "" is the value itself: skip the call)
        tool_calls = red.json_text(ev.tool_calls) if ev.tool_calls else ev.tool_calls
        if t_hit or r_hit:
            logprobs = _mask_tokens_json(ev.logprobs)
            server_tokens = _mask_tokens_json(ev.server_tokens)
            raw = None
        else:
            logprobs = red.json_text(ev.logprobs, False) if ev.logprobs else ev.logprobs
            server_tokens = ev.server_tokens
            raw = red.json_text(ev.raw) if ev.raw else ev.raw
        if (
            text is ev.text
            and reasoning is ev.reasoning
            and tool_calls is ev.tool_calls
            and logprobs is ev.logprobs
            and server_tokens is ev.server_tokens
            and raw is ev.raw
        ):
            return ev
        new = replace(
            ev,
            text=text,
            reasoning=reasoning,
            tool_calls=tool_calls,
            logprobs=logprobs,
            server_tokens=server_tokens,
            raw=raw,
        )
        self._account(ev, new)
        return new


def _clean_cut(
    pending: list[str], start: int, cut: int, max_held: int, redactor: Redactor
) -> tuple[int, int] | None:
    """What ``TextWindow.advance()`` decides for a window of ``pending``
    texts whose text from character ``start`` on (a negative ``start``: the
    window's start) holds nothing the built-in patterns need (the earlier
    text was looked at before): ``(k, limit)``, the number of leading chunks
    ending at most ``cut`` characters in (at least ``len(pending) -
    max_held``) and where the last of them ends (0 when none). None when the
    pre-checks find something there. The reference of the native core's
    ``redact_clean_cut``, which answers None for text that is not ASCII."""
    window = "".join(pending)
    if redactor._builtins_may_edit(window[start:] if start > 0 else window):
        return None
    ends = list(accumulate(map(len, pending)))
    k = max(bisect_right(ends, cut), len(pending) - max_held)
    return (k, ends[k - 1]) if k > 0 else (0, 0)


#: ``(pending, start, cut, max_held, enabled) → (k, limit) | None``
_NativeCut = Callable[[list[str], int, int, int, bool], "tuple[int, int] | None"]


def _native_clean_cut() -> _NativeCut | None:
    """:func:`_clean_cut` as the native core has it (``enabled``: the
    redactor's), or None when the pure core runs (``SPARSEETY_PURE``) or the
    extension lacks it."""
    from sniffer import native_core

    native: _NativeCut | None = getattr(native_core()[0], "redact_clean_cut", None)
    return native


class _NativeEvents(Protocol):
    """The native core's pass of :meth:`StreamRedactor.events` over a batch
    (``RedactChunks``), and its :meth:`StreamRedactor._final_clean`."""

    def __call__(
        self,
        events: list[StoreEvent],
        streams: dict[int, _Stream],
        out: list[StoreEvent],
        enabled: bool,
        chunk: Callable[[ChunkEvent, _Stream | None, list[StoreEvent]], None],
        other: Callable[[StoreEvent, list[StoreEvent]], None],
        scan: Callable[[_Choice, _Stream, list[StoreEvent]], None],
    ) -> None: ...

    def final_clean(self, c: _Choice, enabled: bool) -> bool: ...


@cache
def _native_events() -> _NativeEvents | None:
    """The loop of :meth:`StreamRedactor.events` as the native core has it
    (for a redactor without user patterns): the hot path's chunks taken in,
    and the usual scan of :meth:`StreamRedactor._scan` (a clean window by
    ``redact_clean_cut``, its decided events given out as they came) done,
    without a Python step per chunk; every other step calls the Python one.
    None when the pure core runs (``SPARSEETY_PURE``) or the extension
    lacks it."""
    from sniffer import native_core

    cls = getattr(native_core()[0], "RedactChunks", None)
    if cls is None:
        return None
    native: _NativeEvents = cls(
        ChunkEvent, _Stream, _Choice, TextWindow, _COLD, _WINDOW_PRE_MAX, _REWRITTEN
    )
    return native


#: The choice of no chunk event (``_Stream.hot`` when its last run is no
#: choice's, or a choice with reasoning).
_COLD = _Choice(Redactor(enabled=False), -1, None)


def _arm(c: _Choice) -> None:
    """Set ``c.limit`` (``c`` has no reasoning window) after its text window
    changed other than by the hot path: below it, the hot path's chunk (text
    not empty, so each adds a character or more) leaves ``_due()`` false,
    ``pending_len`` under ``scan_at`` and the chunks held under ``max_held``:
    its ``_release`` would do nothing. (At or above it ``_release`` runs, and
    does nothing where ``_due()`` is still false.)"""
    tw = c.text
    if tw.decided:  # (never after _release when there is no reasoning window)
        c.limit = 0
        return
    n = tw.pending_len
    c.limit = min(tw.scan_at, n + tw.max_held - len(tw.pending) + 1)


def _due(w: TextWindow) -> bool:
    """Whether ``w.advance()`` would do something (``w.pending`` not empty)."""
    return not w.pending_len or w.pending_len >= w.scan_at or len(w.pending) > w.max_held


def _made_at(c: _Choice) -> int:
    return c.index


#: One choice's redactions: the spans of its original text, their replacements.
ChoiceRedactions = tuple[list[tuple[int, int]], list[str]]


def apply_spans(text: str, spans: Sequence[tuple[int, int]], replacements: Sequence[str]) -> str:
    """``text`` with each span replaced by its replacement: the text
    :class:`TextWindow` stores for the original ``text`` it gave these spans."""
    parts: list[str] = []
    pos = 0
    for (start, end), repl in zip(spans, replacements, strict=True):
        parts.append(text[pos:start])
        parts.append(repl)
        pos = end
    parts.append(text[pos:])
    return "".join(parts)


def redact_choice_texts(
    redactor: Redactor, texts: Sequence[str]
) -> tuple[list[str], list[tuple[int, int]]]:
    """What :class:`StreamRedactor` stores for one choice's chunk texts (in
    order): the stored texts, and the redacted spans of the joined original
    text. For the token pass, which sees the text as sent."""
    if not redactor._extra:
        joined = "".join(texts)
        # The pre-checks are plain searches: no match in the whole text, none
        # in any window of it, so nothing to redact (prose without a run of
        # digits a digit pattern needs, see _digit_run).
        if not (_maybe_secret(joined) and _SECRET_PRE.search(joined) is not None) and (
            not redactor.enabled or ("@" not in joined and not _digit_run(joined))
        ):
            return list(texts), []
    w = TextWindow(redactor)
    pending = w.pending
    scan_at = w.scan_at
    max_held = w.max_held
    for t in texts:
        pending.append(t)
        n = w.pending_len = w.pending_len + len(t)
        if not n or n >= scan_at or len(pending) > max_held:  # else advance() is a no-op
            w.advance()
    w.advance(final=True)
    return w.decided, w.spans


__all__ = [
    "CARD",
    "EMAIL",
    "ID",
    "IP",
    "LOOKBEHIND",
    "MASK",
    "PHONE",
    "REDACTED",
    "ChoiceRedactions",
    "Redactor",
    "StreamRedactor",
    "TextWindow",
    "apply_spans",
    "id_checksum_ok",
    "luhn_ok",
    "redact_choice_texts",
]
