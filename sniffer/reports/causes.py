"""Why two outputs of one request differ: a cause class from what the streams show.

Pure (no I/O). Given two outputs (a *reference* side — the baseline in ``diff``,
the modal variant in ``stats`` — and the *other* side), :func:`classify` says:

* ``None`` — identical text, token ids and finish reason;
* ``retokenization_only`` — the same text, different token ids (a tokenizer
  boundary, e.g. ``"Hel"+"lo"`` vs ``"Hello"``);
* ``finish_only`` — the same text and ids, another finish reason;
* ``length_only`` — one text is a proper prefix of the other: one side stopped
  early (the finish reasons are given with the pair);
* ``near_tie`` — the servers' own log-probabilities at the fork token show the
  two chosen tokens within ``margin`` nats of each other in the reference
  side's top alternatives and/or in the other side's: numerical noise or
  kernel non-determinism, not a model change;
* ``substantive`` — the other side's token is outside the reference side's top
  alternatives, or further than ``margin`` below the chosen one (or the same,
  seen from the other side). Without alternatives, the chosen token's own
  log-probability still bounds every other token: ``log(1 − p)``; a chosen
  token more than ``margin`` above that bound makes the fork substantive;
* ``sampler_adjusted`` — instead of ``substantive`` when a side chose, at the
  fork, a token its own raw logprobs put more than ``margin`` below the other
  side's token: its sampler is adjusted (the chosen token is not the top-1 of
  its raw logprobs; llama-cpp-python applies repeat_penalty 1.1 at
  temperature 0), so the fork is the sampler's and the raw margins prove no
  model change;
* ``unknown`` — the evidence is missing (no logprobs at the fork, or too few
  to decide).

Every class says which source decided it (:data:`CAUSE_SOURCES`, ``Cause.source``):
``outputs`` (the texts, token ids and finish reasons alone: retokenization_only,
length_only, finish_only), ``server_logprobs`` (the servers' own logprobs at
the fork), ``sampler_evidence`` (sampler_adjusted: the server's chosen token is
not the top-1 of its raw logprobs), ``reference_model`` (a pair the servers'
logprobs leave ``unknown``, decided by a local reference model's margin
between the two sides' continuations at the fork, same ``margin``:
:func:`reference_cause`); None for ``unknown`` and identical pairs.

Near tie wins over substantive when the two sides' views disagree (either
server found the two tokens nearly equally likely). The fork token is the
first token where the two logprob token lists differ (both sides sent them),
else the token of the side with logprobs that holds the first differing
character; the other side's token there is then the longest of the listed
alternatives that begins the other side's text from that token's start.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sniffer.llm.logprobs import TokenLogprob, token_starts
from sniffer.reports.align import common_prefix
from sniffer.reports.output import Output

__all__ = [
    "CAUSES",
    "CAUSE_SOURCES",
    "DEFAULT_NEAR_TIE_MARGIN",
    "SAMPLER_TOLERANCE",
    "SOURCE_WORDS",
    "Cause",
    "classify",
    "distribution",
    "reference_cause",
    "sampler_adjusted",
    "source_distribution",
]

#: Every class, in the order reports list them.
CAUSES = (
    "retokenization_only",
    "near_tie",
    "substantive",
    "length_only",
    "finish_only",
    "sampler_adjusted",
    "unknown",
)
#: What decided a class (``Cause.source``), in the order reports list them.
CAUSE_SOURCES = ("outputs", "server_logprobs", "sampler_evidence", "reference_model")
#: Each source in words (text and HTML reports).
SOURCE_WORDS = {
    "outputs": "the outputs",
    "server_logprobs": "server logprobs",
    "sampler_evidence": "sampler evidence",
    "reference_model": "reference model",
}
#: The source of each class when the streams alone decide it.
_SOURCE_OF = {
    "retokenization_only": "outputs",
    "length_only": "outputs",
    "finish_only": "outputs",
    "near_tie": "server_logprobs",
    "substantive": "server_logprobs",
    "sampler_adjusted": "sampler_evidence",
}
#: Default margin (nats) between the two chosen tokens' log-probabilities for a near tie.
DEFAULT_NEAR_TIE_MARGIN = 0.5
#: A listed alternative more than this (nats) above the chosen token makes the
#: chosen token not the top-1 of the raw logprobs (the sampler was adjusted).
SAMPLER_TOLERANCE = 1e-4


def sampler_adjusted(lps: Sequence[TokenLogprob] | None) -> int:
    """Positions of an output where the chosen token is not the top-1 of its own
    raw logprobs (another listed alternative is more likely): a sampler that
    is not plain greedy on those logprobs (repetition penalties, top-k/min-p
    after a penalty)."""
    if not lps:
        return 0
    n = 0
    for t in lps:
        if t.logprob is None:
            continue
        if any(a.key != t.key and a.logprob > t.logprob + SAMPLER_TOLERANCE for a in t.top):
            n += 1
    return n


@dataclass(slots=True)
class Cause:
    """Why two outputs of one request differ: the cause class, its evidence, its source."""

    cause: str | None
    #: what the classification rests on (JSON-ready): fork token, each side's view
    evidence: dict[str, Any] = field(default_factory=dict)
    #: which source decided (CAUSE_SOURCES); None for unknown and identical
    source: str | None = None

    def __post_init__(self) -> None:
        if self.source is None and self.cause is not None:
            self.source = _SOURCE_OF.get(self.cause)


def _view(
    chosen: TokenLogprob, other_key: bytes | None, other_rest: str | None, margin: float
) -> dict[str, Any]:
    """One side's view of the fork: its chosen token against the other side's.

    ``other_key``: the other side's token bytes (both sides sent logprobs);
    else ``other_rest``: the other side's text from the fork token's start."""
    view: dict[str, Any] = {
        "chosen": chosen.text,
        "chosen_logprob": chosen.logprob,
        "top_k": len(chosen.top),
    }
    other = None
    if other_key is not None:
        other = next((a for a in chosen.top if a.key == other_key), None)
    elif other_rest is not None:
        raw = other_rest.encode("utf-8", "surrogatepass")
        found = [a for a in chosen.top if a.key and a.key != chosen.key and raw.startswith(a.key)]
        other = max(found, key=lambda a: len(a.key), default=None)
    if other is not None and chosen.logprob is not None:
        gap = chosen.logprob - other.logprob
        view.update(other=other.text, other_logprob=other.logprob, gap=gap, in_top_k=True)
        view["verdict"] = "near_tie" if abs(gap) <= margin else "substantive"
        return view
    if not chosen.top_complete:  # an alternative was unreadable: it may be the other one
        view["verdict"] = None
        view["unreadable"] = True
        return view
    if chosen.top and chosen.logprob is not None:
        view["in_top_k"] = False
        floor = min(a.logprob for a in chosen.top)
        view["gap_at_least"] = max(0.0, chosen.logprob - floor)
        view["verdict"] = "substantive"  # outside the server's own top-k
        return view
    if chosen.logprob is not None and -math.inf < chosen.logprob <= 0.0:
        p = math.exp(chosen.logprob)
        if p >= 1.0:  # every other token had probability 0
            view["gap_at_least"] = None
            view["verdict"] = "substantive"
            return view
        gap = chosen.logprob - math.log1p(-p)  # no other token above log(1 - p)
        view["gap_at_least"] = gap
        view["verdict"] = "substantive" if gap > margin else None
        return view
    view["verdict"] = None
    return view


def _fork_token(lps: Sequence[TokenLogprob], char: int) -> int | None:
    starts = token_starts(lps)
    j = None
    for i, s in enumerate(starts):
        if s <= char:
            j = i
        else:
            break
    return j


def classify(
    ref: Output,
    other: Output,
    *,
    margin: float = DEFAULT_NEAR_TIE_MARGIN,
    tokens_equal: bool | None = None,
) -> Cause:
    """The cause class of ``other`` differing from ``ref`` (see the module doc).

    ``tokens_equal``: whether the caller found the two token sequences equal
    (``diff`` compares in server ids when both sides carry them); by default
    server ids when both have them, else the re-tokenized ids."""
    if ref.text == other.text:
        if tokens_equal is not None:
            same_ids = tokens_equal
        elif ref.server_ids is not None and other.server_ids is not None:
            same_ids = ref.server_ids == other.server_ids
        else:
            same_ids = ref.ids == other.ids or ref.tokenizer is not other.tokenizer
        if not same_ids:
            return Cause("retokenization_only", {"text_equal": True})
        if ref.finish_reason != other.finish_reason:
            return Cause("finish_only", {"text_equal": True})
        return Cause(None)
    char = common_prefix(ref.text, other.text)
    if char == min(len(ref.text), len(other.text)):
        shorter = "reference" if len(ref.text) < len(other.text) else "other"
        return Cause("length_only", {"char": char, "stopped_early": shorter})
    bl, cl = ref.logprobs, other.logprobs
    ev: dict[str, Any] = {"char": char}
    views: dict[str, dict[str, Any]] = {}
    if bl is not None and cl is not None:
        k = common_prefix([t.key for t in bl], [t.key for t in cl])
        if k < len(bl) and k < len(cl):
            ev["fork_token"] = k
            views["reference"] = _view(bl[k], cl[k].key, None, margin)
            views["other"] = _view(cl[k], bl[k].key, None, margin)
    else:
        for name, mine, theirs in (("reference", bl, other), ("other", cl, ref)):
            if mine is None:
                continue
            j = _fork_token(mine, char)
            if j is None:
                continue
            start = token_starts(mine)[j]
            ev["fork_token"] = j
            views[name] = _view(mine[j], None, theirs.text[start:], margin)
    ev.update({f"{k}_view": v for k, v in views.items()})
    verdicts = {v.get("verdict") for v in views.values()}
    if "near_tie" in verdicts:
        return Cause("near_tie", ev)
    if "substantive" in verdicts:
        adjusted = {"reference": sampler_adjusted(bl), "other": sampler_adjusted(cl)}
        against = [
            name
            for name, v in views.items()
            # this side chose against its own raw logprobs at the fork, by more
            # than the margin, on a sampler that is adjusted: the fork is the
            # sampler's (penalties), the raw margins are not what it chose by
            if adjusted[name] and v.get("gap") is not None and v["gap"] < -margin
        ]
        if against:
            ev["sampler_adjusted_positions"] = {k: n for k, n in adjusted.items() if n}
            ev["chose_against_raw_logprobs"] = against
            return Cause("sampler_adjusted", ev)
        return Cause("substantive", ev)
    ev["why"] = "no logprobs at the fork" if not views else "logprobs too few to decide"
    return Cause("unknown", ev)


def distribution(causes: Sequence[str | None]) -> dict[str, int]:
    """Count per class (every class listed, zeros included)."""
    out = dict.fromkeys(CAUSES, 0)
    for c in causes:
        if c is not None:
            out[c] = out.get(c, 0) + 1
    return out


def source_distribution(sources: Sequence[str | None]) -> dict[str, int]:
    """Count of classes per deciding source (every source listed, zeros included)."""
    out = dict.fromkeys(CAUSE_SOURCES, 0)
    for s in sources:
        if s is not None:
            out[s] = out.get(s, 0) + 1
    return out


def reference_cause(result: dict[str, Any] | None, margin: float) -> Cause | None:
    """near_tie or substantive from a reference model's scores of a pair
    (:meth:`sniffer.llm.reference.ReferenceModel.score`'s ``result``): the two
    sides' continuations at the fork within ``margin`` nats of each other, or
    not. None when the result cannot decide (an error, a side not scored)."""
    if not result or "error" in result:
        return None
    fb, fc = result.get("baseline_fork_surprisal"), result.get("candidate_fork_surprisal")
    if not isinstance(fb, int | float) or not isinstance(fc, int | float):
        return None
    if math.isnan(fb) or math.isnan(fc):
        return None
    gap = float(fc) - float(fb)  # > 0: the reference finds the baseline's side more likely
    view = {
        "model": result.get("model"),
        "ids": result.get("ids"),
        "fork_token": result.get("fork_token"),
        "baseline_fork_surprisal": fb,
        "candidate_fork_surprisal": fc,
        "gap": gap if math.isfinite(gap) else None,
        "preferred_at_fork": result.get("preferred_at_fork"),
    }
    for k in ("fork_char", "fork_scoring"):
        if k in result:
            view[k] = result[k]
    verdict = "near_tie" if abs(gap) <= margin else "substantive"
    return Cause(verdict, {"reference_model_view": view}, "reference_model")
