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

from clients import exact_count
from conftest import TEST_DATABASE, RunningProxy, spent_epsilon


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


def test_ibis_sql_is_refused_as_the_temporary_view_it_creates_and_raw_sql_answers(con: Any, budget: psycopg.Connection,
                                                                                 admin: psycopg.Connection):
    """con.sql(query) learns the query's columns from a CREATE TEMPORARY VIEW over it, which
    dpproxy refuses as it refuses every DDL (25006, before any charge); con.raw_sql runs the
    query itself."""
    before = spent_epsilon(budget)
    with pytest.raises(psycopg.Error) as info:
        con.sql("SELECT COUNT(*) AS n FROM adult WHERE age > 30").execute()
    assert info.value.diag.sqlstate == "25006" and "(rule: read-only)" in str(info.value)
    assert spent_epsilon(budget) == before
    with con.raw_sql("SELECT COUNT(*) AS n FROM adult WHERE age > 30") as cursor:
        ((count,),) = cursor.fetchall()
    assert abs(count - exact_count(admin, "age > 30")) < 30 and spent_epsilon(budget) - before == 1
