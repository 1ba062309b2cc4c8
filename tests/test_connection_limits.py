"""Connection limits: one analyst cannot take every session slot, and no crowd of clients the
process's file descriptors. A user past ``max_sessions`` and a client past
``listen.max_connections`` are told so as PostgreSQL tells them (53300), and nobody else is."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
from collections.abc import Iterator

import psycopg
import pytest
import wire

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy

_POLICY = ATTACK_POLICY_HEAD.replace(
    "  analyst: {{password: analyst,", "  analyst: {{max_sessions: 3, password: analyst,"
).replace("listen: {{host: 127.0.0.1, port: 0}}", "listen: {{host: 127.0.0.1, port: 0, max_connections: 8}}") + """
  public.adult:
    access: protected
    epsilon: 1.0
    columns:
      age: {{bounds: [17, 90]}}
"""


@pytest.fixture(scope="module")
def limited(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    assert "max_sessions: 3" in _POLICY and "max_connections: 8" in _POLICY
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _analyst(proxy: RunningProxy) -> psycopg.Connection:
    return psycopg.connect(proxy.dsn(), autocommit=True)


def test_a_user_past_max_sessions_is_refused_with_53300_and_may_connect_once_one_closes(limited: RunningProxy):
    sessions = [_analyst(limited) for _ in range(3)]
    try:
        with pytest.raises(psycopg.OperationalError) as refused:
            _analyst(limited)
        assert 'too many connections for role "analyst"' in str(refused.value)
        assert "max_sessions" in str(refused.value)
        # Another user is not limited by analyst's sessions.
        with psycopg.connect(limited.dsn(user="plain", password="plain"), autocommit=True) as plain:
            assert plain.execute("SELECT 1").fetchone() == (1,)
        sessions.pop().close()
        with _analyst(limited) as again:
            assert again.execute("SELECT count(*) > 0 FROM adult").fetchone() is not None
    finally:
        for conn in sessions:
            conn.close()


def test_logins_racing_each_other_cannot_pass_max_sessions_together(limited: RunningProxy):
    async def login() -> psycopg.AsyncConnection | None:
        try:
            return await psycopg.AsyncConnection.connect(limited.dsn(), autocommit=True)
        except psycopg.OperationalError as exc:
            assert "too many connections" in str(exc)
            return None

    async def race() -> int:
        connections = await asyncio.gather(*(login() for _ in range(7)))
        opened = [conn for conn in connections if conn is not None]
        for conn in opened:
            await conn.close()
        return len(opened)

    assert asyncio.run(race()) == 3


def test_a_client_past_max_connections_is_refused_before_authentication(limited: RunningProxy):
    # Eight raw connections that have not finished startup hold every slot.
    held = [socket.create_connection((limited.host, limited.port), timeout=15) for _ in range(8)]
    try:
        extra = wire.Wire.__new__(wire.Wire)
        extra.sock = socket.create_connection((limited.host, limited.port), timeout=15)
        extra.buffer = b""
        extra.sock.sendall(wire.startup(user="nobody", database="dpproxy_test"))
        replies = extra.read_until(b"E")
        fields = wire.error_fields(replies[-1][1])
        assert fields[b"C"] == b"53300" and fields[b"S"] == b"FATAL"
        assert fields[b"M"] == b"sorry, too many clients already"
        extra.close()
    finally:
        for sock in held:
            sock.close()
    # The slots come back as those connections end.
    for _ in range(50):
        try:
            with _analyst(limited) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
            break
        except psycopg.OperationalError:
            asyncio.run(asyncio.sleep(0.1))
    else:
        pytest.fail("no slot came back after the held connections closed")


def _wrong_password(proxy: RunningProxy) -> None:
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(proxy.dsn(password="wrong"), autocommit=True)


def _wrong_database(proxy: RunningProxy) -> None:
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        psycopg.connect(proxy.dsn(database="no_such_db"), autocommit=True)


def _unsafe_encoding(proxy: RunningProxy) -> None:
    with pytest.raises(psycopg.OperationalError, match="client-encoding"):
        psycopg.connect(proxy.dsn(), autocommit=True, client_encoding="SJIS")


def _cancel_request(proxy: RunningProxy) -> None:
    with socket.create_connection((proxy.host, proxy.port), timeout=15) as sock:
        sock.sendall(struct.pack("!iiii", 16, 80877102, 12345, 678))
        assert sock.recv(1) == b""  # answered by closing


def _ssl_request_abandoned(proxy: RunningProxy) -> None:
    with socket.create_connection((proxy.host, proxy.port), timeout=15) as sock:
        sock.sendall(struct.pack("!ii", 8, 80877103))
        assert sock.recv(1) == b"N"


def _startup_cut_off(proxy: RunningProxy) -> None:
    with socket.create_connection((proxy.host, proxy.port), timeout=15) as sock:
        sock.sendall(wire.startup(user="analyst", database="dpproxy_test"))
        sock.recv(1)  # the authentication request; the client goes away without answering


def _session_used_and_closed(proxy: RunningProxy) -> None:
    with _analyst(proxy) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def _terminated(proxy: RunningProxy) -> None:
    client = wire.Wire(proxy.host, proxy.port)  # the cleartext user
    client.send(wire.message(b"X"))
    assert client.sock.recv(1) == b""  # dpproxy closes its side at once, nothing being left to send
    client.sock.close()


@pytest.mark.parametrize("attempt", [_wrong_password, _wrong_database, _unsafe_encoding, _cancel_request,
                                     _ssl_request_abandoned, _startup_cut_off, _session_used_and_closed,
                                     _terminated])
def test_a_failed_or_abandoned_connection_gives_its_slots_back(limited: RunningProxy, attempt):
    for _ in range(10):  # more than both limits
        attempt(limited)
    deadline = time.monotonic() + 10
    while True:  # the server sees an abandoned socket end a moment later
        sessions: list[psycopg.Connection] = []
        try:
            for _ in range(3):
                sessions.append(_analyst(limited))
            break
        except psycopg.OperationalError:
            for conn in sessions:
                conn.close()
            assert time.monotonic() < deadline, "a slot was never given back"
            time.sleep(0.1)
    try:
        assert [conn.execute("SELECT 1").fetchone() for conn in sessions] == [(1,)] * 3
    finally:
        for conn in sessions:
            conn.close()
