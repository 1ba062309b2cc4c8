"""The pool of pre-drawn discrete Laplace noise: right distribution, every draw used once."""

from __future__ import annotations

import threading

import numpy as np
from scipy import stats

from mechanisms.noise_pool import NoisePool, pool_for
from mechanisms.samplers import laplace_int


def _discrete_laplace_pmf(k: np.ndarray, scale: float) -> np.ndarray:
    p = np.exp(-1.0 / scale)
    return (1 - p) / (1 + p) * p ** np.abs(k)


def _chi_square_pvalue(draws: np.ndarray, scale: float) -> float:
    """Pearson's χ² p-value, the cells expecting fewer than 100 draws lumped into one.

    With cells of ≥ 100 the χ² tail holds down to small p-values (simulated: P(p < 1e-5) ≈
    1e-5); with cells of 5 to 10 a cell's Poisson tail made P(p < 1e-6) ≈ 6e-6.
    """
    support = np.arange(-8 * int(np.ceil(scale)), 8 * int(np.ceil(scale)) + 1)
    observed = np.array([(draws == k).sum() for k in support] + [(np.abs(draws) > support[-1]).sum()])
    expected = _discrete_laplace_pmf(support, scale)
    expected = np.append(expected, 1 - expected.sum()) * draws.size
    keep = expected >= 100
    observed = np.append(observed[keep], observed[~keep].sum())
    expected = np.append(expected[keep], expected[~keep].sum())
    return float(stats.chisquare(observed, expected).pvalue)


def test_pooled_draws_follow_discrete_laplace_at_several_scales() -> None:
    for scale in (0.7, 1.0, 3.0):
        draws = np.array([laplace_int(0, scale) for _ in range(20_000)])
        # Fails by chance with p ≈ 1e-8 a scale (a floor of 1e-4 with cells of 5 failed with p ≈ 2e-4);
        # a scale off by 10% gives χ² in the hundreds.
        assert _chi_square_pvalue(draws, scale) > 1e-8, scale


def test_consecutive_draws_are_uncorrelated() -> None:
    draws = np.array([laplace_int(0, 2.0) for _ in range(20_000)], dtype=float)
    # r has sd 1/√20000 = 0.0071: ±0.04 (5.7 sd) fails by chance with p ≈ 2e-8 (±0.03 did with p ≈ 2e-5);
    # a value handed out twice in a row gives r ≈ 0.5.
    assert abs(np.corrcoef(draws[:-1], draws[1:])[0, 1]) < 0.04


def test_an_empty_pool_draws_on_the_spot_instead_of_waiting() -> None:
    pool = NoisePool(1.0, batch=4)
    pool._refill_pending = True  # as if a refill were running and had not delivered yet
    assert isinstance(pool.take(), int)
    assert len(pool._values) == 0


def test_every_drawn_value_is_handed_out_exactly_once_across_threads() -> None:
    pool = NoisePool(5.0, batch=64)
    pool._refill()
    drawn = list(pool._values)
    pool._refill_pending = True  # no background refill: only the drawn values, then on-the-spot draws
    taken: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        mine = [pool.take() for _ in range(16)]
        with lock:
            taken.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(taken) == sorted(drawn)
    assert len(pool._values) == 0


def test_a_low_pool_refills_in_the_background() -> None:
    pool = pool_for(1.234)
    pool.take()
    for _ in range(200):
        if len(pool._values) >= pool.batch // 2:
            break
        threading.Event().wait(0.01)
    assert len(pool._values) >= pool.batch // 2


def test_a_sum_beyond_64_bits_stays_exact() -> None:
    big = 2**70
    assert abs(laplace_int(big, 1.0) - big) < 200  # fails by chance with p ≈ e^-200
