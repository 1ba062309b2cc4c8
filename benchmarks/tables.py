"""The benchmark database: Adult-shaped tables of the requested sizes and the service role.

A table of n ≤ 48,842 rows is ``proxy.demo.data.load_adult``'s deterministic table of n rows.
A larger one is built inside PostgreSQL from the 48,842-row table (much faster than generating
it in Python): copy g = 0, 1, 2, … of every row, in the base table's physical order, with

    age            → 17 + (age − 17 + g) mod 74        (stays in 17–90)
    hours_per_week → 1 + (hours_per_week − 1 + g) mod 99 (stays in 1–99)
    fnlwgt         → fnlwgt + g

and every other column unchanged, until n rows. The same n gives the same rows every time.
A table that already holds n rows is kept (``--data-dir`` reuses a loaded database).
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from proxy.demo.data import ADULT_COLUMNS, ADULT_ROWS, load_adult
from proxy.demo.embedded import SERVICE_ROLE

from .postgres import ADMIN, BenchPostgres

__all__ = ["prepare_database", "table_name"]

_SHIFTED = {
    "age": "17 + (b.age - 17 + g) %% 74",
    "hours_per_week": "1 + (b.hours_per_week - 1 + g) %% 99",
    "fnlwgt": "b.fnlwgt + g",
}


def table_name(rows: int) -> str:
    return f"adult_{rows}"


def prepare_database(postgres: BenchPostgres, database: str, sizes: list[int]) -> None:
    """Create ``database``, the service role, and one Adult-shaped table per size; grant SELECT."""
    with psycopg.connect(postgres.endpoint(ADMIN, "postgres", tcp=False).uri(), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (SERVICE_ROLE,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(SERVICE_ROLE)))
    uri = postgres.endpoint(ADMIN, database, tcp=False).uri()
    for rows in sorted(sizes):
        if rows <= ADULT_ROWS:
            load_adult(uri, table_name(rows), rows)
        else:
            load_adult(uri, table_name(ADULT_ROWS), ADULT_ROWS)
            _replicate(uri, table_name(ADULT_ROWS), table_name(rows), rows)
    with psycopg.connect(uri, autocommit=True) as conn:
        tables = sql.SQL(", ").join(sql.Identifier(table_name(rows)) for rows in sizes)
        conn.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(tables, sql.Identifier(SERVICE_ROLE)))


def _replicate(uri: str, base: str, target: str, rows: int) -> None:
    columns = sql.SQL(", ").join(
        sql.SQL(_SHIFTED.get(name, f"b.{name}")) for name, _ in ADULT_COLUMNS
    )
    base_id, target_id = sql.Identifier(base), sql.Identifier(target)
    with psycopg.connect(uri, autocommit=True) as conn:
        if _holds(conn, target, rows):
            return
        with conn.transaction():
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(target_id))
            conn.execute(sql.SQL("CREATE TABLE {} (LIKE {})").format(target_id, base_id))
            for g in range(-(-rows // ADULT_ROWS)):
                conn.execute(
                    sql.SQL("INSERT INTO {} SELECT {} FROM {} AS b, (SELECT %(g)s::integer AS g) AS c "
                            "ORDER BY b.ctid LIMIT %(n)s").format(target_id, columns, base_id),
                    {"g": g, "n": min(ADULT_ROWS, rows - g * ADULT_ROWS)},
                )
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(target_id))


def _holds(conn: psycopg.Connection, table: str, rows: int) -> bool:
    if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (None,):
        return False
    count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
    return count is not None and count[0] == rows
