"""Attacks on what an answer costs: ε, δ and the noise actually drawn must match the charge."""

from __future__ import annotations

import psycopg

from conftest import TEST_POLICY, TestDatabase, running_proxy
from mechanisms.laplace import release_sum

I64_LIMITS = (2**63 - 1, -(2**63))

BIG = TEST_POLICY.replace(
    "  public.lookup:\n",
    "  public.big_amounts:\n    epsilon: 1.0\n    columns:\n      amount: {{bounds: [0, 10000000000000]}}\n"
    "  public.lookup:\n",
)


def test_integer_sum_noise_wider_than_i64_is_not_saturated_into_the_exact_answer():
    # OpenDP's integer Laplace works in i64 and saturates: at scale 1e19 about 40% of its
    # draws came out as exactly ±(2^63 - 1), so answer - (2^63 - 1) was the exact sum.
    exact, scale = 51_275, 1e19
    noise = [release_sum(exact, 1e-6, 1e13, True).value - exact for _ in range(400)]
    assert not set(noise) & {2**63 - 1, -(2**63)}
    # Laplace(1e19) exceeds 2^63 in magnitude with probability e^-0.92 ≈ 0.40: a saturating
    # sampler never does. Fewer than 100 of 400 fails by chance with p < 1e-12.
    assert sum(abs(n) > 2**63 for n in noise) >= 100
    assert release_sum(exact, 1e-6, 1e13, True).scale >= scale


def test_a_bigint_sum_at_the_minimum_epsilon_never_answers_the_exact_sum_plus_an_i64_limit(
    test_db: TestDatabase, tmp_path_factory, admin: psycopg.Connection
):
    admin.execute("DROP TABLE IF EXISTS big_amounts")
    admin.execute("CREATE TABLE big_amounts (amount bigint)")
    admin.execute("INSERT INTO big_amounts SELECT 1000 + i FROM generate_series(1, 50) i")
    admin.execute("GRANT SELECT ON big_amounts TO dpproxy_service")
    (exact,) = admin.execute("SELECT SUM(amount)::bigint FROM big_amounts").fetchone()
    with running_proxy(test_db, tmp_path_factory, BIG) as proxy, proxy.connect() as conn:
        conn.execute("SET dpproxy.epsilon = 1e-6")  # scale 1e13 / 1e-6 = 1e19
        answers = [conn.execute("SELECT SUM(amount) FROM big_amounts").fetchone()[0] for _ in range(30)]
    # Before the fix 1 - 0.6^30 ≈ 99.9998% of runs had at least one such answer.
    assert not [a for a in answers if int(a) - exact in I64_LIMITS]
