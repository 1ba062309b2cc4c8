"""GROUP BY keys over declared domains: the cells of a DP histogram, fixed before any row is read.

A protected table answers ``GROUP BY`` only over keys the policy opts in (``group_by``,
docs/policy.md), each with a domain known in advance:

* ``category``: ``GROUP BY col`` on a column with declared ``categories``; one cell per
  category, plus the policy's ``other`` cell for every row whose value is NULL or undeclared
  (without ``other`` such rows are in no cell);
* ``integer``: ``GROUP BY col`` on an integer column with bounds [lo, hi]; one cell per
  integer in them, rows outside (and NULL) in no cell;
* ``time``: ``DATE_TRUNC('<unit>', col)`` on a date/timestamp column with a declared time
  range, the unit listed or nested in a listed one (``policies.time_buckets``: a quarter is
  three months); one cell per bucket the range touches, rows outside it (and NULL) in no cell;
* ``bin``: ``width_bucket(col, lo, hi, n)`` on a bounded numeric column; the n + 2 cells
  0 … n + 1 that ``width_bucket`` can return for any value, NULL and NaN in no cell;
* ``floor``: Metabase's numeric binning ``floor((col - A) / W) * W + A`` on a bounded numeric
  column; one cell per bin index ``floor((col - A) / W)`` a value within the bounds can have,
  rows outside them, NULL and NaN in no cell (:mod:`rewriter.floor_bins`);
* ``epoch``: Grafana's ``floor(extract(epoch from col)/N)*N`` on a time column whose policy opts
  ``day`` in, N whole days in seconds; one cell per N-second bucket (counted from 1970-01-01
  UTC) the declared range touches, read in UTC (:mod:`rewriter.epoch_buckets`).

The cells, their keys and their order are a function of the policy and the statement's text
only, never of the data, so that which rows exist cannot show in which keys come back. Every
row of the table falls in at most one cell (the keys partition the rows), which is what lets
each cell be noised with the column's whole share of ε (parallel composition; the argument
is in docs/mechanisms.md).

The backend groups the rows by a per-row expression (:meth:`GroupKey.group_sql`) and reports,
per group, a value that names the group's cell (:meth:`GroupKey.cell_sql`,
:meth:`GroupKey.cell_of`). Neither can raise an error on any row: they are comparisons with
literals, ``date_trunc`` and ``width_bucket`` evaluated only for rows inside the declared
range or finite, and ``to_char`` of a group's bucket. The grouping expression takes at most
:attr:`GroupKey.grouped_values` values whatever the rows hold (a category key groups by the
row's cell, never by its raw value), so the backend's hash table of groups is bounded by the
policy and the statement, not by the rows (rewriter/sort_memory.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from decimal import Decimal
from datetime import datetime
from typing import Literal

from sqlglot import exp

from policies.errors import SQLSTATE, Refusal
from policies.tables import ColumnInfo
from policies.time_buckets import TimeUnit, bucket_count, bucket_index, bucket_start, truncate

from .constants import NotFoldable, qualified_constant
from .date_hints import date_shape_advice, part_advice
from .date_parts import PART_UNITS, DatePart, PartShape, answered_parts, date_part_shape, part_value, time_source
from .epoch_buckets import DAY_SECONDS, bucket_of, epoch_bucket, epoch_seconds
from .epoch_buckets import bucket_start as epoch_start
from .floor_bins import BinError, FloorBin, floor_bin, floor_shape
from .raw_equality import HASHED_LIST, RAW_TYPES
from .scope import Scope
from .text_bounds import column_sql
from .sql_text import literal, operator, short_text
from .types import INT4, INTEGER_TYPES, NUMERIC, NUMERIC_TYPES

__all__ = ["DATE", "GroupKey", "KeyRange", "TIMESTAMP", "TIMESTAMPTZ", "column_key_count", "group_key", "key_form",
           "key_over_columns", "key_ranges", "year_extract"]

DATE, TIMESTAMP, TIMESTAMPTZ = 1082, 1114, 1184
TIME_TYPES = frozenset({DATE, TIMESTAMP, TIMESTAMPTZ})

KeyKind = Literal["category", "integer", "time", "bin", "epoch", "floor"]

# date_trunc's spellings of the units a policy may opt in (PostgreSQL's own abbreviations,
# as sqlglot reads them), each to its unit.
_UNIT_SPELLINGS: dict[str, TimeUnit] = {
    **dict.fromkeys(("DAY", "DAYS", "D"), "day"),
    **dict.fromkeys(("WEEK", "WEEKS", "W"), "week"),
    **dict.fromkeys(("MONTH", "MONTHS", "MON", "MONS"), "month"),
    **dict.fromkeys(("QUARTER", "QTR"), "quarter"),
    **dict.fromkeys(("YEAR", "YEARS", "Y", "YR", "YRS"), "year"),
}
_KEY_TEXT = "YYYY-MM-DD"
_WIDTHS: dict[TimeUnit, str] = {"day": "1 day", "week": "7 days", "month": "1 month", "quarter": "3 months", "year": "1 year"}
_LABEL_CASTS = frozenset({exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR})  # without a typmod: one to one
_YEAR_CASTS = frozenset({exp.DataType.Type.INT, exp.DataType.Type.BIGINT, exp.DataType.Type.DECIMAL})
_TIME_CASTS = frozenset({exp.DataType.Type.DATE, exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPTZ})  # to_char's format of a bucket's start: its date, in any DateStyle
_CAST_NAMES = {exp.DataType.Type.DATE: "date", exp.DataType.Type.TIMESTAMP: "timestamp",
               exp.DataType.Type.TIMESTAMPTZ: "timestamptz"}


@dataclass(frozen=True)
class GroupKey:
    """One GROUP BY key: its cells (a declared domain) and how the backend finds a row's cell.

    ``result_type_oid`` is the type PostgreSQL gives the grouping expression (the column's
    type; ``timestamp``/``timestamptz`` for ``date_trunc``; ``integer`` for ``width_bucket``).
    ``first``/``count`` are a time key's first bucket and number of buckets; ``bins`` are
    ``width_bucket``'s bounds and bucket count, ``bin_type`` the overload PostgreSQL resolves
    the call to (``double precision`` unless the column or a bound is ``numeric``).
    An ``epoch`` key's ``first`` is its first bucket's start (UTC) and ``seconds`` its width.
    A ``floor`` key's ``floor`` holds its bin indices and the backend's arithmetic; its cells are
    released as the indices (``result_type_oid`` the type of ``floor(...)``), of which the outer
    statement computes ``* W + A``.
    A time key's ``cast`` is the type (``date``, ``timestamp``, ``timestamptz``) the column is
    cast to inside ``date_trunc`` (Tableau's ``DATE_TRUNC('MONTH', CAST(col AS DATE))``), or None.
    A time key with a ``part`` is a function of its buckets (:mod:`rewriter.date_parts`): the
    backend still reports a row's bucket, and its cells are the distinct values the part takes
    (:mod:`rewriter.key_domain`); ``shift`` is the integer added to the part (Metabase's day of
    week, ``+ 1``). Its ``result_type_oid`` is the column's own type: each cell is released as a
    time of its buckets (its representative), of which the outer statement computes the part.
    """

    column: ColumnInfo
    kind: KeyKind
    result_type_oid: int
    unit: TimeUnit | None = None
    first: datetime | None = None
    count: int = 0
    bins: tuple[float, float, int] | None = None
    bin_type: Literal["double precision", "numeric"] = "double precision"
    seconds: int = 0
    cast: str | None = None
    part: DatePart | None = None
    shift: int = 0
    floor: FloorBin | None = None

    @property
    def identity(self) -> tuple[str, str, str | None, tuple[float, float, int] | None, str, int, str | None,
                                str | None, int, FloorBin | None]:
        """What the key groups by, whatever part of its domain a query answers."""
        return (self.column.name, self.kind, self.unit, self.bins, self.bin_type, self.seconds, self.cast,
                self.part, self.shift, self.floor)

    def narrowed(self, lo: datetime | None, hi: datetime | None) -> GroupKey:
        """A time key's buckets that meet [lo, hi] (None: unbounded on that side); maybe none."""
        if self.kind == "epoch":
            return self._epoch_narrowed(lo, hi)
        assert self.kind == "time" and self.unit is not None and self.first is not None
        first, last = 0, self.count - 1
        if lo is not None:
            first = max(first, bucket_index(self.unit, self.first, truncate(self.unit, lo)))
        if hi is not None:
            last = min(last, bucket_index(self.unit, self.first, truncate(self.unit, hi)))
        if last < first:
            return replace(self, count=0)
        return replace(self, first=bucket_start(self.unit, self.first, first), count=last - first + 1)

    def _epoch_narrowed(self, lo: datetime | None, hi: datetime | None) -> GroupKey:
        assert self.first is not None
        base = self._first_index
        first, last = 0, self.count - 1
        if lo is not None:
            first = max(first, bucket_of(lo, self.seconds) - base)
        if hi is not None:
            last = min(last, bucket_of(hi, self.seconds) - base)
        if last < first:
            return replace(self, count=0)
        return replace(self, first=epoch_start(base + first, self.seconds), count=last - first + 1)

    @property
    def _first_index(self) -> int:
        assert self.first is not None
        return bucket_of(self.first, self.seconds)

    # ------------------------------------------------------------ the cells

    @property
    def size(self) -> int:
        """How many cells the key has."""
        policy = self.column.policy
        assert policy is not None
        if self.kind == "category":
            assert policy.categories is not None
            return len(policy.categories) + (policy.other is not None)
        if self.kind == "integer":
            assert policy.bounds is not None
            return int(policy.bounds[1]) - int(policy.bounds[0]) + 1
        if self.kind in ("time", "epoch"):
            return self.count
        if self.floor is not None:
            return self.floor.count
        assert self.bins is not None
        return self.bins[2] + 2

    def labels(self) -> list[str]:
        """Each cell's key as text that the key's type reads back (its input syntax), in cell order."""
        policy = self.column.policy
        assert policy is not None
        if self.kind == "category":
            return list(self.column.labels())
        if self.kind == "integer":
            assert policy.bounds is not None
            return [str(int(policy.bounds[0]) + i) for i in range(self.size)]
        if self.kind == "time":
            return [start.isoformat(sep=" ") for start in self._starts()]
        if self.kind == "epoch":
            return [str((self._first_index + i) * self.seconds) for i in range(self.count)]
        if self.floor is not None:
            return [str(self.floor.first + i) for i in range(self.floor.count)]
        return [str(i) for i in range(self.size)]

    def value_at(self, start: datetime) -> int | datetime:
        """A time key's value for its bucket that starts at ``start``: its part of it (a key with a
        ``part``), else the start itself."""
        return start if self.part is None else part_value(self.part, start)

    def label_at(self, start: datetime) -> str:
        """A time key's label for a time ``start`` (midnight) in its bucket: the bucket's start as
        ``date_trunc`` names it, or for a key with a ``part`` that time in the column's type."""
        if self.part is not None and self.column.type_oid == DATE:
            return start.date().isoformat()
        return start.isoformat(sep=" ")

    def _starts(self) -> list[datetime]:
        assert self.unit is not None and self.first is not None
        return [bucket_start(self.unit, self.first, i) for i in range(self.count)]

    # ------------------------------------------------------------ the backend's side

    def group_sql(self) -> str:
        """The per-row expression the backend groups by, whose values are at most
        :attr:`grouped_values` whatever the rows hold: grouped by the raw value, a column of
        distinct values held a group a row, a hash table the rows' number sized
        (rewriter/sort_memory.py).

        A category key's is the row's cell (the CASE of its categories, once a row: comparisons
        the work limit weighs, each comparing the sizes first). Of :data:`HASHED_LIST` categories
        or more, on a ``text`` or ``varchar`` column under a deterministic collation (whose ``=``
        is ``texteq`` with a text literal as with a list's), it is the row's value where it
        equals a declared category, else NULL, tested by one ``= ANY`` of them, which PostgreSQL
        hashes from that many values: one hash of the value a row, where the CASE of 41 countries
        compared it 41 times (5.5 to 6.7 times as slow; benchmarks/grouped_by_cell.py). The rows
        are grouped by the same ``=`` as the CASE of :meth:`cell_sql` then finds a group's cell
        by, so each group is one category's. Under a nondeterministic collation (whose hash is of
        the ICU sort key) and for other types (``char(n)``'s ``=`` is not a text list's) the
        CASE stays. An integer or floor key's is the row's cell; a time, epoch or bin key's
        :meth:`row_sql`, a bucket already (its cell, ``to_char``, computed once a group)."""
        row = self.row_sql()
        if self.kind == "category":
            if not self._hashed_category:
                return self._category_cell(row)
            policy = self.column.policy
            assert policy is not None and policy.categories is not None
            array = ", ".join(f"CAST({literal(category)} AS pg_catalog.text)" for category in policy.categories)
            return f"CASE WHEN ({row} OPERATOR(pg_catalog.=) ANY (ARRAY[{array}])) THEN {row} END"
        if self.kind == "integer":
            policy = self.column.policy
            assert policy is not None and policy.bounds is not None
            lo, hi = (str(int(bound)) for bound in policy.bounds)
            return f"CASE WHEN {operator(row, '>=', lo)} AND {operator(row, '<=', hi)} THEN {row} END"
        if self.floor is not None:
            return self.floor.cell_sql(row)
        return row

    @property
    def grouped_values(self) -> int:
        """The most distinct values :meth:`group_sql` takes over any rows, NULL included: a
        category key's cells and NULL (without ``other``); an integer's or a floor key's cells
        and NULL; a bin key's n + 2 buckets and NULL; a time or epoch key's buckets, NULL, and a
        bucket on either side, where a cast's time zone moves a value within the range past
        its edge (:meth:`row_sql`; such a group is in no cell)."""
        if self.kind in ("time", "epoch"):
            return self.count + 3
        return self.size + 1

    @property
    def held_bytes(self) -> int:
        """The most bytes a group's value of :meth:`group_sql` holds in the group's key beyond a
        fixed-width value's: a hashed category key's group is the row's value itself, as long as
        the longest declared category (and its 4-byte length word); 0 for any other key, whose
        group is a number or a time."""
        if self.kind != "category" or not self._hashed_category:
            return 0
        policy = self.column.policy
        assert policy is not None and policy.categories is not None
        return 4 + max(len(category.encode("utf-8")) for category in policy.categories)

    def row_sql(self) -> str:
        """The per-row expression the backend groups by; it cannot raise on any value."""
        name = column_sql(self.column)
        if self.kind == "category" and not self.column.deterministic_collation:
            return short_text(name)  # hashed through an ICU copy of two bytes a character
        if self.kind in ("category", "integer"):
            return name
        if self.kind == "time":
            assert self.unit is not None and self.first is not None
            within = f"{operator(name, '>=', self._time_literal(self.first))} AND {operator(name, '<', self._end_sql())}"
            # A date beyond timestamp's range (year 294277 and later) fails date_trunc's cast;
            # CASE evaluates it only for the rows within the declared range, where no cast
            # between date, timestamp and timestamptz fails. The bucket is PostgreSQL's own of
            # the expression the statement groups by, cast included.
            source = name if self.cast is None else f"CAST({name} AS pg_catalog.{self.cast})"
            return f"CASE WHEN {within} THEN pg_catalog.date_trunc({literal(self.unit)}, {source}) END"
        if self.kind == "epoch":
            assert self.first is not None
            within = f"{operator(name, '>=', self._utc_literal(self.first))} AND {operator(name, '<', self._end_sql())}"
            index = f"pg_catalog.floor({operator(f'EXTRACT(EPOCH FROM {name})', '/', str(self.seconds))})"
            return f"CASE WHEN {within} THEN {index} END"
        if self.floor is not None:
            return self.floor.row_sql(name)
        assert self.bins is not None
        lo, hi, n = self.bins
        bound = self.bin_type
        bucket = f"pg_catalog.width_bucket(CAST({name} AS {bound}), CAST({lo!r} AS {bound}), CAST({hi!r} AS {bound}), {n})"
        if self.column.type_oid in INTEGER_TYPES:
            return bucket
        # width_bucket raises for a NaN operand: a NaN row is in no cell.
        return f"CASE WHEN {operator(name, '=', literal('NaN'))} THEN NULL ELSE {bucket} END"

    def _end_sql(self) -> str:
        """The moment the key's last bucket ends, in the column's type. A range that reaches the
        year 9999 ends in the year 10000, which ``datetime`` cannot hold: then it is written as
        the last bucket's start plus its width, for PostgreSQL to add."""
        assert self.first is not None
        if self.kind == "epoch":
            try:
                return self._utc_literal(epoch_start(self._first_index + self.count, self.seconds))
            except OverflowError:
                last, width = self._utc_literal(epoch_start(self._first_index + self.count - 1, self.seconds)), \
                    f"{self.seconds} seconds"
        else:
            assert self.unit is not None
            try:
                return self._time_literal(bucket_start(self.unit, self.first, self.count))
            except (OverflowError, ValueError):
                last, width = self._time_literal(bucket_start(self.unit, self.first, self.count - 1)), _WIDTHS[self.unit]
        return operator(last, '+', f"CAST({literal(width)} AS pg_catalog.interval)")

    def _time_literal(self, moment: datetime) -> str:
        if self.column.type_oid == DATE:
            return f"CAST({literal(moment.date().isoformat())} AS pg_catalog.date)"
        type_name = "timestamptz" if self.column.type_oid == TIMESTAMPTZ else "timestamp"
        return f"CAST({literal(moment.isoformat(sep=' '))} AS pg_catalog.{type_name})"

    def _utc_literal(self, moment: datetime) -> str:
        """``moment`` (UTC wall-clock) in the column's type; a timestamptz's with an explicit +00,
        whatever the session's TimeZone, as extract(epoch ...) reads it."""
        if self.column.type_oid == TIMESTAMPTZ:
            return f"CAST({literal(moment.isoformat(sep=' ') + '+00')} AS pg_catalog.timestamptz)"
        return self._time_literal(moment)

    def cell_sql(self, group: str | None = None) -> str:
        """What the backend reports for a group, computed from ``group`` (SQL of the group's value of
        :meth:`group_sql`; by default that expression itself): read by :meth:`cell_of`. A hashed
        category key's is the cell of its category (or ``other``'s), a time key's ``to_char`` of
        its bucket; any other key's group value is its cell. Computed over a column of the
        grouped rows (``group``), once a group: PostgreSQL evaluated a CASE over the grouping
        expression written out again once a row (41 categories: 1.9 s more on 1,000,000 rows)."""
        value = self.group_sql() if group is None else group
        if self.kind == "category" and self._hashed_category:
            return self._category_cell(value)
        if self.kind == "time":
            return f"pg_catalog.to_char({value}, {literal(_KEY_TEXT)})"
        return value

    @property
    def _hashed_category(self) -> bool:
        """Whether this category key groups by the row's value where it is a category's, found by a
        hashed list (:meth:`group_sql`), rather than by the row's cell."""
        policy = self.column.policy
        assert policy is not None and policy.categories is not None
        return (self.column.deterministic_collation and self.column.value_type[0] in RAW_TYPES
                and len(policy.categories) >= HASHED_LIST)

    def _category_cell(self, value: str) -> str:
        """The cell number of ``value`` (SQL of the column's value): the first declared category it
        equals, else ``other``'s (NULL without one)."""
        policy = self.column.policy
        assert policy is not None and policy.categories is not None
        branches = " ".join(f"WHEN {operator(value, '=', literal(c))} THEN {i}" for i, c in enumerate(policy.categories))
        other = f" ELSE {len(policy.categories)}" if policy.other is not None else ""
        return f"CASE {branches}{other} END"

    def cell_of(self, value: bytes | None) -> int | None:
        """The cell a group reported by :meth:`cell_sql` falls in; None for rows in no cell."""
        if value is None:
            return None
        if self.kind == "category":
            return int(value)
        if self.kind == "integer":
            policy = self.column.policy
            assert policy is not None and policy.bounds is not None
            return int(value) - int(policy.bounds[0])
        if self.kind == "time":
            assert self.first is not None and self.unit is not None
            index = bucket_index(self.unit, self.first, datetime.fromisoformat(value.decode("ascii")))
            return index if 0 <= index < self.count else None
        if self.kind == "epoch":
            index = int(Decimal(value.decode("ascii"))) - self._first_index
            return index if 0 <= index < self.count else None
        if self.floor is not None:
            index = int(value) - self.floor.first
            return index if 0 <= index < self.floor.count else None
        return int(value)


@dataclass(frozen=True)
class KeyRange:
    """A WHERE conjunct ``column op value`` on a time key's column, ``value`` row-independent.

    Only rows within it reach the backend's groups, so the buckets outside it hold no row
    whatever the data: the answer leaves them out (:meth:`GroupKey.narrowed`). ``sql`` is the
    value pinned to pg_catalog: a literal, a parameter or a foldable expression
    (:mod:`rewriter.constants`), evaluated in a query that reads no table.
    """

    key: int  # index into the plan's keys
    op: str  # >=, >, <=, <, =
    sql: str
    # A string literal: PostgreSQL reads it as the column's type (a date column's
    # '5874897-12-31' is a date, beyond what a timestamp holds).
    untyped: bool = False


_RANGE_OPS: dict[type[exp.Expression], str] = {exp.GTE: ">=", exp.GT: ">", exp.LTE: "<=", exp.LT: "<", exp.EQ: "="}
_FLIPPED = {">=": "<=", ">": "<", "<=": ">=", "<": ">", "=": "="}


def key_ranges(where: exp.Expression | None, keys: tuple[GroupKey, ...], scope: Scope) -> tuple[KeyRange, ...]:
    """The top-level AND conjuncts of ``where`` that bound a time key's column by a constant."""
    if where is None:
        return ()
    columns = {key.column.name: i for i, key in enumerate(keys) if key.kind in ("time", "epoch")}
    if not columns:
        return ()
    ranges: list[KeyRange] = []
    for conjunct in _conjuncts(where):
        if isinstance(conjunct, exp.Between) and not conjunct.args.get("symmetric"):
            sides = [(conjunct.this, ">=", conjunct.args.get("low")), (conjunct.this, "<=", conjunct.args.get("high"))]
        elif type(conjunct) in _RANGE_OPS:
            op = _RANGE_OPS[type(conjunct)]
            left, right = conjunct.this, conjunct.expression
            sides = [(left, op, right)] if isinstance(left, exp.Column) else [(right, _FLIPPED[op], left)]
        else:
            continue
        for column, op, value in sides:
            index = _key_column(column, columns, scope)
            sql = _constant(value)
            if index is not None and sql is not None:
                ranges.append(KeyRange(index, op, sql, _string_literal(value)))
    return tuple(ranges)


def _conjuncts(node: exp.Expression) -> list[exp.Expression]:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


def _string_literal(node: exp.Expression | None) -> bool:
    while isinstance(node, exp.Paren):
        node = node.this
    return isinstance(node, exp.Literal) and node.is_string


def _key_column(node: exp.Expression, columns: dict[str, int], scope: Scope) -> int | None:
    if not isinstance(node, exp.Column):
        return None
    try:
        return columns.get(scope.column(node).name)
    except Refusal:
        return None


def _constant(node: exp.Expression | None) -> str | None:
    """``node`` as pinned SQL if it is a row-independent value, else None."""
    if node is None or any(isinstance(part, (exp.Column, exp.Subquery, exp.Select, exp.Star)) for part in node.walk()):
        return None
    try:
        return qualified_constant(node.sql("postgres"))
    except (NotFoldable, Refusal):
        return None


def key_form(node: exp.Expression) -> bool:
    """Whether ``node`` is written as a grouping key could be (a column, date_trunc, width_bucket)."""
    if date_part_shape(node) is not None:
        return True
    if isinstance(node, exp.Cast):
        node = node.this
    return (isinstance(node, (exp.Column, exp.TimestampTrunc, exp.DateTrunc, exp.WidthBucket))
            or epoch_bucket(node) is not None or _year_of(_year_number(node)) is not None or floor_shape(node) is not None)


def key_over_columns(node: exp.Expression) -> bool:
    """Whether ``node`` is a time or bin key written over a column, as a wrapper subquery may
    select it (:mod:`rewriter.flatten`): ``date_trunc`` of a column or of its cast to a time type,
    ``width_bucket`` of a column, Metabase's numeric binning, Grafana's epoch bucket or the year's
    ``EXTRACT``; maybe cast."""
    if _year_of(_year_number(node)) is not None or date_part_shape(node) is not None or floor_shape(node) is not None:
        return True
    if isinstance(node, exp.Cast):
        node = node.this
    if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
        return time_source(node.this) is not None
    return (isinstance(node, exp.WidthBucket) and isinstance(node.this, exp.Column)) or epoch_bucket(node) is not None


def group_key(node: exp.Expression, scope: Scope) -> GroupKey:
    """The key ``node`` (a GROUP BY item, resolved) groups by; refused unless the policy opts it in."""
    if isinstance(node, exp.Column):
        return _column_key(scope.column(node), node, scope)
    shape = date_part_shape(node)
    if shape is not None:
        return _part_key(shape, node, scope)
    if isinstance(node, (exp.TimestampTrunc, exp.DateTrunc)):
        return _time_key(node, scope)
    if isinstance(node, exp.Cast) and isinstance(node.this, (exp.TimestampTrunc, exp.DateTrunc)) and node.to.this in _TIME_CASTS:
        # A bucket's start cast to a date or timestamp names the same bucket (the cast is one to
        # one on starts of days and longer units): the key is the bucket, the cast post-processing.
        return _time_key(node.this, scope)
    year = _year_of(_year_number(node))
    if year is not None:
        # EXTRACT(YEAR FROM col) (Tableau's YEAR(date) dimension, CAST(TRUNC(...) AS INTEGER)) is
        # one to one with date_trunc('year', col): the key is the year's bucket, and the
        # EXTRACT (TRUNC, the cast) post-processing of its start (post_process._replace_keys).
        # 'year' is answered wherever a unit it is nested in is; without it (weeks only) the year
        # part is refused with what to opt in.
        source = time_source(year)
        assert source is not None
        policy = scope.column(source[0]).policy
        if policy is not None and policy.time_units and "year" not in policy.time_units:
            return _part_key(PartShape(source[0], source[1], "year"), node, scope)
        return _time_key(exp.TimestampTrunc(this=year.copy(), unit=exp.var("YEAR")), scope)
    if isinstance(node, exp.Cast) and isinstance(node.this, exp.Column) and node.to.this in _LABEL_CASTS \
            and not node.to.expressions:
        # Tableau groups a dimension as CAST(col AS TEXT): over a category column the cast is one
        # to one, so the key is the category and the cast post-processing of its label.
        key = _column_key(scope.column(node.this), node.this, scope)
        if key.kind == "category":
            return key
    if isinstance(node, exp.WidthBucket):
        return _bin_key(node, scope)
    bucket = epoch_bucket(node)
    if bucket is not None:
        return _epoch_key(*bucket, scope)
    if floor_shape(node) is not None:
        return _floor_key(node, scope)
    raise _refuse(scope, f"GROUP BY {node.sql('postgres')} is not allowed on protected table", date_shape_advice(node))


def year_extract(node: exp.Expression) -> bool:
    """Whether ``node`` is ``EXTRACT(YEAR FROM col)``: a year key written as its year's number."""
    return _year_of(node) is not None


def _year_number(node: exp.Expression) -> exp.Expression:
    """``node`` without what keeps a year's number as it is: a cast to an integer or numeric (no
    typmod) and Tableau's TRUNC, in that order."""
    if isinstance(node, exp.Cast) and node.to.this in _YEAR_CASTS and not node.to.expressions:
        node = node.this
    if isinstance(node, exp.Trunc) and node.args.get("decimals") is None:
        node = node.this
    return node


def _year_of(node: exp.Expression | None) -> exp.Expression | None:
    """The column (maybe cast to a time type) of ``EXTRACT(YEAR FROM ...)`` or ``date_part('year', ...)``
    (a :class:`~rewriter.sqlglot_parse.DatePart`, its field a string), or None."""
    if isinstance(node, exp.Extract) and isinstance(node.this, (exp.Var, exp.Literal)) and node.this.name.upper() == "YEAR" \
            and time_source(node.expression) is not None:
        return node.expression
    return None


def column_key_count(column: ColumnInfo) -> int | None:
    """The cells of ``GROUP BY column`` (its categories and ``other``, or the integers in an integer
    column's bounds), or None if the column is not such a key.

    A float or numeric column is not one, whatever its bounds: grouped by its own values it
    reports 2.5 (or numeric 2.0) for a group, the key of no integer cell; its bins are
    ``width_bucket``'s.
    """
    policy = column.policy
    if policy is None or (policy.categories is None and column.type_oid not in INTEGER_TYPES):
        return None
    return policy.key_count


def _column_key(column: ColumnInfo, node: exp.Expression, scope: Scope) -> GroupKey:
    policy = column.policy
    count = column_key_count(column)
    if column.type_oid == DATE and policy is not None and policy.time_units:
        # A date is its day's bucket (a timestamp, finer than a day, is not: CAST(col AS DATE) is).
        assert isinstance(node, exp.Column)
        return _part_key(PartShape(node, None, "date"), node, scope)
    if policy is None or count is None:
        raise _refuse(scope, f"GROUP BY {column.name} is not allowed on protected table", _time_grain_advice(column))
    if policy.categories is not None:
        return GroupKey(column, "category", column.type_oid)
    if count > scope.table.policy.max_cells:
        raise _too_many(scope, f"GROUP BY {column.name}", count)
    return GroupKey(column, "integer", column.type_oid)


def _time_grain_advice(column: ColumnInfo) -> str | None:
    """What to group a time column opted in by units by, when a statement groups it by its raw
    values or by a unit the policy does not answer (a BI tool's temporal dimension without a time
    grain, or with *Hour*); None for any other column. From the policy alone."""
    policy = column.policy
    if policy is None or column.type_oid not in TIME_TYPES or not policy.time_units:
        return None
    units = list(policy.time_units)
    listed = units[0] if len(units) == 1 else f"{', '.join(units[:-1])} or {units[-1]}"
    example = f"DATE_TRUNC('{'month' if 'month' in units else units[0]}', {column.name})"
    day = f" or CAST({column.name} AS DATE), its day," if "day" in units and column.type_oid != DATE else ""
    return (f"{column.name} is grouped by its declared time units (and the coarser ones nested in them) only: "
            f"{listed}. Group by {example}{day} (a BI "
            f"tool's time grain: in Superset, the x axis' or the dimension's Time grain; in a chart whose columns "
            f"carry none, such as Sunburst or Sankey, a custom SQL column {example}).")


def _time_key(node: exp.Expression, scope: Scope) -> GroupKey:
    source = time_source(node.this)
    unit = node.args.get("unit")
    text = unit.name.upper() if isinstance(unit, (exp.Var, exp.Literal)) else None
    if source is None or node.args.get("zone") is not None or text is None:
        raise _refuse(scope, "DATE_TRUNC takes a unit literal and a column (maybe cast to date, timestamp or "
                             "timestamptz), without a time zone, on protected table")
    argument, cast = source
    column = scope.column(argument)
    policy = column.policy
    chosen = _UNIT_SPELLINGS.get(text)
    if policy is None or column.type_oid not in TIME_TYPES or chosen is None or chosen not in policy.time_units:
        raise _refuse(scope, f"GROUP BY DATE_TRUNC('{text.lower()}', {column.name}) is not allowed on protected table",
                      _time_grain_advice(column))
    assert policy.time_bounds is not None
    lo, hi = policy.time_bounds
    first = truncate(chosen, lo)
    # date_trunc of a date is timestamptz (the date's implicit cast); a cast of the column to a
    # type other than its own is PostgreSQL's, evaluated in the backend's grouping (row_sql).
    truncated = {"date": DATE, "timestamp": TIMESTAMP, "timestamptz": TIMESTAMPTZ}.get(cast or "", column.type_oid)
    result = TIMESTAMP if truncated == TIMESTAMP else TIMESTAMPTZ
    return GroupKey(column, "time", result, unit=chosen, first=first, count=bucket_count(chosen, lo, hi),
                    cast=cast if truncated != column.type_oid else None)


def _part_key(shape: PartShape, node: exp.Expression, scope: Scope) -> GroupKey:
    """A date key that is a function of a time bucket (:mod:`rewriter.date_parts`), over the
    first unit that decides it the column opts in."""
    column = scope.column(shape.column)
    policy = column.policy
    units = PART_UNITS[shape.part]
    what = f"GROUP BY {node.sql('postgres')} is not allowed on protected table"
    if policy is None or column.type_oid not in TIME_TYPES or not policy.time_units:
        raise _refuse(scope, what)
    chosen = next((unit for unit in units if unit in policy.time_units), None)
    if chosen is None:
        if shape.part == "date" and isinstance(node, exp.Column):  # a date column by its raw values
            raise _refuse(scope, what, f"{_time_grain_advice(column)} Grouped by itself, {column.name} is answered "
                                       "where the policy opts 'day' in.")
        raise _refuse(scope, what, part_advice(shape.part, column.name, policy.time_units))
    assert policy.time_bounds is not None
    lo, hi = policy.time_bounds
    cast = shape.cast
    truncated = {"date": DATE, "timestamp": TIMESTAMP, "timestamptz": TIMESTAMPTZ}.get(cast or "", column.type_oid)
    return GroupKey(column, "time", column.type_oid, unit=chosen, first=truncate(chosen, lo),
                    count=bucket_count(chosen, lo, hi), cast=cast if truncated != column.type_oid else None,
                    part=shape.part, shift=shape.shift)


def _epoch_key(argument: exp.Column, seconds: int, scope: Scope) -> GroupKey:
    column = scope.column(argument)
    policy = column.policy
    what = f"GROUP BY floor(extract(epoch from {column.name})/{seconds})*{seconds}"
    if policy is None or column.type_oid not in TIME_TYPES or "day" not in policy.time_units:
        raise _refuse(scope, f"{what} is not allowed on protected table")
    if seconds % DAY_SECONDS:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{what} has buckets of {seconds} seconds, not a whole number of days, on protected table "
            f"{scope.table.display_name} (rule: no-group-by)",
            f"Time buckets on {column.name} are whole days at the finest: use an interval of 1d or more "
            "(in Grafana, the query's Min interval), or DATE_TRUNC. " + group_by_hint(scope),
            "no-group-by",
        )
    assert policy.time_bounds is not None
    lo, hi = policy.time_bounds
    first, last = bucket_of(lo, seconds), bucket_of(hi, seconds)
    count = last - first + 1
    if count > scope.table.policy.max_cells:
        raise _too_many(scope, what, count)
    return GroupKey(column, "epoch", NUMERIC, first=epoch_start(first, seconds), count=count, seconds=seconds)


def _bin_key(node: exp.WidthBucket, scope: Scope) -> GroupKey:
    argument = node.this
    if not isinstance(argument, exp.Column):
        raise _refuse(scope, "width_bucket takes a column, two numbers and a bucket count on protected table")
    column = scope.column(argument)
    policy = column.policy
    if policy is None or policy.bounds is None or policy.group_by is not True or column.type_oid not in NUMERIC_TYPES:
        raise _refuse(scope, f"GROUP BY width_bucket({column.name}, ...) is not allowed on protected table")
    (lo, lo_integer), (hi, hi_integer) = (_number(node.args.get(key), scope) for key in ("min_value", "max_value"))
    count = node.args.get("num_buckets")
    if not (isinstance(count, exp.Literal) and not count.is_string and count.this.isdigit() and len(count.this) <= 9
            and int(count.this) >= 1):
        raise _refuse(scope, "width_bucket's bucket count must be a positive integer literal on protected table")
    if lo == hi:
        # PostgreSQL raises for equal bounds only when a row reaches it: refused from the text.
        raise _refuse(scope, "width_bucket's lower and upper bound must differ on protected table")
    n = int(count.this)
    if n + 2 > scope.table.policy.max_cells:
        raise _too_many(scope, f"GROUP BY width_bucket({column.name}, ..., {n})", n + 2)
    # PostgreSQL's overload: double precision for a float column, or an integer one between
    # integer literals; numeric for a numeric column, or when a bound is a decimal literal.
    exact = column.type_oid == NUMERIC or (column.type_oid in INTEGER_TYPES and not (lo_integer and hi_integer))
    return GroupKey(column, "bin", INT4, bins=(lo, hi, n), bin_type="numeric" if exact else "double precision")


def _floor_key(node: exp.Expression, scope: Scope) -> GroupKey:
    """Metabase's numeric binning over a bounded numeric column opted in (:mod:`rewriter.floor_bins`)."""
    shape = floor_shape(node)
    assert shape is not None
    column = scope.column(shape.column)
    policy = column.policy
    what = f"GROUP BY {node.sql('postgres')}"
    if policy is None or policy.bounds is None or policy.group_by is not True or column.type_oid not in NUMERIC_TYPES:
        raise _refuse(scope, f"{what} is not allowed on protected table",
                      f"Binning {column.name} needs numeric bounds and group_by: true in its policy.")
    try:
        key = floor_bin(shape, column.type_oid, policy.bounds)
    except BinError as error:
        raise _refuse(scope, f"{what}: {error} on protected table", error.advice) from None
    if key.count > scope.table.policy.max_cells:
        lo, hi = policy.bounds
        wider = (hi - lo) / max(1, scope.table.policy.max_cells - 2)
        raise _too_many(scope, what, key.count,
                        f"Use a wider bin width W: at least {wider:.3g} over {column.name}'s bounds [{lo:g}, {hi:g}] "
                        f"(in Metabase, fewer bins or a wider bin width).")
    return GroupKey(column, "floor", key.result_type_oid, floor=key)


def _number(node: exp.Expression | None, scope: Scope) -> tuple[float, bool]:
    """A width_bucket bound's value, and whether PostgreSQL reads it as an integer (int4/int8)."""
    negative = isinstance(node, exp.Neg)
    if negative:
        assert node is not None
        node = node.this
    if not (isinstance(node, exp.Literal) and not node.is_string):
        raise _refuse(scope, "width_bucket's bounds must be number literals on protected table")
    value = float(node.this)
    if not math.isfinite(value) or abs(value) > 1e300:
        raise _refuse(scope, "width_bucket's bounds must be finite numbers on protected table")
    integer = node.this.isdigit() and abs(int(node.this)) < 2**63
    return (-value if negative else value), integer


def _refuse(scope: Scope, message: str, advice: str | None = None) -> Refusal:
    refusal = scope.refuse(message, "no-group-by")
    return Refusal(refusal.sqlstate, refusal.message, group_by_hint(scope, advice), "no-group-by")


def _too_many(scope: Scope, what: str, cells: int, advice: str | None = None) -> Refusal:
    return Refusal(
        SQLSTATE.DP_QUERY_SHAPE,
        f"{what} has {cells} cells, more than the {scope.table.policy.max_cells} protected table "
        f"{scope.table.display_name} answers (rule: max-cells)",
        (advice or "Group by fewer keys, a coarser time unit or fewer width_bucket bins,")
        + (" Or" if advice else " or") + " ask the policy's owner to raise max_cells.",
        "max-cells",
    )


def group_by_hint(scope: Scope, advice: str | None = None) -> str:
    """What GROUP BY this table answers: the keys its policy opts in, or how to opt one in;
    after ``advice`` on the refused key (:func:`rewriter.date_hints.date_shape_advice`) if any."""
    if advice is not None:
        return f"{advice} {group_by_hint(scope)}"
    keys = []
    for column in sorted(scope.table.columns.values(), key=lambda c: c.attnum):
        policy = column.policy
        if policy is None or policy.group_by is False:
            continue
        if policy.categories is not None:
            keys.append(f"{column.name} (its {len(policy.categories)} categories"
                        + (f" and {policy.other!r}" if policy.other is not None else "") + ")")
        elif policy.time_units:
            parts = [part for part in answered_parts(policy.time_units) if part not in ("sunday_week", "date")]
            keys.append(f"DATE_TRUNC('{'|'.join(policy.time_units)}', {column.name})"
                        + (f" (also Grafana's floor(extract(epoch from {column.name})/N)*N, N a multiple of 86400)"
                           if "day" in policy.time_units else "")
                        + (f", EXTRACT({'|'.join(part.upper() for part in parts)} FROM {column.name})" if parts else "")
                        + (f", CAST({column.name} AS DATE) and Sunday weeks" if "day" in policy.time_units else ""))
        elif policy.bounds is not None:
            keys.append(f"width_bucket({column.name}, lo, hi, n), floor(({column.name} - A) / W) * W + A"
                        + (f" and {column.name}" if column_key_count(column) is not None else ""))
    if not keys:
        return ("GROUP BY is answered only over keys the policy declares (group_by on a column with categories, "
                "integer bounds or a time range; docs/policy.md); this table declares none. Without GROUP BY: "
                + scope.hint)
    return (f"GROUP BY on {scope.table.display_name} is answered as a noised histogram over declared keys only: "
            + ", ".join(keys) + "; with COUNT, SUM, AVG, COUNT(DISTINCT col), MODE or PERCENTILE_CONT per group.")
