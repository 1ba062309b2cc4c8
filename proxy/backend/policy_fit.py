"""Whether a column's policy fits the column's type on the backend.

``serve`` (and a reload, and ``check-config`` when it reaches the backend) refuses a policy
whose column entries cannot work: bounds need a number to clamp; categories are matched with
``column = 'category'``, which on a numeric column fails at query time for a category that is
not a number (and a numeric column wants bounds). Text, enum, boolean … columns take categories; a
column whose values can be of any length with no header telling their size
(``ColumnInfo.unbounded_length``: jsonb, arrays …) takes none, as its values are never read
(rewriter/text_bounds.py).
Bounds of float-valued columns are limited (``rewriter.types.MAX_ABS_BOUND``) so that the
backend's sums cannot overflow; bounds of integer columns must be values of the column's type,
since the clamp casts them to it (``CAST(100000 AS smallint)`` fails every query, after its charge).
"""

from __future__ import annotations

import math

from policies.model import ColumnPolicy
from policies.tables import ColumnInfo
from rewriter.group_keys import TIME_TYPES
from rewriter.types import ARRAY_TYPES, INT2, INT4, INT8, INTEGER_TYPES, MAX_ABS_BOUND, NUMERIC_TYPES

__all__ = ["column_fit_problems", "unbounded_categories_problems"]

# The values each integer type holds: a bound outside them cannot be cast to the type.
_INTEGER_RANGES = {INT2: (-(2**15), 2**15 - 1), INT4: (-(2**31), 2**31 - 1), INT8: (-(2**63), 2**63 - 1)}


def column_fit_problems(table: str, column: str, policy: ColumnPolicy, info: ColumnInfo) -> list[str]:
    """The problems of ``policy`` for the backend column ``info``, as ``tables.t.columns.c: ...``."""
    key = f"tables.{table}.columns.{column}"
    type_oid = info.type_oid
    declared = [name for name, given in (("categories", policy.categories is not None), ("bounds", policy.bounds is not None),
                                         ("a time range", policy.time_bounds is not None), ("group_by", bool(policy.group_by)))
                if given]
    if not info.builtin and declared:
        return [f"{key}: {' and '.join(declared)} on a column of a type not built into PostgreSQL (an extension's or "
                "a user's): its comparisons are code of its own, which may fail on some values only (pgvector's "
                "vector on two of different dimensions), so such a column is only counted and tested for NULL, which "
                "needs no entry: leave it out of the policy's columns"]
    if policy.time_bounds is not None and type_oid not in TIME_TYPES:
        return [f"{key}: a time range (bounds of dates) needs a date or timestamp column; on the backend it is not one"]
    if policy.group_by is True and policy.categories is not None and not (info.array_type_oid or type_oid in ARRAY_TYPES):
        return [f"{key}: group_by needs a column type with an array type (its keys are sent as one); this one has none"]
    if policy.bounds is not None:
        if type_oid in TIME_TYPES:
            return [f"{key}: bounds of numbers on a date or timestamp column; give it a time range, "
                    "e.g. bounds: [2021-01-01, 2024-12-31]"]
        if type_oid not in NUMERIC_TYPES and info.base_type_oid in NUMERIC_TYPES:
            return [f"{key}: bounds need a column of a numeric type itself (smallint, integer, bigint, real, double "
                    "precision or numeric); on the backend it is of a domain over one, which is only counted: "
                    "leave it out of the policy's columns"]
        if type_oid not in NUMERIC_TYPES:
            return [f"{key}: bounds need a numeric column (smallint, integer, bigint, real, double precision "
                    "or numeric); on the backend it is not one (use categories for a text column)"]
        if type_oid in INTEGER_TYPES and not all(float(b).is_integer() for b in policy.bounds):
            return [f"{key}: integer column needs integer bounds"]
        if type_oid in INTEGER_TYPES and not all(
            _INTEGER_RANGES[type_oid][0] <= int(b) <= _INTEGER_RANGES[type_oid][1] for b in policy.bounds
        ):
            low, high = _INTEGER_RANGES[type_oid]
            # Bounds are doubles: 2^63 - 1 reads as 2^63, so a bigint's largest usable bound is below it.
            largest = " (bounds are read as doubles: at most 9223372036854774784)" if type_oid == INT8 else ""
            return [f"{key}: bounds of this integer column must lie within its type's range "
                    f"[{low}, {high}]{largest}; the clamp casts them to the column's type"]
        if policy.sensitivity > MAX_ABS_BOUND.get(type_oid, math.inf):
            return [f"{key}: bounds of this column type may be at most {MAX_ABS_BOUND[type_oid]:g} in magnitude "
                    "(a larger SUM could overflow on the backend, depending on the rows)"]
    if policy.categories is not None and info.container:
        # MODE and GROUP BY compare the column with each category, which on an array or
        # composite can fail per row (ColumnInfo.container).
        return [f"{key}: categories are for a text (or enum, boolean ...) column; on the backend it is an array "
                "or composite, whose comparisons can fail depending on the rows"]
    if policy.categories is not None and type_oid in NUMERIC_TYPES:
        return [f"{key}: categories are for a text (or enum, boolean ...) column; on the backend it is "
                "numeric: give it bounds"]
    return []


def unbounded_categories_problems(table: str, column: str, policy: ColumnPolicy, info: ColumnInfo) -> list[str]:
    """Categories on a column whose values can be of any length with no header telling their size
    (``ColumnInfo.unbounded_length``): MODE and a categorical key compare the column with each category,
    reading all of a value, which ``max_text_bytes`` cannot bound as it bounds text. Asked after the
    checks of the labels themselves, whose problem (a type that cannot compare them at all) says more."""
    if policy.categories is None or not info.unbounded_length:
        return []
    return [f"tables.{table}.columns.{column}: categories on a column whose values can be of any length (jsonb, "
            "tsvector, an array, numrange, path ...) with no header telling their size: MODE and a GROUP BY compare "
            "the column with each category, reading all of a value, which max_text_bytes cannot bound as it bounds "
            "text, so such a column is only counted and tested for NULL, which needs no entry: leave it out of the "
            "policy's columns"]
