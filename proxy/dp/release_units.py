"""Which of a statement's aggregates are one release: ε is split over releases, not columns.

Every variance and standard deviation (``var_pop``, ``var_samp``/``variance``, ``stddev_pop``,
``stddev_samp``/``stddev``) of one column under one condition is post-processing of the same
three noisy moments (:mod:`mechanisms.variance`): the backend computes the same parts for each
(``rewriter.rewrite.aggregate_parts``: the count, centred sum and centred sum of squares of the
clamped values, under the same FILTER), so the moments are drawn once, with one share of ε,
and every member of the family is computed from them. Two variances whose parts differ (another
column, another condition) are two releases, and so is every other aggregate.

The grouping reads the plan alone (the statement and the policy), never a row, so the split
is known before the charge.
"""

from __future__ import annotations

from typing import Sequence

from rewriter.dp_query import Aggregate, AggregateQuery
from rewriter.rewrite import aggregate_parts

__all__ = ["release_count", "release_units"]


def release_units(aggregates: Sequence[Aggregate]) -> tuple[int, ...]:
    """Each aggregate's release, numbered 0, 1, … in order of first use: a variance or standard
    deviation takes the number of an earlier one whose backend parts are the same SQL (so the
    same exact values, the same grid and the same clamp); every other aggregate a new one."""
    units: list[int] = []
    moments: dict[tuple[str, ...], int] = {}
    released = 0
    for agg in aggregates:
        if agg.mechanism == "moments":
            parts = tuple(part.sql for part in aggregate_parts(agg))
            if parts in moments:
                units.append(moments[parts])
                continue
            moments[parts] = released
        units.append(released)
        released += 1
    return tuple(units)


def release_count(plan: AggregateQuery) -> int:
    """k: how many releases share the statement's ε (:func:`release_units`; 0 without aggregates)."""
    units = release_units(plan.aggregates)
    return max(units) + 1 if units else 0
