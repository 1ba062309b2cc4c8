"""Constant expressions of a pglast JSON tree: which nodes are one, their SQL, and whether two
of them evaluate alike on a real PostgreSQL (tests/parse_differential.py).

A *constant expression* is an expression node that reads no column, no parameter, no subquery,
calls no aggregate and no volatile function: PostgreSQL gives it one value (or one error) for
the whole statement. dpproxy may rewrite one (sqlglot reads and writes it back; the rewriter
casts it to a column's type), so the differential compares what the analyst's and the backend's
evaluate to, not how they are spelled.

:class:`ConstantEvaluator` asks the backend, in one transaction per session profile (so that
``now()`` is one instant for both sides), whether two expressions are ``IS NOT DISTINCT FROM``
each other, or fail with the same SQLSTATE. Each profile sets the session settings a constant's
reading or value depends on (TimeZone, DateStyle, IntervalStyle, extra_float_digits): a
rewrite that holds under one setting only (a date respelled in ISO order, an interval whose
sign depends on IntervalStyle) does not pass.
"""

from __future__ import annotations

from typing import Any

import psycopg
from pglast import ast
from pglast.stream import RawStream

from rewriter.function_check import nodes_of

__all__ = ["AGGREGATES", "PROFILES", "ConstantEvaluator", "is_constant", "sql_of"]

# Functions whose value changes within a transaction (or that read more than their arguments).
_VOLATILE = frozenset({"random", "clock_timestamp", "statement_timestamp", "timeofday", "setseed", "nextval",
                       "currval", "lastval", "pg_sleep", "gen_random_uuid", "txid_current"})
AGGREGATES = frozenset({"count", "sum", "avg", "min", "max", "mode", "percentile_cont", "percentile_disc",
                         "stddev", "stddev_samp", "stddev_pop", "variance", "var_samp", "var_pop", "string_agg",
                         "array_agg", "bool_and", "bool_or", "every"})
# Nodes that are not expressions of their own (a name, a type) or are left to the structural comparison.
_NOT_EXPRESSIONS = frozenset({"A_Const", "ColumnRef", "String", "Integer", "Float", "Boolean", "BitString",
                              "TypeName", "List", "ResTarget", "SortBy", "CaseWhen", "NamedArgExpr"})

# (TimeZone, DateStyle, IntervalStyle, extra_float_digits): PostgreSQL's defaults, then settings that
# each read or print constants otherwise (a zone with a half-hour offset, day-first dates, SQL-standard
# interval signs, floats printed short).
PROFILES = (("UTC", "ISO, MDY", "postgres", 1), ("America/St_Johns", "SQL, DMY", "sql_standard", 0))

_SCALARS: dict[str, tuple[type[ast.Node], Any]] = {
    "ival": (ast.Integer, 0), "fval": (ast.Float, "0"), "sval": (ast.String, ""),
    "bsval": (ast.BitString, ""), "boolval": (ast.Boolean, False)}


def is_constant(node: dict[str, Any]) -> bool:
    """Whether ``node`` (one pglast JSON node, ``{kind: fields}``) is a constant expression other
    than a bare literal (which the structural comparison reads by value already). A ``Released``
    node (tests/release_differential.py) stands for a released aggregate or key: not a constant."""
    if len(node) != 1:
        return False
    (kind, value), = node.items()
    if kind in _NOT_EXPRESSIONS or not isinstance(value, dict):
        return False
    if any(nodes_of(node, other) for other in ("ColumnRef", "ParamRef", "SubLink", "GroupingFunc", "Released")):
        return False
    for call in nodes_of(node, "FuncCall"):
        name = call["funcname"][-1]["String"]["sval"].lower()
        if (name in _VOLATILE or name in AGGREGATES or call.get("agg_star") or call.get("agg_filter")
                or call.get("over") or call.get("agg_within_group")):
            return False
    return True


def _node(kind: str, fields: dict[str, Any]) -> ast.Node:
    if kind == "A_Const":
        if fields.get("isnull"):
            return ast.A_Const(isnull=True)
        (name, scalar), = [(name, scalar) for name, scalar in fields.items() if name in _SCALARS]
        cls, default = _SCALARS[name]
        return ast.A_Const(isnull=False, val=cls(scalar.get(name, default)))
    cls = getattr(ast, kind)
    slots = cls.__slots__ if isinstance(cls.__slots__, dict) else {}
    return cls(**{name: _ast(item, slots[name].c_type.rstrip("*") if name in slots else "")
                  for name, item in fields.items()})


def _ast(item: Any, kind: str = "") -> Any:
    """pglast's JSON form of a node as pglast's AST (``kind`` names an unwrapped struct's type)."""
    if isinstance(item, list):
        return tuple(_ast(part) for part in item)
    if not isinstance(item, dict):
        return item
    if len(item) == 1 and "List" in item:
        return tuple(_ast(part) for part in item["List"].get("items", ()))
    if len(item) == 1 and isinstance(getattr(ast, next(iter(item)), None), type):
        (name, fields), = item.items()
        return _node(name, fields)
    return _node(kind, item)


def sql_of(node: dict[str, Any]) -> str:
    """``node`` (pglast JSON) written back as SQL that PostgreSQL parses to the same tree."""
    return str(RawStream()(_ast(node)))


class ConstantEvaluator:
    """Whether two constant expressions evaluate alike on the backend at ``dsn``, under every
    session profile of :data:`PROFILES`; answers are cached (one transaction per profile: its
    ``now()`` stays one instant)."""

    def __init__(self, dsn: str) -> None:
        self._connections: list[psycopg.Connection[Any]] = []
        for zone, date_style, interval_style, float_digits in PROFILES:
            conn = psycopg.connect(dsn)
            conn.execute("SET statement_timeout = 5000")
            conn.execute(f"SET TimeZone = '{zone}'")
            conn.execute(f"SET DateStyle = '{date_style}'")
            conn.execute(f"SET IntervalStyle = '{interval_style}'")
            conn.execute(f"SET extra_float_digits = {float_digits}")
            self._connections.append(conn)
        self._known: dict[tuple[str, str], bool] = {}
        self._printed: dict[tuple[str, str], str] = {}
        self.asked = 0

    def close(self) -> None:
        for conn in self._connections:
            conn.close()

    def __call__(self, left: str, right: str) -> bool:
        if left == right:
            return True
        key = (left, right)
        if key not in self._known:
            self.asked += 1
            self._known[key] = all(self._alike(conn, left, right) for conn in self._connections)
        return self._known[key]

    def printed(self, value: str, type_name: str) -> str:
        """``value`` read as a value of ``type_name`` and printed as PostgreSQL sends it (its type's
        output function) under the first session profile, the one dpproxy's own session has at load."""
        key = (value, "printed as " + type_name)
        if key not in self._printed:
            self.asked += 1
            row = self._connections[0].execute(f"SELECT pg_catalog.format('%%s', CAST(%s AS {type_name}))", (value,)).fetchone()
            self._printed[key] = str(row[0]) if row else ""
        return self._printed[key]

    @staticmethod
    def _outcome(conn: psycopg.Connection[Any], sql: str) -> tuple[str, Any]:
        conn.execute("SAVEPOINT constant_value")
        try:
            row = conn.execute(sql).fetchone()
        except psycopg.Error as exc:
            conn.execute("ROLLBACK TO SAVEPOINT constant_value")
            return ("error", exc.sqlstate)
        conn.execute("RELEASE SAVEPOINT constant_value")
        return ("value", row[0] if row else None)

    def _alike(self, conn: psycopg.Connection[Any], left: str, right: str) -> bool:
        both = self._outcome(conn, f"SELECT ({left}) IS NOT DISTINCT FROM ({right})")
        if both == ("value", True):
            return True
        outcomes = [self._outcome(conn, f"SELECT CAST(({side}) AS pg_catalog.text)") for side in (left, right)]
        return outcomes[0][0] == "error" and outcomes[0] == outcomes[1]
