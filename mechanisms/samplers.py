"""Secure, floating-point-safe noise samplers.

Every random draw that protects privacy in dpproxy comes from here. The samplers are
OpenDP's: they take their randomness from the operating system's CSPRNG and sample
exactly (discrete Laplace on integers; Laplace on floats via a discretised lattice), so
they do not have the low-order-bit weakness of ``x + numpy.random.laplace()``
(Mironov 2012, "On significance of the least significant bits for differential privacy").
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Sequence

import opendp.prelude as dp

from .noise_pool import pool_for

dp.enable_features("contrib")

__all__ = ["MAX_INT_SCALE", "laplace_int", "laplace_float", "laplace_float_vector", "gumbel_argmax"]

MAX_INT_SCALE = 2.0**57
"""The largest scale ``laplace_int`` draws at. OpenDP's integer sampler works in i64 and
saturates a draw at ±(2^63 − 1): at a scale near 2^63 a large share of draws come out as
exactly that constant, so ``value + draw`` gives ``value`` away. Up to 2^57 a draw reaches
the limit with probability about e^-64. Wider integer noise: ``mechanisms.laplace.release_sum``."""


# Built once: the smooth median's noise scale is new on every release, so its measurement
# is rebuilt each time, and constructing these two objects was half of that (~60 µs).
_FLOAT_DOMAIN = dp.atom_domain(T=float, nan=False)
_FLOAT_METRIC = dp.absolute_distance(T=float)
_FLOAT_VECTOR_DOMAIN = dp.vector_domain(_FLOAT_DOMAIN)
_FLOAT_VECTOR_METRIC = dp.l1_distance(T=float)


def _float_laplace(scale: float) -> Any:
    # Built on every draw, never cached: its one caller, the smooth median, draws at a scale that
    # depends on the data (S*), and a cache hit (~20 µs less) would tell that an earlier release
    # had the same S*, or that S* was at its floor, a constant (benchmarks/proxy_cost.py).
    return dp.m.make_laplace(_FLOAT_DOMAIN, _FLOAT_METRIC, scale=scale)


@lru_cache(maxsize=64)
def _float_laplace_vector(scale: float) -> Any:
    return dp.m.make_laplace(_FLOAT_VECTOR_DOMAIN, _FLOAT_VECTOR_METRIC, scale=scale)


@lru_cache(maxsize=64)
def _gumbel_noisy_max(scale: float) -> Any:
    # OpenDP 0.16 picks the noise from the output measure: zero-concentrated divergence gives
    # Gumbel noise (argmax ~ softmax, the exponential mechanism); max divergence gives
    # exponential noise, which is permute-and-flip, a different distribution. Only the sampler
    # is used here; the privacy accounting is the caller's.
    return dp.m.make_noisy_max(
        dp.vector_domain(dp.atom_domain(T=float, nan=False)),
        dp.linf_distance(T=float),
        dp.zero_concentrated_divergence(),
        scale=scale,
    )


def _check_scale(scale: float) -> float:
    scale = float(scale)
    if not scale > 0.0 or scale != scale or scale == float("inf"):
        raise ValueError(f"noise scale must be a finite positive number, got {scale!r}")
    return scale


def laplace_int(value: int, scale: float) -> int:
    """Return ``value`` plus discrete Laplace noise: P(k) ∝ exp(-|k|/scale).

    With integer sensitivity Δ this is (Δ/scale)-DP for a query whose answer is ``value``.
    The draw comes from a pool that OpenDP fills in batches (``mechanisms.noise_pool``);
    the sum is exact in Python's integers.
    """
    scale = _check_scale(scale)
    if scale > MAX_INT_SCALE:
        raise ValueError(f"integer noise scale {scale!r} is above {MAX_INT_SCALE:g}: the i64 sampler would saturate")
    return int(value) + pool_for(scale).take()


def laplace_float(value: float, scale: float) -> float:
    """Return ``value`` plus continuous Laplace(scale) noise, sampled without float artefacts.

    With L1 sensitivity Δ this is (Δ/scale)-DP for a query whose answer is ``value``. The
    measurement is built anew on every call, so its time does not depend on earlier scales.
    """
    return float(_float_laplace(_check_scale(scale))(float(value)))


def laplace_float_vector(values: Sequence[float], scale: float) -> list[float]:
    """Add independent Laplace(scale) noise to each element of ``values`` in one call."""
    return [float(v) for v in _float_laplace_vector(_check_scale(scale))([float(v) for v in values])]


def gumbel_argmax(scores: Sequence[float], scale: float) -> int:
    """Return index i with probability exp(scores[i]/scale) / Σ_j exp(scores[j]/scale).

    This is argmax_i(scores[i] + Gumbel(scale)), sampled exactly by OpenDP (lazy
    arbitrary-precision comparisons), i.e. the exponential mechanism for quality ``scores``
    when ``scale = 2Δ/ε``.
    """
    values = [float(s) for s in scores]
    if not values:
        raise ValueError("gumbel_argmax needs at least one score")
    if not all(math.isfinite(v) for v in values):
        raise ValueError("scores must be finite numbers")
    return int(_gumbel_noisy_max(_check_scale(scale))(values))
