"""Time buckets of a declared time range: what DATE_TRUNC(unit, column) can return within it.

A GROUP BY over ``DATE_TRUNC(unit, column)`` answers one row per bucket that the policy's
time range spans, generated from the range and never from the data. Bounds are wall-clock
times (no time zone): a bucket is named by the wall-clock time it starts at, which is what
``date_trunc`` gives in any session time zone, so the buckets, their number and their order
do not depend on the time zone either. Weeks start on Monday, as in PostgreSQL.

A unit is *nested* in a finer one when each of its buckets is a union of the finer one's:
quarter and year in month, year in quarter, and every other unit in day. Week is nested only
in day: a week straddles months, quarters and years.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final, Literal, get_args

__all__ = ["NESTED", "TIME_UNITS", "TimeUnit", "answered_units", "bucket_count", "bucket_index", "bucket_start", "bucket_starts", "truncate"]

TimeUnit = Literal["day", "week", "month", "quarter", "year"]
TIME_UNITS: Final[tuple[TimeUnit, ...]] = get_args(TimeUnit)

# Each unit to the coarser units nested in it (module docstring).
NESTED: Final[dict[TimeUnit, tuple[TimeUnit, ...]]] = {
    "day": ("week", "month", "quarter", "year"), "week": (), "month": ("quarter", "year"), "quarter": ("year",),
    "year": (),
}
_MONTHS: Final = {"month": 1, "quarter": 3, "year": 12}
_DAYS: Final = {"day": 1, "week": 7}


def answered_units(listed: tuple[TimeUnit, ...]) -> tuple[TimeUnit, ...]:
    """The units ``listed`` and every unit nested in one of them, finest first (TIME_UNITS' order)."""
    answered = {nested for unit in listed for nested in (unit, *NESTED[unit])}
    return tuple(unit for unit in TIME_UNITS if unit in answered)


def truncate(unit: TimeUnit, moment: datetime) -> datetime:
    """``moment`` truncated to the start of its ``unit``, as PostgreSQL's date_trunc does."""
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if unit == "day":
        return day
    if unit == "week":
        return day - timedelta(days=day.weekday())
    if unit in _MONTHS:
        months = _MONTHS[unit]
        return day.replace(month=(day.month - 1) // months * months + 1, day=1)
    raise ValueError(f"unknown time unit {unit!r}")


def bucket_count(unit: TimeUnit, lo: datetime, hi: datetime) -> int:
    """How many ``unit`` buckets [lo, hi] touches (lo ≤ hi): date_trunc(lo) … date_trunc(hi)."""
    first, last = truncate(unit, lo), truncate(unit, hi)
    if unit in _MONTHS:
        months = (last.year - first.year) * 12 + last.month - first.month
        return months // _MONTHS[unit] + 1
    return (last - first).days // _DAYS[unit] + 1


def bucket_start(unit: TimeUnit, first: datetime, index: int) -> datetime:
    """The start of the ``index``-th ``unit`` bucket after the bucket that starts at ``first``.

    Years past 9999 cannot be written (``datetime`` ends there): ``OverflowError``/``ValueError``.
    """
    if unit in _MONTHS:
        months = first.month - 1 + index * _MONTHS[unit]
        return first.replace(year=first.year + months // 12, month=months % 12 + 1)
    return first + timedelta(days=index * _DAYS[unit])


def bucket_index(unit: TimeUnit, first: datetime, start: datetime) -> int:
    """Which bucket after the one starting at ``first`` starts at ``start`` (:func:`bucket_start`'s inverse)."""
    if unit in _MONTHS:
        return ((start.year - first.year) * 12 + start.month - first.month) // _MONTHS[unit]
    return (start - first).days // _DAYS[unit]


def bucket_starts(unit: TimeUnit, lo: datetime, hi: datetime) -> list[datetime]:
    """The start of every ``unit`` bucket [lo, hi] touches, in order (wall-clock)."""
    first = truncate(unit, lo)
    return [bucket_start(unit, first, i) for i in range(bucket_count(unit, lo, hi))]
