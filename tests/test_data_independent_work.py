"""dpproxy's own work on a release does not branch on the data where one row could switch the branch:
what an answer's latency would tell about one row (docs/threat-model.md, Timing;
benchmarks/proxy_cost.py measures the rest). No test here times anything: each counts the work.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any, Callable

import numpy as np
import pytest

from mechanisms import opendp_calls, samplers, smooth_median
from mechanisms.exponential import release_mode
from mechanisms.quantile import QuantileGrid, release_quantile
from mechanisms.samplers import padding_probability
from mechanisms.smooth_median import (
    prepare_partition_values, release_sample_and_aggregate, search_passes, smooth_sensitivity_median, smoothing_beta,
)


def _passes(values: list[float | None], monkeypatch: pytest.MonkeyPatch) -> int:
    """How many passes the S* search makes over ``values`` (m partition values on [0, 100])."""
    calls = [0]

    def counted(function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            calls[0] += 1
            return function(*args)
        return call

    with monkeypatch.context() as patched:
        patched.setattr(smooth_median, "_whole_rows", counted(smooth_median._whole_rows))
        patched.setattr(smooth_median, "_rows_within", counted(smooth_median._rows_within))
        smooth_sensitivity_median(prepare_partition_values(values, 0.0, 100.0), 0.0, 100.0, smoothing_beta(1.0, 1e-6))
    return calls[0]


def _spread(count: int) -> list[float | None]:
    return [10.0 + 80.0 * i / max(count, 1) for i in range(count)]


# Partition values with k of them moved to one place: at the upper bound (one partition more at hi
# made a small search of every row instead of three passes, ~35 µs less), at the lower bound, NaN
# (counted as hi), empty (the midpoint), all on one value.
FAMILIES: dict[str, Callable[[int, int], list[float | None]]] = {
    "k-at-hi": lambda m, k: [100.0] * k + _spread(m - k),
    "k-beyond-hi": lambda m, k: [1e308] * k + _spread(m - k),
    "k-at-lo": lambda m, k: [0.0] * k + _spread(m - k),
    "k-nan": lambda m, k: [float("nan")] * k + _spread(m - k),
    "k-empty": lambda m, k: [None] * k + _spread(m - k),
    "k-on-50-rest-at-hi": lambda m, k: [50.0] * k + [100.0] * (m - k),
}


@pytest.mark.parametrize("m", [3, 64, 256, 1024])
@pytest.mark.parametrize("family", FAMILIES.values(), ids=FAMILIES.keys())
def test_the_smooth_median_search_makes_the_same_passes_whatever_the_partition_values(
        m: int, family: Callable[[int, int], list[float | None]], monkeypatch: pytest.MonkeyPatch) -> None:
    moved = range(m + 1) if m <= 256 else [0, 1, m // 2, m - 40, m - 33, m - 32, m - 31, m - 30, m - 1, m]
    passes = {k: _passes(family(m, k), monkeypatch) for k in moved}
    assert set(passes.values()) == {search_passes(m)}, passes


def test_the_search_passes_are_one_for_a_small_matrix_and_three_for_a_large_one() -> None:
    assert [search_passes(m) for m in (1, 2, 3, 64, 120)] == [1] * 5
    assert [search_passes(m) for m in (256, 512, 1024, 10_000)] == [3] * 4


def test_the_smooth_medians_laplace_measurement_is_built_on_every_release(monkeypatch: pytest.MonkeyPatch) -> None:
    # The scale 2·S*/ε follows the data: a cache of measurements by scale would answer faster when an
    # earlier release had the same S* (here: the very same partition values), or S* was at its floor.
    built: list[float] = []
    make = opendp_calls._make_laplace

    def counted(domain: Any, metric: Any, scale: float, k: Any, measure: bytes) -> Any:
        built.append(scale)
        return make(domain, metric, scale, k, measure)

    monkeypatch.setattr(opendp_calls, "_make_laplace", counted)
    values: list[float | None] = list(np.linspace(40.0, 60.0, 256))
    for _ in range(3):
        release_sample_and_aggregate(values, 0.0, 100.0, 1.0, 1e-6)
    assert len(built) == 3 and len(set(built)) == 1


# The exponential mechanism (MODE, percentiles): OpenDP draws a uniform candidate i and accepts it
# with probability exp(-(max s - s_i)/scale) until one is accepted (mechanisms.samplers.gumbel_argmax),
# so a draw makes 1 + Geometric(Z/K) trials, Z = Σ exp((s_i - max s)/scale): ~K/Z, which one row moves
# (K/Z 500 → 622 for the median of 10,000 rows over 1,000 cells, +0.3–0.6 ms). The tests below model
# the work from what OpenDP is given (each draw's scores and scale, the padding coin's probability)
# and require the same distribution of trials on neighbouring data.
_TRIALS = 400  # terms of the trial-count distributions compared


def _failures(acceptance: float) -> np.ndarray:
    """P(f failed trials before the accepted one), f < _TRIALS: Geometric(acceptance)."""
    return acceptance * (1.0 - acceptance) ** np.arange(_TRIALS)


def _acceptance(scores: list[float], scale: float) -> float:
    """The probability that one of OpenDP's trials over ``scores`` accepts: Z/K."""
    shifted = (np.asarray(scores, dtype=float) - max(scores)) / scale
    return float(np.exp(shifted).sum() / len(scores))


def _trials(draws: list[tuple[list[float], float]], coins: list[float]) -> np.ndarray:
    """The distribution of the failed trials of a release's draws: the release's own draw, and a
    padding draw after each coin (over ``samplers._padding_scores`` of either outcome)."""
    total = np.zeros(_TRIALS)
    total[0] = 1.0
    for scores, scale in draws[:len(draws) - len(coins)]:
        total = np.convolve(total, _failures(_acceptance(scores, scale)))[:_TRIALS]
    for (scores, scale), probability in zip(draws[len(draws) - len(coins):], coins):
        padded, equal = (_failures(_acceptance(samplers._padding_scores(len(scores), scale, pad), scale))
                         for pad in (True, False))
        total = np.convolve(total, probability * padded + (1 - probability) * equal)[:_TRIALS]
    return total


def _work(release: Callable[[], object], monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    """The trial distribution of the draws ``release`` makes (recorded as they are made)."""
    draws: list[tuple[list[float], float]] = []
    coins: list[float] = []
    noisy_max, coin = samplers._gumbel_noisy_max, getattr(samplers, "_coin", None)

    def recording_draw(scale: float) -> Callable[[list[float]], int]:
        def draw(scores: list[float]) -> int:
            draws.append((list(scores), scale))
            return int(noisy_max(scale)(scores))
        return draw

    def recording_coin(probability: float) -> bool:
        coins.append(probability)
        assert coin is not None
        return bool(coin(probability))

    with monkeypatch.context() as patched:
        patched.setattr(samplers, "_gumbel_noisy_max", recording_draw)
        patched.setattr(samplers, "_coin", recording_coin, raising=False)
        release()
    return _trials(draws, coins)


def _quantile_counts(cells: int, extra_cell: int | None) -> list[int]:
    counts = [10] * cells
    if extra_cell is not None:
        counts[extra_cell] += 1
    return counts


@pytest.mark.parametrize("extra_cell", [0, 7, 19], ids=["row-in-the-bottom-cell", "row-in-the-middle", "row-in-the-top-cell"])
@pytest.mark.parametrize("fraction", [Fraction(1, 2), Fraction(9, 10)], ids=["median", "p90"])
def test_a_percentiles_draws_make_as_many_trials_in_distribution_whatever_one_row_holds(
        extra_cell: int, fraction: Fraction, monkeypatch: pytest.MonkeyPatch) -> None:
    # 20 cells of 10 rows: the median ties two candidates; one row more anywhere breaks the tie
    # (K/Z 10 → 12.4 unpadded), as a NaN or a 16,383-digit row in the top cell did in proxy_cost.
    grid = QuantileGrid.for_bounds(0.0, 100.0, False, 20)
    base = _work(lambda: release_quantile(grid, _quantile_counts(20, None), fraction, 1.0), monkeypatch)
    plus = _work(lambda: release_quantile(grid, _quantile_counts(20, extra_cell), fraction, 1.0), monkeypatch)
    np.testing.assert_allclose(plus, base, rtol=0, atol=1e-9)
    np.testing.assert_allclose(base, _failures(1 / 20), rtol=0, atol=1e-9)  # 2 + Geometric(1/K) trials in all


@pytest.mark.parametrize("counts", [(0, 0, 0, 0, 0), (3, 3, 3, 3, 3), (40, 0, 0, 0, 0), (40, 39, 0, 0, 0), (0, 1, 2, 4, 6)])
def test_a_modes_draws_make_as_many_trials_in_distribution_whatever_the_counts(
        counts: tuple[int, ...], monkeypatch: pytest.MonkeyPatch) -> None:
    categories = ("a", "b", "c", "d", "e")
    neighbours = [counts, *(tuple(c + (i == j) for j, c in enumerate(counts)) for i in range(len(counts)))]
    works = [_work(lambda c=c: release_mode(categories, c, 1.0), monkeypatch) for c in neighbours]
    for work in works:
        np.testing.assert_allclose(work, works[0], rtol=0, atol=1e-9)


@pytest.mark.parametrize("candidates", [2, 3, 20, 1000])
def test_the_padding_coin_makes_a_geometric_count_of_any_acceptance_one_of_acceptance_one_over_k(candidates: int) -> None:
    # F ~ Geometric(Z/K) and B·F', F' ~ Geometric(1/K), B ~ Bernoulli(padding_probability(Z, K)):
    # their sum is Geometric(1/K) for every Z in [1, K] (thinning), term by term.
    target = _failures(1 / candidates)
    for z in np.linspace(1.0, candidates, 13):
        padding = padding_probability(float(z), candidates)
        assert 0.0 <= padding <= 1.0
        pad = padding * target + (1 - padding) * np.eye(1, _TRIALS, 0)[0]
        np.testing.assert_allclose(np.convolve(_failures(z / candidates), pad)[:_TRIALS], target, rtol=0, atol=1e-12)


def test_the_released_index_is_the_first_draws_never_the_paddings(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([3, 0])
    monkeypatch.setattr(samplers, "_gumbel_noisy_max", lambda scale: lambda scores: next(answers))
    assert samplers.gumbel_argmax([0.0, 1.0, 2.0, 3.0, 4.0], 1.0) == 3
    assert next(answers, None) is None  # the padding draw was made
