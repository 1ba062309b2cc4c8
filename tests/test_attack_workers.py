"""Attack review of several serving processes, answer timing, timeouts, cancel, reload and shutdown.

The analyst holds a valid login and a budget, opens as many connections as they like (landing
on any worker of ``listen.workers``), times every answer, sends CancelRequests whenever they
choose and sets whatever session settings dpproxy lets through. Each hole found is pinned
here with the probe that found it; the probes that held stay as regression tests.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from conftest import TEST_DATABASE, TEST_POLICY, RunningProxy, TestDatabase, make_policy
from proxy.demo.embedded import SERVICE_ROLE

QUANTUM_S = 0.4
QUANTISED = TEST_POLICY.replace(
    "  public.adult:\n    access: protected\n    epsilon: 1.0\n",
    f"  public.adult:\n    access: protected\n    epsilon: 1.0\n    answer_quantum_ms: {int(QUANTUM_S * 1000)}\n",
)


@pytest.fixture(scope="module")
def quantised(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    assert QUANTISED != TEST_POLICY
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("quantised") / "l.sqlite3", QUANTISED))
    yield proxy
    proxy.stop()


# ------------------------------------------------------------------ timeouts as an oracle


@pytest.mark.parametrize("statement", [
    "SET idle_in_transaction_session_timeout = '50ms'",
    "SET LOCAL idle_in_transaction_session_timeout = 50",
    "SELECT set_config('idle_in_transaction_session_timeout', '50', false)",
])
def test_the_backends_idle_in_transaction_timeout_cannot_be_set(quantised: RunningProxy, statement: str):
    """The backend's idle-in-transaction timer runs while a quantised DP answer waits for its
    boundary inside a block, for q minus the time the rows took: with it at T, whether the
    connection (and the block) survived said whether the backend needed less than q − T."""
    with quantised.connect() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="idle_in_transaction_session_timeout"):
            conn.execute(statement)


@pytest.fixture
def role_idle_timeout(test_db: TestDatabase) -> Iterator[None]:
    """The service role with an idle_in_transaction_session_timeout of 100 ms in the test
    database, as an operator's ALTER ROLE (or postgresql.conf) would give it."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        role, database = sql.Identifier(SERVICE_ROLE), sql.Identifier(TEST_DATABASE)
        admin.execute(sql.SQL("ALTER ROLE {} IN DATABASE {} SET idle_in_transaction_session_timeout = '100ms'")
                      .format(role, database))
        try:
            yield
        finally:
            admin.execute(sql.SQL("ALTER ROLE {} IN DATABASE {} RESET idle_in_transaction_session_timeout")
                          .format(role, database))


def test_a_quantised_answer_in_a_block_keeps_its_backend_whatever_the_backends_idle_timeout(
    test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, role_idle_timeout: None
):
    """A fast answer leaves the backend idle in its transaction for most of the quantum. Were the
    backend's own timeout (100 ms here) to end the connection then, the block would end with it
    — or not, when the rows had kept the backend busy past q − 100 ms."""
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("idle") / "l.sqlite3", QUANTISED))
    try:
        with proxy.connect() as conn:
            conn.execute("BEGIN")
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()
            conn.execute("SELECT COUNT(*) FROM adult WHERE age > 200").fetchall()  # the index finds nothing
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
            assert conn.execute("SELECT pg_backend_pid()").fetchone() == pid
            conn.execute("COMMIT")
    finally:
        proxy.stop()
