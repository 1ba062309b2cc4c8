"""The variance mechanism (mechanisms/variance.py) on its own: its grid, its three parts' noise
scales and ε shares, the post-processing into the feasible range, a data-independent answer for
tiny noisy counts, and its accuracy.

Each statistical assertion states its false-failure rate, at most 1e-6.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import numpy as np
import pytest

import mechanisms.variance as variance_module
from mechanisms.fixed_point import Grid
from mechanisms.variance import SHARES, MomentGrid, mean_of, moment_noise, noisy_moments, release_variance, variance_of

KINDS = ("var_pop", "var_samp", "stddev_pop", "stddev_samp")


def _moments(values: list[float], moments: MomentGrid) -> tuple[int, int, int]:
    """n, Σ d and Σ d² of ``values`` (already within the bounds) as the backend computes them."""
    grid = moments.grid
    points = [min(max(grid.point(v), moments.low), moments.high) - moments.centre for v in values]
    return len(points), sum(points), sum(d * d for d in points)


def _exact(kind: str, values: list[float]) -> float:
    n = len(values)
    mean = sum(values) / n
    pop = sum((v - mean) ** 2 for v in values) / n
    var = pop * n / (n - 1) if kind.endswith("samp") else pop
    return math.sqrt(var) if kind.startswith("stddev") else var


@pytest.fixture
def no_noise(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[tuple[int, float]]]:
    """The mechanism with its draws replaced by the exact values; records (sensitivity, ε) of
    each sum and the count's scale."""
    asked: dict[str, list[tuple[int, float]]] = {"sums": [], "count": []}

    def exact_sum(exact: int, sensitivity: int, epsilon: float) -> tuple[int, float]:
        asked["sums"].append((sensitivity, epsilon))
        return exact, sensitivity / epsilon

    def exact_count(value: int, scale: float) -> int:
        asked["count"].append((1, scale))
        return value

    monkeypatch.setattr(variance_module, "laplace_integer_sum", exact_sum)
    monkeypatch.setattr(variance_module, "laplace_int", exact_count)
    return asked


def test_an_integer_column_counts_half_units_centred_on_the_midpoint_so_one_row_moves_the_sum_by_h():
    moments = MomentGrid.for_bounds(17, 90, integer=True)
    assert (moments.grid.step, moments.low, moments.high, moments.centre, moments.reach) == (0.5, 34, 180, 107, 73)
    # h = 36.5 in the column's units: D points of 1/2
    assert moments.reach * moments.grid.step == (90 - 17) / 2


@pytest.mark.parametrize("bounds", [(0.0, 10.0), (-2.5, 2.5), (1e15, 1e15 + 2), (1e-300, 3e-300), (-7.25, 1e6)])
def test_a_float_column_s_reach_bounds_every_clamped_value_s_centred_point(bounds):
    lo, hi = bounds
    moments = MomentGrid.for_bounds(lo, hi, integer=False)
    assert moments.grid == Grid.for_bounds(lo, hi)
    assert (moments.low, moments.high) == (moments.grid.point(lo), moments.grid.point(hi))
    for value in (lo, hi, lo + (hi - lo) / 3, np.nextafter(hi, lo)):
        assert abs(moments.grid.point(value) - moments.centre) <= moments.reach
    # never more than one point beyond the half-width h
    assert moments.reach * moments.grid.step <= (hi - lo) / 2 + moments.grid.step


def test_the_shares_of_epsilon_minimise_the_worst_case_error_and_add_up_to_one():
    """The worst case of the first-order error variance is h⁴(1/ε_n² + 4/ε_S² + 1/ε_Q²): least for
    ε_i ∝ (1, 4^⅓, 1) (docs/mechanisms.md). No other split of a fine grid of the simplex does better."""
    assert sum(SHARES) == pytest.approx(1.0, abs=1e-15)
    worst = lambda n, s, q: 1 / n**2 + 4 / s**2 + 1 / q**2  # noqa: E731
    best = worst(*SHARES)
    steps = 200
    for i in range(1, steps):
        for j in range(1, steps - i):
            assert worst(i / steps, j / steps, (steps - i - j) / steps) >= best * (1 - 1e-12)
    assert best < worst(1 / 3, 1 / 3, 1 / 3)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("epsilon", [1.0, 0.3])
def test_the_three_parts_are_noised_with_sensitivities_1_d_and_d_squared_at_their_shares(no_noise, kind, epsilon):
    moments = MomentGrid.for_bounds(17, 90, integer=True)
    release_variance(kind, 100, 10, 5000, moments, epsilon)
    ((count, count_scale),) = no_noise["count"]
    (sum_sensitivity, sum_epsilon), (squares_sensitivity, squares_epsilon) = no_noise["sums"]
    assert count_scale == pytest.approx(1 / (epsilon * SHARES[0]))
    assert (sum_sensitivity, squares_sensitivity) == (73, 73**2)
    assert (sum_epsilon, squares_epsilon) == pytest.approx((epsilon * SHARES[1], epsilon * SHARES[2]))
    assert count_scale >= 1 / epsilon and sum_epsilon + squares_epsilon + 1 / count_scale == pytest.approx(epsilon)


def test_moment_noise_reports_the_scales_the_release_draws_at_in_the_column_s_units():
    moments = MomentGrid.for_bounds(-2.5, 2.5, integer=False)
    count, centred, squares = moment_noise(moments, 0.5)
    h = moments.reach * moments.grid.step
    assert count == pytest.approx(1 / (0.5 * SHARES[0]))
    assert centred == pytest.approx(h / (0.5 * SHARES[1]))
    assert squares == pytest.approx(h * h / (0.5 * SHARES[2]))
    release = release_variance("var_pop", 10, 0, 0, moments, 0.5)
    assert release.scales == pytest.approx((count, centred, squares))


def test_one_draw_of_the_moments_answers_every_kind_consistently_and_draws_nothing_more(no_noise):
    """Of one NoisyMoments (three draws, at the whole ε): stddev² = var for both forms, and
    var_samp = var_pop·m/(m − 1) with m the noisy count; computing the kinds draws nothing."""
    moments = MomentGrid.for_bounds(17, 90, integer=True)
    noisy = noisy_moments(1000, 1234, 2_000_000, moments, 1.0)
    released = {kind: variance_of(kind, noisy) for kind in KINDS}
    assert len(no_noise["count"]) == 1 and len(no_noise["sums"]) == 2
    assert released["stddev_pop"].value ** 2 == pytest.approx(released["var_pop"].value, rel=1e-12)
    assert released["stddev_samp"].value ** 2 == pytest.approx(released["var_samp"].value, rel=1e-12)
    assert released["var_samp"].value == pytest.approx(released["var_pop"].value * 1000 / 999, rel=1e-12)
    assert {release.epsilon for release in released.values()} == {1.0}
    assert {release.scales for release in released.values()} == {moment_noise(moments, 1.0)}


def test_noisy_moments_are_drawn_at_the_shares_and_scales_release_variance_uses(no_noise):
    moments = MomentGrid.for_bounds(-2.5, 2.5, integer=False)
    noisy = noisy_moments(10, 3, 40, moments, 0.5)
    (count, scale), = no_noise["count"]
    assert (noisy.count, noisy.centred_sum, noisy.centred_squares) == (10, 3, 40)
    assert noisy.scales[0] == scale == pytest.approx(1 / (0.5 * SHARES[0]))
    assert variance_of("var_pop", noisy) == release_variance("var_pop", 10, 3, 40, moments, 0.5)


@pytest.mark.parametrize("integer", [True, False])
def test_without_noise_the_mean_of_the_moments_is_the_clamped_values_mean(no_noise, integer):
    rng = random.Random(11)
    lo, hi = (17, 90) if integer else (-2.5, 2.5)
    values = [float(rng.randint(lo, hi)) if integer else rng.uniform(lo, hi) for _ in range(500)]
    moments = MomentGrid.for_bounds(lo, hi, integer)
    release = mean_of(noisy_moments(*_moments(values, moments), moments, 1.0), lo, hi)
    assert release.value == pytest.approx(sum(values) / len(values), rel=1e-12, abs=1e-12)
    assert release.epsilon == 1.0 and release.delta == 0.0


def test_the_mean_of_the_moments_stays_in_the_bounds_whatever_the_noisy_parts():
    moments = MomentGrid.for_bounds(0, 10, integer=True)
    for count, centred in ((0, 0), (0, 10**6), (1, -(10**6)), (-5, 3), (3, 30)):
        noisy = replace(noisy_moments(3, 0, 0, moments, 1.0), count=count, centred_sum=centred)
        assert 0.0 <= mean_of(noisy, 0, 10).value <= 10.0
    assert mean_of(replace(noisy, count=0, centred_sum=0), 0, 10).value == 5.0  # m = 1: the centre
    assert mean_of(noisy_moments(4, 0, 0, MomentGrid.for_bounds(3, 3, True), 1.0), 3, 3).value == 3.0


def test_the_mean_of_the_moments_is_as_accurate_as_documented():
    """The first-order analysis (docs/mechanisms.md): error variance 2h²(1/0.4425² + ρ²/0.2788²)/ε²
    over n² (a Laplace draw of scale b has variance 2b²). 20,000 draws' mean square stays within 12%
    of it: the relative standard deviation of such a mean is below 1.6% (a squared Laplace draw's
    is √20/2), so 12% is 7.5 of them, a false failure far below 1e-6."""
    moments = MomentGrid.for_bounds(0, 10, integer=True)
    values = [2.0] * 300 + [4.0] * 100  # mean 2.5, ρ = 0.5
    parts = _moments(values, moments)
    squares = [(mean_of(noisy_moments(*parts, moments, 1.0), 0, 10).value - 2.5) ** 2 for _ in range(20000)]
    expected = 2 * 25 * (1 / SHARES[1] ** 2 + 0.25 / SHARES[0] ** 2) / 400**2
    assert sum(squares) / len(squares) == pytest.approx(expected, rel=0.12)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("integer", [True, False])
def test_without_noise_the_release_is_postgresql_s_value(no_noise, kind, integer):
    rng = random.Random(7)
    lo, hi = (17, 90) if integer else (-2.5, 2.5)
    values = [float(rng.randint(lo, hi)) if integer else rng.uniform(lo, hi) for _ in range(500)]
    moments = MomentGrid.for_bounds(lo, hi, integer)
    release = release_variance(kind, *_moments(values, moments), moments, 1.0)
    # floats are on a grid of 2^-50 here: the exact values' variance within that rounding
    assert release.value == pytest.approx(_exact(kind, values), rel=1e-9)
    assert release.mechanism == "moments" and release.delta == 0.0


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("count", [0, 1])
def test_a_tiny_noisy_count_gives_a_value_in_range_never_null_nor_an_error(no_noise, kind, count):
    moments = MomentGrid.for_bounds(0, 10, integer=True)
    # the noisy parts could be anything: an empty filter's with noise, or a single row's
    for centred, squares in ((0, 0), (7, 3), (-40, 900), (10**6, 10**9)):
        value = release_variance(kind, count, centred, squares, moments, 1.0).value
        widest = 25.0 * (2 if kind.endswith("samp") else 1)
        assert 0.0 <= value <= (math.sqrt(widest) if kind.startswith("stddev") else widest)


def test_the_population_variance_is_clamped_into_0_to_h_squared_and_the_sample_one_scaled_from_it(monkeypatch):
    """Post-processing: a noisy Q̃ far above its range, or below (S̃/ñ)², gives h² or 0."""
    moments = MomentGrid.for_bounds(0, 10, integer=True)  # h = 5
    monkeypatch.setattr(variance_module, "laplace_int", lambda value, scale: value)
    for squares, expected in ((10**9, 25.0), (0, 0.0)):
        monkeypatch.setattr(variance_module, "laplace_integer_sum",
                            lambda exact, sensitivity, epsilon, s=squares: (s if sensitivity == 100 else 50, 1.0))
        assert release_variance("var_pop", 10, 0, 0, moments, 1.0).value == expected
        assert release_variance("var_samp", 10, 0, 0, moments, 1.0).value == pytest.approx(expected * 10 / 9)
        assert release_variance("stddev_pop", 10, 0, 0, moments, 1.0).value == pytest.approx(math.sqrt(expected))


def test_bounds_lo_equal_hi_release_zero_without_drawing():
    moments = MomentGrid.for_bounds(5, 5, integer=True)
    assert release_variance("stddev_samp", 3, 0, 0, moments, 1.0).value == 0.0


def test_a_negative_count_or_sum_of_squares_is_refused_as_a_programming_error():
    moments = MomentGrid.for_bounds(0, 10, integer=True)
    with pytest.raises(ValueError):
        release_variance("var_pop", -1, 0, 0, moments, 1.0)
    with pytest.raises(ValueError):
        release_variance("var_pop", 1, 0, -1, moments, 1.0)


def test_the_released_variance_is_within_its_stated_accuracy_at_epsilon_1():
    """n = 100,000 values uniform on the integers of [0, 100] (σ² ≈ 850), ε = 1, h = 50.

    With ñ = n + e_n, S̃ = S + e_S, Q̃ = Q + e_Q (column units) and |S/n| ≤ h, Q/n ≤ h², the exact
    error of Q̃/ñ − (S̃/ñ)² is at most (|e_Q| + 3h²|e_n| + 2h|e_S|)/ñ + ((|e_S| + h|e_n|)/ñ)², and
    the clamp only shrinks it. Each of the 3 draws of each of 300 releases stays within b·ln(1.5/p)
    but with probability p = 1e-6/900 (discrete Laplace of scale b ≥ 1: P(|X| > b·t) ≤ 1.5·e^-t):
    the assertion fails by chance with probability ≤ 1e-6."""
    rng = random.Random(11)
    values = [float(rng.randint(0, 100)) for _ in range(100_000)]
    moments = MomentGrid.for_bounds(0, 100, integer=True)
    parts = _moments(values, moments)
    b_n, b_s, b_q = moment_noise(moments, 1.0)
    releases = 300
    t = math.log(1.5 * releases * 3 / 1e-6)
    n, h = len(values), 50.0
    low = n - b_n * t
    bound = (b_q + 3 * h * h * b_n + 2 * h * b_s) * t / low + ((b_s + h * b_n) * t / low) ** 2
    exact = _exact("var_pop", values)
    errors = [abs(release_variance("var_pop", *parts, moments, 1.0).value - exact) for _ in range(releases)]
    assert max(errors) <= bound, (max(errors), bound)
    assert bound < 0.02 * exact  # the bound says something: within 2% of the variance at n = 100,000
    # The 95% bound the notice states (first order, each draw within its 1/60 tail) covers at least
    # 85% of 300 releases: for a true coverage ≥ 0.95, fewer fails with probability < 1e-12 (Chernoff).
    stated = release_variance("var_pop", *parts, moments, 1.0).error95
    assert sum(e <= stated for e in errors) >= 0.85 * releases


def test_a_standard_deviations_stated_bound_is_the_variances_carried_through_the_square_root():
    """|√v̂ − √v| = |v̂ − v|/(√v̂ + √v) ≤ e/√v̂: on the same 100,000 values the notice stated √e
    (±1.6 for σ ≈ 29, twenty times the error it bounds); it now states min(√e, e/√v̂), which
    covers at least 85% of 300 releases as the variance's bound does (same Chernoff argument)."""
    rng = random.Random(11)
    values = [float(rng.randint(0, 100)) for _ in range(100_000)]
    moments = MomentGrid.for_bounds(0, 100, integer=True)
    parts = _moments(values, moments)
    exact = _exact("stddev_pop", values)
    draws = [noisy_moments(*parts, moments, 1.0) for _ in range(300)]
    releases = [variance_of("stddev_pop", noisy) for noisy in draws]
    for noisy, release in zip(draws, releases):
        variance = variance_of("var_pop", noisy)
        assert release.error95 == pytest.approx(min(math.sqrt(variance.error95), variance.error95 / release.value))
        assert release.error95 < math.sqrt(variance.error95) / 10
    assert sum(abs(release.value - exact) <= release.error95 for release in releases) >= 0.85 * len(releases)


@pytest.mark.parametrize("kind", KINDS)
def test_the_widest_bounds_a_variance_takes_release_a_finite_value_even_at_a_tiny_epsilon(kind):
    """|bounds| ≤ 1e150 (rewriter.types.MAX_ABS_VARIANCE_BOUND): the sample variance's range, up to
    2e300, is finite; a noise scale past the doubles is reported as infinity, never an error."""
    moments = MomentGrid.for_bounds(-1e150, 1e150, integer=False)
    for epsilon in (1.0, 1e-9):
        release = release_variance(kind, 2, 0, 2 * moments.reach**2, moments, epsilon)
        assert math.isfinite(release.value) and 0.0 <= release.value <= 2.0001e300
