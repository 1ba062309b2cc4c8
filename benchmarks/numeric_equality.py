"""Conditions on an indexed numeric of no declared precision: dpproxy's backend SQL against the direct
statement, with and without ``answer_quantum_ms``.

Not a timed test: a measuring tool for rewriter/raw_equality.py's numeric part. A DP statement reads
such a column through its stored-form bound (rewriter/text_bounds.py), which no index can hold, so
without a quantum ``n = 5`` is a sequential scan; with one, the comparison is also made on the raw
column, which a B-tree index on ``n`` serves. Table ``ne_<rows>`` (``--rows``): ``id``, ``n numeric``
of ``(g % 1000) / 10.0`` (1,000 rows a value), ``v``, a B-tree index on ``n``. For each statement of
:data:`STATEMENTS` it times the statement run directly and the backend SQL dpproxy sends without a
quantum (the bounded value) and with one (the raw column beside it), alternating, with the scans
each plan makes. Times as benchmarks/text_equality.py's: PostgreSQL's ``Execution Time``, the
median of ``--repeats`` runs after one warm-up.

Run from the repository root::

    python -m benchmarks.numeric_equality --pg 16 --out /tmp/numeric_equality.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

from benchmarks.row_cost import on_server, print_report
from benchmarks.text_equality import backend_of, quantum_policies, timed_plans

__all__ = ["STATEMENTS", "main"]

_MISSING = ", ".join(f"{1000 + i}.5" for i in range(254))  # values no row holds
STATEMENTS: tuple[tuple[str, str], ...] = (
    ("n = 5 (1,000 rows)", "SELECT COUNT(*), SUM(v) FROM {table} WHERE n = 5"),
    ("n IN (256 values, 2 held: 2,000 rows)", f"SELECT COUNT(*), SUM(v) FROM {{table}} WHERE n IN (5, 7.3, {_MISSING})"),
    ("n < 0.5 (5,000 rows)", "SELECT COUNT(*), SUM(v) FROM {table} WHERE n < 0.5"),
    ("n BETWEEN 5 AND 5.2 (3,000 rows)", "SELECT COUNT(*), SUM(v) FROM {table} WHERE n BETWEEN 5 AND 5.2"),
    ("n > 50 (half)", "SELECT COUNT(*), SUM(v) FROM {table} WHERE n > 50"),
    ("n BETWEEN 0 AND 90 (90 %)", "SELECT COUNT(*), SUM(v) FROM {table} WHERE n BETWEEN 0 AND 90"),
)


def measure(dsn: str, rows: int, repeats: int) -> list[str]:
    """The report's table rows for ``ne_<rows>``."""
    table = f"ne_{rows}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute(f"CREATE TABLE {table} (id integer, n numeric, v integer)")
        conn.execute(f"INSERT INTO {table} SELECT g, (g % 1000) / 10.0, g % 100 FROM generate_series(1, {rows}) g")
        conn.execute(f"CREATE INDEX ON {table} (n)")
        conn.execute(f"VACUUM ANALYZE {table}")
    lines = []
    with tempfile.TemporaryDirectory(prefix="dpproxy-numeric-equality-") as directory:
        policies = quantum_policies(dsn, Path(directory), [table])
        for name, template in STATEMENTS:
            statement = template.format(table=table)
            (direct, direct_scan), *forms = timed_plans(
                dsn, [statement, backend_of(policies, statement, True), backend_of(policies, statement, False)], repeats)
            (bounded, bounded_scan), (raw, raw_scan) = forms
            lines.append(f"| {name} | {direct:.2f} ({direct_scan}) | {bounded:.2f} ({bounded_scan}) | "
                         f"{raw:.2f} ({raw_scan}) | {bounded / raw:.1f}× |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--dsn", help="a superuser DSN (default: start a server, --pg)")
    parser.add_argument("--pg", type=int, choices=(15, 16, 17, 18), default=16)
    args = parser.parse_args(argv)
    started = time.monotonic()
    lines = on_server(args.dsn, args.pg, "numeric-equality", lambda dsn: measure(dsn, args.rows, args.repeats))
    text = "\n".join([
        f"PostgreSQL {args.pg}; {args.rows:,} rows, a B-tree index on n; execution time (EXPLAIN ANALYZE, TIMING OFF) "
        f"in ms, median of {args.repeats} runs each, alternating, after one warm-up. "
        f"{time.monotonic() - started:.0f} s in all.", "",
        "| statement (COUNT(*), SUM(v)) | direct ms (scan) | no quantum: bounded ms (scan) | "
        "quantum: raw + bounded ms (scan) | bounded / raw + bounded |",
        "|---|---|---|---|---:|", *lines]) + "\n"
    return print_report(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
