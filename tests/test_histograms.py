"""GROUP BY over declared keys through dpproxy: noised histograms and time series (policy opt-in).

A table whose policy opts columns in (``group_by``) answers GROUP BY over their declared
domains: every declared key comes back in the domain's order, whatever the rows hold, each
cell noised with the column's whole share of ε (the cells are disjoint, so the query costs ε
once). Without the opt-in GROUP BY is refused, as are shapes that would put a row in several
cells (ROLLUP) or that need many rows per cell (MIN/MAX).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from datetime import date, datetime

import asyncpg
import numpy as np
import psycopg
import pytest
from conftest import TEST_POLICY, RunningProxy, TestDatabase, running_proxy, spent_epsilon

from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from proxy.demo.embedded import SERVICE_ROLE
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql

_COLUMNS = """\
    columns:
      sex: {{categories: [Male, Female], group_by: true}}
      race: {{categories: [White, Black], group_by: true, other: Other}}
      device: {{categories: [phone, laptop]}}
      age: {{bounds: [17, 90], group_by: true}}
      income: {{bounds: [0, 1000]}}
      score: {{bounds: [0, 1], group_by: true}}
      visited_on: {{bounds: [2023-01-01, 2023-12-31], group_by: [month, quarter, week]}}
      visited_at: {{bounds: [2023-01-01, 2023-12-31], group_by: true}}
      logged_at: {{bounds: [2023-01-01, 2023-12-31], group_by: [month, day]}}
"""
_TABLES = ("visits", "kp_empty", "kp_alien", "nbh_base", "nbh_plus")
POLICY = TEST_POLICY + "".join(
    f"  public.{table}:\n    access: protected\n    epsilon: 1.0\n    delta: 1.0e-6\n    max_cells: 400\n" + _COLUMNS
    for table in _TABLES
)
REPEATING = POLICY.replace("repeats: {{enabled: false}}", "repeats: {{enabled: true}}")

_DDL = ("(sex text, race varchar(20), device text, age integer, income numeric, score double precision, "
        "visited_on date, visited_at timestamp, logged_at timestamptz)")
_TABLE_SQL = f"""
DROP TABLE IF EXISTS {", ".join(_TABLES)};
CREATE TABLE visits {_DDL};
INSERT INTO visits
SELECT CASE WHEN i % 3 = 0 THEN 'Female' WHEN i % 97 = 0 THEN 'Unknown' ELSE 'Male' END,
       CASE WHEN i % 5 = 0 THEN 'Black' WHEN i % 7 = 0 THEN 'Asian' WHEN i % 11 = 0 THEN NULL ELSE 'White' END,
       CASE WHEN i % 2 = 0 THEN 'phone' ELSE 'laptop' END,
       18 + i % 60, (i * 37) % 1000, (i % 100) / 100.0,
       DATE '2023-01-01' + (i % 365), TIMESTAMP '2023-01-01' + (i % 365) * INTERVAL '1 day',
       TIMESTAMPTZ '2023-01-01 12:00+00' + (i % 365) * INTERVAL '1 day'
FROM generate_series(1, 3000) AS i;
-- Beyond every declared domain: a date past timestamp's range (date_trunc would fail on it), NaN, infinity.
INSERT INTO visits (sex, visited_on, score, age) VALUES ('Male', '5000000-01-01', 'NaN', 500),
                                                         ('Male', 'infinity', 'Infinity', -3);
CREATE TABLE kp_empty {_DDL};
-- Nothing in any declared domain: undeclared categories, ages and times outside the bounds.
CREATE TABLE kp_alien AS SELECT 'X'::text AS sex, 'Martian'::varchar(20) AS race, 'tv'::text AS device, 200 AS age,
    5000::numeric AS income, 'NaN'::float8 AS score, DATE '1999-01-01' AS visited_on,
    TIMESTAMP '2031-05-05' AS visited_at, TIMESTAMPTZ '1970-01-01 00:00+00' AS logged_at FROM generate_series(1, 50);
-- Neighbours: nbh_plus is nbh_base and one row more, in the Female cell.
CREATE TABLE nbh_base AS SELECT * FROM visits WHERE age < 30;
CREATE TABLE nbh_plus AS SELECT * FROM nbh_base;
INSERT INTO nbh_plus (sex, age) VALUES ('Female', 40);
"""


@pytest.fixture(scope="module")
def tables(test_db: TestDatabase) -> None:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(_TABLE_SQL)
        conn.execute(f"GRANT SELECT ON {', '.join(_TABLES)} TO {SERVICE_ROLE}")


@pytest.fixture(scope="module")
def hproxy(tables: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with running_proxy(test_db, tmp_path_factory, POLICY) as running:
        yield running


@pytest.fixture(scope="module")
def repeating(tables: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with running_proxy(test_db, tmp_path_factory, REPEATING) as running:
        yield running


def _rows(proxy: RunningProxy, sql: str) -> tuple[list[str], list[tuple]]:
    with proxy.connect() as conn:
        cursor = conn.execute(sql)
        assert cursor.description is not None
        return [c.name for c in cursor.description], cursor.fetchall()


def _refusal(proxy: RunningProxy, sql: str) -> psycopg.Error:
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as error:
            conn.execute(sql)
        conn.execute("SELECT 1")  # the session goes on
    return error.value


# ---------------------------------------------------------------- the keys


def test_group_by_a_category_answers_every_declared_key_in_declared_order(hproxy, admin):
    names, rows = _rows(hproxy, "SELECT sex, COUNT(*) FROM visits GROUP BY sex")
    assert names == ["sex", "count"]
    assert [r[0] for r in rows] == ["Male", "Female"]
    exact = dict(admin.execute("SELECT sex, count(*) FROM visits GROUP BY sex").fetchall())
    for sex, count in rows:
        assert abs(count - exact[sex]) < 30  # discrete Laplace scale 1: fails by chance with p ≈ 1.4e-13


def test_other_key_catches_null_and_undeclared_values(hproxy, admin):
    _, rows = _rows(hproxy, "SELECT race, count(*) FROM visits GROUP BY race")
    assert [r[0] for r in rows] == ["White", "Black", "Other"]
    (exact_other,) = admin.execute(
        "SELECT count(*) FROM visits WHERE race IS NULL OR race NOT IN ('White', 'Black')").fetchone()
    assert abs(rows[2][1] - exact_other) < 30  # discrete Laplace scale 1: fails by chance with p ≈ 1.4e-13


def test_integer_column_with_bounds_groups_by_each_value_in_them(hproxy):
    _, rows = _rows(hproxy, "SELECT age, count(*) FROM visits GROUP BY age")
    assert [r[0] for r in rows] == list(range(17, 91))


def test_date_trunc_buckets_span_the_declared_range_with_the_type_postgresql_gives(hproxy, admin):
    for column, unit, starts in [
        ("visited_at", "month", [datetime(2023, m, 1) for m in range(1, 13)]),
        ("visited_on", "quarter", [date(2023, m, 1) for m in (1, 4, 7, 10)]),
        ("logged_at", "month", [date(2023, m, 1) for m in range(1, 13)]),
    ]:
        sql = f"SELECT date_trunc('{unit}', {column}) AS k, count(*) FROM visits GROUP BY 1"
        with hproxy.connect() as conn:
            cursor = conn.execute(sql)
            keys = [r[0] for r in cursor.fetchall()]
            direct = admin.execute(sql.replace("GROUP BY", "WHERE false GROUP BY"))
            assert cursor.description[0].type_code == direct.description[0].type_code
        assert [k.date() if isinstance(starts[0], date) and not isinstance(starts[0], datetime) else k
                for k in keys] == starts


def test_weeks_start_on_monday_as_in_postgresql(hproxy):
    _, rows = _rows(hproxy, "SELECT date_trunc('week', visited_on), count(*) FROM visits GROUP BY 1")
    assert rows[0][0].date() == date(2022, 12, 26) and rows[-1][0].date() == date(2023, 12, 25)
    assert len(rows) == 53 and all(r[0].weekday() == 0 for r in rows)


def test_width_bucket_answers_every_bin_including_below_and_above(hproxy):
    _, rows = _rows(hproxy, "SELECT width_bucket(score, 0, 1, 4) AS bin, count(*) FROM visits GROUP BY 1 ORDER BY 1")
    assert [r[0] for r in rows] == [0, 1, 2, 3, 4, 5]


def test_several_keys_give_the_cross_product_in_row_major_order(hproxy):
    _, rows = _rows(hproxy, "SELECT sex, race, count(*), sum(income), avg(age) FROM visits GROUP BY sex, race")
    assert [(r[0], r[1]) for r in rows] == [(s, r) for s in ("Male", "Female") for r in ("White", "Black", "Other")]
    assert all(17 <= r[4] <= 90 for r in rows)


KEY_STATEMENTS = [
    "SELECT sex, count(*) FROM {t} GROUP BY sex",
    "SELECT race, count(*), sum(income) FROM {t} GROUP BY race",
    "SELECT age, count(DISTINCT sex) FROM {t} GROUP BY age",
    "SELECT date_trunc('month', visited_on), count(*) FROM {t} GROUP BY 1",
    "SELECT date_trunc('week', visited_on), avg(age) FROM {t} GROUP BY 1",
    "SELECT date_trunc('day', logged_at), count(*) FROM {t} GROUP BY 1",
    "SELECT DATE_TRUNC('MONTH', visited_at) AS m, count(*) FROM {t} GROUP BY DATE_TRUNC('MONTH', visited_at)",
    "SELECT width_bucket(score, 0, 1, 10), count(*) FROM {t} GROUP BY 1",
    "SELECT sex, race, date_trunc('quarter', visited_on) AS q, count(*) FROM {t} GROUP BY sex, race, q",
    "SELECT sex, count(*) FROM {t} WHERE age > 30 GROUP BY sex ORDER BY sex DESC",
    "SELECT date_trunc('month', visited_at), count(*) FROM {t} WHERE visited_at >= '2023-04-01' GROUP BY 1",
]


@pytest.mark.parametrize("sql", KEY_STATEMENTS)
def test_keys_and_their_order_do_not_depend_on_the_data(hproxy, sql):
    """The same keys, in the same order, on a full table, an empty one and one with no declared value."""
    keys = {}
    for table in ("visits", "kp_empty", "kp_alien"):
        names, rows = _rows(hproxy, sql.format(t=table))
        width = len(names) - (2 if "sum(" in sql else 1)
        keys[table] = [row[:width] for row in rows]
    assert keys["visits"] == keys["kp_empty"] == keys["kp_alien"]
    assert keys["visits"]


# ---------------------------------------------------------------- what BI tools send


def test_superset_pie_shape_is_answered_with_order_and_limit(hproxy):
    names, rows = _rows(hproxy, "SELECT sex AS sex, COUNT(*) AS count FROM public.visits GROUP BY sex "
                                "ORDER BY count DESC LIMIT 100")
    assert names == ["sex", "count"]
    assert [r[0] for r in rows] == ["Male", "Female"]  # ~2,000 against ~1,000


def test_superset_monthly_line_shape_is_answered(hproxy):
    names, rows = _rows(hproxy, "SELECT DATE_TRUNC('MONTH', visited_at) AS visited_at, COUNT(*) AS count "
                                "FROM public.visits GROUP BY DATE_TRUNC('MONTH', visited_at) "
                                "ORDER BY count DESC LIMIT 10000")
    assert names == ["visited_at", "count"]
    assert sorted(r[0] for r in rows) == [datetime(2023, m, 1) for m in range(1, 13)]


def test_time_range_in_where_leaves_out_the_buckets_it_excludes(hproxy):
    _, rows = _rows(hproxy, "SELECT DATE_TRUNC('MONTH', visited_at) AS m, COUNT(*) AS count FROM public.visits "
                            "WHERE visited_at >= TO_TIMESTAMP('2023-03-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US') "
                            "AND visited_at < TO_TIMESTAMP('2023-09-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US') "
                            "GROUP BY DATE_TRUNC('MONTH', visited_at) LIMIT 10000")
    assert [r[0] for r in rows] == [datetime(2023, m, 1) for m in range(3, 9)]


@pytest.mark.parametrize(("where", "months"), [
    ("visited_on < TIMESTAMP '2023-03-01 12:00'", [1, 2, 3]),   # March 1 is before noon that day
    ("visited_on < TIMESTAMP '2023-03-01 00:00'", [1, 2]),
    ("visited_on < DATE '2023-03-01'", [1, 2]),
    ("visited_on <= DATE '2023-03-01'", [1, 2, 3]),
    ("visited_on >= DATE '2023-10-31'", [10, 11, 12]),
    # No row is after October 31 (or its noon) in October; keeping it costs only a cell.
    ("visited_on > DATE '2023-10-31'", [10, 11, 12]),
    ("visited_on > TIMESTAMP '2023-10-31 12:00'", [10, 11, 12]),
])
def test_a_date_key_bounded_by_a_time_keeps_every_bucket_a_row_can_reach(hproxy, admin, where: str, months: list[int]):
    _, rows = _rows(hproxy, f"SELECT date_trunc('month', visited_on) AS m, count(*) FROM visits WHERE {where} GROUP BY 1")
    assert [r[0].month for r in rows] == months
    # What PostgreSQL itself finds in those months is within them.
    reached = admin.execute(f"SELECT DISTINCT extract(month FROM visited_on)::int FROM visits WHERE {where} "
                            "AND visited_on BETWEEN '2023-01-01' AND '2023-12-31'").fetchall()
    assert {m for (m,) in reached} <= set(months)


def test_a_where_outside_the_declared_range_answers_no_row_at_no_cost(hproxy):
    with hproxy.connect() as conn:
        before = spent_epsilon(conn)
        rows = conn.execute("SELECT date_trunc('month', visited_on), count(*) FROM visits "
                            "WHERE visited_on BETWEEN '2030-01-01' AND '2030-02-01' GROUP BY 1").fetchall()
        assert rows == [] and spent_epsilon(conn) == before


def test_virtual_dataset_wrapper_is_flattened(hproxy):
    _, rows = _rows(hproxy, "SELECT sex AS sex, count(*) AS count FROM (SELECT * FROM visits WHERE age > 20) "
                            "AS virtual_table GROUP BY sex ORDER BY count DESC LIMIT 10")
    assert {r[0] for r in rows} == {"Male", "Female"}


@pytest.mark.parametrize(("sql", "check"), [
    ("SELECT sex, count(*) AS n FROM visits GROUP BY sex HAVING count(*) > 1500",
     lambda rows: [r[0] for r in rows] == ["Male"]),  # ~2,000 and ~1,000
    ("SELECT sex, count(*) FROM visits GROUP BY sex ORDER BY 2 LIMIT 1 OFFSET 1", lambda rows: rows[0][0] == "Male"),
    ("SELECT upper(sex) AS s, round(avg(age)) AS a FROM visits GROUP BY sex ORDER BY s",
     lambda rows: [r[0] for r in rows] == ["FEMALE", "MALE"]),
    ("SELECT count(*) FROM visits GROUP BY sex ORDER BY sex", lambda rows: rows[0][0] < rows[1][0]),  # Female first
    ("SELECT max(n) FROM (SELECT sex, count(*) AS n FROM visits GROUP BY sex) AS t",
     lambda rows: len(rows) == 1 and rows[0][0] > 1500),
    ("SELECT date_trunc('quarter', visited_on)::date AS q, sum(income) FROM visits GROUP BY 1 ORDER BY q DESC",
     lambda rows: rows[0][0] == date(2023, 10, 1)),
])
def test_post_processing_over_the_released_cells(hproxy, sql, check):
    _, rows = _rows(hproxy, sql)
    assert check(rows), rows


@pytest.mark.parametrize("order", ['sex COLLATE "C" DESC', "lower(sex) DESC", "sex || '' DESC",
                                   'upper(sex) COLLATE "C" DESC, 2'])
def test_an_order_by_expression_of_a_key_orders_the_released_cells_by_their_labels(hproxy, order):
    # A key's name within an ORDER BY expression was taken for the output column's and left
    # unreplaced, for the outer statement to fail on: 42703 where PostgreSQL answers. Ordering
    # the released cells by a function of their labels is post-processing.
    with hproxy.connect() as conn:
        before = spent_epsilon(conn)
        rows = conn.execute(f"SELECT sex, count(*) FROM visits GROUP BY sex ORDER BY {order}").fetchall()
        assert spent_epsilon(conn) - before == pytest.approx(1.0)
    assert [row[0] for row in rows] == ["Male", "Female"]


def test_an_output_alias_within_an_order_by_expression_is_postgresqls_own_42703_before_the_charge(hproxy, admin):
    # PostgreSQL resolves an output column's name in ORDER BY only when it stands alone.
    sql = 'SELECT sex AS s, count(*) FROM visits GROUP BY sex ORDER BY s COLLATE "C"'
    with pytest.raises(psycopg.Error) as direct:
        admin.execute(sql)
    with hproxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as proxied:
            conn.execute(sql)
        assert spent_epsilon(conn) == before
    assert proxied.value.sqlstate == direct.value.sqlstate == "42703"
    assert proxied.value.diag.message_primary == direct.value.diag.message_primary == 'column "s" does not exist'


def test_extended_protocol_with_parameters_and_binary_results(hproxy):
    with hproxy.connect() as conn:
        cursor = conn.cursor(binary=True)
        rows = cursor.execute("SELECT date_trunc('month', logged_at) AS m, count(*) FROM visits "
                              "WHERE logged_at >= %s AND sex = %s GROUP BY 1", (datetime(2023, 11, 1), "Male"),
                              prepare=True).fetchall()
    assert [r[0].month for r in rows] == [11, 12]


def test_asyncpg_describes_and_fetches_a_histogram(hproxy):
    async def run() -> list:
        conn = await asyncpg.connect(host=hproxy.host, port=hproxy.port, user="analyst", password="analyst",
                                     database="dpproxy_test")
        try:
            statement = await conn.prepare("SELECT race, count(*) AS n FROM visits WHERE age > $1 GROUP BY race")
            assert [a.name for a in statement.get_attributes()] == ["race", "n"]
            return await statement.fetch(30)
        finally:
            await conn.close()

    rows = asyncio.run(run())
    assert [r["race"] for r in rows] == ["White", "Black", "Other"]


def test_copy_of_a_histogram_writes_every_cell(hproxy):
    with hproxy.connect() as conn:
        with conn.cursor() as cur, cur.copy("COPY (SELECT sex, count(*) FROM visits GROUP BY sex) TO STDOUT "
                                            "WITH (FORMAT csv)") as copy:
            text = b"".join(bytes(chunk) for chunk in copy).decode()
    assert [line.split(",")[0] for line in text.splitlines()] == ["Male", "Female"]


# ---------------------------------------------------------------- what it costs


def test_a_histogram_costs_epsilon_once_and_the_notice_says_why(hproxy):
    with hproxy.connect() as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        before = spent_epsilon(conn)
        conn.execute("SELECT age, count(*), avg(income) FROM visits GROUP BY age").fetchall()
        assert spent_epsilon(conn) - before == pytest.approx(1.0)
    (notice,) = notices
    assert "ε charged 1, δ 0 for 74 groups (each row is in one group, so the groups share that ε)" in notice
    assert "per group: count(*): laplace scale 2 (95% within ±5.991)" in notice
    assert "avg(income): noisy sum / noisy count, scales 2000 and 4 (95% within ±14756/n in a group of n rows)" in notice


def test_a_repeated_histogram_is_the_same_release_at_no_cost(repeating):
    with repeating.connect() as conn:
        first = conn.execute("SELECT sex, count(*) AS n FROM visits WHERE age > 25 GROUP BY sex").fetchall()
        spent = spent_epsilon(conn)
        again = conn.execute("SELECT sex AS s, count(*) AS total FROM visits WHERE age > 25 GROUP BY sex "
                             "ORDER BY 1").fetchall()
        assert spent_epsilon(conn) == spent
    assert sorted(again) == sorted(first)


def test_a_repeated_series_limit_keeps_the_same_series_from_the_same_release_at_no_cost(repeating):
    # Every age from 18 to 77 has 50 rows: which three the noised ranking puts first is the noise's
    # choice. A repeat runs the ranking's outer statement again over the stored release.
    sql = ("SELECT age, count(*) FROM visits JOIN (SELECT age AS a__, count(*) AS m FROM visits "
           "WHERE age BETWEEN 18 AND 77 GROUP BY age ORDER BY count(*) DESC LIMIT 3) AS s ON age = a__ "
           "WHERE age BETWEEN 18 AND 77 GROUP BY age")
    with repeating.connect() as conn:
        first = conn.execute(sql).fetchall()
        spent = spent_epsilon(conn)
        again = conn.execute(sql).fetchall()
        assert spent_epsilon(conn) == spent
    assert len(first) == 3 and again == first


def test_limit_zero_answers_the_columns_and_costs_nothing(hproxy):
    with hproxy.connect() as conn:
        before = spent_epsilon(conn)
        cursor = conn.execute("SELECT sex, count(*) FROM visits GROUP BY sex LIMIT 0")
        assert cursor.fetchall() == [] and [d.name for d in cursor.description] == ["sex", "count"]
        assert spent_epsilon(conn) == before


# ---------------------------------------------------------------- refused


@pytest.mark.parametrize(("sql", "sqlstate", "rule"), [
    ("SELECT device, count(*) FROM visits GROUP BY device", "DP001", "no-group-by"),
    ("SELECT income, count(*) FROM visits GROUP BY income", "DP001", "no-group-by"),
    ("SELECT date_trunc('day', visited_on), count(*) FROM visits GROUP BY 1", "DP001", "no-group-by"),
    ("SELECT date_trunc('month', visited_on, 'UTC'), count(*) FROM visits GROUP BY 1", "DP001", "no-group-by"),
    # Grafana's daily buckets on a column whose policy opts months, quarters and weeks in, not days.
    ("SELECT floor(extract(epoch from visited_on)/86400)*86400 AS t, count(*) FROM visits GROUP BY 1", "DP001",
     "no-group-by"),
    ("SELECT floor(extract(epoch from logged_at)/3600)*3600 AS t, count(*) FROM visits GROUP BY 1", "DP001",
     "no-group-by"),  # hours, finer than the day logged_at opts in
    ("SELECT width_bucket(income, 0, 1000, 4) AS b, count(*) FROM visits GROUP BY 1", "DP001",
     "no-group-by"),  # income has bounds but is not opted in to GROUP BY
    ("SELECT age + 1, count(*) FROM visits GROUP BY age + 1", "DP001", "no-group-by"),
    ("SELECT sex, count(*) FROM visits GROUP BY ROLLUP (sex)", "DP001", "no-group-by"),
    ("SELECT sex, count(*) FROM visits GROUP BY GROUPING SETS ((sex), ())", "DP001", "no-group-by"),
    ("SELECT sex, count(*) FROM visits GROUP BY CUBE (sex)", "DP001", "no-group-by"),
    ("SELECT sex, min(age) FROM visits GROUP BY sex", "DP001", "aggregate-not-allowed"),
    ("SELECT sex, max(age) FROM visits GROUP BY sex", "DP001", "aggregate-not-allowed"),
    ("SELECT age, date_trunc('week', visited_on), count(*) FROM visits GROUP BY 1, 2", "DP001", "max-cells"),
    ("SELECT width_bucket(score, 0, 1, 500), count(*) FROM visits GROUP BY 1", "DP001", "max-cells"),
    ("SELECT width_bucket(score, 1, 1, 5), count(*) FROM visits GROUP BY 1", "DP001", "no-group-by"),
    ("SELECT width_bucket(score, 0, 1, 0), count(*) FROM visits GROUP BY 1", "DP001", "no-group-by"),
    ("SELECT width_bucket(score, 0, age, 5), count(*) FROM visits GROUP BY 1", "DP001", "no-group-by"),
    ("SELECT width_bucket(sex, 0, 1, 5), count(*) FROM visits GROUP BY 1", "DP001", "no-group-by"),
    ("SELECT sex, age, count(*) FROM visits GROUP BY sex", "42803", "no-row-access"),
    ("SELECT visited_on, count(*) FROM visits GROUP BY date_trunc('month', visited_on)", "42803", "no-row-access"),
    ("SELECT sex, count(*) FROM visits GROUP BY 3", "42P10", "no-group-by"),
    ("SELECT sex, count(*) FROM visits GROUP BY sex HAVING min(age) > 3", "DP001", "aggregate-not-allowed"),
])
def test_refused_shapes_say_why(hproxy, sql, sqlstate, rule):
    error = _refusal(hproxy, sql)
    assert error.sqlstate == sqlstate, error
    assert error.diag.message_hint, error


def test_group_by_without_opt_in_hint_names_the_keys_the_table_has(hproxy):
    error = _refusal(hproxy, "SELECT device, count(*) FROM visits GROUP BY device")
    assert "rule: no-group-by" in str(error)
    hint = error.diag.message_hint or ""
    assert "sex (its 2 categories)" in hint and "DATE_TRUNC('week|month|quarter|year', visited_on)" in hint, hint


def test_selecting_a_declared_key_values_hints_at_counting_rows_per_key(hproxy):
    """A chart that bins raw values itself (Superset's Histogram chart: ``SELECT age AS age FROM
    t``) reads rows; on a column opted in to GROUP BY the hint says how to ask for its histogram."""
    error = _refusal(hproxy, "SELECT age AS age FROM visits LIMIT 10000")
    assert error.sqlstate == "DP001" and "rule: no-row-access" in str(error)
    hint = error.diag.message_hint or ""
    assert "SELECT age, COUNT(*) FROM visits GROUP BY age" in hint and "width_bucket(age, lo, hi, n)" in hint, hint


def test_selecting_values_of_a_column_not_opted_in_keeps_the_aggregate_hint(hproxy):
    error = _refusal(hproxy, "SELECT device FROM visits")
    assert "rule: no-row-access" in str(error)
    assert (error.diag.message_hint or "").startswith("Protected tables answer only aggregates"), error


@pytest.mark.parametrize("key", ["visited_on", "DATE_TRUNC('hour', visited_on)"])
def test_group_by_a_time_column_without_a_declared_unit_hints_at_a_time_grain(hproxy, key):
    """A BI tool's temporal dimension without a time grain (Superset's Table or Sunburst on a
    timestamp: ``GROUP BY signed_up``), or with one the policy does not list (*Hour*): the hint
    names the units to pick, and where a chart's column carries no grain, the DATE_TRUNC to write."""
    error = _refusal(hproxy, f"SELECT {key} AS k, count(*) FROM visits GROUP BY {key}")
    assert "rule: no-group-by" in str(error)
    hint = error.diag.message_hint or ""
    # [month, quarter, week] declared: year is nested in month and quarter, day in none of them
    assert hint.startswith("visited_on is grouped by its declared time units (and the coarser ones nested in them) "
                           "only: week, month, quarter or year"), hint
    assert "DATE_TRUNC('month', visited_on)" in hint and "Time grain" in hint, hint


def test_a_table_without_opt_in_still_refuses_group_by(hproxy):
    error = _refusal(hproxy, "SELECT sex, count(*) FROM adult GROUP BY sex")
    assert error.sqlstate == "DP001" and "rule: no-group-by" in str(error)
    assert "declares none" in (error.diag.message_hint or "")


# ---------------------------------------------------------------- the guarantee


def _draws(proxy: RunningProxy, table: str, n: int) -> np.ndarray:
    with proxy.connect() as conn:
        return np.array([[c for _, c in conn.execute(f"SELECT sex, count(*) FROM {table} GROUP BY sex").fetchall()]
                         for _ in range(n)], dtype=float)


def test_neighbouring_tables_give_histograms_within_e_epsilon(hproxy, admin):
    """nbh_plus has one row more than nbh_base, in the Female cell: at ε = 1 every outcome's
    probability may change by at most e^1, cell by cell (the other cell does not change at all).

    The discrete Laplace attains that bound: every count at or below the base's true count is
    exactly e times likelier on nbh_base than on nbh_plus. The test checks that the observed
    log ratio there is ε (it can see a privacy loss of ε, so a larger one would fail it) and
    never more than ε anywhere, up to sampling error (z = 5.3: one false failure in 10^7 per bin).
    """
    n, epsilon, z = 3000, 1.0, 5.3
    base, plus = _draws(hproxy, "nbh_base", n), _draws(hproxy, "nbh_plus", n)
    (female,) = admin.execute("SELECT count(*) FROM nbh_base WHERE sex = 'Female'").fetchone()
    # The Male cell is the same table in both: its counts come from one distribution. The
    # difference of the two means (variance 2·1.84/n each) fails by chance with p ≈ 3e-8.
    assert abs(base[:, 0].mean() - plus[:, 0].mean()) < z * math.sqrt(2 * 2 / n)
    a, b = base[:, 1], plus[:, 1]
    # Bins that each hold ≥ 9% of the draws on both tables (P ≈ 0.099 below female − 1 on nbh_plus),
    # so the ≥ 100 precondition fails by chance with p < 1e-20 (a bin below female − 2 held 3.6%,
    # ≈ 109 of 3000, and failed it one run in five). The two log-ratio checks fail by chance with
    # p ≈ 1e-8 over all bins (binomial counts, summed exactly).
    for lo, hi in [(-np.inf, female - 1), (female, female), (female + 1, female + 1), (female + 2, np.inf)]:
        ca, cb = np.sum((a >= lo) & (a <= hi)), np.sum((b >= lo) & (b <= hi))
        assert min(ca, cb) >= 100, (lo, hi, ca, cb)
        log_ratio = math.log(ca / cb)
        assert abs(log_ratio) - z * math.sqrt(1 / ca + 1 / cb) <= epsilon, (lo, hi, ca, cb)
        if hi <= female:
            # Below the base's count the loss is exactly ε: the test sees it.
            assert abs(log_ratio - epsilon) <= z * math.sqrt(1 / ca + 1 / cb), (lo, hi, ca, cb)



@pytest.mark.parametrize("bounds, overload", [("17, 91", "double precision"), ("17.5, 91", "numeric")])
def test_width_bucket_resolves_to_the_overload_postgresql_picks(admin, bounds, overload):
    """An integer column between integer literals is bucketed in double precision, as PostgreSQL
    does (its float and numeric width_bucket can disagree at a bucket's edge), else in numeric."""
    admin.execute("CREATE TEMP TABLE wb (age integer)")
    explained = " ".join(row[0] for row in admin.execute(f"EXPLAIN VERBOSE SELECT width_bucket(age, {bounds}, 3) FROM wb"))
    assert f"width_bucket((age)::{overload}" in explained or (overload == "numeric" and "(age)::numeric" in explained)
    age = ColumnPolicy(bounds=(17, 90), group_by=True)
    relation = Relation(1, "public", "wb", TablePolicy(epsilon=1.0, columns={"age": age}),
                        {"age": ColumnInfo("age", 23, -1, 1, age, array_type_oid=1007)})
    plan = plan_aggregate_query(f"SELECT width_bucket(age, {bounds}, 3), COUNT(*) FROM wb GROUP BY 1", relation)
    assert f'pg_catalog.width_bucket(CAST("age" AS {overload})' in backend_sql(plan, seed=0)


@pytest.mark.parametrize("group_by", [
    "date_trunc('year', d)", "date_trunc('week', d)", "date_trunc('day', d)",
    "floor(extract(epoch from d)/604800)*604800",
])
def test_a_time_range_ending_in_9999_groups_its_last_bucket(admin, group_by):
    """The last bucket of a range that ends on 9999-12-31 ends in the year 10000, past what a
    Python datetime holds: planning failed with ValueError (an internal error). Its end is now
    PostgreSQL's sum of the bucket's start and width, and the row in it is counted."""
    admin.execute("CREATE TEMP TABLE far (d date)")
    admin.execute("INSERT INTO far VALUES ('9999-12-31'), ('9990-01-01'), ('infinity'), ('5874897-12-31')")
    d = ColumnPolicy(bounds=("9990-01-01", "9999-12-31"), group_by=True)
    relation = Relation(1, "pg_temp", "far", TablePolicy(epsilon=1.0, max_cells=100_000, columns={"d": d}),
                        {"d": ColumnInfo("d", 1082, -1, 1, d, array_type_oid=1182)})
    plan = plan_aggregate_query(f"SELECT {group_by}, count(*) FROM far GROUP BY 1", relation)
    key = plan.groups[0]
    rows = admin.execute(backend_sql(plan, seed=0)).fetchall()
    cells = [key.cell_of(None if row[0] is None else str(row[0]).encode()) for row in rows]
    assert key.size - 1 in cells and 0 in cells  # the rows of 9999-12-31 and 9990-01-01; the others in no cell


_NAMED = [
    "SELECT date_trunc('month', visited_on), count(*) FROM visits GROUP BY 1",
    "SELECT date_trunc('month', visited_on)::date, count(*) FROM visits GROUP BY 1",
    "SELECT sex COLLATE \"C\", count(*) FROM visits GROUP BY sex",
    "SELECT sex, count(*)::int, round(avg(age)), now() IS NOT NULL, (count(*)) FROM visits GROUP BY sex",
    "SELECT width_bucket(age, 0, 100, 4), sum(income) / 2, CASE WHEN count(*) > 0 THEN sex END "
    "FROM visits GROUP BY 1, sex",
    "SELECT max(n), min(n) + 1, current_date IS NOT NULL FROM (SELECT sex, count(*) AS n FROM visits GROUP BY sex) t",
    "SELECT count(*), trim(' x '), position('a' in 'cat'), upper('a') FROM visits HAVING count(*) > 0",
    "SELECT date_trunc FROM (SELECT date_trunc('month', visited_on), count(*) FROM visits GROUP BY 1) AS t",
]


@pytest.mark.parametrize("sql", _NAMED)
def test_output_columns_are_named_as_postgresql_names_them(hproxy: RunningProxy, test_db: TestDatabase, sql: str):
    # The outer statement is sqlglot's rendering, which renamed unaliased columns:
    # date_trunc(...) came back as "timestamp_trunc", t COLLATE "C" as "?column?".
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        expected = [d.name for d in admin.execute(f"SELECT * FROM ({sql}) AS q LIMIT 0").description]
    with hproxy.connect() as conn:
        got = [d.name for d in conn.execute(sql).description]
    assert got == expected


@pytest.mark.parametrize("key", [
    "date_trunc('day', logged_at)",
    "floor(extract(epoch from logged_at)/86400)*86400",  # Grafana's $__timeGroup(logged_at, '1d')
])
def test_cells_are_counted_after_the_where_narrows_the_time_keys(hproxy, key):
    # Daily buckets by sex over the declared year are 730 cells, more than visits' max_cells (400);
    # a week of them (Grafana's $__timeFilter) is 14. Refused before, as the year's 730.
    week = "logged_at >= '2023-06-01' AND logged_at < '2023-06-08'"
    with hproxy.connect() as conn:
        rows = conn.execute(f"SELECT {key} AS t, sex, count(*) FROM visits WHERE {week} GROUP BY 1, 2").fetchall()
        assert len(rows) == 14
        before = spent_epsilon(conn)
        for where in ("", "WHERE logged_at >= '2023-01-01' AND logged_at < '2023-12-01'"):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(f"SELECT {key} AS t, sex, count(*) FROM visits {where} GROUP BY 1, 2")
            assert refused.value.sqlstate == "DP001" and "rule: max-cells" in str(refused.value)
            assert "narrow the time range" in (refused.value.diag.message_hint or "")
        assert spent_epsilon(conn) == before
