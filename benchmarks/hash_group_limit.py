"""What one row adds to a GROUP BY over declared keys whose hash aggregate outgrows its limit.

Not a timed test: a measuring tool for docs/threat-model.md's Timing section ("work_mem", a GROUP
BY bounded by its cells). The grouped statement's ``work_mem`` (``rewriter.sort_memory.hashed_groups_kb``)
weighed each group at ``GROUP_BYTES`` and its states only, and a filter ``id <= k`` decides how many
groups the hash table holds. Two shapes outgrew it:

* ``--shape keys``: from nine categories on a text column a key groups each row by the declared
  category it equals (``GroupKey.group_sql``), so a group's key holds that category's bytes. Table
  ``hk`` holds two rows of each combination of ``--keys`` such keys (nine categories of
  ``--label-bytes`` each), in id order.
* ``--shape wide``: a hash aggregate admits ``work_mem`` × ``hash_mem_multiplier`` over the planner's
  estimate of an entry groups, and the estimate counts the statistics' average width of the columns
  the aggregates read: ``count(*) FILTER (WHERE u = 'a')`` per cell of x over a column u of
  ``--label-bytes`` bytes a row stored in the row, one row a cell of ``--cells``.

This tool bisects k for the first at which the statement, after dpproxy's setting step, writes
temporary blocks, and times k - 1 and k (the table without and with the row that opens the group
at the edge), and as a control both 64 rows below, alternating, ``--repeats`` times.
``--before`` plans as the bound did before it counted either (``KEY_ROUNDING`` 0, no input width);
the default, as it does now (no edge is found).

Run from the repository root::

    python -m benchmarks.hash_group_limit --dsn postgresql://... --shape keys --before
    python -m benchmarks.hash_group_limit --dsn postgresql://... --shape wide --label-bytes 7000 --before
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from typing import Any

import psycopg

import rewriter.sort_memory as sort_memory
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql

_TEXT, _TEXT_ARRAY = 25, 1009
_K = 987_654_321  # the filter's bound as planned, replaced by each k


def _wide_relation(cells: int) -> Relation:
    policies = {"x": ColumnPolicy(bounds=(0, cells - 1), group_by=True), "u": ColumnPolicy(categories=["a", "b"]),
                "id": ColumnPolicy(bounds=(0, 10**9))}
    table = TablePolicy(epsilon=1.0, delta=1e-6, columns=policies, max_cells=100_000, max_sort_memory_mb=1024)
    columns = {"id": ColumnInfo("id", 23, -1, 1, policies["id"]), "x": ColumnInfo("x", 23, -1, 2, policies["x"]),
               "u": ColumnInfo("u", _TEXT, -1, 3, policies["u"], array_type_oid=_TEXT_ARRAY)}
    return Relation(0, "public", "hw", table, columns, "ctid")


def _load_wide(conn: psycopg.Connection[Any], cells: int, width: int) -> int:
    conn.execute("DROP TABLE IF EXISTS hw")
    conn.execute("CREATE TABLE hw (id integer, x integer, u text STORAGE PLAIN)")
    conn.execute(f"INSERT INTO hw SELECT i + 1, i, repeat('u', {width}) FROM generate_series(0, {cells - 1}) i")
    conn.execute("VACUUM ANALYZE hw")
    return cells


def _relation(keys: int, label_bytes: int) -> Relation:
    categories = [f"{i}" + "x" * (label_bytes - 1) for i in range(9)]
    policies = {f"t{k}": ColumnPolicy(categories=categories, group_by=True) for k in range(keys)}
    policies["id"] = ColumnPolicy(bounds=(0, 10**9))
    table = TablePolicy(epsilon=1.0, delta=1e-6, columns=policies, max_text_bytes=max(256, label_bytes),
                        max_cells=100_000, max_sort_memory_mb=1024)
    columns = {f"t{k}": ColumnInfo(f"t{k}", _TEXT, -1, k + 2, policies[f"t{k}"], array_type_oid=_TEXT_ARRAY)
               for k in range(keys)}
    columns["id"] = ColumnInfo("id", 23, -1, 1, policies["id"])
    return Relation(0, "public", "hk", table, columns, "ctid")


def _load(conn: psycopg.Connection[Any], relation: Relation, keys: int) -> int:
    policy = relation.columns["t0"].policy
    assert policy is not None and policy.categories is not None
    categories = policy.categories
    conn.execute("DROP TABLE IF EXISTS hk")
    conn.execute(f"CREATE TABLE hk (id integer, {', '.join(f't{k} text STORAGE PLAIN' for k in range(keys))})")
    rows = [(2 * g + r + 1, *(categories[i] for i in combination))
            for g, combination in enumerate(itertools.product(range(9), repeat=keys)) for r in range(2)]
    with conn.cursor() as cursor:
        cursor.executemany(f"INSERT INTO hk VALUES (%s, {', '.join(['%s'] * keys)})", rows)
    conn.execute("VACUUM ANALYZE hk")
    return len(rows)


def _statement(relation: Relation, sql: str) -> tuple[str, str]:
    plan = plan_aggregate_query(sql, relation)
    steps = sort_memory.memory_steps(plan, in_block=False)
    assert steps is not None
    return steps.setting, backend_sql(plan, seed=3)


def _spills(conn: psycopg.Connection[Any], setting: str, sql: str, k: int) -> bool:
    with conn.transaction():
        conn.execute(setting)
        row = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql.replace(str(_K), str(k))}").fetchone()
    assert row is not None
    return _written(row[0][0]["Plan"])


def _written(node: dict[str, Any]) -> bool:
    return node.get("Temp Written Blocks", 0) > 0 or any(_written(child) for child in node.get("Plans", []))


def _ms(conn: psycopg.Connection[Any], setting: str, sql: str, k: int) -> float:
    with conn.transaction():
        conn.execute(setting)
        started = time.perf_counter()
        conn.execute(sql.replace(str(_K), str(k))).fetchall()
        return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--shape", choices=("keys", "wide"), default="keys")
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--label-bytes", type=int, default=1400)
    parser.add_argument("--repeats", type=int, default=51)
    parser.add_argument("--before", action="store_true")
    args = parser.parse_args()
    if args.before:
        sort_memory.KEY_ROUNDING = 0
        sort_memory._input_bytes = lambda plan: 0
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        if args.shape == "keys":
            relation = _relation(args.keys, args.label_bytes)
            rows = _load(conn, relation, args.keys)
            names = ", ".join(f"t{k}" for k in range(args.keys))
            statement = f"SELECT {names}, count(*) FROM hk WHERE id <= {_K} GROUP BY {names}"
        else:
            relation = _wide_relation(args.cells)
            rows = _load_wide(conn, args.cells, args.label_bytes)
            statement = f"SELECT x, count(*) FILTER (WHERE u = 'a') FROM hw WHERE id <= {_K} GROUP BY x"
        setting, sql = _statement(relation, statement)
        print(setting)
        if not _spills(conn, setting, sql, rows):
            print(f"no spill at any filter (up to all {rows} rows): no edge")
            return
        low, high = 0, rows  # low does not spill, high does
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (low, middle) if _spills(conn, setting, sql, middle) else (middle, high)
        print(f"edge: k = {high} (the row that opens the group at the edge) of {rows} rows")
        pairs = {"edge": (high - 1, high), "control": (high - 65, high - 64)}
        times: dict[str, list[list[float]]] = {name: [[], []] for name in pairs}
        for _ in range(args.repeats):
            for name, ks in pairs.items():
                for side, k in enumerate(ks):
                    times[name][side].append(_ms(conn, setting, sql, k))
        for name, (without, with_row) in times.items():
            difference = [b - a for a, b in zip(without, with_row)]
            print(f"{name}: without the row {statistics.median(without):.2f} ms, with it "
                  f"{statistics.median(with_row):.2f} ms, paired median difference {statistics.median(difference):+.2f} ms "
                  f"(base IQR {_iqr(without):.2f})")


def _iqr(values: list[float]) -> float:
    quartiles = statistics.quantiles(values, n=4)
    return quartiles[2] - quartiles[0]


if __name__ == "__main__":
    main()
