"""COUNT and SUM through dpproxy: shapes, names and types, empty filters, clamping, noise."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from scipy import stats

from conftest import RunningProxy


def _one_row(proxy: RunningProxy, sql: str) -> tuple:
    with proxy.connect() as conn:
        return conn.execute(sql).fetchone()


def _exact(admin: psycopg.Connection, sql: str) -> tuple:
    return admin.execute(sql).fetchone()


def _noise_draws(proxy: RunningProxy, sql: str, n: int) -> np.ndarray:
    """Run ``sql`` n times on one connection; return the answers as rows."""
    with proxy.connect() as conn:
        return np.array([conn.execute(sql).fetchone() for _ in range(n)], dtype=float)


def test_count_is_a_noised_non_negative_integer_close_to_the_truth(proxy, admin):
    sql = "SELECT COUNT(*) FROM adult WHERE age > 40"
    (exact,) = _exact(admin, sql)
    answers = _noise_draws(proxy, sql, 50)[:, 0]
    assert all(a == int(a) and a >= 0 for a in answers)
    # Scale 1 at ε = 1: E|noise| = 0.85; fails by chance with p < 1e-21 (Chernoff), catches a 4× scale.
    assert np.mean(np.abs(answers - exact)) < 3
    assert len(set(answers)) > 1  # noise is fresh per query: fails by chance with p < 2e-17


def test_result_columns_have_the_names_and_types_postgres_gives(proxy, admin):
    sql = ("SELECT COUNT(*), count(age) AS n_age, SUM(hours_per_week), sum(clamp.capital_gain) AS \"Gain\" "
           "FROM public.adult AS clamp WHERE sex = 'Female'")
    with proxy.connect() as conn:
        through = conn.execute(sql).description
    direct = admin.execute(sql).description
    assert [(c.name, c.type_code) for c in through] == [(c.name, c.type_code) for c in direct]
    assert [c.name for c in through] == ["count", "n_age", "sum", "Gain"]


def test_sum_over_float_column_returns_float(proxy, admin):
    sql = "SELECT SUM(ratio) FROM clamp_test"
    with proxy.connect() as conn:
        cur = conn.execute(sql)
        value = cur.fetchone()[0]
        assert cur.description[0].type_code == admin.execute(sql).description[0].type_code
    assert isinstance(value, float)


def test_filter_matching_nothing_still_returns_one_noised_row(proxy):
    with proxy.connect() as conn:
        rows = [conn.execute("SELECT COUNT(*), SUM(hours_per_week) FROM adult WHERE age > 200").fetchall()
                for _ in range(20)]
    assert all(len(r) == 1 for r in rows)
    counts = [r[0][0] for r in rows]
    sums = [r[0][1] for r in rows]
    assert all(c is not None and c >= 0 for c in counts)
    assert all(s is not None for s in sums)  # never the NULL that SUM over no rows gives
    assert len(set(sums)) > 1  # discrete Laplace scale 198: fails by chance with p < 1e-50


def test_limit_zero_returns_no_row_and_limit_one_the_row(proxy):
    with proxy.connect() as conn:
        assert conn.execute("SELECT COUNT(*) FROM adult LIMIT 0").fetchall() == []
        assert len(conn.execute("SELECT COUNT(*) FROM adult ORDER BY 1 LIMIT 1").fetchall()) == 1


def test_outlier_far_outside_bounds_is_clamped_before_summing(proxy, admin):
    (clamped,) = _exact(admin, "SELECT SUM(LEAST(GREATEST(value, 0), 10)) FROM clamp_test")
    (raw,) = _exact(admin, "SELECT SUM(value) FROM clamp_test")
    assert raw > 10**9
    answers = _noise_draws(proxy, "SELECT SUM(value) FROM clamp_test", 200)[:, 0]
    # Laplace scale Δ/ε = 10: the mean of 200 draws has standard error 10·√2/√200 = 1, so ±6
    # fails by chance with p ≈ 4e-9 (exact sum of discrete Laplace draws; the normal tail says 2e-9);
    # without the clamp it would be off by > 10⁹.
    assert abs(answers.mean() - clamped) < 6
    assert answers.max() < clamped + 200  # fails by chance with p ≈ 200·e⁻²⁰/(1 + e^-0.1) ≈ 2e-7


# The noise tests' WHERE selects 4 % of adult (1,982 rows) through its index on age: the noise does not depend
# on the rows, and 2,000 scans of the whole table were 4/5 of each test's time. The counts and
# sums stay far above 0 (hundreds of noise scales), so no answer is near a bound.
SELECTIVE = "age >= 70"


def test_count_noise_follows_discrete_laplace_with_scale_one_over_epsilon(proxy, admin):
    sql = f"SELECT COUNT(*) FROM adult WHERE {SELECTIVE}"
    (exact,) = _exact(admin, sql)
    noise = _noise_draws(proxy, sql, 2000)[:, 0] - exact
    _assert_discrete_laplace(noise, scale=1.0)


def test_two_column_query_splits_epsilon_and_doubles_each_scale(proxy, admin):
    sql = f"SELECT COUNT(*), SUM(hours_per_week) FROM adult WHERE {SELECTIVE}"
    exact_count, exact_sum = _exact(admin, sql)
    draws = _noise_draws(proxy, sql, 2000)
    _assert_discrete_laplace(draws[:, 0] - exact_count, scale=2.0)  # k/ε = 2/1
    _assert_discrete_laplace(draws[:, 1] - float(exact_sum), scale=2 * 99.0)  # kΔ/ε, Δ = 99


def test_sum_of_a_float_column_is_its_exact_clamped_sum_plus_laplace_noise_of_scale_bound_over_epsilon(proxy, admin):
    """A float column's SUM is noised on a fixed-point grid (mechanisms.fixed_point): discrete
    Laplace in steps of 2^-k, about 2^-52 of the bound, i.e. Laplace(Δ/ε) to the analyst,
    centred on the exact sum of the clamped values (the outlier 1e12 counts as 2.5)."""
    (exact,) = _exact(admin, "SELECT SUM(LEAST(GREATEST(ratio, -2.5), 2.5)) FROM clamp_test")
    noise = _noise_draws(proxy, "SELECT SUM(ratio) FROM clamp_test", 2000)[:, 0] - exact
    # KS against Laplace(2.5/1): fails by chance with p = 1e-7; a √2 scale error gives D ≈ 0.09
    # against the 0.065 this tolerates at n = 2000. Variance 2b², checked as above.
    assert stats.kstest(noise, stats.laplace(scale=2.5).cdf).pvalue > 1e-7
    assert abs(noise.var() / (2 * 2.5**2) - 1) < 0.4


def _assert_discrete_laplace(noise: np.ndarray, scale: float) -> None:
    """KS and moment checks against the discrete Laplace P(k) ∝ exp(-|k|/scale).

    Together they catch a scale off by √2 (variance ratio 2) or more in 2000 draws; each fails
    by chance with p ≈ 1e-7 at most.
    """
    assert np.all(noise == np.round(noise))
    reference = stats.dlaplace(1.0 / scale)
    # Each draw plus its own Uniform(-1/2, 1/2) has the continuous CDF _smoothed_cdf, so the
    # KS p-value (scipy's exact distribution) is uniform: fails by chance with p = 1e-7. A 2×
    # scale gives D ≈ 0.11 against the 0.065 this needs at n = 2000.
    result = stats.kstest(noise + np.random.default_rng(0).uniform(-0.5, 0.5, noise.size),
                          lambda x: _smoothed_cdf(reference, x))
    assert result.pvalue > 1e-7, result
    # The variance of discrete Laplace: 2e^{-1/b} / (1 - e^{-1/b})^2. The sample variance of
    # 2000 draws has relative sd ≈ 0.05 and a heavy upper tail: ±0.4 fails by chance with
    # p < 3e-9 (Chernoff bound on the truncated sum of squares); ±0.2 failed with p ≈ 3e-4.
    q = np.exp(-1.0 / scale)
    variance = 2 * q / (1 - q) ** 2
    assert abs(noise.var() / variance - 1) < 0.4


def _smoothed_cdf(dist, x: np.ndarray) -> np.ndarray:
    """CDF of (discrete variable + Uniform(-1/2, 1/2)): linear between half-integers."""
    lower = np.floor(x + 0.5)
    return dist.cdf(lower - 1) + (x + 0.5 - lower) * dist.pmf(lower)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM adult",
        "select count(*) from ADULT",
        'SELECT count(*) FROM "adult"',
        "SELECT count(*) FROM public.adult",
        "SELECT count(*) FROM adult t WHERE t.age BETWEEN 20 AND 30",
        "SELECT count(*) FROM adult WHERE sex IN ('Male', 'Female') AND age IS NOT NULL",
        "SELECT count(*) FROM adult WHERE lower(sex) LIKE 'fem%' OR NOT (age < 30)",
    ],
)
def test_accepted_shapes_return_one_row(proxy, sql):
    assert len(_one_row(proxy, sql)) == 1
