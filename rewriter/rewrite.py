"""Write the SQL that the backend runs for a DP query: exact aggregates, clamped, pushed down.

The backend returns one row of exact aggregates (never rows of the table); values are
clamped into the policy bounds inside PostgreSQL, so one row's influence on each
aggregate is bounded before any noise is added.
"""

from __future__ import annotations

from policies.tables import ColumnInfo

from .dp_query import Aggregate, AggregateQuery
from .types import INTEGER_TYPES

__all__ = ["backend_sql"]


def backend_sql(query: AggregateQuery) -> str:
    """One SELECT over the resolved table computing every aggregate of ``query`` exactly."""
    items = ", ".join(_aggregate_sql(agg) for agg in query.aggregates)
    sql = f"SELECT {items} FROM {query.table.qualified_name}"
    if query.where_sql:
        sql += f" WHERE {query.where_sql}"
    return sql


def _aggregate_sql(agg: Aggregate) -> str:
    if agg.column is None:
        return "count(*)"
    column = quote(agg.column.name)
    if agg.kind == "count":
        return f"count({column})"
    if agg.kind == "sum":
        return f"sum({clamped(agg.column)})"
    raise ValueError(f"no backend SQL for {agg.kind}")


def clamped(column: ColumnInfo) -> str:
    """The column's values forced into its policy bounds [lo, hi]."""
    assert column.policy is not None and column.policy.bounds is not None
    lo, hi = (_literal(bound, column) for bound in column.policy.bounds)
    return f"LEAST(GREATEST({quote(column.name)}, {lo}), {hi})"


def _literal(bound: float, column: ColumnInfo) -> str:
    if column.type_oid in INTEGER_TYPES:
        return str(int(bound))
    return repr(float(bound))


def quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
