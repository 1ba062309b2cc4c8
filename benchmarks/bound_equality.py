"""A declared-size column's ``=`` and IN list with bound parameters, before and after their raw comparison.

rewriter/raw_equality.py ``parameter_raw_equality``: ``x = $1`` on a ``varchar(n)``, ``char(n)`` or
``numeric(p, s)`` read through its in-line check (``declared_apart``) got no raw conjunct, so the
statements BI tools and drivers send with bound parameters were sequential scans where the same
statement with a literal was an index scan. This tool measures, on PostgreSQL's own executor, with
the parameter bound through the extended protocol (a custom plan, as dpproxy's backend runs it):

* on ``da_big_<i>`` (``--rows`` rows, a plain B-tree index on ``x``; benchmarks/declared_apart.py
  ``load``): the plan and the median time of dpproxy's backend SQL for ``count(*) … WHERE x = $1``
  and for ``x IN ($1, $2, $3)`` (``parameter_list_equality``)
  without the raw comparison (``before``) and with it (``after``), each as a ratio to plain
  ``SELECT count(*) FROM da_big_<i> WHERE x = $1`` timed in the same rounds (interleaved);
* on the 101-row ``da_flat_<i>``/``da_apart_<i>``: the shared buffers ``after`` reads on the table
  whose row 0 holds its value stored apart beyond the one holding it in line, bound to another value
  and to the stored value itself (the list: 16 values of its size, the first the stored value or
  another), planned with the values bound as dpproxy's backend plans every statement, and in a
  generic plan (``plan_cache_mode = force_generic_plan``, which dpproxy pins off: the list's array
  is then no constant, is not hashed, and each value reads the row's value again).

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
_CONDITIONS = {"x = $1": 1, "x IN ($1, $2, $3)": 3}
"""The conditions measured, each with its number of parameters: one, and a list (rewriter/raw_equality.py
``parameter_raw_equality`` and ``parameter_list_equality``)."""
_APART_LIST = 16
"""The parameters of the list whose buffers are counted on the 101-row tables: each a value of the
stored value's size, the first the stored value itself or another."""


def _forms(table: str, column_type: str, condition: str) -> dict[str, str]:
    """The statements compared: plain SQL, dpproxy's backend SQL without the raw comparison, with it."""
    after = dpproxy_sql(table, column_type, condition)
    suffix = after.rsplit(" AND ", 1)[1]
    assert suffix.startswith('("raw 2" OPERATOR(pg_catalog.=) '), after
    return {"direct": f"SELECT count(*) FROM {table} WHERE {condition}",
            "before": after.removesuffix(f" AND {suffix}"), "after": after}


def _explain(conn: psycopg.Connection[Any], sql: str, values: Sequence[str], analyze: bool) -> dict[str, Any]:
    options = "ANALYZE, BUFFERS, TIMING OFF, " if analyze else ""
    row = psycopg.RawCursor(conn).execute(f"EXPLAIN ({options}FORMAT JSON) {sql}", values).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return dict(plan[0]["Plan"])


def _scans(plan: dict[str, Any]) -> list[str]:
    names = [str(plan["Node Type"])] if "Scan" in str(plan["Node Type"]) else []
    for child in plan.get("Plans", []):
        names += _scans(child)
    return names


def _buffers(conn: psycopg.Connection[Any], sql: str, values: Sequence[str], generic: bool) -> int:
    """The shared buffers ``sql`` reads bound to ``values``: planned with them (``EXPLAIN`` of the bound
    statement plans it so, as an unnamed statement is by default), or in a generic plan (prepared,
    run under ``plan_cache_mode = force_generic_plan``, which dpproxy's backend connections pin off)."""
    if not generic:
        plan = _explain(conn, sql, values, True)
    else:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute(f"PREPARE bound_equality AS {sql}")
        try:
            literals = ", ".join("'" + value.replace("'", "''") + "'" for value in values)
            row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) EXECUTE bound_equality ({literals})").fetchone()
            assert row is not None
            plan = (row[0] if isinstance(row[0], list) else json.loads(row[0]))[0]["Plan"]
        finally:
            conn.execute("DEALLOCATE bound_equality")
            conn.execute("RESET plan_cache_mode")
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def _extra(conn: psycopg.Connection[Any], i: int, column_type: str, condition: str, generic: bool) -> list[int]:
    """The buffers ``after`` reads on da_apart_<i> beyond da_flat_<i>, bound to values of the stored value's
    size (the list: :data:`_APART_LIST` of them), the first another value and then the stored one."""
    stored = conn.execute(f"SELECT x::text FROM da_apart_{i} WHERE id = 0").fetchone()
    assert stored is not None
    numeric = column_type.startswith("numeric")
    size = len(str(stored[0]).rstrip())
    others = [str(int(str(stored[0])) - 1 - k) if numeric else f"z{k}".ljust(size, "z") for k in range(_APART_LIST)]
    list_condition = "x IN (" + ", ".join(f"${k}" for k in range(1, _APART_LIST + 1)) + ")"
    if condition.startswith("x = "):
        others, list_condition = others[:1], condition
    extra = []
    for values in (others, [str(stored[0]), *others[1:]]):
        apart, flat = (_forms(f"da_{kind}_{i}", column_type, list_condition)["after"] for kind in ("apart", "flat"))
        for sql in (apart, flat):  # warm: a session's first fetch of a value stored apart opens the TOAST relation
            _buffers(conn, sql, values, generic)
        extra.append(_buffers(conn, apart, values, generic) - _buffers(conn, flat, values, generic))
    return extra


def measure(conn: psycopg.Connection[Any], rounds: int) -> list[str]:
    """One Markdown row per condition and type: plans, median ms and ratios to direct, and extra buffers."""
    lines = ["| condition | type | plan before | plan after | direct ms | before × | after × | apart +buffers "
             "(other values, stored value; generic plan) |", "|---|---|---|---|---|---|---|---|"]
    conn.execute("SET enable_indexonlyscan = off")  # as dpproxy's backend connections plan
    for condition, count in _CONDITIONS.items():
        for i, column_type in enumerate(TYPES):
            forms = _forms(f"da_big_{i}", column_type, condition)
            probe = _PROBES[column_type]
            values = [probe] + [probe[:-1] + str(k) for k in range(1, count)]  # each a row's value
            plans = {name: " › ".join(_scans(_explain(conn, sql, values, False))) for name, sql in forms.items()}
            times: dict[str, list[float]] = {name: [] for name in forms}
            cursor = psycopg.RawCursor(conn)
            for sql in forms.values():  # untimed: the first run reads the table into the cache
                cursor.execute(sql, values).fetchall()
            for _ in range(rounds):
                for name, sql in forms.items():  # interleaved: the load moves all three alike
                    started = time.perf_counter()
                    cursor.execute(sql, values).fetchall()
                    times[name].append(time.perf_counter() - started)
            median = {name: statistics.median(values) for name, values in times.items()}
            custom, generic = (_extra(conn, i, column_type, condition, kind) for kind in (False, True))
            lines.append(f"| `{condition}` | {column_type} | {plans['before']} | {plans['after']} | "
                         f"{1000 * median['direct']:.3f} | ×{median['before'] / median['direct']:.1f} | "
                         f"×{median['after'] / median['direct']:.2f} | +{custom[0]}, +{custom[1]}; "
                         f"+{generic[0]}, +{generic[1]} |")
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
