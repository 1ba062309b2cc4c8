"""The memory a DP statement's sorts and hash tables may take: enough that no filter tips one into
spilling, and the refusal of the statements that sort on a table too large for the operator's ceiling.

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

**What it does not bound.** A protected view's rows are not bounded by its pages (it may join or
expand its tables): it gets the ceiling, which closes the step only while its rows' sort fits
in it; such a view whose rows may outgrow it needs ``answer_quantum_ms``.

**The ceiling.** Read at start and reload (``Relation.sort_memory_kb``), a table whose bound is
above its ``max_sort_memory_mb`` and that has no ``answer_quantum_ms`` refuses the statements that
sort or hash its rows before any charge (54000, rule ``sort-memory``): their memory would be
the operator's to grant. Decided from the table's size when the policy was loaded, never from
a statement's rows.
"""

from __future__ import annotations

from typing import NamedTuple

from policies.errors import SQLSTATE, Refusal
from policies.tables import Relation

from .dp_query import AggregateQuery
from .rewrite import sorts_rows

__all__ = ["MIN_ROW_BYTES", "ROW_BYTES", "SLACK_BYTES", "MemorySteps", "memory_steps", "sort_memory_kb_sql",
           "sort_memory_refusal",
           "within_sort_memory", "work_mem_setting"]

ROW_BYTES = 256
"""The memory, as PostgreSQL counts it against ``work_mem``, one row may take in one sort or hash
node, with what its values add (module docstring)."""
MIN_ROW_BYTES = 28
"""The least a heap row takes of its page: its header (23 bytes, aligned to 24) and line pointer (4)."""
SLACK_BYTES = 32_768
"""A page of the largest block size PostgreSQL allows: the row a neighbouring table holds more may
add one."""
_MAX_WORK_MEM_KB = 2_147_483_647  # PostgreSQL's most, on 64-bit builds
_SAVED = "dpproxy_internal.work_mem"  # where a block's own work_mem waits while the statement runs


def sort_memory_kb_sql(oid: int | str, descendants: bool = True) -> str:
    """SQL for the bound, in kB (an ``int8``), of relation ``oid`` (or an SQL expression of a
    ``regclass``) as it is now (module docstring): every row its pages and one page more can hold,
    at ``ROW_BYTES`` each. With ``descendants`` its partitions' and inheritance children's pages
    too (``pg_partition_tree``: ~0.2 ms a statement more, so only for a relation that had some when
    the policy was loaded, ``Relation.sort_memory_tree``)."""
    relation = f"CAST({oid} AS pg_catalog.regclass)" if isinstance(oid, int) else oid
    size = f"pg_catalog.pg_relation_size({relation})"
    if descendants:
        tree = (f"(SELECT CAST(pg_catalog.sum(pg_catalog.pg_relation_size(p.relid)) AS pg_catalog.int8) "
                f"FROM pg_catalog.pg_partition_tree({relation}) AS p)")
        size = f"GREATEST({size}, {tree})"
    rows = f"({size} + {SLACK_BYTES}) / {MIN_ROW_BYTES} + 1"
    return f"LEAST({_MAX_WORK_MEM_KB}, (({rows}) * {ROW_BYTES} + 1023) / 1024)"


def work_mem_setting(oid: int | str, ceiling_mb: int, descendants: bool) -> str:
    """The statement that sets ``work_mem``, for the transaction, to relation ``oid``'s bound (as
    :func:`sort_memory_kb_sql`) and at least ``ceiling_mb``."""
    bound = sort_memory_kb_sql(oid, descendants)
    value = f"CAST(GREATEST({ceiling_mb * 1024}, {bound}) AS pg_catalog.text) OPERATOR(pg_catalog.||) 'kB'"
    return f"SELECT pg_catalog.set_config('work_mem', {value}, true)"


class MemorySteps(NamedTuple):
    """The statements that set a DP statement's ``work_mem`` before it and give the block's back
    after it (None: nothing to give back, the setting ends with the implicit transaction)."""

    setting: str
    restore: str | None


def memory_steps(plan: AggregateQuery, in_block: bool) -> MemorySteps | None:
    """The steps that run ``plan``'s backend SQL with ``work_mem`` at the table's bound (at least its
    ceiling), or None when its plan neither sorts nor hashes rows (COUNT, SUM, MODE: nothing to set)
    or the table has ``answer_quantum_ms``.

    ``set_config(..., true)`` holds until the transaction ends: outside a block that is the
    pipeline's Sync; in a client's block the value the block had is kept aside and put back by
    ``restore``, sent right after the statement, so the client never sees another."""
    table = plan.table
    if table.policy.answer_quantum_ms or not sorts_rows(plan):
        return None  # a quantum hides the step (docs/threat-model.md), and PostgreSQL's own setting holds
    setting = work_mem_setting(table.oid, table.policy.max_sort_memory_mb, table.sort_memory_tree)
    if not in_block:
        return MemorySteps(setting, None)
    saved = f"SELECT pg_catalog.set_config('{_SAVED}', pg_catalog.current_setting('work_mem'), true) AS saved"
    return MemorySteps(f"{setting} FROM ({saved}) AS saved",
                       f"SELECT pg_catalog.set_config('work_mem', pg_catalog.current_setting('{_SAVED}'), true)")


def within_sort_memory(plan: AggregateQuery) -> AggregateQuery:
    """``plan``, or its :func:`sort_memory_refusal` (or its series limit's ranking's) raised."""
    for part in (plan, plan.series.ranking if plan.series is not None else None):
        refusal = sort_memory_refusal(part) if part is not None else None
        if refusal is not None:
            raise refusal
    return plan


def sort_memory_refusal(plan: AggregateQuery) -> Refusal | None:
    """The refusal of ``plan`` when it sorts or hashes rows of a table without ``answer_quantum_ms``
    whose bound when the policy was loaded (``Relation.sort_memory_kb``) is above its
    ``max_sort_memory_mb``; None otherwise. Decided by the statement, the policy and the table's
    size at load, before any charge."""
    table = plan.table
    if table.policy.answer_quantum_ms or not sorts_rows(plan) or not _over_ceiling(table):
        return None
    needed_mb = -(-table.sort_memory_kb // 1024)
    return Refusal(
        SQLSTATE.PROGRAM_LIMIT_EXCEEDED,
        f"a statement that sorts or groups the rows of protected table {table.display_name} would need up to "
        f"{needed_mb:,} MB of memory for its sorts, above the table's max_sort_memory_mb "
        f"({table.policy.max_sort_memory_mb:,}) (rule: sort-memory)",
        "COUNT(DISTINCT), GROUP BY, percentiles and sample-and-aggregate AVG/MIN/MAX sort or hash every row a "
        "filter reaches, all in memory so that their time cannot tell a row's presence; an administrator can raise "
        f"the table's max_sort_memory_mb in the policy to at least {needed_mb:,}, or set answer_quantum_ms on it, and "
        "reload. COUNT, SUM, sum-and-count AVG and MODE are answered. Nothing was charged.",
        "sort-memory",
    )


def _over_ceiling(table: Relation) -> bool:
    return table.sort_memory_kb > table.policy.max_sort_memory_mb * 1024
