"""The exponential mechanism for MODE (McSherry & Talwar 2007; Definition 2.5 of Hu and Zhou,
"Differential Privacy: A Survey", 2017; docs/references.md).

Guarantee: given a declared, data-independent category domain R and a quality q_i (the
count of rows in category i) that one added or removed row changes by at most Δ,
choosing category i with probability ∝ exp(ε·q_i / (2Δ)) is ε-differentially private
(δ = 0). The domain must come from the policy, never from the data: listing only the
categories that occur would reveal them.
"""

from __future__ import annotations

import math
from typing import Sequence

from .laplace import _check_epsilon
from .release import Release
from .samplers import gumbel_argmax

__all__ = ["mode_error95", "release_mode"]


def mode_error95(epsilon: float, n_categories: int, sensitivity: float = 1.0) -> float:
    """Count shortfall of the chosen category that holds with probability ≥ 0.95.

    Hu and Zhou's survey, Theorem 2 with t = ln 20: P[q(chosen) ≤ OPT − (2Δ/ε)·(ln|R| + t)] ≤ e^{-t}, so
    the chosen category's count is within (2Δ/ε)·ln(20·|R|) of the true mode's count with
    probability at least 0.95. It is in units of the count, not of the column, and depends
    only on ε, Δ and the size of the declared domain.
    """
    return 2.0 * sensitivity / epsilon * math.log(20.0 * n_categories)


def release_mode(
    categories: Sequence[str],
    counts: Sequence[int],
    epsilon: float,
    sensitivity: float = 1.0,
    padded: bool = True,
) -> Release[str]:
    """ε-DP most common category: picks ``categories[i]`` with probability ∝ exp(ε·counts[i]/(2Δ)).

    ``categories`` is the column's declared domain (distinct, non-empty) and ``counts[i]`` the
    exact number of rows in ``categories[i]`` (0 for categories absent from the data). Sampling
    is OpenDP's exact draw (:func:`mechanisms.samplers.gumbel_argmax`), which has exactly this
    distribution, and its work does not depend on the counts (``padded``: see
    :func:`~mechanisms.samplers.gumbel_argmax`). Release.scale is the Gumbel scale
    2Δ/ε and error95 is :func:`mode_error95`.
    """
    _check_epsilon(epsilon)
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be a finite positive number, got {sensitivity!r}")
    if len(categories) == 0:
        raise ValueError("the category domain must not be empty")
    if len(categories) != len(counts):
        raise ValueError(
            f"{len(categories)} categories but {len(counts)} counts: need one count per category"
        )
    if len(set(categories)) != len(categories):
        raise ValueError("categories must be distinct (a repeated one would be chosen too often)")
    if any(c < 0 for c in counts):
        raise ValueError("counts must be non-negative")
    scale = 2.0 * sensitivity / epsilon
    index = gumbel_argmax(counts, scale, padded)
    return Release(
        categories[index],
        epsilon,
        0.0,
        scale,
        mode_error95(epsilon, len(categories), sensitivity),
        "exponential",
    )
