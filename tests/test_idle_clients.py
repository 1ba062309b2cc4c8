"""Idle clients hold no PostgreSQL connection: the backend is opened at a session's first statement."""

from __future__ import annotations

import psycopg

from conftest import RunningProxy
from wire import Wire, cstr, message


def _backends(admin: psycopg.Connection) -> int:
    (count,) = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE usename = 'dpproxy_service' AND datname = 'dpproxy_test'"
    ).fetchone()
    return count


def test_150_idle_clients_do_not_take_150_backend_connections(proxy: RunningProxy, admin):
    Wire(proxy.host, proxy.port).close()  # the first of its kind learns the parameters
    before = _backends(admin)
    clients = [Wire(proxy.host, proxy.port) for _ in range(150)]  # more than max_connections (100)
    try:
        assert all(client.startup[-1] == (b"Z", b"I") for client in clients)
        assert _backends(admin) - before <= 1
        clients[0].send(message(b"Q", cstr("SELECT COUNT(*) FROM adult")))
        replies = clients[0].read_until(b"Z")
        assert [k for k, _ in replies][-3:] == [b"D", b"C", b"Z"]
    finally:
        for client in clients:
            client.close()


def test_a_lazy_session_reports_and_applies_its_own_startup_settings(proxy: RunningProxy):
    dsn = proxy.dsn() + " application_name=first"
    with psycopg.connect(dsn, autocommit=True):
        pass
    with psycopg.connect(proxy.dsn() + " application_name=dashboard-7 options='-c TimeZone=UTC'",
                         autocommit=True) as conn:
        assert conn.info.parameter_status("application_name") == "dashboard-7"
        assert conn.execute("SHOW application_name").fetchone() == ("dashboard-7",)
        assert conn.execute("SELECT COUNT(*) FROM adult").fetchone()[0] > 40000
