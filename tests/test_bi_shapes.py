"""Statements BI tools send for aggregate charts, answered as PostgreSQL would shape them.

Each statement is written as its tool generates it (the tool is named in a comment) and run
through dpproxy and directly on PostgreSQL: the column names and types must match, and the
rows are the declared keys (docs/bi-tools.md). Variants that would release more stay refused
with their SQLSTATE, rule and hint.
"""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pytest
from conftest import RunningProxy, TestDatabase, running_proxy, spent_epsilon
from test_histograms import POLICY, _TABLE_SQL, _TABLES

from proxy.demo.embedded import SERVICE_ROLE


@pytest.fixture(scope="module")
def bi(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over test_histograms' tables (visits: sex, race, age, visited_at … opted in)."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(_TABLE_SQL)
        conn.execute(f"GRANT SELECT ON {', '.join(_TABLES)} TO {SERVICE_ROLE}")
    with running_proxy(test_db, tmp_path_factory, POLICY) as running:
        yield running


Shape = list[tuple[str, int]]


def _run(conn: psycopg.Connection, sql: str) -> tuple[Shape, list[tuple]]:
    cursor = conn.execute(sql)
    assert cursor.description is not None
    return [(c.name, c.type_code) for c in cursor.description], cursor.fetchall()


def _both(proxy: RunningProxy, admin: psycopg.Connection, sql: str, timezone: str = "UTC") -> tuple[list[tuple], list[tuple]]:
    """``sql`` through dpproxy and directly, in one TimeZone; asserts the same names and types."""
    admin.execute(f"SET TimeZone = '{timezone}'")
    with proxy.connect() as conn:
        conn.execute(f"SET TimeZone = '{timezone}'")
        shape, rows = _run(conn, sql)
    direct_shape, direct = _run(admin, sql)
    admin.execute("RESET TimeZone")
    assert shape == direct_shape
    return rows, direct


def _refused(proxy: RunningProxy, sql: str) -> psycopg.errors.Diagnostic:
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
        conn.execute("SELECT 1")  # the session goes on
    return info.value.diag


def _refused_with(proxy: RunningProxy, sql: str, advice: str) -> None:
    """``sql`` is refused (``no-group-by``) with a hint that says ``advice``."""
    diag = _refused(proxy, sql)
    assert diag.sqlstate == "DP001" and "rule: no-group-by" in (diag.message_primary or "")
    assert advice in (diag.message_hint or "")


# ---------------------------------------------------------------- Metabase


def test_metabase_time_series_with_qualified_columns_answers_every_month(bi, admin):
    # Metabase (MBQL → SQL, PostgreSQL driver): count by created_at: Month
    sql = ('SELECT date_trunc(\'month\', "public"."visits"."visited_at") AS "visited_at", count(*) AS "count" '
           'FROM "public"."visits" GROUP BY date_trunc(\'month\', "public"."visits"."visited_at") '
           'ORDER BY date_trunc(\'month\', "public"."visits"."visited_at") ASC')
    rows, direct = _both(bi, admin, sql)
    assert [r[0] for r in rows] == [r[0] for r in direct if r[0] is not None]  # the 12 months of 2023


def test_metabase_source_wrapper_grouped_by_a_qualified_name_is_answered(bi, admin):
    # Metabase ≥ 0.50: a breakout over a nested "source" query, grouped and ordered by "source"."sex"
    sql = ('SELECT "source"."sex" AS "sex", count(*) AS "count" FROM (SELECT "public"."visits"."sex" AS "sex", '
           '"public"."visits"."age" AS "age" FROM "public"."visits") AS "source" '
           'GROUP BY "source"."sex" ORDER BY "source"."sex" ASC')
    rows, _ = _both(bi, admin, sql)
    assert [r[0] for r in rows] == ["Female", "Male"]  # declared keys, ordered as asked


def test_metabase_source_wrapper_selecting_a_date_trunc_key_is_answered(bi, admin):
    # Metabase: the breakout's date_trunc is computed in the "source" subquery, grouped above it
    sql = ('SELECT "source"."visited_at" AS "visited_at", count(*) AS "count" FROM (SELECT '
           'date_trunc(\'month\', "public"."visits"."visited_at") AS "visited_at" FROM "public"."visits") AS "source" '
           'GROUP BY "source"."visited_at" ORDER BY "source"."visited_at" ASC')
    rows, direct = _both(bi, admin, sql)
    assert [r[0] for r in rows] == [r[0] for r in direct if r[0] is not None]


def test_metabase_source_wrapper_with_a_cast_key_and_a_category_gives_their_cross_product(bi, admin):
    # Metabase: a date column's quarter cast back to date, broken out by sex, with an average
    sql = ('SELECT "source"."visited_at" AS "visited_at", "source"."sex" AS "sex", count(*) AS "count", '
           'avg("source"."age") AS "avg" FROM (SELECT CAST(date_trunc(\'quarter\', "public"."visits"."visited_at") '
           'AS date) AS "visited_at", "public"."visits"."sex" AS "sex", "public"."visits"."age" AS "age" '
           'FROM "public"."visits") AS "source" GROUP BY "source"."visited_at", "source"."sex" '
           'ORDER BY "source"."visited_at" ASC, "source"."sex" ASC')
    rows, _ = _both(bi, admin, sql)
    assert len(rows) == 4 * 2 and [r[1] for r in rows[:2]] == ["Female", "Male"]


def test_metabase_auto_binning_of_a_bounded_column_answers_every_bin_of_its_bounds(bi, admin):
    # Metabase: count by age, Auto binned (A and W from the fingerprint: 10 bins of 10.0 from 10.0)
    key = '((floor((("public"."visits"."age" - 10.0) / 10.0)) * 10.0) + 10.0)'
    sql = f'SELECT {key} AS "age", count(*) AS "count" FROM "public"."visits" GROUP BY {key} ORDER BY {key} ASC'
    rows, direct = _both(bi, admin, sql)
    assert [str(r[0]) for r in rows] == [f"{10 * i}.0" for i in range(1, 10)]  # 17 … 90: the bins 10.0 … 90.0
    within = {str(r[0]) for r in direct if r[0] is not None and 10 <= r[0] <= 70}  # visits' ages 18 … 77, 500, -3
    assert within <= {str(r[0]) for r in rows}


@pytest.mark.parametrize("sql", [
    # Metabase: a Year breakout computed in the "source" subquery
    'SELECT "source"."visited_at" AS "visited_at", count(*) AS "count" FROM (SELECT CAST(extract(year from '
    '"public"."visits"."visited_at") AS integer) AS "visited_at" FROM "public"."visits") AS "source" '
    'GROUP BY "source"."visited_at" ORDER BY "source"."visited_at" ASC',
    # Tableau: a Custom SQL Query that selects a truncated cast, grouped above it
    'SELECT "Custom SQL Query"."m" AS "m", SUM(1) AS "cnt" FROM (SELECT DATE_TRUNC(\'MONTH\', CAST(logged_at AS DATE)) '
    'AS m FROM visits) "Custom SQL Query" GROUP BY 1',
])
def test_wrappers_selecting_a_year_or_a_truncated_cast_are_answered(bi, admin, sql):
    # Refused before (no-subquery): the wrapper's column is a year or time key written over a column.
    rows, direct = _both(bi, admin, sql, timezone="Europe/Berlin")
    assert {r[0] for r in rows} <= {r[0] for r in direct} and len(rows) in (1, 12)


@pytest.mark.parametrize("sql", [
    # a middle wrapper that renames: the name it gives is the one visible above it
    "SELECT count(*) FROM (SELECT x FROM (SELECT age AS x FROM visits) AS a) AS b WHERE b.x > 30",
    "SELECT b.m, count(*) FROM (SELECT m FROM (SELECT date_trunc('month', visited_at) AS m FROM visits) AS a) AS b "
    "GROUP BY 1 ORDER BY b.m",
    'SELECT "b"."s" AS "s", count(*) FROM (SELECT "a"."s" FROM (SELECT sex AS s, age FROM visits) "a" '
    'WHERE "a"."age" > 20) "b" GROUP BY "b"."s"',
])
def test_nested_wrappers_that_rename_columns_are_answered(bi, admin, sql):
    # The middle level's own output column lost its name when flattened: 42703 'column "x" does
    # not exist', where PostgreSQL answers.
    rows, _ = _both(bi, admin, sql)  # names and types as PostgreSQL's
    assert rows


@pytest.mark.parametrize("sql, rule", [
    # a computed column that is no key: still not modelled
    ("SELECT count(*) FROM (SELECT age + 1 AS a FROM visits) AS s", "no-subquery"),
    # a key the policy does not opt in, through a wrapper: refused as if written above it
    ("SELECT s.m, count(*) FROM (SELECT date_trunc('hour', visited_at) AS m FROM visits) AS s GROUP BY 1",
     "no-group-by"),
    # a wrapper's key selected without GROUP BY would be a row value
    ("SELECT s.m, count(*) FROM (SELECT date_trunc('month', visited_at) AS m FROM visits) AS s", "no-row-access"),
    # a wrapper's key as an aggregate's argument is not a column
    ("SELECT sum(s.b) FROM (SELECT width_bucket(score, 0, 1, 4) AS b FROM visits) AS s", "aggregate-argument"),
    ("SELECT sum(s.y) FROM (SELECT EXTRACT(YEAR FROM visited_at) AS y FROM visits) AS s", "aggregate-argument"),
    # a truncated cast of something other than a column is no key
    ("SELECT s.m, count(*) FROM (SELECT date_trunc('month', CAST(age AS text)::date) AS m FROM visits) AS s GROUP BY 1",
     "no-subquery"),
])
def test_wrapper_columns_that_would_release_more_stay_refused(bi, sql, rule):
    diag = _refused(bi, sql)
    assert diag.sqlstate == "DP001" and f"rule: {rule}" in (diag.message_primary or "")
    assert diag.message_hint


# ---------------------------------------------------------------- Tableau


def test_tableau_number_of_records_sum_1_is_a_count_per_declared_key(bi, admin):
    # Tableau (PostgreSQL dialect): a bar of Number of Records by sex
    sql = ('SELECT "visits"."sex" AS "sex", SUM(1) AS "sum:Number of Records:ok" FROM "public"."visits" "visits" '
           'GROUP BY 1')
    rows, _ = _both(bi, admin, sql)
    assert [r[0] for r in rows] == ["Male", "Female"]


def test_tableau_sum_1_is_released_once_with_count(bi, admin):
    # Tableau: the total of Number of Records, with its HAVING (COUNT(1) > 0)
    rows, _ = _both(bi, admin, 'SELECT SUM(1) AS "sum:Number of Records:ok" FROM "public"."visits" "visits" '
                               'HAVING (COUNT(1) > 0)')
    assert len(rows) == 1
    # Post-processed, SUM(1) and COUNT(*) are one release: the same noised value.
    rows, _ = _both(bi, admin, "SELECT SUM(1), count(*) + 0 AS n FROM visits WHERE age > 30")
    assert rows[0][0] == rows[0][1]


def test_tableau_custom_sql_wrapper_with_sum_1_is_answered(bi, admin):
    # Tableau: a Custom SQL Query data source
    sql = 'SELECT "Custom SQL Query"."sex" AS "sex", SUM(1) AS "cnt" FROM (SELECT * FROM visits) "Custom SQL Query" GROUP BY 1'
    rows, _ = _both(bi, admin, sql)
    assert [r[0] for r in rows] == ["Male", "Female"]


@pytest.mark.parametrize("sql", ["SELECT SUM(2) FROM visits", "SELECT SUM(1.0) FROM visits", "SELECT SUM('1') FROM visits"])
def test_sums_of_other_constants_stay_refused(bi, sql):
    diag = _refused(bi, sql)
    assert diag.sqlstate == "DP001" and "rule: aggregate-argument" in (diag.message_primary or "")


_WIDENING_CASTS = [
    # Tableau casts an integer measure before averaging or summing it
    'SELECT AVG(CAST("visits"."age" AS DOUBLE PRECISION)) AS "avg:age:ok" FROM "public"."visits" "visits"',
    'SELECT SUM(CAST("visits"."age" AS BIGINT)) AS "sum:age:ok" FROM "public"."visits" "visits"',
    'SELECT "visits"."sex" AS "sex", SUM(CAST("visits"."age" AS BIGINT)) AS "sum:age:ok" '
    'FROM "public"."visits" "visits" GROUP BY 1',
    "SELECT sum(age::numeric), avg(income::float8), count(age::float8), sum(score::float8) FROM visits",
    "SELECT sum(age::bigint) + 0 AS s, sum(age) AS plain FROM visits WHERE age > 30",
]


@pytest.mark.parametrize("sql", _WIDENING_CASTS)
def test_an_aggregate_of_a_widening_cast_is_answered_in_the_casts_result_type(bi, admin, sql):
    # Refused before (aggregate-argument): the cast changes no value, so the release is the
    # plain aggregate's, in the result type PostgreSQL gives the cast's.
    rows, _ = _both(bi, admin, sql)  # names and types as PostgreSQL's
    assert rows and all(value is not None for row in rows for value in row)


@pytest.mark.parametrize("sql", [
    # Tableau groups a string dimension as CAST(col AS TEXT)
    'SELECT CAST("visits"."sex" AS TEXT) AS "sex", SUM(1) AS "sum:Number of Records:ok" '
    'FROM "public"."visits" "visits" GROUP BY 1',
    "SELECT race::varchar, count(*) FROM visits GROUP BY race::varchar",
    "SELECT CAST(sex AS TEXT), count(*) FROM visits GROUP BY sex",
])
def test_a_category_cast_to_text_is_the_category_key(bi, admin, sql):
    rows, _ = _both(bi, admin, sql)  # names and types as PostgreSQL's
    labels = [r[0] for r in rows]
    assert labels in (["Male", "Female"], ["White", "Black", "Other"])  # the declared keys, none from the data


@pytest.mark.parametrize("sql", [
    # Tableau's YEAR(date) dimension
    'SELECT CAST(EXTRACT(YEAR FROM "visits"."visited_at") AS INTEGER) AS "yr:visited_at:ok", SUM(1) AS "cnt" '
    'FROM "public"."visits" "visits" GROUP BY 1',
    "SELECT EXTRACT(YEAR FROM visited_at), count(*) FROM visits GROUP BY EXTRACT(YEAR FROM visited_at)",
    "SELECT EXTRACT(YEAR FROM visited_at) AS y, sex, count(*) FROM visits "
    "WHERE visited_at >= '2023-06-01' GROUP BY 1, 2 ORDER BY 1, 2",
    "SELECT date_part('year', visited_at), count(*) FROM visits WHERE visited_at < '2024-01-01' GROUP BY 1",
    # Tableau's own YEAR(date): the year's number through TRUNC, cast to an integer
    'SELECT CAST(TRUNC(EXTRACT(YEAR FROM "visits"."visited_at")) AS INTEGER) AS "yr:visited_at:ok", '
    'SUM(1) AS "sum:Number of Records:ok" FROM "public"."visits" "visits" GROUP BY 1',
    "SELECT TRUNC(EXTRACT(YEAR FROM visited_at)) AS y, count(*) FROM visits GROUP BY TRUNC(EXTRACT(YEAR FROM visited_at))",
    # a date part of a date field cast to a timestamp, as other BI tools derive it
    "SELECT CAST(EXTRACT(YEAR FROM visited_at::TIMESTAMPTZ) AS INT) AS y, count(*) FROM visits GROUP BY 1 ORDER BY 1",
    "SELECT CAST(date_part('year', visited_at) AS INTEGER) AS y, count(*) FROM visits GROUP BY 1",
])
def test_the_year_of_a_time_column_is_its_year_key(bi, admin, sql):
    rows, _ = _both(bi, admin, sql)  # names and types as PostgreSQL's (numeric, or the cast's)
    assert {int(r[0]) for r in rows} == {2023}  # the declared range's one year, whatever the data


@pytest.mark.parametrize("sql, type_oid", [
    # PostgreSQL 14+: EXTRACT is numeric, date_part double precision (PostgreSQL's own
    # spellings, each kept as written through post-processing)
    ("SELECT EXTRACT(YEAR FROM visited_at) AS y, count(*) FROM visits GROUP BY 1", 1700),
    ("SELECT date_part('year', visited_at), count(*) FROM visits GROUP BY 1", 701),
    ("SELECT date_part('YEAR', visited_at) AS y, count(*) FROM visits GROUP BY date_part('YEAR', visited_at)", 701),
    ("SELECT date_part('month', date_trunc('month', visited_at)) AS m, count(*) FROM visits "
     "GROUP BY date_trunc('month', visited_at)", 701),
    ("SELECT date_part('year', now()) AS y, count(*) FROM visits", 701),
])
def test_date_part_and_extract_keys_have_postgresqls_types(bi, admin, sql, type_oid):
    # date_part('year', col) came back numeric: sqlglot wrote it back as EXTRACT.
    with bi.connect() as conn:
        cursor = conn.execute(sql)
        assert cursor.description is not None and cursor.description[0].type_code == type_oid
    _both(bi, admin, sql.replace("FROM visits", "FROM visits WHERE visited_at < '2024-01-01'", 1)
          if "now()" not in sql and "date_trunc" not in sql else sql)


def test_grafanas_epoch_group_spelled_with_date_part_is_refused_with_a_hint(bi):
    # floor(date_part('epoch', col)/N)*N is double precision, not the numeric epoch buckets
    # extract(epoch from col) gives: the hint names Grafana's own spelling.
    diag = _refused(bi, "SELECT floor(date_part('epoch', visited_at)/86400)*86400 AS t, count(*) FROM visits GROUP BY 1")
    assert diag.sqlstate == "DP001" and "rule: no-group-by" in (diag.message_primary or "")
    assert "floor(extract(epoch from visited_at)/N)*N" in (diag.message_hint or "")


_TABLEAU_TRUNCATED_CASTS = [
    # Tableau's month of a date-time field (its cast to date, truncated, cast back to date), in a
    # session whose TimeZone is not UTC: the date cast of a timestamptz is read in it, as date_trunc is
    ('SELECT CAST(DATE_TRUNC(\'MONTH\', CAST("visits"."logged_at" AS DATE)) AS DATE) AS "tmn:logged_at:ok", '
     'SUM(1) AS "sum:Number of Records:ok" FROM "public"."visits" "visits" GROUP BY 1', 12),
    ('SELECT DATE_TRUNC(\'MONTH\', CAST("visits"."visited_at" AS DATE)) AS "tmn:visited_at:ok", SUM(1) AS "cnt" '
     'FROM "public"."visits" "visits" GROUP BY 1', 12),
    ('SELECT CAST(DATE_TRUNC(\'QUARTER\', CAST("visits"."visited_at" AS DATE)) AS DATE) AS "tqr:visited_at:ok", '
     'COUNT(1) AS "cnt" FROM "public"."visits" "visits" GROUP BY 1', 4),
    ('SELECT CAST(DATE_TRUNC(\'WEEK\', CAST("visits"."visited_on" AS DATE)) AS DATE) AS "twk:visited_on:ok", '
     'COUNT(1) AS "cnt" FROM "public"."visits" "visits" WHERE "visits"."visited_on" < \'2024-01-01\' GROUP BY 1', 53),
    ('SELECT DATE_TRUNC(\'DAY\', CAST("visits"."logged_at" AS DATE)) AS "tdy:logged_at:ok", COUNT(1) AS "cnt" '
     'FROM "public"."visits" "visits" WHERE "visits"."logged_at" >= \'2023-03-01\' AND "visits"."logged_at" < \'2023-04-01\' '
     'GROUP BY 1', 31),
    # Tableau's month through a timestamp cast (its SQL for a date-time field on some versions)
    ('SELECT DATE_TRUNC( \'MONTH\', CAST("visits"."logged_at" AS TIMESTAMP) ) AS "tmn:logged_at:ok", '
     'COUNT(1) AS "cnt" FROM "public"."visits" "visits" GROUP BY 1', 12),
    ("SELECT date_trunc('month', visited_at::timestamptz) AS m, count(*) FROM visits GROUP BY 1 ORDER BY 1", 12),
    ("SELECT CAST(EXTRACT(YEAR FROM CAST(visited_at AS DATE)) AS INTEGER) AS y, count(*) FROM visits GROUP BY 1", 1),
]


@pytest.mark.parametrize("sql, cells", _TABLEAU_TRUNCATED_CASTS)
def test_date_trunc_of_a_time_column_cast_to_a_time_type_is_its_time_key(bi, admin, sql, cells):
    # Refused before (no-group-by): the backend groups by PostgreSQL's own expression, cast
    # included, so each row is in the cell PostgreSQL would put it in, over the declared range.
    rows, direct = _both(bi, admin, sql, timezone="America/New_York")  # names and types as PostgreSQL's
    keys = [r[0] for r in rows]
    assert len(keys) == cells and keys == sorted(keys)
    assert set(keys) <= {r[0] for r in direct}  # every cell is one PostgreSQL's groups are named by


@pytest.mark.parametrize("sql", [
    "SELECT date_trunc('hour', CAST(logged_at AS DATE)), count(*) FROM visits GROUP BY 1",          # finer than a day
    "SELECT date_trunc('month', CAST(logged_at AS timestamp(0))), count(*) FROM visits GROUP BY 1",  # a typmod rounds
    "SELECT date_trunc('day', CAST(visited_on AS timestamp)), count(*) FROM visits GROUP BY 1",     # finer than declared
    "SELECT date_trunc('month', CAST(device AS DATE)), count(*) FROM visits GROUP BY 1",             # not a time column
    "SELECT date_trunc('month', CAST(visited_at + interval '1 day' AS DATE)), count(*) FROM visits GROUP BY 1",
])
def test_other_truncated_casts_stay_refused(bi, sql):
    diag = _refused(bi, sql)
    assert diag.sqlstate == "DP001" and "rule: no-group-by" in (diag.message_primary or "")
    assert "DATE_TRUNC(" in (diag.message_hint or "")


def test_a_truncated_cast_and_the_plain_key_are_different_expressions(bi):
    # As in PostgreSQL: the select list's DATE_TRUNC of the cast is not the GROUP BY's key.
    diag = _refused(bi, "SELECT DATE_TRUNC('MONTH', CAST(visited_at AS DATE)) AS m, count(*) FROM visits "
                        "GROUP BY DATE_TRUNC('MONTH', visited_at)")
    assert diag.sqlstate == "42803"


# ---------------------------------------------------------------- date keys that are functions of a bucket

_V, _L, _D = '"public"."visits"."visited_at"', '"public"."visits"."logged_at"', '"public"."visits"."visited_on"'

_DATE_PARTS = [
    # Metabase (postgres driver): Month of year, Quarter of year, Day of month, Day of year, Week of year
    (f'SELECT CAST(extract(month from {_V}) AS integer) AS "visited_at", count(*) AS "count" FROM "public"."visits" '
     f'GROUP BY CAST(extract(month from {_V}) AS integer) ORDER BY CAST(extract(month from {_V}) AS integer) ASC', 12),
    (f'SELECT CAST(extract(quarter from {_V}) AS integer) AS "q", count(*) AS "count" FROM "public"."visits" GROUP BY 1', 4),
    (f'SELECT CAST(extract(day from {_V}) AS integer) AS "d", count(*) AS "count" FROM "public"."visits" GROUP BY 1', 31),
    (f'SELECT CAST(extract(doy from {_V}) AS integer) AS "d", count(*) AS "count" FROM "public"."visits" GROUP BY 1', 365),
    (f'SELECT CAST(extract(week from {_V}) AS integer) AS "w", count(*) AS "count" FROM "public"."visits" GROUP BY 1', 52),
    # Metabase's Day of week (first day of the week: Sunday, its default): 1 … 7
    (f'SELECT (CAST(extract(dow from {_V}) AS integer) + 1) AS "visited_at", count(*) AS "count" '
     f'FROM "public"."visits" GROUP BY (CAST(extract(dow from {_V}) AS integer) + 1) ORDER BY 1 ASC', 7),
    # … and with another first day of the week (Monday: the day's number moved by 6, modulo 7, 1 … 7)
    (f'SELECT CASE WHEN mod(((CAST(extract(dow from {_V}) AS integer) + 1) + 6), 7) = 0 THEN 7 ELSE '
     f'mod(((CAST(extract(dow from {_V}) AS integer) + 1) + 6), 7) END AS "visited_at", count(*) AS "count" '
     'FROM "public"."visits" GROUP BY 1 ORDER BY 1 ASC', 7),
    # Metabase over a date column: the part of its cast to a timestamp ('week' opted in answers the week
    # number). Directly, the cast fails on the year-5000000 row; dpproxy casts only the rows in the range.
    (f'SELECT CAST(extract(month from CAST({_D} AS timestamp)) AS integer) AS "m", count(*) AS "count" '
     f'FROM "public"."visits" WHERE {_D} < \'2024-01-01\' GROUP BY 1', 12),
    (f'SELECT CAST(extract(week from CAST({_D} AS timestamp)) AS integer) AS "w", count(*) AS "count" '
     f'FROM "public"."visits" WHERE {_D} < \'2024-01-01\' GROUP BY 1', 52),
    # Tableau's discrete MONTH(date), QUARTER(date), WEEKDAY(date)
    ('SELECT CAST(TRUNC(EXTRACT(MONTH FROM "visits"."visited_at")) AS INTEGER) AS "mn:visited_at:ok", SUM(1) AS "cnt" '
     'FROM "public"."visits" "visits" GROUP BY 1', 12),
    ('SELECT CAST(TRUNC(EXTRACT(QUARTER FROM "visits"."visited_on")) AS INTEGER) AS "qr:visited_on:ok", SUM(1) AS "cnt" '
     'FROM "public"."visits" "visits" GROUP BY 1', 4),
    ('SELECT CAST(TRUNC(EXTRACT(DOW FROM "visits"."visited_at")) AS INTEGER) AS "wd:visited_at:ok", SUM(1) AS "cnt" '
     'FROM "public"."visits" "visits" GROUP BY 1', 7),
    # Power BI's date hierarchy levels fold to date_part (double precision)
    ("SELECT date_part('quarter', visited_at) AS q, count(*) FROM visits GROUP BY 1", 4),
    ("SELECT date_part('month', visited_at) AS m, count(*) FROM visits GROUP BY date_part('month', visited_at)", 12),
    ("SELECT date_part('day', visited_at) AS d, count(*) FROM visits GROUP BY 1", 31),
    # an expression of the key in the select list is computed over it, as in PostgreSQL
    ("SELECT EXTRACT(MONTH FROM visited_at) * 2 AS m2, count(*) FROM visits GROUP BY EXTRACT(MONTH FROM visited_at)", 12),
    # timestamptz: parts in the session's TimeZone; the quarter over 'month', the ISO week over 'day'
    ("SELECT EXTRACT(ISODOW FROM logged_at) AS d, count(*) FROM visits GROUP BY 1", 7),
    ("SELECT date_part('quarter', logged_at) AS q, count(*) FROM visits GROUP BY 1", 4),
    ("SELECT EXTRACT(WEEK FROM logged_at) AS w, count(*) FROM visits GROUP BY 1", 52),
    ("SELECT EXTRACT(MONTH FROM logged_at) AS m, count(*) FROM visits WHERE logged_at >= '2023-03-15' "
     "AND logged_at < '2023-06-01' GROUP BY 1", 3),
]


@pytest.mark.parametrize("sql, cells", _DATE_PARTS)
@pytest.mark.parametrize("timezone", ["UTC", "Pacific/Kiritimati"])
def test_a_date_part_of_an_opted_in_unit_is_answered_over_the_values_the_range_gives(bi, admin, sql, cells, timezone):
    # Refused before (no-group-by): month of year, day of week … are functions of the bucket of a
    # unit the column opts in, so each cell is a union of that unit's buckets.
    rows, direct = _both(bi, admin, sql, timezone=timezone)  # names and types as PostgreSQL's
    keys = [r[0] for r in rows]
    assert len(keys) == cells and keys == sorted(keys)  # one row per value the declared range gives, in order
    assert set(keys) == {r[0] for r in direct if r[0] is not None}  # the data covers every day of 2023


_HIERARCHIES = [
    # Power BI: Year, Quarter, Month of a date hierarchy
    ("SELECT date_part('year', visited_at), date_part('quarter', visited_at), date_part('month', visited_at), "
     "count(*) FROM visits GROUP BY date_part('year', visited_at), date_part('quarter', visited_at), "
     "date_part('month', visited_at)", 12),
    # Tableau: YEAR(date) and QUARTER(date), both discrete
    ('SELECT CAST(TRUNC(EXTRACT(QUARTER FROM "visits"."visited_at")) AS INTEGER) AS "qr:visited_at:ok", '
     'CAST(TRUNC(EXTRACT(YEAR FROM "visits"."visited_at")) AS INTEGER) AS "yr:visited_at:ok", SUM(1) AS "cnt" '
     'FROM "public"."visits" "visits" GROUP BY 1, 2', 4),
    ("SELECT EXTRACT(QUARTER FROM logged_at) AS q, EXTRACT(MONTH FROM logged_at) AS m, EXTRACT(DAY FROM logged_at) AS d, "
     "count(*) FROM visits GROUP BY 1, 2, 3", 365),
    ("SELECT date_trunc('month', visited_at) AS m, EXTRACT(ISODOW FROM visited_at) AS d, count(*) FROM visits "
     "GROUP BY 1, 2", 84),  # the 7 week days of each month: 12 × 7
    ("SELECT EXTRACT(MONTH FROM visited_on) AS m, EXTRACT(WEEK FROM visited_on) AS w, count(*) FROM visits "
     "WHERE visited_on < '2024-01-01' GROUP BY 1, 2", 52 + 1 + 10),  # Jan 1 is in 2022's week 52; ten
    # months of 2023 start in the middle of a week, which is then in two cells
]


@pytest.mark.parametrize("sql, cells", _HIERARCHIES)
def test_date_keys_over_one_column_are_the_tuples_the_range_gives_not_their_product(bi, admin, sql, cells):
    rows, direct = _both(bi, admin, sql, timezone="America/New_York")
    keys = [tuple(r[:-1]) for r in rows]
    assert len(keys) == cells and keys == sorted(keys)
    assert set(keys) == {tuple(r[:-1]) for r in direct if None not in r[:-1] and r[0] in {k[0] for k in keys}}


# ---------------------------------------------------------------- units nested in a declared one

_NESTED_UNITS = [
    # visited_on lists month, quarter and week: the year is nested in month (Superset's Time grain: Year)
    ("SELECT DATE_TRUNC('year', visited_on) AS visited_on, COUNT(*) AS count FROM visits "
     "WHERE visited_on < '2024-01-01' GROUP BY DATE_TRUNC('year', visited_on) ORDER BY count DESC LIMIT 10000", 1),
    # logged_at lists month and day: week, quarter and year are nested in day
    ("SELECT date_trunc('week', logged_at) AS w, count(*) FROM visits GROUP BY 1", 53),
    # Tableau's continuous QUARTER(date); Metabase's Quarter, cast back to a date
    ('SELECT DATE_TRUNC(\'QUARTER\', CAST("visits"."logged_at" AS DATE)) AS "tqr:logged_at:ok", SUM(1) AS "cnt" '
     'FROM "public"."visits" "visits" GROUP BY 1', 4),
    (f'SELECT CAST(date_trunc(\'quarter\', {_L}) AS date) AS "logged_at", count(*) AS "count" '
     f'FROM "public"."visits" GROUP BY CAST(date_trunc(\'quarter\', {_L}) AS date) ORDER BY 1 ASC', 4),
    ("SELECT EXTRACT(YEAR FROM logged_at) AS y, count(*) FROM visits GROUP BY 1", 1),
]


@pytest.mark.parametrize("sql, cells", _NESTED_UNITS)
def test_a_unit_nested_in_a_declared_one_is_answered_as_if_it_were_declared(bi, admin, sql, cells):
    # Refused before (no-group-by): each bucket of the coarser unit is a union of the declared
    # unit's buckets, so its cells come from the declared range and each row is in one of them.
    rows, direct = _both(bi, admin, sql, timezone="America/New_York")
    keys = [r[0] for r in rows]
    assert len(keys) == cells and sorted(keys) == sorted(set(keys))
    assert set(keys) >= {r[0] for r in direct if r[0] is not None}


_PAIRS = [
    # Superset's pivot table: rows by quarter, columns by month (12 cells, not 4 × 12)
    ("SELECT DATE_TRUNC('quarter', visited_at) AS q, DATE_TRUNC('month', visited_at) AS m, COUNT(*) AS count "
     "FROM visits GROUP BY DATE_TRUNC('quarter', visited_at), DATE_TRUNC('month', visited_at)", 12),
    # Tableau: YEAR(date) discrete beside MONTH(date) continuous
    ('SELECT CAST(TRUNC(EXTRACT(YEAR FROM "visits"."visited_at")) AS INTEGER) AS "yr:visited_at:ok", '
     'DATE_TRUNC(\'MONTH\', CAST("visits"."visited_at" AS DATE)) AS "tmn:visited_at:ok", SUM(1) AS "cnt" '
     'FROM "public"."visits" "visits" GROUP BY 1, 2', 12),
    # weeks by month: a week that straddles two months is in two cells, each of its days in one
    ("SELECT date_trunc('month', logged_at) AS m, date_trunc('week', logged_at) AS w, count(*) FROM visits "
     "GROUP BY 1, 2", 53 + 10),  # ten months of 2023 start in the middle of a week (not May)
]


@pytest.mark.parametrize("sql, cells", _PAIRS)
def test_date_truncs_over_one_column_are_the_tuples_the_range_gives_not_their_product(bi, admin, sql, cells):
    # A cross product before: 48 cells for quarters by months, 36 of them impossible.
    rows, direct = _both(bi, admin, sql, timezone="UTC")
    keys = [tuple(r[:-1]) for r in rows]
    assert len(keys) == cells and keys == sorted(keys)
    assert set(keys) == {tuple(r[:-1]) for r in direct if None not in r[:-1]}


def test_date_truncs_over_different_columns_stay_their_product(bi, admin):
    sql = ("SELECT date_trunc('quarter', visited_at) AS a, date_trunc('quarter', logged_at) AS b, count(*) "
           "FROM visits GROUP BY 1, 2")
    rows, _ = _both(bi, admin, sql)
    assert len(rows) == 16


@pytest.fixture(scope="module")
def month_only(bi: RunningProxy, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over the same tables, visited_on declared over two years by month only."""
    policy = POLICY.replace("visited_on: {{bounds: [2023-01-01, 2023-12-31], group_by: [month, quarter, week]}}",
                            "visited_on: {{bounds: [2022-07-01, 2024-06-30], group_by: [month]}}")
    with running_proxy(test_db, tmp_path_factory, policy) as running:
        yield running


def test_superset_quarters_of_a_column_declared_by_month_are_answered(month_only, admin):
    sql = ("SELECT DATE_TRUNC('quarter', visited_on) AS visited_on, COUNT(*) AS count FROM visits "
           "WHERE visited_on < '2024-01-01' GROUP BY DATE_TRUNC('quarter', visited_on) LIMIT 10000")
    rows, direct = _both(month_only, admin, sql)
    keys = sorted(r[0] for r in rows)
    assert [(k.year, k.month) for k in keys] == [(2022, 7), (2022, 10), (2023, 1), (2023, 4), (2023, 7), (2023, 10)]
    assert set(keys) >= {r[0] for r in direct}


def test_a_nested_unit_is_answered_where_the_columns_own_date_trunc_would_raise(month_only):
    # visits holds a date in the year 5000000, past what date_trunc casts: directly this raises;
    # dpproxy truncates only the times within the declared range.
    with month_only.connect() as conn:
        rows = conn.execute("SELECT date_trunc('year', visited_on) AS y, count(*) FROM visits GROUP BY 1").fetchall()
    assert [r[0].year for r in rows] == [2022, 2023, 2024]


@pytest.mark.parametrize("sql", [
    # Superset's pivot table: rows by year, columns by month
    "SELECT date_trunc('year', visited_on) AS y, date_trunc('month', visited_on) AS m, count(*) FROM visits "
    "WHERE visited_on < '2024-01-01' GROUP BY 1, 2 ORDER BY 1, 2",
    # Tableau: YEAR(date) discrete beside MONTH(date) continuous
    'SELECT CAST(TRUNC(EXTRACT(YEAR FROM "visits"."visited_on")) AS INTEGER) AS "yr:visited_on:ok", '
    'DATE_TRUNC(\'MONTH\', CAST("visits"."visited_on" AS DATE)) AS "tmn:visited_on:ok", SUM(1) AS "cnt" '
    'FROM "public"."visits" "visits" WHERE "visits"."visited_on" < \'2024-01-01\' GROUP BY 1, 2 ORDER BY 1, 2',
    # Tableau: YEAR(date) and MONTH(date), both continuous
    'SELECT DATE_TRUNC(\'YEAR\', CAST("visits"."visited_on" AS DATE)) AS "tyr:visited_on:ok", '
    'DATE_TRUNC(\'MONTH\', CAST("visits"."visited_on" AS DATE)) AS "tmn:visited_on:ok", SUM(1) AS "cnt" '
    'FROM "public"."visits" "visits" WHERE "visits"."visited_on" < \'2024-01-01\' GROUP BY 1, 2 ORDER BY 1, 2',
])
def test_years_by_months_of_a_column_declared_by_month_are_its_months(month_only, admin, sql):
    rows, direct = _both(month_only, admin, sql)
    # not 2 × 18 cells: no "2022, 2023-07"
    assert len(rows) == 18 and all(getattr(y, "year", y) == m.year for y, m, _ in rows)
    assert {(y, m) for y, m, _ in rows} >= {(y, m) for y, m, _ in direct}


@pytest.mark.parametrize("sql, advice", [
    ("SELECT date_trunc('week', visited_on), count(*) FROM visits GROUP BY 1", "month, quarter or year"),  # straddles months
    ("SELECT date_trunc('day', visited_on), count(*) FROM visits GROUP BY 1", "month, quarter or year"),   # finer than month
    ("SELECT EXTRACT(WEEK FROM visited_on), count(*) FROM visits GROUP BY 1", "'week' or 'day'"),
    ("SELECT EXTRACT(DOW FROM visited_on), count(*) FROM visits GROUP BY 1",
     "opts 'day' in (visited_on answers month, quarter, year)"),
])
def test_units_not_nested_in_a_declared_one_stay_refused(month_only, sql, advice):
    _refused_with(month_only, sql, advice)


def test_date_keys_over_one_column_beside_a_category_are_their_tuples_times_the_categories(bi, admin):
    sql = ("SELECT sex, date_part('year', visited_at) AS y, date_part('month', visited_at) AS m, count(*) "
           "FROM visits GROUP BY 1, 2, 3")
    rows, _ = _both(bi, admin, sql)
    assert [(r[0], r[2]) for r in rows] == [(s, float(m)) for s in ("Male", "Female") for m in range(1, 13)]


@pytest.mark.parametrize("sql, cells", [
    # a filter's list of values: the values the declared range gives, at ε 0
    ("SELECT DISTINCT EXTRACT(MONTH FROM visited_at) AS m FROM visits", 12),
    ("SELECT date_part('dow', logged_at) FROM visits GROUP BY 1 ORDER BY 1", 7),
    # Metabase ≥ 0.50: the breakout computed in its "source" subquery, grouped above it
    (f'SELECT "source"."m" AS "m", count(*) AS "count" FROM (SELECT CAST(extract(month from {_V}) AS integer) '
     'AS "m" FROM "public"."visits") AS "source" GROUP BY "source"."m" ORDER BY "source"."m" ASC', 12),
])
def test_date_parts_as_a_list_of_values_or_under_a_wrapper_are_answered(bi, admin, sql, cells):
    with bi.connect() as conn:
        before = conn.execute("SHOW dpproxy.budget").fetchone()
    rows, direct = _both(bi, admin, sql)
    assert [r[0] for r in rows] == sorted(r[0] for r in direct if r[0] is not None) and len(rows) == cells
    with bi.connect() as conn:
        after = conn.execute("SHOW dpproxy.budget").fetchone()
    assert (after[1] == before[1]) == ("count" not in sql)  # keys alone are the policy's: nothing charged


_SUNDAY_WEEKS = [
    # Metabase's week (its default first day of the week, Sunday): the Monday week of the next day, a day earlier
    (f"SELECT (date_trunc('week', ({_V} + INTERVAL '1 day')) + INTERVAL '-1 day') AS \"visited_at\", count(*) AS "
     f"\"count\" FROM \"public\".\"visits\" GROUP BY (date_trunc('week', ({_V} + INTERVAL '1 day')) + "
     "INTERVAL '-1 day') ORDER BY 1 ASC"),
    (f"SELECT CAST((date_trunc('week', ({_L} + INTERVAL '1 day')) + INTERVAL '-1 day') AS date) AS \"logged_at\", "
     'count(*) AS "count" FROM "public"."visits" GROUP BY 1'),
    # Tableau's week (Sunday first): the day minus its day of the week
    ('SELECT CAST((DATE_TRUNC( \'day\', CAST("visits"."visited_at" AS DATE) ) + (-EXTRACT(DOW FROM '
     '"visits"."visited_at") * INTERVAL \'1 DAY\')) AS DATE) AS "twk:visited_at:ok", SUM(1) AS "cnt" '
     'FROM "public"."visits" "visits" GROUP BY 1'),
]


@pytest.mark.parametrize("sql", _SUNDAY_WEEKS)
def test_weeks_that_start_on_sunday_are_answered_over_an_opted_in_day(bi, admin, sql):
    rows, direct = _both(bi, admin, sql, timezone="Asia/Kolkata")
    keys = [r[0] for r in rows]
    assert len(keys) == 53 and keys == sorted(keys)  # 2023-01-01 … 2023-12-31, both Sundays
    assert set(keys) == {r[0] for r in direct if r[0] is not None}


@pytest.mark.parametrize("sql, cells", [
    # Tableau's Exact date of a date-time field
    ('SELECT CAST("visits"."visited_at" AS DATE) AS "none:visited_at:ok", SUM(1) AS "cnt" '
     'FROM "public"."visits" "visits" GROUP BY 1', 365),
    ("SELECT logged_at::date AS d, count(*) FROM visits WHERE logged_at >= '2023-12-01' GROUP BY 1", 31),
])
def test_the_date_of_a_time_is_its_day_bucket(bi, admin, sql, cells):
    rows, direct = _both(bi, admin, sql, timezone="America/New_York")
    keys = [r[0] for r in rows]
    assert len(keys) == cells and keys == sorted(keys) and set(keys) <= {r[0] for r in direct}


def test_a_date_column_grouped_by_itself_is_its_day_bucket(test_db, tmp_path_factory, admin):
    policy = POLICY.replace("visited_on: {{bounds: [2023-01-01, 2023-12-31], group_by: [month, quarter, week]}}",
                            "visited_on: {{bounds: [2023-01-01, 2023-12-31], group_by: [day]}}")
    with running_proxy(test_db, tmp_path_factory, policy) as proxy:
        rows, direct = _both(proxy, admin, "SELECT visited_on, count(*) FROM visits WHERE visited_on >= '2023-06-01' "
                                           "AND visited_on < '2024-01-01' GROUP BY visited_on ORDER BY visited_on")
    assert [r[0] for r in rows] == [r[0] for r in direct]  # June … December, each day


@pytest.mark.parametrize("sql, advice", [
    # the unit that decides the part is not opted in: the hint names it
    ("SELECT EXTRACT(DAY FROM visited_on), count(*) FROM visits GROUP BY 1", "opts 'day' in"),
    ("SELECT CAST(extract(dow from visited_on) AS integer) + 1, count(*) FROM visits GROUP BY 1", "opts 'day' in"),
    ("SELECT visited_on, count(*) FROM visits GROUP BY 1", "opts 'day' in"),
    ("SELECT visited_at, count(*) FROM visits GROUP BY 1", "CAST(visited_at AS DATE)"),
    ("SELECT extract(hour from visited_at), count(*) FROM visits GROUP BY 1", "finer than any unit"),
    ("SELECT EXTRACT(MONTH FROM visited_at) * 2, count(*) FROM visits GROUP BY 1", "group by it and compute"),
    # Metabase's Sunday weeks over a column that opts 'week' in but not 'day'
    ('SELECT CAST((date_trunc(\'week\', ("public"."visits"."visited_on" + INTERVAL \'1 day\')) + INTERVAL \'-1 day\') '
     'AS date) AS "visited_on", count(*) AS "count" FROM "public"."visits" GROUP BY 1', "opts 'day' in also answers"),
    # weeks that start on Saturday are no function dpproxy knows
    ("SELECT date_trunc('week', visited_at + INTERVAL '2 day') - INTERVAL '2 day', count(*) FROM visits GROUP BY 1",
     "weeks that start on a day other than Monday"),
])
def test_date_keys_no_opted_in_unit_decides_stay_refused_with_what_to_do(bi, sql, advice):
    _refused_with(bi, sql, advice)


def test_show_columns_lists_each_date_part_with_its_cells(bi):
    with bi.connect() as conn:
        keys = {r[1]: r[6] for r in conn.execute("SHOW dpproxy.columns").fetchall() if r[0] == "visits"}
    assert ("EXTRACT(MONTH FROM logged_at) (12 cells), EXTRACT(QUARTER FROM logged_at) (4 cells), "
            "EXTRACT(DAY FROM logged_at) (31 cells), EXTRACT(DOW FROM logged_at) (7 cells)") in keys["logged_at"]
    # logged_at opts month and day in: year, quarter and week are nested in them, each its own DATE_TRUNC
    assert ("DATE_TRUNC('week', logged_at) (53 cells), DATE_TRUNC('month', logged_at) (12 cells), "
            "DATE_TRUNC('quarter', logged_at) (4 cells), DATE_TRUNC('year', logged_at) (1 cell)") in keys["logged_at"]
    # EXTRACT(YEAR ...) is answered (as the year's bucket): it is listed as any other part.
    assert "EXTRACT(YEAR FROM logged_at) (1 cell), EXTRACT(MONTH FROM logged_at)" in keys["logged_at"]
    assert ("date_trunc('week', logged_at + INTERVAL '1 day') + INTERVAL '-1 day' (53 cells), "
            "CAST(logged_at AS DATE) (365 cells)") in keys["logged_at"]
    assert "EXTRACT(WEEK FROM visited_on) (52 cells)" in keys["visited_on"] and "DOW" not in keys["visited_on"]


def test_the_group_by_hint_lists_the_date_parts_each_time_column_answers(bi):
    hint = _refused(bi, "SELECT device, count(*) FROM visits GROUP BY 1").message_hint or ""
    assert "EXTRACT(YEAR|MONTH|QUARTER|WEEK FROM visited_on)" in hint  # month, quarter, week opted in
    assert "EXTRACT(YEAR|MONTH|QUARTER|DAY|DOW|ISODOW|DOY|WEEK FROM logged_at), CAST(logged_at AS DATE)" in hint


@pytest.mark.parametrize("sql, cells", [
    # logged_at opts month and day in, not year: the year is a function of their buckets
    # (a WHERE within the declared range, read in the session's TimeZone as dpproxy reads the range)
    ("SELECT EXTRACT(YEAR FROM logged_at), count(*) FROM visits WHERE logged_at < '2024-01-01' GROUP BY 1", 1),
    ('SELECT CAST(TRUNC(EXTRACT(YEAR FROM "visits"."logged_at")) AS INTEGER) AS "yr:logged_at:ok", '
     'CAST(TRUNC(EXTRACT(MONTH FROM "visits"."logged_at")) AS INTEGER) AS "mn:logged_at:ok", SUM(1) AS "cnt" '
     'FROM "public"."visits" "visits" WHERE "visits"."logged_at" < \'2024-01-01\' GROUP BY 1, 2', 12),
    ("SELECT date_part('year', visited_on), count(*) FROM visits WHERE visited_on < '2024-01-01' GROUP BY 1", 1),
])
def test_the_year_of_a_column_that_opts_only_finer_units_in_is_a_function_of_their_buckets(bi, admin, sql, cells):
    # Refused before (no-group-by: the policy opts no year in).
    rows, direct = _both(bi, admin, sql, timezone="Pacific/Kiritimati")
    keys = [tuple(r[:-1]) for r in rows]
    assert len(keys) == cells and set(keys) == {tuple(r[:-1]) for r in direct if None not in r[:-1]}


@pytest.mark.parametrize("sql", [
    "SELECT EXTRACT(YEAR FROM visited_at) + 1, count(*) FROM visits GROUP BY 1",
])
def test_other_date_parts_as_keys_stay_refused(bi, sql):
    diag = _refused(bi, sql)
    assert diag.sqlstate == "DP001" and "rule: no-group-by" in (diag.message_primary or "")


def test_a_date_part_in_the_select_list_must_be_the_grouped_one(bi):
    # As in PostgreSQL: the month is not the day of week the statement groups by.
    diag = _refused(bi, "SELECT EXTRACT(MONTH FROM visited_at) AS m, count(*) FROM visits "
                        "GROUP BY EXTRACT(DOW FROM visited_at)")
    assert diag.sqlstate == "42803"


@pytest.mark.parametrize("sql", [
    "SELECT CAST(age AS TEXT), count(*) FROM visits GROUP BY 1",        # not a category column
    "SELECT CAST(sex AS varchar(1)), count(*) FROM visits GROUP BY 1",  # a typmod: not one to one
    "SELECT CAST(device AS TEXT), count(*) FROM visits GROUP BY 1",     # a category not opted in
])
def test_other_casts_as_keys_stay_refused(bi, sql):
    diag = _refused(bi, sql)
    assert diag.sqlstate == "DP001" and "rule: no-group-by" in (diag.message_primary or "")


@pytest.mark.parametrize("sql", [
    "SELECT sum(score::int) FROM visits",             # rounds every value
    "SELECT sum(income::int) FROM visits",            # numeric to integer rounds too
    "SELECT sum(age::numeric(4, 1)) FROM visits",     # a typmod
    "SELECT avg(age::smallint) FROM visits",          # narrowing: could fail on a row
    "SELECT sum(sex::int) FROM visits",               # fails on a row that is not a number
    "SELECT count(sex::int) FROM visits",
])
def test_an_aggregate_of_a_cast_that_may_change_a_value_stays_refused(bi, sql):
    diag = _refused(bi, sql)
    assert diag.sqlstate == "DP001" and "rule: aggregate-argument" in (diag.message_primary or "")


# ---------------------------------------------------------------- time ranges beyond timestamp's


@pytest.mark.parametrize("where, cells", [
    # a date past timestamp's range (294276 AD) bounding a date column: typed, untyped, in a BETWEEN
    ("visited_on >= '5874897-01-01'::date", 0),
    ("visited_on <= '5874897-12-31'", 12),
    ("visited_on BETWEEN '2023-01-01' AND '300000-01-01'::date", 12),
    ("visited_on >= 'infinity'", 0),
    ("visited_on < '-infinity'", 0),
    ("visited_on > '4713-01-01 BC' AND visited_on < '20000-01-01'", 12),
    ("visited_on = '5874897-12-31'::date", 0),
])
def test_a_date_bound_beyond_timestamps_range_narrows_without_error(bi, where, cells):
    # These failed with 22008 (date out of range for timestamp) while narrowing, before any charge.
    with bi.connect() as conn:
        before = conn.execute("SHOW dpproxy.budget").fetchone()
        rows = conn.execute(f"SELECT date_trunc('month', visited_on) AS m, count(*) FROM visits WHERE {where} "
                            "GROUP BY 1").fetchall()
        after = conn.execute("SHOW dpproxy.budget").fetchone()
    assert len(rows) == cells
    assert (after[1] - before[1] > 0) == (cells > 0)  # no cell: nothing released, nothing charged


@pytest.mark.parametrize("sql, cells", [
    # timestamp and timestamptz columns compared with such a date, as PostgreSQL compares them
    ("SELECT date_trunc('month', visited_at), count(*) FROM visits WHERE visited_at >= '294277-01-01'::date GROUP BY 1", 0),
    ("SELECT date_trunc('day', logged_at), count(*) FROM visits WHERE logged_at < '294277-01-01'::date "
     "AND logged_at >= '2023-12-01' GROUP BY 1", 31),
    ('SELECT floor(extract(epoch from logged_at)/86400)*86400 AS "time", count(*) FROM visits '
     "WHERE logged_at BETWEEN '2023-12-01' AND 'infinity' GROUP BY 1", 31),
    ('SELECT floor(extract(epoch from visited_at)/86400)*86400 AS "time", count(*) FROM visits '
     "WHERE visited_at >= '5874897-01-01'::date GROUP BY 1", 0),
])
def test_time_and_epoch_keys_narrow_by_dates_beyond_timestamps_range(bi, admin, sql, cells):
    rows, _ = _both(bi, admin, sql)
    assert len(rows) == cells


# ---------------------------------------------------------------- Grafana


_GRAFANA_DAILY = ('SELECT floor(extract(epoch from visited_at)/86400)*86400 AS "time", count(*) AS "value" FROM visits '
                  "WHERE visited_at BETWEEN '2023-03-01T00:00:00Z' AND '2023-03-31T00:00:00Z' GROUP BY 1 ORDER BY 1")


def test_grafana_time_group_of_a_day_answers_each_day_of_the_time_filter(bi, admin):
    # Grafana (PostgreSQL data source): $__timeGroupAlias(visited_at, '1d'), $__timeFilter(visited_at)
    rows, direct = _both(bi, admin, _GRAFANA_DAILY)
    assert [r[0] for r in rows] == [r[0] for r in direct]  # 31 days, as epoch seconds (numeric)
    assert rows[0][0] == Decimal(1677628800)
    for (_, noised), (_, exact) in zip(rows, direct):
        assert abs(noised - exact) < 30  # discrete Laplace scale 1: fails by chance with p ≈ 1e-12


def test_grafana_time_group_keys_do_not_depend_on_the_data(bi):
    keys = {}
    for table in ("visits", "kp_empty", "kp_alien"):
        with bi.connect() as conn:
            keys[table] = [r[0] for r in conn.execute(_GRAFANA_DAILY.replace("FROM visits", f"FROM {table}"))]
    assert keys["visits"] == keys["kp_empty"] == keys["kp_alien"] and len(keys["visits"]) == 31


def test_grafana_weekly_buckets_of_a_timestamptz_are_read_in_utc_whatever_the_time_zone(bi, admin):
    # Grafana: $__timeGroupAlias(logged_at, '1w') on a timestamptz, the session in another time zone
    sql = ('SELECT floor(extract(epoch from logged_at)/604800)*604800 AS "time", count(*) AS "count" FROM visits '
           "WHERE logged_at BETWEEN '2023-03-01T00:00:00Z' AND '2023-06-01T00:00:00Z' GROUP BY 1 ORDER BY 1")
    rows, direct = _both(bi, admin, sql, timezone="America/New_York")
    assert {r[0] for r in direct} <= {r[0] for r in rows}
    assert all(r[0] % 604800 == 0 for r in rows) and len(rows) == 15


def test_grafana_time_group_with_a_metric_column_is_answered(bi, admin):
    # Grafana: $__timeGroupAlias(visited_at, '7d'), sex AS metric (one series per sex)
    sql = ('SELECT floor(extract(epoch from visited_at)/604800)*604800 AS "time", sex AS metric, count(*) FROM visits '
           "WHERE visited_at BETWEEN '2023-03-01T00:00:00Z' AND '2023-03-31T00:00:00Z' GROUP BY 1, 2 ORDER BY 1")
    rows, _ = _both(bi, admin, sql)
    # Epoch weeks start on Thursdays (1970-01-01): six of them meet March 2023.
    assert [r[1] for r in rows[:2]] == ["Male", "Female"] and len(rows) == 6 * 2


def test_grafana_time_group_finer_than_a_day_is_refused_with_a_hint(bi):
    # Grafana's automatic $__interval on a short range: 1h
    diag = _refused(bi, 'SELECT floor(extract(epoch from visited_at)/3600)*3600 AS "time", count(*) FROM visits GROUP BY 1')
    assert diag.sqlstate == "DP001" and "rule: no-group-by" in (diag.message_primary or "")
    assert "1d" in (diag.message_hint or "")


def test_grafana_time_group_on_a_column_without_day_is_refused(bi):
    # visited_on opts in month, quarter and week only
    diag = _refused(bi, 'SELECT floor(extract(epoch from visited_on)/86400)*86400 AS "time", count(*) FROM visits GROUP BY 1')
    assert diag.sqlstate == "DP001" and "rule: no-group-by" in (diag.message_primary or "")


@pytest.mark.parametrize("sql", [
    # different widths in the division and the product: not a bucket
    'SELECT floor(extract(epoch from visited_at)/86400)*3600 AS "time", count(*) FROM visits GROUP BY 1',
    # the raw epoch: one group per distinct instant
    'SELECT extract(epoch from visited_at) AS "time", count(*) FROM visits GROUP BY 1',
])
def test_epoch_forms_that_are_not_buckets_stay_refused(bi, sql):
    diag = _refused(bi, sql)
    assert diag.sqlstate == "DP001" and "rule: no-group-by" in (diag.message_primary or "")


# ---------------------------------------------------------------- Power BI, Superset


def test_power_bi_folded_group_by_under_an_outer_filter_is_answered(bi, admin):
    # Power BI (Npgsql query folding): the grouped rows wrapped in "_" with a not-null filter and a row cap
    sql = ('select "_"."sex", "_"."a0" from (select "rows"."sex" as "sex", count(1) as "a0" from '
           '(select "_"."sex" from "public"."visits" "_") "rows" group by "sex") "_" '
           'where not "_"."a0" is null limit 1000001')
    rows, _ = _both(bi, admin, sql)
    assert sorted(r[0] for r in rows) == ["Female", "Male"]


@pytest.mark.parametrize("sql, cells", [
    # Superset: Big Number with Trendline (daily), with a time range
    ("SELECT DATE_TRUNC('DAY', visited_at) AS __timestamp, COUNT(*) AS count FROM public.visits "
     "WHERE visited_at >= TO_TIMESTAMP('2023-03-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US') "
     "AND visited_at < TO_TIMESTAMP('2023-04-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US') "
     "GROUP BY DATE_TRUNC('DAY', visited_at) LIMIT 10000", 31),
    # Superset: Heatmap over two declared keys
    ("SELECT sex AS sex, race AS race, COUNT(*) AS count FROM public.visits GROUP BY sex, race LIMIT 10000", 6),
    # Superset: Time-series Table, two metrics, weekly
    ("SELECT DATE_TRUNC('WEEK', visited_at) AS visited_at, COUNT(*) AS count, SUM(income) AS \"SUM(income)\" "
     "FROM public.visits GROUP BY DATE_TRUNC('WEEK', visited_at) LIMIT 10000", 53),
])
def test_superset_chart_types_draw_every_declared_cell(bi, admin, sql, cells):
    rows, _ = _both(bi, admin, sql)
    assert len(rows) == cells


# ---------------------------------------------------------------- filter value lists: keys without aggregates

_MARCH_TO_JUNE = ("visited_at >= TO_TIMESTAMP('2023-03-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US') "
                  "AND visited_at < TO_TIMESTAMP('2023-07-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US')")


def _answered_free(proxy: RunningProxy, sql: str) -> tuple[list[tuple], list[str]]:
    """``sql``'s rows and notices through dpproxy, asserting it charged nothing."""
    with proxy.connect() as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        before = spent_epsilon(conn)
        rows = conn.execute(sql).fetchall()
        assert spent_epsilon(conn) == before, sql
    return rows, notices


@pytest.mark.parametrize("sql, keys", [
    # Superset: a dashboard's native Value filter (filter_select), sorted ascending
    ("SELECT sex AS sex FROM public.visits GROUP BY sex ORDER BY sex ASC LIMIT 1000", [("Female",), ("Male",)]),
    # Superset: the explore view's column values (/api/v1/datasource/table/<id>/column/<col>/values/)
    ("SELECT DISTINCT sex AS column_values \nFROM public.visits \n LIMIT 10000", [("Male",), ("Female",)]),
    # Power BI: a slicer over a category, folded
    ('select "sex" from (select "_"."sex" from "public"."visits" "_") "_" group by "sex" limit 1000001',
     [("Male",), ("Female",)]),
    # an `other` key is a key like the categories
    ("SELECT DISTINCT race FROM visits ORDER BY race DESC", [("White",), ("Other",), ("Black",)]),
])
def test_a_filters_value_list_on_an_opted_in_category_is_its_declared_keys_at_no_cost(bi, admin, sql, keys):
    rows, direct = _both(bi, admin, sql)
    assert rows == keys
    assert ("Unknown",) in direct or (None,) in direct  # the rows hold values the policy does not declare


def test_a_value_list_says_in_its_notice_that_it_cost_nothing(bi):
    rows, notices = _answered_free(bi, "SELECT sex FROM visits GROUP BY sex")
    assert rows == [("Male",), ("Female",)]
    (notice,) = notices
    assert notice.startswith("dpproxy: ε charged 0, δ 0 for 2 groups (their declared keys only") and "remaining ε" in notice


def test_a_value_list_of_a_time_key_is_its_buckets_in_the_statements_time_range(bi, admin):
    sql = (f"SELECT DATE_TRUNC('MONTH', visited_at) AS visited_at FROM public.visits WHERE {_MARCH_TO_JUNE} "
           "GROUP BY DATE_TRUNC('MONTH', visited_at) ORDER BY visited_at LIMIT 10000")
    rows, direct = _both(bi, admin, sql)
    assert [r[0].month for r in rows] == [3, 4, 5, 6] and rows == direct


@pytest.mark.parametrize("keys, count, where", [
    ("sex", 1, "age > 40"),
    ("race, width_bucket(score, 0, 1, 4)", 2, "sex = 'Female'"),
    ("DATE_TRUNC('week', visited_on), sex", 2, "visited_on BETWEEN '2023-02-01' AND '2023-03-01'"),
    ("CAST(DATE_TRUNC('month', visited_on) AS date)", 1, "visited_on >= '2023-11-15'"),
    ("age", 1, "income < 10"),
])
def test_a_value_list_is_the_key_columns_of_the_histogram_it_lists(bi, keys, count, where):
    """Keys without aggregates answer what the same GROUP BY with a count answers in its key
    columns: the declared keys, narrowed by the statement's own time bounds, nothing else."""
    listed, _ = _answered_free(bi, f"SELECT {keys} FROM visits WHERE {where} GROUP BY {keys}")
    with bi.connect() as conn:
        histogram = conn.execute(f"SELECT {keys}, COUNT(*) FROM visits WHERE {where} GROUP BY {keys}").fetchall()
    assert listed == [row[:count] for row in histogram] and listed


def test_a_value_list_does_not_depend_on_the_rows(bi):
    lists = {table: _answered_free(bi, f"SELECT DISTINCT race, sex FROM {table} WHERE age > 30")[0]
             for table in ("visits", "kp_empty", "kp_alien")}
    assert lists["visits"] == lists["kp_empty"] == lists["kp_alien"] and len(lists["visits"]) == 6


def test_a_value_list_never_reads_the_table(bi, admin):
    """Answered even where dpproxy's service role may not read the table: neither the rows nor
    the WHERE are ever run, so nothing about them can show in the answer, its errors or its time."""
    admin.execute(f"REVOKE SELECT ON kp_alien FROM {SERVICE_ROLE}")
    try:
        rows, _ = _answered_free(bi, "SELECT sex FROM kp_alien WHERE age > 1 OR sex = 'X' GROUP BY sex")
        assert rows == [("Male",), ("Female",)]
        with bi.connect() as conn, pytest.raises(psycopg.Error):
            conn.execute("SELECT sex, COUNT(*) FROM kp_alien GROUP BY sex")  # a histogram reads it
    finally:
        admin.execute(f"GRANT SELECT ON kp_alien TO {SERVICE_ROLE}")


def test_a_value_list_with_an_aggregate_in_having_is_a_charged_histogram(bi):
    with bi.connect() as conn:
        before = spent_epsilon(conn)
        rows = conn.execute("SELECT sex FROM visits GROUP BY sex HAVING COUNT(*) > -1000").fetchall()
        assert spent_epsilon(conn) == before + 1.0
    assert sorted(rows) == [("Female",), ("Male",)]


@pytest.mark.parametrize("sql, rule", [
    ("SELECT device AS device FROM public.visits GROUP BY device ORDER BY device ASC LIMIT 1000", "no-group-by"),
    ("SELECT DISTINCT income AS column_values FROM public.visits LIMIT 10000", "no-distinct"),
    ('select "device" from (select "_"."device" from "public"."visits" "_") "_" group by "device" limit 1000001',
     "no-group-by"),
    ("SELECT DISTINCT ON (sex) sex FROM visits", "no-distinct"),
    ("SELECT DISTINCT 1 FROM visits", "no-distinct"),
    ("SELECT DISTINCT * FROM visits", "no-distinct"),
    ("SELECT DISTINCT sex, COUNT(*) FROM visits", "no-distinct"),
    ("SELECT DISTINCT sex, device FROM visits", "no-distinct"),
    ("SELECT sex FROM visits", "no-row-access"),
    ("SELECT DISTINCT lower(sex) FROM visits", "no-distinct"),
    # how many values are present would come from the rows
    ("SELECT count(*) FROM (SELECT sex FROM visits GROUP BY sex) AS t", "no-subquery"),
    ("SELECT count(*) FROM (SELECT DISTINCT sex FROM visits) AS t", "no-subquery"),
])
def test_value_lists_of_values_the_policy_does_not_declare_stay_refused(bi, sql, rule):
    diag = _refused(bi, sql)
    assert diag.sqlstate == "DP001" and f"(rule: {rule})" in (diag.message_primary or ""), diag.message_primary
    assert diag.message_hint


def test_a_value_list_through_the_extended_protocol_binary_results_and_copy(bi, admin):
    sql = "SELECT DATE_TRUNC('quarter', visited_on) AS q, sex FROM visits WHERE visited_on >= %s AND visited_on < '2024-01-01' GROUP BY 1, 2 ORDER BY 1, 2"
    with bi.connect(prepare_threshold=0) as conn:
        before = spent_epsilon(conn)
        cursor = conn.cursor(binary=True)
        rows = cursor.execute(sql, ("2023-07-01",)).fetchall()
        names = [(c.name, c.type_code) for c in cursor.description or ()]
        with conn.cursor().copy("COPY (SELECT sex FROM visits GROUP BY sex) TO STDOUT") as copy:
            copied = b"".join(bytes(chunk) for chunk in copy)
        assert conn.execute("SELECT sex FROM visits GROUP BY sex LIMIT 0").fetchall() == []
        assert spent_epsilon(conn) == before
    direct = admin.execute(sql, ("2023-07-01",))
    assert names == [(c.name, c.type_code) for c in direct.description or ()]
    assert [(r[0].month, r[1]) for r in rows] == [(7, "Female"), (7, "Male"), (10, "Female"), (10, "Male")]
    assert copied == b"Male\nFemale\n"


# ---------------------------------------------------------------- Superset's series limit: a ranked subquery

_VISITS_RANGE = ("visited_at >= TO_TIMESTAMP('2023-03-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US') "
                 "AND visited_at < TO_TIMESTAMP('2023-07-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US')")


def _series_limited(limit: int, metric: str = "COUNT(*)", ranking_metric: str = "COUNT(*)") -> str:
    """A line or bar chart over time split by sex with a *Series limit*, as Superset 6.1 sends it."""
    return (f"SELECT DATE_TRUNC('MONTH', visited_at) AS visited_at, sex AS sex, {metric} AS count "
            f"FROM public.visits JOIN (SELECT sex AS sex__, {ranking_metric} AS mme_inner__ FROM public.visits "
            f"WHERE {_VISITS_RANGE} GROUP BY sex ORDER BY {ranking_metric} DESC LIMIT {limit}) AS series_limit "
            f"ON sex = sex__ WHERE {_VISITS_RANGE} GROUP BY DATE_TRUNC('MONTH', visited_at), sex "
            "ORDER BY count DESC LIMIT 10000")


def test_a_series_limit_keeps_the_series_its_noised_ranking_puts_first(bi, admin):
    rows, direct = _both(bi, admin, _series_limited(1))
    # Male has twice Female's rows: its noised count is ahead whatever the noise (scale 2).
    assert sorted((r[0].month, r[1]) for r in rows) == sorted((r[0].month, r[1]) for r in direct)
    assert sorted((r[0].month, r[1]) for r in rows) == [(3, "Male"), (4, "Male"), (5, "Male"), (6, "Male")]
    for row, exact in zip(sorted(rows), sorted(direct)):
        assert abs(row[2] - exact[2]) < 60  # discrete Laplace scale 2: fails by chance with p < 1e-12


def test_a_series_limit_above_the_number_of_series_keeps_every_declared_series(bi, admin):
    rows, _ = _both(bi, admin, _series_limited(5))
    assert sorted((r[0].month, r[1]) for r in rows) == sorted((m, s) for m in (3, 4, 5, 6) for s in ("Female", "Male"))


def test_a_series_limit_over_a_date_part_keeps_its_series_in_every_month(bi, admin):
    # Each plan names a day of week's cells by a day of its own (the outer one a day of each
    # month): a series is kept by its day of week, not by that day. Before, only March's rows came back.
    sql = (f"SELECT DATE_TRUNC('MONTH', visited_at) AS m, EXTRACT(DOW FROM visited_at) AS d, COUNT(*) AS count "
           f"FROM public.visits JOIN (SELECT EXTRACT(DOW FROM visited_at) AS d__, COUNT(*) AS mme_inner__ "
           f"FROM public.visits WHERE {_VISITS_RANGE} GROUP BY EXTRACT(DOW FROM visited_at) "
           f"ORDER BY COUNT(*) DESC LIMIT 7) AS series_limit ON EXTRACT(DOW FROM visited_at) = d__ "
           f"WHERE {_VISITS_RANGE} GROUP BY DATE_TRUNC('MONTH', visited_at), EXTRACT(DOW FROM visited_at)")
    rows, direct = _both(bi, admin, sql)
    assert sorted((r[0], r[1]) for r in rows) == sorted((r[0], r[1]) for r in direct)
    assert len(rows) == 4 * 7


def test_a_series_limit_is_charged_once_its_epsilon_split_over_both_releases(bi):
    with bi.connect() as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        before = spent_epsilon(conn)
        conn.execute(_series_limited(1, "SUM(income)")).fetchall()
        assert spent_epsilon(conn) == pytest.approx(before + 1.0)
    (notice,) = notices
    # Two columns (the chart's metric and the ranking's) share ε = 1: each cell's count has scale 2.
    assert notice.startswith("dpproxy: ε charged 1, δ 0 for 8 groups") and "sum(income): laplace scale 2000" in notice
    assert "series ranking count(*): laplace scale 2 " in notice, notice


def test_a_series_limit_whose_ranking_is_post_processed_to_nothing_answers_no_row(bi):
    sql = _series_limited(5).replace("ORDER BY COUNT(*) DESC LIMIT 5", "HAVING COUNT(*) < -1000000")
    with bi.connect() as conn:
        assert conn.execute(sql).fetchall() == []


@pytest.mark.parametrize("sql, rule", [
    # a LEFT JOIN keeps every series
    (_series_limited(1).replace("FROM public.visits JOIN", "FROM public.visits LEFT JOIN"), "no-subquery"),
    # the ranking over another table
    (_series_limited(1).replace("FROM public.visits WHERE", "FROM public.kp_empty WHERE"), "no-subquery"),
    # the ranking is no GROUP BY: its rows would be the rows
    (_series_limited(1).replace("GROUP BY sex ORDER BY COUNT(*) DESC", "ORDER BY age DESC"), "no-subquery"),
    # joined on a column that is not the ranking's key
    (_series_limited(1).replace("ON sex = sex__", "ON race = sex__"), "no-subquery"),
    # a ranking key left out of the join: one row would join several ranked rows
    (_series_limited(1).replace("SELECT sex AS sex__,", "SELECT sex AS sex__, race AS race__,")
     .replace("GROUP BY sex ORDER", "GROUP BY sex, race ORDER"), "no-subquery"),
    # joined on a key the statement does not group by
    (_series_limited(1).replace("GROUP BY DATE_TRUNC('MONTH', visited_at), sex ORDER", "GROUP BY 1, 2 ORDER")
     .replace("sex AS sex, COUNT(*) AS count FROM public.visits JOIN", "race AS sex, COUNT(*) AS count FROM "
              "public.visits JOIN").replace("GROUP BY 1, 2", "GROUP BY 1, race"), "no-subquery"),
    # anything but an equality of keys
    (_series_limited(1).replace("ON sex = sex__", "ON sex < sex__"), "no-subquery"),
    (_series_limited(1).replace("ON sex = sex__", "ON sex = sex__ OR true"), "no-subquery"),
    # the ranking's metric in the answer is a value per row, not post-processing of the cells
    (_series_limited(1).replace("COUNT(*) AS count FROM", "mme_inner__ AS count FROM"), "42803"),
    # the ranking's aggregate must be one a histogram answers
    (_series_limited(1, ranking_metric="MAX(age)"), "aggregate-not-allowed"),
    # GROUP BY over a key not opted in, inside
    (_series_limited(1).replace("SELECT sex AS sex__", "SELECT device AS sex__").replace("GROUP BY sex ORDER", "GROUP BY device ORDER"),
     "no-group-by"),
    ("SELECT sex, COUNT(*) FROM visits JOIN LATERAL (SELECT sex AS s FROM visits GROUP BY sex LIMIT 1) AS l "
     "ON sex = s GROUP BY sex", "no-subquery"),
    ("SELECT sex, COUNT(*) FROM visits JOIN (SELECT sex AS s FROM visits GROUP BY sex LIMIT 1) AS l USING (sex) "
     "GROUP BY sex", "no-subquery"),
])
def test_other_joins_to_a_subquery_stay_refused(bi, sql, rule):
    diag = _refused(bi, sql)
    assert diag.sqlstate == rule or (diag.sqlstate == "DP001" and f"(rule: {rule})" in (diag.message_primary or "")), (
        diag.sqlstate, diag.message_primary)


def test_a_series_limit_through_the_extended_protocol_binary_results_and_copy(bi, admin):
    sql = _series_limited(1)
    with bi.connect(prepare_threshold=0) as conn:
        cursor = conn.cursor(binary=True)
        rows = cursor.execute(sql).fetchall()
        names = [(c.name, c.type_code) for c in cursor.description or ()]
        with conn.cursor().copy(f"COPY ({sql}) TO STDOUT") as copy:
            copied = b"".join(bytes(chunk) for chunk in copy).decode().splitlines()
    direct = admin.execute(sql)
    assert names == [(c.name, c.type_code) for c in direct.description or ()]
    assert sorted((r[0].month, r[1]) for r in rows) == [(3, "Male"), (4, "Male"), (5, "Male"), (6, "Male")]
    assert sorted(line.split("\t")[1] for line in copied) == ["Male"] * 4


def test_a_series_limit_with_parameters_is_refused_before_any_charge(bi):
    with bi.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as info:
            conn.execute(_series_limited(1).replace("LIMIT 1)", "LIMIT 1) ").replace(
                "ON sex = sex__", "ON sex = sex__ AND sex__ <> %s"), ("x",))
        assert spent_epsilon(conn) == before
    assert info.value.diag.sqlstate == "DP001"
