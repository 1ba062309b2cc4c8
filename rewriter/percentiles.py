"""Read ``percentile_cont(p) WITHIN GROUP (ORDER BY col [ASC|DESC])`` and ``percentile_disc``.

What the statement asks for is decided here from its text alone, before anything is charged:
the fraction p, exact (a decimal literal, maybe cast to a number type), in [0, 1]; DESC reads
it as 1 − p, as PostgreSQL orders the values the other way. The column is checked by the
caller as SUM's is (numeric, with bounds). The array form, a parameter, a NULL p and a p
outside [0, 1] are refused here. Released by :mod:`mechanisms.quantile` (docs/mechanisms.md).
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Literal

from sqlglot import exp

from policies.errors import SQLSTATE, Refusal

from .scope import Scope

__all__ = ["PercentileKind", "decimal_text", "is_percentile", "percentile_call"]

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


def is_percentile(item: exp.Expression) -> bool:
    """Whether ``item`` is ``percentile_cont(...)``/``percentile_disc(...) WITHIN GROUP (...)``."""
    return isinstance(item, exp.WithinGroup) and type(item.this) in _KINDS


def percentile_call(item: exp.WithinGroup, scope: Scope) -> tuple[PercentileKind, exp.Expression, Fraction]:
    """The kind, the ordered argument and the exact fraction (DESC applied) of a percentile call."""
    kind = _KINDS[type(item.this)]
    order = item.expression.expressions if isinstance(item.expression, exp.Order) else []
    if len(order) != 1:
        raise scope.refuse(f"{kind}() takes one ORDER BY column on protected table", "aggregate-argument")
    fraction = _fraction(item.this.this, kind, scope)
    if order[0].args.get("desc"):
        fraction = 1 - fraction
    return kind, order[0].this, fraction


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
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{kind}(NULL) is not answered on protected table {scope.table.display_name} (rule: aggregate-argument)",
            f"PostgreSQL answers NULL for a NULL fraction; give {kind}() a fraction in [0, 1], e.g. {kind}(0.5).",
            "aggregate-argument",
        )
    if isinstance(node, exp.Array):
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{kind}() of an array of fractions is not answered on protected table {scope.table.display_name} "
            "(rule: aggregate-argument)",
            f"Ask each fraction as its own column: SELECT {kind}(0.25) WITHIN GROUP (ORDER BY col), "
            f"{kind}(0.75) WITHIN GROUP (ORDER BY col) FROM ...; the query's ε is split over them.",
            "aggregate-argument",
        )
    value = _number(node)
    if value is None:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{kind}({written}) is not answered on protected table {scope.table.display_name}: the fraction must "
            "be a number literal (rule: aggregate-argument)",
            f"Write the fraction in the statement, e.g. {kind}(0.5) WITHIN GROUP (ORDER BY col); parameters and "
            "expressions are not read there.",
            "aggregate-argument",
        )
    fraction = Fraction(-value if negative else value)
    if not 0 <= fraction <= 1:
        raise Refusal(
            "22003",  # numeric_value_out_of_range, as PostgreSQL raises it
            f"percentile value {written} is not between 0 and 1 (rule: aggregate-argument)",
            f"{kind}() takes a fraction in [0, 1]: 0.5 is the median, 0.9 the 90th percentile.",
            "aggregate-argument",
        )
    return fraction


def _number(node: exp.Expression | None) -> Decimal | None:
    """A number literal's exact value, or None for anything else (and for over-long digits)."""
    if not isinstance(node, exp.Literal) or node.is_string:
        return None
    text = node.this
    if len(text) > _MAX_DIGITS + 8:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    shape = value.as_tuple()
    if not value.is_finite() or len(shape.digits) > _MAX_DIGITS or int(shape.exponent) < -_MAX_DIGITS:
        return None  # 1e-1000: a denominator of 10^1000 in every score, and no double either
    return value


def decimal_text(fraction: Fraction) -> str:
    """A fraction read from a decimal literal (or 1 − one) as that decimal, e.g. ``0.25``."""
    digits = 0
    while (fraction * 10**digits).denominator != 1:
        digits += 1  # ends: the denominator is a power of ten's divisor (_MAX_DIGITS bounds it)
    scaled = str(fraction.numerator * 10**digits // fraction.denominator).rjust(digits + 1, "0")
    return f"{scaled[:-digits]}.{scaled[-digits:]}" if digits else scaled
