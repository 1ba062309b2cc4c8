"""The exponential mechanism for a quantile over a data-independent grid of candidates
(Smith, "Privacy-preserving statistical estimation with optimal convergence rates", 2011;
the scores of OpenDP's ``make_quantile_score_candidates``; docs/mechanisms.md).

The candidates c_0 < … < c_{K-1} come from the column's bounds and the table's
``quantile_cells`` alone (:class:`QuantileGrid`), never from the rows. Each row's clamped value
falls on one grid index; the backend returns how many rows fall on each index, n_i. For a
fraction p = a/b (exact, from the statement's decimal literal) and candidate j, with
L_j = Σ_{i<j} n_i rows below it, E_j = n_j on it, G_j = Σ_{i>j} n_i above it and n = L + E + G:

    score_j = −max(0, b·L_j − a·n, b·G_j − (b − a)·n)

in units of 1/b rows: 0 exactly when c_j is a p-quantile of the grid values (L_j ≤ p·n and
G_j ≤ (1 − p)·n), else how many rows (times b) it is from being one.

**Sensitivity.** Adding one row adds 1 to exactly one of L_j, E_j, G_j and 1 to n, so
b·L_j − a·n moves by b − a (the row below) or −a (on or above), and b·G_j − (b − a)·n by a
(above) or −(b − a) (on or below): each term by at most Δ = max(a, b − a), and so does the
maximum of them and 0 (a maximum of functions that each move by at most Δ moves by at most
Δ). Removal is the reverse. So Δ = max(a, b − a) = b·max(p, 1 − p), and choosing candidate j
with probability ∝ exp(ε·score_j / (2Δ)) is ε-DP, δ = 0 (McSherry and Talwar 2007). It is
sampled exactly by OpenDP (:func:`mechanisms.samplers.gumbel_argmax`), as MODE is, with work
whose distribution does not depend on the scores. The scores are integers, exact as doubles below 2^53 (b·n < 2^53: any table with b ≤ 10^4,
that is p with up to four decimals, and fewer than 9·10^11 rows); above that a score is rounded
by at most |score|·2^-53 ≤ b·n·2^-53, which adds at most ε·n·2^-52 to the privacy loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

from .laplace import _check_epsilon
from .release import Release
from .samplers import gumbel_argmax

__all__ = ["QuantileGrid", "QuantileRelease", "QuantilesRelease", "quantile_error95", "quantile_scores",
           "release_quantile", "release_quantiles"]


@dataclass(frozen=True)
class QuantileGrid:
    """The candidates of a quantile of a column bounded by [lo, hi], a function of the policy alone.

    ``integers``: one candidate per integer lo … hi (an integer column whose bounds hold at most
    the table's ``quantile_cells`` integers); the backend groups by the clamped value itself.
    Otherwise ``count`` equal cells of [lo, hi], each answered by its midpoint; the backend
    groups by ``width_bucket`` of the clamped value (lo = hi: one cell, the bound).
    """

    lo: float
    hi: float
    count: int
    integers: bool

    @classmethod
    def for_bounds(cls, lo: float, hi: float, integer_column: bool, cells: int) -> QuantileGrid:
        """The grid of a column with bounds [lo, hi] under a table's ``quantile_cells``."""
        if cells < 1:
            raise ValueError(f"a quantile grid needs at least one cell, not {cells}")
        if integer_column and hi - lo + 1 <= cells:
            return cls(lo, hi, int(hi) - int(lo) + 1, True)
        return cls(lo, hi, 1 if lo == hi else cells, False)

    def candidate(self, index: int) -> float:
        """The value candidate ``index`` stands for: its integer, or its cell's midpoint."""
        if self.integers:
            return self.lo + index
        if self.count == 1:
            return self.lo
        width = (self.hi - self.lo) / self.count
        return min(self.hi, max(self.lo, self.lo + (index + 0.5) * width))

    def index(self, backend_value: float) -> int:
        """The grid index of a backend group's value: the clamped value itself on an integer grid,
        ``width_bucket``'s 1 … count + 1 (count + 1 for hi) on a grid of cells."""
        raw = int(backend_value) - int(self.lo) if self.integers else int(backend_value) - 1
        return min(self.count - 1, max(0, raw))

    @property
    def step(self) -> float:
        """The distance between neighbouring candidates (0 for one candidate)."""
        if self.integers:
            return 1.0 if self.count > 1 else 0.0
        return (self.hi - self.lo) / self.count


@dataclass(frozen=True)
class QuantileRelease(Release[float]):
    """A released quantile and its grid: ``candidates`` values ``step`` apart (the notice says both)."""

    candidates: int = 1
    step: float = 0.0


@dataclass(frozen=True)
class QuantilesRelease(Release[tuple[float, ...]]):
    """Several quantiles of one column, one per fraction in order (``each``: their releases, at
    ε/k apiece); ``scale`` and ``error95`` are the largest of theirs."""

    each: tuple[QuantileRelease, ...] = ()
    fractions: tuple[Fraction, ...] = ()


def quantile_scores(counts: Sequence[int], fraction: Fraction) -> list[int]:
    """Each candidate's score (module docstring), in units of 1/b rows for p = a/b."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"the fraction must be in [0, 1], not {fraction}")
    if any(c < 0 for c in counts):
        raise ValueError("counts must be non-negative")
    a, b = fraction.numerator, fraction.denominator
    n = sum(counts)
    scores = []
    below = 0
    for count in counts:
        above = n - below - count
        scores.append(-max(0, b * below - a * n, b * above - (b - a) * n))
        below += count
    return scores


def quantile_error95(epsilon: float, candidates: int, fraction: Fraction) -> float:
    """Rank error of the chosen candidate that holds with probability ≥ 0.95, in rows.

    The best score is 0 (some candidate is a p-quantile of the grid values; with no rows every
    score is 0), so by the exponential mechanism's utility bound (Theorem 2 of Hu and Zhou's
    survey, t = ln 20) the chosen candidate's score is above −(2Δ/ε)·ln(20·K) with probability
    ≥ 0.95: it is within max(p, 1 − p)·(2/ε)·ln(20·K) rows of being a p-quantile. A function of
    ε, p and the number of candidates K only.
    """
    return max(fraction, 1 - fraction) * 2.0 / epsilon * math.log(20.0 * candidates)


def release_quantile(grid: QuantileGrid, counts: Sequence[int], fraction: Fraction, epsilon: float,
                     padded: bool = True) -> QuantileRelease:
    """ε-DP p-quantile of the values counted per grid index (``counts[i]``: rows on index i).

    Picks a candidate with probability ∝ exp(ε·score/(2Δ)) (module docstring) and releases its
    value (:meth:`QuantileGrid.candidate`). ``Release.scale`` is the Gumbel scale in rows,
    2·max(p, 1 − p)/ε, and ``error95`` the rank bound of :func:`quantile_error95`. ``padded``:
    whether the draw's work is padded (:func:`~mechanisms.samplers.gumbel_argmax`).
    """
    _check_epsilon(epsilon)
    if len(counts) != grid.count:
        raise ValueError(f"{len(counts)} counts for a grid of {grid.count} candidates")
    scores = quantile_scores(counts, fraction)
    sensitivity = max(fraction.numerator, fraction.denominator - fraction.numerator)
    index = gumbel_argmax(scores, 2.0 * sensitivity / epsilon, padded)
    rows_scale = 2.0 * float(max(fraction, 1 - fraction)) / epsilon
    return QuantileRelease(grid.candidate(index), epsilon, 0.0, rows_scale,
                           quantile_error95(epsilon, grid.count, fraction), "exponential_quantile",
                           grid.count, grid.step)


def release_quantiles(grid: QuantileGrid, counts: Sequence[int], fractions: Sequence[Fraction],
                      epsilon: float, padded: bool = True) -> QuantilesRelease:
    """ε-DP quantiles at each of k ``fractions`` of the same ``counts``: k independent choices
    (:func:`release_quantile`) at ε/k each, ε in all by sequential composition. The counts are
    read once; each choice is ε/k-DP on them, whatever the others chose."""
    _check_epsilon(epsilon)
    if not fractions:
        raise ValueError("at least one fraction")
    share = epsilon / len(fractions)
    each = tuple(release_quantile(grid, counts, fraction, share, padded) for fraction in fractions)
    return QuantilesRelease(tuple(chosen.value for chosen in each), epsilon, 0.0, max(c.scale for c in each),
                            max(c.error95 for c in each), "exponential_quantile", each, tuple(fractions))
