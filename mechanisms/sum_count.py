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
"""

from __future__ import annotations

import math

from .laplace import _check_epsilon
from .release import Release
from .samplers import laplace_float, laplace_int

__all__ = ["mean_noise", "release_mean"]

# P(|Lap(b)| > b·ln 40) = 1/40: two such bounds hold together with probability ≥ 0.95.
_LN40 = math.log(40.0)


def mean_noise(lo: float, hi: float, epsilon: float) -> tuple[float, float, float]:
    """What :func:`release_mean` adds, before the data: the noisy sum's and the noisy count's
    Laplace scales, and the 95% error bound times the noisy count (divide by ñ for the bound)."""
    half, share = (float(hi) - float(lo)) / 2.0, epsilon / 2.0
    return half / share, 1.0 / share, 2.0 * half / share * _LN40


def release_mean(total: float, count: int, lo: float, hi: float, epsilon: float) -> Release[float]:
    """ε-DP mean of ``count`` values clamped into [lo, hi] whose exact sum is ``total``.

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
    mid, half = lo + (hi - lo) / 2.0, (hi - lo) / 2.0
    share = epsilon / 2.0
    centred = float(total) - mid * count
    noisy_sum = laplace_float(centred, half / share)
    denominator = max(laplace_int(count, 1.0 / share), 1)
    value = min(max(mid + noisy_sum / denominator, lo), hi)
    scale = half / share / denominator
    error95 = min(2.0 * half / share * _LN40 / denominator, hi - lo)
    return Release(value, epsilon, 0.0, scale, error95, "sum_count")
