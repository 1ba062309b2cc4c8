"""Release one aggregate column: its exact backend parts in, one DP value out.

Each aggregate's parts are the backend columns ``rewriter.rewrite.aggregate_parts`` asked
for; this module hands them to the aggregate's mechanism with the column's share of ε and
turns the mechanism's value into the Python value the result type expects (an integer for
COUNT, for SUM of integers and for MIN/MAX of an integer column; a float for AVG and the
variances; the category text for MODE; a candidate of the column's grid for a percentile). Missing data is
mapped to data-independent inputs before any mechanism runs (SQL's NULL sum → 0, a partition
with no rows → empty, a grid index no row reached → 0), so an empty filter takes the same
path as any other.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence, cast

from mechanisms.exponential import release_mode
from mechanisms.laplace import release_count, release_grid_sum, release_sum
from mechanisms.quantile import release_quantile, release_quantiles
from mechanisms.release import Release
from mechanisms.smooth_median import release_sample_and_aggregate
from mechanisms.sum_count import release_mean
from mechanisms.variance import NoisyMoments, VarianceKind, mean_of, noisy_moments, variance_of
from policies.model import TablePolicy
from rewriter.dp_query import Aggregate
from rewriter.rewrite import quantile_grid
from rewriter.types import FLOAT_TYPES, INTEGER_TYPES

__all__ = ["release_column", "release_columns"]


def release_columns(aggregates: Sequence[Aggregate], parts: Sequence[Sequence[Any]], units: Sequence[int],
                    epsilon: float, table: TablePolicy) -> list[Release[Any]]:
    """Release each of ``aggregates`` from its exact ``parts``, ``epsilon`` being one release's
    share of the query's ε and ``units`` each aggregate's release (``proxy.dp.release_units``; ():
    each its own).

    Each release is drawn once, for the first of its aggregates: the others are given the same
    :class:`Release` object (the same value), except that the variances and standard deviations
    of one release are each computed from its one draw of the moments (one object per kind), and
    so is an AVG of that release (its own parts are not read).
    """
    if not units:
        return [release_column(agg, agg_parts, epsilon, table) for agg, agg_parts in zip(aggregates, parts)]
    drawn: dict[int, NoisyMoments] = {}
    for agg, agg_parts, unit in zip(aggregates, parts, units, strict=True):
        if agg.mechanism == "moments" and unit not in drawn:
            drawn[unit] = _moments(agg, agg_parts, epsilon)
    released: dict[tuple[int, str], Release[Any]] = {}
    releases: list[Release[Any]] = []
    for agg, agg_parts, unit in zip(aggregates, parts, units, strict=True):
        key = (unit, agg.kind if unit in drawn else "")
        if key not in released:
            released[key] = (_from_moments(agg, drawn[unit]) if unit in drawn
                             else release_column(agg, agg_parts, epsilon, table))
        releases.append(released[key])
    return releases


def _from_moments(agg: Aggregate, moments: NoisyMoments) -> Release[Any]:
    """A variance, a standard deviation or an AVG computed from its release's noisy moments."""
    if agg.mechanism == "moments":
        return variance_of(cast(VarianceKind, agg.kind), moments)
    assert agg.kind == "avg" and agg.column is not None and agg.column.policy is not None
    assert agg.column.policy.bounds is not None
    return mean_of(moments, *agg.column.policy.bounds)


def _moments(agg: Aggregate, parts: Sequence[Any], epsilon: float) -> NoisyMoments:
    """The noisy moments of a variance's exact parts (count, centred sum, centred sum of squares)."""
    column = agg.column
    assert column is not None and column.policy is not None
    # SQL's NULL sums over no value → 0: an empty filter takes the same path as any other.
    count, centred, squares = (int(part or 0) for part in parts)
    return noisy_moments(count, centred, squares, column.policy.moment_grid(column.type_oid in INTEGER_TYPES), epsilon)


def release_column(agg: Aggregate, parts: Sequence[Any], epsilon: float, table: TablePolicy) -> Release[Any]:
    """Release ``agg`` from its exact ``parts`` with ``epsilon`` (its share of the query's ε).

    Sample-and-aggregate columns cost the table's δ each; every other column costs δ = 0.
    The exponential mechanism's draws are padded to work that no row decides
    (:func:`mechanisms.samplers.gumbel_argmax`) unless the table has ``answer_quantum_ms``,
    whose quantum hides the answer's time, as it lifts the condition limits.
    """
    padded = not table.answer_quantum_ms
    if agg.kind == "count":
        return release_count(int(parts[0] or 0), epsilon)
    column = agg.column
    assert column is not None and column.policy is not None
    integer = column.type_oid in INTEGER_TYPES
    if agg.kind == "mode":
        assert column.policy.categories is not None
        counts = [int(count or 0) for count in parts]
        categories = column.labels()[:len(column.policy.categories)]  # as PostgreSQL prints them
        return release_mode(categories, counts, epsilon, padded=padded)
    if agg.mechanism == "quantile" and agg.fractions:
        # All k from the one set of counts per grid index; ε/k each (mechanisms.quantile).
        several = release_quantiles(quantile_grid(column, table), parts[0], agg.fractions, epsilon, padded)
        if integer and agg.kind == "percentile_disc":
            return replace(several, value=tuple(int(round(value)) for value in several.value))
        return several
    if agg.mechanism == "quantile":
        assert agg.fraction is not None
        # Every grid index has a count (0 where no row is): the same path for an empty filter.
        chosen = release_quantile(quantile_grid(column, table), parts[0], agg.fraction, epsilon, padded)
        if integer and agg.kind == "percentile_disc":
            # The column's type; integer bounds keep a rounded midpoint within them.
            return replace(chosen, value=int(round(chosen.value)))
        return chosen
    assert column.policy.bounds is not None
    if agg.mechanism == "moments":
        return variance_of(cast(VarianceKind, agg.kind), _moments(agg, parts, epsilon))
    lo, hi = column.policy.bounds
    if agg.kind == "sum":
        # SUM over no rows is NULL in SQL; releasing 0 + noise hides that the filter was empty.
        total = parts[0] if parts[0] is not None else 0
        if integer:
            return release_sum(int(total), epsilon, int(column.policy.sensitivity))
        grid = column.policy.sum_grid
        if column.type_oid in FLOAT_TYPES:  # the backend summed grid points (rewriter.rewrite.clamped_sum)
            return release_grid_sum(int(total), grid.sensitivity(lo, hi), grid, epsilon)
        # numeric: the exact total rounded to the grid once, which adds one point to what a row moves it by
        return release_grid_sum(grid.rounded(total), grid.sensitivity(lo, hi) + 1, grid, epsilon)
    if agg.mechanism == "sum_count":
        total, count = parts
        # The total unconverted, exact (an int or Decimal; a float column's in grid points): the
        # centred sum is computed from it exactly, never from a double rounded relative to n·|mid|.
        return release_mean(total if total is not None else 0, int(count or 0), lo, hi, epsilon,
                            on_grid=column.type_oid in FLOAT_TYPES)
    if agg.mechanism == "sample_aggregate":
        present = parts[0]
        if agg.kind == "avg" and column.type_oid in FLOAT_TYPES:
            # The backend's partition means are in points of the column's grid (exact sums:
            # rewriter.rewrite.per_partition); back to the column's units, by a power of two.
            present = present * column.policy.sum_grid.step
        if len(present) > table.partitions:
            raise ValueError(f"backend returned {len(present)} partitions, the policy has {table.partitions}")
        release = release_sample_and_aggregate(
            present, lo, hi, epsilon, table.delta, empty=table.partitions - len(present)
        )
        if integer and agg.kind in ("min", "max"):
            # MIN/MAX keep the column's type; rounding the clamped release stays in [lo, hi]
            # because integer columns have integer bounds.
            return release.with_value(int(round(release.value)))
        return release
    raise ValueError(f"no mechanism for {agg.kind} by {agg.mechanism}")
