"""dpproxy in front of a hot standby (a streaming read replica), attacked as an analyst.

Operators point analysts' read-only tools at a replica, and dpproxy only reads from its backend,
so they will put dpproxy there too. A standby is not a primary: it refuses SERIALIZABLE ("cannot
use serializable mode in a hot standby", 0A000) and every write, its tables change as the primary's
WAL is replayed (schema changes included), and it cancels a statement that conflicts with what it
replays (40001, "canceling statement due to conflict with recovery", once
``max_standby_streaming_delay`` has passed). The servers are tests/standby.py's; the adversarial
rows and the ALTERs are written on the primary and waited for on the standby.

Found and fixed:

* A ledger pointed at the standby (``ledger.url`` naming the replica, whose ledger tables
  were replayed from the primary) opened without a word, and every DP statement was then
  refused with DP005 at its charge: dpproxy now refuses to start, naming the cause and
  ``ledger.url`` (``policies.ledger.ReadOnlyLedger``).
* A DP statement cancelled by a recovery conflict was charged and failed with DP004, for a
  conflict the operator's writes on the primary decided (reproduced without timing: the
  statement waits for a lock the replayed ``REINDEX`` holds while it holds the table, and the
  primary's ``LOCK TABLE`` then conflicts with it). The charge still stands (how long the rows
  take decides whether a conflict meets the statement, the channel that keeps a timed-out
  statement charged), but outside a transaction block the statement now runs once more under
  that one charge, so that a conflict costs no answer unless it strikes twice.
* A lock the primary holds on a table's TOAST index (``REINDEX``), replayed on the standby,
  decided whether a DP statement failed: ``s < 'b'`` opens the TOAST index only for a value
  stored apart, so under a ``lock_timeout`` (the analyst's SET, or the role's default) it was
  answered on a table and failed with DP004, charged, on its neighbour holding one long value.
  ``lock_timeout`` is now pinned to 0 on backend connections and refused in SET.

Held: every accepted DP form of tests/test_attack_settings.py has one outcome on the standby's
copies of neighbouring tables under the session states a standby allows; the serializable ones
are refused with PostgreSQL's 0A000 and its hint, uncharged; ``SET TRANSACTION SNAPSHOT`` is
refused (safe-settings) as on a primary; cursors WITH HOLD, COPY, the extended protocol and
dpproxy's read-backs work; schema drift replayed from the primary is caught as on the primary.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from policies.loader import parse_policy
from proxy.serving.startup import StartupError
from tests.conftest import (ATTACK_POLICY_HEAD, TEST_DATABASE, TEST_POLICY, RunningProxy, StandbyDatabase,
                            TestDatabase, running_proxy, spent_epsilon)
from tests.neighbour_outcome import create_neighbours, masked_outcome
from tests.post_charge_wait import (READ_APART_TEXT, SHORT_TEXT, WIDE_PAD, create_gate, gated, keep_apart, store_apart,
                                    toast_index)
import tests.test_attack_settings as settings_attack
from tests.test_attack_settings import (_BASE_ROWS, _BINARY_AND_COPY, _DDL, _NEIGHBOURS, _POLICY, ACCEPTED_FORMS,
                                        SESSION_STATES, _answer_form, _dates_as_text, _same_on_neighbours)

_HOT_STANDBY_REFUSES = "cannot use serializable mode in a hot standby"


@pytest.fixture(scope="module")
def standby_proxy(standby_db: StandbyDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """tests/test_attack_settings.py's neighbouring tables, written on the primary, and a dpproxy
    whose backend is the standby that replayed them."""
    create_neighbours(standby_db.primary.admin_dsn, "st0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    with psycopg.connect(standby_db.primary.admin_dsn, autocommit=True) as admin:  # the policy's serializable table
        admin.execute("DROP TABLE IF EXISTS sr0")
        admin.execute("CREATE TABLE sr0 (id int8 PRIMARY KEY, v int4)")
        admin.execute("GRANT SELECT ON sr0 TO dpproxy_service")
    standby_db.pair.wait_for_replay(TEST_DATABASE)
    with running_proxy(standby_db.standby, tmp_path_factory, _POLICY) as running:
        yield running


def test_the_backend_is_a_hot_standby(standby_db: StandbyDatabase) -> None:
    with psycopg.connect(standby_db.standby.service_dsn) as conn:
        assert conn.execute("SELECT pg_catalog.pg_is_in_recovery()").fetchone() == (True,)


# ---------------------------------------------------------------- every accepted form on the neighbours

_SERIALIZABLE_STATES = {"serializable", "serializable block"}


@pytest.mark.parametrize("state", [state for state in SESSION_STATES if state not in _SERIALIZABLE_STATES])
def test_no_session_state_lets_one_row_decide_an_outcome_on_a_standby(standby_proxy: RunningProxy, state: str) -> None:
    settings_attack.test_no_session_state_lets_one_row_decide_an_outcome(standby_proxy, state)


def test_every_accepted_form_is_answered_on_a_standby(standby_proxy: RunningProxy) -> None:
    with standby_proxy.connect() as conn:
        _dates_as_text(conn)
        for sql in ACCEPTED_FORMS:
            assert masked_outcome(conn, sql, "st0")[0] == "answer", sql
        for sql in _BINARY_AND_COPY:
            assert _answer_form(conn, sql.replace("{t}", "st0"))[0] != "error", sql


@pytest.mark.parametrize("state", ["default", "repeatable read block", "latin1"])
def test_no_session_state_lets_one_row_decide_a_binary_or_copy_answer_on_a_standby(standby_proxy: RunningProxy,
                                                                                   state: str) -> None:
    settings_attack.test_no_session_state_lets_one_row_decide_a_binary_or_copy_answer(standby_proxy, state)


@pytest.mark.parametrize("statement", [
    "SET default_transaction_isolation = serializable",
    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY, DEFERRABLE",
    "SELECT set_config('default_transaction_isolation', 'serializable', false)",
])
def test_a_serializable_default_is_refused_uncharged_by_every_dp_form_on_every_neighbour(
    standby_proxy: RunningProxy, statement: str
) -> None:
    """The standby refuses the serializable snapshot dpproxy takes before the charge
    (proxy/serving/safe_snapshot.py): PostgreSQL's 0A000 and hint, nothing charged."""
    with standby_proxy.connect() as conn:
        _dates_as_text(conn)
        conn.execute(statement)
        for sql in ACCEPTED_FORMS:
            outcome = _same_on_neighbours(conn, sql)  # uncharged, as it is an error
            assert outcome[:2] == ("error", "0A000") and outcome[2] == _HOT_STANDBY_REFUSES, (sql, outcome)
            assert "repeatable read" in str(outcome[3]), outcome
        for sql in _BINARY_AND_COPY:  # in binary and in COPY: refused as PostgreSQL refuses, uncharged
            outcomes = {_answer_form(conn, sql.replace("{t}", table)) for table in ("st0", *_NEIGHBOURS)}
            assert outcomes == {("error", "0A000", True)}, (sql, outcomes)
        conn.execute("RESET default_transaction_isolation")
        assert conn.execute("SELECT COUNT(*) FROM st0").fetchone() is not None


def test_a_serializable_default_is_refused_uncharged_in_the_extended_protocol(standby_proxy: RunningProxy) -> None:
    with psycopg.connect(standby_proxy.dsn(), autocommit=True, prepare_threshold=0) as conn:
        conn.execute("SET default_transaction_isolation = serializable")
        before = spent_epsilon(conn)
        for value in (10, 20):
            with pytest.raises(psycopg.errors.FeatureNotSupported, match=_HOT_STANDBY_REFUSES):
                conn.execute("SELECT COUNT(*), AVG(f) FROM st0 WHERE i > %s", (value,))
        assert spent_epsilon(conn) == before


def test_begin_serializable_is_refused_before_anything_is_charged(standby_proxy: RunningProxy) -> None:
    with standby_proxy.connect() as conn:
        before = spent_epsilon(conn)
        for begin in ("BEGIN ISOLATION LEVEL SERIALIZABLE", "START TRANSACTION ISOLATION LEVEL SERIALIZABLE"):
            with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
                conn.execute(begin)
            assert _HOT_STANDBY_REFUSES in str(refused.value)
            assert "REPEATABLE READ" in (refused.value.diag.message_hint or "")
        conn.execute("BEGIN")
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        conn.execute("ROLLBACK")
        assert spent_epsilon(conn) == before
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        assert conn.execute("SELECT COUNT(*) FROM st0").fetchone() is not None
        conn.execute("COMMIT")
        assert spent_epsilon(conn) == before + 1


def test_a_snapshot_cannot_be_imported_or_exported(standby_proxy: RunningProxy) -> None:
    with standby_proxy.connect() as conn:
        before = spent_epsilon(conn)
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            conn.execute("SET TRANSACTION SNAPSHOT '00000003-00000002-1'")
        assert "(rule: safe-settings)" in str(refused.value) and refused.value.diag.message_hint
        conn.execute("ROLLBACK")
        for sql in ("SELECT pg_export_snapshot()", "SELECT txid_current()", "SELECT pg_advisory_lock(1)",
                    "SELECT nextval('st0_sequence')"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                conn.execute(sql)
            assert "(rule: function-allowlist)" in str(refused.value), sql
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as refused:
            conn.execute("CREATE TEMP TABLE scratch (a int)")
        assert "(rule: read-only)" in str(refused.value)
        assert spent_epsilon(conn) == before


def test_cursors_copy_the_extended_protocol_and_read_backs_work_on_a_standby(standby_proxy: RunningProxy) -> None:
    with standby_proxy.connect() as conn:
        before = spent_epsilon(conn)
        conn.execute("BEGIN")
        conn.execute("DECLARE held CURSOR WITH HOLD FOR SELECT COUNT(*) FROM st0 WHERE i > 10")
        conn.execute("COMMIT")
        assert len(conn.execute("FETCH ALL FROM held").fetchall()) == 1
        conn.execute("CLOSE held")
        with conn.cursor().copy("COPY (SELECT s, COUNT(*) FROM st0 GROUP BY s) TO STDOUT") as copy:
            lines = b"".join(bytes(block) for block in copy).splitlines()
        assert [line.split(b"\t")[0] for line in lines] == [b"a", b"b"]
        assert spent_epsilon(conn) == before + 2
        assert conn.execute("SHOW dpproxy.columns").fetchall()
        assert conn.execute("SHOW transaction_read_only").fetchone() == ("on",)
    with psycopg.connect(standby_proxy.dsn(), autocommit=True, prepare_threshold=0) as extended:
        for value in (10, 20, 30):
            assert extended.execute("SELECT COUNT(*) FROM st0 WHERE i > %s", (value,)).fetchone() is not None


def test_check_config_checks_a_policy_against_a_standby(standby_db: StandbyDatabase, tmp_path: Path) -> None:
    from tests.test_check_config_backend import POLICY, _check

    run = _check(tmp_path, POLICY.format(dsn=standby_db.standby.service_dsn))
    assert run.returncode == 0, run.stderr
    assert "checked against the backend" in run.stdout, run.stdout


# ---------------------------------------------------------------- the ledger

def test_a_ledger_on_the_standby_is_refused_at_startup_not_at_the_first_charge(
    standby_db: StandbyDatabase, tmp_path: Path
) -> None:
    """On the code before: started (the ledger's tables had been replayed from the primary), then
    every DP statement was refused with DP005 at its charge."""
    from policies.ledger import Ledger

    Ledger.from_url(standby_db.primary.admin_dsn).close()  # the ledger's tables, on the primary
    standby_db.pair.wait_for_replay(TEST_DATABASE)
    ledger_url = standby_db.pair.on_standby(standby_db.primary.admin_dsn)
    text = TEST_POLICY.replace('{{url: "sqlite:///{ledger}"}}', f'{{{{url: "{ledger_url}"}}}}')
    assert ledger_url in text.format(dsn="", ledger="")
    policy = parse_policy(text.format(dsn=standby_db.standby.service_dsn, ledger=""), "policy.yaml")
    with pytest.raises(StartupError) as refused:
        RunningProxy(policy).stop()
    message = str(refused.value)
    assert "cannot open the ledger" in message and "hot standby" in message, message
    assert "point ledger.url at the primary" in message, message


def test_a_ledger_whose_transactions_are_read_only_is_refused_at_startup(standby_db: StandbyDatabase) -> None:
    from policies.ledger import Ledger, ReadOnlyLedger

    with psycopg.connect(standby_db.primary.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP ROLE IF EXISTS ledger_read_only")
        admin.execute("CREATE ROLE ledger_read_only LOGIN SUPERUSER")
        admin.execute("ALTER ROLE ledger_read_only SET default_transaction_read_only = on")
        try:
            url = standby_db.primary.admin_dsn.replace("postgres@", "ledger_read_only@")
            with pytest.raises(ReadOnlyLedger, match="read-only"):
                Ledger.from_url(url)
        finally:
            admin.execute("DROP ROLE ledger_read_only")


# ---------------------------------------------------------------- recovery conflicts

_CONFLICT_POLICY = ATTACK_POLICY_HEAD.replace("repeats: {{enabled: true}}", "repeats: {{enabled: false}}") + """
  public.conflicted:
    access: protected
    epsilon: 1.0
    columns:
      a: {{bounds: [0, 10]}}
      b: {{bounds: [0, 10]}}
"""


CONFLICT_GATE = "conflicted_gate"


def _waiting_for_a_lock(standby: TestDatabase, table: str = "conflicted") -> bool:
    """Whether a statement on ``table`` waits for a lock on the standby."""
    with psycopg.connect(standby.admin_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE wait_event_type = 'Lock' "
                           "AND query LIKE %s", (f'%"{table}"%',)).fetchone()
    return row is not None and row[0] > 0


@pytest.fixture
def conflicting_standby(standby_db: StandbyDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A dpproxy on the standby, which cancels a conflicting statement at once
    (``max_standby_streaming_delay = 0``, no feedback), and the protected view ``conflicted`` of
    the table ``conflicted_rows`` behind the gate ``CONFLICT_GATE``, where a DP statement's run
    waits after its charge while the primary holds the gate (tests/post_charge_wait.py)."""
    with psycopg.connect(standby_db.primary.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP VIEW IF EXISTS conflicted")
        admin.execute("DROP TABLE IF EXISTS conflicted_rows")
        admin.execute("CREATE TABLE conflicted_rows AS SELECT g % 10 AS a, 1::numeric AS b FROM generate_series(1, 100) g")
        admin.execute("CREATE INDEX conflicted_a ON conflicted_rows (a)")
        create_gate(admin, CONFLICT_GATE)
        gated(admin, "conflicted", "conflicted_rows", gate=CONFLICT_GATE)
    standby_db.pair.wait_for_replay(TEST_DATABASE)
    standby_db.pair.configure_standby(hot_standby_feedback="off", max_standby_streaming_delay="0")
    try:
        with running_proxy(standby_db.standby, tmp_path_factory, _CONFLICT_POLICY) as running:
            yield running
    finally:
        standby_db.pair.configure_standby(hot_standby_feedback="on")
        with psycopg.connect(standby_db.primary.admin_dsn, autocommit=True) as admin:
            admin.execute(f"DROP TABLE IF EXISTS conflicted_rows, {CONFLICT_GATE} CASCADE")


def _cancelled_by_a_conflict(standby_db: StandbyDatabase, analyst: psycopg.Connection, sql: str,
                             index: str | None = None) -> object:
    """``sql`` run by ``analyst`` while it holds ``conflicted`` and waits, after its charge, at the
    gate a replayed ``REINDEX`` of the gate's TOAST index holds; then the primary locks the view
    (and so its table), which the standby must replay at once: a lock conflict with the analyst's
    statement, cancelled with 40001, whatever the timing. ``index``: the table's own index
    instead, whose lock the statement waits for before its charge, at the lock step (planning).
    The statement's outcome: its rows, or (SQLSTATE, message)."""
    pair, outcome = standby_db.pair, {}
    with psycopg.connect(standby_db.primary.admin_dsn) as operator:
        # An ACCESS EXCLUSIVE lock on the gate's TOAST index, replayed: a lock on the table or its
        # own indexes would be waited for by the lock step, uncharged (proxy/serving/relation_locks.py).
        operator.execute(f"REINDEX INDEX {index or toast_index(operator, CONFLICT_GATE)}")
        pair.wait_for_replay(TEST_DATABASE)

        def ask() -> None:
            try:
                outcome["result"] = analyst.execute(sql).fetchall()
            except psycopg.Error as exc:
                outcome["result"] = (exc.sqlstate, exc.diag.message_primary)

        asking = threading.Thread(target=ask, daemon=True)
        asking.start()
        deadline = time.monotonic() + 60
        while not _waiting_for_a_lock(standby_db.standby):  # planning it, the table held, the index awaited
            assert time.monotonic() < deadline and asking.is_alive(), outcome
            time.sleep(0.05)
        operator.execute("LOCK TABLE conflicted IN ACCESS EXCLUSIVE MODE")
        operator.commit()
    asking.join(60)
    assert not asking.is_alive()
    return outcome["result"]


def test_a_dp_statement_cancelled_by_a_recovery_conflict_is_answered_under_its_one_charge(
    standby_db: StandbyDatabase, conflicting_standby: RunningProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """On the code before: charged 1 ε and failed with DP004 for a conflict the operator's
    LOCK TABLE on the primary decided."""
    caplog.set_level(logging.INFO, logger="dpproxy.executor")
    with conflicting_standby.connect() as analyst:
        before = spent_epsilon(analyst)
        result = _cancelled_by_a_conflict(standby_db, analyst, "SELECT COUNT(*) FROM conflicted WHERE a > 3 AND b > 0")
        assert isinstance(result, list) and len(result) == 1, result
        assert spent_epsilon(analyst) == before + 1
        assert any("40001: canceling statement due to conflict with recovery" in record.getMessage()
                   for record in caplog.records), caplog.text  # the standby did cancel it once


def test_a_recovery_conflict_in_a_transaction_block_fails_charged_and_the_session_goes_on(
    standby_db: StandbyDatabase, conflicting_standby: RunningProxy
) -> None:
    """The conflict aborted the analyst's block: nothing can run again in it, so the statement
    fails as any failure after the charge does (DP004, charged), and ROLLBACK ends the block."""
    with conflicting_standby.connect() as analyst:
        before = spent_epsilon(analyst)
        analyst.execute("BEGIN")
        result = _cancelled_by_a_conflict(standby_db, analyst, "SELECT COUNT(*) FROM conflicted WHERE a > 3 AND b > 0")
        assert result == ("DP004", "the backend failed to compute this DP aggregate"), result
        analyst.execute("ROLLBACK")
        assert spent_epsilon(analyst) == before + 1
        assert analyst.execute("SELECT COUNT(*) FROM conflicted").fetchone() is not None


def test_a_recovery_conflict_at_the_lock_step_is_not_charged_and_the_step_is_taken_again(
    standby_db: StandbyDatabase, conflicting_standby: RunningProxy
) -> None:
    """The statement waits for the replayed REINDEX of the table's own index at its lock step,
    before the charge, and the primary's LOCK TABLE cancels it there: nothing was charged or
    read, so dpproxy's own block is rolled back and the step taken once more; the statement is
    answered and charged once."""
    with conflicting_standby.connect() as analyst:
        before = spent_epsilon(analyst)
        result = _cancelled_by_a_conflict(standby_db, analyst, "SELECT COUNT(*) FROM conflicted WHERE a > 4",
                                          index="conflicted_a")
        assert isinstance(result, list) and len(result) == 1, result
        assert spent_epsilon(analyst) == before + 1


def test_a_recovery_conflict_at_the_lock_step_in_a_block_fails_uncharged(
    standby_db: StandbyDatabase, conflicting_standby: RunningProxy
) -> None:
    """On the code before: DP004, charged (the wait came after the charge). Now the conflict
    meets the lock step, before the charge: the analyst's block is aborted, as PostgreSQL
    aborts it, with the backend's 40001, and nothing is charged."""
    with conflicting_standby.connect() as analyst:
        before = spent_epsilon(analyst)
        analyst.execute("BEGIN")
        result = _cancelled_by_a_conflict(standby_db, analyst, "SELECT COUNT(*) FROM conflicted WHERE a > 5",
                                          index="conflicted_a")
        assert isinstance(result, tuple) and result[0] == "40001", result
        analyst.execute("ROLLBACK")
        assert spent_epsilon(analyst) == before


def test_a_block_whose_backend_a_recovery_conflict_ended_ends_the_session_without_a_charge(
    standby_db: StandbyDatabase, conflicting_standby: RunningProxy
) -> None:
    """Idle in a block after a DP statement, the backend holds the table; the primary's LOCK TABLE
    replayed then terminates that backend (PostgreSQL ends an idle session it cannot cancel). The
    next DP statement never reaches it: uncharged, and the session ends as on any lost backend."""
    with conflicting_standby.connect() as analyst, conflicting_standby.connect() as other:
        analyst.execute("BEGIN")
        assert analyst.execute("SELECT COUNT(*) FROM conflicted").fetchone() is not None
        before = spent_epsilon(other)
        with psycopg.connect(standby_db.primary.admin_dsn, autocommit=True) as operator:
            operator.execute("BEGIN; LOCK TABLE conflicted IN ACCESS EXCLUSIVE MODE; COMMIT")
        standby_db.pair.wait_for_replay(TEST_DATABASE)
        with pytest.raises(psycopg.OperationalError) as ended:
            for _ in range(600):  # the standby ends the backend once it replays the lock
                analyst.execute("SELECT COUNT(*) FROM conflicted")
                time.sleep(0.1)
        assert ended.value.sqlstate in ("08006", "57P01"), str(ended.value)
        assert spent_epsilon(other) == before


# ---------------------------------------------------------------- the operator's locks, replayed

_TOAST_POLICY = ATTACK_POLICY_HEAD.replace("repeats: {{enabled: true}}", "repeats: {{enabled: false}}") + """
  public.tx0: &T
    access: protected
    epsilon: 1.0
    columns:
      s: {{categories: [a, b]}}
  public.tx1: *T
"""


@pytest.fixture
def toasted_neighbours(standby_db: StandbyDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """``tx0`` and its neighbour ``tx1`` with one row more, whose 64-character value (hex digits of
    random hashes) in a ``varchar(64)`` is stored apart, in the TOAST relation (tests/post_charge_wait.py;
    a value stored apart is placed from its TOAST pointer and read as NULL, but a top-level ``=``
    on a column of a declared size also compares the raw column, hashed, which fetches it once);
    both have the same columns. A dpproxy on
    the standby under a service role whose ``lock_timeout`` is 100 ms (an operator's default)."""
    with psycopg.connect(standby_db.primary.admin_dsn, autocommit=True) as admin:
        for table in ("tx0", "tx1"):
            admin.execute(f"DROP TABLE IF EXISTS {table}")
            admin.execute(f"CREATE TABLE {table} AS SELECT ((ARRAY['a', 'b'])[1 + g % 2])::{READ_APART_TEXT} AS s "
                          "FROM generate_series(1, 200) g")
            admin.execute(f"GRANT SELECT ON {table} TO dpproxy_service")
        keep_apart(admin, "tx0", "s")
        store_apart(admin, "tx1", "s", SHORT_TEXT, most=64, pad=WIDE_PAD)
        admin.execute("ALTER ROLE dpproxy_service SET lock_timeout = '100ms'")
        try:
            standby_db.pair.wait_for_replay(TEST_DATABASE)
            with running_proxy(standby_db.standby, tmp_path_factory, _TOAST_POLICY) as running:
                yield running
        finally:
            admin.execute("ALTER ROLE dpproxy_service RESET lock_timeout")
            admin.execute("DROP TABLE IF EXISTS tx0, tx1")
            standby_db.pair.wait_for_replay(TEST_DATABASE)


def test_a_lock_on_a_toast_index_replayed_from_the_primary_decides_no_outcome(
    standby_db: StandbyDatabase, toasted_neighbours: RunningProxy
) -> None:
    """The primary's REINDEX of each table's TOAST index holds an ACCESS EXCLUSIVE lock on it, which
    the standby replays. ``s = 'b'`` hashes each raw value (rewriter/raw_equality.py), and opens the
    TOAST index only for a value stored apart (it was ``s < 'b'``, which reads the bounded value now): on the code before, under the role's lock_timeout, the statement was
    answered on tx0 and failed with DP004 on tx1, charged both times. Now lock_timeout is pinned
    to 0: the statement waits for the lock on tx1 (seen waiting, so that the value is read and the
    test is not passed by a statement that never opened the index) and is answered once the
    REINDEX ends."""
    sql = "SELECT COUNT(*) FROM {t} WHERE s = 'b'"
    outcomes, waited = {}, {}
    for table in ("tx0", "tx1"):
        with psycopg.connect(standby_db.primary.admin_dsn) as operator, toasted_neighbours.connect() as analyst:
            toast = operator.execute("SELECT t.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_class t "
                                     "ON t.oid = c.reltoastrelid WHERE c.relname = %s", (table,)).fetchone()
            assert toast is not None
            operator.execute(f"REINDEX INDEX pg_toast.{toast[0]}_index")
            standby_db.pair.wait_for_replay(TEST_DATABASE)
            before, outcome = spent_epsilon(analyst), {}

            def ask() -> None:
                outcome["masked"] = masked_outcome(analyst, sql, table)

            asking = threading.Thread(target=ask, daemon=True)
            asking.start()
            deadline = time.monotonic() + 60
            while asking.is_alive() and not _waiting_for_a_lock(standby_db.standby, table):
                assert time.monotonic() < deadline, f"{table}: neither answered nor waiting"
                time.sleep(0.05)
            waited[table] = asking.is_alive()
            operator.rollback()  # the REINDEX ends; a statement waiting for its lock goes on
            asking.join(60)
            assert not asking.is_alive()
            outcomes[table] = outcome["masked"]
            assert spent_epsilon(analyst) == before + 1
    assert waited == {"tx0": False, "tx1": True}, waited
    assert outcomes["tx0"] == outcomes["tx1"], outcomes
    assert outcomes["tx0"][0] == "answer", outcomes


# ---------------------------------------------------------------- schema drift by replay

def test_a_column_type_change_replayed_from_the_primary_is_refused_before_the_charge(
    standby_db: StandbyDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As tests/test_schema_drift.py on a primary: ``bounds`` on a column made text is refused
    (55000, schema-changed) once the standby has replayed the ALTER, before anything is charged."""
    from tests.test_schema_drift import _assert_refused, _drifting, _remaining

    def replayed() -> None:
        standby_db.pair.wait_for_replay(TEST_DATABASE)

    # The operator writes on the primary; dpproxy reads the standby.
    across = TestDatabase(standby_db.primary.admin_dsn, standby_db.standby.service_dsn)
    with _drifting(across, tmp_path, monkeypatch, replayed=replayed) as (admin, proxy, _), proxy.connect() as conn:
        assert conn.execute("SELECT SUM(a) FROM drifted").fetchone() is not None
        admin.execute("ALTER TABLE drifted ALTER COLUMN a TYPE text")
        replayed()
        deadline = time.monotonic() + 60
        while not proxy.server.registry.redefined:  # the re-check, every 0.2 s, has seen it
            assert time.monotonic() < deadline, "the replayed ALTER was never noticed"
            time.sleep(0.05)
        before = _remaining(proxy)
        _assert_refused(conn, "SELECT COUNT(*) FROM drifted", "column a was altered (its type)")
        assert _remaining(proxy) == before
        admin.execute("ALTER TABLE drifted ALTER COLUMN a TYPE integer USING a::integer")
        replayed()
        while proxy.server.registry.redefined:
            assert time.monotonic() < deadline + 60, "the table back as loaded was never noticed"
            time.sleep(0.05)
        assert conn.execute("SELECT SUM(a) FROM drifted").fetchone() is not None
