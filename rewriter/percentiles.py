"""Read ``percentile_cont(p) WITHIN GROUP (ORDER BY col [ASC|DESC])`` and ``percentile_disc``.

What the statement asks for is decided here from its text alone, before anything is charged:
the fraction p, exact (a decimal literal, maybe cast to a number type), in [0, 1]; DESC reads
it as 1 − p, as PostgreSQL orders the values the other way. The column is checked by the
caller as SUM's is (numeric, with bounds). A NULL p and a p outside [0, 1] are refused here,
with PostgreSQL's SQLSTATE where PostgreSQL would fail the statement too.

The array form, ``percentile_cont(ARRAY[0.25, 0.5, 0.75])`` or ``percentile_cont('{0.25,0.5}'::float8[])``,
asks for up to :data:`MAX_FRACTIONS` fractions at once, each read as the single form reads its
literal; a NULL element, an empty array, a bound parameter as an element (``ARRAY[$1, $2]``)
or more fractions than that are refused here.

A bound parameter (``percentile_cont($1)``, what a driver that binds literals sends) is read
from its value when the statement runs (:func:`bound_fraction`, called by
``proxy.dp.percentile_params`` before the repeat lookup and the charge), by the same rules.
Released by :mod:`mechanisms.quantile` (docs/mechanisms.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Literal

from sqlglot import exp

from policies.errors import SQLSTATE, Refusal

from .scope import Scope

__all__ = ["MAX_FRACTIONS", "FractionParameter", "PercentileKind", "array_parameter_refusal", "bound_fraction", "decimal_text",
           "is_percentile", "percentile_call"]

PercentileKind = Literal["percentile_cont", "percentile_disc"]

_KINDS: dict[type[exp.Expression], PercentileKind] = {
    exp.PercentileCont: "percentile_cont",
    exp.PercentileDisc: "percentile_disc",
}
_NUMBER_CASTS = frozenset({
    exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT, exp.DataType.Type.DECIMAL, exp.DataType.Type.INT,
    exp.DataType.Type.BIGINT, exp.DataType.Type.SMALLINT,
})
# p with more digits than this is refused: its exact fraction a/b enters every score as b
# (mechanisms.quantile), and PostgreSQL reads p as a double, which holds about 17 digits.
_MAX_DIGITS = 20
MAX_FRACTIONS = 20
"""The most fractions one array form asks for: each is released at ε/k of its column's share,
so more would leave each too little to be of use (docs/mechanisms.md)."""


@dataclass(frozen=True)
class FractionParameter:
    """A percentile's fraction given as bound parameter ``$number`` (read by ``bound_fraction``
    when the statement runs), to be read as 1 − p when ``desc``."""

    number: int
    desc: bool


def is_percentile(item: exp.Expression) -> bool:
    """Whether ``item`` is ``percentile_cont(...)``/``percentile_disc(...) WITHIN GROUP (...)``."""
    return isinstance(item, exp.WithinGroup) and type(item.this) in _KINDS


def percentile_call(
    item: exp.WithinGroup, scope: Scope
) -> tuple[PercentileKind, exp.Expression, Fraction | FractionParameter | tuple[Fraction, ...]]:
    """The kind, the ordered argument and the exact fraction (DESC applied) of a percentile
    call, or the parameter that will give it, or for the array form its fractions in order."""
    kind = _KINDS[type(item.this)]
    order = item.expression.expressions if isinstance(item.expression, exp.Order) else []
    if len(order) != 1:
        raise scope.refuse(f"{kind}() takes one ORDER BY column on protected table", "aggregate-argument")
    desc = bool(order[0].args.get("desc"))
    node = item.this.this
    if isinstance(node, exp.Cast) and node.to.this in _NUMBER_CASTS and not node.to.expressions:
        node = node.this
    if isinstance(node, exp.Parameter):
        return kind, order[0].this, FractionParameter(int(node.name), desc)
    fractions = _array_fractions(item.this.this, kind, scope)
    if fractions is not None:
        return kind, order[0].this, tuple(1 - f if desc else f for f in fractions)
    fraction = _fraction(item.this.this, kind, scope)
    return kind, order[0].this, 1 - fraction if desc else fraction


def bound_fraction(value: Decimal | None, written: str, kind: PercentileKind, table: str) -> Fraction:
    """The exact fraction a bound parameter's value gives (DESC not applied): refused as the
    same value written as a literal would be (``written``: the value as the client sent it)."""
    if value is None:
        raise _null_refusal(kind, table)
    return _checked(value, written, kind, table)


def _null_refusal(kind: PercentileKind, table: str) -> Refusal:
    return Refusal(
        SQLSTATE.DP_QUERY_SHAPE,
        f"{kind}(NULL) is not answered on protected table {table} (rule: aggregate-argument)",
        f"PostgreSQL answers NULL for a NULL fraction; give {kind}() a fraction in [0, 1], e.g. {kind}(0.5).",
        "aggregate-argument",
    )


def _fraction(node: exp.Expression | None, kind: PercentileKind, scope: Scope) -> Fraction:
    """p as an exact fraction; refused unless a number literal in [0, 1]."""
    written = node.sql("postgres") if node is not None else ""
    if isinstance(node, exp.Cast) and node.to.this in _NUMBER_CASTS and not node.to.expressions:
        node = node.this
    negative = isinstance(node, exp.Neg)
    if negative:
        assert isinstance(node, exp.Neg)
        node = node.this
    if isinstance(node, exp.Null):
        raise _null_refusal(kind, scope.table.display_name)
    value = _number(node)
    if value is None:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{kind}({written}) is not answered on protected table {scope.table.display_name}: the fraction must "
            "be a number literal (rule: aggregate-argument)",
            f"Write the fraction in the statement, e.g. {kind}(0.5) WITHIN GROUP (ORDER BY col), or bind it as a "
            "parameter; expressions are not read there.",
            "aggregate-argument",
        )
    return _checked(-value if negative else value, written, kind, scope.table.display_name)


def _array_fractions(node: exp.Expression | None, kind: PercentileKind, scope: Scope) -> tuple[Fraction, ...] | None:
    """The fractions of the array form, in order, or None when ``node`` is not one: ``ARRAY[...]``
    of number literals, maybe cast to an array of a number type, or a string literal cast to
    one (``'{0.25,0.5}'::float8[]``). Refused: a NULL element, no element, more than
    :data:`MAX_FRACTIONS`, an element the single form would refuse."""
    table = scope.table.display_name
    if isinstance(node, exp.Cast) and node.to.this == exp.DataType.Type.ARRAY:
        element = node.to.expressions
        if len(element) != 1 or element[0].this not in _NUMBER_CASTS or element[0].expressions:
            raise _not_fractions(kind, node.sql("postgres"), table)
        node = node.this
        if _is_parameter(node):  # $1::float8[]: a list bound as one parameter
            raise array_parameter_refusal(kind, _bare(node).sql("postgres"), table)
        if isinstance(node, exp.Literal) and node.is_string:
            texts = _array_elements(node.this, kind, table)
            _check_count(len(texts), kind, table)
            return tuple(_text_element(text, kind, table) for text in texts)
    if not isinstance(node, exp.Array):
        return None
    _check_count(len(node.expressions), kind, table)
    if any(isinstance(element, exp.Null) for element in node.expressions):
        raise _null_element(kind, table)
    if any(_is_parameter(element) for element in node.expressions):
        raise _parameter_element(kind, table)
    return tuple(_fraction(element, kind, scope) for element in node.expressions)


def _is_parameter(node: exp.Expression) -> bool:
    """Whether an array element is a bound parameter (``$1``), maybe cast (``$1::float8``),
    parenthesised or negated (``($1)``, ``-$1``)."""
    return isinstance(_bare(node), (exp.Parameter, exp.Placeholder))


def _bare(node: exp.Expression) -> exp.Expression:
    """``node`` without the casts, parentheses and minus signs around it."""
    while isinstance(node, (exp.Cast, exp.Paren, exp.Neg)):
        node = node.this
    return node


def array_parameter_refusal(kind: PercentileKind, parameter: str, table: str) -> Refusal:
    """The refusal of ``kind(parameter)`` whose parameter is a list of fractions (declared or
    cast as a number array, ``$1::float8[]``): one bound parameter gives one fraction."""
    return Refusal(
        SQLSTATE.DP_QUERY_SHAPE,
        f"{kind}({parameter}) with an array of fractions as the parameter is not answered on protected table "
        f"{table} (rule: aggregate-argument)",
        f"Write the fractions in the statement, {kind}(ARRAY[0.25, 0.5, 0.75]) WITHIN GROUP (ORDER BY col), "
        "or bind each fraction to a percentile of its own.",
        "aggregate-argument",
    )


def _parameter_element(kind: PercentileKind, table: str) -> Refusal:
    # Not read: each element's value would have to be read before the charge as $1 alone is
    # (proxy.dp.percentile_params); PostgreSQL itself cannot type ARRAY[$1, $2] when the
    # parameters come unspecified (asyncpg's Parse), so drivers that bind literals send no such array.
    return Refusal(
        SQLSTATE.DP_QUERY_SHAPE,
        f"{kind}() of an array with a bound parameter as a fraction is not answered on protected table {table} "
        "(rule: aggregate-argument)",
        f"Write the fractions in the statement, {kind}(ARRAY[0.25, 0.5, 0.75]) WITHIN GROUP (ORDER BY col), or bind "
        f"each fraction to a percentile of its own: {kind}($1) WITHIN GROUP (ORDER BY col), "
        f"{kind}($2) WITHIN GROUP (ORDER BY col).",
        "aggregate-argument",
    )


def _check_count(count: int, kind: PercentileKind, table: str) -> None:
    """Refuse an array form of no fraction or of more than :data:`MAX_FRACTIONS`."""
    if not count:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{kind}() of an empty array of fractions is not answered on protected table {table} "
            "(rule: aggregate-argument)",
            f"Give at least one fraction, e.g. {kind}(ARRAY[0.25, 0.5, 0.75]); PostgreSQL answers an empty array "
            "for none, which tells nothing.",
            "aggregate-argument",
        )
    if count > MAX_FRACTIONS:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{kind}() of {count} fractions is not answered on protected table {table}: at most "
            f"{MAX_FRACTIONS} (rule: aggregate-argument)",
            f"Ask at most {MAX_FRACTIONS} fractions in one array; each is answered with ε/k of the column's share, "
            "so more would each be too noisy to use.",
            "aggregate-argument",
        )


def _array_elements(text: str, kind: PercentileKind, table: str) -> list[str]:
    """The elements of a one-dimensional array literal's text (``{0.25, "0.5"}``), as written
    (quotes and an unquoted ``NULL`` are read by :func:`_text_element`)."""
    inner = text.strip()
    if not (inner.startswith("{") and inner.endswith("}")) or any(c in inner[1:-1] for c in '{}\\'):
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{kind}('{text}') is not answered on protected table {table}: the fractions must be a "
            "one-dimensional array literal of numbers (rule: aggregate-argument)",
            f"Write the fractions as {kind}(ARRAY[0.25, 0.5, 0.75]) or '{{0.25,0.5,0.75}}'::float8[].",
            "aggregate-argument",
        )
    body = inner[1:-1].strip()
    return [] if not body else [part.strip() for part in body.split(",")]


def _text_element(text: str, kind: PercentileKind, table: str) -> Fraction:
    """One element of an array literal's text, read as PostgreSQL's float8in reads it."""
    if text.upper() == "NULL":
        raise _null_element(kind, table)
    unquoted = text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '"' else text
    try:
        if "_" in unquoted:  # Decimal reads 0.2_5; float8in does not
            raise InvalidOperation
        value = Decimal(_FLOAT_WORDS.get(unquoted.lower(), unquoted))
    except InvalidOperation:
        raise Refusal("22P02", f'invalid input syntax for type double precision: "{unquoted}"',
                      f"{kind}() takes fractions in [0, 1], e.g. '{{0.25,0.5,0.75}}'::float8[].") from None
    return _checked(value, unquoted, kind, table)


_FLOAT_WORDS = {"infinity": "Infinity", "+infinity": "Infinity", "inf": "Infinity", "+inf": "Infinity",
                "-infinity": "-Infinity", "-inf": "-Infinity"}


def _null_element(kind: PercentileKind, table: str) -> Refusal:
    return Refusal(
        SQLSTATE.DP_QUERY_SHAPE,
        f"{kind}() of an array with a NULL fraction is not answered on protected table {table} "
        "(rule: aggregate-argument)",
        f"PostgreSQL answers NULL for a NULL element; leave it out, e.g. {kind}(ARRAY[0.25, 0.5, 0.75]).",
        "aggregate-argument",
    )


def _not_fractions(kind: PercentileKind, written: str, table: str) -> Refusal:
    return Refusal(
        SQLSTATE.DP_QUERY_SHAPE,
        f"{kind}({written}) is not answered on protected table {table}: the fractions must be an array of a "
        "number type (rule: aggregate-argument)",
        f"Write the fractions as {kind}(ARRAY[0.25, 0.5, 0.75]) or '{{0.25,0.5,0.75}}'::float8[].",
        "aggregate-argument",
    )


def _checked(value: Decimal, written: str, kind: PercentileKind, table: str) -> Fraction:
    """``value`` as an exact fraction in [0, 1]; refused with PostgreSQL's 22003 where PostgreSQL
    fails too (out of double precision's range, outside [0, 1], NaN), else with DP001 when it has
    more digits than dpproxy reads."""
    if value.is_nan():
        raise _outside(kind, "NaN")
    if value.is_finite() and value and (float(value) == 0.0 or abs(float(value)) == float("inf")):
        shown = f"{value:f}" if abs(int(value.as_tuple().exponent)) <= 1000 else written
        raise Refusal(  # PostgreSQL reads p as a double: 1e-400 underflows, 1e400 overflows
            "22003",
            f'"{shown}" is out of range for type double precision (rule: aggregate-argument)',
            f"{kind}() takes a fraction in [0, 1]: 0.5 is the median, 0.9 the 90th percentile.",
            "aggregate-argument",
        )
    if not value.is_finite() or not 0 <= value <= 1:
        raise _outside(kind, written)
    shape = value.as_tuple()
    if len(shape.digits) > _MAX_DIGITS or int(shape.exponent) < -_MAX_DIGITS:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{kind}({written}) is not answered on protected table {table}: the fraction has more than "
            f"{_MAX_DIGITS} decimal places (rule: aggregate-argument)",
            f"Round the fraction to at most {_MAX_DIGITS} decimal places, e.g. {kind}(0.5); PostgreSQL reads it as a "
            "double, which holds about 17 digits.",
            "aggregate-argument",
        )
    return Fraction(value)


def _outside(kind: PercentileKind, written: str) -> Refusal:
    return Refusal(
        "22003",  # numeric_value_out_of_range, as PostgreSQL raises it
        f"percentile value {written} is not between 0 and 1 (rule: aggregate-argument)",
        f"{kind}() takes a fraction in [0, 1]: 0.5 is the median, 0.9 the 90th percentile.",
        "aggregate-argument",
    )


def _number(node: exp.Expression | None) -> Decimal | None:
    """A number literal's exact value, or None for anything else."""
    if not isinstance(node, exp.Literal) or node.is_string:
        return None
    text = node.this
    if len(text) > 1000:  # PostgreSQL's numeric holds any of these; no fraction needs so many
        return None
    try:
        return Decimal(text)
    except InvalidOperation:
        return None


def decimal_text(fraction: Fraction) -> str:
    """A fraction read from a decimal literal (or 1 − one) as that decimal, e.g. ``0.25``."""
    digits = 0
    while (fraction * 10**digits).denominator != 1:
        digits += 1  # ends: the denominator is a power of ten's divisor (_MAX_DIGITS bounds it)
    scaled = str(fraction.numerator * 10**digits // fraction.denominator).rjust(digits + 1, "0")
    return f"{scaled[:-digits]}.{scaled[-digits:]}" if digits else scaled
