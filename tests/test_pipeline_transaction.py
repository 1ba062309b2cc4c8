"""An extended-protocol pipeline is one implicit transaction, and its error goes out at once.

In PostgreSQL the messages up to a Sync run in one implicit transaction: an error before the
Sync rolls back everything since the last one, a ``SET`` included (psycopg's pipeline mode,
pgjdbc's batches and asyncpg's executemany send many statements before one Sync). dpproxy
used to commit each statement on its own, so a ``SET`` earlier in a failed pipeline stayed in
force. And PostgreSQL sends an ErrorResponse as soon as the error happens, then ignores
everything up to the Sync; dpproxy held it until the client's Sync or Flush. Each behaviour
is compared with the same client connected straight to PostgreSQL.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import asyncpg
import psycopg
import pytest

from conftest import RunningProxy, TestDatabase, spent_epsilon
from test_backend_pool import one, starved  # noqa: F401 - one-connection proxies, fixtures used by name
from wire import FLUSH, SYNC, Wire, bind, cstr, data_row_values, describe, error_fields, execute, message, parse


def _failed_pipeline(conn: psycopg.Connection, *statements: str) -> str | None:
    """Run ``statements`` in one psycopg pipeline (one Sync at its end): the SQLSTATE it failed with."""
    try:
        with conn.pipeline():
            for sql in statements:
                conn.execute(sql)
    except psycopg.Error as exc:
        return exc.diag.sqlstate
    return None


def _both(test_db: TestDatabase, proxy: RunningProxy, scenario: Callable[[psycopg.Connection], object]) -> list[object]:
    """``scenario`` run on a connection straight to PostgreSQL, then on one through dpproxy."""
    results = []
    for dsn in (test_db.admin_dsn, proxy.dsn()):
        with psycopg.connect(dsn, autocommit=True) as conn:
            results.append(scenario(conn))
    return results


def test_a_set_earlier_in_a_failed_pipeline_is_rolled_back_as_on_postgresql(proxy: RunningProxy, test_db):
    def scenario(conn: psycopg.Connection) -> object:
        failed = _failed_pipeline(conn, "SET TimeZone = 'Asia/Tokyo'", "SELECT 1/0")
        return failed, conn.execute("SHOW TimeZone").fetchone(), conn.info.parameter_status("TimeZone")

    direct, proxied = _both(test_db, proxy, scenario)
    assert direct == proxied == ("22012", ("Etc/UTC",), "Etc/UTC")


def test_a_set_in_a_pipeline_that_succeeds_is_kept_and_reported(proxy: RunningProxy, test_db):
    def scenario(conn: psycopg.Connection) -> object:
        failed = _failed_pipeline(conn, "SET TimeZone = 'Asia/Tokyo'", "SELECT 1", "SELECT set_config('DateStyle', 'German', false)")
        return (failed, conn.execute("SHOW TimeZone").fetchone(), conn.info.parameter_status("TimeZone"),
                conn.info.parameter_status("DateStyle"), conn.info.transaction_status)

    direct, proxied = _both(test_db, proxy, scenario)
    assert direct == proxied == (None, ("Asia/Tokyo",), "Asia/Tokyo", "German, DMY", psycopg.pq.TransactionStatus.IDLE)


def test_set_config_earlier_in_a_failed_pipeline_is_rolled_back_as_on_postgresql(proxy: RunningProxy, test_db):
    def scenario(conn: psycopg.Connection) -> object:
        failed = _failed_pipeline(conn, "SELECT set_config('DateStyle', 'German', false)", "SELECT 1/0")
        return failed, conn.execute("SHOW DateStyle").fetchone()

    direct, proxied = _both(test_db, proxy, scenario)
    assert direct == proxied == ("22012", ("ISO, MDY",))


def test_a_begin_inside_a_pipeline_makes_its_implicit_transaction_a_block_as_on_postgresql(proxy: RunningProxy, test_db):
    """SET, BEGIN, then an error: the block the BEGIN began includes the SET, so the failed
    block's ROLLBACK undoes it; the pipeline's Sync leaves the block open and failed."""
    def scenario(conn: psycopg.Connection) -> object:
        failed = _failed_pipeline(conn, "SET TimeZone = 'Asia/Tokyo'", "BEGIN", "SELECT 1/0")
        status = conn.info.transaction_status
        conn.execute("ROLLBACK")
        return failed, status, conn.execute("SHOW TimeZone").fetchone()

    direct, proxied = _both(test_db, proxy, scenario)
    assert direct == proxied == ("22012", psycopg.pq.TransactionStatus.INERROR, ("Etc/UTC",))


def test_a_begin_with_options_after_a_set_in_a_pipeline_or_query_string_keeps_its_options(proxy: RunningProxy, test_db):
    """The block a BEGIN ISOLATION LEVEL SERIALIZABLE turns the implicit transaction into is
    serializable, as on PostgreSQL (dpproxy's conversion once dropped the options)."""
    def scenario(conn: psycopg.Connection) -> object:
        with conn.pipeline():
            conn.execute("SET TimeZone = 'Asia/Tokyo'")
            conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY")
            in_pipeline = conn.execute("SHOW transaction_isolation")
        seen = [in_pipeline.fetchone()]
        conn.execute("ROLLBACK")
        with conn.cursor() as cursor:  # psycopg's simple Query: no parameters
            cursor.execute(b"SET TimeZone = 'Asia/Tokyo'; BEGIN ISOLATION LEVEL SERIALIZABLE; SHOW transaction_isolation",
                           prepare=False)
            while cursor.nextset():
                pass
            seen.append(cursor.fetchone())
        conn.execute("ROLLBACK")
        return seen, conn.execute("SHOW TimeZone").fetchone()

    direct, proxied = _both(test_db, proxy, scenario)
    assert direct == proxied == ([("serializable",), ("serializable",)], ("Etc/UTC",))


def test_set_local_in_a_pipeline_lasts_until_its_sync_with_postgresqls_warning(proxy: RunningProxy, test_db):
    def scenario(conn: psycopg.Connection) -> object:
        warnings: list[tuple[str | None, str | None]] = []
        conn.add_notice_handler(lambda diag: warnings.append((diag.sqlstate, diag.message_primary)))
        with conn.pipeline():
            conn.execute("SET LOCAL TimeZone = 'Asia/Tokyo'")
            conn.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            inside = conn.execute("SELECT current_setting('TimeZone'), current_setting('transaction_isolation')")
        return inside.fetchone(), conn.execute("SHOW TimeZone").fetchone(), warnings

    direct, proxied = _both(test_db, proxy, scenario)
    assert direct == proxied == (("Asia/Tokyo", "serializable"), ("Etc/UTC",), [
        ("25P01", "SET LOCAL can only be used in transaction blocks"),
        ("25P01", "SET TRANSACTION can only be used in transaction blocks")])


def test_a_commit_inside_a_pipeline_keeps_what_came_before_it_as_on_postgresql(proxy: RunningProxy, test_db):
    def scenario(conn: psycopg.Connection) -> object:
        failed = _failed_pipeline(conn, "SET TimeZone = 'Asia/Tokyo'", "COMMIT", "SET DateStyle = 'German'",
                                  "SELECT 1/0")
        return failed, conn.execute("SHOW TimeZone").fetchone(), conn.execute("SHOW DateStyle").fetchone()

    direct, proxied = _both(test_db, proxy, scenario)
    assert direct == proxied == ("22012", ("Asia/Tokyo",), ("ISO, MDY",))


def test_asyncpg_executemany_that_fails_undoes_its_earlier_rows_settings_as_on_postgresql(proxy: RunningProxy, test_db):
    """asyncpg's executemany sends every row's Bind/Execute before one Sync: atomic on PostgreSQL."""
    async def scenario(connect: dict[str, object]) -> object:
        conn = await asyncpg.connect(**connect)
        try:
            with pytest.raises(asyncpg.InvalidParameterValueError):
                await conn.executemany("SELECT set_config('TimeZone', $1, false)", [("Asia/Tokyo",), ("nonsense",)])
            return await conn.fetchval("SHOW TimeZone")
        finally:
            await conn.close()

    direct = asyncio.run(scenario({"dsn": test_db.admin_dsn}))
    proxied = asyncio.run(scenario({"host": proxy.host, "port": proxy.port, "user": "analyst", "password": "analyst",
                                    "database": "dpproxy_test"}))
    assert direct == proxied == "Etc/UTC"


def test_dpproxy_epsilon_set_in_a_failed_pipeline_is_rolled_back_and_the_dp_answer_stays_charged_once(
        proxy: RunningProxy):
    """A DP answer sent inside a pipeline that fails later stays charged, exactly once: the
    answer reached the client (docs/deployment.md); the ε SET before it is undone."""
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        before = spent_epsilon(conn)
        failed = _failed_pipeline(conn, "SET dpproxy.epsilon = 0.25", "SELECT COUNT(*) FROM adult WHERE age > 40",
                                  "SELECT 1/0")
        assert failed == "22012"
        assert spent_epsilon(conn) - before == pytest.approx(0.25)
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("default",)


def test_a_failed_pipelines_set_does_not_reach_the_next_session_on_the_connection(one: RunningProxy):
    with psycopg.connect(one.dsn(), autocommit=True) as alice:
        assert _failed_pipeline(alice, "SET search_path = pg_catalog", "SET TimeZone = 'Asia/Tokyo'",
                                "SELECT 1/0") == "22012"
        assert alice.execute("SHOW search_path").fetchone() == ('"$user", public',)
        with psycopg.connect(one.dsn(), autocommit=True) as bob:
            assert bob.execute("SHOW search_path").fetchone() == ('"$user", public',)
            assert bob.execute("SHOW TimeZone").fetchone() == ("Etc/UTC",)
            assert bob.execute("SELECT COUNT(*) FROM adult WHERE age > 30").fetchone()[0] > 0


def test_a_pipelines_set_committed_at_its_sync_stays_its_sessions_own(one: RunningProxy):
    """The SET's implicit transaction commits at the Sync (ReadyForQuery I): the next session
    on the one connection has its own settings."""
    alice = Wire(one.host, one.port)
    try:
        alice.send(parse("", "SET TimeZone = 'Asia/Tokyo'"), bind("", ""), execute(""))
        alice.send(parse("", "SELECT 1"), bind("", ""), execute(""), SYNC)
        replies = alice.read_until(b"Z")
        assert [kind for kind, _ in replies] == [b"1", b"2", b"C", b"1", b"2", b"D", b"C", b"S", b"Z"]
        assert replies[-1] == (b"Z", b"I")
        with psycopg.connect(one.dsn(), autocommit=True) as bob:
            assert bob.execute("SHOW TimeZone").fetchone() == ("Etc/UTC",)
    finally:
        alice.close()


def test_psycopg_pipeline_that_waits_on_a_flush_for_a_failed_statement_does_not_hang(proxy: RunningProxy):
    """psycopg fetches a result inside a pipeline by a Flush and a wait: it gets the error, and
    the statements queued after it are not run."""
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            with conn.pipeline():
                conn.execute("SET TimeZone = 'Asia/Tokyo'")
                failing = conn.execute("SELECT 1/0")
                conn.execute("SET DateStyle = 'German'")
                failing.fetchone()
        assert conn.execute("SHOW TimeZone").fetchone() == ("Etc/UTC",)
        assert conn.execute("SHOW DateStyle").fetchone() == ("ISO, MDY",)


def _time_zone(wire: Wire) -> bytes | None:
    wire.send(message(b"Q", cstr("SHOW TimeZone")))
    (row,) = [data_row_values(body) for kind, body in wire.read_until(b"Z") if kind == b"D"]
    return row[0]


@pytest.mark.parametrize(("ending", "replies"), [
    # A simple Query ends the pipeline's implicit transaction, and its error rolls it back.
    (message(b"Q", cstr("SELECT 1/0")), [b"1", b"2", b"C", b"E", b"Z"]),
    # DISCARD ALL after another statement of a pipeline runs inside its transaction: refused.
    (parse("", "DISCARD ALL") + bind("", "") + execute("") + SYNC, [b"1", b"2", b"C", b"1", b"2", b"E", b"Z"]),
])
def test_a_pipelines_set_is_undone_by_what_ends_it_failing_as_on_postgresql(proxy: RunningProxy, ending, replies):
    """The replies and outcomes PostgreSQL 16 gives the same messages (compared by hand over a
    raw connection to it): the Query's error, or DISCARD ALL's 25001, undoes the SET before it."""
    wire = Wire(proxy.host, proxy.port)
    try:
        wire.send(parse("", "SET TimeZone = 'Asia/Tokyo'"), bind("", ""), execute(""), ending)
        got = wire.read_until(b"Z")
        assert [kind for kind, _ in got] == replies
        assert error_fields(got[-2][1])[b"C"] in (b"22012", b"25001")
        assert got[-1] == (b"Z", b"I")
        assert _time_zone(wire) == b"Etc/UTC"
    finally:
        wire.close()


def _error_before_sync(host: str, port: int) -> list[bytes]:
    """The kinds of the replies to Parse, Bind and Execute of a failing statement, sent without
    Sync or Flush: what arrives within 5 s (PostgreSQL sends its error at once)."""
    wire = Wire(host, port)
    try:
        wire.sock.settimeout(5)
        wire.send(parse("", "SELECT 1/0"), bind("", ""), execute(""), parse("", "SELECT 2"))
        try:
            replies = wire.read_until(b"E")
        except socket.timeout:
            return []
        assert error_fields(replies[-1][1])[b"C"] == b"22012"
        wire.send(SYNC)
        assert wire.read_until(b"Z")[-1] == (b"Z", b"I")  # the Parse after the error was ignored
        return [kind for kind, _ in replies]
    finally:
        wire.close()


def test_an_extended_protocol_error_is_sent_at_once_not_held_for_the_sync(proxy: RunningProxy):
    assert _error_before_sync(proxy.host, proxy.port) == [b"1", b"2", b"E"]


def _extended(wire: Wire, *statements: str) -> list[tuple[bytes, bytes]]:
    """``statements`` in one pipeline (Parse, Bind, Describe, Execute each; one Sync): the replies."""
    wire.send(*(parse("", sql) + bind("", "") + describe(b"P", "") + execute("") for sql in statements), SYNC)
    return wire.read_until(b"Z")


def test_dpproxy_settings_over_the_extended_protocol_need_no_backend_connection(starved: RunningProxy):
    """SET, SHOW and RESET of dpproxy.epsilon are answered by dpproxy alone, as over the simple
    protocol: with the pool's one connection held by another session's block, they used to
    wait for it (a pipeline's SET opened its implicit transaction with a BEGIN) and fail 53300."""
    with psycopg.connect(starved.dsn(), autocommit=False) as holder:
        holder.execute("SELECT 1")  # its block keeps the only connection
        wire = Wire(starved.host, starved.port)
        try:
            replies = _extended(wire, "SET dpproxy.epsilon = 0.5", "SHOW dpproxy.epsilon", "SET LOCAL dpproxy.epsilon = 0.25",
                                "SHOW dpproxy.epsilon")
            assert b"E" not in [kind for kind, _ in replies]
            assert [data_row_values(body) for kind, body in replies if kind == b"D"] == [[b"0.5"], [b"0.25"]]
            assert replies[-1] == (b"Z", b"I")
            replies = _extended(wire, "SHOW dpproxy.epsilon", "RESET dpproxy.epsilon", "SHOW dpproxy.epsilon",
                                "SHOW dpproxy.budget")
            rows = [data_row_values(body) for kind, body in replies if kind == b"D"]
            assert rows[:2] == [[b"0.5"], [b"default"]] and rows[2][0] == b"plain" and len(rows) == 3
            # Rolled back with the pipeline, still without the backend: the error is dpproxy's own.
            replies = _extended(wire, "SET dpproxy.epsilon = 0.5", "SET dpproxy.epsilon = -1")
            assert [error_fields(body)[b"C"] for kind, body in replies if kind == b"E"] == [b"22023"]
            replies = _extended(wire, "SHOW dpproxy.epsilon")
            assert [data_row_values(body) for kind, body in replies if kind == b"D"] == [[b"default"]]
        finally:
            wire.close()


def test_dpproxy_epsilon_in_a_pipeline_follows_its_commit_begin_and_rollback(proxy: RunningProxy):
    """A pipeline's ``SET dpproxy.epsilon`` (held in dpproxy alone until a statement needs the
    backend) is one with the backend settings of the same implicit transaction."""
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        assert _failed_pipeline(conn, "SET dpproxy.epsilon = 0.5", "SET TimeZone = 'Asia/Tokyo'",
                                "SELECT 1 / (count(*) - 2) FROM lookup") == "22012"
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("default",)
        assert conn.execute("SHOW TimeZone").fetchone() == ("Etc/UTC",)
        assert _failed_pipeline(conn, "SET dpproxy.epsilon = 0.5", "BEGIN", "SET dpproxy.epsilon = 0.25",
                                "ROLLBACK") is None
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("default",)
        assert _failed_pipeline(conn, "SET dpproxy.epsilon = 0.5", "COMMIT", "SET dpproxy.epsilon = 0.25",
                                "SELECT 1 / (count(*) - 2) FROM lookup") == "22012"
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.5",)


_DP = "SELECT COUNT(*) FROM adult WHERE age > 40"


@pytest.mark.parametrize(("statements", "charges"), [
    (("SELECT 1 / (count(*) - 2) FROM lookup", _DP), 0),  # skipped to the Sync, as PostgreSQL skips it
    (("SET TimeZone = 'Asia/Tokyo'", _DP, "ROLLBACK", _DP), 2),
    (("BEGIN", _DP, "SELECT 1 / (count(*) - 2) FROM lookup", _DP), 1),
    (("DECLARE c CURSOR WITH HOLD FOR " + _DP, "SELECT 1 / (count(*) - 2) FROM lookup"), 1),
], ids=["after-an-error", "around-a-rollback", "in-a-block-that-fails", "dp-cursor-rolled-back"])
def test_a_dp_answer_in_a_pipeline_is_charged_once_whatever_follows(proxy: RunningProxy, statements: tuple[str, ...],
                                                                     charges: int):
    """Charged when it is computed, once, whether the pipeline then commits, rolls back or
    fails; one after an error in the pipeline is never computed, and never charged."""
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        conn.execute("SET dpproxy.epsilon = 0.125")
        before = spent_epsilon(conn)
        _failed_pipeline(conn, *statements)
        if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")
        assert spent_epsilon(conn) - before == pytest.approx(0.125 * charges)
        with pytest.raises(psycopg.errors.InvalidCursorName):
            conn.execute("FETCH 1 FROM c")  # a cursor declared in a pipeline that failed is gone


def test_a_dp_answer_in_a_pipeline_whose_client_goes_before_the_sync_is_charged_once(proxy: RunningProxy):
    with psycopg.connect(proxy.dsn("plain", "plain"), autocommit=True) as conn:  # Wire's user
        before = spent_epsilon(conn)
        wire = Wire(proxy.host, proxy.port)
        try:
            wire.send(parse("", "SET dpproxy.epsilon = 0.125") + bind("", "") + execute(""),
                      parse("", _DP) + bind("", "") + execute(""), FLUSH)
            assert [kind for kind, _ in wire.read_until(b"C")][-1:] == [b"C"]
            assert [kind for kind, _ in wire.read_until(b"C")][-2:] == [b"D", b"C"]  # the answer came
        finally:
            wire.close()  # no Sync: the pipeline's implicit transaction is rolled back
        deadline = time.monotonic() + 10
        while spent_epsilon(conn) - before < 0.125 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # a second charge, if there were one, would come now
        assert spent_epsilon(conn) - before == pytest.approx(0.125)
