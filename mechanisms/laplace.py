"""The Laplace mechanism for COUNT and SUM (Dwork, McSherry, Nissim and Smith, "Calibrating
Noise to Sensitivity in Private Data Analysis", 2006; as Evans, Girkins and Sartor, Mivule, and
Hu and Zhou's survey present it: docs/references.md).

Guarantee: for a query whose answer changes by at most Δ when one row is added or
removed, releasing ``answer + Lap(Δ/ε)`` is ε-differentially private (δ = 0). The noise is
discrete Laplace on integers: integer sums are noised as they are, float and numeric ones on
the exact fixed-point grid of ``mechanisms.fixed_point``, so nothing is rounded before the
noise. Post-processing (scaling back, clamping at 0) does not weaken it.
"""

from __future__ import annotations

import math

from .fixed_point import Grid
from .release import Release
from .samplers import MAX_INT_SCALE, laplace_int

__all__ = ["integer_noise_scale", "laplace_error95", "laplace_integer_sum", "release_count", "release_grid_sum", "release_sum"]


def laplace_error95(scale: float) -> float:
    """The 95% bound of |Lap(scale)|: P(|X| > b·ln 20) = 0.05."""
    return scale * math.log(20.0)


def release_count(exact: int, epsilon: float) -> Release[int]:
    """ε-DP count: Δ = 1, discrete Laplace with scale 1/ε, clamped at 0."""
    _check_epsilon(epsilon)
    scale = 1.0 / epsilon
    noisy = max(0, laplace_int(exact, scale))
    return Release(noisy, epsilon, 0.0, scale, laplace_error95(scale), "laplace")


def release_sum(exact: int, epsilon: float, sensitivity: int) -> Release[int]:
    """ε-DP sum of integers already clamped so that one row moves it by at most ``sensitivity``:
    discrete Laplace, so the release is an integer. A sensitivity of 0 (bounds [0, 0])
    releases the exact, data-independent answer 0."""
    _check_epsilon(epsilon)
    if sensitivity < 0:
        raise ValueError("sensitivity must be non-negative")
    if sensitivity == 0:
        return Release(0, epsilon, 0.0, 0.0, 0.0, "laplace")
    value, scale = laplace_integer_sum(int(exact), int(sensitivity), epsilon)
    return Release(value, epsilon, 0.0, scale, laplace_error95(scale), "laplace")


def release_grid_sum(points: int, sensitivity: int, grid: Grid, epsilon: float) -> Release[float]:
    """ε-DP sum of a float or numeric column, from its exact total on ``grid``
    (``mechanisms.fixed_point``): ``points``, which one row moves by at most ``sensitivity``
    points, gets discrete Laplace noise, and the release is scaled back to the column's units.

    No rounding happens before the noise, so the guarantee is exact, whatever the number of
    rows (a sum of doubles is not: Casacuberta et al. 2022, in ``mechanisms.fixed_point``).
    """
    release = release_sum(points, epsilon, sensitivity)
    scale = release.scale * grid.step
    return Release(grid.value(release.value), epsilon, 0.0, scale, laplace_error95(scale), "laplace")


def laplace_integer_sum(exact: int, sensitivity: int, epsilon: float) -> tuple[int, float]:
    """``exact`` + discrete Laplace(sensitivity/ε), ε-DP; returns the value and the scale used.

    Above ``MAX_INT_SCALE`` (wide bounds of a bigint column at a small ε) the i64 sampler would
    saturate, so the sum is released at a granularity g = 2^j instead:
    g·(⌊exact/g⌋ + DLap(⌈Δ/g⌉/ε)). ⌊x/g⌋ moves by at most ⌈Δ/g⌉ when x moves by Δ, so this is
    ε-DP too, with a noise scale g·⌈Δ/g⌉/ε ≥ Δ/ε (a little more noise, never less).

    A sensitivity of 0 (no row can move ``exact``: a float column whose bounds are subnormal
    has every value's grid point 0) releases ``exact`` as it is, with scale 0.
    """
    if sensitivity == 0:
        return exact, 0.0
    g = _granularity(sensitivity, epsilon)
    if g == 1:
        return laplace_int(exact, sensitivity / epsilon), sensitivity / epsilon
    coarse = -(-sensitivity // g)
    return g * laplace_int(exact // g, coarse / epsilon), g * coarse / epsilon


def integer_noise_scale(sensitivity: int, epsilon: float) -> float:
    """The scale :func:`laplace_integer_sum` draws at, known before the data: g·⌈Δ/g⌉/ε."""
    g = _granularity(sensitivity, epsilon)
    return g * -(-sensitivity // g) / epsilon


def _granularity(sensitivity: int, epsilon: float) -> int:
    """The power of two g at which :func:`laplace_integer_sum` draws: 1 unless the scale Δ/ε
    is above ``MAX_INT_SCALE``, else the least g with ⌈Δ/g⌉/ε within it."""
    if sensitivity / epsilon <= MAX_INT_SCALE:
        return 1
    g = 1
    while -(-sensitivity // g) / epsilon > MAX_INT_SCALE:
        if g >= sensitivity:  # ⌈Δ/g⌉ = 1 already: ε itself is below 1/MAX_INT_SCALE
            raise ValueError(f"epsilon {epsilon!r} is too small for integer noise")
        g *= 2
    return g


def _check_epsilon(epsilon: float) -> None:
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite positive number, got {epsilon!r}")
