"""Date keys that are functions of a time bucket: the shapes BI tools group by, and their values.

A policy opts units of a time column in (``group_by``: day, week, month, quarter, year). Beside
``DATE_TRUNC(unit, col)`` itself, a GROUP BY item whose value is a function of the bucket of a
unit the column opts in is answered (docs/policy.md): each row is still in at most one cell,
and the cells are a coarsening of the buckets', so the histogram releases no more than the
``DATE_TRUNC`` one dpproxy already answers. The shapes recognised here, each with the units
whose bucket decides it (the first one the column opts in is used):

* a date part "of a period": ``EXTRACT(field FROM col)`` or ``date_part('field', col)``, maybe
  wrapped in Tableau's ``TRUNC(...)``, a cast to an integer or numeric type, and (Metabase's day
  of week, ``CAST(extract(dow from col) AS integer) + 1``) plus or minus an integer literal:
  ``month`` (month), ``quarter`` (quarter, month), ``day``/``dow``/``isodow``/``doy`` (day),
  ``week``, the ISO week number (week, day); and Metabase's day of week counted from a first
  day other than Sunday, ``CASE WHEN mod(E, 7) = 0 THEN 7 ELSE mod(E, 7) END`` with ``E`` the
  day of week plus an integer (``weekday``: day);
* weeks that start on Sunday, a function of the day: Metabase's ``date_trunc('week', col +
  INTERVAL '1 day') + INTERVAL '-1 day'`` and Tableau's ``DATE_TRUNC('day', CAST(col AS DATE)) +
  (-EXTRACT(DOW FROM col) * INTERVAL '1 DAY')``, maybe cast to a date;
* the date of a time, ``CAST(col AS DATE)`` (Tableau's *Exact date*), the day's bucket.

``col`` is a column, maybe cast to ``date``, ``timestamp`` or ``timestamptz`` (:func:`time_source`).
The year (``EXTRACT(YEAR FROM col)``) is one to one with the year's bucket and is a plain time
key (:mod:`rewriter.group_keys`) on a column that answers ``year``: one that lists it, or a unit
it is nested in (quarter, month, day; ``policies.time_buckets``). On a column that lists only
``week`` (whose buckets straddle years) the ``year`` part is refused with advice.

:func:`part_value` computes a part from a bucket's start (a wall-clock time, as ``date_trunc``
gives it in the session's TimeZone) as PostgreSQL computes it from any time in that bucket:
which buckets share a cell is decided from the policy and the statement alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlglot import exp

from policies.time_buckets import TimeUnit

from .sql_text import operator

__all__ = ["DatePart", "PART_UNITS", "PartShape", "answered_parts", "date_part_shape", "part_sql", "part_value",
           "time_source"]

DatePart = Literal["year", "month", "quarter", "day", "dow", "isodow", "doy", "week", "weekday", "sunday_week", "date"]

# The units whose bucket decides each part, preferred first.
PART_UNITS: dict[DatePart, tuple[TimeUnit, ...]] = {
    "year": ("year", "quarter", "month", "day"), "month": ("month",), "quarter": ("quarter", "month"), "day": ("day",), "dow": ("day",), "isodow": ("day",),
    "doy": ("day",), "week": ("week", "day"), "weekday": ("day",), "sunday_week": ("day",), "date": ("day",),
}
def answered_parts(units: tuple[TimeUnit, ...]) -> tuple[DatePart, ...]:
    """The parts a column answers as a GROUP BY of their own when it answers ``units`` (listed
    or nested, ``ColumnPolicy.time_units``): each whose bucket one of them decides, the year
    among them (its key is the year's bucket). What ``SHOW dpproxy.columns`` and the GROUP BY
    hint list, so that each lists exactly what is answered. ``weekday`` is left out: it is
    Metabase's spelling of the day of week counted from another first day, answered where
    ``dow`` is and with as many cells."""
    return tuple(part for part, deciding in PART_UNITS.items()
                 if part != "weekday" and any(unit in units for unit in deciding))


# EXTRACT's (and date_part's) spellings of the parts above (PostgreSQL's own abbreviations).
_FIELDS: dict[str, DatePart] = {
    **dict.fromkeys(("MONTH", "MONTHS", "MON", "MONS"), "month"),
    **dict.fromkeys(("QUARTER", "QTR"), "quarter"),
    **dict.fromkeys(("DAY", "DAYS", "D"), "day"),
    "DOW": "dow", "ISODOW": "isodow", "DOY": "doy",
    **dict.fromkeys(("WEEK", "WEEKS", "W"), "week"),
}
_NUMBER_CASTS = frozenset({exp.DataType.Type.INT, exp.DataType.Type.BIGINT, exp.DataType.Type.SMALLINT,
                           exp.DataType.Type.DECIMAL})
_CAST_NAMES = {exp.DataType.Type.DATE: "date", exp.DataType.Type.TIMESTAMP: "timestamp",
               exp.DataType.Type.TIMESTAMPTZ: "timestamptz"}


@dataclass(frozen=True)
class PartShape:
    """A recognised date key: its column, the time type it is cast to (None: not cast), its part,
    and the integer added to it (Metabase's ``+ 1``; part of what the key is, not of its cells)."""

    column: exp.Column
    cast: str | None
    part: DatePart
    shift: int = 0


def time_source(node: exp.Expression | None) -> tuple[exp.Column, str | None] | None:
    """A time key's column and the time type it is cast to (None: not cast), or None if ``node``
    is neither a column nor one cast to ``date``, ``timestamp`` or ``timestamptz`` (no typmod:
    ``timestamp(0)`` rounds)."""
    node = _bare(node)
    if isinstance(node, exp.Column):
        return node, None
    if isinstance(node, exp.Cast) and isinstance(_bare(node.this), exp.Column) and node.to.this in _CAST_NAMES \
            and not node.to.expressions:
        column = _bare(node.this)
        assert isinstance(column, exp.Column)
        return column, _CAST_NAMES[node.to.this]
    return None


def date_part_shape(item: exp.Expression) -> PartShape | None:
    """The date key ``item`` is written as (module docstring), or None."""
    node = _bare(item)
    week = _sunday_week(node)
    if week is not None:
        return week
    if isinstance(node, exp.Cast) and not node.to.expressions and node.to.this == exp.DataType.Type.DATE:
        source = time_source(node.this)
        if source is not None and source[1] is None:
            return PartShape(source[0], None, "date")
    weekday = _weekday(node)
    if weekday is not None:
        return weekday
    node, shift = _shifted(node)
    if isinstance(node, exp.Cast) and node.to.this in _NUMBER_CASTS and not node.to.expressions:
        node = _bare(node.this)
    if isinstance(node, exp.Trunc) and node.args.get("decimals") is None:
        node = _bare(node.this)
    part = _extracted(node)
    if part is None or not isinstance(node, exp.Extract):
        return None
    source = time_source(node.expression)
    return PartShape(source[0], source[1], part, shift) if source is not None else None


def part_value(part: DatePart, start: datetime) -> int | datetime:
    """The value of ``part`` for every time in the bucket that starts at ``start`` (a day's start
    or a longer unit's), as PostgreSQL's EXTRACT gives it; a Sunday week as the Sunday it starts
    on, a date as its day. The Sunday week of 0001-01-01 … 06 starts in 1 BC, which ``datetime``
    cannot hold: it is named by 0001-01-01 (no other Sunday week is), not an error for a row."""
    if part == "year":
        return start.year
    if part == "month":
        return start.month
    if part == "quarter":
        return (start.month - 1) // 3 + 1
    if part == "day":
        return start.day
    if part in ("dow", "weekday"):
        return start.isoweekday() % 7
    if part == "isodow":
        return start.isoweekday()
    if part == "doy":
        return start.timetuple().tm_yday
    if part == "week":
        return start.isocalendar()[1]
    if part == "sunday_week":
        return start - timedelta(days=min(start.isoweekday() % 7, start.toordinal() - 1))
    return start


# The to_char field that prints each part that is a number of its bucket, one to one with the part's
# value (weekday's cells are the day of week's; 'D' counts from Sunday = 1 where EXTRACT's dow does from 0).
_PRINTED: dict[DatePart, str] = {"year": "YYYY", "month": "MM", "quarter": "Q", "day": "DD", "dow": "D",
                                 "weekday": "D", "isodow": "ID", "doy": "DDD", "week": "IW"}


def part_sql(part: DatePart | None, bucket: str) -> str:
    """The SQL of a value that tells ``part``'s cells apart, of ``bucket`` (a key's ``date_trunc``
    of a row, as the backend groups by it): equal for two buckets exactly where :func:`part_value`
    of their starts is. A number part is the bucket's ``to_char`` field that prints it, one to one
    with what EXTRACT gives and :func:`part_value` computes; a Sunday week is the (Monday) week of
    the day after, which holds Sunday to Saturday; a date, or a key without a part, is the bucket
    itself. None of them fails: the bucket is a time inside the declared range, and a day added to
    it stays far inside its type's.
    """
    if part in _PRINTED:
        return f"pg_catalog.to_char({bucket}, '{_PRINTED[part]}')"
    if part == "sunday_week":
        after = operator(bucket, "+", "CAST('1 day' AS pg_catalog.interval)")
        return f"pg_catalog.date_trunc('week', {after})"
    return bucket


def _bare(node: exp.Expression | None) -> exp.Expression | None:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _extracted(node: exp.Expression | None) -> DatePart | None:
    if not isinstance(node, exp.Extract) or not isinstance(node.this, (exp.Var, exp.Literal)):
        return None
    return _FIELDS.get(node.this.name.upper())


def _shifted(node: exp.Expression | None) -> tuple[exp.Expression | None, int]:
    """``node`` without the integer literals added to it or subtracted from it, and their sum."""
    total = 0
    while isinstance(node, (exp.Add, exp.Sub)):
        amount = _integer(node.expression)
        if amount is None:
            break
        total += amount if isinstance(node, exp.Add) else -amount
        node = _bare(node.this)
    return node, total


def _weekday(node: exp.Expression | None) -> PartShape | None:
    """Metabase's day of week from another first day (module docstring): a bijection of the day of week."""
    if not isinstance(node, exp.Case) or node.this is not None or len(node.args.get("ifs") or []) != 1:
        return None
    branch = node.args["ifs"][0]
    condition, then, otherwise = _bare(branch.this), _bare(branch.args.get("true")), _bare(node.args.get("default"))
    if not (isinstance(condition, exp.EQ) and _integer(condition.expression) == 0 and _integer(then) == 7):
        return None
    remainder = _bare(condition.this)
    if not (isinstance(remainder, exp.Mod) and isinstance(otherwise, exp.Mod) and remainder == otherwise
            and _integer(remainder.expression) == 7):
        return None
    inner = date_part_shape(remainder.this)
    if inner is None or inner.part != "dow":
        return None
    return PartShape(inner.column, inner.cast, "weekday", inner.shift)


def _integer(node: exp.Expression | None) -> int | None:
    node = _bare(node)
    negative = isinstance(node, exp.Neg)
    if negative:
        assert node is not None
        node = _bare(node.this)
    if not (isinstance(node, exp.Literal) and not node.is_string and node.this.isdigit() and len(node.this) <= 6):
        return None
    return -int(node.this) if negative else int(node.this)


def _sunday_week(node: exp.Expression | None) -> PartShape | None:
    """Metabase's or Tableau's Sunday week of a column (module docstring), maybe cast to a date."""
    if isinstance(node, exp.Cast) and not node.to.expressions and node.to.this == exp.DataType.Type.DATE:
        node = _bare(node.this)
    if not isinstance(node, exp.Add):
        return None
    left, right = _bare(node.this), _bare(node.expression)
    # Metabase: date_trunc('week', col + INTERVAL '1 day') + INTERVAL '-1 day'
    if isinstance(left, (exp.TimestampTrunc, exp.DateTrunc)) and _unit(left) in ("WEEK", "WEEKS", "W") \
            and left.args.get("zone") is None and _days(right) == -1:
        inner = _bare(left.this)
        if isinstance(inner, exp.Add) and _days(inner.expression) == 1:
            source = time_source(inner.this)
            if source is not None:
                return PartShape(source[0], source[1], "sunday_week")
    # Tableau: DATE_TRUNC('day', CAST(col AS DATE)) + (-EXTRACT(DOW FROM col) * INTERVAL '1 DAY')
    if isinstance(left, (exp.TimestampTrunc, exp.DateTrunc)) and _unit(left) in ("DAY", "DAYS", "D") \
            and left.args.get("zone") is None and isinstance(right, exp.Mul) and _days(right.expression) == 1:
        day, offset = time_source(left.this), _bare(right.this)
        if isinstance(offset, exp.Neg) and _extracted(_bare(offset.this)) == "dow":
            extract = _bare(offset.this)
            assert isinstance(extract, exp.Extract)
            of = time_source(extract.expression)
            if day is not None and of is not None and day[0].name == of[0].name and day[0].table == of[0].table:
                return PartShape(day[0], day[1], "sunday_week")
    return None


def _unit(node: exp.Expression) -> str | None:
    unit = node.args.get("unit")
    return unit.name.upper() if isinstance(unit, (exp.Var, exp.Literal)) else None


def _days(node: exp.Expression | None) -> int | None:
    """The number of days of ``INTERVAL 'n day'`` (any sign, singular or plural), or None."""
    node = _bare(node)
    if not isinstance(node, exp.Interval):
        return None
    value, unit = node.this, node.args.get("unit")
    text = value.name.strip() if isinstance(value, exp.Literal) else None
    if text is None:
        return None
    if unit is None:
        words = text.split()
        if len(words) != 2:
            return None
        text, unit_name = words
    else:
        unit_name = unit.name
    if unit_name.upper() not in ("DAY", "DAYS"):
        return None
    try:
        return int(text)
    except ValueError:
        return None
