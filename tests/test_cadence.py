"""Cadence: speculative decoding inferred from chunk capture times (reports/cadence).

Synthetic cadences built here with known steps, and the real llama-cpp-python
captures in pcaps/llamacpp/ (plain vs prompt-lookup speculative decoding).
"""

from __future__ import annotations

import random
from itertools import accumulate

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.reports.cadence import (
    BURSTY,
    MIN_GAPS,
    STEADY,
    UNKNOWN,
    cadence,
    gap_histogram,
    split_threshold,
)


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
