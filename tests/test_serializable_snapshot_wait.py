"""A serializable DP statement waits for its safe snapshot before it is charged, not after.

Backend transactions are DEFERRABLE (``tests/test_attack_settings.py``): at SERIALIZABLE, a
transaction's first snapshot waits until no concurrent serializable read-write transaction of
the operator's can make it unsafe. That wait depends on the operator's writers, never on the
rows. Found and fixed (budget): the DP statement was charged first and its transaction took its
first snapshot after, so while a serializable writer stayed open the wait ran into
``statement_timeout`` (or the client's cancel) and the analyst was charged for a 57014 no row
decided. The snapshot is now taken before the charge (a trivial ``SELECT`` in the transaction
that then runs the DP SQL); a wait that ends in a timeout or cancel is an uncharged 57014 that
says what it waited for. READ COMMITTED and REPEATABLE READ never wait.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.dp_count_sends import answered_once_released, cancelled_while_waiting, count_sends
from tests.reconcile import audit_lines
from tests.wire import SYNC, Wire, bind, describe, error_fields, execute, parse

_TIMEOUT_MS = 600
_POLICY = ATTACK_POLICY_HEAD.replace("statement_timeout_ms: 10000", f"statement_timeout_ms: {_TIMEOUT_MS}").replace(
    "ledger: ", "audit: {{path: \"{ledger}.audit\"}}\nledger: ") + """
  public.snap0:
    access: protected
    epsilon: 1.0
    columns:
      v: {{bounds: [0, 100], group_by: true}}
"""

# Each way an analyst asks for SERIALIZABLE, as the statements before the DP one; a DP
# statement after them is the first of its transaction.
_SERIALIZABLE = {
    "default_transaction_isolation": ("SET default_transaction_isolation = 'serializable'",),
    "session characteristics": ("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",),
    "begin": ("BEGIN ISOLATION LEVEL SERIALIZABLE",),
    "start transaction": ("START TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY",),
    "set transaction": ("BEGIN", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE"),
    "set transaction_isolation": ("BEGIN", "SET transaction_isolation = 'serializable'"),
    "block after session default": ("SET default_transaction_isolation = 'serializable'", "BEGIN"),
}


@pytest.fixture(scope="module")
def snapshot_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS snap0, snapw")
        admin.execute("CREATE TABLE snap0 (id int8 PRIMARY KEY, v int4)")
        admin.execute("INSERT INTO snap0 SELECT g, g % 100 FROM generate_series(1, 500) g")
        admin.execute("CREATE TABLE snapw (id int PRIMARY KEY, v int)")
        admin.execute("INSERT INTO snapw VALUES (1, 0)")
        admin.execute("GRANT SELECT ON snap0 TO dpproxy_service")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


@contextmanager
def _serializable_writer(admin_dsn: str) -> Iterator[psycopg.Connection]:
    """An operator's serializable read-write transaction that has read and written, left open."""
    with psycopg.connect(admin_dsn) as writer:
        writer.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        writer.execute("SELECT v FROM snapw WHERE id = 1").fetchall()
        writer.execute("UPDATE snapw SET v = v + 1 WHERE id = 1")
        try:
            yield writer
        finally:
            writer.rollback()


def _analyst(proxy: RunningProxy, way: str) -> psycopg.Connection:
    """An analyst's connection at SERIALIZABLE the way ``way`` asks for it, which has resolved
    snap0 already (a block's first statement is then the DP one's own)."""
    conn = proxy.connect()
    conn.execute("SELECT COUNT(*) FROM snap0").fetchall()
    for statement in _SERIALIZABLE[way]:
        conn.execute(statement)
    return conn


def _audit_path(proxy: RunningProxy) -> Path:
    assert proxy.policy.audit is not None and proxy.policy.audit.path is not None
    return Path(proxy.policy.audit.path)


def _failures_since(proxy: RunningProxy, audited: int) -> list[tuple[str, float | None]]:
    """The (SQLSTATE, ε) of the analyst's audited failures after the first ``audited`` lines,
    once there is one (audit lines are written soon after the statement, not with it)."""
    deadline = time.monotonic() + 5
    while True:
        lines = audit_lines(_audit_path(proxy), "analyst")[audited:]
        failures = [(line["reason"], line["epsilon"]) for line in lines if line["decision"] == "error"]
        if failures or time.monotonic() > deadline:
            return failures
        time.sleep(0.05)


def _assert_uncharged_wait(failure: psycopg.Error) -> None:
    assert failure.sqlstate == "57014"
    assert "serializable snapshot" in str(failure.diag.message_primary)
    assert "READ COMMITTED" in str(failure.diag.message_hint)


@pytest.mark.parametrize("way", list(_SERIALIZABLE))
def test_a_serializable_dp_query_timed_out_waiting_for_its_snapshot_is_not_charged(
        snapshot_proxy: RunningProxy, test_db: TestDatabase, way: str) -> None:
    # Before: charged 1.0 for the 57014 of a wait that outlasted statement_timeout (or, after a
    # session-level SET, the session ended: reading its settings back waited too).
    cutoff = 10 + list(_SERIALIZABLE).index(way)  # another statement each: no repeat of another's answer
    with snapshot_proxy.connect() as other, _analyst(snapshot_proxy, way) as conn:
        spent = spent_epsilon(other)
        with _serializable_writer(test_db.admin_dsn):
            audited = len(audit_lines(_audit_path(snapshot_proxy), "analyst"))
            with pytest.raises(psycopg.errors.QueryCanceled) as failed:
                conn.execute(f"SELECT COUNT(*) FROM snap0 WHERE v < {cutoff}")
            assert spent_epsilon(other) == spent
            _assert_uncharged_wait(failed.value)
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
                conn.execute("ROLLBACK")
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the writer gone, nothing waits
    assert _failures_since(snapshot_proxy, audited) == [("57014", None)]


@pytest.mark.parametrize("way", ["default_transaction_isolation", "begin"])
def test_a_serializable_dp_query_is_answered_and_charged_once_the_writer_ends(
        snapshot_proxy: RunningProxy, test_db: TestDatabase, way: str) -> None:
    cutoff = 40 + list(_SERIALIZABLE).index(way)
    with _analyst(snapshot_proxy, way) as conn, snapshot_proxy.connect() as other:
        with _serializable_writer(test_db.admin_dsn) as writer:
            answered_once_released(conn, other, f"SELECT COUNT(*) FROM snap0 WHERE v < {cutoff}", writer,
                                   _TIMEOUT_MS / 4000)
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute("COMMIT")


def test_a_cancelled_wait_for_a_serializable_snapshot_is_not_charged(
        snapshot_proxy: RunningProxy, test_db: TestDatabase) -> None:
    with snapshot_proxy.connect() as other, _analyst(snapshot_proxy, "session characteristics") as conn:
        with _serializable_writer(test_db.admin_dsn):
            _assert_uncharged_wait(
                cancelled_while_waiting(conn, other, "SELECT COUNT(*) FROM snap0 WHERE v < 30", _TIMEOUT_MS / 4000))
        assert conn.execute("SELECT 1").fetchone() == (1,)


_SENDS = count_sends("snap0")


@pytest.mark.parametrize("way", ["extended", "copy", "pipeline"])
def test_a_wait_for_a_serializable_snapshot_is_not_charged_in_any_protocol(
        snapshot_proxy: RunningProxy, test_db: TestDatabase, way: str) -> None:
    send, cutoff = _SENDS[way], {"extended": 60, "copy": 62, "pipeline": 64}[way]
    with snapshot_proxy.connect() as other, _analyst(snapshot_proxy, "default_transaction_isolation") as conn:
        send(conn, 1)  # Parse, COPY and the pipeline's statements seen once at serializable, no writer
        spent = spent_epsilon(other)
        with _serializable_writer(test_db.admin_dsn):
            with pytest.raises(psycopg.errors.QueryCanceled) as failed:
                send(conn, cutoff)
            assert spent_epsilon(other) == spent
            _assert_uncharged_wait(failed.value)
        send(conn, cutoff)
        assert spent_epsilon(other) > spent  # answered, and charged, once the writer is gone


@pytest.mark.parametrize("level", ["READ COMMITTED", "REPEATABLE READ"])
def test_no_other_isolation_level_waits_for_a_serializable_writer(
        snapshot_proxy: RunningProxy, test_db: TestDatabase, level: str) -> None:
    with snapshot_proxy.connect() as conn, _serializable_writer(test_db.admin_dsn):
        conn.execute(f"SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {level}")
        assert conn.execute("SELECT COUNT(*) FROM snap0 WHERE v < 70").fetchone() is not None
        conn.execute(f"BEGIN ISOLATION LEVEL {level}")
        assert conn.execute("SELECT COUNT(*) FROM snap0 WHERE v < 71").fetchone() is not None
        conn.execute("COMMIT")


def test_a_service_role_default_of_serializable_is_not_the_analysts(
        test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # An operator's ALTER ROLE ... SET default_transaction_isolation = serializable made every DP
    # statement wait for the operator's serializable writers; dpproxy's sessions start at READ
    # COMMITTED, and an analyst asks for SERIALIZABLE when they want it.
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("ALTER ROLE dpproxy_service SET default_transaction_isolation = serializable")
        try:
            with running_proxy(test_db, tmp_path_factory, _POLICY) as proxy, proxy.connect() as conn, \
                    _serializable_writer(test_db.admin_dsn):
                assert conn.execute("SHOW default_transaction_isolation").fetchone() == ("read committed",)
                assert conn.execute("SELECT COUNT(*) FROM snap0 WHERE v < 80").fetchone() is not None
                conn.execute("RESET ALL")
                assert conn.execute("SELECT COUNT(*) FROM snap0 WHERE v < 81").fetchone() is not None
        finally:
            admin.execute("ALTER ROLE dpproxy_service RESET default_transaction_isolation")



def _described(proxy: RunningProxy, setup: str, admin_dsn: str) -> list[tuple[bytes, bytes]]:
    """Parse and Describe (statement) of a DP COUNT after ``setup``, as JDBC sends them before its
    first Execute, while a serializable writer is open: the messages, an error by its SQLSTATE
    and message."""
    wire = Wire(proxy.host, proxy.port)
    try:
        wire.send(parse("", setup), bind("", ""), execute(""), SYNC)
        wire.read_until(b"Z")
        with _serializable_writer(admin_dsn):
            wire.send(parse("q", "SELECT COUNT(*) FROM snap0 WHERE v < $1"), describe(b"S", "q"), SYNC)
            replies = wire.read_until(b"Z")
    finally:
        wire.close()
    return [(kind, b"%s %s" % (error_fields(body)[b"C"], error_fields(body)[b"M"]) if kind == b"E" else b"")
            for kind, body in replies if kind != b"N"]


def test_a_described_dp_statement_waits_for_no_serializable_snapshot(
        snapshot_proxy: RunningProxy, test_db: TestDatabase) -> None:
    # Before: parsing on the backend took a snapshot in a serializable transaction of its own,
    # which waited for the writer and failed the Describe with a bare 57014.
    replies = _described(snapshot_proxy, "SET default_transaction_isolation = 'serializable'", test_db.admin_dsn)
    assert [kind for kind, _ in replies] == [b"1", b"t", b"T", b"Z"], replies


def test_a_described_dp_statement_in_a_serializable_block_says_what_it_waited_for(
        snapshot_proxy: RunningProxy, test_db: TestDatabase) -> None:
    replies = _described(snapshot_proxy, "BEGIN ISOLATION LEVEL SERIALIZABLE", test_db.admin_dsn)
    errors = [text for kind, text in replies if kind == b"E"]
    assert len(errors) == 1 and errors[0].startswith(b"57014 ") and b"serializable snapshot" in errors[0], replies
