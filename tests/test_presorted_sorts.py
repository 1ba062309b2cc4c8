"""No DP statement's sort reads the table in its physical order: one row cannot decide whether
a sort finds its input presorted (docs/threat-model.md, Timing).

PostgreSQL's in-memory sort checks first whether its input is in order and returns after n − 1
comparisons if it is. On a table appended in a column's order, a late row below the others made
``COUNT(DISTINCT col)`` sort in earnest (benchmarks/presorted.py). Pinned on the plans
PostgreSQL makes of the backend SQL dpproxy writes, on a table appended in every column's
order: a statement with ``COUNT(DISTINCT ...)`` reads its rows through a Sort by ``random()``
(:func:`rewriter.rewrite.shuffled_source`) before anything sorts them by value, and the other
shapes do not sort rows by value at all (hash aggregates). Timing is never asserted.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from conftest import TEST_POLICY, TestDatabase, make_policy, policy_registry

from policies.tables import Relation
from proxy.demo.embedded import SERVICE_ROLE
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql, partition_seed, split_row

ROWS = 20_000
POLICY = TEST_POLICY[: TEST_POLICY.index("tables:")] + """
tables:
  public.ps_appended:
    epsilon: 1.0
    delta: 1.0e-6
    partitions: 16
    avg: sample_aggregate
    columns:
      big: {{bounds: [0, 100000000000]}}
      age: {{bounds: [0, 100], group_by: true}}
      n: {{bounds: [0, 100], group_by: true}}
      ts: {{bounds: ["2021-01-01", "2025-12-31"], group_by: [month]}}
      cat: {{categories: [a, b, c], group_by: true}}
      label: {{categories: [a, b, c], group_by: true, other: other}}
"""
# Every column in the order of the rows' insertion, as an id or a timestamp is; the last row's
# values are below all the others (what made the sort of COUNT(DISTINCT big) a full one).
_TABLE = f"""
DROP TABLE IF EXISTS ps_appended;
CREATE TABLE ps_appended (id integer PRIMARY KEY, big bigint, age integer, n numeric, ts timestamptz, cat text,
                          label text);
INSERT INTO ps_appended SELECT g, g * 1000003::bigint, g * 100 / {ROWS}, g * 100.0 / {ROWS},
    '2021-01-01'::timestamptz + g * interval '1 hour', (ARRAY['a', 'b', 'c'])[1 + g * 3 / ({ROWS} + 1)],
    'v' || lpad(g::text, 9, '0') FROM generate_series(1, {ROWS}) g;
INSERT INTO ps_appended VALUES ({ROWS} + 1, 0, 0, 0, '2021-01-01', 'a', 'a');
ANALYZE ps_appended;
"""

DISTINCT_SHAPES = (
    "SELECT COUNT(DISTINCT big) FROM ps_appended",
    "SELECT COUNT(*), COUNT(DISTINCT big), SUM(age) FROM ps_appended WHERE cat = 'a' AND age > 3",
    "SELECT COUNT(DISTINCT big) FILTER (WHERE n > 5), COUNT(*) FILTER (WHERE age < 50) FROM ps_appended",
    "SELECT COUNT(DISTINCT age) FROM ps_appended WHERE ts > '2021-03-01'",
    "SELECT date_trunc('month', ts) AS m, COUNT(DISTINCT big) FROM ps_appended GROUP BY 1",
    "SELECT age, COUNT(DISTINCT big) FROM ps_appended GROUP BY age",
    "SELECT cat, COUNT(DISTINCT big) FROM ps_appended GROUP BY cat",
)
OTHER_SHAPES = (
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY big) FROM ps_appended",
    "SELECT MODE() WITHIN GROUP (ORDER BY cat) FROM ps_appended",
    "SELECT AVG(big), MIN(n) FROM ps_appended",
    "SELECT label, COUNT(*) FROM ps_appended GROUP BY label",
    "SELECT age, COUNT(*), SUM(big) FROM ps_appended GROUP BY age",
    "SELECT date_trunc('month', ts) AS m, percentile_disc(0.9) WITHIN GROUP (ORDER BY n) FROM ps_appended GROUP BY 1",
    "SELECT width_bucket(n, 0, 100, 10) AS b, COUNT(*) FROM ps_appended GROUP BY 1",
    # An outer query over the groups: a date part's buckets per cell, a percentile's totals per cell.
    "SELECT EXTRACT(MONTH FROM ts) AS m, COUNT(*), SUM(n) FROM ps_appended GROUP BY 1",
    "SELECT EXTRACT(QUARTER FROM ts) AS q, date_trunc('year', ts) AS y, AVG(n) FROM ps_appended GROUP BY 1, 2",
    "SELECT date_trunc('month', ts) AS m, SUM(n), percentile_disc(0.9) WITHIN GROUP (ORDER BY n) FROM ps_appended "
    "GROUP BY 1",
    "SELECT EXTRACT(MONTH FROM ts) AS m, SUM(n), percentile_cont(0.5) WITHIN GROUP (ORDER BY age) FROM ps_appended "
    "GROUP BY 1",
    "SELECT label, AVG(n), percentile_disc(0.5) WITHIN GROUP (ORDER BY n) FROM ps_appended GROUP BY label",
    "SELECT VARIANCE(n), STDDEV(big) FROM ps_appended",
)


def _appended(database: TestDatabase) -> Relation:
    """``ps_appended`` made on ``database``, and its relation as dpproxy builds it when it starts."""
    with psycopg.connect(database.admin_dsn, autocommit=True) as conn:
        conn.execute(_TABLE)
        conn.execute(f"GRANT SELECT ON ps_appended TO {SERVICE_ROLE}")
    registry = policy_registry(make_policy(database, Path("unused.sqlite3"), POLICY))
    return next(r for r in registry.by_oid.values() if r.name == "ps_appended")


@pytest.fixture(scope="module")
def appended(test_db: TestDatabase) -> Relation:
    return _appended(test_db)


@pytest.fixture(scope="module")
def appended_pg15(pg15_db: TestDatabase) -> Relation:
    return _appended(pg15_db)


def _plan(conn: psycopg.Connection[Any], sql: str) -> dict[str, Any]:
    row = conn.execute(f"EXPLAIN (VERBOSE, FORMAT JSON) {sql}").fetchone()
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


def _by_random(node: dict[str, Any]) -> bool:
    return node["Node Type"] == "Sort" and node.get("Sort Key") == ["(random())"]


def _sorts_by_value(node: dict[str, Any]) -> bool:
    """Whether ``node`` orders its input rows by their values (a sort, an ordered aggregate's)."""
    if node["Node Type"] in ("Sort", "Incremental Sort"):
        return not _by_random(node)
    if node["Node Type"] in ("Aggregate", "WindowAgg"):  # an ORDER BY/DISTINCT aggregate sorts inside
        return node.get("Strategy") == "Sorted" or any("ORDER BY " in out or "(DISTINCT " in out
                                                       for out in node.get("Output", []))
    return False


def physical_order_sorts(node: dict[str, Any], shuffled: bool = False) -> list[str]:
    """The nodes of ``node``'s plan that order rows by value and reach a scan of ``ps_appended``
    with no Sort by ``random()`` between: the sorts that can find the table's physical order."""
    shuffled = shuffled or _by_random(node)
    if node.get("Relation Name") == "ps_appended" and not shuffled:
        return ["scan"]
    below = [found for child in node.get("Plans", []) for found in physical_order_sorts(child, shuffled)]
    if below and _sorts_by_value(node):
        return [f"{node['Node Type']} {node.get('Sort Key') or node.get('Output')}"]
    return below


def _is_sorting(found: list[str]) -> list[str]:
    return [item for item in found if item != "scan"]


@pytest.mark.parametrize("sql", DISTINCT_SHAPES)
def test_count_distinct_sorts_its_rows_only_after_a_sort_by_random(test_db: TestDatabase, appended: Relation,
                                                                   sql: str) -> None:
    backend = backend_sql(plan_aggregate_query(sql, appended), seed=partition_seed())
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        plan = _plan(conn, backend)
    assert not _is_sorting(physical_order_sorts(plan)), (sql, backend, plan)
    assert "ORDER BY pg_catalog.random()" in backend


@pytest.mark.parametrize("sql", DISTINCT_SHAPES)
def test_count_distinct_on_postgresql_15_sorts_inside_its_aggregate_only_after_a_sort_by_random(
        pg15_db: TestDatabase, appended_pg15: Relation, sql: str) -> None:
    """PostgreSQL 15 sorts a ``COUNT(DISTINCT)``'s values inside the Aggregate node (no Sort
    node below it): the timing fuzzer's finding was there."""
    backend = backend_sql(plan_aggregate_query(sql, appended_pg15), seed=partition_seed())
    with psycopg.connect(pg15_db.admin_dsn, autocommit=True) as conn:
        assert conn.info.server_version // 10000 == 15
        unshuffled = _plan(conn, backend.replace(" ORDER BY pg_catalog.random()", ""))
        plan = _plan(conn, backend)
    assert _is_sorting(physical_order_sorts(unshuffled)), unshuffled  # the check sees the aggregate's sort
    assert not _is_sorting(physical_order_sorts(plan)), (sql, backend, plan)


@pytest.mark.parametrize("sql", OTHER_SHAPES)
def test_the_other_shapes_never_sort_rows_by_value(test_db: TestDatabase, appended: Relation, sql: str) -> None:
    backend = backend_sql(plan_aggregate_query(sql, appended), seed=partition_seed())
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        plan = _plan(conn, backend)
    assert not _is_sorting(physical_order_sorts(plan)), (sql, backend, plan)
    assert "random()" not in backend or "AVG" in sql  # only what sorts pays for the shuffle


def test_the_plan_check_finds_a_count_distinct_read_in_physical_order(test_db: TestDatabase) -> None:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        plain = _plan(conn, 'SELECT pg_catalog.count(DISTINCT "big") FROM "public"."ps_appended"')
        grouped = _plan(conn, 'SELECT age, pg_catalog.count(DISTINCT "big") FROM "public"."ps_appended" GROUP BY age')
        ordered = _plan(conn, 'SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY big) FROM "public"."ps_appended"')
    for plan in (plain, grouped, ordered):
        assert _is_sorting(physical_order_sorts(plan)), plan


def test_the_shuffle_leaves_count_distinct_s_exact_parts_unchanged(test_db: TestDatabase, appended: Relation) -> None:
    """The same exact values as the unshuffled SQL, for each shape, on every run."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for sql in DISTINCT_SHAPES:
            query = plan_aggregate_query(sql, appended)
            backend = backend_sql(query, seed=partition_seed())
            unshuffled = backend.replace(" ORDER BY pg_catalog.random()", "")
            assert unshuffled != backend
            expected = sorted(map(tuple, conn.execute(unshuffled).fetchall()))
            for _ in range(3):
                assert sorted(map(tuple, conn.execute(backend).fetchall())) == expected, sql
            if not query.groups:
                assert split_row(query, conn.execute(backend).fetchone()) == split_row(query, expected[0])


def test_a_table_with_an_answer_quantum_reads_count_distinct_s_rows_as_stored(appended: Relation) -> None:
    """The quantum hides what a row adds below it (as it lifts the term limits), so the shuffle's
    extra sort is not paid there."""
    quantised = replace(appended, policy=appended.policy.model_copy(update={"answer_quantum_ms": 200}))
    for sql in DISTINCT_SHAPES:
        assert "random()" not in backend_sql(plan_aggregate_query(sql, quantised), seed=partition_seed()), sql
