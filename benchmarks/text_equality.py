"""Text equality on an indexed column: dpproxy's backend SQL against the direct statement, and what a
long value in the index adds.

Not a timed test: a measuring tool for rewriter/raw_equality.py and docs/threat-model.md's Timing
section. Times are PostgreSQL's own ``Execution Time`` (``EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON)``),
never wall time through a client, the median of ``--repeats`` runs after one warm-up, the forms
alternating. Two parts:

* **Plans.** Tables ``te_<rows>`` (``--rows``, repeatable; 100,000 and 1,000,000 by default) of
  ``id``, ``t text`` and ``v``, with a B-tree index on ``t``, and ``tx_<rows>``, the same rows with an
  index on the bounded value instead: a third of the rows hold ``'common'``, the others one of
  50,000 keys ``'k<n>'`` (about 1 row per key at 100,000 rows, 13 at 1,000,000). For each DP
  COUNT/SUM of :data:`STATEMENTS` it times the statement run directly on ``te``, and on each table
  the backend SQL dpproxy sends for a table without ``answer_quantum_ms`` (the bounded value) and
  with one (the raw column beside it: rewriter/raw_equality.py), with the scans each plan makes,
  and the ratios to the direct time.
* **The index lever.** ``te_lever_base``/``te_lever_plus`` (``--lever-rows``): the same rows, the
  second plus one row of ``--lever-bytes`` of ``a`` (as long as a B-tree entry, compressed, may
  hold) that sorts just after the searched ``'a'``. What that row adds to ``t = 'a'`` in either
  form, with a plain index on ``t`` and with one on the bounded value.

Run from the repository root::

    python -m benchmarks.text_equality --pg 16 --out /tmp/text_equality.md   # ~5 minutes
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import yaml

from benchmarks.plans import plan_of
from benchmarks.row_cost import on_server, print_report
from rewriter.rewrite import backend_sql

__all__ = ["STATEMENTS", "backend_of", "main", "quantum_policies", "timed_plans"]

STATEMENTS: tuple[tuple[str, str], ...] = (
    ("selective: t = 'k123'", "SELECT COUNT(*), SUM(v) FROM {table} WHERE t = 'k123'"),
    ("common: t = 'common'", "SELECT COUNT(*), SUM(v) FROM {table} WHERE t = 'common'"),
    ("selective: t IN ('k123', 'k4567')", "SELECT COUNT(*), SUM(v) FROM {table} WHERE t IN ('k123', 'k4567')"),
    ("common: t IN ('common', 'k123')", "SELECT COUNT(*), SUM(v) FROM {table} WHERE t IN ('common', 'k123')"),
)
_ROWS = ("SELECT g, CASE WHEN g % 3 = 0 THEN 'common' ELSE 'k' || g % 50000 END, g % 100 "
         "FROM generate_series(1, {rows}) g")
_BOUND = 256  # the default max_text_bytes
_TABLE = {"access": "protected", "epsilon": 1.0, "delta": 1e-6, "columns": {"v": {"bounds": [0, 100]}}}


def quantum_policies(dsn: str, directory: Path, tables: Sequence[str]) -> tuple[Path, Path]:
    """The tables' policy without ``answer_quantum_ms`` and with it."""
    return _policy(dsn, directory / "bounded", tables, 0), _policy(dsn, directory / "quantum", tables, 20)


def _policy(dsn: str, directory: Path, tables: Sequence[str], quantum_ms: int) -> Path:
    directory.mkdir()
    policy = {
        "backend": {"dsn": dsn},
        "listen": {"host": "127.0.0.1", "port": 1},
        "ledger": {"url": f"sqlite:///{directory / 'ledger.sqlite3'}"},
        "users": {"analyst": {"password": "analyst", "budget": {"epsilon": 1000, "delta": 0.5}}},
        "tables": {f"public.{name}": {**_TABLE, "answer_quantum_ms": quantum_ms} for name in tables},
    }
    path = directory / "policy.yaml"
    path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
    return path


def _create(conn: psycopg.Connection[Any], table: str, rows: int, index: str) -> None:
    """``table`` of ``rows`` rows and the index ``index`` (SQL after ``CREATE INDEX ON table``)."""
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"CREATE TABLE {table} (id integer, t text, v integer)")
    conn.execute(f"INSERT INTO {table} {_ROWS.format(rows=rows)}")
    conn.execute(f"CREATE INDEX ON {table} {index}")
    conn.execute(f"VACUUM ANALYZE {table}")


def _explain(conn: psycopg.Connection[Any], sql: str) -> tuple[float, str]:
    """PostgreSQL's execution time of ``sql`` (ms) and the scans its plan makes."""
    row = conn.execute(f"EXPLAIN (ANALYZE, TIMING OFF, SUMMARY ON, FORMAT JSON) {sql}").fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    scans: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        if node["Node Type"].endswith("Scan"):
            scans.append(node["Node Type"])
        for child in node.get("Plans", ()):
            walk(child)

    walk(plan[0]["Plan"])
    return float(plan[0]["Execution Time"]), ", ".join(dict.fromkeys(scans))


def backend_of(policies: tuple[Path, Path], statement: str, bounded: bool) -> str:
    """dpproxy's backend SQL of ``statement``: on a table without a quantum (``bounded``: every
    comparison of the bounded value) or with one (``t = 'x'`` on the raw column)."""
    return backend_sql(plan_of(policies[0] if bounded else policies[1], statement), seed=0)


def timed_plans(dsn: str, sqls: Sequence[str], repeats: int) -> list[tuple[float, str]]:
    """Each of ``sqls``: its median execution time and its scans, the statements alternating."""
    times: list[list[float]] = [[] for _ in sqls]
    scans = [""] * len(sqls)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET jit = off")  # as dpproxy's own backend sessions
        for sql in sqls:
            _explain(conn, sql)  # warm-up
        for _ in range(repeats):
            for index, sql in enumerate(sqls):
                elapsed, scans[index] = _explain(conn, sql)
                times[index].append(elapsed)
    return [(statistics.median(each), scan) for each, scan in zip(times, scans)]


_PLAIN = "(t)"
_BOUNDED = f"((CASE WHEN octet_length(t) <= {_BOUND} THEN t END))"  # the bounded value, as the backend SQL reads it


def plans(dsn: str, sizes: Sequence[int], repeats: int) -> list[str]:
    """The plan part's table rows: per size, ``te_<rows>`` with a plain index on ``t`` and ``tx_<rows>``
    with an index on the bounded value instead."""
    lines = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        for rows in sizes:
            _create(conn, f"te_{rows}", rows, _PLAIN)
            _create(conn, f"tx_{rows}", rows, _BOUNDED)
    with tempfile.TemporaryDirectory(prefix="dpproxy-text-equality-") as directory:
        tables = [f"{kind}_{rows}" for rows in sizes for kind in ("te", "tx")]
        policies = quantum_policies(dsn, Path(directory), tables)
        for rows in sizes:
            for name, template in STATEMENTS:
                statement, indexed = template.format(table=f"te_{rows}"), template.format(table=f"tx_{rows}")
                sqls = [backend_of(policies, sql, bounded) for bounded in (True, False) for sql in (statement, indexed)]
                timed = timed_plans(dsn, [statement, *sqls], repeats)
                (direct, direct_scan), *forms = timed
                lines.append(f"| {name} | {rows:,} | {direct:.3f} ({direct_scan}) | "
                             + " | ".join(f"{ms:.3f} ({scan}) | {ms / direct:.2f}×" for ms, scan in forms) + " |")
    return lines


def lever(dsn: str, rows: int, length: int, repeats: int) -> list[str]:
    """The index lever's table rows: what a row of ``length`` a's adds to ``t = 'a'``, each index and form."""
    lines = []
    with tempfile.TemporaryDirectory(prefix="dpproxy-text-equality-") as directory:
        policies = quantum_policies(dsn, Path(directory), ["te_lever_base", "te_lever_plus"])
        for index in (_PLAIN, _BOUNDED):
            with psycopg.connect(dsn, autocommit=True) as conn:
                for table in ("te_lever_base", "te_lever_plus"):
                    _create(conn, table, rows, index)
                conn.execute(f"INSERT INTO te_lever_plus VALUES (0, repeat('a', {length}), 1)")
                conn.execute("VACUUM ANALYZE te_lever_plus")
            for bounded in (True, False):
                sqls = [backend_of(policies, f"SELECT COUNT(*) FROM {table} WHERE t = 'a'", bounded)
                        for table in ("te_lever_base", "te_lever_plus")]
                (base, scan), (plus, _) = timed_plans(dsn, sqls, repeats)
                lines.append(f"| {'bounded (no quantum)' if bounded else 'raw (quantum)'} | `{index}` | {scan} | "
                             f"{base:.3f} | {plus:.3f} | {plus - base:+.3f} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, action="append", help="plan tables' sizes (default 100,000 and 1,000,000)")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--lever-rows", type=int, default=100_000)
    parser.add_argument("--lever-bytes", type=int, default=200_000,
                        help="the long row's length: the most a B-tree entry holds compressed is ~2.7 kB")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--dsn", help="a superuser DSN (default: start a server, --pg)")
    parser.add_argument("--pg", type=int, choices=(15, 16, 17, 18), default=16)
    args = parser.parse_args(argv)
    started = time.monotonic()

    def run(dsn: str) -> tuple[list[str], list[str]]:
        return plans(dsn, args.rows or [100_000, 1_000_000], args.repeats), lever(dsn, args.lever_rows, args.lever_bytes,
                                                                                 args.repeats)

    planned, levered = on_server(args.dsn, args.pg, "text-equality", run)
    text = "\n".join([
        f"PostgreSQL {args.pg}; execution time (EXPLAIN ANALYZE, TIMING OFF) in ms, median of {args.repeats} runs "
        f"each, alternating, after one warm-up. {time.monotonic() - started:.0f} s in all.", "",
        "| statement (COUNT(*), SUM(v)) | rows | direct ms (scan), index on t | no quantum, index on t | / direct | "
        "no quantum, index on the bounded value | / direct | quantum (raw), index on t | / direct | "
        "quantum (raw), index on the bounded value | / direct |",
        "|---|---:|---|---|---:|---|---:|---|---:|---|---:|", *planned, "",
        f"The index lever: {args.lever_rows:,} rows, and the same plus one row of {args.lever_bytes:,} a's; "
        "`SELECT COUNT(*) … WHERE t = 'a'`.", "",
        "| form | index | scan | base ms | + the long row ms | the row adds (ms) |",
        "|---|---|---|---:|---:|---:|", *levered]) + "\n"
    return print_report(text, args.out)


if __name__ == "__main__":
    sys.exit(main())
