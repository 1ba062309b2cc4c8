"""A lock a DP statement waits for only after its charge, where tests place their faults.

A DP statement takes the locks of its table, the table's partitions and indexes and a view's
tables in a lock step sent just before its run, whose failure refunds the charge
(``proxy/serving/relation_locks.py``): a test holding one of those makes the statement fail
uncharged, before its run. A statement opens the table's TOAST relation and index only to read
a long value stored apart, which no lock step does: a held ``REINDEX`` of that index (``hold_toast_index``) makes a statement reading such a
value (``amount IN (1, 2)`` on a table of ``create_toasted``) wait after its charge, on the
backend, with the table held. A value dpproxy reads, stored apart: dpproxy reads a column's
stored size and placement first (``rewriter/text_bounds.py``; a text, a numeric, a column of a
declared size long enough to be stored apart), which PostgreSQL takes from the TOAST pointer, and
leaves a value stored apart unread, however short, in every term. The one read left is the hashed
raw conjunct beside a WHERE's top-level ``=`` or IN on a column of a declared size
(``rewriter/raw_equality.py``), which hashes the raw value once: so the value is in such a column
(``READ_APART_NUMERIC``, ``READ_APART_TEXT``), short enough for its type (~880 digits, ~450
bytes; 64 characters), pushed out of the row by a wide column kept in it (``STORAGE MAIN``)
beside its own ``STORAGE EXTERNAL``, and the statement compares it with ``=`` or IN at the top
of its WHERE.
``LONG_NUMBER`` and ``LONG_TEXT`` in a bounded column are what a statement reads as NULL since then
(tests/test_attack_stop40.py).

That wait depends on dpproxy's SQL reading the value, which the rewriter decides. The *gate*
does not (:func:`create_gate`, :func:`gated`, :func:`hold_gate`): the protected relation is a
view of the table ``WHERE EXISTS (SELECT FROM <gate> WHERE v = '<GATE_VALUE>')``, where the gate
is a table of one text stored apart, ``GATE_VALUE`` itself, named by no policy. PostgreSQL runs
that uncorrelated ``EXISTS`` once, as a one-time filter, when the run first asks for a row, before
it reads any of the table and whatever the statement's own WHERE: ``texteq`` weighs the two sizes
first, from the TOAST pointer, and finding them equal fetches ``v`` from the gate's TOAST relation
through its index, which the held ``REINDEX`` of :func:`hold_gate` blocks. The value is one of
250 bytes, within a table's default ``max_text_bytes``: dpproxy refuses a protected view whose
conditions read a value of any length whole (a range such as ``v >= ''``, an equality with a
longer literal), and accepts an equality with a literal that short, whose read is bounded by it
(``proxy/backend/row_failures.py``). The lock step (under
``LIMIT 0``, ``proxy/serving/relation_locks.py``) asks for no row and so never runs it, whether
its locks end with it or are held to the run. :func:`waiting_at_gate` names the backends
waiting there (``pg_locks``, never a timing). A wait inside a function the view calls
(``pg_advisory_xact_lock_shared``) would not do: dpproxy refuses a protected view that calls a
function it cannot show total (``proxy/backend/row_failures.py``), and a sublink ``EXISTS``
and a built-in text comparison are what it accepts.
"""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg

from policies.model import TablePolicy

__all__ = ["GATE", "GATE_VALUE", "LONG_NUMBER", "LONG_NUMBER_BYTES", "LONG_TEXT", "PAD", "READ_APART_NUMERIC", "READ_APART_TEXT",
           "SHORT_TEXT", "TEXT_MAX_BYTES", "WIDE_PAD", "create_gate", "create_gated", "create_toasted", "gated", "hold_gate",
           "hold_toast_index", "keep_apart", "store_apart", "toast_index", "waiting_at_gate", "with_toasted"]

LONG_NUMBER = "(SELECT ('1' || pg_catalog.string_agg(lpad((random() * 1e8)::int8::text, 8, '0'), ''))::numeric " \
              "FROM generate_series(1, 110) g)"
"""A number of 881 random digits (~450 bytes uncompressed): what ``numeric(1000, 0)`` holds; stored
apart, a DP statement reads it as NULL (``rewriter.text_bounds``), and fetches it only to hash it
for a top-level ``=``/IN on a column of that type (``READ_APART_NUMERIC``)."""

LONG_NUMBER_BYTES = 512
"""The most bytes ``LONG_NUMBER`` takes uncompressed (more than half of them)."""

READ_APART_NUMERIC = "numeric(1000, 0)"
"""A numeric type of a declared precision: a DP statement fetches a value of it stored apart only for
the hashed raw conjunct of a top-level ``=``/IN (``rewriter.raw_equality``)."""

TEXT_MAX_BYTES: int = TablePolicy.model_fields["max_text_bytes"].default
"""A table's default ``max_text_bytes``: the most bytes of a text a DP statement reads."""

LONG_TEXT = "(SELECT substr(pg_catalog.string_agg(md5(random()::text), ''), 1, 250) FROM generate_series(1, 8) g)"
"""250 random hex digits (250 bytes): within a table's default ``max_text_bytes`` (256); stored apart,
a DP statement reads it as NULL (``rewriter.text_bounds``)."""

SHORT_TEXT = "(SELECT substr(pg_catalog.string_agg(md5(random()::text), ''), 1, 64) FROM generate_series(1, 3) g)"
"""64 random hex digits: what ``READ_APART_TEXT`` holds, long enough to be stored apart (more than 24 bytes)."""

READ_APART_TEXT = "varchar(64)"
"""A text type of a declared size within the default ``max_text_bytes``: a DP statement fetches a
value of it stored apart only for the hashed raw conjunct of a top-level ``=``/IN (``rewriter.raw_equality``)."""

PAD = "(SELECT pg_catalog.string_agg(md5(random()::text), '') FROM generate_series(1, 57) g)"
"""1,824 random characters: in a column kept in the row, they leave no room for the long value."""

WIDE_PAD = f"{PAD} || repeat('-', 250)"
"""``PAD`` and 250 characters more: they leave no room for ``SHORT_TEXT`` either."""


def keep_apart(admin: psycopg.Connection[Any], table: str, column: str) -> None:
    """Lay ``table`` out as :func:`store_apart` does, without adding a row: a column ``pad`` kept
    in the row (``STORAGE MAIN``), and ``column`` the one the toaster may move (``STORAGE
    EXTERNAL``). For a neighbour that is to have the same columns and no value stored apart."""
    admin.execute(f"ALTER TABLE {table} ADD COLUMN pad text, ALTER COLUMN pad SET STORAGE MAIN, "
                  f"ALTER COLUMN {column} SET STORAGE EXTERNAL")


def store_apart(admin: psycopg.Connection[Any], table: str, column: str, values: str,
                most: int = LONG_NUMBER_BYTES, pad: str = PAD) -> None:
    """Add to ``table`` one row (``values``, a select list that ends with ``LONG_NUMBER``,
    ``LONG_TEXT`` or ``SHORT_TEXT`` for ``column``, the table's last column) whose value is stored
    apart, in the TOAST relation, uncompressed, in more than half of ``most`` bytes and at most
    ``most`` (``LONG_NUMBER_BYTES``, ``TEXT_MAX_BYTES``, 64): the table is laid out by
    :func:`keep_apart` first. ``pad``: the row's pad (``WIDE_PAD`` for a value too short for
    ``PAD`` to push it out)."""
    keep_apart(admin, table, column)
    admin.execute(f"INSERT INTO {table} SELECT {values}, {pad}")
    toast = toast_index(admin, table).removesuffix("_index")
    chunks = admin.execute(f"SELECT count(*) FROM {toast}").fetchone()
    size = admin.execute(f"SELECT max(pg_catalog.pg_column_size({column})) FROM {table} "
                         f"WHERE pg_catalog.pg_column_compression({column}) IS NULL").fetchone()
    assert chunks is not None and chunks[0] > 0, f"{table}'s long value was not stored apart"
    assert size is not None, f"{table} has no uncompressed {column}"
    assert most // 2 < size[0] <= most, f"{table}'s long value takes {size[0]} bytes"


def with_toasted(policy: str, table: str, extra: str = "", braces: int = 2) -> str:
    """``policy`` (a policy's text, its braces doubled for ``str.format`` if ``braces`` is 2)
    with ``table`` (a ``create_toasted`` table or a ``create_gated`` view: age and amount)
    protected at ε 1 (``extra``: more of its lines)."""
    columns: tuple[str, ...] = ("{{bounds: [0, 100]}}", "{{bounds: [0, 10]}}")
    if braces == 1:
        columns = tuple(c.replace("{{", "{").replace("}}", "}") for c in columns)
    entry = (f"  {table}:\n    access: protected\n    epsilon: 1.0\n{extra}    columns:\n"
             f"      age: {columns[0]}\n      amount: {columns[1]}\n")
    assert "tables:\n" in policy
    return policy.replace("tables:\n", "tables:\n" + entry, 1)


def create_toasted(admin: psycopg.Connection[Any], table: str, grantee: str = "dpproxy_service") -> None:
    """(Re)create ``table`` (age integer, amount ``READ_APART_NUMERIC``): 1,000 short rows and one
    whose amount has 881 random digits, stored apart in the TOAST relation (:func:`store_apart`),
    which a DP statement with ``amount = v`` or ``amount IN (…)`` at the top of its WHERE fetches
    (to hash it) after its charge."""
    admin.execute(f"DROP TABLE IF EXISTS {table}")
    admin.execute(f"CREATE TABLE {table} (age integer, amount {READ_APART_NUMERIC})")
    admin.execute(f"INSERT INTO {table} SELECT i % 90, 1 FROM generate_series(1, 1000) i")
    store_apart(admin, table, "amount", f"50, {LONG_NUMBER}")
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


GATE = "post_charge_gate"
"""The gate table's default name: one text, ``GATE_VALUE``, stored apart, uncompressed."""

GATE_VALUE = "".join(hashlib.md5(str(part).encode()).hexdigest() for part in range(8))[:250]
"""The gate's value, 250 hex digits (250 bytes): short enough (a table's default ``max_text_bytes``
is 256) for a protected view's equality with it to be accepted, long enough to be stored apart
beside ``PAD``."""


def create_gate(admin: psycopg.Connection[Any], gate: str = GATE) -> None:
    """(Re)create ``gate`` (v text, pad text): one row whose ``v`` (``GATE_VALUE``) is stored apart
    in the TOAST relation, uncompressed (:func:`store_apart`). Views made by :func:`gated` are
    dropped with it."""
    admin.execute(f"DROP TABLE IF EXISTS {gate} CASCADE")
    admin.execute(f"CREATE TABLE {gate} (v text)")
    store_apart(admin, gate, "v", f"'{GATE_VALUE}'", most=TEXT_MAX_BYTES)


def gated(admin: psycopg.Connection[Any], view: str, table: str, grantee: str = "dpproxy_service",
          gate: str = GATE) -> None:
    """(Re)create ``view``, every column and row of ``table`` behind the gate (``EXISTS`` over
    ``gate``, made by :func:`create_gate`), readable by ``grantee``: a run on the view waits at
    the gate while :func:`hold_gate` holds it, after its charge; the view computes nothing that
    can fail on a row and reads no value further than a short literal's size, so dpproxy accepts
    it as a protected relation."""
    admin.execute(f"CREATE OR REPLACE VIEW {view} AS SELECT * FROM {table} "
                  f"WHERE EXISTS (SELECT FROM {gate} WHERE {gate}.v = '{GATE_VALUE}')")
    admin.execute(f"GRANT SELECT ON {view} TO {grantee}")


def create_gated(admin: psycopg.Connection[Any], view: str, grantee: str = "dpproxy_service", gate: str = GATE) -> None:
    """(Re)create ``gate`` and ``view``: behind it, a table ``<view>_rows`` (age integer, amount
    numeric) of 1,000 rows, as :func:`create_toasted`'s but with no value stored apart."""
    create_gate(admin, gate)
    admin.execute(f"DROP TABLE IF EXISTS {view}_rows CASCADE")
    admin.execute(f"CREATE TABLE {view}_rows (age integer, amount numeric)")
    admin.execute(f"INSERT INTO {view}_rows SELECT i % 90, 1 FROM generate_series(1, 1000) i")
    gated(admin, view, f"{view}_rows", grantee, gate)


def hold_gate(admin: psycopg.Connection[Any], gate: str = GATE) -> None:
    """Hold ``gate`` shut in ``admin``'s new transaction (left open; ``ROLLBACK`` opens it): every
    run on a view of :func:`gated` then waits at it, after its charge."""
    hold_toast_index(admin, gate)


def waiting_at_gate(observer: psycopg.Connection[Any], gate: str = GATE,
                    role: str = "dpproxy_service") -> list[tuple[int, str]]:
    """The pid and statement of each backend of ``role`` waiting at ``gate`` (pg_stat_activity: for
    a lock, which pg_locks says is the one on the gate's TOAST index, not granted). ``observer`` in
    a transaction sees pg_stat_activity as it first read it: the snapshot is cleared first."""
    observer.execute("SELECT pg_catalog.pg_stat_clear_snapshot()")
    rows = observer.execute(
        "SELECT l.pid, a.query FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid "
        "WHERE l.relation = %s::regclass AND NOT l.granted AND a.wait_event_type = 'Lock' AND a.usename = %s",
        (toast_index(observer, gate), role)).fetchall()
    return [(int(pid), str(query)) for pid, query in rows]
