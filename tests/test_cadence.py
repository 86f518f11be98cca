"""Cadence: speculative decoding inferred from chunk capture times (reports/cadence).

Synthetic cadences built here with known steps, and the real llama-cpp-python
captures in pcaps/llamacpp/ (plain vs prompt-lookup speculative decoding).
"""

from __future__ import annotations

import json
import math
import random
import statistics
from itertools import accumulate, pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.llm.cadence import GAP_FLOOR, cadence_class
from sniffer.reports.cadence import (
    BURSTY,
    MIN_GAPS,
    STEADY,
    UNKNOWN,
    cadence,
    gap_histogram,
    split_threshold,
    summarize,
)
from sniffer.reports.output import Output
from sniffer.reports.stats import load_outputs
from sniffer.runtime.replay import replay
from sniffer.store.writer import open_store


def steps_to_times(
    steps: list[int], short: tuple[float, float], long: tuple[float, float], seed: int = 1
) -> list[float]:
    """Chunk times of a stream whose verification steps emit ``steps[i]``
    tokens one chunk each: ``short`` gaps inside a step, ``long`` between."""
    rng = random.Random(seed)
    gaps: list[float] = []
    for i, n in enumerate(steps):
        if i:
            gaps.append(rng.uniform(*long))
        gaps += [rng.uniform(*short) for _ in range(n - 1)]
    return list(accumulate(gaps, initial=100.0))


def test_steady_stream() -> None:
    times = steps_to_times([1] * 60, (0.0, 0.0), (0.045, 0.055))
    c = cadence(times)
    assert c.cls == STEADY and c.gaps == 59
    assert c.burst_lengths == {1: 60} and c.tokens_per_step == 1.0 and c.threshold_ms is None
    assert c.evidence["mode_ratio"] < 2


def test_steady_stream_with_one_stall_is_still_steady() -> None:
    times = steps_to_times([1] * 40, (0.0, 0.0), (0.045, 0.055))
    times = times[:20] + [t + 0.4 for t in times[20:]]  # one 450 ms stall
    assert cadence(times).cls == STEADY


def test_bursty_stream_gives_its_steps() -> None:
    steps = [1, 4, 2, 10, 1, 3, 7, 1, 2, 5]
    times = steps_to_times(steps, (0.0005, 0.004), (0.12, 0.25))
    c = cadence(times)
    assert c.cls == BURSTY
    want: dict[int, int] = {}
    for n in steps:
        want[n] = want.get(n, 0) + 1
    assert c.burst_lengths == dict(sorted(want.items()))
    assert c.bursts == len(steps)
    assert c.tokens_per_step == pytest.approx(sum(steps) / len(steps))
    assert c.threshold_ms is not None and 4 < c.threshold_ms < 120
    assert "bursty" in c.describe() and "tokens per step" in c.describe()


def test_threshold_comes_from_the_stream_not_a_fixed_number() -> None:
    """The same step structure ten times slower (short gaps of 5–40 ms, long
    ones of 1.2–2.5 s) is found the same: the split scales with the stream."""
    steps = [3, 1, 6, 2, 2, 8, 1, 4]
    fast = cadence(steps_to_times(steps, (0.0005, 0.004), (0.12, 0.25)))
    slow = cadence(steps_to_times(steps, (0.005, 0.04), (1.2, 2.5)))
    assert fast.cls == slow.cls == BURSTY
    assert fast.burst_lengths == slow.burst_lengths
    assert slow.threshold_ms is not None and fast.threshold_ms is not None
    assert slow.threshold_ms > 5 * fast.threshold_ms


def test_tokens_per_chunk_count_in_the_step_estimate() -> None:
    """vLLM streams one chunk per step carrying every accepted token: a steady
    cadence, and the tokens per chunk are the tokens per step."""
    times = steps_to_times([1] * 20, (0.0, 0.0), (0.02, 0.03))
    tokens = [3, 2, 4, 1] * 5
    c = cadence(times, tokens)
    assert c.cls == STEADY and c.tokens_per_step == pytest.approx(sum(tokens) / 20)


def test_too_few_gaps_is_unknown() -> None:
    c = cadence([0.0, 0.1, 0.2])
    assert c.cls == UNKNOWN and c.gaps == 2 and "too few" in c.describe()
    assert cadence([]).cls == UNKNOWN and cadence([]).tokens_per_step is None
    assert cadence([float(i) for i in range(MIN_GAPS + 1)]).cls != UNKNOWN


def test_split_threshold_separates_two_modes() -> None:
    k, t = split_threshold([0.001, 0.002, 0.0015, 0.2, 0.25, 0.001, 0.3])
    assert k == 4 and 0.002 < t < 0.2


def test_gap_histogram_bins() -> None:
    bins = gap_histogram([0.1, 0.3, 3.0, 150.0, 5000.0])
    assert sum(c for _, _, c in bins) == 5
    assert bins[0] == (0.0, 0.25, 1) and bins[-1] == (1024.0, None, 1)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(min_value=0.0, max_value=5.0), max_size=80),
    st.booleans(),
)
def test_any_times_give_a_consistent_cadence(gaps: list[float], shuffle: bool) -> None:
    times = list(accumulate(gaps, initial=10.0))
    if shuffle:  # a capture clock that went backwards: negative gaps count as 0
        times = times[::-1]
    c = cadence(times)
    assert c.cls in (STEADY, BURSTY, UNKNOWN)
    assert sum(n * m for n, m in c.burst_lengths.items()) == len(times)
    if times:
        assert c.tokens_per_step is not None and c.tokens_per_step >= 1.0


def _reference(times: list[float]) -> tuple[str, int, float | None, dict[str, Any]]:
    """The cadence as first written (a loop per gap, ``max`` with a key per
    candidate, ``statistics.median``): what the faster code must equal, float
    for float. (class, k, threshold, evidence) for streams of MIN_GAPS gaps or more."""
    gaps = [max(0.0, b - a) for a, b in pairwise(times)]
    s = sorted(max(g, GAP_FLOOR) for g in gaps)
    logs = [math.log(g) for g in s]
    n = len(logs)
    total = sum(logs)
    best_k, best = 1, -1.0
    prefix = 0.0
    for k in range(1, n):
        prefix += logs[k - 1]
        between = k * (n - k) * (prefix / k - (total - prefix) / (n - k)) ** 2
        if between > best:
            best_k, best = k, between
    lo, hi = (best_k - 1) // 2, best_k + (n - best_k) // 2
    k = max(range(lo + 1, hi + 1), key=lambda i: (logs[i] - logs[i - 1], -abs(i - best_k)))
    threshold = math.sqrt(s[k - 1] * s[k])
    ordered = sorted(gaps)
    short_p50, long_p50 = statistics.median(ordered[:k]), statistics.median(ordered[k:])
    ratio = long_p50 / max(short_p50, GAP_FLOOR)
    n_long = len(gaps) - k
    bursty = ratio >= 4.0 and k / len(gaps) >= 0.2 and n_long >= 2 and n_long / len(gaps) >= 0.05
    evidence = {
        "split_ms": threshold * 1000.0,
        "short_share": k / len(gaps),
        "short_ms_p50": short_p50 * 1000.0,
        "long_ms_p50": long_p50 * 1000.0,
        "mode_ratio": ratio,
        "long_gaps": n_long,
    }
    return (BURSTY if bursty else STEADY), k, threshold * 1000.0 if bursty else None, evidence


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([0.0, 1e-6, GAP_FLOOR, 0.001, 0.2, 0.2, 1.0]),  # ties and the floor
            st.floats(min_value=0.0, max_value=5.0),
            st.floats(min_value=0.0, max_value=0.005),
        ),
        min_size=MIN_GAPS,
        max_size=150,
    ),
    st.booleans(),
)
def test_cadence_equals_the_reference_float_for_float(gaps: list[float], reverse: bool) -> None:
    """``cadence`` and ``cadence_class`` (what the live metrics count at every
    close) give exactly the first implementation's class, split and evidence,
    ties between equally wide stretches and gaps under the floor included."""
    times = list(accumulate(gaps, initial=10.0))
    if reverse:
        times = times[::-1]
    cls, k, threshold_ms, evidence = _reference(times)
    c = cadence(times)
    assert (c.cls, c.threshold_ms, c.evidence) == (cls, threshold_ms, evidence)
    assert cadence_class(times) == cls
    assert split_threshold([max(0.0, b - a) for a, b in pairwise(times)])[0] == k


def _native_split() -> Any:
    from sniffer import native_core

    native = getattr(native_core()[0], "cadence_split", None)
    if native is None:
        pytest.skip("the native core is not built (or SPARSEETY_PURE is set)")
    return native


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([0.0, 1e-6, GAP_FLOOR, 0.001, 0.2, 0.2, 1.0]),  # ties and the floor
            st.floats(min_value=0.0, max_value=5.0),
            st.floats(min_value=0.0, max_value=0.005),
            st.floats(min_value=1e-300, max_value=1e6),
        ),
        min_size=2,
        max_size=150,
    ),
    st.booleans(),
)
def test_native_split_equals_the_pure_classes_float_for_float(
    gaps: list[float], reverse: bool
) -> None:
    """The native core's split (what ``cadence_class`` takes when it runs)
    gives the pure ``_classes``' k and medians exactly, from a list or from
    the ``array('d')`` the metrics keep the chunk times in."""
    from array import array

    from sniffer.llm import cadence as mod

    native = _native_split()
    times = list(accumulate(gaps, initial=10.0))
    if reverse:
        times = times[::-1]
    c = mod._classes(mod._gaps(times))
    want = (c.k, c.short_p50, c.long_p50)
    assert native(times, GAP_FLOOR) == want
    assert native(array("d", times), GAP_FLOOR) == want


def test_native_split_leaves_infinite_gaps_and_short_streams_to_the_reference() -> None:
    native = _native_split()
    assert native([10.0, 10.0, 10.2, 10.2, *[math.inf] * 14], GAP_FLOOR) is None
    assert native([1.0, 2.0], GAP_FLOOR) is None and native([], GAP_FLOOR) is None
    assert native([1.0, 2.0, 2.5], GAP_FLOOR) == (1, 0.5, 1.0)


def test_cadence_with_an_infinite_gap_is_the_reference() -> None:
    """An infinite time (NaN logarithm differences) takes the reference path."""
    times = [10.0, 10.0, 10.2, 10.2, *[math.inf] * 14]
    cls, _, threshold_ms, evidence = _reference(times)
    c = cadence(times)
    assert c.cls == cls == cadence_class(times) and c.threshold_ms == threshold_ms
    assert repr(c.evidence) == repr(evidence)


# ---------------------------------------------------------------------------
# Real traffic: llama-cpp-python serving Gemma 3 270M (pcaps/llamacpp/)
# ---------------------------------------------------------------------------

LLAMACPP = Path(__file__).resolve().parent.parent / "pcaps" / "llamacpp"
REAL = sorted(LLAMACPP.glob("llamacpp_*.pcap"))


@pytest.fixture(scope="module")
def real_outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Output]]:
    """Each real capture replayed into its own SQLite file, read back as outputs
    (no tokenizer: one token per event, as llama.cpp streams them)."""
    out: dict[str, list[Output]] = {}
    root = tmp_path_factory.mktemp("llamacpp")
    for pcap in REAL:
        db = str(root / f"{pcap.stem}.db")
        replay(pcap, db)
        out[pcap.stem] = load_outputs(open_store(db), repeats_only=True)
    return out


def _server(pcap_stem: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((LLAMACPP / f"{pcap_stem}.expected.json").read_text())
    return data["server"]


def test_real_captures_are_there() -> None:
    assert {p.stem for p in REAL} == {"llamacpp_plain", "llamacpp_kvq8", "llamacpp_spec"}


@pytest.mark.parametrize("stem", [p.stem for p in REAL])
def test_real_cadence_tells_the_speculative_server(
    stem: str, real_outputs: dict[str, list[Output]]
) -> None:
    """The server that verified drafts in batches (the recording's own record
    of its options) streams bursty outputs; the plain and KV-quantized ones
    steady; the side summary says so."""
    outputs = real_outputs[stem]
    assert len(outputs) == 4 and all(o.cadence is not None for o in outputs)
    plain = [o for o in outputs if '"logprobs"' not in (o.request_json or "")]
    assert len(plain) == 2  # the streams without logprobs
    summary = summarize((o.cadence, o.speculative) for o in plain)
    if _server(stem)["speculative"]:
        for o in plain:
            c = o.cadence
            assert c is not None and c.cls == BURSTY, c
            assert max(c.burst_lengths) <= 11  # at most the draft (10) plus the verified token
            assert c.tokens_per_step is not None and c.tokens_per_step > 1.5
            assert c.threshold_ms is not None and c.threshold_ms < c.evidence["long_ms_p50"]
        assert summary["bursty_ratio"] == 1.0
    else:
        assert [o.cadence.cls for o in outputs if o.cadence is not None] == [STEADY] * 4
        assert summary["bursty_ratio"] == 0.0
        assert summary["tokens_per_step_p50"] == pytest.approx(1.0)
    assert summary["spec_streams"] == 0  # llama-cpp-python reports nothing


def test_real_logprobs_hide_the_speculative_cadence(real_outputs: dict[str, list[Output]]) -> None:
    """With logprobs, llama-cpp-python computes every token's log-probabilities
    on its own (hundreds of ms per token here): the same speculative server's
    streams are then steady. What the capture shows, stated."""
    with_lp = [o for o in real_outputs["llamacpp_spec"] if '"logprobs"' in (o.request_json or "")]
    assert len(with_lp) == 2
    assert all(o.cadence is not None and o.cadence.cls == STEADY for o in with_lp)


def test_a_burst_mode_with_a_long_tail_is_not_cut_through_its_tail() -> None:
    """What llama-server shows (pcaps/llama-server/): inside a verification
    step the chunks come back to back (~0.02 ms), except that the second one
    sometimes lags by a few ms; between steps ~0.5–1.1 s. In log space a lag
    of 7 ms is nearer the long mode than the short one, so the between-class
    variance alone puts the split below it; the split goes in the widest
    empty stretch between the modes, and every step is one burst."""
    rng = random.Random(7)
    steps = [1, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 5]
    gaps: list[float] = []
    for i, n in enumerate(steps):
        if i:
            gaps.append(rng.uniform(0.5, 1.1))
        for j in range(n - 1):
            lag = j == 0 and i % 3 == 0
            gaps.append(rng.uniform(0.005, 0.008) if lag else rng.uniform(0.00001, 0.0001))
    gaps += [rng.uniform(0.001, 0.004)]  # one more lag inside the last step
    steps[-1] += 1
    c = cadence(list(accumulate(gaps, initial=10.0)))
    assert c.cls == BURSTY
    want: dict[int, int] = {}
    for n in steps:
        want[n] = want.get(n, 0) + 1
    assert c.burst_lengths == dict(sorted(want.items()))
    assert c.tokens_per_step == pytest.approx(sum(steps) / len(steps))
    assert c.threshold_ms is not None and 8 < c.threshold_ms < 500
