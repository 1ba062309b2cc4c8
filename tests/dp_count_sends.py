"""The ways a client sends one DP COUNT: for tests that check a behaviour in every protocol."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

__all__ = ["Send", "count_sends"]

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
