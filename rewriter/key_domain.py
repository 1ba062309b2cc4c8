"""The cells of a GROUP BY over declared keys: their order, their labels, and a group's cell.

Keys over different columns (and any key that is not a date key) give the product of their
domains, as each key's cells are (:class:`rewriter.group_keys.GroupKey`). Date keys over one
time column, when there are several (``DATE_TRUNC`` of two units: Superset's pivot of years by
months) or one of them is a function of a bucket (a ``part``: month of year, day of week, a
Sunday week, ``rewriter.date_parts``), are taken together: their cells are the distinct tuples
of values the times of the column's buckets give, not their product (a Power BI hierarchy's
year, quarter and month has no "2023, Q1, July" cell, years by months no "2023, 2024-07"), and a
date part alone has one cell per value it takes (month of year over three months of a range:
three cells).

Those tuples are computed from the keys' buckets, each narrowed to the WHERE's time bounds,
never from the rows: each distinct tuple the days the keys' buckets all hold give is a cell,
named by the first such day (its representative: the outer statement computes each key from
it, as PostgreSQL computes the key from a row, so types and labels are PostgreSQL's). Cells are
in the order of their tuples. :mod:`rewriter.joint_cells` finds them with work bounded by the
cells and one 400-year cycle, not by the range, which the WHERE chooses. Each row is in the cell of its buckets' tuple, so the cells still
partition the rows and each is a union of cells of the ``DATE_TRUNC`` keys of the same units.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from policies.sql_names import quote_ident
from policies.tables import ColumnInfo
from policies.time_buckets import TimeUnit, bucket_count, bucket_start, truncate

from .date_parts import PART_UNITS, answered_parts
from .group_keys import DATE, GroupKey
from .joint_cells import JointCells, KeySpec, joint_cells

__all__ = ["KeyDomain", "key_domain", "part_keys"]



@dataclass(frozen=True)
class _Factor:
    """One factor of the product: a single key's own cells, or date keys over one column taken
    together (``cells``: each cell's values, one per key, and its representative)."""

    keys: tuple[int, ...]
    size: int
    cells: JointCells | None = None


@dataclass(frozen=True)
class KeyDomain:
    """The cells of a plan's keys: ``size`` of them (more than the limit when ``exceeded``)."""

    groups: tuple[GroupKey, ...]
    factors: tuple[_Factor, ...]
    exceeded: bool = False

    @property
    def size(self) -> int:
        size = 1
        for factor in self.factors:
            size *= factor.size
        return size if self.groups else 1

    @property
    def joined(self) -> bool:
        """Whether some cell joins several of the backend's reported key values: a joint factor's
        cell collects several buckets (month of year: one per year), which the backend SQL's
        outer query adds up (``rewriter.rewrite._grouped_sql``)."""
        return any(factor.cells is not None for factor in self.factors)

    @property
    def joint_keys(self) -> frozenset[int]:
        """The keys (indices into ``groups``) that are members of a joint factor."""
        return frozenset(key for factor in self.factors if factor.cells is not None for key in factor.keys)

    def labels(self) -> Iterator[tuple[str, ...]]:
        """Every cell's keys as text their types read back, in key order, in cell order."""
        per_factor = [self._factor_labels(factor) for factor in self.factors]
        for combination in itertools.product(*per_factor):
            labels: list[str] = [""] * len(self.groups)
            for factor, cell in zip(self.factors, combination):
                for key, label in zip(factor.keys, cell):
                    labels[key] = label
            yield tuple(labels)

    def _factor_labels(self, factor: _Factor) -> list[tuple[str, ...]]:
        if factor.cells is None:
            return [(label,) for label in self.groups[factor.keys[0]].labels()]
        keys = [self.groups[i] for i in factor.keys]
        return [tuple(key.label_at(start if key.part is not None else truncate(_unit(key), start)) for key in keys)
                for start in factor.cells.starts]

    def cell(self, coordinates: Sequence[int | None]) -> int | None:
        """The cell of a group whose keys' cells are ``coordinates`` (each key's ``cell_of``: a
        time key's bucket), or None if it is in none."""
        if any(coordinate is None for coordinate in coordinates):
            return None
        cell = 0
        for factor in self.factors:
            if factor.cells is None:
                coordinate = coordinates[factor.keys[0]]
                assert coordinate is not None
                cell = cell * factor.size + coordinate
                continue
            values = []
            for i in factor.keys:
                key, index = self.groups[i], coordinates[i]
                assert key.first is not None and index is not None
                values.append(key.value_at(bucket_start(_unit(key), key.first, index)))
            found = factor.cells.positions.get(tuple(values))
            if found is None:
                return None
            cell = cell * factor.size + found
        return cell


def key_domain(groups: tuple[GroupKey, ...], limit: int) -> KeyDomain:
    """The cells of ``groups`` (module docstring); a joint factor stops counting past ``limit``."""
    factors: list[_Factor] = []
    joined: dict[str, list[int]] = {}
    for i, key in enumerate(groups):
        if key.kind == "time":
            joined.setdefault(key.column.name, []).append(i)
    # A DATE_TRUNC key alone is its buckets; any other time key, or several over one column, a joint factor.
    joined = {name: members for name, members in joined.items()
              if len(members) > 1 or groups[members[0]].part is not None}
    exceeded = False
    placed: set[int] = set()
    for i, key in enumerate(groups):
        if i in placed:
            continue
        members = joined.get(key.column.name) if key.kind == "time" else None
        if members is None:
            factors.append(_Factor((i,), key.size))
            continue
        placed.update(members)
        cells = joint_cells(tuple(_spec(groups[j]) for j in members), limit)
        exceeded = exceeded or cells.exceeded
        factors.append(_Factor(tuple(members), cells.size, cells))
    return KeyDomain(groups, tuple(factors), exceeded)


def part_keys(column: ColumnInfo, limit: int) -> list[tuple[str, int]]:
    """The date parts ``column`` answers as a GROUP BY of their own (docs/policy.md), each written as
    an analyst may write it, with its number of cells over the declared range (at most ``limit``)."""
    policy = column.policy
    if policy is None or not policy.time_units or policy.time_bounds is None:
        return []
    lo, hi = policy.time_bounds
    keys = []
    for part in answered_parts(policy.time_units):
        unit = next(unit for unit in PART_UNITS[part] if unit in policy.time_units)
        key = GroupKey(column, "time", column.type_oid, unit=unit, first=truncate(unit, lo),
                       count=bucket_count(unit, lo, hi), part=part)
        domain = key_domain((key,), limit)
        if domain.exceeded:
            continue
        name = quote_ident(column.name)
        # Each as a key an analyst may write (Sunday weeks as Metabase writes them, docs/policy.md).
        written = {"sunday_week": f"date_trunc('week', {name} + INTERVAL '1 day') + INTERVAL '-1 day'",
                   "date": name if column.type_oid == DATE else f"CAST({name} AS DATE)"}.get(
            part, f"EXTRACT({part.upper()} FROM {name})")
        keys.append((written, domain.size))
    return keys


def _spec(key: GroupKey) -> KeySpec:
    assert key.unit is not None and key.first is not None
    return key.unit, key.first, key.count, key.part


def _unit(key: GroupKey) -> TimeUnit:
    assert key.unit is not None
    return key.unit
