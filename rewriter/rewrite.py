"""Write the SQL that the backend runs for a DP query: exact aggregates, clamped, pushed down.

The backend returns exactly one row, never rows of the table. Each aggregate of the plan
becomes one or more *parts*, each one column of that row (:func:`aggregate_parts`):

* additive parts are exact totals over the filtered rows: COUNT, a SUM of values clamped
  into the column's bounds, the count of one declared category (MODE), the clamped sum and
  the count behind an ``avg: sum_count`` AVG;
* partition parts are the m per-partition values of a sample-and-aggregate AVG, MIN or
  MAX, computed over clamped values and returned as one text value ``'v1,v2,NULL,...'``
  (``array_to_string`` of the array, so that it reads the same however the row is fetched);
  empty partitions are missing from it and the caller counts them as empty.

Without partition parts the query is one plain aggregate over the filtered rows. With them
it is still one pass over the table: the filtered rows are grouped by a partition number
``floor(random() * m)`` drawn for each row on its own, and an outer aggregate folds the
partitions back together (``sum`` for additive parts, ``array_agg`` for partition values).

Why per-row ``random()``: sample and aggregate is private only if adding or removing one
row changes one partition's value, so a row's partition must not depend on the other rows
(``ntile`` over a random order would shift many rows when one is added). ``random()`` is
evaluated once per row as the grouping key, so every query draws a fresh partitioning.
PostgreSQL ≥ 15 seeds it per backend process from a strong random source; analysts cannot
reseed it (``setseed()``, ``SET seed`` and ``set_config('seed', ...)`` are refused) or read
its output (``random()`` is not on any allowlist). The partitioning's randomness serves
accuracy and the coupling argument above, it is not the noise: the noise comes from
``mechanisms.samplers``.

Functions are schema-qualified with ``pg_catalog`` so that a session's ``search_path``
cannot substitute another function for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from policies.tables import ColumnInfo, quote_identifier

from .dp_query import Aggregate, AggregateQuery
from .types import INTEGER_TYPES

__all__ = ["Part", "aggregate_parts", "backend_sql", "clamped", "literal", "partition_values", "split_row"]

_PER_PARTITION = {"avg": "avg", "min": "min", "max": "max"}


@dataclass(frozen=True)
class Part:
    """One backend column: an exact total (``additive``) or one value per partition."""

    sql: str
    additive: bool = True


def aggregate_parts(agg: Aggregate) -> tuple[Part, ...]:
    """The backend columns ``agg`` is released from, in the order the mechanism takes them.

    count → (count,); sum → (clamped sum,); sum_count AVG → (clamped sum, count of values);
    sample-and-aggregate AVG/MIN/MAX → (per-partition aggregate of clamped values,);
    MODE → (count of each declared category, in the policy's order).
    """
    if agg.column is None:
        return (Part("pg_catalog.count(*)"),)
    column = quote_identifier(agg.column.name)
    if agg.kind == "count":
        return (Part(f"pg_catalog.count({column})"),)
    if agg.kind == "sum":
        return (Part(f"pg_catalog.sum({clamped(agg.column)})"),)
    if agg.mechanism == "sum_count":
        return (Part(f"pg_catalog.sum({clamped(agg.column)})"), Part(f"pg_catalog.count({column})"))
    if agg.mechanism == "sample_aggregate":
        return (Part(f"pg_catalog.{_PER_PARTITION[agg.kind]}({clamped(agg.column)})", additive=False),)
    if agg.kind == "mode":
        assert agg.column.policy is not None and agg.column.policy.categories is not None
        return tuple(
            Part(f"pg_catalog.count(*) FILTER (WHERE {column} = {literal(category)})")
            for category in agg.column.policy.categories
        )
    raise ValueError(f"no backend SQL for {agg.kind} by {agg.mechanism}")


def backend_sql(query: AggregateQuery) -> str:
    """One SELECT over the resolved table that returns every part of every aggregate."""
    parts = [part for agg in query.aggregates for part in aggregate_parts(agg)]
    source = query.table.qualified_name
    if query.where_sql:
        source += f" WHERE {query.where_sql}"
    if all(part.additive for part in parts):
        return f"SELECT {', '.join(part.sql for part in parts)} FROM {source}"
    inner = ", ".join(f"{part.sql} AS p{i}" for i, part in enumerate(parts))
    outer = ", ".join(
        f"pg_catalog.sum(p{i})"
        if part.additive
        else f"pg_catalog.array_to_string(pg_catalog.array_agg(p{i}), ',', 'NULL')"
        for i, part in enumerate(parts)
    )
    partitions = query.table.policy.partitions
    return (
        f"SELECT {outer} FROM (SELECT {inner} FROM {source} "
        f"GROUP BY pg_catalog.floor(pg_catalog.random() * {partitions})) AS partitions"
    )


def split_row(query: AggregateQuery, row: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The backend row of :func:`backend_sql` cut into each aggregate's parts.

    Additive parts stay as fetched (None where SQL gives NULL); partition parts become the
    list of the non-empty partitions' values (:func:`partition_values`).
    """
    grouped: list[tuple[Any, ...]] = []
    start = 0
    for agg in query.aggregates:
        parts = aggregate_parts(agg)
        values = row[start : start + len(parts)]
        grouped.append(tuple(v if p.additive else partition_values(v) for p, v in zip(parts, values)))
        start += len(parts)
    if start != len(row):
        raise ValueError(f"backend row has {len(row)} columns, the plan needs {start}")
    return grouped


def partition_values(text: str | bytes | None) -> list[float | None]:
    """Parse a partition part (``'1.5,NULL,17'``; None when no partition has rows)."""
    if text is None:
        return []
    if isinstance(text, bytes):
        text = text.decode("ascii")
    return [None if item == "NULL" else float(item) for item in text.split(",")]


def clamped(column: ColumnInfo) -> str:
    """The column's values forced into its policy bounds [lo, hi]."""
    assert column.policy is not None and column.policy.bounds is not None
    lo, hi = (_bound(bound, column) for bound in column.policy.bounds)
    return f"LEAST(GREATEST({quote_identifier(column.name)}, {lo}), {hi})"


def _bound(bound: float, column: ColumnInfo) -> str:
    if column.type_oid in INTEGER_TYPES:
        return str(int(bound))
    return repr(float(bound))




def literal(text: str) -> str:
    """A string constant that reads the same whatever standard_conforming_strings is."""
    escaped = text.replace("'", "''")
    if "\\" in escaped:
        return "E'" + escaped.replace("\\", "\\\\") + "'"
    return f"'{escaped}'"
