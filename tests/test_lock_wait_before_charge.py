"""A DP statement waits for the operator's locks before it is charged, not after.

A DP statement waits for an ``ACCESS EXCLUSIVE`` lock another session holds on its table (DDL,
``LOCK TABLE``, a VACUUM truncating the tail; on a hot standby, each one the primary takes).
Found and fixed (budget): the statement was charged first and then waited, so a wait that ran
into ``statement_timeout`` (or the client's cancel) was a charged 57014 for a failure no row
decided. The statement's locks are now taken by its backend SQL under ``LIMIT 0``
(``proxy/serving/relation_locks.py``), sent with the DP SQL in one pipeline, whose charge goes
back when the step fails (the run then never executes); a wait that ends in a timeout or cancel
is an uncharged 57014 that names the table. The lock step reads no row, so neither its success
nor its time depends on one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from proxy.serving.relation_locks import lock_step_sql
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.dp_count_sends import answered_once_released, cancelled_while_waiting, count_sends

_TIMEOUT_MS = 600
_POLICY = ATTACK_POLICY_HEAD.replace("statement_timeout_ms: 10000", f"statement_timeout_ms: {_TIMEOUT_MS}") + """
  public.lock0:
    access: protected
    epsilon: 1.0
    columns:
      v: {{bounds: [0, 100], group_by: true}}
"""


@pytest.fixture(scope="module")
def lock_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP VIEW IF EXISTS lockv")
        admin.execute("DROP TABLE IF EXISTS lock0")
        admin.execute("CREATE TABLE lock0 (id int8 PRIMARY KEY, v int4)")
        admin.execute("CREATE INDEX lock0_v ON lock0 (v)")
        admin.execute("INSERT INTO lock0 SELECT g, g % 100 FROM generate_series(1, 500) g")
        # A view whose expression fails on every row: a step that met a row would fail.
        admin.execute("CREATE OR REPLACE FUNCTION lock_fails(x int4) RETURNS int4 LANGUAGE plpgsql AS "
                      "$$ BEGIN RAISE EXCEPTION 'a row was read'; END $$")
        admin.execute("CREATE VIEW lockv AS SELECT id, lock_fails(v) AS v FROM lock0")
        admin.execute("GRANT SELECT ON lock0, lockv TO dpproxy_service")
        admin.execute("ANALYZE lock0")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


@contextmanager
def _locked(admin_dsn: str, lock: str = "LOCK TABLE lock0 IN ACCESS EXCLUSIVE MODE") -> Iterator[psycopg.Connection]:
    """The operator's transaction holding ``lock``, left open."""
    with psycopg.connect(admin_dsn) as operator:
        operator.execute(lock)
        try:
            yield operator
        finally:
            operator.rollback()


def _assert_uncharged_lock_wait(failure: psycopg.Error) -> None:
    assert failure.sqlstate == "57014"
    assert "while waiting for a lock on public.lock0" in str(failure.diag.message_primary)
    assert "nothing was charged" in str(failure.diag.message_hint)


_SENDS = count_sends("lock0")
_CUTOFFS = {"simple": 10, "extended": 20, "copy": 30, "block": 40, "pipeline": 50}


@pytest.mark.parametrize("way", list(_SENDS))
def test_a_dp_statement_timed_out_waiting_for_a_lock_is_not_charged(
        lock_proxy: RunningProxy, test_db: TestDatabase, way: str) -> None:
    # Before: charged 1.0 for the 57014 of a wait for the operator's lock that outlasted
    # statement_timeout, with no word of the lock.
    send, cutoff = _SENDS[way], _CUTOFFS[way]
    with lock_proxy.connect() as other, lock_proxy.connect() as conn:
        send(conn, 1)  # Parse, COPY and the pipeline's statements seen once, nothing locked
        spent = spent_epsilon(other)
        with _locked(test_db.admin_dsn):
            with pytest.raises(psycopg.errors.QueryCanceled) as failed:
                send(conn, cutoff)
            assert spent_epsilon(other) == spent
            _assert_uncharged_lock_wait(failed.value)
        # Nothing of the failure was stored as an answer: asked again, it is answered fresh, charged.
        send(conn, cutoff)
        assert spent_epsilon(other) > spent
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_dp_statement_is_answered_and_charged_once_when_the_lock_is_released_in_time(
        lock_proxy: RunningProxy, test_db: TestDatabase) -> None:
    with lock_proxy.connect() as other, lock_proxy.connect() as conn:
        with _locked(test_db.admin_dsn) as operator:
            answered_once_released(conn, other, "SELECT COUNT(*) FROM lock0 WHERE v < 60", operator, _TIMEOUT_MS / 4000)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_cancelled_wait_for_a_lock_is_not_charged(lock_proxy: RunningProxy, test_db: TestDatabase) -> None:
    with lock_proxy.connect() as other, lock_proxy.connect() as conn:
        spent = spent_epsilon(other)
        with _locked(test_db.admin_dsn):
            _assert_uncharged_lock_wait(
                cancelled_while_waiting(conn, other, "SELECT COUNT(*) FROM lock0 WHERE v < 70", _TIMEOUT_MS / 4000))
        assert conn.execute("SELECT COUNT(*) FROM lock0 WHERE v < 70").fetchone() is not None
        assert spent_epsilon(other) == pytest.approx(spent + 1.0)


def test_a_lock_on_an_index_of_the_table_is_waited_for_before_the_charge(
        lock_proxy: RunningProxy, test_db: TestDatabase) -> None:
    # The planner opens every index of a table it reads: an index's ACCESS EXCLUSIVE lock (a
    # REINDEX INDEX, also replayed on a hot standby) is waited for at the lock step, which plans.
    with lock_proxy.connect() as other, lock_proxy.connect() as conn:
        spent = spent_epsilon(other)
        with _locked(test_db.admin_dsn, "REINDEX INDEX lock0_v"):
            with pytest.raises(psycopg.errors.QueryCanceled) as failed:
                conn.execute("SELECT COUNT(*) FROM lock0 WHERE v < 80")
            assert spent_epsilon(other) == spent
            _assert_uncharged_lock_wait(failed.value)


def test_the_lock_step_reads_no_row(lock_proxy: RunningProxy, test_db: TestDatabase) -> None:
    # Its success must not depend on a row: over a view whose expression fails on every row it
    # succeeds (the run would fail), and the table's read counters do not move.
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        def reads() -> tuple[int, int]:
            admin.execute("SELECT pg_catalog.pg_stat_force_next_flush()")
            admin.execute("SELECT pg_catalog.pg_stat_clear_snapshot()")
            row = admin.execute("SELECT seq_tup_read, coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables "
                                "WHERE relid = 'lock0'::regclass").fetchone()
            assert row is not None
            return int(row[0]), int(row[1])

        before = reads()
        for sql in ("SELECT count(*) FROM lock0 WHERE v < 5", "SELECT count(v) FROM lockv WHERE id < 9",
                    "SELECT v, count(*) FROM lock0 WHERE id = 3 GROUP BY v"):
            admin.execute(lock_step_sql(sql))
        assert reads() == before
        with pytest.raises(psycopg.errors.RaiseException):
            admin.execute("SELECT count(v) FROM lockv WHERE id < 9")
