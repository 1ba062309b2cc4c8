"""The types a DP statement's parameters may be declared with (Parse), checked before any charge.

A parameter declared with a type makes PostgreSQL choose the comparison's operator for that
type, and where there is none for the column's type and the parameter's, it converts one side
by an implicit cast. Converting the parameter happens once, while planning: its error is the
same on every table. Converting the *column* happens per row: ``id = $1`` with a bigint ``id``
and ``$1`` declared ``oid`` (or ``regclass``, any ``reg*`` type) casts every row's id to
``oid``, which fails with "OID out of range" only on a row holding a negative or too large id.

So a parameter must be unspecified (PostgreSQL gives it the column's type) or declared with one
of the built-in scalar types below, the ones client drivers send. None of them makes PostgreSQL
convert a column per row in a way that can fail: for each, either an operator with the column's
type exists, or the parameter is the side converted, or the column's conversion is total
(integers to numeric or a float, ``real`` to ``double precision``, ``date``/``time`` to the wider
time types with overflow-safe cross-type operators); a numeric column's parameter is cast to
numeric by the rewriter (``rewriter.predicates``). Any other type is refused, whatever its value.

The declared types also settle the raw conjunct a WHERE's list of parameters on a column of a
declared size gets (``rewriter.raw_equality.parameter_list_equality``): it stays where they are all
one type, and is left out otherwise (:func:`settled_lists`), before the statement is described or run.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import replace

from policies.errors import SQLSTATE, Refusal
from proxy.backend.connection import BoundParams
from rewriter.dp_query import AggregateQuery

__all__ = ["NUMERIC_PARAMETER_TYPES", "PARAMETER_TYPES", "check_listed_parameters",
           "check_numeric_parameters", "check_parameter_types", "settled_lists"]

PARAMETER_TYPES = frozenset({
    0,  # unspecified: PostgreSQL infers the column's type
    16, 17, 18, 19,  # bool, bytea, "char", name
    20, 21, 23,  # int8, int2, int4
    25, 705, 1042, 1043,  # text, unknown, bpchar, varchar
    700, 701, 1700,  # real, double precision, numeric
    1082, 1083, 1114, 1184, 1186, 1266,  # date, time, timestamp, timestamptz, interval, timetz
    2950,  # uuid
})


def check_parameter_types(plan: AggregateQuery, params: BoundParams) -> None:
    """Refuse (DP001) a parameter declared with a type outside :data:`PARAMETER_TYPES`: the
    statement decides it, not the rows, and nothing has been charged."""
    for number, type_oid in enumerate(params.types, start=1):
        if type_oid not in PARAMETER_TYPES:
            raise Refusal(
                SQLSTATE.DP_QUERY_SHAPE,
                f"parameter ${number} declared with type OID {type_oid} is not allowed on protected table "
                f"{plan.table.display_name} (rule: safe-predicate)",
                "Send the parameter unspecified (type 0) or as a built-in number, text, boolean, bytea, uuid or "
                "date/time type: PostgreSQL could convert every row's value to the declared type, which fails "
                "for some values only.",
                "safe-predicate",
            )


NUMERIC_PARAMETER_TYPES = frozenset({0, 705, 20, 21, 23, 1700})
"""The types a parameter compared with a numeric column may be declared with: unspecified or unknown
(PostgreSQL infers numeric) and the ones it compares with numeric in numeric (the integers, cast
implicitly, and numeric); and double precision where :func:`_float_read_alike` holds."""

_FLOAT8 = 701
_FLOAT_DIGITS = 15  # DBL_DIG: the digits PostgreSQL's float8-to-numeric cast keeps


def check_numeric_parameters(plan: AggregateQuery, params: BoundParams) -> None:
    """Refuse (0A000, rule ``numeric-parameter``) a parameter the plan compares with a numeric
    column (``AggregateQuery.numeric_parameters``: the rewriter casts it to numeric, so that no row's
    value is converted) declared with a type PostgreSQL compares otherwise, whatever the rows: a text
    type has no operator with numeric (42883); with ``real`` or ``double precision`` PostgreSQL
    compares every value converted to double precision, where the cast keeps 15 digits of the
    parameter (``n = $1`` bound to 4.500000000000001 as float8 holds for no row of 4.5 to
    PostgreSQL, for every one to the cast). A double precision value is answered where the two
    comparisons agree on every value the column can hold (:func:`_float_read_alike`)."""
    for judged in _with_ranking(plan):
        for number, precision in judged.numeric_parameters:
            type_oid = params.types[number - 1] if number <= len(params.types) else 0
            if type_oid in NUMERIC_PARAMETER_TYPES or (
                    type_oid == _FLOAT8 and _float_read_alike(params, number - 1, precision)):
                continue
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"parameter ${number} declared with type OID {type_oid} is compared with a numeric column on protected "
                f"table {plan.table.display_name} (rule: numeric-parameter)",
                "Send the parameter as numeric, an integer type or unspecified (type 0; psycopg: a Decimal, not a "
                "float): PostgreSQL compares a numeric column with a text parameter not at all, and with a real or "
                "double precision one in double precision, which dpproxy answers only beside a column of at most 15 "
                "digits, for a value of at most 15.",
                "numeric-parameter",
            )


def _float_read_alike(params: BoundParams, index: int, precision: int | None) -> bool:
    """Whether a double precision parameter compares with a numeric(p, s) column alike in double
    precision (PostgreSQL) and cast to numeric (dpproxy): the column holds at most 15 digits (p <=
    15), and the value is the double nearest to its own 15 digits, or NULL, NaN or an infinity.
    Then the cast's decimal d maps to the value, and distinct decimals of at most 15 digits to
    distinct doubles, in order: a column value equals, precedes or follows d exactly where its
    double does the value's."""
    if precision is None or precision > _FLOAT_DIGITS:
        return False
    value = params.values[index] if index < len(params.values) else None
    if value is None:
        return True
    formats = params.formats
    binary = (formats[index] if len(formats) > 1 else formats[0] if formats else 0) == 1
    try:
        number = struct.unpack("!d", bytes(value))[0] if binary else float(bytes(value).decode("ascii"))
    except (struct.error, ValueError, UnicodeDecodeError):
        return False  # a value Python does not read (PostgreSQL's Bind may fail for it): not judged, refused
    return not math.isfinite(number) or float(f"{number:.{_FLOAT_DIGITS}g}") == number


def check_listed_parameters(plan: AggregateQuery, params: BoundParams) -> None:
    """Refuse (0A000, rule ``in-list-parameter-types``) an IN list holding parameters whose declared
    types make PostgreSQL's reading of the list (in its values' common type) another than dpproxy's
    ``x = a OR x = b`` (:meth:`rewriter.listed_parameters.ListedParameters.one_reading`): the types
    decide it, not the rows, and nothing has been charged."""
    for judged in _with_ranking(plan):
        for listed in judged.listed_parameters:
            if not listed.one_reading(params.types):
                numbers = ", ".join(f"${number}" for number in dict.fromkeys(listed.numbers))
                raise Refusal(
                    SQLSTATE.FEATURE_NOT_SUPPORTED,
                    f"an IN list with parameters {numbers} declared as types "
                    f"{', '.join(str(params.types[n - 1]) if n <= len(params.types) else '0' for n in dict.fromkeys(listed.numbers))} "
                    f"beside its other values is not supported on protected table {plan.table.display_name} "
                    "(rule: in-list-parameter-types)",
                    "PostgreSQL compares x IN (a, b) in the values' common type, which a parameter's declared type "
                    "changes, dpproxy as x = a OR x = b, each in its own; send every parameter of the list with one "
                    "type (or all unspecified) and no typed value beside them, or write x = a OR x = b.",
                    "in-list-parameter-types",
                )


def _with_ranking(plan: AggregateQuery) -> tuple[AggregateQuery, ...]:
    """``plan`` and its series limit's ranking, whose conditions read the same parameters."""
    return (plan,) if plan.series is None else (plan, plan.series.ranking)


def settled_lists(plan: AggregateQuery, types: Sequence[int]) -> AggregateQuery:
    """``plan`` (and its series' ranking) without the raw conjuncts over lists of parameters that do
    not hold for parameters declared ``types`` (:meth:`rewriter.raw_equality.ParameterList.holds`):
    each was AND'ed after the WHERE's condition, which keeps its rows without it (only no index
    serves it then). The same plan where all hold, or it has none."""
    series = plan.series
    if series is not None and (ranking := settled_lists(series.ranking, types)) is not series.ranking:
        series = replace(series, ranking=ranking)
    dropped = [listed for listed in plan.parameter_lists if not listed.holds(types)]
    if not dropped and series is plan.series:
        return plan
    where_sql = plan.where_sql
    for listed in dropped:
        assert where_sql is not None and f" AND {listed.sql}" in where_sql, listed.sql
        where_sql = where_sql.replace(f" AND {listed.sql}", "", 1)
    kept = tuple(listed for listed in plan.parameter_lists if listed not in dropped)
    return replace(plan, where_sql=where_sql, series=series, parameter_lists=kept)
