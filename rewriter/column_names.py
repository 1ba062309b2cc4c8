"""The names PostgreSQL gives a SELECT's output columns, read from its own parse tree (pglast).

An output column without ``AS`` is named by PostgreSQL's ``FigureColname``
(src/backend/parser/parse_target.c): a column reference by its column, a function call by its
function, a cast by what it casts (or else its type), ``CASE`` by its ELSE branch (or else
``case``), and so on; anything else is ``?column?``. dpproxy writes the outer statement of a
post-processed DP answer with sqlglot, whose own rendering renames functions
(``date_trunc`` → ``TIMESTAMP_TRUNC``, ``now()`` → ``CURRENT_TIMESTAMP``): naming each output
column from the analyst's own text, as PostgreSQL would, keeps the client's column names
PostgreSQL's.
"""

from __future__ import annotations

from typing import Any

__all__ = ["output_names"]

_UNNAMED = "?column?"

_SQL_VALUE_FUNCTIONS = {
    "SVFOP_CURRENT_DATE": "current_date",
    "SVFOP_CURRENT_TIME": "current_time",
    "SVFOP_CURRENT_TIME_N": "current_time",
    "SVFOP_CURRENT_TIMESTAMP": "current_timestamp",
    "SVFOP_CURRENT_TIMESTAMP_N": "current_timestamp",
    "SVFOP_LOCALTIME": "localtime",
    "SVFOP_LOCALTIME_N": "localtime",
    "SVFOP_LOCALTIMESTAMP": "localtimestamp",
    "SVFOP_LOCALTIMESTAMP_N": "localtimestamp",
    "SVFOP_CURRENT_ROLE": "current_role",
    "SVFOP_CURRENT_USER": "current_user",
    "SVFOP_USER": "user",
    "SVFOP_SESSION_USER": "session_user",
    "SVFOP_CURRENT_CATALOG": "current_catalog",
    "SVFOP_CURRENT_SCHEMA": "current_schema",
}


def output_names(select: dict[str, Any], depth: int = 0) -> list[str | None] | None:
    """The output column names of a pglast ``SelectStmt`` node, or of the SELECT ``depth``
    levels down its chain of FROM subqueries; None for a ``*`` target (its names are the
    relation's); None if there is no such level or it is no plain SELECT list."""
    for _ in range(depth):
        sources = select.get("fromClause") or []
        if len(sources) != 1 or "RangeSubselect" not in sources[0]:
            return None
        select = sources[0]["RangeSubselect"]["subquery"].get("SelectStmt", {})
    targets = select.get("targetList")
    if not targets:
        return None
    names: list[str | None] = []
    for target in targets:
        res = target.get("ResTarget", {})
        value = res.get("val", {})
        if res.get("name"):
            names.append(res["name"])
        elif "ColumnRef" in value and "A_Star" in value["ColumnRef"]["fields"][-1]:
            names.append(None)
        else:
            names.append(_figure(value)[0] or _UNNAMED)
    return names


def _figure(node: dict[str, Any]) -> tuple[str | None, int]:
    """FigureColnameInternal: a name and its strength (2: a real name, 1: a fallback, 0: none)."""
    if not node:
        return None, 0
    ((kind, value),) = node.items()
    if kind == "ColumnRef":
        last = value["fields"][-1]
        return (last["String"]["sval"], 2) if "String" in last else (None, 0)
    if kind == "A_Indirection":
        last = value["indirection"][-1]
        return (last["String"]["sval"], 2) if "String" in last else _figure(value["arg"])
    if kind == "FuncCall":
        return value["funcname"][-1]["String"]["sval"], 2
    if kind == "A_Expr":
        return ("nullif", 2) if value.get("kind") == "AEXPR_NULLIF" else (None, 0)
    if kind == "TypeCast":
        name, strength = _figure(value.get("arg", {}))
        if strength <= 1:
            names = value.get("typeName", {}).get("names", [])
            if names and "String" in names[-1]:
                return names[-1]["String"]["sval"], 1
        return name, strength
    if kind == "CollateClause":
        return _figure(value.get("arg", {}))
    if kind == "GroupingFunc":
        return "grouping", 2
    if kind == "SubLink":
        link = value.get("subLinkType")
        if link == "EXISTS_SUBLINK":
            return "exists", 2
        if link == "ARRAY_SUBLINK":
            return "array", 2
        if link == "EXPR_SUBLINK":
            inner = output_names(value.get("subselect", {}).get("SelectStmt", {}))
            return (inner[0], 2) if inner and inner[0] not in (None, _UNNAMED) else (None, 0)
        return None, 0
    if kind == "CaseExpr":
        name, strength = _figure(value.get("defresult", {}))
        return (name, strength) if strength > 1 else ("case", 1)
    if kind == "A_ArrayExpr":
        return "array", 1
    if kind == "RowExpr":
        return "row", 1
    if kind == "CoalesceExpr":
        return "coalesce", 2
    if kind == "MinMaxExpr":
        return ("greatest" if value.get("op") == "IS_GREATEST" else "least"), 2
    if kind == "SQLValueFunction":
        name = _SQL_VALUE_FUNCTIONS.get(value.get("op", ""))
        return (name, 2) if name else (None, 0)
    return None, 0
