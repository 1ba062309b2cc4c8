"""ibis (``ibis-framework[postgres]``) through dpproxy.

ibis compiles its expressions with sqlglot and runs them on psycopg, each in a transaction
block of its own (BEGIN ... COMMIT, simple Queries, literals inlined): a filter becomes a
subquery wrapper (``SELECT COUNT(*) FROM (SELECT * FROM "adult" AS "t0" WHERE ...) AS "t1"``)
that dpproxy flattens. It learns a table's schema from pg_attribute after asking for
``pg_my_temp_schema()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ibis
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from clients import exact_count
from conftest import TEST_DATABASE, RunningProxy, TestDatabase, spent_epsilon
from neighbour_outcome import same_on_neighbours
from test_attack_histograms import _NEIGHBOURS, hist_proxy

__all__ = ["hist_proxy"]  # the fixture, used here as it is there

_NEIGHBOUR_TABLES = ["hn0", *_NEIGHBOURS]


@pytest.fixture(scope="module")
def con(histogram_proxy: RunningProxy) -> Iterator[Any]:
    connection = ibis.postgres.connect(host=histogram_proxy.host, port=histogram_proxy.port, user="analyst", password="analyst",
                                       database=TEST_DATABASE, connect_timeout=10)
    try:
        yield connection
    finally:
        connection.disconnect()


@pytest.fixture(scope="module")
def budget(histogram_proxy: RunningProxy) -> Iterator[psycopg.Connection]:
    with histogram_proxy.connect() as conn:
        yield conn


def test_ibis_lists_tables_and_reads_adult_s_schema(con: Any):
    assert {"adult", "lookup"} <= set(con.list_tables())
    schema = con.table("adult").schema()
    assert schema["age"].is_integer() and schema["sex"].is_string() and schema["interview_date"].is_date()


def _charged(budget: psycopg.Connection, expression: Any) -> tuple[Any, float]:
    before = spent_epsilon(budget)
    value = expression.execute()
    return value, spent_epsilon(budget) - before


def test_ibis_count_sum_and_mean_with_filters_are_noised_and_charged_once(con: Any, budget: psycopg.Connection,
                                                                         admin: psycopg.Connection):
    t = con.table("adult")
    count, charged = _charged(budget, t.count())
    assert abs(count - exact_count(admin)) < 30 and charged == 1
    older, charged = _charged(budget, t.filter(t.age > 30).count())
    assert abs(older - exact_count(admin, "age > 30")) < 30 and charged == 1
    mean, charged = _charged(budget, t.filter(t.sex == "Female").age.mean())
    exact_mean = admin.execute("SELECT avg(age) FROM adult WHERE sex = 'Female'").fetchone()[0]
    assert abs(mean - float(exact_mean)) < 1 and charged == 1
    total, charged = _charged(budget, t.filter(t.age > 30).capital_gain.sum())
    exact_total = admin.execute("SELECT sum(capital_gain) FROM adult WHERE age > 30").fetchone()[0]
    assert abs(total - exact_total) < 2e6 and charged == 1  # bounds [0, 100000]: Laplace scale 1e5


def test_ibis_aggregate_of_several_metrics_is_one_statement_charged_once(con: Any, budget: psycopg.Connection,
                                                                         admin: psycopg.Connection):
    t = con.table("adult")
    older = t.filter(t.age > 30)
    frame, charged = _charged(budget, older.aggregate(n=older.count(), mean_hours=older.hours_per_week.mean()))
    assert abs(int(frame["n"][0]) - exact_count(admin, "age > 30")) < 60 and charged == 1


def test_ibis_group_by_a_declared_key_is_a_noised_histogram_charged_once(con: Any, budget: psycopg.Connection,
                                                                         admin: psycopg.Connection):
    t = con.table("adult")
    frame, charged = _charged(budget, t.group_by("sex").aggregate(n=t.count(), mean_age=t.age.mean()))
    exact = dict(admin.execute("SELECT sex, count(*) FROM adult GROUP BY sex").fetchall())
    got = dict(zip(frame["sex"], frame["n"]))
    assert got.keys() == exact.keys() and all(abs(got[k] - exact[k]) < 30 for k in exact) and charged == 1


def test_ibis_group_by_an_undeclared_column_is_refused_with_sqlstate(con: Any, budget: psycopg.Connection):
    t = con.table("adult")
    before = spent_epsilon(budget)
    with pytest.raises(psycopg.Error) as info:
        t.group_by("education").aggregate(n=t.count()).execute()
    assert info.value.diag.sqlstate == "DP001" and "(rule: no-group-by)" in str(info.value)
    assert spent_epsilon(budget) == before


def test_ibis_row_reads_are_refused_with_dpproxy_s_sqlstate_and_the_connection_goes_on(
        con: Any, budget: psycopg.Connection, admin: psycopg.Connection):
    t = con.table("adult")
    before = spent_epsilon(budget)
    for expression in (t.head(5), t.filter(t.age > 30).select("age", "sex")):
        with pytest.raises(psycopg.Error) as info:
            expression.execute()
        assert info.value.diag.sqlstate == "DP001" and "(rule: no-row-access)" in str(info.value)
        assert info.value.diag.message_hint
    assert spent_epsilon(budget) == before
    assert abs(t.count().execute() - exact_count(admin)) < 30


def test_ibis_to_pyarrow_reads_through_a_cursor_charged_once(con: Any, budget: psycopg.Connection,
                                                             admin: psycopg.Connection):
    """to_pyarrow declares a cursor over the query and fetches from it: the DP answer is
    released (and charged) at the DECLARE."""
    t = con.table("adult")
    before = spent_epsilon(budget)
    count = t.filter(t.age > 40).count().to_pyarrow().as_py()
    assert abs(count - exact_count(admin, "age > 40")) < 30 and spent_epsilon(budget) - before == 1


def test_ibis_value_counts_of_a_declared_key_is_a_histogram(con: Any, budget: psycopg.Connection,
                                                           admin: psycopg.Connection):
    t = con.table("adult")
    frame, charged = _charged(budget, t.sex.value_counts())
    exact = dict(admin.execute("SELECT sex, count(*) FROM adult GROUP BY sex").fetchall())
    got = dict(zip(frame["sex"], frame["sex_count"]))
    assert got.keys() == exact.keys() and all(abs(got[k] - exact[k]) < 30 for k in exact) and charged == 1


# What con.sql(query) sends to learn the query's columns, whatever the query (captured through
# tests/capture_relay.py): BEGIN; CREATE TEMPORARY VIEW ibis_postgres_metadata_<id> AS <query>;
# COMMIT; SELECT nspname FROM pg_namespace WHERE oid = pg_my_temp_schema(); the columns from
# pg_attribute (a prepared statement, the view's name a parameter); DROP VIEW IF EXISTS. Given a
# schema, it sends none of it: .execute() sends the query itself.
_SQL_QUERIES = {
    "dp aggregate": "SELECT COUNT(*) AS n FROM adult WHERE age > 30",
    "histogram": "SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex",
    "row-level": "SELECT age, sex FROM adult WHERE age > 30",
    "catalog": "SELECT relname FROM pg_class WHERE relname = 'adult'",
    "public table": "SELECT code, label FROM lookup",
}


@pytest.mark.parametrize("query", _SQL_QUERIES.values(), ids=_SQL_QUERIES.keys())
def test_ibis_sql_without_a_schema_is_refused_at_its_temporary_view_with_a_hint_naming_what_answers(
        con: Any, budget: psycopg.Connection, query: str):
    """The temporary view is refused whatever its query (25006, before any charge): the refusal is
    decided from the statement's kind, never from the query's plan or the table's rows. The hint
    names what answers the same need: con.sql with the columns given, LIMIT 0, con.table."""
    before = spent_epsilon(budget)
    with pytest.raises(psycopg.Error) as info:
        con.sql(query)
    assert info.value.diag.sqlstate == "25006" and "(rule: read-only)" in str(info.value)
    assert "CREATE VIEW" in str(info.value.diag.message_primary)
    hint = str(info.value.diag.message_hint)
    assert "con.sql(query, schema={...})" in hint and "LIMIT 0" in hint and "con.table(...)" in hint
    assert spent_epsilon(budget) == before


def test_ibis_sql_given_its_columns_answers_a_dp_aggregate_charged_once(con: Any, budget: psycopg.Connection,
                                                                         admin: psycopg.Connection):
    expression = con.sql(_SQL_QUERIES["dp aggregate"], schema={"n": "int64"})
    frame, charged = _charged(budget, expression)
    assert abs(int(frame["n"][0]) - exact_count(admin, "age > 30")) < 30 and charged == 1
    # A filter on it wraps the query (SELECT * FROM (<query>) AS "t0" WHERE "t0"."n" > 0): post-processing
    # of the one released row, charged once more as a statement of its own.
    frame, charged = _charged(budget, expression.filter(expression.n > 0))
    assert abs(int(frame["n"][0]) - exact_count(admin, "age > 30")) < 30 and charged == 1


def test_ibis_sql_given_its_columns_answers_a_histogram_over_a_declared_key(con: Any, budget: psycopg.Connection,
                                                                             admin: psycopg.Connection):
    expression = con.sql(_SQL_QUERIES["histogram"], schema={"sex": "string", "n": "int64"})
    frame, charged = _charged(budget, expression)
    exact = dict(admin.execute("SELECT sex, count(*) FROM adult GROUP BY sex").fetchall())
    got = dict(zip(frame["sex"], frame["n"]))
    assert got.keys() == exact.keys() and all(abs(got[k] - exact[k]) < 30 for k in exact) and charged == 1


def test_ibis_sql_given_its_columns_still_refuses_a_row_level_select_uncharged(con: Any, budget: psycopg.Connection):
    before = spent_epsilon(budget)
    with pytest.raises(psycopg.Error) as info:
        con.sql(_SQL_QUERIES["row-level"], schema={"age": "int32", "sex": "string"}).execute()
    assert info.value.diag.sqlstate == "DP001" and "(rule: no-row-access)" in str(info.value)
    assert spent_epsilon(budget) == before


def test_ibis_sql_given_its_columns_reads_a_public_table_uncharged(con: Any, budget: psycopg.Connection):
    before = spent_epsilon(budget)
    frame = con.sql(_SQL_QUERIES["public table"], schema={"code": "string", "label": "string"}).execute()
    assert dict(zip(frame["code"], frame["label"])) == {"M": "Male", "F": "Female"}
    assert spent_epsilon(budget) == before


@pytest.mark.parametrize("query", [_SQL_QUERIES["dp aggregate"], _SQL_QUERIES["histogram"]],
                         ids=["dp aggregate", "histogram"])
def test_ibis_raw_sql_with_limit_0_gives_a_query_s_columns_uncharged(con: Any, budget: psycopg.Connection,
                                                                     query: str):
    """The refusal's hint for learning a query's columns: the query with LIMIT 0, ε 0."""
    before = spent_epsilon(budget)
    with con.raw_sql(f"{query} LIMIT 0") as cursor:
        assert cursor.fetchall() == []
        names = [column.name for column in cursor.description]
    assert names == (["n"] if "GROUP BY" not in query else ["sex", "n"])
    assert spent_epsilon(budget) == before


def test_ibis_raw_sql_runs_the_query_itself_charged_once(con: Any, budget: psycopg.Connection,
                                                         admin: psycopg.Connection):
    before = spent_epsilon(budget)
    with con.raw_sql(_SQL_QUERIES["dp aggregate"]) as cursor:
        ((count,),) = cursor.fetchall()
    assert abs(count - exact_count(admin, "age > 30")) < 30 and spent_epsilon(budget) - before == 1


def test_ibis_12_under_sqlglot_30_fails_its_own_sql_schema_probe_on_postgresql_itself(test_db: TestDatabase):
    """Why dpproxy does not answer con.sql's temporary view: with the sqlglot dpproxy pins (30.x),
    ibis 12.0 renders the probe's clean-up as ``DROP VIEW IF EXISTS`` without the view's name, a
    syntax error on PostgreSQL itself, so con.sql(query) without a schema fails on any server. When
    this test fails, ibis's probe works again: see docs/bi-tools.md (ibis) for the design it needs."""
    params = conninfo_to_dict(test_db.admin_dsn)
    params["database"] = params.pop("dbname")
    direct = ibis.postgres.connect(**params)
    try:
        with pytest.raises(psycopg.errors.SyntaxError) as info:
            direct.sql("SELECT COUNT(*) AS n FROM adult WHERE age > 30")
        assert "DROP VIEW IF EXISTS" in str(info.value)
    finally:
        direct.disconnect()


@pytest.mark.parametrize("query", [
    "SELECT COUNT(*) AS n FROM {t} WHERE x > 3",
    "SELECT t, COUNT(*) AS n FROM {t} GROUP BY t",
    "SELECT * FROM {t}",
])
@pytest.mark.parametrize("create", ["CREATE TEMPORARY VIEW ibis_postgres_metadata_probe", "CREATE TEMPORARY TABLE probe"])
def test_ibis_sql_s_temporary_view_is_refused_alike_and_uncharged_on_neighbouring_tables(
        hist_proxy: RunningProxy, create: str, query: str):
    """The probe as ibis sends it, and its CREATE TABLE AS twin, over test_attack_histograms'
    neighbours (hn0, and hn1 … hn5 with one adversarial row more): the same refusal on each."""
    with hist_proxy.connect() as conn:
        conn.autocommit = True
        outcome = same_on_neighbours(conn, f"{create} AS {query}", _NEIGHBOUR_TABLES, spent_epsilon)
    assert outcome[0] == "error" and outcome[1] == "25006" and "con.sql(query, schema={...})" in str(outcome[3])
