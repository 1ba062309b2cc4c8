"""A lock a DP statement waits for only after its charge, where tests place their faults.

A DP statement takes the locks of its table, the table's partitions and indexes and a view's
tables before its charge (``proxy/serving/relation_locks.py``): a test holding one of those
makes the statement fail uncharged, before anything runs. A statement opens the table's TOAST
relation and index only to read a long value stored apart, which no step before the charge
does: a held ``REINDEX`` of that index (``hold_toast_index``) makes a statement reading such a
value (``SUM(amount)``, ``amount > 0`` on a table of ``create_toasted``) wait after its charge,
on the backend, with the table held. A long number, not a long text: dpproxy reads a text's
length first, which PostgreSQL takes from the TOAST pointer, and leaves a long one out.
"""

from __future__ import annotations

from typing import Any

import psycopg

__all__ = ["LONG_NUMBER", "create_toasted", "hold_toast_index", "toast_index", "with_toasted"]

LONG_NUMBER = "('1' || pg_catalog.string_agg(lpad((random() * 1e8)::int8::text, 8, '0'), ''))::numeric"
"""An aggregate over ``generate_series(1, 2500) g``: a number of 20,001 random digits (~10 kB,
incompressible), which PostgreSQL stores apart, in the TOAST relation."""


def with_toasted(policy: str, table: str, extra: str = "", braces: int = 2) -> str:
    """``policy`` (a policy's text, its braces doubled for ``str.format`` if ``braces`` is 2)
    with ``table``, a ``create_toasted`` table, protected at ε 1 (``extra``: more of its lines)."""
    columns = "{{bounds: [0, 100]}}", "{{bounds: [0, 10]}}"
    if braces == 1:
        columns = tuple(c.replace("{{", "{").replace("}}", "}") for c in columns)
    entry = (f"  {table}:\n    access: protected\n    epsilon: 1.0\n{extra}    columns:\n"
             f"      age: {columns[0]}\n      amount: {columns[1]}\n")
    assert "tables:\n" in policy
    return policy.replace("tables:\n", "tables:\n" + entry, 1)


def create_toasted(admin: psycopg.Connection[Any], table: str, grantee: str = "dpproxy_service") -> None:
    """(Re)create ``table`` (age integer, amount numeric): 1,000 short rows and one whose amount
    has 20,000 random digits (~10 kB, incompressible), stored apart in the TOAST relation."""
    admin.execute(f"DROP TABLE IF EXISTS {table}")
    admin.execute(f"CREATE TABLE {table} (age integer, amount numeric)")
    admin.execute(f"INSERT INTO {table} SELECT i % 90, 1 FROM generate_series(1, 1000) i")
    admin.execute(f"INSERT INTO {table} SELECT 50, {LONG_NUMBER} FROM generate_series(1, 2500) g")
    admin.execute(f"GRANT SELECT ON {table} TO {grantee}")


def toast_index(conn: psycopg.Connection[Any], table: str) -> str:
    """The qualified name of ``table``'s TOAST index."""
    toast = conn.execute("SELECT t.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_class t "
                         "ON t.oid = c.reltoastrelid WHERE c.oid = %s::regclass", (table,)).fetchone()
    assert toast is not None, f"{table} has no TOAST relation"
    return f"pg_toast.{toast[0]}_index"


def hold_toast_index(admin: psycopg.Connection[Any], table: str) -> None:
    """In ``admin``'s new transaction (left open), ``REINDEX`` the TOAST index of ``table``: an
    ACCESS EXCLUSIVE lock on it until that transaction ends (replayed on a hot standby)."""
    admin.execute("BEGIN")
    admin.execute(f"REINDEX INDEX {toast_index(admin, table)}")
