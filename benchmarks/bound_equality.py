"""A declared-size column's ``=`` with a bound parameter, before and after its raw comparison.

rewriter/raw_equality.py ``parameter_raw_equality``: ``x = $1`` on a ``varchar(n)``, ``char(n)`` or
``numeric(p, s)`` read through its in-line check (``declared_apart``) got no raw conjunct, so the
statements BI tools and drivers send with bound parameters were sequential scans where the same
statement with a literal was an index scan. This tool measures, on PostgreSQL's own executor, with
the parameter bound through the extended protocol (a custom plan, as dpproxy's backend runs it):

* on ``da_big_<i>`` (``--rows`` rows, a plain B-tree index on ``x``; benchmarks/declared_apart.py
  ``load``): the plan and the median time of dpproxy's backend SQL for ``count(*) … WHERE x = $1``
  without the raw comparison (``before``) and with it (``after``), each as a ratio to plain
  ``SELECT count(*) FROM da_big_<i> WHERE x = $1`` timed in the same rounds (interleaved);
* on the 101-row ``da_flat_<i>``/``da_apart_<i>``: the shared buffers ``after`` reads on the table
  whose row 0 holds its value stored apart beyond the one holding it in line, bound to another value
  and to the stored value itself (the raw comparison reads a row's raw value once).

Run from the repository root: ``python -m benchmarks.bound_equality [--rows 1000000] [--rounds 15]``.
It starts its own PostgreSQL (pgserver) and removes it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from benchmarks.declared_apart import TYPES, dpproxy_sql, on_loaded_server

_PROBES = {"varchar(64)": "row 500000", "char(64)": "row 500000", "numeric(60, 0)": "500000"}
"""Per type: the value bound on the indexed table (one row holds it)."""


def _forms(table: str, column_type: str) -> dict[str, str]:
    """The statements compared: plain SQL, dpproxy's backend SQL without the raw comparison, with it."""
    after = dpproxy_sql(table, column_type, "x = $1")
    suffix = after.rsplit(" AND ", 1)[1]
    assert suffix.startswith('("raw 2" OPERATOR(pg_catalog.=) '), after
    return {"direct": f"SELECT count(*) FROM {table} WHERE x = $1", "before": after.removesuffix(f" AND {suffix}"),
            "after": after}


def _explain(conn: psycopg.Connection[Any], sql: str, value: str, analyze: bool) -> dict[str, Any]:
    options = "ANALYZE, BUFFERS, TIMING OFF, " if analyze else ""
    row = psycopg.RawCursor(conn).execute(f"EXPLAIN ({options}FORMAT JSON) {sql}", [value]).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return dict(plan[0]["Plan"])


def _scans(plan: dict[str, Any]) -> list[str]:
    names = [str(plan["Node Type"])] if "Scan" in str(plan["Node Type"]) else []
    for child in plan.get("Plans", []):
        names += _scans(child)
    return names


def _buffers(conn: psycopg.Connection[Any], sql: str, value: str) -> int:
    plan = _explain(conn, sql, value, True)
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def measure(conn: psycopg.Connection[Any], rounds: int) -> list[str]:
    """One Markdown row per type: plans, median ms and ratios to direct, and extra buffers."""
    lines = ["| type | plan before | plan after | direct ms | before × | after × | apart +buffers (other value, "
             "stored value) |", "|---|---|---|---|---|---|---|"]
    conn.execute("SET enable_indexonlyscan = off")  # as dpproxy's backend connections plan
    for i, column_type in enumerate(TYPES):
        forms = _forms(f"da_big_{i}", column_type)
        probe = _PROBES[column_type]
        plans = {name: " › ".join(_scans(_explain(conn, sql, probe, False))) for name, sql in forms.items()}
        times: dict[str, list[float]] = {name: [] for name in forms}
        cursor = psycopg.RawCursor(conn)
        for sql in forms.values():  # untimed: the first run reads the table into the cache
            cursor.execute(sql, [probe]).fetchall()
        for _ in range(rounds):
            for name, sql in forms.items():  # interleaved: the load moves all three alike
                started = time.perf_counter()
                cursor.execute(sql, [probe]).fetchall()
                times[name].append(time.perf_counter() - started)
        median = {name: statistics.median(values) for name, values in times.items()}
        stored = conn.execute(f"SELECT x::text FROM da_apart_{i} WHERE id = 0").fetchone()
        assert stored is not None
        extra = []
        for value in ("row 7" if not column_type.startswith("numeric") else "7", str(stored[0])):
            apart, flat = (_forms(f"da_{kind}_{i}", column_type)["after"] for kind in ("apart", "flat"))
            extra.append(_buffers(conn, apart, value) - _buffers(conn, flat, value))
        lines.append(f"| {column_type} | {plans['before']} | {plans['after']} | {1000 * median['direct']:.3f} | "
                     f"×{median['before'] / median['direct']:.1f} | ×{median['after'] / median['direct']:.2f} | "
                     f"+{extra[0]}, +{extra[1]} |")
    conn.execute("RESET enable_indexonlyscan")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the indexed table (default 1,000,000)")
    parser.add_argument("--rounds", type=int, default=15, help="timed runs of each form (default 15)")
    args = parser.parse_args(argv)
    on_loaded_server(args.rows, lambda conn: "\n".join(measure(conn, args.rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
