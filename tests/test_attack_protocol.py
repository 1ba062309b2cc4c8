"""Attacks on the protocol state machine and the session lifecycle, with raw protocol bytes.

Each test pins one invariant: no XX000 from any byte sequence, no charge for a statement
PostgreSQL would never run, no byte sent before a TLS handshake read as if it came through
TLS, and no client able to take memory or pooled backend connections from the others by
not reading what it asked for.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import TEST_POLICY, RunningProxy, TestDatabase, make_policy, running_proxy, spent_epsilon
from wire import SYNC, Wire, bind, cstr, error_fields, execute, message, parse, startup


def _query(sql: str) -> bytes:
    return message(b"Q", cstr(sql))


def _read_all(sock: socket.socket, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (socket.timeout, ConnectionError, ssl.SSLError):
        pass
    return data


def _codes(replies: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [error_fields(body)[b"C"] for kind, body in replies if kind == b"E"]


def _plain(proxy: RunningProxy):  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(proxy.dsn(user="plain", password="plain"), autocommit=True, prepare_threshold=None)


def test_scram_client_first_that_is_not_utf8_is_a_protocol_violation_not_an_internal_error(proxy: RunningProxy):
    # The client-first message was decoded outside the exchange's error handling: a byte
    # that is not UTF-8 ended the session with XX000 "internal error in dpproxy".
    sock = socket.create_connection((proxy.host, proxy.port), timeout=5)
    sock.sendall(startup(user="analyst", database="dpproxy_test"))
    assert sock.recv(64)[:1] == b"R"  # AuthenticationSASL
    first = b"n,,n=,r=\xff\xfe"
    sock.sendall(message(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first))
    reply = _read_all(sock)
    sock.close()
    assert b"C08P01\0" in reply and b"XX000" not in reply


def test_a_query_pipelined_behind_the_password_is_answered_after_the_login(proxy: RunningProxy):
    # The password exchange and the session read the socket through one buffered reader: what
    # came in the password's packet must reach the session, not be dropped with the exchange.
    sock = socket.create_connection((proxy.host, proxy.port), timeout=5)
    sock.sendall(startup(user="plain", database="dpproxy_test"))
    assert sock.recv(64)[:1] == b"R"  # AuthenticationCleartextPassword
    sock.sendall(message(b"p", cstr("plain")) + _query("SELECT 41 + 1 AS answer") + message(b"X"))
    reply = _read_all(sock)
    sock.close()
    kinds, pos = [], 0
    while pos < len(reply):
        kinds.append(reply[pos:pos + 1])
        pos += 1 + struct.unpack("!i", reply[pos + 1:pos + 5])[0]
    assert kinds[0] == b"R" and kinds[-5:] == [b"Z", b"T", b"D", b"C", b"Z"], kinds
    assert b"\x00\x00\x00\x0242" in reply  # the DataRow's one value


def test_a_password_message_over_64_kib_is_refused_though_statements_may_be_longer(proxy: RunningProxy):
    assert proxy.policy.listen.max_message_bytes > 65536
    sock = socket.create_connection((proxy.host, proxy.port), timeout=5)
    sock.sendall(startup(user="plain", database="dpproxy_test"))
    assert sock.recv(64)[:1] == b"R"
    sock.sendall(message(b"p", b"x" * 65536 + b"\0"))
    reply = _read_all(sock)
    sock.close()
    assert b"C54000\0" in reply and b"SFATAL\0" in reply


@pytest.mark.clients  # openssl makes the certificate
def test_plaintext_sent_after_sslrequest_is_never_read_as_if_it_came_through_tls(
    test_db: TestDatabase, tmp_path: Path
):
    # A man in the middle appends a StartupMessage to the client's SSLRequest. Read from the
    # stream's buffer after the handshake, it passed tls.required and got a password request
    # over TLS before the client had sent anything through it (CVE-2021-23214 in PostgreSQL).
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    tls = f'listen: {{{{host: 127.0.0.1, port: 0, tls: {{{{cert: "{cert}", key: "{key}", required: true}}}}}}}}'
    proxy = RunningProxy(make_policy(test_db, tmp_path / "l.sqlite3",
                                     TEST_POLICY.replace("listen: {{host: 127.0.0.1, port: 0}}", tls)))
    try:
        sock = socket.create_connection((proxy.host, proxy.port), timeout=5)
        sock.sendall(struct.pack("!ii", 8, 80877103) + startup(user="plain", database="dpproxy_test"))
        answer = sock.recv(1)
        if answer == b"S":  # the check may also come after 'S': then the handshake must find nothing
            context = ssl.create_default_context()
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            try:
                sock = context.wrap_socket(sock)
                reply = _read_all(sock, 3)
            except (ssl.SSLError, ConnectionError):
                reply = b""
        else:
            reply = answer + _read_all(sock)
            assert b"C08P01\0" in reply
        sock.close()
        assert b"R\0\0\0\x08\0\0\0\x03" not in reply  # no AuthenticationCleartextPassword
        # A client that waits for 'S' is served.
        plain = socket.create_connection((proxy.host, proxy.port), timeout=5)
        plain.sendall(struct.pack("!ii", 8, 80877103))
        assert plain.recv(1) == b"S"
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        secure = context.wrap_socket(plain)
        secure.sendall(startup(user="plain", database="dpproxy_test"))
        assert secure.recv(64)[:1] == b"R"
        secure.close()
    finally:
        proxy.stop()


def test_a_dp_query_in_an_aborted_transaction_is_refused_with_25p02_before_any_charge(proxy: RunningProxy):
    # The relation was resolved before the error, so the DP query went as far as the charge:
    # each one cost ε and came back DP004 for a 25P02 that depends on nothing but the session.
    wire = Wire(proxy.host, proxy.port)
    with _plain(proxy) as conn:
        wire.send(_query("BEGIN"), _query("SELECT COUNT(*) FROM adult"), _query("SELECT 1/0"))
        for _ in range(3):
            wire.read_until(b"Z")
        before = spent_epsilon(conn)
        wire.send(_query("SELECT COUNT(*) FROM adult WHERE age > 30"))
        simple = wire.read_until(b"Z")
        wire.send(parse("", "SELECT COUNT(*) FROM adult WHERE age > $1"), bind("", "", (b"40",)), execute(""), SYNC)
        extended = wire.read_until(b"Z")
        time.sleep(0.1)
        assert spent_epsilon(conn) == before
    assert _codes(simple) == [b"25P02"] and simple[-1] == (b"Z", b"E")
    assert _codes(extended) == [b"25P02"] and extended[-1] == (b"Z", b"E")
    wire.send(_query("ROLLBACK"), _query("SELECT COUNT(*) FROM adult"))
    wire.read_until(b"Z")
    assert [k for k, _ in wire.read_until(b"Z")][-3:] == [b"D", b"C", b"Z"]
    wire.close()


def test_results_piled_up_before_sync_are_sent_as_they_grow(proxy: RunningProxy):
    # Bind/Execute pairs of ~30 bytes each, never a Sync: every result was held in the
    # session's output list until a Sync, ~450 kB per pair here, so a client that never
    # sends one grew the process shared by every session without bound. Like PostgreSQL,
    # replies now leave once they pass a buffer's size, and the session waits for the client.
    wire = Wire(proxy.host, proxy.port)
    wire.send(parse("s", "SELECT * FROM pg_attribute"), *(bind("", "s") + execute("") for _ in range(4)))
    wire.sock.settimeout(5)
    received = wire.sock.recv(65536)  # before any Sync or Flush
    assert received[:1] == b"1" and len(received) > 1000
    wire.buffer = received
    wire.sock.settimeout(15)
    wire.send(SYNC)
    assert wire.read_until(b"Z")[-1] == (b"Z", b"I")
    wire.close()


# The one connection can come back only by what the test pins: the rest of a slow client's result
# held (outside a block) or the idle-in-transaction timeout (inside one). The backend's statement
# timeout is set far past the checkout's: at 20 s it cut the holder off first, and the test passed
# with the hold removed. The other session may wait a 90 s checkout, far longer than either takes
# on a loaded machine (2-17 s seen).
_SMALL_POOL = TEST_POLICY.replace(
    "statement_timeout_ms: 20000", "statement_timeout_ms: 600000\n  pool: {{size: 1, checkout_timeout_s: 90}}"
).replace("listen: {{host: 127.0.0.1, port: 0}}",
          "listen: {{host: 127.0.0.1, port: 0, idle_in_transaction_timeout_s: 2}}")


def _rows_arriving(wire: Wire, least: int = 2048) -> None:
    """Wait (reading nothing) until ``least`` bytes of rows wait in ``wire``'s socket: its
    statement runs, on the one pooled connection."""
    deadline = time.monotonic() + 60
    while len(wire.sock.recv(65536, socket.MSG_PEEK)) < least:
        assert time.monotonic() < deadline, "no rows came"
        time.sleep(0.05)


def _who_holds(proxy: RunningProxy, test_db: TestDatabase) -> str:
    """What a failed checkout needs explained: the pool's counts, the backend's sessions and
    the proxy's session tasks, where they wait."""
    import psycopg

    async def stacks() -> list[str]:
        out = []
        for task in asyncio.all_tasks():
            awaits, coro = [], task.get_coro()
            while (frame := getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)) is not None:
                awaits.append(f"{frame.f_code.co_qualname}:{frame.f_lineno}")
                coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)
            out.append(f"{task.get_name()}: " + " -> ".join(awaits))
        return out

    pool = proxy.server.pool
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        activity = conn.execute(
            "SELECT pid, state, wait_event_type, wait_event, left(query, 60) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall()
    try:
        tasks = asyncio.run_coroutine_threadsafe(stacks(), proxy.loop).result(timeout=10)
    except TimeoutError:
        tasks = ["the proxy's event loop did not run a task for 10 s"]
    return "\n".join([f"pool: in_use={pool.in_use} idle={pool.idle}", *map(str, activity), *tasks])


def test_a_client_that_does_not_read_its_answer_keeps_no_pooled_connection_from_the_others(
    test_db: TestDatabase, tmp_path_factory
):
    # The session waited for the client to take its answer before giving the backend
    # connection back, and that wait had no bound: pool.size clients asking for a large
    # result and reading none of it left every other session with 53300, for ever. The other
    # session asks while the one connection is held and waits up to the checkout timeout:
    # answered, the connection came back while its holder still read nothing.
    with running_proxy(test_db, tmp_path_factory, _SMALL_POOL) as proxy:
        other = Wire(proxy.host, proxy.port)
        other.sock.settimeout(120)
        hog = Wire(proxy.host, proxy.port)
        hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        hog.send(_query("SELECT * FROM generate_series(1, 1000000)"))
        _rows_arriving(hog)
        other.send(_query("SELECT 1"))
        codes = _codes(other.read_until(b"Z"))
        assert codes == [], _who_holds(proxy, test_db)
        # Inside a transaction block the connection stays the session's, as on PostgreSQL,
        # and not reading for idle_in_transaction_timeout_s ends the session like idling.
        stuck = Wire(proxy.host, proxy.port)
        stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.send(_query("BEGIN"), _query("SELECT * FROM generate_series(1, 1000000)"))
        _rows_arriving(stuck)
        other.send(_query("SELECT 1"))
        codes = _codes(other.read_until(b"Z"))
        assert codes == [], _who_holds(proxy, test_db)
        for wire in (hog, stuck, other):
            wire.close()


def test_a_dp_portal_is_charged_once_whatever_the_executes_cancels_and_errors_around_it(proxy: RunningProxy):
    """Re-Execute, max_rows, a refusal in the middle of a pipeline (what follows it up to Sync
    is skipped, never run) and a CancelRequest at any point: each answer costs ε once, and
    every charge is an answer or an error of a query the backend was running."""
    wire = Wire(proxy.host, proxy.port)
    pid, secret = struct.unpack("!ii", next(body for kind, body in wire.startup if kind == b"K"))
    dp = "SELECT COUNT(*) FROM adult WHERE age > $1"
    with _plain(proxy) as conn:
        before = spent_epsilon(conn)
        wire.send(parse("s", dp), bind("a", "s", (b"40",)), execute("a", 1), execute("a", 1), execute("a"),
                  bind("b", "s", (b"41",)), execute("b"), parse("", "SELECT * FROM adult"), bind("", ""), execute(""),
                  bind("c", "s", (b"42",)), execute("c"), SYNC)
        replies = wire.read_until(b"Z")
        assert [k for k, _ in replies if k in (b"D", b"s", b"E")] == [b"D", b"s", b"D", b"E"]
        time.sleep(0.1)
        assert spent_epsilon(conn) - before == pytest.approx(2.0)

        def cancel() -> None:
            sock = socket.create_connection((proxy.host, proxy.port), timeout=5)
            sock.sendall(struct.pack("!iiii", 16, 80877102, pid, secret))
            _read_all(sock, 2)
            sock.close()

        answered = failed = 0
        before = spent_epsilon(conn)
        for i in range(16):
            timer = threading.Timer(0.002 * i, cancel)
            timer.start()
            wire.send(bind("", "s", (str(20 + i).encode(),)), execute(""), SYNC)
            replies = wire.read_until(b"Z")
            timer.join()
            codes = _codes(replies)
            assert codes in ([], [b"57014"]) and replies[-1] == (b"Z", b"I")
            answered += not codes
            failed += bool(codes)
        time.sleep(0.1)
        charged = spent_epsilon(conn) - before
        assert answered - 1e-9 <= charged <= answered + failed + 1e-9
    wire.close()


def test_a_setting_given_twice_in_the_startup_packet_is_reported_as_the_backend_applies_it(proxy: RunningProxy):
    # The ParameterStatus cache was keyed by the packet's pairs, sorted: TimeZone=A then
    # timezone=B (the backend applies B) and timezone=B then TimeZone=A (it applies A) shared
    # one key, so the second session was told the first one's TimeZone.
    def session(pairs: list[tuple[str, str]]) -> tuple[bytes, bytes]:
        body = struct.pack("!i", 196608) + b"".join(cstr(k) + cstr(v) for k, v in
                                                    [("user", "plain"), ("database", "dpproxy_test"), *pairs]) + b"\0"
        wire = Wire.__new__(Wire)
        wire.sock, wire.buffer = socket.create_connection((proxy.host, proxy.port), timeout=15), b""
        wire.sock.sendall(struct.pack("!i", len(body) + 4) + body)
        wire.read_until(b"R")
        wire.send(message(b"p", cstr("plain")))
        reported = next(body.split(b"\0")[1] for kind, body in wire.read_until(b"Z")
                        if kind == b"S" and body.startswith(b"TimeZone\0"))
        wire.send(_query("SHOW timezone"))
        (applied,) = [body[6:] for kind, body in wire.read_until(b"Z") if kind == b"D"]
        wire.close()
        return reported, applied

    for pairs in ([("TimeZone", "Asia/Tokyo"), ("timezone", "America/Chicago")],
                  [("timezone", "America/Chicago"), ("TimeZone", "Asia/Tokyo")]):
        reported, applied = session(pairs)
        assert reported == applied == pairs[-1][1].encode()


@pytest.mark.parametrize("given", [(), (b"40", b"41")], ids=["too-few", "too-many"])
def test_a_bind_with_the_wrong_number_of_parameters_is_refused_before_any_charge(proxy: RunningProxy, given):
    # PostgreSQL refuses such a Bind (08P01) before anything runs; dpproxy let it through to
    # the DP answer, which was charged and then failed on the backend: ε spent for an error.
    wire = Wire(proxy.host, proxy.port)
    with _plain(proxy) as conn:
        before = spent_epsilon(conn)
        wire.send(parse("s", "SELECT COUNT(*) FROM adult WHERE age > $1"), bind("", "s", given), execute(""), SYNC)
        replies = wire.read_until(b"Z")
        time.sleep(0.1)
        assert spent_epsilon(conn) == before
    errors = [error_fields(body) for kind, body in replies if kind == b"E"]
    assert [e[b"C"] for e in errors] == [b"08P01"]
    assert errors[0][b"M"] == f'bind message supplies {len(given)} parameters, but prepared statement "s" requires 1'.encode()
    wire.send(bind("", "s", (b"40",)), execute(""), SYNC)  # the session goes on
    assert _codes(wire.read_until(b"Z")) == []
    wire.close()


def test_a_client_asking_for_protocol_3_2_is_told_the_connection_speaks_3_0(proxy: RunningProxy):
    # dpproxy took a StartupMessage for 3.2 (or with _pq_ options) as 3.0 without a word, so a
    # client could believe it spoke 3.2 (e.g. longer cancel keys); PostgreSQL answers it with
    # NegotiateProtocolVersion, and so does dpproxy now.
    import psycopg

    sock = socket.create_connection((proxy.host, proxy.port), timeout=5)
    params = b"user\0plain\0database\0dpproxy_test\0_pq_.test_option\0x\0\0"
    sock.sendall(struct.pack("!ii", 8 + len(params), (3 << 16) | 2) + params)
    reply = sock.recv(256)
    sock.close()
    assert reply[:1] == b"v"
    (length,) = struct.unpack("!i", reply[1:5])
    assert reply[5:1 + length] == struct.pack("!ii", 3 << 16, 1) + b"_pq_.test_option\0"
    assert reply[1 + length:2 + length] == b"R"  # then authentication, as usual
    # libpq 18 asking for the latest version falls back to 3.0 and works.
    with psycopg.connect(proxy.dsn(user="plain", password="plain"), max_protocol_version="latest",
                         autocommit=True) as conn:
        assert conn.pgconn.protocol_version == 3
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_client_starting_tls_directly_without_tls_configured_is_closed_at_once_and_the_server_goes_on(
    proxy: RunningProxy,
):
    # libpq 17's sslnegotiation=direct sends a TLS ClientHello where the SSLRequest would be.
    # With no listen.tls, dpproxy closes the connection at its first byte, as PostgreSQL without
    # ssl does (not held until the startup timeout); with TLS configured it is answered
    # (tests/test_direct_tls.py).
    import psycopg

    with pytest.raises(psycopg.OperationalError, match="SSL"):
        psycopg.connect(proxy.dsn() + " sslmode=require sslnegotiation=direct connect_timeout=10")
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_statement_that_is_not_utf8_fails_and_the_session_goes_on(proxy: RunningProxy):
    # A LATIN1 client (psql under a latin1 locale sets client_encoding from it) typing
    # 'Zürich' sent the byte 0xfc: the session ended with FATAL. PostgreSQL fails the
    # statement (22021) and goes on; so does dpproxy now, with a hint on what to set.
    wire = Wire(proxy.host, proxy.port)
    wire.send(message(b"Q", b"SELECT 'Z\xfcrich'\0"))
    replies = wire.read_until(b"Z")
    errors = [error_fields(body) for kind, body in replies if kind == b"E"]
    assert [e[b"C"] for e in errors] == [b"22021"] and errors[0][b"S"] == b"ERROR"
    assert errors[0][b"M"].startswith(b'invalid byte sequence for encoding "UTF8": 0xfc')
    assert b"UTF8" in errors[0][b"H"]
    wire.send(parse("", "SELECT 1"), message(b"P", b"\0SELECT 'Z\xfcrich'\0\0\0"), bind("", ""), execute(""), SYNC)
    replies = wire.read_until(b"Z")
    assert _codes(replies) == [b"22021"] and replies[-1] == (b"Z", b"I")  # the rest up to Sync skipped
    wire.send(_query("SELECT 1"))
    assert _codes(wire.read_until(b"Z")) == []
    wire.close()
