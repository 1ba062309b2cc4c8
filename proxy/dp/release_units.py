"""Which of a statement's aggregates are one release: ε is split over releases, not columns.

Every variance and standard deviation (``var_pop``, ``var_samp``/``variance``, ``stddev_pop``,
``stddev_samp``/``stddev``) of one column under one condition is post-processing of the same
three noisy moments (:mod:`mechanisms.variance`): the backend computes the same parts for each
(``rewriter.rewrite.aggregate_parts``: the count, centred sum and centred sum of squares of the
clamped values, under the same FILTER), so the moments are drawn once, with one share of ε,
and every member of the family is computed from them. Two variances whose parts differ (another
column, another condition) are two releases, and so is every other aggregate, with one
exception: an AVG (``sum_count``) of a family's column under its condition is read from the
family's moments (``mechanisms.variance.mean_of``) when the statement has at most
:data:`AVG_FROM_MOMENTS_UP_TO` releases counted with the AVG apart. There its error is no
larger than ``sum_count``'s at its own share, and the family's smaller; beside more releases
the moments' split (≈ 0.279 and 0.443 of the share on the count and the sum, against 1/2 and
1/2) costs the AVG more than the freed share gives it back (docs/mechanisms.md).

The grouping reads the plan alone (the statement and the policy), never a row, so the split
is known before the charge.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

from rewriter.dp_query import Aggregate, AggregateQuery
from rewriter.rewrite import aggregate_parts

__all__ = ["AVG_FROM_MOMENTS_UP_TO", "release_count", "release_units"]

AVG_FROM_MOMENTS_UP_TO = 3
"""The most releases (the AVG counted apart) a statement may have for its AVG to be read from a
variance family's moments: to first order the AVG's error variance merged over apart is
((k − 1)/k)²·(5.11 + 12.9ρ²)/(4(1 + ρ²)), ρ ≤ 1 the mean's offset from the bounds' centre in
half-widths: below 1 for every ρ at k ≤ 3, up to 1.26 at k = 4."""


def release_units(aggregates: Sequence[Aggregate]) -> tuple[int, ...]:
    """Each aggregate's release, numbered 0, 1, … in order of first use: a variance or standard
    deviation takes the number of an earlier one whose backend parts are the same SQL (so the
    same exact values, the same grid and the same clamp), an AVG read from moments the number
    of their family, and every other aggregate a new one; () when there is no variance, so every
    aggregate is a release of its own (the statements on the hot path pay only this test)."""
    for agg in aggregates:
        if agg.mechanism == "moments":
            break
    else:
        return ()
    units: list[int] = []
    families: dict[tuple[str, ...], int] = {}
    released = 0
    for agg in aggregates:
        if agg.mechanism == "moments":
            parts = _moment_parts(agg)
            if parts in families:
                units.append(families[parts])
                continue
            families[parts] = released
        units.append(released)
        released += 1
    if not families or released > AVG_FROM_MOMENTS_UP_TO:
        return tuple(units)
    for index, agg in enumerate(aggregates):
        if agg.kind == "avg" and agg.mechanism == "sum_count":
            units[index] = families.get(_moment_parts(replace(agg, kind="var_pop", mechanism="moments")), units[index])
    order: dict[int, int] = {}
    return tuple(order.setdefault(unit, len(order)) for unit in units)


def release_count(plan: AggregateQuery) -> int:
    """k: how many releases share the statement's ε (:func:`release_units`; 0 without aggregates)."""
    units = release_units(plan.aggregates)
    return max(units) + 1 if units else len(plan.aggregates)


def _moment_parts(agg: Aggregate) -> tuple[str, ...]:
    """What identifies a variance's moments: the SQL of its backend parts."""
    return tuple(part.sql for part in aggregate_parts(agg))
