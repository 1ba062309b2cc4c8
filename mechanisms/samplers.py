"""Secure, floating-point-safe noise samplers.

Every random draw that protects privacy in dpproxy comes from here. The samplers are
OpenDP's: they take their randomness from the operating system's CSPRNG and sample
exactly (discrete Laplace on integers; Laplace on floats via a discretised lattice), so
they do not have the low-order-bit weakness of ``x + numpy.random.laplace()``
(Mironov 2012, "On significance of the least significant bits for differential privacy").
"""

from __future__ import annotations

import math
from functools import lru_cache, partial
from typing import Any, Callable, Sequence

import numpy as np
import opendp.prelude as dp

from .noise_pool import pool_for
from .opendp_calls import invoke_bool, invoke_floats_to_index, laplace_float_draw

dp.enable_features("contrib")

__all__ = ["MAX_INT_SCALE", "laplace_int", "laplace_float", "laplace_float_vector", "gumbel_argmax", "padding_probability"]

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


@lru_cache(maxsize=64)
def _float_laplace_vector(scale: float) -> Any:
    return dp.m.make_laplace(_FLOAT_VECTOR_DOMAIN, _FLOAT_VECTOR_METRIC, scale=scale)


@lru_cache(maxsize=64)
def _gumbel_noisy_max(scale: float) -> Callable[[Sequence[float]], int]:
    # OpenDP 0.16 picks the algorithm from the output measure: zero-concentrated divergence
    # gives permute-and-flip *with* replacement, whose choice is softmax (the exponential
    # mechanism, as Gumbel-max); max divergence gives it without replacement, permute-and-flip
    # proper, a different distribution. Only the sampler is used here; the privacy accounting
    # is the caller's. The scale is 2Δ/ε, known before the data.
    measurement = dp.m.make_noisy_max(_FLOAT_VECTOR_DOMAIN, dp.linf_distance(T=float), dp.zero_concentrated_divergence(), scale=scale)
    return partial(invoke_floats_to_index, measurement)


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
    measurement (OpenDP's ``make_laplace`` on an ``f64``) is built anew on every call, through
    the library's constructor directly (``mechanisms.opendp_calls.laplace_float_draw``), and
    never cached: its one caller, the smooth median, draws at a scale that depends on the data
    (S*), and a cache hit would answer faster when an earlier release had the same S*, or S*
    was at its floor, a constant (benchmarks/proxy_cost.py).
    """
    return laplace_float_draw(_FLOAT_DOMAIN, _FLOAT_METRIC, _check_scale(scale), float(value))


def laplace_float_vector(values: Sequence[float], scale: float) -> list[float]:
    """Add independent Laplace(scale) noise to each element of ``values`` in one call."""
    return [float(v) for v in _float_laplace_vector(_check_scale(scale))([float(v) for v in values])]


def padding_probability(total_weight: float, candidates: int) -> float:
    """The probability that :func:`gumbel_argmax` pads its draw with a draw of 1/K acceptance.

    OpenDP's draw over K candidates of weights w_i = exp((s_i − max s)/scale), Z = Σ w_i (so
    1 ≤ Z ≤ K), makes 1 + F trials, F ~ Geometric(Z/K) failures (see
    :func:`gumbel_argmax`). The padding draw makes 1 + B·F' trials, F' ~ Geometric(1/K) failures
    and B a coin that is 1 with the probability returned here, r = K·(Z − 1) / (Z·(K − 1)):
    then F + B·F' ~ Geometric(1/K) whatever Z is (the probability generating functions agree:
    thinning a geometric count), so the two draws make 2 + Geometric(1/K) trials together.
    Clipped to [0, 1] against rounding; 0 for one candidate, whose draw is always one trial.
    """
    if candidates <= 1:
        return 0.0
    z = min(max(total_weight, 1.0), float(candidates))
    return min(1.0, max(0.0, candidates * (z - 1.0) / (z * (candidates - 1))))


def _total_weight(values: Sequence[float], scale: float) -> float:
    # Z = Σ exp((s_i − max s)/scale), over all K values whatever they hold; the exponents are
    # clipped at −700 so that no exp is subnormal (slower on some CPUs, and below e^-700 a
    # weight changes Z by less than its rounding).
    shifted = (np.asarray(values, dtype=np.float64) - max(values)) / scale
    return float(np.exp(np.maximum(shifted, -700.0)).sum())


def _coin(probability: float) -> bool:
    # True with ``probability``, from OpenDP's randomized response in its constant-time mode;
    # an input of True is kept with prob ≥ 1/2, one of False flipped with prob ≤ 1/2.
    keep = probability >= 0.5
    response = dp.m.make_randomized_response_bool(probability if keep else 1.0 - probability, constant_time=True)
    return invoke_bool(response, keep)


def _padding_scores(candidates: int, scale: float, pad: bool) -> list[float]:
    # The padding draw's input, of the release's length and scale: one candidate above the rest
    # by 2^32 scales (each of the rest accepted with probability e^(-2^32): a trial accepts with
    # probability 1/K), or all equal (the first trial accepts). 2^32·scale is exact in binary;
    # the cap keeps it finite, and it is 2^32 scales for any scale below 2^964.
    far = -min(scale * 2.0**32, 1e300)
    return [0.0 if pad else far, *([far] * (candidates - 1))]


def gumbel_argmax(scores: Sequence[float], scale: float, padded: bool = True) -> int:
    """Return index i with probability exp(scores[i]/scale) / Σ_j exp(scores[j]/scale).

    This is the exponential mechanism for quality ``scores`` when ``scale = 2Δ/ε`` (the
    distribution of argmax_i(scores[i] + Gumbel(scale))), sampled exactly by OpenDP: its
    ``make_noisy_max`` under zero-concentrated divergence (0.16) draws a candidate i uniformly
    and accepts it with probability exp(−(max s − s_i)/scale), an exact Bernoulli, until one is
    accepted (permute-and-flip with replacement; McKenna and Sheldon 2020). A trial accepts i
    with probability w_i/K (w_i = exp((s_i − max s)/scale), Z = Σ w_i), so the accepted index
    is i with probability w_i/Z, independently of how many trials it took: 1 + F of them,
    F ~ Geometric(Z/K) failures, mean K/Z = K·max_i P(i). That count follows the scores, and
    one row moves them (K/Z went 500 → 622 for a median over 1,000 cells of 10,000 rows), so
    the draw is followed by a padding draw that nothing reads (:func:`padding_probability`):
    OpenDP's same sampler on fixed scores, after an OpenDP coin that decides which of two
    fixed inputs it gets. Both draws together make 2 + Geometric(1/K) trials whatever the
    scores, of K candidates each, and neither the coin nor the padding touches the returned
    index: its distribution, and so the mechanism's guarantee, are the unpadded draw's.
    ``padded=False`` skips the padding, for a caller whose answer's time is hidden otherwise (a
    table with ``answer_quantum_ms``); the returned index has the same distribution either way.
    """
    values = [float(s) for s in scores]
    if not values:
        raise ValueError("gumbel_argmax needs at least one score")
    if not all(math.isfinite(v) for v in values):
        raise ValueError("scores must be finite numbers")
    scale = _check_scale(scale)
    draw = _gumbel_noisy_max(scale)
    index = draw(values)
    if padded and len(values) > 1:  # the number of candidates is the policy's (categories, grid), not the data's
        pad = _coin(padding_probability(_total_weight(values, scale), len(values)))
        draw(_padding_scores(len(values), scale, pad))
    return index
