"""The memory a DP statement's sorts and hash tables may take: enough that no filter tips one into
spilling, and the refusal of the statements that sort on a table too large for the operator's ceiling.
A GROUP BY over declared keys is bounded by its cells instead, whatever the table's size.

**Why.** A sort keeps its rows in memory up to ``work_mem`` and, past it, writes them all to
temporary files and merges them; a hash aggregate spills its groups past ``work_mem`` ×
``hash_mem_multiplier``. The analyst chooses the filter (``id <= k``), so one row at the edge
added a step of ~10–35 % of the statement's time, which told that row's presence
(benchmarks/work_mem_step.py, docs/threat-model.md: Timing, **work_mem**). So a statement whose
plan can sort or hash its rows (:func:`rewriter.rewrite.sorts_rows`) runs with ``work_mem`` set,
for its own transaction, to a bound no filter can outgrow: what a sort or hash of every row the
relation can hold, and one page more, may take.

**The bound.** A heap row takes at least 28 bytes of its page (its header, 23 bytes aligned to
24, and its line pointer), so a relation of b bytes holds at most b / 28 rows (291 to an 8 kB
page, what PostgreSQL allows). A row held by one sort or hash node took at most 147 bytes as
PostgreSQL counts it against ``work_mem`` (``EXPLAIN (ANALYZE)``'s ``Memory``, PostgreSQL 15 and
16, 200,000 rows: a sort 62–87 bytes a row, a hash aggregate of a group a row 105–147, with one
aggregate or six; benchmarks/sort_memory_bound.py); a value the row holds adds at most 2.5 times
its bytes (a hash table of 255-byte values: 608 bytes a row), and those bytes are the row's own in
the page (a value read is stored in the row uncompressed, or it reads as NULL:
rewriter/text_bounds.py), so they only lower the rows a page holds: ``ROW_BYTES`` = 256 a row
covers both with a margin (the bound was 2.3 to 12.6 times what was taken). The relation's bytes
are its ``pg_relation_size`` (and its partitions' and inheritance children's, where it had some
when the policy was loaded), read by the statement's own step when it runs (so a table that grew
since the load is still covered), plus ``SLACK_BYTES``, a page of the largest block size, for the
row a neighbouring table holds more. The setting is at least the table's ceiling
(``max_sort_memory_mb``): a sort takes the memory its rows need, never its ``work_mem``, so a
setting above that need costs nothing, and the value a client in a transaction block could read
(``SHOW work_mem``, restored right after the statement, :func:`memory_steps`) is the policy's.

**A GROUP BY over declared keys** (of counts and sums: no ``COUNT(DISTINCT)``, percentile or
sample and aggregate, which sort rows) groups each row by its cell (``GroupKey.group_sql``: a
category's number, or the declared category it equals, found by a hashed list; an integer within
the bounds; a bucket of the declared range), so its groups are at most
:func:`~rewriter.rewrite.grouped_values` whatever the rows hold, a function of the statement and
the policy. Before, a category key grouped by the raw value first (mapping each
group to its cell after), so that a column of distinct values held a group a row: its hash table
grew with the rows, and every GROUP BY ran under the table's bound and was refused on a table
past the ceiling, the histograms BI tools draw among them. Nothing rested on the raw value's
grouping but speed (the CASE once a group rather than once a row): the cells, their answers and
each row's cell are the same, and the work limit already weighed a key's comparisons with the
categories once a row (rewriter/single_reads.py). Speed is what it costs: a text key's backend
SQL takes 1.07 to 1.34 times the raw value's grouping (benchmarks/results.md). The hash table's
memory is then what those groups take (:func:`hashed_groups_kb`): ``GROUP_BYTES`` a group, twice
the bytes its keys' values hold (``KEY_ROUNDING``: a hashed category key's group holds the category
itself, and a memory context rounds the tuple up to a power of two; weighed nothing before, three keys
of 1,400-byte categories spilled past ~600 groups, tests/test_attack_stop46_red.py), what the
planner may estimate the columns its aggregates read to take in a group's entry (:func:`_input_bytes`:
a hash aggregate admits only ``work_mem`` × ``hash_mem_multiplier`` over that estimate groups before it
spills, however little they take, and the estimate is the statistics' average width, so a FILTER on a
column of 7,000-byte values spilled 1,000 groups of counts from the 383rd, at 109 kB; a heap tuple
for each column other than a number or a time) and
each part's state, a count's ``COUNT_STATE_BYTES``, a sum's ``SUM_STATE_BYTES``, a ``numeric`` column's exact total's
``NUMERIC_STATE_BYTES`` (its accumulator spans every digit a clamped value may hold, 34 kB
measured), besides ``HASH_BASE_BYTES``, twice (a hash aggregate that expects to spill keeps a
quarter of its memory for its buffers). A hash aggregate checks its memory as it adds a group, so
the bound holds at every group a filter can add. The statement runs with ``work_mem`` at that,
``enable_sort`` off and ``enable_hashagg`` on for its transaction: a sorted GroupAggregate would
sort every row (PostgreSQL chose one under an operator's ``enable_hashagg = off``, and may where it
estimates groups past ``work_mem``), which only the table's bound covers; with hashing possible for every key's type,
PostgreSQL then hashes. A bound within the ceiling needs no table bound, and its statement is
never refused; one above it (tens of thousands of cells) falls back to the table's bound and its
refusal. The setting is small (a few MB for 1,000 cells), which also keeps the hash table's first
buckets, sized by the planner's estimate of the groups (a column's distinct values), small.

**A table-bound statement's groups** (a percentile's (cell, grid index) groups, sample and
aggregate's partitions, a ``COUNT(DISTINCT)``'s cells, a GROUP BY past its cells' bound) are
weighed on top of the rows' bound, as a GROUP BY's are (:func:`_table_groups`): a group of one row
can keep more than a row's 256 bytes, an exact ``numeric`` total 34 kB, and at a ceiling just
above the table's bound a percentile's grid groups beside a ``numeric`` SUM spilled once hashed
(1,000 cells of 20 rows at 14 MB: a peak of 28.7 MB, 5 batches; tests/test_sort_memory.py). The
setting also counts each group at the planner's estimate of its input (:func:`_input_bytes`), as a
GROUP BY's does: a hashed group past ``work_mem`` × ``hash_mem_multiplier`` over that estimate
spills however little it holds, and a ``char(2000)`` never analysed is estimated at 8,004 bytes, so a
FILTER on one over 5,000 cells of one narrow row each spilled from ~2,000 groups at the 16 MB
ceiling (tests/test_attack_stop46_hash.py). The refusal weighs what groups hold only: a setting
permits and never allocates, so no estimate refuses a statement.

**A view** stores no rows: its pages bound none of them, and it may join or expand its
relations' rows or compute wider values than they store. One PostgreSQL can show does neither, a
simple view (one relation's rows, each column one of its columns: proxy/backend/view_rows.py),
is bounded by the pages of the relations it reads (``Relation.sort_memory_bases``), read by the
step as a table's are. Any other view's statements that sort rows are refused before any charge
without ``answer_quantum_ms`` (54000, rule ``sort-memory``): before, it got the ceiling alone,
and a view joining a table with 50 rows spilled at 1 MB from a filter of 600 rows. A GROUP BY of
counts and sums within its cells' bound is answered on any view (its groups are its cells; a column
such a view computes weighs the values it is computed from, which PostgreSQL carries into the hash
aggregate's input, ``Relation.view_input_bytes``: an ``octet_length(u)`` over 7,000-byte values
spilled 1,000 cells from ~500 at 8 bytes, tests/test_attack_stop46_hash.py).

**The ceiling.** Read at start and reload (``Relation.sort_memory_kb``), a table whose bound is
above its ``max_sort_memory_mb`` and that has no ``answer_quantum_ms`` refuses the statements that
sort or hash its rows before any charge (54000, rule ``sort-memory``): their memory would be
the operator's to grant. Decided from the table's size when the policy was loaded, never from
a statement's rows. A table that grows past the ceiling after the load is not refused until a
reload, and is never answered below its bound: the step reads its size as the statement runs
(so the grant then exceeds the ceiling, which only permits: a sort takes what its rows need).
Refusing on the size at the statement's moment was weighed and left: the table's size is not
public (the catalog's sizes read as NULL), and whether the step raised would be a noiseless bit
of it, at a moment the analyst chooses, that one row's page can tip; the load's decision is one
bit at the operator's moment.
"""

from __future__ import annotations

from decimal import Decimal
from typing import NamedTuple

from policies.errors import SQLSTATE, Refusal
from policies.tables import ColumnInfo, Relation

from .dp_query import Aggregate, AggregateQuery
from .group_keys import DATE, TIMESTAMP, TIMESTAMPTZ
from .rewrite import Part, aggregate_parts, bound_literal, grouped_values, query_grid, sorts_rows, used_columns
from .types import BOOL, FLOAT_TYPES, INTEGER_TYPES, NUMERIC, numeric_precision

__all__ = ["COUNT_STATE_BYTES", "FIXED_WIDTHS", "GROUP_BYTES", "HASH_BASE_BYTES", "KEY_ROUNDING", "MIN_ROW_BYTES", "NUMERIC_STATE_BYTES",
           "ROW_BYTES", "SLACK_BYTES", "SUM_STATE_BYTES", "MemorySteps", "column_input_bytes", "hashed_groups_kb", "memory_steps", "numeric_total_bytes", "sort_memory_kb_sql",
           "sort_memory_refusal", "within_sort_memory", "work_mem_setting"]

ROW_BYTES = 256
"""The memory, as PostgreSQL counts it against ``work_mem``, one row may take in one sort or hash
node, with what its values add (module docstring)."""
MIN_ROW_BYTES = 28
"""The least a heap row takes of its page: its header (23 bytes, aligned to 24) and line pointer (4)."""
SLACK_BYTES = 32_768
"""A page of the largest block size PostgreSQL allows: the row a neighbouring table holds more may
add one."""
HASH_BASE_BYTES = 262_144
"""What a hash aggregate takes before its groups: its table's first buckets and memory contexts
(measured at 40 kB with 100 groups)."""
GROUP_BYTES = 1_024
"""What one group of a hash aggregate takes besides its parts' states and the bytes its keys' values
hold (``KEY_ROUNDING``): its entry, bucket and key tuple of numbers (measured at 123 to 409 bytes a
group with one count)."""
COUNT_STATE_BYTES = 64
"""A count's state in a group (a by-value ``int8``: measured at 16 to 36 bytes, 600 counts a group)."""
SUM_STATE_BYTES = 1_024
"""Another sum's state in a group: of integers (an ``int8``, an ``int128`` accumulator), of grid
points or of a variance's centred points in ``numeric`` (numbers below 2^107: measured at 170 to
500 bytes a part)."""
KEY_ROUNDING = 2
"""What a group's key tuple may take for each byte a key's value holds in it (``GroupKey.held_bytes``:
a hashed category key's declared category): PostgreSQL's memory contexts round a chunk up to a power
of two (below 8 kB; a larger one is a block of its own), so a tuple of 2,100 bytes takes 4 kB
(measured on PostgreSQL 16: three keys of 1,400-byte categories, 729 groups, 5.2 MB)."""
NUMERIC_STATE_BYTES = 40_960
"""A ``numeric`` column's exact total in a group: its accumulator holds a digit of every place
from the highest a clamped value reaches (1.8e308 at most) to the least any value has (16,383
fraction digits, in a value of a few bytes), twice: measured at 34,069 to 34,478 bytes a group
with 1e307 and 1e-16383 in each."""
_ROWS_DIGITS = 19  # a total of up to 10^19 rows' values has 19 more integer digits than a value


def numeric_total_bytes(column: ColumnInfo) -> int:
    """The most a ``numeric`` column's exact total takes in a group. Of a ``numeric(p, s)``, whose
    values have at most ``s`` fraction digits and ``p - s`` integer digits, and whose clamp bounds
    (:func:`~rewriter.rewrite.bound_literal`) as many as they are written with, its accumulator holds
    a base-10,000 digit for every four places from the highest a total reaches to the least a value
    has, in two 4-byte words (its positive and negative sums), rounded up to a power of two: twice
    that and ``SUM_STATE_BYTES`` for the state around it. Of an unconstrained ``numeric``, whose
    values may have 16,383 fraction digits, ``NUMERIC_STATE_BYTES`` (measured)."""
    precision = numeric_precision(column.value_type[1])
    if precision is None or column.policy is None or column.policy.bounds is None:
        return NUMERIC_STATE_BYTES
    scale = (column.value_type[1] - 4) & 0xFFFF
    bounds = [Decimal(bound_literal(bound, column, upper))
              for bound, upper in zip(column.policy.bounds, (False, True))]
    integer = max([precision - scale, *(max(0, bound.adjusted() + 1) for bound in bounds)])
    fraction = max([scale, *(max(0, -int(bound.as_tuple().exponent)) for bound in bounds)])
    words = (integer + _ROWS_DIGITS + fraction) // 4 + 3
    return min(NUMERIC_STATE_BYTES, 2 * 2 * 4 * words + SUM_STATE_BYTES)


FIXED_WIDTHS = frozenset({*INTEGER_TYPES, *FLOAT_TYPES, BOOL, DATE, TIMESTAMP, TIMESTAMPTZ})
"""The types of eight bytes or fewer (integers, floats, boolean, date, timestamp, timestamptz) whose
width the planner knows without statistics; any other column's width it estimates from them."""
_BPCHAR = 1042
_ENCODING_BYTES = 4  # the most bytes a character takes in any server encoding: a char(n)'s estimate
_HASH_MARGIN = 2  # a hash aggregate's limit can be 3/4 of its memory (its spill buffers' quarter)
_MAX_WORK_MEM_KB = 2_147_483_647  # PostgreSQL's most, on 64-bit builds
_SAVED = "dpproxy_internal."  # where a block's own settings wait while the statement runs


def sort_memory_kb_sql(relations: int | str | tuple[int, ...], descendants: bool = True) -> str:
    """SQL for the bound, in kB (an ``int8``), of relation ``relations`` (an OID or an SQL expression
    of a ``regclass``; a tuple: the relations a view's rows come from, their pages added up) as it
    is now (module docstring): every row its pages and one page more can hold, at ``ROW_BYTES``
    each. With ``descendants`` its partitions' and inheritance children's pages too, at every
    level (``pg_inherits``, walked recursively: ~0.2 ms a statement more, so only for a relation that had some when
    the policy was loaded, ``Relation.sort_memory_tree``, and a view's)."""
    return f"LEAST({_MAX_WORK_MEM_KB}, ((({_rows_sql(relations, descendants)}) * {ROW_BYTES} + 1023) / 1024))"


def _rows_sql(relations: int | str | tuple[int, ...], descendants: bool) -> str:
    """SQL for the most rows ``relations``' pages and one page more can hold, now."""
    sizes = " + ".join(_bytes_sql(relation, descendants)
                       for relation in (relations if isinstance(relations, tuple) else (relations,)))
    return f"({sizes or '0'} + {SLACK_BYTES}) / {MIN_ROW_BYTES} + 1"


def _bytes_sql(oid: int | str, descendants: bool) -> str:
    relation = f"CAST({oid} AS pg_catalog.regclass)" if isinstance(oid, int) else oid
    size = f"pg_catalog.pg_relation_size({relation})"
    if descendants:
        # pg_inherits, not pg_partition_tree: that lists a partitioned table's partitions only, never
        # an inheritance parent's children, whose rows a statement on the parent reads all the same.
        tree = (f"(WITH RECURSIVE tree(relid) AS (SELECT CAST({relation} AS pg_catalog.oid) UNION "
                "SELECT i.inhrelid FROM pg_catalog.pg_inherits AS i JOIN tree AS t "
                "ON i.inhparent OPERATOR(pg_catalog.=) t.relid) "
                "SELECT CAST(pg_catalog.sum(pg_catalog.pg_relation_size(CAST(relid AS pg_catalog.regclass))) "
                "AS pg_catalog.int8) FROM tree)")
        size = f"GREATEST({size}, {tree})"
    return size


def work_mem_setting(oid: int | str, ceiling_mb: int, descendants: bool) -> str:
    """The statement that sets ``work_mem``, for the transaction, to relation ``oid``'s bound (as
    :func:`sort_memory_kb_sql`) and at least ``ceiling_mb``."""
    return f"SELECT pg_catalog.set_config('work_mem', {_at_least(ceiling_mb, sort_memory_kb_sql(oid, descendants))}, true)"


def table_bound_sql(plan: AggregateQuery) -> str:
    """SQL for what ``plan``'s sorts and hash tables may take, in kB, as its relation is now: a
    sort or hash of every row it can hold (:func:`sort_memory_kb_sql`; a view's, its base
    relations', ``Relation.sort_memory_bases``), and its groups (:func:`_table_groups`), each at
    what a hash aggregate counts it (:func:`_hashed_group_bytes`)."""
    table = plan.table
    bases = table.sort_memory_bases
    relations, descendants = ((table.oid, table.sort_memory_tree) if not bases else (bases, True))
    bound = sort_memory_kb_sql(relations, descendants)
    groups = _table_groups(plan)
    if not groups:
        return bound
    rows = _rows_sql(relations, descendants)
    states = (f"(({_HASH_MARGIN} * ({HASH_BASE_BYTES} + LEAST({groups}, {rows}) * {_hashed_group_bytes(plan)}) "
              "+ 1023) / 1024)")
    return f"LEAST({_MAX_WORK_MEM_KB}, {bound} + {states})"


def _at_least(ceiling_mb: int, bound_kb: str) -> str:
    """The ``work_mem`` value of SQL ``bound_kb``, at least ``ceiling_mb``."""
    return f"CAST(GREATEST({ceiling_mb * 1024}, {bound_kb}) AS pg_catalog.text) OPERATOR(pg_catalog.||) 'kB'"


class MemorySteps(NamedTuple):
    """The statements that set a DP statement's ``work_mem`` before it and give the block's back
    after it (None: nothing to give back, the setting ends with the implicit transaction)."""

    setting: str
    restore: str | None


def memory_steps(plan: AggregateQuery, in_block: bool) -> MemorySteps | None:
    """The steps that run ``plan``'s backend SQL with its sorts and hash tables held in memory, or
    None when the table has ``answer_quantum_ms`` or the plan neither sorts nor groups rows
    (COUNT, SUM, MODE: nothing to set).

    A GROUP BY within its :func:`hashed_groups_kb` runs with ``work_mem`` at that bound, hashing
    (``enable_sort`` off, ``enable_hashagg`` on); any other statement that sorts or groups rows
    with ``work_mem`` at the table's bound (at least its ceiling, :func:`work_mem_setting`).
    ``set_config(..., true)`` holds until the transaction ends: outside a block that is the
    pipeline's Sync; in a client's block the values the block had are kept aside and put back by
    ``restore``, sent right after the statement, so the client never sees another."""
    table = plan.table
    if table.policy.answer_quantum_ms:
        return None  # a quantum hides the step (docs/threat-model.md), and PostgreSQL's own settings hold
    grouped = hashed_groups_kb(plan)
    if grouped is not None:
        settings = {"work_mem": f"'{grouped}kB'", "enable_sort": "'off'", "enable_hashagg": "'on'"}
    elif _needs_table_bound(plan):
        settings = {"work_mem": _at_least(table.policy.max_sort_memory_mb, table_bound_sql(plan))}
    else:
        return None
    setting = "SELECT " + ", ".join(f"pg_catalog.set_config('{name}', {value}, true)" for name, value in settings.items())
    if not in_block:
        return MemorySteps(setting, None)
    saved = ", ".join(f"pg_catalog.set_config('{_SAVED}{name}', pg_catalog.current_setting('{name}'), true) AS {name}"
                      for name in settings)
    restore = ", ".join(f"pg_catalog.set_config('{name}', pg_catalog.current_setting('{_SAVED}{name}'), true)"
                        for name in settings)
    return MemorySteps(f"{setting} FROM (SELECT {saved}) AS saved", f"SELECT {restore}")


def hashed_groups_kb(plan: AggregateQuery) -> int | None:
    """The memory, in kB, that ``plan``'s hash tables of groups may take, for a GROUP BY that sorts
    no rows (:func:`~rewriter.rewrite.sorts_rows`) and whose bound is within the table's
    ceiling; None otherwise (no keys, a plan that sorts rows, or a bound above the ceiling: the
    table's bound then holds, :func:`work_mem_setting`).

    Its groups are at most :func:`~rewriter.rewrite.grouped_values` whatever the rows hold (each
    key groups by a row's cell or bucket), each taking at most ``GROUP_BYTES``, ``KEY_ROUNDING``
    times the bytes its keys' values hold (a hashed category key's longest category) and its parts'
    states (:func:`_state_bytes`), besides ``HASH_BASE_BYTES``; twice that, since a hash
    aggregate that expects to spill keeps up to a quarter of its memory for its spill buffers and
    counts its groups against the planner's estimate of their size. Decided by the statement and
    the policy alone."""
    if not plan.groups or sorts_rows(plan):
        return None
    kb = _hash_table_kb(grouped_values(plan), _hashed_group_bytes(plan))
    return kb if kb <= plan.table.policy.max_sort_memory_mb * 1024 else None


def _hash_table_kb(groups: int, per_group: int) -> int:
    """What a hash aggregate of ``groups`` groups of ``per_group`` bytes each may take, in kB
    (:func:`hashed_groups_kb`)."""
    return -(-_HASH_MARGIN * (HASH_BASE_BYTES + groups * per_group) // 1024)


def _hashed_group_bytes(plan: AggregateQuery) -> int:
    """What one group of ``plan``'s hash aggregate is counted at against its ``work_mem``: what it
    holds (:func:`_held_group_bytes`) and the planner's estimate of its input (:func:`_input_bytes`),
    which takes no memory but limits the groups admitted before a spill."""
    return _held_group_bytes(plan) + _input_bytes(plan)


def _held_group_bytes(plan: AggregateQuery) -> int:
    """The memory one group of ``plan``'s hash aggregate holds: its :func:`_group_bytes` and
    ``KEY_ROUNDING`` times the bytes its keys' values hold."""
    return _group_bytes(plan) + sum(KEY_ROUNDING * key.held_bytes for key in plan.groups)


def _group_bytes(plan: AggregateQuery) -> int:
    """The most one group of ``plan``'s GROUP BY takes: ``GROUP_BYTES`` and each part's state
    (:func:`_state_bytes`; a sample-and-aggregate AVG of a ``numeric`` column sums it exactly,
    ``NUMERIC_STATE_BYTES``)."""
    return GROUP_BYTES + sum(_state_bytes(part, agg.column, exact=_sums_numeric(agg))
                             for agg in plan.aggregates for part in aggregate_parts(agg))


def _sums_numeric(agg: Aggregate) -> bool:
    """Whether ``agg``'s partition values are exact sums of a ``numeric`` column (sample and
    aggregate's AVG: its clamped sum over its count)."""
    return (agg.mechanism == "sample_aggregate" and agg.kind == "avg" and agg.column is not None
            and agg.column.type_oid == NUMERIC)


def _input_bytes(plan: AggregateQuery) -> int:
    """The most the planner may estimate the columns the aggregates and their FILTERs read to take
    in a group's entry (its ``hashentrysize``, of which the hash aggregate allows only ``work_mem``
    × ``hash_mem_multiplier`` / ``hashentrysize`` groups before it spills, however little they
    take): eight bytes a column of :data:`FIXED_WIDTHS`; for any other, its statistics' average
    stored width, which is of the rows that hold a value (NULLs left out, so two columns each set
    where the other is NULL average a tuple each) and at most a heap tuple's (``SLACK_BYTES``, a
    page of the largest block size), or without statistics its type's estimate (a ``char(n)``'s n
    characters of four bytes). Both are the rows' or the schema's, never a filter's: weighed at
    their most, no filter tips the count of groups past that limit. A column of a view that computes
    its columns carries the values it is computed from: weighed as read at load
    (``Relation.view_input_bytes``, proxy/backend/view_widths.py)."""
    carried = plan.table.view_input_bytes
    return sum(carried[name] if name in carried else column_input_bytes(*plan.table.columns[name].value_type)
               for name in used_columns(plan))


def column_input_bytes(type_oid: int, modifier: int) -> int:
    """The most the planner may estimate a column of type ``type_oid`` (a domain's base type) and
    ``modifier`` to take in an aggregate's input (:func:`_input_bytes`): eight bytes one of
    :data:`FIXED_WIDTHS`, else a heap tuple's (``SLACK_BYTES``) or a ``char(n)``'s n characters of
    four bytes, the larger."""
    if type_oid in FIXED_WIDTHS:
        return 8
    char_estimate = (modifier - 4) * _ENCODING_BYTES + 4 if type_oid == _BPCHAR and modifier > 4 else 0
    return max(SLACK_BYTES, char_estimate)


def _state_bytes(part: Part, column: ColumnInfo | None, exact: bool = False) -> int:
    """The most one group's state of ``part`` (of an aggregate of ``column``) takes: a count's, a
    numeric column's exact total's (:func:`numeric_total_bytes`; ``exact``: a part that sums it
    exactly though it releases no total), another sum's."""
    if (exact or part.cut is not None) and column is not None:
        return numeric_total_bytes(column)
    return COUNT_STATE_BYTES if part.sql.startswith("pg_catalog.count(") else SUM_STATE_BYTES


def _table_groups(plan: AggregateQuery) -> int:
    """The most groups a table-bound ``plan``'s GROUP BY holds, whatever the rows (its cells, times
    a percentile's grid indices and NULL's, times sample and aggregate's partitions); 0 when it
    groups nothing (a ``COUNT(DISTINCT)`` alone).

    The table's bound weighs a row at 256 bytes, and a group of one row can keep more: an exact
    ``numeric`` total's accumulator spans every digit from the highest a clamped value reaches to
    the least any value has, so two 7-byte values make a group's state of 34 kB. At a ceiling just
    above the table's bound, a percentile's grid groups beside a ``numeric`` SUM spilled once
    hashed (sample and aggregate's 512 partitions of a ``numeric`` AVG peaked at 16.7 MB, within
    that table's hash memory, which a smaller table's bound would not hold). So the groups' states are weighed on top
    of the rows' bound, as :func:`hashed_groups_kb` weighs them, for at most these groups and the
    rows the relation can hold (a group holds one at least)."""
    grid = query_grid(plan)
    partitioned = any(agg.mechanism == "sample_aggregate" for agg in plan.aggregates)
    if not (plan.groups or grid is not None or partitioned):
        return 0
    return (grouped_values(plan) * (grid[1].count + 2 if grid is not None else 1)
            * (plan.table.policy.partitions if partitioned else 1))


def _loaded_bound_kb(plan: AggregateQuery) -> int:
    """The memory :func:`table_bound_sql` grants ``plan`` for its relation's size when the policy was
    loaded, of which it can take: its groups weighed at what they hold (:func:`_held_group_bytes`),
    not at the planner's estimate of their input, which only raises the groups admitted (a
    setting permits, never allocates), so no estimate refuses a statement."""
    kb = plan.table.sort_memory_kb
    groups = min(_table_groups(plan), kb * 1024 // ROW_BYTES)  # the rows: at least those the bound was of
    return kb + (_hash_table_kb(groups, _held_group_bytes(plan)) if groups else 0)


def _needs_table_bound(plan: AggregateQuery) -> bool:
    """Whether ``plan`` sorts or groups rows in memory no policy bounds: it sorts rows, or it is a
    GROUP BY whose :func:`hashed_groups_kb` is above the ceiling."""
    return sorts_rows(plan) or (bool(plan.groups) and hashed_groups_kb(plan) is None)


def within_sort_memory(plan: AggregateQuery) -> AggregateQuery:
    """``plan``, or its :func:`sort_memory_refusal` (or its series limit's ranking's) raised."""
    for part in (plan, plan.series.ranking if plan.series is not None else None):
        refusal = sort_memory_refusal(part) if part is not None else None
        if refusal is not None:
            raise refusal
    return plan


def sort_memory_refusal(plan: AggregateQuery) -> Refusal | None:
    """The refusal of ``plan`` when it sorts or hashes rows of a relation without
    ``answer_quantum_ms`` whose bound when the policy was loaded (``Relation.sort_memory_kb``, and
    its groups' states, :func:`_table_groups`) is above its ``max_sort_memory_mb``,
    or whose rows no pages bound (a view that may expand its relations' rows,
    ``Relation.sort_memory_bases``); None otherwise. Decided by the statement, the policy and the
    catalog at load, before any charge."""
    table = plan.table
    if table.policy.answer_quantum_ms or not _needs_table_bound(plan):
        return None
    if table.sort_memory_bases is None:
        return _unbounded_view_refusal(table)
    needed_kb = _loaded_bound_kb(plan)
    if needed_kb <= table.policy.max_sort_memory_mb * 1024:
        return None
    needed_mb = -(-needed_kb // 1024)
    return Refusal(
        SQLSTATE.PROGRAM_LIMIT_EXCEEDED,
        f"a statement that sorts or groups the rows of protected table {table.display_name} would need up to "
        f"{needed_mb:,} MB of memory for its sorts, above the table's max_sort_memory_mb "
        f"({table.policy.max_sort_memory_mb:,}) (rule: sort-memory)",
        "COUNT(DISTINCT), percentiles and sample-and-aggregate AVG/MIN/MAX sort or hash every row a filter "
        "reaches, and a GROUP BY whose cells' sums need more than max_sort_memory_mb holds its groups, all in memory "
        "so that their time cannot tell a row's presence; an administrator can raise the table's max_sort_memory_mb "
        f"in the policy to at least {needed_mb:,}, or set answer_quantum_ms on it, and reload. COUNT, SUM, "
        "sum-and-count AVG, MODE and a GROUP BY of fewer cells or sums are answered. Nothing was charged.",
        "sort-memory",
    )


def _unbounded_view_refusal(table: Relation) -> Refusal:
    return Refusal(
        SQLSTATE.PROGRAM_LIMIT_EXCEEDED,
        f"a statement that sorts or groups the rows of protected view {table.display_name} is not answered: the "
        "view may join or expand the rows of the relations it reads, or compute its values, so no size bounds "
        "the memory its sorts take (rule: sort-memory)",
        "COUNT(DISTINCT), percentiles and sample-and-aggregate AVG/MIN/MAX sort or hash every row a filter "
        "reaches, in memory no filter can outgrow so that their time cannot tell a row's presence; on this view "
        "that memory has no bound. An administrator can set answer_quantum_ms on the view, protect a "
        "materialized view of it instead, or define it as a simple view (one table's rows, each column one of "
        "its columns), and reload. COUNT, SUM, sum-and-count AVG, MODE and a GROUP BY of declared keys whose "
        "groups fit in max_sort_memory_mb (fewer cells, or fewer columns read) are answered. Nothing was charged.",
        "sort-memory",
    )
