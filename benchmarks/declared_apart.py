"""Candidate closures of the stored-apart lever for values of a declared size, measured by buffers and plans.

docs/threat-model.md (Timing, values of a declared size stored apart): a ``varchar(n)``/``char(n)``
within ``max_text_bytes`` or a ``numeric(p, s)`` was read as it is, so a value a wide row stored
apart was fetched again (2 buffer hits) by each reference. Reading it through the in-line check
(``CASE WHEN <in the row> THEN x END``, rewriter/text_bounds.py) closes that, but no index serves
the check. This tool measures, for each candidate rendering of a condition, on PostgreSQL's own
executor:

* the shared buffers a statement reads on a 101-row table whose row 0 holds the value apart, beyond
  the same table with an ordinary value there (``EXPLAIN (ANALYZE, BUFFERS)``; a count load does
  not move), for each construct: one ``=``, a hashed IN list, OR'ed ``=``, OR'ed short IN lists,
  OR'ed ``>``, BETWEENs, AND'ed ``<>`` and ``COUNT(DISTINCT)``;
* the plan PostgreSQL picks for a selective ``=`` and IN list, and an unselective count, on
  1,000,000 rows with a plain B-tree index on the column (``EXPLAIN``, no timing).

The candidates (``FORMS``): ``raw`` (dpproxy's before the closure), ``bounded`` (the in-line check at
every reference), ``guarded`` (each term ``(<in the row> AND term)``, the raw term after the check)
and ``one raw`` (every term on the bounded value, and a top-level construct's first term on the raw
column beside them, an ``=`` or IN list as ``x = ANY(<its values, at least 9>)``, which PostgreSQL
hashes: the one raw reference a row may pay, which an index serves). ``one raw`` is the closure
dpproxy built (rewriter/raw_equality.py ``hashed_raw_equality``); ``dpproxy`` is the backend SQL its
rewriter writes for the same statement (a count; the table read through the bounded projection),
planned as dpproxy's backend connections plan it (``enable_indexonlyscan`` off).

Run from the repository root: ``python -m benchmarks.declared_apart [--rows 1000000]``. It starts
its own PostgreSQL (pgserver) and removes it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from policies.model import TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql
from rewriter.text_bounds import in_line_numeric, in_line_text
from tests.post_charge_wait import PAD, SHORT_TEXT, WIDE_PAD

TYPES = {"varchar(64)": ("'row ' || g", SHORT_TEXT, "'row 0'", WIDE_PAD),
         "char(64)": ("'row ' || g", SHORT_TEXT, "'row 0'", PAD),
         "numeric(60, 0)": ("g % 100", "repeat('7', 60)::numeric", "1", WIDE_PAD)}
"""Per type: the rows' values, row 0's value stored apart, its ordinary value, and the pad that keeps
the ordinary one in the row (a char(64) value takes 64 bytes: the narrower PAD)."""
_TYPE_INFO = {"varchar(64)": (1043, 64 + 4), "char(64)": (1042, 64 + 4), "numeric(60, 0)": (1700, (60 << 16) + 4)}
"""Per type: its OID and type modifier, as dpproxy's catalog reads them."""


def _in_line(column: str, column_type: str) -> str:
    return in_line_numeric(column) if column_type.startswith("numeric") else in_line_text(column)


def _literal(column_type: str, i: int) -> str:
    """A value of the stored value's size (64 characters; 60 digits), so that a size check reads it."""
    if column_type.startswith("numeric"):
        return str(10 ** 59 + i)
    return "'" + f"z{i}".ljust(64, "z") + "'"


Term = Callable[[str, int], str]  # (column SQL, the term's index) -> a term


def _constructs(column_type: str, value: str = "NULL") -> dict[str, tuple[str, Term, int, bool]]:
    """Per construct: its joiner (" OR ", " AND "), its term, how many terms, and whether it stands at
    the top level of the WHERE (AND only), where a raw conjunct may stand beside it. ``value``: the
    literal of the value stored apart (an analyst who knows it makes a hashed list's hash match)."""
    def lit(i: int) -> str:
        return _literal(column_type, i)

    def values(first: int, count: int) -> str:
        return ", ".join(lit(first + k) for k in range(count))

    return {
        "one =": (" AND ", lambda c, i: f"{c} = {lit(0)}", 1, True),
        "one =, the value itself": (" AND ", lambda c, i: f"{c} = {value}", 1, True),
        "IN (64 values), hashed": (" AND ", lambda c, i: f"{c} IN ({values(0, 64)})", 1, True),
        "64 OR'ed =": (" OR ", lambda c, i: f"{c} = {lit(i)}", 64, False),
        "16 OR'ed IN (8 values)": (" OR ", lambda c, i: f"{c} IN ({values(8 * i, 8)})", 16, False),
        "64 OR'ed >": (" OR ", lambda c, i: f"{c} > {lit(i)}", 64, False),
        "32 OR'ed BETWEEN": (" OR ", lambda c, i: f"{c} BETWEEN {lit(i)} AND {lit(i + 1)}", 32, False),
        "64 AND'ed <>": (" AND ", lambda c, i: f"{c} <> {lit(i)}", 64, True),
    }


def _render(form: str, column_type: str, joiner: str, term: Term, count: int, top: bool) -> str | None:
    """The WHERE of a construct in a candidate form, or None where the form does not apply."""
    bounded = f"(CASE WHEN {_in_line('x', column_type)} THEN x END)"
    if form == "raw":
        return joiner.join(f"({term('x', i)})" for i in range(count))
    if form == "bounded":
        return joiner.join(f"({term(bounded, i)})" for i in range(count))
    if form == "guarded":
        return joiner.join(f"({_in_line('x', column_type)} AND {term('x', i)})" for i in range(count))
    if form == "dpproxy":
        return joiner.join(f"({term('x', i)})" for i in range(count))  # the analyst's condition: dpproxy_sql renders it
    # one raw: a top-level construct's first term also on the raw column (an = or IN as x = ANY of
    # its values, repeated to 9 or more: hashed), every term on the bounded value
    if not top:
        return None
    first = term("x", 0)
    if " = " in first or " IN (" in first:
        listed = (first.split(" = ", 1)[1] if " = " in first else first.split(" IN (", 1)[1].removesuffix(")")).split(", ")
        first = f"x = ANY (CAST(ARRAY[{', '.join((listed * 9)[:max(9, len(listed))])}] AS {column_type}[]))"
    return f"{first} AND " + joiner.join(f"({term(bounded, i)})" for i in range(count))


FORMS = ("raw", "bounded", "guarded", "one raw", "dpproxy")


def dpproxy_sql(table: str, column_type: str, where: str) -> str:
    """The backend SQL dpproxy's rewriter writes for ``SELECT count(*) FROM <table> WHERE <where>``
    on a protected table of ``id int`` and ``x <column_type>`` (no quantum)."""
    type_oid, modifier = _TYPE_INFO[column_type]
    columns = {"id": ColumnInfo("id", 23, -1, 1, None), "x": ColumnInfo("x", type_oid, modifier, 2, None),
               "pad": ColumnInfo("pad", 25, -1, 3, None)}
    relation = Relation(1, "public", table, TablePolicy(epsilon=1.0), columns)
    return backend_sql(plan_aggregate_query(f"SELECT count(*) FROM {table} WHERE {where}", relation), 0)


def _statement(form: str, table: str, column_type: str, where: str) -> str:
    if form == "dpproxy":
        return dpproxy_sql(table, column_type, where)
    return f"SELECT count(*) FROM {table} WHERE {where}"


def _explain(conn: psycopg.Connection[Any], sql: str, analyze: bool) -> dict[str, Any]:
    options = "ANALYZE, BUFFERS, TIMING OFF, " if analyze else ""
    row = conn.execute(f"EXPLAIN ({options}FORMAT JSON) {sql}").fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return dict(plan[0]["Plan"])


def _buffers(conn: psycopg.Connection[Any], sql: str) -> int:
    plan = _explain(conn, sql, True)
    return int(plan["Shared Hit Blocks"]) + int(plan["Shared Read Blocks"])


def _nodes(plan: dict[str, Any]) -> list[str]:
    names = [str(plan["Node Type"]) + (f" ({plan['Index Name']})" if "Index Name" in plan else "")]
    for child in plan.get("Plans", []):
        names += _nodes(child)
    return names


def load(conn: psycopg.Connection[Any], rows: int) -> None:
    """Per type: ``da_flat_<i>``/``da_apart_<i>`` (101 rows, row 0's value in the row or apart) and
    ``da_big_<i>`` (``rows`` rows, a B-tree index on ``x``)."""
    for i, (column_type, (values, apart, ordinary, flat_pad)) in enumerate(TYPES.items()):
        for kind, value, pad in (("flat", ordinary, flat_pad), ("apart", apart, WIDE_PAD)):
            table = f"da_{kind}_{i}"
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"CREATE TABLE {table} (id int, x {column_type}, pad text)")
            conn.execute(f"ALTER TABLE {table} ALTER COLUMN pad SET STORAGE MAIN, ALTER COLUMN x SET STORAGE EXTERNAL")
            conn.execute(f"INSERT INTO {table} SELECT g, {values}, NULL FROM generate_series(1, 100) g")
            conn.execute(f"INSERT INTO {table} SELECT 0, {value}, {pad}")
            conn.execute(f"VACUUM ANALYZE {table}")
        placed = conn.execute(f"SELECT {_in_line('x', column_type)} FROM da_flat_{i} WHERE id = 0 UNION ALL "
                              f"SELECT {_in_line('x', column_type)} FROM da_apart_{i} WHERE id = 0").fetchall()
        assert placed == [(True,), (False,)], (column_type, placed)
        big = f"da_big_{i}"
        conn.execute(f"DROP TABLE IF EXISTS {big}")
        conn.execute(f"CREATE TABLE {big} AS SELECT g AS id, "
                     f"CAST({values.replace('g % 100', 'g')} AS {column_type}) AS x FROM generate_series(1, {rows}) g")
        conn.execute(f"CREATE INDEX ON {big} (x)")
        conn.execute(f"VACUUM ANALYZE {big}")


def extra_buffers(conn: psycopg.Connection[Any]) -> dict[tuple[str, str, str], int | None]:
    """Per (type, construct, form): the shared buffers a count reads on ``da_apart_<i>`` beyond
    ``da_flat_<i>`` (None where the form does not apply). COUNT(DISTINCT) has a raw and a bounded form."""
    out: dict[tuple[str, str, str], int | None] = {}
    for i, column_type in enumerate(TYPES):
        stored = conn.execute(f"SELECT quote_literal(x) FROM da_apart_{i} WHERE id = 0").fetchone()
        assert stored is not None
        for name, (joiner, term, count, top) in _constructs(column_type, str(stored[0])).items():
            for form in FORMS:
                where = _render(form, column_type, joiner, term, count, top)
                out[column_type, name, form] = None if where is None else (
                    _buffers(conn, _statement(form, f"da_apart_{i}", column_type, where))
                    - _buffers(conn, _statement(form, f"da_flat_{i}", column_type, where)))
        for form in FORMS:
            x = {"raw": "x", "bounded": f"(CASE WHEN {_in_line('x', column_type)} THEN x END)"}.get(form)
            out[column_type, "COUNT(DISTINCT)", form] = None if x is None else (
                _buffers(conn, f"SELECT count(DISTINCT {x}) FROM da_apart_{i}")
                - _buffers(conn, f"SELECT count(DISTINCT {x}) FROM da_flat_{i}"))
    return out


def plans(conn: psycopg.Connection[Any]) -> dict[tuple[str, str, str], list[str]]:
    """Per (type, statement, form): the plan's nodes on ``da_big_<i>``, for a selective ``=`` and
    IN list and an unselective count (``x > 'row'``, ``x > 0``: every row)."""
    out = {}
    for i, column_type in enumerate(TYPES):
        constructs = _constructs(column_type)
        every = "0" if column_type.startswith("numeric") else "'row'"

        def unselective(c: str, i: int, every: str = every) -> str:
            return f"{c} > {every}"
        for name, (joiner, term, count, top) in (("one =", constructs["one ="]),
                                                 ("IN (64 values), hashed", constructs["IN (64 values), hashed"]),
                                                 ("count, x > (every row)", (" AND ", unselective, 1, True))):
            for form in FORMS:
                where = _render(form, column_type, joiner, term, count, top)
                assert where is not None
                conn.execute(f"SET enable_indexonlyscan = {'off' if form == 'dpproxy' else 'on'}")
                out[column_type, name, form] = _nodes(_explain(conn, _statement(form, f"da_big_{i}", column_type, where), False))
        conn.execute("RESET enable_indexonlyscan")
    return out


def report(buffers: dict[tuple[str, str, str], int | None], planned: dict[tuple[str, str, str], list[str]]) -> str:
    """Both as Markdown tables, a row per type and construct, a column per form."""
    lines = []
    for header, cells in (("construct: extra buffers", {k: "–" if v is None else f"+{v}" for k, v in buffers.items()}),
                          ("statement on the indexed table: plan", {k: " › ".join(v) for k, v in planned.items()})):
        lines += ["", f"| type | {header} | " + " | ".join(FORMS) + " |", "|---|---|" + "---|" * len(FORMS)]
        rows = dict.fromkeys((column_type, name) for column_type, name, _ in cells)
        lines += [f"| {column_type} | {name} | " + " | ".join(cells[column_type, name, form] for form in FORMS) + " |"
                  for column_type, name in rows]
    return "\n".join(lines)


def on_loaded_server(rows: int, measure: Callable[[psycopg.Connection[Any]], str]) -> None:
    """Print ``measure`` of a connection (jit off) to a PostgreSQL of its own (pgserver, removed
    after) holding :func:`load`'s tables, the indexed ones of ``rows`` rows."""
    import pgserver

    data = Path(tempfile.mkdtemp(prefix="dpproxy-declared-apart-"))
    server = pgserver.get_server(data, cleanup_mode="stop")
    try:
        with psycopg.connect(server.get_uri("postgres"), autocommit=True) as conn:
            conn.execute("SET jit = off")
            load(conn, rows)
            print(measure(conn))
    finally:
        server.cleanup()
        shutil.rmtree(data, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows of the indexed table (default 1,000,000)")
    args = parser.parse_args(argv)
    on_loaded_server(args.rows, lambda conn: report(extra_buffers(conn), plans(conn)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
