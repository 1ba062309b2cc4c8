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
* The centred sum is computed exactly (in rationals) from the backend's total, and rounded
  to a double once, relative to its own size (at most n·h). ``float(total) − mid·count``
  rounded the total and the product relative to n·|mid| instead, an error one row does not
  bound: with bounds [1e15, 1e15 + 2] (h = 1) over 100 rows it moved the centred sum by 16
  between two neighbours whose exact centred sums are equal (tests/test_attack_mechanisms.py).
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from .laplace import _check_epsilon
from .release import Release
from .samplers import laplace_float, laplace_int

__all__ = ["centre", "mean_noise", "release_mean", "row_bound"]

# P(|Lap(b)| > b·ln 40) = 1/40: two such bounds hold together with probability ≥ 0.95.
_LN40 = math.log(40.0)


def centre(lo: float, hi: float) -> float:
    """The double the sum is centred on: lo + (hi − lo)/2 in floating point.

    The backend subtracts this very value from each clamped value of a float column
    (``rewriter.rewrite.centred_sum``), so it must be computed alike on both sides.
    """
    lo, hi = float(lo), float(hi)
    return lo + (hi - lo) / 2.0


def row_bound(lo: float, hi: float, backend_centred: bool = False) -> float:
    """The most one row moves the centred sum: max(hi − c, c − lo) for c = :func:`centre`.

    ``backend_centred``: the backend summed fl(x − c) in ``double precision`` (float columns);
    rounding is monotone, so each term lies in [fl(lo − c), fl(hi − c)] and the bound is those
    two doubles. Otherwise the centred sum is exact and the bound is the exact value rounded up.
    """
    lo, hi = float(lo), float(hi)
    c = centre(lo, hi)
    if backend_centred:
        return max(hi - c, c - lo)
    exact = max(Fraction(hi) - Fraction(c), Fraction(c) - Fraction(lo))
    bound = float(exact)
    return bound if Fraction(bound) >= exact else math.nextafter(bound, math.inf)


def mean_noise(lo: float, hi: float, epsilon: float, backend_centred: bool = False) -> tuple[float, float, float]:
    """What :func:`release_mean` adds, before the data: the noisy sum's and the noisy count's
    Laplace scales, and the 95% error bound times the noisy count (divide by ñ for the bound)."""
    half, share = row_bound(lo, hi, backend_centred), epsilon / 2.0
    return half / share, 1.0 / share, 2.0 * half / share * _LN40


def release_mean(
    total: int | Decimal | float, count: int, lo: float, hi: float, epsilon: float, backend_centred: bool = False
) -> Release[float]:
    """ε-DP mean of ``count`` values clamped into [lo, hi] whose exact sum is ``total``.

    ``total`` is the backend's sum as loaded: an ``int`` or a ``Decimal`` for integer and
    numeric columns (exact); pass it unconverted, the centred sum is computed from it exactly.
    With ``backend_centred`` (float columns) ``total`` is already the centred sum Σ fl(x − c),
    c = :func:`centre`, summed by the backend in ``double precision``: the sum of the values
    themselves would be rounded relative to n·|c|, and the centred one is rounded relative to
    n·h only (what remains is floating-point summation's error, about n²·h·2^-53).

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
    mid, half = centre(lo, hi), row_bound(lo, hi, backend_centred)
    share = epsilon / 2.0
    centred = float(total) if backend_centred else float(Fraction(total) - Fraction(mid) * count)
    noisy_sum = laplace_float(centred, half / share)
    denominator = max(laplace_int(count, 1.0 / share), 1)
    value = min(max(mid + noisy_sum / denominator, lo), hi)
    scale = half / share / denominator
    error95 = min(2.0 * half / share * _LN40 / denominator, hi - lo)
    return Release(value, epsilon, 0.0, scale, error95, "sum_count")
