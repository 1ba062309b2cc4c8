"""The backend connection pool (proxy/backend/pool.py) through real clients and a real PostgreSQL.

Sessions borrow backend connections per transaction, or per statement outside one. With a
pool of one connection every session runs on the same PostgreSQL backend, which is what
makes the isolation tests bite: whatever one session leaves on it (settings, search_path,
prepared statements, cursors) the next must not see, and its own must come back with it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import psycopg
import pytest
from prometheus_client import REGISTRY

from clients import require_tool
from conftest import TEST_DATABASE, TEST_POLICY, RunningProxy, running_proxy, spent_epsilon


def _policy(size: int, checkout_timeout_s: float = 10) -> str:
    pool = f"  pool: {{{{size: {size}, checkout_timeout_s: {checkout_timeout_s}}}}}\n"
    return TEST_POLICY.replace("  statement_timeout_ms: 20000\n", "  statement_timeout_ms: 20000\n" + pool)


@pytest.fixture(scope="module")
def one(test_db, tmp_path_factory) -> Iterator[RunningProxy]:
    """A dpproxy whose pool holds one backend connection: every session shares it."""
    with running_proxy(test_db, tmp_path_factory, _policy(1)) as running:
        yield running


@pytest.fixture(scope="module")
def two(test_db, tmp_path_factory) -> Iterator[RunningProxy]:
    with running_proxy(test_db, tmp_path_factory, _policy(2)) as running:
        yield running


@pytest.fixture(scope="module")
def starved(test_db, tmp_path_factory) -> Iterator[RunningProxy]:
    """One connection, and a checkout gives up after half a second."""
    with running_proxy(test_db, tmp_path_factory, _policy(1, 0.5)) as running:
        yield running


def _pid(conn: psycopg.Connection) -> int:
    return conn.execute("SELECT pg_backend_pid()").fetchone()[0]


def _show(conn: psycopg.Connection, name: str) -> str:
    return conn.execute(f"SHOW {name}").fetchone()[0]


_SETTINGS = {  # a change of every kind of safe setting, and what SHOW then says
    "search_path": ("SET search_path = pg_catalog, public", "pg_catalog, public"),
    "application_name": ("SET application_name = 'alice-secret'", "alice-secret"),
    "DateStyle": ("SET DateStyle = 'German'", "German, DMY"),
    "TimeZone": ("SET TIME ZONE 'Pacific/Auckland'", "Pacific/Auckland"),
    "IntervalStyle": ("SET IntervalStyle = 'sql_standard'", "sql_standard"),
    "bytea_output": ("SELECT set_config('bytea_output', 'escape', false)", "escape"),
    "default_transaction_isolation": (
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE", "serializable"),
}


def test_a_sessions_settings_are_invisible_to_another_on_the_same_backend_and_stay_its_own(one: RunningProxy):
    with one.connect() as alice, one.connect() as bob:
        defaults = {name: _show(bob, name) for name in _SETTINGS}
        for statement, _ in _SETTINGS.values():
            alice.execute(statement)
        assert _pid(alice) == _pid(bob), "precondition: one backend connection for both"
        assert {name: _show(bob, name) for name in _SETTINGS} == defaults
        assert {name: _show(alice, name) for name in _SETTINGS} == {n: v for n, (_, v) in _SETTINGS.items()}
        assert {name: _show(bob, name) for name in _SETTINGS} == defaults
        # What the client was told (ParameterStatus) is its own too.
        assert alice.info.parameter_status("application_name") == "alice-secret"
        assert bob.info.parameter_status("application_name") != "alice-secret"
        alice.execute("RESET ALL")
        assert {name: _show(alice, name) for name in _SETTINGS} == defaults


def test_startup_parameters_are_each_sessions_own_on_a_shared_backend(one: RunningProxy):
    async def scenario() -> None:
        dsn = dict(host=one.host, port=one.port, user="analyst", password="analyst", database=TEST_DATABASE)
        tokyo = await asyncpg.connect(**dsn, server_settings={"TimeZone": "Asia/Tokyo", "application_name": "tokyo"})
        lima = await asyncpg.connect(**dsn, server_settings={"TimeZone": "America/Lima", "application_name": "lima"})
        try:
            for _ in range(3):
                assert await tokyo.fetchval("SHOW TimeZone") == "Asia/Tokyo"
                assert await lima.fetchval("SHOW TimeZone") == "America/Lima"
                assert await tokyo.fetchval("SHOW application_name") == "tokyo"
                assert await lima.fetchval("SHOW application_name") == "lima"
            assert await tokyo.fetchval("SELECT pg_backend_pid()") == await lima.fetchval("SELECT pg_backend_pid()")
            assert tokyo.get_settings().TimeZone == "Asia/Tokyo" and lima.get_settings().TimeZone == "America/Lima"
        finally:
            await tokyo.close()
            await lima.close()

    asyncio.run(scenario())


def test_a_plan_resolved_under_one_search_path_never_runs_under_anothers(one: RunningProxy, admin):
    admin.execute("CREATE SCHEMA IF NOT EXISTS pool_shadow")
    admin.execute("CREATE TABLE IF NOT EXISTS pool_shadow.lookup (code text, label text)")
    admin.execute("GRANT USAGE ON SCHEMA pool_shadow TO dpproxy_service")
    admin.execute("GRANT SELECT ON pool_shadow.lookup TO dpproxy_service")
    try:
        with one.connect() as alice, one.connect() as bob:
            bob.execute("SET search_path = pool_shadow, public")
            for _ in range(3):  # interleaved on the one backend connection
                assert alice.execute("SELECT label FROM lookup WHERE code = %s", ("M",), prepare=True).fetchall() == [("Male",)]
                with pytest.raises(psycopg.Error) as refused:
                    bob.execute("SELECT label FROM lookup WHERE code = %s", ("M",), prepare=True)
                assert refused.value.diag.sqlstate == "42501"  # pool_shadow.lookup is not in the policy
                assert alice.execute("SELECT COUNT(*) FROM adult").fetchone()[0] > 40000
    finally:  # a second relation named lookup would stay in pg_class for the modules after this one
        admin.execute("DROP SCHEMA pool_shadow CASCADE")


def test_prepared_statements_cursors_and_temp_objects_leave_nothing_on_the_backend(one: RunningProxy):
    with one.connect() as alice, one.connect() as bob:
        alice.execute("SELECT label FROM lookup WHERE code = %s", ("M",), prepare=True)  # a named statement
        for refused in (
            "PREPARE p AS SELECT 1", "LISTEN channel",
            "CREATE TEMP TABLE t (x int)", "SELECT 1 AS x INTO TEMP t2", "SELECT pg_advisory_lock(1)",
        ):
            with pytest.raises(psycopg.Error) as raised:
                alice.execute(refused)
            assert "dpproxy" in str(raised.value), f"{refused!r} reached the backend: {raised.value}"
        # A cursor WITH HOLD keeps the connection to its session until CLOSE (below).
        alice.execute("DECLARE c CURSOR WITH HOLD FOR SELECT 1")
        assert alice.execute("FETCH ALL c").fetchall() == [(1,)]
        alice.execute("CLOSE c")
        assert _pid(alice) == _pid(bob)
        assert bob.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)
        # (The portal running this query is the unnamed one: dpproxy sends it as one statement.)
        assert bob.execute("SELECT count(*) FROM pg_cursors WHERE name <> ''").fetchone() == (0,)
        assert bob.execute("SELECT count(*) FROM pg_class WHERE relpersistence = 't'").fetchone() == (0,)


def _select_one_meanwhile(conn: Any) -> tuple[threading.Event, threading.Thread]:
    """``SELECT 1`` on ``conn`` in a thread: the event is set when it has been answered."""
    done = threading.Event()

    def other() -> None:
        conn.execute("SELECT 1")
        done.set()

    worker = threading.Thread(target=other, daemon=True)
    worker.start()
    return done, worker


def test_a_cursor_with_hold_holds_its_connection_until_close(one: RunningProxy):
    with one.connect() as alice, one.connect() as bob:
        alice.execute("DECLARE held CURSOR WITH HOLD FOR SELECT g FROM generate_series(1, 3) AS g")
        pid = _pid(alice)
        done, worker = _select_one_meanwhile(bob)
        assert not done.wait(0.5), "another session ran on the connection holding the cursor"
        assert alice.execute("FETCH 2 FROM held").fetchall() == [(1,), (2,)]
        assert _pid(alice) == pid
        alice.execute("CLOSE held")
        assert done.wait(10)
        worker.join(10)
        assert bob.execute("SELECT count(*) FROM pg_cursors WHERE name <> ''").fetchone() == (0,)


def test_a_transaction_holds_one_connection_from_begin_to_commit(one: RunningProxy):
    with one.connect() as alice, one.connect() as bob:
        alice.execute("BEGIN")
        alice.execute("SET LOCAL search_path = pg_catalog")
        pid = _pid(alice)
        done, worker = _select_one_meanwhile(bob)
        assert not done.wait(0.5), "another session ran while the transaction held the only connection"
        assert _show(alice, "search_path") == "pg_catalog"
        assert _pid(alice) == pid
        alice.execute("COMMIT")
        assert done.wait(10)
        worker.join(10)
        assert _show(alice, "search_path") == '"$user", public'  # SET LOCAL ended with the transaction
        assert _show(bob, "search_path") == '"$user", public'


def test_twenty_clients_share_two_backend_connections(two: RunningProxy):
    pids: set[int] = set()
    failures: list[BaseException] = []

    def client(i: int) -> None:
        try:
            with two.connect() as conn:
                conn.execute(f"SET application_name = 'client-{i}'")
                for _ in range(5):
                    pids.add(_pid(conn))
                    assert conn.execute("SELECT COUNT(*) FROM adult WHERE age > 30").fetchone()[0] > 0
                    assert _show(conn, "application_name") == f"client-{i}"
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    assert 1 <= len(pids) <= 2


def test_an_exhausted_pool_answers_53300_naming_the_policy_key_and_charges_nothing(starved: RunningProxy):
    with starved.connect() as holder, starved.connect() as waiting:
        spent = spent_epsilon(waiting)
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        started = time.monotonic()
        with pytest.raises(psycopg.Error) as exhausted:
            waiting.execute("SELECT COUNT(*) FROM adult")
        assert 0.4 < time.monotonic() - started < 5
        assert exhausted.value.diag.sqlstate == "53300"
        assert "backend.pool.size" in (exhausted.value.diag.message_hint or "")
        holder.execute("COMMIT")
        assert spent_epsilon(waiting) == pytest.approx(spent), "a query that got no connection was charged"
        assert REGISTRY.get_sample_value("dpproxy_backend_pool_timeouts_total") >= 1
        assert waiting.execute("SELECT 1").fetchone() == (1,)  # the session goes on


def test_a_cancel_reaches_the_connection_its_session_is_using_and_no_other(two: RunningProxy, admin):
    admin.execute("BEGIN")
    admin.execute("LOCK TABLE lookup IN ACCESS EXCLUSIVE MODE")
    outcomes: dict[str, Any] = {}

    def wait_on_lock(name: str, conn: psycopg.Connection) -> None:
        try:
            outcomes[name] = conn.execute("SELECT count(*) FROM lookup").fetchone()
        except BaseException as exc:
            outcomes[name] = exc

    with two.connect() as alice, two.connect() as bob:
        workers = [threading.Thread(target=wait_on_lock, args=(n, c), daemon=True)
                   for n, c in (("alice", alice), ("bob", bob))]
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 10
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = 'dpproxy_service' "
                            "AND wait_event_type = 'Lock'").fetchone()[0] < 2:
            assert time.monotonic() < deadline, "both sessions should be waiting on the lock"
            time.sleep(0.05)
        discarded = REGISTRY.get_sample_value("dpproxy_backend_pool_discarded_total", {"reason": "cancelled"}) or 0
        alice.cancel_safe()
        workers[0].join(10)
        assert isinstance(outcomes["alice"], psycopg.errors.QueryCanceled)
        # The cancelled connection is closed, never pooled: a late signal cannot hit another session.
        deadline = time.monotonic() + 5
        while REGISTRY.get_sample_value("dpproxy_backend_pool_discarded_total", {"reason": "cancelled"}) != discarded + 1:
            assert time.monotonic() < deadline, "the cancelled connection was not closed"
            time.sleep(0.02)
        assert "bob" not in outcomes, "bob's statement was cancelled too"
        admin.execute("ROLLBACK")
        workers[1].join(10)
        assert outcomes["bob"] == (2,)
        assert alice.execute("SELECT 1").fetchone() == (1,)  # the cancelled session goes on


def test_named_statements_and_portals_work_across_syncs_on_changing_connections(one: RunningProxy):
    async def scenario() -> None:
        dsn = dict(host=one.host, port=one.port, user="analyst", password="analyst", database=TEST_DATABASE)
        alice = await asyncpg.connect(**dsn)
        bob = await asyncpg.connect(**dsn)
        try:
            statement = await alice.prepare("SELECT label FROM lookup WHERE code = $1")
            await bob.execute("SET search_path = pg_catalog")
            for code, label in (("M", "Male"), ("F", "Female"), ("M", "Male")):
                assert await statement.fetchval(code) == label
                assert await bob.fetchval("SHOW search_path") == "pg_catalog"
            async with alice.transaction():
                cursor = await alice.cursor("SELECT code FROM lookup ORDER BY code")  # a portal, fetched in pieces
                assert [r["code"] for r in await cursor.fetch(1)] == ["F"]
                assert [r["code"] for r in await cursor.fetch(1)] == ["M"]
        finally:
            await alice.close()
            await bob.close()

    asyncio.run(scenario())


def test_pgbench_with_more_clients_than_backend_connections(two: RunningProxy, tmp_path: Path):
    pgbench = require_tool("pgbench", "postgresql (pgbench comes with the server package)")
    script = tmp_path / "load.sql"
    script.write_text("\\set a random(20, 60)\nBEGIN;\nSELECT COUNT(*) FROM adult WHERE age > :a;\n"
                      "SET LOCAL search_path = pg_catalog;\nSHOW search_path;\nCOMMIT;\nSHOW search_path;\n")
    env = {**os.environ, "PGPASSWORD": "analyst", "PGCONNECT_TIMEOUT": "10"}
    result = subprocess.run(
        [pgbench, "-n", "-M", "extended", "-f", str(script), "-t", "10", "-c", "8", "-j", "2",
         "-h", two.host, "-p", str(two.port), "-U", "analyst", TEST_DATABASE],
        capture_output=True, text=True, env=env, timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "number of transactions actually processed: 80/80" in result.stdout


def test_settings_survive_checkouts_byte_for_byte_whatever_the_client_encodings(one: RunningProxy):
    with psycopg.connect(one.dsn(), autocommit=True, prepare_threshold=None, client_encoding="LATIN1") as latin, \
         one.connect() as utf8:
        # dpproxy reads client messages as UTF-8, so the LATIN1 client sends ASCII only; the
        # UTF-8 session's settings are restored on a connection last left in LATIN1.
        latin.execute("SET search_path = latin, public")
        utf8.execute("SET search_path = \"zürich\", public")
        for _ in range(3):
            assert _show(latin, "search_path") == "latin, public"
            assert _show(latin, "client_encoding") == "LATIN1"
            assert _show(utf8, "search_path") == '"zürich", public'
            assert _show(utf8, "client_encoding") == "UTF8"
        assert _pid(latin) == _pid(utf8)


def test_reset_gives_back_the_startup_parameters_as_postgresql_does(one: RunningProxy):
    async def scenario() -> None:
        dsn = dict(host=one.host, port=one.port, user="analyst", password="analyst", database=TEST_DATABASE)
        conn = await asyncpg.connect(**dsn, server_settings={"TimeZone": "Asia/Tokyo", "application_name": "tokyo"})
        try:
            await conn.execute("SET TimeZone = 'UTC'; SET application_name = 'other'")
            await conn.execute("RESET TIME ZONE")
            assert await conn.fetchval("SHOW TimeZone") == "Asia/Tokyo"
            await conn.execute("SET TimeZone = 'UTC'")
            await conn.execute("RESET ALL")
            assert await conn.fetchval("SHOW TimeZone") == "Asia/Tokyo"
            assert await conn.fetchval("SHOW application_name") == "tokyo"
            await conn.execute("SET TimeZone TO DEFAULT")
            assert await conn.fetchval("SHOW TimeZone") == "Asia/Tokyo"
            await conn.execute("SET application_name = 'other'")
            await conn.execute("DISCARD ALL")  # drops the statements asyncpg has prepared: a new text
            assert await conn.fetchval("SELECT current_setting('application_name')") == "tokyo"
        finally:
            await conn.close()

    asyncio.run(scenario())


def test_idle_pooled_connections_are_closed_after_idle_timeout(test_db, tmp_path_factory, admin):
    text = _policy(2).replace("checkout_timeout_s: 10}}", "checkout_timeout_s: 10, idle_timeout_s: 0.5}}")
    with running_proxy(test_db, tmp_path_factory, text) as proxy, proxy.connect() as conn:
        pid = _pid(conn)
        assert admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() == (1,)
        deadline = time.monotonic() + 10
        while admin.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() != (0,):
            assert time.monotonic() < deadline, "an idle pooled connection outlived backend.pool.idle_timeout_s"
            time.sleep(0.1)
        assert _pid(conn) != pid  # the session goes on, on a new connection


def test_the_first_session_of_a_server_is_told_the_backends_parameters(test_db, tmp_path_factory) -> None:
    # psycopg2 (Superset's driver) refuses a server that reports no client_encoding; the very
    # first session of a startup kind has no earlier session's values to stand in for them.
    expected = {"client_encoding": "UTF8", "server_encoding": "UTF8", "integer_datetimes": "on",
                "standard_conforming_strings": "on", "DateStyle": "ISO, MDY"}
    with running_proxy(test_db, tmp_path_factory, _policy(1)) as fresh:
        with fresh.connect() as first, fresh.connect() as second:
            for conn in (first, second):
                assert {name: conn.info.parameter_status(name) for name in expected} == expected
                assert conn.info.parameter_status("server_version")


def _pool_counts(proxy: RunningProxy) -> tuple[int, int, int]:
    """The pool's connections in use, idle, and the checkouts waiting, read on the proxy's loop."""
    async def read() -> tuple[int, int, int]:
        pool = proxy.server.pool
        return pool.in_use, pool.idle, pool.waiting
    return proxy._call(read())


def _until_waiting(proxy: RunningProxy, count: int) -> None:
    deadline = time.monotonic() + 30
    while _pool_counts(proxy)[2] != count:
        assert time.monotonic() < deadline, f"expected {count} checkout(s) waiting, pool {_pool_counts(proxy)}"
        time.sleep(0.01)


def test_cancels_and_closed_clients_waiting_for_a_checkout_give_every_slot_back(test_db, tmp_path_factory):
    # A checkout a CancelRequest ends must leave the pool as it was: a slot counted as taken per
    # such wait would shrink the pool until every session waited. So must one whose client goes
    # away while it waits: the wait ends then, and the statement is dropped.
    statements = ["SELECT 1", "SELECT COUNT(*) FROM adult"] * 3
    with running_proxy(test_db, tmp_path_factory, _policy(1, checkout_timeout_s=600)) as proxy, \
            proxy.connect() as holder, proxy.connect() as probe:
        probe.execute("SELECT 1")
        spent = spent_epsilon(probe)
        start = _pool_counts(proxy)
        assert start == (0, 1, 0)
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        for statement in statements:
            with proxy.connect() as cancelled:
                outcome: list[BaseException | None] = []

                def run(conn: psycopg.Connection = cancelled, sql: str = statement) -> None:
                    try:
                        conn.execute(sql)
                        outcome.append(None)
                    except BaseException as exc:
                        outcome.append(exc)

                worker = threading.Thread(target=run, daemon=True)
                worker.start()
                _until_waiting(proxy, 1)
                cancelled.cancel_safe()
                worker.join(30)
                assert outcome and isinstance(outcome[0], psycopg.errors.QueryCanceled), outcome
            _until_waiting(proxy, 0)
            assert _pool_counts(proxy) == (1, 0, 0)  # the holder's connection, nothing more
        for statement in statements:
            closing = proxy.connect()
            closing.pgconn.send_query(statement.encode())
            assert closing.pgconn.flush() == 0
            _until_waiting(proxy, 1)
            closing.close()  # Terminate, then the socket closes, the statement still waiting
            _until_waiting(proxy, 0)
        assert _pool_counts(proxy) == (1, 0, 0)
        holder.execute("COMMIT")
        done, worker = _select_one_meanwhile(probe)
        assert done.wait(60), f"the pool did not serve a statement after the cancels: {_pool_counts(proxy)}"
        worker.join(10)
        deadline = time.monotonic() + 30
        while _pool_counts(proxy) != start:
            assert time.monotonic() < deadline, f"pool {_pool_counts(proxy)}, at the start {start}"
            time.sleep(0.02)
        # Neither the cancelled statements nor the closed clients' were charged.
        assert spent_epsilon(probe) == pytest.approx(spent)


def _send_count(conn: psycopg.Connection, how: str) -> None:
    """Send a DP count on ``conn`` without waiting for its answer, as ``how`` says."""
    pgconn = conn.pgconn
    if how == "extended":
        pgconn.send_query_params(b"SELECT COUNT(*) FROM adult", None)
    elif how == "extended_block":  # Parse/Bind/Describe/Execute of each, one Sync at the end
        pgconn.enter_pipeline_mode()
        pgconn.send_query_params(b"BEGIN", None)
        pgconn.send_query_params(b"SELECT COUNT(*) FROM adult", None)
        pgconn.pipeline_sync()
    elif how == "simple_block":
        pgconn.send_query(b"BEGIN; SELECT COUNT(*) FROM adult; COMMIT")
    else:
        pgconn.send_query(b"SELECT COUNT(*) FROM adult")
    assert pgconn.flush() == 0


@pytest.mark.parametrize("how", ["simple", "extended", "simple_block", "extended_block", "shutdown_socket"])
def test_a_dp_statement_whose_client_goes_while_it_waits_for_a_connection_is_dropped_uncharged(
        how: str, test_db, tmp_path_factory):
    # Nothing of it reached the backend and nobody is left to read its answer: run when a
    # connection freed up, it was charged for nothing.
    with running_proxy(test_db, tmp_path_factory, _policy(1, checkout_timeout_s=600)) as proxy, \
            proxy.connect() as holder, proxy.connect() as probe:
        spent = spent_epsilon(probe)
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        leaving = proxy.connect()
        _send_count(leaving, how)
        _until_waiting(proxy, 1)
        if how == "shutdown_socket":  # no Terminate: the client's side of the socket just ends
            import socket
            socket.socket(fileno=os.dup(leaving.pgconn.socket)).shutdown(socket.SHUT_RDWR)
        else:
            leaving.pgconn.finish()  # Terminate, then the socket closes
        leaving.close()
        _until_waiting(proxy, 0)  # before the holder gives its connection back
        assert _pool_counts(proxy) == (1, 0, 0)
        holder.execute("COMMIT")
        assert probe.execute("SELECT COUNT(*) FROM adult").fetchone()[0] > 40000
        assert spent_epsilon(probe) == pytest.approx(spent + 1.0), "only the probe's count was charged"
        assert proxy.server.session_count == 2


def test_a_dp_statement_whose_client_goes_after_its_charge_stays_charged(test_db, tmp_path_factory, admin):
    # Once it is charged its rows may be read: whatever the client does then, the charge stands.
    with running_proxy(test_db, tmp_path_factory, _policy(2)) as proxy, proxy.connect() as probe:
        spent = spent_epsilon(probe)
        locker = psycopg.connect(test_db.admin_dsn, autocommit=True)
        locker.execute("BEGIN")
        locker.execute("LOCK TABLE adult IN ACCESS EXCLUSIVE MODE")
        try:
            leaving = proxy.connect()
            _send_count(leaving, "simple")
            deadline = time.monotonic() + 30
            # Waiting for the lock on the backend: sent, so charged.
            while not admin.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND query LIKE '%adult%' AND pid <> pg_backend_pid()").fetchone()[0]:
                assert time.monotonic() < deadline, "the DP count never reached the backend"
                time.sleep(0.01)
            leaving.pgconn.finish()
            leaving.close()
        finally:
            locker.close()  # the lock goes with it
        deadline = time.monotonic() + 30
        while proxy.server.session_count != 1:
            assert time.monotonic() < deadline, "the closed client's session did not end"
            time.sleep(0.01)
        assert spent_epsilon(probe) == pytest.approx(spent + 1.0)


def test_a_session_ended_just_as_the_pool_hands_it_a_connection_gives_the_connection_back(
        test_db, tmp_path_factory, admin):
    # A shutdown cancels each session's task. Cancelled after the pool handed its checkout a
    # connection but before the session took it, the connection stayed counted in use and open
    # on PostgreSQL, past the pool's close, for as long as the process lived.
    def service_pids() -> set[int]:
        return {pid for (pid,) in admin.execute("SELECT pid FROM pg_stat_activity WHERE usename = 'dpproxy_service'")}

    before = service_pids()
    with running_proxy(test_db, tmp_path_factory, _policy(1, checkout_timeout_s=600)) as proxy, \
            proxy.connect() as holder:
        pool = proxy.server.pool
        real_acquire = pool.acquire

        async def acquire_then_shut_down(state: Any) -> Any:
            """The pool's checkout, and the waiting session's task cancelled right after it."""
            conn = await real_acquire(state)
            checkout = asyncio.current_task()
            for task, session in proxy.server._connections.items():
                if session.backend is not None and session.backend._checkout_wait._wait is checkout:
                    # Runs before the session's task wakes up to take the connection.
                    asyncio.get_running_loop().call_soon(task.cancel)
            return conn

        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        ended = proxy.connect()
        pool.acquire = acquire_then_shut_down  # type: ignore[method-assign]
        _send_count(ended, "simple")
        _until_waiting(proxy, 1)
        holder.execute("COMMIT")
        ended.pgconn.consume_input()
        while ended.pgconn.is_busy():
            ended.pgconn.consume_input()  # blocks until the FATAL 57P01 and the close
        failed = ended.pgconn.get_result()
        assert failed is not None and failed.error_field(psycopg.pq.DiagnosticField.SQLSTATE) == b"57P01"
        ended.close()
        deadline = time.monotonic() + 30
        while _pool_counts(proxy) != (0, 1, 0):
            assert time.monotonic() < deadline, f"pool {_pool_counts(proxy)}: the connection handed over was kept"
            time.sleep(0.01)
        pool.acquire = real_acquire  # type: ignore[method-assign]
    # After the shutdown no backend connection of that proxy is left, the one handed over least of all.
    deadline = time.monotonic() + 30
    while service_pids() - before:
        assert time.monotonic() < deadline, f"backend connections left after the shutdown: {service_pids() - before}"
        time.sleep(0.01)
