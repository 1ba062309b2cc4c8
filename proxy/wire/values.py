"""PostgreSQL text format: encoding the values dpproxy computes, loading the ones it reads."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Callable

import numpy as np

from rewriter.types import FLOAT4, FLOAT8, INT2, INT4, INT8, NUMERIC

__all__ = ["TYPE_SIZES", "Value", "encode_text", "load_text"]

# A value as dpproxy computes with it: what load_text gives and encode_text takes.
Value = int | float | Decimal | str | None

TYPE_SIZES = {INT2: 2, INT4: 4, INT8: 8, FLOAT4: 4, FLOAT8: 8, NUMERIC: -1}


def encode_text(value: Value, type_oid: int, scale: int | None = None, codec: str = "utf-8") -> bytes | None:
    """``value`` as PostgreSQL's output function for ``type_oid`` would print it.

    ``scale`` is the number of fraction digits for numeric results (None: as many as needed);
    ``codec`` is the client_encoding's, for text (a released category).
    """
    if value is None:
        return None
    if type_oid in (INT2, INT4, INT8):
        return str(int(value)).encode()
    if type_oid == FLOAT8:
        return _float_text(float(value), repr).encode()
    if type_oid == FLOAT4:
        return _float_text(float(value), lambda v: str(np.float32(v))).encode()
    if type_oid == NUMERIC:
        if isinstance(value, int):  # a count or an integer sum: its digits, then the scale's zeros
            return (str(value) + ("." + "0" * scale if scale else "")).encode()
        number = Decimal(repr(float(value))) if isinstance(value, float) else Decimal(value)
        # format() rounds half-even to ``scale`` digits without the decimal context's
        # 28-digit precision limit, which round() would hit on a large scale.
        return format(number, "f" if scale is None else f".{scale}f").encode()
    return str(value).encode(codec)


def _float_text(value: float, shortest: Callable[[float], str]) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return shortest(value)


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
