"""Metabase's numeric binning as a GROUP BY key: ``floor((col - A) / W) * W + A`` over declared bounds.

Metabase's *Auto bin*, *N bins* and *bin width* breakouts on a number column send
``((floor((("public"."t"."col" - A) / W)) * W) + A)``, A and W literals it computes from the
column's fingerprint (``floor(col / W) * W`` when A is 0). The value is a function of the
*bin index* ``floor((col - A) / W)``, and over a column with declared bounds [lo, hi] the
indices a value within them can have are known from the statement's text (A, W) and the policy
alone: every integer from the index of lo to the index of hi, the arithmetic being monotone in
the value. So the key is a histogram over declared bins, like ``width_bucket``'s.

The key is the index; ``* W + A`` stays in the outer statement, computed by PostgreSQL from
each released index with the analyst's own literals, so the bin's value has the type, scale and
text the direct query gives it. The backend computes each row's index with the analyst's
arithmetic (:meth:`FloorBin.row_sql`): PostgreSQL's own rounding decides a value at a bin's edge,
never dpproxy. dpproxy derives only the set of indices (:func:`floor_bin`), so that every value
within the bounds has its index in the set:

* ``double precision`` (a float column): the same IEEE operations at lo and hi as PostgreSQL's;
* integer arithmetic (an integer column, integer literals): ``/`` truncates, as PostgreSQL's;
* ``numeric``: PostgreSQL rounds a quotient to a scale that depends on the row's own digits
  (its display scale), so a row's index may be one more than the exact quotient's floor when the
  quotient falls just below an integer; the set's upper end allows that rounding (at the
  coarsest scale PostgreSQL can choose for a value within the bounds).

A row outside the bounds, NULL or NaN has no index; a row whose index is not in the set (none
should be) is dropped in the backend too (:meth:`FloorBin.cell_sql`). Per-row errors are ruled
out from the text: an integer ``col - A`` that could overflow, a ``double precision`` one or its
quotient that could overflow, is refused; a ``double precision`` quotient that PostgreSQL would
report as an underflow (a difference so small that dividing it by W > 1 rounds it to zero) is
given its index (0 or -1) without dividing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction
from typing import Literal

from sqlglot import exp


from .sql_text import literal, operator
from .types import FLOAT8, FLOAT_TYPES, INT8, INTEGER_TYPES, NUMERIC

__all__ = ["BinError", "FloorBin", "FloorShape", "MAX_INDEX", "Number", "floor_bin", "floor_shape", "number_literal", "numeric_indices"]

Arithmetic = Literal["float", "integer", "numeric"]

MAX_INDEX = 2**53
"""Bin indices beyond ±2^53 are refused: a ``double precision`` index there is not every integer."""

_INT4_MAX, _INT8_MAX = 2**31 - 1, 2**63 - 1
_TINY = 2.0**-1022  # the smallest normal double: a quotient at least this large is no underflow


@dataclass(frozen=True)
class FloorShape:
    """The parts of ``floor((col - A) / W) * W + A`` as written: ``offset`` A and ``width`` W are
    None where the text leaves them out (``floor(col / W) * W``, ``floor(col)``); ``floor`` is the
    ``floor(...)`` node, which the outer statement replaces by the released index."""

    column: exp.Column
    floor: exp.Floor
    offset: exp.Expression | None
    width: exp.Expression | None
    form: int = 0  # what is written around floor(...): 0 nothing, 1 ``* W``, 2 ``* W + A``


def _bare(node: exp.Expression | None) -> exp.Expression | None:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def floor_shape(node: exp.Expression) -> FloorShape | None:
    """The binning ``node`` is written as, or None: ``floor(x)``, ``floor(x) * W`` or
    ``floor(x) * W + A`` with x ``col``, ``col / W``, ``col - A`` or ``(col - A) / W`` (parentheses
    allowed), the outer W and A spelled as the inner ones."""
    top = _bare(node)
    outer_offset = outer_width = None
    if isinstance(top, exp.Add):
        outer_offset = _bare(top.expression)
        top = _bare(top.this)
        if not isinstance(top, exp.Mul):
            return None
    if isinstance(top, exp.Mul):
        outer_width = _bare(top.expression)
        top = _bare(top.this)
    if not isinstance(top, exp.Floor) or top.args.get("decimals") is not None:
        return None
    inner = _bare(top.this)
    width = offset = None
    if isinstance(inner, exp.Div):
        width = _bare(inner.expression)
        inner = _bare(inner.this)
    if isinstance(inner, exp.Sub):
        offset = _bare(inner.expression)
        inner = _bare(inner.this)
    if not isinstance(inner, exp.Column):
        return None
    if outer_width is not None and (width is None or outer_width.sql("postgres") != width.sql("postgres")):
        return None
    if outer_offset is not None and (offset is None or outer_offset.sql("postgres") != offset.sql("postgres")):
        return None
    return FloorShape(inner, top, offset, width, (outer_width is not None) + (outer_offset is not None))


@dataclass(frozen=True)
class Number:
    """A number literal as written (``text``, maybe negated) and as PostgreSQL types it."""

    text: str
    value: Fraction
    integer: bool  # an integer literal (int4/int8); else numeric


def number_literal(node: exp.Expression | None) -> Number | None:
    """``node`` as a finite number literal (maybe negated), or None."""
    negative = isinstance(node, exp.Neg)
    if negative:
        assert node is not None
        node = _bare(node.this)
    if not isinstance(node, exp.Literal) or node.is_string:
        return None
    text = str(node.this)
    if len(text) > 40:
        return None
    try:
        value = Decimal(text)
    except InvalidOperation:
        return None
    if not value.is_finite() or (value != 0 and not -300 <= value.adjusted() <= 300):
        return None
    integer = text.isdigit() and int(text) <= _INT8_MAX
    fraction = Fraction(value)
    return Number(f"-{text}" if negative else text, -fraction if negative else fraction, integer)


@dataclass(frozen=True)
class FloorBin:
    """A binning key's indices ``first`` … ``first + count - 1`` and how the backend computes a row's.

    ``arithmetic`` is how PostgreSQL evaluates the analyst's ``(col - A) / W`` (its operand types);
    ``result_type_oid`` the type of ``floor(...)`` (``double precision``, or ``numeric``).
    ``lo``/``hi`` are the bounds as literals of the column's comparison.
    """

    arithmetic: Arithmetic
    offset: str | None
    width: str | None
    first: int
    count: int
    lo: str
    hi: str
    tiny: str | None  # float: below this |col - A| the quotient would underflow; None: it cannot
    form: int = 0  # FloorShape.form: a key's identity, as PostgreSQL tells the expressions apart

    @property
    def result_type_oid(self) -> int:
        return NUMERIC if self.arithmetic == "numeric" else FLOAT8

    def row_sql(self, name: str) -> str:
        """The row's index of the column read as ``name`` (its SQL): the analyst's arithmetic, for a
        value within the bounds only; it cannot raise on any value (overflow ruled out by
        :func:`floor_bin`, underflow by ``tiny``)."""
        within = f"{operator(name, '>=', self.lo)} AND {operator(name, '<=', self.hi)}"
        difference = name if self.offset is None else operator(name, "-", f"({self.offset})")
        quotient = difference if self.width is None else operator(difference, "/", f"({self.width})")
        index = f"pg_catalog.floor({quotient})"
        if self.tiny is not None:
            tiny = f"CAST({literal(self.tiny)} AS pg_catalog.float8)"
            sign = f"CASE WHEN {operator(difference, '<', '0')} THEN -1 ELSE 0 END"
            index = f"CASE WHEN {operator(f'pg_catalog.abs({difference})', '<', tiny)} THEN {sign} ELSE {index} END"
        return f"CASE WHEN {within} THEN {index} END"

    def cell_sql(self, row: str) -> str:
        """A group's index as a bigint, NULL for one outside the set (dropped, in no cell)."""
        last = self.first + self.count - 1
        return (f"CASE WHEN {operator(row, '>=', str(self.first))} AND {operator(row, '<=', str(last))} "
                f"THEN CAST({row} AS pg_catalog.int8) END")


class BinError(ValueError):
    """Why a binning key over a column cannot be answered: the refusal's message and advice."""

    def __init__(self, message: str, advice: str) -> None:
        super().__init__(message)
        self.advice = advice


def floor_bin(shape: FloorShape, column_type: int, bounds: tuple[float, float]) -> FloorBin:
    """The indices ``shape`` can give a value of a column of ``column_type`` within ``bounds``.

    Raises :class:`BinError` for a non-literal, non-finite or non-positive W or A, and where a
    row's arithmetic could fail (an overflow). The count is not capped here.
    """
    offset, width = _part(shape.offset, "A"), _part(shape.width, "W")
    if width is not None and width.value <= 0:
        raise BinError("the bin width W must be a positive number", "Use a positive bin width.")
    literals = [part for part in (offset, width) if part is not None]
    arithmetic: Arithmetic
    if column_type in FLOAT_TYPES:
        arithmetic = "float"
    elif column_type in INTEGER_TYPES and all(part.integer for part in literals):
        arithmetic = "integer"
    else:
        arithmetic = "numeric"
    lo, hi = bounds
    tiny = None
    if arithmetic == "float":
        first, last, tiny = _float_indices(lo, hi, offset, width)
    elif column_type in INTEGER_TYPES:
        low, high = math.ceil(Fraction(lo)), math.floor(Fraction(hi))
        if offset is not None and offset.integer:
            limit = _INT8_MAX if column_type == INT8 else _INT4_MAX
            if max(abs(low - offset.value), abs(high - offset.value)) > limit:
                raise BinError("col - A could overflow the column's integer type for a value within the bounds",
                               "Use an A nearer the column's bounds.")
        if arithmetic == "integer":
            first, last = (_integer_index(x, offset, width) for x in (low, high))
        else:
            first, last = numeric_indices(Fraction(low), Fraction(high), offset, width)
    else:
        first, last = numeric_indices(Fraction(Decimal(repr(lo))), Fraction(Decimal(repr(hi))), offset, width)
    if max(abs(first), abs(last)) > MAX_INDEX:
        raise BinError("its bin indices (col - A) / W exceed 2^53", "Use a wider bin width W or an A nearer the bounds.")
    bound_type = "float8" if column_type in FLOAT_TYPES else "numeric"
    return FloorBin(arithmetic, offset.text if offset else None, width.text if width else None, first, last - first + 1,
                    f"CAST({literal(repr(lo))} AS pg_catalog.{bound_type})",
                    f"CAST({literal(repr(hi))} AS pg_catalog.{bound_type})", tiny, shape.form)


def _part(node: exp.Expression | None, name: str) -> Number | None:
    if node is None:
        return None
    number = number_literal(node)
    if number is None:
        raise BinError(f"{name} must be a finite number literal",
                       "Write the bin's offset A and width W as number literals, as Metabase does.")
    return number


def _float_indices(lo: float, hi: float, offset: Number | None, width: Number | None) -> tuple[int, int, str | None]:
    """The indices at lo and hi in double precision, as PostgreSQL computes them (IEEE, rounded to
    nearest); and the underflow threshold when W > 1. A value within the bounds is a double
    at least lo's and at most hi's (rounded) value, and each operation is monotone."""
    a = float(offset.value) if offset is not None else 0.0
    w = float(width.value) if width is not None else 1.0
    indices = []
    for x in (lo, hi):
        difference = x - a
        quotient = difference / w
        if not (math.isfinite(difference) and math.isfinite(quotient)):
            raise BinError("(col - A) / W overflows double precision for a value within the bounds",
                           "Use an A nearer the bounds and a wider bin width W.")
        indices.append(math.floor(quotient))
    tiny = repr(w * _TINY) if w > 1 else None
    return indices[0], indices[1], tiny


def _integer_index(x: int, offset: Number | None, width: Number | None) -> int:
    """PostgreSQL's integer ``(x - A) / W``: the quotient truncated toward zero."""
    difference = x - int(offset.value) if offset is not None else x
    if width is None:
        return difference
    w = int(width.value)
    quotient = abs(difference) // w
    return quotient if difference >= 0 else -quotient


def numeric_indices(lo: Fraction, hi: Fraction, offset: Number | None, width: Number | None) -> tuple[int, int]:
    """The indices within [lo, hi] in numeric arithmetic: from the exact floor at lo to the
    exact floor at hi, plus one where PostgreSQL's rounding of a quotient just below an integer
    (half a unit of its least result scale) may carry a value within the bounds over it."""
    a = offset.value if offset is not None else Fraction(0)
    w = width.value if width is not None else Fraction(1)
    first = math.floor((lo - a) / w)
    if width is None:
        return first, math.floor(hi - a)  # no division, no rounding
    largest = max(abs(lo - a), abs(hi - a))
    if largest == 0:
        return first, first
    # select_div_scale: at least 16 significant digits, from the weights (base 10,000) of the
    # dividend and divisor; the dividend's weight is at most the largest difference's.
    weight = _weight(largest) - _weight(w)
    scale = min(max(0, 16 - 4 * weight), 1000)
    return first, math.floor((hi - a) / w + Fraction(1, 2 * 10**scale))


def _weight(value: Fraction) -> int:
    """The weight of ``value`` > 0 in base 10,000 digits, as PostgreSQL's numeric stores it:
    ``floor(log10(value)) // 4``, computed exactly."""
    exponent = len(str(value.numerator)) - len(str(value.denominator))
    if Fraction(10) ** exponent > value:
        exponent -= 1
    elif Fraction(10) ** (exponent + 1) <= value:
        exponent += 1
    return exponent // 4
