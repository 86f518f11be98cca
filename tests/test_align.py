"""Alignment and edit distance (sniffer.reports.align): exact values and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sniffer.reports.align import (
    MAX_LEN,
    common_prefix,
    common_suffix,
    edit_distance,
    edit_ratio,
    first_divergence,
    longest_common_prefix,
)


def naive_distance(a: list[int], b: list[int]) -> int:
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def naive_prefix(a: list[int], b: list[int]) -> int:
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


small = st.lists(st.integers(0, 3), max_size=40)
wide = st.lists(st.integers(0, 200_000), max_size=150)


def test_known_distances() -> None:
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance([], [1, 2, 3]) == 3
    assert edit_distance([1, 2, 3], [1, 2, 3]) == 0
    assert edit_distance([1, 2, 3, 4], [1, 3, 4]) == 1
    assert edit_distance([5] * 100, [6] * 100) == 100
    # longer than one machine word on both sides
    a = list(range(300))
    b = [*a[:100], -1, *a[100:250], *a[260:]]
    assert edit_distance(a, b) == 11


def test_prefix_divergence() -> None:
    assert common_prefix([1, 2, 3], (1, 2, 4)) == 2  # list vs tuple compares by value
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    assert first_divergence([], [7]) == 0
    assert common_suffix([1, 2, 3], [9, 2, 3]) == 2
    assert common_suffix([1, 2, 3], [9, 2, 3], limit=1) == 1
    assert longest_common_prefix([[1, 2, 3], [1, 2, 4], [1, 5]]) == 1
    assert longest_common_prefix([]) == 0
    assert longest_common_prefix([[1, 2]]) == 2


def test_ratio() -> None:
    assert edit_ratio(0, 0, 0) == 0.0
    assert edit_ratio(3, 6, 4) == 0.5
    assert edit_ratio(9, 3, 3) == 1.0


def test_cap_and_refusal() -> None:
    a = [1] * 50
    b = [2] * 50
    assert edit_distance(a, b, max_distance=10) == 11
    assert edit_distance(a, b, max_distance=50) == 50
    assert edit_distance([1] * 30, [], max_distance=5) == 6
    with pytest.raises(ValueError):
        edit_distance(a, b, max_distance=-1)
    big = [0] * (MAX_LEN + 1)
    with pytest.raises(ValueError):
        edit_distance(big, [1])
    assert edit_distance(big, [1], max_distance=3) == 4


@given(small, small)
@settings(max_examples=400)
def test_matches_dynamic_programming(a: list[int], b: list[int]) -> None:
    assert edit_distance(a, b) == naive_distance(a, b)


@given(wide, wide)
@settings(max_examples=100)
def test_matches_dynamic_programming_wide_alphabet(a: list[int], b: list[int]) -> None:
    assert edit_distance(a, b) == naive_distance(a, b)


@given(small, small)
def test_symmetric(a: list[int], b: list[int]) -> None:
    assert edit_distance(a, b) == edit_distance(b, a)


@given(small, small, small)
def test_triangle_inequality(a: list[int], b: list[int], c: list[int]) -> None:
    assert edit_distance(a, c) <= edit_distance(a, b) + edit_distance(b, c)


@given(small, small)
def test_zero_iff_equal(a: list[int], b: list[int]) -> None:
    assert (edit_distance(a, b) == 0) == (a == b)
    assert edit_distance(a, a) == 0


@given(small, small)
def test_bounds(a: list[int], b: list[int]) -> None:
    d = edit_distance(a, b)
    assert abs(len(a) - len(b)) <= d <= max(len(a), len(b))
    assert 0.0 <= edit_ratio(d, len(a), len(b)) <= 1.0


@given(small, small, st.integers(0, 45))
def test_cap_is_exact_below_and_saturates_above(a: list[int], b: list[int], cap: int) -> None:
    d = naive_distance(a, b)
    assert edit_distance(a, b, max_distance=cap) == (d if d <= cap else cap + 1)


@given(st.lists(st.integers(0, 2), max_size=300), st.lists(st.integers(0, 2), max_size=300))
def test_common_prefix_and_divergence(a: list[int], b: list[int]) -> None:
    k = naive_prefix(a, b)
    assert common_prefix(a, b) == k
    assert common_prefix(tuple(a), b) == k
    assert first_divergence(a, b) == (None if a == b else k)


@given(st.lists(st.lists(st.integers(0, 1), max_size=12), min_size=1, max_size=6))
def test_longest_common_prefix_is_min_pairwise(seqs: list[list[int]]) -> None:
    expected = min(naive_prefix(seqs[0], s) for s in seqs)
    assert longest_common_prefix(seqs) == expected
