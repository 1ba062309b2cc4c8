"""What a CHECK constraint declares about a column's values, read from its text alone.

``dpproxy draft-policy`` fills a column's ``bounds`` or ``categories`` only from what the schema
declares, never from rows. This module reads the simple forms of a table's or a domain's CHECK
constraint as PostgreSQL prints it (``pg_get_constraintdef``): a conjunction (``AND``) whose terms
compare one column with a constant — ``x >= 0``, ``x BETWEEN 0 AND 120`` (printed as two
comparisons), ``x IN ('a', 'b')`` (printed as ``x = ANY (ARRAY[...])``). Any other term (an ``OR``,
a function, two columns) declares nothing here and is left out; so is a whole constraint that is
not such a conjunction, since its terms bound no column on their own.

A bound holds for every row PostgreSQL accepts (a CHECK passes on NULL too, which the policy's
bounds never need to cover): values are clamped into the bounds anyway, so a bound wider than the
data is no leak, only more noise.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

import pglast
from pglast import ast
from pglast.enums import A_Expr_Kind, BoolExprType

__all__ = ["Declared", "declared_by_checks"]

# The value types a constant may be cast to and still be read as the number or text it spells.
_NUMBER_TYPES = frozenset({"int2", "int4", "int8", "smallint", "integer", "bigint", "numeric", "float4", "float8",
                           "real", "double precision", "decimal"})
_TEXT_TYPES = frozenset({"text", "varchar", "bpchar", "char", "character varying", "character"})
_LOWER = {">=": False, ">": True}
_UPPER = {"<=": False, "<": True}
_MIRRORED = {">=": "<=", ">": "<", "<=": ">=", "<": ">", "=": "="}


@dataclass
class Declared:
    """What the schema's CHECK constraints declare about one column: a lower and upper bound
    (numbers, or ISO dates and timestamps as text), each maybe strict, and a list of allowed text values."""

    lower: Decimal | str | None = None
    lower_strict: bool = False
    upper: Decimal | str | None = None
    upper_strict: bool = False
    values: tuple[str, ...] | None = None
    sources: list[str] = field(default_factory=list)

    def add_source(self, name: str) -> None:
        if name not in self.sources:
            self.sources.append(name)

    def narrow_lower(self, value: Decimal | str, strict: bool) -> None:
        if self.lower is None or _above(value, self.lower) or (value == self.lower and strict):
            self.lower, self.lower_strict = value, strict

    def narrow_upper(self, value: Decimal | str, strict: bool) -> None:
        if self.upper is None or _above(self.upper, value) or (value == self.upper and strict):
            self.upper, self.upper_strict = value, strict

    def narrow_values(self, values: tuple[str, ...]) -> None:
        self.values = values if self.values is None else tuple(v for v in self.values if v in values)


def _above(a: Decimal | str, b: Decimal | str) -> bool:
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return a > b
    return str(a) > str(b)  # ISO dates, and timestamps of one column, compare as text


def declared_by_checks(constraints: list[tuple[str, str]], value_name: str | None = None) -> dict[str, Declared]:
    """Each column's :class:`Declared`, from the CHECK ``constraints`` (name, definition as
    ``pg_get_constraintdef`` prints it: ``CHECK ((...))``); ``sources`` names the constraints
    that declared it. ``value_name``: read a domain's constraint, whose column is ``VALUE``, as
    being about that name."""
    found: dict[str, Declared] = {}
    for name, definition in constraints:
        expression = _expression(definition)
        if expression is None:
            continue
        for term in _conjuncts(expression):
            _read_term(term, found, name, value_name)
    return found


def _expression(definition: str) -> ast.Node | None:
    text = definition.strip()
    if not text.upper().startswith("CHECK"):
        return None
    text = text[len("CHECK"):].strip()
    if text.upper().endswith("NOT VALID"):  # not checked on the rows already there: declares nothing of them
        return None
    try:
        statements = pglast.parse_sql(f"SELECT {text}")
    except pglast.parser.ParseError:
        return None
    target = statements[0].stmt.targetList  # type: ignore[union-attr]
    return target[0].val if target and len(target) == 1 else None


def _conjuncts(node: ast.Node) -> list[ast.Node]:
    if isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.AND_EXPR:
        return [term for arg in node.args or () for term in _conjuncts(arg)]
    return [node]


def _read_term(term: ast.Node, found: dict[str, Declared], source: str, value_name: str | None) -> None:
    if not isinstance(term, ast.A_Expr) or not term.name or len(term.name) != 1:
        return
    op = term.name[0].sval
    if term.kind == A_Expr_Kind.AEXPR_OP and op in _MIRRORED:
        left, right = _column(term.lexpr, value_name, cast_ok=False), _constant(term.rexpr)
        if left is None or right is None:  # constant <op> column: mirror it
            left, right, op = _column(term.rexpr, value_name, cast_ok=False), _constant(term.lexpr), _MIRRORED[op]
        if left is None or right is None:
            return
        declared = found.setdefault(left, Declared())
        if op in _LOWER or op == "=":
            declared.narrow_lower(right, _LOWER.get(op, False))
        if op in _UPPER or op == "=":
            declared.narrow_upper(right, _UPPER.get(op, False))
        declared.add_source(source)
    elif term.kind in (A_Expr_Kind.AEXPR_OP_ANY, A_Expr_Kind.AEXPR_IN) and op == "=":
        column = _column(term.lexpr, value_name, cast_ok=True)
        values = _text_list(term.rexpr)
        if column is not None and values:
            declared = found.setdefault(column, Declared())
            declared.narrow_values(values)
            declared.add_source(source)


def _column(node: Any, value_name: str | None, cast_ok: bool) -> str | None:
    """The column ``node`` names (maybe cast to text where ``cast_ok``: varchar read as text)."""
    if cast_ok and isinstance(node, ast.TypeCast) and _type_name(node.typeName) in _TEXT_TYPES:
        node = node.arg
    if not isinstance(node, ast.ColumnRef) or not node.fields or len(node.fields) != 1:
        return None
    name = getattr(node.fields[0], "sval", None)
    if value_name is not None:
        return value_name if name == "value" else None
    return name if isinstance(name, str) else None


def _type_name(type_name: Any) -> str | None:
    if not isinstance(type_name, ast.TypeName) or type_name.arrayBounds or not type_name.names:
        return None
    return str(type_name.names[-1].sval)


def _constant(node: Any) -> Decimal | str | None:
    """A number (as a Decimal), or an ISO date or timestamp without time zone (as text) the
    constant ``node`` spells; None for anything else (a string of another type, a timestamp with
    a time zone, whose wall-clock time depends on the session's, NULL, an expression)."""
    time: str | None = None
    cast = False
    while isinstance(node, ast.TypeCast):
        kind = _type_name(node.typeName)
        if kind in ("date", "timestamp"):
            time = kind
        elif kind not in _NUMBER_TYPES:
            return None
        node, cast = node.arg, True
    if isinstance(node, ast.A_Expr) and node.kind == A_Expr_Kind.AEXPR_OP and node.lexpr is None \
            and node.name and node.name[0].sval == "-":  # a unary minus the printer left
        inner = _constant(node.rexpr)
        return -inner if isinstance(inner, Decimal) else None
    if not isinstance(node, ast.A_Const) or node.isnull:
        return None
    value = node.val
    if isinstance(value, ast.Integer):
        text = str(value.ival)
    elif isinstance(value, ast.Float):
        text = str(value.fval)
    elif isinstance(value, ast.String) and cast:  # a string is a number or time only as its cast says
        text = str(value.sval)
    else:
        return None
    if time is not None:
        return text if _iso_time(text, time) else None
    try:
        number = Decimal(text)
    except InvalidOperation:
        return None
    return number if number.is_finite() and math.isfinite(float(number)) else None


def _iso_time(text: str, kind: str) -> bool:
    from datetime import date, datetime

    try:
        read = date.fromisoformat(text) if kind == "date" else datetime.fromisoformat(text)
    except ValueError:
        return False
    return not isinstance(read, datetime) or read.tzinfo is None


def _text_list(node: Any) -> tuple[str, ...] | None:
    """The strings of ``ARRAY['a'::text, ...]`` (maybe cast to ``text[]``) or of ``IN ('a', ...)``."""
    if isinstance(node, ast.TypeCast) and isinstance(node.typeName, ast.TypeName) and node.typeName.arrayBounds:
        node = node.arg
    items = node.elements if isinstance(node, ast.A_ArrayExpr) else node if isinstance(node, tuple) else None
    if not items:
        return None
    values = []
    for item in items:
        while isinstance(item, ast.TypeCast) and _type_name(item.typeName) in _TEXT_TYPES:
            item = item.arg
        if not isinstance(item, ast.A_Const) or not isinstance(item.val, ast.String):
            return None
        values.append(str(item.val.sval))
    return tuple(dict.fromkeys(values))
