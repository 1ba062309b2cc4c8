"""A large passthrough result is passed on as it arrives, never held whole (row_stream.py).

Before, libpq gave a passthrough result whole and dpproxy kept it until the client had it:
one ``SELECT`` of 3,000,000 generated rows took the process shared by every session from
117 MB to 965 MB (and 530 MB stayed taken). Pinned here: a result far larger than any
buffer arrives intact with its tag while dpproxy's memory stays flat; the backend waits for
a client that does not read (its rows stay in PostgreSQL); a client that stops reading for
good gets at most a bounded rest held, and its pooled connection goes back to the others;
a statement that fails part-way sends its rows and then its error, as PostgreSQL does; in
the extended protocol, row-limited Execute hands a stream out in pieces, another statement
may run in between, and a portal closed before its end leaves the connection usable;
mixed result formats convert per chunk; a cancel stops a stream.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import psycopg
import pytest

from conftest import TEST_POLICY, RunningProxy, TestDatabase, memory_kb, reset_peak_memory, running_proxy
from proxy.backend.row_stream import HELD_RESULT_BYTES
from proxy.serving import session
from wire import SYNC, Wire, bind, cstr, data_row_values, error_fields, execute, message, parse

WIDE = "x" * 1000


def _query(sql: str) -> bytes:
    return message(b"Q", cstr(sql))


def _drain_counting(wire: Wire, until: bytes = b"Z") -> tuple[int, list[tuple[bytes, bytes]]]:
    """Read to the message ``until``, counting DataRows without keeping them; the other messages."""
    rows, others = 0, []
    buffer = wire.buffer
    while True:
        pos = 0
        while len(buffer) - pos >= 5:
            length = struct.unpack_from("!i", buffer, pos + 1)[0]
            if len(buffer) - pos < 1 + length:
                break
            kind = buffer[pos:pos + 1]
            if kind == b"D":
                rows += 1
            else:
                others.append((kind, buffer[pos + 5:pos + 1 + length]))
            pos += 1 + length
            if kind == until:
                wire.buffer = buffer[pos:]
                return rows, others
        buffer = buffer[pos:]
        chunk = wire.sock.recv(1 << 20)
        assert chunk, "connection closed"
        buffer += chunk


def _codes(messages: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [error_fields(body)[b"C"] for kind, body in messages if kind == b"E"]


def _backend_wait(admin: psycopg.Connection, marker: str) -> tuple[str | None, str | None]:
    row = admin.execute(
        "SELECT state, wait_event FROM pg_stat_activity WHERE query LIKE %s AND pid <> pg_backend_pid()",
        (f"%{marker}%",),
    ).fetchone()
    return (row[0], row[1]) if row else (None, None)


def test_a_result_larger_than_memory_should_hold_arrives_intact_with_memory_flat(proxy: RunningProxy) -> None:
    wire = Wire(proxy.host, proxy.port)
    wire.send(_query("SELECT 1"))
    wire.read_until(b"Z")
    reset_peak_memory()
    before = memory_kb("VmRSS")
    wire.send(_query(f"SELECT g, '{WIDE}' FROM generate_series(1, 300000) g"))  # ~300 MB on the wire
    rows, others = _drain_counting(wire)
    grown_mb = (memory_kb("VmHWM") - before) / 1024
    wire.close()
    assert rows == 300_000
    assert [k for k, _ in others] == [b"T", b"C", b"Z"]
    assert others[1][1] == b"SELECT 300000\0"
    assert grown_mb < 60, f"the process grew by {grown_mb:.0f} MB while relaying ~300 MB"


def test_the_backend_waits_for_a_client_that_does_not_read(
    proxy: RunningProxy, admin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The moment a slow client is given before its rows are held, lengthened: with both cores
    # busy the backend can take more than the usual second to fill the sockets' buffers.
    monkeypatch.setattr(session, "_SLOW_CLIENT_S", 60.0)
    wire = Wire(proxy.host, proxy.port)
    marker = "stream_waits_marker"
    reset_peak_memory()
    before = memory_kb("VmRSS")
    wire.send(_query(f"SELECT g AS {marker}, '{WIDE}' FROM generate_series(1, 2000000) g"))  # ~2 GB
    deadline = time.monotonic() + 30
    while True:
        state, wait_event = _backend_wait(admin, marker)
        if wait_event == "ClientWrite" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    grown_mb = (memory_kb("VmHWM") - before) / 1024
    wire.close()
    assert (state, wait_event) == ("active", "ClientWrite")  # PostgreSQL holds the rows ...
    assert grown_mb < 60, f"the process grew by {grown_mb:.0f} MB"  # ... not dpproxy


_SMALL_POOL = TEST_POLICY.replace(
    "statement_timeout_ms: 20000", "statement_timeout_ms: 20000\n  pool: {{size: 1, checkout_timeout_s: 15}}"
)


@pytest.fixture(scope="module")
def one_connection(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with running_proxy(test_db, tmp_path_factory, _SMALL_POOL) as running:
        yield running


def test_a_client_that_stops_reading_gets_a_bounded_rest_and_frees_its_connection(
    one_connection: RunningProxy,
) -> None:
    proxy = one_connection
    hog = Wire(proxy.host, proxy.port)
    total = 2 * HELD_RESULT_BYTES // 1000  # twice what dpproxy holds for it
    reset_peak_memory()
    before = memory_kb("VmRSS")
    hog.send(_query(f"SELECT g, '{WIDE}' FROM generate_series(1, {total}) g"))
    time.sleep(1.5)
    other = Wire(proxy.host, proxy.port)
    other.send(_query("SELECT 1"))
    assert _codes(other.read_until(b"Z")) == []  # the only pooled connection came back
    rows, others = _drain_counting(hog)
    grown_mb = (memory_kb("VmHWM") - before) / 1024
    # The held rest, and no copy of it: handed out at once, it was joined into one write (3×).
    assert grown_mb < HELD_RESULT_BYTES / 2**20 + 45, f"the process grew by {grown_mb:.0f} MB"
    # What it took, what was held for it, then 54000: the rest was more than dpproxy holds.
    assert 0 < rows < total
    assert _codes(others) == [b"54000"]
    hog.send(_query("SELECT 2"))
    assert _codes(hog.read_until(b"Z")) == []  # and the session goes on
    for wire in (hog, other):
        wire.close()


def test_a_statement_failing_part_way_sends_its_rows_then_its_error(proxy: RunningProxy) -> None:
    wire = Wire(proxy.host, proxy.port)
    wire.send(_query(f"SELECT 1 / (g - 150000), '{WIDE}' FROM generate_series(1, 200000) g"))
    rows, others = _drain_counting(wire)
    assert rows > 0 and _codes(others) == [b"22012"] and others[-1] == (b"Z", b"I")
    wire.send(_query("SELECT 1"))
    assert _codes(wire.read_until(b"Z")) == []
    wire.close()


def test_row_limited_execute_hands_a_stream_out_in_pieces_with_statements_between(proxy: RunningProxy) -> None:
    wire = Wire(proxy.host, proxy.port)
    big = f"SELECT g, '{WIDE}' FROM generate_series(1, 30000) g"  # ~30 MB
    wire.send(_query("BEGIN"))
    wire.read_until(b"Z")
    wire.send(parse("big", big), bind("p", "big"), execute("p", 1000), SYNC)
    rows, others = _drain_counting(wire)
    assert rows == 1000 and [k for k, _ in others] == [b"1", b"2", b"s", b"Z"] and others[-1][1] == b"T"
    # Another statement on the same connection while the portal is suspended (in a block the
    # portal is a backend cursor: nothing of it is held meanwhile; outside one, see
    # test_suspended_portals_of_a_pipeline_together_hold_no_more_than_one_cap).
    wire.send(_query("SELECT 42"))
    got = wire.read_until(b"Z")
    assert [data_row_values(b) for k, b in got if k == b"D"] == [[b"42"]]
    wire.send(execute("p", 0), SYNC)
    rest, others = _drain_counting(wire)
    assert rest == 29_000 and others[0] == (b"C", b"SELECT 29000\0")
    wire.send(_query("COMMIT"))
    assert _codes(wire.read_until(b"Z")) == []
    wire.close()


def test_a_portal_closed_before_its_end_leaves_the_connection_usable(proxy: RunningProxy) -> None:
    wire = Wire(proxy.host, proxy.port)
    big = f"SELECT g, '{WIDE}' FROM generate_series(1, 100000) g"
    # Outside a block, Sync ends the portal: its rest is read for nothing.
    wire.send(parse("", big), bind("", ""), execute("", 10), SYNC)
    rows, others = _drain_counting(wire)
    assert rows == 10 and others[-1] == (b"Z", b"I")
    wire.send(_query("SELECT 7"))
    got = wire.read_until(b"Z")
    assert [data_row_values(b) for k, b in got if k == b"D"] == [[b"7"]]
    # Inside one, Close does.
    wire.send(_query("BEGIN"), parse("s", big), bind("q", "s"), execute("q", 10),
              message(b"C", b"P" + cstr("q")), SYNC)
    wire.read_until(b"Z")
    rows, others = _drain_counting(wire)
    assert rows == 10 and others[-1] == (b"Z", b"T")
    wire.send(_query("SELECT 8"), _query("COMMIT"))
    got = wire.read_until(b"Z")
    assert [data_row_values(b) for k, b in got if k == b"D"] == [[b"8"]]
    assert _codes(wire.read_until(b"Z")) == []
    wire.close()


@pytest.mark.parametrize("ending", [SYNC, message(b"C", b"P" + cstr("")) + SYNC], ids=["sync", "close"])
def test_a_portal_ended_outside_a_block_stops_its_statement_as_on_postgresql(proxy: RunningProxy, ending: bytes) -> None:
    """PostgreSQL drops a portal's statement when the portal ends (at Sync outside a block, or
    at Close): the next request is answered at once. dpproxy read the rest for nothing first,
    for as long as the statement ran (3,000,000 rows: 3.6 s; here until the 20 s statement
    timeout). Now the statement, in a transaction of its own, is cancelled on the backend."""
    wire = Wire(proxy.host, proxy.port)
    try:
        wire.send(parse("", "SELECT generate_series(1, 1000000000)"), bind("", ""), execute("", 10), ending)
        rows, others = _drain_counting(wire)
        assert rows == 10 and others[-1] == (b"Z", b"I")
        started = time.monotonic()
        wire.send(_query("SELECT 7"))
        got = wire.read_until(b"Z")
        assert [data_row_values(b) for k, b in got if k == b"D"] == [[b"7"]] and _codes(got) == []
        assert time.monotonic() - started < 5
        wire.send(_query("SELECT 8"))  # and no late cancel reaches the statements after it
        assert [data_row_values(b) for k, b in wire.read_until(b"Z") if k == b"D"] == [[b"8"]]
    finally:
        wire.close()


def test_mixed_result_formats_convert_every_chunk(proxy: RunningProxy) -> None:
    wire = Wire(proxy.host, proxy.port)
    sql = "SELECT g, g::text FROM generate_series(1, 50000) g"
    wire.send(parse("", sql), bind("", "", result_formats=(1, 0)), execute(""), SYNC)
    got = wire.read_until(b"Z")
    values = [data_row_values(b) for k, b in got if k == b"D"]
    assert len(values) == 50_000
    assert all(v == [struct.pack("!i", i), str(i).encode()] for i, v in enumerate(values, 1))
    wire.close()


def test_a_cancel_stops_a_stream(proxy: RunningProxy) -> None:
    wire = Wire(proxy.host, proxy.port)
    pid, secret = struct.unpack("!ii", next(body for kind, body in wire.startup if kind == b"K"))
    total = 2_000_000
    wire.send(_query(f"SELECT g, '{WIDE}' FROM generate_series(1, {total}) g"))
    # Rows on their way (the first one read: a fixed sleep let none arrive on a loaded machine),
    # the backend waiting for the client to take more.
    first, _ = _drain_counting(wire, until=b"D")
    with socket.create_connection((proxy.host, proxy.port), timeout=5) as cancel:
        cancel.sendall(struct.pack("!iiii", 16, 80877102, pid, secret))
        cancel.recv(1)
    rows, others = _drain_counting(wire)
    assert first == 1 and rows < total - 1 and _codes(others) == [b"57014"]
    wire.close()


def test_suspended_portals_of_a_pipeline_together_hold_no_more_than_one_cap(proxy: RunningProxy) -> None:
    # Each suspended portal's rest was held up to the cap when the next statement needed the
    # connection: six portals on a 100 MB result grew the process by 349 MB (availability review).
    # Outside a block (one pipeline, its implicit transaction) a portal's statement runs on the
    # backend connection, so a rest is still held; in a block each is a cursor of its own
    # (test_suspended_portals_in_a_block_hand_out_their_whole_rests_with_memory_flat).
    wire = Wire(proxy.host, proxy.port)
    big = f"SELECT g, '{WIDE}' FROM generate_series(1, 100000) g"  # ~100 MB each
    reset_peak_memory()
    before = memory_kb("VmRSS")
    wire.send(parse("s", big), *(bind(f"p{i}", "s") + execute(f"p{i}", 1) for i in range(4)),
              parse("", "SELECT 1"), bind("", ""), execute(""),  # the last portal's rest is held too
              *(execute(f"p{i}") for i in range(4)), SYNC)
    rows, others = _drain_counting(wire)
    grown_mb = (memory_kb("VmHWM") - before) / 1024
    wire.close()
    assert grown_mb < HELD_RESULT_BYTES / 2**20 + 40, f"the process grew by {grown_mb:.0f} MB"
    # What was held of the first rest is handed out, then 54000: it did not fit (the rest skipped).
    assert _codes(others) == [b"54000"]
    # (A hold may pass the cap by the chunk that crossed it and the rows its portal had.)
    assert 5 < rows and (rows - 5) * 1000 <= HELD_RESULT_BYTES + 2048 * 1010


def test_suspended_portals_in_a_block_hand_out_their_whole_rests_with_memory_flat(proxy: RunningProxy) -> None:
    """In a block a portal run in pieces is a backend cursor (backend_portals.py): nothing of
    its rest is held for another statement, and each hands out all of it, as on PostgreSQL
    (before, the rests were held together up to the cap, then 54000)."""
    wire = Wire(proxy.host, proxy.port)
    big = f"SELECT g, '{WIDE}' FROM generate_series(1, 100000) g"  # ~100 MB each
    wire.send(_query("BEGIN"))
    wire.read_until(b"Z")
    reset_peak_memory()
    before = memory_kb("VmRSS")
    for i in range(4):
        wire.send(parse(f"s{i}", big), bind(f"p{i}", f"s{i}"), execute(f"p{i}", 1), SYNC)
        rows, others = _drain_counting(wire)
        assert rows == 1 and others[-1] == (b"Z", b"T")
    wire.send(_query("SELECT 1"))
    wire.read_until(b"Z")
    received = []
    for i in range(4):
        wire.send(execute(f"p{i}"), SYNC)
        rows, others = _drain_counting(wire)
        received.append((rows, _codes(others)))
    grown_mb = (memory_kb("VmHWM") - before) / 1024
    wire.send(_query("COMMIT"))
    wire.read_until(b"Z")
    wire.close()
    assert received == [(99_999, [])] * 4
    assert grown_mb < 40, f"the process grew by {grown_mb:.0f} MB"
