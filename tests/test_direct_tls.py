"""Direct TLS (libpq 17's ``sslnegotiation=direct``; pgJDBC 42.7.4+'s ``sslNegotiation=direct`` is the same handshake): the
client's first bytes are its TLS ClientHello, with ALPN ``postgresql``, and no SSLRequest.

dpproxy takes it when TLS is configured and the client offers that ALPN, as PostgreSQL 17 does,
and closes it otherwise with a log line and nothing sent. psycopg's libpq (18, from its wheel) and
libpq 17 from the PostgreSQL 17 package of tests/pg_versions.py (under the system's psql) are the
clients.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import struct
import subprocess
import time
from typing import Iterator

import psycopg
import pytest

from conftest import RunningProxy, TestDatabase, psql_path, spent_epsilon
from pg_versions import postgresql_binaries
from tls_proxy import self_signed_certificate, tls_proxy
from wire import SLOW_CATALOG_QUERY, Wire, assert_cancel_stops_a_slow_query, message, startup

DIRECT = " sslmode=require sslnegotiation=direct connect_timeout=10"
DP_COUNT = "SELECT COUNT(*) FROM adult WHERE age > 40"


@pytest.fixture(scope="module")
def required_tls_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A dpproxy that requires TLS: a session there proves its connection encrypted."""
    folder = tmp_path_factory.mktemp("direct-tls")
    proxy = tls_proxy(test_db, self_signed_certificate(folder), folder / "l.sqlite3", required=True)
    yield proxy
    proxy.stop()


def _client_context(alpn: list[str] | None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if alpn is not None:
        context.set_alpn_protocols(alpn)
    return context


def _direct(proxy: RunningProxy, alpn: list[str] | None) -> ssl.SSLSocket:
    """A socket that began with a TLS handshake offering ``alpn`` (raises if the handshake fails)."""
    sock = socket.create_connection((proxy.host, proxy.port), timeout=10)
    return _client_context(alpn).wrap_socket(sock, server_hostname="localhost")


def _ready_for_a_handshake(proxy: RunningProxy, negotiation: str) -> socket.socket:
    """A socket to ``proxy`` where the client's TLS handshake comes next: at once (``direct``),
    or after an SSLRequest answered ``S`` (``ssl-request``)."""
    sock = socket.create_connection((proxy.host, proxy.port), timeout=10)
    if negotiation == "ssl-request":
        sock.sendall(struct.pack("!ii", 8, 80877103))
        assert sock.recv(1) == b"S"
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection (a TLS error counts as closed)."""
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except (ssl.SSLError, ConnectionError):
        pass
    return received


def test_direct_tls_and_the_default_negotiation_both_reach_a_session(required_tls_proxy: RunningProxy):
    for negotiation in ("direct", "postgres"):
        dsn = required_tls_proxy.dsn() + f" sslmode=require sslnegotiation={negotiation} connect_timeout=10"
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.pgconn.ssl_in_use, negotiation
            assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_dp_count_over_direct_tls_is_answered_and_charged_once(required_tls_proxy: RunningProxy):
    with psycopg.connect(required_tls_proxy.dsn() + DIRECT, autocommit=True, prepare_threshold=None) as conn:
        before = spent_epsilon(conn)
        (count,) = conn.execute(DP_COUNT).fetchone()  # type: ignore[misc]
        assert count > 1000
        assert spent_epsilon(conn) == pytest.approx(before + 1.0)


def test_a_direct_handshake_agrees_on_alpn_postgresql_and_the_startup_follows_inside(required_tls_proxy: RunningProxy):
    sock = _direct(required_tls_proxy, ["postgresql"])
    assert sock.selected_alpn_protocol() == "postgresql"
    sock.sendall(startup(user="analyst", database="dpproxy_test"))
    reply = sock.recv(1024)
    assert reply[:1] == b"R" and struct.unpack("!i", reply[5:9])[0] == 10  # AuthenticationSASL, as after an SSLRequest
    sock.close()


def test_alpn_postgresql_is_chosen_after_an_ssl_request_too(required_tls_proxy: RunningProxy):
    # libpq 17 offers it there as well, and checks the server's choice when there is one.
    sock = socket.create_connection((required_tls_proxy.host, required_tls_proxy.port), timeout=10)
    sock.sendall(struct.pack("!ii", 8, 80877103))
    assert sock.recv(1) == b"S"
    tls = _client_context(["postgresql"]).wrap_socket(sock, server_hostname="localhost")
    assert tls.selected_alpn_protocol() == "postgresql"
    tls.close()


def test_a_direct_handshake_without_alpn_is_closed_before_any_startup(
    required_tls_proxy: RunningProxy, caplog: pytest.LogCaptureFixture
):
    # PostgreSQL 17 refuses direct TLS without ALPN "postgresql": a client of another protocol
    # (an HTTPS client sent to this port) must not get as far as a startup packet.
    caplog.set_level(logging.WARNING, "dpproxy.session")
    sock = _direct(required_tls_proxy, None)
    assert sock.selected_alpn_protocol() is None
    try:
        sock.sendall(startup(user="analyst", database="dpproxy_test"))
    except (ssl.SSLError, ConnectionError):
        pass  # closed already
    assert _read_all(sock) == b""
    sock.close()
    assert any("offered no ALPN protocol" in r.getMessage() for r in caplog.records)
    with psycopg.connect(required_tls_proxy.dsn() + DIRECT, autocommit=True) as conn:  # the server goes on
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("negotiation", ["direct", "ssl-request"])
def test_a_failed_handshake_is_one_log_line_not_an_internal_error(
    required_tls_proxy: RunningProxy, negotiation: str, caplog: pytest.LogCaptureFixture
):
    # A client that does not trust the certificate aborts the handshake with an alert: an
    # operator's log gets one line saying so, as PostgreSQL's does, not a session's traceback.
    caplog.set_level(logging.WARNING, "dpproxy")
    sock = _ready_for_a_handshake(required_tls_proxy, negotiation)
    context = ssl.create_default_context()  # verifies: the suite's self-signed certificate is unknown
    context.set_alpn_protocols(["postgresql"])
    with pytest.raises(ssl.SSLCertVerificationError):
        context.wrap_socket(sock, server_hostname="localhost")
    sock.close()
    deadline = time.monotonic() + 10
    while not any("the handshake failed" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert any("the handshake failed" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert not [r.getMessage() for r in caplog.records if r.exc_info], "a traceback was logged"
    with psycopg.connect(required_tls_proxy.dsn() + DIRECT, autocommit=True) as conn:  # the server goes on
        assert conn.execute("SELECT 1").fetchone() == (1,)


@pytest.mark.parametrize("negotiation", ["direct", "ssl-request"])
def test_a_handshake_offering_alpn_without_postgresql_gets_no_application_protocol(
    required_tls_proxy: RunningProxy, negotiation: str, caplog: pytest.LogCaptureFixture
):
    # As PostgreSQL 17 answers it, after an SSLRequest too.
    caplog.set_level(logging.WARNING, "dpproxy.session")
    sock = _ready_for_a_handshake(required_tls_proxy, negotiation)
    with pytest.raises(ssl.SSLError, match="alert no application protocol"):
        _client_context(["http/1.1", "h2"]).wrap_socket(sock, server_hostname="localhost")
    sock.close()
    assert any('offered ALPN protocols without "postgresql"' in r.getMessage() for r in caplog.records)


def test_a_client_offering_no_alpn_after_an_ssl_request_is_served(required_tls_proxy: RunningProxy):
    # Clients before libpq 17 offer none: after an SSLRequest that is fine, as on PostgreSQL 17.
    sock = socket.create_connection((required_tls_proxy.host, required_tls_proxy.port), timeout=10)
    sock.sendall(struct.pack("!ii", 8, 80877103))
    assert sock.recv(1) == b"S"
    tls = _client_context(None).wrap_socket(sock, server_hostname="localhost")
    assert tls.selected_alpn_protocol() is None
    tls.sendall(startup(user="analyst", database="dpproxy_test"))
    assert tls.recv(1) == b"R"
    tls.close()


def test_a_direct_handshake_is_closed_without_a_word_when_tls_is_not_configured(
    proxy: RunningProxy, caplog: pytest.LogCaptureFixture
):
    # PostgreSQL without ssl=on closes such a connection and sends nothing: the client speaks
    # TLS and could read no ErrorResponse.
    caplog.set_level(logging.WARNING, "dpproxy.session")
    sock = socket.create_connection((proxy.host, proxy.port), timeout=10)
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _client_context(["postgresql"]).wrap_socket(sock, server_hostname="localhost")
    sock.close()
    raw = socket.create_connection((proxy.host, proxy.port), timeout=10)
    raw.sendall(b"\x16\x03\x01\x00\x05hello")  # the start of a TLS record: nothing comes back
    assert _read_all(raw) == b""
    raw.close()
    assert any("TLS is not configured (listen.tls)" in r.getMessage() for r in caplog.records)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(proxy.dsn() + DIRECT)
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_cancel_request_over_direct_tls_cancels_the_query(required_tls_proxy: RunningProxy):
    # libpq 17's cancel connection negotiates as its session did: here, direct TLS.
    with psycopg.connect(required_tls_proxy.dsn() + DIRECT, autocommit=True) as conn:
        assert_cancel_stops_a_slow_query(conn, after_s=0.5)


def test_a_client_hello_arriving_in_pieces_is_read_whole(required_tls_proxy: RunningProxy):
    # The session reads the first byte, then what has arrived; the rest of a ClientHello sent
    # in pieces must reach the handshake from the socket, after those bytes and in order.
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = _client_context(["postgresql"]).wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    sock = socket.create_connection((required_tls_proxy.host, required_tls_proxy.port), timeout=10)
    for piece in (hello[:1], hello[1:7], hello[7:]):
        sock.sendall(piece)
        time.sleep(0.1)  # a chance to arrive apart; either way the handshake must succeed
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            data = sock.recv(65536)
            assert data, "the server closed the connection during the handshake"
            incoming.write(data)
    assert tls.selected_alpn_protocol() == "postgresql"
    tls.write(startup(user="analyst", database="dpproxy_test"))
    sock.sendall(outgoing.read())
    reply = b""
    while not reply:
        try:
            reply = tls.read(1024)
        except ssl.SSLWantReadError:
            incoming.write(sock.recv(65536))
    assert reply[:1] == b"R"
    sock.close()


@pytest.mark.parametrize("cancel_over", ["direct-tls", "plaintext"])
def test_a_cancel_request_sent_over_direct_tls_or_in_clear_cancels_the_query(
        required_tls_proxy: RunningProxy, admin: psycopg.Connection, cancel_over: str):
    # In clear too, with tls.required, as PostgreSQL takes it whatever pg_hba.conf says: the
    # request opens no session and carries only the process id and the secret key, which the
    # session's client chose to send so (docs/deployment.md).
    wire = Wire(required_tls_proxy.host, required_tls_proxy.port, direct_tls=_client_context(["postgresql"]))
    (key,) = [body for kind, body in wire.startup if kind == b"K"]
    wire.send(message(b"Q", SLOW_CATALOG_QUERY.encode() + b"\0"))
    running = ("SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active' "
               "AND query LIKE '%pg_attribute AS a%'")
    for _ in range(600):  # cancelled once it runs (a cancel before would find nothing to cancel)
        if admin.execute(running).fetchone() != (0,):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the statement never showed as running: {admin.execute('SELECT query FROM pg_stat_activity').fetchall()}")
    if cancel_over == "direct-tls":
        cancel = _direct(required_tls_proxy, ["postgresql"])
    else:
        cancel = socket.create_connection((required_tls_proxy.host, required_tls_proxy.port), timeout=10)
    cancel.sendall(struct.pack("!ii", 16, 80877102) + key)
    assert _read_all(cancel) == b""  # closed once read, as PostgreSQL closes it
    cancel.close()
    errors = [body for kind, body in wire.read_until(b"Z") if kind == b"E"]
    assert len(errors) == 1 and b"C57014\0" in errors[0]
    wire.close()


@pytest.mark.pg_versions
def test_libpq_17_psql_connects_directly_and_by_ssl_request(required_tls_proxy: RunningProxy):
    # The system's psql (15) on PostgreSQL 17's libpq, from the package tests/pg_versions.py pins:
    # the connection string, negotiation included, is libpq's.
    libpq_17 = postgresql_binaries(17).parent / "lib"
    env = {**os.environ, "PGPASSWORD": "analyst", "LD_LIBRARY_PATH": str(libpq_17)}
    for negotiation in ("direct", "postgres"):
        conninfo = (f"host={required_tls_proxy.host} port={required_tls_proxy.port} dbname=dpproxy_test "
                    f"user=analyst sslmode=require sslnegotiation={negotiation}")
        result = subprocess.run([psql_path(), "-X", "-At", conninfo, "-c", DP_COUNT],
                                capture_output=True, text=True, env=env, timeout=60)
        assert result.returncode == 0, (negotiation, result.stderr)
        assert int(result.stdout.split()[-1]) > 1000, result.stdout
