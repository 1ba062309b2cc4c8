"""A large passthrough result: the time to read it, and what it costs dpproxy's memory.

``SELECT g, '<100 characters>' FROM generate_series(1, N) g`` reads no table, so dpproxy
forwards it to PostgreSQL unchanged and relays its N rows (~120 bytes each on the wire).

* Reading: a libpq client (psycopg's low-level ``pgconn``, chunked rows mode, 1,024 rows per
  chunk) sends it and reads every row, discarding each chunk as it comes, through dpproxy and
  directly over TCP, endpoints alternating by round. The wall time from sending to the end of
  the result, p50 over the rounds, and the ratio dpproxy / direct.
* dpproxy's memory: its RSS before the dpproxy reads, its peak during them (the kernel's
  ``VmHWM``, reset through ``/proc/<pid>/clear_refs`` before the reads; where that file is not
  writable, the largest RSS sampled every 50 ms), and its RSS after them. Before results were
  streamed, dpproxy held a result whole: its peak grew with N.
* A slow client: one that reads nothing for ``pause_s`` after sending the statement, then
  reads everything. dpproxy's peak RSS during the pause (a client that stops reading has at
  most ``HELD_RESULT_BYTES``, 64 MB, of its result held for it; past that it gets 54000 after
  the held rows), and what the client got: rows, and the SQLSTATE of an error if any.

Only measured: nothing here asserts a figure.
"""

from __future__ import annotations

import select
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
from psycopg import pq
from psycopg.pq.abc import PGconn

from .postgres import Endpoint
from .servers import ServerProcess
from .stats import median

__all__ = ["LITERAL", "LargeResult", "Read", "SlowClient", "large_result", "query", "wire_bytes"]

LITERAL = "x" * 100
CHUNK_ROWS = 1024
_SAMPLE_S = 0.05
_WAIT_S = 600.0  # for a result that does not come: PostgreSQL's statement_timeout is dpproxy's bound


def query(rows: int) -> str:
    return f"SELECT g, '{LITERAL}' FROM generate_series(1, {rows}) g"


def wire_bytes(rows: int) -> int:
    """The bytes of the result's DataRow messages: per row, type, length, field count, and each
    field's length and text (``g``'s digits, the literal)."""
    digits, width, start = 0, 1, 1
    while start <= rows:
        end = min(rows, start * 10 - 1)
        digits += (end - start + 1) * width
        width, start = width + 1, start * 10
    return rows * (1 + 4 + 2 + 4 + 4 + len(LITERAL)) + digits


@dataclass(frozen=True)
class Read:
    """One client's read of the result: wall seconds from sending, rows received, and the
    SQLSTATE of the error that ended it (None: it ended with its command tag)."""

    seconds: float
    rows: int
    sqlstate: str | None = None


@dataclass(frozen=True)
class SlowClient:
    pause_s: float
    rss_before: int
    peak_during_pause: int
    peak_while_reading: int  # over the whole probe, the pause and the read after it
    read: Read  # its seconds: from the end of the pause to the end of the result


@dataclass
class LargeResult:
    rows: int
    wire_bytes: int
    reads: dict[str, list[Read]]  # endpoint name → one read per round
    rss_before: int = 0
    peak_rss: int = 0
    rss_after: int = 0
    peak_method: str = ""
    slow: SlowClient | None = None
    endpoint_names: tuple[str, str] = ("dpproxy", "direct-tcp")

    def p50(self, name: str) -> float:
        return median([r.seconds for r in self.reads[name] if r.sqlstate is None and r.rows == self.rows])

    def incomplete(self) -> list[str]:
        """The reads that did not get every row with the command tag, described."""
        return [f"{name}: {r.rows:,} rows" + (f", SQLSTATE {r.sqlstate}" if r.sqlstate else "")
                for name, reads in self.reads.items() for r in reads
                if r.sqlstate is not None or r.rows != self.rows]


def large_result(
    proxy: ServerProcess, dpproxy: Endpoint, direct: Endpoint, rows: int, rounds: int, pause_s: float = 3.0,
) -> LargeResult:
    sql = query(rows)
    result = LargeResult(rows, wire_bytes(rows), {dpproxy.name: [], direct.name: []},
                         endpoint_names=(dpproxy.name, direct.name))
    _read(dpproxy, "SELECT 1")  # dpproxy has a backend connection open before its RSS is read
    result.rss_before = proxy.rss()
    with PeakRss(proxy.pid) as peak:
        for round_ in range(rounds):
            for endpoint in (dpproxy, direct) if round_ % 2 == 0 else (direct, dpproxy):
                result.reads[endpoint.name].append(_read(endpoint, sql))
    result.peak_rss, result.peak_method = peak.bytes, peak.method
    result.rss_after = proxy.rss()
    result.slow = _slow_client(proxy, dpproxy, sql, pause_s)
    return result


class PeakRss:
    """The peak resident memory of process ``pid`` between entering and leaving the block:
    ``VmHWM`` after a reset through ``clear_refs``, or the largest RSS sampled every 50 ms
    when that file is not writable (another user's process)."""

    def __init__(self, pid: int):
        self.pid = pid
        self.bytes = 0
        self.method = ""
        self._process = psutil.Process(pid)
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    def __enter__(self) -> PeakRss:
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # VmHWM := the current RSS
            self.method = "VmHWM after clear_refs"
        except OSError:
            self.method = "largest RSS sampled every 50 ms"
            self.bytes = self._process.memory_info().rss
            self._sampler = threading.Thread(target=self._sample, daemon=True)
            self._sampler.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._sampler is not None:
            self._stop.set()
            self._sampler.join()
        self.bytes = self.current()

    def current(self) -> int:
        """The peak so far."""
        if self._sampler is None:
            return _status_kb(self.pid, "VmHWM") * 1024
        return max(self.bytes, self._process.memory_info().rss)

    def _sample(self) -> None:
        while not self._stop.wait(_SAMPLE_S):
            try:
                self.bytes = max(self.bytes, self._process.memory_info().rss)
            except psutil.Error:
                return


def _slow_client(proxy: ServerProcess, endpoint: Endpoint, sql: str, pause_s: float) -> SlowClient:
    pgconn = _connect(endpoint)
    try:
        rss_before = proxy.rss()
        with PeakRss(proxy.pid) as peak:
            _send(pgconn, sql)
            time.sleep(pause_s)  # nothing read: the rows wait in the sockets, in dpproxy, in PostgreSQL
            during_pause = peak.current()
            read = _read_all(pgconn, time.perf_counter())
    finally:
        pgconn.finish()
    return SlowClient(pause_s, rss_before, during_pause, peak.bytes, read)


def _read(endpoint: Endpoint, sql: str) -> Read:
    pgconn = _connect(endpoint)
    try:
        started = time.perf_counter()
        _send(pgconn, sql)
        return _read_all(pgconn, started)
    finally:
        pgconn.finish()


def _connect(endpoint: Endpoint) -> PGconn:
    pgconn = pq.PGconn.connect(endpoint.conninfo(connect_timeout="30").encode())
    if pgconn.status != pq.ConnStatus.OK:
        message = pgconn.get_error_message()
        pgconn.finish()
        raise RuntimeError(f"cannot connect to {endpoint.name}: {message!r}")
    pgconn.nonblocking = 1  # waits happen in select(), outside the GIL
    return pgconn


def _send(pgconn: PGconn, sql: str) -> None:
    pgconn.send_query(sql.encode())
    pgconn.set_chunked_rows_mode(CHUNK_ROWS)
    while pgconn.flush():
        select.select([], [pgconn.socket], [], _WAIT_S)


def _read_all(pgconn: PGconn, started: float) -> Read:
    """Every result of the statement, rows counted and discarded, to the end."""
    rows, sqlstate = 0, None
    while True:
        while True:
            pgconn.consume_input()
            if not pgconn.is_busy():
                break
            if not select.select([pgconn.socket], [], [], _WAIT_S)[0]:
                raise TimeoutError(f"no result in {_WAIT_S:g}s")
        res = pgconn.get_result()
        if res is None:
            return Read(time.perf_counter() - started, rows, sqlstate)
        if res.status in (pq.ExecStatus.TUPLES_CHUNK, pq.ExecStatus.SINGLE_TUPLE, pq.ExecStatus.TUPLES_OK):
            rows += res.ntuples
        elif res.status == pq.ExecStatus.FATAL_ERROR:
            code = res.error_field(pq.DiagnosticField.SQLSTATE)
            sqlstate = code.decode() if code else "?"
        res.clear()


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)

