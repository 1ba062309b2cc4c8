"""Row-independent expressions in WHERE: which ones dpproxy folds, and the SQL that folds them.

BI tools compare columns with computed constants: Superset's time filter
``ts >= TO_TIMESTAMP('2024-01-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US')``,
``now() - interval '1 year'``, ``current_date - 30``, ``50000 + 1``. Such an expression is
*foldable* if it references no column and no subquery and is built only from literals,
parameters, casts to built-in scalar types, the arithmetic operators ``+ - * / %``, the
date/time value functions (``CURRENT_DATE``, ``CURRENT_TIMESTAMP``, ``LOCALTIMESTAMP`` ...)
and the functions of :data:`FUNCTIONS`, an explicit allowlist of immutable or stable
pg_catalog functions of dates, times and numbers. Never a volatile function (``random()``,
``nextval()``, ``pg_sleep()``, ``set_config()``, ``clock_timestamp()``), nor anything that
reads data, files, sizes or statistics.

dpproxy never lets PostgreSQL evaluate such an expression next to the rows. It evaluates
every foldable expression of a statement first, in one round trip of its own that reads no
table (:func:`fold_query`), in the analyst's session (TimeZone, DateStyle apply) with the
statement's parameters, before anything is charged; then it puts each value into the DP
query as a typed literal of the **column's own type**. Why that is safe:

* The fold query reads no relation, so its value, its error (22007 from ``to_timestamp``,
  22008 from a cast out of range ...) and its time are the same on every database: they
  depend on the statement, its parameters and the session's settings, which the analyst
  already knows. Its error is returned as PostgreSQL wrote it, and nothing is charged.
* The value is cast to the column's type *inside the fold query*, so the per-row comparison
  compares two values of one type, which cannot fail. Left in place, ``ts >= to_timestamp(..)``
  on a ``timestamp`` column would compare timestamp with timestamptz, converting each row's
  value; near the limits of the type that conversion may fail for some rows only (or, while
  planning, for a column statistic), an error oracle on the rows. If the cast fails, it fails
  in the fold query, where no row is involved.
* After folding, the DP query holds only the shapes accepted before (column, operator, typed
  literal), so planner estimates against the column statistics and per-row work are what
  they were for a literal.
* Casting may round (a ``timestamptz`` to a ``date``, ``0.5`` to a ``float8``). The fold query
  also returns whether the rounded value is below or above the exact one, and the comparison
  is adjusted so that it selects exactly the rows PostgreSQL's own comparison would
  (:func:`folded_comparison`): ``d >= now()`` on a date column becomes ``d > current date``
  when ``now()`` is past midnight. Integer columns are compared with ``numeric`` (an
  integer to numeric conversion cannot fail), so ``age > 40.5`` keeps its meaning.

The expression's SQL is checked and pinned to pg_catalog on PostgreSQL's own parse tree
(:mod:`pglast`), the tree that will run, not on sqlglot's reading of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from pglast import ast, parse_sql
from pglast.enums import A_Expr_Kind, SQLValueFunctionOp
from pglast.parser import ParseError

from .qualify import qualify
from .sized_cache import sized_cache
from .sql_text import literal, operator
from .types import FLOAT4, FLOAT8, INT2, INT4, INT8, NUMERIC

__all__ = ["FUNCTIONS", "HINT", "Fold", "Folding", "NotFoldable", "column_type_name", "fold_query", "fold_type",
           "folded_comparison", "qualified_constant"]

# Immutable or stable pg_catalog functions of dates, times and numbers that BI tools send.
# Each computes from its arguments (and the session's TimeZone/DateStyle) only.
FUNCTIONS = frozenset({
    "now", "transaction_timestamp", "statement_timestamp", "to_timestamp", "to_date", "to_number",
    "date_trunc", "date_part", "extract", "make_date", "make_time", "make_timestamp", "make_timestamptz",
    "make_interval", "date_add", "date_subtract", "timezone", "justify_days", "justify_hours",
    "justify_interval", "abs", "round", "trunc", "floor", "ceil", "ceiling", "mod",
})
_OPERATORS = frozenset({"+", "-", "*", "/", "%"})
_VALUE_FUNCTIONS = frozenset({
    SQLValueFunctionOp.SVFOP_CURRENT_DATE, SQLValueFunctionOp.SVFOP_CURRENT_TIME,
    SQLValueFunctionOp.SVFOP_CURRENT_TIME_N, SQLValueFunctionOp.SVFOP_CURRENT_TIMESTAMP,
    SQLValueFunctionOp.SVFOP_CURRENT_TIMESTAMP_N, SQLValueFunctionOp.SVFOP_LOCALTIME,
    SQLValueFunctionOp.SVFOP_LOCALTIME_N, SQLValueFunctionOp.SVFOP_LOCALTIMESTAMP,
    SQLValueFunctionOp.SVFOP_LOCALTIMESTAMP_N,
})
_CAST_TYPES = frozenset({
    "int2", "int4", "int8", "float4", "float8", "numeric", "date", "time", "timestamp", "timestamptz",
    "interval", "text", "varchar", "bpchar",
})
# The type a folded value takes, by the column's type OID: the column's own type (a time column's
# ``t < current_time`` is PostgreSQL's ``t::timetz < current_time``, both in the session's offset of
# today, which orders as ``t < current_time::time``), except
# integers, compared with numeric (exact, and int → numeric cannot fail), and real, compared
# with double precision (real → double precision cannot fail either, and keeps the value's meaning).
_FOLD_TYPES: dict[int, str] = {
    INT2: "numeric", INT4: "numeric", INT8: "numeric", NUMERIC: "numeric", FLOAT4: "float8", FLOAT8: "float8",
    1082: "date", 1083: "time", 1114: "timestamp", 1184: "timestamptz", 1266: "timetz",
}
# The pg_catalog name of each type a folded value is compared with (_FOLD_TYPES' keys).
_COLUMN_TYPES: dict[int, str] = {
    INT2: "int2", INT4: "int4", INT8: "int8", NUMERIC: "numeric", FLOAT4: "float4", FLOAT8: "float8",
    1082: "date", 1083: "time", 1114: "timestamp", 1184: "timestamptz", 1266: "timetz",
}
assert _COLUMN_TYPES.keys() == _FOLD_TYPES.keys()
_TOKEN = re.compile("\x00[0-9]+\x00")
HINT = (
    "A computed value in WHERE may use literals, parameters, casts, + - * / %, CURRENT_DATE/CURRENT_TIMESTAMP "
    "and the date/time and arithmetic functions " + ", ".join(sorted(FUNCTIONS)) + "; never a column or a subquery."
)


@dataclass(frozen=True)
class Fold:
    """One comparison ``column op <expression>`` whose expression is folded before the query runs.

    ``token`` is ``\\x00<n>\\x00`` (n its index among the plan's folds): no SQL text holds a NUL.

    ``expression`` is the pinned SQL of the expression, ``type_name`` the pg_catalog type its
    value is cast to, ``token`` what stands for the whole comparison in the plan's template.

    ``column_type`` is the column's own pg_catalog type, which :func:`fold_query` compares the
    expression with first, as PostgreSQL resolves ``column op expression`` (``d = '20000501' - 7`` is
    its 42883, no operator ``date = integer``, not the cast's 42846). ``in_list``: for the first fold
    of an IN list, the list's values in order, each with whether it is an untyped string or NULL,
    which PostgreSQL types by the comparison: it transforms every value of the list before it
    compares the column with any, so a value's own error (``'May 1' + 1``: 22P02) comes before a
    comparison's (:func:`fold_query` checks them in that order). ``in_list_member``: a later fold of
    such a list, checked with it.
    """

    column_sql: str
    op: str
    expression: str
    type_name: str
    token: str
    column_type: str | None = None
    in_list: tuple[tuple[str, bool], ...] = ()
    in_list_member: bool = False

    @property
    def inline(self) -> str:
        """The comparison with the expression left in place (for Describe, which runs nothing)."""
        return operator(self.column_sql, self.op, f"CAST(({self.expression}) AS pg_catalog.{self.type_name})")


@dataclass(frozen=True)
class Folding:
    """What a DP query's WHERE still needs from its execution: folded values, checked parameters.

    ``template`` is the rendered predicate with each fold's ``token`` in place of its
    comparison; ``like_parameters`` are the numbers of the parameters used as LIKE/ILIKE
    patterns, whose values are checked when they are bound (:mod:`rewriter.like_patterns`).
    """

    template: str | None
    folds: tuple[Fold, ...]
    like_parameters: tuple[int, ...]
    # The templates of the plan's aggregates' FILTERs (rewriter.conditional), one per aggregate
    # (None for one without); their tokens are numbered with the WHERE's.
    filters: tuple[str | None, ...] = ()
    # Of like_parameters, those of an ILIKE (once each per use), and the UTF-8 bytes of the
    # statement's literal ILIKE patterns: their sum is limited (like_patterns.case_folded_refusal).
    ilike_parameters: tuple[int, ...] = ()
    ilike_bytes: int = 0
    # Each use of a pattern parameter on a text column: its number and the bytes of the column's values
    # read (rewriter.text_bounds.value_bytes). The plan's text work counted its part after % as one
    # character; the bound pattern's own part is added when it is bound (proxy.dp.folding).
    like_weights: tuple[tuple[int, int], ...] = ()

    @property
    def inline(self) -> str:
        """The predicate with every expression left in place: valid SQL to describe, never to run."""
        return self.fill(self.template or "", [fold.inline for fold in self.folds])

    def inline_filters(self) -> tuple[str | None, ...]:
        """The FILTERs with every expression left in place, as :attr:`inline`."""
        comparisons = [fold.inline for fold in self.folds]
        return tuple(None if text is None else self.fill(text, comparisons) for text in self.filters)

    def filled(self, comparisons: Sequence[str]) -> str:
        """The template with each fold's token replaced by the comparison at its index in ``folds``."""
        return self.fill(self.template or "", comparisons)

    def fill(self, text: str, comparisons: Sequence[str]) -> str:
        """``text`` (a template of this folding) with each fold's token replaced by the comparison
        at its index in ``folds``.

        In one pass: replacing token by token read the whole template once per fold, and a
        long IN list beside 500 folds took 1.3 s (at bind time, on the event loop).
        """
        by_token = {fold.token: comparison for fold, comparison in zip(self.folds, comparisons, strict=True)}
        return _TOKEN.sub(lambda match: by_token[match.group()], text)


def fold_type(type_oid: int) -> str | None:
    """The pg_catalog type a folded value compared with a column of ``type_oid`` takes, or None."""
    return _FOLD_TYPES.get(type_oid)


def column_type_name(type_oid: int) -> str | None:
    """The pg_catalog name of a column type :func:`fold_type` folds values for, or None."""
    return _COLUMN_TYPES.get(type_oid)


def qualified_constant(sql: str) -> str:
    """``sql`` (one scalar expression) pinned to pg_catalog; NotFoldable (or Refusal from pinning) if it is not foldable."""
    return _qualified_constant(sql)


@sized_cache(1024, 1024 * 1024, lambda text, sql: len(sql) + len(text))
def _qualified_constant(sql: str) -> str:
    try:
        (raw,) = parse_sql(f"SELECT {sql}")
        statement: Any = raw.stmt
        (target,) = statement.targetList
    except (ParseError, ValueError) as exc:
        raise _refuse(f"the expression {sql[:60]!r}, which dpproxy cannot read,") from exc
    _check(target.val)
    text = qualify(f"SELECT {sql}")
    assert text.startswith("SELECT ")
    return text[len("SELECT "):]


def fold_query(folds: tuple[Fold, ...]) -> str:
    """One SELECT that evaluates every fold, reading no table.

    Per fold three columns: the value cast to the fold's type, as text; and whether that text,
    read back as the fold's type in this same session, is below / above the exact value.
    Reading the text back makes the flags describe the literal the DP query will hold.

    Its levels fail, where the statement does, as PostgreSQL parses it: the innermost computes each
    expression (an IN list's values all first, in order: :attr:`Fold.in_list`), the next compares a
    NULL of the column's type with each (an IN list's untyped strings too, in the list's order), as
    PostgreSQL's comparison resolves its operator (42883 where it has none) and types an untyped
    string (22007 for a date that is none); only then is each value cast to the fold's type.
    """
    values, checks, inner, outer = [], [], [], []
    for index, fold in enumerate(folds):
        for position, (value, untyped) in enumerate(fold.in_list):
            if not untyped:
                values.append(f"({value}) AS l{index}_{position}")
        values.append(f"({fold.expression}) AS e{index}")
        null = f"CAST(NULL AS pg_catalog.{fold.column_type})"
        for position, (value, untyped) in enumerate(fold.in_list):
            checks.append(operator(null, fold.op, value if untyped else f"g.l{index}_{position}"))
        if fold.column_type is not None and not fold.in_list and not fold.in_list_member:
            checks.append(operator(null, fold.op, f"g.e{index}"))
        inner.append(f"CAST(c.e{index} AS pg_catalog.{fold.type_name}) AS v{index}")
        inner.append(f"c.e{index} AS e{index}")
        text = _TEXT.get(fold.type_name, "CAST({v} AS pg_catalog.text)").format(v=f"f.v{index}")
        back = f"CAST({text} AS pg_catalog.{fold.type_name})"
        outer.extend([text, operator(back, "<", f"f.e{index}"), operator(back, ">", f"f.e{index}")])
    checked = ", ".join([*(f"{check} AS k{number}" for number, check in enumerate(checks)), "g.*"])
    return (f"SELECT {', '.join(outer)} FROM (SELECT {', '.join(inner)} FROM (SELECT {checked} FROM "
            f"(SELECT {', '.join(values)}) AS g) AS c) AS f")


# A folded time value's text, written so that every DateStyle and TimeZone reads it back as the
# same value: ISO's field order, the era spelled out, a timestamptz in UTC. PostgreSQL's own
# output is not always so: under 'SQL, YMD' a date prints 11/26/2026, which YMD reads as the
# 26th month (22008), and under 'German, MDY' 02.01.0099 (2 January), which MDY reads as
# 1 February. Infinite values print the same in every style. A date is written from its parts
# (extract of a date does not convert it to a timestamp, whose range is 20 times shorter).
_ISO = "YYYY-MM-DD HH24:MI:SS.US"
_TEXT = {
    "timestamp": f"CASE WHEN pg_catalog.isfinite({{v}}) THEN pg_catalog.to_char({{v}}, '{_ISO} BC') "
                 "ELSE CAST({v} AS pg_catalog.text) END",
    "timestamptz": f"CASE WHEN pg_catalog.isfinite({{v}}) THEN pg_catalog.to_char(pg_catalog.timezone('UTC', {{v}}), "
                   f"'{_ISO}\"+00\" BC') ELSE CAST({{v}} AS pg_catalog.text) END",
    "date": "CASE WHEN pg_catalog.isfinite({v}) THEN "
            "pg_catalog.to_char(pg_catalog.abs(pg_catalog.extract('year', {v})), 'FM9990000') || '-' || "
            "pg_catalog.to_char(pg_catalog.extract('month', {v}), 'FM00') || '-' || "
            "pg_catalog.to_char(pg_catalog.extract('day', {v}), 'FM00') || "
            "CASE WHEN " + operator("pg_catalog.extract('year', {v})", "<", "0") + " THEN ' BC' ELSE ' AD' END "
            "ELSE CAST({v} AS pg_catalog.text) END",
}


def folded_comparison(fold: Fold, value: str | None, below: bool, above: bool) -> str:
    """The comparison of ``fold`` with its value, selecting exactly the rows the original would.

    ``below``/``above``: the typed value is less/greater than the exact one (it was rounded).
    No value of the type lies strictly between them (casts round to a neighbour), so
    ``x >= e`` is ``x > v`` when v < e, and ``x >= v`` when v > e; ``x = e`` matches no row
    (NULL for a NULL x, as the original), ``x <> e`` every non-NULL x.
    """
    column = fold.column_sql
    if value is None:
        return operator(column, fold.op, f"CAST(NULL AS pg_catalog.{fold.type_name})")
    typed = f"CAST({literal(value)} AS pg_catalog.{fold.type_name})"
    op = fold.op
    if below or above:
        if op == "=":
            return f"(NOT {operator(column, '=', column)})"
        if op == "<>":
            return operator(column, "=", column)
        if below:
            op = {">=": ">", ">": ">", "<=": "<=", "<": "<="}[op]
        else:
            op = {">=": ">=", ">": ">=", "<=": "<", "<": "<"}[op]
    return operator(column, op, typed)


def _check(node: Any) -> None:
    """Refuse anything in ``node`` that is not part of a foldable expression."""
    if isinstance(node, (ast.A_Const, ast.ParamRef)):
        return
    if isinstance(node, ast.TypeCast):
        assert node.typeName is not None
        _check_type(node.typeName)
        _check(node.arg)
        return
    if isinstance(node, ast.A_Expr):
        parts = [part.sval for part in node.name or ()]
        name = parts[-1] if parts else ""
        if node.kind != A_Expr_Kind.AEXPR_OP or name not in _OPERATORS or parts[:-1] not in ([], ["pg_catalog"]):
            raise _refuse(f"operator {name or 'form'} in a computed value")
        for side in (node.lexpr, node.rexpr):
            if side is not None:
                _check(side)
        return
    if isinstance(node, ast.SQLValueFunction):
        if node.op not in _VALUE_FUNCTIONS:
            raise _refuse(f"{getattr(node.op, 'name', '').removeprefix('SVFOP_')} in a computed value")
        return
    if isinstance(node, ast.FuncCall):
        names = [part.sval for part in node.funcname or ()]
        name = names[-1]
        if (name not in FUNCTIONS or names[:-1] not in ([], ["pg_catalog"]) or node.agg_star or node.agg_distinct
                or node.agg_order or node.agg_filter or node.over or node.func_variadic or node.agg_within_group):
            raise _refuse(f"function {'.'.join(names)}() in a computed value")
        for argument in node.args or ():
            if isinstance(argument, ast.NamedArgExpr):
                argument = argument.arg
            _check(argument)
        return
    if isinstance(node, ast.ColumnRef):
        raise _refuse("a column in a computed value")
    if isinstance(node, ast.SubLink):
        raise _refuse("a subquery")
    raise _refuse(f"{type(node).__name__} in a computed value")


def _check_type(type_name: ast.TypeName) -> None:
    names = [part.sval for part in type_name.names or ()]
    if (names[-1] not in _CAST_TYPES or names[:-1] not in ([], ["pg_catalog"]) or type_name.arrayBounds
            or type_name.setof or type_name.pct_type):
        raise _refuse(f"a cast to {'.'.join(names)} in a computed value")
    for modifier in type_name.typmods or ():
        if not (isinstance(modifier, ast.A_Const) and isinstance(modifier.val, ast.Integer)):
            raise _refuse("a type modifier that is not an integer in a computed value")


class NotFoldable(Exception):
    """An expression that is not foldable; ``args[0]`` says what in it is not allowed."""


def _refuse(what: str) -> NotFoldable:
    return NotFoldable(what)
