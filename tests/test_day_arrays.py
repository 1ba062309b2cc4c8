"""The vectorised date keys (rewriter.day_arrays) are part_value, day for day."""

from __future__ import annotations

from datetime import date, datetime

import numpy as np
import pytest

from policies.time_buckets import TIME_UNITS, TimeUnit, truncate
from rewriter.date_parts import PART_UNITS, DatePart, part_value
from rewriter.day_arrays import key_values
from rewriter.joint_cells import CYCLE

_KEYS: list[tuple[TimeUnit, DatePart | None]] = [
    *((unit, part) for part, units in PART_UNITS.items() for unit in units),
    *((unit, None) for unit in TIME_UNITS),
]
_LAST = date.max.toordinal()


def _expected(unit: TimeUnit, part: DatePart | None, ordinal: int) -> int:
    start = truncate(unit, datetime.fromordinal(ordinal))
    value = start if part is None else part_value(part, start)
    return value.toordinal() if isinstance(value, datetime) else value


def _check(unit: TimeUnit, part: DatePart | None, days: np.ndarray) -> None:
    got = key_values(unit, part, days).tolist()
    expected = [_expected(unit, part, ordinal) for ordinal in days.tolist()]
    assert got == expected


@pytest.mark.parametrize("unit, part", _KEYS, ids=[f"{part}-{unit}" for unit, part in _KEYS])
def test_each_key_s_vectorised_value_is_part_value_on_every_day_of_a_400_year_cycle(unit, part):
    _check(unit, part, np.arange(date(2000, 1, 1).toordinal(), date(2000, 1, 1).toordinal() + CYCLE, dtype=np.int64))


@pytest.mark.parametrize("unit, part", _KEYS, ids=[f"{part}-{unit}" for unit, part in _KEYS])
def test_each_key_s_vectorised_value_is_part_value_at_the_ends_of_the_datetime_range(unit, part):
    _check(unit, part, np.concatenate([np.arange(1, 800), np.arange(_LAST - 800, _LAST + 1)]).astype(np.int64))


def test_the_sunday_week_of_year_1_s_first_days_is_a_time_not_an_error():
    assert {part_value("sunday_week", datetime(1, 1, day)) for day in range(1, 7)} == {datetime(1, 1, 1)}
    assert part_value("sunday_week", datetime(1, 1, 7)) == datetime(1, 1, 7)
