"""The budget ledger against a real SQLite file and a real PostgreSQL (issue 4)."""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from policies.ledger import DEFAULT_PG_SCHEMA, Budget, Ledger
from policies.periods import period_key, period_start

REPO = Path(__file__).resolve().parents[1]
UTC = timezone.utc
DAY1 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Store:
    """Where a ledger lives: a SQLAlchemy URL and, for PostgreSQL, a schema."""

    url: str
    schema: str | None

    def open(self) -> Ledger:
        return Ledger(self.url, self.schema)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh, empty store: a new SQLite file, or a new schema in the PostgreSQL."""
    if request.param == "sqlite":
        yield Store(f"sqlite:///{tmp_path / 'ledger.db'}", None)
        return
    dsn: str = request.getfixturevalue("pg_dsn")
    schema = f"test_{uuid.uuid4().hex[:12]}"
    yield Store(_sqlalchemy_url(dsn), schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def ledger(store: Store) -> Iterator[Ledger]:
    with store.open() as opened:
        yield opened


def _sqlalchemy_url(dsn: str) -> str:
    return "postgresql+psycopg://" + dsn.split("://", 1)[1]


def _times(count: int, amount: float) -> float:
    """``count`` × ``amount`` computed exactly, as the ledger does."""
    return float(Decimal(repr(amount)) * count)


# --- charging -------------------------------------------------------------------------


def test_charges_accumulate_until_the_budget_is_spent(ledger: Ledger) -> None:
    budget = Budget(epsilon=1.0, delta=1e-5)
    results = [ledger.charge("ann", 0.25, 1e-6, budget) for _ in range(5)]
    assert [r.accepted for r in results] == [True, True, True, True, False]
    final = results[-1].balance
    assert (final.spent_epsilon, final.spent_delta) == (1.0, _times(4, 1e-6))
    assert (final.remaining_epsilon, final.limit_epsilon) == (0.0, 1.0)


def test_a_refused_charge_costs_nothing_and_reports_what_remains(ledger: Ledger) -> None:
    budget = Budget(epsilon=1.0, delta=0.0)
    assert ledger.charge("ann", 0.9, 0.0, budget).accepted
    refused = ledger.charge("ann", 0.2, 0.0, budget)
    assert not refused.accepted
    assert refused.balance.spent_epsilon == 0.9
    assert refused.balance.remaining_epsilon == 0.1
    assert ledger.balance("ann", budget) == refused.balance
    assert [e.kind for e in ledger.history("ann")] == ["charge"]


def test_a_charge_that_overruns_delta_spends_no_epsilon_either(ledger: Ledger) -> None:
    budget = Budget(epsilon=100.0, delta=1e-5)
    accepted = [ledger.charge("ann", 0.1, 1e-6, budget).accepted for _ in range(11)]
    assert accepted == [True] * 10 + [False]
    balance = ledger.balance("ann", budget)
    assert (balance.spent_epsilon, balance.spent_delta) == (1.0, 1e-5)
    assert ledger.charge("ann", 0.1, 0.0, budget).accepted


@pytest.mark.parametrize(("epsilon", "count", "limit"), [(1.0, 500, 500.0), (0.1, 10, 1.0)])
def test_repeated_charges_fit_a_budget_of_their_exact_sum(
    ledger: Ledger, epsilon: float, count: int, limit: float
) -> None:
    budget = Budget(epsilon=limit, delta=0.0)
    assert all(ledger.charge("ann", epsilon, 0.0, budget).accepted for _ in range(count))
    refused = ledger.charge("ann", 1e-12, 0.0, budget)
    assert not refused.accepted
    assert refused.balance.spent_epsilon == limit
    assert refused.balance.remaining_epsilon == 0.0


def test_an_infinite_budget_accepts_and_never_runs_out(ledger: Ledger) -> None:
    budget = Budget(epsilon=math.inf, delta=math.inf)
    result = ledger.charge("ann", 1e5, 0.5, budget)
    assert result.accepted
    assert result.balance.remaining_epsilon == math.inf


def test_a_policy_change_applies_to_the_next_charge(ledger: Ledger) -> None:
    assert ledger.charge("ann", 2.0, 0.0, Budget(epsilon=5.0, delta=0.0)).accepted
    lowered = Budget(epsilon=1.0, delta=0.0)
    assert ledger.balance("ann", lowered).remaining_epsilon == 0.0
    assert not ledger.charge("ann", 0.1, 0.0, lowered).accepted
    assert ledger.charge("ann", 0.1, 0.0, Budget(epsilon=3.0, delta=0.0)).accepted


def test_users_are_charged_separately_and_listed(ledger: Ledger) -> None:
    budget = Budget(epsilon=1.0, delta=0.0)
    assert ledger.charge("bob", 1.0, 0.0, budget).accepted
    assert ledger.charge("ann", 1.0, 0.0, budget).accepted
    assert ledger.users() == ["ann", "bob"]


def test_history_holds_one_row_per_accepted_charge_summing_to_the_spend(
    ledger: Ledger,
) -> None:
    budget = Budget(epsilon=1.0, delta=1e-5)
    for fingerprint in ("q1", "q2", "q3"):
        ledger.charge("ann", 0.4, 1e-6, budget, now=DAY1, fingerprint=fingerprint)
    entries = ledger.history("ann")
    assert [(e.kind, e.fingerprint, e.at) for e in entries] == [
        ("charge", "q1", DAY1),
        ("charge", "q2", DAY1),
    ]
    assert sum(e.epsilon for e in entries) == ledger.balance("ann", budget).spent_epsilon
    assert [e.fingerprint for e in ledger.history(limit=1)] == ["q2"]


# --- grants and resets ----------------------------------------------------------------


def test_a_grant_extends_the_current_period_only(ledger: Ledger) -> None:
    budget = Budget(epsilon=1.0, delta=0.0, period="day")
    assert ledger.charge("ann", 1.0, 0.0, budget, now=DAY1).accepted
    granted = ledger.grant("ann", 0.5, budget=budget, now=DAY1)
    assert (granted.limit_epsilon, granted.remaining_epsilon) == (1.5, 0.5)
    assert ledger.charge("ann", 0.5, 0.0, budget, now=DAY1).accepted
    assert not ledger.charge("ann", 0.1, 0.0, budget, now=DAY1).accepted
    next_day = ledger.balance("ann", budget, now=DAY1 + timedelta(days=1))
    assert (next_day.limit_epsilon, next_day.granted_epsilon) == (1.0, 0.0)


def test_a_reset_clears_the_spend_keeps_grants_and_is_recorded(ledger: Ledger) -> None:
    budget = Budget(epsilon=1.0, delta=1e-5)
    ledger.charge("ann", 0.75, 1e-6, budget)
    ledger.grant("ann", 0.5, budget=budget)
    after = ledger.reset("ann", budget)
    assert (after.spent_epsilon, after.spent_delta, after.remaining_epsilon) == (0.0, 0.0, 1.5)
    last = ledger.history("ann")[-1]
    assert (last.kind, last.epsilon, last.delta) == ("reset", 0.75, 1e-6)
    assert ledger.charge("ann", 1.5, 0.0, budget).accepted


# --- periods --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("period", "first", "last"),
    [
        ("day", datetime(2024, 5, 1, tzinfo=UTC), datetime(2024, 5, 1, 23, 59, 59, tzinfo=UTC)),
        ("week", datetime(2024, 4, 29, tzinfo=UTC), datetime(2024, 5, 5, 23, 59, tzinfo=UTC)),
        ("month", datetime(2024, 12, 1, tzinfo=UTC), datetime(2024, 12, 31, 23, 59, tzinfo=UTC)),
    ],
)
def test_spend_resets_at_the_utc_period_boundary(
    ledger: Ledger, period: str, first: datetime, last: datetime
) -> None:
    budget = Budget(epsilon=1.0, delta=0.0, period=period)
    assert ledger.charge("ann", 1.0, 0.0, budget, now=first).accepted
    assert not ledger.charge("ann", 0.5, 0.0, budget, now=last).accepted
    boundary = last.replace(second=0) + timedelta(minutes=1)
    following = ledger.charge("ann", 1.0, 0.0, budget, now=boundary)
    assert following.accepted
    assert following.balance.period_start == boundary
    assert ledger.balance("ann", budget, now=last).spent_epsilon == 1.0


def test_a_budget_without_period_never_resets(ledger: Ledger) -> None:
    budget = Budget(epsilon=1.0, delta=0.0)
    assert ledger.charge("ann", 1.0, 0.0, budget, now=DAY1).accepted
    assert not ledger.charge("ann", 0.1, 0.0, budget, now=DAY1 + timedelta(days=400)).accepted


def test_periods_are_taken_in_utc() -> None:
    paris_early = datetime(2024, 5, 1, 1, 0, tzinfo=timezone(timedelta(hours=2)))
    assert period_start("day", paris_early) == datetime(2024, 4, 30, tzinfo=UTC)
    assert period_key("week", paris_early) == "week:2024-04-29"
    assert period_key("month", paris_early) == "month:2024-04-01"
    assert period_key(None, paris_early) == "total"
    assert period_start("day", datetime(2024, 5, 1, 1, 0)) == datetime(2024, 5, 1, tzinfo=UTC)


# --- validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user", "epsilon", "delta"),
    [
        ("ann", -0.1, 0.0),
        ("ann", 0.1, -1e-9),
        ("ann", math.nan, 0.0),
        ("ann", math.inf, 0.0),
        ("ann", 1e7, 0.0),
        ("", 0.1, 0.0),
    ],
)
def test_invalid_charges_are_rejected_and_cost_nothing(
    ledger: Ledger, user: str, epsilon: float, delta: float
) -> None:
    budget = Budget(epsilon=1.0, delta=1e-5)
    with pytest.raises(ValueError):
        ledger.charge(user, epsilon, delta, budget)
    assert ledger.history() == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": -1.0, "delta": 0.0},
        {"epsilon": 1.0, "delta": math.nan},
        {"epsilon": 1.0, "delta": 0.0, "period": "year"},
    ],
)
def test_invalid_budgets_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Budget(**kwargs)


def test_non_numeric_amounts_are_a_type_error(ledger: Ledger) -> None:
    with pytest.raises(TypeError):
        ledger.charge("ann", True, 0.0, Budget(epsilon=1.0, delta=0.0))  # type: ignore[arg-type]


def test_negative_grant_is_rejected(ledger: Ledger) -> None:
    with pytest.raises(ValueError):
        ledger.grant("ann", -1.0, budget=Budget(epsilon=1.0, delta=0.0))


def test_an_in_memory_sqlite_ledger_is_refused() -> None:
    with pytest.raises(ValueError, match="durable"):
        Ledger("sqlite://")


# --- opening the store ----------------------------------------------------------------


def test_from_url_takes_a_file_path(tmp_path: Path) -> None:
    budget = Budget(epsilon=1.0, delta=0.0)
    with Ledger.from_url(str(tmp_path / "ledger.db")) as ledger:
        ledger.charge("ann", 0.5, 0.0, budget)
    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as reopened:
        assert reopened.balance("ann", budget).spent_epsilon == 0.5


def test_postgresql_tables_live_in_the_dpproxy_schema(pg_dsn: str) -> None:
    with Ledger.from_url(pg_dsn) as ledger:
        ledger.balance("ann", Budget(epsilon=1.0, delta=0.0))
        inspector = sa.inspect(ledger._engine)
        tables = set(inspector.get_table_names(schema=DEFAULT_PG_SCHEMA))
    assert {"budget_spend", "budget_history"} <= tables


def test_replicas_opening_a_fresh_store_together_all_succeed(store: Store) -> None:
    barrier = threading.Barrier(6)

    def open_and_charge(_: int) -> bool:
        barrier.wait()
        with store.open() as ledger:
            return ledger.charge("ann", 0.1, 0.0, Budget(epsilon=1.0, delta=0.0)).accepted

    with ThreadPoolExecutor(6) as pool:
        assert all(pool.map(open_and_charge, range(6)))


# --- concurrency and durability -------------------------------------------------------

RACE_BUDGET = Budget(epsilon=10.0, delta=1e-5)
RACE_EPSILON, RACE_DELTA = 0.1, 1e-8


def _assert_exactly_what_fits(ledger: Ledger, accepted: int, attempts: int) -> None:
    """After spending 9.0 of 10.0, exactly ten charges of 0.1 fit, whoever raced."""
    assert (accepted, attempts - accepted) == (10, attempts - 10)
    balance = ledger.balance("ann", RACE_BUDGET)
    assert balance.spent_epsilon == 9.0 + _times(accepted, RACE_EPSILON) == 10.0
    assert balance.spent_delta == _times(accepted, RACE_DELTA)
    charges = [e for e in ledger.history("ann") if e.kind == "charge"]
    assert len(charges) == accepted + 1


def test_racing_threads_never_overspend(store: Store) -> None:
    threads, per_thread = 32, 3
    with store.open() as ledger:
        assert ledger.charge("ann", 9.0, 0.0, RACE_BUDGET).accepted
        barrier = threading.Barrier(threads)

        def race(_: int) -> int:
            barrier.wait()
            return sum(
                ledger.charge("ann", RACE_EPSILON, RACE_DELTA, RACE_BUDGET).accepted
                for _ in range(per_thread)
            )

        with ThreadPoolExecutor(threads) as pool:
            accepted = sum(pool.map(race, range(threads)))
        _assert_exactly_what_fits(ledger, accepted, threads * per_thread)


def _race_in_process(
    store: Store, barrier: Any, attempts: int, results: multiprocessing.Queue[int]
) -> None:
    with store.open() as ledger:
        barrier.wait()
        results.put(
            sum(
                ledger.charge("ann", RACE_EPSILON, RACE_DELTA, RACE_BUDGET).accepted
                for _ in range(attempts)
            )
        )


def test_racing_processes_never_overspend(store: Store) -> None:
    processes, per_process = 4, 8
    with store.open() as ledger:
        assert ledger.charge("ann", 9.0, 0.0, RACE_BUDGET).accepted
        context = multiprocessing.get_context("spawn")
        barrier = context.Barrier(processes)
        results: multiprocessing.Queue[int] = context.Queue()
        workers = [
            context.Process(target=_race_in_process, args=(store, barrier, per_process, results))
            for _ in range(processes)
        ]
        for worker in workers:
            worker.start()
        accepted = sum(results.get(timeout=60) for _ in workers)
        for worker in workers:
            worker.join(timeout=10)
            assert worker.exitcode == 0
        _assert_exactly_what_fits(ledger, accepted, processes * per_process)


_CHARGE_AND_HANG = textwrap.dedent(
    """
    import sys, time
    from policies.ledger import Budget, Ledger
    ledger = Ledger(sys.argv[1], sys.argv[2] or None)
    result = ledger.charge("ann", 0.25, 1e-6, Budget(epsilon=1.0, delta=1e-5))
    print("committed" if result.accepted else "refused", flush=True)
    time.sleep(120)
    """
)


def test_a_committed_charge_survives_kill_9(store: Store) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), *sys.path])}
    child = subprocess.Popen(
        [sys.executable, "-c", _CHARGE_AND_HANG, store.url, store.schema or ""],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "committed"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()
    assert child.returncode == -signal.SIGKILL
    with store.open() as reopened:
        balance = reopened.balance("ann", Budget(epsilon=1.0, delta=1e-5))
        assert (balance.spent_epsilon, balance.spent_delta) == (0.25, 1e-6)
        assert len(reopened.history("ann")) == 1


def test_the_next_renewal_is_the_start_of_the_following_utc_period():
    from datetime import datetime, timezone

    from policies.periods import next_period_start

    now = datetime(2024, 12, 31, 23, 59, tzinfo=timezone.utc)  # a Tuesday
    assert next_period_start("day", now) == datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert next_period_start("week", now) == datetime(2025, 1, 6, tzinfo=timezone.utc)
    assert next_period_start("month", now) == datetime(2025, 1, 1, tzinfo=timezone.utc)
    assert next_period_start("month", datetime(2024, 1, 31, tzinfo=timezone.utc)) == datetime(2024, 2, 1, tzinfo=timezone.utc)
    assert next_period_start(None, now) is None


def test_a_committed_charge_survives_a_crash_of_the_ledgers_postgresql_under_asynchronous_commit() -> None:
    """An operator's ``synchronous_commit = off`` (for the server, the database or the role: a
    common tuning) acknowledges a commit before its WAL is on disk, and a crash of PostgreSQL
    (a backend killed: the postmaster resets shared memory, WAL buffers included) forgets it.
    A charge, or a reservation answers were then spent from, would vanish: an overspend. The
    ledger's own sessions commit synchronously whatever the defaults say."""
    from tests.own_postgres import own_postgres

    with own_postgres("ledgerdb", "dpproxy-ledger-crash-") as server:
        with psycopg.connect(server.admin_dsn, autocommit=True) as admin:
            # The WAL writer flushes only every 10 s: an asynchronous commit stays in memory.
            admin.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
            admin.execute("ALTER DATABASE ledgerdb SET synchronous_commit = off")
            admin.execute("SELECT pg_catalog.pg_reload_conf()")
        url = _sqlalchemy_url(server.admin_dsn)
        with Ledger(url) as ledger:
            ledger.balance("ann", Budget(epsilon=1.0, delta=1e-5))  # the tables, before the charge
            assert ledger.charge("ann", 0.25, 1e-6, Budget(epsilon=1.0, delta=1e-5)).accepted
            with psycopg.connect(server.admin_dsn, autocommit=True) as victim:
                (pid,) = victim.execute("SELECT pg_catalog.pg_backend_pid()").fetchone()  # type: ignore[misc]
                assert victim.execute("SHOW synchronous_commit").fetchone() == ("off",)
                os.kill(pid, signal.SIGKILL)  # the postmaster ends every backend and recovers from WAL
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(server.admin_dsn, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline, "PostgreSQL did not come back after the crash"
                time.sleep(0.2)
        with Ledger(url) as reopened:
            balance = reopened.balance("ann", Budget(epsilon=1.0, delta=1e-5))
            assert (balance.spent_epsilon, balance.spent_delta) == (0.25, 1e-6)
            assert len(reopened.history("ann")) == 1


@pytest.mark.parametrize(("default", "session"), [
    ("off", "on"), ("local", "on"), ("remote_write", "on"), ("on", "on"), ("remote_apply", "remote_apply")])
def test_the_ledgers_sessions_commit_at_least_as_durably_as_on(pg_dsn: str, default: str, session: str) -> None:
    """Whatever the database's default, a ledger session waits for its WAL flush (and, with
    synchronous replication, the standby's); an operator's stronger remote_apply is kept."""
    database = f"ledger_sync_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {database}")
        admin.execute(f"ALTER DATABASE {database} SET synchronous_commit = {default}")
    try:
        url = sa.make_url(_sqlalchemy_url(pg_dsn)).set(database=database)
        with Ledger(url.render_as_string(hide_password=False)) as ledger:
            ledger.balance("ann", Budget(epsilon=1.0, delta=1e-5))
            with ledger._engine.connect() as conn:
                assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == session
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute(f"DROP DATABASE {database} WITH (FORCE)")


def test_a_sqlite_ledger_syncs_every_commit(tmp_path: Path) -> None:
    """synchronous = FULL in WAL mode: a commit is on disk when charge() returns, so a power
    loss cannot forget a reservation whose answers were released (NORMAL syncs at checkpoints)."""
    with Ledger(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        ledger.balance("ann", Budget(epsilon=1.0, delta=1e-5))
        with ledger._engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL


def test_a_postgresql_ledger_on_a_server_without_fsync_is_reported_when_opened(
        caplog: pytest.LogCaptureFixture) -> None:
    """fsync = off is the server's, which no session can undo: the operator is told at start."""
    from tests.own_postgres import own_postgres

    with own_postgres("ledgerdb", "dpproxy-ledger-fsync-") as server:
        url = _sqlalchemy_url(server.admin_dsn)
        with caplog.at_level("WARNING", logger="dpproxy.budget"), Ledger(url):
            assert not [r for r in caplog.records if "fsync" in r.getMessage()]
        with psycopg.connect(server.admin_dsn, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM SET fsync = off")
            admin.execute("SELECT pg_catalog.pg_reload_conf()")
            time.sleep(0.5)  # the reload reaches new sessions once the postmaster has read it
            assert admin.execute("SELECT 1").fetchone() == (1,)
        caplog.clear()
        with caplog.at_level("WARNING", logger="dpproxy.budget"), Ledger(url):
            pass
        assert [r for r in caplog.records if "fsync = off" in r.getMessage()]
