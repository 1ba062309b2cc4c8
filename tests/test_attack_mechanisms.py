"""Implementation limits that let an exact value through the noise: arithmetic before the noise.

The mechanisms' guarantees are about the value the noise is added to: the ``sum_count`` AVG adds
Lap(h/(ε/2)) to the centred sum Σ(x − mid), which one added or removed row moves by at most
h = (hi − lo)/2, and SUM adds Lap(Δ/ε) to a clamped sum that one row moves by at most Δ. If the
value the noise is added to is first *rounded* in a way that depends on the data (a float of
53 bits, or of 24 bits for ``real``), one row can move it by more than the mechanism's
sensitivity, and the release is no longer ε-DP at the ε it is charged.

Two such roundings were found:

* ``release_mean`` computed the centred sum as ``float(total) − mid·count``: the exact integer
  or numeric total rounded to a double, minus a rounded product. When |mid|·n is beyond 2^53·h
  the rounding error (relative to n·|mid|, not to h) is larger than h: int8 bounds
  [1e15, 1e15 + 2] (h = 1) over 100 rows move the centred sum by 16 between two neighbours whose
  exact centred sums are equal, so the sum half of the release costs 16·ε/2, not ε/2.
* ``SUM``/``AVG`` of a ``real`` column was summed in ``double precision`` and cast back to
  ``real`` in the backend, i.e. rounded to 24 bits before the noise: with bounds
  [999999, 1000001] (h = 1), 1099 rows and one more move the centred sum by 64.

The tests capture the exact value each mechanism hands to its float Laplace sampler, for parts
computed by PostgreSQL on two neighbouring tables, and check it moves by at most the sensitivity.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import psycopg
import pytest

import mechanisms.laplace as laplace_module
import mechanisms.sum_count as sum_count_module
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from proxy.dp.column_release import release_column
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql, split_row

_INT8, _FLOAT4, _FLOAT8, _NUMERIC = 20, 700, 701, 1700


def _relation(table: str, type_oid: int, bounds: tuple[float, float]) -> Relation:
    column_policy = ColumnPolicy(bounds=bounds)
    table_policy = TablePolicy(epsilon=1.0, delta=1e-6, partitions=4, columns={"y": column_policy})
    return Relation(0, "public", table, table_policy, {"y": ColumnInfo("y", type_oid, -1, 1, column_policy)}, "ctid")


def _noised_value(admin: psycopg.Connection, sql: str, relation: Relation, module: Any, monkeypatch) -> float:
    """The exact value the column's mechanism adds float Laplace noise to (its first draw)."""
    plan = plan_aggregate_query(sql, relation)
    (parts,) = split_row(plan, admin.execute(backend_sql(plan, seed=3)).fetchone())
    seen: list[float] = []

    def capture(value: float, scale: float) -> float:
        seen.append(value)
        return value

    monkeypatch.setattr(module, "laplace_float", capture)
    release_column(plan.aggregates[0], parts, 1.0, relation.policy)
    monkeypatch.undo()
    return seen[0]


@pytest.fixture
def tables(admin: psycopg.Connection):
    names = ("atk_mech_d", "atk_mech_d1")
    admin.execute(f"DROP TABLE IF EXISTS {', '.join(names)}")
    yield admin
    admin.execute(f"DROP TABLE IF EXISTS {', '.join(names)}")


# (column type, OID, bounds, rows of D, the extra row of D′): D′ = D plus one row.
_CASES = [
    # Both exact centred sums are 100 (the extra row is the midpoint): before the fix 96 and 112.
    pytest.param("bigint", _INT8, (1e15, 1e15 + 2), [10**15 + 2] * 100, 10**15 + 1, id="bigint"),
    pytest.param("numeric", _NUMERIC, (1e15, 1e15 + 2), [10**15 + 2] * 100, 10**15 + 1, id="numeric"),
    # The backend's own float additions, rounded relative to the running total (≈ n·|mid|).
    pytest.param("double precision", _FLOAT8, (1e15, 1e15 + 2), [1e15 + 2] * 175, 1e15 + 2, id="double"),
    # Exact centred sums 1099 and 1100: before the fix 1088 and 1152 (the sum rounded to real).
    pytest.param("real", _FLOAT4, (999999.0, 1000001.0), [1000001] * 1099, 1000001, id="real"),
]


@pytest.mark.parametrize("type_name,oid,bounds,rows,extra", _CASES)
def test_sum_count_avg_centred_sum_moves_by_at_most_h_between_neighbours(
    tables, monkeypatch, type_name, oid, bounds, rows, extra
):
    admin = tables
    admin.execute(f"CREATE TABLE atk_mech_d (y {type_name})")
    with admin.cursor() as cur:
        cur.executemany("INSERT INTO atk_mech_d VALUES (%s)", [(v,) for v in rows])
    admin.execute("CREATE TABLE atk_mech_d1 AS SELECT * FROM atk_mech_d")
    admin.execute("INSERT INTO atk_mech_d1 VALUES (%s)", (extra,))
    centred = [
        _noised_value(admin, f"SELECT AVG(y) FROM {table}", _relation(table, oid, bounds), sum_count_module, monkeypatch)
        for table in ("atk_mech_d", "atk_mech_d1")
    ]
    half = (bounds[1] - bounds[0]) / 2
    assert abs(centred[1] - centred[0]) <= half, (
        f"one row moved the centred sum from {centred[0]} to {centred[1]}, "
        f"more than h = {half}: the sum noise Lap(h/(ε/2)) no longer covers it"
    )


def test_sum_of_a_real_column_reaches_the_noise_unrounded(tables, monkeypatch):
    """SUM(real) is noised on the double-precision sum, not on the sum rounded to 24 bits.

    Rounding to ``real`` errs by up to 2^-25·|sum|, which one row's value (≤ Δ) cannot bound: at
    2^24 rows of Δ two neighbours' rounded sums can differ by 2Δ. Here: 2^24 + 1 is not a real.
    """
    admin = tables
    admin.execute("CREATE TABLE atk_mech_d (y real)")
    admin.execute("INSERT INTO atk_mech_d VALUES (16777216), (1)")
    exact = _noised_value(admin, "SELECT SUM(y) FROM atk_mech_d", _relation("atk_mech_d", _FLOAT4, (0.0, 16777216.0)),
                          laplace_module, monkeypatch)
    assert exact == 16777217.0


def test_sum_count_centred_sum_is_exact_for_exact_totals(monkeypatch):
    """The mechanism alone: an integer or numeric total far beyond 2^53 still gives the exact centred sum."""
    seen: list[float] = []
    monkeypatch.setattr(sum_count_module, "laplace_float", lambda value, scale: seen.append(value) or value)
    lo, hi = 2.0**62, 2.0**62 + 2048  # doubles; mid 2^62 + 1024, h = 1024
    for count in (1, 3, 1001):
        total = count * (2**62 + 1024) + 7  # centred sum 7 whatever the count
        sum_count_module.release_mean(total, count, lo, hi, 1.0)
        sum_count_module.release_mean(Decimal(total), count, lo, hi, 1.0)
    assert seen == [7.0] * 6


# The bounds the SQL clamps to must be the bounds the noise is scaled to. A numeric column's bound
# was written as the shortest decimal that reads back as the double (repr), which can lie outside
# it by up to half a unit of its 17th digit; a real column's bound was cast to real, which rounds
# to 24 bits, outward as often as inward. Either way a row could contribute more than Δ or h.
@pytest.mark.parametrize("type_name,oid,bounds", [
    ("numeric", _NUMERIC, (0.0, 1e15 + 0.375)),  # repr: 1000000000000000.4
    ("numeric", _NUMERIC, (-(1e15 + 0.375), 0.0)),
    ("real", _FLOAT4, (16777216.0, 16777217.5)),  # as a real: 16777218
    ("real", _FLOAT4, (-16777217.5, -16777216.0)),
    ("real", _FLOAT4, (0.0, 0.1)),  # as a real: 0.100000001490116
    ("double precision", _FLOAT8, (0.0, 1e15 + 0.375)),
])
def test_backend_clamps_within_the_bounds_the_noise_is_scaled_to(admin, type_name, oid, bounds):
    from fractions import Fraction

    from rewriter.rewrite import clamped

    column = _relation("t", oid, bounds).columns["y"]
    values = ["'-Infinity'", "-1e30", "0", "1e30", "'Infinity'", "'NaN'"] if type_name != "numeric" else ["-1e30", "0", "1e30", "'NaN'"]
    # Exact values: a numeric's text, a float's double (real → double precision is exact, and a
    # double's shortest text reads back as that double).
    exact = f"CAST({clamped(column)} AS {'text' if type_name == 'numeric' else 'double precision'})"
    rows = admin.execute(
        f"SELECT {exact} FROM (VALUES " + ", ".join(f"(CAST({v} AS {type_name}))" for v in values) + ") AS t(y)"
    ).fetchall()
    lo, hi = (Fraction(b) for b in bounds)
    for (value,) in rows:
        exact_value = Fraction(Decimal(value)) if isinstance(value, str) else Fraction(value)
        assert lo <= exact_value <= hi, f"clamped to {value!r}, outside [{bounds[0]!r}, {bounds[1]!r}]"
