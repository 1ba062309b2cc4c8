"""Smooth-sensitivity median for sample and aggregate (NRS07 §3.1): exactness, bounds, privacy."""

from __future__ import annotations

import math
import sys
from functools import lru_cache
from types import FrameType
from typing import Sequence
from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from mechanisms import smooth_median
from mechanisms.smooth_median import (
    median_index,
    prepare_partition_values,
    recommended_partitions,
    release_sample_and_aggregate,
    smooth_sensitivity_median,
    smoothing_beta,
)

Z = 5.3  # two-sided per-check quantile: a check of a frequency at its true value fails by chance with p ≈ 1.2e-7


def direct_smooth_sensitivity(sorted_values: list[float], lo: float, hi: float, beta: float) -> float:
    """NRS07's definition read literally, O(m²): max_k e^{-kβ} max_{0≤t≤k+1} (x_{j+t} − x_{j+t−k−1})."""
    m = len(sorted_values)
    j = math.ceil(m / 2)

    def x(i: int) -> float:
        return lo if i < 1 else hi if i > m else sorted_values[i - 1]

    return max(
        math.exp(-k * beta) * max(x(j + t) - x(j + t - k - 1) for t in range(k + 2))
        for k in range(2 * m + 2)
    )


def vectorised_definition(sorted_values: Sequence[float], lo: float, hi: float, beta: float) -> float:
    """direct_smooth_sensitivity with its max over t taken by numpy: the same floating-point
    operations (so the same result, bit for bit), fast enough for m ≈ 1,000."""
    m = len(sorted_values)
    j = math.ceil(m / 2)
    pad = 2 * m + 2
    xs = np.concatenate((np.full(pad, lo), sorted_values, np.full(pad, hi)))  # x_i is xs[i − 1 + pad]
    return max(
        math.exp(-k * beta) * float(np.max(xs[j - 1 + pad : j + k + 1 + pad] - xs[j - k - 2 + pad : j + pad]))
        for k in range(2 * m + 2)
    )


# The search scans small inputs whole; with no budget for that, every pass runs at any m.
SCAN_MODES = pytest.mark.parametrize(
    "direct_scan_size", [smooth_median._DIRECT_SCAN_SIZE, 0], ids=["as-configured", "every-pass"]
)


@lru_cache(maxsize=None)
def draws(values: tuple[float | None, ...], lo: float, hi: float, eps: float, delta: float, n: int) -> np.ndarray:
    return np.array(
        [release_sample_and_aggregate(values, lo, hi, eps, delta).value for _ in range(n)]
    )


def binned(sample: np.ndarray, lo: float, hi: float, bins: int = 10) -> np.ndarray:
    """Counts at lo, in `bins` equal open bins of (lo, hi), and at hi (clamping makes atoms)."""
    interior = sample[(sample > lo) & (sample < hi)]
    inner, _ = np.histogram(interior, bins=bins, range=(lo, hi))
    return np.concatenate([[np.sum(sample == lo)], inner, [np.sum(sample == hi)]])


@given(
    values=st.lists(st.floats(-50, 50), min_size=1, max_size=40),
    spread=st.floats(0, 60),
    epsilon=st.floats(0.01, 20),
    delta=st.floats(1e-12, 0.5),
)
@settings(max_examples=300)
def test_fast_smooth_sensitivity_equals_the_direct_definition(
    values: list[float], spread: float, epsilon: float, delta: float
) -> None:
    lo, hi = min(values) - spread / 3, max(values) + spread
    beta = smoothing_beta(epsilon, delta)
    sorted_values = sorted(values)
    fast = smooth_sensitivity_median(sorted_values, lo, hi, beta)
    assert fast == pytest.approx(direct_smooth_sensitivity(sorted_values, lo, hi, beta), rel=1e-12, abs=1e-300)


@given(values=st.lists(st.integers(0, 3), min_size=1, max_size=30), epsilon=st.floats(0.05, 5))
def test_fast_smooth_sensitivity_with_many_ties(values: list[int], epsilon: float) -> None:
    sorted_values = [float(v) for v in sorted(values)]
    beta = smoothing_beta(epsilon, 1e-6)
    fast = smooth_sensitivity_median(sorted_values, 0.0, 3.0, beta)
    assert fast == pytest.approx(direct_smooth_sensitivity(sorted_values, 0.0, 3.0, beta), rel=1e-12)


@given(values=st.lists(st.floats(-50, 50), min_size=1, max_size=40), beta=st.floats(1e-4, 8))
def test_vectorised_definition_is_the_literal_definition(values: list[float], beta: float) -> None:
    sorted_values = sorted(values)
    lo, hi = sorted_values[0] - 1.0, sorted_values[-1] + 2.0
    assert vectorised_definition(sorted_values, lo, hi, beta) == direct_smooth_sensitivity(sorted_values, lo, hi, beta)


@SCAN_MODES
@given(
    values=st.lists(
        st.one_of(
            st.none(),
            st.floats(allow_nan=True, allow_infinity=True),
            st.floats(-1.0, 11.0),
            st.sampled_from([0.0, 5.0, 10.0]),
        ),
        min_size=1,
        max_size=80,
    ),
    epsilon=st.floats(0.01, 20),
    delta=st.floats(1e-12, 0.5),
)
@settings(max_examples=200)
def test_every_search_pass_finds_the_definitions_value(
    direct_scan_size: int, values: list[float | None], epsilon: float, delta: float
) -> None:
    # Empty partitions, NaN, values beyond and at the bounds, ties, m = 1 and 2, odd and even m.
    sorted_values = prepare_partition_values(values, 0.0, 10.0)
    beta = smoothing_beta(epsilon, delta)
    with patch.object(smooth_median, "_DIRECT_SCAN_SIZE", direct_scan_size):
        fast = smooth_sensitivity_median(sorted_values, 0.0, 10.0, beta)
    assert fast == pytest.approx(direct_smooth_sensitivity(sorted_values, 0.0, 10.0, beta), rel=1e-13, abs=1e-300)


EDGE_CASES = {
    "m=1": [0.3],
    "m=1-empty": [None],
    "m=1-at-hi": [1.0],
    "m=2": [0.9, 0.2],
    "m=2-at-bounds": [0.0, 1.0],
    "m=2-empty": [None, None],
    "m=3": [0.5, 0.1, 0.7],
    "m=4": [0.5, 0.1, 0.7, 0.65],
    "all-equal-odd": [0.4] * 301,
    "all-equal-even": [0.4] * 300,
    "all-empty": [None] * 257,
    "all-at-lo": [0.0] * 200,
    "all-at-hi": [1.0] * 201,
    "all-beyond-bounds": [-3.0, math.inf, 7.0, -math.inf, math.nan] * 40,
    "median-flips": [0.0] * 151 + [1.0] * 150,
    "half-empty": [0.1 + 0.002 * i for i in range(150)] + [None] * 150,
    "ties-at-bounds-and-inside": [0.0, 0.25, 1.0, 0.25, None] * 61,
}


@SCAN_MODES
@pytest.mark.parametrize("epsilon", [0.05, 1.0, 20.0])
@pytest.mark.parametrize("values", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_edge_cases_equal_the_definition_bit_for_bit(
    direct_scan_size: int, values: list[float | None], epsilon: float
) -> None:
    sorted_values = prepare_partition_values(values, 0.0, 1.0)
    beta = smoothing_beta(epsilon, 1e-6)
    with patch.object(smooth_median, "_DIRECT_SCAN_SIZE", direct_scan_size):
        fast = smooth_sensitivity_median(sorted_values, 0.0, 1.0, beta)
    assert fast == direct_smooth_sensitivity(sorted_values, 0.0, 1.0, beta)


def partition_values(shape: str, m: int, rng: np.random.Generator) -> list[float | None]:
    """m partition values in or around [0, 100], of a few shapes that move the best terms about."""
    if shape == "concentrated":
        return list(rng.normal(38.6, 0.8, m))
    if shape == "spread-beyond-bounds":
        return list(rng.uniform(-10, 110, m))
    if shape == "two-clusters":
        return list(np.where(rng.random(m) < 0.5, rng.normal(20, 1, m), rng.normal(80, 1, m)))
    if shape == "most-at-hi":
        return list(np.where(rng.random(m) < 0.6, 100.0, rng.uniform(0, 100, m)))
    if shape == "exponential-tail":
        return list(rng.exponential(5.0, m))
    if shape == "quarter-empty":
        return [*rng.normal(38.6, 3.0, m - m // 4), *[None] * (m // 4)]
    raise ValueError(shape)


@pytest.mark.parametrize("epsilon", [0.1, 0.3, 1.0, 4.0])
@pytest.mark.parametrize("m", [129, 512, 1024, 1101])
@pytest.mark.parametrize(
    "shape",
    ["concentrated", "spread-beyond-bounds", "two-clusters", "most-at-hi", "exponential-tail", "quarter-empty"],
)
def test_large_m_equals_the_definition_bit_for_bit(shape: str, m: int, epsilon: float) -> None:
    rng = np.random.default_rng([m, int(epsilon * 10), len(shape)])
    sorted_values = prepare_partition_values(partition_values(shape, m, rng), 0.0, 100.0)
    beta = smoothing_beta(epsilon, 1e-6)
    assert smooth_sensitivity_median(sorted_values, 0.0, 100.0, beta) == vectorised_definition(
        sorted_values, 0.0, 100.0, beta
    )


@given(
    values=st.lists(
        st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10)), max_size=40
    ),
    lo=st.floats(-1e6, 1e6),
    width=st.floats(0, 1e6),
)
def test_prepared_values_are_the_plain_definition(values: list[float | None], lo: float, width: float) -> None:
    hi = lo + width
    midpoint = lo + (hi - lo) / 2.0
    expected = sorted(
        midpoint if v is None else hi if math.isnan(float(v)) else min(max(float(v), lo), hi) for v in values
    )
    assert prepare_partition_values(values, lo, hi) == expected


def test_lower_median_for_even_m() -> None:
    assert [median_index(m) for m in range(1, 7)] == [0, 0, 1, 1, 2, 2]
    # The released distribution is clamp(2 + Laplace): its median is 2, the lower middle value.
    sample = draws((4.0, 1.0, 3.0, 2.0), 0.0, 10.0, 1.0, 1e-3, 20000)
    below = np.mean(sample < 2.0)
    # P(below) = 1/2 exactly: fails by chance with p ≈ 1.2e-7 (binomial). The upper median 3, with
    # this noise scale of 15.4, gives 0.469: 20000 draws catch it in all but 2e-4 of runs (4000 in 9%).
    assert abs(below - 0.5) <= Z * math.sqrt(0.25 / len(sample))


@given(
    values=st.lists(
        st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)), min_size=1, max_size=15
    ),
    lo=st.floats(-1e6, 1e6),
    width=st.floats(0, 1e6),
    epsilon=st.floats(0.01, 10),
)
@settings(max_examples=100)
def test_release_stays_within_bounds(
    values: list[float | None], lo: float, width: float, epsilon: float
) -> None:
    hi = lo + width
    released = release_sample_and_aggregate(values, lo, hi, epsilon, 1e-6)
    assert lo <= released.value <= hi


def test_outliers_nan_and_empty_partitions_are_mapped_into_bounds() -> None:
    assert prepare_partition_values([1e300, -math.inf, 7.0, None, math.nan], 0.0, 10.0) == [
        0.0, 5.0, 7.0, 10.0, 10.0,
    ]


def test_all_partitions_empty_releases_around_the_midpoint() -> None:
    sample = draws((None,) * 9, -4.0, 6.0, 1.0, 1e-3, 4000)
    # Two views of one binomial frequency (P(sample = 1) ≈ 0): fails by chance with p ≈ 1.2e-7.
    assert abs(np.mean(sample < 1.0) - 0.5) <= Z * math.sqrt(0.25 / len(sample))
    assert abs(np.mean(sample > 1.0) - 0.5) <= Z * math.sqrt(0.25 / len(sample))


def test_released_distribution_is_clamped_laplace_with_scale_2_s_star_over_epsilon() -> None:
    values = tuple(0.3 + 0.02 * i for i in range(21))
    lo, hi, eps, delta = 0.0, 1.0, 1.0, 1e-3
    s_star = direct_smooth_sensitivity(sorted(values), lo, hi, smoothing_beta(eps, delta))
    noise = stats.laplace(loc=values[10], scale=2 * s_star / eps)
    edges = np.linspace(lo, hi, 11)
    expected = np.concatenate([[noise.cdf(lo)], np.diff(noise.cdf(edges)), [noise.sf(hi)]])
    observed = binned(draws(values, lo, hi, eps, delta, 20000), lo, hi)
    # Every cell expects ≥ 800 draws, where the χ² tail is accurate: fails by chance with p ≈ 1e-8
    # (the floor of 1e-4 failed with p ≈ 1e-4). Half or twice the scale gives χ² ≈ 5000.
    assert stats.chisquare(observed, expected * observed.sum()).pvalue > 1e-8


@pytest.mark.parametrize(
    ("x", "x_neighbour"),
    [
        # 11 partitions at lo and 10 at hi; moving one flips the median across the range.
        ((0.0,) * 11 + (1.0,) * 10, (0.0,) * 10 + (1.0,) * 11),
        # An empty partition against one at the top of the range.
        ((0.2, 0.3, 0.35, 0.4, None, 0.45, 0.5, 0.6, 0.9), (0.2, 0.3, 0.35, 0.4, 1.0, 0.45, 0.5, 0.6, 0.9)),
    ],
    ids=["median-flips", "empty-vs-full"],
)
def test_neighbouring_partition_vectors_are_eps_delta_indistinguishable(
    x: tuple[float | None, ...], x_neighbour: tuple[float | None, ...]
) -> None:
    lo, hi, eps, delta, n = 0.0, 1.0, 1.0, 1e-3, 20000
    p = binned(draws(x, lo, hi, eps, delta, n), lo, hi) / n
    q = binned(draws(x_neighbour, lo, hi, eps, delta, n), lo, hi) / n
    for a, b in [(p, q), (q, p)]:
        # (ε, δ)-DP: P_a(B) ≤ e^ε P_b(B) + δ for every bin B, up to binomial sampling error.
        # The true a − e^ε·b is ≤ −7 sd in every bin of both cases: fails by chance with p < 1e-30.
        sd = np.sqrt(a * (1 - a) / n + math.exp(2 * eps) * b * (1 - b) / n)
        assert np.all(a - math.exp(eps) * b <= delta + Z * sd + 1.0 / n)
    if x[0] == 0.0 and x[-1] == 1.0:
        # The flip case is not trivially private: the atom at lo has privacy loss ε/2 here (exactly:
        # both atoms come from Laplace(2) noise, centred at 0 and at 1). Fails by chance with p ≈ 2e-11.
        assert math.log(p[0] / q[0]) == pytest.approx(eps / 2, abs=Z * math.sqrt(1 / (p[0] * n) + 1 / (q[0] * n)))


def test_scale_and_error95_are_data_independent_worst_cases() -> None:
    lo, hi, eps, delta = 0.0, 10.0, 0.5, 1e-6
    tight = release_sample_and_aggregate([5.0] * 301, lo, hi, eps, delta)
    spread = release_sample_and_aggregate([0.0, 10.0, 3.0], lo, hi, eps, delta)
    for released in (tight, spread):
        assert released.scale == pytest.approx(2 * (hi - lo) / eps)
        assert released.error95 == pytest.approx(min(2 * (hi - lo) / eps * math.log(20), hi - lo))
        assert (released.epsilon, released.delta, released.mechanism) == (eps, delta, "smooth_median")
    wide = release_sample_and_aggregate([5.0], lo, hi, 100.0, delta)
    assert wide.error95 == pytest.approx(2 * (hi - lo) / 100.0 * math.log(20))


def test_error95_bounds_the_error_at_least_95_percent_of_the_time() -> None:
    values = tuple(0.3 + 0.02 * i for i in range(21))
    sample = draws(values, 0.0, 1.0, 1.0, 1e-3, 20000)
    bound = release_sample_and_aggregate(values, 0.0, 1.0, 1.0, 1e-3).error95
    # At ε = 1 error95 is the whole range (2(hi − lo)/ε·ln 20 > hi − lo), so every released value
    # is inside: this check cannot fail, by chance or otherwise (it would need ε > 2 ln 20 ≈ 6).
    inside = np.mean(np.abs(sample - values[10]) <= bound)
    assert inside >= 0.95 - Z * math.sqrt(0.95 * 0.05 / len(sample))


def test_degenerate_range_releases_the_bound_exactly() -> None:
    released = release_sample_and_aggregate([3.0, None, 3.0], 3.0, 3.0, 1.0, 1e-6)
    assert (released.value, released.scale, released.error95) == (3.0, 0.0, 0.0)


def test_recommended_partitions_make_the_range_term_small() -> None:
    eps, delta, fraction = 1.0, 1e-6, 0.01
    m = recommended_partitions(eps, delta, fraction)
    beta = smoothing_beta(eps, delta)
    # All partitions equal: S* is exactly the range term (hi − lo)·e^{−β(⌈m/2⌉−1)}.
    assert smooth_sensitivity_median([1.0] * m, 0.0, 1.0, beta) <= fraction
    assert smooth_sensitivity_median([1.0] * (m - 1), 0.0, 1.0, beta) > fraction


def test_huge_m_keeps_a_positive_noise_scale() -> None:
    # β·m/2 ≈ 1000: e^{-β k} underflows; the floor keeps the sampler's scale positive.
    released = release_sample_and_aggregate([0.5] * 4001, 0.0, 1.0, 50.0, 1e-6)
    assert 0.0 <= released.value <= 1.0


def test_subnormal_range_keeps_a_positive_noise_scale() -> None:
    # hi − lo = 5e-324: 2·S*/ε rounds to 0, which the sampler rejects; it is rounded up instead.
    released = release_sample_and_aggregate([None], 0.0, 5e-324, 4.0, 1e-6)
    assert 0.0 <= released.value <= 5e-324


@pytest.mark.parametrize(
    ("values", "lo", "hi", "eps", "delta", "match"),
    [
        ([], 0.0, 1.0, 1.0, 1e-6, "at least one partition"),
        ([0.5], 0.0, 1.0, 0.0, 1e-6, "epsilon"),
        ([0.5], 0.0, 1.0, math.inf, 1e-6, "epsilon"),
        ([0.5], 0.0, 1.0, 1.0, 0.0, "delta"),
        ([0.5], 0.0, 1.0, 1.0, 1.0, "delta"),
        ([0.5], 1.0, 0.0, 1.0, 1e-6, "exceeds"),
        ([0.5], 0.0, math.inf, 1.0, 1e-6, "finite"),
        ([0.5], -1e308, 1e308, 1.0, 1e-6, "finite"),
    ],
)
def test_invalid_parameters_are_rejected(
    values: list[float], lo: float, hi: float, eps: float, delta: float, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        release_sample_and_aggregate(values, lo, hi, eps, delta)


def test_empty_partitions_passed_as_a_count_equal_none_values_and_nan_stays_hi() -> None:
    values = [1.0, math.nan, None, 9.5]
    as_list = prepare_partition_values(values + [None, None], 0.0, 10.0)
    assert as_list == [1.0, 5.0, 5.0, 5.0, 9.5, 10.0]
    assert smooth_median._prepared_values(np.array([1.0, math.nan, 9.5]), 0.0, 10.0, empty=3).tolist() == as_list
    assert smooth_median._prepared_values(values, 0.0, 10.0, empty=2).tolist() == as_list


@pytest.mark.parametrize("m", [64, 256, 1024])
def test_the_s_star_search_calls_no_numpy_wrapper_written_in_python(m: int) -> None:
    # The search is a few dozen numpy calls on arrays of a few thousand terms, so each call's
    # fixed cost is most of its time: np.repeat, np.cumsum, np.searchsorted and ndarray.max go
    # through Python wrappers (fromnumeric._wrapfunc, _methods._amax) and np.iinfo builds an
    # object, ~12 % of the search at m = 1,024 before it used the array methods and ufuncs.
    values = np.sort(np.concatenate((np.linspace(10.0, 90.0, m - m // 3), np.full(m // 3, 50.0))))
    called: set[str] = set()

    def profile(frame: FrameType, event: str, arg: object) -> None:
        path = frame.f_code.co_filename
        if event == "call" and "numpy" in path and not path.endswith("multiarray.py"):  # C functions' dispatchers
            called.add(f"{path.rsplit('numpy', 1)[-1]}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        smooth_sensitivity_median(values, 0.0, 100.0, smoothing_beta(0.5, 1e-6))
    finally:
        sys.setprofile(None)
    assert not called


def test_the_search_weights_are_computed_once_per_partitions_and_beta_and_cannot_be_changed() -> None:
    # A function of m and β (the policy's partitions, the column's ε and δ), never of the values:
    # whether they were computed before tells nothing about any row.
    smooth_median._weights.cache_clear()
    beta = smoothing_beta(0.5, 1e-6)
    for low in (10.0, 20.0, 30.0):
        smooth_sensitivity_median(np.linspace(low, 90.0, 300), 0.0, 100.0, beta)
    assert smooth_median._weights.cache_info().misses == 1
    weight = smooth_median._weights(300, beta)
    assert weight[0] == 0.0 and weight[1] == 1.0 and weight[2] == pytest.approx(math.exp(-beta))
    with pytest.raises(ValueError):
        weight[1] = 2.0
