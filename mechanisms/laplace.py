"""The Laplace mechanism for COUNT and SUM (Dwork, McSherry, Nissim and Smith, "Calibrating
Noise to Sensitivity in Private Data Analysis", 2006; as Evans, Girkins and Sartor, Mivule, and
Hu and Zhou's survey present it: docs/references.md).

Guarantee: for a query whose answer changes by at most Δ when one row is added or
removed, releasing ``answer + Lap(Δ/ε)`` is ε-differentially private (δ = 0). Integer
answers get discrete Laplace noise, so the release stays an integer with the same
guarantee. Post-processing (rounding, clamping at 0) does not weaken it.
"""

from __future__ import annotations

import math

from .release import Release
from .samplers import MAX_INT_SCALE, laplace_float, laplace_int

__all__ = ["laplace_error95", "release_count", "release_sum"]


def laplace_error95(scale: float) -> float:
    """The 95% bound of |Lap(scale)|: P(|X| > b·ln 20) = 0.05."""
    return scale * math.log(20.0)


def release_count(exact: int, epsilon: float) -> Release[int]:
    """ε-DP count: Δ = 1, discrete Laplace with scale 1/ε, clamped at 0."""
    _check_epsilon(epsilon)
    scale = 1.0 / epsilon
    noisy = max(0, laplace_int(exact, scale))
    return Release(noisy, epsilon, 0.0, scale, laplace_error95(scale), "laplace")


def release_sum(
    exact: int | float, epsilon: float, sensitivity: float, integer: bool
) -> Release[int] | Release[float]:
    """ε-DP sum of values already clamped so that one row moves it by at most ``sensitivity``.

    ``integer`` selects discrete Laplace (the exact sum and the sensitivity are integers).
    A sensitivity of 0 (bounds [0, 0]) releases the exact, data-independent answer 0.
    """
    _check_epsilon(epsilon)
    if sensitivity < 0:
        raise ValueError("sensitivity must be non-negative")
    if sensitivity == 0:
        return Release(type(exact)(0), epsilon, 0.0, 0.0, 0.0, "laplace")
    scale = sensitivity / epsilon
    if integer:
        value: int | float
        value, scale = _integer_sum(int(exact), int(sensitivity), epsilon)
    else:
        value = laplace_float(float(exact), scale)
    return Release(value, epsilon, 0.0, scale, laplace_error95(scale), "laplace")


def _integer_sum(exact: int, sensitivity: int, epsilon: float) -> tuple[int, float]:
    """``exact`` + discrete Laplace(sensitivity/ε), ε-DP; returns the value and the scale used.

    Above ``MAX_INT_SCALE`` (wide bounds of a bigint column at a small ε) the i64 sampler would
    saturate, so the sum is released at a granularity g = 2^j instead:
    g·(⌊exact/g⌋ + DLap(⌈Δ/g⌉/ε)). ⌊x/g⌋ moves by at most ⌈Δ/g⌉ when x moves by Δ, so this is
    ε-DP too, with a noise scale g·⌈Δ/g⌉/ε ≥ Δ/ε (a little more noise, never less).
    """
    if sensitivity / epsilon <= MAX_INT_SCALE:
        return laplace_int(exact, sensitivity / epsilon), sensitivity / epsilon
    g = 1
    while -(-sensitivity // g) / epsilon > MAX_INT_SCALE:
        if g >= sensitivity:  # ⌈Δ/g⌉ = 1 already: ε itself is below 1/MAX_INT_SCALE
            raise ValueError(f"epsilon {epsilon!r} is too small for integer noise")
        g *= 2
    coarse = -(-sensitivity // g)
    return g * laplace_int(exact // g, coarse / epsilon), g * coarse / epsilon


def _check_epsilon(epsilon: float) -> None:
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite positive number, got {epsilon!r}")
