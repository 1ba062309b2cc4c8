"""A DP statement's backend SQL as PostgreSQL ran it after dpproxy's ``work_mem`` setting step: the
plan nodes ``EXPLAIN (ANALYZE)`` reports, for the tests that check a sort or hash stayed in memory
whatever the filter (tests/test_sort_memory.py, tests/test_attack_stop46_red.py,
tests/test_attack_stop46_hash.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg

from rewriter.dp_query import AggregateQuery
from rewriter.rewrite import backend_sql, partition_seed
from rewriter.sort_memory import memory_steps

__all__ = ["explained_after_step", "plan_nodes"]


def explained_after_step(dsn: str, plan: AggregateQuery, *settings: str) -> dict[str, Any]:
    """The root node of ``EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`` of ``plan``'s backend SQL, run on
    ``dsn`` after each of ``settings`` (an operator's, such as ``SET hash_mem_multiplier = 1``) and
    then ``plan``'s own setting step, as dpproxy runs it; rolled back after."""
    steps = memory_steps(plan, in_block=False)
    assert steps is not None
    with psycopg.connect(dsn) as conn:
        for setting in (*settings, steps.setting):
            conn.execute(setting)
        (explained,) = conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {backend_sql(plan, seed=partition_seed())}").fetchone()
        conn.rollback()
    root: dict[str, Any] = explained[0]["Plan"]
    return root


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """``node`` and every node below it."""
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)
