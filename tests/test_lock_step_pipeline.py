"""A DP statement's lock step and its run go in one pipeline, after the charge.

The lock step (``proxy/serving/relation_locks.py``) used to be a statement of its own, waited
for before the charge: one round trip more per DP statement, and outside a client's block its
locks ended with it, so a lock the operator took between the step and the run was met after
the charge. Now the step, a Flush, the run and one Sync go in one libpq pipeline
(``BackendSession.after_steps``) after the charge: one transaction, so the step's locks are held
to the run; a failed step skips the run (PostgreSQL aborts the pipeline up to its Sync), so its
charge goes back, once. These tests pin what that rests on, on the backend, and the refunds
through dpproxy: a step's failure, and a connection lost (terminated or killed) while the step
waited, decided by the order of the results, never by timing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from own_postgres import own_postgres
from post_charge_wait import create_gated, hold_gate
from reconcile import assert_reconciled, audit_lines, spend_while_running
from test_backend_faults import LOST, POLICY, QUERY, OwnPostgres, Setup, _raised, _setup, bounded, wait_until

from policies.loader import parse_policy
from proxy.backend.connection import BackendLost, BackendSession, connect
from proxy.backend.errors import BackendError, StepFailed
from proxy.demo.embedded import SERVICE_ROLE
from proxy.serving.event_loop import run
from proxy.serving.relation_locks import LOCK_STEP_MARK, lock_step_sql


@pytest.fixture(scope="module")
def own_pg() -> Iterator[OwnPostgres]:
    """A server of this module's own: a test kills a backend with SIGKILL, which restarts them all."""
    with own_postgres("faults", "dpproxy-pipeline-pg-") as server:
        with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
            create_gated(conn, "people", SERVICE_ROLE)
            conn.execute("CREATE TABLE IF NOT EXISTS other (x int)")
            conn.execute("CREATE SEQUENCE IF NOT EXISTS runs")
            conn.execute(f"GRANT SELECT ON other TO {SERVICE_ROLE}")
            conn.execute(f"GRANT USAGE, SELECT ON SEQUENCE runs TO {SERVICE_ROLE}")
        yield OwnPostgres(server.data, server.system_user, server.admin_dsn, server.service_dsn)


@pytest.fixture
def setup(own_pg: OwnPostgres, tmp_path: Path) -> Iterator[Setup]:
    yield from _setup(own_pg, tmp_path, 20000)


@pytest.fixture
def short_timeout(own_pg: OwnPostgres, tmp_path: Path) -> Iterator[Setup]:
    yield from _setup(own_pg, tmp_path, 300)


# The run of the backend-level tests: it advances a sequence, which no rollback undoes, so
# whether it executed is read afterwards.
_RUN = "SELECT pg_catalog.nextval('runs')"


def _runs(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT last_value + (CASE WHEN is_called THEN 1 ELSE 0 END) FROM runs").fetchone()
    assert row is not None
    return int(row[0])


def _on_backend(own_pg: OwnPostgres, tmp_path: Path,
                scenario: Callable[[BackendSession, BackendSession], Any]) -> None:
    """Run ``scenario(session, watcher)`` on two backend sessions of their own (dpproxy's connect)."""
    text = POLICY.format(dsn=own_pg.service_dsn, timeout_ms=20000, ledger=tmp_path / "l.sqlite3",
                         audit=tmp_path / "a.jsonl", user="pipeline")
    policy = parse_policy(text, "faults.yaml")

    async def both() -> None:
        session, watcher = await connect(policy), await connect(policy)
        try:
            await asyncio.wait_for(scenario(session, watcher), 30)
        finally:
            await session.close()
            await watcher.close()

    run(both())


async def _waits_for_a_lock(watcher: BackendSession, pid: int) -> None:
    while not await watcher.fetch_all(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'", (pid,)):
        await asyncio.sleep(0.02)


def test_the_lock_step_is_the_run_itself_under_limit_0(own_pg: OwnPostgres) -> None:
    # Before: the step selected the whole row of the run as a subquery (one column, "locked",
    # a record), a query level more for the planner: ~17 % more of the step's instructions.
    run_sql = "SELECT pg_catalog.count(*), pg_catalog.sum(x) AS total, pg_catalog.max(x) FROM other WHERE x > 1"
    step = lock_step_sql(run_sql)
    assert step.startswith(LOCK_STEP_MARK)  # what an operator reading pg_stat_activity tells it by
    with psycopg.connect(own_pg.service_dsn, autocommit=True) as conn:
        ran, stepped = conn.execute(run_sql), conn.execute(step)
        assert stepped.fetchall() == []
        assert ran.description is not None and stepped.description is not None
        assert [(c.name, c.type_code) for c in stepped.description] == [(c.name, c.type_code) for c in ran.description]


def test_the_steps_locks_are_held_until_the_run_ends(own_pg: OwnPostgres, tmp_path: Path) -> None:
    # Before: the step was a statement of its own outside a block, its locks released at its
    # end; the run saw none of them, and an operator's lock could come in between.
    held = ("SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks WHERE pid = pg_catalog.pg_backend_pid() "
            "AND relation = 'other'::pg_catalog.regclass AND mode = 'AccessShareLock'")

    async def scenario(session: BackendSession, _: BackendSession) -> None:
        values, _types = await session.first_row(held, None, (lock_step_sql("SELECT x FROM other"),))
        assert values == [b"1"]
        assert session.transaction_status == b"I"  # the pipeline's implicit transaction has ended

    _on_backend(own_pg, tmp_path, scenario)


def test_a_run_longer_than_the_socket_buffer_returns_its_own_result_after_the_steps(
        own_pg: OwnPostgres, tmp_path: Path) -> None:
    # Before: while the run's last bytes were still being written, the step's result arrived and
    # was read as idle chatter and dropped, so the run's result stood where the step's should: an
    # IndexError (internal error) for a long IN list, and a failing run would have been taken for a
    # failed step and its charge given back.
    values = ", ".join(str(i) for i in range(400_000))  # ~3 MB of SQL, past any socket buffer
    long_run = f"SELECT pg_catalog.count(*) FROM other WHERE x IN ({values}) OR true"

    async def scenario(session: BackendSession, _: BackendSession) -> None:
        answered, _types = await session.first_row(long_run, None, (lock_step_sql("SELECT x FROM other"),) * 2)
        assert answered == [b"0"]
        with pytest.raises(BackendError) as failed:  # the run's own error, not a step's
            await session.first_row(long_run.replace("OR true", "OR 1 / 0 = 1"), None,
                                    (lock_step_sql("SELECT x FROM other"),))
        assert not isinstance(failed.value, StepFailed) and failed.value.sqlstate == "22012"

    _on_backend(own_pg, tmp_path, scenario)


def test_statement_timeout_runs_for_the_step_and_for_the_run_separately(own_pg: OwnPostgres, tmp_path: Path) -> None:
    # PostgreSQL's docs: in the extended protocol the timeout starts when a query message
    # arrives and is cancelled by an Execute's completion. Each statement sleeps 2 s of a 3 s
    # timeout; one timeout over both (4 s) would cancel the run.
    async def scenario(session: BackendSession, _: BackendSession) -> None:
        await session.execute("SET statement_timeout = 3000")
        values, _types = await session.first_row("SELECT pg_catalog.pg_sleep(2)::text", None,
                                                 ("SELECT pg_catalog.pg_sleep(2)",))
        assert values == [b""]

    _on_backend(own_pg, tmp_path, scenario)


def test_a_failed_step_skips_the_run_and_leaves_the_connection_usable(own_pg: OwnPostgres, tmp_path: Path) -> None:
    with psycopg.connect(own_pg.admin_dsn, autocommit=True) as admin:
        before = _runs(admin)

        async def scenario(session: BackendSession, _: BackendSession) -> None:
            with pytest.raises(StepFailed) as failed:
                await session.first_row(_RUN, None, ("SELECT 1", "SELECT 1/0"))
            assert failed.value.index == 1 and failed.value.error.sqlstate == "22012"
            assert session.transaction_status == b"I"
            assert (await session.execute("SELECT 2")).rows == [[b"2"]]

        _on_backend(own_pg, tmp_path, scenario)
        assert _runs(admin) == before


def test_a_cancel_during_the_step_ends_the_step_only(own_pg: OwnPostgres, tmp_path: Path) -> None:
    with psycopg.connect(own_pg.admin_dsn, autocommit=True) as admin, psycopg.connect(own_pg.admin_dsn) as operator:
        before = _runs(admin)
        operator.execute("LOCK TABLE other IN ACCESS EXCLUSIVE MODE")

        async def scenario(session: BackendSession, watcher: BackendSession) -> None:
            (pid,) = await session.fetch_row("SELECT pg_catalog.pg_backend_pid()")
            pipeline = asyncio.ensure_future(session.first_row(_RUN, None, (lock_step_sql("SELECT x FROM other"),)))
            await _waits_for_a_lock(watcher, pid)
            await session.cancel()
            with pytest.raises(StepFailed) as failed:
                await pipeline
            assert failed.value.error.sqlstate == "57014"

        _on_backend(own_pg, tmp_path, scenario)
        operator.rollback()
        assert _runs(admin) == before


@pytest.mark.parametrize("where", ["step", "run"])
def test_a_connection_terminated_in_the_step_is_not_reached_and_in_the_run_is(
        own_pg: OwnPostgres, tmp_path: Path, where: str) -> None:
    # The step waits for ``other``; or it passes and the run waits for it.
    step, wait = ("SELECT x FROM other", _RUN) if where == "step" else ("SELECT 1", "SELECT count(*) FROM other")
    with psycopg.connect(own_pg.admin_dsn) as operator:
        operator.execute("LOCK TABLE other IN ACCESS EXCLUSIVE MODE")

        async def scenario(session: BackendSession, watcher: BackendSession) -> None:
            (pid,) = await session.fetch_row("SELECT pg_catalog.pg_backend_pid()")
            pipeline = asyncio.ensure_future(session.first_row(wait, None, (lock_step_sql(step),)))
            await _waits_for_a_lock(watcher, pid)
            await watcher.fetch_all("SELECT pg_catalog.pg_terminate_backend(%s)", (pid,))
            with pytest.raises(BackendLost) as lost:
                await pipeline
            assert lost.value.reached == (where == "run")

        _on_backend(own_pg, tmp_path, scenario)
        operator.rollback()


def _dp_query_waiting(conn: psycopg.Connection[Any], admin: psycopg.Connection[Any]) -> Callable[[], Any]:
    """Start QUERY on ``conn`` in a thread, return once its backend waits for a lock; the function
    returned gives its result or exception."""
    outcome: list[Any] = []

    def ask() -> None:
        try:
            outcome.append(conn.execute(QUERY).fetchone())
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    wait_until(lambda: bool(admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND wait_event_type = 'Lock'",
        (SERVICE_ROLE,)).fetchone()[0]))  # type: ignore[index]

    def result() -> Any:
        worker.join(20)
        assert outcome, "a session running a DP query through the fault hung"
        return outcome[0]

    return result


def _service_pid_waiting(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT pid FROM pg_stat_activity WHERE usename = %s AND wait_event_type = 'Lock'",
                        (SERVICE_ROLE,)).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("how", ["terminate", "kill"])
@pytest.mark.parametrize("where", ["step", "run"])
def test_a_dp_statement_whose_backend_is_lost_in_its_lock_step_is_refunded_and_in_its_run_stays_charged(
        setup: Setup, own_pg: OwnPostgres, how: str, where: str) -> None:
    # In the step: the operator's lock on the table, which the step waits for; in the run: the
    # gate, which only the run meets (post_charge_wait). Either way the
    # statement was charged when its backend went; only the order of its results says which.
    with setup.connect() as conn:
        query = bounded(lambda: conn.execute(QUERY).fetchone())
        assert query is not None
        operator = psycopg.connect(own_pg.admin_dsn)
        watcher = psycopg.connect(own_pg.admin_dsn, autocommit=True)
        try:
            if where == "step":
                operator.execute("LOCK TABLE people IN ACCESS EXCLUSIVE MODE")
            else:
                hold_gate(operator)
            outcome_of = _dp_query_waiting(conn, watcher)
            assert spend_while_running(setup.proxy, setup.user).keeper == pytest.approx(2.0)  # charged first
            pid = _service_pid_waiting(watcher)
            if how == "terminate":
                watcher.execute("SELECT pg_terminate_backend(%s)", (pid,))
            else:
                os.kill(pid, signal.SIGKILL)  # the server restarts every backend, the operator's too
            outcome = outcome_of()
        finally:
            for admin in (operator, watcher):
                try:
                    admin.close()
                except psycopg.Error:
                    pass
        assert isinstance(outcome, psycopg.OperationalError) and outcome.sqlstate in LOST, outcome
    charged = 1.0 if where == "run" else None  # the audit line of an uncharged error carries no ε
    lines = audit_lines(setup.audit, setup.user, at_least=2)
    assert [(line["decision"], line["epsilon"]) for line in lines] == [("dp", 1.0), ("error", charged)]
    assert assert_reconciled(setup.proxy, setup.audit, setup.user, setup.metric_before) == pytest.approx(
        1.0 + (charged or 0.0))
    if how == "kill":
        wait_until(lambda: _accepts(own_pg))


def _accepts(own_pg: OwnPostgres) -> bool:
    try:
        with psycopg.connect(own_pg.admin_dsn, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def test_a_lock_the_operator_takes_while_a_statement_is_charged_is_never_met_after_the_charge(
        short_timeout: Setup, own_pg: OwnPostgres) -> None:
    # Before: the step ran and released its locks, then the charge, then the run; the operator's
    # lock taken during the charge was met by the run, a charged 57014. The charge is held here
    # (on the proxy's loop) while the operator takes the lock.
    setup = short_timeout
    budget = setup.proxy.server.budget
    charge, charging, charged = budget.charge, threading.Event(), threading.Event()

    async def held_charge(*args: Any, **kwargs: Any) -> Any:
        charging.set()
        while not charged.is_set():
            await asyncio.sleep(0.01)
        return await charge(*args, **kwargs)

    with setup.connect() as conn, psycopg.connect(own_pg.admin_dsn) as operator:
        budget.charge = held_charge  # type: ignore[method-assign]
        outcome: list[Any] = []
        worker = threading.Thread(target=lambda: outcome.append(_raised(lambda: conn.execute(QUERY).fetchone())))
        worker.start()
        assert charging.wait(20)
        operator.execute("LOCK TABLE people IN ACCESS EXCLUSIVE MODE")
        charged.set()
        worker.join(20)
        operator.rollback()
        budget.charge = charge  # type: ignore[method-assign]
        (failure,) = outcome
        assert isinstance(failure, psycopg.errors.QueryCanceled), failure
        assert "while waiting for a lock on public.people" in str(failure.diag.message_primary)
        assert "nothing was charged" in str(failure.diag.message_hint)
        assert spend_while_running(setup.proxy, setup.user).keeper == 0.0
        assert bounded(lambda: conn.execute(QUERY).fetchone()) is not None  # the session goes on
    assert assert_reconciled(setup.proxy, setup.audit, setup.user, setup.metric_before) == pytest.approx(1.0)
