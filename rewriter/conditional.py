"""Conditional aggregates: ``agg(...) FILTER (WHERE p)`` and the CASE forms BI tools send for it.

Metabase's CountIf/SumIf, Tableau's ``COUNT(IIF(p, 1, NULL))`` and ``SUM(IIF(p, x, 0))`` and
Superset's custom SQL metrics restrict one aggregate to the rows where a condition holds.
:func:`unconditional` reads such an aggregate as the plain aggregate it restricts and the
condition ``p``; the caller plans the first as any aggregate and renders ``p`` in WHERE's
safe predicate language (:mod:`rewriter.predicates`), which the backend then applies as the
aggregate's ``FILTER (WHERE p)``. Accepted, and what each means in PostgreSQL:

* ``agg(...) FILTER (WHERE p)``: itself;
* ``COUNT(CASE WHEN p THEN c [ELSE NULL] END)``, c a non-NULL constant: ``COUNT(*) FILTER p``;
* ``COUNT([DISTINCT] CASE WHEN p THEN col [ELSE NULL] END)``, and likewise SUM, AVG, MIN, MAX
  and ``MODE() WITHIN GROUP (ORDER BY CASE ...)``: ``agg([DISTINCT] col) FILTER p`` (the rows
  where p is not true give NULL, which every one of them skips);
* ``SUM(CASE WHEN p THEN 1 [ELSE 0] END)`` (1, 1.0, 0, 0.0): the count of rows where p holds, in
  SUM's result type: ``bigint`` when both constants are integers, else ``numeric``;
* ``SUM(CAST(p AS INT))``, ``SUM((p)::int)``, ``SUM(b::integer)`` for a boolean column b
  (Superset, Metabase, Looker): the count of rows where p holds, as ``bigint`` (SUM of int4);
  PostgreSQL casts a boolean to ``integer`` only, so ``CAST(p AS BIGINT)``/``NUMERIC`` fails
  whatever the rows and is refused with its error, 42846, before any charge;
* ``SUM(CASE WHEN p THEN col ELSE 0 END)`` (0 or 0.0): ``SUM(col) FILTER p`` in the result type
  PostgreSQL gives it: SUM of the CASE's type, the wider of col's type and the constant's
  (``SUM(CASE WHEN p THEN int_col ELSE 0.0 END)`` is ``numeric``). Exactly, it differs from
  the FILTER only by being 0, not NULL, when rows fail p and none holds a value under p:
  whether any row does is what a DP release never tells, so both are released alike.

Each CASE may also be written ``CASE WHEN p THEN v WHEN NOT p THEN e ELSE NULL END`` (Tableau's
``IIF(p, v, e)``; a NULL p gives NULL, as ``ELSE NULL`` does), and in parentheses.

``AVG(CASE WHEN p THEN 1 ELSE 0 END)``, ``AVG(CAST(p AS INT))`` and Tableau's
``AVG(IIF(p, 1, 0))``, the share of rows where p holds, are read by :func:`share` as two counts
(:mod:`rewriter.shares` answers them as post-processing of the two).

Anything else in a CASE inside an aggregate (several WHENs, a simple ``CASE x WHEN``, other
THEN/ELSE values, arithmetic) is refused with a hint naming the FILTER form.

Why each is private: every column is the same aggregate of an accepted statement whose WHERE is
``(where) AND p`` (one row moves ``agg FILTER p`` by at most what it moves ``agg``), so the
columns' ε split is that of the plain columns; p itself is rendered in WHERE's language, which
cannot fail on any row, and never runs anywhere else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sqlglot import exp

from policies.errors import Refusal

from .scope import Scope
from .types import BOOL, FLOAT4, FLOAT8, INT2, INT4, INT8, NUMERIC

__all__ = ["Share", "Unconditional", "share", "unconditional"]

_ONE = re.compile(r"1(?:\.0*)?|1\.")
_ZERO = re.compile(r"0(?:\.0*)?|0\.|\.0+")
# PostgreSQL's numeric types in the order each converts implicitly to the next: a CASE of two
# of them has the later one's type (double precision, the category's preferred type, is last).
_WIDENING = (INT2, INT4, INT8, NUMERIC, FLOAT4, FLOAT8)
_CAST_TO: dict[int, str] = {INT2: "SMALLINT", INT4: "INT", INT8: "BIGINT", NUMERIC: "NUMERIC",
                            FLOAT4: "REAL", FLOAT8: "DOUBLE PRECISION"}
HINT = ("Write the condition as a FILTER: COUNT(*) FILTER (WHERE p), SUM(col) FILTER (WHERE p), AVG(col) FILTER "
        "(WHERE p). The CASE forms answered are COUNT(CASE WHEN p THEN 1 END), COUNT(CASE WHEN p THEN col END), "
        "SUM(CASE WHEN p THEN 1 ELSE 0 END), SUM(CAST(p AS INT)), SUM(CASE WHEN p THEN col ELSE 0 END), "
        "AVG/MIN/MAX(CASE WHEN p THEN col END) and, for the share of rows where p holds, "
        "AVG(CASE WHEN p THEN 1 ELSE 0 END) or AVG(CAST(p AS INT)), with p as in WHERE.")
# Casts a boolean has none to in PostgreSQL (42846 whatever the rows): SUM(CAST(p AS BIGINT)).
_NO_BOOLEAN_CAST = {exp.DataType.Type.SMALLINT: "smallint", exp.DataType.Type.BIGINT: "bigint",
                    exp.DataType.Type.DECIMAL: "numeric", exp.DataType.Type.FLOAT: "real",
                    exp.DataType.Type.DOUBLE: "double precision"}
# Node kinds that are conditions in WHERE's language (a boolean column is one too).
_CONDITIONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.And, exp.Or, exp.Not, exp.Between, exp.In,
               exp.Is, exp.Like, exp.ILike, exp.Boolean)


@dataclass(frozen=True)
class Unconditional:
    """An aggregate read as a plain one (``aggregate``) restricted to the rows where ``condition`` holds.

    ``condition`` is None for an aggregate without one. ``counted_type``: for a SUM that counts
    rows (``SUM(CASE WHEN p THEN 1 ELSE 0.0 END)``), the result type its constants give it
    (``aggregate`` is then ``SUM(1)``, which is planned as a count). ``scale``: the fraction
    digits the CASE's constants give a numeric result (``ELSE 0.0``: 1), which PostgreSQL prints
    when any row fails p; None when the constants give none.
    """

    aggregate: exp.Expression
    condition: exp.Expression | None = None
    counted_type: int | None = None
    scale: int | None = None


@dataclass(frozen=True)
class Share:
    """``AVG`` of an indicator of p: the rows where ``numerator`` holds over those where
    ``denominator`` holds (None: every row the WHERE keeps), each a condition to count under."""

    numerator: exp.Expression
    denominator: exp.Expression | None


def share(item: exp.Expression, scope: Scope) -> Share | None:
    """``item`` (an aggregate, maybe with a FILTER (WHERE q)) as a share of rows, or None if it is not one.

    ``AVG(CASE WHEN p THEN 1 ELSE 0 END)`` averages 1 and 0 over every row, a NULL p giving 0:
    ``COUNT(*) FILTER (WHERE p) / COUNT(*)``. ``AVG(CAST(p AS INT))`` and Tableau's
    ``AVG(CASE WHEN p THEN 1 WHEN NOT p THEN 0 END)`` skip the rows where p is NULL: the
    denominator counts under ``p OR NOT p``, which is true exactly where p is not NULL. With
    ``FILTER (WHERE q)``, both count under q as well. 1 may be 1.0, 0 may be 0.0.
    """
    item, filtered = _filtered(item)
    if not isinstance(item, exp.Avg) or isinstance(item.this, exp.Distinct):
        return None
    argument = _unparenthesised(item.this)
    condition: exp.Expression | None = None
    known: exp.Expression | None = None
    if isinstance(argument, exp.Cast):
        condition = _indicator(argument, scope)
        known = _known(condition) if condition is not None else None
    elif isinstance(argument, exp.Case) and argument.this is None:
        ifs = argument.args.get("ifs") or []
        iif = _iif(argument)
        otherwise = _unparenthesised(ifs[1].args["true"]) if iif else argument.args.get("default")
        if (len(ifs) != (2 if iif else 1) or not _constant_is(ifs[0].args["true"], _ONE)
                or not _constant_is(otherwise, _ZERO)):
            return None
        condition = ifs[0].this
        known = _known(condition) if iif else None
    if condition is None:
        return None
    if filtered is None:
        return Share(condition.copy(), known)
    return Share(_both(filtered, condition.copy()), filtered.copy() if known is None else _both(filtered, known))


def unconditional(item: exp.Expression, scope: Scope) -> Unconditional:
    """``item`` (an output aggregate, unaliased) as a plain aggregate and its condition.

    Refuses (``aggregate-argument``) a CASE inside an aggregate that is none of the accepted
    forms. The condition is not checked here: the caller renders it as it renders WHERE.
    """
    item, filtered = _filtered(item)
    if isinstance(item, exp.WithinGroup) and isinstance(item.this, exp.Mode):
        order = item.expression.expressions if isinstance(item.expression, exp.Order) else []
        case = order[0].this if len(order) == 1 and isinstance(order[0].this, exp.Case) else None
        if case is None:
            return Unconditional(item, filtered)
        condition, then, _ = _case(case, scope, "MODE() WITHIN GROUP (ORDER BY CASE ...)", zero=False)
        mode = item.copy()
        mode.expression.expressions[0].set("this", _column(then, scope, "MODE() WITHIN GROUP (ORDER BY CASE ...)"))
        return Unconditional(mode, _both(filtered, condition))
    if not isinstance(item, exp.AggFunc):
        return Unconditional(item, filtered)
    argument = item.this
    distinct = isinstance(argument, exp.Distinct) and len(argument.expressions) == 1
    if distinct:
        assert isinstance(argument, exp.Distinct)
        argument = argument.expressions[0]
    argument = _unparenthesised(argument)  # Tableau wraps its CASE in parentheses
    if isinstance(argument, exp.Cast):
        indicator = _indicator(argument, scope)
        if indicator is None or (isinstance(indicator, exp.Column) and not isinstance(item, exp.Sum)):
            return Unconditional(item, filtered)  # COUNT(CAST(b AS INT)) is COUNT(b), a plain aggregate
        if not isinstance(item, exp.Sum) or distinct:
            raise _refusal(scope, f"{item.sql_name().upper()}({'DISTINCT ' if distinct else ''}CAST(condition AS INT))")
        return Unconditional(exp.Sum(this=exp.Literal.number(1)), _both(filtered, indicator))
    if not isinstance(argument, exp.Case):
        return Unconditional(item, filtered)
    name = f"{item.sql_name().upper()}({'DISTINCT ' if distinct else ''}CASE ...)"
    summed = isinstance(item, exp.Sum) and not distinct
    condition, then, zero = _case(argument, scope, name, zero=summed)
    plain = item.copy()
    if summed and _constant_is(then, _ONE):
        assert isinstance(then, exp.Literal)
        scale = max(_scale(c) for c in (then, zero) if c is not None)
        plain.set("this", exp.Literal.number(1))
        return Unconditional(plain, _both(filtered, condition), NUMERIC if _is_numeric(then, zero) else None,
                             scale if _is_numeric(then, zero) else None)
    if isinstance(item, exp.Count) and not distinct and _non_null_constant(then):
        plain.set("this", exp.Star())
        return Unconditional(plain, _both(filtered, condition))
    column: exp.Expression = _column(then, scope, name)
    if zero is not None:
        column = _widened(column, zero, scope)
    plain.set("this", exp.Distinct(expressions=[column]) if distinct else column)
    return Unconditional(plain, _both(filtered, condition), scale=_scale(zero) if zero is not None else None)


def _case(case: exp.Case, scope: Scope, name: str, zero: bool) -> tuple[exp.Expression, exp.Expression, exp.Literal | None]:
    """The condition p, the THEN value and the zero constant (None for NULL) of ``CASE WHEN p
    THEN v [ELSE e] END`` or ``CASE WHEN p THEN v WHEN NOT p THEN e [ELSE NULL] END`` (Tableau's
    IIF). e must be NULL or, where ``zero`` allows one, a zero constant (0, 0.0)."""
    ifs = case.args.get("ifs") or []
    otherwise = case.args.get("default")
    otherwise = _unparenthesised(otherwise) if otherwise is not None else None
    if _iif(case):
        otherwise = _unparenthesised(ifs[1].args["true"])  # IIF(p, v, e): p NULL gives NULL, as ELSE NULL
        ifs = ifs[:1]
    if case.this is not None or len(ifs) != 1:
        raise _refusal(scope, f"{name} with {'CASE x WHEN' if case.this is not None else 'several WHENs'}")
    if otherwise is not None and not isinstance(otherwise, exp.Null) and not (zero and _constant_is(otherwise, _ZERO)):
        raise _refusal(scope, f"{name} with ELSE {otherwise.sql('postgres')[:40]}")
    (when,) = ifs
    constant = otherwise if isinstance(otherwise, exp.Literal) else None
    return when.this, _unparenthesised(when.args["true"]), constant


def _filtered(item: exp.Expression) -> tuple[exp.Expression, exp.Expression | None]:
    """``agg(...) FILTER (WHERE q)`` as ``agg(...)`` and q; another item as itself and None."""
    if not isinstance(item, exp.Filter):
        return item, None
    where = item.expression
    return item.this, where.this if isinstance(where, exp.Where) else where


def _iif(case: exp.Case) -> bool:
    """Whether ``case`` is ``CASE WHEN p THEN v WHEN NOT p THEN e [ELSE NULL] END`` (Tableau's IIF(p, v, e))."""
    ifs = case.args.get("ifs") or []
    otherwise = case.args.get("default")
    otherwise = _unparenthesised(otherwise) if otherwise is not None else None
    return (case.this is None and len(ifs) == 2 and isinstance(_unparenthesised(ifs[1].this), exp.Not)
            and _unparenthesised(_unparenthesised(ifs[1].this).this) == _unparenthesised(ifs[0].this)
            and (otherwise is None or isinstance(otherwise, exp.Null)))


def _indicator(cast: exp.Cast, scope: Scope) -> exp.Expression | None:
    """The condition p of ``CAST(p AS INT)`` (1 where p holds, 0 where it fails, NULL where it is
    NULL), or None when the cast is of a value, not a condition (``CAST(age AS BIGINT)``).

    A condition is a node of WHERE's language or a boolean column; the caller renders it as
    WHERE is rendered. A cast of one to another type fails in PostgreSQL whatever the rows:
    refused here with PostgreSQL's error.
    """
    operand = _unparenthesised(cast.this)
    boolean = (isinstance(operand, exp.Column) and not isinstance(operand.this, exp.Star)
               and scope.column(operand).type_oid == BOOL)
    if not isinstance(operand, _CONDITIONS) and not boolean:
        return None
    target = cast.args["to"]
    if isinstance(target, exp.DataType) and target.this == exp.DataType.Type.INT and not target.expressions:
        return operand
    if isinstance(target, exp.DataType) and target.this in _NO_BOOLEAN_CAST:
        type_name = _NO_BOOLEAN_CAST[target.this]
        raise Refusal("42846", f"cannot cast type boolean to {type_name}",
                      f"PostgreSQL casts a condition to integer only: write SUM(CAST(p AS INT)), or "
                      f"CAST(SUM(CAST(p AS INT)) AS {type_name}) for a {type_name} result.", "aggregate-argument")
    raise _refusal(scope, f"CAST(condition AS {target.sql('postgres')[:40]})")


def _known(condition: exp.Expression) -> exp.Expression:
    """``p OR NOT p``: true exactly where p is not NULL (p cannot fail, so it may be read twice)."""
    return exp.Or(this=exp.Paren(this=condition.copy()), expression=exp.Not(this=exp.Paren(this=condition.copy())))


def _scale(constant: exp.Literal) -> int:
    """The fraction digits PostgreSQL gives a numeric constant (``0.0``: 1, ``1.``: 0)."""
    return len(constant.this.partition(".")[2])


def _is_numeric(*constants: exp.Expression | None) -> bool:
    """Whether a CASE of these constants is numeric (one of them has a decimal point), not integer."""
    return any(isinstance(c, exp.Literal) and not c.this.isdigit() for c in constants if c is not None)


def _column(then: exp.Expression, scope: Scope, name: str) -> exp.Column:
    if not isinstance(then, exp.Column) or isinstance(then.this, exp.Star):
        raise _refusal(scope, f"{name} with THEN {then.sql('postgres')[:40]}")
    return then.copy()


def _widened(column: exp.Expression, zero: exp.Literal, scope: Scope) -> exp.Expression:
    """``column`` cast to the type PostgreSQL gives ``CASE ... THEN column ELSE zero END``."""
    assert isinstance(column, exp.Column)
    own = scope.column(column).type_oid
    if own not in _WIDENING:
        return column  # SUM refuses a column that is not numeric
    constant = INT4 if zero.this.isdigit() else NUMERIC
    wider = max(own, constant, key=_WIDENING.index)
    return column if wider == own else exp.Cast(this=column, to=exp.DataType.build(_CAST_TO[wider]))


def _constant_is(node: exp.Expression | None, value: re.Pattern[str]) -> bool:
    node = _unparenthesised(node) if node is not None else None
    return isinstance(node, exp.Literal) and not node.is_string and value.fullmatch(node.this) is not None


def _non_null_constant(node: exp.Expression) -> bool:
    return (isinstance(node, exp.Literal) and (node.is_string or re.fullmatch(r"[0-9.]+", node.this) is not None)) or (
        isinstance(node, exp.Boolean))


def _unparenthesised(node: exp.Expression) -> exp.Expression:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _both(first: exp.Expression | None, second: exp.Expression) -> exp.Expression:
    return second if first is None else exp.And(this=exp.Paren(this=first.copy()), expression=exp.Paren(this=second))


def _refusal(scope: Scope, what: str) -> Refusal:
    refusal = scope.refuse(f"{what} is not answered on protected table", "aggregate-argument")
    refusal.hint = HINT
    return refusal
