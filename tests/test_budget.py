"""The privacy budget through dpproxy: charged atomically before answers leave, never overspent."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import psycopg
import pytest

from conftest import TEST_POLICY, RunningProxy, TestDatabase, make_policy
from policies.ledger import Budget, Ledger
from wire import race

TIGHT = TEST_POLICY.replace(
    "users:\n",
    "users:\n  tight:\n    password: tight\n    budget: {{epsilon: 10.5, delta: 0.001}}\n"
    "  capped:\n    password: capped\n    max_query_epsilon: 0.5\n    budget: {{epsilon: 100}}\n",
)


def _tight_proxy(test_db: TestDatabase, ledger_url: str, text: str = TIGHT) -> RunningProxy:
    policy_text = text.replace('ledger: {{url: "sqlite:///{ledger}"}}', f'ledger: {{{{url: "{ledger_url}"}}}}')
    return RunningProxy(make_policy(test_db, Path("unused"), policy_text))


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path, test_db: TestDatabase) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
        return
    yield test_db.admin_dsn.replace("postgresql://", "postgresql+psycopg://", 1)
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS dpproxy CASCADE")  # the ledger's default schema


def _spent(ledger_url: str, user: str, budget: Budget) -> float:
    ledger = Ledger.from_url(ledger_url)
    try:
        return ledger.balance(user, budget).spent_epsilon
    finally:
        ledger.close()


def test_32_concurrent_clients_racing_a_nearly_spent_budget_charge_exactly_what_fits(test_db, ledger_url):
    proxy = _tight_proxy(test_db, ledger_url)
    try:
        outcomes = race([proxy.dsn(user="tight", password="tight")],
                        [f"SELECT COUNT(*) FROM adult WHERE age > {i}" for i in range(32)])
    finally:
        proxy.stop()
    assert outcomes.count("ok") == 10  # ε = 1 each, budget 10.5
    assert outcomes.count("DP002") == 22
    assert _spent(ledger_url, "tight", Budget(10.5, 0.001)) == pytest.approx(10.0)


def test_refusal_message_says_what_was_asked_and_what_remains(test_db, tmp_path):
    proxy = _tight_proxy(test_db, f"sqlite:///{tmp_path / 'l.sqlite3'}")
    try:
        with psycopg.connect(proxy.dsn(user="tight", password="tight"), autocommit=True, prepare_threshold=None) as conn:
            for i in range(10):
                conn.execute(f"SELECT COUNT(*) FROM adult WHERE age > {i}")
            with pytest.raises(psycopg.Error) as info:
                conn.execute("SELECT COUNT(*) FROM adult WHERE age > 50")
    finally:
        proxy.stop()
    diag = info.value.diag
    assert diag.sqlstate == "DP002"
    assert "costs ε=1" in diag.message_primary and "ε=0.5" in diag.message_primary
    assert "dpproxy.epsilon" in diag.message_hint


def test_notice_and_show_budget_agree_with_the_ledger(test_db, tmp_path):
    url = f"sqlite:///{tmp_path / 'l.sqlite3'}"
    proxy = _tight_proxy(test_db, url)
    notices: list[str] = []
    try:
        with psycopg.connect(proxy.dsn(user="tight", password="tight"), autocommit=True, prepare_threshold=None) as conn:
            conn.add_notice_handler(lambda d: notices.append(d.message_primary))
            conn.execute("SELECT COUNT(*), SUM(age) FROM adult WHERE age > 30")
            conn.execute("SELECT COUNT(*) FROM adult WHERE age > 31")
            cur = conn.execute("SHOW dpproxy.budget")
            names = [d.name for d in cur.description]
            row = dict(zip(names, cur.fetchone()))
    finally:
        proxy.stop()
    assert row["user"] == "tight"
    assert row["spent_epsilon"] == pytest.approx(2.0)
    assert row["remaining_epsilon"] == pytest.approx(8.5)
    assert row["spent_epsilon"] == pytest.approx(_spent(url, "tight", Budget(10.5, 0.001)))
    assert re.search(r"remaining ε 8\.5\b", notices[-1]), notices
    assert "count: laplace scale 2" in notices[0] and "sum: laplace scale 180" in notices[0]


def test_set_epsilon_lowers_the_cost_and_is_refused_above_the_maximum(test_db, tmp_path):
    url = f"sqlite:///{tmp_path / 'l.sqlite3'}"
    proxy = _tight_proxy(test_db, url)
    try:
        with psycopg.connect(proxy.dsn(user="tight", password="tight"), autocommit=True, prepare_threshold=None) as conn:
            conn.execute("SET dpproxy.epsilon = 0.25")
            assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.25",)
            conn.execute("SELECT COUNT(*) FROM adult WHERE age > 30")
            with pytest.raises(psycopg.Error) as info:
                conn.execute("SET dpproxy.epsilon = 5")
            assert info.value.diag.sqlstate == "DP003"
            assert info.value.diag.message_primary == (
                "dpproxy.epsilon = 5 is above 1, the largest per-query ε of a protected table "
                "(tables.public.adult.epsilon in the policy) (rule: epsilon-maximum)")
            conn.execute("RESET dpproxy.epsilon")
            assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("default",)
        with psycopg.connect(proxy.dsn(user="capped", password="capped"), autocommit=True, prepare_threshold=None) as conn:
            notices: list[str] = []
            conn.add_notice_handler(lambda d: notices.append(d.message_primary))
            conn.execute("SELECT COUNT(*) FROM adult")
            assert "ε charged 0.5" in notices[-1]  # the user's max_query_epsilon caps the table's 1.0
            with pytest.raises(psycopg.Error) as info:
                conn.execute("SET dpproxy.epsilon = 0.75")
            assert info.value.diag.message_primary == (
                "dpproxy.epsilon = 0.75 is above 0.5, capped's max_query_epsilon "
                "(users.capped.max_query_epsilon in the policy) (rule: epsilon-maximum)")
            assert "give at most 0.5" in info.value.diag.message_hint
    finally:
        proxy.stop()
    assert _spent(url, "tight", Budget(10.5, 0.001)) == pytest.approx(0.25)


def test_refused_queries_cost_nothing(test_db, tmp_path):
    url = f"sqlite:///{tmp_path / 'l.sqlite3'}"
    proxy = _tight_proxy(test_db, url)
    try:
        with psycopg.connect(proxy.dsn(user="tight", password="tight"), autocommit=True, prepare_threshold=None) as conn:
            for sql in ("SELECT * FROM adult", "SELECT COUNT(*) FROM adult GROUP BY sex",
                        "SELECT COUNT(*) FROM adult WHERE age / 0 = 1", "SELECT COUNT(*) FROM adult LIMIT 0"):
                try:
                    conn.execute(sql)
                except psycopg.Error:
                    pass
    finally:
        proxy.stop()
    assert _spent(url, "tight", Budget(10.5, 0.001)) == 0.0


def test_a_repeated_query_gets_the_same_answer_for_free(test_db, tmp_path):
    url = f"sqlite:///{tmp_path / 'l.sqlite3'}"
    proxy = _tight_proxy(test_db, url, TIGHT.replace("repeats: {{enabled: false}}", "repeats: {{ttl_s: 600}}"))
    try:
        with psycopg.connect(proxy.dsn(user="tight", password="tight"), autocommit=True) as conn:
            first = conn.execute("SELECT COUNT(*) FROM adult WHERE age > %s", (44,)).fetchone()
            again = [conn.execute("SELECT count(*)  FROM adult WHERE age >  %s", (44,)).fetchone() for _ in range(5)]
            other = conn.execute("SELECT COUNT(*) FROM adult WHERE age > %s", (45,)).fetchone()
    finally:
        proxy.stop()
    assert all(a == first for a in again)
    # Five repeats were free; the query with another parameter was charged: 2 in all.
    assert other is not None
    assert _spent(url, "tight", Budget(10.5, 0.001)) == pytest.approx(2.0)


def test_one_ledger_write_reserves_ten_answers_and_a_clean_stop_returns_the_rest(test_db, tmp_path):
    url = f"sqlite:///{tmp_path / 'l.sqlite3'}"
    proxy = _tight_proxy(test_db, url, TIGHT.replace("epsilon: 1000000, delta: 0.5", "epsilon: 1000, delta: 0.5"))
    try:
        with proxy.connect() as conn:
            for i in range(25):
                conn.execute(f"SELECT COUNT(*) FROM adult WHERE age > {i}")
            assert conn.execute("SHOW dpproxy.budget").fetchone()[1] == pytest.approx(25.0)
    finally:
        proxy.stop()
    ledger = Ledger.from_url(url)
    try:
        kinds = [entry.kind for entry in ledger.history("analyst")]
        assert kinds == ["charge", "charge", "charge", "release"]  # 10 + 10 + 10 reserved, 5 returned
        assert ledger.balance("analyst", Budget(1000, 0.5)).spent_epsilon == pytest.approx(25.0)
    finally:
        ledger.close()


def test_an_exhausted_budget_s_hint_offers_only_what_can_help_and_when_it_renews(test_db, tmp_path):
    # The hint said "Lower the cost with SET dpproxy.epsilon" with ε=0 left, and "It renews every
    # week" without saying when.
    from datetime import datetime, timedelta, timezone

    weekly = TEST_POLICY.replace(
        "users:\n", "users:\n  weekly:\n    password: weekly\n    budget: {{epsilon: 2, delta: 1.0e-7, period: week}}\n")
    proxy = _tight_proxy(test_db, f"sqlite:///{tmp_path / 'l.sqlite3'}", weekly)
    hints = []
    try:
        with psycopg.connect(proxy.dsn(user="weekly", password="weekly"), autocommit=True,
                             prepare_threshold=None) as conn:
            for sql in ("SELECT MIN(age) FROM adult", "SELECT COUNT(*) FROM adult WHERE age > 1",
                        "SELECT COUNT(*) FROM adult WHERE age > 2", "SELECT COUNT(*) FROM adult WHERE age > 3"):
                try:
                    conn.execute(sql)
                except psycopg.Error as exc:
                    assert exc.sqlstate == "DP002"
                    hints.append(exc.diag.message_hint)
    finally:
        proxy.stop()
    today = datetime.now(timezone.utc).date()
    renewal = f"It renews every week, next at {today + timedelta(days=7 - today.weekday()):%Y-%m-%d} 00:00 UTC."
    assert hints == [
        "Either leave out MIN, MAX and AVG by sample and aggregate, the only aggregates that cost δ, or ask an "
        "administrator for more (dpproxy budget grant). " + renewal,
        "Ask an administrator for more (dpproxy budget grant). " + renewal,
    ]


def _show_budget(proxy: RunningProxy) -> tuple[dict[str, float], list[str]]:
    """SHOW dpproxy.budget as the analyst: its spent and remaining ε, and the notices with it."""
    notices: list[str] = []
    with proxy.connect() as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        cursor = conn.execute("SHOW dpproxy.budget")
        row = dict(zip([d.name for d in cursor.description or ()], cursor.fetchone() or ()))
    return {name: float(row[name]) for name in ("spent_epsilon", "remaining_epsilon")}, notices


def test_show_budget_on_a_replica_names_the_reservations_others_may_hold_and_shows_no_more_than_can_be_spent(
        test_db, ledger_url):
    # Replicas on one PostgreSQL ledger cannot ask each other to give reservations back, as
    # workers do: what one reserved is counted as spent on the other until it comes back. The
    # figures stay those the ledger allows; the notice says why spent may be above the answers'.
    text = TEST_POLICY.replace('ledger: {{url: "sqlite:///{ledger}"}}',
                               f'ledger: {{{{url: "{ledger_url}", reserve: 10, release_idle_s: 3600}}}}')
    first = RunningProxy(make_policy(test_db, Path("unused"), text))
    try:
        second = RunningProxy(make_policy(test_db, Path("unused"), text)) if "postgresql" in ledger_url else None
        try:
            before, _ = _show_budget(first)
            with first.connect() as conn:
                conn.execute("SELECT COUNT(*) FROM adult").fetchone()  # reserves 10 answers' worth
            mine, notices = _show_budget(first)
            assert mine["spent_epsilon"] == pytest.approx(before["spent_epsilon"] + 1.0)
            if second is None:  # a SQLite ledger: no replica shares it, nothing to explain
                assert not [n for n in notices if "reservation" in n], notices
                return
            theirs, notices = _show_budget(second)
            assert theirs["spent_epsilon"] == pytest.approx(before["spent_epsilon"] + 10.0)
            assert theirs["remaining_epsilon"] == pytest.approx(before["remaining_epsilon"] - 10.0)
            assert any("reservations other dpproxy processes" in n and "3600 s" in n for n in notices), notices
        finally:
            if second is not None:
                second.stop()
    finally:
        first.stop()
    if second is not None:  # the first's clean stop gave its reservation back
        restarted = RunningProxy(make_policy(test_db, Path("unused"), text))
        try:
            assert _show_budget(restarted)[0]["spent_epsilon"] == pytest.approx(before["spent_epsilon"] + 1.0)
        finally:
            restarted.stop()
