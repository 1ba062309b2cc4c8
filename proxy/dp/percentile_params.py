"""Read the fractions a DP query's percentiles take as bound parameters, before any charge.

``percentile_cont($1) WITHIN GROUP (ORDER BY age)`` is planned once (at Parse); the fraction
comes with each execution. :func:`bind_fractions` reads it from the Bind values, as PostgreSQL
would read a ``double precision`` parameter (its inferred type; a declared integer, real or
numeric type is read as that type), and refuses it as the same value written as a literal
would be (``rewriter.percentiles``). It runs before the repeat lookup, whose key holds the
parameters' values, and before the charge: the value is the statement's, not the rows'.

The backend SQL does not mention the parameter (the fraction is applied by the mechanism, not
by PostgreSQL), so an unspecified type is given as ``double precision`` to the backend, which
otherwise could not infer it.
"""

from __future__ import annotations

import math
import struct
from dataclasses import replace
from decimal import Decimal, InvalidOperation

from policies.errors import SQLSTATE, Refusal
from proxy.backend.connection import BoundParams
from rewriter.dp_query import Aggregate, AggregateQuery
from rewriter.percentiles import FractionParameter, array_parameter_refusal, bound_fraction
from rewriter.types import NUMBER_ARRAY_NAMES

__all__ = ["FRACTION_TYPES", "bind_fractions", "fraction_param_types"]

_FLOAT8, _FLOAT4, _NUMERIC = 701, 700, 1700
_INTEGERS = {20: ("bigint", "!q"), 21: ("smallint", "!h"), 23: ("integer", "!i")}
FRACTION_TYPES = frozenset({0, _FLOAT8, _FLOAT4, _NUMERIC, *_INTEGERS})
"""The types a fraction parameter may be declared with: unspecified (PostgreSQL infers double
precision) or one PostgreSQL casts to double precision implicitly."""


def fraction_param_types(plan: AggregateQuery, types: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """``types`` with each fraction parameter left unspecified given as double precision."""
    numbers = {agg.fraction_parameter.number for agg in plan.aggregates if agg.fraction_parameter is not None}
    if not numbers:
        return tuple(types)
    count = max(len(types), max(numbers))
    given = list(types) + [0] * (count - len(types))
    return tuple(_FLOAT8 if number in numbers and given[number - 1] == 0 else given[number - 1]
                 for number in range(1, count + 1))


def bind_fractions(plan: AggregateQuery, params: BoundParams) -> tuple[AggregateQuery, BoundParams]:
    """The plan with each parameter fraction read from ``params``, and the parameters to run it
    with (fraction parameters of unspecified type declared double precision). Raises Refusal
    for a value PostgreSQL would refuse (with its SQLSTATE) or dpproxy cannot answer (DP001)."""
    if not any(agg.fraction_parameter is not None for agg in plan.aggregates):
        return plan, params
    aggregates = tuple(_bound(agg, plan, params) for agg in plan.aggregates)
    types = fraction_param_types(plan, tuple(params.types) + (0,) * (len(params.values) - len(params.types)))
    return replace(plan, aggregates=aggregates), BoundParams(params.values, params.formats, types)


def _bound(agg: Aggregate, plan: AggregateQuery, params: BoundParams) -> Aggregate:
    parameter = agg.fraction_parameter
    if parameter is None:
        return agg
    assert agg.kind in ("percentile_cont", "percentile_disc")
    table = plan.table.display_name
    index = parameter.number - 1
    if index >= len(params.values):  # the Bind's count is checked before; a plan's own use stays safe
        raise Refusal("08P01", f"bind message supplies {len(params.values)} parameters, but the statement "
                               f"needs {parameter.number}")
    type_oid = params.types[index] if index < len(params.types) else 0
    if type_oid in NUMBER_ARRAY_NAMES:  # a driver's list bound as one parameter (psycopg: float8[])
        raise array_parameter_refusal(agg.kind, f"${parameter.number}", table)
    if type_oid not in FRACTION_TYPES:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{agg.kind}(${parameter.number}) with the parameter declared as type OID {type_oid} is not answered on "
            f"protected table {table} (rule: aggregate-argument)",
            "Send the fraction unspecified (type 0) or as double precision, real, numeric or an integer type.",
            "aggregate-argument",
        )
    raw = params.values[index]
    binary = bool(params.formats[index] if len(params.formats) > 1 else (params.formats[0] if params.formats else 0))
    value, written = (None, "NULL") if raw is None else _read(raw, binary, type_oid, parameter)
    fraction = bound_fraction(value, written, agg.kind, table)
    return replace(agg, fraction=1 - fraction if parameter.desc else fraction, fraction_parameter=None)


def _read(raw: bytes, binary: bool, type_oid: int, parameter: FractionParameter) -> tuple[Decimal, str]:
    """The parameter's exact value and its text, as PostgreSQL reads one of ``type_oid``."""
    if binary:
        return _read_binary(raw, type_oid, parameter)
    text = raw.decode("utf-8", "replace")
    name = _INTEGERS[type_oid][0] if type_oid in _INTEGERS else "numeric" if type_oid == _NUMERIC else (
        "real" if type_oid == _FLOAT4 else "double precision")
    stripped = text.strip()
    try:
        if type_oid in _INTEGERS:
            return Decimal(int(stripped, 10)), stripped
        value = Decimal(_float_words(stripped))
    except (ValueError, InvalidOperation):
        raise Refusal("22P02", f'invalid input syntax for type {name}: "{text}"') from None
    return value, stripped


def _float_words(text: str) -> str:
    """PostgreSQL's spellings of infinity, in Decimal's; the rest as given."""
    lowered = text.lower()
    if lowered in ("infinity", "+infinity", "inf", "+inf"):
        return "Infinity"
    if lowered in ("-infinity", "-inf"):
        return "-Infinity"
    return text


def _read_binary(raw: bytes, type_oid: int, parameter: FractionParameter) -> tuple[Decimal, str]:
    try:
        if type_oid in _INTEGERS:
            (number,) = struct.unpack(_INTEGERS[type_oid][1], raw)
            return Decimal(number), str(number)
        if type_oid == _NUMERIC:
            value = _numeric_recv(raw)
            return value, str(value)
        (double,) = struct.unpack("!f" if type_oid == _FLOAT4 else "!d", raw)
    except struct.error:
        raise Refusal("08P01", f"incorrect binary data format in bind parameter {parameter.number}") from None
    if math.isnan(double):
        return Decimal("NaN"), "NaN"
    return Decimal(repr(double)) if math.isfinite(double) else Decimal(double), repr(double)


def _numeric_recv(raw: bytes) -> Decimal:
    """numeric_recv: ndigits, weight, sign, dscale, then base-10000 digits."""
    ndigits, weight, sign, _ = struct.unpack("!hhHh", raw[:8])
    if sign == 0xC000:
        return Decimal("NaN")
    if sign in (0xD000, 0xF000):
        return Decimal("Infinity" if sign == 0xD000 else "-Infinity")
    if sign not in (0, 0x4000) or ndigits < 0 or len(raw) != 8 + 2 * ndigits:
        raise struct.error("numeric")
    digits = struct.unpack(f"!{ndigits}H", raw[8:])
    value = sum((Decimal(d) * Decimal(10000) ** (weight - i) for i, d in enumerate(digits)), Decimal(0))
    return -value if sign == 0x4000 else value
