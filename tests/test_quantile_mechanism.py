"""The exponential mechanism for percentiles (mechanisms/quantile.py): its scores' sensitivity,
selection frequencies ∝ exp(ε·score/(2Δ)), privacy on neighbouring counts, the rank bound, the grid."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from mechanisms.quantile import (QuantileGrid, QuantileRelease, QuantilesRelease, quantile_error95, quantile_scores,
                                 release_quantile, release_quantiles)

Z = 4.5
COUNTS = (1, 2, 0, 3, 1)
NEIGHBOUR = (1, 2, 1, 3, 1)  # one more row on index 2
GRID = QuantileGrid.for_bounds(10, 14, True, 1000)  # candidates 10 … 14
MEDIAN = Fraction(1, 2)
EPSILON = 1.0
N = 40_000


def exact_probabilities(counts: tuple[int, ...], fraction: Fraction, epsilon: float) -> np.ndarray:
    """exp(ε·score/(2Δ)) normalised, with score and Δ in rows (the module's definition, in floats)."""
    p = float(fraction)
    n = sum(counts)
    below = np.concatenate([[0], np.cumsum(counts)[:-1]])
    above = n - below - np.array(counts)
    scores = -np.maximum(0, np.maximum(below - p * n, above - (1 - p) * n))
    weights = np.exp(epsilon * scores / (2 * max(p, 1 - p)))
    return weights / weights.sum()


def frequencies(counts: tuple[int, ...], fraction: Fraction = MEDIAN, epsilon: float = EPSILON) -> np.ndarray:
    picks = Counter(release_quantile(GRID, counts, fraction, epsilon).value for _ in range(N))
    return np.array([picks[GRID.candidate(i)] for i in range(GRID.count)], dtype=float)


_FRACTIONS = [Fraction(0), Fraction(1, 10), Fraction(1, 2), Fraction(9, 10), Fraction(1), Fraction(333, 1000)]


@pytest.mark.parametrize("fraction", _FRACTIONS)
def test_one_row_moves_every_score_by_at_most_max_p_and_1_minus_p_rows(fraction: Fraction) -> None:
    # Exhaustive over every count vector of 4 indices with 0…3 rows each, every row added on every
    # index (removal is the same pair read the other way); Δ is attained, so it is not overstated.
    a, b = fraction.numerator, fraction.denominator
    sensitivity = max(a, b - a)
    largest = 0
    for counts in itertools.product(range(4), repeat=4):
        before = quantile_scores(counts, fraction)
        for index in range(4):
            after = quantile_scores(tuple(c + (i == index) for i, c in enumerate(counts)), fraction)
            largest = max(largest, max(abs(x - y) for x, y in zip(before, after)))
    assert largest == sensitivity


def test_a_score_is_zero_exactly_on_the_p_quantiles() -> None:
    # 7 values 0, 1, 1, 3, 3, 3, 4 on the grid 0 … 4: the median is 3 (3 below, 3 on it, 1 above).
    assert quantile_scores(COUNTS, MEDIAN) == [-5, -1, -1, 0, -5]  # in half rows (b = 2)
    assert quantile_scores((0, 0, 0), MEDIAN) == [0, 0, 0]  # no rows: every candidate is one


# The χ² tests expect ≥ 1,000 draws a cell (the smallest here ≈ 1,380), where the χ² tail is
# accurate: each fails by chance with p ≈ 1e-8. A Δ or ε wrong by 2× gives χ² in the thousands.


def test_selection_frequencies_follow_exp_eps_score_over_2_delta() -> None:
    observed = frequencies(COUNTS)
    assert stats.chisquare(observed, exact_probabilities(COUNTS, MEDIAN, EPSILON) * N).pvalue > 1e-8


def test_selection_frequencies_follow_the_scores_of_an_uneven_fraction() -> None:
    fraction = Fraction(9, 10)  # Δ = 0.9 rows
    observed = frequencies(NEIGHBOUR, fraction, 0.5)
    expected = exact_probabilities(NEIGHBOUR, fraction, 0.5) * N
    assert expected.min() > 1000
    assert stats.chisquare(observed, expected).pvalue > 1e-8


def test_one_more_row_changes_selection_probabilities_by_at_most_e_eps() -> None:
    # Scores 0, 1 and 4 fall by half a row, index 2's rises by half a row: every exact log
    # ratio of a candidate's probabilities is within ε (here 0.54 at most).
    exact = np.log(exact_probabilities(COUNTS, MEDIAN, EPSILON) / exact_probabilities(NEIGHBOUR, MEDIAN, EPSILON))
    assert np.abs(exact).max() <= EPSILON
    p, q = frequencies(COUNTS) / N, frequencies(NEIGHBOUR) / N
    for x, y in [(p, q), (q, p)]:
        sd = np.sqrt(x * (1 - x) / N + math.exp(2 * EPSILON) * y * (1 - y) / N)
        # The true x − e^ε·y is ≤ 0 in every bin: beyond 6 sd by chance with p < 1e-9 per bin
        # and side, 1e-8 over the 10.
        assert np.all(x - math.exp(EPSILON) * y <= 6.0 * sd)


def test_without_rows_every_candidate_is_as_likely() -> None:
    observed = frequencies((0, 0, 0, 0, 0))
    assert stats.chisquare(observed).pvalue > 1e-8


def test_release_reports_its_grid_scale_and_rank_bound() -> None:
    released = release_quantile(GRID, COUNTS, MEDIAN, EPSILON)
    assert isinstance(released, QuantileRelease)
    assert (released.candidates, released.step, released.epsilon, released.delta) == (5, 1.0, EPSILON, 0.0)
    assert released.scale == pytest.approx(2 * 0.5 / EPSILON)
    assert released.error95 == pytest.approx(0.5 * 2 / EPSILON * math.log(20 * 5))


def test_several_fractions_are_released_in_order_at_epsilon_over_k_each_summing_to_epsilon() -> None:
    fractions = (Fraction(3, 4), Fraction(1, 4), Fraction(1, 2))
    released = release_quantiles(GRID, COUNTS, fractions, EPSILON)
    assert isinstance(released, QuantilesRelease) and released.fractions == fractions
    assert [r.epsilon for r in released.each] == [pytest.approx(EPSILON / 3)] * 3
    assert sum(r.epsilon for r in released.each) == pytest.approx(released.epsilon) == pytest.approx(EPSILON)
    assert released.value == tuple(r.value for r in released.each) and released.delta == 0.0
    assert [r.error95 for r in released.each] == [pytest.approx(quantile_error95(EPSILON / 3, 5, f)) for f in fractions]
    assert released.error95 == max(r.error95 for r in released.each)
    with pytest.raises(ValueError, match="at least one fraction"):
        release_quantiles(GRID, COUNTS, (), EPSILON)


@pytest.mark.parametrize("candidates", [2, 74, 1000])
@pytest.mark.parametrize(("fraction", "epsilon"), [(Fraction(1, 2), 0.1), (Fraction(9, 10), 1.0)])
def test_error95_bounds_the_rank_error_with_probability_095(candidates: int, fraction: Fraction, epsilon: float) -> None:
    # The near-worst case: one candidate with score 0 and every other just beyond the bound.
    bound = quantile_error95(epsilon, candidates, fraction)
    sensitivity = float(max(fraction, 1 - fraction))
    weights = np.exp(epsilon * np.array([0.0] + [-bound * (1 + 1e-12)] * (candidates - 1)) / (2 * sensitivity))
    p_miss = 1 - weights[0] / weights.sum()
    assert 0.04 * (candidates - 1) / candidates < p_miss <= 0.05


def test_grids_are_integers_within_the_cap_and_cells_beyond() -> None:
    ages = QuantileGrid.for_bounds(17, 90, True, 1000)
    assert (ages.integers, ages.count, ages.candidate(0), ages.candidate(73), ages.step) == (True, 74, 17, 90, 1.0)
    assert ages.index(17) == 0 and ages.index(90) == 73
    gains = QuantileGrid.for_bounds(0, 100_000, True, 1000)  # 100,001 integers: cells of 100
    assert (gains.integers, gains.count, gains.candidate(0), gains.candidate(999), gains.step) == (
        False, 1000, 50.0, 99_950.0, 100.0)
    assert gains.index(1) == 0 and gains.index(1000) == 999 and gains.index(1001) == 999  # width_bucket's hi
    ratio = QuantileGrid.for_bounds(-2.5, 2.5, False, 10)
    assert [ratio.candidate(i) for i in (0, 9)] == [-2.25, 2.25]
    flat = QuantileGrid.for_bounds(3.5, 3.5, False, 1000)
    assert (flat.count, flat.candidate(0), flat.index(1)) == (1, 3.5, 0)


@pytest.mark.parametrize(
    ("counts", "fraction", "epsilon", "match"),
    [((1, 2), MEDIAN, 1.0, "counts for a grid"), (COUNTS, Fraction(3, 2), 1.0, "fraction"),
     ((1, -1, 0, 0, 0), MEDIAN, 1.0, "non-negative"), (COUNTS, MEDIAN, 0.0, "epsilon")],
)
def test_invalid_arguments_are_rejected(counts: tuple[int, ...], fraction: Fraction, epsilon: float, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        release_quantile(GRID, counts, fraction, epsilon)
