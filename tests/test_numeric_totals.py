"""A numeric column's SUM and ``sum_count`` AVG: the backend sends the total with the fraction digits
its rounding onto the sum grid needs, whatever digits a row holds (rewriter.rewrite.decided_total).

Read whole, a row of 16,383 fraction digits made dpproxy parse that total and compute with it in
rationals: ~8 ms more per answer (benchmarks/proxy_cost.py), which told whether the row was there.
"""

from __future__ import annotations

import random
from fractions import Fraction

import psycopg
import pytest

import mechanisms.laplace as laplace_module
from mechanisms.fixed_point import Grid
from mechanisms.sum_count import centre
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from proxy.dp.column_release import release_column
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql, clamped, decided_total, split_row
from rewriter.text_bounds import read_through

_NUMERIC = 1700
# A numeric of no declared precision is read only when stored in the row in at most 127 bytes (~248
# digits, rewriter/text_bounds.py: another value reads as NULL), so the long row here has 240 fraction digits.
_FINE = "('50.' || repeat('3', 240))::numeric"  # 240 fraction digits, inside the bounds


def _relation(table: str, bounds: tuple[float, float], avg: str = "sum_count") -> Relation:
    column_policy = ColumnPolicy(bounds=bounds, avg=avg)
    table_policy = TablePolicy(epsilon=1.0, delta=1e-6, partitions=4, columns={"y": column_policy})
    return Relation(0, "public", table, table_policy, {"y": ColumnInfo("y", _NUMERIC, -1, 1, column_policy)}, "ctid")


@pytest.fixture
def fine_table(admin: psycopg.Connection):
    admin.execute("DROP TABLE IF EXISTS numeric_totals")
    admin.execute("CREATE TABLE numeric_totals (y numeric)")
    admin.execute(f"INSERT INTO numeric_totals SELECT (g % 97) / 10.0 FROM generate_series(1, 200) g UNION ALL SELECT {_FINE}")
    yield "numeric_totals"
    admin.execute("DROP TABLE numeric_totals")


# Without GROUP BY the total is cut in the outermost SELECT: a plain aggregate, beside a percentile
# (an outer sum over the grid's groups) and beside sample and aggregate (over the partitions).
@pytest.mark.parametrize("sql", ["SELECT SUM(y) FROM numeric_totals", "SELECT AVG(y) FROM numeric_totals",
                                 "SELECT SUM(y), percentile_cont(0.5) WITHIN GROUP (ORDER BY y) FROM numeric_totals",
                                 "SELECT SUM(y), MAX(y) FROM numeric_totals"])
def test_a_row_of_240_fraction_digits_reaches_dpproxy_cut_to_the_digits_the_rounding_needs(
        admin: psycopg.Connection, fine_table: str, sql: str, monkeypatch: pytest.MonkeyPatch) -> None:
    relation = _relation(fine_table, (0.0, 100.0))
    column = relation.columns["y"]
    assert column.policy is not None
    plan = plan_aggregate_query(sql, relation)
    row = admin.execute(backend_sql(plan, seed=3)).fetchone()
    assert row is not None
    total = row[0]
    exponent = total.as_tuple().exponent
    assert isinstance(exponent, int) and -exponent <= column.policy.total_digits + 1  # not 240
    # ... and the mechanism noises the same grid point as it would the exact total.
    exact = admin.execute(f"SELECT sum({read_through(clamped(column))}), count(y) FROM {fine_table}").fetchone()
    assert exact is not None
    seen: list[int] = []
    monkeypatch.setattr(laplace_module, "laplace_int", lambda value, scale: seen.append(value) or value)
    release_column(plan.aggregates[0], split_row(plan, row)[0], 1.0, relation.policy)
    grid, mid = column.policy.sum_grid, Fraction(centre(0.0, 100.0))
    expected = grid.rounded(exact[0]) if "SUM" in sql else grid.rounded(Fraction(exact[0]) - mid * exact[1])
    assert seen[0] == expected


BOUNDS = [(0.0, 100.0), (-3.3, 7.1), (1e15, 1e15 + 2), (0.0, 1e-300), (-1e20, 3e20), (17.0, 90.0)]


def _totals(grid: Grid, middle: Fraction, rng: random.Random) -> list[Fraction]:
    """Exact totals around the grid's rounding boundaries T = centre·n + (2m + 1)/2^(k+1) (on,
    just above and just below them) and long decimals anywhere."""
    out: list[Fraction] = []
    for n in (0, 1, 7, 1000):
        for m in (-3, 0, 5, 10**6):
            tie = middle * n + Fraction(2 * m + 1, 2) / Fraction(2) ** grid.exponent
            tiny = Fraction(1, 10 ** (grid.deciding_digits(float(middle)) + 30))
            out += [tie, tie + tiny, tie - tiny]
    for _ in range(40):
        digits = rng.randint(0, 3000)
        out.append(Fraction(rng.randint(-10**40, 10**40), 10**digits))
    return out


def _decimal(value: Fraction) -> str:
    """The exact decimal text of a Fraction whose denominator divides a power of ten."""
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
    whole = int(value * 10**digits)
    text = str(abs(whole)).rjust(digits + 1, "0")
    return ("-" if whole < 0 else "") + (f"{text[:-digits]}.{text[-digits:]}" if digits else text)


@pytest.mark.parametrize("bounds", BOUNDS, ids=[f"{lo:g}..{hi:g}" for lo, hi in BOUNDS])
def test_the_cut_total_rounds_onto_the_sum_grid_exactly_as_the_whole_total(admin: psycopg.Connection,
                                                                           bounds: tuple[float, float]) -> None:
    grid = Grid.for_bounds(*bounds)
    middle = Fraction(centre(*bounds))
    digits = ColumnPolicy(bounds=bounds).total_digits
    totals = _totals(grid, middle, random.Random(7))
    texts = [_decimal(total) for total in totals]
    cut = admin.execute(f"SELECT {decided_total('t', digits)} FROM unnest(%s::numeric[]) WITH ORDINALITY AS u(t, i) "
                        "ORDER BY i", (texts,)).fetchall()
    for total, (sent,) in zip(totals, cut):
        assert -sent.as_tuple().exponent <= digits + 1
        for n in (0, 1, 7, 1000):
            assert grid.rounded(Fraction(sent) - middle * n) == grid.rounded(total - middle * n), (total, sent, n)

