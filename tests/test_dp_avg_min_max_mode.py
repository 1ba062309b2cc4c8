"""AVG, MIN, MAX and MODE through dpproxy: guarantees on neighbouring tables, clamping,
fresh partitions, declared categories, result types, empty filters and refusals.

The privacy checks run the real proxy on two tables that differ by one added row and
compare the answers' distributions bin by bin: the log ratio of each bin's frequencies
must stay within ε, up to sampling error (z standard errors of the log ratio).
"""

from __future__ import annotations

import math
import re
import struct
from collections import Counter
from collections.abc import Iterator

import numpy as np
import psycopg
import pytest
from conftest import ATTACK_POLICY_HEAD, TEST_POLICY, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from scipy import stats

from proxy.demo.embedded import SERVICE_ROLE
from proxy.dp.answer import query_delta, release_row
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql, partition_seed, split_row

# The shared test policy's backend, settings and user, with this module's tables.
NEIGHBOUR_POLICY = TEST_POLICY[: TEST_POLICY.index("tables:")] + """
tables:
  public.nb_base: &neighbour
    epsilon: 1.0
    delta: 1.0e-6
    partitions: 3
    partitioning: row_hash
    avg: sum_count
    columns:
      v: {{bounds: [0, 100]}}
      grp: {{categories: [A, B, C]}}
  public.nb_plus: *neighbour
  public.outliers:
    epsilon: 30.0
    partitions: 30
    avg: sample_aggregate
    columns:
      v: {{bounds: [0, 10]}}
  public.outliers_sc:
    epsilon: 30.0
    delta: 0
    avg: sum_count
    columns:
      v: {{bounds: [0, 10]}}
  public.spread:
    epsilon: 1.0
    partitions: 16
    columns:
      v: {{bounds: [0, 100]}}
  public.undeclared:
    epsilon: 1.0
    columns:
      grp: {{categories: [A, B, C]}}
"""

# nb_base: v = 100 in one row and 0 in 19; grp A in 10 rows, B in 10. nb_plus adds (100, 'A', 21).
# They are partitioned by row_hash (the adult tables elsewhere by random(), the default on a
# table without a primary key), which hashes every column: id tells the rows apart, else rows
# equal in all of them would always share a partition (the two 100s could never be split).
_TABLES = """
DROP TABLE IF EXISTS nb_base, nb_plus, outliers, outliers_sc, spread, undeclared;
CREATE TABLE nb_base (v integer, grp text, id integer);
INSERT INTO nb_base SELECT CASE WHEN i = 1 THEN 100 ELSE 0 END, CASE WHEN i <= 10 THEN 'A' ELSE 'B' END, i
  FROM generate_series(1, 20) i;
CREATE TABLE nb_plus AS SELECT * FROM nb_base;
INSERT INTO nb_plus VALUES (100, 'A', 21);
-- 65% of the rows in 0..9, 30% far above the bounds [0, 10], 5% far below, and some NULLs.
CREATE TABLE outliers (v bigint);
INSERT INTO outliers SELECT CASE WHEN i % 20 < 13 THEN i % 10 WHEN i % 20 < 19 THEN 1000000000 ELSE -1000000000 END
  FROM generate_series(0, 2999) i;
INSERT INTO outliers SELECT NULL FROM generate_series(1, 100);
CREATE TABLE outliers_sc AS SELECT * FROM outliers;
CREATE TABLE spread (v integer);
INSERT INTO spread SELECT i FROM generate_series(1, 16) i;
CREATE TABLE undeclared (grp text);
INSERT INTO undeclared SELECT 'Z' FROM generate_series(1, 500);
INSERT INTO undeclared VALUES ('A'), ('A'), ('A'), ('A'), ('A'), ('B'), ('B'), ('B');
"""

@pytest.fixture(scope="module")
def nproxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A dpproxy over the neighbouring and outlier tables of this module."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(_TABLES)
        conn.execute(f"GRANT SELECT ON nb_base, nb_plus, outliers, outliers_sc, spread, undeclared TO {SERVICE_ROLE}")
    with running_proxy(test_db, tmp_path_factory, NEIGHBOUR_POLICY) as running:
        yield running


def _answers(proxy: RunningProxy, sql: str, n: int) -> list:
    with proxy.connect() as conn:
        return [conn.execute(sql).fetchone()[0] for _ in range(n)]


def _plan(proxy: RunningProxy, table: str, sql: str):
    relation = next(r for r in proxy.server.registry.by_oid.values() if r.name == table)
    return plan_aggregate_query(sql, relation)


def _assert_within_e_epsilon(a: np.ndarray, b: np.ndarray, epsilon: float, bins: int = 6, z: float = 3.5) -> None:
    """Every bin's frequency ratio between the two samples is within e^±ε up to sampling error.

    Bins: the point masses at the smallest and largest value (clamping puts mass there) and
    interior bins at pooled quantiles. Bins with fewer than 20 draws on a side are skipped.
    """
    pooled = np.concatenate([a, b])
    lo, hi = pooled.min(), pooled.max()
    inner = pooled[(pooled > lo) & (pooled < hi)]
    edges = np.unique(np.quantile(inner, np.linspace(0, 1, bins + 1))) if inner.size else np.array([])
    cuts = [lo, *edges[1:-1], hi]

    def counts(x: np.ndarray) -> list[int]:
        return [int(np.sum(x == lo)), *np.histogram(x[(x > lo) & (x < hi)], cuts)[0], int(np.sum(x == hi))]

    checked = 0
    for ca, cb in zip(counts(a), counts(b)):
        if min(ca, cb) < 20:
            continue
        log_ratio = abs(math.log((ca / a.size) / (cb / b.size)))
        assert log_ratio - z * math.sqrt(1 / ca + 1 / cb) <= epsilon, (counts(a), counts(b))
        checked += 1
    assert checked >= 2, (counts(a), counts(b))


def test_sample_and_aggregate_max_on_neighbouring_tables_stays_within_e_epsilon(nproxy):
    # m = 3: the partition maxima's median is 0 on nb_base (one 100) and 100 on nb_plus
    # whenever its two 100s fall in different partitions (2/3 of the seeds: row_hash spreads
    # distinct rows as a random function would); without the smooth-sensitivity noise the bin
    # at 0 would have ratio ≥ 3 > e.
    base = np.array(_answers(nproxy, "SELECT MAX(v) FROM nb_base", 800), dtype=float)
    plus = np.array(_answers(nproxy, "SELECT MAX(v) FROM nb_plus", 800), dtype=float)
    assert base.min() >= 0 and plus.max() <= 100
    # S* = 100 on both tables, so the noise is Lap(200): no bin's true |log ratio| exceeds 0.36,
    # and the check fails by chance with p < 1e-30 (binomial bin counts).
    _assert_within_e_epsilon(base, plus, epsilon=1.0)


def test_sum_count_avg_on_neighbouring_tables_stays_within_e_epsilon(nproxy):
    base = np.array(_answers(nproxy, "SELECT AVG(v) FROM nb_base", 1500), dtype=float)
    plus = np.array(_answers(nproxy, "SELECT AVG(v) FROM nb_plus", 1500), dtype=float)
    # The exact means are 5 and 9.52; the answers must differ in distribution (the test has
    # power) while no bin's ratio exceeds e^ε. The KS statistic is 0.25 ± 0.017 against the
    # 0.071 that p < 1e-3 needs: fails by chance with p < 1e-20.
    assert stats.ks_2samp(base, plus).pvalue < 1e-3
    # The largest true |log ratio| of a bin is 0.75 (the top one): fails by chance with
    # p ≈ 3e-10 (binomial bin counts at the mechanism's exact bin probabilities).
    _assert_within_e_epsilon(base, plus, epsilon=1.0)


def test_mode_frequencies_on_neighbouring_tables_follow_the_exponential_mechanism(nproxy):
    # 1500 draws a table: the G-test's floor of 1e-8 still catches an ε twice too large (A on
    # nb_plus at 0.73 instead of 0.62) in all but ~2e-4 of runs.
    epsilon, n = 1.0, 1500
    tables = {"nb_base": {"A": 10, "B": 10, "C": 0}, "nb_plus": {"A": 11, "B": 10, "C": 0}}
    seen = {}
    for table, counts in tables.items():
        seen[table] = Counter(_answers(nproxy, f"SELECT MODE() WITHIN GROUP (ORDER BY grp) FROM {table}", n))
        weights = {c: math.exp(epsilon * q / 2) for c, q in counts.items()}
        expected = {c: w / sum(weights.values()) for c, w in weights.items()}
        # Likelihood-ratio (G) test of the observed choices against exp(ε·q/2Δ) proportions.
        g = 2 * sum(k * math.log(k / (n * expected[c])) for c, k in seen[table].items())
        assert set(seen[table]) <= set(counts)
        # Fails by chance with p ≈ 7e-9 per table (the multinomial summed exactly: C's expected
        # count is ~3, where the χ² tail is a little conservative); a floor of 1e-3 failed with p ≈ 8e-4.
        assert stats.chi2.sf(g, df=len(counts) - 1) > 1e-8, (table, seen[table])
    for category in ("A", "B"):
        a, b = seen["nb_base"][category], seen["nb_plus"][category]
        # True |log ratio| ≤ 0.28 with ~750 draws a side: fails by chance with p < 1e-40.
        assert abs(math.log(a / b)) - 3.5 * math.sqrt(1 / a + 1 / b) <= epsilon


def test_mode_never_answers_a_category_the_policy_does_not_declare(nproxy):
    # 'Z' holds 500 of 508 rows but is not declared: the answer is always A, B or C.
    seen = Counter(_answers(nproxy, "SELECT MODE() WITHIN GROUP (ORDER BY grp) FROM undeclared", 200))
    assert set(seen) <= {"A", "B", "C"}
    assert seen["A"] > seen["C"]  # counts 5 vs 0: e^{2.5} times as likely; fails by chance with p < 1e-40


def test_outliers_are_clamped_row_by_row_before_averaging(nproxy, admin):
    (clamped,) = admin.execute("SELECT AVG(LEAST(GREATEST(v, 0), 10)) FROM outliers WHERE v IS NOT NULL").fetchone()
    assert 4 < clamped < 6  # while the raw mean is ~2e8
    # Without clamping inside the SQL every partition's mean would be ~2e8 and clamp to 10.
    for table in ("outliers", "outliers_sc"):
        answers = np.array(_answers(nproxy, f"SELECT AVG(v) FROM {table}", 15), dtype=float)
        assert np.all((answers >= 0) & (answers <= 10))
        # An answer errs by sd ≈ 0.05 (median of 30 partition means of ~100 rows; sum_count: 1e-4),
        # the median of 15 by ≈ 0.02: fails by chance with p < 1e-30.
        assert abs(np.median(answers) - float(clamped)) < 0.3, (table, answers)


def test_min_and_max_with_outliers_stay_in_bounds_and_keep_the_integer_type(nproxy):
    with nproxy.connect() as conn:
        rows = [conn.execute("SELECT MIN(v), MAX(v) FROM outliers").fetchone() for _ in range(10)]
    assert all(isinstance(v, int) for row in rows for v in row)
    # Every partition holds clamped outliers at both ends, so at ε = 15 per column the
    # median of the minima is 0 and of the maxima 10, with negligible noise (S* = 10·e^{-15β},
    # scale 6e-4): fails by chance with p < 1e-100 (the noise reaches 0.5 with p ≈ e^{-860}; the
    # median moves only if 15 of 30 partitions lack a row at the bound, each with p < 1e-7).
    assert [row for row in rows if row != (0, 10)] == []


def test_partitions_are_drawn_per_row_and_afresh_for_every_query(nproxy, test_db):
    plan = _plan(nproxy, "spread", "SELECT MIN(v) FROM spread")
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        runs = [split_row(plan, conn.execute(backend_sql(plan, seed=partition_seed())).fetchone())[0][0]
                for _ in range(40)]
    # 16 rows in 16 partitions: each row drawn on its own leaves 16·(15/16)^16 ≈ 5.6 partitions
    # empty on average (an equal split such as ntile would leave none).
    filled = np.array([len(values) for values in runs])
    assert 9 <= filled.mean() <= 12, filled  # mean 10.3, sd 0.2: fails by chance with p ≈ 2e-11 (exact)
    # A new partitioning per query: the partition minima hardly ever repeat (two runs share
    # theirs with p ≈ 3e-4, so 0.2 shared pairs in 40 runs): fails by chance with p < 1e-10.
    assert len({tuple(sorted(values)) for values in runs}) >= 30


def test_sum_count_table_without_delta_answers_avg_and_refuses_min(nproxy):
    with nproxy.connect() as conn:
        assert 0 <= conn.execute("SELECT AVG(v) FROM outliers_sc").fetchone()[0] <= 10
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT MIN(v) FROM outliers_sc")
    assert info.value.diag.sqlstate == "DP001"
    assert "rule: delta-required" in info.value.diag.message_primary
    assert info.value.diag.message_hint


# ------------------------------------------------------------------ the shared test proxy (adult)


def test_avg_min_max_mode_have_the_names_and_types_postgres_gives(proxy, admin):
    sql = ("SELECT AVG(age), MIN(age) AS youngest, MAX(hours_per_week), MODE() WITHIN GROUP (ORDER BY sex) "
           "FROM adult WHERE age > 30")
    with proxy.connect() as conn:
        cur = conn.execute(sql)
        row = cur.fetchone()
        through = cur.description
        float_avg = conn.execute("SELECT AVG(ratio) FROM clamp_test").description[0].type_code
    direct = admin.execute(sql).description
    assert [(c.name, c.type_code) for c in through] == [(c.name, c.type_code) for c in direct]
    assert float_avg == admin.execute("SELECT AVG(ratio) FROM clamp_test").description[0].type_code
    avg, youngest, longest, mode = row
    assert 17 <= avg <= 90 and isinstance(youngest, int) and 17 <= youngest <= 90
    assert isinstance(longest, int) and 1 <= longest <= 99 and mode in ("Male", "Female")


def test_avg_of_adult_age_is_close_to_the_exact_mean(proxy, admin):
    (exact,) = admin.execute("SELECT AVG(age) FROM adult").fetchone()
    answers = np.array(_answers(proxy, "SELECT AVG(age) FROM adult", 10), dtype=float)
    # The default, noisy sum / noisy count at ε = 1: the error is (e_sum − c·e_count)/ñ with
    # e_sum ~ Lap(73), e_count ~ DiscreteLap(2), c = 38.4 − 53.5 and ñ ≈ 48,842. An answer is off
    # by more than 0.02 (|e_sum − c·e_count| > 977) with p < P(|e_sum| > 488) + P(|e_count| > 32)
    # ≈ 1.3e-3; the median of 10 needs 5 such: fails by chance with p < 252·(1.3e-3)^5 ≈ 1e-12.
    assert abs(np.median(answers) - float(exact)) < 0.02


def test_sample_and_aggregate_avg_of_adult_hours_is_close_to_the_exact_mean(proxy, admin):
    # hours_per_week says avg: sample_aggregate (a column's override of the table's default).
    (exact,) = admin.execute("SELECT AVG(hours_per_week) FROM adult").fetchone()
    answers = np.array(_answers(proxy, "SELECT AVG(hours_per_week) FROM adult", 10), dtype=float)
    # m = 512 partitions of ~95 rows at ε = 1 (simulated on the demo data, 200 partitionings:
    # the partition means' median is within 0.09 of the mean, S* gives noise scales 0.076–0.19).
    # An answer is off by more than 1 with p < e^(−0.91/0.19) ≈ 8e-3, the median of 10 needs 5
    # such: fails by chance with p < 252·(8e-3)^5 ≈ 8e-9.
    assert abs(np.median(answers) - float(exact)) < 1.0


def test_empty_filter_still_answers_every_aggregate_with_a_value(proxy):
    sql = ("SELECT AVG(age), MIN(age), MAX(hours_per_week), MODE() WITHIN GROUP (ORDER BY sex) "
           "FROM adult WHERE age > 200")
    with proxy.connect() as conn:
        rows = [conn.execute(sql).fetchall() for _ in range(5)]
    for (row,) in rows:
        avg, low, high, mode = row
        assert 17 <= avg <= 90 and 17 <= low <= 90 and 1 <= high <= 99 and mode in ("Male", "Female")


def test_answer_delta_is_the_sum_of_the_sample_and_aggregate_columns_delta(proxy):
    plan = _plan(proxy, "adult", "SELECT COUNT(*), AVG(age), AVG(hours_per_week), MIN(age), "
                                 "MODE() WITHIN GROUP (ORDER BY sex) FROM adult")
    partitions = struct.pack(">d", 40.0).hex() * 512  # the backend's partition part: float8 values in hex
    # AVG(age): the clamped sum and the count of values (sum_count, the default)
    answer = release_row(plan, (48842, 1876000, 48842, partitions, partitions, 30000, 18000), 1.0)
    assert answer.epsilon == 1.0
    # AVG(hours_per_week) (avg: sample_aggregate) and MIN each use the table's δ, unsplit; AVG(age) none
    assert answer.delta == pytest.approx(2e-6)
    assert query_delta(plan) == pytest.approx(answer.delta)  # what the ledger charges up front
    assert [r.mechanism for r in answer.releases] == ["laplace", "sum_count", "smooth_median", "smooth_median",
                                                      "exponential"]
    assert all(r.epsilon == pytest.approx(0.2) for r in answer.releases)


def test_avg_by_default_is_a_noisy_sum_over_a_noisy_count_and_costs_no_delta(proxy):
    """A column and table without ``avg`` answer AVG by sum_count: pure ε, so a query of AVG,
    COUNT and SUM charges δ 0, and the notice gives the noise of the released ratio."""
    plan = _plan(proxy, "adult", "SELECT COUNT(*), AVG(age), SUM(capital_gain) FROM adult")
    assert [agg.mechanism for agg in plan.aggregates] == ["laplace", "sum_count", "laplace"]
    assert query_delta(plan) == 0
    notices: list[str] = []
    with proxy.connect() as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        spent_delta = conn.execute("SHOW dpproxy.budget").fetchone()[3]
        conn.execute("SELECT AVG(age) FROM adult WHERE sex = 'Female'")
        assert conn.execute("SHOW dpproxy.budget").fetchone()[3] == spent_delta
    (notice,) = [n for n in notices if "ε charged" in n]
    assert re.fullmatch(r"dpproxy: ε charged 1, δ 0; avg: noisy sum / noisy count, scale [0-9.e-]+ "
                        r"\(95% within ±[0-9.e-]+\); remaining ε .*", notice), notice


def test_the_notice_gives_the_bound_an_analyst_can_use_for_each_mechanism(proxy):
    """Sample and aggregate's noise depends on the data, so its notice gives only the worst case
    (here the width of hours_per_week's bounds, 98); the noisy sum / noisy count gives its noise
    from the released noisy count; MODE's bound is in rows of the winning category."""
    notices: list[str] = []
    with proxy.connect() as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        conn.execute("SELECT COUNT(*), AVG(age) AS mean_age, AVG(hours_per_week), "
                     "MODE() WITHIN GROUP (ORDER BY sex) FROM adult")
    (notice,) = notices
    assert re.match(r"dpproxy: ε charged 1, δ 1e-06; count: laplace scale 4 \(95% within ±11\.98\), "
                    r"mean_age: noisy sum / noisy count, scale [0-9.e-]+ \(95% within ±[0-9.e-]+\), "
                    r"avg: sample and aggregate, worst-case 95% bound ±98, "
                    r"mode: exponential mechanism, 95% within ", notice), notice
    assert " rows of the top category's count; remaining ε " in notice and "scale" not in notice.split("avg:")[1]


@pytest.mark.parametrize(
    "sql,rule",
    [
        ("SELECT MODE() WITHIN GROUP (ORDER BY age) FROM adult", "categories-required"),
        ("SELECT MIN(sex) FROM adult", "aggregate-argument"),
        ("SELECT AVG(fnlwgt) FROM adult", "bounds-required"),
        ("SELECT MAX(age + 1) FROM adult", "aggregate-argument"),
    ],
)
def test_aggregates_without_the_policy_they_need_are_refused_with_a_hint(proxy, sql, rule):
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
    assert info.value.diag.sqlstate == "DP001"
    assert f"rule: {rule}" in info.value.diag.message_primary
    assert info.value.diag.message_hint


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT setseed(0.5)",
        "SELECT pg_catalog.setseed(0.5), 1",
        "SET seed = 0.5",
        "SELECT set_config('seed', '0.5', false)",
        "SELECT random()",
        "SELECT AVG(hours_per_week) FROM adult WHERE setseed(0.5) IS NULL",  # sample and aggregate
        "SELECT setseed(0.5), MIN(age) FROM adult",
        "SELECT COUNT(*) FROM adult WHERE random() < 0.5",
    ],
)
def test_analysts_can_neither_reseed_nor_read_the_partitioning_random_source(proxy, sql):
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
    assert info.value.diag.sqlstate in ("42501", "DP001")


def test_mode_of_more_categories_than_postgresql_selects_columns_is_refused_before_the_charge(
        test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """MODE selects one count per category: over 1,664 columns PostgreSQL fails the backend SQL
    (54011) while parsing it, whatever the rows; it was charged first and answered DP004."""
    labels = ", ".join(f"l{i}" for i in range(1700))
    policy = ATTACK_POLICY_HEAD + f"""
  public.many_labels:
    access: protected
    epsilon: 1.0
    columns:
      k: {{{{categories: [a, b], group_by: true}}}}
      m: {{{{categories: [{labels}]}}}}
"""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS many_labels")
        conn.execute("CREATE TABLE many_labels AS SELECT (ARRAY['a', 'b'])[1 + g % 2] AS k, 'l' || g AS m "
                     "FROM generate_series(1, 100) g")
        conn.execute(f"GRANT SELECT ON many_labels TO {SERVICE_ROLE}")
    with running_proxy(test_db, tmp_path_factory, policy) as proxy, proxy.connect(autocommit=True) as conn:
        for sql in ("SELECT MODE() WITHIN GROUP (ORDER BY m) FROM many_labels",
                    "SELECT k, MODE() WITHIN GROUP (ORDER BY m) FROM many_labels GROUP BY k"):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(sql)
            assert refused.value.sqlstate == "54011", str(refused.value)
            assert "(rule: statement-limits)" in str(refused.value)
        assert spent_epsilon(conn) == 0
