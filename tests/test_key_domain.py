"""The cells of date keys that are functions of a bucket, computed from the declared range alone."""

from __future__ import annotations

from datetime import date, datetime

import pytest

from policies.model import ColumnPolicy
from policies.tables import ColumnInfo
from policies.time_buckets import TimeUnit, bucket_count, truncate
from rewriter.date_parts import DatePart, part_value
from rewriter.group_keys import TIMESTAMP, GroupKey
from rewriter.key_domain import key_domain

_COLUMN = ColumnInfo("ts", TIMESTAMP, -1, 1, ColumnPolicy(bounds=("2022-11-15", "2024-02-10"), group_by=True))
_LO, _HI = datetime(2022, 11, 15), datetime(2024, 2, 10)


def _key(unit: TimeUnit, part: DatePart | None = None, lo: datetime = _LO, hi: datetime = _HI) -> GroupKey:
    return GroupKey(_COLUMN, "time", TIMESTAMP, unit=unit, first=truncate(unit, lo), count=bucket_count(unit, lo, hi),
                    part=part)


@pytest.mark.parametrize("part, unit, values", [
    ("month", "month", list(range(1, 13))),
    ("quarter", "month", [1, 2, 3, 4]),
    ("quarter", "quarter", [1, 2, 3, 4]),
    ("dow", "day", list(range(7))),
    ("isodow", "day", list(range(1, 8))),
    ("day", "day", list(range(1, 32))),
    ("doy", "day", list(range(1, 367))),  # 2024 is a leap year; its 41 days of the range reach no day 366
])
def test_a_date_part_alone_has_one_cell_per_value_the_range_gives_in_order(part, unit, values):
    domain = key_domain((_key(unit, part),), 1000)
    labels = [datetime.fromisoformat(cell[0]) for cell in domain.labels()]
    got = [part_value(part, label) for label in labels]
    expected = [v for v in values if part != "doy" or v <= 365]
    assert got == expected and domain.size == len(expected)


def test_a_part_over_a_narrow_range_has_only_the_values_it_gives():
    lo, hi = datetime(2023, 3, 20), datetime(2023, 5, 2)
    domain = key_domain((_key("month", "month", lo, hi),), 1000)
    assert [part_value("month", datetime.fromisoformat(c[0])) for c in domain.labels()] == [3, 4, 5]


def test_keys_over_one_column_are_their_tuples_and_each_group_finds_its_cell():
    keys = (_key("year"), _key("quarter", "quarter"), _key("month", "month"))
    domain = key_domain(keys, 1000)
    cells = [tuple(datetime.fromisoformat(label) for label in cell) for cell in domain.labels()]
    assert len(cells) == 16  # Nov 2022 … Feb 2024, not 3 × 4 × 12
    for i, (year, quarter, month) in enumerate(cells):
        assert (part_value("quarter", quarter), part_value("month", month)) == (
            (month.month - 1) // 3 + 1, month.month) and year.year == month.year
        coordinates = [keys[0].cell_of(year.date().isoformat().encode()), keys[1].cell_of(
            truncate("quarter", quarter).date().isoformat().encode()), keys[2].cell_of(month.date().isoformat().encode())]
        assert domain.cell(coordinates) == i


def test_a_category_beside_date_keys_multiplies_their_tuples():
    category = ColumnInfo("sex", 25, -1, 2, ColumnPolicy(categories=("a", "b"), group_by=True))
    keys = (GroupKey(category, "category", 25), _key("day", "dow"))
    assert key_domain(keys, 1000).size == 2 * 7


def test_too_many_tuples_stop_the_walk_past_the_limit():
    domain = key_domain((_key("day", "date"),), 100)
    assert domain.exceeded and domain.size == 101


def test_a_periodic_part_over_thousands_of_years_walks_one_cycle():
    lo, hi = datetime(2000, 2, 29), datetime(9999, 12, 31)
    domain = key_domain((_key("day", "dow", lo, hi),), 1000)
    assert domain.size == 7 and [c[0] for c in domain.labels()][0] == "2000-03-05 00:00:00"  # a Sunday
    assert date(2000, 3, 5).isoweekday() == 7


def test_sunday_weeks_from_the_first_day_of_year_1_have_cells_and_each_row_finds_one():
    key = _key("day", "sunday_week", datetime(1, 1, 1), datetime(1, 2, 1))
    domain = key_domain((key,), 1000)
    assert [c[0] for c in domain.labels()][:2] == ["0001-01-01 00:00:00", "0001-01-07 00:00:00"]
    assert domain.cell([key.cell_of(b"0001-01-03 00:00:00")]) == 0
