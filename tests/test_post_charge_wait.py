"""The gate (tests/post_charge_wait.py) is a wait a DP statement meets after its charge, in its run.

The fault tests that place a fault after the charge rely on it: were the gate met before the
charge (by the lock step, or by any other step of dpproxy's that read rows), their faults would
test the uncharged path; were it met by nothing, they would wait for nothing. Both are pinned
here, without any timing: the waiting backend is found in ``pg_locks`` and ``pg_stat_activity``,
and the charge is read from the budget keeper while it waits.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from tests.conftest import TEST_POLICY, TestDatabase, running_proxy, spent_epsilon
from tests.post_charge_wait import create_gated, hold_gate, waiting_at_gate, with_toasted
from tests.reconcile import spend_while_running

_GATE = "gate0_gate"
_LOCK_STEP = ("SELECT 1 FROM (", "BEGIN; SELECT 1 FROM (")  # proxy/serving/relation_locks.py's step, maybe in a block
BOUND_S = 30.0


def test_a_dp_statement_on_a_gated_view_waits_at_the_gate_charged_and_its_lock_step_does_not(
    test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        create_gated(admin, "gate0", gate=_GATE)
    try:
        with running_proxy(test_db, tmp_path_factory, with_toasted(TEST_POLICY, "public.gate0")) as proxy, \
                proxy.connect() as conn, psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
            assert conn.execute("SELECT COUNT(*) FROM gate0 WHERE age > 3").fetchone() is not None  # the gate open
            before = spent_epsilon(conn)
            hold_gate(admin, _GATE)
            outcome: list[Any] = []
            thread = threading.Thread(target=lambda: outcome.append(
                conn.execute("SELECT COUNT(*) FROM gate0 WHERE age > 4").fetchone()), daemon=True)
            thread.start()
            deadline = time.monotonic() + BOUND_S
            while not (waiting := waiting_at_gate(admin, _GATE)):
                assert not outcome and time.monotonic() < deadline, f"the statement never waited at the gate: {outcome}"
                time.sleep(0.02)
            (pid, statement), = waiting
            assert not statement.startswith(_LOCK_STEP) and "gate0" in statement, statement  # the run itself
            assert spend_while_running(proxy, "analyst").keeper == before + 1  # charged while it waits
            admin.execute("ROLLBACK")
            thread.join(BOUND_S)
            assert outcome and outcome[0] is not None, outcome
            assert spent_epsilon(conn) == before + 1
    finally:
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
            admin.execute(f"DROP TABLE IF EXISTS gate0_rows, {_GATE} CASCADE")
