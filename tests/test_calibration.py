"""The numbers of the guarantee, pinned where the calibration ablation found nothing that would notice
them going quietly wrong (``tests/tools/guard_ablation.py --sites calibration``).

Each test here fails on one mutation of a calibration site that the area's other tests let through
(the site's name is in the test's docstring), and passes on the real code.

The statistical ones are one test of a noise scale, :func:`assert_laplace_scale`: the share of n
draws whose magnitude exceeds t = b·ln 2 (exactly 1/2 for Laplace(b); computed exactly for the
discrete Laplace). A scale off by a factor of 2 either way moves that share by at least 0.2
(to 1/4 for b/2, to 0.71 for 2b), so the test accepts within half of the nearer move, d ≈ 0.10,
and Hoeffding's inequality bounds both errors by 2·exp(−2·n·d²): 1e-9 at n = 1000. The helper
computes that bound from n and refuses to run a test whose false-failure rate would be 1e-6 or more.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from decimal import Decimal

import numpy as np
import psycopg
import pytest
from conftest import TEST_POLICY, RunningProxy, TestDatabase, dropped_around, running_proxy, spent_epsilon

import mechanisms.laplace as laplace_module
import mechanisms.sum_count as sum_count_module
from mechanisms.fixed_point import Grid
from mechanisms.laplace import integer_noise_scale, laplace_integer_sum
from mechanisms.noise_pool import NoisePool
from mechanisms.smooth_median import release_sample_and_aggregate
from mechanisms.sum_count import release_mean
from policies.errors import SQLSTATE
from policies.ledger import Budget, Ledger
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from proxy.demo.embedded import SERVICE_ROLE
from proxy.dp.column_release import release_column
from rewriter.dp_query import plan_aggregate_query

_NUMERIC = 1700

FALSE_FAILURE = 1e-6  # the most any statistical test here may fail by chance on the real code


def _tail(scale: float, t: float, discrete: bool) -> float:
    """P(|X| ≥ t) for discrete Laplace P(k) ∝ exp(−|k|/scale) (t a positive integer), else P(|X| > t) for Laplace."""
    if not discrete:
        return math.exp(-t / scale)
    q = math.exp(-1.0 / scale)
    return 2.0 * q**t / (1.0 + q)


def assert_laplace_scale(noise: np.ndarray, scale: float, discrete: bool = True) -> None:
    """Assert ``noise`` holds draws of (discrete) Laplace(``scale``), not of half or twice that scale.

    The statistic is the share of draws with |x| ≥ t, t = scale·ln 2 (rounded up for discrete
    draws); it is accepted within d of its exact probability p, d half the distance from p to the
    nearer of its values at scale/2 and 2·scale. Hoeffding: a correct sampler fails with probability
    ≤ 2·exp(−2nd²), and so does a sampler off by 2× pass; the bound must be below FALSE_FAILURE.
    """
    n = noise.size
    t = math.ceil(scale * math.log(2.0)) if discrete else scale * math.log(2.0)
    p = _tail(scale, t, discrete)
    d = min(p - _tail(scale / 2, t, discrete), _tail(2 * scale, t, discrete) - p) / 2
    bound = 2.0 * math.exp(-2.0 * n * d * d)
    assert bound < FALSE_FAILURE, f"{n} draws are too few: the test would fail by chance with p ≤ {bound:.2g}"
    share = float(np.mean(np.abs(noise) >= t if discrete else np.abs(noise) > t))
    assert abs(share - p) < d, (
        f"{share:.3f} of the draws exceed {t:g}, Laplace({scale:g}) gives {p:.3f} (±{d:.3f}): the noise scale is "
        f"{'smaller' if share < p else 'larger'} than {scale:g}"
    )


# ---------------------------------------------------------------------------------------- the proxy
_TABLE = "calib_neg"
POLICY = TEST_POLICY + f"""\
  public.{_TABLE}:
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      i: {{{{bounds: [-100, 1]}}}}
      f: {{{{bounds: [-100.0, 1.0]}}}}
      c: {{{{categories: [a, b, c]}}}}
"""


@pytest.fixture(scope="module")
def calib_table(test_db: TestDatabase) -> Iterator[None]:
    """A table whose columns' bounds are far from symmetric, [-100, 1], and whose declared
    categories a, b and c hold 1, 0 and 0 of its 41 rows; i is -50 but in one row 10^9 (clamped: 1)."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin, dropped_around(admin, _TABLE):
        admin.execute(f"CREATE TABLE {_TABLE} (i integer, f double precision, c text)")
        admin.execute(f"INSERT INTO {_TABLE} SELECT -50, -50.0, CASE WHEN g = 1 THEN 'a' END FROM generate_series(1, 40) g")
        admin.execute(f"INSERT INTO {_TABLE} VALUES (1000000000, -50.0, NULL)")  # i far above its bound, 1
        admin.execute(f"GRANT SELECT ON {_TABLE} TO {SERVICE_ROLE}")
        yield


@pytest.fixture(scope="module")
def calib(calib_table: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A proxy over the table with repeats off: every answer is a fresh release."""
    with running_proxy(test_db, tmp_path_factory, POLICY) as running:
        yield running


@pytest.fixture(scope="module")
def repeating(calib_table: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A proxy over the table with repeats on."""
    text = POLICY.replace("repeats: {{enabled: false}}", "repeats: {{ttl_s: 600}}")
    with running_proxy(test_db, tmp_path_factory, text) as running:
        yield running


def _answers(proxy: RunningProxy, sql: str, n: int) -> np.ndarray:
    with proxy.connect() as conn:
        return np.array([conn.execute(sql).fetchone() for _ in range(n)], dtype=float)


def test_a_sum_is_noised_to_the_bound_of_larger_magnitude_even_when_it_is_the_lower_one(calib):
    """Sites sum.policy-sensitivity-upper-bound-only and grid.sensitivity-upper-only: one row moves a
    SUM over [-100, 1] by up to 100, so the noise scale is 100/ε per column (200 with two columns),
    for an integer column (discrete Laplace) as for a float one (on the fixed-point grid)."""
    draws = _answers(calib, f"SELECT SUM(i), SUM(f) FROM {_TABLE}", 1000) - np.array([-1999.0, -2050.0])
    assert_laplace_scale(draws[:, 0], 200.0)
    assert_laplace_scale(draws[:, 1], 200.0, discrete=False)


@pytest.mark.parametrize("aggregate", ["SUM(i) FILTER (WHERE f > -60)", "SUM(CASE WHEN f > -60 THEN i ELSE 0 END)"])
def test_a_conditional_sum_adds_clamped_values(calib, aggregate):
    """Site clamp.filtered-sum-unclamped: a FILTER (or the CASE form read as one) restricts the
    clamped sum, it does not replace it. The row holding 10^9 counts as 1, so the exact clamped sum
    is -1999; noise of scale 100 is beyond ±2000 with probability e^-20 < 3e-9 per answer."""
    with calib.connect() as conn:
        answers = [conn.execute(f"SELECT {aggregate} FROM {_TABLE}").fetchone()[0] for _ in range(3)]
    assert all(abs(answer - (-1999)) < 2000 for answer in answers), answers


def test_mode_chooses_among_every_declared_category_even_those_no_row_holds(calib):
    """Site mode.candidates-from-the-data: the exponential mechanism's candidates are the policy's
    categories, not the ones present (which would tell that b and c hold no row). With counts
    1, 0, 0 at ε = 1 each of b and c is chosen with probability 1/(e^0.5 + 2) = 0.27, so all three
    show up in 60 answers except with probability < 2·0.73^60 + 0.55^60 < 1e-8."""
    with calib.connect() as conn:
        chosen = {conn.execute(f"SELECT MODE() WITHIN GROUP (ORDER BY c) FROM {_TABLE}").fetchone()[0]
                  for _ in range(60)}
    assert chosen == {"a", "b", "c"}


def test_a_repeat_is_free_for_the_user_who_was_charged_for_it_and_for_no_other(repeating):
    """Site repeat.key-without-user: each analyst's budget bounds what that analyst learns, so an
    answer another analyst paid for is released afresh, and charged, when this one asks."""
    sql = f"SELECT SUM(i) FROM {_TABLE}"
    with repeating.connect() as first, psycopg.connect(repeating.dsn("plain", "plain"), autocommit=True) as second:
        first.execute(sql).fetchone()
        before = spent_epsilon(first), spent_epsilon(second)
        first.execute(sql).fetchone()  # a repeat: free
        second.execute(sql).fetchone()  # another user's first: charged
        assert (spent_epsilon(first), spent_epsilon(second)) == (before[0], pytest.approx(before[1] + 1.0))


def test_a_repeat_at_another_epsilon_is_a_fresh_release_at_that_epsilon(repeating):
    """Site repeat.key-without-epsilon: the stored answer was noised for the ε it was asked at; the
    same statement under another ``dpproxy.epsilon`` is released and charged at that ε (docs:
    a repeat is the same statement, parameters, settings and ε)."""
    sql = f"SELECT COUNT(*) FROM {_TABLE} WHERE i < 0"
    with repeating.connect() as conn:
        conn.execute(sql).fetchone()
        before = spent_epsilon(conn)
        conn.execute("SET dpproxy.epsilon = 0.5")
        conn.execute(sql).fetchone()
        assert spent_epsilon(conn) == pytest.approx(before + 0.5)


def test_delta_spent_from_a_reservation_is_taken_off_it(calib_table, test_db, tmp_path_factory):
    """Sites reserve.delta-not-spent and reserve.covers-epsilon-only: a reservation holds ten answers'
    worth of the (ε, δ) of the answer that made it. Answers at a tenth of that ε spend its ε ninety
    times over but its δ ten times: with a δ budget of twenty sample-and-aggregate answers, exactly
    twenty are answered, however the reservation is spent."""
    text = POLICY.replace("users:\n", "users:\n  tight: {{password: tight, budget: {{epsilon: 1000, delta: 2.0e-5}}}}\n")
    text = text.replace('ledger: {{url: "sqlite:///{ledger}"}}', 'ledger: {{url: "sqlite:///{ledger}", release_idle_s: 3600}}')
    answered = 0
    with running_proxy(test_db, tmp_path_factory, text) as proxy:
        with psycopg.connect(proxy.dsn("tight", "tight"), autocommit=True) as conn:
            sql = f"SELECT MIN(i) FROM {_TABLE}"  # sample and aggregate: δ = 1e-6
            conn.execute(sql).fetchone()  # at ε = 1: reserves (10, 1e-5)
            answered += 1
            conn.execute("SET dpproxy.epsilon = 0.1")
            for _ in range(40):
                try:
                    conn.execute(sql).fetchone()
                except psycopg.Error as exc:
                    assert exc.sqlstate == SQLSTATE.DP_BUDGET_EXHAUSTED, exc
                    break
                answered += 1
    assert answered == 20


# ---------------------------------------------------------------------------------------- mechanisms
def test_a_coarse_integer_sum_is_never_noised_below_sensitivity_over_epsilon():
    """Site lap.coarse-sensitivity-rounded-down: past MAX_INT_SCALE an integer sum is noised at a
    granularity g, with ⌈Δ/g⌉ points of sensitivity; ⌊Δ/g⌋ would be a scale below Δ/ε whenever g
    does not divide Δ."""
    for sensitivity in (2**60 + 1, 2**61 - 1, 3 * 2**58 + 5):
        for epsilon in (1.0, 0.5, 0.01):
            _, scale = laplace_integer_sum(0, sensitivity, epsilon)
            assert scale >= sensitivity / epsilon, (sensitivity, epsilon)
            assert integer_noise_scale(sensitivity, epsilon) == scale


def test_a_numeric_sum_is_noised_for_the_point_its_rounding_to_the_grid_can_add(monkeypatch):
    """Site sum.numeric-rounding-point: a numeric column's exact total is rounded to the grid once,
    so one row moves the rounded total by up to one point more than the bound's own points. With
    bounds [0, 1 + 2^-52] (k = 51, hi·2^k = 2^51 + 1/2, rint 2^51) the totals 2^-53 and 2^-53 + hi
    round to 0 and 2^51 + 1: the noise must be scaled to that move."""
    hi = 1.0 + 2.0**-52
    relation = _relation(_NUMERIC, (0.0, hi))
    plan = plan_aggregate_query("SELECT SUM(y) FROM t", relation)
    grid = Grid.for_bounds(0.0, hi)
    low, high = Decimal(2.0**-53), Decimal(2.0**-53) + Decimal(hi)
    move = grid.rounded(high) - grid.rounded(low)
    assert move == grid.sensitivity(0.0, hi) + 1  # the case the rounding point is for
    scales: list[float] = []

    def capture(value: int, scale: float) -> int:
        scales.append(scale)
        return value

    monkeypatch.setattr(laplace_module, "laplace_int", capture)
    for total in (low, high):
        release_column(plan.aggregates[0], (total,), 1.0, relation.policy)
    assert scales and all(scale >= move / 1.0 for scale in scales), (scales, move)


def _relation(type_oid: int, bounds: tuple[float, float]) -> Relation:
    """A protected table ``t`` of one column ``y`` of ``type_oid`` with ``bounds``."""
    column = ColumnPolicy(bounds=bounds)
    policy = TablePolicy(epsilon=1.0, delta=1e-6, partitions=4, columns={"y": column})
    return Relation(0, "public", "t", policy, {"y": ColumnInfo("y", type_oid, -1, 1, column)}, "ctid")


@pytest.mark.parametrize("on_grid", [False, True], ids=["exact-total", "float-grid"])
@pytest.mark.parametrize("bounds", [(17.0, 90.0), (0.0, 10.0), (-2.5, 2.5), (1e15, 1e15 + 2)])
@pytest.mark.parametrize("epsilon", [1.0, 0.3])
def test_a_noisy_sum_over_noisy_count_avg_draws_each_half_at_half_the_epsilon(monkeypatch, bounds, on_grid, epsilon):
    """Sites avg.count-scale-whole-epsilon, avg.sensitivity-halved, avg.on-grid-sensitivity-halved,
    avg.uncentred-sensitivity: the centred sum moves by up to h = (hi − lo)/2 per row and the count
    by 1, each noised with ε/2, so the sampler must be asked for scales of at least h/(ε/2) (in the
    column's units) and 1/(ε/2). The scales asked for are what the draws have (the samplers' own
    tests pin that); h is computed here from the bounds, not by the mechanism's helpers."""
    lo, hi = bounds
    asked: dict[str, list[float]] = {"sum": [], "count": []}
    real_sum = sum_count_module.laplace_integer_sum

    def sum_noise(exact: int, sensitivity: int, share: float) -> tuple[int, float]:
        value, scale = real_sum(exact, sensitivity, share)
        asked["sum"].append(scale)
        return value, scale

    def count_noise(value: int, scale: float) -> int:
        asked["count"].append(scale)
        return value

    monkeypatch.setattr(sum_count_module, "laplace_integer_sum", sum_noise)
    monkeypatch.setattr(sum_count_module, "laplace_int", count_noise)
    grid = Grid.for_bounds(lo, hi)
    count = 1000
    total = grid.point(hi) * count if on_grid else int(hi) * count if hi == int(hi) else Decimal(hi) * count
    release_mean(total, count, lo, hi, epsilon, on_grid=on_grid)
    (sum_scale,), (count_scale,) = asked["sum"], asked["count"]
    h = (hi - lo) / 2
    assert sum_scale * grid.step >= h / (epsilon / 2) * (1 - 1e-12), (sum_scale * grid.step, h / (epsilon / 2))
    assert count_scale >= 1 / (epsilon / 2)


def _smooth_sensitivity(values: list[float], lo: float, hi: float, epsilon: float, delta: float) -> float:
    """S*_β of the lower median by the definition of Nissim, Raskhodnikova and Smith, "Smooth Sensitivity
    and Sampling in Private Data Analysis" (2007), with β = ε / (2·ln(2/δ)) (Laplace noise is
    (ε/2, β)-admissible), written out here rather than taken from the mechanism."""
    beta = epsilon / (2 * math.log(2 / delta))
    m = len(values)
    x = [lo, *sorted(values), hi]
    j = (m + 1) // 2  # 1-based lower median
    at = lambda i: x[min(max(i, 0), m + 1)]  # noqa: E731
    return max(math.exp(-k * beta) * max(at(j + t) - at(j + t - k - 1) for t in range(k + 2)) for k in range(m + 1))


def test_sample_and_aggregate_noise_is_scaled_to_the_smooth_sensitivity_at_beta_epsilon_over_2_ln_2_over_delta():
    """Site sa.beta-from-epsilon: with partition values all at the midpoint of [0, 100] the median's
    smooth sensitivity is reached k ≈ m/2 steps away, e^{-βk}·(hi − lo), so a β twice as large
    (ε / ln(2/δ)) gives noise about six times smaller at m = 101, ε = 1, δ = 1e-6. The released
    noise must be Laplace(2·S*/ε) with S* at β = ε/(2 ln(2/δ)); the output clamp to [0, 100] leaves
    the share of draws beyond the scale's b·ln 2 (< 50) as it is."""
    lo, hi, epsilon, delta = 0.0, 100.0, 1.0, 1e-6
    values = [50.0] * 101
    scale = 2 * _smooth_sensitivity(values, lo, hi, epsilon, delta) / epsilon
    assert scale * math.log(2) < 50  # the clamp cannot move a draw across the threshold
    noise = np.array([release_sample_and_aggregate(values, lo, hi, epsilon, delta).value - 50.0 for _ in range(1000)])
    assert_laplace_scale(noise, scale, discrete=False)


def test_a_refill_of_the_noise_pool_holds_independent_draws_none_handed_out_twice():
    """Sites pool.draw-handed-out-twice and pool.draw-not-removed: each value of the pool is one
    draw, handed out once. At scale 1e15 two independent draws are equal with probability below
    1/(2·1e15), so 256 of them are all distinct except with probability < 256²/2 · 5e-16 < 2e-11;
    a batch drawn once and queued twice (or a value left at the head of the queue) repeats one."""
    pool = NoisePool(1e15, batch=256)
    pool._refill()
    pool._refill_pending = True  # no background refill: the values of this one refill
    taken = [pool.take() for _ in range(256)]
    assert len(set(taken)) == len(taken)


# ---------------------------------------------------------------------------------------- the ledger
def test_charges_finer_than_the_ledger_s_unit_are_rounded_against_the_analyst(tmp_path):
    """Site ledger.charge-rounded-down: the ledger counts ε in units of 1e-12, so a charge of
    0.1000000000001 ε is 100000000000.1 units. Ten of them add up to 1.000000000001 ε, above a
    budget of 1: rounded up, the tenth does not fit; rounded down, all ten would, and δ likewise."""
    ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    try:
        for amount, budget in ((dict(epsilon=0.1000000000001, delta=0.0), Budget(1.0, 0.0)),
                               (dict(epsilon=0.0, delta=1.0000000000000001e-7), Budget(1.0, 1e-6))):
            user = f"u{budget.delta}"
            accepted = [ledger.charge(user, amount["epsilon"], amount["delta"], budget).accepted for _ in range(10)]
            assert accepted == [True] * 9 + [False], (amount, accepted)
    finally:
        ledger.close()


def test_limits_finer_than_the_ledger_s_unit_are_rounded_against_the_analyst(tmp_path):
    """Site ledger.limit-rounded-up: a budget of 0.9999999999999 ε is 999999999999.9 units, so a
    charge of exactly 1 ε (10^12 units) does not fit it; with the limit rounded up it would. The
    same for a δ budget of 9.999999999999997e-7 (999999999999.9997 units) and a charge of 1e-6."""
    ledger = Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    try:
        assert not ledger.charge("e", 1.0, 0.0, Budget(0.9999999999999, 0.0)).accepted
        assert not ledger.charge("d", 0.0, 1e-6, Budget(1.0, 9.999999999999997e-7)).accepted
        assert ledger.charge("both", 1.0, 1e-6, Budget(1.0, 1e-6)).accepted  # what is within the limits fits
    finally:
        ledger.close()
