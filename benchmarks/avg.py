"""Sample-and-aggregate AVG, MIN and MAX through dpproxy against plain AVG()/MIN()/MAX() on PostgreSQL.

For each of AVG, MIN and MAX, interleaved: the exact aggregate run directly; the SQL dpproxy
sends the backend for it (one pass grouping the rows into the policy's m partitions) run
directly under each partitioning — ``row_hash`` as ``partitioning: row_hash`` hashes the
benchmark table (no primary key, so every hashable column), ``row_hash`` over one integer
column (what the default, ``auto``, gives a table with a one-column integer primary key;
``fnlwgt`` stands in for the key, which is a matter of cost only: the benchmark reads no
answer), ``ctid_hash`` and ``random``; and the DP query through dpproxy under the policy's
default (``auto``, which is ``random`` on this key-less table). A rewritten SQL's
ratio is what the rewrite costs inside PostgreSQL, the DP query's what dpproxy's own work
(protocol, parsing, noise) adds on top.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from rewriter.dp_query import AggregateQuery
from rewriter.rewrite import backend_sql, hashed_columns, partition_seed

from .latency import Latency, Probe, measure
from .plans import plan_of
from .postgres import Endpoint

__all__ = ["AGGREGATES", "PARTITIONINGS", "AvgComparison", "compare_avg", "rewritten_sql"]

AGGREGATES = {
    "AVG": "SELECT AVG(hours_per_week) FROM {table} WHERE age > 40",
    "MIN": "SELECT MIN(age) FROM {table} WHERE hours_per_week > 40",
    "MAX": "SELECT MAX(age) FROM {table} WHERE hours_per_week > 40",
}
# label → the plan's table's partition key and hashed columns (None: every hashable column)
PARTITIONINGS: dict[str, tuple[Literal["row", "ctid", "random"], tuple[str, ...] | None]] = {
    "row_hash": ("row", None),
    "row_hash, one integer column": ("row", ("fnlwgt",)),
    "ctid_hash": ("ctid", ()),
    "random": ("random", ()),
}


@dataclass(frozen=True)
class AvgComparison:
    rows: int
    direct: dict[str, Latency]  # by aggregate
    rewritten: dict[str, dict[str, Latency]]  # by aggregate, then partitioning
    dpproxy: dict[str, Latency]  # by aggregate
    backend_sql: dict[str, str]  # AVG's, by partitioning
    hashed_columns: tuple[str, ...]  # what row_hash hashes on this table
    dpproxy_partitioning: str  # what the DP query through dpproxy used


def compare_avg(
    policy_path: Path, proxy: Endpoint, direct: Endpoint, table: str, rows: int, iterations: int
) -> AvgComparison:
    probes: list[Probe] = []
    sqls: dict[str, str] = {}
    hashed: tuple[str, ...] = ()
    used = ""
    for name, template in AGGREGATES.items():
        sql = template.format(table=table)
        plan = plan_of(policy_path, sql)
        used = {"row": "row_hash", "ctid": "ctid_hash"}.get(plan.table.partition_key, plan.table.partition_key)
        hashed = hashed_columns(plan.table.columns)
        variants = rewritten_sql(plan, hashed)
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
        used,
    )


def rewritten_sql(plan: AggregateQuery, every_column: tuple[str, ...]) -> dict[str, str]:
    """The backend SQL dpproxy runs for ``plan``, under each of :data:`PARTITIONINGS`
    (``row_hash`` hashing ``every_column``)."""
    seed = partition_seed()  # one partitioning, like one query's
    texts = {}
    for label, (key, columns) in PARTITIONINGS.items():
        table = replace(plan.table, partition_key=key, hashed_columns=every_column if columns is None else columns)
        texts[label] = backend_sql(replace(plan, table=table), seed=seed)
    return texts
