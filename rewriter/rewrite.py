"""Write the SQL that the backend runs for a DP query: exact aggregates, clamped, pushed down.

The backend returns exactly one row, never rows of the table (a GROUP BY over declared keys:
one row per group, each naming the cell it falls in; :func:`_grouped_sql`). Each aggregate of
the plan becomes one or more *parts*, each one column of that row (:func:`aggregate_parts`):

* additive parts are exact totals over the filtered rows: COUNT, a SUM of values clamped
  into the column's bounds, the count of one declared category (MODE), the clamped sum and
  the count behind an ``avg: sum_count`` AVG; the count, centred sum and centred sum of squares
  behind a variance or standard deviation (:func:`centred_points`);
* partition parts are the m per-partition values of a sample-and-aggregate AVG, MIN or
  MAX, clamped into the column's bounds, as ``double precision`` (:func:`per_partition`) and
  returned as one text value: the values' 8-byte IEEE 754 forms (``float8send``), end to
  end, in hex (:func:`partition_values` reads it). That is exact and quick to read, and it
  does not depend on session settings such as ``extra_float_digits`` or ``bytea_output``;
  empty partitions, and partitions whose values are all NULL, are missing from it
  (``string_agg`` skips NULL) and the caller counts them as empty.

A percentile (``percentile_cont``/``percentile_disc``) has one *grid part*: the count of the
column's values per index of its quantile grid (:func:`quantile_grid`), which the backend gets
by grouping the filtered rows by :func:`grid_index`, the clamped value's index on the grid, a
function of that row alone that cannot fail on any value. Without GROUP BY an outer aggregate
folds the groups back into one row, as for partitions: ``sum`` for additive parts, and the
grid part as one text ``index:count,…`` (:func:`collected_counts`); per cell of a GROUP BY the
grid index is one more grouping column, and dpproxy adds a cell's counts up (:func:`split_cells`);
its other parts are summed per cell in the backend (:func:`_grouped_sql`).

Without partition or grid parts the query is one plain aggregate over the filtered rows. With them
it is still one pass over the table: the filtered rows are grouped by a partition number in
0..m-1 computed for each row on its own (:func:`partition_key`), and an outer aggregate folds
the partitions back together (``sum`` for additive parts, ``string_agg`` for partition values).

The partition number comes from the table's ``partitioning`` (policy; ``Relation.partition_key``):

* ``auto`` (the default) is ``row_hash`` over the primary key when the table has one whose
  columns are all hashable, else ``random``: on a key-less table hashing every column costs
  about what ``random()`` does (benchmarks/results.md) and would keep duplicate rows together.
* ``row_hash``: a keyed hash of the row's *values* with a fresh 63-bit secret
  per query (:func:`partition_seed`, from :mod:`secrets`), ``(h & (2^63 - 1)) % m`` with
  ``h`` the XOR of one keyed hash per hashed column (:func:`row_hash_key`); the mask clears
  the sign bit, so there are exactly m partitions. The hashed columns
  (``Relation.hashed_columns``) are fixed when dpproxy loads the policy, from the schema
  alone: the primary key when the table has one whose columns are all of a hashable type,
  else every column of a hashable type (:data:`HASH_FUNCTIONS`).

  **Why it is private, with no assumption.** Fix the seed s. A row's partition is then a
  function of that row's values and s only: no other row, no ctid, no physical order enters
  it. Take neighbouring tables D and D' = D plus one row x (any two tables that differ by one
  added or removed row, however each was loaded or laid out). Every row of D gets the same
  partition in D' (its partition depends on it and s alone), and x joins exactly one
  partition; so the vectors of the m partition values differ in at most one coordinate, which
  is what the smooth-sensitivity median is (ε, δ)-DP against
  (:mod:`mechanisms.smooth_median`). That holds for every s, so it holds for s drawn at
  random; nothing is assumed of the hash (it need not be a PRF: its quality matters for
  accuracy only). What the argument needs of s is that it be independent of the data: it
  comes from :mod:`secrets`, is never derived from rows, and no analyst sees or sets it
  (it appears only in the SQL dpproxy sends its backend). Rows identical on every hashed
  column always share a partition: that is still a function of each row alone (adding one
  more copy changes one partition), but a table of many duplicate rows gets fewer, larger
  partitions — an accuracy cost, for which ``random`` is the remedy.

  **No error oracle, no data-dependent timing.** Only columns whose type is in
  :data:`HASH_FUNCTIONS` are hashed, decided from the catalog at load, never from the data;
  each of those functions is total: it returns a value, without error, for every value the
  type can hold (NaN, ±Infinity and -0 included), and NULL gives NULL, which ``COALESCE``
  turns into 0. ``#`` (XOR), ``&`` and ``%`` by a positive constant cannot fail on bigints.
  So the key cannot raise for any row a filter lets through, which would otherwise tell
  whether any row matches (``hash_record_extended`` raises for a column type without an
  extended hash, json or point, only when it meets a row). Its cost per row is a fixed
  number of function calls plus, for text, time linear in the text's length, as reading
  it is. Text is hashed by its bytes (``COLLATE "C"``), so a nondeterministic collation's
  ICU sort key is never computed. Each column has its own seed (the query's seed XOR the
  column's position), so two columns holding equal values do not cancel out in the XOR.
  Every function is PARALLEL SAFE: PostgreSQL runs the grouping in parallel workers.
* ``random``: ``floor(random() * m)``, drawn for each row on its own and afresh
  for every query. Sample and aggregate is private if adding or removing one row changes at
  most one partition's value; with independent per-row draws the rows two neighbouring tables
  share can be given the same partitions in both, whatever the tables' physical layout, so
  the guarantee needs no assumption. PostgreSQL ≥ 15 seeds ``random()`` per backend process
  from a strong random source; analysts cannot reseed it (``setseed()``, ``SET seed`` and
  ``set_config('seed', ...)`` are refused) or read its output (``random()`` is on no
  allowlist). ``random()`` is PARALLEL RESTRICTED, so the query runs serially. Duplicate rows
  are split like any others.
* ``ctid_hash``: ``(hashtidextended(ctid, seed) & (2^63 - 1)) % m``, a keyed hash of the row's
  physical id with a fresh 63-bit seed per query; the mask clears the sign bit, so there are
  exactly m partitions. This is
  a function of each row on its own, and a row's ``ctid`` does not change when another row is
  inserted or deleted, so neighbouring tables that differ by one row added or removed *in
  place* differ in one partition, for every seed. **Assumption:** that is the neighbouring
  relation. For two tables loaded separately, whose shared rows sit at different ctids, the
  argument instead needs the keyed hash to behave like a random function of the ctid, which
  ``hashtidextended`` (not a cryptographic PRF) is not proven to do; hence opt-in.

The hash keys (``row_hash``, ``ctid_hash``) are PARALLEL SAFE. The rows pass through a subquery
that also selects ``pg_is_in_recovery()``, volatile but PARALLEL SAFE, so that the subquery is
not flattened into the grouping query; PostgreSQL then estimates its default 200 groups
instead of one per distinct key (it cannot know that ``% m`` leaves m values) and picks a
parallel plan with a partial aggregate per worker.

In every case the partitioning serves accuracy and the coupling argument, it is not the
noise: the noise comes from ``mechanisms.samplers``.

Every part, key and condition reads a column as :func:`rewriter.text_bounds.column_sql`, which the
level that reads the table writes as the column's bound (:func:`rewriter.text_bounds.read_table`: a
text value longer than the table's ``max_text_bytes``, or stored apart, is NULL, decided from its
header without reading it; in place where each bounded column is read once, else through a
projection PostgreSQL pulls up), and a level above a subquery as that subquery's output, which
bounded it (COUNT(DISTINCT)'s shuffle, the partitions' rows: :func:`rewriter.text_bounds.read_through`).
On a table with ``answer_quantum_ms`` the raw values that equalities compare where that gives the same
answer (:mod:`rewriter.raw_equality`) are the column itself there (or the projection's raw output), so
that an index on it serves them.

Functions, operators (``OPERATOR(pg_catalog.*)``) and type names that are not grammar
keywords (``pg_catalog.bytea``) are schema-qualified with ``pg_catalog``, and the WHERE
predicate is rendered qualified too (:mod:`rewriter.predicates`), so that a session's
``search_path`` cannot substitute another function, operator or type for them.
"""

from __future__ import annotations

import math
import secrets
from collections import Counter
from dataclasses import dataclass
from decimal import MAX_EMAX, MAX_PREC, MIN_EMIN, Context, Decimal, Inexact, Overflow, Rounded, Underflow
from typing import Any, Mapping, Sequence

import numpy as np

from policies.errors import SQLSTATE, Refusal
from policies.model import QuantileGrid, TablePolicy
from policies.tables import ColumnInfo, Relation, quote_identifier

from .date_parts import part_sql
from .dp_query import Aggregate, AggregateQuery
from .sql_text import literal, operator
from .text_bounds import bounded_outputs, column_sql, distinct_by_bytes, read_table, read_through
from .types import FLOAT4, FLOAT8, FLOAT_TYPES, INT2, INT4, INT8, INTEGER_TYPES, NUMERIC

__all__ = [
    "MAX_BACKEND_COLUMNS", "too_many_columns",
    "HASH_FUNCTIONS", "Part", "aggregate_parts", "backend_sql", "centred_points", "clamped", "clamped_sum", "collected",
    "split_by_index",
    "bound_literal", "decided_total", "filtered", "grid_index", "grouped_values",
    "hashable", "hashed_columns", "literal", "quantile_grid", "query_grid",
    "partition_key", "partition_seed", "partition_values", "per_partition", "row_hash_key", "seeded", "sent", "shuffled_source", "sorts_rows",
    "split_cells", "split_row", "used_columns",
]

_SEED_MAX = (1 << 63) - 1  # seeds are non-negative bigints; also the mask that clears the hash's sign bit


@dataclass(frozen=True)
class Part:
    """One backend column: an exact total (``additive``), one value per partition, or the count
    of a percentile's column per grid index (``per_grid``: a total in each group of the grid)."""

    sql: str
    additive: bool = True
    per_grid: bool = False
    cut: int | None = None  # a numeric total's fraction digits as released (sent, decided_total)


def aggregate_parts(agg: Aggregate) -> tuple[Part, ...]:
    """The backend columns ``agg`` is released from, in the order the mechanism takes them.

    count → (count,); sum → (clamped sum,); sum_count AVG → (clamped sum, count of values);
    sample-and-aggregate AVG/MIN/MAX → (per-partition aggregate of clamped values,);
    VARIANCE/STDDEV → (count of values, Σ d, Σ d²) over the centred points d (:func:`centred_points`);
    MODE → (count of each declared category, in the policy's order); percentile → (count of the
    column's values, per grid index).

    A function of ``agg`` alone (a frozen plan's aggregate, its column and the column's policy
    frozen too), so it is kept per aggregate object: every statement of a cached plan reads its
    aggregates' parts to split the backend row (:func:`split_row`), and writing a clamp's SQL
    again each time cost a sum's or a sample-and-aggregate column's statement ~450 bytecodes.
    """
    known = _PARTS.get(id(agg))
    if known is not None and known[0] is agg:
        return known[1]
    parts = _aggregate_parts(agg)
    if len(_PARTS) >= 4096:
        _PARTS.clear()
    _PARTS[id(agg)] = (agg, parts)
    return parts


# aggregate_parts by aggregate, the aggregate kept so that its id is not reused meanwhile.
_PARTS: dict[int, tuple[Aggregate, tuple[Part, ...]]] = {}


def _aggregate_parts(agg: Aggregate) -> tuple[Part, ...]:
    """:func:`aggregate_parts`, computed."""
    condition = agg.filter_sql
    if agg.column is None:
        return (Part(filtered("pg_catalog.count(*)", condition)),)
    column = column_sql(agg.column)
    if agg.kind == "count":
        if agg.distinct and distinct_by_bytes(agg.column):  # the same classes, sorted by bytes
            column += ' COLLATE pg_catalog."C"'
        return (Part(filtered(f"pg_catalog.count({'DISTINCT ' if agg.distinct else ''}{column})", condition)),)
    if agg.kind == "sum":
        return (_total(agg.column, condition),)
    if agg.mechanism == "sum_count":
        return (_total(agg.column, condition), Part(filtered(f"pg_catalog.count({column})", condition)))
    if agg.mechanism == "sample_aggregate":
        return (Part(per_partition(agg.kind, agg.column, condition), additive=False),)
    if agg.mechanism == "moments":
        centred = centred_points(agg.column)  # numeric: d² reaches 2^106, beyond bigint
        return (Part(filtered(f"pg_catalog.count({column})", condition)),
                Part(filtered(f"pg_catalog.sum({centred})", condition)),
                Part(filtered(f"pg_catalog.sum({operator(centred, '*', centred)})", condition)))
    if agg.mechanism == "quantile":
        return (Part(filtered(f"pg_catalog.count({column})", condition), per_grid=True),)
    if agg.kind == "mode":
        assert agg.column.policy is not None and agg.column.policy.categories is not None
        restricted = f"({condition}) AND " if condition is not None else ""
        return tuple(
            Part(f"pg_catalog.count(*) FILTER (WHERE {restricted}{operator(column, '=', literal(category))})")
            for category in agg.column.policy.categories
        )
    raise ValueError(f"no backend SQL for {agg.kind} by {agg.mechanism}")


# PostgreSQL's MaxTupleAttributeNumber: a SELECT list longer fails (54011) while it is parsed.
MAX_BACKEND_COLUMNS = 1664


def too_many_columns(query: AggregateQuery) -> Refusal | None:
    """The refusal (54011, ``statement-limits``) of a query whose backend SQL would select more
    columns than PostgreSQL allows, or None. Each MODE selects one count per category of its
    column, so a MODE of a column of ~1,700 categories failed on the backend after its charge,
    whatever the rows; the count depends on the statement and the policy only."""
    columns = len(query.groups) + sum(len(aggregate_parts(agg)) for agg in query.aggregates)
    if columns <= MAX_BACKEND_COLUMNS:
        return None
    return Refusal(
        SQLSTATE.TOO_MANY_COLUMNS,
        f"this DP query needs {columns} backend columns (one per key, aggregate part and MODE category), more "
        f"than PostgreSQL's {MAX_BACKEND_COLUMNS} (rule: statement-limits)",
        "Ask for fewer aggregates at once, or MODE of a column with fewer categories.",
        "statement-limits",
    )


def filtered(call: str, condition: str | None) -> str:
    """``call`` (one aggregate call) over the rows where ``condition`` holds: its FILTER clause.

    ``condition`` is a predicate rendered in WHERE's safe language (``Aggregate.filter_sql``):
    PostgreSQL evaluates it per row as it does the WHERE, and it cannot fail on any row.
    """
    return call if condition is None else f"{call} FILTER (WHERE {condition})"


def per_partition(kind: str, column: ColumnInfo, condition: str | None = None) -> str:
    """One partition's value of a sample-and-aggregate AVG, MIN or MAX, as ``double precision``.

    The mechanism works in floats, and ``float8`` prints the shortest text that reads back
    exactly: ``38`` where ``avg()`` of integers prints ``38.0000000000000000``. That is ~6×
    less text for PostgreSQL to format, send and for dpproxy to read and parse per query.
    AVG is the clamped sum over the count of values, which also spares ``avg()``'s numeric
    division per partition; a partition whose values are all NULL gives NULL (a strict
    division by a count of 0 is not evaluated), as ``avg()`` does. For a ``real`` or ``double
    precision`` column that sum is :func:`clamped_sum`'s, exact in points of the column's grid,
    and the value is the mean in points (``proxy.dp.column_release`` scales it back): a
    partition's value must be a function of its rows, not of the order they are read in.

    Neither step may fail on any rows: PostgreSQL raises "out of range" when a ``numeric``
    too close to 0 for ``double precision`` (1e-400) is cast to it, and "value out of range:
    underflow" when a float division gives 0 from a non-zero dividend (a partition whose sum
    is 5e-324 over two rows). Whether a partition held such a value would show as an error.
    So a numeric value below the smallest normal double in magnitude is taken as 0 before
    the cast (:func:`_to_double`), and a mean of a numeric column below it is 0
    without dividing (:func:`_mean`): at most 2.3e-308 off, in one partition's value.

    ``condition``: each aggregate call is over the partition's rows where it holds (a FILTER).
    """
    if kind == "avg":
        count = filtered(f"pg_catalog.count({column_sql(column)})", condition)
        if column.type_oid in FLOAT_TYPES:
            # In grid points: a sum of doubles is rounded in the order the rows are read, so the
            # same partition read in another order (another load order, a parallel plan) would
            # have another value. A non-zero sum of points is ≥ 1 in magnitude: no underflow.
            return operator(f"CAST({filtered(clamped_sum(column), condition)} AS double precision)", "/", count)
        total = _to_double(filtered(f"pg_catalog.sum({clamped(column)})", condition), column)
        if column.type_oid in INTEGER_TYPES:
            return operator(total, "/", count)  # a non-zero integer sum over a count never underflows
        return _mean(total, count)
    if kind not in ("min", "max"):
        raise ValueError(f"no per-partition value for {kind}")
    # Clamping is non-decreasing in the type's order (NULL stays NULL, NaN sorts last), so
    # the clamped MIN/MAX is the MIN/MAX of the clamped values, at two calls per partition
    # instead of two per row.
    return _to_double(clamped(column, filtered(f"pg_catalog.{kind}({column_sql(column)})", condition)), column)


_SMALLEST_NORMAL = "2.2250738585072014e-308"  # double precision's smallest normal magnitude


def _to_double(value: str, column: ColumnInfo) -> str:
    """``value`` (of the column's type, or its sum's) cast to ``double precision``, never failing."""
    if column.type_oid != NUMERIC:
        return f"CAST({value} AS double precision)"  # integers and floats convert without error
    tiny = operator(f"pg_catalog.abs({value})", "<", f"CAST('{_SMALLEST_NORMAL}' AS pg_catalog.numeric)")
    return f"CAST(CASE WHEN {tiny} THEN CAST(0 AS pg_catalog.numeric) ELSE {value} END AS double precision)"


def _mean(total: str, count: str) -> str:
    """``total / count`` in ``double precision``, 0 where the quotient would underflow.

    Where |total| ≥ count · 2.2e-308 the quotient is a normal double; below it, 0. A NULL
    total (no value) stays NULL through the ELSE's strict division.
    """
    floor = operator(f"CAST({count} AS double precision)", "*", f"CAST('{_SMALLEST_NORMAL}' AS double precision)")
    tiny = operator(f"pg_catalog.abs({total})", "<", floor)
    return f"CASE WHEN {tiny} THEN CAST(0 AS double precision) ELSE {operator(total, '/', count)} END"


def backend_sql(query: AggregateQuery, seed: int) -> str:
    """One SELECT over the resolved table that returns every part of every aggregate.

    ``seed`` keys the partitioning (:func:`partition_key`); the SQL is a function of
    ``(query, seed)`` alone. Run it with a fresh :func:`partition_seed`; any fixed seed
    (0) names the query independently of its partitioning.
    """
    if seed == 0:  # the SQL that names a plan, asked for each statement that runs it
        known = _NAMED.get(id(query))
        if known is not None and known[0] is query:
            return known[1]
        if len(_NAMED) >= 1024:
            _NAMED.clear()
        named_sql = _seeded_sql(query, 0)
        _NAMED[id(query)] = (query, named_sql)
        return named_sql
    return _seeded_sql(query, seed)


# backend_sql(plan, seed=0) by plan, the plan kept so that its id is not reused meanwhile
# (plans are cached and immutable; a reload makes new ones).
_NAMED: dict[int, tuple[AggregateQuery, str]] = {}


def _seeded_sql(query: AggregateQuery, seed: int) -> str:
    """:func:`backend_sql`, computed.

    Every construct wrote its reads of a column as :func:`rewriter.text_bounds.column_sql`: those
    above a subquery that read the table (COUNT(DISTINCT)'s shuffle, the partitions' rows) read its
    output (:func:`rewriter.text_bounds.read_through`); those of the level that reads the table read
    its bound (a text value longer than the table's bound, or stored apart, reads as NULL:
    :func:`rewriter.text_bounds.read_table`)."""
    table = query.table
    rows = _SOURCE + (f" WHERE {query.where_sql}" if query.where_sql else "")
    if any(agg.distinct for agg in query.aggregates) and not table.policy.answer_quantum_ms:
        above = _backend_sql(query, seed, _SHUFFLED)
        sql = read_through(above, table).replace(_SHUFFLED, shuffled_source(query, rows, above), 1)
    else:
        sql = _backend_sql(query, seed, rows)
    return read_table(sql, table, _SOURCE)


# Where the table, and the shuffled rows, go in _backend_sql's text until their reads are written (a
# NUL, which no SQL text dpproxy writes can hold).
_SOURCE = "\x00source\x00"
_SHUFFLED = "\x00shuffled\x00"


def _backend_sql(query: AggregateQuery, seed: int, source: str) -> str:
    """:func:`backend_sql` with ``source`` for the rows, their columns read as tokens
    (:func:`rewriter.text_bounds.column_sql`) except above the partitions' rows, which read them
    (:func:`rewriter.text_bounds.read_through`)."""
    parts = [part for agg in query.aggregates for part in aggregate_parts(agg)]
    if query.groups:
        return _grouped_sql(query, parts, source)
    grid = query_grid(query)
    if grid is not None:  # one group per grid index the rows reach (dp_query refused partitions beside it)
        inner = ", ".join(f"{part.sql} AS p{i}" for i, part in enumerate(parts))
        outer = ", ".join(collected_counts(f"p{i}") if part.per_grid else sent(part, f"pg_catalog.sum(p{i})")
                          for i, part in enumerate(parts))
        index = grid_index(*grid)
        return f"SELECT {outer} FROM (SELECT {index} AS g, {inner} FROM {source} GROUP BY {index}) AS grid"
    if all(part.additive for part in parts):
        return f"SELECT {', '.join(sent(part, part.sql) for part in parts)} FROM {source}"
    inner = ", ".join(f"{part.sql} AS p{i}" for i, part in enumerate(parts))
    outer = ", ".join(sent(part, f"pg_catalog.sum(p{i})") if part.additive else collected(f"p{i}")
                      for i, part in enumerate(parts))
    key, fence = (quote_identifier(_unused_name(query.table, name)) for name in ("partition", "fence"))
    rows = ", ".join([
        *bounded_outputs(query.table, used_columns(query), inner),
        f"{partition_key(query.table, seed)} AS {key}",
        f"pg_catalog.pg_is_in_recovery() AS {fence}",  # volatile: keeps the subquery (module docstring)
    ])
    return (
        f"SELECT {outer} FROM (SELECT {read_through(inner, query.table)} FROM (SELECT {rows} FROM {source}) AS filtered "
        f"GROUP BY {key}) AS partitions"
    )


def sorts_rows(query: AggregateQuery) -> bool:
    """Whether :func:`backend_sql`'s plan may hold the filtered rows (or a group per row) in a sort
    or a hash table: ``COUNT(DISTINCT)`` (its shuffle and its value sort), a percentile's grid and
    sample and aggregate's partitions (grouped, which PostgreSQL may do by sorting the rows).
    False for the plain aggregate over the rows (COUNT, SUM, sum-and-count AVG, variances, MODE),
    whose memory no row count moves, and for a GROUP BY of such aggregates: its groups are at most
    :func:`grouped_values` whatever the rows, so its hash table's memory is the policy's to
    bound, provided PostgreSQL hashes rather than sorts the rows (rewriter/sort_memory.py)."""
    if any(agg.distinct for agg in query.aggregates) or query_grid(query) is not None:
        return True
    return not all(part.additive for agg in query.aggregates for part in aggregate_parts(agg))


def grouped_values(query: AggregateQuery) -> int:
    """The most groups :func:`backend_sql`'s GROUP BY of the rows can make, whatever they hold: the
    product of its keys' ``GroupKey.grouped_values`` (1 without keys). An outer query over those
    groups (:func:`_grouped_sql`) has as many at most."""
    return math.prod(key.grouped_values for key in query.groups)


def used_columns(query: AggregateQuery) -> list[str]:
    """The columns the aggregates and their FILTERs read, in order, each once."""
    return list(dict.fromkeys(name for agg in query.aggregates
                              for name in ((agg.column.name,) if agg.column is not None else ()) + agg.filter_columns))


def shuffled_source(query: AggregateQuery, source: str, above: str) -> str:
    """``source`` (the table and its WHERE) as a subquery whose rows come out in random order,
    under the table's own name: what a query with ``COUNT(DISTINCT ...)`` reads, ``above`` (its
    columns read through it, :func:`rewriter.text_bounds.bounded_outputs`).

    **Why.** Counting distinct values sorts them (PostgreSQL 15: inside the Aggregate node; 16
    and later: a Sort node below it; per group: a Sort by the keys and the value), and
    PostgreSQL's in-memory sort (``src/include/lib/sort_template.h``) first checks whether its
    input is already in order, returning after n − 1 comparisons if it is. Read straight from
    the table, that input comes in the table's physical order: on a table appended in a
    column's order (an id, a timestamp), one late row whose value falls below the others turned
    that pass into a full n·log n sort, a timing oracle on the row's presence
    (benchmarks/presorted.py, docs/threat-model.md's Timing). Here the sort's input is the
    filtered rows ordered by ``random()``, drawn per row and afresh for each statement, so the
    order it receives is a uniformly random arrangement of the rows, whatever the table's
    layout: it is in order only if every value is equal (a question of the values, as the rest
    of a sort's cost is, never of where a row sits), and with two distinct values among n rows
    with probability at most 1/n. So the sort always does its full work, whichever row was
    appended where. ``random()``'s seeding and why analysts cannot reseed or read it: the
    module docstring (``random`` partitioning).

    **Cost.** One more sort, of the filtered rows by a double (only the columns the aggregates,
    their FILTERs and the group keys read): benchmarks/results.md gives the ratio on 1,000,000
    rows. The answer is unchanged: ``COUNT(DISTINCT ...)``, ``COUNT`` and clamped sums do not
    depend on the order their rows arrive in. A subquery with ORDER BY is never pulled up into
    the outer query, so PostgreSQL keeps the order; ``random()`` is PARALLEL RESTRICTED, so the
    statement runs serially.

    A table with ``answer_quantum_ms`` reads its rows as stored: the quantum hides what a row
    adds below it, as it does for the limits on a statement's terms (rewriter/predicate_terms.py),
    so an operator who wants ``COUNT(DISTINCT)`` at PostgreSQL's own pace on a large table has it.
    """
    columns = [*used_columns(query), *(key.column.name for key in query.groups)]
    selected = ", ".join(bounded_outputs(query.table, columns, above)) or "1"
    return (f"(SELECT {selected} FROM {source} ORDER BY pg_catalog.random()) "
            f"AS {quote_identifier(query.table.name)}")


def _grouped_sql(query: AggregateQuery, parts: list[Part], source: str) -> str:
    """One pass over the filtered rows, grouped by each key's per-row expression, then one row per
    reported cell (and grid index, with a percentile).

    Each group reports the cell it falls in (one column per key, ``GroupKey.cell_sql``, and its
    grid index ``g``) and its parts; groups in no cell are left out, after grouping. A category,
    integer or floor key groups by the row's cell itself (``GroupKey.group_sql``), so its groups
    are its cells whatever values the rows hold. A reported cell may still receive several
    groups: the buckets a date part joins (month of year: one per year;
    ``KeyDomain.joint_keys``). An outer query then adds them up per cell, exactly (PostgreSQL's
    numeric sum is), by :func:`rewriter.date_parts.part_sql` of its bucket (``b``), which is
    equal for two buckets exactly where dpproxy's cell of them is, and reports the least of the
    cell's buckets, whose cell is the cell's. Without such a key each group is its cell's only
    one, and there is no outer query, whose GROUP BY PostgreSQL may implement with a sort of the
    groups (the presorted check, :func:`shuffled_source`, over groups in hash order: at most a
    small lever where the groups are few, none where the plan hashes; see docs/threat-model.md).

    A percentile splits each cell by grid index. Beside a numeric total (a part with a ``cut``),
    the outer query groups by the grouping sets (cell, index), whose rows carry the grid counts
    only, and (cell), whose rows carry every other part only: so a cell's totals are summed over
    all its indices too (:func:`split_by_index`). PostgreSQL hashes both sets, or sorts the groups
    (never the rows) once for the two: a sort over at most the groups, in hash order, as above.

    So the backend sends each reported cell's numeric totals in one row, whatever values the rows
    hold, cut to the digits their grid rounding needs (:func:`sent`), never with every fraction
    digit a row holds; dpproxy adds up only a cell's grid counts (:func:`split_cells`).

    **The released distribution is unchanged.** A cell's total is the sum over its groups of their
    exact clamped sums, which is the exact clamped sum over the cell's rows, as dpproxy's exact
    addition made it. Its cut, floor(T·10^D)·10^-D plus a sticky 5·10^-(D+1), rounds onto the sum
    grid as T does for every count n (``Grid.deciding_digits``; D is the policy's ``total_digits``),
    so each cell's grid point, hence its noise and its answer, is the exact one.
    """
    groups = query.groups
    joint = query.domain.joint_keys
    grouping = [key.group_sql() for key in groups]
    values = [f"{sql} AS v{i}" for i, sql in enumerate(grouping)]
    # Each group's cell from its value, once a group (written over the grouping expression again,
    # PostgreSQL computed it once a row: GroupKey.cell_sql).
    cells = [f"{key.cell_sql(f'v{i}')} AS k{i}" for i, key in enumerate(groups)]
    cells += [f"v{i} AS b{i}" for i in sorted(joint)]  # the bucket a joint key's cell is of
    grid = query_grid(query)
    if grid is not None:  # each cell's rows grouped by their grid index too
        index = grid_index(*grid)
        values.append(f"{index} AS g")
        grouping.append(index)
        cells.append("g")
    present = " AND ".join(f"k{i} IS NOT NULL" for i in range(len(groups)))
    split = split_by_index(query)

    def grouped(totals: list[str]) -> str:
        # OFFSET 0 keeps the filter on the groups: PostgreSQL would push a HAVING (or an outer
        # WHERE) on grouping expressions down to every row, computing each key twice per row.
        return (f"(SELECT {', '.join([*cells, *(f'p{i}' for i in range(len(parts)))])} FROM "
                f"(SELECT {', '.join([*values, *totals])} FROM {source} GROUP BY {', '.join(grouping)} OFFSET 0) "
                f"AS groups) AS cells WHERE {present}")

    if not split and not joint:
        # Each group reports a value of its own (a cell, a bucket, a time): it is its cell's only
        # row, and no outer query (whose GROUP BY PostgreSQL may sort) is needed.
        outputs = [*(f"k{i}" for i in range(len(groups))), *(["g"] if grid is not None else []),
                   *(f"p{i}" for i in range(len(parts)))]
        return f"SELECT {', '.join(outputs)} FROM " + grouped([f"{sent(part, part.sql)} AS p{i}" for i, part in enumerate(parts)])
    inner = grouped([f"{part.sql} AS p{i}" for i, part in enumerate(parts)])
    keys = [f"pg_catalog.min(k{i})" if i in joint else f"k{i}" for i in range(len(groups))]
    ids = [part_sql(groups[i].part, f"b{i}") if i in joint else f"k{i}" for i in range(len(groups))]
    if split:
        return (f"SELECT {', '.join([*keys, 'g', *_split_totals(parts)])} FROM {inner} "
                f"GROUP BY GROUPING SETS (({', '.join([*ids, 'g'])}), ({', '.join(ids)}))")
    totals = [sent(part, f"pg_catalog.sum(p{i})") for i, part in enumerate(parts)]
    if grid is not None:
        keys.append("g")
        ids.append("g")
    return f"SELECT {', '.join([*keys, *totals])} FROM {inner} GROUP BY {', '.join(ids)}"


def split_by_index(query: AggregateQuery) -> bool:
    """Whether a grouped :func:`backend_sql` sums a cell's parts other than a percentile's grid counts
    per cell, apart from the counts per (cell, grid index) (:func:`_grouped_sql`'s grouping sets):
    where a numeric total beside the percentile must be summed over the cell's indices, in the
    backend, before it is cut."""
    return query_grid(query) is not None and any(
        part.cut is not None for agg in query.aggregates for part in aggregate_parts(agg))


def _split_totals(parts: list[Part]) -> list[str]:
    """The outer query's parts over the grouping sets (cell, index) and (cell) (:func:`_grouped_sql`):
    a grid count on the first set's rows only, any other part, cut (:func:`sent`), on the second's
    only (NULL elsewhere: each is in exactly one row of its cell)."""
    return [f"CASE WHEN {operator('GROUPING(g)', '=', str(1 - part.per_grid))} THEN "
            f"{sent(part, f'pg_catalog.sum(p{i})')} END" for i, part in enumerate(parts)]


def partition_key(table: Relation, seed: int) -> str:
    """The SQL of a row's partition number in 0..m-1, computed from that row alone.

    A keyed hash of the row's hashed columns (``row_hash``, :func:`row_hash_key`) or of its
    ``ctid`` (``ctid_hash``), keyed by ``seed``; else a per-row ``random()`` draw, which
    ignores ``seed``. Why each is private: the module docstring.
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _SEED_MAX:
        raise ValueError(f"partition seed must be an integer in [0, 2^63), not {seed!r}")
    partitions = table.policy.partitions
    if table.partition_key == "row":
        return operator(operator(row_hash_key(table, seed), "&", str(_SEED_MAX)), "%", str(partitions))
    if table.partition_key == "ctid":
        return operator(operator(f"pg_catalog.hashtidextended(ctid, {seed})", "&", str(_SEED_MAX)), "%", str(partitions))
    return f"pg_catalog.floor({operator('pg_catalog.random()', '*', str(partitions))})"


# The types whose values ``row_hash`` hashes, by OID, and the SQL of one value's keyed hash
# ({column} is the quoted column, {seed} a bigint literal). Each function is total over its
# type (no value, NaN and ±Infinity included, makes it raise), immutable and PARALLEL SAFE,
# and NULL in gives NULL out. Text is hashed by its bytes (COLLATE "C"): no ICU sort key.
# Types not listed (date, timestamptz, json, point, arrays, domains, ...) are never hashed:
# a cast to a hashable type could raise (a date beyond timestamp's range), and some types
# have no extended hash at all (hash_record_extended raises on them, for a row it meets).
_TEXT_HASH = "pg_catalog.hashtextextended({column} COLLATE pg_catalog.\"C\", {seed})"
HASH_FUNCTIONS: dict[int, str] = {
    16: "pg_catalog.hashint4extended(CAST({column} AS integer), {seed})",  # boolean
    INT2: "pg_catalog.hashint2extended({column}, {seed})",
    INT4: "pg_catalog.hashint4extended({column}, {seed})",
    INT8: "pg_catalog.hashint8extended({column}, {seed})",
    FLOAT4: "pg_catalog.hashfloat4extended({column}, {seed})",  # -0 = 0, every NaN alike
    FLOAT8: "pg_catalog.hashfloat8extended({column}, {seed})",
    NUMERIC: "pg_catalog.hash_numeric_extended({column}, {seed})",  # NaN, ±Infinity included
    25: _TEXT_HASH,  # text
    1043: _TEXT_HASH,  # varchar
    1042: "pg_catalog.hashbpcharextended({column} COLLATE pg_catalog.\"C\", {seed})",  # char(n)
    1114: "pg_catalog.timestamp_hash_extended({column}, {seed})",  # timestamp (without time zone)
    2950: "pg_catalog.uuid_hash_extended({column}, {seed})",
}


def hashable(column: ColumnInfo) -> bool:
    """Whether ``row_hash`` can hash the column's values (its type is in :data:`HASH_FUNCTIONS`)."""
    return column.type_oid in HASH_FUNCTIONS


def hashed_columns(
    columns: Mapping[str, ColumnInfo], primary_key: Sequence[str] = (), key_only: bool = False
) -> tuple[str, ...]:
    """The columns ``row_hash`` hashes, chosen from the schema alone, never from the data.

    The primary key's, when the table has one whose columns are all hashable: the key tells
    rows apart, so no two rows share a partition by being equal, and one column is the
    cheapest to hash. Else every hashable column, in column order, so that only rows equal
    on all of them share a partition by force; or, with ``key_only`` (``partitioning:
    auto``), none. Empty when no column is hashable.
    """
    if primary_key and all(name in columns and hashable(columns[name]) for name in primary_key):
        return tuple(primary_key)
    if key_only:
        return ()
    return tuple(name for name, column in sorted(columns.items(), key=lambda item: item[1].attnum) if hashable(column))


def row_hash_key(table: Relation, seed: int) -> str:
    """The ``row_hash`` key before masking: the XOR of one keyed hash per hashed column.

    Column i (0-based, in ``table.hashed_columns``' order) is keyed by ``seed XOR (i + 1)``;
    a NULL hashes to 0. A table without hashed columns (the registry gives those ``random``)
    is refused here rather than given one partition.
    """
    if not table.hashed_columns:
        raise ValueError(f"row_hash partitioning of {table.display_name} has no columns to hash")
    terms = []
    for i, name in enumerate(table.hashed_columns):
        column = table.columns[name]
        value = HASH_FUNCTIONS[column.type_oid].format(column=column_sql(column), seed=seed ^ (i + 1))
        terms.append(f"COALESCE({value}, 0)")
    while len(terms) > 1:  # a balanced tree of XORs: nesting grows with log2 of the columns
        terms = [operator(terms[i], "#", terms[i + 1]) if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def seeded(query: AggregateQuery) -> bool:
    """Whether :func:`backend_sql`'s text for ``query`` depends on its seed (a hash key)."""
    # Only sample and aggregate has partition parts (aggregate_parts); checked without
    # writing their SQL, as this runs on every DP answer.
    return query.table.partition_key in ("ctid", "row") and any(
        agg.mechanism == "sample_aggregate" for agg in query.aggregates
    )


def partition_seed() -> int:
    """A fresh seed for one query's partitioning: 63 bits from :mod:`secrets`."""
    return secrets.randbits(63)


def _unused_name(table: Relation, name: str) -> str:
    """``name``, lengthened until no column of ``table`` has it."""
    while name in table.columns:
        name += "_"
    return name


def split_row(query: AggregateQuery, row: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The backend row of :func:`backend_sql` cut into each aggregate's parts.

    Additive parts stay as fetched (None where SQL gives NULL); partition parts become an
    array of the non-empty partitions' values (:func:`partition_values`); a grid part (the text
    of :func:`collected_counts`, or a cell's ``Counter`` of counts by grid index, as
    :func:`split_cells` gathers it) becomes the count on every index of the grid, in order.
    """
    grouped: list[tuple[Any, ...]] = []
    start = 0
    grid = query_grid(query)
    for agg in query.aggregates:
        parts = aggregate_parts(agg)
        values = row[start : start + len(parts)]
        grouped.append(tuple(_grid_counts(v, grid[1]) if p.per_grid and grid is not None
                             else v if p.additive else partition_values(v) for p, v in zip(parts, values)))
        start += len(parts)
    if start != len(row):
        raise ValueError(f"backend row has {len(row)} columns, the plan needs {start}")
    return grouped


def split_cells(query: AggregateQuery, rows: Sequence[Sequence[Any]]) -> list[list[tuple[Any, ...]]]:
    """The rows of a grouped :func:`backend_sql` as every cell's aggregates' parts, in cell order.

    ``rows`` hold each reported cell's values (one per key, as the backend printed them), its grid
    index if the query has a percentile, and its parts, loaded. Cells are numbered as
    ``query.domain`` numbers them; a cell no row reached gets parts of None (what SQL gives an
    empty set: the mechanisms read None as 0). A cell's numeric totals come in one of its rows,
    summed and cut in the backend (:func:`_grouped_sql`); the rows a percentile splits a cell into
    are added up (:func:`_added`), a grid part's count by its row's grid index, the other parts
    being NULL (None) in all of the cell's rows but one where a numeric total is among them
    (:func:`split_by_index`).
    """
    keys = query.groups
    domain = query.domain
    grid = query_grid(query)
    parts = [part for agg in query.aggregates for part in aggregate_parts(agg)]
    start = len(keys) + (grid is not None)
    totals: list[list[Any] | None] = [None] * domain.size
    for row in rows:
        cell = domain.cell([key.cell_of(value) for key, value in zip(keys, row)])
        if cell is None:
            continue
        values = list(row[start:])
        if grid is not None:
            index = grid[1].index(row[len(keys)]) if row[len(keys)] is not None else None
            values = [_at_index(index, value) if part.per_grid else value for part, value in zip(parts, values)]
        earlier = totals[cell]
        totals[cell] = values if earlier is None else [_added(a, b) for a, b in zip(earlier, values)]
    empty = [None] * len(parts)
    return [split_row(query, total if total is not None else empty) for total in totals]


def collected_counts(column: str) -> str:
    """The aggregate that collects each grid group's count of ``column`` with its index ``g``
    into one text, ``index:count`` pairs separated by commas (:func:`_grid_counts` reads it)."""
    return f"pg_catalog.string_agg(pg_catalog.concat_ws(':', g, {column}), ',') FILTER (WHERE g IS NOT NULL)"


def _at_index(index: int | None, count: Any) -> Counter[int] | None:
    """A group's grid part as counts by grid index (None: the group's values are NULL, on no index)."""
    return Counter({index: int(count)}) if index is not None and count else None


def _grid_counts(counts: Counter[int] | str | None, grid: QuantileGrid) -> list[int]:
    """The count on each index of ``grid``, in order (0 where no group reached it), from the
    groups' counts by index (:func:`split_cells`) or their collected text (:func:`collected_counts`;
    a group of NULL values has no index and is left out)."""
    if isinstance(counts, str):
        parsed: Counter[int] = Counter()
        for pair in counts.split(","):
            index, count = pair.split(":")
            parsed[grid.index(int(index))] += int(count)
        counts = parsed
    return [counts.get(i, 0) if counts is not None else 0 for i in range(grid.count)]


def quantile_grid(column: ColumnInfo, table: TablePolicy) -> QuantileGrid:
    """The candidates of a percentile of ``column``: its bounds and the table's ``quantile_cells``,
    the policy alone (``mechanisms.quantile``)."""
    assert column.policy is not None
    return column.policy.quantile_grid(column.type_oid in INTEGER_TYPES, table.quantile_cells)


def query_grid(query: AggregateQuery) -> tuple[ColumnInfo, QuantileGrid] | None:
    """The column whose grid the query's percentiles are counted on, and that grid; None without
    a percentile (``rewriter.dp_query`` refuses percentiles of two columns in one query)."""
    for agg in query.aggregates:
        if agg.mechanism == "quantile" and agg.column is not None:
            return agg.column, quantile_grid(agg.column, query.table.policy)
    return None


def grid_index(column: ColumnInfo, grid: QuantileGrid) -> str:
    """The SQL of a row's index on ``grid``, from its clamped value alone; NULL for NULL.

    On a grid of integers, the clamped value itself. On a grid of cells, ``width_bucket`` of the
    clamped value over the bounds (1 … count, and count + 1 for hi: ``QuantileGrid.index`` reads
    both). Neither can fail: the value is clamped first (NaN to hi, ±Infinity to the bounds), so
    ``width_bucket`` sees a finite value in [lo, hi], finite bounds lo < hi and a count ≥ 1,
    the only inputs for which it raises nothing; an integer column is read as a double, which
    cannot fail. Bounds lo = hi have one cell: the index is 1 for any value.
    """
    value = clamped(column)
    if grid.integers:
        return value
    name = column_sql(column)
    if grid.count == 1:
        return f"CASE WHEN {name} IS NOT NULL THEN 1 END"
    if column.type_oid == NUMERIC:
        bound = "pg_catalog.numeric"
        lo, hi = (bound_literal(b, column, upper) for b, upper in ((grid.lo, False), (grid.hi, True)))
    else:
        bound = "double precision"
        value = value if column.type_oid in FLOAT_TYPES else f"CAST({value} AS double precision)"
        lo, hi = repr(float(grid.lo)), repr(float(grid.hi))
    return f"pg_catalog.width_bucket({value}, CAST('{lo}' AS {bound}), CAST('{hi}' AS {bound}), {grid.count})"


def _added(a: Any, b: Any) -> Any:
    """Two groups' additive parts together, exactly (None, SQL's empty-set total, adds nothing).

    Numeric totals are ``Decimal``: added in :data:`_EXACT`, never rounded (the default context
    keeps 28 significant digits, so 1e20 + 1e-9 lost its 1e-9 and a cell's total was not the
    sum of its groups). Counts and ``bigint`` totals are ``int``, exact anyway.
    """
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, Counter):  # a cell's grid counts, added to in place: a cell has up to a grid's groups
        a.update(b)
        return a
    if isinstance(a, Decimal) or isinstance(b, Decimal):
        return _EXACT.add(a, b)
    return a + b


# A context in which adding two numerics' values is exact: a sum of two values of at most numeric's
# 131,072 + 16,383 digits has fewer digits than any precision Python can set, and no exponent leaves
# its range. Inexact and Rounded trap, so that an inexact sum would raise rather than be used.
_EXACT = Context(prec=MAX_PREC, Emax=MAX_EMAX, Emin=MIN_EMIN, traps=[Inexact, Rounded, Overflow, Underflow])


def collected(column: str) -> str:
    """The aggregate that collects the partitions' values of ``column`` into one partition part."""
    return f"pg_catalog.encode(pg_catalog.string_agg(pg_catalog.float8send({column}), CAST('' AS pg_catalog.bytea)), 'hex')"


def partition_values(text: str | bytes | None) -> np.ndarray:
    """Read a partition part (hex of big-endian float8 values) into floats; empty when no
    partition has a value.

    A partition whose values are all NULL has a NULL aggregate, which ``string_agg`` leaves
    out: it then counts as a partition with no rows, as the mechanism would count it.
    """
    if not text:
        return np.empty(0)
    if isinstance(text, bytes):
        text = text.decode("ascii")
    raw = bytes.fromhex(text)
    if len(raw) % 8:
        raise ValueError(f"partition part of {len(raw)} bytes is not a list of float8 values")
    return np.frombuffer(raw, dtype=">f8").astype(np.float64)  # NaN and ±Infinity come through as such


def clamped_sum(column: ColumnInfo) -> str:
    """The exact sum of the column's clamped values, for SUM and for a ``sum_count`` AVG.

    Integer and numeric columns: ``sum()`` of the clamped values, exact in PostgreSQL. Float
    columns: Σ rint(x·2^k) over the clamped values x, each term a ``bigint`` and the sum
    ``numeric``, exact too (``mechanisms.fixed_point``, the column's ``sum_grid``). A sum of
    doubles is rounded at every addition, relative to the running total and in an order a
    parallel plan varies, by more in all than one row's bound once the rows are many; and
    ``sum(real)`` would add up in ``real``, whose total overflows past 3.4e38. The scaled
    terms cannot fail: a clamped value times 2^k is below 2^52 in magnitude, and for k < 0 a
    value that the product would underflow is taken as 0, its grid point anyway.
    """
    if column.type_oid not in FLOAT_TYPES:
        return f"pg_catalog.sum({clamped(column)})"
    assert column.policy is not None
    grid = column.policy.sum_grid
    value = clamped(column)  # double precision, a real column's values converted exactly
    return f"pg_catalog.sum({_grid_point(value, grid.factor, grid.rounds_to_zero_below)})"


def _total(column: ColumnInfo, condition: str | None) -> Part:
    """A SUM's or a ``sum_count`` AVG's total: :func:`clamped_sum` over the rows where
    ``condition`` holds; a ``numeric`` column's is cut to the policy's ``total_digits`` where the
    backend sends it whole (:func:`sent`)."""
    total = filtered(clamped_sum(column), condition)
    if column.type_oid != NUMERIC:
        return Part(total)
    assert column.policy is not None
    return Part(total, cut=column.policy.total_digits)


def sent(part: Part, total: str) -> str:
    """What the backend sends for ``part`` as the query that releases it computes it (``total``:
    the part's SQL, or the sum of an inner query's values of it): :func:`decided_total` of it for
    a numeric total, which dpproxy rounds onto the sum grid exactly as it would the whole sum.

    Only a released total may be cut, the outermost sum of a statement without GROUP BY or a
    cell's sum of its groups (:func:`_grouped_sql`): the cut values of several groups do not add
    up to the cut of their sum. So a cell's numeric totals are summed in the backend, over every
    group and grid index of the cell, before they are cut.
    """
    return total if part.cut is None else decided_total(total, part.cut)


def decided_total(total: str, digits: int) -> str:
    """A numeric total T with at most ``digits`` + 1 fraction digits that rounds onto the sum
    grid as T does: T itself when it has at most ``digits`` fraction digits, else
    floor(T·10^D)·10^-D + 5·10^-(D+1), a value strictly between the same two points of the
    lattice 10^-D as T (``mechanisms.fixed_point.Grid.deciding_digits``: no rounding boundary
    lies strictly between them).

    The exact sum of clamped values keeps every fraction digit a row holds (up to 16,383): read
    whole, one such row makes dpproxy parse it and compute with it in rationals, ~8 ms more per
    answer (benchmarks/proxy_cost.py), a timing oracle on that row; so does a GROUP BY cell's
    (:func:`_grouped_sql`). This text's length depends
    on the policy and on the total's integer part only. Nothing here fails: T is a finite sum of
    clamped values (NULL stays NULL: a sum over no row).
    """
    scaled = operator(total, "*", f"CAST('1e{digits}' AS pg_catalog.numeric)")
    whole = f"pg_catalog.floor({scaled})"
    kept = operator(whole, "*", f"CAST('1e-{digits}' AS pg_catalog.numeric)")
    sticky = (f"CASE WHEN {operator(scaled, '=', whole)} THEN CAST(0 AS pg_catalog.numeric) "
              f"ELSE CAST('5e-{digits + 1}' AS pg_catalog.numeric) END")
    return operator(kept, "+", sticky)


def _grid_point(value: str, factor: float, tiny: float | None) -> str:
    """rint(``value``·2^k) as a ``bigint``: a clamped ``double precision`` value's point on a grid
    (``mechanisms.fixed_point.Grid``: ``factor`` its 2^k, ``tiny`` its ``rounds_to_zero_below``).

    It cannot fail: a clamped value times 2^k is below 2^52 in magnitude, and for k < 0 a value
    that the product would underflow is taken as 0, its grid point anyway.
    """
    scaled = operator(value, "*", f"CAST('{factor!r}' AS double precision)")
    if tiny is not None:
        small = operator(f"pg_catalog.abs({value})", "<", f"CAST('{tiny!r}' AS double precision)")
        scaled = f"CASE WHEN {small} THEN CAST(0 AS double precision) ELSE {scaled} END"
    return f"CAST({scaled} AS bigint)"


def centred_points(column: ColumnInfo) -> str:
    """A row's centred value d = p(x) − C on the column's moment grid (``mechanisms.variance``),
    for VARIANCE and STDDEV: an exact integer with |d| ≤ D, NULL for NULL, from that row alone.

    Integer columns: 2x − (lo + hi) over the clamped value x, in ``numeric`` (2x of a
    ``bigint`` could overflow). Float and numeric columns: the clamped value's point on the sum
    grid (a numeric value converted to ``double precision`` first, :func:`_to_double`, which
    cannot fail on a clamped value), clamped again into [p(lo), p(hi)] as a ``bigint``, so that
    |d| ≤ D holds by the SQL alone, whatever a conversion rounds; then minus C in ``numeric``
    (total, where ``bigint`` subtraction is not). None of it fails on any value: NULL stays
    NULL, NaN and ±Infinity are clamped to the bounds first.
    """
    assert column.policy is not None and column.policy.bounds is not None
    moments = column.policy.moment_grid(column.type_oid in INTEGER_TYPES)
    if column.type_oid in INTEGER_TYPES:
        doubled = operator(f"CAST({clamped(column)} AS pg_catalog.numeric)", "*", "CAST(2 AS pg_catalog.numeric)")
        return operator(doubled, "-", f"CAST('{moments.centre}' AS pg_catalog.numeric)")
    value = clamped(column) if column.type_oid in FLOAT_TYPES else _to_double(clamped(column), column)
    point = _grid_point(value, moments.grid.factor, moments.grid.rounds_to_zero_below)
    bounded = (f"pg_catalog.int8smaller(pg_catalog.int8larger({point}, CAST('{moments.low}' AS bigint)), "
               f"CAST('{moments.high}' AS bigint))")
    return operator(f"CAST({bounded} AS pg_catalog.numeric)", "-", f"CAST('{moments.centre}' AS pg_catalog.numeric)")


def clamped(column: ColumnInfo, value: str | None = None) -> str:
    """The column's values (or ``value``, an expression of the column's type) forced into its
    policy bounds [lo, hi]; NULL stays NULL.

    NULL must stay NULL, as SUM, AVG, MIN and MAX skip it and ``count(column)`` does not
    count it: ``LEAST(GREATEST(x, lo), hi)`` turns NULL into lo (GREATEST ignores NULL
    arguments), which made a NULL row add lo to the ``sum_count`` sum but nothing to its
    count, moving the centred sum by |lo| where the mechanism allows (hi − lo)/2. NaN and
    ±Infinity clamp to hi and lo as they would with LEAST/GREATEST.

    Columns of the built-in numeric types use the type's strict ``*larger``/``*smaller``
    functions, two function calls per row, which PostgreSQL evaluates in about half the time
    of the equivalent CASE (benchmarks/results.md); the value keeps the column's type, as it
    does with the CASE, except a ``real`` one's. Other types (domains) keep the CASE.

    The values are clamped to exactly the bounds the mechanisms scale their noise to, the
    policy's doubles, or inside them: a ``numeric`` bound is written as the double's shortest
    decimal only where that is not outside it, else as its exact decimal expansion (1e15 +
    0.375 prints as 1000000000000000.4, above the double), and a ``real`` value is converted to ``double precision`` (exactly)
    and clamped there, since a bound cast to ``real`` is rounded to 24 bits, as often outward
    as inward (16777217.5 becomes 16777218, one more than h = 0.75 allows from a lower bound
    of 16777216).
    """
    assert column.policy is not None and column.policy.bounds is not None
    lo, hi = (bound_literal(bound, column, upper) for bound, upper in zip(column.policy.bounds, (False, True)))
    name = column_sql(column) if value is None else value
    if column.type_oid == FLOAT4:
        name = f"CAST({name} AS double precision)"
    functions = _CLAMP_FUNCTIONS.get(column.type_oid)
    if functions is None:
        return f"CASE WHEN {operator(name, '<', lo)} THEN {lo} WHEN {operator(name, '>', hi)} THEN {hi} ELSE {name} END"
    larger, smaller, type_name = functions
    return (
        f"pg_catalog.{smaller}(pg_catalog.{larger}({name}, CAST({lo} AS {type_name})), "
        f"CAST({hi} AS {type_name}))"
    )


# Per column type: the strict functions clamped() nests (NULL in, NULL out; NaN sorts above
# every number, so it comes out as hi), and the type the bounds are cast to.
_CLAMP_FUNCTIONS = {
    INT2: ("int2larger", "int2smaller", "smallint"),
    INT4: ("int4larger", "int4smaller", "integer"),
    INT8: ("int8larger", "int8smaller", "bigint"),
    FLOAT4: ("float8larger", "float8smaller", "double precision"),  # on the value cast to double
    FLOAT8: ("float8larger", "float8smaller", "double precision"),
    NUMERIC: ("numeric_larger", "numeric_smaller", "numeric"),
}


def bound_literal(bound: float, column: ColumnInfo, upper: bool) -> str:
    """A bound as a literal of the column's type that is not outside the policy's double.

    A numeric bound is the double's shortest decimal where that lies on the inner side of
    the double (``0.1`` as an upper bound), else its exact expansion: never outside [lo, hi],
    and short for the usual bounds (long numerics would slow every sum they enter).
    """
    if column.type_oid in INTEGER_TYPES:
        return str(int(bound))
    if column.type_oid == NUMERIC:
        shortest, exact = Decimal(repr(float(bound))), Decimal(float(bound))
        inside = shortest <= exact if upper else shortest >= exact
        return repr(float(bound)) if inside else format(exact, "f")
    return repr(float(bound))
