"""Transactions and session statements through dpproxy, in both protocols."""

from __future__ import annotations

import psycopg
import pytest

from conftest import RunningProxy
from wire import SYNC, Wire, bind, cstr, execute, message, parse


def _simple(wire: Wire, sql: str) -> list[tuple[bytes, bytes]]:
    wire.send(message(b"Q", cstr(sql)))
    return wire.read_until(b"Z")


def test_transaction_status_byte_follows_begin_savepoint_rollback_commit(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)
    assert _simple(wire, "BEGIN")[-1] == (b"Z", b"T")
    assert _simple(wire, "SAVEPOINT s1")[-1] == (b"Z", b"T")
    assert _simple(wire, "SELECT COUNT(*) FROM adult")[-1] == (b"Z", b"T")  # DP inside a transaction
    assert _simple(wire, "SELECT * FROM no_such_table_here")[-1][0] == b"Z"
    assert _simple(wire, "ROLLBACK TO SAVEPOINT s1")[-1] == (b"Z", b"T")
    assert _simple(wire, "RELEASE s1")[-1] == (b"Z", b"T")
    assert _simple(wire, "COMMIT")[-1] == (b"Z", b"I")
    wire.close()


def test_backend_error_inside_a_transaction_reports_failed_status(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)
    _simple(wire, "BEGIN")
    replies = _simple(wire, "SELECT 1/0")
    assert replies[-1] == (b"Z", b"E")
    assert _simple(wire, "ROLLBACK")[-1] == (b"Z", b"I")
    wire.close()


def test_commit_through_the_extended_protocol(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)
    wire.send(parse("", "BEGIN"), bind("", ""), execute(""), SYNC)
    assert wire.read_until(b"Z")[-1] == (b"Z", b"T")
    wire.send(parse("S_1", "COMMIT"), bind("", "S_1"), execute("", 1), SYNC)
    replies = wire.read_until(b"Z")
    assert [k for k, _ in replies] == [b"1", b"2", b"C", b"Z"] and replies[-1][1] == b"I"
    wire.close()


def test_set_of_a_reported_setting_sends_parameter_status(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)
    replies = _simple(wire, "SET application_name = 'PostgreSQL JDBC Driver'")
    statuses = [body for kind, body in replies if kind == b"S"]
    assert statuses == [b"application_name\0PostgreSQL JDBC Driver\0"]
    assert [k for k, _ in replies][-2:] == [b"S", b"Z"]
    replies = _simple(wire, "SET DateStyle = 'ISO'; SET extra_float_digits = 2; show transaction_isolation")
    assert [k for k, _ in replies].count(b"C") == 3
    wire.close()


def test_deallocate_and_discard_act_on_dpproxy_prepared_statements(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)
    wire.send(parse("_PLAN0x1", "SELECT COUNT(*) FROM adult WHERE age > $1"), SYNC)
    wire.read_until(b"Z")
    # pgjdbc's autosave, which it sends inside a transaction block (outside one PostgreSQL
    # refuses the SAVEPOINT: a query string's implicit transaction is no block).
    _simple(wire, "BEGIN")
    replies = _simple(wire, 'SAVEPOINT _per_query_svp_;DEALLOCATE "_PLAN0x1";RELEASE _per_query_svp_')
    assert [k for k, _ in replies].count(b"C") == 3 and b"E" not in [k for k, _ in replies]
    _simple(wire, "COMMIT")
    replies = _simple(wire, 'DEALLOCATE "_PLAN0x1"')
    assert replies[0][0] == b"E" and b"26000" in replies[0][1]
    wire.send(parse("again", "SELECT 1"), SYNC)
    wire.read_until(b"Z")
    assert b"E" not in [k for k, _ in _simple(wire, "DISCARD ALL")]
    wire.send(bind("", "again"), execute(""), SYNC)
    assert wire.read_until(b"Z")[0][0] == b"E"  # DISCARD ALL dropped it
    wire.close()


@pytest.mark.parametrize("reset", ["RESET ALL", "DISCARD ALL"])
def test_reset_all_and_discard_all_reset_dpproxy_epsilon_too(proxy: RunningProxy, reset: str):
    # A client pool (pgbouncer's server_reset_query) hands the session to the next client
    # with DISCARD ALL: that client must not inherit the last one's SET dpproxy.epsilon.
    with proxy.connect() as conn:
        conn.execute("SET dpproxy.epsilon = 0.25")
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("0.25",)
        conn.execute(reset)
        assert conn.execute("SHOW dpproxy.epsilon").fetchone() == ("default",)


def test_pool_reset_string_of_asyncpg_passes(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)
    replies = _simple(wire, "SELECT pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL;")
    assert b"E" not in [k for k, _ in replies]
    wire.close()


def test_search_path_change_replans_a_prepared_statement(proxy: RunningProxy, admin):
    admin.execute("CREATE SCHEMA IF NOT EXISTS shadow")
    admin.execute("CREATE TABLE IF NOT EXISTS shadow.lookup (code text, label text)")
    admin.execute("GRANT USAGE ON SCHEMA shadow TO dpproxy_service")
    admin.execute("GRANT SELECT ON shadow.lookup TO dpproxy_service")
    try:
        with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
            conn.execute("SELECT label FROM lookup WHERE code = %s", ("M",), prepare=True)
            conn.execute("SET search_path = shadow, public")
            with pytest.raises(psycopg.Error) as info:
                conn.execute("SELECT label FROM lookup WHERE code = %s", ("M",), prepare=True)
            assert info.value.diag.sqlstate == "42501"  # shadow.lookup is not in the policy
    finally:  # a second relation named lookup would stay in pg_class for the modules after this one
        admin.execute("DROP SCHEMA shadow CASCADE")
