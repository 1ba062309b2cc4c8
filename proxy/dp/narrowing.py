"""Leave out the time buckets a GROUP BY's own WHERE excludes, before the charge.

``SELECT DATE_TRUNC('month', ts), COUNT(*) FROM t WHERE ts >= '2023-03-01' AND ts < '2023-09-01'
GROUP BY 1`` on a column whose declared range spans two years would otherwise answer 24 months,
18 of them noise around nothing. The WHERE's bounds on the key's column are values of the
statement (literals, parameters, expressions dpproxy folds): they are evaluated here in one
query that reads no table, in the analyst's session with the statement's parameters, and the
buckets that cannot hold a row within them are dropped from the plan. Which buckets remain is a
function of the statement, its parameters and the session's settings only, never of the rows;
an error evaluating a bound is PostgreSQL's own, returned before anything is charged.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from proxy.backend.connection import BackendSession, BoundParams
from proxy.dp.bound_values import evaluated
from rewriter.dp_query import AggregateQuery
from rewriter.group_keys import DATE, TIMESTAMP, TIMESTAMPTZ, GroupKey, KeyRange
from rewriter.rewrite import backend_sql

__all__ = ["narrow_keys", "range_query"]

_WALL_CLOCK = "YYYY-MM-DD HH24:MI:SS.US BC"
_AFTER, _BEFORE = "after", "before"
_HELD = ("9999-12-31 23:59:59.999999", "0001-01-01 00:00:00")  # what datetime holds
_COLUMN_TYPES = {DATE: "date", TIMESTAMP: "timestamp", TIMESTAMPTZ: "timestamptz"}


async def narrow_keys(plan: AggregateQuery, params: BoundParams, backend: BackendSession) -> tuple[AggregateQuery, BoundParams]:
    """``plan`` with each time key narrowed to the buckets its WHERE bounds can reach.

    A plan left with no cell asks for no row (``limit_zero``): nothing is released or charged.
    """
    if not plan.ranges:
        return plan, params
    values, params = await evaluated(plan, params, range_query(plan), backend)
    bounds: dict[int, tuple[datetime | None, datetime | None]] = {}
    for limit, value in zip(plan.ranges, values):
        moment = _moment(value)
        lo, hi = bounds.get(limit.key, (None, None))
        if moment is not None and limit.op in (">=", ">", "="):
            lo = moment if lo is None else max(lo, moment)
        if moment is not None and limit.op in ("<=", "<", "="):
            if limit.op == "<" and moment > datetime.min:
                moment -= timedelta(microseconds=1)  # the last moment a row can have (a bucket starting there holds none)
            hi = moment if hi is None else min(hi, moment)
        bounds[limit.key] = (lo, hi)
    groups = tuple(key.narrowed(*bounds[i]) if i in bounds else key for i, key in enumerate(plan.groups))
    narrowed = replace(plan, groups=groups, ranges=())
    if narrowed.cells == 0:
        narrowed = replace(narrowed, limit_zero=True)
    return narrowed, params


def range_query(plan: AggregateQuery) -> str:
    """One SELECT of every range value as the wall-clock time it is in the key column's type.

    A value beyond what ``datetime`` holds (years past 9999, a date past timestamp's range,
    ``infinity``) is reported as ``after``, one before year 1 (BC, ``-infinity``) as ``before``:
    compared, not cast, since the cast of a date past 294276 to a timestamp fails (22008) and
    the comparison (PostgreSQL's cross-type one) does not.
    """
    return "SELECT " + ", ".join(_wall_clock(limit, plan.groups[limit.key]) for limit in plan.ranges)


def _wall_clock(limit: KeyRange, key: GroupKey) -> str:
    # A date column is compared with a time as the timestamp of its midnight, so its bound
    # keeps the time: cast to date, `d < '2000-03-01 12:00'::timestamp` would end before
    # March 1, which that WHERE keeps, and drop March's bucket. A date value reads as its
    # midnight either way. A string literal is read as the column's type first, as the WHERE
    # reads it.
    type_name = "timestamptz" if key.column.type_oid == TIMESTAMPTZ else "timestamp"
    value = f"({limit.sql})"
    if limit.untyped:
        value = f"CAST({value} AS pg_catalog.{_COLUMN_TYPES.get(key.column.type_oid, type_name)})"
    moment = f"CAST({value} AS pg_catalog.{type_name})"
    if key.kind == "epoch" and key.column.type_oid == TIMESTAMPTZ:
        moment = f"({moment} AT TIME ZONE 'UTC')"  # epoch buckets are read in UTC (rewriter/epoch_buckets.py)
    last, first = (f"CAST('{bound}' AS pg_catalog.{type_name})" for bound in _HELD)
    return (f"CASE WHEN {value} OPERATOR(pg_catalog.>) {last} THEN '{_AFTER}' "
            f"WHEN {value} OPERATOR(pg_catalog.<) {first} THEN '{_BEFORE}' "
            f"ELSE pg_catalog.to_char({moment}, '{_WALL_CLOCK}') END")


def _moment(value: bytes | None) -> datetime | None:
    """A wall-clock time; None (no narrowing on that side) for NULL. A value past what
    ``datetime`` holds is ``datetime.max`` (after every declared range), one before it
    ``datetime.min``; a time that does not parse (a year past 9999 after the epoch keys'
    shift to UTC) is None."""
    if value == _AFTER.encode():
        return datetime.max
    if value == _BEFORE.encode():
        return datetime.min
    if value is None or not value.endswith(b" AD"):
        return None
    try:
        return datetime.strptime(value[:-3].decode("ascii"), "%Y-%m-%d %H:%M:%S.%f")
    except ValueError:
        return None
