"""A result passed on as it arrives (row_stream.py) is audited when it ends, with its outcome.

Before, its audit line was written when its first rows went out: a statement that failed
part-way, was cancelled, or whose client went away was a ``passthrough`` line like one that
succeeded. Pinned here: one line per statement, at its end, with the rows the client was
handed and, for an error that ended it, ``error`` and the SQLSTATE.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import TEST_POLICY, RunningProxy, TestDatabase, running_proxy
from proxy.ops.audit import fingerprint
from wire import SYNC, Wire, bind, cstr, execute, message, parse

WIDE = "x" * 1000
FAILING = f"SELECT 1 / (g - 150000), '{WIDE}' FROM generate_series(1, 200000) g"
WHOLE = f"SELECT g, '{WIDE}' FROM generate_series(1, 60000) g"


@pytest.fixture(scope="module")
def audited(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningProxy, Path]]:
    log = tmp_path_factory.mktemp("audit") / "audit.jsonl"
    text = TEST_POLICY.replace("users:\n", f'audit: {{{{path: "{log}"}}}}\nusers:\n')
    with running_proxy(test_db, tmp_path_factory, text) as proxy:
        yield proxy, log


def _lines_of(log: Path, sql: str, count: int = 1) -> list[dict[str, Any]]:
    """The audit lines of ``sql``, once ``count`` of them have been written (or 20 s passed)."""
    mark = fingerprint(sql)
    lines: list[dict[str, Any]] = []
    for _ in range(400):
        written = log.read_text().split("\n")[:-1]  # whole lines only: the writer may be mid-line
        lines = [line for line in map(json.loads, written) if line["fingerprint"] == mark]
        if len(lines) >= count:
            break
        time.sleep(0.05)
    return lines


def _drain(wire: Wire) -> None:
    """Read until the ReadyForQuery that ends the answer, keeping only its last bytes: appending
    every chunk of a 150 MB answer to one buffer took 10-15 s of the test's own CPU, enough under
    load to run into the policy's statement timeout."""
    tail = wire.buffer
    while not tail.endswith(b"Z\x00\x00\x00\x05I"):
        chunk = wire.sock.recv(1 << 20)
        assert chunk
        tail = (tail + chunk)[-6:]
    wire.buffer = b""


def _streamed_line(audited: tuple[RunningProxy, Path], sql: str) -> dict[str, Any]:
    """The one audit line of ``sql``, sent as a simple Query and read to its end."""
    proxy, log = audited
    wire = Wire(proxy.host, proxy.port)
    wire.send(message(b"Q", cstr(sql)))
    _drain(wire)
    wire.close()
    (line,) = _lines_of(log, sql)
    return line


def test_a_stream_failing_part_way_is_an_error_line_with_its_sqlstate_and_rows(audited):
    line = _streamed_line(audited, FAILING)
    assert line["decision"] == "error" and line["reason"] == "22012"
    assert 0 < line["rows"] < 150_000


def test_a_stream_read_to_its_end_is_a_passthrough_line_with_all_its_rows(audited):
    line = _streamed_line(audited, WHOLE)
    assert line["decision"] == "passthrough" and line["reason"] is None and line["rows"] == 60_000


def test_a_result_that_came_whole_records_its_rows(audited):
    proxy, log = audited
    with proxy.connect() as conn:
        conn.execute("SELECT g FROM generate_series(1, 3) g")
    (line,) = _lines_of(log, "SELECT g FROM generate_series(1, 3) g")
    assert line["decision"] == "passthrough" and line["rows"] == 3


def test_a_portal_closed_before_its_end_records_the_rows_handed_out(audited):
    proxy, log = audited
    sql = WHOLE.replace("60000", "60001")
    wire = Wire(proxy.host, proxy.port)
    wire.send(parse("", sql), bind("", ""), execute("", 10), SYNC)
    wire.read_until(b"Z")
    wire.close()
    (line,) = _lines_of(log, sql)
    assert line["decision"] == "passthrough" and line["rows"] == 10


def test_a_client_gone_mid_stream_is_an_error_line_and_no_internal_error(audited, caplog):
    proxy, log = audited
    sql = f"SELECT g, '{WIDE}' FROM generate_series(1, 2000000) g"
    wire = Wire(proxy.host, proxy.port)
    wire.send(message(b"Q", cstr(sql)))
    wire.sock.recv(1 << 16)
    wire.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    wire.close()  # reset, without reading the rest, nor saying Terminate
    (line,) = _lines_of(log, sql)
    assert line["decision"] == "error" and line["reason"] == "08006" and line["rows"] < 2_000_000
    # A client going away is routine: before, uvloop's write to its closed transport raised a
    # RuntimeError that ended the session as an internal error, logged with two tracebacks.
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


def test_a_suspended_portal_left_at_terminate_is_a_passthrough_line(audited):
    proxy, log = audited
    sql = WHOLE.replace("60000", "60002")
    wire = Wire(proxy.host, proxy.port)
    wire.send(message(b"Q", cstr("BEGIN")), parse("", sql), bind("p", ""), execute("p", 5), SYNC)
    wire.read_until(b"Z")
    wire.read_until(b"Z")
    wire.send(message(b"X"))
    wire.close()
    (line,) = _lines_of(log, sql)
    assert line["decision"] == "passthrough" and line["reason"] is None and line["rows"] == 5


def test_a_portal_run_in_pieces_in_a_block_is_one_line_with_every_piece_s_rows(audited):
    """A portal run as a backend cursor (backend_portals.py): one line, at its end, counting the
    rows of all its Executes."""
    proxy, log = audited
    sql = "SELECT g FROM generate_series(1, 2500) g"
    wire = Wire(proxy.host, proxy.port)
    wire.send(message(b"Q", cstr("BEGIN")), parse("", sql), bind("p", ""), execute("p", 1000), SYNC)
    wire.read_until(b"Z")
    wire.read_until(b"Z")
    wire.send(execute("p", 1000), execute("p", 1000), SYNC, message(b"Q", cstr("COMMIT")))
    wire.read_until(b"Z")
    wire.read_until(b"Z")
    wire.close()
    (line,) = _lines_of(log, sql)
    assert line["decision"] == "passthrough" and line["reason"] is None and line["rows"] == 2500


@pytest.mark.parametrize("ending", ["close", "commit"])
def test_a_portal_run_in_pieces_left_early_records_the_rows_handed_out(audited, ending: str):
    proxy, log = audited
    sql = f"SELECT g FROM (SELECT generate_series(1, 1000000000) AS g) s WHERE '{ending}' IS NOT NULL"
    wire = Wire(proxy.host, proxy.port)
    wire.send(message(b"Q", cstr("BEGIN")), parse("", sql), bind("p", ""), execute("p", 7), execute("p", 3),
              *([message(b"C", b"P" + cstr("p"))] if ending == "close" else []), SYNC, message(b"Q", cstr("COMMIT")))
    for _ in range(3):
        wire.read_until(b"Z")
    wire.close()
    (line,) = _lines_of(log, sql)
    assert line["decision"] == "passthrough" and line["rows"] == 10


def test_a_portal_run_in_pieces_failing_is_an_error_line_with_its_sqlstate_and_rows(audited):
    proxy, log = audited
    sql = "SELECT 1 / (g - 5) FROM generate_series(1, 10) g"
    wire = Wire(proxy.host, proxy.port)
    wire.send(message(b"Q", cstr("BEGIN")), parse("", sql), bind("p", ""), execute("p", 2), execute("p", 2),
              execute("p", 2), SYNC, message(b"Q", cstr("ROLLBACK")))
    for _ in range(3):
        wire.read_until(b"Z")
    wire.close()
    (line,) = _lines_of(log, sql)
    assert line["decision"] == "error" and line["reason"] == "22012" and line["rows"] == 4
