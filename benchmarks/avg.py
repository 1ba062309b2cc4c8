"""Sample-and-aggregate AVG, MIN and MAX through dpproxy against plain AVG()/MIN()/MAX() on PostgreSQL.

For each of AVG, MIN and MAX, interleaved: the exact aggregate run directly; the SQL dpproxy
sends the backend for it (one pass grouping the rows into the policy's m partitions) run
directly under each partitioning — ``row_hash`` as the benchmark table gets it (no primary
key, so every hashable column is hashed), ``row_hash`` over one integer column (what a table
with a one-column integer primary key gets; ``fnlwgt`` stands in for the key, which is a
matter of cost only: the benchmark reads no answer), ``ctid_hash`` and ``random``; and the DP
query through dpproxy (the policy's partitioning, the default ``row_hash``). A rewritten SQL's
ratio is what the rewrite costs inside PostgreSQL, the DP query's what dpproxy's own work
(protocol, parsing, noise) adds on top.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from rewriter.dp_query import AggregateQuery
from rewriter.rewrite import backend_sql, partition_seed

from .latency import Latency, Probe, measure
from .plans import plan_of
from .postgres import Endpoint

__all__ = ["AGGREGATES", "PARTITIONINGS", "AvgComparison", "compare_avg", "rewritten_sql"]

AGGREGATES = {
    "AVG": "SELECT AVG(hours_per_week) FROM {table} WHERE age > 40",
    "MIN": "SELECT MIN(age) FROM {table} WHERE hours_per_week > 40",
    "MAX": "SELECT MAX(age) FROM {table} WHERE hours_per_week > 40",
}
# label → how the plan's table is changed (None: as the policy has it)
PARTITIONINGS = {
    "row_hash": None,
    "row_hash, one integer column": {"partition_key": "row", "hashed_columns": ("fnlwgt",)},
    "ctid_hash": {"partition_key": "ctid"},
    "random": {"partition_key": "random"},
}


@dataclass(frozen=True)
class AvgComparison:
    rows: int
    direct: dict[str, Latency]  # by aggregate
    rewritten: dict[str, dict[str, Latency]]  # by aggregate, then partitioning
    dpproxy: dict[str, Latency]  # by aggregate
    backend_sql: dict[str, str]  # AVG's, by partitioning
    hashed_columns: tuple[str, ...]  # what the policy's row_hash hashes


def compare_avg(
    policy_path: Path, proxy: Endpoint, direct: Endpoint, table: str, rows: int, iterations: int
) -> AvgComparison:
    probes, sqls, hashed = [], {}, ()
    for name, template in AGGREGATES.items():
        sql = template.format(table=table)
        plan = plan_of(policy_path, sql)
        hashed = plan.table.hashed_columns
        variants = rewritten_sql(plan)
        if name == "AVG":
            sqls = variants
        probes.append(Probe.on(f"{name}|direct", direct, sql))
        probes += [Probe.on(f"{name}|{label}", direct, text) for label, text in variants.items()]
        probes.append(Probe.on(f"{name}|dpproxy", proxy, sql))
    times = measure(probes, iterations)
    return AvgComparison(
        rows,
        {name: times[f"{name}|direct"] for name in AGGREGATES},
        {name: {label: times[f"{name}|{label}"] for label in PARTITIONINGS} for name in AGGREGATES},
        {name: times[f"{name}|dpproxy"] for name in AGGREGATES},
        sqls,
        hashed,
    )


def rewritten_sql(plan: AggregateQuery) -> dict[str, str]:
    """The backend SQL dpproxy runs for ``plan``, under each of :data:`PARTITIONINGS`."""
    seed = partition_seed()  # one partitioning, like one query's
    return {
        label: backend_sql(plan if change is None else replace(plan, table=replace(plan.table, **change)), seed=seed)
        for label, change in PARTITIONINGS.items()
    }
