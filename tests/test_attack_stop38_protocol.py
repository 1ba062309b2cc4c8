"""Attacks on this stop's protocol code, as an unauthenticated client and as an analyst.

The ClientHello reader (proxy/wire/client_hello.py), fuzzed alone and through a real socket;
direct TLS and ``tls.required``; and the watch over the client's stream while a DP statement
waits for a pooled connection (``MessageReader.closed``): what a client pipelines meanwhile is
handled once and in order, and only what reached the backend is charged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import TEST_POLICY, RunningProxy, TestDatabase, make_policy, spent_epsilon
from proxy.wire.client_hello import ClientHello, offered_alpn, read_client_hello
from proxy.wire.protocol import ProtocolError
from test_client_hello import _client_hello
from test_direct_tls import _client_context, _read_all
from tls_proxy import self_signed_certificate
from wire import SYNC, Wire, bind, cstr, data_row_values, describe, error_fields, execute, message, parse, startup

SSL_REQUEST = struct.pack("!ii", 8, 80877103)


HELLO = _client_hello(["postgresql"])


def _read(data: bytes, head: bytes = b"") -> tuple[ClientHello | Exception, bytes]:
    """What read_client_hello makes of a stream of ``data`` then its end, and what it leaves."""
    async def read() -> tuple[ClientHello | Exception, bytes]:
        reader = asyncio.StreamReader()
        reader.feed_data(data)
        reader.feed_eof()
        try:
            hello: ClientHello | Exception = await read_client_hello(reader, head)
        except (ProtocolError, asyncio.IncompleteReadError) as exc:
            hello = exc
        return hello, await reader.read()
    return asyncio.run(read())


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(cut=st.integers(0, len(HELLO)), noise=st.binary(max_size=200), tail=st.binary(max_size=40))
def test_any_bytes_give_a_client_hello_read_to_its_end_or_the_documented_errors(cut: int, noise: bytes, tail: bytes):
    data = HELLO[:cut] + noise + tail
    hello, rest = _read(data)
    if isinstance(hello, ClientHello):
        assert hello.records + rest == data  # whole records, in order, none past the hello


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(cuts=st.lists(st.integers(1, len(HELLO) - 6), max_size=8, unique=True))
def test_a_client_hello_split_into_records_anywhere_is_read_whole(cuts: list[int]):
    body = HELLO[5:]
    pieces, start = [], 0
    for cut in sorted(cuts) + [len(body)]:
        if cut > start:
            pieces.append(HELLO[:3] + struct.pack("!H", cut - start) + body[start:cut])
            start = cut
    records = b"".join(pieces)
    hello, rest = _read(records + b"X")
    assert isinstance(hello, ClientHello) and hello.records == records and rest == b"X"
    assert hello.alpn == [b"postgresql"]


def _hello_with_extensions(extensions: list[tuple[int, bytes]]) -> tuple[bytes, bytes]:
    """HELLO with ``extensions`` (type, body) in place of its own: its record and its message."""
    message = HELLO[5:]
    pos = 4 + 2 + 32
    pos += 1 + message[pos]
    pos += 2 + struct.unpack_from("!H", message, pos)[0]
    pos += 1 + message[pos]
    block = b"".join(struct.pack("!HH", kind, len(body)) + body for kind, body in extensions)
    body = message[4:pos] + struct.pack("!H", len(block)) + block
    message = b"\x01" + len(body).to_bytes(3, "big") + body
    return HELLO[:3] + struct.pack("!H", len(message)) + message, message


def _extensions_of(message: bytes) -> list[tuple[int, bytes]]:
    pos = 4 + 2 + 32
    pos += 1 + message[pos]
    pos += 2 + struct.unpack_from("!H", message, pos)[0]
    pos += 1 + message[pos] + 2
    extensions = []
    while pos < len(message):
        kind, length = struct.unpack_from("!HH", message, pos)
        extensions.append((kind, message[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    return extensions


_ALPN = 16
_OTHER_EXTENSIONS = [e for e in _extensions_of(HELLO[5:]) if e[0] != _ALPN]


@pytest.fixture(scope="module")
def server_context(tmp_path_factory: pytest.TempPathFactory) -> ssl.SSLContext:
    """A TLS server context as dpproxy's: ALPN postgresql."""
    cert, key = self_signed_certificate(tmp_path_factory.mktemp("stop38-cert"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["postgresql"])
    return context


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(names=st.lists(st.one_of(st.sampled_from([b"postgresql", b"h2", b"", b"postgresq", b"postgresqlx"]),
                                st.binary(max_size=12)), max_size=5),
       list_skew=st.one_of(st.just(0), st.integers(-3, 3)), extension_skew=st.one_of(st.just(0), st.integers(-3, 3)),
       copies=st.sampled_from([1, 1, 0, 2]), where=st.integers(0, 20))
def test_openssl_never_takes_an_alpn_offer_the_reader_did_not_read_as_offered(
        server_context: ssl.SSLContext, names: list[bytes], list_skew: int, extension_skew: int, copies: int,
        where: int):
    # The reader's answer decides the refusal (no_application_protocol) that Python's ssl module
    # cannot make: for any ALPN extension, empty, overlong, short, repeated or anywhere, a
    # ClientHello OpenSSL goes on with must have been read as offering what OpenSSL saw.
    entries = b"".join(bytes([len(name)]) + name for name in names)
    body = struct.pack("!H", max(0, len(entries) + list_skew)) + entries
    body = body[: len(body) + extension_skew] if extension_skew < 0 else body + b"\0" * extension_skew
    where = min(where, len(_OTHER_EXTENSIONS))
    records, message = _hello_with_extensions(
        _OTHER_EXTENSIONS[:where] + [(_ALPN, body)] * copies + _OTHER_EXTENSIONS[where:])
    offered = offered_alpn(message)
    tls = server_context.wrap_bio(incoming := ssl.MemoryBIO(), ssl.MemoryBIO(), server_side=True)
    incoming.write(records)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass  # OpenSSL answered and waits for the client's next flight: it went on
    except ssl.SSLError:
        return  # refused by OpenSSL: whatever the reader made of it, no session follows
    if copies == 0:
        assert offered is None
    else:
        assert offered is not None, "OpenSSL went on with an ALPN offer the reader did not see"
        assert (tls.selected_alpn_protocol() == "postgresql") == (b"postgresql" in offered)


# ---------------------------------------------------------------- the ClientHello through a real socket


@pytest.fixture(scope="module")
def tls_required(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A dpproxy that requires TLS and gives a connection 2 s to start."""
    folder = tmp_path_factory.mktemp("stop38-tls")
    cert, key = self_signed_certificate(folder)
    listen = (f'listen: {{{{host: 127.0.0.1, port: 0, startup_timeout_s: 2, '
              f'tls: {{{{cert: "{cert}", key: "{key}", required: true}}}}}}}}')
    proxy = RunningProxy(make_policy(test_db, folder / "ledger.sqlite3",
                                     TEST_POLICY.replace("listen: {{host: 127.0.0.1, port: 0}}", listen)))
    yield proxy
    proxy.stop()


def _connect(proxy: RunningProxy, negotiation: str) -> socket.socket:
    """A socket to ``proxy``; for ``ssl-request``, after an SSLRequest answered 'S'."""
    sock = socket.create_connection((proxy.host, proxy.port), timeout=30)
    if negotiation == "ssl-request":
        sock.sendall(SSL_REQUEST)
        assert sock.recv(1) == b"S"
    return sock


def _serves_on(proxy: RunningProxy) -> None:
    with psycopg.connect(proxy.dsn() + " sslmode=require", autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


_NOT_A_CLIENT_HELLO = {
    "record-longer-than-tls-allows": b"\x16\x03\x01\xff\xff",
    "empty-record": b"\x16\x03\x01\x00\x00",
    "hello-declared-16-MiB": b"\x16\x03\x01\x00\x04\x01\xff\xff\xff",
    "alert-record": b"\x16\x03\x01\x00\x01\x01" + b"\x15\x03\x01\x00\x02\x02\x28",
    "startup-packet-behind-the-hello": HELLO + struct.pack("!ii", 8, 80877103),
}


@pytest.mark.parametrize("negotiation", ["direct", "ssl-request"])
@pytest.mark.parametrize("case", list(_NOT_A_CLIENT_HELLO))
def test_what_is_no_client_hello_is_closed_with_a_log_line_and_no_plaintext_answer(
        tls_required: RunningProxy, negotiation: str, case: str, caplog: pytest.LogCaptureFixture):
    # The client sent a ClientHello's first byte, or had 'S': it speaks TLS and could read no
    # ErrorResponse. After an SSLRequest such a connection got a plaintext FATAL and no log line.
    caplog.set_level(logging.WARNING, "dpproxy")
    sock = _connect(tls_required, negotiation)
    sock.sendall(_NOT_A_CLIENT_HELLO[case])
    assert _read_all(sock) == b""
    sock.close()
    assert [r.getMessage() for r in caplog.records if "the handshake failed" in r.getMessage()], \
        [r.getMessage() for r in caplog.records]
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    _serves_on(tls_required)


@pytest.mark.parametrize("negotiation", ["direct", "ssl-request"])
@pytest.mark.parametrize("sent", [3, 40, len(HELLO)], ids=["record-header", "half-a-hello", "whole-hello"])
def test_a_client_that_stops_in_its_handshake_is_closed_at_the_startup_timeout(
        tls_required: RunningProxy, negotiation: str, sent: int, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING, "dpproxy")
    sock = _connect(tls_required, negotiation)
    sock.sendall(HELLO[:sent])
    _read_all(sock)  # returns once the server closes (the socket's own timeout is far longer)
    sock.close()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    _serves_on(tls_required)


GSSENC_REQUEST = struct.pack("!ii", 8, 80877104)


def _fatal_code(sock: socket.socket) -> bytes:
    """The SQLSTATE of the one message the server sends before it closes: an ErrorResponse."""
    reply = _read_all(sock)
    assert reply[:1] == b"E" and len(reply) == 1 + struct.unpack("!i", reply[1:5])[0], reply
    return error_fields(reply[5:])[b"C"]


def test_tls_required_gives_no_session_to_a_startup_in_clear_after_any_request(tls_required: RunningProxy):
    # A GSSENC request answered 'N' leaves the connection in clear: its StartupMessage is refused.
    sock = _connect(tls_required, "plain")
    sock.sendall(GSSENC_REQUEST)
    assert sock.recv(1) == b"N"
    sock.sendall(startup(user="analyst", database="dpproxy_test"))
    assert _fatal_code(sock) == b"28000"
    sock.close()
    # A ClientHello is taken only as the connection's first bytes, as PostgreSQL 17 takes it.
    sock = _connect(tls_required, "plain")
    sock.sendall(GSSENC_REQUEST)
    assert sock.recv(1) == b"N"
    sock.sendall(HELLO)
    assert _fatal_code(sock) == b"08P01"
    sock.close()


def test_requests_inside_direct_tls_keep_the_session_in_tls_and_are_counted(tls_required: RunningProxy):
    tls = _client_context(["postgresql"]).wrap_socket(_connect(tls_required, "direct"), server_hostname="localhost")
    tls.sendall(SSL_REQUEST)  # TLS already: 'N', and the startup follows inside TLS
    assert tls.recv(1) == b"N"
    tls.sendall(startup(user="analyst", database="dpproxy_test"))
    assert tls.recv(1) == b"R"
    tls.close()
    tls = _client_context(["postgresql"]).wrap_socket(_connect(tls_required, "direct"), server_hostname="localhost")
    for request in (GSSENC_REQUEST, SSL_REQUEST):
        tls.sendall(request)
        assert tls.recv(1) == b"N"
    assert _fatal_code(tls) == b"08P01"  # three negotiations at most, the handshake among them
    tls.close()


# ---------------------------------------------------------------- the client watch during a pool wait

DP_COUNT = "SELECT COUNT(*) FROM adult"


@pytest.fixture(scope="module")
def pool_of_one(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningProxy, Path]]:
    """A dpproxy whose pool holds one backend connection (a checkout waits as long as it takes),
    and its audit log."""
    folder = tmp_path_factory.mktemp("stop38-pool")
    audit = folder / "audit.jsonl"
    pool = "  pool: {{size: 1, checkout_timeout_s: 600}}\n"
    text = TEST_POLICY.replace("  statement_timeout_ms: 20000\n", "  statement_timeout_ms: 20000\n" + pool)
    text = text.replace("users:\n", f'audit: {{{{path: "{audit}"}}}}\nusers:\n')
    proxy = RunningProxy(make_policy(test_db, folder / "ledger.sqlite3", text))
    yield proxy, audit
    proxy.stop()


def _client(wire: Wire) -> str:
    """``wire``'s address as the audit log names the client."""
    host, port = wire.sock.getsockname()[:2]
    return f"{host}:{port}"


def _audited(audit: Path, client: str, *expected: tuple[object, object, object]) -> None:
    """Wait until the audit lines of ``client``'s session that are not passthrough nor command
    lines are ``expected`` (decision, reason, ε): lines reach the file within 20 ms."""
    deadline = time.monotonic() + 30
    while True:
        lines = [json.loads(line) for line in audit.read_text().splitlines()]
        seen = [(line["decision"], line["reason"], line["epsilon"]) for line in lines
                if line["client"] == client and line["decision"] not in ("passthrough", "command")]
        if seen == list(expected) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert seen == list(expected)


@contextmanager
def _pool_held(proxy: RunningProxy) -> Iterator[None]:
    """The pool's one connection held in a transaction block until the block ends."""
    with proxy.connect() as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1")
        yield
        holder.execute("COMMIT")


def _plain_epsilon(proxy: RunningProxy) -> float:
    with psycopg.connect(proxy.dsn(user="plain", password="plain"), autocommit=True) as conn:
        return spent_epsilon(conn)


def _query(sql: str) -> bytes:
    return message(b"Q", cstr(sql))


def _extended(sql: str) -> bytes:
    return parse("", sql) + bind("", "") + describe(b"P", "") + execute("")


def _values(replies: list[tuple[bytes, bytes]]) -> list[bytes | None]:
    return [value for kind, body in replies if kind == b"D" for value in data_row_values(body)]


def _waiting(proxy: RunningProxy) -> int:
    async def read() -> int:
        return proxy.server.pool.waiting
    return int(proxy._call(read()))


def _until_waiting(proxy: RunningProxy, count: int) -> None:
    deadline = time.monotonic() + 30
    while _waiting(proxy) != count:
        assert time.monotonic() < deadline, f"expected {count} checkout(s) waiting, {_waiting(proxy)} are"
        time.sleep(0.01)


def test_messages_pipelined_while_a_dp_statement_waits_are_answered_once_and_in_order(pool_of_one):
    proxy, audit = pool_of_one
    before = _plain_epsilon(proxy)
    wire = Wire(proxy.host, proxy.port)
    client = _client(wire)
    with _pool_held(proxy):
        wire.send(_query(DP_COUNT))
        _until_waiting(proxy, 1)
        # Read ahead by the watch, kept for after the checkout: a second Query, a DP statement
        # in the extended protocol, stray COPY data (ignored, as PostgreSQL ignores it) and one more.
        wire.send(_query("SELECT 2"), _extended(DP_COUNT), SYNC, message(b"d", b"stray"), _query("SELECT 3"))
        time.sleep(0.2)  # a chance for the watch to read them all before the pool hands over
    answers = [wire.read_until(b"Z") for _ in range(4)]
    assert [b"E" in [kind for kind, _ in replies] for replies in answers] == [False] * 4, answers
    first, second, third, fourth = (_values(replies) for replies in answers)
    assert int(first[0]) > 40000 and second == [b"2"] and int(third[0]) > 40000 and fourth == [b"3"]
    wire.send(_query("SELECT 4"))
    assert _values(wire.read_until(b"Z")) == [b"4"]  # nothing more was queued
    wire.close()
    assert _plain_epsilon(proxy) == pytest.approx(before + 2.0)
    _audited(audit, client, ("dp", None, 1.0), ("dp", None, 1.0))


def _read_ahead(proxy: RunningProxy) -> int:
    """The most bytes a session of ``proxy`` holds read from its client and not yet handled."""
    async def read() -> int:
        readers = [session._messages for session in proxy.server.sessions if session._messages is not None]
        return max((len(reader._buffer) - reader._pos for reader in readers), default=0)
    return int(proxy._call(read()))


def test_more_than_the_watch_reads_ahead_waits_in_the_socket_and_comes_after_in_order(pool_of_one):
    proxy, _ = pool_of_one
    before = _plain_epsilon(proxy)
    wire = Wire(proxy.host, proxy.port)
    copy_data = message(b"d", b"x" * 60_000)
    with _pool_held(proxy):
        wire.send(_query(DP_COUNT))
        _until_waiting(proxy, 1)
        # 600 kB: the watch keeps at most 256 KiB and leaves the rest in the socket (a sender
        # thread, for the socket's buffers fill up until the checkout).
        sender = threading.Thread(target=wire.send, args=(copy_data * 10 + _query("SELECT 5"),))
        sender.start()
        deadline = time.monotonic() + 30
        while _read_ahead(proxy) < 256 * 1024:
            assert time.monotonic() < deadline, f"the watch read {_read_ahead(proxy)} bytes ahead"
            time.sleep(0.01)
        time.sleep(0.2)  # a chance to read more than it should
        assert _read_ahead(proxy) <= 256 * 1024 + 65536  # its limit and one read past it
    sender.join(30)
    assert not sender.is_alive()
    first, second = wire.read_until(b"Z"), wire.read_until(b"Z")
    assert int(_values(first)[0]) > 40000 and _values(second) == [b"5"], (first, second)
    wire.close()
    assert _plain_epsilon(proxy) == pytest.approx(before + 1.0)


def test_a_terminate_pipelined_after_a_waiting_dp_statement_comes_after_its_answer(pool_of_one):
    # The client is still there (its socket open): the statement runs, is charged and answered,
    # then the Terminate ends the session.
    proxy, _ = pool_of_one
    before = _plain_epsilon(proxy)
    wire = Wire(proxy.host, proxy.port)
    with _pool_held(proxy):
        wire.send(_query(DP_COUNT))
        _until_waiting(proxy, 1)
        wire.send(message(b"X"))
        time.sleep(0.2)
    replies = wire.read_until(b"Z")
    assert int(_values(replies)[0]) > 40000
    assert wire.read_until(b"never") == []  # then the connection closes
    wire.close()
    assert _plain_epsilon(proxy) == pytest.approx(before + 1.0)


@pytest.mark.parametrize("names_known", [False, True], ids=["first-statement", "names-resolved-before"])
def test_a_half_close_after_pipelined_queries_drops_them_all_uncharged_and_audits_the_waiting_one(
        pool_of_one, names_known: bool):
    # An end of file while the statement waits is a client gone (docs/deployment.md), even one
    # that only shut down its sending side: no statement of the pipeline reached the backend.
    # The session's first statement waits for its checkout to resolve its names, a later one to
    # run: either way it leaves one audit line, 08006 and no ε, as a statement failing there for
    # want of a connection (53300) leaves one.
    proxy, audit = pool_of_one
    wire = Wire(proxy.host, proxy.port)
    client = _client(wire)
    warm_up = []
    if names_known:
        wire.send(_query(DP_COUNT))
        assert int(_values(wire.read_until(b"Z"))[0]) > 40000
        warm_up = [("dp", None, 1.0)]
    before = _plain_epsilon(proxy)
    with _pool_held(proxy):
        wire.send(_query(DP_COUNT), _query(DP_COUNT))
        _until_waiting(proxy, 1)
        wire.sock.shutdown(socket.SHUT_WR)
        _until_waiting(proxy, 0)  # before the pool hands a connection over
    assert wire.read_until(b"Z") == []
    wire.close()
    assert _plain_epsilon(proxy) == pytest.approx(before)
    _audited(audit, client, *warm_up, ("error", "08006", None))  # the second Query was never read


def test_a_client_gone_after_the_checkout_but_before_the_charge_is_charged_once_as_the_statement_runs(pool_of_one):
    # Past the checkout nothing watches the client: the statement is charged, sent and answered
    # to a closed socket, and the charge stands (as for a client gone after the charge).
    proxy, audit = pool_of_one
    before = _plain_epsilon(proxy)
    budget = proxy.server.budget
    charge = budget.charge
    reached = threading.Event()
    go = asyncio.Event()

    async def held_charge(*args: object, **kwargs: object) -> object:
        reached.set()
        await go.wait()
        return await charge(*args, **kwargs)

    budget.charge = held_charge  # type: ignore[method-assign]
    try:
        wire = Wire(proxy.host, proxy.port)
        client = _client(wire)
        wire.send(_query(DP_COUNT))
        assert reached.wait(30)
        wire.sock.shutdown(socket.SHUT_RDWR)
        wire.close()
        proxy.loop.call_soon_threadsafe(go.set)
        _audited(audit, client, ("dp", None, 1.0))
    finally:
        budget.charge = charge  # type: ignore[method-assign]
    assert _plain_epsilon(proxy) == pytest.approx(before + 1.0)


def test_an_extended_error_pipelined_behind_a_waiting_statement_skips_to_sync_and_a_cancel_charges_nothing(
        pool_of_one):
    proxy, _ = pool_of_one
    before = _plain_epsilon(proxy)
    wire = Wire(proxy.host, proxy.port)
    (key,) = [body for kind, body in wire.startup if kind == b"K"]
    with _pool_held(proxy):
        # A DP statement waits; behind it a Parse that fails, then messages up to Sync (a Query
        # among them) that PostgreSQL's rule skips.
        wire.send(_extended(DP_COUNT), parse("", "SELEC 1"), bind("", ""), execute(""), _query("SELECT 7"), SYNC)
        _until_waiting(proxy, 1)
        time.sleep(0.2)
    replies = wire.read_until(b"Z")
    assert int(_values(replies)[0]) > 40000
    assert [error_fields(body)[b"C"] for kind, body in replies if kind == b"E"] == [b"42601"]
    assert _values(replies) == _values(replies)[:1]  # SELECT 7 was skipped
    with _pool_held(proxy):
        # Cancelled while it waits: 57014, everything up to Sync skipped, nothing charged.
        wire.send(_extended(DP_COUNT), _extended("SELECT 8"), SYNC)
        _until_waiting(proxy, 1)
        cancel = socket.create_connection((proxy.host, proxy.port), timeout=10)
        cancel.sendall(struct.pack("!ii", 16, 80877102) + key)
        cancel.close()
        replies = wire.read_until(b"Z")
    assert [error_fields(body)[b"C"] for kind, body in replies if kind == b"E"] == [b"57014"]
    assert _values(replies) == []
    wire.send(_query("SELECT 9"))
    assert _values(wire.read_until(b"Z")) == [b"9"]
    wire.close()
    assert _plain_epsilon(proxy) == pytest.approx(before + 1.0)
