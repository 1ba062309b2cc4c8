"""Attacks on what an answer costs: ε, δ and the noise actually drawn must match the charge."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from pathlib import Path

import psycopg
import pytest

import proxy.dp.budget as budget_module
from conftest import TEST_POLICY, TestDatabase, running_proxy, spent_epsilon
from wire import SYNC, Wire, bind, cstr, data_row_values, error_fields, execute, message, parse
from mechanisms.laplace import release_sum
from policies.errors import Refusal
from policies.ledger import Ledger
from policies.loader import parse_policy
from proxy.dp.budget import BudgetKeeper

_KEEPER_POLICY = """
backend: {{dsn: "postgresql://unused@localhost/unused"}}
ledger: {{url: "sqlite:///{ledger}", reserve: 10}}
users:
  analyst:
    password: analyst
    budget: {{epsilon: 100, period: day}}
tables: {{}}
"""

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
    noise = [release_sum(exact, 1e-6, 10**13).value - exact for _ in range(400)]
    assert not set(noise) & {2**63 - 1, -(2**63)}
    # Laplace(1e19) exceeds 2^63 in magnitude with probability e^-0.92 ≈ 0.40: a saturating
    # sampler never does. Fewer than 100 of 400 fails by chance with p < 1e-12.
    assert sum(abs(n) > 2**63 for n in noise) >= 100
    assert release_sum(exact, 1e-6, 10**13).scale >= scale


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


class _Clock:
    """What ``datetime.now`` returns in proxy.dp.budget, set by the test."""

    now = datetime(2024, 5, 1, 23, 59, 59, tzinfo=timezone.utc)


class _ClockedDatetime(datetime):
    @classmethod
    def now(cls, tz=None):  # type: ignore[no-untyped-def, override]
        return _Clock.now


def test_a_charge_refunded_after_midnight_is_not_spendable_again_in_the_new_period(tmp_path: Path, monkeypatch):
    # A query charged at 23:59:59 whose backend connection was found lost before it was sent
    # gets its charge back just after midnight, while another session already holds a
    # reservation of the new day. The ledger counted that charge in yesterday's row: given to
    # today's reservation it would let today's spend exceed the daily budget by its ε.
    monkeypatch.setattr(budget_module, "datetime", _ClockedDatetime)
    _Clock.now = datetime(2024, 5, 1, 23, 59, 59, tzinfo=timezone.utc)
    policy = parse_policy(_KEEPER_POLICY.format(ledger=tmp_path / "ledger.sqlite3"), "test")
    keeper = BudgetKeeper(Ledger(f"sqlite:///{tmp_path / 'ledger.sqlite3'}"), policy)

    async def scenario() -> int:
        charged = await keeper.charge("analyst", 1.0, 0.0)  # yesterday; then its backend is lost
        _Clock.now = datetime(2024, 5, 2, 0, 0, 1, tzinfo=timezone.utc)
        answered = 0
        await keeper.charge("analyst", 1.0, 0.0)  # another session: today's first answer
        answered += 1
        keeper.refund("analyst", 1.0, 0.0, charged)  # the lost query's charge comes back
        while answered < 200:
            try:
                await keeper.charge("analyst", 1.0, 0.0)
            except Refusal:
                break
            answered += 1
        await keeper.settle()
        return answered

    try:
        answered_today = asyncio.run(scenario())
    finally:
        keeper.close()
    assert answered_today == 100  # the daily budget, not 101


def test_a_statement_prepared_before_set_epsilon_is_charged_and_noised_at_the_epsilon_in_force(proxy):
    # Extended protocol: Parse before the SET, Bind/Execute after it (and after RESET). The
    # charge and the noise scale of each execution must follow the ε in force when it runs.
    with psycopg.connect(proxy.dsn(), autocommit=True, prepare_threshold=0) as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        statement = "SELECT COUNT(*) FROM adult WHERE age > %s"
        conn.execute(statement, (40,), prepare=True)
        for setting, epsilon in (("SET dpproxy.epsilon = 0.25", 0.25), ("RESET dpproxy.epsilon", 1.0),
                                 ("SET dpproxy.epsilon = '1e-6'", 1e-6)):
            conn.execute(setting)
            before = spent_epsilon(conn)
            notices.clear()
            conn.execute(statement, (40,), prepare=True)
            assert spent_epsilon(conn) - before == pytest.approx(epsilon, rel=1e-9, abs=1e-12)
            assert f"ε charged {epsilon:g}," in notices[0]
            assert f"laplace scale {1 / epsilon:.4g} " in notices[0]


def _spent_over_the_wire(wire: Wire) -> float:
    wire.send(message(b"Q", cstr("SHOW dpproxy.budget")))
    rows = [data_row_values(body) for kind, body in wire.read_until(b"Z") if kind == b"D"]
    return float(rows[0][1])


@pytest.mark.parametrize(("sql", "formats", "sqlstate"), [
    ("SELECT COUNT(*), SUM(age) FROM adult WHERE age > 37", (1, 0, 1), b"08P01"),  # 3 codes, 2 columns
    ("SELECT COUNT(*) FROM adult WHERE age > 38", (0, 0), b"08P01"),
    ("SELECT COUNT(*) * interval '1 day', COUNT(*) FROM adult WHERE age > 34", (1, 0), b"0A000"),  # binary interval
])
def test_result_formats_the_answer_cannot_be_sent_in_are_refused_before_the_charge(proxy, sql, formats, sqlstate):
    # Before, the answer was computed and charged, then the formats were found wrong: ε spent
    # for an error the statement alone decided.
    wire = Wire(proxy.host, proxy.port)
    before = _spent_over_the_wire(wire)
    wire.send(parse("", sql), bind("", "", result_formats=formats), execute(""), SYNC)
    errors = [error_fields(body)[b"C"] for kind, body in wire.read_until(b"Z") if kind == b"E"]
    assert errors == [sqlstate]
    assert _spent_over_the_wire(wire) == before
    wire.close()


@pytest.mark.parametrize("sql, params, message", [
    ("SELECT COUNT(*) FROM adult WHERE age = 'abc'", None, 'invalid input syntax for type integer: "abc"'),
    ("SELECT AVG(hours_per_week) FROM adult WHERE sex = 'Male' AND age > 'x'", None, 'invalid input syntax for type integer: "x"'),
    ("SELECT COUNT(*) FROM adult WHERE age = %s", ("abc",), 'invalid input syntax for type integer: "abc"'),
    ("SELECT SUM(age) FROM adult WHERE age < %s", ("99999999999",), 'value "99999999999" is out of range for type integer'),
    # a number beside a float column that double precision cannot hold (it failed while planning)
    ("SELECT COUNT(*) FROM clamp_test WHERE ratio > 1e400", None, '"1e400" is out of range for type double precision'),
    ("SELECT SUM(value) FROM clamp_test WHERE ratio IN (0.5, -1e-400)", None,
     '"-1e-400" is out of range for type double precision'),
])
def test_a_value_the_column_type_cannot_read_fails_before_the_charge(proxy, sql, params, message):
    # PostgreSQL rejects such a literal while parsing the statement and such a parameter while
    # binding it, before any row: the error was charged ε and withheld as DP004 ("could depend on
    # protected rows"). It now comes first, as PostgreSQL's own, and costs nothing.
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as failed:
            conn.execute(sql, params)
        assert failed.value.sqlstate in ("22P02", "22003")
        assert failed.value.diag.message_primary == message
        assert spent_epsilon(conn) == before
        assert conn.execute("SELECT COUNT(*) FROM adult WHERE age = %s", (40,)).fetchone()  # and the session goes on


@pytest.mark.parametrize("statement", ["SET lc_monetary = 'C'", "SELECT set_config('lc_monetary', 'C', false)",
                                       "SET LOCAL lc_monetary TO DEFAULT"])
def test_lc_monetary_which_changes_what_a_money_literal_means_cannot_be_set(proxy, statement):
    # A money literal in a DP query's WHERE ('1,000.00') reads as another amount under another
    # lc_monetary, while a repeat's key and the pre-charge check's memory carry only DateStyle,
    # IntervalStyle, TimeZone and client_encoding: a repeat would answer another question, and a
    # check passed under one setting would be skipped under another, charged, then fail.
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(statement)
        assert "lc_monetary" in str(refused.value)
        assert conn.execute("SELECT current_setting('lc_monetary')").fetchone()  # the session goes on
