"""The ways a client sends one DP COUNT: for tests that check a behaviour in every protocol, and
what one meets while it waits before its charge (a lock, a serializable snapshot)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import pytest

from tests.conftest import spent_epsilon

__all__ = ["Send", "answered_once_released", "cancelled_while_waiting", "count_sends"]

Send = Callable[[psycopg.Connection, int], None]
"""Send ``SELECT COUNT(*) FROM <table> WHERE v < cutoff`` on the connection, its rows read."""


def count_sends(table: str) -> dict[str, Send]:
    """By name: as a simple Query, Parse/Bind/Execute with a parameter, a COPY of it, a simple
    Query inside a transaction block (rolled back after), and two in one pipeline (cutoff and
    cutoff + 1)."""
    sql = f"SELECT COUNT(*) FROM {table} WHERE v < "

    def simple(conn: psycopg.Connection, cutoff: int) -> None:
        conn.execute(f"{sql}{cutoff}").fetchall()

    def extended(conn: psycopg.Connection, cutoff: int) -> None:
        conn.execute(f"{sql}%s", (cutoff,)).fetchall()

    def copied(conn: psycopg.Connection, cutoff: int) -> None:
        with conn.cursor().copy(f"COPY ({sql}{cutoff}) TO STDOUT") as copy:
            b"".join(bytes(data) for data in copy)

    def in_block(conn: psycopg.Connection, cutoff: int) -> None:
        conn.execute("BEGIN")
        try:
            simple(conn, cutoff)
        finally:
            conn.execute("ROLLBACK")

    def pipelined(conn: psycopg.Connection, cutoff: int) -> None:
        with conn.pipeline():
            conn.execute(f"{sql}%s", (cutoff,))
            conn.execute(f"{sql}%s", (cutoff + 1,))

    return {"simple": simple, "extended": extended, "copy": copied, "block": in_block, "pipeline": pipelined}


def answered_once_released(conn: psycopg.Connection, other: psycopg.Connection, sql: str,
                           holder: psycopg.Connection, after_s: float) -> None:
    """``sql``, sent on ``conn`` while ``holder``'s transaction makes it wait before its charge, is
    answered once ``holder`` commits ``after_s`` later, and charged once (``other`` reads the budget)."""
    spent = spent_epsilon(other)
    answered: list[object] = []

    def ask() -> None:
        answered.append(conn.execute(sql).fetchone())

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    time.sleep(after_s)
    holder.commit()
    asking.join(10)
    assert len(answered) == 1 and answered[0] is not None
    assert spent_epsilon(other) == pytest.approx(spent + 1.0)


def cancelled_while_waiting(conn: psycopg.Connection, other: psycopg.Connection, sql: str,
                            after_s: float) -> psycopg.Error:
    """The failure of ``sql`` on ``conn``, cancelled by the client ``after_s`` into a wait before
    its charge: 57014 for the user's request, not the timeout, and uncharged."""
    spent = spent_epsilon(other)
    timer = threading.Timer(after_s, conn.cancel_safe)  # cancel() holds the GIL the proxy needs
    timer.start()
    with pytest.raises(psycopg.errors.QueryCanceled) as failed:
        conn.execute(sql)
    timer.join()
    assert spent_epsilon(other) == spent
    assert "user request" in str(failed.value.diag.message_primary)  # not the timeout
    return failed.value
