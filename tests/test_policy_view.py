"""SHOW dpproxy.columns: the policy's choices, visible from SQL (psql, a BI tool's SQL editor)."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Iterator

import psycopg
import pytest

from conftest import ATTACK_POLICY_HEAD, SERVICE_ROLE, RunningProxy, TestDatabase, psql_path, running_proxy

_COLUMNS = ["table_name", "column_name", "data_type", "bounds", "categories", "aggregates", "group_by", "epsilon",
            "delta"]


@pytest.mark.parametrize("prepare", [False, True], ids=["simple", "extended"])
def test_show_columns_lists_each_protected_column_with_what_it_accepts(proxy: RunningProxy, prepare: bool):
    with proxy.connect(autocommit=True) as conn:
        cur = conn.execute("SHOW dpproxy.columns", prepare=prepare)
        assert [d.name for d in cur.description] == _COLUMNS
        rows = {(r[0], r[1]): r[2:] for r in cur.fetchall()}
    assert {table for table, _ in rows} == {"adult", "clamp_test"}  # protected only; lookup is public
    assert rows[("adult", "*")] == (None, None, None, "COUNT(*) laplace", None, 1.0, 1e-6)
    assert rows[("adult", "age")] == ("integer", "[17, 90]", None, "COUNT laplace, COUNT(DISTINCT) laplace, SUM laplace, "
                                      "AVG sum_count, MIN sample_aggregate, MAX sample_aggregate, PERCENTILE exponential, "
                                      "VARIANCE moments",
                                      None, 1.0,
                                      1e-6)  # AVG by the default
    assert rows[("adult", "hours_per_week")][3] == ("COUNT laplace, COUNT(DISTINCT) laplace, SUM laplace, AVG sample_aggregate, "
                                                    "MIN sample_aggregate, MAX sample_aggregate, PERCENTILE exponential, "
                                                    "VARIANCE moments")  # the column's avg
    assert rows[("adult", "sex")] == ("text", "at most 256 bytes, stored in the row uncompressed (another value reads as NULL)", '["Male", "Female"]',
                                      "COUNT laplace, COUNT(DISTINCT) laplace, MODE exponential", None,
                                      1.0, 1e-6)
    assert rows[("adult", "fnlwgt")][3] == "COUNT laplace, COUNT(DISTINCT) laplace"  # no bounds: COUNTs only
    assert rows[("clamp_test", "ratio")][1:3] == ("[-2.5, 2.5]", None)


def test_show_columns_shows_the_session_s_epsilon(proxy: RunningProxy):
    with proxy.connect(autocommit=True) as conn:
        conn.execute("SET dpproxy.epsilon = 0.25")
        epsilons = {row[7] for row in conn.execute("SHOW dpproxy.columns").fetchall()}
    assert epsilons == {0.25}


def test_psql_shows_the_policy_columns(proxy: RunningProxy):
    env = {**os.environ, "PGPASSWORD": "analyst", "PGSSLMODE": "prefer", "PGCONNECT_TIMEOUT": "10"}
    result = subprocess.run(
        [psql_path(), "-X", "-h", proxy.host, "-p", str(proxy.port), "-U", "analyst", "-d", "dpproxy_test",
         "-c", "SHOW dpproxy.columns"], capture_output=True, text=True, env=env, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "MODE exponential" in result.stdout and "[17, 90]" in result.stdout


def test_show_columns_shows_bounds_exactly_as_declared():
    # ``:g`` showed [0, 1.23457e+06] for bounds [0, 1234567]: a bound the policy does not have.
    from policies.model import ColumnPolicy, TablePolicy
    from policies.tables import ColumnInfo, Relation, TableRegistry
    from proxy.serving.policy_view import columns_result

    declared = {"n": (0, 1234567), "x": (-0.1, 2.5e-7), "big": (-1e20, 1e20)}
    columns = {name: ColumnInfo(name, 701, -1, i + 1, ColumnPolicy(bounds=bounds))
               for i, (name, bounds) in enumerate(declared.items())}
    registry = TableRegistry({1: Relation(1, "public", "t", TablePolicy(epsilon=1.0), columns)})
    shown = {row[1].decode(): row[3].decode() for row in columns_result(registry, lambda _: 1.0).rows[1:]}
    assert shown == {"n": "[0, 1234567]", "x": "[-0.1, 2.5e-07]", "big": "[-1e+20, 1e+20]"}


def test_show_columns_shows_a_date_range_as_dates_and_a_timestamp_range_as_times():
    # A date column's [2021-01-01, 2024-12-31] was shown as [2021-01-01 00:00:00, 2024-12-31 00:00:00].
    from policies.model import ColumnPolicy, TablePolicy
    from policies.tables import ColumnInfo, Relation, TableRegistry
    from proxy.serving.policy_view import columns_result

    declared = {"d": 1082, "ts": 1114, "tz": 1184}
    columns = {name: ColumnInfo(name, oid, -1, i + 1, ColumnPolicy(bounds=("2021-01-01", "2024-12-31")))
               for i, (name, oid) in enumerate(declared.items())}
    registry = TableRegistry({1: Relation(1, "public", "t", TablePolicy(epsilon=1.0), columns)})
    shown = {row[1].decode(): row[3].decode() for row in columns_result(registry, lambda _: 1.0).rows[1:]}
    assert shown == {"d": "[2021-01-01, 2024-12-31]", "ts": "[2021-01-01 00:00:00, 2024-12-31 00:00:00]",
                     "tz": "[2021-01-01 00:00:00, 2024-12-31 00:00:00]"}


_TYPED_SCHEMA = """
    DROP SCHEMA IF EXISTS "Sales" CASCADE;
    DROP TABLE IF EXISTS pv_order;
    DROP TYPE IF EXISTS pv_mood;
    DROP DOMAIN IF EXISTS pv_percent;
    CREATE TYPE pv_mood AS ENUM ('sad', 'happy');
    CREATE DOMAIN pv_percent AS integer CHECK (VALUE BETWEEN 0 AND 100);
    CREATE SCHEMA "Sales";
    CREATE TABLE "Sales"."Order.Items" (mood pv_mood, tags text[], pct pv_percent, label varchar(20),
                                        price numeric(10, 2), at timestamptz, "Qty" integer);
    INSERT INTO "Sales"."Order.Items" SELECT 'happy', '{a}', g % 100, 'x', g, now(), g FROM generate_series(1, 20) g;
    CREATE TABLE pv_order ("order" integer);
    GRANT USAGE ON SCHEMA "Sales" TO {role};
    GRANT SELECT ON "Sales"."Order.Items", pv_order TO {role};
"""
_TYPED_POLICY = ATTACK_POLICY_HEAD + """\
  '"Sales"."Order.Items"':
    access: protected
    epsilon: 1.0
    columns:
      mood: {{categories: [sad, happy], group_by: true}}
      price: {{bounds: [0, 1000]}}
      Qty: {{bounds: [0, 100], group_by: true}}
  pv_order:
    access: protected
    epsilon: 1.0
"""


@pytest.fixture(scope="module")
def typed_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A proxy over a table of an enum, an array, a domain, varchar(20), numeric(10, 2), timestamptz
    and a mixed-case column, in a mixed-case schema and a dotted table name; and a table with a
    keyword for a column."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(_TYPED_SCHEMA.replace("{role}", SERVICE_ROLE))
    with running_proxy(test_db, tmp_path_factory, _TYPED_POLICY) as running:
        yield running


def test_show_columns_names_each_type_as_psql_s_d_does(typed_proxy: RunningProxy, admin: psycopg.Connection):
    # Only the built-in scalar types had names: an enum, an array or a domain showed "type oid 16385",
    # and varchar(20) and numeric(10, 2) lost their modifiers.
    with typed_proxy.connect() as conn:
        shown = {row[1]: row[2] for row in conn.execute("SHOW dpproxy.columns").fetchall()
                 if row[0] == '"Sales"."Order.Items"'}
    described = dict(admin.execute(
        "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = '\"Sales\".\"Order.Items\"'::regclass AND attnum > 0").fetchall())
    assert shown == {"*": None, **described}
    assert described == {"mood": "pv_mood", "tags": "text[]", "pct": "pv_percent", "label": "character varying(20)",
                         "price": "numeric(10,2)", "at": "timestamp with time zone", "Qty": "integer"}


def test_show_columns_quotes_a_table_s_name_as_quote_ident_does(typed_proxy: RunningProxy):
    # "Sales"."Order.Items" was shown as Sales.Order.Items: the table Items of a schema Sales.Order.
    with typed_proxy.connect() as conn:
        rows = conn.execute("SHOW dpproxy.columns").fetchall()
        assert {row[0] for row in rows} == {'"Sales"."Order.Items"', "pv_order"}
        # Each name shown reads back as its table, and each GROUP BY key as its column.
        assert conn.execute('SELECT COUNT(*) FROM "Sales"."Order.Items"').fetchone() is not None
        keys = {row[1]: row[6] for row in rows if row[0] == '"Sales"."Order.Items"'}
        assert keys["Qty"].startswith('"Qty" (101 cells), width_bucket("Qty", lo, hi, n)'), keys
        assert keys["mood"] == "mood (2 cells)", keys


def test_psql_shows_types_and_quoted_names(typed_proxy: RunningProxy):
    env = {**os.environ, "PGPASSWORD": "analyst", "PGSSLMODE": "prefer", "PGCONNECT_TIMEOUT": "10"}
    result = subprocess.run(
        [psql_path(), "-X", "-A", "-t", "-h", typed_proxy.host, "-p", str(typed_proxy.port), "-U", "analyst",
         "-d", "dpproxy_test", "-c", "SHOW dpproxy.columns"], capture_output=True, text=True, env=env, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = {tuple(line.split("|")[:3]) for line in result.stdout.splitlines()}
    assert {('"Sales"."Order.Items"', "mood", "pv_mood"), ('"Sales"."Order.Items"', "tags", "text[]"),
            ('"Sales"."Order.Items"', "label", "character varying(20)"), ("pv_order", "order", "integer")} <= lines
    assert "type oid" not in result.stdout


def test_a_refusal_names_a_table_as_sql_writes_it(typed_proxy: RunningProxy):
    # The refusal's message and hint named Sales.Order.Items, which no statement can use as written.
    with typed_proxy.connect() as conn, pytest.raises(psycopg.Error) as refused:
        conn.execute('SELECT * FROM "Sales"."Order.Items"')
    diag = refused.value.diag
    assert '"Sales"."Order.Items"' in (diag.message_primary or "") + (diag.message_hint or ""), diag.message_primary


def test_quote_ident_agrees_with_the_backend_s(admin: psycopg.Connection):
    from policies.sql_names import QUOTED_KEYWORDS, quote_ident

    reserved = {word for (word,) in admin.execute("SELECT word FROM pg_get_keywords() WHERE catcode <> 'U'")}
    assert reserved <= QUOTED_KEYWORDS
    names = ["adult", "Adult", "order", "Order.Items", 'say "hi"', "_x1", "1x", "a$b", "naïve", "user", "name", ""]
    row = admin.execute("SELECT " + ", ".join(["quote_ident(%s)"] * len(names)), names).fetchone()
    assert row is not None and [quote_ident(name) for name in names] == list(row)


_TIMES_SCHEMA = """
    DROP TABLE IF EXISTS pv_times;
    CREATE TABLE pv_times (demo date, weeks timestamp, quarters date, days timestamptz, label text);
    INSERT INTO pv_times SELECT DATE '2022-05-01' + g, TIMESTAMP '2023-02-01' + g * INTERVAL '1 day',
                                DATE '2022-05-01' + g, TIMESTAMPTZ '2023-01-10 12:00+00' + g * INTERVAL '1 hour', 'x'
                         FROM generate_series(1, 40) g;
    GRANT SELECT ON pv_times TO {role};
"""
_TIMES_POLICY = ATTACK_POLICY_HEAD + """\
  pv_times:
    access: protected
    epsilon: 1.0
    columns:
      demo: {{bounds: [2021-01-01, 2024-12-31], group_by: [month, quarter, year]}}
      weeks: {{bounds: [2023-01-01 00:00:00, 2023-12-31 00:00:00], group_by: [week]}}
      quarters: {{bounds: [2021-01-01, 2024-12-31], group_by: [quarter]}}
      days: {{bounds: [2023-01-01 00:00:00, 2023-03-31 00:00:00], group_by: [day]}}
"""
# Every form a time key may take: each DATE_TRUNC unit and EXTRACT field (some finer than any unit),
# the date of a time, and Metabase's Sunday weeks, each as an analyst writes it and SHOW lists it
# (SHOW wrote "Sunday weeks of col", which no one can run).
_UNITS = ("day", "week", "month", "quarter", "year", "hour", "decade")
_FIELDS = ("YEAR", "QUARTER", "MONTH", "WEEK", "DAY", "DOW", "ISODOW", "DOY", "HOUR", "DECADE")


def _time_forms(column: str) -> set[str]:
    return ({f"DATE_TRUNC('{unit}', {column})" for unit in _UNITS} | {f"EXTRACT({f} FROM {column})" for f in _FIELDS}
            | {f"CAST({column} AS DATE)", f"date_trunc('week', {column} + INTERVAL '1 day') + INTERVAL '-1 day'"})


@pytest.fixture(scope="module")
def times_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """Date and time columns opting in the demo's units (month, quarter, year), weeks only, quarters
    only and days."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(_TIMES_SCHEMA.replace("{role}", SERVICE_ROLE))
    with running_proxy(test_db, tmp_path_factory, _TIMES_POLICY) as running:
        yield running


@pytest.mark.parametrize("column", ["demo", "weeks", "quarters", "days"])
def test_show_columns_lists_exactly_the_time_keys_a_column_answers(times_proxy: RunningProxy, column: str):
    # EXTRACT(YEAR FROM col) was answered (as the year's bucket) but listed neither here nor in the hint.
    with times_proxy.connect(autocommit=True) as conn:
        shown = {row[1]: row[6] or "" for row in conn.execute("SHOW dpproxy.columns").fetchall()}
        listed = set(re.findall(r"(.+?) \(\d+ cells?\)(?:, |$)", shown[column]))
        unlisted = (listed - _time_forms(column)) - ({column} if column in ("demo", "quarters") else set())
        assert not unlisted, f"a form this test does not try: {unlisted}"
        answered = set()
        for form in _time_forms(column) | listed:
            try:
                conn.execute(f"SELECT {form} AS k, count(*) FROM pv_times GROUP BY 1").fetchall()
            except psycopg.Error as exc:
                assert "(rule: no-group-by)" in str(exc), (form, exc)
            else:
                answered.add(form)
    assert answered == listed


def test_the_group_by_hint_lists_exactly_the_time_keys_show_columns_lists(times_proxy: RunningProxy):
    with times_proxy.connect(autocommit=True) as conn:
        shown = {row[1]: row[6] or "" for row in conn.execute("SHOW dpproxy.columns").fetchall()}
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT label, count(*) FROM pv_times GROUP BY 1")
    hint = refused.value.diag.message_hint or ""
    assert "EXTRACT(YEAR|MONTH|QUARTER FROM demo)" in hint  # the year was left out of both
    for column in ("demo", "weeks", "quarters", "days"):
        listed = set(re.findall(r"(.+?) \(\d+ cells?\)(?:, |$)", shown[column]))
        units = re.search(rf"DATE_TRUNC\('([a-z|]+)', {column}\)", hint)
        fields = re.search(rf"EXTRACT\(([A-Z|]+) FROM {column}\)", hint)
        hinted = ({f"DATE_TRUNC('{unit}', {column})" for unit in units[1].split("|")} if units else set()) | (
            {f"EXTRACT({field} FROM {column})" for field in fields[1].split("|")} if fields else set())
        assert hinted == {form for form in listed if form.startswith(("DATE_TRUNC", "EXTRACT"))}, (column, hint)


def test_extract_year_of_a_column_opting_in_weeks_only_is_refused_with_the_units_to_opt_in(times_proxy: RunningProxy):
    # A week straddles years: the year is not answered. Its advice was looked up eagerly in a table
    # without 'year', and the statement failed with XX000 (internal error) instead.
    with times_proxy.connect(autocommit=True) as conn, pytest.raises(psycopg.Error) as refused:
        conn.execute("SELECT EXTRACT(YEAR FROM weeks) AS y, count(*) FROM pv_times GROUP BY 1")
    assert refused.value.sqlstate != "XX000" and "(rule: no-group-by)" in str(refused.value)
    assert (refused.value.diag.message_hint or "").startswith(
        "The YEAR part of weeks is answered when the policy opts 'year', 'quarter', 'month' or 'day' in "
        "(weeks answers week)")


def test_show_columns_lists_count_distinct_where_it_is_answered(typed_proxy: RunningProxy):
    # COUNT(DISTINCT col) was answered (and named by the GROUP BY hint) but listed by no column.
    with typed_proxy.connect(autocommit=True) as conn:
        shown = {row[1]: row[5] for row in conn.execute("SHOW dpproxy.columns").fetchall()
                 if row[0] == '"Sales"."Order.Items"'}
        for column, aggregates in shown.items():
            if column == "*":
                continue
            try:
                conn.execute(f'SELECT COUNT(DISTINCT "{column}") FROM "Sales"."Order.Items"').fetchall()
            except psycopg.Error as exc:
                assert "(rule: aggregate-argument)" in str(exc), (column, exc)
                answered = False
            else:
                answered = True
            assert ("COUNT(DISTINCT) laplace" in aggregates) == answered, (column, aggregates)
    assert "COUNT(DISTINCT) laplace" in shown["mood"] and "COUNT(DISTINCT) laplace" not in shown["tags"]
