"""What one row adds to a DP statement whose sort or hash table it pushes past ``work_mem``.

Not a timed test: a measuring tool for docs/threat-model.md's Timing section ("work_mem"). A
``COUNT(DISTINCT t)`` sorts the filtered rows' values (twice: dpproxy's shuffle, then the value
sort) and a categorical GROUP BY key hashes them by the raw value first; each keeps its rows in
memory up to ``work_mem`` (a hash table up to ``work_mem`` × ``hash_mem_multiplier``) and spills
them all to temporary files past it. An analyst chooses the filter (``id <= k``) and so how many
rows reach the sort: this tool bisects k on ``rc_plus`` (``rc_base`` and one more row, id 0, whose
``tp``/``cp`` hold ``--value-bytes`` random bytes) for the smallest k at which the neighbour's
statement writes temporary blocks (``EXPLAIN (BUFFERS)``'s ``Temp Written Blocks``) while the
base's does not, then times both at that k and, as controls, 64 rows below it (both in memory)
and 64 above (both spilled), alternating, ``--repeats`` times each: the step the row buys at the
edge against what it adds away from it. Every other row's ``tp``/``cp`` is a distinct random value
of ``--base-bytes``; the statements are the backend SQL dpproxy sends (planned under
``max_text_bytes`` = ``--bound``).

``--closed`` checks the closure instead (rewriter/sort_memory.py): with ``--role-work-mem`` set as
the measuring role's default (``ALTER ROLE ... SET work_mem``, as an operator would set the
service role's), each statement runs as dpproxy runs it, after the step that sets ``work_mem`` to
the table's bound for its transaction, at every k of a grid of 64 over the table and at the k
where each spilled without the step, for ``rc_base`` and ``rc_plus``: it counts the ks at which
it wrote temporary blocks without the step and with it (which must be none).

Run from the repository root::

    python -m benchmarks.work_mem_step --rows 60000 --repeats 21
    python -m benchmarks.work_mem_step --rows 60000 --bound 2048 --value-bytes 2048
    python -m benchmarks.work_mem_step --rows 20000 --closed --role-work-mem 64kB
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import psycopg

from policies.model import TablePolicy
from rewriter.sort_memory import work_mem_setting
from benchmarks.row_cost import (Construct, _writer, alternating_runs, load_tables, measuring_session, on_server, plan_constructs,
                                 policy_file)

_K = 987_654_321  # the filter's bound as planned, replaced by each k bisected
STATEMENTS: tuple[Construct, ...] = (
    Construct("COUNT(DISTINCT tp)", f"SELECT COUNT(DISTINCT tp) FROM {{table}} WHERE id <= {_K}"),
    Construct("GROUP BY cp (categories, other)", f"SELECT cp, COUNT(*) FROM {{table}} WHERE id <= {_K} GROUP BY cp"),
)
_CONTROL = 64  # rows below and above the edge the controls filter


class Step(NamedTuple):
    """One statement's edge for one kind of neighbour and the times about it (medians and the base's
    interquartile range, ms)."""

    name: str
    edge: int
    at_edge: tuple[float, float, float, float]
    below: tuple[float, float, float, float]
    above: tuple[float, float, float, float]


def _random_text(size: int) -> str:
    return (f"(SELECT left(string_agg(md5(id::text || k::text || random()::text), ''), {size}) "
            f"FROM generate_series(1, {(size + 31) // 32}) k)")


def _fill(dsn: str, base_bytes: int, value_bytes: int) -> None:
    """Every row's ``tp`` and ``cp`` a distinct random value of ``base_bytes``; ``rc_plus``'s row id 0
    one of ``value_bytes``, kept in the row where it fits (``STORAGE PLAIN``)."""
    with _writer(dsn) as conn:
        conn.execute(f"UPDATE rc_base SET tp = {_random_text(base_bytes)}, pad = NULL")
        conn.execute("UPDATE rc_base SET cp = tp")
        conn.execute("TRUNCATE rc_plus")
        conn.execute("INSERT INTO rc_plus SELECT * FROM rc_base")
        conn.execute(f"INSERT INTO rc_plus SELECT 0, age, t, ci, cat, n, f, ts, arr, j, d, big, v, b, dt, by, tv, nr, vb, dn, "
                     f"nx, tx, nd, NULL, nb.x, nb.x, cm FROM rc_base, (SELECT {_random_text(value_bytes)} AS x FROM "
                     f"(SELECT 0 AS id) i) nb WHERE rc_base.id = 1")
        for table in ("rc_base", "rc_plus"):
            conn.execute(f"VACUUM FULL ANALYZE {table}")


def _explained(conn: psycopg.Connection[Any], sql: str) -> tuple[float, int]:
    """PostgreSQL's execution time of ``sql`` (ms) and the temporary blocks it wrote."""
    row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, SUMMARY ON, FORMAT JSON) {sql}").fetchone()
    assert row is not None
    plan = row[0][0]
    return float(plan["Execution Time"]), int(plan["Plan"]["Temp Written Blocks"])


def _spills(conn: psycopg.Connection[Any], sql: str, k: int) -> bool:
    return _explained(conn, sql.replace(str(_K), str(k)))[1] > 0


def _edge(spills: Callable[[int], bool], rows: int) -> int | None:
    """The smallest k at which ``spills(k)`` and not ``spills(k - 1)``, or None.

    Spilling is not monotonic in k: the planner picks a hash aggregate or a sort by its estimates,
    so the first run of spilling ks on a grid of 64 is bisected."""
    grid = [rows * step // 64 for step in range(1, 65)]
    for low, high in zip(grid, grid[1:]):
        if spills(low) or not spills(high):
            continue
        while high - low > 1:
            middle = (low + high) // 2
            if spills(middle):
                high = middle
            else:
                low = middle
        return high
    return None


def _timed(conn: psycopg.Connection[Any], base: str, plus: str, repeats: int) -> tuple[float, float, float, float]:
    """The base's and the neighbour's median ms, the median of the paired differences (each
    neighbour run less the base run before it: load moves both alike) and the base's interquartile range."""
    base_ms, plus_ms = alternating_runs(conn, (base, plus), repeats)
    quartiles = statistics.quantiles(base_ms, n=4)
    paired = statistics.median(p - b for b, p in zip(base_ms, plus_ms))
    return statistics.median(base_ms), statistics.median(plus_ms), paired, quartiles[2] - quartiles[0]


def _steps(conn: psycopg.Connection[Any], name: str, plan: tuple[str, str], rows: int, repeats: int) -> list[Step | str]:
    """The statement's step for the long row (``rc_base`` against ``rc_plus`` at the k where only the
    latter spills) and for an ordinary one (``rc_base`` at k − 1 against k, where row k tips it)."""
    def at(sql: str, k: int) -> str:
        return sql.replace(str(_K), str(k))

    out: list[Step | str] = []
    long_edge = _edge(lambda k: _spills(conn, plan[1], k), rows)
    if long_edge is None or _spills(conn, plan[0], long_edge):
        out.append(f"{name}, the long row: no k within {rows:,} rows at which the row alone decides")
    else:
        out.append(Step(f"{name}, the long row", long_edge,
                        *(_timed(conn, at(plan[0], k), at(plan[1], k), repeats)
                          for k in (long_edge, long_edge - _CONTROL, long_edge + _CONTROL))))
    edge = _edge(lambda k: _spills(conn, plan[0], k), rows)
    if edge is None:
        out.append(f"{name}, an ordinary row: no spill within {rows:,} rows")
    else:
        out.append(Step(f"{name}, an ordinary row (row k)", edge,
                        *(_timed(conn, at(plan[0], k - 1), at(plan[0], k), repeats)
                          for k in (edge, edge - _CONTROL, edge + _CONTROL))))
    return out


def measure(dsn: str, rows: int, base_bytes: int, value_bytes: int, bound: int, repeats: int,
            work_mem: str | None) -> list[Step | str]:
    """Per statement and neighbour its :class:`Step`, or why there is none."""
    load_tables(dsn, rows)
    _fill(dsn, base_bytes, value_bytes)
    with tempfile.TemporaryDirectory(prefix="dpproxy-work-mem-") as directory:
        plans = plan_constructs(policy_file(dsn, Path(directory), max_text_bytes=bound), STATEMENTS)
    out: list[Step | str] = []
    with measuring_session(dsn) as conn:
        if work_mem is not None:
            conn.execute(f"SET work_mem = '{work_mem}'")
        for construct, plan in zip(STATEMENTS, plans):
            if isinstance(plan, str):
                out.append(f"{construct.name}: refused ({plan})")
            else:
                out += _steps(conn, construct.name, plan, rows, repeats)
    return out


class Closure(NamedTuple):
    """One statement on one table: the ks tried, those at which it spilled without the step, the
    first of them, and those at which it spilled with the step (and the most blocks it wrote)."""

    name: str
    tried: int
    spilled_open: int
    first_open: int | None
    spilled_closed: int
    most_blocks_closed: int


def _closed_blocks(conn: psycopg.Connection[Any], setting: str, sql: str) -> int:
    """The temporary blocks ``sql`` writes after ``setting`` in one transaction, as dpproxy sends them."""
    with conn.transaction():
        conn.execute(setting)
        return _explained(conn, sql)[1]


def closure(dsn: str, rows: int, base_bytes: int, value_bytes: int, bound: int, role_work_mem: str) -> list[Closure]:
    """Per statement and table, :class:`Closure` under ``role_work_mem`` as the role's default."""
    load_tables(dsn, rows)
    _fill(dsn, base_bytes, value_bytes)
    with tempfile.TemporaryDirectory(prefix="dpproxy-work-mem-") as directory:
        plans = plan_constructs(policy_file(dsn, Path(directory), max_text_bytes=bound), STATEMENTS)
    ceiling = TablePolicy.model_fields["max_sort_memory_mb"].default
    with _writer(dsn) as admin:
        admin.execute(f"ALTER ROLE CURRENT_USER SET work_mem = '{role_work_mem}'")
    out: list[Closure] = []
    try:
        with measuring_session(dsn) as conn:
            conn.execute("RESET work_mem")  # the role's default, as a pooled connection's RESET ALL leaves it
            for construct, plan in zip(STATEMENTS, plans):
                if isinstance(plan, str):
                    continue
                for table, sql in zip(("rc_base", "rc_plus"), plan):
                    setting = work_mem_setting(f"CAST('{table}' AS pg_catalog.regclass)", ceiling, False)
                    grid = sorted({rows * step // 64 for step in range(1, 65)})
                    opened = [k for k in grid if _spills(conn, sql, k)]
                    edge = _edge(lambda k: _spills(conn, sql, k), rows)
                    ks = sorted(set(grid) | ({edge - 1, edge, edge + 1} if edge is not None else set()))
                    blocks = [_closed_blocks(conn, setting, sql.replace(str(_K), str(k))) for k in ks]
                    out.append(Closure(f"{construct.name}, {table}", len(ks), len(opened), edge,
                                       sum(1 for b in blocks if b), max(blocks)))
    finally:
        with _writer(dsn) as admin:
            admin.execute("ALTER ROLE CURRENT_USER RESET work_mem")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--base-bytes", type=int, default=24, help="bytes of every other row's tp/cp")
    parser.add_argument("--value-bytes", type=int, default=256, help="bytes of the neighbour row's tp/cp")
    parser.add_argument("--bound", type=int, default=256, help="the tables' max_text_bytes")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--work-mem", help="the session's work_mem (default: the server's, 4MB)")
    parser.add_argument("--closed", action="store_true", help="check the closure (module docstring)")
    parser.add_argument("--role-work-mem", default="64kB", help="with --closed: the role's default work_mem")
    parser.add_argument("--dsn", help="a superuser DSN (default: start a server, --pg)")
    parser.add_argument("--pg", type=int, choices=(15, 16, 17, 18), default=16)
    args = parser.parse_args(argv)
    started = time.monotonic()
    if args.closed:
        checked = on_server(args.dsn, args.pg, "work-mem-closed",
                            lambda dsn: closure(dsn, args.rows, args.base_bytes, args.value_bytes, args.bound,
                                                args.role_work_mem))
        print(f"{args.rows:,} rows; the role's work_mem {args.role_work_mem}; filters id <= k; "
              f"{time.monotonic() - started:.0f} s in all.\n")
        print("| statement, table | ks tried | spilled without the step | first k | spilled with it | most temp blocks with it |")
        print("|---|---:|---:|---:|---:|---:|")
        for check in checked:
            first = f"{check.first_open:,}" if check.first_open is not None else "—"
            print(f"| {check.name} | {check.tried} | {check.spilled_open} | {first} | {check.spilled_closed} | "
                  f"{check.most_blocks_closed} |")
        return 0
    results = on_server(args.dsn, args.pg, "work-mem-step",
                        lambda dsn: measure(dsn, args.rows, args.base_bytes, args.value_bytes, args.bound, args.repeats,
                                            args.work_mem))
    print(f"{args.rows:,} rows of {args.base_bytes}-byte distinct values; the neighbour's row holds {args.value_bytes:,} "
          f"bytes (max_text_bytes {args.bound:,}); work_mem {args.work_mem or 'the default'}; PostgreSQL's execution time, "
          f"median of {args.repeats} alternating runs; in brackets the median of the paired differences "
          f"(neighbour less base) and the base's interquartile range (the jitter); "
          f"{time.monotonic() - started:.0f} s in all.\n")
    print("| statement | edge k | at the edge: base → neighbour ms (jitter) | 64 rows below | 64 rows above |")
    print("|---|---:|---:|---:|---:|")
    for item in results:
        if isinstance(item, str):
            print(f"| {item} | | | | |")
            continue
        cells = [f"{base:.2f} → {plus:.2f} ({paired:+.2f}; {jitter:.2f})" for base, plus, paired, jitter in
                 (item.at_edge, item.below, item.above)]
        print(f"| {item.name} | {item.edge:,} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
