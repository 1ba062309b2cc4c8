"""Rewrite catalog statements so that they never reveal row counts or sizes, and see the analyst.

``neutralise_calls`` (on the parse tree, before pinning) replaces every call of a
neutralised function (``NEUTRALISED_FUNCTIONS``: the size functions, pg_blocking_pids) by a
NULL of its result type, and ``current_user``,
``session_user``, ``user`` and ``current_role`` by the analyst's login name, as a ``name``
literal: what they would show had the analyst connected to PostgreSQL directly, not the
service role dpproxy uses. Inside the role argument of a privilege function
(``pg_has_role``, ``has_*_privilege``) they are left alone: the analyst is usually no role on
the backend (naming it would fail with 42704), and what an analyst can read through dpproxy
is what the service role can, so that is the answer the question wants.

``neutralise_pg_class`` (on the text):

Every reference to pg_catalog.pg_class becomes a subquery with the same columns in which
``reltuples``, ``relpages``, ``relallvisible``, (PostgreSQL 18) ``relallfrozen``,
``relfrozenxid`` and ``relminmxid`` are constants (-1 is what PostgreSQL itself reports for a
table never analysed; catalog.py says why each is replaced). Clients that read them (pgjdbc's
getIndexInfo CARDINALITY) keep working and learn nothing.

Of pg_class's system columns only ``tableoid`` (pg_class's own oid, the same on every row)
is carried, and only into a statement that names a column ``tableoid``, so that ``SELECT *``
keeps pg_class's shape; pgAdmin joins ``pg_depend.classid = cls.tableoid``. The others (``xmin``
and ``ctid`` tell when and in what order relations were written) stay out.

``neutralise_pg_database`` (on the text) does the same for pg_catalog.pg_database, whose
``datfrozenxid`` and ``datminmxid`` are the least of its relations' relfrozenxid and relminmxid.

``empty_relations`` (on the text): every reference to a relation of ``EMPTIED_RELATIONS``
becomes the same relation with no row (``WHERE false``: its columns and types, nothing read).
pgAdmin reads pg_replication_slots and pg_stat_gssapi at connect and fails to connect when
either is refused, and its Dashboard's graphs and Sessions tab draw nothing but its own error
text when pg_stat_database and pg_stat_activity are (catalog.py says why none is released).

A subquery can be named only by an unqualified alias, so column references qualified by
schema (``pg_catalog.pg_class.relname``, as SQLAlchemy writes them) lose the schema.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

from pglast import ast, parser
from pglast.enums import SQLValueFunctionOp

from .catalog import EMPTIED_RELATIONS, NEUTRALISED_FUNCTIONS, NEUTRALISED_PG_CLASS_COLUMNS, NEUTRALISED_PG_DATABASE_COLUMNS

__all__ = ["empty_relations", "neutralise_calls", "neutralise_pg_class", "neutralise_pg_database"]

_USER_FUNCTIONS = frozenset({"current_user", "session_user", "user", "current_role"})
# The session-user value functions, with the column name PostgreSQL gives them.
_USER_VALUES = {
    SQLValueFunctionOp.SVFOP_CURRENT_USER: "current_user",
    SQLValueFunctionOp.SVFOP_SESSION_USER: "session_user",
    SQLValueFunctionOp.SVFOP_USER: "user",
    SQLValueFunctionOp.SVFOP_CURRENT_ROLE: "current_role",
}


def neutralise_calls(node: Any, user: str | None) -> Any:
    """``node`` (a pglast AST) with neutralised calls as typed NULLs and, if ``user`` is given, the
    session-user functions as ``user``; returns what replaces ``node``."""
    if isinstance(node, tuple):
        return tuple(neutralise_calls(item, user) for item in node)
    if not isinstance(node, ast.Node):
        return node
    if isinstance(node, ast.FuncCall):
        parts = node.funcname or ()
        name = str(parts[-1].sval)
        schema = str(parts[0].sval) if len(parts) > 1 else "pg_catalog"
        if schema == "pg_catalog" and name in NEUTRALISED_FUNCTIONS:
            return _cast(ast.A_Const(isnull=True), NEUTRALISED_FUNCTIONS[name])
        if schema == "pg_catalog" and name in _USER_FUNCTIONS and not node.args and user is not None:
            return _user_literal(user)
        if name == "pg_has_role" or name.startswith("has_") and name.endswith("_privilege"):
            user = None  # the role argument stays the backend's own (module docstring)
    elif isinstance(node, ast.SQLValueFunction) and node.op in _USER_VALUES and user is not None:
        return _user_literal(user)
    elif isinstance(node, ast.ResTarget) and node.name is None and node.val is not None:
        # A replaced output column keeps the name PostgreSQL would have given it.
        original = node.val
        node.val = neutralise_calls(original, user)
        if node.val is not original:
            node.name = _column_name(original)
        return node
    for attr in node:
        value = getattr(node, attr)
        if isinstance(value, (ast.Node, tuple)):
            setattr(node, attr, neutralise_calls(value, user))
    return node


def _column_name(value: ast.Node) -> str:
    if isinstance(value, ast.SQLValueFunction):
        return _USER_VALUES[SQLValueFunctionOp(value.op or 0)]
    assert isinstance(value, ast.FuncCall)
    return str((value.funcname or ())[-1].sval)


def _user_literal(user: str) -> ast.TypeCast:
    return _cast(ast.A_Const(isnull=False, val=ast.String(sval=user)), "name")


def _cast(value: ast.A_Const, type_name: str) -> ast.TypeCast:
    """``value`` cast to pg_catalog's ``type_name`` (``int4[]``: an array of it)."""
    base = type_name.removesuffix("[]")
    names = (ast.String(sval="pg_catalog"), ast.String(sval=base))
    bounds = (ast.Integer(ival=-1),) if base != type_name else None
    type_ = ast.TypeName(names=names, setof=False, pct_type=False, typemod=-1, arrayBounds=bounds, location=-1)
    return ast.TypeCast(arg=value, typeName=type_, location=-1)


def neutralise_pg_class(sql: str, pg_class_columns: tuple[str, ...], is_pg_class: Any) -> str:
    """Replace each RangeVar for which ``is_pg_class(schema, name)`` holds by a safe subquery."""
    return _neutralise(sql, "pg_class", pg_class_columns, NEUTRALISED_PG_CLASS_COLUMNS, is_pg_class)


def neutralise_pg_database(sql: str, pg_database_columns: tuple[str, ...], is_pg_database: Any) -> str:
    """Replace each RangeVar for which ``is_pg_database(schema, name)`` holds by a subquery in which
    ``datfrozenxid`` and ``datminmxid`` are constants, as pg_class's subquery is built."""
    return _neutralise(sql, "pg_database", pg_database_columns, NEUTRALISED_PG_DATABASE_COLUMNS, is_pg_database)


def _neutralise(sql: str, relation: str, columns: tuple[str, ...], constants: dict[str, str], matches: Any) -> str:
    tree = json.loads(parser.parse_sql_json(sql))
    if any(_column_names(ref)[-1:] == ["tableoid"] for ref in _nodes(tree, "ColumnRef")):
        columns += ("tableoid",)
    return _replace_relations(sql, tree, relation, matches, _subquery(relation, columns, constants))


def empty_relations(sql: str, is_emptied: Any) -> str:
    """Replace each RangeVar of a relation in ``EMPTIED_RELATIONS`` for which
    ``is_emptied(schema, name)`` holds (the name resolves to that catalog relation) by the same
    relation with no row."""
    tree = json.loads(parser.parse_sql_json(sql))
    for name in sorted(EMPTIED_RELATIONS):
        replacement = f"(SELECT * FROM pg_catalog.{name} WHERE false)"
        sql = _replace_relations(sql, tree, name, lambda schema, relname: relname == name and is_emptied(schema, relname),
                                 replacement)
        tree = json.loads(parser.parse_sql_json(sql))
    return sql


def _replace_relations(sql: str, tree: Any, name: str, matches: Any, replacement: str) -> str:
    """``sql`` with each RangeVar for which ``matches(schema, relname)`` holds replaced by
    ``replacement`` (aliased ``name`` when it had no alias), and ``pg_catalog.`` dropped from
    column references ``[db.]pg_catalog.name.col``.

    The parse tree's locations are byte offsets, pglast's scanner gives character offsets:
    locations are converted, so text before the relation may hold any characters.
    """
    encoded = sql.encode("utf-8")
    targets = [node for node in _nodes(tree, "RangeVar") if matches(node.get("schemaname"), node["relname"])]
    if not targets:
        return sql

    def char_offset(location: int) -> int:
        return len(encoded[:location].decode("utf-8"))

    tokens = parser.scan(sql)
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement) character ranges
    for node in targets:
        start, end = _name_extent(tokens, char_offset(node["location"]))
        if not node.get("inh"):  # the JSON tree leaves out a false inh (FROM ONLY)
            start = _only_keyword_start(tokens, start)
        edits.append((start, end, replacement if "alias" in node else f"{replacement} AS {name}"))
    for ref in _nodes(tree, "ColumnRef"):
        prefix = _schema_prefix(tokens, ref, char_offset(ref["location"]), name)
        if prefix is not None:
            edits.append((*prefix, ""))
    pieces: list[str] = []
    cursor = 0
    for start, end, text in sorted(edits):
        pieces += [sql[cursor:start], text]
        cursor = end
    pieces.append(sql[cursor:])
    return "".join(pieces)


def _column_names(ref: dict[str, Any]) -> list[str | None]:
    return [field.get("String", {}).get("sval") for field in ref["fields"]]


def _schema_prefix(tokens: list[Any], ref: dict[str, Any], start: int, relation: str) -> tuple[int, int] | None:
    """Character range of ``[db.]pg_catalog.`` in a column reference ``[db.]pg_catalog.relation.col``."""
    names = _column_names(ref)
    if len(names) < 3 or names[-3:-1] != ["pg_catalog", relation]:
        return None
    index = next(i for i, token in enumerate(tokens) if token.start == start)
    return start, tokens[index + 2 * (len(names) - 2)].start


def _subquery(relation: str, columns: tuple[str, ...], constants: dict[str, str]) -> str:
    items = [f"{constants[c]} AS {c}" if c in constants else c for c in columns]
    return f"(SELECT {', '.join(items)} FROM pg_catalog.{relation})"


def _nodes(node: Any, kind: str) -> Iterator[dict[str, Any]]:
    """Every node of ``kind`` in a pglast JSON parse tree."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == kind:
                yield value
            yield from _nodes(value, kind)
    elif isinstance(node, list):
        for item in node:
            yield from _nodes(item, kind)


def _name_extent(tokens: list[Any], location: int) -> tuple[int, int]:
    """Character range of the (possibly schema-qualified) name that starts at ``location``."""
    index = next(i for i, token in enumerate(tokens) if token.start == location)
    end = tokens[index].end + 1
    while index + 2 < len(tokens) and tokens[index + 1].name == "ASCII_46":
        index += 2
        end = tokens[index].end + 1
    return location, end


def _only_keyword_start(tokens: list[Any], start: int) -> int:
    index = next(i for i, token in enumerate(tokens) if token.start == start)
    if index > 0 and tokens[index - 1].name == "ONLY":
        return tokens[index - 1].start
    return start
