"""Which of a statement's aggregates are one release: ε is split over releases, not columns.

Two aggregates released by the same mechanism, with the same parameters, from the same exact
backend parts (``rewriter.rewrite.aggregate_parts``: the same column, DISTINCT and FILTER/CASE
condition) are one release (:func:`release_key`): ``count(*), count(*)`` is drawn once, with one
share of ε, and both columns carry the one value, as PostgreSQL answers identical expressions
identically. Two draws at half the share each would be strictly worse than one at the whole
share, and they would disagree.

Every variance and standard deviation (``var_pop``, ``var_samp``/``variance``, ``stddev_pop``,
``stddev_samp``/``stddev``) of one column under one condition is post-processing of the same
three noisy moments (:mod:`mechanisms.variance`): the backend computes the same parts for each
(the count, centred sum and centred sum of squares of the clamped values, under the same
FILTER), so the moments are drawn once, with one share of ε,
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

__all__ = ["AVG_FROM_MOMENTS_UP_TO", "release_count", "release_key", "release_units"]

AVG_FROM_MOMENTS_UP_TO = 3
"""The most releases (the AVG counted apart) a statement may have for its AVG to be read from a
variance family's moments: to first order the AVG's error variance merged over apart is
((k − 1)/k)²·(5.11 + 12.9ρ²)/(4(1 + ρ²)), ρ ≤ 1 the mean's offset from the bounds' centre in
half-widths: below 1 for every ρ at k ≤ 3, up to 1.26 at k = 4."""


def release_units(aggregates: tuple[Aggregate, ...]) -> tuple[int, ...]:
    """Each aggregate's release, numbered 0, 1, … in order of first use: an aggregate takes the
    number of an earlier one released by the same mechanism from the same exact parts
    (:func:`release_key`: they are one draw, and the same value), a variance or standard
    deviation that of an earlier one whose backend parts are the same SQL (so the same exact
    values, the same grid and the same clamp), an AVG read from moments the number of their
    family, and every other aggregate a new one; () when every aggregate is a release of its
    own (the statements on the hot path, with no variance and no two aggregates of one kind
    over one column, pay only that test)."""
    global _last
    if len(aggregates) < 2:
        return ()
    last = _last
    if aggregates is last[0]:
        return last[1]
    units = _units(aggregates)
    _last = (aggregates, units)
    return units


_last: tuple[tuple[Aggregate, ...] | None, tuple[int, ...]] = (None, ())
"""The last aggregates :func:`release_units` was asked about, and its answer: one statement asks
three times (its split, its release, its audit line). Holding the sequence keeps its id from
being reused by another."""


def _units(aggregates: Sequence[Aggregate]) -> tuple[int, ...]:
    """:func:`release_units`, computed for two aggregates or more."""
    seen: set[tuple[str, str | None]] = set()
    for agg in aggregates:
        if agg.mechanism == "moments":
            break
        coarse = (agg.kind, agg.column.name if agg.column is not None else None)
        if coarse in seen:
            break  # maybe the same release: release_key decides
        seen.add(coarse)
    else:
        return ()
    units: list[int] = []
    releases: dict[tuple[object, ...], int] = {}
    families = False
    for agg in aggregates:
        key = release_key(agg)
        if key in releases:
            units.append(releases[key])
            continue
        families = families or agg.mechanism == "moments"
        releases[key] = len(releases)
        units.append(releases[key])
    if not families or len(releases) > AVG_FROM_MOMENTS_UP_TO:
        return tuple(units)
    for index, agg in enumerate(aggregates):
        if agg.kind == "avg" and agg.mechanism == "sum_count":
            family = release_key(replace(agg, kind="var_pop", mechanism="moments"))
            units[index] = releases.get(family, units[index])
    order: dict[int, int] = {}
    return tuple(order.setdefault(unit, len(order)) for unit in units)


def release_key(agg: Aggregate) -> tuple[object, ...]:
    """What makes two aggregates one release: the SQL of their backend parts
    (``rewriter.rewrite.aggregate_parts``: the column, DISTINCT and the condition) and, but for a
    variance family (whose members are all computed from one draw of its moments), the kind,
    the mechanism and what else the mechanism reads: the percentile's fraction or fractions (a
    bound parameter's number until it is read). A MODE's categories, a grid, the bounds and
    sample-and-aggregate's partitions are the column's and the table's, so the same for both.
    The result type is not part of it: each column encodes the one value for its own type."""
    parts = tuple(part.sql for part in aggregate_parts(agg))
    if agg.mechanism == "moments":
        return ("moments", parts)
    fraction = agg.fraction if agg.fraction_parameter is None else agg.fraction_parameter
    return (agg.kind, agg.mechanism, agg.distinct, parts, fraction, agg.fractions)


def release_count(plan: AggregateQuery) -> int:
    """k: how many releases share the statement's ε (:func:`release_units`; 0 without aggregates)."""
    units = release_units(plan.aggregates)
    return max(units) + 1 if units else len(plan.aggregates)

