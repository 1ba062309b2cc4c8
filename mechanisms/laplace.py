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
from .samplers import laplace_float, laplace_int

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
        value: int | float = laplace_int(int(exact), scale)
    else:
        value = laplace_float(float(exact), scale)
    return Release(value, epsilon, 0.0, scale, laplace_error95(scale), "laplace")


def _check_epsilon(epsilon: float) -> None:
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be a finite positive number, got {epsilon!r}")
