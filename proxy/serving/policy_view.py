"""``SHOW dpproxy.columns``: what the policy lets an analyst ask, one row per protected column.

Everything shown is policy, not data: bounds and categories are what the policy's owner
declared, and which aggregates a column takes follows from them exactly as the DP planner
decides (rewriter/dp_query.py). A text column's ``bounds`` is the most bytes of its values a DP
statement reads (the table's ``max_text_bytes``, or a ``varchar(n)``'s 4·n: rewriter/text_bounds.py; a
``bytea`` column's and a domain's over text too); a ``numeric`` of no declared precision (or a
domain over one) adds to its bounds that a value is read only when stored uncompressed in at most
``NUMERIC_MAX_BYTES`` (127), in the row (a text value too: rewriter/text_bounds.py); a column whose values can be of any length (``jsonb``, arrays …) says
it is not read. Each protected table also gets a row for ``*`` (COUNT(*)).
``epsilon`` is what one query on the table costs this session (the table's ε, capped by
the user's ``max_query_epsilon`` and ``SET dpproxy.epsilon``); ``delta`` is the table's δ,
charged only by the sample-and-aggregate mechanisms. Public tables are not listed: they
are passed through as they are.

A table is named as an analyst writes it (``quote_ident`` of each part, the ``public`` schema
left out: ``"Sales"."Order.Items"``), a column as the catalog stores it (as psql's ``\\d`` shows
it), in the GROUP BY keys as SQL writes it; ``data_type`` is the backend's ``format_type`` of the
column's type and modifier, read when the policy was loaded (``ColumnInfo.type_name``).
"""

from __future__ import annotations

import json
from datetime import datetime, time
from typing import Callable

from policies.sql_names import quote_ident
from policies.tables import ColumnInfo, Relation, TableRegistry, quote_identifier
from proxy.backend.connection import ResultSet
from proxy.wire.binary import TEXT
from proxy.wire.protocol import Field
from proxy.wire.values import encode_text
from rewriter.group_keys import DATE, column_key_count
from rewriter.key_domain import part_keys
from rewriter.text_bounds import NUMERIC, NUMERIC_MAX_BYTES, bounded_value, unconstrained_numeric, value_bytes
from rewriter.types import FLOAT8, MAX_ABS_BOUND, MAX_ABS_VARIANCE_BOUND, NUMERIC_TYPES

__all__ = ["COLUMNS_FIELDS", "columns_result"]

COLUMNS_FIELDS = [
    Field("table_name", TEXT),
    Field("column_name", TEXT),
    Field("data_type", TEXT),
    Field("bounds", TEXT),
    Field("categories", TEXT),
    Field("aggregates", TEXT),
    Field("group_by", TEXT),
    Field("epsilon", FLOAT8, 8),
    Field("delta", FLOAT8, 8),
]

def columns_result(registry: TableRegistry, epsilon_of: Callable[[Relation], float]) -> ResultSet:
    """The rows of SHOW dpproxy.columns, tables and columns in name order."""
    rows: list[list[bytes | None]] = []
    tables = sorted((r for r in registry.by_oid.values() if r.access == "protected"),
                    key=lambda r: (r.schema, r.name))
    for table in tables:
        epsilon = encode_text(epsilon_of(table), FLOAT8)
        delta = encode_text(table.policy.delta, FLOAT8)
        name = table.display_name.encode()
        rows.append([name, b"*", None, None, None, b"COUNT(*) laplace", None, epsilon, delta])
        for column in sorted(table.columns.values(), key=lambda c: c.attnum):
            keys = _group_keys(table, column)
            rows.append([name, column.name.encode(), column.type_name.encode() or None, *_declared(table, column),
                         ", ".join(_aggregates(table, column)).encode(), keys.encode() if keys else None,
                         epsilon, delta])
    return ResultSet(list(COLUMNS_FIELDS), rows, "SHOW")


def _declared(table: Relation, column: ColumnInfo) -> list[bytes | None]:
    """Bounds as ``[lo, hi]`` (a time range's as ISO dates or times; a text column's as the bytes of
    a value read; a numeric's of no declared precision followed by the stored form it is read in,
    which applies with no bounds declared too, to COUNT(col)) and categories as a JSON array, as declared."""
    policy = column.policy
    bounds = f"[{_number(policy.bounds[0])}, {_number(policy.bounds[1])}]" if policy and policy.bounds else None
    text_bytes = value_bytes(column, table.policy)
    if text_bytes is not None:
        bounds = f"at most {text_bytes} bytes (a longer value reads as NULL)"
        if bounded_value(column, table.policy) != quote_identifier(column.name):
            bounds = f"at most {text_bytes} bytes, stored in the row uncompressed (another value reads as NULL)"
    elif unconstrained_numeric(column) or (column.value_type[0] == NUMERIC
                                           and bounded_value(column, table.policy) != quote_identifier(column.name)):
        stored = (f"read only when stored in the row uncompressed in at most {NUMERIC_MAX_BYTES} bytes "
                  "(another value reads as NULL)")
        bounds = f"{bounds}, {stored}" if bounds else stored
    elif column.unbounded_length:
        bounds = "not read: values of any length are only counted and tested for NULL"
    if policy and policy.time_bounds:
        bounds = "[{}, {}]".format(*(_moment(moment, column.type_oid) for moment in policy.time_bounds))
    categories = json.dumps(list(policy.categories)).encode() if policy and policy.categories else None
    return [bounds.encode() if bounds else None, categories]


def _moment(moment: datetime, type_oid: int) -> str:
    """A time bound as the column's type writes it: a ``date`` column's midnight as the date alone
    (the policy's ``2021-01-01``, not ``2021-01-01 00:00:00``), anything else as an ISO time."""
    if type_oid == DATE and moment.time() == time():
        return moment.date().isoformat()
    return moment.isoformat(sep=" ")


def _number(bound: float) -> str:
    """A bound exactly as its value: a whole number up to 2^53 without a fraction or exponent
    (1500000, not ``:g``'s 1.5e+06, which also rounded 1234567 to 1.23457e+06), else the
    shortest text that reads back as the same double (1e+20, 0.1)."""
    return str(int(bound)) if bound.is_integer() and abs(bound) <= 2**53 else repr(bound)


def _group_keys(table: Relation, column: ColumnInfo) -> str | None:
    """The GROUP BY keys the column gives (rewriter/group_keys.py, its date parts
    rewriter/key_domain.py), with their number of cells: a DATE_TRUNC per unit answered, those
    nested in a listed unit included (policies/time_buckets.py)."""
    policy = column.policy
    if policy is None or policy.group_by is False:
        return None
    written = quote_ident(column.name)
    if policy.time_units:
        parts = [f"{part} ({_cells(cells)})" for part, cells in part_keys(column, table.policy.max_cells)]
        return ", ".join([f"DATE_TRUNC('{unit}', {written}) ({_cells(policy.bucket_count(unit))})"
                          for unit in policy.time_units] + parts)
    keys = []
    count = column_key_count(column)
    if count is not None and count <= table.policy.max_cells:
        keys.append(f"{written} ({_cells(count)})")
    if policy.bounds is not None:
        keys.append(f"width_bucket({written}, lo, hi, n) (n + 2 cells), "
                    f"floor(({written} - A) / W) * W + A (the bins the bounds span)")
    return ", ".join(keys) or None


def _aggregates(table: Relation, column: ColumnInfo) -> list[str]:
    """The aggregates the DP planner accepts on ``column``, each with its mechanism (COUNT(DISTINCT)
    where rewriter/dp_query.py answers it: a built-in type PostgreSQL can sort, of bounded size)."""
    accepted = ["COUNT laplace"]
    if column.builtin and column.distinct_countable and not column.unbounded_length:
        accepted.append("COUNT(DISTINCT) laplace")
    policy = column.policy
    limit = MAX_ABS_BOUND.get(column.type_oid)
    if (column.type_oid in NUMERIC_TYPES and policy is not None and policy.bounds is not None
            and (limit is None or policy.sensitivity <= limit)):
        accepted.append("SUM laplace")
        sampled = table.policy.delta > 0
        if (policy.avg or table.policy.avg) == "sum_count":
            accepted.append("AVG sum_count")
        elif sampled:
            accepted.append("AVG sample_aggregate")
        if sampled:
            accepted += ["MIN sample_aggregate", "MAX sample_aggregate"]
        accepted.append("PERCENTILE exponential")  # percentile_cont and percentile_disc
        if policy.sensitivity <= MAX_ABS_VARIANCE_BOUND:
            accepted.append("VARIANCE moments")  # var_pop, var_samp, stddev_pop, stddev_samp
    if policy is not None and policy.categories is not None:
        accepted.append("MODE exponential")
    return accepted


def _cells(count: int) -> str:
    return f"{count} cell{'' if count == 1 else 's'}"
