"""Whether rewriter/sort_memory.py's bound covers what PostgreSQL's sorts and hash tables take.

Not a timed test: a measuring tool for the bound's constants (``ROW_BYTES`` a row, at most one
row per ``MIN_ROW_BYTES`` of the relation). For tables whose rows are as narrow as a page allows
(NULLs, short distinct values), of 256-byte values and of several columns, it runs the forms of
dpproxy's backend SQL that sort or hash every row (the ``COUNT(DISTINCT)`` shuffle and value
sort, a GROUP BY of a value per row by hash, with six aggregates, and by sort) under a
``work_mem`` no table here reaches, and prints the largest ``Memory`` a node reported in
``EXPLAIN (ANALYZE)`` (what PostgreSQL counts against ``work_mem``) beside the bound read from
the table's size: the bound must be above it. 58,983 rows put a hash table just past a doubling
of its buckets (0.9 × 2^16 + 1).

Run from the repository root::

    python -m benchmarks.sort_memory_bound --rows 58983,200000
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence

import psycopg

from benchmarks.row_cost import on_server
from rewriter.sort_memory import sort_memory_kb_sql

TABLES = {  # name: (columns, rows)
    "NULL text": ("(t text)", "SELECT NULL FROM generate_series(1, {rows})"),
    "distinct int": ("(t int)", "SELECT i FROM generate_series(1, {rows}) i"),
    "short text": ("(t text)", "SELECT i::text FROM generate_series(1, {rows}) i"),
    "255-byte text": ("(t text)", "SELECT left(repeat(md5(i::text), 8), 255) FROM generate_series(1, {rows}) i"),
    "five columns": ("(i int, n numeric, x float8, t text, u text)",
                     "SELECT i, i, i, md5(i::text), '' FROM generate_series(1, {rows}) i"),
}
PROBE = "CAST('sort_memory_probe' AS regclass)"
STATEMENTS = {
    "shuffle, then COUNT(DISTINCT)": ("", "SELECT count(DISTINCT t) FROM (SELECT t FROM {table} ORDER BY random()) s"),
    "GROUP BY, hashed": ("", "SELECT count(*) FROM (SELECT t, count(*) FROM {table} GROUP BY t OFFSET 0) s"),
    "GROUP BY, hashed, six aggregates": (
        "", "SELECT count(*) FROM (SELECT t, count(*), sum(1::numeric), sum(2::numeric), sum(3::float8), "
            "avg(4::numeric), sum(5::bigint) FROM {table} GROUP BY t OFFSET 0) s"),
    "GROUP BY, sorted": ("off", "SELECT count(*) FROM (SELECT t, count(*) FROM {table} GROUP BY t OFFSET 0) s"),
}


def measure(dsn: str, sizes: Sequence[int]) -> list[tuple[int, str, str, int, int, bool]]:
    """Per size, table and statement: the largest node's ``Memory`` (kB), the bound (kB) and whether
    any node spilled."""
    out = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET work_mem = '2GB'")
        conn.execute("SET jit = off")
        conn.execute("SET max_parallel_workers_per_gather = 0")
        for rows in sizes:
            for name, (columns, fill) in TABLES.items():
                conn.execute("DROP TABLE IF EXISTS sort_memory_probe")
                conn.execute(f"CREATE TABLE sort_memory_probe {columns}")
                conn.execute(f"INSERT INTO sort_memory_probe {fill.format(rows=rows)}")
                conn.execute("VACUUM sort_memory_probe")
                bound = conn.execute(f"SELECT CAST({sort_memory_kb_sql(PROBE)} AS int8)").fetchone()
                assert bound is not None
                for statement, (hashagg, sql) in STATEMENTS.items():
                    conn.execute(f"SET enable_hashagg = {hashagg or 'on'}")
                    plan = "\n".join(row[0] for row in conn.execute(
                        f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {sql.format(table='sort_memory_probe')}").fetchall())
                    peak = max((int(kb) for kb in re.findall(r"Memory(?: Usage)?: (\d+)kB", plan)), default=0)
                    out.append((rows, name, statement, peak, int(bound[0]), "Disk" in plan))
        conn.execute("DROP TABLE IF EXISTS sort_memory_probe")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", default="58983,200000", help="table sizes, comma-separated")
    parser.add_argument("--dsn", help="a superuser DSN (default: start a server, --pg)")
    parser.add_argument("--pg", type=int, choices=(15, 16, 17, 18), default=16)
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.rows.split(",")]
    results = on_server(args.dsn, args.pg, "sort-memory-bound", lambda dsn: measure(dsn, sizes))
    print("| rows | table | statement | largest node's Memory (kB) | bound (kB) | bound ÷ Memory |")
    print("|---:|---|---|---:|---:|---:|")
    for rows, name, statement, peak, bound, spilled in results:
        ratio = f"{bound / peak:.2f}" if peak else "—"
        print(f"| {rows:,} | {name} | {statement}{' (spilled)' if spilled else ''} | {peak:,} | {bound:,} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
