"""Warn the administrator when sample and aggregate will answer mostly noise on a table.

MIN, MAX and AVG where the policy says ``avg: sample_aggregate`` (AVG's default is
``sum_count``, which has no partitions) split the filtered rows into ``partitions`` parts and release a noisy median of the parts' values. With fewer than about 30 rows per
partition many parts are empty or tiny, and the answer drifts to the middle of the bounds
(docs/mechanisms.md, "Choosing m"). Nothing is refused for it: the guarantee holds, only the
usefulness does not. ``check-config`` and ``serve`` report it from the backend's row
estimate (``pg_class.reltuples``, which the administrator may see; analysts may not).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from policies.model import Policy, TablePolicy
from policies.tables import Relation, TableRegistry

from .connection import BackendSession

__all__ = ["ROWS_PER_PARTITION", "estimated_rows", "partition_warnings", "usefulness_warnings"]

ROWS_PER_PARTITION: Final = 30
_MIN_PARTITIONS: Final = 3  # the policy's lower bound on partitions


def partition_warnings(name: str, policy: TablePolicy, rows: float | None) -> list[str]:
    """The warning for table ``name`` with about ``rows`` rows (None: no estimate), or none."""
    if policy.access != "protected" or rows is None or policy.delta <= 0:
        return []
    bounded = [column_name for column_name, column in policy.columns.items() if column.bounds is not None]
    if not bounded:
        return []  # no MIN or MAX (nor AVG) can be asked
    m = policy.partitions
    if rows >= ROWS_PER_PARTITION * m:
        return []
    sampled_avg = [column_name for column_name in bounded if policy.avg_method(column_name) == "sample_aggregate"]
    if not sampled_avg:
        what, fix, avoid = "MIN and MAX", "", "do not rely on MIN and MAX"
    else:
        which = "" if len(sampled_avg) == len(bounded) else f" of {', '.join(sampled_avg)}"
        what = f"AVG{which}, MIN and MAX"
        fix = ", or avg: sum_count for AVG"
        avoid = "use avg: sum_count for AVG and do not rely on MIN and MAX"
    head = (f"tables.{name}.partitions: about {rows:,.0f} rows for {m} partitions "
            f"({rows / m:.3g} rows each, {ROWS_PER_PARTITION} or more needed): {what} by sample and aggregate "
            f"will be mostly noise")
    fitting = int(rows // ROWS_PER_PARTITION)
    if fitting >= _MIN_PARTITIONS:
        return [f"{head}; set partitions: {fitting} or lower ({ROWS_PER_PARTITION} rows each){fix} "
                "(docs/mechanisms.md, Choosing m; fewer rows after a WHERE make it worse)"]
    return [f"{head}; the table is too small for sample and aggregate at any partitions: {avoid} "
            "(docs/mechanisms.md, Choosing m)"]


async def estimated_rows(session: BackendSession, relations: Mapping[int, Relation]) -> dict[int, float | None]:
    """Each relation's row estimate from the backend's statistics (None: never analysed).

    A partitioned table's estimate is the sum over its leaf partitions.
    """
    if not relations:
        return {}
    rows = await session.fetch_all(
        "SELECT r.oid::pg_catalog.int8, "
        "CASE WHEN r.relkind OPERATOR(pg_catalog.=) 'p' THEN (SELECT pg_catalog.sum(CASE WHEN c.reltuples OPERATOR(pg_catalog.>) 0 THEN c.reltuples ELSE 0 END) "
        "FROM pg_catalog.pg_partition_tree(r.oid) AS t JOIN pg_catalog.pg_class AS c ON c.oid OPERATOR(pg_catalog.=) t.relid "
        "WHERE t.isleaf) ELSE r.reltuples END::pg_catalog.float8 "
        "FROM pg_catalog.pg_class AS r WHERE r.oid::pg_catalog.int8 OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.int8[])",
        (list(relations),),
    )
    # reltuples is -1 for a relation never vacuumed or analysed (PostgreSQL >= 14).
    return {int(oid): (float(estimate) if estimate is not None and estimate >= 0 else None) for oid, estimate in rows}


async def usefulness_warnings(session: BackendSession, registry: TableRegistry, policy: Policy) -> list[str]:
    """Each protected table's warning where sample and aggregate would answer mostly noise."""
    rows = await estimated_rows(session, registry.by_oid)
    names = {id(table_policy): name for name, table_policy in policy.tables.items()}
    return [warning for oid, relation in registry.by_oid.items()
            for warning in partition_warnings(names[id(relation.policy)], relation.policy, rows.get(oid))]
