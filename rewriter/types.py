"""PostgreSQL type OIDs and the result type PostgreSQL gives each aggregate."""

from __future__ import annotations

__all__ = ["ARRAY_ELEMENTS", "ARRAY_TYPES", "BOOL", "BUILTIN_TYPE_OIDS",
           "FLOAT_TYPES", "INTEGER_TYPES", "MAX_ABS_BOUND", "MAX_ABS_VARIANCE_BOUND", "NUMBER_ARRAY_NAMES",
           "numeric_precision",
           "NUMERIC_TYPES",
           "aggregate_result_type"]

INT2, INT4, INT8, FLOAT4, FLOAT8, NUMERIC = 21, 23, 20, 700, 701, 1700
BOOL = 16

INTEGER_TYPES = frozenset({INT2, INT4, INT8})
FLOAT_TYPES = frozenset({FLOAT4, FLOAT8})

#: The OIDs of built-in scalar types by the name PostgreSQL's parser writes for them in a cast
#: (``int`` is ``int4``, ``char(3)`` is ``bpchar``, ``"char"`` is ``char``, ``double precision`` is ``float8``).
BUILTIN_TYPE_OIDS = {
    "bool": BOOL, "bytea": 17, "char": 18, "name": 19, "int8": INT8, "int2": INT2, "int4": INT4, "text": 25,
    "oid": 26, "json": 114, "cidr": 650, "float4": FLOAT4, "float8": FLOAT8, "money": 790, "inet": 869,
    "bpchar": 1042, "varchar": 1043, "date": 1082, "time": 1083, "timestamp": 1114, "timestamptz": 1184,
    "interval": 1186, "timetz": 1266, "bit": 1560, "varbit": 1562, "numeric": NUMERIC, "uuid": 2950,
    "jsonb": 3802,
}

#: pg_type.typarray of the built-in types a DP answer or a GROUP BY key can have.
ARRAY_TYPES = {
    16: 1000, 19: 1003, INT8: 1016, INT2: 1005, INT4: 1007, 25: 1009, FLOAT4: 1021, FLOAT8: 1022,
    1042: 1014, 1043: 1015, 1082: 1182, 1114: 1115, 1184: 1185, NUMERIC: 1231,
}
ARRAY_ELEMENTS = {array: element for element, array in ARRAY_TYPES.items()}
NUMERIC_TYPES = INTEGER_TYPES | {FLOAT4, FLOAT8, NUMERIC}
# Released values of these types are never NULL, NaN or infinite (the bounds below keep them in
# range); real is left out, as a noised value is rounded to it and may round past its range
# (proxy.wire.values), and rewriter.certain_errors reasons from this.
SESSION_PRINTED_TYPES = frozenset({17, 790, 1082, 1114, 1184, 1186})
"""Types whose values PostgreSQL prints by the session's settings: bytea (``bytea_output``), money
(``lc_monetary``), date and the time stamps (``DateStyle``; ``timestamptz`` in its ``TimeZone``),
interval (``IntervalStyle``)."""
FINITE_NUMBER_TYPES = INTEGER_TYPES | {FLOAT8, NUMERIC}
#: The arrays of the number types by their SQL names: what a percentile's array form answers.
NUMBER_ARRAY_NAMES = {ARRAY_TYPES[INT2]: "smallint[]", ARRAY_TYPES[INT4]: "integer[]", ARRAY_TYPES[INT8]: "bigint[]",
                      ARRAY_TYPES[FLOAT4]: "real[]", ARRAY_TYPES[FLOAT8]: "double precision[]",
                      ARRAY_TYPES[NUMERIC]: "numeric[]"}

# The largest |bound| a SUM/AVG/MIN/MAX column of each float-valued type may have. The
# backend adds clamped values in the column's float type (numeric: cast to double precision
# for sample and aggregate), and float addition and the casts raise "value out of range"
# past the type's range, which would make the rows decide whether a query fails. With at
# most 10^18 rows (far beyond any table) the total stays below 10^298 (double precision's
# range ends near 1.8e308) and, for real columns summed in double precision and cast back,
# below 10^38 (real's ends near 3.4e38). Integer columns add up in bigint/numeric as exact
# integers and need no limit.
MAX_ABS_BOUND = {FLOAT4: 1e20, FLOAT8: 1e280, NUMERIC: 1e280}

# The largest |bound| a VARIANCE or STDDEV column may have: the sample variance of values in
# [lo, hi] reaches (hi − lo)²/2 (two rows at the bounds), which dpproxy computes and releases as a
# double; with |bounds| ≤ 1e150 it is at most 2e300, below double precision's 1.8e308 whatever
# the noise (mechanisms/variance.py clamps it into that range).
MAX_ABS_VARIANCE_BOUND = 1e150

# pg_aggregate's result types for the argument types dpproxy accepts.
_SUM = {INT2: INT8, INT4: INT8, INT8: NUMERIC, FLOAT4: FLOAT4, FLOAT8: FLOAT8, NUMERIC: NUMERIC}
_AVG = {INT2: NUMERIC, INT4: NUMERIC, INT8: NUMERIC, FLOAT4: FLOAT8, FLOAT8: FLOAT8, NUMERIC: NUMERIC}


def aggregate_result_type(kind: str, argument_type: int | None) -> int:
    """The type OID PostgreSQL reports for ``kind(argument)``; COUNT is always int8."""
    if kind == "count":
        return INT8
    assert argument_type is not None
    if kind == "sum":
        return _SUM[argument_type]
    if kind in ("avg", "var_pop", "var_samp", "stddev_pop", "stddev_samp"):
        return _AVG[argument_type]  # numeric for integers and numeric, double precision for floats
    if kind == "percentile_cont":
        return FLOAT8  # PostgreSQL's percentile_cont(double precision) reads every number as a double
    return argument_type  # min, max, mode keep the argument's type


def numeric_precision(type_modifier: int) -> int | None:
    """The precision ``p`` of a ``numeric(p, s)`` type modifier (``((p << 16) | s) + 4``), None for
    an unconstrained numeric (-1)."""
    return ((type_modifier - 4) >> 16) & 0xFFFF if type_modifier >= 4 else None
