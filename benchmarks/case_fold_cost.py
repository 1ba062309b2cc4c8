"""What a byte of a text value costs ``lower()``, ``upper()`` and ILIKE under each kind of collation.

Not a timed test: the measure behind ``COLLATED_CASE_FOLD_WORK`` (rewriter/text_bounds.py,
``case_fold_work``). Case folding runs the collation's code: libc's ``towlower`` under ``C.UTF-8``
(the work limit's unit: ``lower()`` there is 51 units a byte), ICU's case mapping (through UTF-16)
under an ICU collation, and on PostgreSQL 17 and 18 the builtin provider's tables. For each
collation of :data:`COLLATIONS` (those the server has) this fills ``cf_base`` with ``--rows`` rows of
8-character values and ``cf_plus`` with the same rows of ``--long`` characters of ``--letters``
repeated (``Aßé``: ASCII and two-byte Latin letters, ``ß`` changing length under full case mapping),
runs each statement on both, alternating, and reports (neighbour − base) / rows / the bytes the
long values add, in ns and in units (``lower()`` under libc's ``C.UTF-8``, measured in the same run).

Run from the repository root (a server with ICU: Debian's 15, the default)::

    python -m benchmarks.case_fold_cost --rows 3000 --long 1000 --repeats 21 --letters 'Aßé'

``--libc en_US.UTF-8`` measures a libc locale too (a collation of that name, made if missing): one
the machine has (``locale -a``), or one compiled with ``localedef -i en_US -f UTF-8 DIR/en_US.UTF-8``
and the server started with ``LOCPATH=DIR`` in its environment (the started server inherits it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from benchmarks.raw_conjunct_cost import print_per_byte
from benchmarks.row_cost import alternating_runs, measuring_session, on_server

COLLATIONS = ("C", "und-x-icu", "en-x-icu", "pg_c_utf8", "pg_unicode_fast")
"""libc's ``C`` (folds ASCII only), ICU's root and English locales, PostgreSQL 17's builtin
``C.UTF-8`` (simple case mapping) and 18's ``PG_UNICODE_FAST`` (full case mapping)."""
STATEMENTS = {
    "lower(v) = 'x'": "SELECT count(*) FROM {table} WHERE lower(v) = 'x'",
    "upper(v) = 'x'": "SELECT count(*) FROM {table} WHERE upper(v) = 'x'",
    "v ILIKE '%z'": "SELECT count(*) FROM {table} WHERE v ILIKE '%z'",
}
CALIBRATION = "SELECT count(*) FROM {table} WHERE lower(c) = 'x'"
LOWER_UNITS = 51  # what rewriter/text_bounds.py weighs lower(t) = 'x' a byte (CASE_FOLD_WORK + COMPARISON_WORK)


def _tables(conn: psycopg.Connection[Any], collation: str, rows: int, long: int, letters: str) -> int:
    """``cf_base`` and ``cf_plus``, ``v`` under ``collation`` and ``c`` under libc's ``C.UTF-8``; the
    bytes a long value holds more than a short one."""
    for table, size in (("cf_base", 8), ("cf_plus", long)):
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f'CREATE TABLE {table} (id int, c text COLLATE "C.utf8", v text COLLATE "{collation}")')
        conn.execute(f"ALTER TABLE {table} ALTER COLUMN c SET STORAGE PLAIN, ALTER COLUMN v SET STORAGE PLAIN")
        conn.execute(f"INSERT INTO {table} SELECT i, x, x FROM (SELECT i, left(repeat(%s, {size}), {size}) AS x "
                     f"FROM generate_series(1, {rows}) i) s", [letters])
        conn.execute(f"VACUUM ANALYZE {table}")
    row = conn.execute("SELECT (SELECT octet_length(v) FROM cf_plus LIMIT 1) - (SELECT octet_length(v) FROM cf_base LIMIT 1)"
                       ).fetchone()
    assert row is not None
    return int(row[0])


def _per_byte(conn: psycopg.Connection[Any], sql: str, rows: int, span: int, repeats: int) -> float:
    base, plus = alternating_runs(conn, (sql.format(table="cf_base"), sql.format(table="cf_plus")), repeats)
    return statistics.median(p - b for b, p in zip(base, plus)) * 1e6 / rows / span


def measure(dsn: str, rows: int, long: int, repeats: int, letters: str,
            libc: Sequence[str] = ()) -> list[tuple[str, str, float, float]]:
    """Per collation the server has (and libc locale of ``libc``) and statement: ns a byte, and in work units."""
    out = []
    with psycopg.connect(dsn, autocommit=True) as admin:
        for locale in libc:
            admin.execute(f'CREATE COLLATION IF NOT EXISTS "{locale}" (provider = libc, locale = \'{locale}\')')
        known = {name for (name,) in admin.execute("SELECT collname::text FROM pg_collation").fetchall()}
        for collation in (name for name in (*COLLATIONS, *libc) if name in known):
            span = _tables(admin, collation, rows, long, letters)
            with measuring_session(dsn) as conn:
                unit = _per_byte(conn, CALIBRATION, rows, span, repeats) / LOWER_UNITS
                for name, sql in STATEMENTS.items():
                    ns = _per_byte(conn, sql, rows, span, repeats)
                    out.append((collation, name, ns, ns / unit))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=3_000)
    parser.add_argument("--long", type=int, default=1_000, help="characters of each neighbour row's value")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--letters", default="Aßé", help="the characters the long values repeat")
    parser.add_argument("--dsn", help="a superuser DSN of a PostgreSQL with ICU (default: start one, --pg)")
    parser.add_argument("--pg", type=int, choices=(15, 16, 17, 18), default=15)
    parser.add_argument("--libc", action="append", default=[], metavar="LOCALE",
                        help="a libc locale to measure too (module docstring)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    results = on_server(args.dsn, args.pg, "case-fold-cost",
                        lambda dsn: measure(dsn, args.rows, args.long, args.repeats, args.letters, args.libc))
    print(f"{args.rows:,} rows of 8 characters against the same of {args.long:,} ({args.letters!r} repeated), "
          f"PostgreSQL {args.pg}; median of {args.repeats} paired alternating runs each; "
          f"{time.monotonic() - started:.0f} s in all.\n")
    print_per_byte(results, "statement", "units a byte (lower() under C.UTF-8 = 51)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
