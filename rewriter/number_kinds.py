"""The kind of number PostgreSQL makes of an expression (pglast JSON), from its text and the table's
column types alone: for rule ``round-cast`` (rewriter.misreadings), since PostgreSQL has
``round(numeric, integer)`` only and fails ``round(x, n)`` of a double precision ``x``, where sqlglot
writes ``ROUND(CAST(x AS DECIMAL), n)``.

The kinds: ``"int"`` (smallint, integer, bigint), ``"numeric"``, ``"float"`` (real, double
precision), ``"unknown"`` (an untyped string or a parameter, which takes the type of what it meets),
None (anything else: not a number this module knows). Function resolution as PostgreSQL's: of
``ceil``/``floor``/``round``/``trunc`` with one argument it has a numeric and a double precision
form, and an integer or an untyped argument goes to the double precision one (the preferred type of
its category): ``round(5)`` and ``ceil(count(*))`` are double precision, ``round(4.5)`` numeric.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from policies.tables import ColumnInfo

from .types import FLOAT_TYPES, INTEGER_TYPES, NUMERIC

__all__ = ["number_kind"]

_TYPE_KINDS = {"int2": "int", "int4": "int", "int8": "int", "numeric": "numeric", "float4": "float", "float8": "float"}
_ARITHMETIC = frozenset({"+", "-", "*", "/", "%"})
_BOTH_FORMS = frozenset({"ceil", "ceiling", "floor", "round", "trunc"})  # numeric and double precision, one argument
_NUMERIC_ONLY = frozenset({"round", "trunc"})  # with two arguments: numeric only
_SAME_KIND = frozenset({"abs", "mod", "min", "max"})
_DOUBLE_PRECISION = frozenset({"pi", "date_part"})  # double precision whatever their arguments


def _column_kind(column: ColumnInfo | None) -> str | None:
    type_oid = column.value_type[0] if column is not None else 0
    return "int" if type_oid in INTEGER_TYPES else "numeric" if type_oid == NUMERIC else (
        "float" if type_oid in FLOAT_TYPES else None)


def _combined(kinds: list[str | None]) -> str | None:
    """The kind of arithmetic over ``kinds``: float over numeric over int; an untyped side takes the other's."""
    known = [kind for kind in kinds if kind != "unknown"]
    if None in known or not known:
        return None
    return "float" if "float" in known else "numeric" if "numeric" in known else "int"


def _aggregate_kind(name: str, argument: str | None) -> str | None:
    """PostgreSQL's result kind of aggregate ``name`` over an argument of kind ``argument``."""
    if name == "count":
        return "int"
    if name == "sum":
        return argument if argument in ("numeric", "float") else "numeric" if argument == "int" else None
    if name == "avg" or name.startswith(("stddev", "var")):
        return "float" if argument == "float" else "numeric" if argument in ("int", "numeric") else None
    if name in ("percentile_cont",):
        return "float"
    return None


def number_kind(item: dict[str, Any], columns: Mapping[str, ColumnInfo]) -> str | None:
    """The kind of number ``item`` is to PostgreSQL (see the module), ``columns`` the table's by name."""
    if "A_Const" in item:
        const = item["A_Const"]
        return "int" if "ival" in const else "numeric" if "fval" in const else "unknown" if "sval" in const else None
    if "ParamRef" in item:
        return "unknown"
    if "TypeCast" in item:
        return _TYPE_KINDS.get(str(item["TypeCast"]["typeName"]["names"][-1]["String"]["sval"]))
    if "ColumnRef" in item:
        name = item["ColumnRef"]["fields"][-1].get("String", {}).get("sval")
        return _column_kind(columns.get(name)) if isinstance(name, str) else None
    if "A_Expr" in item:
        expression = item["A_Expr"]
        if expression.get("kind") != "AEXPR_OP" or expression["name"][-1]["String"]["sval"] not in _ARITHMETIC:
            return None
        return _combined([number_kind(side, columns) for side in (expression.get("lexpr"), expression.get("rexpr"))
                          if side is not None])
    if "FuncCall" in item:
        call = item["FuncCall"]
        name = call["funcname"][-1]["String"]["sval"]
        arguments = [number_kind(argument, columns) for argument in call.get("args", [])]
        if call.get("agg_star"):
            return "int" if name == "count" else None
        if name in _BOTH_FORMS and len(arguments) == 1:
            return "numeric" if arguments[0] == "numeric" else "float" if arguments[0] in ("int", "float", "unknown") else None
        if name in _NUMERIC_ONLY and len(arguments) == 2:
            return "numeric" if arguments[0] in ("int", "numeric", "unknown") else None
        if name in _DOUBLE_PRECISION:
            return "float"
        if name in _SAME_KIND and arguments:
            return _combined(arguments) if name != "mod" or "float" not in arguments else None
        return _aggregate_kind(name, arguments[0] if len(arguments) == 1 else None)
    return None
