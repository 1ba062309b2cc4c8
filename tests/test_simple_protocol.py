"""Protocol v3 simple-query flow through dpproxy, driven by real clients and raw sockets."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess

import psycopg
import pytest

from conftest import TEST_DATABASE, RunningProxy, psql_path, spent_epsilon

from proxy.backend.connection import REPORTED_PARAMETERS, BackendSession
from proxy.backend.errors import BackendError
from proxy.wire import protocol


def _startup_packet(**params: str) -> bytes:
    body = struct.pack("!i", 196608) + b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in params.items()) + b"\0"
    return struct.pack("!i", len(body) + 4) + body


def _read_messages(sock: socket.socket, until: bytes) -> list[tuple[bytes, bytes]]:
    messages, buffer = [], b""
    while True:
        while len(buffer) >= 5:
            kind, length = buffer[:1], struct.unpack("!i", buffer[1:5])[0]
            if len(buffer) < 1 + length:
                break
            messages.append((kind, buffer[5 : 1 + length]))
            buffer = buffer[1 + length :]
            if kind == until:
                return messages
        chunk = sock.recv(65536)
        if not chunk:
            return messages
        buffer += chunk


def _login(proxy: RunningProxy) -> tuple[socket.socket, list[tuple[bytes, bytes]]]:
    sock = socket.create_connection((proxy.host, proxy.port), timeout=10)
    sock.sendall(struct.pack("!ii", 8, 80877103))  # SSLRequest
    assert sock.recv(1) == b"N"
    sock.sendall(struct.pack("!ii", 8, 80877104))  # GSSENCRequest
    assert sock.recv(1) == b"N"
    sock.sendall(_startup_packet(user="plain", database="dpproxy_test"))
    kind, body = _read_messages(sock, b"R")[0]
    assert kind == b"R" and struct.unpack("!i", body[:4])[0] == 3  # cleartext password
    sock.sendall(b"p" + struct.pack("!i", 4 + 6) + b"plain\0")
    return sock, _read_messages(sock, b"Z")


def _query(sock: socket.socket, sql: str) -> list[tuple[bytes, bytes]]:
    payload = sql.encode() + b"\0"
    sock.sendall(b"Q" + struct.pack("!i", len(payload) + 4) + payload)
    return _read_messages(sock, b"Z")


def test_startup_sends_backend_parameters_key_data_and_ready(proxy: RunningProxy):
    sock, messages = _login(proxy)
    kinds = [k for k, _ in messages]
    assert kinds[0] == b"R" and kinds[-1] == b"Z" and b"K" in kinds
    params = dict(body[:-1].split(b"\0", 1) for k, body in messages if k == b"S")
    for name in (b"server_version", b"client_encoding", b"DateStyle", b"integer_datetimes",
                 b"standard_conforming_strings", b"TimeZone"):
        assert name in params
    assert params[b"client_encoding"] == b"UTF8"
    assert params[b"session_authorization"] == b"plain"
    assert messages[-1][1] == b"I"
    sock.close()


def test_startup_reply_reports_every_parameter_once_in_order_with_each_sessions_own_values(proxy: RunningProxy):
    replies = []
    for application in ("first", "second", "first"):
        sock = socket.create_connection((proxy.host, proxy.port), timeout=10)
        sock.sendall(_startup_packet(user="plain", database="dpproxy_test", application_name=application))
        assert _read_messages(sock, b"R")[0][0] == b"R"
        sock.sendall(b"p" + struct.pack("!i", 4 + 6) + b"plain\0")
        replies.append(_read_messages(sock, b"Z"))
        sock.close()
    for messages, application in zip(replies, ("first", "second", "first")):
        statuses = [body[:-1].split(b"\0", 1) for kind, body in messages if kind == b"S"]
        assert [kind for kind, _ in messages] == [b"R"] + [b"S"] * len(statuses) + [b"K", b"Z"]
        names = [name.decode() for name, _ in statuses]
        assert names == [name for name in REPORTED_PARAMETERS if name in names]  # each once, in order
        assert set(names) >= {"application_name", "client_encoding", "is_superuser", "session_authorization",
                              "server_version", "TimeZone"}
        values = dict(statuses)
        assert (values[b"application_name"], values[b"session_authorization"], values[b"is_superuser"]) == (
            application.encode(), b"plain", b"off")
    assert [m for m in replies[0] if m[0] == b"S"] == [m for m in replies[2] if m[0] == b"S"]


def test_parameter_statuses_are_the_messages_one_by_one_in_order():
    values = {"application_name": "a", "client_encoding": "UTF8", "session_authorization": "bob"}
    block = protocol.parameter_statuses(values)
    assert block == b"".join(protocol.parameter_status(name, value) for name, value in values.items())
    assert protocol.parameter_statuses({**values, "session_authorization": "eve"}) != block
    assert protocol.parameter_statuses(dict(reversed(values.items()))) != block
    assert protocol.parameter_statuses({}) == b""


@pytest.mark.parametrize("payload, text", [(b"SELECT 1\0", "SELECT 1"), (b"\0", ""), (b"", None), (b"SELECT 1", None),
                                           (b"SELECT\0 1\0", None), (b"\0\0", None)])
def test_a_query_or_password_is_exactly_one_string_ended_by_its_only_nul(payload: bytes, text: str | None):
    if text is None:
        with pytest.raises(protocol.ProtocolError, match="malformed Query message"):
            protocol.decode_cstring(payload, "Query")
    else:
        assert protocol.decode_cstring(payload, "Query") == text


def test_several_statements_in_one_query_and_transaction_status(proxy: RunningProxy):
    sock, _ = _login(proxy)
    replies = _query(sock, "BEGIN; SELECT 1 AS one; SELECT COUNT(*) FROM adult")
    kinds = [k for k, _ in replies]
    assert kinds.count(b"C") == 3 and kinds.count(b"T") == 2 and b"N" in kinds
    assert replies[-1] == (b"Z", b"T")
    assert _query(sock, "COMMIT")[-1] == (b"Z", b"I")
    sock.close()


def test_error_stops_the_rest_of_a_multi_statement_query(proxy: RunningProxy):
    sock, _ = _login(proxy)
    replies = _query(sock, "SELECT 1; SELECT * FROM adult; SELECT 2")
    kinds = [k for k, _ in replies]
    assert kinds == [b"T", b"D", b"C", b"E", b"Z"]
    fields = dict((f[:1], f[1:]) for f in replies[3][1].split(b"\0") if f)
    assert fields[b"C"] == b"DP001" and b"H" in fields and fields[b"S"] == b"ERROR"
    sock.close()


def test_empty_query_gets_empty_query_response(proxy: RunningProxy):
    sock, _ = _login(proxy)
    assert [k for k, _ in _query(sock, "  ")] == [b"I", b"Z"]
    sock.close()


def test_wrong_password_and_unknown_user_get_the_same_error(proxy: RunningProxy):
    for user, password in (("analyst", "wrong"), ("nobody", "analyst")):
        with pytest.raises(psycopg.OperationalError) as info:
            psycopg.connect(proxy.dsn(user=user, password=password))
        assert "password authentication failed" in str(info.value)


def test_unknown_database_is_refused(proxy: RunningProxy):
    with pytest.raises(psycopg.OperationalError, match="does not exist"):
        psycopg.connect(proxy.dsn(database="elsewhere"))


def test_malformed_startup_closes_only_that_connection(proxy: RunningProxy):
    bad = socket.create_connection((proxy.host, proxy.port), timeout=10)
    bad.sendall(struct.pack("!ii", 99999999, 196608) + b"junk")
    data = bad.recv(1024)
    assert data[:1] == b"E" and b"08P01" in data
    assert bad.recv(1024) == b""  # closed
    with proxy.connect() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_oversized_message_closes_the_connection_with_an_error(proxy: RunningProxy):
    sock, _ = _login(proxy)
    sock.sendall(b"Q" + struct.pack("!i", 2**30))
    data = sock.recv(1024)
    assert data[:1] == b"E" and b"54000" in data


def test_terminate_closes_the_connection(proxy: RunningProxy):
    sock, _ = _login(proxy)
    sock.sendall(b"X" + struct.pack("!i", 4))
    assert sock.recv(1024) == b""


def test_client_vanishing_mid_query_does_not_disturb_others(proxy: RunningProxy):
    for _ in range(5):
        sock, _ = _login(proxy)
        payload = b"SELECT COUNT(*), SUM(age) FROM adult WHERE age > 20\0"
        sock.sendall(b"Q" + struct.pack("!i", len(payload) + 4) + payload)
        sock.close()
    with proxy.connect() as conn:
        assert conn.execute("SELECT COUNT(*) FROM adult").fetchone()[0] > 40000


def test_many_concurrent_clients_on_one_loop(proxy: RunningProxy):
    async def client(i: int) -> int:
        async with await psycopg.AsyncConnection.connect(proxy.dsn(), autocommit=True) as conn:
            total = 0
            for _ in range(5):
                cur = await conn.execute("SELECT COUNT(*) FROM adult WHERE age > 30")
                total += (await cur.fetchone())[0]
            return total

    async def main() -> list[int]:
        return await asyncio.gather(*(client(i) for i in range(40)))

    results = asyncio.run(main())
    assert len(results) == 40 and all(r > 0 for r in results)
    assert proxy.server.session_count == 0 or proxy.server.session_count < 40


def test_out_of_order_message_closes_only_that_connection(proxy: RunningProxy):
    sock, _ = _login(proxy)
    sock.sendall(b"p" + struct.pack("!i", 4 + 6) + b"again\0")  # a password message mid-session
    data = sock.recv(1024)
    assert data[:1] == b"E" and b"08P01" in data
    assert sock.recv(1024) == b""
    with proxy.connect() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_backend_failure_during_a_dp_query_reveals_no_detail(proxy: RunningProxy, monkeypatch: pytest.MonkeyPatch):
    # The backend fails this DP query while computing it; its message is withheld. (A literal
    # the column cannot read, age = 'abc', now fails before the charge, as PostgreSQL's own
    # 22P02: tests/test_attack_budget.py.)
    async def failing(*_: object) -> None:
        raise BackendError("22003", 'value "abc" is out of range')

    monkeypatch.setattr(BackendSession, "first_row", failing)
    sock, _ = _login(proxy)
    replies = _query(sock, "SELECT COUNT(*) FROM adult WHERE age = 41")
    (error,) = [body for kind, body in replies if kind == b"E"]
    fields = dict((f[:1], f[1:]) for f in error.split(b"\0") if f)
    assert fields[b"C"] == b"DP004"
    assert b"abc" not in error and b"H" in fields
    assert replies[-1] == (b"Z", b"I")
    sock.close()


def test_an_unreachable_backend_is_a_connection_error_not_an_internal_one(test_db, tmp_path):
    from conftest import TEST_POLICY, make_policy

    policy = make_policy(test_db, tmp_path / "l.sqlite3")
    running = RunningProxy(policy)
    try:
        # Point new sessions at a backend that is not there (the registry is already built).
        broken = TEST_POLICY.replace('dsn: "{dsn}"', 'dsn: "host=127.0.0.1 port=1 dbname=x user=y connect_timeout=2"')
        running.server.policy = make_policy(test_db, tmp_path / "l.sqlite3", broken)
        with pytest.raises(psycopg.OperationalError) as info:
            psycopg.connect(running.dsn(), connect_timeout=10)
        told = str(info.value).split("FATAL:", 1)[1]  # after libpq's prefix naming dpproxy's own address
        assert "could not connect to the backend database" in told and "internal error" not in told
        assert "port" not in told and "127.0.0.1" not in told  # the backend's address stays in dpproxy's log
    finally:
        running.server.policy = policy
        running.stop()


@pytest.mark.parametrize("sql, named", [
    ("SELECT COUNT(*) FROM adult WHERE age > $1", "$1"),  # a DP statement: refused before its charge
    ("SELECT $2::int + $1::int", "$2"),  # passthrough: the first written, as PostgreSQL names it
    ("COPY (SELECT COUNT(*) FROM adult WHERE age < $1) TO STDOUT", "$1"),
])
def test_a_parameter_in_a_simple_query_is_postgresql_s_undefined_parameter(proxy: RunningProxy, sql: str, named: str):
    # Sent as it was, the backend's Bind failed it with "bind message supplies 0 parameters, but
    # prepared statement "" requires 1" (08P01): a protocol violation a psql user never made.
    with proxy.connect() as conn:
        spent = spent_epsilon(conn)
        with pytest.raises(psycopg.errors.UndefinedParameter) as refused:
            conn.execute(sql)
        assert refused.value.diag.message_primary == f"there is no parameter {named}"
        assert "literal" in (refused.value.diag.message_hint or "")
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on
        assert spent_epsilon(conn) == spent
    env = {**os.environ, "PGPASSWORD": "analyst", "PGCONNECT_TIMEOUT": "10"}
    result = subprocess.run([psql_path(), "-X", "-v", "VERBOSITY=verbose", "-h", proxy.host, "-p", str(proxy.port),
                             "-U", "analyst", "-d", TEST_DATABASE, "-c", sql], capture_output=True, text=True, env=env,
                            timeout=60)
    assert f"ERROR:  42P02: there is no parameter {named}" in result.stderr, result.stderr


def test_prepare_in_a_simple_query_keeps_its_own_refusal(proxy: RunningProxy):
    with proxy.connect() as conn, pytest.raises(psycopg.errors.FeatureNotSupported):
        conn.execute("PREPARE p AS SELECT COUNT(*) FROM adult WHERE age > $1")
