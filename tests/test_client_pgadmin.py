"""pgAdmin 4 (9.18) end to end through dpproxy: connect, browse, properties, statistics, Query Tool.

A real pgAdmin (its own venv, tests/pgadmin/install.sh; desktop mode, headless, a throwaway
SQLite store) is driven through its HTTP API as its web front end drives it, against dpproxy
behind a relay that records every statement pgAdmin sends. It registers dpproxy under
*Servers* and connects; expands the tree down to ``people``'s columns and constraints; opens
the table's *Properties* (no row count: ``reltuples`` is neutralised, *Rows (counted)* 0), its
*SQL*, *Dependencies* and *Dependents*; its *Statistics* tabs (the table's, a column's, the
server's) are refused (they are counters the rows decide), with dpproxy's rule and hint in what
pgAdmin shows; the database's *Statistics* and the *Dashboard* are answered from views with no
row, the same whatever the rows and other sessions do. *Count Rows* and the Query
Tool's DP COUNT and AVG are answered with noise and dpproxy's NOTICE in *Messages*, in
auto-commit, in a transaction block, with a server cursor and after ``SET dpproxy.epsilon``;
``SELECT *``, *Explain* and *View/Edit Data* are refused with dpproxy's message and hint,
nothing charged. pgAdmin missing is a failure that says how to install it, never a skip.

``DPPROXY_RECORD_PGADMIN=1`` rewrites tests/data/pgadmin-statements.md from this run (the
statements tests/test_bi_statements.py replays without pgAdmin).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from bi_data import PEOPLE_POLICY, PEOPLE_ROWS, create_people
from bi_statements import PGADMIN_HEADER, PGADMIN_RECORD_FILE, write_recorded
from capture_relay import CapturingRelay
from conftest import TEST_DATABASE, RunningProxy, TestDatabase, make_policy, spent_epsilon
from pgadmin_harness import PgAdminApi, PgAdminServer, QueryResult

# The steps whose every statement dpproxy must answer, recorded as "ok" even when the dpproxy
# that recorded them did not: the replay then fails until it does.
MUST_ANSWER = frozenset({"connect", "browse", "table-properties", "table-sql", "table-dependencies",
                         "database-properties", "count-rows", "query-tool-count", "query-tool-avg",
                         "query-tool-transaction", "query-tool-set", "query-tool-server-cursor"})
pytestmark = pytest.mark.pgadmin

NOTICE = re.compile(r"NOTICE:  dpproxy: ε charged (?P<epsilon>[\d.]+)")


@dataclass
class Stack:
    """dpproxy (behind the recording relay) and pgAdmin, with dpproxy registered and connected."""

    proxy: RunningProxy
    people_oid: int
    relay: CapturingRelay
    server: PgAdminServer
    api: PgAdminApi
    server_id: int
    database_id: int
    schema_id: int

    @property
    def table(self) -> str:
        """The tree path of ``people``, as pgAdmin's URLs name it."""
        return f"1/{self.server_id}/{self.database_id}/{self.schema_id}/{self.people_oid}"


def _node_id(api: PgAdminApi, path: str, label: str) -> int:
    nodes = api.data(path)
    return int(next(node["_id"] for node in nodes if node["label"] == label))


@pytest.fixture(scope="module")
def stack(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    people_oid = create_people(test_db)
    workdir = tmp_path_factory.mktemp("pgadmin")
    proxy = RunningProxy(make_policy(test_db, workdir / "ledger.sqlite3", PEOPLE_POLICY))
    relay = CapturingRelay(proxy.host, proxy.port)
    server = None
    try:
        server = PgAdminServer(workdir)
        api = PgAdminApi(server.url)
        relay.phase = "connect"
        # The *Register → Server* dialog with *Connect now?* on, as the web UI posts it.
        status, body = api.post("/browser/server/obj/1/", {
            "name": "dpproxy", "host": "127.0.0.1", "port": relay.port, "db": TEST_DATABASE,
            "username": "analyst", "password": "analyst", "save_password": True, "connect_now": True,
            "connection_params": [{"name": "sslmode", "value": "disable", "keyword": "sslmode"}]})
        if status != 200:
            pytest.fail(f"registering dpproxy in pgAdmin failed: HTTP {status} {body}\n{server.log_tail()}")
        assert body["node"]["connected"], body
        server_id = int(body["node"]["_id"])
        relay.phase = "browse"
        database_id = _node_id(api, f"/browser/database/nodes/1/{server_id}/", TEST_DATABASE)
        schema_id = _node_id(api, f"/browser/schema/nodes/1/{server_id}/{database_id}/", "public")
        yield Stack(proxy, people_oid, relay, server, api, server_id, database_id, schema_id)
    finally:
        if server is not None:
            server.stop()
        relay.close()
        proxy.stop()
        if os.environ.get("DPPROXY_RECORD_PGADMIN") == "1":
            write_recorded(relay.statements(), PGADMIN_RECORD_FILE, people_oid, MUST_ANSWER, PGADMIN_HEADER)


@pytest.fixture(scope="module")
def query_tool(stack: Stack) -> int:
    """A Query Tool opened on the database (*Tools → Query Tool*): its transaction id."""
    stack.relay.phase = "query-tool-open"
    return stack.api.open_query_tool(stack.server_id, stack.database_id, TEST_DATABASE)


def _analyst(stack: Stack) -> psycopg.Connection:
    return stack.proxy.connect()


def _spent(stack: Stack) -> float:
    with _analyst(stack) as conn:
        return spent_epsilon(conn)


def _exact(admin: psycopg.Connection, sql: str) -> float:
    return float(admin.execute(sql).fetchone()[0])


def _refused(status: int, body: Any, rule: str) -> str:
    """pgAdmin's error answer for a refused statement: dpproxy's message, rule and hint in it."""
    assert status >= 400 and isinstance(body, dict) and not body.get("success"), (status, body)
    message = str(body["errormsg"])
    assert f"(rule: {rule})" in message and "HINT:" in message, message
    return message


def _relay_outcomes(stack: Stack, phase: str) -> set[str]:
    return {r.outcome for r in stack.relay.statements() if r.phase == phase}


def test_pgadmin_connects_and_browses_to_people_columns_and_constraints(stack: Stack):
    stack.relay.phase = "browse"
    base = f"1/{stack.server_id}/{stack.database_id}/{stack.schema_id}"
    tables = {node["label"] for node in stack.api.data(f"/browser/table/nodes/{base}/")}
    assert {"adult", "people"} <= tables
    columns = {node["label"]: node["datatype"] for node in stack.api.data(f"/browser/column/nodes/{stack.table}/")}
    assert columns == {"id": "integer", "age": "integer", "income": "integer", "sex": "text",
                       "signed_up": "timestamp without time zone"}
    constraints = {node["label"] for node in stack.api.data(f"/browser/constraints/nodes/{stack.table}/")}
    assert constraints == {"people_pkey"}
    for child in ("index", "trigger", "rule", "partition"):
        assert stack.api.data(f"/browser/{child}/nodes/{stack.table}/") == []
    # The database's and the schema's other collections, as a user expands them.
    database = f"1/{stack.server_id}/{stack.database_id}"
    assert "plpgsql" in {node["label"] for node in stack.api.data(f"/browser/extension/nodes/{database}/")}
    for collection in ("cast", "event_trigger", "foreign_data_wrapper", "language", "publication"):
        stack.api.data(f"/browser/{collection}/nodes/{database}/")
    for collection in ("view", "mview", "sequence", "function", "procedure", "trigger_function", "type", "domain",
                       "collation", "foreign_table", "aggregate", "operator"):
        stack.api.data(f"/browser/{collection}/nodes/{base}/")
    assert _relay_outcomes(stack, "connect") | _relay_outcomes(stack, "browse") == {"ok"}


def test_pgadmin_table_properties_show_no_row_count(stack: Stack, admin: psycopg.Connection):
    stack.relay.phase = "table-properties"
    admin.execute("ANALYZE people")  # PostgreSQL's own estimate is exact here: 2,000
    status, table = stack.api.get(f"/browser/table/obj/{stack.table}")
    assert status == 200 and table["name"] == "people", table
    # reltuples is neutralised: pgAdmin reads -1 as "not analysed", counts nothing (it runs
    # COUNT(*) itself when the estimate is under its threshold) and shows Rows (counted) 0.
    assert table["reltuples"] == "-1" and table["rows_cnt"] == 0, table
    assert not re.search(rf"\b{PEOPLE_ROWS}\b", str(table)), table
    assert table["primary_key"][0]["columns"][0]["column"] == "id", table["primary_key"]
    status, columns = stack.api.get(f"/browser/column/obj/{stack.table}/")
    assert status == 200 and [c["name"] for c in columns] == ["id", "age", "income", "sex", "signed_up"], columns
    stack.relay.phase = "table-sql"
    status, ddl = stack.api.get(f"/browser/table/sql/{stack.table}")
    assert status == 200 and "CREATE TABLE IF NOT EXISTS public.people" in ddl and "PRIMARY KEY (id)" in ddl, ddl
    assert _relay_outcomes(stack, "table-properties") | _relay_outcomes(stack, "table-sql") == {"ok"}


def test_pgadmin_dependencies_and_dependents_of_people(stack: Stack):
    stack.relay.phase = "table-dependencies"
    status, dependencies = stack.api.get(f"/browser/table/dependency/{stack.table}")
    assert status == 200 and {"type": "schema", "name": "public", "field": "normal", "icon": None} in dependencies
    status, dependents = stack.api.get(f"/browser/table/dependent/{stack.table}")
    assert status == 200 and [d["name"] for d in dependents] == ["public.people_pkey"], dependents


def test_pgadmin_subscriptions_node_is_refused(stack: Stack):
    """pg_subscription holds the subscriptions' connection strings: not on the allowlist."""
    stack.relay.phase = "subscriptions"
    message = _refused(*stack.api.get(f"/browser/subscription/nodes/1/{stack.server_id}/{stack.database_id}/"),
                       "catalog-allowlist")
    assert "pg_catalog.pg_subscription" in message, message


def test_pgadmin_database_properties(stack: Stack):
    stack.relay.phase = "database-properties"
    status, database = stack.api.get(f"/browser/database/obj/1/{stack.server_id}/{stack.database_id}")
    assert status == 200 and database["name"] == TEST_DATABASE, database
    assert _relay_outcomes(stack, "database-properties") == {"ok"}


def test_pgadmin_table_and_server_statistics_are_refused_the_databases_has_no_row(stack: Stack):
    """Scans, tuples inserted/updated/deleted, live and dead tuples, sizes, a column's null
    fraction and distinct values: numbers the rows decide, refused before anything runs. A
    database's *Statistics* reads pg_stat_database alone, which has no row through dpproxy: an
    empty table, its columns and no figure; the server's reads pg_stat_replication too: refused."""
    before = _spent(stack)
    stack.relay.phase = "table-statistics"
    for path in (f"/browser/table/stats/{stack.table}",
                 f"/browser/table/stats/1/{stack.server_id}/{stack.database_id}/{stack.schema_id}/"):
        message = _refused(*stack.api.get(path), "catalog-allowlist")
        assert "pg_catalog.pg_stat" in message, message
    stack.relay.phase = "column-statistics"
    _refused(*stack.api.get(f"/browser/column/stats/{stack.table}/2"), "catalog-allowlist")
    stack.relay.phase = "database-statistics"
    for path in (f"/browser/database/stats/1/{stack.server_id}/{stack.database_id}",
                 f"/browser/database/stats/1/{stack.server_id}/"):
        status, body = stack.api.get(path)
        assert status == 200 and body["data"]["rows"] == [], (path, body)
        assert {"Backends", "Tuples inserted", "Blocks read"} <= {c["name"] for c in body["data"]["columns"]}, body
    message = _refused(*stack.api.get(f"/browser/server/stats/1/{stack.server_id}"), "catalog-allowlist")
    assert "pg_catalog.pg_stat_replication" in message, message
    for phase in ("table-statistics", "column-statistics", "database-statistics"):
        assert "42501" in _relay_outcomes(stack, phase), phase
    assert _spent(stack) == before


# What the Dashboard's graphs read through dpproxy, whatever the rows and other sessions: its
# views have no row, so the sessions count 0 and every counter is a sum over no row, NULL.
NO_ACTIVITY_GRAPHS = {
    "session_stats": {"Total": 0, "Active": 0, "Idle": 0},
    "tps_stats": {"Transactions": None, "Commits": None, "Rollbacks": None},
    "ti_stats": {"Inserts": None, "Updates": None, "Deletes": None},
    "to_stats": {"Fetched": None, "Returned": None},
    "bio_stats": {"Reads": None, "Hits": None},
}


def _dashboard(stack: Stack) -> dict[str, Any]:
    """What every Dashboard panel's request answers: the graphs (server and database), the
    *State* tab's sessions, locks and prepared transactions (one request, as pgAdmin's front end
    sends it) and the separate locks and prepared transactions requests; each must succeed."""
    charts = ",".join(NO_ACTIVITY_GRAPHS)
    server, database = f"{stack.server_id}", f"{stack.server_id}/{stack.database_id}"
    answers = {}
    for path in (f"/dashboard/dashboard_stats/{server}?chart_names={charts}",
                 f"/dashboard/dashboard_stats/{database}?chart_names={charts}",
                 f"/dashboard/activity/{server}", f"/dashboard/activity/{database}",
                 f"/dashboard/locks/{server}", f"/dashboard/locks/{database}",
                 f"/dashboard/prepared/{server}", f"/dashboard/prepared/{database}"):
        status, body = stack.api.get(path)
        assert status == 200, (path, status, body)
        answers[path] = body
    return answers


def test_pgadmin_dashboard_draws_no_activity_whatever_the_rows_and_other_sessions(
        stack: Stack, admin: psycopg.Connection, test_db: TestDatabase):
    """The Dashboard's graphs (sessions, transactions, tuples in and out, block I/O) and its
    Sessions, Locks and Prepared Transactions panels are answered, with no figure from the
    server: pg_stat_activity, pg_stat_database, pg_locks and pg_prepared_xacts have no row
    through dpproxy. The answers are the same after committed writes, and while another
    session holds an open transaction that wrote into ``people`` (its locks, its statement
    text, its transaction id are on the server). *Configuration* (pg_settings) is answered."""
    stack.relay.phase = "dashboard"
    before = _spent(stack)
    quiet = _dashboard(stack)
    for path, body in quiet.items():
        if "dashboard_stats" in path:
            assert body == NO_ACTIVITY_GRAPHS, (path, body)
        elif "/activity/" in path:
            assert body == [{"activity": [], "locks": [], "prepared": []}], (path, body)
        else:
            assert body == [], (path, body)
    admin.execute("CREATE TABLE IF NOT EXISTS dashboard_writes (n integer)")
    for _ in range(3):
        admin.execute("INSERT INTO dashboard_writes SELECT generate_series(1, 500)")
    admin.execute("DELETE FROM dashboard_writes WHERE n % 2 = 0")
    with psycopg.connect(test_db.admin_dsn) as other:  # a transaction left open
        other.execute("INSERT INTO people (id, age, income, sex) VALUES (-1, 40, 1, 'Female')")
        other.execute("SELECT count(*) FROM people WHERE age > 30").fetchall()
        held = admin.execute("SELECT count(*) FROM pg_catalog.pg_locks WHERE relation = 'people'::regclass")
        assert held.fetchone()[0] > 0  # type: ignore[index]
        busy = _dashboard(stack)
        other.rollback()
    admin.execute("DROP TABLE dashboard_writes")
    assert busy == quiet
    status, settings = stack.api.get(f"/dashboard/config/{stack.server_id}")
    assert status == 200 and any(s["name"] == "autovacuum_max_workers" for s in settings), settings
    assert _relay_outcomes(stack, "dashboard") == {"ok"}
    assert _spent(stack) == before


def test_pgadmin_count_rows_is_a_noised_count(stack: Stack):
    """*Count Rows* on the table sends ``SELECT COUNT(*)::text FROM "public"."people"``: a DP count."""
    stack.relay.phase = "count-rows"
    before = _spent(stack)
    status, body = stack.api.get(f"/browser/table/count_rows/{stack.table}")
    assert status == 200, body
    assert abs(int(body["data"]["total_rows"]) - PEOPLE_ROWS) < 50, body
    assert _spent(stack) == pytest.approx(before + 1.0)


def _run(stack: Stack, trans_id: int, phase: str, sql: str, explain_plan: Any = None) -> QueryResult:
    stack.relay.phase = phase
    return stack.api.query(trans_id, sql, explain_plan)


@pytest.mark.parametrize(("phase", "sql", "tolerance", "mechanism"), [
    ("query-tool-count", "SELECT COUNT(*) FROM people WHERE age > 40", 50, "count: laplace scale"),
    ("query-tool-avg", "SELECT AVG(age) FROM people WHERE sex = 'Female'", 5, "avg: noisy sum / noisy count"),
])
def test_query_tool_dp_aggregate_shows_the_noised_answer_and_the_notice(
    stack: Stack, query_tool: int, admin: psycopg.Connection, phase: str, sql: str, tolerance: float, mechanism: str
):
    result = _run(stack, query_tool, phase, sql)
    assert result.status == "Success" and len(result.columns) == 1 and len(result.rows) == 1, result
    exact = _exact(admin, sql)
    assert abs(float(result.rows[0][0]) - exact) < tolerance, (result, exact)
    notice = NOTICE.search(result.messages)
    assert notice and float(notice["epsilon"]) == 1.0 and mechanism in result.messages, result


def test_query_tool_select_star_is_refused_with_dpproxys_message_and_hint(stack: Stack, query_tool: int):
    before = _spent(stack)
    result = _run(stack, query_tool, "query-tool-select-star", "SELECT * FROM people")
    assert result.status == "Error" and result.rows == [], result
    assert "SELECT * is not allowed on protected table people (rule: no-row-access)" in result.messages, result
    assert "HINT:  Protected tables answer only aggregates" in result.messages, result
    assert _spent(stack) == before
    # The Query Tool goes on: the next statement is answered.
    assert _run(stack, query_tool, "query-tool-count", "SELECT COUNT(*) FROM people WHERE age > 40").status == "Success"


def test_query_tool_explain_is_refused(stack: Stack, query_tool: int):
    """*Explain* (the button: EXPLAIN with pgAdmin's options) and a typed EXPLAIN: row estimates."""
    plan = {"format": "json", "analyze": False, "verbose": True, "costs": True, "buffers": False, "timing": False,
            "summary": False, "settings": False, "wal": False}
    for sql, explain_plan in (("SELECT COUNT(*) FROM people", plan), ("EXPLAIN SELECT COUNT(*) FROM people", None)):
        result = _run(stack, query_tool, "query-tool-explain", sql, explain_plan)
        assert result.status == "Error" and "rule: statement-not-allowed" in result.messages, result
        assert "HINT:" in result.messages and "SQL state: 0A000" in result.messages, result


@contextmanager
def _option(stack: Stack, trans_id: int, option: str, value: bool) -> Iterator[None]:
    """A Query Tool option (``auto_commit``, ``server_cursor`` …) set as its toolbar's checkbox
    sets it, and set back after."""
    status, body = stack.api.post(f"/sqleditor/{option}/{trans_id}", value)
    assert status == 200 and body["data"]["status"], body
    try:
        yield
    finally:
        status, body = stack.api.post(f"/sqleditor/{option}/{trans_id}", not value)
        assert status == 200, body


def test_query_tool_without_auto_commit_wraps_the_dp_count_in_a_transaction(stack: Stack, query_tool: int):
    stack.relay.phase = "query-tool-transaction"
    with _option(stack, query_tool, "auto_commit", False):
        result = _run(stack, query_tool, "query-tool-transaction", "SELECT COUNT(*) FROM people WHERE age > 30")
        assert result.status == "Success" and NOTICE.search(result.messages), result
        commit = _run(stack, query_tool, "query-tool-transaction", "COMMIT;")
        assert commit.status == "Success", commit
    sent = [r.sql.strip() for r in stack.relay.statements() if r.phase == "query-tool-transaction"]
    assert "BEGIN;" in sent, sent


def test_query_tool_set_epsilon_then_a_dp_count_charges_it(stack: Stack, query_tool: int):
    assert _run(stack, query_tool, "query-tool-set", "SET dpproxy.epsilon = 0.5").status == "Success"
    before = _spent(stack)
    result = _run(stack, query_tool, "query-tool-set", "SELECT COUNT(*) FROM people WHERE income > 50000")
    notice = NOTICE.search(result.messages)
    assert result.status == "Success" and notice and float(notice["epsilon"]) == 0.5, result
    assert _spent(stack) == pytest.approx(before + 0.5)
    assert _run(stack, query_tool, "query-tool-set", "RESET dpproxy.epsilon").status == "Success"


def test_query_tool_with_a_server_cursor_answers_the_dp_count(stack: Stack, query_tool: int):
    stack.relay.phase = "query-tool-server-cursor"
    with _option(stack, query_tool, "server_cursor", True):
        result = _run(stack, query_tool, "query-tool-server-cursor", "SELECT COUNT(*) FROM people WHERE age < 30")
        assert result.status == "Success" and result.columns == ["count"] and len(result.rows) == 1, result
        assert NOTICE.search(result.messages), result


def test_view_edit_data_is_refused_with_dpproxys_message(stack: Stack):
    """*View/Edit Data → First 100 Rows* sends ``SELECT * FROM public.people ORDER BY id ASC LIMIT 100``."""
    before = _spent(stack)
    stack.relay.phase = "view-data"
    trans_id = stack.api.new_transaction_id()
    path = f"/sqleditor/initialize/viewdata/{trans_id}/1/table/1/{stack.server_id}/{stack.database_id}/{stack.people_oid}"
    status, body = stack.api.post(path, {})
    assert status == 200 and body["success"], body
    status, body = stack.api.get(f"/sqleditor/view_data/start/{trans_id}")
    assert status == 200 and body["data"]["status"] is False, body
    message = body["data"]["result"]
    assert "not allowed on protected table people (rule: no-row-access)" in message and "HINT:" in message, message
    assert _spent(stack) == before
    assert "DP001" in _relay_outcomes(stack, "view-data")
