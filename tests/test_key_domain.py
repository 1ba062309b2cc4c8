"""The cells of date keys that are functions of a bucket, computed from the declared range alone."""

from __future__ import annotations

import random
import time
from datetime import date, datetime, timedelta

import pytest

from policies.model import ColumnPolicy
from policies.tables import ColumnInfo
from policies.time_buckets import TimeUnit, bucket_count, bucket_start, truncate
from rewriter.date_parts import PART_UNITS, DatePart, part_value
from rewriter.group_keys import TIMESTAMP, GroupKey
from rewriter.joint_cells import CYCLE, KeySpec, joint_cells
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


# ---------------------------------------------------------------- the work, bounded by the cells

def _spec(unit: TimeUnit, part: DatePart | None, lo: datetime, hi: datetime) -> KeySpec:
    return unit, truncate(unit, lo), bucket_count(unit, lo, hi), part


def _end(unit: TimeUnit, first: datetime, count: int) -> datetime:
    try:
        return bucket_start(unit, first, count)
    except (OverflowError, ValueError):  # past 9999
        return datetime.max


def _walked(specs: tuple[KeySpec, ...], limit: int) -> tuple[list[tuple[object, ...]], list[datetime], bool]:
    """The definition, day by day in Python: each new tuple of the keys' values is a cell, named by its first day."""
    start = max(first for _, first, _, _ in specs)
    end = min(_end(unit, first, count) for unit, first, count, _ in specs)
    seen: dict[tuple[object, ...], datetime] = {}
    day = start
    while day < end and len(seen) <= limit:
        values = tuple(part_value(part, truncate(unit, day)) if part else truncate(unit, day)
                       for unit, _, _, part in specs)
        seen.setdefault(values, day)
        if day.date() == date.max:
            break
        day += timedelta(days=1)
    ordered = sorted(seen)
    return ordered, [seen[values] for values in ordered], len(seen) > limit


_SHAPES: list[tuple[tuple[TimeUnit, DatePart | None], ...]] = [
    (("day", "dow"),), (("day", "doy"),), (("week", "week"),), (("day", "sunday_week"),), (("day", "year"),),
    (("month", "year"), ("month", "month")), (("year", None), ("quarter", "quarter"), ("month", "month")),
    (("day", "year"), ("day", "dow")), (("month", "month"), ("week", "week")), (("day", "year"), ("day", "week")),
    (("quarter", None), ("day", "dow")), (("week", None), ("day", "sunday_week"), ("day", "isodow")),
    (("day", "date"), ("month", "month")), (("month", None), ("day", "day"), ("day", "weekday")),
    (("day", "year"), ("day", "doy"), ("week", "week")),
    tuple((unit, part) for part, units in PART_UNITS.items() for unit in units
          if part not in ("year", "sunday_week", "date")),  # every periodic key at once
]


@pytest.mark.parametrize("shape", _SHAPES, ids=lambda shape: ",".join(f"{part}-{unit}" for unit, part in shape))
def test_the_cells_are_the_day_by_day_walk_s_tuples_and_first_days(shape):
    rng = random.Random(str(shape))
    for i in range(16):
        lo = datetime.fromordinal(rng.choice([1, 1000, 700_000, 3_640_000]) + rng.randrange(6000))
        hi = min(lo + timedelta(days=rng.choice([0, 5, 40, 400, 3000])), datetime(9999, 12, 31))
        if i < 2:  # the ends of the datetime range
            lo, hi = (datetime(1, 1, 1), datetime(1, 1, 1) + timedelta(days=rng.randrange(2000))) if i == 0 \
                else (datetime(9999, 12, 31) - timedelta(days=rng.randrange(2000)), datetime(9999, 12, 31))
        specs = tuple(_spec(unit, part, lo, hi) for unit, part in shape)
        limit = rng.choice([3, 50, 1000, 100_000])
        values, starts, exceeded = _walked(specs, limit)
        cells = joint_cells(specs, limit)
        assert cells.exceeded == exceeded and cells.size == len(values)
        if not exceeded:
            assert list(cells.values) == values and list(cells.starts) == starts


@pytest.mark.parametrize("shape, lo, hi, limit, size", [
    ((("day", "doy"),), datetime(1, 1, 1), datetime(9999, 12, 31), 100_000, 366),
    ((("day", "year"), ("day", "dow")), datetime(1, 1, 1), datetime(9999, 12, 31), 100_000, 7 * 9999),
    ((("month", "month"), ("week", "week")), datetime(2000, 1, 1), datetime(2399, 12, 31), 100_000, None),
    ((("day", "sunday_week"),), datetime(1, 1, 1), datetime(9999, 12, 31), 100_000, 100_001),
    ((("day", "date"),), datetime(1, 1, 1), datetime(9999, 12, 31), 100_000, 100_001),
    ((("quarter", None), ("day", "dow")), datetime(1, 1, 1), datetime(9999, 12, 31), 100_000, 100_001),
])
def test_the_work_is_bounded_by_the_cells_and_one_cycle_not_by_the_range(shape, lo, hi, limit, size):
    cells = joint_cells(tuple(_spec(unit, part, lo, hi) for unit, part in shape), limit)
    assert size is None or cells.size == size
    # Days read: one 400-year cycle, and the two runs the range's ends clip; runs: no more than the cells.
    assert cells.looked_at <= CYCLE + 2 * 366 and cells.runs <= limit + 1


def test_a_statement_over_more_cells_than_the_limit_builds_none_of_them():
    cells = joint_cells((_spec("day", "date", datetime(1, 1, 1), datetime(9999, 12, 31)),), 100_000)
    assert cells.exceeded and cells.size == 100_001 and cells.values == () == cells.starts


def test_sunday_weeks_from_the_first_day_of_year_1_have_cells_and_each_row_finds_one():
    key = _key("day", "sunday_week", datetime(1, 1, 1), datetime(1, 2, 1))
    domain = key_domain((key,), 1000)
    assert [c[0] for c in domain.labels()][:2] == ["0001-01-01 00:00:00", "0001-01-07 00:00:00"]
    assert domain.cell([key.cell_of(b"0001-01-03 00:00:00")]) == 0


def test_finding_a_group_s_cell_does_not_scale_with_the_cells():
    keys = (_key("day", "year", datetime(1, 1, 1), datetime(9999, 12, 31)),
            _key("day", "dow", datetime(1, 1, 1), datetime(9999, 12, 31)))
    domain = key_domain(keys, 100_000)
    assert domain.size == 7 * 9999
    days = [f"{year:04d}-03-{day:02d}".encode() for year in range(1, 9999, 10) for day in range(1, 11)]
    began = time.process_time()  # CPU time: a loaded machine's wall clock measures the machine
    found = [domain.cell([key.cell_of(day) for key in keys]) for day in days]
    assert time.process_time() - began < 1.0  # hashing the 69993 tuples for each group: ~1 ms a group
    assert None not in found and len(set(found)) == 1000 * 7


def test_date_truncs_over_one_column_are_their_tuples_and_each_bucket_pair_finds_its_cell():
    keys = (_key("year"), _key("month"))
    domain = key_domain(keys, 1000)
    cells = [tuple(datetime.fromisoformat(label) for label in cell) for cell in domain.labels()]
    assert len(cells) == 16 and all(year == truncate("year", month) for year, month in cells)  # not 3 × 16
    for i, (year, month) in enumerate(cells):
        assert domain.cell([keys[0].cell_of(year.date().isoformat().encode()),
                            keys[1].cell_of(month.date().isoformat().encode())]) == i
    impossible = [keys[0].cell_of(b"2022-01-01"), keys[1].cell_of(b"2023-07-01")]
    assert domain.cell(impossible) is None


def test_weeks_by_months_have_a_cell_per_week_and_month_it_meets():
    keys = (_key("month"), _key("week"))
    domain = key_domain(keys, 1000)
    cells = [tuple(datetime.fromisoformat(label) for label in cell) for cell in domain.labels()]
    # the days both keys' buckets hold: the week of Nov 15, 2022 … the end of the week of Feb 10, 2024
    first, end = truncate("week", _LO), truncate("week", _HI) + timedelta(days=7)
    days = [first + timedelta(days=n) for n in range((end - first).days)]
    assert cells == sorted({(truncate("month", day), truncate("week", day)) for day in days})


def test_date_truncs_over_different_columns_stay_their_product():
    other = ColumnInfo("ts2", TIMESTAMP, -1, 2, _COLUMN.policy)
    month = _key("month")
    keys = (_key("quarter"), GroupKey(other, "time", TIMESTAMP, unit="month", first=month.first, count=month.count))
    assert key_domain(keys, 1000).size == 6 * 16
