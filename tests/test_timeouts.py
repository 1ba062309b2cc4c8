"""Silent, slow and idle connections close on their own; the server and other sessions go on."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from conftest import TEST_POLICY, RunningProxy, make_policy
from wire import Wire, cstr, error_fields, message

FAST = TEST_POLICY.replace(
    "listen: {{host: 127.0.0.1, port: 0}}",
    "listen: {{host: 127.0.0.1, port: 0, startup_timeout_s: 1, idle_timeout_s: 1.5, idle_in_transaction_timeout_s: 1}}",
)


@pytest.fixture(scope="module")
def fast(test_db, tmp_path_factory: pytest.TempPathFactory):
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("t") / "l.sqlite3", FAST))
    yield proxy
    proxy.stop()


def test_a_flood_of_silent_connections_times_out_while_others_are_served(fast: RunningProxy):
    silent = [socket.create_connection((fast.host, fast.port), timeout=10) for _ in range(100)]
    half = [socket.create_connection((fast.host, fast.port), timeout=10) for _ in range(20)]
    for sock in half:
        sock.sendall(struct.pack("!i", 100))  # a startup length, then nothing
    with fast.connect() as conn:
        assert conn.execute("SELECT COUNT(*) FROM adult").fetchone()[0] > 40000
    time.sleep(1.5)
    for sock in silent + half:
        data = sock.recv(1024)
        assert data == b"" or (data[:1] == b"E" and b"08P01" in data)
        sock.close()
    assert fast.server.session_count == 0


def test_idle_session_is_closed_with_57P05(fast: RunningProxy):
    wire = Wire(fast.host, fast.port)
    time.sleep(2.0)
    replies = wire.read_until(b"E")
    assert error_fields(replies[-1][1])[b"C"] == b"57P05"
    wire.close()


def test_idle_in_transaction_is_closed_with_25P03(fast: RunningProxy):
    wire = Wire(fast.host, fast.port)
    wire.send(message(b"Q", cstr("BEGIN")))
    assert wire.read_until(b"Z")[-1] == (b"Z", b"T")
    time.sleep(1.5)
    replies = wire.read_until(b"E")
    assert error_fields(replies[-1][1])[b"C"] == b"25P03"
    wire.close()


def test_an_active_client_is_not_timed_out(fast: RunningProxy):
    with fast.connect() as conn:
        for _ in range(4):
            conn.execute("SELECT 1")
            time.sleep(0.5)
        assert conn.execute("SELECT 2").fetchone() == (2,)
