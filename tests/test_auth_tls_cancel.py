"""Authentication methods, TLS on the client side, and CancelRequest through dpproxy."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from pathlib import Path
from typing import Iterator

import asyncpg
import psycopg
import pytest

from conftest import TEST_POLICY, RunningProxy, TestDatabase, make_policy, psql_path
from tls_proxy import self_signed_certificate, tls_proxy
from wire import Wire, assert_cancel_stops_a_slow_query, message, startup

AUTH_USERS = (
    "users:\n"
    "  hashed:\n    password: md5-secret\n    auth: md5\n    budget: {{epsilon: 100}}\n"
    "  stored:\n    scram_verifier: \"{verifier}\"\n    budget: {{epsilon: 100}}\n"
)


@pytest.fixture(scope="module")
def verifier(test_db: TestDatabase) -> str:
    """A SCRAM verifier made by PostgreSQL itself, as an operator would copy it from pg_authid."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("SET password_encryption = 'scram-sha-256'")
        conn.execute("DROP ROLE IF EXISTS verifier_source")
        conn.execute("CREATE ROLE verifier_source PASSWORD 'from-postgres'")
        (value,) = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'verifier_source'").fetchone()
        conn.execute("DROP ROLE verifier_source")
    return value


@pytest.fixture(scope="module")
def auth_proxy(test_db: TestDatabase, verifier: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    text = TEST_POLICY.replace("users:\n", AUTH_USERS.replace("{verifier}", verifier), 1)
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("auth") / "l.sqlite3", text))
    yield proxy
    proxy.stop()


def _psql(proxy: RunningProxy, user: str, password: str, sslmode: str = "prefer") -> subprocess.CompletedProcess[str]:
    conninfo = f"host={proxy.host} port={proxy.port} dbname=dpproxy_test user={user} sslmode={sslmode}"
    return subprocess.run([psql_path(), "-X", "-At", conninfo, "-c", "SELECT COUNT(*) FROM adult"],
                          capture_output=True, text=True, env={**os.environ, "PGPASSWORD": password}, timeout=30)


def test_scram_sha_256_is_offered_by_default(auth_proxy: RunningProxy):
    import socket
    import struct

    sock = socket.create_connection((auth_proxy.host, auth_proxy.port), timeout=10)
    sock.sendall(startup(user="analyst", database="dpproxy_test"))
    reply = sock.recv(1024)
    assert reply[:1] == b"R" and struct.unpack("!i", reply[5:9])[0] == 10  # AuthenticationSASL
    assert b"SCRAM-SHA-256\0" in reply
    sock.close()


def test_scram_md5_and_stored_verifier_logins_work_with_psql(auth_proxy: RunningProxy):
    for user, password in (("analyst", "analyst"), ("hashed", "md5-secret"), ("stored", "from-postgres")):
        result = _psql(auth_proxy, user, password)
        assert result.returncode == 0, (user, result.stderr)
        assert int(result.stdout) > 40000


def test_scram_keys_are_derived_when_the_policy_loads_not_at_each_login(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # libpq derives the client's side in C; every PBKDF2 in Python here is dpproxy's own.
    derived: list[str] = []
    pbkdf2 = hashlib.pbkdf2_hmac
    monkeypatch.setattr(hashlib, "pbkdf2_hmac", lambda *args, **kw: derived.append(args[0]) or pbkdf2(*args, **kw))
    text = TEST_POLICY.replace("password: analyst ", "password: fresh-for-this-test ")
    proxy = RunningProxy(make_policy(test_db, tmp_path / "l.sqlite3", text))
    try:
        at_load = len(derived)
        for _ in range(3):
            psycopg.connect(host=proxy.host, port=proxy.port, dbname="dpproxy_test", user="analyst",
                            password="fresh-for-this-test").close()
    finally:
        proxy.stop()
    assert at_load == 1  # analyst; plain is a cleartext user
    assert len(derived) == at_load


def test_md5_works_with_asyncpg(auth_proxy: RunningProxy):
    import asyncio

    async def main() -> int:
        conn = await asyncpg.connect(host=auth_proxy.host, port=auth_proxy.port, user="hashed",
                                     password="md5-secret", database="dpproxy_test")
        try:
            return await conn.fetchval("SELECT COUNT(*) FROM adult WHERE age > $1", 30)
        finally:
            await conn.close()

    assert asyncio.run(main()) > 10000


@pytest.mark.parametrize("user", ["analyst", "hashed", "stored", "nobody"])
def test_wrong_password_fails_the_same_way_for_every_method_and_unknown_users(auth_proxy: RunningProxy, user: str):
    result = _psql(auth_proxy, user, "wrong")
    assert result.returncode != 0
    assert f'password authentication failed for user "{user}"' in result.stderr
    # A newcomer often tries a PostgreSQL role: the hint says where logins come from, in the same
    # words for every user, known or not, so it tells nothing about which users exist.
    assert ("\nHINT:  Logins are the users of dpproxy's policy, not the backend's PostgreSQL roles: "
            "check the user name and password with the policy's owner." in result.stderr)


def test_cleartext_is_used_only_for_users_that_ask_for_it(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)  # the test policy's "plain" user has auth: cleartext
    assert wire.startup[-1][0] == b"Z"
    wire.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_certificate(tmp_path_factory.mktemp("tls"))


def _tls_proxy(test_db: TestDatabase, certificate: tuple[Path, Path], tmp_path: Path, required: bool) -> RunningProxy:
    return tls_proxy(test_db, certificate, tmp_path / "l.sqlite3", required)


def test_tls_is_negotiated_when_the_policy_has_a_certificate(test_db, certificate, tmp_path):
    proxy = _tls_proxy(test_db, certificate, tmp_path, required=False)
    try:
        with psycopg.connect(proxy.dsn() + " sslmode=require", autocommit=True, prepare_threshold=None) as conn:
            assert conn.pgconn.ssl_in_use
            assert conn.execute("SELECT COUNT(*) FROM adult").fetchone()[0] > 40000
        assert _psql(proxy, "analyst", "analyst", sslmode="require").returncode == 0
        with psycopg.connect(proxy.dsn() + " sslmode=disable", autocommit=True) as conn:
            assert not conn.pgconn.ssl_in_use  # allowed unless tls.required
    finally:
        proxy.stop()


def test_tls_required_refuses_plaintext_clients(test_db, certificate, tmp_path):
    proxy = _tls_proxy(test_db, certificate, tmp_path, required=True)
    try:
        with pytest.raises(psycopg.OperationalError, match="requires TLS"):
            psycopg.connect(proxy.dsn() + " sslmode=disable")
        with psycopg.connect(proxy.dsn() + " sslmode=require", autocommit=True) as conn:
            assert conn.pgconn.ssl_in_use
    finally:
        proxy.stop()


def test_without_tls_ssl_is_refused_with_n(proxy: RunningProxy):
    result = _psql(proxy, "analyst", "analyst", sslmode="require")
    assert result.returncode != 0 and "does not support SSL" in result.stderr


def test_cancel_request_cancels_the_backend_query(proxy: RunningProxy):
    with proxy.connect() as conn:
        assert_cancel_stops_a_slow_query(conn, after_s=0.5)


def test_cancel_with_a_wrong_secret_does_nothing(proxy: RunningProxy):
    import socket
    import struct

    wire = Wire(proxy.host, proxy.port)
    (key,) = [body for kind, body in wire.startup if kind == b"K"]
    pid, secret = struct.unpack("!ii", key)
    wire.send(message(b"Q", b"SELECT count(*) FROM pg_attribute a, pg_attribute b, pg_attribute b2 LIMIT 1\0"))
    bogus = socket.create_connection((proxy.host, proxy.port), timeout=5)
    bogus.sendall(struct.pack("!iiii", 16, 80877102, pid, secret ^ 1))
    bogus.close()
    time.sleep(0.5)
    wire.sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        wire.sock.recv(1)  # the query is still running: the wrong secret cancelled nothing
    wire.sock.setblocking(True)
    real = socket.create_connection((proxy.host, proxy.port), timeout=5)
    real.sendall(struct.pack("!iiii", 16, 80877102, pid, secret))
    real.close()
    replies = wire.read_until(b"Z")
    assert b"57014" in b"".join(body for kind, body in replies if kind == b"E")
    wire.close()
