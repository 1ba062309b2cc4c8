"""Time buckets of a declared time range: what DATE_TRUNC(unit, column) can return within it.

A GROUP BY over ``DATE_TRUNC(unit, column)`` answers one row per bucket that the policy's
time range spans, generated from the range and never from the data. Bounds are wall-clock
times; the number of buckets between two wall-clock times does not depend on a time zone.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final, Literal, get_args

__all__ = ["TIME_UNITS", "TimeUnit", "bucket_count", "bucket_starts", "truncate"]

TimeUnit = Literal["hour", "day", "week", "month", "quarter", "year"]
TIME_UNITS: Final[tuple[str, ...]] = get_args(TimeUnit)


def truncate(unit: TimeUnit, moment: datetime) -> datetime:
    """``moment`` truncated to the start of its ``unit``, as PostgreSQL's date_trunc does (weeks start on Monday)."""
    if unit == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if unit == "day":
        return day
    if unit == "week":
        return day - timedelta(days=day.weekday())
    if unit == "month":
        return day.replace(day=1)
    if unit == "quarter":
        return day.replace(month=(day.month - 1) // 3 * 3 + 1, day=1)
    if unit == "year":
        return day.replace(month=1, day=1)
    raise ValueError(f"unknown time unit {unit!r}")


def bucket_count(unit: TimeUnit, lo: datetime, hi: datetime) -> int:
    """How many ``unit`` buckets [lo, hi] touches (lo ≤ hi): date_trunc(lo) … date_trunc(hi)."""
    first, last = truncate(unit, lo), truncate(unit, hi)
    if unit in ("month", "quarter", "year"):
        months = (last.year - first.year) * 12 + last.month - first.month
        return months // {"month": 1, "quarter": 3, "year": 12}[unit] + 1
    step = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}[unit]
    return (last - first) // step + 1


def bucket_starts(unit: TimeUnit, lo: datetime, hi: datetime) -> list[datetime]:
    """The start of every ``unit`` bucket [lo, hi] touches, in order (wall-clock)."""
    first = truncate(unit, lo)
    starts = []
    for i in range(bucket_count(unit, lo, hi)):
        if unit in ("month", "quarter", "year"):
            months = first.month - 1 + i * {"month": 1, "quarter": 3, "year": 12}[unit]
            starts.append(first.replace(year=first.year + months // 12, month=months % 12 + 1))
        else:
            step = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}[unit]
            starts.append(first + i * step)
    return starts
