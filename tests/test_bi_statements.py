"""Every statement Apache Superset and pgAdmin 4 sent through dpproxy, replayed without them.

tests/data/superset-statements.md (recorded by tests/test_superset.py) lists each distinct
statement Superset 6.1 sent while connecting, introspecting ``people``, creating datasets and
drawing charts, with the outcome issue 18 requires: ``ok`` (answered) or the SQLSTATE of the
refusal; tests/data/pgadmin-statements.md (recorded by tests/test_client_pgadmin.py) each one
pgAdmin 4 sent while connecting, browsing to ``people``, showing its properties, statistics and
dependencies, the Dashboard, and in its Query Tool. Each is sent here, in the recorded order,
on one session per tool with the protocol the tool used, against the same table and policy
(tests/bi_data.py). A refusal must also carry a hint; an answered statement that is not a DP
aggregate must not carry people's exact row count.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from bi_data import PEOPLE_POLICY, create_people
from bi_statements import PGADMIN_RECORD_FILE, Expected, load_recorded, replay
from conftest import RunningProxy, TestDatabase, make_policy

RECORDED = load_recorded()
PGADMIN_RECORDED = load_recorded(PGADMIN_RECORD_FILE)


def test_recording_covers_connect_introspection_datasets_and_charts():
    phases = {e.phase for e in RECORDED}
    assert {"connect", "introspect", "physical-dataset", "big-number", "big-number-time-range",
            "table-of-aggregates", "virtual-dataset", "pie-chart", "bar-chart", "time-series-chart",
            "group-by-chart", "big-number-time-comparison", "pivot-table", "table-with-dimensions", "mixed-chart",
            "treemap", "sunburst", "box-plot", "box-plot-refused", "histogram-refused", "conditional-big-number",
            "conditional-bar-chart", "conditional-table", "conditional-share",
            "conditional-series-limit", "conditional-indicator", "cte-virtual-dataset", "cte-big-number",
            "cte-bar-chart", "cte-indicator", "cte-row-level-virtual-dataset", "cte-group-by-refused"} <= phases, phases
    # Histograms over keys the policy opts in are answered; a GROUP BY on any other column is not.
    for phase in ("pie-chart", "bar-chart", "time-series-chart", "pivot-table", "table-with-dimensions", "treemap",
                  "sunburst", "box-plot"):
        assert {e.outcome for e in RECORDED if e.phase == phase and "GROUP BY" in e.sql} == {"ok"}, phase
    for phase in ("chart-radar", "chart-bubble_v2", "chart-waterfall", "chart-bar-by-age", "chart-bar-by-width-bucket",
                  "chart-cal_heatmap", "chart-rose", "chart-chord", "conditional-big-number",
                  "conditional-bar-chart", "conditional-table", "conditional-share", "conditional-series-limit",
                  "conditional-indicator", "cte-virtual-dataset", "cte-big-number", "cte-bar-chart", "cte-indicator"):
        assert {e.outcome for e in RECORDED if e.phase == phase and "people" in e.sql} == {"ok"}, phase
    for phase in ("group-by-chart", "box-plot-refused", "histogram-refused", "chart-tree_chart-refused",
                  "chart-gantt_chart-refused", "chart-deck_scatter-refused", "cte-row-level-virtual-dataset",
                  "cte-group-by-refused"):  # a value per row, or the rows
        assert {e.outcome for e in RECORDED if e.phase == phase and "people" in e.sql} == {"DP001"}, phase


@pytest.fixture(scope="module")
def people_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningProxy, int]]:
    people_oid = create_people(test_db)
    ledger: Path = tmp_path_factory.mktemp("bi-ledger") / "ledger.sqlite3"
    proxy = RunningProxy(make_policy(test_db, ledger, PEOPLE_POLICY))
    try:
        yield proxy, people_oid
    finally:
        proxy.stop()


@pytest.fixture(scope="module")
def superset_session(people_proxy: tuple[RunningProxy, int]) -> Iterator[tuple[psycopg.Connection, int]]:
    proxy, people_oid = people_proxy
    with proxy.connect(options="-c statement_timeout=20000") as conn:
        yield conn, people_oid


@pytest.fixture(scope="module")
def pgadmin_session(people_proxy: tuple[RunningProxy, int]) -> Iterator[tuple[psycopg.Connection, int]]:
    proxy, people_oid = people_proxy
    with proxy.connect(options="-c statement_timeout=20000") as conn:
        yield conn, people_oid


@pytest.mark.parametrize("expected", RECORDED, ids=lambda e: e.id)
def test_superset_statement_gets_its_recorded_outcome(superset_session: tuple[psycopg.Connection, int],
                                                      expected: Expected):
    conn, people_oid = superset_session
    assert expected.protocol == "Q", "Superset (psycopg2) sends simple queries only"
    replay(conn.pgconn, expected, people_oid)


def test_pgadmin_recording_covers_connect_browsing_statistics_and_the_query_tool():
    phases = {e.phase for e in PGADMIN_RECORDED}
    assert {"connect", "browse", "table-properties", "table-statistics", "column-statistics", "dashboard",
            "query-tool-count", "query-tool-avg", "query-tool-select-star", "view-data"} <= phases, phases
    for phase in ("table-statistics", "column-statistics", "database-statistics"):
        assert {e.outcome for e in PGADMIN_RECORDED if e.phase == phase} - {"ok"} == {"42501"}, phase
    # The Dashboard's views answer with no row (rewriter/catalog.py, EMPTIED_RELATIONS).
    dashboard = [e for e in PGADMIN_RECORDED if e.phase == "dashboard"]
    assert {e.outcome for e in dashboard} == {"ok"}
    assert {"pg_stat_activity", "pg_stat_database", "pg_locks", "pg_prepared_xacts"} <= {
        view for e in dashboard for view in re.findall(r"pg_catalog\.(pg_\w+)", e.sql)}
    assert {e.outcome for e in PGADMIN_RECORDED if e.phase in ("query-tool-select-star", "view-data")
            and re.search(r"\bFROM\s+(public\.)?people\b", e.sql)} == {"DP001"}


@pytest.mark.parametrize("expected", PGADMIN_RECORDED, ids=lambda e: e.id)
def test_pgadmin_statement_gets_its_recorded_outcome(pgadmin_session: tuple[psycopg.Connection, int],
                                                     expected: Expected):
    conn, people_oid = pgadmin_session
    replay(conn.pgconn, expected, people_oid)
