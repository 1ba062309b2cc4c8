"""What an analyst sees of a statement on one table but the noised values, and neighbouring
tables to compare it on: the attack tests' check that one row changes none of it."""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Sequence

import psycopg

NUMBER = re.compile(r"-?\d+(\.\d+)?(e[+-]?\d+)?", re.IGNORECASE)
_BINARY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"


def binary_copy_cells(data: bytes) -> tuple[tuple[bool, ...] | str, ...]:
    """Binary COPY data (all of it, or one CopyData message) reduced as the attack tests reduce
    text lines: each tuple's cells NULL or not, and where the file header and the trailer stand."""
    out: list[tuple[bool, ...] | str] = []
    pos = 0
    if data.startswith(_BINARY_SIGNATURE):
        (extension,) = struct.unpack_from("!i", data, len(_BINARY_SIGNATURE) + 4)
        out.append("header")
        pos = len(_BINARY_SIGNATURE) + 8 + extension
    while pos < len(data):
        (count,), pos = struct.unpack_from("!h", data, pos), pos + 2
        if count == -1:
            out.append("trailer")
            continue
        cells = []
        for _ in range(count):
            (size,), pos = struct.unpack_from("!i", data, pos), pos + 4
            cells.append(size == -1)
            pos += max(size, 0)
        out.append(tuple(cells))
    return tuple(out)


def masked_detail(detail: str | None, table: str) -> str:
    """An error's DETAIL compared whole but for ``table``'s name, except the line that is
    dpproxy's charge notice (an error after the charge carries it there): its numbers are the
    budget left and the noise's scale, masked as in a notice."""
    return "\n".join(NUMBER.sub("#", line) if line.startswith("dpproxy: ε charged") else line
                      for line in (detail or "").replace(table, "T").split("\n"))


def masked_outcome(conn: psycopg.Connection, sql: str, table: str, params: tuple[object, ...] | None = None,
                   keys: int = 0) -> tuple[object, ...]:
    """``sql`` (``{t}`` standing for ``table``) run on ``conn``: an error's ("error", SQLSTATE,
    message, hint, DETAIL), or ("answer", the columns, the number of rows, their widths, the first
    ``keys`` values of each row as text, the tag, the notices (message, DETAIL and HINT) with
    numbers masked)."""
    notices: list[str] = []

    def handler(diag: psycopg.errors.Diagnostic) -> None:
        notices.append("\x1f".join(text or "" for text in (diag.message_primary, diag.message_detail,
                                                             diag.message_hint)))

    conn.add_notice_handler(handler)
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql.replace("{t}", table), params)
            columns = tuple((c.name, c.type_code) for c in cursor.description or ())
            rows = cursor.fetchall() if cursor.description else []
            return ("answer", columns, len(rows), frozenset(len(row) for row in rows),
                    tuple(tuple(map(str, row[:keys])) for row in rows), cursor.statusmessage,
                    tuple(NUMBER.sub("#", n.replace(table, "T")) for n in notices))
    except psycopg.Error as exc:
        return ("error", exc.sqlstate, (exc.diag.message_primary or "").replace(table, "T"),
                (exc.diag.message_hint or "").replace(table, "T"), masked_detail(exc.diag.message_detail, table))
    finally:
        conn.remove_notice_handler(handler)


def same_on_neighbours(conn: psycopg.Connection, sql: str, tables: Sequence[str],
                       spent: Callable[[psycopg.Connection], float], keys: int = 0,
                       params: tuple[object, ...] | None = None) -> tuple[object, ...]:
    """``sql``'s :func:`masked_outcome` on each of ``tables`` (the base table first), asserting it
    is the same on all and that an error charged nothing (``spent``: the user's spent ε)."""
    base: tuple[object, ...] = ()
    for name in tables:
        before = spent(conn)
        outcome = masked_outcome(conn, sql, name, params, keys=keys)
        if name == tables[0]:
            base = outcome
        assert outcome == base, (name, sql, base)
        assert outcome[0] == "answer" or spent(conn) == before, (name, sql, outcome)
    return base


def create_neighbours(admin_dsn: str, base: str, neighbours: dict[str, str], ddl: str, rows: str) -> None:
    """Table ``base`` with ``rows``, and each of ``neighbours`` with the same rows plus its own one."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for name in (base, *neighbours):
            conn.execute(f"DROP TABLE IF EXISTS {name}")
            conn.execute(f"CREATE TABLE {name} {ddl}")
            conn.execute(f"INSERT INTO {name} {rows}")
            conn.execute(f"GRANT SELECT ON {name} TO dpproxy_service")
        for name, row in neighbours.items():
            conn.execute(f"INSERT INTO {name} VALUES {row}")
