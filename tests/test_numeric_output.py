"""Numeric DP answers print with a scale fixed by the schema, never by the exact value."""

from __future__ import annotations

import math
from decimal import Decimal

import pytest

from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from proxy.dp.answer import release_row
from proxy.wire.values import encode_text
from rewriter.dp_query import plan_aggregate_query
from rewriter.types import FLOAT4, FLOAT8, INT8, NUMERIC

_POLICY = TablePolicy(epsilon=1.0, columns={
    "n": ColumnPolicy(bounds=(0, 1e20)), "m": ColumnPolicy(bounds=(0, 100)), "k": ColumnPolicy(bounds=(0, 10)),
})
_TABLE = Relation(16400, "public", "t", _POLICY, {
    "n": ColumnInfo("n", NUMERIC, -1, 1, _POLICY.columns["n"]),
    "m": ColumnInfo("m", NUMERIC, (10 << 16 | 3) + 4, 2, _POLICY.columns["m"]),  # numeric(10, 3)
    "k": ColumnInfo("k", INT8, -1, 3, _POLICY.columns["k"]),
})


def _fraction_digits(sql: str, exact: tuple[object, ...]) -> list[int]:
    row = release_row(plan_aggregate_query(sql, _TABLE), exact, 1.0).result.rows[0]
    return [len(value.split(b".")[1]) if b"." in value else 0 for value in row]


def test_sum_of_a_numeric_column_prints_the_same_digits_whatever_the_rows_hold():
    sql = "SELECT SUM(n), SUM(m), SUM(k) FROM t"
    plain = _fraction_digits(sql, (Decimal("5"), Decimal("5.000"), Decimal("5")))
    for exact_n in (Decimal("5.123456789012345678901"), Decimal("1E-21"), Decimal("-123456789012345678901.5")):
        # One row with a longer fraction must not show in the answer's form.
        assert _fraction_digits(sql, (exact_n, Decimal("5.000"), Decimal("5")))[1:] == plain[1:]
    assert plain[1] == 3 and plain[2] == 0  # numeric(10, 3) keeps its scale; SUM of bigint is whole
    # NaN and ±Infinity rows are clamped into the bounds (tests/test_clamping.py), so the exact
    # total is finite; one that is not is refused by the mechanism rather than noised.
    for impossible in (Decimal("NaN"), Decimal("-Infinity")):
        with pytest.raises(ValueError, match="finite"):
            _fraction_digits(sql, (impossible, Decimal("5.000"), Decimal("5")))


def test_a_large_scale_is_printed_without_the_decimal_contexts_precision_limit():
    assert encode_text(Decimal("1E+20"), NUMERIC, 21) == b"100000000000000000000." + b"0" * 21
    assert encode_text(1e20, NUMERIC, 2) == b"100000000000000000000.00"


_FLOATS = [35.0, 0.0, -0.0, 100.0, -2.5, 0.1, 1 / 3, 1e-4, 1.5e-4, 1e-5, 1.5e-5, 123456.0, 1234567.0, 1e14,
           123456789012345.0, 1e15, 999999999999999.9, 1e16, 2.0**53, 1e300, -1e-300, 5e-324, 1.7976931348623157e308,
           float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("type_name, oid", [("float8", FLOAT8), ("float4", FLOAT4)])
def test_a_float_dpproxy_computes_prints_as_postgresqls_own_output_function_prints_it(admin, type_name, oid):
    # Python's repr keeps a ".0" on whole numbers and turns to exponents at 1e16; PostgreSQL
    # prints "35" and "1e+15" (float4: from 1e+06). A percentile_cont of 35 printed "35.0".
    for value in _FLOATS:
        if oid == FLOAT4 and math.isfinite(value) and value != 0 and not 1e-37 < abs(value) < 1e38:
            continue  # past float4's range: PostgreSQL's cast fails (22003); no float4 column holds it
        row = admin.execute(f"SELECT %s::float8::{type_name}::text", (repr(value),)).fetchone()
        assert row is not None
        assert encode_text(value, oid) == row[0].encode(), (value, type_name)
