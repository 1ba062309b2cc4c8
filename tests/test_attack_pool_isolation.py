"""Attacks on the backend pool's isolation between analysts, and what stops them.

With ``backend.pool.size: 1`` every session runs on the one PostgreSQL backend, so whatever
one analyst leaves on it is what the next one gets. These tests pin holes found by trying:

* a startup parameter spelled in another case (``Extra_Float_Digits``) is a setting to
  PostgreSQL, and must be checked like the lower-case one: else extra_float_digits = -15
  rounds the exact float sums before they are noised (rule exact-floats);
* ``SET TRANSACTION ...`` (and ``SET transaction_isolation``) leaves ``transaction_isolation``
  with source 'session' on the backend, which ``RESET ALL`` cannot undo: it must neither
  stay on a pooled connection (the next analyst reads it in ``pg_settings``) nor enter the
  settings dpproxy re-applies (``set_config('transaction_isolation', ...)`` after the first
  query of a transaction fails, so one analyst's SET broke every other session that was
  later given that connection's settings: 25001 on each statement).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import asyncpg
import psycopg
import pytest

from conftest import TEST_DATABASE, RunningProxy
from proxy.backend.connection import _SESSION_SETTINGS_SQL
from test_backend_pool import _pid, one  # noqa: F401 - one: the one-connection proxy, a fixture used by name
from wire import SYNC, Wire, bind, cstr, execute, message, parse


def _session_settings(conn: psycopg.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT name, setting FROM pg_settings WHERE source = 'session'").fetchall())


@pytest.mark.parametrize("settings", [
    {"Extra_Float_Digits": "-15"},
    {"EXTRA_FLOAT_DIGITS": "0"},
    {"extra_float_digits": "3", "Extra_Float_Digits": "-15"},  # the last one is what PostgreSQL takes
])
def test_extra_float_digits_in_the_startup_packet_is_checked_whatever_its_case(one: RunningProxy, settings):
    async def scenario() -> None:
        dsn = dict(host=one.host, port=one.port, user="analyst", password="analyst", database=TEST_DATABASE)
        with pytest.raises(asyncpg.PostgresError) as refused:
            conn = await asyncpg.connect(**dsn, server_settings=settings)
            try:  # accepted: show what it got, so the failure says why it matters
                rounded = await conn.fetchval("SELECT 1234.5678::float8::text")
                pytest.fail(f"accepted with extra_float_digits {await conn.fetchval('SHOW extra_float_digits')}: "
                            f"1234.5678 reads {rounded}")
            finally:
                await conn.close()
        assert refused.value.sqlstate == "22023"
        assert "exact-floats" in str(refused.value)

    asyncio.run(scenario())


_LEFT_BEHIND = [
    ("BEGIN", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY", "SHOW transaction_isolation", "COMMIT"),
    ("BEGIN", "SET transaction_isolation = 'repeatable read'", "SHOW transaction_isolation", "COMMIT"),
    ("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",),
    ("SET transaction_isolation = 'serializable'",),
]


@pytest.mark.parametrize("statements", _LEFT_BEHIND, ids=[" / ".join(s) for s in _LEFT_BEHIND])
def test_set_transaction_leaves_nothing_on_a_shared_backend_connection(one: RunningProxy, statements):
    with one.connect() as alice, one.connect(application_name="bob") as bob:
        for sql in statements:
            cursor = alice.execute(sql)
            if sql.startswith("SHOW"):  # inside the block the SET is in force
                assert cursor.fetchone()[0] in ("serializable", "repeatable read")
        assert _pid(alice) == _pid(bob), "precondition: one backend connection for both"
        assert _session_settings(bob) == {"application_name": "bob"}
        assert bob.execute("SHOW transaction_isolation").fetchone() == ("read committed",)


def test_set_config_of_transaction_isolation_for_the_session_is_refused(one: RunningProxy):
    with one.connect() as alice, one.connect(application_name="bob") as bob:
        with pytest.raises(psycopg.Error) as refused:
            alice.execute("SELECT set_config('transaction_isolation', 'serializable', false)")
        assert refused.value.sqlstate == "42501" and "safe-settings" in str(refused.value)
        alice.execute("BEGIN")  # for the transaction it passes (PostgreSQL accepts it after a query
        # only when it changes nothing)
        assert alice.execute("SELECT set_config('transaction_isolation', 'read committed', true)").fetchone() == (
            "read committed",)
        alice.execute("COMMIT")
        assert _pid(alice) == _pid(bob)
        assert _session_settings(bob) == {"application_name": "bob"}


def test_one_analysts_transaction_settings_cannot_break_another_session(one: RunningProxy):
    with one.connect() as alice, one.connect(application_name="bob") as bob:
        alice.execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        alice.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        alice.execute("BEGIN")
        alice.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        alice.execute("COMMIT")
        for _ in range(3):  # each checkout moves the one connection between their settings
            assert bob.execute("SHOW transaction_isolation").fetchone() == ("read committed",)
            assert alice.execute("SHOW transaction_isolation").fetchone() == ("serializable",)
            assert bob.execute("SELECT COUNT(*) FROM adult WHERE age > 30").fetchone()[0] > 0
        with one.connect(application_name="carol") as carol:  # a session that starts afterwards
            assert carol.execute("SHOW transaction_isolation").fetchone() == ("read committed",)
            assert _session_settings(carol) == {"application_name": "carol"}


def test_the_settings_read_back_from_a_connection_leave_out_transaction_scoped_ones(test_db):
    """Were a transaction_* setting ever left with source 'session' on a pooled connection,
    it must not become part of the settings re-applied elsewhere (RESET ALL cannot undo it,
    and set_config of it after a transaction's first query fails)."""
    with psycopg.connect(test_db.service_dsn, autocommit=True) as conn:
        conn.execute("SET transaction_isolation = 'serializable'")
        conn.execute("BEGIN")
        conn.execute("SET TRANSACTION READ ONLY")
        conn.execute("COMMIT")
        conn.execute("SET application_name = 'kept'")
        assert {"transaction_isolation", "transaction_read_only"} <= set(_session_settings(conn))  # precondition
        names = [name for name, _ in conn.execute(_SESSION_SETTINGS_SQL).fetchall()]
        assert names == ["application_name"]


_EVERYTHING_A_SESSION_MAY_SET = [
    "SET search_path = pg_catalog, public", "SET DateStyle = 'German'", "SET TIME ZONE INTERVAL '+05:30' HOUR TO MINUTE",
    "SET IntervalStyle = 'sql_standard'", "SET extra_float_digits = 3", "SET bytea_output = 'escape'",
    "SET client_min_messages = 'debug1'", "SET lc_numeric = 'C'", "SET lc_time = 'C'",
    "SET jit = off",
    "SET XML OPTION CONTENT", "SET NAMES 'UTF8'", "SET application_name = 'alice-secret'",
    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY, DEFERRABLE",
    "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", "SET transaction_isolation = 'serializable'",
    "BEGIN ISOLATION LEVEL REPEATABLE READ", "SET LOCAL search_path = elsewhere",
    "SELECT set_config('application_name', 'local', true)", "SET TRANSACTION READ ONLY", "COMMIT",
    "BEGIN", "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", "SAVEPOINT s", "SET lc_time = 'C'", "ROLLBACK TO s", "COMMIT",
    "SELECT COUNT(*) FROM adult WHERE interview_date >= now() - interval '1 year'",
]


def test_nothing_a_session_sets_shows_in_the_next_sessions_pg_settings(one: RunningProxy):
    """Every row of pg_settings (value, source, reset value) is the same for Bob before and
    after Alice has set everything she may on the connection they share."""
    everything = "SELECT name, setting, source, reset_val FROM pg_settings ORDER BY name"
    with one.connect(application_name="bob") as bob:
        before = bob.execute(everything).fetchall()
        with one.connect() as alice:
            for sql in _EVERYTHING_A_SESSION_MAY_SET:
                alice.execute(sql)
            after = bob.execute(everything).fetchall()
            assert _pid(alice) == _pid(bob)
    assert [(b, a) for b, a in zip(before, after) if b != a] == [] and len(before) == len(after)


def test_a_session_that_leaves_in_a_failed_transaction_leaves_nothing_behind(one: RunningProxy):
    alice = one.connect()
    pid = _pid(alice)
    alice.execute("BEGIN")
    alice.execute("SET LOCAL search_path = pg_catalog")
    alice.execute("SET LOCAL application_name = 'alice-in-a-block'")
    with pytest.raises(psycopg.errors.DivisionByZero):
        alice.execute("SELECT 1/0")
    alice.close()  # Terminate, no ROLLBACK: the backend is still in the failed block
    with one.connect(application_name="bob") as bob:  # the connection was closed, not pooled
        assert bob.execute("SHOW search_path").fetchone() == ('"$user", public',)
        assert _session_settings(bob) == {"application_name": "bob"}
        assert bob.execute("SELECT COUNT(*) FROM adult WHERE age > 30").fetchone()[0] > 0
        assert _pid(bob) != pid


@pytest.mark.parametrize("ending", ["reset", "terminate"])
def test_a_session_gone_mid_transaction_with_a_suspended_portal_leaves_nothing_behind(one: RunningProxy, admin, ending):
    """Alice leaves inside an open block (not a failed one) with SET LOCALs, a session SET and
    a large result suspended in a portal, by Terminate or by resetting her socket: the next
    session on the one connection finds no open transaction, no cursor, and its own settings."""
    with one.connect() as first:
        pid = _pid(first)
    alice = Wire(one.host, one.port)
    big = f"SELECT g, g::text || '{'x' * 1000}' FROM generate_series(1, 200000) g"
    alice.send(message(b"Q", cstr("BEGIN; SET LOCAL search_path = pg_catalog; SET DateStyle = 'German'; "
                                  "SET LOCAL application_name = 'alice-in-a-block'")))
    alice.read_until(b"Z")
    alice.send(parse("", big), bind("p", ""), execute("p", 10), SYNC)
    piece = alice.read_until(b"Z")
    assert [kind for kind, _ in piece].count(b"D") == 10 and piece[-1] == (b"Z", b"T")
    if ending == "terminate":
        alice.send(message(b"X"))
    else:
        alice.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    alice.close()
    with one.connect(application_name="bob") as bob:
        assert bob.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert bob.execute("SHOW search_path").fetchone() == ('"$user", public',)
        assert bob.execute("SHOW DateStyle").fetchone() == ("ISO, MDY",)
        assert _session_settings(bob) == {"application_name": "bob"}
        assert bob.execute("SELECT count(*) FROM pg_cursors").fetchone() == (1,)  # this query's own
        assert _pid(bob) != pid  # the connection she held was closed, not pooled
    left = "SELECT count(*) FROM pg_stat_activity WHERE usename = 'dpproxy_service' AND state <> 'idle'"
    deadline = time.monotonic() + 5
    while admin.execute(left).fetchone() != (0,):  # her block and its statement end with the connection
        assert time.monotonic() < deadline, admin.execute(left.replace("count(*)", "state, query")).fetchall()
        time.sleep(0.05)
