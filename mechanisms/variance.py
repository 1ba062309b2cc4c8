"""VARIANCE and STDDEV (population and sample) from three noisy moments, pure ε (δ = 0).

Guarantee: for values clamped into [lo, hi], centred on c and put on a grid of step s (each
row's centred value d = p(x) − C an integer number of points, |d| ≤ D; :class:`MomentGrid`),
releasing

    ñ = n + DiscreteLap(1/ε_n),   S̃ = Σ d + DiscreteLap(D/ε_S),   Q̃ = Σ d² + DiscreteLap(D²/ε_Q)

with ε_n + ε_S + ε_Q = ε is ε-differentially private under adding or removing one row. One
row moves n by 1, Σ d by its own d (|d| ≤ D) and Σ d² by its own d² (0 ≤ d² ≤ D²); nothing
else moves, since each term is a function of its row alone. Each noisy value is then
ε_i-DP (the Laplace mechanism over the integers), all three ε-DP (sequential composition),
and everything after is post-processing of (ñ, S̃, Q̃):

    var_pop  = clamp(Q̃/m − (S̃/m)², 0, D²)·s²,   m = max(ñ, 1)
    var_samp = var_pop(m')·m'/(m' − 1),          m' = max(ñ, 2)
    stddev   = √var

All four are computed from one draw of the three (:class:`NoisyMoments`, :func:`variance_of`):
a statement asking several of them of one column under one condition pays for one release.

Choices (docs/mechanisms.md):

* The split. To first order the error of the population variance is
  (e_Q − 2μ·e_S − (σ² − μ²)·e_n)/n with μ the mean's offset from the centre (|μ| ≤ h) and
  σ² + μ² ≤ h². Its variance is ∝ h⁴/ε_Q² + 4μ²h²/ε_S² + (σ² − μ²)²/ε_n², largest over the
  data at μ = ±h (every value at one bound): h⁴·(1/ε_Q² + 4/ε_S² + 1/ε_n²). That is least
  for ε_i ∝ (1, 4^⅓, 1): ε_n = ε_Q ≈ 0.279·ε and ε_S ≈ 0.443·ε, a worst-case variance
  about 15% below the even split's. (For data centred in its bounds, μ ≈ 0, the even split
  would do better; a split tuned to a guessed mean helps only when the guess is right.)
* A noisy count below 1 (below 2 for the sample forms) is replaced by it, and the variance
  is clamped into [0, h²], the population variance's range over [c − h, c + h]: the same
  formula runs whatever the data, so no answer is NULL or an error because few rows
  matched. The sample forms are the clamped population variance times m'/(m' − 1), at most
  2h².
* Exact sums. The backend returns n, Σ d and Σ d² as exact integers (``rewriter.rewrite``:
  ``bigint`` terms, ``numeric`` sums); nothing is rounded before the noise. Integer columns
  use the grid of step 1/2, on which every centred value, c = (lo + hi)/2 included, is an
  integer: D = hi − lo points, exactly h. Float and numeric columns use their sum grid
  (``mechanisms.fixed_point``, step 2^-k with max(|lo|, |hi|) just below 2^52 points), each
  value's point clamped again into [p(lo), p(hi)] on the grid, so D is the bound the SQL
  itself enforces; d² ≤ 2^106 and the sums of n terms are exact ``numeric``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from .fixed_point import Grid
from .laplace import _check_epsilon, integer_noise_scale, laplace_integer_sum
from .release import Release
from .samplers import laplace_int

__all__ = ["MomentGrid", "MomentsRelease", "NoisyMoments", "SHARES", "VarianceKind", "mean_of", "moment_noise",
           "noisy_moments", "release_variance", "variance_of"]

VarianceKind = Literal["var_pop", "var_samp", "stddev_pop", "stddev_samp"]

_CUBE_ROOT_4 = 4.0 ** (1.0 / 3.0)
SHARES = (1.0 / (2.0 + _CUBE_ROOT_4), _CUBE_ROOT_4 / (2.0 + _CUBE_ROOT_4), 1.0 / (2.0 + _CUBE_ROOT_4))
"""The shares of ε the count, the centred sum and the centred sum of squares get (sum 1)."""

# P(|Lap(b)| > b·ln 60) = 1/60: three such bounds hold together with probability ≥ 0.95.
_LN60 = math.log(60.0)
# And b·ln 40 for two (a mean's count and centred sum), as mechanisms.sum_count bounds its own.
_LN40 = math.log(40.0)


@dataclass(frozen=True)
class MomentsRelease(Release[float]):
    """A released variance or standard deviation and its three parts' Laplace scales (count,
    centred sum in column units, centred sum of squares in squared units; the notice says them)."""

    scales: tuple[float, float, float] = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class MomentGrid:
    """Where a column's centred values are counted: each row's value x, clamped into the bounds,
    is the point p(x) = rint(x·2^k) of ``grid`` (clamped into [``low``, ``high``]), and its
    centred value the integer d = p(x) − ``centre``, with |d| ≤ ``reach``."""

    grid: Grid
    low: int
    high: int
    centre: int

    @classmethod
    def for_bounds(cls, lo: float, hi: float, integer: bool) -> MomentGrid:
        """An integer column's grid of step 1/2 (c = (lo + hi)/2 is a point), else the column's
        sum grid (``Grid.for_bounds``) centred on the midpoint of the bounds' points, rounded
        down (any centre the data does not choose would do: D counts the distance)."""
        if not (math.isfinite(float(lo)) and math.isfinite(float(hi))) or lo > hi:
            raise ValueError(f"bounds must be finite with lo <= hi, got [{lo!r}, {hi!r}]")
        if integer:
            return cls(Grid(1), 2 * int(lo), 2 * int(hi), int(lo) + int(hi))
        grid = Grid.for_bounds(lo, hi)
        low, high = grid.point(lo), grid.point(hi)
        return cls(grid, low, high, (low + high) // 2)

    @property
    def reach(self) -> int:
        """D: the largest |d| a row can have, in points."""
        return max(self.high - self.centre, self.centre - self.low)


def moment_noise(moments: MomentGrid, epsilon: float) -> tuple[float, float, float]:
    """The Laplace scales of the noisy count, centred sum (column units) and centred sum of
    squares (squared units) :func:`release_variance` draws at, known before the data."""
    share_n, share_s, share_q = (epsilon * share for share in SHARES)
    step = moments.grid.step
    return (1.0 / share_n, integer_noise_scale(moments.reach, share_s) * step,
            _scaled(integer_noise_scale(moments.reach**2, share_q), 2 * moments.grid.exponent))


@dataclass(frozen=True)
class NoisyMoments:
    """One release of a column's moments: the noisy count ñ, centred sum S̃ and centred sum of
    squares Q̃ (integers, in points of ``moments``), drawn once at ``epsilon``, and the three
    draws' scales in points. Every variance and standard deviation of the column under the same
    condition is computed from it (:func:`variance_of`), post-processing that costs nothing more."""

    count: int
    centred_sum: int
    centred_squares: int
    moments: MomentGrid
    epsilon: float
    scales: tuple[float, float, float]


def noisy_moments(count: int, centred_sum: int, centred_squares: int, moments: MomentGrid,
                  epsilon: float) -> NoisyMoments:
    """The ε-DP moments of ``count`` values whose centred points sum to ``centred_sum`` and whose
    squares sum to ``centred_squares`` (exact integers, :class:`MomentGrid`): one draw each,
    at ε_n, ε_S and ε_Q (:data:`SHARES`). With lo = hi (D = 0) nothing is drawn: every value
    is the centre and every variance 0 whatever the rows."""
    _check_epsilon(epsilon)
    if count < 0 or centred_squares < 0:
        raise ValueError("a count and a sum of squares are non-negative")
    reach = moments.reach
    if reach == 0:
        return NoisyMoments(0, 0, 0, moments, epsilon, (0.0, 0.0, 0.0))
    share_n, share_s, share_q = (epsilon * share for share in SHARES)
    count_scale = 1.0 / share_n
    noisy_count = laplace_int(count, count_scale)
    noisy_sum, sum_scale = laplace_integer_sum(centred_sum, reach, share_s)
    noisy_squares, squares_scale = laplace_integer_sum(centred_squares, reach**2, share_q)
    return NoisyMoments(noisy_count, noisy_sum, noisy_squares, moments, epsilon, (count_scale, sum_scale, squares_scale))


def variance_of(kind: VarianceKind, noisy: NoisyMoments) -> MomentsRelease:
    """``kind`` computed from the released ``noisy`` moments alone (post-processing).

    Release.scale is the centred sum of squares' noise scale over the noisy count (the part
    that dominates on wide data), and error95 a bound the error stays below with probability
    about 0.95, to first order: (b_Q + 2h·b_S + h²·b_n)·ln 60 / m, each draw within its
    1/60 tail, at most the release's range. For the standard deviations it is the variance's
    bound e carried through the square root: |√v̂ − √v| = |v̂ − v|/(√v̂ + √v) ≤ min(√e, e/√v̂).
    Both are functions of released values: reporting them is free.

    Of one ``noisy``, stddev_pop² = var_pop and stddev_samp² = var_samp up to the square root's
    rounding, and var_samp = var_pop·m/(m − 1) whenever the noisy count m is at least 2.
    """
    moments, epsilon = noisy.moments, noisy.epsilon
    reach = moments.reach
    exponent = moments.grid.exponent
    if reach == 0:  # lo = hi: every value is the centre, the variance is 0 whatever the rows
        return MomentsRelease(0.0, epsilon, 0.0, 0.0, 0.0, "moments")
    count_scale, sum_scale, squares_scale = noisy.scales
    sample = kind in ("var_samp", "stddev_samp")
    m = max(noisy.count, 2 if sample else 1)
    # In points², exactly, then clamped into [0, D²]: the population variance's range.
    points = min(max(Fraction(noisy.centred_squares, m) - Fraction(noisy.centred_sum, m) ** 2, Fraction(0)),
                 Fraction(reach**2))
    widest = Fraction(reach**2)
    if sample:
        points, widest = points * m / (m - 1), widest * m / (m - 1)
    bound = min((squares_scale + 2 * reach * sum_scale + reach**2 * count_scale) * _LN60 / m, float(widest))
    scales = (count_scale, _scaled(sum_scale, exponent), _scaled(squares_scale, 2 * exponent))
    if kind.startswith("stddev"):
        spread = math.sqrt(points)
        within = min(math.sqrt(bound), bound / spread) if spread else math.sqrt(bound)
        return MomentsRelease(_scaled(spread, exponent), epsilon, 0.0,
                              _scaled(math.sqrt(squares_scale / m), exponent), _scaled(within, exponent),
                              "moments", scales)
    return MomentsRelease(_scaled(float(points), 2 * exponent), epsilon, 0.0, _scaled(squares_scale / m, 2 * exponent),
                          _scaled(bound, 2 * exponent), "moments", scales)


def mean_of(noisy: NoisyMoments, lo: float, hi: float) -> Release[float]:
    """The mean of the clamped values in [``lo``, ``hi``] (the bounds ``noisy.moments`` was made
    for) from the released moments alone: c + S̃·s/max(ñ, 1), clamped into [lo, hi] (post-processing).

    Release.scale is the centred sum's scale over the noisy count, and error95 the first-order
    bound (b_S + h·b_n)·ln 40 / m, each of the two draws within its 1/40 tail, at most hi − lo
    (``mechanisms.sum_count`` reports its own mean's the same way)."""
    moments = noisy.moments
    lo, hi = float(lo), float(hi)
    if moments.reach == 0:
        return Release(lo, noisy.epsilon, 0.0, 0.0, 0.0, "moments")
    m = max(noisy.count, 1)
    exponent = moments.grid.exponent
    point = Fraction(moments.centre) + Fraction(noisy.centred_sum, m)
    value = min(max(_scaled(float(point), exponent), lo), hi)
    count_scale, sum_scale, _ = noisy.scales
    bound = (sum_scale + moments.reach * count_scale) * _LN40 / m
    return Release(value, noisy.epsilon, 0.0, _scaled(sum_scale / m, exponent),
                   min(_scaled(bound, exponent), hi - lo), "moments")


def release_variance(
    kind: VarianceKind, count: int, centred_sum: int, centred_squares: int, moments: MomentGrid, epsilon: float
) -> MomentsRelease:
    """ε-DP ``kind`` of ``count`` values whose centred points sum to ``centred_sum`` and whose
    squares sum to ``centred_squares``: :func:`variance_of` one fresh :func:`noisy_moments`."""
    return variance_of(kind, noisy_moments(count, centred_sum, centred_squares, moments, epsilon))


def _scaled(points: float, exponent: int) -> float:
    """``points`` in column units: times 2^-exponent (a power of two: exact, 0 below the doubles,
    and infinity above them, which only a noise scale can reach: ``rewriter.types`` bounds the
    columns so that every released value is finite)."""
    try:
        return math.ldexp(points, -exponent)
    except OverflowError:
        return math.inf
