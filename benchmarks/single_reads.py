"""What a byte of a text value costs each construct that reads it once a row (a single read), per row.

Not a timed test: the measure behind the single reads' weights in rewriter/text_bounds.py
(``DISTINCT_WORK``, ``KEY_WORK``). What one row at the bound adds to a statement is below the jitter
of one run (benchmarks/row_cost.py's ``single:`` constructs), so this tool multiplies it by the
rows: it fills ``rc_base`` with ``--rows`` rows whose ``tp`` and ``cp`` are short, distinct values
(``--short`` bytes) and ``rc_plus`` with the same rows but values of ``--long`` bytes, distinct too
(random), both kept in the row (``STORAGE PLAIN``) and both rows equally wide (``pad``, ``STORAGE
MAIN``, takes what the value does not), then runs on each the backend SQL dpproxy sends for each
statement of :data:`STATEMENTS`, planned with ``max_text_bytes`` = ``--long``, alternating, and
reports (neighbour − base) / rows / (long − short): PostgreSQL's time a byte of one row's value costs,
in ns and in the work units of rewriter/text_bounds.py (~0.1 ns). ``lower(tp) = 'x'`` reads every
byte and is weighed 51 units a byte there: it calibrates the unit on the machine at hand.

Run from the repository root::

    python -m benchmarks.single_reads --rows 10000 --repeats 11
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

from benchmarks.row_cost import Construct, alternating_runs, load_tables, on_server, plan_constructs, policy_file

STATEMENTS: tuple[Construct, ...] = (
    Construct("COUNT(tp) (the header only)", "SELECT COUNT(tp) FROM {table}"),
    Construct("COUNT(*) WHERE lower(tp) = 'x' (51 units a byte: the calibration)",
              "SELECT COUNT(*) FROM {table} WHERE lower(tp) = 'x'"),
    Construct("COUNT(DISTINCT tp)", "SELECT COUNT(DISTINCT tp) FROM {table}"),
    Construct("GROUP BY cp (categories, other)", "SELECT cp, COUNT(*) FROM {table} GROUP BY cp"),
    Construct("MODE() of cp", "SELECT MODE() WITHIN GROUP (ORDER BY cp) FROM {table}"),
)
# Read as dpproxy's backend SQL reads them but not a statement of their own: the row_hash partition key's
# hash of a text column (rewriter/rewrite.py, HASH_FUNCTIONS), which sample and aggregate computes for each row.
DIRECT: tuple[Construct, ...] = (
    Construct("the row_hash key's hashtextextended(tp)",
              "SELECT pg_catalog.sum(pg_catalog.hashtextextended(tp COLLATE pg_catalog.\"C\", 12345) % 7) FROM {table}"),
)
UNIT_NS = 0.1  # a work unit of rewriter/text_bounds.py, nominally


def _values(dsn: str, rows: int, short: int, long: int) -> None:
    """``tp``/``cp`` of ``short`` bytes in ``rc_base``, of ``long`` in ``rc_plus``, random and distinct;
    ``pad`` fills each row to the same width."""
    width = long + 64
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table, size in (("rc_base", short), ("rc_plus", long)):
            random_text = (f"(SELECT left(string_agg(md5(id::text || k::text || random()::text), ''), {{n}}) "
                           f"FROM generate_series(1, {(2 * width + 31) // 32}) k)")
            conn.execute(f"UPDATE {table} SET tp = {random_text.format(n=size)}, cp = {random_text.format(n=size)}, "
                         f"pad = {random_text.format(n=2 * (width - size))}")
            conn.execute(f"VACUUM FULL ANALYZE {table}")


def measure(dsn: str, rows: int, short: int, long: int, repeats: int,
            work_mem: str | None = None) -> list[tuple[str, float, float, float, float]]:
    """Per statement: its name, the base's and the neighbour's median ms, the base's interquartile
    range, and ns a byte of one row's value."""
    load_tables(dsn, rows)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("rc_base", "rc_plus"):
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN pad SET STORAGE PLAIN")
    _values(dsn, rows, short, long)
    out = []
    with tempfile.TemporaryDirectory(prefix="dpproxy-single-reads-") as directory:
        plans = plan_constructs(policy_file(dsn, Path(directory), max_text_bytes=long), STATEMENTS)
    plans += [(construct.sql.format(table="rc_base"), construct.sql.format(table="rc_plus")) for construct in DIRECT]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET jit = off")
        if work_mem is not None:  # enough for the sorts and hash tables of every row's value: what a byte costs in memory
            conn.execute(f"SET work_mem = '{work_mem}'")
        for construct, plan in zip(STATEMENTS + DIRECT, plans):
            if isinstance(plan, str):
                out.append((f"{construct.name}: refused ({plan})", 0.0, 0.0, 0.0, 0.0))
                continue
            base, plus = alternating_runs(conn, plan, repeats)
            quartiles = statistics.quantiles(base, n=4)
            per_byte = (statistics.median(plus) - statistics.median(base)) * 1e6 / rows / (long - short)
            out.append((construct.name, statistics.median(base), statistics.median(plus), quartiles[2] - quartiles[0],
                        per_byte))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--short", type=int, default=8, help="bytes of each base row's value")
    parser.add_argument("--long", type=int, default=3_800, help="bytes of each neighbour row's value")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--work-mem", help="the sessions' work_mem (default: the server's, 4MB: the long rows' "
                                           "sorts and hash tables then spill to disk)")
    parser.add_argument("--dsn", help="a superuser DSN (default: start a server, --pg)")
    parser.add_argument("--pg", type=int, choices=(15, 16, 17, 18), default=15)
    args = parser.parse_args(argv)
    started = time.monotonic()
    results = on_server(args.dsn, args.pg, "single-reads",
                        lambda dsn: measure(dsn, args.rows, args.short, args.long, args.repeats, args.work_mem))
    print(f"{args.rows:,} rows of {args.short}-byte values against the same of {args.long:,}-byte ones, PostgreSQL "
          f"{args.pg}, work_mem {args.work_mem or 'the default'}; median of {args.repeats} alternating runs each; {time.monotonic() - started:.0f} s in all.\n")
    print("| statement | base ms | neighbour ms | jitter (ms) | ns a byte of a row | units a byte (0.1 ns) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, base, plus, jitter, per_byte in results:
        print(f"| {name} | {base:.2f} | {plus:.2f} | {jitter:.2f} | {per_byte:.3f} | {per_byte / UNIT_NS:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
