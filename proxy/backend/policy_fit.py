"""Whether a column's policy fits the column's type on the backend.

``serve`` (and a reload, and ``check-config`` when it reaches the backend) refuses a policy
whose column entries cannot work: bounds need a number to clamp; categories are matched with
``column = 'category'``, which on a numeric column fails at query time for a category that is
not a number (and a numeric column wants bounds). Text, enum, boolean … columns take categories.
Bounds of float-valued columns are limited (``rewriter.types.MAX_ABS_BOUND``) so that the
backend's sums cannot overflow.
"""

from __future__ import annotations

import math

from policies.model import ColumnPolicy
from policies.tables import ColumnInfo
from rewriter.group_keys import TIME_TYPES
from rewriter.types import ARRAY_TYPES, INTEGER_TYPES, MAX_ABS_BOUND, NUMERIC_TYPES

__all__ = ["column_fit_problems"]


def column_fit_problems(table: str, column: str, policy: ColumnPolicy, info: ColumnInfo) -> list[str]:
    """The problems of ``policy`` for the backend column ``info``, as ``tables.t.columns.c: ...``."""
    key = f"tables.{table}.columns.{column}"
    type_oid = info.type_oid
    if policy.time_bounds is not None and type_oid not in TIME_TYPES:
        return [f"{key}: a time range (bounds of dates) needs a date or timestamp column; on the backend it is not one"]
    if policy.group_by is True and policy.categories is not None and not (info.array_type_oid or type_oid in ARRAY_TYPES):
        return [f"{key}: group_by needs a column type with an array type (its keys are sent as one); this one has none"]
    if policy.bounds is not None:
        if type_oid not in NUMERIC_TYPES:
            return [f"{key}: bounds need a numeric column (smallint, integer, bigint, real, double precision "
                    "or numeric); on the backend it is not one (use categories for a text column)"]
        if type_oid in INTEGER_TYPES and not all(float(b).is_integer() for b in policy.bounds):
            return [f"{key}: integer column needs integer bounds"]
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
