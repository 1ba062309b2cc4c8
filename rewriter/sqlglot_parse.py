"""Parse one PostgreSQL statement with sqlglot, parameters included.

sqlglot's tokenizer reads ``$`` as the start of a dollar-quoted string and, looking for its
tag, scans the rest of the statement; with a ``''`` after a ``$1`` it fails (``a > $1 AND s =
''``) or mis-tokenizes. PostgreSQL's own scanner (pglast) finds the parameters exactly (never
inside a string or a comment); each is handed to sqlglot as a named placeholder and turned
back into ``$n`` in the tree, so the DP-query analyser sees what PostgreSQL would.

sqlglot reads ``date_part('year', x)`` as ``EXTRACT(YEAR FROM x)`` and writes it back so; but
since PostgreSQL 14 the two differ in type (``date_part`` is double precision, ``EXTRACT``
numeric), and dpproxy runs what it writes back (post-processing, WHERE). The call keeps its
spelling here: a :class:`DatePart` node, an ``Extract`` written as ``DATE_PART('field', x)``.

sqlglot writes ``current_time`` back as ``CURRENT_TIME()``, which PostgreSQL cannot parse, so a
condition or an output holding it was refused as unreadable; it is kept as the keyword it is.

sqlglot rewrites an interval string holding one ``<number><unit>`` as ``'<number> <UNIT>'``, which
misreads an ISO 8601 interval but a single designator: ``interval 'P1DT'`` (a day to PostgreSQL) as
``'1 DT'`` (no unit), ``'P2M'`` (two months) as two minutes. Such a string is kept as written
(:func:`iso_kept_as_written`), so PostgreSQL reads in the backend SQL what it reads in the analyst's.

sqlglot reads a collation qualified with pg_catalog (``COLLATE pg_catalog."C"``) as a column of a
table pg_catalog; it is read as the collation's name, which dpproxy pins to pg_catalog anyway.
"""

from __future__ import annotations

import re
from typing import Callable

import sqlglot
from pglast.parser import ParseError, scan
from sqlglot import exp
from sqlglot.dialects.postgres import Postgres
from sqlglot.parsers.postgres import PostgresParser

__all__ = ["DatePart", "ISO_ONE_DESIGNATOR", "VARIANCE_FUNCTIONS", "iso_kept_as_written", "parse_postgres"]


class DatePart(exp.Extract):
    """``date_part('field', source)``: an ``Extract`` whose field is the string literal it was
    written with, rendered (sqlglot's generic function form) as ``DATE_PART('field', source)``."""


# The variance aggregates take one argument; sqlglot fails to parse any other number of them, and
# the analyser would only say it could not read the statement. Read as an anonymous call of that
# name instead, it is refused for what it is (``rewriter.dp_query``).
VARIANCE_FUNCTIONS = {"STDDEV": exp.Stddev, "STDDEV_SAMP": exp.StddevSamp, "STDDEV_POP": exp.StddevPop,
                      "VARIANCE": exp.Variance, "VAR_SAMP": exp.Variance, "VAR_POP": exp.VariancePop}


def _one_argument(name: str, kind: type[exp.Func]) -> Callable[[list[exp.Expression]], exp.Func]:
    def build(args: list[exp.Expression]) -> exp.Func:
        return kind(this=args[0]) if len(args) == 1 else exp.Anonymous(this=name.lower(), expressions=args)

    return build


# One ISO 8601 designator, which sqlglot writes back as '<number> <unit>' of the same meaning: a
# year, week or day (its M would be a month, which sqlglot reads as a minute), or after T an hour,
# minute or second, in capitals (PostgreSQL reads no other). It reads a fraction of each as that
# number of the unit, as sqlglot writes it.
ISO_ONE_DESIGNATOR = re.compile(r"P(?:-?[0-9]+(?:\.[0-9]+)?[YWD]|T-?[0-9]+(?:\.[0-9]+)?[HMS])")


def iso_kept_as_written(value: str) -> bool:
    """Whether the interval string ``value`` is kept as written in dpproxy's reading (:class:`_Parser`):
    an ISO 8601 interval (PostgreSQL reads one where the string starts with ``P``) in which sqlglot
    finds one ``<number><unit>`` (``'P1DT'``, ``'P2M'``), but a single designator
    (:data:`ISO_ONE_DESIGNATOR`: ``'P1D'``, written ``'1 DAY'``, as the time keys read it)."""
    return (value.startswith("P") and len(exp.INTERVAL_STRING_RE.findall(value)) == 1
            and ISO_ONE_DESIGNATOR.fullmatch(value) is None)


class _Parser(PostgresParser):
    FUNCTION_PARSERS = {**PostgresParser.FUNCTION_PARSERS, "DATE_PART": lambda self: self._parse_date_part_call()}
    FUNCTIONS = {**PostgresParser.FUNCTIONS, **{name: _one_argument(name, kind) for name, kind in VARIANCE_FUNCTIONS.items()}}

    def _parse_date_part_call(self) -> exp.Expr:
        extract = self._parse_date_part()
        field = extract.this
        if isinstance(field, exp.Var):
            field = exp.Literal.string(field.name.lower())
        return DatePart(this=field, expression=extract.expression)

    def _parse_interval_span(self, this: exp.Expr, parse_function_unit: bool = True) -> exp.Interval:
        interval = super()._parse_interval_span(this, parse_function_unit=parse_function_unit)
        if this is not None and this.is_string and iso_kept_as_written(this.name) \
                and not isinstance(interval.args.get("unit"), exp.IntervalSpan):
            interval.set("this", this)
            interval.set("unit", None)
            interval.set("fraction_in_string", None)
        return interval


class _DpproxyPostgres(Postgres):
    """PostgreSQL as sqlglot reads it, but for ``date_part``'s spelling (:class:`DatePart`)."""

    Parser = _Parser

_PLACEHOLDER = "dpproxy_param_"


def parse_postgres(sql: str) -> exp.Expr:
    """The sqlglot tree of ``sql`` (one statement); raises sqlglot's ParseError/TokenError."""
    tree = _parsed(sql)
    tree = tree.transform(_current_time) if _CURRENT_TIME.search(sql) else tree
    return tree.transform(_catalog_collation) if _COLLATE.search(sql) else tree


_CURRENT_TIME = re.compile(r"current_time\b", re.IGNORECASE)
_COLLATE = re.compile(r"collate\b", re.IGNORECASE)


def _catalog_collation(node: exp.Expr) -> exp.Expr:
    """A collation written ``pg_catalog."C"`` as its name ``"C"`` (dpproxy pins a collation to pg_catalog
    when it writes it): sqlglot reads the qualified name as the column ``"C"`` of a table pg_catalog,
    and such a statement was refused as that column's 42803 where PostgreSQL answers (found by the
    round-trip check of GROUP BY keys, tests/round_trip_keys.py)."""
    if isinstance(node, exp.Collate) and isinstance(node.expression, exp.Column) and not node.expression.args.get("db") \
            and node.expression.table.lower() == "pg_catalog" and isinstance(node.expression.this, exp.Identifier):
        name = node.expression.this
        # an unquoted name is PostgreSQL's in lower case (pg_catalog.default, a keyword, is "default")
        return exp.Collate(this=node.this, expression=exp.to_identifier(name.this if name.quoted else name.this.lower(),
                                                                         quoted=True))
    return node


def _current_time(node: exp.Expr) -> exp.Expr:
    """``CURRENT_TIME`` without a precision as the keyword (sqlglot writes ``CURRENT_TIME()``)."""
    if isinstance(node, exp.CurrentTime) and node.this is None:
        return exp.Var(this="CURRENT_TIME")
    return node


def _parsed(sql: str) -> exp.Expr:
    if "$" not in sql or _PLACEHOLDER in sql:
        return sqlglot.parse_one(sql, read=_DpproxyPostgres)
    try:
        tokens = scan(sql)
    except ParseError:
        return sqlglot.parse_one(sql, read=_DpproxyPostgres)
    pieces, position = [], 0
    for token in tokens:
        if token.name == "PARAM":  # start and end are the offsets of its first and last character
            pieces += [sql[position : token.start], f":{_PLACEHOLDER}{sql[token.start + 1 : token.end + 1]}"]
            position = token.end + 1
    if not pieces:
        return sqlglot.parse_one(sql, read=_DpproxyPostgres)
    pieces.append(sql[position:])
    tree = sqlglot.parse_one("".join(pieces), read=_DpproxyPostgres)
    return tree.transform(_parameter)


def _parameter(node: exp.Expr) -> exp.Expr:
    if isinstance(node, exp.Placeholder) and str(node.name).startswith(_PLACEHOLDER):
        return exp.Parameter(this=exp.Literal.number(node.name[len(_PLACEHOLDER):]))
    return node
