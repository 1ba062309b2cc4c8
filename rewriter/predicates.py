"""The safe predicate language of WHERE clauses on protected tables (SPEC §3).

A predicate may compare columns with literals or parameters (=, <>, <, <=, >, >=,
BETWEEN, IN (literals), IS [NOT] NULL, [NOT] LIKE/ILIKE 'pattern'), combine them with
AND/OR/NOT, and apply lower()/upper() to a column. Nothing else: no arithmetic, casts or
other functions on columns (each is an error or timing oracle on single rows), no
subqueries, no system columns. The validated predicate is re-rendered by sqlglot, so the
backend runs exactly what was checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlglot import exp

if TYPE_CHECKING:
    from .dp_query import Scope

__all__ = ["validate_predicate"]

_LOGICAL = (exp.And, exp.Or, exp.Not, exp.Paren)
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_PATTERNS = (exp.Like, exp.ILike)
_CASE_FUNCTIONS = (exp.Lower, exp.Upper)


def validate_predicate(predicate: exp.Expression, scope: Scope) -> str:
    """Check ``predicate`` against the safe language; return it as SQL with bare column names."""
    _check(predicate, scope)
    rendered = predicate.copy()
    for column in rendered.find_all(exp.Column):
        column.set("table", None)
    return rendered.sql(dialect="postgres")


def _check(node: exp.Expression, scope: Scope) -> None:
    if isinstance(node, _LOGICAL):
        for child in (node.this, node.args.get("expression")):
            if child is not None:
                _check(child, scope)
    elif isinstance(node, _COMPARISONS):
        _check_operands(node.this, node.expression, scope)
    elif isinstance(node, exp.Between):
        _check_column_side(node.this, scope)
        _check_value(node.args["low"], scope)
        _check_value(node.args["high"], scope)
    elif isinstance(node, exp.In):
        if node.args.get("query") is not None or node.args.get("unnest") is not None or not node.expressions:
            raise scope.refuse("IN takes a list of literals on protected table", "safe-predicate")
        _check_column_side(node.this, scope)
        for value in node.expressions:
            _check_value(value, scope)
    elif isinstance(node, exp.Is):
        if not isinstance(node.expression, exp.Null):
            raise scope.refuse("only IS [NOT] NULL is allowed in WHERE on protected table", "safe-predicate")
        _check_column_side(node.this, scope)
    elif isinstance(node, _PATTERNS):
        _check_column_side(node.this, scope)
        if not (isinstance(node.expression, exp.Literal) and node.expression.is_string):
            raise scope.refuse("LIKE/ILIKE takes a literal pattern on protected table", "safe-predicate")
    elif isinstance(node, exp.Boolean):
        return
    else:
        raise scope.refuse(f"{_describe(node)} is not allowed in WHERE on protected table", "safe-predicate")


def _check_operands(left: exp.Expression, right: exp.Expression, scope: Scope) -> None:
    """A comparison needs a column on at least one side and a column or value on the other."""
    if _is_value(left):
        left, right = right, left
    _check_column_side(left, scope)
    if _is_column_side(right):
        _check_column_side(right, scope)
    else:
        _check_value(right, scope)


def _is_column_side(node: exp.Expression) -> bool:
    return isinstance(node, exp.Column) or (isinstance(node, _CASE_FUNCTIONS) and isinstance(node.this, exp.Column))


def _check_column_side(node: exp.Expression, scope: Scope) -> None:
    if isinstance(node, _CASE_FUNCTIONS):
        node = node.this
    if not isinstance(node, exp.Column) or isinstance(node.this, exp.Star):
        raise scope.refuse(f"{_describe(node)} is not allowed in WHERE on protected table", "safe-predicate")
    scope.column(node)


def _is_value(node: exp.Expression) -> bool:
    # Signs, casts and parentheses around a literal are constants: pgjdbc's
    # preferQueryMode=simple inlines a parameter as ('40'::int4).
    while isinstance(node, (exp.Neg, exp.Cast, exp.Paren)):
        node = node.this
    return isinstance(node, (exp.Literal, exp.Null, exp.Boolean, exp.Parameter, exp.Placeholder))


def _check_value(node: exp.Expression, scope: Scope) -> None:
    if not _is_value(node):
        raise scope.refuse(f"{_describe(node)} is not allowed in WHERE on protected table", "safe-predicate")


def _describe(node: exp.Expression) -> str:
    if isinstance(node, exp.Cast):
        return "a cast of a column"
    if isinstance(node, exp.Func):
        return f"function {node.sql_name().lower()}()"
    if isinstance(node, (exp.Subquery, exp.Select, exp.Exists)):
        return "a subquery"
    if isinstance(node, exp.Binary):
        return f"operator {type(node).__name__.lower()}"
    return f"expression {node.sql('postgres')[:60]!r}"
