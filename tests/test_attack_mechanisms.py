"""Implementation limits that let an exact value through the noise: arithmetic before the noise.

The mechanisms' guarantees are about the value the noise is added to: the ``sum_count`` AVG adds
Lap(h/(ε/2)) to the centred sum Σ(x − mid), which one added or removed row moves by at most
h = (hi − lo)/2, and SUM adds Lap(Δ/ε) to a clamped sum that one row moves by at most Δ. If the
value the noise is added to is first *rounded* in a way that depends on the data (a float of
53 bits, or of 24 bits for ``real``), one row can move it by more than the mechanism's
sensitivity, and the release is no longer ε-DP at the ε it is charged.

Three such roundings were found:

* ``release_mean`` computed the centred sum as ``float(total) − mid·count``: the exact integer
  or numeric total rounded to a double, minus a rounded product. When |mid|·n is beyond 2^53·h
  the rounding error (relative to n·|mid|, not to h) is larger than h: int8 bounds
  [1e15, 1e15 + 2] (h = 1) over 100 rows move the centred sum by 16 between two neighbours whose
  exact centred sums are equal, so the sum half of the release costs 16·ε/2, not ε/2.
* ``SUM``/``AVG`` of a ``real`` column was summed in ``double precision`` and cast back to
  ``real`` in the backend, i.e. rounded to 24 bits before the noise: with bounds
  [999999, 1000001] (h = 1), 1099 rows and one more move the centred sum by 64.
* A float column's SUM and AVG were PostgreSQL's sum of doubles, rounded at every addition
  relative to the running total: about n²·2^-53 of the largest bound over n rows, which one
  row does not bound past ~10^7 rows (Casacuberta, Shoemate, Vadhan and Wagaman 2022). They
  are now exact sums on a fixed-point grid (``mechanisms.fixed_point``).

The tests capture the exact value each mechanism hands to its sampler (integer points of that
grid, read back in the column's units), for parts computed by PostgreSQL on two neighbouring
tables, and check it moves by at most the sensitivity.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import psycopg
import pytest

from tests.conftest import dropped_around

import mechanisms.laplace as laplace_module
import mechanisms.sum_count as sum_count_module
from mechanisms.fixed_point import Grid
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from proxy.dp.column_release import release_column
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql, split_row
from rewriter.text_bounds import read_through

_INT8, _FLOAT4, _FLOAT8, _NUMERIC = 20, 700, 701, 1700


def _relation(table: str, type_oid: int, bounds: tuple[float, float]) -> Relation:
    column_policy = ColumnPolicy(bounds=bounds)
    table_policy = TablePolicy(epsilon=1.0, delta=1e-6, partitions=4, columns={"y": column_policy})
    return Relation(0, "public", table, table_policy, {"y": ColumnInfo("y", type_oid, -1, 1, column_policy)}, "ctid")


def _noised_value(admin: psycopg.Connection, sql: str, relation: Relation, monkeypatch) -> float:
    """The exact value the column's mechanism adds noise to (its first draw), in the column's
    units: the sum noise is drawn on the grid of ``mechanisms.fixed_point``, in integer points."""
    plan = plan_aggregate_query(sql, relation)
    (parts,) = split_row(plan, admin.execute(backend_sql(plan, seed=3)).fetchone())
    seen: list[int] = []

    def capture(value: int, scale: float) -> int:
        seen.append(value)
        return value

    monkeypatch.setattr(laplace_module, "laplace_int", capture)
    release_column(plan.aggregates[0], parts, 1.0, relation.policy)
    monkeypatch.undo()
    column = relation.columns["y"].policy
    assert column is not None
    return float(Fraction(seen[0]) * Fraction(column.sum_grid.step))


@pytest.fixture
def tables(admin: psycopg.Connection):
    with dropped_around(admin, *("atk_mech_d", "atk_mech_d1")) as conn:
        yield conn


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
        _noised_value(admin, f"SELECT AVG(y) FROM {table}", _relation(table, oid, bounds), monkeypatch)
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
                          monkeypatch)
    assert exact == 16777217.0


@pytest.mark.parametrize("type_name,oid", [("double precision", _FLOAT8), ("real", _FLOAT4)])
def test_sum_of_a_float_column_reaches_the_noise_exact_not_rounded_at_each_addition(tables, monkeypatch, type_name, oid):
    """A float column's SUM is noised on the exact sum of its clamped values, not on PostgreSQL's
    sum of doubles, which rounds each addition relative to the running total.

    Over n rows those roundings add up to about n²·2^-53 of the largest bound, which one row
    does not bound (Casacuberta et al. 2022): past ~10^7 rows one added row can move the sum of
    doubles by more than the noise covers. Here a smaller case shows the rounding: after
    4·2^40, each added 2^-11 is half a unit in the last place of the running total, and
    ``sum()`` drops all 1,000 of them; the exact sum keeps them.
    """
    admin = tables
    admin.execute(f"CREATE TABLE atk_mech_d (y {type_name})")
    admin.execute(f"INSERT INTO atk_mech_d SELECT CAST(2 AS {type_name}) ^ 40 FROM generate_series(1, 4)")
    admin.execute(f"INSERT INTO atk_mech_d SELECT CAST(2 AS {type_name}) ^ -11 FROM generate_series(1, 1000)")
    (rounded,) = admin.execute("SELECT CAST(sum(CAST(y AS double precision)) AS double precision) FROM atk_mech_d").fetchone()
    assert rounded == 2.0**42  # the backend's own sum, which the mechanism used to be handed
    relation = _relation("atk_mech_d", oid, (-(2.0**40), 2.0**40))
    exact = float(Fraction(2**42) + 1000 * Fraction(1, 2**11))
    assert _noised_value(admin, "SELECT SUM(y) FROM atk_mech_d", relation, monkeypatch) == exact
    # AVG's sum, centred on the middle of the bounds, 0 here
    assert _noised_value(admin, "SELECT AVG(y) FROM atk_mech_d", relation, monkeypatch) == exact


def test_float_sum_on_a_coarse_grid_never_fails_on_a_tiny_value(tables, monkeypatch):
    """Bounds beyond 2^52 give a grid step above 1 (k < 0): multiplying a subnormal value by 2^k
    in ``double precision`` gives 0, which PostgreSQL raises as "value out of range:
    underflow", so whether a row held such a value would decide whether the query fails. Such
    values are taken as 0 (their grid point) without multiplying; the sum stays exact."""
    admin = tables
    admin.execute("CREATE TABLE atk_mech_d (y double precision)")
    values = ["5e-324", "-1e-300", "1e14", "2e14", "1e30", "'NaN'", "'-Infinity'"]
    admin.execute("INSERT INTO atk_mech_d VALUES " + ", ".join(f"(CAST({v} AS double precision))" for v in values))
    bounds = (-1e30, 1e30)
    grid = Grid.for_bounds(*bounds)
    assert grid.exponent < 0 and grid.rounds_to_zero_below is not None
    clamped = [5e-324, -1e-300, 1e14, 2e14, 1e30, 1e30, -1e30]  # NaN clamps to hi, -Infinity to lo
    exact = float(Fraction(sum(grid.point(v) for v in clamped)) * Fraction(grid.step))
    relation = _relation("atk_mech_d", _FLOAT8, bounds)
    assert _noised_value(admin, "SELECT SUM(y) FROM atk_mech_d", relation, monkeypatch) == exact


def test_sum_count_centred_sum_is_exact_for_exact_totals(monkeypatch):
    """The mechanism alone: an integer or numeric total far beyond 2^53 still gives the exact
    centred sum, rounded once to the grid (here a step of 2^11)."""
    seen: list[int] = []
    monkeypatch.setattr(laplace_module, "laplace_int", lambda value, scale: seen.append(value) or value)
    lo, hi = 2.0**62, 2.0**62 + 2048  # doubles; mid 2^62 + 1024, h = 1024
    assert Grid.for_bounds(lo, hi).step == 2.0**11
    for count in (1, 3, 1001):
        total = count * (2**62 + 1024) + 7 * 2**11 + 5  # centred sum 7 points and 5/2048 whatever the count
        sum_count_module.release_mean(total, count, lo, hi, 1.0)
        sum_count_module.release_mean(Decimal(total), count, lo, hi, 1.0)
    assert seen == [7] * 6


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
    exact = f"CAST({read_through(clamped(column))} AS {'text' if type_name == 'numeric' else 'double precision'})"
    rows = admin.execute(
        f"SELECT {exact} FROM (VALUES " + ", ".join(f"(CAST({v} AS {type_name}))" for v in values) + ") AS t(y)"
    ).fetchall()
    lo, hi = (Fraction(b) for b in bounds)
    for (value,) in rows:
        exact_value = Fraction(Decimal(value)) if isinstance(value, str) else Fraction(value)
        assert lo <= exact_value <= hi, f"clamped to {value!r}, outside [{bounds[0]!r}, {bounds[1]!r}]"


_PROXY_POLICY = """
backend: {{dsn: "{dsn}", statement_timeout_ms: 20000}}
listen: {{host: 127.0.0.1, port: 0}}
ledger: {{url: "sqlite:///{ledger}"}}
repeats: {{enabled: false}}
users:
  analyst: {{password: analyst, budget: {{epsilon: 1000000, delta: 0.5}}}}
tables:
  public.atk_mech_wide:
    access: protected
    epsilon: 200.0
    delta: 1.0e-6
    partitions: 4
    columns:
      r: {{bounds: [999999, 1000001]}}
      b: {{bounds: [1.0e15, 1000000000000002]}}
      n: {{bounds: [1.0e15, 1000000000000002]}}
      f: {{bounds: [1.0e15, 1000000000000002]}}
      k: {{categories: [x, y], group_by: true}}
"""


def test_wide_values_answer_through_the_proxy_with_postgres_types_and_near_the_exact_value(test_db, tmp_path_factory):
    """End to end over the fixes: a real's sum reaches dpproxy as a double, float AVGs as a
    centred sum, bigint and numeric AVGs exactly; the answers keep PostgreSQL's result types
    and, at ε = 200, lie near the exact values (a centred sum misread as a plain one, or the
    centre added twice, would be off by about 1e6 or 1e15)."""
    from tests.conftest import running_proxy

    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS atk_mech_wide")
        conn.execute("CREATE TABLE atk_mech_wide (r real, b bigint, n numeric, f double precision, k text)")
        conn.execute("INSERT INTO atk_mech_wide SELECT 1000000 + (i % 3) - 1, 1000000000000000 + i % 3, "
                     "1000000000000000 + i % 3, 1000000000000000 + i % 3, CASE WHEN i % 2 = 0 THEN 'x' ELSE 'y' END "
                     "FROM generate_series(1, 3000) i")
        conn.execute("GRANT SELECT ON atk_mech_wide TO dpproxy_service")
    try:
        with running_proxy(test_db, tmp_path_factory, _PROXY_POLICY) as proxy, proxy.connect() as conn:
            cur = conn.execute("SELECT AVG(r), AVG(b), AVG(n), AVG(f), SUM(r) FROM atk_mech_wide")
            types = [column.type_code for column in cur.description]
            avg_r, avg_b, avg_n, avg_f, sum_r = cur.fetchone()
            assert types == [701, 1700, 1700, 701, 700]  # as PostgreSQL: AVG(real) double, SUM(real) real
            assert abs(avg_r - 1000000) < 0.01 and abs(avg_f - 1e15 - 1) < 0.01
            assert abs(avg_b - Decimal(10**15 + 1)) < Decimal("0.01") and abs(avg_n - Decimal(10**15 + 1)) < Decimal("0.01")
            assert abs(sum_r - 3e9) < 3e5  # Lap(1000001/40): 12 scales (chance e^-12), printed as a real
            rows = conn.execute("SELECT k, AVG(r), AVG(f), COUNT(*) FROM atk_mech_wide GROUP BY k ORDER BY k").fetchall()
            assert [row[0] for row in rows] == ["x", "y"]
            for _, cell_r, cell_f, count in rows:
                assert abs(cell_r - 1000000) < 0.01 and abs(cell_f - 1e15 - 1) < 0.01 and abs(count - 1500) < 5
    finally:
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS atk_mech_wide")
