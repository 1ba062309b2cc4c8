"""The exponential mechanism for MODE: selection frequencies ∝ exp(ε·q/(2Δ)), privacy, bounds."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from functools import lru_cache

import numpy as np
import pytest
from scipy import stats

from mechanisms.exponential import mode_error95, release_mode
from mechanisms.samplers import gumbel_argmax

Z = 4.5
CATEGORIES = ("blue", "brown", "green", "grey", "hazel")
COUNTS = (0, 1, 2, 4, 6)
EPSILON = 0.5
N = 20000


@lru_cache(maxsize=None)
def frequencies(counts: tuple[int, ...], epsilon: float, sensitivity: float = 1.0) -> np.ndarray:
    picks = Counter(release_mode(CATEGORIES, counts, epsilon, sensitivity).value for _ in range(N))
    return np.array([picks[c] for c in CATEGORIES], dtype=float)


def exponential_mechanism(qualities: tuple[float, ...], epsilon: float, sensitivity: float = 1.0) -> np.ndarray:
    weights = np.exp(epsilon * np.array(qualities, dtype=float) / (2 * sensitivity))
    return weights / weights.sum()


def permute_and_flip(counts: tuple[int, ...], epsilon: float) -> np.ndarray:
    """Exact selection probabilities of permute-and-flip (report noisy max with exponential noise)."""
    accept = np.exp(epsilon * (np.array(counts, dtype=float) - max(counts)) / 2)
    probabilities = np.zeros(len(counts))
    orders = list(itertools.permutations(range(len(counts))))
    for order in orders:
        reach = 1.0
        for i in order:
            probabilities[i] += reach * accept[i]
            reach *= 1 - accept[i]
    return probabilities / len(orders)


# The χ² tests below expect ≥ 1000 draws a cell, where the χ² tail is accurate: each fails by
# chance with p ≈ 1e-8 (a floor of 1e-4 failed with p ≈ 1e-4). A wrong ε or Δ by 2× gives χ² ≈ 1500 or more.


def test_selection_frequencies_follow_exp_eps_q_over_2_delta() -> None:
    observed = frequencies(COUNTS, EPSILON)
    assert stats.chisquare(observed, exponential_mechanism(COUNTS, EPSILON) * N).pvalue > 1e-8


def test_sensitivity_scales_the_exponent() -> None:
    observed = frequencies(COUNTS, EPSILON, 2.0)
    assert stats.chisquare(observed, exponential_mechanism(COUNTS, EPSILON, 2.0) * N).pvalue > 1e-8


def test_selection_is_not_permute_and_flip() -> None:
    # OpenDP's exponential-noise noisy max is permute-and-flip: a different distribution that
    # 20k draws tell apart (expected χ² ≈ 500 on 4 degrees of freedom, against 53 for p = 1e-10:
    # fails by chance with p < 1e-50).
    observed = frequencies(COUNTS, EPSILON)
    assert stats.chisquare(observed, permute_and_flip(COUNTS, EPSILON) * N).pvalue < 1e-10


@pytest.mark.parametrize("bumped", [0, 4])
def test_one_more_row_changes_selection_probabilities_by_at_most_e_eps(bumped: int) -> None:
    neighbour = tuple(c + (i == bumped) for i, c in enumerate(COUNTS))
    p, q = frequencies(COUNTS, EPSILON) / N, frequencies(neighbour, EPSILON) / N
    for a, b in [(p, q), (q, p)]:
        sd = np.sqrt(a * (1 - a) / N + math.exp(2 * EPSILON) * b * (1 - b) / N)
        # The true a − e^ε·b is ≤ −8.8 sd in every category: fails by chance with p < 1e-40.
        assert np.all(a - math.exp(EPSILON) * b <= Z * sd)


def test_only_declared_categories_are_returned() -> None:
    for counts in [(0, 0, 0, 0, 0), (10**9, 0, 0, 0, 0), COUNTS]:
        for _ in range(200):
            assert release_mode(CATEGORIES, counts, 1.0).value in CATEGORIES


def test_equal_counts_select_uniformly() -> None:
    picks = Counter(gumbel_argmax([3, 3, 3], 1.0) for _ in range(3000))
    assert stats.chisquare([picks[i] for i in range(3)]).pvalue > 1e-8  # exact multinomial: p ≈ 1.0e-8


def test_release_reports_scale_and_count_error_bound() -> None:
    released = release_mode(CATEGORIES, COUNTS, EPSILON)
    assert released.scale == pytest.approx(2 / EPSILON)
    assert released.error95 == pytest.approx(2 / EPSILON * math.log(20 * len(CATEGORIES)))
    assert (released.epsilon, released.delta, released.mechanism) == (EPSILON, 0.0, "exponential")


@pytest.mark.parametrize("n_categories", [2, 5, 50, 1000])
@pytest.mark.parametrize("epsilon", [0.1, 1.0])
def test_error95_bounds_the_count_shortfall_with_probability_095(n_categories: int, epsilon: float) -> None:
    # The near-worst case: one mode and every other category just beyond the bound below it.
    bound = mode_error95(epsilon, n_categories)
    qualities = (bound * (1 + 1e-12),) + (0.0,) * (n_categories - 1)
    p_miss = 1 - exponential_mechanism(qualities, epsilon)[0]
    assert 0.04 * (n_categories - 1) / n_categories < p_miss <= 0.05


@pytest.mark.parametrize(
    ("categories", "counts", "epsilon", "sensitivity", "match"),
    [
        ((), (), 1.0, 1.0, "empty"),
        (("a", "b"), (1,), 1.0, 1.0, "one count per category"),
        (("a", "a"), (1, 2), 1.0, 1.0, "distinct"),
        (("a", "b"), (1, -1), 1.0, 1.0, "non-negative"),
        (("a", "b"), (1, 2), 0.0, 1.0, "epsilon"),
        (("a", "b"), (1, 2), 1.0, 0.0, "sensitivity"),
    ],
)
def test_invalid_arguments_are_rejected(
    categories: tuple[str, ...], counts: tuple[int, ...], epsilon: float, sensitivity: float, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        release_mode(categories, counts, epsilon, sensitivity)
