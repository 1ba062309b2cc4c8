"""Every statement Apache Superset sent through dpproxy, replayed without Superset.

tests/data/superset-statements.md (recorded by tests/test_superset.py) lists each distinct
statement Superset 6.1 sent while connecting, introspecting ``people``, creating datasets and
drawing charts, with the outcome issue 18 requires: ``ok`` (answered) or the SQLSTATE of the
refusal. Each is sent here, in the recorded order, on one session with the protocol Superset
used, against the same table and policy (tests/bi_data.py). A refusal must also carry a hint;
an answered statement that is not a DP aggregate must not carry people's exact row count.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import pq

from bi_data import PEOPLE_POLICY, PEOPLE_ROWS, create_people
from bi_statements import PEOPLE_OID, Expected, load_recorded
from conftest import RunningProxy, TestDatabase, make_policy

RECORDED = load_recorded()
_READS_PEOPLE = re.compile(r"\bFROM\s+(public\.)?people\b", re.IGNORECASE)
_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK, pq.ExecStatus.EMPTY_QUERY)


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
def people_session(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        tuple[psycopg.Connection, int]]:
    people_oid = create_people(test_db)
    ledger: Path = tmp_path_factory.mktemp("bi-ledger") / "ledger.sqlite3"
    proxy = RunningProxy(make_policy(test_db, ledger, PEOPLE_POLICY))
    try:
        with proxy.connect(options="-c statement_timeout=20000") as conn:
            yield conn, people_oid
    finally:
        proxy.stop()


@pytest.mark.parametrize("expected", RECORDED, ids=lambda e: e.id)
def test_superset_statement_gets_its_recorded_outcome(people_session: tuple[psycopg.Connection, int],
                                                      expected: Expected):
    conn, people_oid = people_session
    pgconn = conn.pgconn
    sql = expected.sql.replace(PEOPLE_OID, str(people_oid))
    assert expected.protocol == "Q", "Superset (psycopg2) sends simple queries only"
    result = pgconn.exec_(sql.encode())
    message = (result.error_message or b"").decode(errors="replace")
    try:
        if expected.outcome == "ok":
            assert result.status in _OK, f"{message}\n--- statement ---\n{sql}"
            if not _READS_PEOPLE.search(sql):
                cells = {result.get_value(r, c) for r in range(result.ntuples) for c in range(result.nfields)}
                assert str(PEOPLE_ROWS).encode() not in cells, f"people's exact row count in\n{sql}"
        else:
            assert result.status == pq.ExecStatus.FATAL_ERROR, f"answered, expected {expected.outcome}:\n{sql}"
            assert result.error_field(pq.DiagnosticField.SQLSTATE) == expected.outcome.encode(), message
            assert result.error_field(pq.DiagnosticField.MESSAGE_HINT), message
    finally:
        if pgconn.transaction_status == pq.TransactionStatus.INERROR:
            pgconn.exec_(b"ROLLBACK")
