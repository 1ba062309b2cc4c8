"""Connection limits: one analyst cannot take every session slot, and no crowd of clients the
process's file descriptors. A user past ``max_sessions`` and a client past
``listen.max_connections`` are told so as PostgreSQL tells them (53300), and nobody else is."""

from __future__ import annotations

import asyncio
import socket
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
