"""AVG as a noisy clamped sum over a noisy count (the policy option ``avg: sum_count``).

Guarantee: for values clamped into [lo, hi], releasing

    mid + Lap_sum / max(ñ, 1)   with   Lap_sum = Σ (x_i − mid) + Lap(h / (ε/2)),
                                       ñ = n + DiscreteLap(1 / (ε/2)),

clamped to [lo, hi], is ε-differentially private (δ = 0) under adding or removing one row.
Here mid = (lo + hi)/2 and h = (hi − lo)/2. One row moves the centred sum Σ (x_i − mid) by
at most h and the count n by at most 1, so each noisy value is (ε/2)-DP (Laplace mechanism);
together they are ε-DP (sequential composition), and the ratio, the floor at 1 and the
clamp are post-processing.

Choices:

* Centring on the midpoint. The plain clamped sum has sensitivity max(|lo|, |hi|), the
  centred one h = (hi − lo)/2, which is never larger and much smaller for bounds far from 0
  (age in [17, 90]: 36.5 instead of 90). It also pulls answers over few rows towards the
  middle of the range instead of towards 0.
* The even ε split. The error is (e_sum − c·e_count)/ñ where c = mean − mid, |c| ≤ h. With
  scales h/ε_s and 1/ε_c its variance is ∝ h²/ε_s² + c²/ε_c², and the split that minimises
  the worst case over c (c = h) is ε_s = ε_c = ε/2. A split tuned to a guessed mean would
  help only when the guess is right.
* A noisy count ≤ 0 (an empty or tiny filter) is replaced by 1: the answer is then the
  midpoint plus sum noise, clamped. The same formula runs whatever the data, so nothing
  reveals that the filter was empty.
* Nothing is rounded before the noise but what the sensitivity counts. The centred sum is
  noised as an integer number of points of the grid of ``mechanisms.fixed_point`` (step
  2^-k, about 2^-52 of the largest bound): for float columns the backend sums the clamped
  values on that grid exactly, for integer and numeric columns the exact centred sum is
  computed in rationals and rounded to the grid once (one more point of sensitivity).
  ``float(total) − mid·count`` rounded relative to n·|mid| instead, an error one row does
  not bound: with bounds [1e15, 1e15 + 2] (h = 1) over 100 rows it moved the centred sum by
  16 between two neighbours whose exact centred sums are equal; a float column's sum of
  doubles is rounded at every addition (tests/test_attack_mechanisms.py).
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple

from .fixed_point import Grid
from .laplace import _check_epsilon, integer_noise_scale, laplace_integer_sum
from .release import Release
from .samplers import laplace_int

__all__ = ["centre", "mean_noise", "release_mean"]

# P(|Lap(b)| > b·ln 40) = 1/40: two such bounds hold together with probability ≥ 0.95.
_LN40 = math.log(40.0)


def centre(lo: float, hi: float) -> float:
    """The double the sum is centred on: lo + (hi − lo)/2 in floating point.

    The backend subtracts this very value from each clamped value of a float column
    (``rewriter.rewrite.centred_sum``), so it must be computed alike on both sides.
    """
    lo, hi = float(lo), float(hi)
    return lo + (hi - lo) / 2.0


class _Centred(NamedTuple):
    """What :func:`_centred_points` derives from a column's bounds."""

    grid: Grid
    point: int  # the centre as a grid point C
    points: int  # the most one row moves the centred sum, in points
    centre: Fraction  # the centre, exactly (a double: its denominator is a power of two)


@lru_cache(maxsize=1024)
def _centred_points(lo: float, hi: float, on_grid: bool) -> _Centred:
    """The grid the centred sum is noised on, the centre as a grid point C, the most one
    row moves the centred sum in points, and the centre as an exact fraction.

    ``on_grid`` (float columns): the backend's total is Σ rint(x·2^k) (``mechanisms.fixed_point``)
    and the centred sum Σ (rint(x·2^k) − C) exactly, each term in [L − C, H − C]. Otherwise
    (integer and numeric columns) the total is exact, the centred sum Σ x − n·c is computed in
    rationals and rounded to the grid once, which adds at most one point to the h·2^k one row
    moves it by.

    A function of the policy's bounds alone, so it is kept per bounds (~15 µs of rational
    arithmetic per AVG column otherwise); no count, sum or ε is part of the key.
    """
    grid = Grid.for_bounds(lo, hi)
    c = centre(lo, hi)
    if on_grid:
        point = grid.point(c)
        return _Centred(grid, point, max(grid.point(hi) - point, point - grid.point(lo)), Fraction(c))
    half = max(Fraction(hi) - Fraction(c), Fraction(c) - Fraction(lo)) * Fraction(2) ** grid.exponent
    return _Centred(grid, grid.point(c), math.ceil(half) + 1, Fraction(c))


def mean_noise(lo: float, hi: float, epsilon: float, on_grid: bool = False) -> tuple[float, float, float]:
    """What :func:`release_mean` adds, before the data: the noisy sum's and the noisy count's
    Laplace scales, and the 95% error bound times the noisy count (divide by ñ for the bound)."""
    grid, _, points, _ = _centred_points(float(lo), float(hi), on_grid)
    share = epsilon / 2.0
    scale = integer_noise_scale(points, share) * grid.step
    return scale, 1.0 / share, 2.0 * scale * _LN40


def release_mean(
    total: int | Decimal, count: int, lo: float, hi: float, epsilon: float, on_grid: bool = False
) -> Release[float]:
    """ε-DP mean of ``count`` values clamped into [lo, hi] whose exact sum is ``total``.

    ``total`` is the backend's sum as loaded, exact: an ``int`` or a ``Decimal`` for integer
    and numeric columns; with ``on_grid`` (float columns) the integer Σ rint(x·2^k) of
    ``mechanisms.fixed_point``, since a sum of doubles is rounded relative to the running
    total. Either way the centred sum is noised as an integer number of grid points, with
    nothing rounded before the noise but the one rounding to the grid that its sensitivity
    counts (see :func:`_centred_points`).

    Release.scale is the sum noise's scale divided by the noisy count, and error95 the
    bound (h/ε_s + h/ε_c)·ln 40 / max(ñ, 1) (at most hi − lo) that |release − mean| stays
    below with probability about 0.95: |error| = |e_sum − c·e_count| / ñ with |c| ≤ h, and
    each draw stays within its 97.5% bound (the discrete Laplace tail approximated by the
    continuous one). Both are functions of the released noisy values,
    so reporting them costs no privacy.
    """
    _check_epsilon(epsilon)
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
        raise ValueError(f"bounds must be finite with lo <= hi, got [{lo!r}, {hi!r}]")
    if count < 0:
        raise ValueError("count must be non-negative")
    if lo == hi:
        return Release(lo, epsilon, 0.0, 0.0, 0.0, "sum_count")
    grid, middle, points, exact_centre = _centred_points(lo, hi, on_grid)
    share = epsilon / 2.0
    if on_grid:
        centred = int(total) - middle * count
    elif isinstance(total, int):
        # (total − c·n)·2^k rounded, c = p/q: the same integer as through Fractions, in integers.
        p, q = exact_centre.numerator, exact_centre.denominator
        centred = grid.rounded_ratio(total * q - p * count, q)
    else:
        centred = grid.rounded(Fraction(total) - exact_centre * count)
    noisy, sum_scale = laplace_integer_sum(centred, points, share)
    denominator = max(laplace_int(count, 1.0 / share), 1)
    mid = grid.value(middle) if on_grid else centre(lo, hi)
    value = min(max(mid + grid.value(noisy) / denominator, lo), hi)
    scale = sum_scale * grid.step / denominator
    error95 = min(2.0 * sum_scale * grid.step * _LN40 / denominator, hi - lo)
    return Release(value, epsilon, 0.0, scale, error95, "sum_count")
