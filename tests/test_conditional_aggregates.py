"""Conditional aggregates: ``agg(...) FILTER (WHERE p)`` and the CASE forms BI tools send for it
(Metabase's CountIf/SumIf, Tableau's IIF, Superset's custom SQL metrics), answered as the
aggregate over ``(where) AND p`` with the same noise; near misses refused, at no cost.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import pq

from conftest import ATTACK_POLICY_HEAD, TEST_POLICY, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from neighbour_outcome import create_neighbours, masked_outcome

_REPEATING = TEST_POLICY.replace("repeats: {{enabled: false}}", "repeats: {{ttl_s: 600}}")
_GROUPING = TEST_POLICY.replace("sex: {{categories: [Male, Female]}}", "sex: {{categories: [Male, Female], group_by: true}}")


@pytest.fixture(scope="module")
def repeating(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A proxy that answers repeats from its store (the suite's default proxy does not)."""
    assert _REPEATING != TEST_POLICY
    with running_proxy(test_db, tmp_path_factory, _REPEATING) as running:
        yield running


@pytest.fixture(scope="module")
def grouping(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A proxy whose policy declares sex a GROUP BY key."""
    assert _GROUPING != TEST_POLICY
    with running_proxy(test_db, tmp_path_factory, _GROUPING) as running:
        yield running

# Each answered form, and the exact aggregate over the same rows (WHERE p) it must approximate.
ANSWERED = [
    ("SELECT COUNT(*) FILTER (WHERE age > 40) FROM adult", "SELECT COUNT(*) FROM adult WHERE age > 40"),
    ("SELECT SUM(CASE WHEN age > 40 THEN 1 ELSE 0 END) FROM adult", "SELECT COUNT(*) FROM adult WHERE age > 40"),
    ("SELECT SUM(CASE WHEN age > 40 THEN 1 ELSE 0.0 END) FROM adult", "SELECT COUNT(*) FROM adult WHERE age > 40"),
    ("SELECT SUM(CASE WHEN age > 40 THEN 1.0 END) FROM adult", "SELECT COUNT(*) FROM adult WHERE age > 40"),
    ("SELECT COUNT(CASE WHEN age > 40 THEN 1 END) FROM adult", "SELECT COUNT(*) FROM adult WHERE age > 40"),
    ("SELECT COUNT(CASE WHEN age > 40 THEN 'x' ELSE NULL END) FROM adult", "SELECT COUNT(*) FROM adult WHERE age > 40"),
    ("SELECT COUNT(CASE WHEN sex = 'Male' THEN age END) FROM adult", "SELECT COUNT(age) FROM adult WHERE sex = 'Male'"),
    ("SELECT AVG(CASE WHEN sex = 'Male' THEN age END) FROM adult", "SELECT AVG(age) FROM adult WHERE sex = 'Male'"),
    ("SELECT SUM(CASE WHEN sex = 'Male' THEN age ELSE 0 END) FROM adult", "SELECT SUM(age) FROM adult WHERE sex = 'Male'"),
    ("SELECT SUM(CASE WHEN sex = 'Male' THEN age ELSE 0.0 END) FROM adult",
     "SELECT SUM(age) FROM adult WHERE sex = 'Male'"),
    ("SELECT SUM(age) FILTER (WHERE sex = 'Male') FROM adult", "SELECT SUM(age) FROM adult WHERE sex = 'Male'"),
    ("SELECT AVG(hours_per_week) FILTER (WHERE sex = 'Female') FROM adult",
     "SELECT AVG(hours_per_week) FROM adult WHERE sex = 'Female'"),
    ("SELECT MAX(CASE WHEN sex = 'Female' THEN age END) FROM adult", "SELECT MAX(age) FROM adult WHERE sex = 'Female'"),
    ("SELECT COUNT(DISTINCT CASE WHEN age > 40 THEN sex END) FROM adult",
     "SELECT COUNT(DISTINCT sex) FROM adult WHERE age > 40"),
    ("SELECT MODE() WITHIN GROUP (ORDER BY sex) FILTER (WHERE age BETWEEN 20 AND 60) FROM adult",
     "SELECT MODE() WITHIN GROUP (ORDER BY sex) FROM adult WHERE age BETWEEN 20 AND 60"),
    ("SELECT COUNT(*) FILTER (WHERE sex = 'Male') AS men FROM adult WHERE age > 30",
     "SELECT COUNT(*) AS men FROM adult WHERE age > 30 AND sex = 'Male'"),
    # Metabase's SumIf over its qualified columns, and Tableau's IIF(p, x, 0) / IIF(p, 1, NULL)
    ('SELECT SUM(CASE WHEN "public"."adult"."sex" = \'Male\' THEN "public"."adult"."age" ELSE 0.0 END) FROM adult',
     "SELECT SUM(age) FROM adult WHERE sex = 'Male'"),
    ("SELECT SUM((CASE WHEN (age > 40) THEN 1 WHEN NOT (age > 40) THEN 0 ELSE NULL END)) FROM adult",
     "SELECT COUNT(*) FROM adult WHERE age > 40"),
    ("SELECT COUNT((CASE WHEN (sex = 'Male') THEN 1 WHEN NOT (sex = 'Male') THEN NULL ELSE NULL END)) FROM adult",
     "SELECT COUNT(*) FROM adult WHERE sex = 'Male'"),
    ("SELECT SUM((CASE WHEN (sex = 'Male') THEN age WHEN NOT (sex = 'Male') THEN 0 ELSE NULL END)) FROM adult",
     "SELECT SUM(age) FROM adult WHERE sex = 'Male'"),
    # Superset/Metabase/Looker indicator sums: the count where p holds, bigint as SUM(int4) is
    ("SELECT SUM(CAST(age > 40 AS INT)) FROM adult", "SELECT COUNT(*) FROM adult WHERE age > 40"),
    ("SELECT SUM((age > 40)::int) FROM adult", "SELECT COUNT(*) FROM adult WHERE age > 40"),
    ("SELECT SUM((sex = 'Male' AND age > 30)::integer) FROM adult",
     "SELECT COUNT(*) FROM adult WHERE sex = 'Male' AND age > 30"),
    ("SELECT SUM(CAST(age > 40 AS INT)) FILTER (WHERE sex = 'Female') FROM adult",
     "SELECT COUNT(*) FROM adult WHERE age > 40 AND sex = 'Female'"),
]
# Each column's allowed distance from the exact value (noise at ε = 1 split over the columns).
_TOLERANCE = {"count": 60, "sum": 3000, "avg": 3, "max": 30, "mode": 0, "men": 60}
_SHARE_TOLERANCE = 0.005  # two counts of ~49 000 rows with Laplace noise of scale 2: far below 1 %


def _simple(conn: psycopg.Connection, sql: str) -> pq.abc.PGresult:
    result = conn.pgconn.exec_(sql.encode())
    assert result.status == pq.ExecStatus.TUPLES_OK, (result.error_message or b"").decode()
    return result


def _shape(result: pq.abc.PGresult) -> list[tuple[bytes | None, int]]:
    return [(result.fname(i), result.ftype(i)) for i in range(result.nfields)]


def _close(name: str, answered: bytes | None, exact: bytes | None) -> bool:
    assert answered is not None and exact is not None
    if name == "mode":
        return answered == exact
    return abs(float(answered) - float(exact)) <= _TOLERANCE[name]


@pytest.mark.parametrize("sql, plain", ANSWERED, ids=[a[0][7:60] for a in ANSWERED])
def test_a_conditional_aggregate_is_answered_with_the_names_and_types_postgresql_gives(
        proxy: RunningProxy, admin: psycopg.Connection, sql: str, plain: str):
    exact = _simple(admin, plain)
    with proxy.connect(autocommit=True) as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        answered = _simple(conn, sql)
        assert _shape(answered) == _shape(_simple(admin, sql))
        name = answered.fname(0).decode()  # type: ignore[union-attr]
        assert _close(name, answered.get_value(0, 0), exact.get_value(0, 0))
        # The extended protocol gets the same columns.
        cur = conn.execute(sql)
        assert [(c.name, c.type_code) for c in cur.description or []] == [
            (n.decode(), t) for n, t in _shape(answered) if n is not None]
    assert any(f"{name}:" in notice for notice in notices), notices


def test_a_count_form_releases_noised_values_not_the_exact_count(proxy: RunningProxy, admin: psycopg.Connection):
    (exact,) = admin.execute("SELECT COUNT(*) FROM adult WHERE age > 40").fetchone() or (0,)
    with proxy.connect(autocommit=True) as conn:
        values = [row[0] for row in (conn.execute("SELECT SUM(CASE WHEN age > 40 THEN 1 ELSE 0 END) FROM adult").fetchone()
                                     for _ in range(30)) if row is not None]
    # Laplace noise of scale 1: 30 draws land on at least three integers (all but surely) around the count.
    assert len(set(values)) >= 3 and all(abs(value - exact) < 30 for value in values)


def test_several_conditional_columns_split_epsilon_as_plain_columns_do(proxy: RunningProxy):
    with proxy.connect(autocommit=True) as conn:
        before = spent_epsilon(conn)
        row = conn.execute(
            "SELECT COUNT(*) FILTER (WHERE sex = 'Male') AS men, COUNT(*) FILTER (WHERE sex = 'Female') AS women, "
            "SUM(CASE WHEN age > 60 THEN 1 ELSE 0 END) AS old FROM adult").fetchone()
        assert spent_epsilon(conn) - before == pytest.approx(1.0)
    assert row is not None and abs(row[0] - 32650) < 100 and abs(row[1] - 16192) < 100


def test_conditional_aggregates_per_group_of_declared_keys(grouping: RunningProxy, admin: psycopg.Connection):
    sql = ("SELECT sex, COUNT(*) FILTER (WHERE age > 40) AS older, SUM(CASE WHEN age <= 40 THEN 1 ELSE 0 END) AS younger "
           "FROM adult GROUP BY sex ORDER BY sex")
    exact = admin.execute(sql).fetchall()
    with grouping.connect(autocommit=True) as conn:
        answered = conn.execute(sql).fetchall()
        assert [(c.name, c.type_code) for c in conn.execute(sql).description or []] == [
            ("sex", 25), ("older", 20), ("younger", 20)]
    assert [row[0] for row in answered] == [row[0] for row in exact]
    for got, want in zip(answered, exact):
        assert abs(got[1] - want[1]) < 100 and abs(got[2] - want[2]) < 100


def test_a_filter_beside_an_expression_over_aggregates_is_post_processed(proxy: RunningProxy):
    sql = "SELECT 100.0 * COUNT(*) FILTER (WHERE sex = 'Female') / COUNT(*) AS share FROM adult"
    with proxy.connect(autocommit=True) as conn:
        (share,) = conn.execute(sql).fetchone() or (None,)
    assert share is not None and 30 < float(share) < 36


def test_a_filter_with_a_computed_value_and_parameters_is_folded_first(proxy: RunningProxy, admin: psycopg.Connection):
    (older,) = admin.execute("SELECT COUNT(*) FROM adult WHERE age > 40").fetchone() or (0,)
    (men,) = admin.execute("SELECT COUNT(*) FROM adult WHERE sex = 'Male'").fetchone() or (0,)
    with proxy.connect(autocommit=True) as conn:
        row = conn.execute("SELECT COUNT(*) FILTER (WHERE age > 30 + 10), SUM(CASE WHEN age > %s THEN 1 ELSE 0 END), "
                           "COUNT(*) FILTER (WHERE sex LIKE %s) FROM adult WHERE age < 100 - 1",
                           (40, "Ma%")).fetchone()
    assert row is not None and abs(row[0] - older) < 100 and abs(row[1] - older) < 100 and abs(row[2] - men) < 100


def test_a_repeat_is_told_apart_by_its_filter(repeating: RunningProxy):
    with repeating.connect(autocommit=True) as conn:
        first = conn.execute("SELECT COUNT(*) FILTER (WHERE age > 61) FROM adult").fetchone()
        spent = spent_epsilon(conn)
        again = conn.execute("SELECT SUM(CASE WHEN age > 61 THEN 1 ELSE 0 END) AS n FROM adult").fetchone()
        assert spent_epsilon(conn) == spent  # the same release: a repeat, free
        other = conn.execute("SELECT COUNT(*) FILTER (WHERE age < 61) FROM adult").fetchone()
        assert spent_epsilon(conn) == pytest.approx(spent + 1.0)
        plain = conn.execute("SELECT COUNT(*) FROM adult").fetchone()
        assert spent_epsilon(conn) == pytest.approx(spent + 2.0)
    assert first == again and first is not None and other is not None and plain is not None
    assert first[0] < 10000 < other[0] < plain[0]


REFUSED = [
    ("SELECT SUM(CASE WHEN age > 40 THEN 2 ELSE 0 END) FROM adult", "aggregate-argument"),
    ("SELECT COUNT(CASE WHEN age > 40 THEN 1 ELSE 0 END) FROM adult", "aggregate-argument"),
    ("SELECT SUM(CASE WHEN age > 40 THEN 1 WHEN age > 20 THEN 2 END) FROM adult", "aggregate-argument"),
    ("SELECT SUM(CASE age WHEN 40 THEN 1 END) FROM adult", "aggregate-argument"),
    ("SELECT SUM(CASE WHEN age > 40 THEN age + 1 END) FROM adult", "aggregate-argument"),
    ("SELECT AVG(CASE WHEN age > 40 THEN age ELSE 0 END) FROM adult", "aggregate-argument"),
    ("SELECT SUM(CASE WHEN age > 40 THEN age ELSE 1 END) FROM adult", "aggregate-argument"),
    ("SELECT SUM(CASE WHEN age > 40 THEN 1 ELSE age END) FROM adult", "aggregate-argument"),
    ("SELECT COUNT(*) FILTER (WHERE age + 1 > 40) FROM adult", "safe-predicate"),
    ("SELECT COUNT(*) FILTER (WHERE age::text = '40') FROM adult", "safe-predicate"),
    ("SELECT SUM(CASE WHEN age % 2 = 0 THEN 1 ELSE 0 END) FROM adult", "safe-predicate"),
    ("SELECT COUNT(*) FILTER (WHERE age > (SELECT 1)) FROM adult", "no-subquery"),
    ("SELECT COUNT(*) FILTER (WHERE age > AVG(age)) FROM adult", "safe-predicate"),
    ("SELECT COUNT(*) FILTER (WHERE ctid > '(0,1)') FROM adult", "no-row-access"),
    ("SELECT SUM(CASE WHEN age > 40 THEN 1 WHEN NOT (age > 30) THEN 0 END) FROM adult", "aggregate-argument"),
    ("SELECT COUNT(CASE WHEN age > 40 THEN 1 WHEN NOT (age > 40) THEN 0 END) FROM adult", "aggregate-argument"),
    ("SELECT SUM(CASE WHEN age > 40 THEN 'x' END) FROM adult", "aggregate-argument"),
    ("SELECT AVG(CASE WHEN age > 40 THEN 1 END) FROM adult", "aggregate-argument"),
    ("SELECT AVG(CASE WHEN age > 40 THEN 2 ELSE 0 END) FROM adult", "aggregate-argument"),
    ("SELECT AVG(CASE WHEN age > 40 THEN 0 ELSE 1 END) FROM adult", "aggregate-argument"),
    ("SELECT MAX(CAST(age > 40 AS INT)) FROM adult", "aggregate-argument"),
    ("SELECT COUNT(DISTINCT (age > 40)::int) FROM adult", "aggregate-argument"),
    ("SELECT SUM(CAST(age > 40 AS TEXT)) FROM adult", "aggregate-argument"),
    ("SELECT SUM(CAST(age + 1 > 40 AS INT)) FROM adult", "safe-predicate"),
    ("SELECT COUNT(*) FILTER (WHERE age) FROM adult", "safe-predicate"),
    ("SELECT COUNT(*) FROM adult WHERE sex IS TRUE", "safe-predicate"),
]


@pytest.mark.parametrize("sql, rule", REFUSED, ids=[r[0][7:60] for r in REFUSED])
def test_a_near_miss_is_refused_with_a_hint_and_costs_nothing(proxy: RunningProxy, sql: str, rule: str):
    with proxy.connect(autocommit=True) as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
        assert spent_epsilon(conn) == before
    diag = info.value.diag
    assert diag.sqlstate == "DP001" and f"rule: {rule}" in (diag.message_primary or ""), diag.message_primary
    assert diag.message_hint
    if rule == "aggregate-argument":
        assert "FILTER (WHERE p)" in diag.message_hint


SHARES = [
    "SELECT AVG(CASE WHEN age > 40 THEN 1 ELSE 0 END) FROM adult",
    "SELECT AVG(CASE WHEN age > 40 THEN 1.0 ELSE 0 END) FROM adult",
    "SELECT AVG(CASE WHEN age > 40 THEN 1 ELSE 0.0 END) FROM adult",
    "SELECT AVG(CAST(age > 40 AS INT)) FROM adult",
    "SELECT AVG((age > 40)::int) FROM adult",
    "SELECT AVG((CASE WHEN (age > 40) THEN 1 WHEN NOT (age > 40) THEN 0 ELSE NULL END)) FROM adult",  # Tableau
    "SELECT AVG(CASE WHEN age > 40 THEN 1 ELSE 0 END) FILTER (WHERE sex = 'Male') FROM adult",
    "SELECT AVG((age > 40)::int) FILTER (WHERE sex = 'Female') FROM adult WHERE age < 80",
]


@pytest.mark.parametrize("sql", SHARES)
def test_an_average_of_an_indicator_is_the_share_of_two_released_counts(proxy: RunningProxy, admin: psycopg.Connection,
                                                                       sql: str):
    """The rate idiom a Superset user types as a custom SQL metric: charged as the accepted share
    ``COUNT(*) FILTER (WHERE p) * 1.0 / COUNT(*)`` is (two released counts, ε split between them)."""
    (exact,) = admin.execute(sql).fetchone() or (None,)
    with proxy.connect(autocommit=True) as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        before = spent_epsilon(conn)
        result = _simple(conn, sql)
        charged = spent_epsilon(conn) - before
        before = spent_epsilon(conn)
        conn.execute("SELECT COUNT(*) FILTER (WHERE age > 40) * 1.0 / COUNT(*) FROM adult").fetchone()
        assert charged == pytest.approx(spent_epsilon(conn) - before) == pytest.approx(1.0)
        cur = conn.execute(sql, prepare=True)  # described, then executed, over the extended protocol
        assert [(c.name, c.type_code) for c in cur.description or []] == [("avg", 1700)]
        assert 0 <= (cur.fetchone() or (-1,))[0] <= 1
    assert _shape(result) == _shape(_simple(admin, sql)) == [(b"avg", 1700)]
    value = result.get_value(0, 0)
    assert value is not None and abs(float(value) - float(exact)) < _SHARE_TOLERANCE
    assert any("count(*) filter (where" in notice for notice in notices), notices


def test_a_share_is_a_free_repeat_of_the_share_of_counts(repeating: RunningProxy):
    with repeating.connect(autocommit=True) as conn:
        first = conn.execute("SELECT COUNT(*) FILTER (WHERE age > 63) * 1.0 / COUNT(*) FROM adult").fetchone()
        spent = spent_epsilon(conn)
        again = conn.execute("SELECT AVG(CASE WHEN age > 63 THEN 1 ELSE 0 END) FROM adult").fetchone()
        assert spent_epsilon(conn) == spent
    assert first is not None and again is not None and abs(float(first[0]) - float(again[0])) < 1e-9


def test_a_share_over_no_row_is_a_number_in_0_1_never_null(proxy: RunningProxy):
    """PostgreSQL's AVG over no row is NULL; whether any row is averaged is what a DP answer never
    tells, so the share of a noised count below 1 is taken over 1 row, and clamped to [0, 1]."""
    with proxy.connect(autocommit=True) as conn:
        values = [conn.execute("SELECT AVG(CASE WHEN age > 40 THEN 1 ELSE 0 END), AVG((age < 40)::int) FROM adult "
                               "WHERE age > 1000").fetchone() for _ in range(20)]
    assert all(row is not None and all(v is not None and 0 <= v <= 1 for v in row) for row in values)


def test_a_share_per_group_of_declared_keys(grouping: RunningProxy, admin: psycopg.Connection):
    sql = "SELECT sex, AVG((age > 40)::int) AS older FROM adult GROUP BY sex ORDER BY sex"
    exact = admin.execute(sql).fetchall()
    with grouping.connect(autocommit=True) as conn:
        before = spent_epsilon(conn)
        cur = conn.execute(sql)
        answered = cur.fetchall()
        assert spent_epsilon(conn) - before == pytest.approx(1.0)
        assert [(c.name, c.type_code) for c in cur.description or []] == [("sex", 25), ("older", 1700)]
    assert [row[0] for row in answered] == [row[0] for row in exact]
    assert all(abs(float(got[1]) - float(want[1])) < 0.01 for got, want in zip(answered, exact))


@pytest.mark.parametrize("sql, exact_sql", [
    ("SELECT SUM(CASE WHEN age > 40 THEN age ELSE 0.0 END) FROM adult", None),
    ("SELECT SUM(CASE WHEN age > 40 THEN 1 ELSE 0.0 END) FROM adult", None),
    ("SELECT SUM(CASE WHEN age > 40 THEN 1.00 END) FROM adult", None),
    ("SELECT SUM(CASE WHEN age > 40 THEN age ELSE 0.00 END) FROM adult WHERE age > 1000",
     "SELECT SUM(CASE WHEN age > 40 THEN age ELSE 0.00 END) FROM adult WHERE age < 30"),
])
def test_a_numeric_conditional_sum_prints_the_scale_of_its_constants(proxy: RunningProxy, admin: psycopg.Connection,
                                                                    sql: str, exact_sql: str | None):
    """PostgreSQL prints ``SUM(CASE WHEN p THEN col ELSE 0.0 END)`` with the 0.0's scale when any row
    fails p: the scale dpproxy prints always, whatever the rows (an empty WHERE too)."""
    want = _simple(admin, exact_sql or sql).get_value(0, 0)
    with proxy.connect(autocommit=True) as conn:
        got = _simple(conn, sql).get_value(0, 0)
    assert want is not None and got is not None
    assert len(got.partition(b".")[2]) == len(want.partition(b".")[2]) > 0, (got, want)


def test_a_filter_whose_literal_the_column_cannot_read_fails_before_the_charge(proxy: RunningProxy):
    with proxy.connect(autocommit=True) as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT COUNT(*) FILTER (WHERE age = 'abc') FROM adult")
        assert spent_epsilon(conn) == before
    assert info.value.diag.sqlstate == "22P02"


def test_min_with_a_filter_per_group_is_refused_as_min_per_group_is(grouping: RunningProxy):
    with grouping.connect(autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT sex, MIN(age) FILTER (WHERE age > 30) FROM adult GROUP BY sex")
    assert "rule: aggregate-not-allowed" in (info.value.diag.message_primary or "")


@pytest.mark.parametrize("sql", [
    "SELECT SUM(CASE WHEN value > 3 THEN ratio ELSE 0 END) FROM clamp_test",
    "SELECT SUM(CASE WHEN value > 3 THEN value ELSE 0.0 END) FROM clamp_test",
    "SELECT SUM(CASE WHEN value > 3 THEN value ELSE 0 END), AVG(CASE WHEN ratio > 0 THEN value END) FROM clamp_test",
])
def test_sum_of_a_column_or_zero_has_the_type_postgresql_gives_the_case(proxy: RunningProxy, admin: psycopg.Connection,
                                                                        sql: str):
    with proxy.connect(autocommit=True) as conn:
        assert _shape(_simple(conn, sql)) == _shape(_simple(admin, sql))


def test_metabase_share_is_post_processing_of_two_released_counts(proxy: RunningProxy):
    with proxy.connect(autocommit=True) as conn:
        before = spent_epsilon(conn)
        (share,) = conn.execute('SELECT SUM(CASE WHEN "public"."adult"."sex" = \'Female\' THEN 1 ELSE 0.0 END) '
                                '/ COUNT(*) AS "share" FROM "public"."adult"').fetchone() or (None,)
        assert spent_epsilon(conn) - before == pytest.approx(1.0)
    assert share is not None and 0.30 < float(share) < 0.36


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FILTER (WHERE w.age > 40) AS c FROM (SELECT * FROM adult WHERE sex = 'Male') AS w",
    "SELECT COUNT(*) FILTER (WHERE age > 40) AS c FROM adult HAVING COUNT(*) FILTER (WHERE age > 40) IS NOT NULL",
    "SELECT MAX(x) FILTER (WHERE s = 'Male') AS c FROM (SELECT age AS x, sex AS s FROM adult) AS w",
    "SELECT SUM(CASE WHEN s = 'Male' THEN x ELSE 0 END) AS c FROM (SELECT age AS x, sex AS s FROM adult) AS w",
])
def test_a_filter_in_a_wrapper_or_a_having_is_answered(proxy: RunningProxy, sql: str):
    with proxy.connect(autocommit=True) as conn:
        assert [c.name for c in conn.execute(sql).description or []] == ["c"]


def test_a_filter_on_a_grouping_key_column_stays_a_filter(grouping: RunningProxy):
    with grouping.connect(autocommit=True) as conn:
        rows = conn.execute("SELECT sex, COUNT(*) FILTER (WHERE sex = 'Male') AS men FROM adult GROUP BY sex "
                            "ORDER BY sex").fetchall()
    assert [row[0] for row in rows] == ["Female", "Male"]
    assert abs(rows[0][1]) < 100 and abs(rows[1][1] - 32650) < 100


def test_a_like_pattern_parameter_in_a_filter_is_checked_before_the_charge(proxy: RunningProxy):
    with proxy.connect(autocommit=True) as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT COUNT(*) FILTER (WHERE sex LIKE %s) FROM adult", ("Ma\\",))
        assert spent_epsilon(conn) == before
    assert "rule: safe-predicate" in (info.value.diag.message_primary or "")


def test_a_filter_in_a_window_is_refused_as_the_window_is(proxy: RunningProxy):
    with proxy.connect(autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT COUNT(*) FILTER (WHERE age > 40) OVER () FROM adult")
    assert info.value.diag.sqlstate == "DP001"


def test_a_prepared_filter_with_computed_values_is_described_then_folded_per_execution(proxy: RunningProxy,
                                                                                      admin: psycopg.Connection):
    (older,) = admin.execute("SELECT COUNT(*) FROM adult WHERE age > 40").fetchone() or (0,)
    sql = "SELECT COUNT(*) FILTER (WHERE age > %s + 0) AS a, AVG(CASE WHEN age > 30 + 10 THEN age END) AS b FROM adult"
    with proxy.connect(autocommit=True) as conn:
        for _ in range(2):
            cur = conn.execute(sql, (40,), prepare=True)
            row = cur.fetchone()
            assert [(c.name, c.type_code) for c in cur.description or []] == [("a", 20), ("b", 1700)]
            assert row is not None and abs(row[0] - older) < 100 and 45 < float(row[1]) < 55


def test_one_folded_filter_used_twice_is_one_released_column(proxy: RunningProxy):
    with proxy.connect(autocommit=True) as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        row = conn.execute("SELECT COUNT(*) FILTER (WHERE age > 30 + 10) * 2 - COUNT(*) FILTER (WHERE age > 30 + 10) "
                           "AS c FROM adult").fetchone()
    assert row is not None and notices and notices[0].count("filter (where") == 1, notices


@pytest.mark.parametrize("sql, type_name", [
    ("SELECT SUM(CAST(age > 40 AS BIGINT)) FROM adult", "bigint"),
    ("SELECT SUM((age > 40)::numeric) FROM adult", "numeric"),
    ("SELECT AVG(CAST(age > 40 AS SMALLINT)) FROM adult", "smallint"),
])
def test_a_condition_cast_to_a_type_postgresql_cannot_cast_a_boolean_to_fails_as_there_at_no_cost(
        proxy: RunningProxy, admin: psycopg.Connection, sql: str, type_name: str):
    with pytest.raises(psycopg.Error) as native:
        admin.execute(sql)
    admin.rollback()
    with proxy.connect(autocommit=True) as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
        assert spent_epsilon(conn) == before
    assert info.value.diag.sqlstate == native.value.diag.sqlstate == "42846"
    assert info.value.diag.message_primary == f"cannot cast type boolean to {type_name}"
    assert "CAST(p AS INT)" in (info.value.diag.message_hint or "")


# A protected table with a boolean column, and neighbours that each add one row (a NULL flag too).
_FLAGS_DDL = "(id int, age int, flag boolean)"
_FLAGS_ROWS = "SELECT g, 17 + g % 70, CASE WHEN g % 7 = 0 THEN NULL ELSE g % 3 = 0 END FROM generate_series(1, 3000) g"
_FLAG_NEIGHBOURS = {"flags1": "(9001, 90, true)", "flags2": "(9002, NULL, NULL)", "flags3": "(9003, 17, false)"}
_FLAGS_POLICY = ATTACK_POLICY_HEAD.replace("repeats: {{enabled: true}}", "repeats: {{enabled: false}}") + """
  public.flags0: &F
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      age: {{bounds: [17, 90]}}
""" + "".join(f"  public.{name}: *F\n" for name in _FLAG_NEIGHBOURS)


@pytest.fixture(scope="module")
def flags(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    create_neighbours(test_db.admin_dsn, "flags0", _FLAG_NEIGHBOURS, _FLAGS_DDL, _FLAGS_ROWS)
    with running_proxy(test_db, tmp_path_factory, _FLAGS_POLICY) as running:
        yield running


BOOLEAN_COLUMN = [
    ("SELECT COUNT(*) FROM {t} WHERE flag", "SELECT COUNT(*) FROM {t} WHERE flag"),
    ("SELECT COUNT(*) FROM {t} WHERE NOT flag", "SELECT COUNT(*) FROM {t} WHERE NOT flag"),
    ("SELECT COUNT(*) FROM {t} WHERE flag IS TRUE", "SELECT COUNT(*) FROM {t} WHERE flag"),
    ("SELECT COUNT(*) FROM {t} WHERE flag IS NOT FALSE", "SELECT COUNT(*) FROM {t} WHERE flag IS NOT FALSE"),
    ("SELECT COUNT(*) FROM {t} WHERE (age > 40) IS FALSE AND flag", "SELECT COUNT(*) FROM {t} WHERE age <= 40 AND flag"),
    ("SELECT COUNT(*) FILTER (WHERE flag) FROM {t}", "SELECT COUNT(*) FROM {t} WHERE flag"),
    ("SELECT SUM(CASE WHEN flag THEN 1 ELSE 0 END) FROM {t}", "SELECT COUNT(*) FROM {t} WHERE flag"),
    ("SELECT SUM(CASE WHEN NOT flag THEN age ELSE 0 END) FROM {t}", "SELECT SUM(age) FROM {t} WHERE NOT flag"),
    ("SELECT SUM(flag::int) FROM {t}", "SELECT COUNT(*) FROM {t} WHERE flag"),
    ("SELECT SUM(CAST(flag AS INTEGER)) FROM {t} WHERE age > 30", "SELECT COUNT(*) FROM {t} WHERE flag AND age > 30"),
    ("SELECT AVG(flag::int) FROM {t}", "SELECT AVG(flag::int) FROM {t}"),
    ("SELECT AVG(CASE WHEN flag THEN 1 ELSE 0 END) FROM {t}", "SELECT AVG(CASE WHEN flag THEN 1 ELSE 0 END) FROM {t}"),
    ("SELECT AVG(CASE WHEN flag IS TRUE THEN age END) FROM {t}", "SELECT AVG(age) FROM {t} WHERE flag"),
]


@pytest.mark.parametrize("sql, exact_sql", BOOLEAN_COLUMN, ids=[b[0][7:60] for b in BOOLEAN_COLUMN])
def test_a_boolean_column_is_a_condition_and_one_row_changes_only_the_noised_values(
        flags: RunningProxy, admin: psycopg.Connection, sql: str, exact_sql: str):
    """``WHERE b``, ``NOT b``, ``b IS TRUE``, ``SUM(b::int)``, ``AVG(b::int)``: reading a boolean
    cannot fail, so one row (a NULL flag too) changes nothing but the noised values."""
    (exact,) = admin.execute(exact_sql.replace("{t}", "flags0")).fetchone() or (None,)
    with flags.connect(autocommit=True) as conn:
        before = spent_epsilon(conn)
        answered = _simple(conn, sql.replace("{t}", "flags0"))
        assert spent_epsilon(conn) - before == pytest.approx(1.0)
        assert _shape(answered) == _shape(_simple(admin, sql.replace("{t}", "flags0")))
        value = answered.get_value(0, 0)
        assert value is not None and exact is not None
        assert abs(float(value) - float(exact)) <= (0.02 if float(exact) < 1 else 0.05 * float(exact) + 30)
        base = masked_outcome(conn, sql, "flags0")
        for name in _FLAG_NEIGHBOURS:
            assert masked_outcome(conn, sql, name) == base, name


def test_a_column_that_is_not_boolean_is_no_condition(flags: RunningProxy):
    with flags.connect(autocommit=True) as conn:
        for sql in ("SELECT COUNT(*) FROM flags0 WHERE age", "SELECT SUM(CASE WHEN id THEN 1 ELSE 0 END) FROM flags0",
                    "SELECT COUNT(*) FROM flags0 WHERE age IS TRUE"):
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql)
            assert "rule: safe-predicate" in (info.value.diag.message_primary or ""), sql
            assert "boolean" in (info.value.diag.message_hint or ""), sql
