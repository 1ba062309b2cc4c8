"""VARIANCE, VAR_SAMP, VAR_POP, STDDEV, STDDEV_SAMP and STDDEV_POP through dpproxy (mechanisms/variance.py):
answers near PostgreSQL's own on adult and on float and numeric columns, with a WHERE, a FILTER
and per cell of a GROUP BY; one charge, split as documented, the parts' scales in the notice;
PostgreSQL's result types and column names; repeats, COPY, cursors, the extended protocol and
binary results; neighbouring tables that differ by one adversarial row; refusals, uncharged.

Every accuracy assertion uses a bound that holds unless one of the noise draws behind it lands
beyond b·t with t = ln(1.5/p): for discrete Laplace of scale b ≥ 1 point, P(|X| > b·t) ≤
2e^-t/(1 + e^-1/b) ≤ 1.5·e^-t = p. p is chosen per test so that the test's assertions together
fail by chance with probability at most 1e-6 (the union bound over their draws).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pytest
from conftest import ATTACK_POLICY_HEAD, HISTOGRAM_POLICY, RunningProxy, TestDatabase, running_proxy, spent_epsilon

from proxy.demo.embedded import SERVICE_ROLE

NUMERIC, FLOAT8 = 1700, 701

# The documented split (docs/mechanisms.md), written out here rather than taken from the mechanism:
# ε_n : ε_S : ε_Q = 1 : 4^⅓ : 1.
_R = 4.0 ** (1.0 / 3.0)
SHARES = (1 / (2 + _R), _R / (2 + _R), 1 / (2 + _R))

_VALUES_POLICY = """
  public.var_values:
    access: protected
    epsilon: 1.0
    columns:
      x: {{bounds: [0, 100]}}
      r: {{bounds: [-1, 1]}}
      m: {{bounds: [0, 1000]}}
      g: {{categories: [a, b], group_by: true}}
      w: {{bounds: [0, 1e200]}}
"""
_NEIGHBOURS = ("null", "nan", "infinity", "minus_infinity", "above", "huge")
_ADVERSARIAL = {"null": "NULL, NULL, NULL", "nan": "'NaN', 'NaN', 50", "infinity": "'Infinity', 'Infinity', 50",
                "minus_infinity": "'-Infinity', '-Infinity', 50", "above": "1e300, 1e300, 2147483647",
                "huge": "1e308, " + "9" * 1000 + "." + "9" * 1000 + ", -2147483648"}
_NEIGHBOUR_POLICY = "".join(f"""
  public.var_nb_{name}:
    access: protected
    epsilon: 1.0
    columns:
      x: {{{{bounds: [0, 100]}}}}
      m: {{{{bounds: [0, 1000]}}}}
      i: {{{{bounds: [0, 100]}}}}
""" for name in ("base", *_NEIGHBOURS))
POLICY = HISTOGRAM_POLICY + _VALUES_POLICY + _NEIGHBOUR_POLICY

_TABLES = """
DROP TABLE IF EXISTS var_values;
CREATE TABLE var_values (x double precision, r real, m numeric, g text, w double precision);
INSERT INTO var_values
  SELECT ((i * 37) % 1000) / 10.0 + CASE WHEN i % 2 = 0 THEN 0 ELSE 3.5 END, sin(i), (i % 997) + 0.25,
         CASE WHEN i % 3 = 0 THEN 'a' ELSE 'b' END
  FROM generate_series(1, 60000) i;
INSERT INTO var_values VALUES (1e300, 'Infinity', 'NaN', 'a', 1), ('-Infinity', -5, 1e100, 'b', 2), (NULL, NULL, NULL, 'a', 3);
DROP TABLE IF EXISTS var_nb_base;
CREATE TABLE var_nb_base (x double precision, m numeric, i integer);
INSERT INTO var_nb_base SELECT i % 100, (i * 7) % 1000, i % 100 FROM generate_series(1, 50) i;
"""


@pytest.fixture(scope="module")
def vproxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A dpproxy over adult (sex a GROUP BY key), var_values and the neighbouring tables."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(_TABLES)
        for name in _NEIGHBOURS:
            conn.execute(f"DROP TABLE IF EXISTS var_nb_{name}")
            conn.execute(f"CREATE TABLE var_nb_{name} AS SELECT * FROM var_nb_base")
            conn.execute(f"INSERT INTO var_nb_{name} VALUES ({_ADVERSARIAL[name]})")
        tables = ", ".join(["var_values", "var_nb_base", *(f"var_nb_{name}" for name in _NEIGHBOURS)])
        conn.execute(f"GRANT SELECT ON {tables} TO {SERVICE_ROLE}")
    with running_proxy(test_db, tmp_path_factory, POLICY) as running:
        yield running


def _scales(h: float, epsilon: float) -> tuple[float, float, float]:
    """The three parts' documented Laplace scales: 1/ε_n, h/ε_S, h²/ε_Q."""
    return 1 / (epsilon * SHARES[0]), h / (epsilon * SHARES[1]), h * h / (epsilon * SHARES[2])


def _bound(kind: str, n: int, exact: float, h: float, epsilon: float, p: float) -> float:
    """|release − exact| stays within this unless one of the three draws exceeds b·ln(1.5/p).

    Population variance: (|e_Q| + 3h²|e_n| + 2h|e_S|)/ñ + ((|e_S| + h|e_n|)/ñ)² (|S/n| ≤ h, Q/n ≤ h²;
    the clamp only shrinks it). The sample forms scale it by m/(m − 1) and add h²·|1/(m−1) − 1/(n−1)|;
    a standard deviation's error is at most the variance's over √(its exact variance).
    """
    b_n, b_s, b_q = _scales(h * (1 + 1e-9), epsilon)  # a float grid's reach: at most a point beyond h
    t = math.log(1.5 / p)
    low = n - b_n * t
    assert low > 2
    bound = (b_q + 3 * h * h * b_n + 2 * h * b_s) * t / low + ((b_s + h * b_n) * t / low) ** 2
    if kind in ("var_samp", "stddev_samp"):
        bound = bound * low / (low - 1) + h * h * 2 * b_n * t / (low - 1) ** 2
    variance = exact**2 if kind.startswith("stddev") else exact
    return bound / math.sqrt(variance) if kind.startswith("stddev") else bound


def _exact(admin: psycopg.Connection, kind: str, column: str, lo: float, hi: float, table: str,
           where: str = "TRUE") -> tuple[float, int]:
    clamped = f"LEAST(GREATEST({column}::float8, {lo}), {hi})"
    row = admin.execute(f"SELECT {kind}({clamped}), count({column}) FROM {table} WHERE {where}").fetchone()
    assert row is not None
    return float(row[0]), int(row[1])


def _notices(conn: psycopg.Connection) -> list[str]:
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    return notices


def test_variances_of_an_integer_column_are_near_postgresql_s_with_a_where(vproxy: RunningProxy, admin) -> None:
    """Four columns of adult's age (bounds [17, 90], h = 36.5) over the women, ε/4 each; 12 draws,
    p = 1e-6/12 each."""
    kinds = ("var_pop", "var_samp", "stddev_pop", "stddev_samp")
    with vproxy.connect() as conn:
        row = conn.execute("SELECT var_pop(age), variance(age), stddev_pop(age), stddev(age) FROM adult "
                           "WHERE sex = 'Female'").fetchone()
    for kind, value in zip(kinds, row):
        exact, n = _exact(admin, kind, "age", 17, 90, "adult", "sex = 'Female'")
        assert isinstance(value, Decimal)
        assert abs(float(value) - exact) <= _bound(kind, n, exact, 36.5, 0.25, 1e-6 / 12), (kind, value, exact)


def test_variances_of_float_real_and_numeric_columns_are_near_postgresql_s_values_clamped(vproxy: RunningProxy,
                                                                                          admin) -> None:
    """var_values holds NaN, ±Infinity, NULL and values far outside the bounds: the release is of the
    clamped values, as the exact reference is. 9 draws, p = 1e-6/9."""
    cases = (("var_samp", "x", 0, 100), ("stddev_pop", "r", -1, 1), ("var_pop", "m", 0, 1000))
    with vproxy.connect() as conn:
        cursor = conn.execute("SELECT var_samp(x), stddev_pop(r), var_pop(m) FROM var_values")
        row = cursor.fetchone()
        assert cursor.description is not None
        assert [(d.name, d.type_code) for d in cursor.description] == [
            ("var_samp", FLOAT8), ("stddev_pop", FLOAT8), ("var_pop", NUMERIC)]
    for (kind, column, lo, hi), value in zip(cases, row):
        exact, n = _exact(admin, kind, column, lo, hi, "var_values")
        assert abs(float(value) - exact) <= _bound(kind, n, exact, (hi - lo) / 2, 1 / 3, 1e-6 / 9), (kind, value, exact)


def test_a_variance_per_cell_of_a_group_by_is_near_each_cell_s_and_the_cells_share_one_charge(
        vproxy: RunningProxy, admin) -> None:
    """Per cell the column gets its whole share (parallel composition): ε = 1 in each of the two cells,
    charged once. 2 cells × 3 draws, p = 1e-6/6; and a FILTER's condition, in the same query."""
    with vproxy.connect() as conn:
        before = spent_epsilon(conn)
        rows = conn.execute("SELECT g, var_pop(x) FROM var_values GROUP BY g ORDER BY g").fetchall()
        assert spent_epsilon(conn) - before == pytest.approx(1.0)
    assert [g for g, _ in rows] == ["a", "b"]
    for g, value in rows:
        exact, n = _exact(admin, "var_pop", "x", 0, 100, "var_values", f"g = '{g}'")
        assert abs(value - exact) <= _bound("var_pop", n, exact, 50, 1.0, 1e-6 / 6), (g, value, exact)


def test_a_conditional_stddev_is_the_stddev_over_the_rows_its_condition_holds_for(vproxy: RunningProxy, admin) -> None:
    """FILTER (WHERE …) and CASE WHEN … THEN col END are the aggregate over the rows where the condition
    holds. Two columns at ε/2, 6 draws, p = 1e-6/6."""
    with vproxy.connect() as conn:
        row = conn.execute("SELECT stddev(age) FILTER (WHERE sex = 'Male'), "
                           "stddev_pop(CASE WHEN sex = 'Male' THEN age END) FROM adult").fetchone()
    for kind, value in zip(("stddev_samp", "stddev_pop"), row):
        exact, n = _exact(admin, kind, "age", 17, 90, "adult", "sex = 'Male'")
        assert abs(float(value) - exact) <= _bound(kind, n, exact, 36.5, 0.5, 1e-6 / 6), (kind, value, exact)


def test_the_charge_is_the_query_s_epsilon_once_and_the_notice_gives_the_documented_scales(vproxy: RunningProxy) -> None:
    """stddev(age) beside count(*): ε = 1 split over two columns, the variance's half split 1 : 4^⅓ : 1
    over its count, centred sum (h = 36.5) and centred sum of squares (h² = 1332.25)."""
    with vproxy.connect() as conn:
        notices = _notices(conn)
        before = spent_epsilon(conn)
        conn.execute("SELECT stddev(age), count(*) FROM adult").fetchone()
        assert spent_epsilon(conn) - before == pytest.approx(1.0)
    (notice,) = [n for n in notices if "ε charged" in n]
    b_n, b_s, b_q = _scales(36.5, 0.5)
    expected = (f"stddev: noisy moments (count, centred sum, centred sum of squares), scales {b_n:.4g}, {b_s:.4g} "
                f"and {b_q:.4g} (95% within ±")
    assert "ε charged 1, δ 0;" in notice and expected in notice, (notice, expected)


def test_the_notice_of_a_group_by_gives_the_scales_of_every_cell(vproxy: RunningProxy) -> None:
    with vproxy.connect() as conn:
        notices = _notices(conn)
        conn.execute("SELECT g, stddev_pop(m) FROM var_values GROUP BY g").fetchall()
    (notice,) = [n for n in notices if "ε charged" in n]
    b_n, b_s, b_q = _scales(500, 1.0)
    assert f"scales {b_n:.4g}, {b_s:.4g} and {b_q:.4g} (its error shrinks as 1/n" in notice, notice


def _noise_of(notice: str, name: str) -> str:
    """The part of a notice that describes column ``name``'s noise, up to the next column's."""
    found = re.search(rf"(?:; |, ){re.escape(name)}: (.*?\))(?=, [a-z_ (*).]+: |; |$)", notice)
    assert found is not None, (name, notice)
    return found.group(1)


def _asked(proxy: RunningProxy, sql: str) -> tuple[list[tuple], list[tuple[str, int]], float, str]:
    """``sql``'s rows, its columns' names and types, the ε it cost (SHOW dpproxy.budget) and its notice."""
    with proxy.connect() as conn:
        notices = _notices(conn)
        before = spent_epsilon(conn)
        cursor = conn.execute(sql)
        rows = cursor.fetchall()
        assert cursor.description is not None
        columns = [(d.name, d.type_code) for d in cursor.description]
        spent = spent_epsilon(conn) - before
    (notice,) = [n for n in notices if "ε charged" in n]
    return rows, columns, spent, notice


def _moments_noise(epsilon: float, h: float = 36.5) -> str:
    b_n, b_s, b_q = _scales(h, epsilon)
    return (f"noisy moments (count, centred sum, centred sum of squares), scales {b_n:.4g}, {b_s:.4g} "
            f"and {b_q:.4g}")


def test_the_variance_family_of_one_column_is_one_release_with_the_whole_share_charged_once(
        vproxy: RunningProxy) -> None:
    """var_pop, var_samp, stddev_pop and stddev of age are computed from one draw of the moments at
    the query's whole ε (one release): the notice gives its scales at ε = 1 once and names the
    moments the others are computed from; SHOW dpproxy.budget shows ε = 1 spent."""
    _, _, spent, notice = _asked(vproxy, "SELECT var_pop(age), var_samp(age), stddev_pop(age), stddev(age) FROM adult")
    assert spent == pytest.approx(1.0) and "ε charged 1, δ 0;" in notice, notice
    assert _noise_of(notice, "var_pop").startswith(_moments_noise(1.0) + " (95% within ±"), notice
    for name in ("var_samp", "stddev_pop", "stddev"):
        assert _noise_of(notice, name).startswith("from var_pop's noisy moments, no more ε (95% within ±"), notice
    assert notice.count("scales") == 1, notice


def test_the_family_counts_as_one_column_in_the_split_with_other_aggregates(vproxy: RunningProxy) -> None:
    """var_pop(age), stddev(age) and count(*): two releases, ε/2 each (the count's Laplace scale 2);
    a standard deviation of another column is a release of its own (two again: age's, hours')."""
    with vproxy.connect() as conn:
        notices = _notices(conn)
        conn.execute("SELECT var_pop(age), stddev(age), count(*) FROM adult").fetchone()
        conn.execute("SELECT var_pop(age), stddev(age), stddev(hours_per_week) FROM adult").fetchone()
    first, second = [n for n in notices if "ε charged" in n]
    assert _noise_of(first, "var_pop").startswith(_moments_noise(0.5)), first
    assert _noise_of(first, "stddev").startswith("from var_pop's noisy moments"), first
    assert _noise_of(first, "count").startswith("laplace scale 2 "), first
    assert _noise_of(second, "var_pop").startswith(_moments_noise(0.5)), second
    assert second.count("from var_pop's noisy moments") == 1 and _moments_noise(0.5, 49.0) in second, second


def test_one_answer_s_variances_and_standard_deviations_are_consistent(vproxy: RunningProxy, admin) -> None:
    """From one set of noisy moments: stddev_pop² = var_pop, stddev_samp² = var_samp, and
    var_samp = var_pop·m/(m − 1) for one noisy count m (near n: within 12 of the count's scale
    1/(0.279ε) = 3.6, which a draw exceeds with probability below 1e-6)."""
    n = admin.execute("SELECT count(age) FROM adult").fetchone()[0]
    with vproxy.connect() as conn:
        var_pop, var_samp, stddev_pop, stddev_samp = (float(value) for value in conn.execute(
            "SELECT var_pop(age), variance(age), stddev_pop(age), stddev_samp(age) FROM adult").fetchone())
    assert stddev_pop**2 == pytest.approx(var_pop, rel=1e-12)
    assert stddev_samp**2 == pytest.approx(var_samp, rel=1e-12)
    m_minus_one = var_pop / (var_samp - var_pop)
    assert abs(m_minus_one - round(m_minus_one)) < 1e-3, m_minus_one
    assert abs(round(m_minus_one) + 1 - n) <= 12 * 3.6, (m_minus_one, n)


def test_a_family_per_cell_of_a_group_by_is_one_release_per_cell_and_consistent_in_each(vproxy: RunningProxy) -> None:
    rows, _, spent, notice = _asked(vproxy, "SELECT g, var_pop(x), stddev_pop(x), var_samp(x) FROM var_values "
                                            "GROUP BY g ORDER BY g")
    assert spent == pytest.approx(1.0) and notice.count("scales") == 1 and _moments_noise(1.0, 50) in notice, notice
    assert "stddev_pop(x): from var_pop(x)'s noisy moments, no more ε" in notice, notice
    for _, var_pop, stddev_pop, var_samp in rows:
        assert stddev_pop**2 == pytest.approx(var_pop, rel=1e-12)
        m_minus_one = var_pop / (var_samp - var_pop)
        assert abs(m_minus_one - round(m_minus_one)) < 1e-3, m_minus_one


@pytest.mark.parametrize("sql, releases", [
    # one condition, as FILTER and as CASE: one release
    ("SELECT var_pop(age) FILTER (WHERE sex = 'Male'), stddev_pop(CASE WHEN sex = 'Male' THEN age END) FROM adult", 1),
    # two conditions, or none and one: two releases
    ("SELECT var_pop(age) FILTER (WHERE sex = 'Male'), stddev_pop(age) FILTER (WHERE sex = 'Female') FROM adult", 2),
    ("SELECT var_pop(age), stddev_pop(age) FILTER (WHERE sex = 'Female') FROM adult", 2),
    ("SELECT var_pop(age) FILTER (WHERE age > 30), var_samp(age) FILTER (WHERE age >= 31) FROM adult", 2),
])
def test_a_family_is_one_release_only_under_one_condition(vproxy: RunningProxy, sql, releases) -> None:
    (row,), _, _, notice = _asked(vproxy, sql)
    assert notice.count(_moments_noise(1 / releases)) == releases, notice
    assert ("from " in notice) == (releases == 1), notice
    assert (float(row[1]) ** 2 == pytest.approx(float(row[0]), rel=1e-12)) == (releases == 1), row


def test_post_processed_variances_of_one_column_share_one_release(vproxy: RunningProxy) -> None:
    """An expression over var_pop and var_samp (HAVING-less post-processing): one release, so the
    ratio is m/(m − 1) for the noisy count m, and the charge the statement's ε."""
    with vproxy.connect() as conn:
        before = spent_epsilon(conn)
        (ratio,) = conn.execute("SELECT var_samp(age) / var_pop(age) FROM adult").fetchone()
        assert spent_epsilon(conn) - before == pytest.approx(1.0)
    m_minus_one = 1 / (float(ratio) - 1)
    assert abs(m_minus_one - round(m_minus_one)) < 1e-3 * m_minus_one / 1e3, ratio


def test_an_avg_beside_its_column_s_family_is_read_from_the_moments_and_near_postgresql_s(vproxy: RunningProxy,
                                                                                          admin) -> None:
    """avg(age) and stddev(age): one release at the whole ε, the AVG c + S̃·s/ñ of the moments
    drawn for the standard deviation, in AVG's type. Its error is at most (b_S + h·b_n)·t/(n − b_n·t)
    unless one of the two draws exceeds b·t, t = ln(1.5/p), p = 1e-6/2."""
    exact, n = admin.execute("SELECT avg(age)::float8, count(age) FROM adult").fetchone()
    ((mean, _),), columns, spent, notice = _asked(vproxy, "SELECT avg(age), stddev(age) FROM adult")
    assert spent == pytest.approx(1.0) and columns[0] == ("avg", NUMERIC)
    assert _noise_of(notice, "stddev").startswith(_moments_noise(1.0)), notice
    assert _noise_of(notice, "avg").startswith("from stddev's noisy moments, no more ε (95% within ±"), notice
    b_n, b_s, _ = _scales(36.5, 1.0)
    t = math.log(1.5 / 5e-7)
    assert abs(float(mean) - exact) <= (b_s + 36.5 * b_n) * t / (n - b_n * t), (mean, exact)


@pytest.mark.parametrize("sql, merged", [
    ("SELECT avg(age), var_pop(age), count(*) FROM adult", True),  # three releases apart: two
    ("SELECT count(*), var_pop(age), avg(age), sum(age) FROM adult", False),  # four apart: the AVG is its own
    ("SELECT avg(age) FILTER (WHERE sex = 'Male'), var_pop(age) FROM adult", False),  # another condition
    ("SELECT avg(hours_per_week), var_pop(age) FROM adult", False),  # another column (and sample_aggregate)
])
def test_an_avg_is_read_from_the_moments_only_under_their_condition_and_beside_at_most_two_other_releases(
        vproxy: RunningProxy, sql, merged) -> None:
    _, _, _, notice = _asked(vproxy, sql)
    releases = sql.count(",") if merged else sql.count(",") + 1
    assert _moments_noise(1 / releases) in notice, notice
    assert ("avg: from var_pop's noisy moments, no more ε" in notice) == merged, notice


def test_an_avg_per_cell_beside_its_family_is_one_release_per_cell(vproxy: RunningProxy) -> None:
    rows, _, _, notice = _asked(vproxy, "SELECT g, avg(x), stddev_pop(x) FROM var_values GROUP BY g ORDER BY g")
    assert _moments_noise(1.0, 50) in notice and "avg(x): from stddev_pop(x)'s noisy moments, no more ε" in notice
    assert all(0 <= mean <= 100 and isinstance(mean, float) for _, mean, _ in rows), rows


@pytest.mark.parametrize("binary", [False, True])
def test_a_family_s_columns_have_postgresql_s_types_in_text_and_binary(vproxy: RunningProxy, admin, binary) -> None:
    sql = ("SELECT var_samp(x), stddev(x), var_samp(r), stddev_pop(r), variance(m), stddev_pop(m) FROM var_values "
           "WHERE g = %s")
    with vproxy.connect() as conn:
        cursor = conn.execute(sql, ["a"], binary=binary)
        row = cursor.fetchone()
    expected = admin.execute(sql + " LIMIT 0", ["a"], binary=binary)
    assert cursor.description is not None and expected.description is not None
    assert [(d.name, d.type_code) for d in cursor.description] == [(d.name, d.type_code) for d in expected.description]
    assert [type(value) for value in row] == [float, float, float, float, Decimal, Decimal], row
    assert row[1] ** 2 == pytest.approx(row[0], rel=1e-12) and float(row[5]) > 0


@pytest.mark.parametrize("sql, names", [
    ("SELECT stddev(age), stddev_samp(age), stddev_pop(age), variance(age), var_samp(age), var_pop(age) FROM adult",
     ["stddev", "stddev_samp", "stddev_pop", "variance", "var_samp", "var_pop"]),
    ("SELECT variance(age) AS v, STDDEV(hours_per_week) FROM adult", ["v", "stddev"]),
    ("SELECT stddev(CAST(age AS double precision)) FROM adult", ["stddev"]),
])
def test_result_columns_are_named_and_typed_as_postgresql_names_and_types_them(vproxy: RunningProxy, admin, sql,
                                                                               names) -> None:
    with vproxy.connect() as conn:
        cursor = conn.execute(sql)
        cursor.fetchall()
    expected = admin.execute(sql.replace("FROM adult", "FROM adult LIMIT 0"))
    assert cursor.description is not None and expected.description is not None
    assert [(d.name, d.type_code) for d in cursor.description] == [(d.name, d.type_code) for d in expected.description]
    assert [d.name for d in cursor.description] == names


@pytest.mark.parametrize("sql, sqlstate, rule", [
    ("SELECT stddev(DISTINCT age) FROM adult", "DP001", "no-distinct"),
    ("SELECT variance(sex) FROM adult", "DP001", "aggregate-argument"),
    ("SELECT var_pop(fnlwgt) FROM adult", "DP001", "bounds-required"),
    ("SELECT stddev(age, hours_per_week) FROM adult", "DP001", "aggregate-argument"),
    ("SELECT var_samp() FROM adult", "DP001", "aggregate-argument"),
    ("SELECT stddev(age * 2) FROM adult", "DP001", "aggregate-argument"),
    ("SELECT stddev(interview_date) FROM adult", "DP001", "aggregate-argument"),
    ("SELECT stddev(CASE WHEN sex = 'Male' THEN age ELSE 0 END) FROM adult", "DP001", "aggregate-argument"),
    ("SELECT sex, stddev(fnlwgt) FROM adult GROUP BY sex", "DP001", "bounds-required"),
    # its variance could reach 5e399, beyond double precision: refused from the policy alone
    ("SELECT var_samp(w) FROM var_values", "DP001", "bounds-too-large"),
    ("SELECT count(*), stddev_pop(w) FROM var_values", "DP001", "bounds-too-large"),
])
def test_refused_variances_say_why_with_a_hint_and_charge_nothing(vproxy: RunningProxy, sql, sqlstate, rule) -> None:
    with vproxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql)
        assert refused.value.sqlstate == sqlstate, refused.value
        assert f"(rule: {rule})" in str(refused.value), refused.value
        assert refused.value.diag.message_hint, refused.value
        assert spent_epsilon(conn) == before


def test_copy_a_cursor_and_the_extended_protocol_with_binary_results_answer_as_a_plain_query(vproxy: RunningProxy) -> None:
    with vproxy.connect() as conn:
        with conn.cursor() as cursor:
            with cursor.copy("COPY (SELECT stddev(age), var_pop(age) FROM adult) TO STDOUT") as copy:
                lines = b"".join(bytes(chunk) for chunk in copy).decode().splitlines()
        (line,) = lines
        stddev, var_pop = (float(value) for value in line.split("\t"))
        assert 10 < stddev < 20 and 100 < var_pop < 400
        row = conn.execute("SELECT stddev_pop(x) FROM var_values WHERE g = %s", ["a"], prepare=True,
                           binary=True).fetchone()
        assert row is not None and isinstance(row[0], float) and 20 < row[0] < 40
        with conn.transaction():
            conn.execute("DECLARE c CURSOR FOR SELECT variance(age) FROM adult")
            (fetched,) = conn.execute("FETCH ALL FROM c").fetchall()
            assert isinstance(fetched[0], Decimal) and 100 < fetched[0] < 400


@pytest.mark.parametrize("neighbour", _NEIGHBOURS)
@pytest.mark.parametrize("sql", [
    "SELECT stddev(x), var_pop(m), variance(i) FROM {table}",
    "SELECT stddev_pop(x) FILTER (WHERE i > 40), var_samp(m) FROM {table} WHERE x > 10",
    "SELECT var_samp(x) FROM {table} WHERE i > 1000",  # no row matches, in either table
    # families of one column: one release each, beside a release of its own under another condition
    "SELECT var_pop(m), stddev_pop(m), stddev(m), variance(i) FILTER (WHERE x > 10), stddev(i) FILTER (WHERE x > 10), "
    "stddev(i) FROM {table}",
    # an AVG read from its family's moments, and one that is not (another condition)
    "SELECT avg(i), stddev_pop(i), avg(x) FILTER (WHERE i > 40) FROM {table}",
    "SELECT avg(x) FILTER (WHERE i < 40), var_samp(x) FILTER (WHERE i < 40) FROM {table} WHERE i > 1000",
])
def test_one_adversarial_row_changes_neither_the_outcome_nor_the_columns_nor_the_notice(vproxy: RunningProxy, neighbour,
                                                                                        sql) -> None:
    """NULL, NaN, ±Infinity, a value far above the bounds and a numeric of 2,000 digits: the
    neighbour answers as the base table does (no error, no NULL, the same types and notice but
    for its noisy numbers)."""
    seen = []
    for table in ("var_nb_base", f"var_nb_{neighbour}"):
        with vproxy.connect() as conn:
            notices = _notices(conn)
            cursor = conn.execute(sql.format(table=table))
            row = cursor.fetchone()
            assert cursor.description is not None
            masked = [re.sub(r"[0-9][0-9.e+-]*", "#", n).replace(table, "T") for n in notices]
            seen.append(([(d.name, d.type_code) for d in cursor.description], [v is None for v in row], masked))
            assert all(v is not None and math.isfinite(float(v)) and float(v) >= 0 for v in row), row
    assert seen[0] == seen[1]


@pytest.fixture(scope="module")
def rproxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A dpproxy with repeats on."""
    text = ATTACK_POLICY_HEAD + """
  public.adult:
    access: protected
    epsilon: 1.0
    columns:
      age: {{bounds: [17, 90]}}
"""
    with running_proxy(test_db, tmp_path_factory, text) as running:
        yield running


def test_stddev_and_stddev_samp_are_one_release_and_stddev_pop_another(rproxy: RunningProxy) -> None:
    """A repeat is free and gives the earlier noised value back, under the name asked now; the
    population and sample forms, and a variance and a standard deviation, are different releases."""
    with rproxy.connect() as conn:
        notices = _notices(conn)
        first = conn.execute("SELECT stddev(age) FROM adult").fetchone()[0]
        before = spent_epsilon(conn)
        cursor = conn.execute("SELECT stddev_samp(age) FROM adult")
        assert cursor.fetchone()[0] == first and cursor.description[0].name == "stddev_samp"
        assert spent_epsilon(conn) == before and "a repeat" in notices[-1]
        variance = conn.execute("SELECT variance(age) FROM adult").fetchone()[0]
        assert spent_epsilon(conn) == before + 1 and "a repeat" not in notices[-1]
        assert conn.execute("SELECT var_samp(age) FROM adult").fetchone()[0] == variance
        assert "a repeat" in notices[-1]
        for fresh in ("SELECT stddev_pop(age) FROM adult", "SELECT var_pop(age) FROM adult"):
            charged = spent_epsilon(conn)
            conn.execute(fresh).fetchone()
            assert spent_epsilon(conn) == charged + 1 and "a repeat" not in notices[-1], fresh
