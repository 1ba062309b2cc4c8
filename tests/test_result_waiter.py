"""The backend round trip: one socket registration per connection, libpq's results intact.

Runs against the real PostgreSQL of the suite, on the event loop dpproxy serves on.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import psycopg
import pytest

from proxy.backend.result_waiter import RECHECK_S, NotSent, ResultWaiter
from proxy.serving.event_loop import run


def _with_waiter(dsn: str, body: Callable[[psycopg.AsyncConnection[Any], ResultWaiter], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        waiter = ResultWaiter(conn.pgconn)
        try:
            return await body(conn, waiter)
        finally:
            waiter.detach()
            await conn.close()

    return run(main())


def _value(results: list[Any]) -> bytes | None:
    return results[-1].get_value(0, 0)


def test_results_of_each_request_come_back_in_order(pg_dsn: str) -> None:
    async def body(conn: psycopg.AsyncConnection[Any], waiter: ResultWaiter) -> list[bytes | None]:
        values = []
        for i in range(50):
            values.append(_value(await waiter.round_trip(lambda i=i: conn.pgconn.send_query(f"SELECT {i}".encode()))))
        return values

    assert _with_waiter(pg_dsn, body) == [str(i).encode() for i in range(50)]


def test_a_cancelled_request_is_read_to_its_end_before_the_next_is_sent(pg_dsn: str) -> None:
    async def body(conn: psycopg.AsyncConnection[Any], waiter: ResultWaiter) -> bytes | None:
        slow = asyncio.ensure_future(waiter.round_trip(lambda: conn.pgconn.send_query(b"SELECT pg_sleep(0.3), 'old'")))
        await asyncio.sleep(0.05)
        slow.cancel()
        with pytest.raises(asyncio.CancelledError):
            await slow
        return _value(await waiter.round_trip(lambda: conn.pgconn.send_query(b"SELECT 'new'")))

    assert _with_waiter(pg_dsn, body) == b"new"


def test_psycopg_may_drive_the_connection_while_the_waiter_is_detached(pg_dsn: str) -> None:
    async def body(conn: psycopg.AsyncConnection[Any], waiter: ResultWaiter) -> tuple[Any, ...]:
        first = _value(await waiter.round_trip(lambda: conn.pgconn.send_query(b"SELECT 1")))
        waiter.detach()
        async with conn.cursor() as cur:
            await cur.execute("SELECT %s::int[]", ([2, 3],))
            middle = (await cur.fetchone())[0]  # type: ignore[index]
        waiter.attach()
        last = _value(await waiter.round_trip(lambda: conn.pgconn.send_query(b"SELECT 4")))
        return first, middle, last

    assert _with_waiter(pg_dsn, body) == (b"1", [2, 3], b"4")


def test_an_error_result_is_returned_and_the_connection_stays_usable(pg_dsn: str) -> None:
    async def body(conn: psycopg.AsyncConnection[Any], waiter: ResultWaiter) -> tuple[Any, ...]:
        failed = await waiter.round_trip(lambda: conn.pgconn.send_query(b"SELECT 1/0"))
        after = _value(await waiter.round_trip(lambda: conn.pgconn.send_query(b"SELECT 'ok'")))
        return failed[-1].status, failed[-1].error_field(psycopg.pq.DiagnosticField.SQLSTATE), after

    status, sqlstate, after = _with_waiter(pg_dsn, body)
    assert status == psycopg.pq.ExecStatus.FATAL_ERROR and sqlstate == b"22012" and after == b"ok"


def test_a_terminated_backend_fails_this_and_every_later_request(pg_dsn: str) -> None:
    async def body(conn: psycopg.AsyncConnection[Any], waiter: ResultWaiter) -> list[str]:
        pid = _value(await waiter.round_trip(lambda: conn.pgconn.send_query(b"SELECT pg_backend_pid()")))
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (int(pid or 0),))
        await asyncio.sleep(0.2)  # the loss is noticed while idle, from the readiness callback
        failures = []
        for _ in range(2):
            try:
                results = await waiter.round_trip(lambda: conn.pgconn.send_query(b"SELECT 1"))
            except NotSent as exc:  # never sent, and says why
                failures.append(f"not sent: {type(exc.__cause__).__name__}")
            else:
                failures.append(f"answered {results[-1].status!r}")
        return failures

    assert _with_waiter(pg_dsn, body) == ["not sent: OperationalError"] * 2


def test_a_missed_readiness_event_delays_an_answer_by_at_most_the_recheck_interval(pg_dsn: str) -> None:
    async def body(conn: psycopg.AsyncConnection[Any], waiter: ResultWaiter) -> bytes | None:
        await waiter.round_trip(lambda: conn.pgconn.send_query(b"SELECT 1"))  # now watching the socket
        asyncio.get_running_loop().remove_reader(conn.pgconn.socket)  # the event loop loses the watch
        return _value(await asyncio.wait_for(
            waiter.round_trip(lambda: conn.pgconn.send_query(b"SELECT 'answered'")), 3 * RECHECK_S
        ))

    assert _with_waiter(pg_dsn, body) == b"answered"
