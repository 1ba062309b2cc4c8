"""PERCENTILE_CONT and PERCENTILE_DISC through dpproxy and PostgreSQL: answers near the exact
percentile, types and names, the ε split and charge, histograms, repeats, COPY, cursors and
binary results, neighbouring tables with an adversarial row, and refusals before any charge.

Accuracy checks use the mechanism's own rank bound at a failure probability of 1e-8 per answer
(mechanisms/quantile.py: P[rank error > (2Δ/ε)(ln K + t)] ≤ e^-t, t = ln 1e8), each element of an
array form at its own ε/k; there are fewer than 100 of them, so together they fail by chance with
p < 1e-6.
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
from collections.abc import Iterator
from fractions import Fraction

import asyncpg
import psycopg
import pytest
from conftest import ATTACK_POLICY_HEAD, TEST_DATABASE, RunningProxy, TestDatabase, running_proxy, spent_epsilon

from mechanisms.quantile import quantile_error95
from proxy.dp.answer import selection_candidates
from proxy.serving import executor
from proxy.demo.embedded import SERVICE_ROLE
from rewriter.dp_query import plan_aggregate_query
from proxy.wire.values import encode_array_text, load_text
from rewriter.rewrite import backend_sql, split_cells, split_row
from rewriter.types import ARRAY_ELEMENTS

POLICY = ATTACK_POLICY_HEAD + """
  public.pct_adult: &adult
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      age: {{bounds: [17, 90]}}
      age_f: {{bounds: [17, 91]}}
      gain: {{bounds: [0, 100000]}}
      ratio_r: {{bounds: [-1, 1]}}
      amount_n: {{bounds: [0, 1000]}}
      sex: {{categories: [Male, Female], group_by: true}}
      note: {{categories: [a, b]}}
  public.pct_plus: *adult
"""

# An Adult-shaped table: age and a float age with a fraction from fnlwgt, capital gain, a real
# and a numeric column, and sex. pct_plus is a copy that each neighbour test gives one more row.
_TABLES = f"""
DROP TABLE IF EXISTS pct_adult, pct_plus;
CREATE TABLE pct_adult AS
  SELECT age, CAST(age AS double precision) + (fnlwgt % 100) / 100.0 AS age_f, capital_gain AS gain,
         CAST(((fnlwgt % 2001) - 1000) / 1000.0 AS real) AS ratio_r, CAST(hours_per_week * 10 AS numeric) AS amount_n,
         sex, CAST('a' AS text) AS note
  FROM adult;
CREATE TABLE pct_plus AS SELECT * FROM pct_adult;
GRANT SELECT ON pct_adult, pct_plus TO {SERVICE_ROLE};
"""


@pytest.fixture(scope="module")
def pproxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(_TABLES)
    with running_proxy(test_db, tmp_path_factory, POLICY) as running:
        yield running


def _answer(conn: psycopg.Connection, sql: str, binary: bool = False) -> tuple[tuple, list[int], list[str]]:
    """The first row of ``sql``'s answer, its columns' types and the notices it raised."""
    rows, types, notices = _answer_all(conn, sql, binary)
    return rows[0], types, notices


def _answer_all(conn: psycopg.Connection, sql: str, binary: bool = False) -> tuple[list[tuple], list[int], list[str]]:
    """Every row of ``sql``'s answer (in binary when ``binary``), its columns' types and the
    notices it raised."""
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    try:
        cur = conn.execute(sql, binary=binary)
        return cur.fetchall(), [d.type_code for d in cur.description], notices
    finally:
        conn._notice_handlers.clear()


def _rank_tolerance(epsilon: float, candidates: int, fraction: float) -> float:
    """Rows a release may be from the p rank with probability ≥ 1 − 1e-8."""
    return max(fraction, 1 - fraction) * 2 / epsilon * (math.log(candidates) + math.log(1e8))


def _assert_near(admin: psycopg.Connection, column: str, where: str, value: float, fraction: float,
                 epsilon: float, candidates: int, step: float, lo: float, hi: float) -> None:
    """``value`` is within the tolerance's rank of the exact p-quantile of the clamped values,
    up to half a grid step (a candidate stands for its cell)."""
    clamped = f"LEAST(GREATEST({column}, {lo}), {hi})"
    n = admin.execute(f"SELECT count({column}) FROM pct_adult {where}").fetchone()[0]
    slack = _rank_tolerance(epsilon, candidates, fraction) / n
    low, high = admin.execute(
        f"SELECT percentile_disc(%s) WITHIN GROUP (ORDER BY {clamped}), percentile_disc(%s) WITHIN GROUP "
        f"(ORDER BY {clamped}) FROM pct_adult {where}", (max(0.0, fraction - slack), min(1.0, fraction + slack))
    ).fetchone()
    assert float(low) - step / 2 - 1e-9 <= value <= float(high) + step / 2 + 1e-9, (value, low, high)


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("where", ["", "WHERE sex = 'Female'"])
@pytest.mark.parametrize(("column", "candidates", "step", "lo", "hi"), [
    ("age", 74, 1.0, 17, 90),  # every integer of the bounds
    ("age_f", 1000, 0.074, 17, 91),  # 1,000 cells of [17, 91]
    ("gain", 1000, 100.0, 0, 100000),  # an integer column too wide for its integers
])
def test_percentile_cont_lands_near_the_exact_percentile(pproxy: RunningProxy, admin: psycopg.Connection,
                                                         fraction: float, where: str, column: str, candidates: int,
                                                         step: float, lo: float, hi: float) -> None:
    with pproxy.connect() as conn:
        (value,), types, notices = _answer(
            conn, f"SELECT percentile_cont({fraction}) WITHIN GROUP (ORDER BY {column}) FROM pct_adult {where}")
    assert types == [701] and isinstance(value, float)
    _assert_near(admin, column, where, value, fraction, 1.0, candidates, step, lo, hi)
    bound = quantile_error95(1.0, candidates, Fraction(str(fraction)))
    assert f"exponential mechanism over {candidates} candidates {step:.4g} apart, 95% within {bound:.4g} rows" \
        in notices[0]


def test_percentile_disc_keeps_the_column_type_and_desc_reads_1_minus_p(pproxy: RunningProxy,
                                                                        admin: psycopg.Connection) -> None:
    with pproxy.connect() as conn:
        (age, total), types, _ = _answer(conn, "SELECT percentile_disc(0.9) WITHIN GROUP (ORDER BY age DESC), "
                                               "sum(gain) FROM pct_adult")
        assert types == [23, 20] and isinstance(age, int)
        _assert_near(admin, "age", "", age, 0.1, 0.5, 74, 1.0, 17, 90)  # DESC: the 10th percentile
        (ratio,), types, _ = _answer(conn, "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY ratio_r) FROM pct_adult")
        assert types == [700]
        _assert_near(admin, "ratio_r", "", ratio, 0.5, 1.0, 1000, 0.002, -1, 1)
        (amount,), types, _ = _answer(conn, "SELECT percentile_disc(0.25) WITHIN GROUP (ORDER BY amount_n) FILTER "
                                            "(WHERE sex = 'Male') AS a FROM pct_adult")
        assert types == [1700]
        _assert_near(admin, "amount_n", "WHERE sex = 'Male'", float(amount), 0.25, 1.0, 1000, 1.0, 0, 1000)
        names = [d.name for d in conn.execute(
            "SELECT percentile_disc(0.9) WITHIN GROUP (ORDER BY age), percentile_cont(0.5) WITHIN GROUP "
            "(ORDER BY age), percentile_cont(0.5) WITHIN GROUP (ORDER BY age) AS m FROM pct_adult").description]
    assert names == ["percentile_disc", "percentile_cont", "m"]  # as PostgreSQL names them


def test_several_fractions_share_the_query_epsilon_charged_once(pproxy: RunningProxy) -> None:
    with pproxy.connect() as conn:
        before = spent_epsilon(conn)
        _, _, notices = _answer(conn, "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY age), "
                                      "percentile_cont(0.9) WITHIN GROUP (ORDER BY age) FROM pct_adult WHERE age > 30")
        assert spent_epsilon(conn) == pytest.approx(before + 1.0)
    third = 1 / 3
    assert notices[0].startswith("dpproxy: ε charged 1, δ 0; ")
    assert f"95% within {quantile_error95(third, 74, Fraction(1, 2)):.4g} rows" in notices[0]
    assert f"95% within {quantile_error95(third, 74, Fraction(9, 10)):.4g} rows" in notices[0]


def test_a_histogram_answers_each_group_near_its_percentile_for_one_epsilon(pproxy: RunningProxy,
                                                                          admin: psycopg.Connection) -> None:
    with pproxy.connect() as conn:
        before = spent_epsilon(conn)
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        rows = conn.execute("SELECT sex, percentile_cont(0.5) WITHIN GROUP (ORDER BY age_f) AS median, count(*) "
                            "FROM pct_adult GROUP BY sex ORDER BY sex").fetchall()
        assert spent_epsilon(conn) == pytest.approx(before + 1.0)
    assert [row[0] for row in rows] == ["Female", "Male"]
    for sex, median, _ in rows:
        _assert_near(admin, "age_f", f"WHERE sex = '{sex}'", median, 0.5, 0.5, 1000, 0.074, 17, 91)
    assert "for 2 groups" in notices[0]
    assert "percentile_cont(0.5) within group (order by age_f): exponential mechanism over 1000 candidates" in notices[0]


def test_an_array_per_cell_answers_each_groups_quantiles_near_theirs_for_one_epsilon(
        pproxy: RunningProxy, admin: psycopg.Connection) -> None:
    """The array form per cell of a declared GROUP BY, as the single form: each cell's k choices
    at ε/k of the column's share, from the one backend query's counts; the cells are disjoint,
    so the statement costs its ε once (parallel composition)."""
    with pproxy.connect() as conn:
        before = spent_epsilon(conn)
        rows, types, notices = _answer_all(conn, "SELECT sex, count(*), percentile_cont(ARRAY[0.25, 0.5, 0.75]) "
                                                 "WITHIN GROUP (ORDER BY age_f) AS quartiles FROM pct_adult "
                                                 "GROUP BY sex ORDER BY sex")
        assert spent_epsilon(conn) == pytest.approx(before + 1.0)
    assert types == [25, 20, 1022] and [row[0] for row in rows] == ["Female", "Male"]
    each = 0.5 / 3  # the column's share of ε = 1 beside COUNT, split over the three fractions
    for sex, _, quartiles in rows:
        assert len(quartiles) == 3
        for quartile, fraction in zip(quartiles, (0.25, 0.5, 0.75)):
            _assert_near(admin, "age_f", f"WHERE sex = '{sex}'", quartile, fraction, each, 1000, 0.074, 17, 91)
    assert "for 2 groups" in notices[0]
    bounds = ", ".join(f"{quantile_error95(each, 1000, Fraction(f)):.4g} rows at {f}" for f in ("0.25", "0.5", "0.75"))
    assert (f"percentile_cont(array[0.25, 0.5, 0.75]) within group (order by age_f): exponential mechanism over "
            f"1000 candidates 0.074 apart, ε {each:.4g} for each of 3 fractions, 95% within each quantile's rank by "
            f"{bounds}") in notices[0]


def test_an_array_per_cell_is_sent_in_text_and_binary_read_by_a_subscript_and_counted_k_times(
        pproxy: RunningProxy, admin: psycopg.Connection) -> None:
    """Per cell, the array is one value of the column's array type whichever way the cells reach
    the client: straight (no outer statement), through an outer statement (ORDER BY, a subscript,
    HAVING), in binary. Its k choices per cell count k times against the release thread's cap."""
    grouped = "SELECT sex, percentile_disc(ARRAY[0.1, 0.9]) WITHIN GROUP (ORDER BY age) AS p FROM pct_adult GROUP BY sex"
    with pproxy.connect() as conn:
        before = spent_epsilon(conn)
        straight = conn.execute(grouped).fetchall()
        ordered = conn.execute(grouped + " ORDER BY sex DESC").fetchall()  # a repeat of the same release
        binary, binary_type = _raw(conn, grouped + " ORDER BY 1", binary=True, column=1)
        assert spent_epsilon(conn) == pytest.approx(before + 1.0)
        having = conn.execute("SELECT sex, percentile_disc(ARRAY[0.1, 0.9]) WITHIN GROUP (ORDER BY age) FROM pct_adult "
                              "WHERE age > 30 GROUP BY sex HAVING count(*) > 0 ORDER BY sex").fetchall()
        (high,) = conn.execute("SELECT (percentile_disc(ARRAY[0.1, 0.9]) WITHIN GROUP (ORDER BY age))[2] FROM pct_adult "
                               "WHERE sex = 'Female' GROUP BY sex").fetchone()
    assert sorted(straight) == sorted(ordered) and [row[0] for row in ordered] == ["Male", "Female"]
    assert all(len(p) == 2 and all(isinstance(v, int) and 17 <= v <= 90 for v in p) for _, p in straight)
    female = dict(straight)["Female"]
    expected, expected_type = _raw(admin, "SELECT $1::int4[]", [encode_array_text(female, 23)], binary=True)
    assert binary_type == expected_type == 1007 and binary == expected  # Female sorts first
    assert [row[0] for row in having] == ["Female", "Male"] and all(len(row[1]) == 2 for row in having)
    assert isinstance(high, int) and 17 <= high <= 90
    registry = pproxy.server.registry.by_oid.values()
    table = next(r for r in registry if r.name == "pct_adult")
    many = plan_aggregate_query("SELECT sex, percentile_cont(ARRAY[0.25, 0.5, 0.75]) WITHIN GROUP (ORDER BY age_f) "
                                "FROM pct_adult GROUP BY sex", table)
    one = plan_aggregate_query("SELECT sex, percentile_cont(0.5) WITHIN GROUP (ORDER BY age_f) FROM pct_adult "
                               "GROUP BY sex", table)
    assert selection_candidates(many) == 3 * selection_candidates(one) == 3 * 2 * 1000
    assert backend_sql(many, seed=0) == backend_sql(one, seed=0)  # one backend query, the same counts


def test_an_empty_filter_still_answers_a_grid_value_never_null(pproxy: RunningProxy) -> None:
    with pproxy.connect() as conn:
        for _ in range(20):
            (age,), _, _ = _answer(conn, "SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY age) FROM pct_adult "
                                         "WHERE age > 1000")
            (age_f,), _, _ = _answer(conn, "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age_f) FROM pct_adult "
                                           "WHERE age > 1000")
            assert isinstance(age, int) and 17 <= age <= 90
            assert 17 < age_f < 91 and ((age_f - 17) / 0.074 - 0.5) == pytest.approx(round((age_f - 17) / 0.074 - 0.5))


def test_a_repeat_is_the_same_answer_uncharged_but_another_fraction_is_not_a_repeat(pproxy: RunningProxy) -> None:
    # The backend SQL of every fraction of a column is the same (counts per grid index): the
    # repeat key must hold p, or the median's answer would come back for the 90th percentile.
    sql = "SELECT percentile_cont({}) WITHIN GROUP (ORDER BY gain) FROM pct_adult WHERE age BETWEEN 20 AND 29"
    with pproxy.connect() as conn:
        first = conn.execute(sql.format(0.5)).fetchone()
        spent = spent_epsilon(conn)
        assert conn.execute(sql.format(0.5)).fetchone() == first
        assert spent_epsilon(conn) == spent
        conn.execute(sql.format(0.99)).fetchone()
        assert spent_epsilon(conn) == pytest.approx(spent + 1.0)


def test_copy_a_cursor_and_binary_results_carry_the_percentile(pproxy: RunningProxy) -> None:
    sql = "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age) AS median FROM pct_adult WHERE sex = 'Male'"
    with pproxy.connect() as conn:
        with conn.cursor() as cur, cur.copy(f"COPY ({sql}) TO STDOUT") as copy:
            copied = b"".join(bytes(chunk) for chunk in copy)
        assert 17 <= float(copied) <= 90
        (binary,) = conn.cursor(binary=True).execute(sql.replace("0.5", "0.4")).fetchone()
        assert isinstance(binary, float) and 17 <= binary <= 90
    with pproxy.connect(autocommit=False) as conn:
        with conn.cursor(name="pct") as cur:
            cur.execute(sql.replace("0.5", "0.6"))
            (fetched,) = cur.fetchone()
        assert isinstance(fetched, float) and 17 <= fetched <= 90


# One adversarial row on each side of a neighbouring pair: NULL, NaN, ±Infinity, out of the
# bounds, huge; the answer must take the same path (columns, types, notice), and the backend's
# counts per grid index must differ by at most one row, on one index.
_ADVERSARIAL = [
    "(NULL, NULL, NULL, NULL, NULL, 'Male', 'a')",
    "(2147483647, 'NaN', 2147483647, 'NaN', 'NaN', 'Male', 'a')",
    "(-2147483648, 'Infinity', -2147483648, 'Infinity', 'Infinity', 'Female', 'a')",
    "(0, '-Infinity', 0, '-Infinity', '-Infinity', NULL, 'a')",
    "(91, 1e308, 100001, 3.4e38, 1e300, 'Female', 'a')",
    "(16, -1e308, -1, -3.4e38, -1e300, 'Female', 'a')",
    "(40, 5e-324, 7, 1e-45, 1e-400, 'Male', 'a')",
]
_NEIGHBOUR_QUERIES = [
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY {c}) FROM {t}",
    "SELECT percentile_disc(0.9) WITHIN GROUP (ORDER BY {c}) FILTER (WHERE sex = 'Female'), count(*) FROM {t}",
    "SELECT sex, percentile_cont(0.1) WITHIN GROUP (ORDER BY {c}) FROM {t} GROUP BY sex",
    "SELECT percentile_disc(ARRAY[0.1, 0.5, 0.9]) WITHIN GROUP (ORDER BY {c}), count(*) FROM {t}",
    "SELECT sex, percentile_cont(ARRAY[0.25, 0.75]) WITHIN GROUP (ORDER BY {c} DESC), count(*) FROM {t} GROUP BY sex",
]


@pytest.mark.parametrize("row", _ADVERSARIAL)
def test_an_adversarial_row_moves_one_grid_count_by_one_and_changes_no_outcome(
        pproxy: RunningProxy, admin: psycopg.Connection, row: str) -> None:
    admin.execute("TRUNCATE pct_plus; INSERT INTO pct_plus SELECT * FROM pct_adult")
    admin.execute(f"INSERT INTO pct_plus VALUES {row}")
    registry = pproxy.server.registry.by_oid.values()
    tables = {name: next(r for r in registry if r.name == name) for name in ("pct_adult", "pct_plus")}
    for column in ("age", "age_f", "gain", "ratio_r", "amount_n"):
        for query in _NEIGHBOUR_QUERIES:
            counts = []
            for name, table in tables.items():
                plan = plan_aggregate_query(query.format(c=column, t=name), table)
                rows = admin.execute(backend_sql(plan, seed=0)).fetchall()
                if not plan.groups:
                    (row,) = rows
                    counts.append([split_row(plan, row)[0][0]])  # the percentile's grid counts
                    continue
                # a key's cell is read from its text, as the backend prints it
                rows = [[str(v) if i == 0 and v is not None else v for i, v in enumerate(row)] for row in rows]
                counts.append([cell[0][0] for cell in split_cells(plan, rows)])
            moved = [(cell, i, b - a) for cell, (xs, ys) in enumerate(zip(*counts))
                     for i, (a, b) in enumerate(zip(xs, ys)) if a != b]
            assert len(moved) <= 1 and all(d == 1 for *_, d in moved), (column, query, moved)
            outcomes: list[list[object]] = [[], []]
            with pproxy.connect() as conn:
                for seen, name in zip(outcomes, tables):
                    # The array form in binary too, without ORDER BY: dpproxy encodes it, not an outer statement.
                    for order, binary in ((" ORDER BY 1", False), ("", True)) if "ARRAY" in query else ((" ORDER BY 1", False),):
                        result, types, notices = _answer(conn, query.format(c=column, t=name) + order, binary)
                        # Each column's noise; the cost differs when pct_adult's answer is a repeat.
                        noise = re.sub(r"; remaining ε .*", "", notices[0].split("; ", 1)[1])
                        seen.append((types, len(result), noise))
            assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize("row", _ADVERSARIAL)
def test_a_fraction_bound_as_a_parameter_has_the_same_outcome_on_neighbouring_tables(
        pproxy: RunningProxy, admin: psycopg.Connection, row: str) -> None:
    """``percentile_cont($1)``: the value is read before the charge, the statement's alone, so an
    adversarial row changes neither an answer's type and notice nor a refusal's SQLSTATE, in text
    or binary parameters."""
    admin.execute("TRUNCATE pct_plus; INSERT INTO pct_plus SELECT * FROM pct_adult")
    admin.execute(f"INSERT INTO pct_plus VALUES {row}")
    outcomes: dict[str, list[object]] = {"pct_adult": [], "pct_plus": []}
    with pproxy.connect() as conn:
        for table, seen in outcomes.items():
            for column in ("age", "gain"):
                for value, binary in ((0.5, False), (0.25, True), (1.5, False), ("abc", False)):
                    notices: list[str] = []
                    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
                    try:
                        cur = conn.execute(f"SELECT percentile_cont(%s) WITHIN GROUP (ORDER BY {column}) FROM {table}",
                                           (value,), binary=binary)
                        rows = cur.fetchall()
                        noise = re.sub(r"; remaining ε .*", "", notices[0].split("; ", 1)[1])
                        seen.append(("answer", [d.type_code for d in cur.description or ()], len(rows), noise))
                    except psycopg.Error as exc:
                        seen.append(("error", exc.sqlstate))
                    finally:
                        conn._notice_handlers.clear()
    assert outcomes["pct_adult"] == outcomes["pct_plus"]
    assert [o[0] for o in outcomes["pct_adult"]] == ["answer", "answer", "error", "error"] * 2


@pytest.mark.parametrize(("sql", "sqlstate", "rule"), [
    ("SELECT percentile_cont(1.5) WITHIN GROUP (ORDER BY age) FROM pct_adult", "22003", "aggregate-argument"),
    ("SELECT percentile_disc(-0.1) WITHIN GROUP (ORDER BY age) FROM pct_adult", "22003", "aggregate-argument"),
    ("SELECT percentile_cont(NULL) WITHIN GROUP (ORDER BY age) FROM pct_adult", "DP001", "aggregate-argument"),
    ("SELECT percentile_cont(ARRAY[0.25, NULL]) WITHIN GROUP (ORDER BY age) FROM pct_adult", "DP001",
     "aggregate-argument"),
    ("SELECT percentile_cont('{0.25,NULL}'::float8[]) WITHIN GROUP (ORDER BY age) FROM pct_adult", "DP001",
     "aggregate-argument"),
    ("SELECT percentile_cont(ARRAY[]::float8[]) WITHIN GROUP (ORDER BY age) FROM pct_adult", "DP001",
     "aggregate-argument"),
    ("SELECT percentile_disc('{}'::float8[]) WITHIN GROUP (ORDER BY age) FROM pct_adult", "DP001",
     "aggregate-argument"),
    ("SELECT percentile_cont(ARRAY[" + ", ".join(["0.5"] * 21) + "]) WITHIN GROUP (ORDER BY age) FROM pct_adult",
     "DP001", "aggregate-argument"),
    ("SELECT percentile_cont(ARRAY[0.25, 1.5]) WITHIN GROUP (ORDER BY age) FROM pct_adult", "22003",
     "aggregate-argument"),
    ("SELECT percentile_cont('{0.25,2}'::float8[]) WITHIN GROUP (ORDER BY age) FROM pct_adult", "22003",
     "aggregate-argument"),
    ("SELECT percentile_cont(ARRAY[0.25, 0.5 + 0.1]) WITHIN GROUP (ORDER BY age) FROM pct_adult", "DP001",
     "aggregate-argument"),
    ("SELECT percentile_cont('{{0.25},{0.5}}'::float8[]) WITHIN GROUP (ORDER BY age) FROM pct_adult", "DP001",
     "aggregate-argument"),
    ("SELECT percentile_cont(ARRAY[0.25]::text[]) WITHIN GROUP (ORDER BY age) FROM pct_adult", "DP001",
     "aggregate-argument"),
    ("SELECT percentile_cont(ARRAY[0.5]) WITHIN GROUP (ORDER BY age), percentile_cont(0.5) WITHIN GROUP "
     "(ORDER BY gain) FROM pct_adult", "DP001", "aggregate-combination"),
    ("SELECT percentile_cont(0.5 + 0.1) WITHIN GROUP (ORDER BY age) FROM pct_adult", "DP001", "aggregate-argument"),
    ("SELECT percentile_cont(1e-1000) WITHIN GROUP (ORDER BY age) FROM pct_adult", "22003", "aggregate-argument"),
    ("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age, gain) FROM pct_adult", "DP001", "aggregate-argument"),
    ("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY sex) FROM pct_adult", "DP001", "aggregate-argument"),
    ("SELECT percentile_disc(0.5) WITHIN GROUP (ORDER BY note) FROM pct_adult", "DP001", "aggregate-argument"),
    ("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age + 1) FROM pct_adult", "DP001", "aggregate-argument"),
    ("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age), percentile_cont(0.5) WITHIN GROUP (ORDER BY gain) "
     "FROM pct_adult", "DP001", "aggregate-combination"),
    ("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age), max(gain) FROM pct_adult", "DP001",
     "aggregate-combination"),
    ("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age), count(DISTINCT sex) FROM pct_adult", "DP001",
     "aggregate-combination"),
])
def test_refused_percentiles_say_why_and_cost_nothing(pproxy: RunningProxy, sql: str, sqlstate: str, rule: str) -> None:
    with pproxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
        assert spent_epsilon(conn) == before
    assert info.value.sqlstate == sqlstate and f"(rule: {rule})" in info.value.diag.message_primary
    assert info.value.diag.message_hint



def test_an_unbounded_column_is_refused_before_the_charge(proxy: RunningProxy) -> None:
    with proxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as unbounded:
            conn.execute("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY fnlwgt) FROM adult")
        assert spent_epsilon(conn) == before
    assert "(rule: bounds-required)" in unbounded.value.diag.message_primary


_BOUND = "SELECT percentile_cont(%s) WITHIN GROUP (ORDER BY age) FROM pct_adult WHERE age > 25"


@pytest.mark.parametrize("binary", [False, True])
def test_a_fraction_bound_as_a_parameter_is_read_before_the_charge_and_keys_the_repeat(
        pproxy: RunningProxy, admin: psycopg.Connection, binary: bool) -> None:
    # What a driver that binds literals sends: the value is the statement's, read as a literal's.
    sql = (_BOUND.replace("%s", "%b") if binary else _BOUND).replace("age > 25", f"age > {25 + binary}")
    where = f"WHERE age > {25 + binary}"
    with pproxy.connect() as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        spent = spent_epsilon(conn)
        cur = conn.execute(sql, (0.25,), prepare=True)
        (first,) = cur.fetchone()
        assert [d.type_code for d in cur.description] == [701] and spent_epsilon(conn) == pytest.approx(spent + 1)
        _assert_near(admin, "age", where, first, 0.25, 1.0, 74, 1.0, 17, 90)
        bound = quantile_error95(1.0, 74, Fraction(1, 4))
        assert f"exponential mechanism over 74 candidates 1 apart, 95% within {bound:.4g} rows" in notices[0]
        assert conn.execute(sql, (0.25,), prepare=True).fetchone() == (first,)  # a repeat, uncharged
        assert spent_epsilon(conn) == pytest.approx(spent + 1)
        (other,) = conn.execute(sql, (0.75,), prepare=True).fetchone()  # another fraction: not a repeat
        assert spent_epsilon(conn) == pytest.approx(spent + 2)
        _assert_near(admin, "age", where, other, 0.75, 1.0, 74, 1.0, 17, 90)
        # DESC reads it as 1 - p, as for a literal.
        (desc,) = conn.execute(sql.replace("age) FROM", "age DESC) FROM"), (0.75,), prepare=True).fetchone()
        _assert_near(admin, "age", where, desc, 0.25, 1.0, 74, 1.0, 17, 90)


def test_a_fraction_parameter_is_described_as_double_precision(pproxy: RunningProxy) -> None:
    async def described() -> tuple[list[str], list[str]]:
        conn = await asyncpg.connect(host=pproxy.host, port=pproxy.port, user="analyst", password="analyst",
                                     database=TEST_DATABASE)
        try:  # asyncpg's Parse leaves every parameter's type to the server
            statement = await conn.prepare("SELECT percentile_disc($1) WITHIN GROUP (ORDER BY age) FROM pct_adult "
                                           "WHERE age > $2")
            return [t.name for t in statement.get_parameters()], [a.type.name for a in statement.get_attributes()]
        finally:
            await conn.close()

    # As PostgreSQL infers them: the fraction a double, the comparison's the column's type.
    assert asyncio.run(described()) == (["float8", "int4"], ["int4"])


@pytest.mark.parametrize(("value", "sqlstate", "message"), [
    (None, "DP001", "percentile_cont(NULL) is not answered"),
    ("1.5", "22003", "percentile value 1.5 is not between 0 and 1"),
    ("NaN", "22003", "percentile value NaN is not between 0 and 1"),
    ("-Infinity", "22003", "is not between 0 and 1"),
    ("1e-400", "22003", "is out of range for type double precision"),
    ("abc", "22P02", 'invalid input syntax for type double precision: "abc"'),
    ("0.123456789012345678901", "DP001", "more than 20 decimal places"),
])
def test_a_bad_fraction_parameter_is_refused_as_postgresql_would_before_the_charge(
        pproxy: RunningProxy, value: str | None, sqlstate: str, message: str) -> None:
    with pproxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as info:
            conn.execute(_BOUND.replace("%s", "%s::float8"), (value,), prepare=True)
        assert spent_epsilon(conn) == before
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert info.value.sqlstate == sqlstate and message in info.value.diag.message_primary, info.value


@pytest.mark.parametrize(("sql", "params", "message"), [
    ("ARRAY[%s, %s]", (0.25, 0.75), "of an array with a bound parameter as a fraction"),
    ("ARRAY[%b, %b]", (0.25, 0.75), "of an array with a bound parameter as a fraction"),  # binary values
    ("ARRAY[%s::float8, 0.5]", (0.25,), "of an array with a bound parameter as a fraction"),
    ("ARRAY[0.25, %s, 0.75]", ("0.5",), "of an array with a bound parameter as a fraction"),
    ("%s", ([0.25, 0.75],), "with an array of fractions as the parameter"),  # psycopg binds a list as float8[]
    ("%b", ([0.25, 0.75],), "with an array of fractions as the parameter"),
])
def test_fractions_bound_as_parameters_of_an_array_are_refused_before_the_charge_with_what_to_send(
        pproxy: RunningProxy, sql: str, params: tuple[object, ...], message: str) -> None:
    """``ARRAY[$1, $2]`` and a list bound to ``$1``: refused from the statement and its parameter
    types, before any charge, with a hint naming the forms that are answered."""
    statement = f"SELECT percentile_cont({sql}) WITHIN GROUP (ORDER BY age) FROM pct_adult"
    with pproxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as info:
            conn.execute(statement, params, prepare=True)
        assert spent_epsilon(conn) == before
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert info.value.sqlstate == "DP001" and message in info.value.diag.message_primary, info.value
    assert "(rule: aggregate-argument)" in info.value.diag.message_primary
    hint = info.value.diag.message_hint or ""
    assert "percentile_cont(ARRAY[0.25, 0.5, 0.75]) WITHIN GROUP (ORDER BY col)" in hint and "of its own" in hint


@pytest.mark.parametrize(("literal", "sqlstate", "message"), [
    ("1e-400", "22003", "is out of range for type double precision"),
    ("1e400", "22003", "is out of range for type double precision"),
    ("1e-30", "DP001", "more than 20 decimal places"),
    ("'{0.25,abc}'::float8[]", "22P02", 'invalid input syntax for type double precision: "abc"'),
    ("'{0.25,1e400}'::float8[]", "22003", "is out of range for type double precision"),
])
def test_a_fraction_literal_out_of_doubles_range_or_unreadable_fails_as_in_postgresql(
        pproxy: RunningProxy, admin: psycopg.Connection, literal: str, sqlstate: str, message: str) -> None:
    sql = f"SELECT percentile_cont({literal}) WITHIN GROUP (ORDER BY age) FROM pct_adult"
    if sqlstate != "DP001":
        with pytest.raises(psycopg.Error) as postgres:
            admin.execute(sql)
        assert postgres.value.sqlstate == sqlstate and message in postgres.value.diag.message_primary
    with pproxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
        assert spent_epsilon(conn) == before
    assert info.value.sqlstate == sqlstate and message in info.value.diag.message_primary, info.value


def test_a_release_drawing_over_many_candidates_runs_off_the_event_loop(
        pproxy: RunningProxy, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # OpenDP's draw takes ~1.4 ms per 1,000 candidates (~5 ms padded): on the event loop, a percentile
    # over a grid of 100,000 in each cell of a histogram held every other session ~0.16 s a cell.
    # A small release stays on the loop (a thread hop would cost every COUNT).
    threads: list[tuple[str, str]] = []
    for name in ("release_row", "release_cells"):
        real = getattr(executor, name)

        def recording(*args: object, _real=real, _name=name) -> object:
            threads.append((_name, threading.current_thread().name))
            return _real(*args)

        monkeypatch.setattr(executor, name, recording)
    # a grid of 100,000 in each cell: up to one hashed group a row, which the table's sort bound weighs
    # beside its rows (rewriter/sort_memory.py _table_groups): 308 MB, above the default 256
    fine = POLICY.replace("    epsilon: 1.0\n    delta: 1.0e-6\n",
                          "    epsilon: 1.0\n    delta: 1.0e-6\n    quantile_cells: 100000\n    max_sort_memory_mb: 512\n")
    assert fine != POLICY
    with running_proxy(test_db, tmp_path_factory, fine) as proxy, proxy.connect() as conn:
        (value,) = conn.execute("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY gain) FROM pct_adult").fetchone()
        rows = conn.execute("SELECT sex, percentile_disc(0.5) WITHIN GROUP (ORDER BY gain) FROM pct_adult "
                            "GROUP BY sex").fetchall()
        small = conn.execute("SELECT sex, percentile_cont(0.5) WITHIN GROUP (ORDER BY age) FROM pct_adult "
                             "GROUP BY sex").fetchall()
    assert 0 <= value <= 100000 and len(rows) == 2 and len(small) == 2
    assert [name for name, _ in threads] == ["release_row", "release_cells", "release_cells"]
    assert threads[0][1].startswith("dpproxy-release") and threads[1][1].startswith("dpproxy-release")
    assert threads[2][1] == "dpproxy"  # the proxy's event-loop thread (conftest.RunningProxy)


_MODES = 1000  # a MODE's categories: 20 cells of them make 20,000 candidates, a release in a thread


def test_the_backend_counts_of_a_release_over_many_candidates_are_loaded_off_the_event_loop(
        pproxy: RunningProxy, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    # A percentile per cell over a grid of 100,000 makes the backend return one row per cell and
    # grid index the rows reach, a MODE one count per cell and category: read and loaded on the
    # event loop, ~200,000 rows of a percentile by sex over 400,000 rows held every other session
    # ~0.5 s. They are read and loaded where the release draws, as the collected counts of an
    # ungrouped percentile are; a small release's stay on the loop.
    loads: dict[str, set[str]] = {}
    statement = ""
    real = executor.load_text

    def recording(value: bytes | None, type_oid: int) -> object:
        loads.setdefault(statement, set()).add(threading.current_thread().name)
        return real(value, type_oid)

    monkeypatch.setattr(executor, "load_text", recording)
    categories = ", ".join(f"m{i}" for i in range(_MODES))
    policy = POLICY.replace("    epsilon: 1.0\n    delta: 1.0e-6\n",  # max_sort_memory_mb: as above
                            "    epsilon: 1.0\n    delta: 1.0e-6\n    quantile_cells: 100000\n    max_sort_memory_mb: 512\n",
                            1) + f"""
  public.pct_modes:
    epsilon: 1.0
    columns:
      k: {{{{bounds: [0, 19], group_by: true}}}}
      m: {{{{categories: [{categories}]}}}}
"""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS pct_modes")
        admin.execute(f"CREATE TABLE pct_modes AS SELECT i % 20 AS k, 'm' || (i % {_MODES}) AS m "
                      "FROM generate_series(1, 5000) AS i")
        admin.execute(f"GRANT SELECT ON pct_modes TO {SERVICE_ROLE}")
    statements = {
        "percentile": "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age_f) FROM pct_adult",
        "percentile by sex": "SELECT sex, percentile_cont(0.5) WITHIN GROUP (ORDER BY age_f), count(*) "
                             "FROM pct_adult GROUP BY sex",
        "mode by k": "SELECT k, mode() WITHIN GROUP (ORDER BY m) FROM pct_modes GROUP BY k",
        "mode": "SELECT mode() WITHIN GROUP (ORDER BY m) FROM pct_modes",
        "percentile by sex, small": "SELECT sex, percentile_cont(0.5) WITHIN GROUP (ORDER BY age) FROM pct_adult "
                                    "GROUP BY sex",
    }
    with running_proxy(test_db, tmp_path_factory, policy) as proxy, proxy.connect() as conn:
        for statement, sql in statements.items():
            rows = conn.execute(sql).fetchall()
            assert len(rows) == {"percentile by sex": 2, "percentile by sex, small": 2, "mode by k": 20}.get(
                statement, 1)
    release = {name: all(thread.startswith("dpproxy-release") for thread in threads)
               for name, threads in loads.items()}
    assert release == {"percentile": True, "percentile by sex": True, "mode by k": True,
                       "mode": False, "percentile by sex, small": False}, loads
    assert loads["mode"] == loads["percentile by sex, small"] == {"dpproxy"}  # the event loop's thread

# The array form: k fractions from one set of grid counts, at ε/k each of the column's share.
_QUARTILES = "percentile_cont(ARRAY[0.25, 0.5, 0.75]) WITHIN GROUP (ORDER BY {c})"


@pytest.mark.parametrize(("column", "candidates", "step", "lo", "hi"), [
    ("age", 74, 1.0, 17, 90), ("age_f", 1000, 0.074, 17, 91), ("gain", 1000, 100.0, 0, 100000),
])
def test_an_array_of_fractions_lands_each_near_its_quantile_charged_once_and_split_k_ways(
        pproxy: RunningProxy, admin: psycopg.Connection, column: str, candidates: int, step: float, lo: float,
        hi: float) -> None:
    where = "WHERE sex = 'Female'"
    with pproxy.connect() as conn:
        before = spent_epsilon(conn)
        (count, quartiles), types, notices = _answer(
            conn, f"SELECT count(*), {_QUARTILES.format(c=column)} FROM pct_adult {where}")
        assert spent_epsilon(conn) == pytest.approx(before + 1.0)  # once, for both columns
    assert types == [20, 1022] and isinstance(count, int)
    assert len(quartiles) == 3 and all(isinstance(q, float) for q in quartiles)
    each = 0.5 / 3  # the column's share of ε = 1 beside COUNT, split over the three fractions
    for quartile, fraction in zip(quartiles, (0.25, 0.5, 0.75)):
        _assert_near(admin, column, where, quartile, fraction, each, candidates, step, lo, hi)
    bounds = ", ".join(f"{quantile_error95(each, candidates, Fraction(f)):.4g} rows at {f}"
                       for f in ("0.25", "0.5", "0.75"))
    assert (f"percentile_cont: exponential mechanism over {candidates} candidates {step:.4g} apart, "
            f"ε {each:.4g} for each of 3 fractions, 95% within each quantile's rank by {bounds}") in notices[0]
    assert notices[0].startswith("dpproxy: ε charged 1, δ 0; count: laplace")


def test_the_array_form_reads_the_same_backend_counts_once_as_one_fraction_does(pproxy: RunningProxy) -> None:
    registry = pproxy.server.registry.by_oid.values()
    table = next(r for r in registry if r.name == "pct_adult")
    many = plan_aggregate_query("SELECT " + _QUARTILES.format(c="age") + " FROM pct_adult WHERE age > 30", table)
    one = plan_aggregate_query("SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age) FROM pct_adult "
                               "WHERE age > 30", table)
    assert backend_sql(many, seed=0) == backend_sql(one, seed=0)
    assert many.aggregates[0].fractions == (Fraction(1, 4), Fraction(1, 2), Fraction(3, 4))
    desc = plan_aggregate_query("SELECT percentile_disc('{0.1, \"0.25\"}'::float8[]) WITHIN GROUP "
                                "(ORDER BY age DESC) FROM pct_adult", table)
    assert desc.aggregates[0].fractions == (Fraction(9, 10), Fraction(3, 4))  # DESC reads each as 1 - p


@pytest.mark.parametrize(("kind", "column", "fractions"), [
    ("percentile_cont", "age", "ARRAY[0.25, 0.5, 0.75]"),
    ("percentile_cont", "age_f", "'{0.1,0.5,0.9}'::float8[]"),
    ("percentile_disc", "age", "ARRAY[0.25, 0.5, 0.75]"),
    ("percentile_disc", "gain", "ARRAY[0, 0.5, 1]"),
    ("percentile_disc", "ratio_r", "ARRAY[0.1, 0.9]"),
    ("percentile_disc", "amount_n", "'{0.25,0.75}'::numeric[]"),
])
def test_the_array_forms_type_and_text_are_postgresqls(pproxy: RunningProxy, admin: psycopg.Connection, kind: str,
                                                      column: str, fractions: str) -> None:
    sql = f"SELECT {kind}({fractions}) WITHIN GROUP (ORDER BY {column}) FROM pct_adult"
    exact = admin.execute(sql)
    (exact_value,) = exact.fetchone()
    exact_type = exact.description[0].type_code
    (exact_text,) = admin.execute(f"SELECT CAST(({sql}) AS text)").fetchone()
    with pproxy.connect() as conn:
        cur = conn.execute(sql)
        (released,) = cur.fetchone()
        assert cur.description[0].type_code == exact_type and cur.description[0].name == kind
        with conn.cursor() as copying, copying.copy(f"COPY ({sql}) TO STDOUT") as copy:
            copied = b"".join(bytes(chunk) for chunk in copy).decode()
    assert type(released[0]) is type(exact_value[0]) and len(released) == len(exact_value)
    # dpproxy prints the exact data's quantiles as PostgreSQL prints them, and its own as it would.
    element = ARRAY_ELEMENTS[exact_type]
    assert encode_array_text([load_text(v.encode(), element) for v in exact_text[1:-1].split(",")],
                             element).decode() == exact_text
    assert copied == encode_array_text(released, element).decode() + "\n"
    assert re.fullmatch(r"\{[-0-9.e]+(,[-0-9.e]+)*\}", copied.strip())


def _raw(conn: psycopg.Connection, sql: str, params: list[bytes] | None = None, binary: bool = False,
         column: int = 0) -> tuple[bytes, int]:
    """The value in ``column`` of ``sql``'s first row as the server sent it (text, or binary when
    asked), and its type, through the extended protocol (Parse, Bind with the result format, Execute)."""
    result = conn.pgconn.exec_params(sql.encode(), params or [], result_format=int(binary))
    assert result.status == psycopg.pq.ExecStatus.TUPLES_OK, result.error_message
    value = result.get_value(0, column)
    assert value is not None
    return value, result.ftype(column)


_ARRAY_CASES = [  # kind, column, fractions: one of each array type a percentile of pct_adult answers
    ("percentile_cont", "age", "ARRAY[0.25, 0.5, 0.75]"),  # float8[]
    ("percentile_disc", "age", "ARRAY[0.1, 0.5, 0.9]"),  # int4[]
    ("percentile_disc", "ratio_r", "ARRAY[0.1, 0.9]"),  # float4[]
    ("percentile_disc", "amount_n", "'{0.25,0.75}'::numeric[]"),  # numeric[]
]


@pytest.mark.parametrize(("kind", "column", "fractions"), _ARRAY_CASES)
def test_the_array_form_in_binary_is_postgresqls_array_send_of_the_same_release_as_text(
        pproxy: RunningProxy, admin: psycopg.Connection, kind: str, column: str, fractions: str) -> None:
    """A binary result of the array form is what PostgreSQL itself sends for the array the text
    answer printed, byte for byte (a repeat: the same release, charged once)."""
    sql = f"SELECT {kind}({fractions}) WITHIN GROUP (ORDER BY {column}) FROM pct_adult WHERE sex = 'Male'"
    with pproxy.connect() as conn:
        before = spent_epsilon(conn)
        text, text_type = _raw(conn, sql)
        binary, binary_type = _raw(conn, sql, binary=True)
        (decoded,) = conn.cursor(binary=True).execute(sql).fetchone()
        assert spent_epsilon(conn) == pytest.approx(before + 1.0)
    type_name = admin.execute("SELECT %s::regtype::text", (text_type,)).fetchone()[0]
    expected, expected_type = _raw(admin, f"SELECT $1::{type_name}", [text], binary=True)
    assert text_type == binary_type == expected_type
    assert binary == expected
    element = ARRAY_ELEMENTS[text_type]
    assert encode_array_text(decoded, element) == text


def test_asyncpg_fetches_the_array_form_as_a_list_equal_to_the_text_answer(pproxy: RunningProxy) -> None:
    """asyncpg asks every column in binary: a box plot's quartiles come back as a Python list,
    the same release a text client reads next (a repeat, uncharged)."""
    sql = "SELECT percentile_cont(ARRAY[0.25, 0.5, 0.75]) WITHIN GROUP (ORDER BY age_f) FROM pct_adult WHERE age < 50"

    async def fetched() -> list[float]:
        conn = await asyncpg.connect(host=pproxy.host, port=pproxy.port, user="analyst", password="analyst",
                                     database=TEST_DATABASE)
        try:
            return await conn.fetchval(sql)
        finally:
            await conn.close()

    with pproxy.connect() as conn:
        before = spent_epsilon(conn)
        quartiles = asyncio.run(fetched())
        assert spent_epsilon(conn) == pytest.approx(before + 1.0)
        (text,) = conn.execute(sql).fetchone()
        assert spent_epsilon(conn) == pytest.approx(before + 1.0)
    assert isinstance(quartiles, list) and len(quartiles) == 3 and all(isinstance(q, float) for q in quartiles)
    assert quartiles == text


def test_copy_binary_of_the_array_form_carries_array_send_and_text_cursors_carry_it(
        pproxy: RunningProxy, admin: psycopg.Connection) -> None:
    sql = "SELECT percentile_disc(ARRAY[0.1, 0.9]) WITHIN GROUP (ORDER BY age) FROM pct_adult WHERE sex = 'Female'"
    with pproxy.connect() as conn:
        before = spent_epsilon(conn)
        with conn.cursor() as cur, cur.copy(f"COPY ({sql}) TO STDOUT (FORMAT binary)") as copy:
            copied = b"".join(bytes(chunk) for chunk in copy)
        assert spent_epsilon(conn) == pytest.approx(before + 1.0)
    # COPY's binary framing: signature, flags, extension length; one tuple of one field; -1.
    assert copied[:19] == b"PGCOPY\n\xff\r\n\x00" + b"\x00" * 8 and copied[-2:] == b"\xff\xff"
    assert copied[19:21] == b"\x00\x01"
    length = int.from_bytes(copied[21:25], "big")
    data = copied[25:25 + length]
    assert 25 + length == len(copied) - 2
    values = psycopg.adapt.Transformer(admin).get_loader(1007, psycopg.pq.Format.BINARY).load(data)
    assert len(values) == 2 and all(isinstance(v, int) and 17 <= v <= 90 for v in values)
    expected, _ = _raw(admin, "SELECT $1::int4[]", [encode_array_text(values, 23)], binary=True)
    assert data == expected
    with pproxy.connect(autocommit=False) as conn:
        with conn.cursor(name="pct_array") as cur:
            cur.execute(sql.replace("0.9", "0.8"))
            (fetched,) = cur.fetchone()
    assert len(fetched) == 2 and all(isinstance(v, int) and 17 <= v <= 90 for v in fetched)


def test_a_repeated_array_is_the_same_answer_uncharged_and_any_other_order_or_set_is_not(
        pproxy: RunningProxy) -> None:
    sql = "SELECT percentile_cont({}) WITHIN GROUP (ORDER BY gain) FROM pct_adult WHERE age BETWEEN 30 AND 39"
    with pproxy.connect() as conn:
        first = conn.execute(sql.format("ARRAY[0.25, 0.75]")).fetchone()
        spent = spent_epsilon(conn)
        assert conn.execute(sql.format("'{0.25,0.75}'::float8[]")).fetchone() == first  # the same fractions
        assert spent_epsilon(conn) == spent
        for other in ("ARRAY[0.75, 0.25]", "ARRAY[0.25, 0.75, 0.5]", "ARRAY[0.25]", "0.25"):
            conn.execute(sql.format(other)).fetchone()
            spent += 1.0
            assert spent_epsilon(conn) == pytest.approx(spent), other



def test_an_element_of_the_array_form_with_a_filter_beside_avg_is_answered_from_the_release(
        pproxy: RunningProxy, admin: psycopg.Connection) -> None:
    # The subscript reads the released array (post-processing); the FILTER narrows the counts.
    with pproxy.connect() as conn:
        before = spent_epsilon(conn)
        (p90, mean), types, notices = _answer(
            conn, "SELECT (percentile_disc(ARRAY[0.1, 0.9]) WITHIN GROUP (ORDER BY age) FILTER (WHERE sex = 'Male'))[2] "
                  "AS p90, avg(age) FROM pct_adult WHERE age > 20")
        assert spent_epsilon(conn) == pytest.approx(before + 1.0)
    assert types == [23, 1700] and isinstance(p90, int)
    _assert_near(admin, "age", "WHERE age > 20 AND sex = 'Male'", p90, 0.9, 0.25, 74, 1.0, 17, 90)
    assert "ε 0.25 for each of 2 fractions" in notices[0]
