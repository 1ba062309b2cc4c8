"""The distinct tuples of date keys over one time column: a joint factor's cells (:mod:`rewriter.key_domain`).

Each key's value is a function of the day (:mod:`rewriter.day_arrays`). Over the days
``[start, end)`` that all the keys' buckets hold, the cells are the distinct tuples of values, in
order, each named by the first day that gives it, and no more than ``limit + 1`` of them (the
first ones in time). The work is bounded by the cells and one 400-year cycle, never by the
range (a statement's WHERE narrows it, so an analyst chooses it freely):

* a *periodic* key (month of year, day of week, ISO week, ...) repeats every 146097 days (400
  years, a whole number of weeks): its values over one cycle are computed once per process;
* every other key (the year, a bucket's start, a Sunday week, a date) never decreases in time,
  so the days split into *runs* on each of which these keys are constant, each run a tuple of
  its own: runs never share a cell, and there are no more runs than cells;
* a run's periodic tuples depend only on where it starts in the cycle and its length: each
  distinct (start in the cycle, length) is looked at once, and those tile the cycle (runs are
  cut at calendar boundaries, which repeat every cycle), plus the two clipped at the range's ends.

Without a non-periodic key there is one run, and one cycle of it gives every tuple.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property, lru_cache

import numpy as np

from policies.time_buckets import TimeUnit, bucket_start

from .date_parts import DatePart
from .day_arrays import TIME_VALUED, Days, key_values, month_ordinals
from .sized_cache import sized_cache

__all__ = ["CYCLE", "JointCells", "KeySpec", "joint_cells"]

KeySpec = tuple[TimeUnit, datetime, int, DatePart | None]  # unit, first bucket, number of buckets, part
Value = int | datetime
CYCLE = 146097  # days in 400 years
_PERIODIC: frozenset[DatePart | None] = frozenset({"month", "quarter", "day", "dow", "isodow", "doy", "week",
                                                   "weekday"})
_MONTHS = {"month": 1, "quarter": 3, "year": 12}
_EPOCH = 719163  # 1970-01-01, numpy's day 0


@dataclass(frozen=True, eq=False)
class JointCells:
    """The cells' tuples in order and each one's first day; when there are more than the limit
    (``exceeded``), only their number so far (``size``, the limit plus one), for the statement is
    refused. ``runs`` and ``looked_at`` say how much work they took (runs of the non-periodic
    keys, days read)."""

    values: tuple[tuple[Value, ...], ...]
    starts: tuple[datetime, ...]
    exceeded: bool
    size: int
    runs: int = 0
    looked_at: int = 0

    @cached_property
    def positions(self) -> dict[tuple[Value, ...], int]:
        """Each tuple's cell: built once, so that finding a group's cell does not scale with the cells."""
        return {values: i for i, values in enumerate(self.values)}


_EMPTY = JointCells((), (), False, 0)


def joint_cells(specs: tuple[KeySpec, ...], limit: int) -> JointCells:
    """The cells of keys over one column (module docstring), memoised: the range is the statement's."""
    return _cells(specs, limit)


@sized_cache(256, 1_700_000, lambda cells, *_: len(cells.values) + 1)
def _cells(specs: tuple[KeySpec, ...], limit: int) -> JointCells:
    if any(count <= 0 for _, _, count, _ in specs):
        return _EMPTY
    lo = max(first for _, first, _, _ in specs).toordinal()
    hi = min(_end(unit, first, count) for unit, first, count, _ in specs)
    if hi <= lo:
        return _EMPTY
    # Any injective numbering of their tuples will do: one table per set of keys, whatever their order.
    periodic = tuple(sorted({(unit, part) for unit, _, _, part in specs if part in _PERIODIC}))
    monotone = [(unit, part) for unit, _, _, part in specs if part not in _PERIODIC]
    if monotone:
        begins, ends = _runs(monotone, lo, hi, limit)
    else:
        begins, ends = np.array([lo]), np.array([min(hi, lo + CYCLE)])
    table, codes = _cycle_codes(periodic)
    # Runs by where they start in the cycle and how long they are.
    shapes, shape_of = np.unique((begins - 1) % CYCLE * (CYCLE + 1) + ends - begins, return_inverse=True)
    offsets, lengths = np.divmod(shapes, CYCLE + 1)
    shape = np.repeat(np.arange(len(shapes)), lengths)
    day = np.arange(len(shape)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    # Each shape's tuples, first day first (np.unique's index is the first occurrence).
    _, first = np.unique(shape * codes + table[(offsets[shape] + day) % CYCLE], return_index=True)
    first.sort()
    per_shape = np.bincount(shape[first], minlength=len(shapes))
    shape_begins = np.cumsum(per_shape) - per_shape
    counts = per_shape[shape_of]
    total = np.cumsum(counts)
    if total[-1] > limit:
        return JointCells((), (), True, limit + 1, runs=len(begins), looked_at=len(shape))
    run = np.repeat(np.arange(len(counts)), counts)
    rank = np.arange(len(run)) - np.repeat(total - counts, counts)
    days = begins[run] + day[first][shape_begins[shape_of[run]] + rank]
    columns = [key_values(unit, part, days) for unit, _, _, part in specs]
    order = np.lexsort(columns[::-1])
    listed = [_times(column[order]) if part in TIME_VALUED else column[order].tolist()
              for column, (_, _, _, part) in zip(columns, specs)]
    return JointCells(tuple(zip(*listed)), tuple(_times(days[order])), False, len(days),
                      runs=len(begins), looked_at=len(shape))


def _times(column: Days) -> list[datetime]:
    """Ordinals as midnights (numpy's conversion, for the cells can be a hundred thousand)."""
    times: list[datetime] = (column - _EPOCH).astype("datetime64[D]").astype("datetime64[us]").tolist()
    return times


def _end(unit: TimeUnit, first: datetime, count: int) -> int:
    """The day after the last bucket (a day past 9999-12-31 when it is the last)."""
    try:
        return bucket_start(unit, first, count).toordinal()
    except (OverflowError, ValueError):
        return datetime.max.toordinal() + 1


def _runs(keys: list[tuple[TimeUnit, DatePart | None]], lo: int, hi: int, limit: int) -> tuple[Days, Days]:
    """The first and the day after the last of each run of ``keys`` over ``[lo, hi)``: at most
    ``limit + 1`` of them, the first ones (each run is a cell at least, so the rest are past the limit)."""
    cuts = np.sort(np.concatenate([_changes(unit, part, lo, hi, limit + 2) for unit, part in keys]))
    cuts = cuts[np.diff(cuts, prepend=lo) != 0]  # all after lo
    if len(cuts) > limit + 1:
        cuts = cuts[:limit + 1]
        return np.concatenate([[lo], cuts[:-1]]), cuts
    return np.concatenate([[lo], cuts]), np.concatenate([cuts, [hi]])


def _changes(unit: TimeUnit, part: DatePart | None, lo: int, hi: int, n: int) -> Days:
    """The first ``n`` days in ``(lo, hi)`` on which a non-periodic key's value changes."""
    if part == "year":
        assert unit != "week", "weeks straddle years"
        unit = "year"
    elif part == "sunday_week" and unit == "day":
        first = lo - lo % 7 + 7
        return np.arange(first, min(hi, first + 7 * n), 7, dtype=np.int64)
    if unit == "day":
        return np.arange(lo + 1, min(hi, lo + 1 + n), dtype=np.int64)
    if unit == "week":
        first = lo - (lo - 1) % 7 + 7
        return np.arange(first, min(hi, first + 7 * n), 7, dtype=np.int64)
    width = _MONTHS[unit]
    start = datetime.fromordinal(lo)
    month = (start.year * 12 + start.month - 1) // width * width + width
    days = month_ordinals(month + width * np.arange(n, dtype=np.int64))
    return days[days < hi]


@lru_cache(maxsize=32)
def _cycle_codes(keys: tuple[tuple[TimeUnit, DatePart | None], ...]) -> tuple[Days, int]:
    """The periodic keys' tuple at each day of the cycle that starts on 0001-01-01, as a dense
    number, and how many numbers there are: computed once per set of keys, whatever the range."""
    code = np.zeros(CYCLE, dtype=np.int64)
    for unit, part in keys:
        values = key_values(unit, part, np.arange(1, CYCLE + 1, dtype=np.int64))  # each below 367
        if code.max() >= 1 << 40:  # renumber densely before the mixed radix could overflow
            _, code = np.unique(code, return_inverse=True)
        code = code * (int(values.max()) + 1) + values
    if code.max() >= 1 << 40:  # a run's shape times it must stay within int64
        _, code = np.unique(code, return_inverse=True)
    return code, int(code.max()) + 1
