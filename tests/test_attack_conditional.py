"""Conditional aggregates (``agg(...) FILTER (WHERE p)`` and the CASE forms BI tools send), attacked.

Found and fixed, pinned here with the probe that found it: a parameter in an aggregate's
FILTER was refused as "a parameter after the aggregates" whenever the statement went through
post-processing (GROUP BY over declared keys, HAVING, an expression over aggregates, a
subquery wrapper), though the FILTER is the release's, bound and folded with the WHERE's; the
same FILTER without GROUP BY was answered (compatibility, not a leak). A parameter in an
aggregate of an outer query over the release is the outer statement's and stays refused.

Probes that held (regression tests): on ``cn0`` and neighbours that each hold one adversarial
row (NULLs, NaN, ±Infinity, numeric 1e400 beyond double precision, dates and timestamps at
their types' limits, a text ending in a backslash, a row alone in a group or passing a FILTER
no other row passes), conditional aggregates of every form — p on a column of another type
than the aggregate's, numeric and float comparisons, LIKE, date/time literals, folded values,
sample-and-aggregate AVG/MIN/MAX, MODE, COUNT(DISTINCT), histograms with empty FILTERs per
cell, HAVING, post-processing — give the same outcome, columns, types, number of rows and
notices, and every error is uncharged. The repeat store keeps filters, parameters, TimeZone
and DateStyle apart; one release is shared by a FILTER and its CASE twin.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours, same_on_neighbours

_DDL = "(id int, i int2, n numeric, f float8, r real, s text, d date, ts timestamptz, b boolean)"
_BASE_ROWS = (
    "SELECT g, g % 90, (g % 700)::numeric / 7, (g % 13)::float8 - 4, (g % 9)::real / 3, "
    "(ARRAY['a', 'b'])[1 + g % 2], DATE '2020-01-01' + (g % 366), "
    "TIMESTAMPTZ '2020-01-01 12:00+00' + (g % 366) * interval '1 day', g % 3 = 0 FROM generate_series(1, 300) g"
)
_NEIGHBOURS = {
    "cn1": "(1001, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "cn2": "(1002, 32767, 1e100, 'NaN', 'Infinity', 'zz', 'infinity', '-infinity', true)",
    "cn3": "(1003, -32768, 'NaN', '-Infinity', 'NaN', '', '4713-01-01 BC', '294276-12-31 23:59:59+00', false)",
    "cn4": "(1004, 89, -1e-100, 1e308, 3.4e38, E'a\\\\', '5874897-12-31', 'infinity', NULL)",
    "cn5": "(1005, 0, 0, 5e-324, 1e-45, 'a', '2020-06-15', '2020-06-15 00:00+14', true)",
    "cn6": "(1006, 1, 1e400, 1, 1, 'b', '2020-06-15', '2020-06-15 00:00+14', true)",
    "cn7": "(1007, 1, -1e-400, 1, 1, 'b', '2020-06-15', '2020-06-15 00:00+14', true)",
}
_POLICY = ATTACK_POLICY_HEAD + """
  public.cn0: &C
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      i: {{bounds: [0, 100]}}
      n: {{bounds: [0, 1000]}}
      f: {{bounds: [-5, 10], avg: sample_aggregate}}
      r: {{bounds: [0, 3]}}
      s: {{categories: [a, b], group_by: true}}
      d: {{bounds: [2020-01-01, 2020-12-31], group_by: [month]}}
""" + "".join(f"  public.{name}: *C\n" for name in _NEIGHBOURS)


@pytest.fixture(scope="module")
def cond_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    create_neighbours(test_db.admin_dsn, "cn0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _same_on_neighbours(proxy: RunningProxy, sql: str, keys: int = 0, params: tuple[object, ...] | None = None,
                        setup: tuple[str, ...] = ()) -> tuple[object, ...]:
    with proxy.connect() as conn:
        for statement in setup:
            conn.execute(statement)
        return same_on_neighbours(conn, sql, ("cn0", *_NEIGHBOURS), spent_epsilon, keys, params)


HELD_ON_NEIGHBOURS = [
    "SELECT s, COUNT(*) FILTER (WHERE s = 'zz') FROM {t} GROUP BY s",
    "SELECT COUNT(*) FILTER (WHERE n > CAST(1.5 AS double precision)) FROM {t}",
    "SELECT COUNT(*) FILTER (WHERE n IN (1, 2.5::float8)) FROM {t}",
    "SELECT SUM(CASE WHEN f > 1 THEN n ELSE 0.0 END) FROM {t}",
    "SELECT COUNT(*) FILTER (WHERE f > 1.5) FROM {t}",
    "SELECT SUM(CASE WHEN n > 2.5 THEN i ELSE 0.0 END) FROM {t}",
    "SELECT SUM(CASE WHEN r > 0.1 THEN f ELSE 0.0 END) FROM {t}",
    "SELECT AVG(f) FILTER (WHERE s LIKE 'a%') FROM {t}",
    "SELECT MIN(f) FILTER (WHERE d > '2020-06-01') FROM {t}",
    "SELECT MAX(CASE WHEN ts < '2020-06-01' THEN f END), AVG(f) FILTER (WHERE false) FROM {t}",
    "SELECT AVG(CASE WHEN n = 'NaN' THEN n END) FROM {t}",
    "SELECT MODE() WITHIN GROUP (ORDER BY CASE WHEN f > 1 THEN s END) FROM {t}",
    "SELECT SUM(i) FILTER (WHERE f > 1e400) FROM {t}",
    "SELECT COUNT(*) FILTER (WHERE f = 'Infinity'), COUNT(*) FILTER (WHERE n > 'NaN') FROM {t}",
    "SELECT COUNT(*) FILTER (WHERE s LIKE 'a\\') FROM {t}",
    "SELECT COUNT(*) FILTER (WHERE ts > '2020-06-01 12:00') FROM {t}",
    "SELECT COUNT(*) FILTER (WHERE d > CURRENT_DATE + 9999999) FROM {t}",
    "SELECT COUNT(*) FILTER (WHERE d = '2020-02-30') FROM {t}",
    "SELECT AVG(f) FILTER (WHERE d = '2020-02-30') FROM {t}",
    "SELECT SUM(i) FILTER (WHERE f > 1) / COUNT(*) FILTER (WHERE f > 1e400) FROM {t}",
    "SELECT s, SUM(i) FILTER (WHERE i > 1000), AVG(n) FILTER (WHERE i > 1000), COUNT(DISTINCT d) FILTER (WHERE i > 1000) "
    "FROM {t} WHERE s = 'b' OR id > 1000 GROUP BY s",
    "SELECT s, SUM(CASE WHEN i > 1000 THEN n ELSE 0 END), AVG(CASE WHEN i > 1000 THEN f END), "
    "SUM(CASE WHEN i > 1000 THEN 1 ELSE 0.0 END) FROM {t} WHERE s = 'b' OR id > 1000 GROUP BY s",
    "SELECT date_trunc('month', d) AS m, SUM(f) FILTER (WHERE i > 1000), AVG(f) FILTER (WHERE i > 1000) FROM {t} "
    "WHERE d < '2020-02-01' OR id > 1000 GROUP BY 1",
    "SELECT s FROM {t} WHERE s = 'b' OR id > 1000 GROUP BY s HAVING SUM(i) FILTER (WHERE i > 1000) IS NULL",
    "SELECT SUM(i) FILTER (WHERE i > 1000) IS NULL, AVG(f) FILTER (WHERE i > 1000) IS NULL, "
    "MIN(f) FILTER (WHERE i > 1000) IS NULL FROM {t} WHERE id > 1000",
    "SELECT COALESCE(SUM(i) FILTER (WHERE i > 1000), -1), COALESCE(AVG(f) FILTER (WHERE id > 1000), -1) FROM {t}",
    # Indicators (Superset, Metabase, Looker) and a boolean column as a condition: the added rows hold
    # NULL, true and false flags, NaN and infinities the conditions meet.
    "SELECT SUM(CAST(f > 1 AS INT)), SUM((n = 'NaN')::int), SUM(b::int) FROM {t}",
    "SELECT AVG(CASE WHEN f > 1 THEN 1 ELSE 0 END), AVG((n > 1e50)::int), AVG(b::int) FROM {t}",
    "SELECT AVG((CASE WHEN (b) THEN 1.0 WHEN NOT (b) THEN 0 ELSE NULL END)) FROM {t} WHERE i > 1000",
    "SELECT COUNT(*) FILTER (WHERE b), COUNT(*) FILTER (WHERE b IS NOT TRUE) FROM {t} WHERE NOT b OR id > 1000",
    "SELECT s, AVG(CAST(b AS INT)), SUM(CASE WHEN b IS FALSE THEN i ELSE 0.0 END) FROM {t} WHERE id > 1000 GROUP BY s",
    "SELECT SUM(CASE WHEN i > 1000 THEN n ELSE 0.00 END), SUM(CASE WHEN b THEN 1 ELSE 0.0 END) FROM {t}",
    "SELECT SUM(CAST(f > 1 AS BIGINT)) FROM {t}",
    # A series limit whose ranking and statement count under FILTERs only the added rows pass.
    "SELECT DATE_TRUNC('MONTH', d) AS m, s AS s, COUNT(*) FILTER (WHERE i > 1000) AS c FROM public.{t} "
    "JOIN (SELECT s AS s__, SUM(CASE WHEN i > 1000 THEN 1 ELSE 0 END) AS mme_inner__ FROM public.{t} "
    "GROUP BY s ORDER BY 2 DESC LIMIT 1) AS series_limit ON s = s__ GROUP BY DATE_TRUNC('MONTH', d), s",
]


@pytest.mark.parametrize("sql", HELD_ON_NEIGHBOURS)
def test_one_row_changes_nothing_of_a_conditional_aggregate_but_its_noised_values(cond_proxy: RunningProxy, sql: str) -> None:
    _same_on_neighbours(cond_proxy, sql, keys=1 if "GROUP BY" in sql and "LIMIT" not in sql else 0)


def _charged(conn: psycopg.Connection, sql: str, params: tuple[object, ...] | None = None) -> float:
    before = spent_epsilon(conn)
    conn.execute(sql, params).fetchall()
    return spent_epsilon(conn) - before


# ---------------------------------------------------------------- parameters in a FILTER after post-processing

GROUPED_WITH_PARAMETERS = [
    ("SELECT s, COUNT(*) FILTER (WHERE i > %s) FROM cn0 WHERE f > %s GROUP BY s", (5, 1)),
    ("SELECT s, COUNT(*) FILTER (WHERE i > %s) FROM cn0 GROUP BY s HAVING COUNT(*) FILTER (WHERE i > %s) > 3", (5, 6)),
    ("SELECT 100.0 * COUNT(*) FILTER (WHERE s LIKE %s) / COUNT(*) FROM cn0", ("a%",)),
    ("SELECT x FROM (SELECT COUNT(*) FILTER (WHERE i > %s) AS x, SUM(i) FILTER (WHERE i > %s) AS y FROM cn0) q", (5, 5)),
]


@pytest.mark.parametrize("sql, params", GROUPED_WITH_PARAMETERS, ids=[s[:60] for s, _ in GROUPED_WITH_PARAMETERS])
def test_a_parameter_in_a_filter_is_answered_also_with_post_processing(cond_proxy: RunningProxy, sql: str,
                                                                       params: tuple[object, ...]) -> None:
    # Refused before (rule: parameters) as if the parameter were in HAVING or an output
    # expression: the placeholder check ran over the outer statement before the aggregates,
    # FILTERs included, were replaced by their released columns.
    with cond_proxy.connect(autocommit=True) as conn:
        assert _charged(conn, sql, params) == pytest.approx(1.0)


@pytest.mark.parametrize("sql, params", [
    ("SELECT s, COUNT(*) FILTER (WHERE i > %s) FROM cn0 GROUP BY s HAVING COUNT(*) > %s", (5, 3)),
    ("SELECT s, COUNT(*) FILTER (WHERE i > %s) FROM cn0 GROUP BY s LIMIT %s", (5, 1)),
    # An aggregate of the outer query over the release: its FILTER is the outer statement's,
    # whose $1 would be the release's first array (bigint > text[] when first tried this way).
    ("SELECT COUNT(*) FILTER (WHERE c > %s) FROM (SELECT s, COUNT(*) AS c FROM cn0 GROUP BY s) q", (5,)),
    ("SELECT SUM(c) FILTER (WHERE c > %s) FROM (SELECT COUNT(*) FILTER (WHERE i > %s) AS c FROM cn0) q", (5, 5)),
])
def test_a_parameter_after_the_aggregates_is_still_refused(cond_proxy: RunningProxy, sql: str,
                                                           params: tuple[object, ...]) -> None:
    with cond_proxy.connect(autocommit=True) as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(sql, params)
        assert caught.value.sqlstate == "DP001" and "rule: parameters" in str(caught.value)
        assert spent_epsilon(conn) == before


@pytest.mark.parametrize("sql, params", [
    ("SELECT s, COUNT(*) FILTER (WHERE d > %s) FROM cn0 GROUP BY s", ("2020-02-30",)),
    ("SELECT s, COUNT(*) FILTER (WHERE i > %s) FROM cn0 GROUP BY s", ("abc",)),
    ("SELECT s, COUNT(*) FILTER (WHERE s LIKE %s) FROM cn0 GROUP BY s", ("a\\",)),
    ("SELECT COUNT(*) FILTER (WHERE i > 1 / %s) + 1 FROM cn0", (0,)),
])
def test_a_filter_parameter_the_column_cannot_read_fails_before_the_charge(cond_proxy: RunningProxy, sql: str,
                                                                          params: tuple[object, ...]) -> None:
    for table in ("cn0", "cn1"):
        with cond_proxy.connect(autocommit=True) as conn:
            before = spent_epsilon(conn)
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(sql.replace("cn0", table), params)
            assert spent_epsilon(conn) == before
            assert "rule: parameters" not in str(caught.value)  # the value's own error, not the form's


def test_a_grouped_filter_parameter_is_part_of_the_repeat_key(cond_proxy: RunningProxy) -> None:
    sql = "SELECT s, COUNT(*) FILTER (WHERE i > %s) FROM cn0 GROUP BY s"
    with cond_proxy.connect(autocommit=True) as conn:
        assert _charged(conn, sql, (7,)) == pytest.approx(1.0)
        assert _charged(conn, sql, (7,)) == 0.0
        assert _charged(conn, sql, (8,)) == pytest.approx(1.0)


# ---------------------------------------------------------------- the repeat store (held)


def test_a_filter_literal_read_under_other_settings_is_another_release(cond_proxy: RunningProxy) -> None:
    with cond_proxy.connect(autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        sql = "SELECT COUNT(*) FILTER (WHERE ts > '2020-06-01 12:00') FROM cn0"
        assert (_charged(conn, sql), _charged(conn, sql)) == (pytest.approx(1.0), 0.0)
        conn.execute("SET TimeZone = 'Pacific/Kiritimati'")
        assert _charged(conn, sql) == pytest.approx(1.0)
        conn.execute("SET DateStyle = 'ISO, MDY'")
        sql = "SELECT SUM(CASE WHEN d > '01/02/2020' THEN 1 ELSE 0 END) FROM cn0"
        assert (_charged(conn, sql), _charged(conn, sql)) == (pytest.approx(1.0), 0.0)
        conn.execute("SET DateStyle = 'ISO, DMY'")
        assert _charged(conn, sql) == pytest.approx(1.0)


def test_filters_are_released_apart_and_a_case_twin_is_a_repeat(cond_proxy: RunningProxy) -> None:
    with cond_proxy.connect(autocommit=True) as conn:
        assert _charged(conn, "SELECT COUNT(*) FILTER (WHERE i > %s) FROM cn0", (11,)) == pytest.approx(1.0)
        assert _charged(conn, "SELECT COUNT(*) FILTER (WHERE i > %s) FROM cn0", (12,)) == pytest.approx(1.0)
        assert _charged(conn, "SELECT COUNT(*) FILTER (WHERE s LIKE %s) FROM cn0", ("b%",)) == pytest.approx(1.0)
        assert _charged(conn, "SELECT COUNT(*) FILTER (WHERE s LIKE %s) FROM cn0", ("a%",)) == pytest.approx(1.0)
        assert _charged(conn, "SELECT SUM(CASE WHEN i > 13 THEN n ELSE 0 END) FROM cn0") == pytest.approx(1.0)
        assert _charged(conn, "SELECT SUM(n) FILTER (WHERE i > 13) FROM cn0") == 0.0
        # Two filters in one statement, in either order: each column its own release.
        low, high = conn.execute("SELECT COUNT(*) FILTER (WHERE i > 5), COUNT(*) FILTER (WHERE i > 80) FROM cn0").fetchone() or (0, 0)
        assert low > high + 100


def test_a_wrapper_that_renames_columns_is_filtered_by_what_the_names_denote(cond_proxy: RunningProxy,
                                                                           test_db: TestDatabase) -> None:
    sql = "SELECT COUNT(*) FILTER (WHERE i > 40) FROM (SELECT n AS i, i AS n FROM cn0) q"  # 20 rows, not 150
    with psycopg.connect(test_db.admin_dsn) as admin:
        (exact,) = admin.execute(sql).fetchone() or (0,)
    with cond_proxy.connect(autocommit=True) as conn:
        (answered,) = conn.execute(sql).fetchone() or (0,)
    assert exact == 20 and abs(answered - exact) < 40


def test_a_repeat_is_printed_with_the_fraction_digits_its_own_constants_give(cond_proxy: RunningProxy) -> None:
    """Found: the repeat key left the scale out, so ``THEN 1.00 ELSE 0`` after ``THEN 1 ELSE 0.0``
    (the same count) was sent as the first one's text, one fraction digit where PostgreSQL prints two."""
    with cond_proxy.connect(autocommit=True) as conn:
        conn.execute("SELECT SUM(CASE WHEN i > 44 THEN 1 ELSE 0.0 END) FROM cn0").fetchall()
        with conn.cursor() as cursor:
            cursor.execute("SELECT SUM(CASE WHEN i > 44 THEN 1.00 ELSE 0 END)::text FROM cn0")
            (text,) = cursor.fetchone() or ("",)
    assert len(text.partition(".")[2]) == 2, text
