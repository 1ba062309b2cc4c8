"""AVG by sample and aggregate through dpproxy against a plain AVG() on PostgreSQL.

Four probes, interleaved: the exact ``AVG()`` run directly, the SQL dpproxy sends the
backend for it (one pass grouping the rows into the policy's m partitions; the benchmark
policy partitions the largest table by a keyed hash of each row's ctid) run directly, the
same SQL with the default ``partitioning: random`` run directly, and the DP AVG through
dpproxy. The rewritten SQL's ratio is what the rewrite costs inside PostgreSQL, the DP
AVG's what dpproxy's own work (protocol, parsing, noise) adds on top.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from rewriter.rewrite import backend_sql, partition_seed

from .latency import QUERIES, Latency, Probe, measure
from .plans import plan_of
from .postgres import Endpoint

__all__ = ["AvgComparison", "compare_avg", "rewritten_sql"]


@dataclass(frozen=True)
class AvgComparison:
    rows: int
    direct: Latency
    rewritten: Latency
    rewritten_random: Latency
    dpproxy: Latency
    backend_sql: str
    random_sql: str


def compare_avg(
    policy_path: Path, proxy: Endpoint, direct: Endpoint, table: str, rows: int, iterations: int
) -> AvgComparison:
    sql = QUERIES["AVG"].format(table=table)
    rewritten, random_sql = rewritten_sql(policy_path, sql)
    times = measure(
        [
            Probe.on("direct", direct, sql),
            Probe.on("rewritten", direct, rewritten),
            Probe.on("random", direct, random_sql),
            Probe.on("dpproxy", proxy, sql),
        ],
        iterations,
    )
    return AvgComparison(
        rows, times["direct"], times["rewritten"], times["random"], times["dpproxy"], rewritten, random_sql
    )


def rewritten_sql(policy_path: Path, sql: str) -> tuple[str, str]:
    """The backend SQL dpproxy runs for the DP query ``sql`` under the policy at ``policy_path``,
    and the same under ``partitioning: random``."""
    plan = plan_of(policy_path, sql)
    seed = partition_seed()  # one partitioning, like one query's
    random_plan = replace(plan, table=replace(plan.table, partition_key="random"))
    return backend_sql(plan, seed=seed), backend_sql(random_plan, seed=seed)
