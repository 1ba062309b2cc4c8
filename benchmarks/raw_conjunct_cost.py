"""What a byte of one row's value costs the raw conjunct of an equality on a column of a declared size.

Not a timed test: the measure behind the weight of that conjunct (rewriter/single_reads.py,
``raw_read``). A WHERE's top-level ``=`` or IN list on a ``varchar(n)``/``char(n)`` column gets a raw
conjunct beside its bounded term, so that a plain index serves it (rewriter/raw_equality.py): a list
of literals or of parameters is ``"raw N" = ANY (ARRAY[…])``, which PostgreSQL hashes, one parameter
``"raw N" = $1``. The hash reads each row's raw value whole, through the collation's code where the
collation is nondeterministic (the value's ICU sort key, as a categorical key's hash does). For each
collation of :data:`COLLATIONS` this fills ``rq_base`` with ``--rows`` rows of a one-character
``varchar(64)`` and ``rq_plus`` with the same rows holding 64 characters (an ``A`` and ``a`` after it,
which a level-by-level comparison reads whole), plans each statement of :data:`STATEMENTS` with
dpproxy's planner (``answer_quantum_ms`` set, so no work limit refuses it and the SQL is what a table
with or without one gets), runs its backend SQL on both tables, alternating (a parameter bound as
dpproxy's backend sessions plan it, with its value), and reports (neighbour − base) / rows / 63
bytes, in ns and in the work limit's units (``lower()``'s cost a byte / 51, measured in the same run,
as benchmarks/collation_cost.py does).

Run from the repository root (a server with ICU: Debian's 15, the default)::

    python -m benchmarks.raw_conjunct_cost --rows 4000 --repeats 21
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import psycopg

from benchmarks.row_cost import alternating_runs, measuring_session, on_server
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql

COLLATIONS = {"C": (True, True), "und-x-icu": (True, False), "rq_ci": (False, False)}
"""Each collation measured, and its column's facts (``deterministic_collation``, ``byte_order``):
libc's ``C``, ICU's root locale (deterministic), ICU ``und-u-ks-level2`` (nondeterministic)."""
_NEAR = "a" * (64 - 1)  # the literals share all but the last character with the neighbour's values
STATEMENTS = {
    "v = 'a…ab' (hashed list of one)": (f"SELECT count(*) FROM {{table}} WHERE v = '{_NEAR}b'", ()),
    "v IN ($1, $2) (hashed list)": ("SELECT count(*) FROM {table} WHERE v IN ($1, $2)", (f"{_NEAR}b", f"{_NEAR}c")),
    "v = $1 (one comparison)": ("SELECT count(*) FROM {table} WHERE v = $1", (f"{_NEAR}b",)),
    "v = 'x' (literal unlike the values)": ("SELECT count(*) FROM {table} WHERE v = 'x'", ()),
    "GROUP BY v (a categorical key's hash, for comparison)": ("SELECT v, count(*) FROM {table} GROUP BY v", ()),
}
"""Each statement and its parameters' values. No literal equals a value under the case-insensitive
collation (``A`` then ``a`` × 63 is unlike ``a`` × 63 then ``b``), so no row of either table matches."""
CALIBRATION = "SELECT count(*) FROM {table} WHERE lower(t COLLATE \"default\") = 'x'"
LOWER_UNITS = 51  # what rewriter/text_bounds.py weighs lower(t) = 'x' a byte (CASE_FOLD_WORK + COMPARISON_WORK)
LONG = 64


def _tables(dsn: str, collation: str, rows: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            conn.execute("CREATE COLLATION IF NOT EXISTS rq_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)")
        except psycopg.errors.FeatureNotSupported:  # built without ICU: the collation is C's
            conn.execute('CREATE COLLATION IF NOT EXISTS rq_ci FROM "C"')
        for table, size in (("rq_base", 1), ("rq_plus", LONG)):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f'CREATE TABLE {table} (id int, v varchar({LONG}) COLLATE "{collation}", t text COLLATE "C")')
            conn.execute(f"INSERT INTO {table} SELECT i, x, x FROM (SELECT i, 'A' || repeat('a', {size - 1}) AS x "
                         f"FROM generate_series(1, {rows}) i) s")
            conn.execute(f"VACUUM ANALYZE {table}")


def _pair(statement: str, params: tuple[str, ...], deterministic: bool, byte_order: bool) -> tuple[str, str]:
    """dpproxy's backend SQL of ``statement`` on each table, its parameters written as the typed
    values a custom plan holds."""
    columns = (ColumnInfo("id", 23, -1, 1, None), ColumnInfo("t", 25, -1, 3, None),
               ColumnInfo("v", 1043, LONG + 4, 2, ColumnPolicy(categories=("a", "b"), group_by=True),
                          deterministic_collation=deterministic, byte_order=byte_order))
    out = []
    for table in ("rq_base", "rq_plus"):
        relation = Relation(1, "public", table, TablePolicy(epsilon=1.0, answer_quantum_ms=1),
                            {column.name: column for column in columns})
        sql = backend_sql(plan_aggregate_query(statement.format(table=table), relation), 0)
        for number, value in reversed(list(enumerate(params, start=1))):
            sql = sql.replace(f"${number}", f"CAST('{value}' AS pg_catalog.varchar)")
        out.append(sql)
    return out[0], out[1]


def _per_byte(conn: psycopg.Connection[object], pair: tuple[str, str], rows: int, repeats: int) -> float:
    base, plus = alternating_runs(conn, pair, repeats)
    return statistics.median(p - b for b, p in zip(base, plus)) * 1e6 / rows / (LONG - 1)


def measure(dsn: str, rows: int, repeats: int) -> list[tuple[str, str, float, float]]:
    """Per collation and statement: ns a byte of one row's value, and in work units."""
    out = []
    for collation, (deterministic, byte_order) in COLLATIONS.items():
        _tables(dsn, collation, rows)
        with measuring_session(dsn) as conn:
            unit = _per_byte(conn, (CALIBRATION.format(table="rq_base"), CALIBRATION.format(table="rq_plus")),
                             rows, repeats) / LOWER_UNITS
            for name, (statement, params) in STATEMENTS.items():
                ns = _per_byte(conn, _pair(statement, params, deterministic, byte_order), rows, repeats)
                out.append((collation, name, ns, ns / unit))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=4_000)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--dsn", help="a superuser DSN of a PostgreSQL with ICU (default: start one, --pg)")
    parser.add_argument("--pg", type=int, choices=(15, 16, 17, 18), default=15)
    args = parser.parse_args(argv)
    started = time.monotonic()
    results = on_server(args.dsn, args.pg, "raw-conjunct-cost", lambda dsn: measure(dsn, args.rows, args.repeats))
    print(f"{args.rows:,} rows of a 1-character varchar({LONG}) against the same of {LONG} characters, PostgreSQL "
          f"{args.pg}; median of {args.repeats} paired alternating runs each; {time.monotonic() - started:.0f} s in all.\n")
    print_per_byte(results, "statement (dpproxy's backend SQL)", "units a byte")
    return 0


def print_per_byte(results: Sequence[tuple[str, str, float, float]], statement: str, units: str) -> None:
    """A table of per-byte figures: per collation and statement, ns and work units a byte."""
    print(f"| collation | {statement} | ns a byte of a row | {units} |")
    print("|---|---|---:|---:|")
    for collation, name, ns, in_units in results:
        print(f"| {collation} | {name} | {ns:.3f} | {in_units:.1f} |")


if __name__ == "__main__":
    sys.exit(main())
