"""Whether one row can decide if a DP statement's sort finds its input presorted, by table size.

Not a timed test: a measuring tool for docs/threat-model.md's Timing section. PostgreSQL's
in-memory sort (``src/include/lib/sort_template.h``) first checks whether its input is already
in order and returns after n − 1 comparisons if it is. On a table whose rows were appended in a
column's order (an id, a timestamp), one row whose value is below all the others turns that
pass into a full sort. For each statement of :data:`STATEMENTS` it plans the statement as
dpproxy does (the backend SQL of :func:`benchmarks.row_cost.plan_constructs`, so a run on a
checkout measures that checkout's SQL) and times it, inside PostgreSQL as row_cost does, on:

* ``sorted``: ``--rows`` rows inserted in ``big``'s and ``cat``'s order, and the same table plus
  one row whose values are below all the others, inserted last;
* ``shuffled``: the same values inserted in random order, and the same plus that row (there
  the row should add what any new value adds, nothing more).

Base and neighbour alternate, ``--repeats`` times each after one warm-up; the report gives both
medians, the difference, and the base's interquartile range (the jitter). Run from the
repository root::

    python -m benchmarks.presorted --pg 16 --rows 2000 --rows 20000 --rows 200000 --rows 1000000

Tables hold only the policy's columns, the rest NULL. The figures of a run are in
benchmarks/results.md ("A sort's presorted check").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from benchmarks.row_cost import Construct, _execution_ms, on_server, plan_constructs, policy_file, print_report

STATEMENTS: tuple[str, ...] = (
    "SELECT COUNT(DISTINCT big) FROM {table}",
    "SELECT COUNT(*), COUNT(DISTINCT big) FROM {table} WHERE cat IS NOT NULL",
    "SELECT cat, COUNT(*) FROM {table} GROUP BY cat",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY big) FROM {table}",
    "SELECT MIN(big) FROM {table}",
)
ORDERS = ("sorted", "shuffled")
_COLUMNS = """id integer, age integer, t text, ci text, cat text, n numeric, f double precision, ts timestamptz,
    arr integer[], j jsonb, d date, big bigint, v varchar(100000), b boolean"""
# big: 1000003·g, cat: zero-padded text (a categorical column's raw values, grouped before mapped)
_VALUES = "SELECT g, g * 1000003::bigint, 'v' || lpad(g::text, 9, '0') FROM generate_series(1, {rows}) g"
_LOW_ROW = "INSERT INTO {table} (id, big, cat) VALUES (0, -1, 'a')"  # below every big and cat of the base


def load(dsn: str, rows: int) -> None:
    """``rc_base``/``rc_plus`` (sorted) and ``rs_base``/``rs_plus`` (shuffled), each plus its low row."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for order, (base, plus) in zip(ORDERS, (("rc_base", "rc_plus"), ("rs_base", "rs_plus"))):
            shuffle = " ORDER BY random()" if order == "shuffled" else ""
            for table in (base, plus):
                conn.execute(f"DROP TABLE IF EXISTS {table}")
                conn.execute(f"CREATE TABLE {table} ({_COLUMNS})")
                conn.execute(f"INSERT INTO {table} (id, big, cat) {_VALUES.format(rows=rows)}{shuffle}")
            conn.execute(_LOW_ROW.format(table=plus))
            for table in (base, plus):
                conn.execute(f"VACUUM ANALYZE {table}")


def sort_nodes(conn: psycopg.Connection[Any], sql: str) -> str:
    """The plan's nodes that sort, and what they sort by (``Sort: big``), or ``none``; a
    ``count(DISTINCT)`` on PostgreSQL 15 sorts inside its Aggregate node, which EXPLAIN does not show."""
    row = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}").fetchone()
    assert row is not None
    found: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if node["Node Type"] in ("Sort", "Incremental Sort"):
            found.append(f"{node['Node Type']}: {', '.join(node.get('Sort Key', []))}")
        elif node["Node Type"] == "Aggregate" and node.get("Strategy") == "Sorted":
            found.append("GroupAggregate")
        for child in node.get("Plans", []):
            walk(child)

    walk(row[0][0]["Plan"])
    return "; ".join(found) or "none"


def measure(dsn: str, rows: int, repeats: int, statements: Sequence[str], work_mem: str = "") -> list[str]:
    """One Markdown row per statement and order, for tables of ``rows`` rows."""
    load(dsn, rows)
    with tempfile.TemporaryDirectory(prefix="dpproxy-presorted-") as directory:
        plans = plan_constructs(policy_file(dsn, Path(directory)), [Construct(s, s) for s in statements])
    lines = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET jit = off")
        if work_mem:
            conn.execute(f"SET work_mem = '{work_mem}'")
        for statement, plan in zip(statements, plans):
            if isinstance(plan, str):
                lines.append(f"| {statement} | {rows:,} | | refused ({plan}) | | | | | |")
                continue
            for order in ORDERS:
                sql = [text if order == "sorted" else text.replace('"rc_base"', '"rs_base"').replace('"rc_plus"', '"rs_plus"')
                       for text in plan]
                for text in sql:
                    _execution_ms(conn, text)  # warm-up
                base: list[float] = []
                plus: list[float] = []
                for _ in range(repeats):
                    base.append(_execution_ms(conn, sql[0]))
                    plus.append(_execution_ms(conn, sql[1]))
                quartiles = statistics.quantiles(base, n=4) if len(base) >= 4 else [min(base), 0, max(base)]
                b, p = statistics.median(base), statistics.median(plus)
                lines.append(f"| {statement.format(table='t')} | {rows:,} | {order} | {sort_nodes(conn, sql[1])} | {b:.2f} | "
                             f"{p:.2f} | {p - b:+.2f} | {quartiles[2] - quartiles[0]:.2f} |")
                print(lines[-1], flush=True)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, action="append", help="table sizes (repeatable; default 2,000 and 20,000)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--only", action="append", default=[], help="statements containing this")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--dsn", help="a superuser DSN (default: start a server, --pg)")
    parser.add_argument("--pg", type=int, choices=(15, 16, 17, 18), default=16)
    parser.add_argument("--work-mem", default="", help="work_mem for the measured statements (default: the server's, 4MB), "
                                                      "such as 1GB: sorts of 1,000,000 rows then stay in memory")
    args = parser.parse_args(argv)
    statements = [s for s in STATEMENTS if not args.only or any(word in s for word in args.only)]
    started = time.monotonic()

    def run(dsn: str) -> list[str]:
        lines: list[str] = []
        for rows in args.rows or [2_000, 20_000]:
            lines += measure(dsn, rows, args.repeats if rows < 1_000_000 else min(args.repeats, 5), statements, args.work_mem)
        return lines

    lines = on_server(args.dsn, args.pg, "presorted", run)
    text = "\n".join([
        f"PostgreSQL {args.pg}, work_mem {args.work_mem or 'the default (4MB)'}; execution time (EXPLAIN ANALYZE, TIMING OFF), median of {args.repeats} runs each "
        f"(5 at 1,000,000 rows), alternating, after one warm-up; jitter is the base's interquartile range. "
        f"{time.monotonic() - started:.0f} s in all.", "",
        "| statement | rows | physical order | sorts (plan) | base ms | + one low row ms | the row adds (ms) | jitter (ms) |",
        "|---|---:|---|---|---:|---:|---:|---:|", *lines]) + "\n"
    return print_report(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
