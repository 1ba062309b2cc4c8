"""A date key's values over arrays of days, computed with numpy: :func:`rewriter.date_parts.part_value` vectorised.

Days are proleptic Gregorian ordinals (``date.toordinal()``: 0001-01-01 is 1), as int64 arrays.
A key's value at a day is its part of the start of the day's bucket of its unit
(``part_value(part, truncate(unit, day))``); a value that is a time (a bucket's start, a Sunday
week, a date) is given as the ordinal of its day. ``part_value`` stays the definition: the tests
check these against it day by day over a 400-year cycle and the ends of the datetime range.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from policies.time_buckets import TimeUnit

from .date_parts import DatePart

__all__ = ["Days", "TIME_VALUED", "civil", "key_values", "month_ordinals", "unit_starts"]

Days = npt.NDArray[np.int64]

# Parts whose value is a time (an ordinal here), as a key without a part is.
TIME_VALUED: frozenset[DatePart | None] = frozenset({None, "sunday_week", "date"})
_BEFORE_MONTH = np.array([0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334], dtype=np.int64)
_MONTHS = {"month": 1, "quarter": 3, "year": 12}


def civil(days: Days) -> tuple[Days, Days, Days]:
    """Each day's year, month and day of month (Howard Hinnant's ``civil_from_days``)."""
    z = days - 1 + 306  # days since 0000-03-01
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    day_of_year = doe - (365 * yoe + yoe // 4 - yoe // 100)  # from March 1st
    mp = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * mp + 2) // 5 + 1
    month = np.where(mp < 10, mp + 3, mp - 9)
    year = yoe + era * 400 + (month <= 2)
    return year, month, day


def _year_start(year: Days) -> Days:
    before = year - 1
    return before * 365 + before // 4 - before // 100 + before // 400 + 1


def month_ordinals(months: Days) -> Days:
    """The first day of each month, given as ``year * 12 + month - 1``."""
    year, month = months // 12, months % 12
    leap = (year % 4 == 0) & ((year % 100 != 0) | (year % 400 == 0))
    return _year_start(year) + _BEFORE_MONTH[month] + (leap & (month >= 2))


def unit_starts(unit: TimeUnit, days: Days) -> Days:
    """The first day of each day's ``unit`` bucket (``truncate``)."""
    if unit == "day":
        return days
    if unit == "week":
        return days - (days - 1) % 7
    year, month, _ = civil(days)
    width = _MONTHS[unit]
    return month_ordinals(year * 12 + (month - 1) // width * width)


def key_values(unit: TimeUnit, part: DatePart | None, days: Days) -> Days:
    """A key's value at each of ``days`` (module docstring)."""
    starts = unit_starts(unit, days)
    if part is None or part == "date":
        return starts
    if part in ("dow", "weekday"):
        return starts % 7
    if part == "isodow":
        return (starts - 1) % 7 + 1
    if part == "sunday_week":
        return np.maximum(starts - starts % 7, 1)  # part_value's 0001-01-01 for 1 BC's Sunday
    if part == "week":
        thursday = starts - (starts - 1) % 7 + 3
        return (thursday - _year_start(civil(thursday)[0])) // 7 + 1
    year, month, day = civil(starts)
    if part == "year":
        return year
    if part == "month":
        return month
    if part == "quarter":
        return (month - 1) // 3 + 1
    if part == "day":
        return day
    assert part == "doy", part
    return starts - _year_start(year) + 1
