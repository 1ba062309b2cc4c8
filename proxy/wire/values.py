"""PostgreSQL text format: encoding the values dpproxy computes, loading the ones it reads."""

from __future__ import annotations

import math
from decimal import MAX_PREC, Context, Decimal
from typing import Callable, Sequence

import numpy as np

from rewriter.types import FLOAT4, FLOAT8, INT2, INT4, INT8, NUMERIC

__all__ = ["TYPE_SIZES", "Value", "encode_array_text", "encode_text", "load_text"]

# A value as dpproxy computes with it: what load_text gives and encode_text takes.
Value = int | float | Decimal | str | None

_EXACT = Context(prec=MAX_PREC)
TYPE_SIZES = {INT2: 2, INT4: 4, INT8: 8, FLOAT4: 4, FLOAT8: 8, NUMERIC: -1}


def encode_text(value: Value, type_oid: int, scale: int | None = None, codec: str = "utf-8") -> bytes | None:
    """``value`` as PostgreSQL's output function for ``type_oid`` would print it.

    ``scale`` is the number of fraction digits for numeric results (None: as many as needed; a
    negative one rounds to a multiple of 10^-scale, printed without fraction digits);
    ``codec`` is the client_encoding's, for text (a released category).
    """
    if value is None:
        return None
    if type_oid in (INT2, INT4, INT8):
        return str(int(value)).encode()
    if type_oid == FLOAT8:
        return _float_text(float(value), repr, _FLOAT8_FIXED_BELOW).encode()
    if type_oid == FLOAT4:
        with np.errstate(over="ignore"):  # past float4's range is its infinity, as PostgreSQL's cast
            single = np.float32(value)
        return _float_text(float(single), lambda _: str(single), _FLOAT4_FIXED_BELOW).encode()
    if type_oid == NUMERIC:
        if isinstance(value, int) and (scale is None or scale >= 0):  # a count or an integer sum: its digits, then the scale's zeros
            return (str(value) + ("." + "0" * scale if scale else "")).encode()
        number = Decimal(repr(float(value))) if isinstance(value, float) else Decimal(value)
        if scale is not None and scale < 0:  # numeric(p, -k): a multiple of 10^k, no fraction digits
            # scaled exactly (the default context would round to 28 digits), then rounded half-even
            return str(round(number.scaleb(scale, _EXACT)) * 10 ** -scale).encode()
        # format() rounds half-even to ``scale`` digits without the decimal context's
        # 28-digit precision limit, which round() would hit on a large scale.
        return format(number, "f" if scale is None else f".{scale}f").encode()
    return str(value).encode(codec)


def encode_array_text(values: Sequence[Value], element_oid: int, scale: int | None = None) -> bytes:
    """A one-dimensional array of numbers as PostgreSQL's array_out prints it: ``{17,37.5,48}``
    (numbers need no quotes; no element is NULL, as dpproxy releases none)."""
    elements = [encode_text(value, element_oid, scale) for value in values]
    if any(element is None for element in elements):
        raise ValueError("a released array has no NULL element")
    return b"{" + b",".join(e for e in elements if e is not None) + b"}"


# PostgreSQL prints the shortest digits that read back exactly (extra_float_digits >= 1, which
# dpproxy enforces), in fixed notation when the leading digit's decimal exponent is in
# [-4, DBL_DIG) for float8 and [-4, FLT_DIG) for float4, else as d.ddde±XX (src/common/d2s.c and
# f2s.c). Python's repr has the same digits but another threshold (16) and keeps a ".0".
_FLOAT8_FIXED_BELOW = 15
_FLOAT4_FIXED_BELOW = 6


def _float_text(value: float, shortest: Callable[[float], str], fixed_below: int) -> str:
    """``value`` as PostgreSQL's float8out/float4out print it: ``shortest`` gives the digits."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    number = Decimal(shortest(value)).normalize()  # its shortest digits, trailing zeros dropped
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)  # finite
    leading = len(digits) + exponent - 1  # the decimal exponent of the first digit
    if -4 <= leading < fixed_below or not any(digits):
        return format(number, "f")
    mantissa = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{'-' if leading < 0 else '+'}{abs(leading):02d}"


def load_text(value: bytes | None, type_oid: int) -> Value:
    """A backend text value as the Python value dpproxy computes with (int, Decimal, float, str)."""
    if value is None:
        return None
    if type_oid in (INT2, INT4, INT8):
        return int(value)
    if type_oid == NUMERIC:
        return Decimal(value.decode())
    if type_oid in (FLOAT4, FLOAT8):
        return float(value)
    return value.decode("utf-8")
