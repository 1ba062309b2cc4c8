"""Sample and aggregate with a smooth-sensitivity median (Nissim, Raskhodnikova, Smith 2007).

AVG, MIN and MAX have no useful global sensitivity, so the rows are split at random into m
partitions, the aggregate is computed on each (values clamped to [lo, hi]), and this module
releases a differentially private median of the m partition values (seed 004; NRS07 §3.1).

Guarantee: the release is (ε, δ)-DP with respect to changing one of the m partition values.
That is one row added or removed as long as each row's partition is chosen independently of
the other rows (so a row moves only its own partition's value), m is fixed by the policy, and
every partition value lies in [lo, hi]. The noise is Laplace scaled by the β-smooth upper
bound S* of the median's local sensitivity; Laplace is (ε/2, β)-admissible for
β = ε / (2 ln(2/δ)), so median + (2·S*/ε)·Lap(1) is (ε, δ)-DP (NRS07 §2, admissible noise).
Clamping the output to [lo, hi] is post-processing. The Laplace draw is OpenDP's, exact on a
fine lattice; the analysis is that of the continuous distribution.

Conventions:

* Median of m sorted values x_1 ≤ … ≤ x_m: the lower median x_j with j = ⌈m/2⌉ (1-based),
  a single order statistic for every m. NRS07 state the odd case; their derivation holds for
  any fixed order statistic, so S* below is exact for the lower median too. For even m the
  release is biased down by at most half the gap between the two middle values.
* An empty partition (``None``) counts as the midpoint (lo + hi)/2, a fixed value that does
  not depend on the data, so emptiness is never revealed (an error or a different code path
  would reveal it). NaN counts as ``hi``, as PostgreSQL orders NaN above every number.
* Release.scale and error95 must not reveal S*, which depends on the data and is not
  itself private. They report the data-independent worst case: scale = 2(hi − lo)/ε ≥ 2S*/ε,
  and error95 = min(scale·ln 20, hi − lo) bounds |release − median| with probability ≥ 0.95.
  The actual noise is usually far smaller. Neither covers the sampling error of sample and
  aggregate (median of partitions vs the aggregate over all rows).

Choosing m (the number of partitions). More partitions give a less noisy median, fewer give
more accurate partition values:

* Noise. Changing about m/2 partition values can move the median to lo or hi, so
  S* ≥ (hi − lo)·e^{−β(⌈m/2⌉−1)}. Even for perfectly concentrated partition values the
  noise is then a fraction f of the range only once m ≥ 1 + 2·ln(1/f)/β
  = 1 + 4·ln(2/δ)·ln(1/f)/ε (:func:`recommended_partitions`). Rule of thumb: f = 1% with
  ε = 1, δ = 1e-6 needs m ≈ 270, and the m needed grows as 1/ε.
* Partition accuracy. Each partition holds about n/m rows. A partition mean has standard
  error σ·√(m/n), so keep n/m at 30 rows or more for AVG. For MIN and MAX the median of the
  partition minima (maxima) estimates a quantile near 0.69·m/n (1 − 0.69·m/n), not the
  extreme itself, which no DP mechanism can release accurately.

So m ≈ 4·ln(2/δ)·ln(100)/ε is enough, and the table needs about 30·m rows
for a useful AVG. Smaller tables get answers dominated by the range term.
"""

from __future__ import annotations

import math
from typing import Sequence

from .laplace import _check_epsilon, laplace_error95
from .release import Release
from .samplers import laplace_float

__all__ = [
    "median_index",
    "prepare_partition_values",
    "recommended_partitions",
    "release_sample_and_aggregate",
    "smooth_sensitivity_median",
    "smoothing_beta",
]

# A constant floor keeps the noise scale positive when S* underflows (β·m > ~700). The
# maximum of a β-smooth upper bound and a constant is still a β-smooth upper bound.
_SENSITIVITY_FLOOR = 2.0**-40


def smoothing_beta(epsilon: float, delta: float) -> float:
    """β = ε / (2 ln(2/δ)), the smoothing for which Laplace noise gives (ε, δ)-DP."""
    return epsilon / (2.0 * math.log(2.0 / delta))


def median_index(m: int) -> int:
    """0-based index of the lower median of m sorted values: ⌈m/2⌉ − 1."""
    return (m - 1) // 2


def recommended_partitions(epsilon: float, delta: float, fraction: float = 0.01) -> int:
    """Smallest m for which the range term (hi − lo)·e^{−β(⌈m/2⌉−1)} of S* is ≤ fraction·(hi − lo)."""
    _check_epsilon(epsilon)
    _check_delta(delta)
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    beta = smoothing_beta(epsilon, delta)
    return 2 * math.ceil(math.log(1.0 / fraction) / beta) + 1


def prepare_partition_values(
    values: Sequence[float | None], lo: float, hi: float
) -> list[float]:
    """The partition values sorted, with None → midpoint, NaN → hi, and all clamped to [lo, hi]."""
    lo, hi = float(lo), float(hi)
    midpoint = lo + (hi - lo) / 2.0
    prepared = []
    for value in values:
        if value is None:
            prepared.append(midpoint)
            continue
        x = float(value)
        prepared.append(hi if math.isnan(x) else min(max(x, lo), hi))
    prepared.sort()
    return prepared


def smooth_sensitivity_median(
    sorted_values: Sequence[float], lo: float, hi: float, beta: float
) -> float:
    """S*_β of the lower median: max_k e^{−kβ} · max_{0≤t≤k+1} (x_{j+t} − x_{j+t−k−1}).

    ``sorted_values`` are x_1 ≤ … ≤ x_m in [lo, hi]; x_i = lo for i < 1 and hi for i > m.
    Writing a = j+t−k−1 and b = j+t, S* is the maximum of (x_b − x_a)·e^{−β(b−a−1)} over
    0 ≤ a ≤ j ≤ b ≤ m+1 (smaller a or larger b only repeat lo or hi with less weight, so
    k ≤ m suffices). For a fixed row a, the comparison of two columns b1 < b2 is linear
    and non-decreasing in x_a, so the best column never moves left as a grows (the
    matrix is totally monotone). Divide and conquer over the rows then finds the exact maximum
    in O(m log m) evaluations. NRS07 remark that k may stop once e^{−kβ}·(hi − lo) is below the
    best value so far; that cut-off is exact too but can still need O(m²) work, this never does.
    """
    m = len(sorted_values)
    if m == 0:
        raise ValueError("need at least one partition value")
    x = [lo, *sorted_values, hi]
    j = median_index(m) + 1
    decay = [math.exp(-beta * k) for k in range(m + 1)]

    def weighted_gap(a: int, b: int) -> float:
        return (x[b] - x[a]) * decay[b - a - 1] if b > a else 0.0

    best = 0.0
    pending = [(0, j, j, m + 1)]  # rows a0..a1 whose best column lies in b0..b1
    while pending:
        a0, a1, b0, b1 = pending.pop()
        if a0 > a1:
            continue
        a = (a0 + a1) // 2
        best_b, best_value = b0, weighted_gap(a, b0)
        for b in range(b0 + 1, b1 + 1):
            value = weighted_gap(a, b)
            if value > best_value:
                best_b, best_value = b, value
        best = max(best, best_value)
        pending.append((a0, a - 1, b0, best_b))
        pending.append((a + 1, a1, best_b, b1))
    return best


def release_sample_and_aggregate(
    partition_values: Sequence[float | None],
    lo: float,
    hi: float,
    epsilon: float,
    delta: float,
) -> Release[float]:
    """(ε, δ)-DP median of the m partition values, clamped to [lo, hi].

    See the module docstring for the guarantee, the median convention, how empty partitions
    are handled and why Release.scale and error95 are the data-independent worst case.
    """
    _check_epsilon(epsilon)
    _check_delta(delta)
    lo, hi = float(lo), float(hi)
    if len(partition_values) < 1:
        raise ValueError("need at least one partition (m ≥ 1)")
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(hi - lo)):
        raise ValueError(f"bounds must be finite with a finite range, got [{lo!r}, {hi!r}]")
    if lo > hi:
        raise ValueError(f"lower bound {lo!r} exceeds upper bound {hi!r}")
    if lo == hi:
        return Release(lo, epsilon, delta, 0.0, 0.0, "smooth_median")

    values = prepare_partition_values(partition_values, lo, hi)
    median = values[median_index(len(values))]
    s_star = smooth_sensitivity_median(values, lo, hi, smoothing_beta(epsilon, delta))
    noise_scale = 2.0 * max(s_star, (hi - lo) * _SENSITIVITY_FLOOR) / epsilon
    noisy = min(max(laplace_float(median, noise_scale), lo), hi)

    worst_scale = 2.0 * (hi - lo) / epsilon
    error95 = min(laplace_error95(worst_scale), hi - lo)
    return Release(noisy, epsilon, delta, worst_scale, error95, "smooth_median")


def _check_delta(delta: float) -> None:
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
