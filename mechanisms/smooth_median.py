"""Sample and aggregate with a smooth-sensitivity median (Nissim, Raskhodnikova, Smith 2007).

AVG, MIN and MAX have no useful global sensitivity, so the rows are split at random into m
partitions, the aggregate is computed on each (values clamped to [lo, hi]), and this module
releases a differentially private median of the m partition values (NRS07 §3.1; as Immuta's
documentation of its differential privacy policies, version 2020.3, describes it; both in
docs/references.md).

Guarantee: the release is (ε, δ)-DP with respect to changing one of the m partition values.
That is one row added or removed as long as each row's partition is chosen independently of
the other rows (so a row moves only its own partition's value), m is fixed by the policy, and
every partition value lies in [lo, hi]. The noise is Laplace scaled by the β-smooth upper
bound S* of the median's local sensitivity; Laplace is (ε/2, β)-admissible for
β = ε / (2 ln(2/δ)), so median + (2·S*/ε)·Lap(1) is (ε, δ)-DP (NRS07 §2, admissible noise).
Clamping the output to [lo, hi] is post-processing. The Laplace draw is OpenDP's, exact on a
fine lattice; the analysis is that of the continuous distribution.

Conventions:

* Median of m sorted values x_1 ≤ … ≤ x_m: the lower median x_j with j = ⌈m/2⌉ (1-based),
  a single order statistic for every m. NRS07 state the odd case; their derivation holds for
  any fixed order statistic, so S* below is exact for the lower median too. For even m the
  release is biased down by at most half the gap between the two middle values.
* An empty partition (``None``) counts as the midpoint (lo + hi)/2, a fixed value that does
  not depend on the data, so emptiness is never revealed (an error or a different code path
  would reveal it). NaN counts as ``hi``, as PostgreSQL orders NaN above every number.
* Release.scale and error95 must not reveal S*, which depends on the data and is not
  itself private. They report the data-independent worst case: scale = 2(hi − lo)/ε ≥ 2S*/ε,
  and error95 = min(scale·ln 20, hi − lo) bounds |release − median| with probability ≥ 0.95.
  The actual noise is usually far smaller. Neither covers the sampling error of sample and
  aggregate (median of partitions vs the aggregate over all rows).

Choosing m (the number of partitions). More partitions give a less noisy median, fewer give
more accurate partition values:

* Noise. Changing about m/2 partition values can move the median to lo or hi, so
  S* ≥ (hi − lo)·e^{−β(⌈m/2⌉−1)}. Even for perfectly concentrated partition values the
  noise is then a fraction f of the range only once m ≥ 1 + 2·ln(1/f)/β
  = 1 + 4·ln(2/δ)·ln(1/f)/ε (:func:`recommended_partitions`). Rule of thumb: f = 1% with
  ε = 1, δ = 1e-6 needs m ≈ 270, and the m needed grows as 1/ε.
* Partition accuracy. Each partition holds about n/m rows. A partition mean has standard
  error σ·√(m/n), so keep n/m at 30 rows or more for AVG. For MIN and MAX the median of the
  partition minima (maxima) estimates a quantile near 0.69·m/n (1 − 0.69·m/n), not the
  extreme itself, which no DP mechanism can release accurately.

So m ≈ 4·ln(2/δ)·ln(100)/ε is enough, and the table needs about 30·m rows
for a useful AVG. Smaller tables get answers dominated by the range term.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence, TypeVar

import numpy as np

from .laplace import _check_epsilon, laplace_error95
from .release import Release
from .samplers import laplace_float

__all__ = [
    "median_index",
    "prepare_partition_values",
    "recommended_partitions",
    "release_sample_and_aggregate",
    "search_passes",
    "smooth_sensitivity_median",
    "smoothing_beta",
]

# A constant floor keeps the noise scale positive when S* underflows (β·m > ~700). The
# maximum of a β-smooth upper bound and a constant is still a β-smooth upper bound. For a
# range near the bottom of the floats (hi − lo < 2^-1030) the scale 2·S*/ε itself can still
# underflow, so it is rounded up to the smallest positive float, again a constant floor.
_SENSITIVITY_FLOOR = 2.0**-40
_SMALLEST_SCALE = math.ulp(0.0)

# Terms within _NEAR_TIE of the best, relatively, or within (hi − lo)·_NEAR_TIE_ABSOLUTE of
# it count as near-best. The first is far above the few ulps by which a computed term can
# differ from the exact one (or np.exp from math.exp); the second covers terms and weights
# that underflow, where rounding is absolute, and is far below the release's floor.
_NEAR_TIE = 2.0**-40
_NEAR_TIE_ABSOLUTE = 2.0**-1000
# A matrix of at most this many terms (a function of m: search_passes) is scanned whole, in
# one pass, rather than in three passes of a few dozen numpy calls. Only speed depends on it.
_DIRECT_SCAN_SIZE = 4096
# Above every column index (the search's index arrays are np.intp): a row's first near-best
# column is the least of these and its near-best columns.
_NO_COLUMN = np.iinfo(np.intp).max


def smoothing_beta(epsilon: float, delta: float) -> float:
    """β = ε / (2 ln(2/δ)), the smoothing for which Laplace noise gives (ε, δ)-DP."""
    return epsilon / (2.0 * math.log(2.0 / delta))


def median_index(m: int) -> int:
    """0-based index of the lower median of m sorted values: ⌈m/2⌉ − 1."""
    return (m - 1) // 2


def recommended_partitions(epsilon: float, delta: float, fraction: float = 0.01) -> int:
    """Smallest m for which the range term (hi − lo)·e^{−β(⌈m/2⌉−1)} of S* is ≤ fraction·(hi − lo)."""
    _check_epsilon(epsilon)
    _check_delta(delta)
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must be in (0, 1), got {fraction!r}")
    beta = smoothing_beta(epsilon, delta)
    return 2 * math.ceil(math.log(1.0 / fraction) / beta) + 1


def prepare_partition_values(
    values: Sequence[float | None], lo: float, hi: float
) -> list[float]:
    """The partition values sorted, with None → midpoint, NaN → hi, and all clamped to [lo, hi]."""
    return _prepared_values(values, float(lo), float(hi)).tolist()


def _prepared_values(values: Sequence[float | None] | np.ndarray, lo: float, hi: float, empty: int = 0) -> np.ndarray:
    """:func:`prepare_partition_values` as an array, with ``empty`` more partitions that had no value."""
    midpoint = lo + (hi - lo) / 2.0
    prepared = np.array(values, dtype=float)  # float(v) for every v, except None → NaN
    nan = np.flatnonzero(np.isnan(prepared))
    if nan.size:
        # Which NaN slots were None does not matter: only the sorted multiset is returned.
        prepared[nan] = hi
        prepared[nan[: 0 if isinstance(values, np.ndarray) else list(values).count(None)]] = midpoint
    if empty:
        prepared = np.concatenate((prepared, np.full(empty, midpoint)))
    np.clip(prepared, lo, hi, out=prepared)
    prepared.sort()
    return prepared


def smooth_sensitivity_median(
    sorted_values: Sequence[float] | np.ndarray, lo: float, hi: float, beta: float
) -> float:
    """S*_β of the lower median: max_k e^{−kβ} · max_{0≤t≤k+1} (x_{j+t} − x_{j+t−k−1}).

    ``sorted_values`` are x_1 ≤ … ≤ x_m in [lo, hi]; x_i = lo for i < 1 and hi for i > m.
    Writing a = j+t−k−1 and b = j+t, S* is the maximum of the terms
    (x_b − x_a)·e^{−β(b−a−1)} over rows 0 ≤ a ≤ j and columns j ≤ b ≤ m+1 (smaller a or
    larger b only repeat lo or hi with less weight, so k ≤ m suffices).

    For a fixed row a, the comparison of two columns b1 < b2 is linear and non-decreasing in
    x_a, so the leftmost best column never moves left as a grows (the matrix is totally
    monotone). A few rows scanned whole therefore bracket the best column of every row in
    between (:func:`_bracketing_terms`), and O(m^{4/3}) terms, computed in a fixed number of
    numpy steps, hold every row's best term. The result is the largest of those terms, each
    computed as the definition computes it (the difference, math.exp(−β·k), the product):
    the definition's value, unless another term lies within rounding of the maximum, and
    then the definition's value up to that rounding.
    """
    m = len(sorted_values)
    if m == 0:
        raise ValueError("need at least one partition value")
    x = np.concatenate(([float(lo)], np.asarray(sorted_values, dtype=float), [float(hi)]))
    j = median_index(m) + 1
    spans, gaps = _near_best(_bracketing_terms(x, j, _weights(m, beta)), x)
    return _exact_max(gaps, spans - 1, beta)


@lru_cache(maxsize=64)
def _weights(m: int, beta: float) -> np.ndarray:
    """weight[b − a] = e^{−β(b−a−1)} for spans 0 … m+1, read-only.

    To within an ulp (np.exp is not math.exp), enough to locate the maximum; weight[0] serves
    only a = b = j, whose gap is 0. Kept per (m, β): both are the policy's and the statement's
    (partitions, the column's ε, δ), never the data's, so whether they were seen before tells
    nothing about any row; ~1,000 exponentials a release otherwise.
    """
    weight = np.exp(np.arange(-1, m + 1) * -beta)
    weight[0] = 0.0
    weight.flags.writeable = False
    return weight


# (span, gap, term) arrays of one length for pairs (a, b): span = b − a, gap = x_b − x_a and
# term = gap·weight[span], the approximate term.
_Terms = tuple[np.ndarray, np.ndarray, np.ndarray]
_Best = TypeVar("_Best", float, np.ndarray)


def _bracketing_terms(x: np.ndarray, j: int, weight: np.ndarray) -> list[_Terms]:
    """Terms of pairs 0 ≤ a ≤ j ≤ b ≤ m+1 that include every row's exactly best term.

    Rows a ≥ 1 with x_a = hi are left out: all their terms are exactly 0. Rows 0, 1 and every
    r²-th row after 1 (r ≈ ∛j) are scanned whole; then every r-th row, and finally every row,
    only from the first near-best column of the nearest scanned row above it to the last of
    the nearest scanned row below it, where total monotonicity puts its best column. Row 1 is
    scanned whole because x_0 = lo is usually far below x_1, so the best column can jump
    across the matrix between rows 0 and 1.

    Which passes run is a function of m alone (:func:`search_passes`): a small matrix is scanned
    whole (every row, those at hi too), a larger one always in the three passes. Deciding by the
    data (how many values are at hi, how wide the brackets came out) saved ~60 µs where most
    partitions were at hi, and one partition moved to or from hi switched it: the time of an
    answer told that one row had moved one partition (benchmarks/proxy_cost.py). The passes'
    sizes still follow the data, by far less than a pass's fixed cost. The terms are the same
    either way, so S* and the release's distribution are unchanged.
    """
    m = x.size - 2
    if search_passes(m) == 1:
        spans, gaps, terms = _whole_rows(x, j, weight, np.arange(j + 1))
        return [(spans.ravel(), gaps.ravel(), terms.ravel())]
    last_row = max(0, min(j, int(x.searchsorted(x[-1])) - 1))
    r = max(2, round(last_row ** (1 / 3)))
    scanned = np.concatenate(([0], np.arange(1, last_row, r * r), [last_row]))
    spans, gaps, terms = _whole_rows(x, j, weight, scanned)
    parts = [(spans.ravel(), gaps.ravel(), terms.ravel())]
    first = np.empty(last_row + 1, dtype=np.intp)
    last = np.empty(last_row + 1, dtype=np.intp)
    near = terms >= _near_tie(np.maximum.reduce(terms, axis=1, keepdims=True), x)
    first[scanned] = j + near.argmax(axis=1)
    last[scanned] = m + 1 - near[:, ::-1].argmax(axis=1)

    coarse = r * r
    for fine in (r, 1):
        rows = np.arange(1, last_row, fine)
        rows = rows[(rows - 1) % coarse != 0]
        below = rows - (rows - 1) % coarse
        above = np.minimum(below + coarse, last_row)
        part, columns, widths = _rows_within(x, weight, rows, first[below], last[above])
        parts.append(part)
        if fine > 1:
            _set_near_best_range(part[2], x, columns, widths, rows, first, last)
        coarse = fine
    return parts


def search_passes(m: int) -> int:
    """How many passes :func:`smooth_sensitivity_median`'s search over m partition values makes:
    1 (the whole matrix of rows 0 … j and columns j … m+1) when it holds at most
    ``_DIRECT_SCAN_SIZE`` terms, else 3. A function of m, never of the values."""
    j = median_index(m) + 1
    return 1 if (j + 1) * (m + 2 - j) <= _DIRECT_SCAN_SIZE else 3


def _whole_rows(x: np.ndarray, j: int, weight: np.ndarray, rows: np.ndarray) -> _Terms:
    """Terms of ``rows`` in all columns j … m+1, as 2-D arrays indexed [row, column − j]."""
    gaps = x[j:] - x[rows, None]
    spans = np.arange(j, x.size) - rows[:, None]
    return spans, gaps, gaps * weight[spans]


def _rows_within(
    x: np.ndarray, weight: np.ndarray, rows: np.ndarray, start: np.ndarray, stop: np.ndarray
) -> tuple[_Terms, np.ndarray, np.ndarray]:
    """Terms of row rows[i] in columns start[i] … stop[i], row after row; their columns; widths.

    A stop before its start (possible only through rounding) scans the start column alone.
    """
    widths = np.maximum(stop - start, 0) + 1
    ends = widths.cumsum()
    columns = np.arange(ends[-1] if ends.size else 0) - (ends - widths - start).repeat(widths)
    spans = columns - rows.repeat(widths)
    gaps = x[columns] - x[rows].repeat(widths)  # x_a, read once per row: columns − spans is the row
    return (spans, gaps, gaps * weight[spans]), columns, widths


def _set_near_best_range(
    terms: np.ndarray,
    x: np.ndarray,
    columns: np.ndarray,
    widths: np.ndarray,
    rows: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
) -> None:
    """Set first[a] and last[a] to the first and last column of row a's near-best terms.

    Row rows[i] has the next widths[i] of ``terms``, in increasing columns.
    """
    if not rows.size:
        return
    starts = widths.cumsum() - widths
    near = terms >= _near_tie(np.maximum.reduceat(terms, starts), x).repeat(widths)
    first[rows] = np.minimum.reduceat(np.where(near, columns, _NO_COLUMN), starts)
    last[rows] = np.maximum.reduceat(np.where(near, columns, -1), starts)


def _near_best(parts: list[_Terms], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Spans and gaps of the near-best of all terms, which include the exactly largest term.

    The parts are not concatenated first: copying every term would cost more than the search.
    """
    threshold = _near_tie(max(np.maximum.reduce(terms, initial=0.0) for _, _, terms in parts), x)
    spans, gaps = [], []
    for part_spans, part_gaps, terms in parts:
        near = terms >= threshold
        spans.append(part_spans[near])
        gaps.append(part_gaps[near])
    return np.concatenate(spans), np.concatenate(gaps)


def _near_tie(best: _Best, x: np.ndarray) -> _Best:
    """The smallest approximate term that is near-best next to approximate best term(s) ``best``.

    The margin is far above the error of an approximate term, so a term whose exact value is
    largest is near-best whatever the rounding.
    """
    return best * (1.0 - _NEAR_TIE) - (x[-1] - x[0]) * _NEAR_TIE_ABSOLUTE


def _exact_max(gaps: np.ndarray, ks: np.ndarray, beta: float) -> float:
    """max of gap·e^{−βk} over the given terms, each computed as the definition computes it."""
    if ks.size > 1:
        order = np.lexsort((gaps, ks))
        gaps, ks = gaps[order], ks[order]
        widest = np.append(ks[1:] != ks[:-1], True)  # per k only the largest gap can win
        gaps, ks = gaps[widest], ks[widest]
    return max(gap * math.exp(-beta * k) for gap, k in zip(gaps.tolist(), ks.tolist()))


def release_sample_and_aggregate(
    partition_values: Sequence[float | None] | np.ndarray,
    lo: float,
    hi: float,
    epsilon: float,
    delta: float,
    empty: int = 0,
) -> Release[float]:
    """(ε, δ)-DP median of the m partition values, clamped to [lo, hi].

    ``partition_values`` holds a value per partition (None for one with no value); ``empty``
    counts further partitions with no value, so m = len(partition_values) + empty. See the
    module docstring for the guarantee, the median convention, how empty partitions are
    handled and why Release.scale and error95 are the data-independent worst case.
    """
    _check_epsilon(epsilon)
    _check_delta(delta)
    lo, hi = float(lo), float(hi)
    if empty < 0:
        raise ValueError(f"empty partitions cannot be negative, got {empty}")
    if len(partition_values) + empty < 1:
        raise ValueError("need at least one partition (m ≥ 1)")
    if not (math.isfinite(lo) and math.isfinite(hi) and math.isfinite(hi - lo)):
        raise ValueError(f"bounds must be finite with a finite range, got [{lo!r}, {hi!r}]")
    if lo > hi:
        raise ValueError(f"lower bound {lo!r} exceeds upper bound {hi!r}")
    if lo == hi:
        return Release(lo, epsilon, delta, 0.0, 0.0, "smooth_median")

    values = _prepared_values(partition_values, lo, hi, empty)
    median = float(values[median_index(len(values))])
    s_star = smooth_sensitivity_median(values, lo, hi, smoothing_beta(epsilon, delta))
    noise_scale = max(2.0 * max(s_star, (hi - lo) * _SENSITIVITY_FLOOR) / epsilon, _SMALLEST_SCALE)
    noisy = min(max(laplace_float(median, noise_scale), lo), hi)

    worst_scale = 2.0 * (hi - lo) / epsilon
    error95 = min(laplace_error95(worst_scale), hi - lo)
    return Release(noisy, epsilon, delta, worst_scale, error95, "smooth_median")


def _check_delta(delta: float) -> None:
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
