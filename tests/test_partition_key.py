"""The sample-and-aggregate partition key: random() by default; with ``partitioning:
ctid_hash`` a keyed hash of each row's ctid, refused where there is no usable ctid, and a
plan PostgreSQL can run in parallel.

Privacy rests on a row's partition depending on that row alone (rewriter/rewrite.py's module
docstring): pinned here on a real table by deleting and inserting other rows.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest
from conftest import TEST_POLICY, TestDatabase, make_policy

from policies.loader import PolicyError
from policies.model import Policy
from policies.tables import Relation, TableRegistry
from proxy.backend.connection import build_registry, connect
from proxy.demo.embedded import SERVICE_ROLE
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql, partition_key, partition_seed, seeded, split_row

M = 16
KEY_POLICY = TEST_POLICY[: TEST_POLICY.index("tables:")] + f"""
tables:
  public.pk_table: &keyed
    epsilon: 1.0
    delta: 1.0e-6
    partitions: {M}
    avg: sample_aggregate  # AVG is partitioned only by sample and aggregate (the default is sum_count)
    partitioning: ctid_hash
    columns: &columns
      v: {{{{bounds: [0, 100]}}}}
      partition: {{{{bounds: [0, 100]}}}}
  public.pk_parted: *keyed
  public.pk_view:
    epsilon: 1.0
    partitions: {M}
    avg: sample_aggregate
    columns: *columns
"""

_TABLES = """
DROP VIEW IF EXISTS pk_view;
DROP TABLE IF EXISTS pk_table, pk_parted;
CREATE TABLE pk_table (v integer, partition integer);
INSERT INTO pk_table SELECT i % 101, i % 7 FROM generate_series(1, 2000) i;
CREATE VIEW pk_view AS SELECT * FROM pk_table;
CREATE TABLE pk_parted (v integer, partition integer) PARTITION BY RANGE (v);
CREATE TABLE pk_parted_low PARTITION OF pk_parted FOR VALUES FROM (MINVALUE) TO (50);
CREATE TABLE pk_parted_high PARTITION OF pk_parted FOR VALUES FROM (50) TO (MAXVALUE);
INSERT INTO pk_parted SELECT * FROM pk_table;
"""


@pytest.fixture(scope="module")
def registry(test_db: TestDatabase) -> TableRegistry:
    """The tables above, and the policy's registry as dpproxy builds it when it starts."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(_TABLES)
        conn.execute(f"GRANT SELECT ON pk_table, pk_view, pk_parted TO {SERVICE_ROLE}")
    return _build_registry(make_policy(test_db, Path("unused.sqlite3"), KEY_POLICY))


def _build_registry(policy: Policy) -> TableRegistry:
    async def build() -> TableRegistry:
        session = await connect(policy)
        try:
            return await build_registry(session, policy)
        finally:
            await session.close()

    return asyncio.run(build())


def _relation(registry: TableRegistry, name: str) -> Relation:
    return next(r for r in registry.by_oid.values() if r.name == name)


def _partitions(conn: psycopg.Connection, relation: Relation, seed: int, table: str | None = None) -> dict[str, int]:
    """Each row's partition under ``seed``, by ctid, computed by the key dpproxy writes."""
    sql = f"SELECT ctid::text, {partition_key(relation, seed)} FROM {table or relation.qualified_name}"
    return {ctid: int(p) for ctid, p in conn.execute(sql).fetchall()}


def test_a_view_cannot_be_partitioned_by_ctid_hash(test_db: TestDatabase, registry) -> None:
    policy = make_policy(test_db, Path("unused.sqlite3"), KEY_POLICY.replace(
        "  public.pk_view:\n    epsilon: 1.0\n", "  public.pk_view:\n    epsilon: 1.0\n    partitioning: ctid_hash\n"
    ))
    with pytest.raises(PolicyError, match="pk_view.partitioning: ctid_hash needs a table"):
        _build_registry(policy)


def test_partitioning_is_random_unless_the_policy_chooses_ctid_hash(registry):
    assert _relation(registry, "pk_table").partition_key == "ctid"
    assert _relation(registry, "pk_parted").partition_key == "ctid"
    view = _relation(registry, "pk_view")
    assert view.partition_key == "random"
    sql = backend_sql(plan_aggregate_query("SELECT AVG(v) FROM pk_view", view), seed=partition_seed())
    assert "pg_catalog.random()" in sql and "hashtidextended" not in sql and "ctid" not in sql
    table_sql = backend_sql(plan_aggregate_query("SELECT AVG(v) FROM pk_table", _relation(registry, "pk_table")), seed=7)
    assert "hashtidextended(ctid, 7)" in table_sql and "random" not in table_sql


def test_a_rows_partition_does_not_depend_on_the_other_rows(registry, admin):
    relation, seed = _relation(registry, "pk_table"), partition_seed()
    admin.execute("DROP TABLE IF EXISTS pk_scratch")
    admin.execute("CREATE TABLE pk_scratch AS SELECT * FROM pk_table")
    try:
        before = _partitions(admin, relation, seed, "pk_scratch")
        assert set(before.values()) == set(range(M))  # m partitions, every one used by 2000 rows
        removed = sorted(before)[100]
        admin.execute("DELETE FROM pk_scratch WHERE ctid = %s::tid", (removed,))
        admin.execute("VACUUM pk_scratch")  # the freed slot may go to the row inserted next
        admin.execute("INSERT INTO pk_scratch VALUES (50, 3)")
        after = _partitions(admin, relation, seed, "pk_scratch")
    finally:
        admin.execute("DROP TABLE IF EXISTS pk_scratch")
    kept = set(before) - {removed}
    assert len(after) == len(before) and kept < set(after)
    assert {ctid: after[ctid] for ctid in kept} == {ctid: before[ctid] for ctid in kept}
    assert set(after.values()) <= set(range(M))


def test_each_seed_gives_its_own_partitioning(registry, admin):
    relation = _relation(registry, "pk_table")
    assert _partitions(admin, relation, 12345) == _partitions(admin, relation, 12345)  # deterministic
    first, second = _partitions(admin, relation, 1), _partitions(admin, relation, 2)
    same = sum(first[ctid] == second[ctid] for ctid in first) / len(first)
    assert same < 3 / M  # ≈ 1/m for unrelated partitionings
    plan = plan_aggregate_query("SELECT MIN(v) FROM pk_table", relation)
    assert backend_sql(plan, seed=99) == backend_sql(plan, seed=99) != backend_sql(plan, seed=100)


def test_sample_and_aggregate_runs_on_tables_views_and_partitioned_tables(registry, admin):
    for name in ("pk_table", "pk_view", "pk_parted"):
        plan = plan_aggregate_query("SELECT AVG(v), MAX(v), COUNT(*), MIN(partition) FROM " + name, _relation(registry, name))
        parts = split_row(plan, admin.execute(backend_sql(plan, seed=partition_seed())).fetchone())
        assert len(parts[0][0]) == M and parts[2] == (2000,), name  # 2000 rows fill all 16 partitions
        assert all(0 <= v <= 100 for v in parts[1][0])
        assert all(0 <= v <= 6 for v in parts[3][0])  # MIN of the column named like the key


def test_the_partitioned_aggregate_can_run_in_parallel(registry, admin):
    plan = plan_aggregate_query("SELECT AVG(v) FROM pk_table WHERE v > 3", _relation(registry, "pk_table"))
    with admin.transaction():
        # pk_table is small: let PostgreSQL consider workers as it would for a large table.
        for setting in ("min_parallel_table_scan_size = 0", "parallel_setup_cost = 0", "parallel_tuple_cost = 0"):
            admin.execute(f"SET LOCAL {setting}")
        plan_text = "\n".join(row[0] for row in admin.execute("EXPLAIN " + backend_sql(plan, seed=5)).fetchall())
    assert "Gather" in plan_text and "Partial HashAggregate" in plan_text, plan_text


def test_only_ctid_hash_partitioned_queries_depend_on_the_seed(registry):
    table, view = _relation(registry, "pk_table"), _relation(registry, "pk_view")
    for relation, sql, expected in (
        (table, "SELECT AVG(v) FROM pk_table", True),
        (table, "SELECT COUNT(*), SUM(v) FROM pk_table", False),
        (view, "SELECT AVG(v) FROM pk_view", False),
    ):
        plan = plan_aggregate_query(sql, relation)
        assert seeded(plan) is expected, sql
        assert (backend_sql(plan, seed=1) != backend_sql(plan, seed=2)) is expected, sql
