"""A GROUP BY's numeric SUM and ``sum_count`` AVG: each released cell's total is summed and cut in the
backend, whatever groups the cell collects (an ``other`` key's values, a date part's buckets, a
percentile's grid indices: rewriter.rewrite._grouped_sql, split_cells). No test here times anything:
the last ones count what dpproxy reads.

Each group's exact total used to reach dpproxy whole: one row of 16,383 fraction digits made it parse
that total and round it in rationals, ~8 ms more per answer (benchmarks/proxy_cost.py), and the groups
an ``other`` cell collects were added in Python's 28-digit default context, which dropped digits.
"""

from __future__ import annotations

from decimal import MAX_EMAX, MIN_EMIN, ROUND_FLOOR, Context, Decimal, localcontext
from fractions import Fraction
from typing import Any

import psycopg
import pytest

import mechanisms.laplace as laplace_module
from mechanisms.fixed_point import Grid
from mechanisms.sum_count import centre
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from proxy.dp.column_release import release_column
from rewriter.dp_query import AggregateQuery, plan_aggregate_query
from rewriter.rewrite import aggregate_parts, backend_sql, clamped, decided_total, split_cells
from rewriter.text_bounds import read_in_place, read_through
from tests.backend_sql_audit import AuditColumn, audit_backend_sql
from tests.raw_reads import projected

_NUMERIC, _TEXT, _TIMESTAMPTZ = 1700, 25, 1184
_TABLE = "grouped_totals"
# A numeric of no declared precision is read only when stored in the row in at most 127 bytes (~248
# digits, rewriter/text_bounds.py: another value reads as NULL), so the long decimals here have 240 fraction digits.
_DIGITS = 240
_TINY = Decimal(f"1e-{_DIGITS}")  # a row's finest fraction digit
_FINE = f"('50.' || repeat('3', {_DIGITS}))::numeric"  # 240 fraction digits, inside [-50, 100]
_EXACT = Context(prec=200_000, Emax=MAX_EMAX, Emin=MIN_EMIN)  # the tests' own sums of long decimals, unrounded


def _relation(bounds: tuple[float, float], units: tuple[str, ...] = ("month",)) -> Relation:
    value = ColumnPolicy(bounds=bounds)
    key = ColumnPolicy(categories=["a", "b", "c", "d"], group_by=True, other="other")
    time = ColumnPolicy(bounds=("2021-01-01", "2022-12-31"), group_by=list(units))
    table_policy = TablePolicy(epsilon=1.0, delta=1e-6, partitions=4, columns={"y": value, "c": key, "ts": time})
    return Relation(0, "public", _TABLE, table_policy,
                    {"y": ColumnInfo("y", _NUMERIC, -1, 1, value),
                     "c": ColumnInfo("c", _TEXT, -1, 2, key, array_type_oid=1009),
                     "ts": ColumnInfo("ts", _TIMESTAMPTZ, -1, 3, time)}, "ctid")


@pytest.fixture
def table(admin: psycopg.Connection):
    admin.execute(f"DROP TABLE IF EXISTS {_TABLE}")
    admin.execute(f"CREATE TABLE {_TABLE} (y numeric, c text, ts timestamptz)")
    yield _TABLE
    admin.execute(f"DROP TABLE {_TABLE}")


def _insert(admin: psycopg.Connection, rows: list[tuple[Any, ...]]) -> None:
    with admin.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {_TABLE} (y, c, ts) VALUES (%s, %s, %s)", rows)


def _cells(admin: psycopg.Connection, plan: AggregateQuery) -> list[list[tuple[Any, ...]]]:
    """Every cell's parts, from the backend's rows as dpproxy reads them (keys as the backend prints them)."""
    with admin.cursor(binary=False) as cursor:
        cursor.execute(backend_sql(plan, seed=3))
        keys = len(plan.groups)
        rows = [[*(None if v is None else str(v).encode() for v in row[:keys]), *row[keys:]] for row in cursor]
    return split_cells(plan, rows)


def _released_points(plan: AggregateQuery, relation: Relation, monkeypatch: pytest.MonkeyPatch,
                     cells: list[list[tuple[Any, ...]]]) -> list[int]:
    """The grid point each cell's total is noised at (the first Laplace draw of its release)."""
    points: list[int] = []
    for parts in cells:
        seen: list[int] = []
        with monkeypatch.context() as patched:
            patched.setattr(laplace_module, "laplace_int", lambda value, scale: seen.append(value) or value)
            release_column(plan.aggregates[0], parts[0], 1.0, relation.policy)
        points.append(seen[0])
    return points


def _exact_points(admin: psycopg.Connection, relation: Relation, avg: bool) -> list[int]:
    """The grid point of each category cell's exact total (a, b, c, d, other), summed whole here."""
    column = relation.columns["y"]
    assert column.policy is not None and column.policy.bounds is not None
    grid, middle = column.policy.sum_grid, Fraction(centre(*column.policy.bounds))
    cell = "CASE c WHEN 'a' THEN 0 WHEN 'b' THEN 1 WHEN 'c' THEN 2 WHEN 'd' THEN 3 ELSE 4 END"
    found = {row[0]: row[1:] for row in admin.execute(
        f"SELECT {cell}, sum({read_through(clamped(column))}), count(y) FROM {_TABLE} GROUP BY 1").fetchall()}
    points = []
    for i in range(5):
        total, count = found.get(i, (None, 0))
        exact = Fraction(total) if total is not None else Fraction(0)
        points.append(grid.rounded(exact - middle * count if avg else exact))
    return points


def _tie(grid: Grid, m: int) -> Decimal:
    """The total (2m + 1)/2^(k+1), halfway between two grid points (rint rounds it to even), exactly."""
    k = grid.exponent
    return Decimal(f"{(2 * m + 1) * 5 ** (k + 1)}E-{k + 1}") if k >= -1 else Decimal((2 * m + 1) * 2 ** (-k - 1))


@pytest.mark.parametrize("sql", ["SELECT c, SUM(y) FROM grouped_totals GROUP BY c",
                                 "SELECT c, AVG(y) FROM grouped_totals GROUP BY c",
                                 "SELECT date_trunc('month', ts) AS m, SUM(y) FROM grouped_totals GROUP BY 1"])
def test_a_group_bys_numeric_totals_are_summed_per_cell_and_cut_in_the_backend(
        admin: psycopg.Connection, table: str, sql: str) -> None:
    relation = _relation((-50.0, 100.0))
    policy = relation.columns["y"].policy
    assert policy is not None
    _insert(admin, [(Decimal("12.5"), "a", "2021-03-04"), (Decimal("7.25"), "x", "2021-03-05"),
                    (Decimal("-3.5"), "z", "2021-04-01"), (Decimal("1.5"), None, "2021-04-02")])
    admin.execute(f"INSERT INTO {_TABLE} VALUES ({_FINE}, 'y', '2021-03-06'), ({_FINE}, 'a', '2021-04-03')")
    plan = plan_aggregate_query(sql, relation)
    # Each key's group is its cell's only row (a category key groups by the row's cell), cut where
    # it is computed.
    first, sql = aggregate_parts(plan.aggregates[0])[0].sql, backend_sql(plan, seed=3)
    read = read_through if projected(sql, "y") else read_in_place  # y read through a projection, or its bound in place
    assert decided_total(read(first, relation), policy.total_digits) in sql
    rows = admin.execute(backend_sql(plan, seed=3)).fetchall()
    keys = len(plan.groups)
    assert len({tuple(row[:keys]) for row in rows}) == len(rows)  # one row per reported cell
    assert all(-row[keys].as_tuple().exponent <= policy.total_digits + 1 for row in rows)  # not 240


# Bounds whose grid is fine (k = 45: ties of 46 fraction digits) and one with a centre of its own.
@pytest.mark.parametrize("bounds", [(-50.0, 50.0), (-3.3, 7.1)], ids=["-50..50", "-3.3..7.1"])
@pytest.mark.parametrize("avg", [False, True], ids=["SUM", "AVG"])
def test_each_cells_released_total_is_the_grid_point_of_its_exact_total(
        admin: psycopg.Connection, table: str, bounds: tuple[float, float], avg: bool,
        monkeypatch: pytest.MonkeyPatch) -> None:
    relation = _relation(bounds)
    policy = relation.columns["y"].policy
    assert policy is not None
    grid, middle = policy.sum_grid, Decimal(centre(*bounds))
    # Totals on a tie and just beside one, each made of long decimals that no group's cut would keep.
    shift = 1 if avg else 0  # the released total is T − centre·n: ties of the centred total
    with localcontext(_EXACT):
        tie_a = _tie(grid, 3) + 2 * shift * middle
        # The other cell's tie near 1, where Python's 28-digit addition of its groups rounded below
        # it (so to the grid point below) while their exact sum is above it (the point above).
        m = 2 ** grid.exponent
        while not _rounded_down_at_28_digits(_tie(grid, m) + 3 * shift * middle):
            m += 1
        tie_other = _tie(grid, m) + 3 * shift * middle
        rows = _rows(tie_a, tie_other)
    _insert(admin, rows)
    sql = f"SELECT c, {'AVG' if avg else 'SUM'}(y) FROM {_TABLE} GROUP BY c"
    plan = plan_aggregate_query(sql, relation)
    released = _released_points(plan, relation, monkeypatch, _cells(admin, plan))
    assert released == _exact_points(admin, relation, avg)


def _rounded_down_at_28_digits(value: Decimal) -> bool:
    with localcontext(Context(prec=28)):
        return +value < value


def _rows(tie_a: Decimal, tie_other: Decimal) -> list[tuple[Any, ...]]:
    return [
        (tie_a + _TINY, "a", None), (-_TINY, "a", None),  # a: exactly on a tie
        # b: no row; c: values all NULL (a group whose total is NULL)
        (None, "c", None), (None, "c", None),
        # d: negative long decimals and a value clamped to the lower bound
        (Decimal("-1." + "7" * (_DIGITS - 10)), "d", None), (Decimal("-1e9"), "d", None),
        (Decimal("-0." + "3" * _DIGITS), "d", None),
        # other: three groups (x, z, a NULL key) whose sum is just above a tie, each far from it
        (tie_other + 4 * _TINY, "x", None), (-2 * _TINY, "z", None), (-_TINY, None, None),
    ]


def test_a_date_parts_buckets_are_added_exactly_beyond_28_digits(
        admin: psycopg.Connection, table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Month of year joins each year's bucket of that month: dpproxy adds the buckets' totals up. In
    # Python's default 28-digit context tie + 1e-9 (31 digits) was the tie itself, which rounds to
    # the even grid point below: the exact total rounds above.
    relation = _relation((-1e21, 1e21))
    policy = relation.columns["y"].policy
    assert policy is not None
    grid = policy.sum_grid
    m = (10**20 >> -grid.exponent) // 2 * 2  # even: its tie rounds down to m
    tie = _tie(grid, m)
    assert 20 <= len(str(tie)) <= 22 and policy.total_digits == 0
    _insert(admin, [(tie, "a", "2021-06-10"), (Decimal("1e-9"), "a", "2022-06-10"), (Decimal("5"), "a", "2022-07-10")])
    plan = plan_aggregate_query(f"SELECT EXTRACT(MONTH FROM ts) AS m, SUM(y) FROM {_TABLE} GROUP BY 1", relation)
    assert plan.domain.joined
    cells = _cells(admin, plan)
    assert cells[5][0][0] == tie + Decimal("0.5")  # June: 2021's and 2022's buckets, above the tie (cut: D = 0)
    assert cells[6][0][0] == 5 and cells[0][0][0] is None
    assert _released_points(plan, relation, monkeypatch, [cells[5]]) == [m + 1]


# A month of year joins each year's bucket of that month; a percentile splits each cell by grid index.
@pytest.mark.parametrize("sql", ["SELECT EXTRACT(MONTH FROM ts) AS m, SUM(y) FROM grouped_totals GROUP BY 1",
                                 "SELECT EXTRACT(MONTH FROM ts) AS m, SUM(y), percentile_disc(0.5) WITHIN GROUP "
                                 "(ORDER BY y) FROM grouped_totals GROUP BY 1",
                                 "SELECT c, AVG(y), percentile_cont(0.5) WITHIN GROUP (ORDER BY y) FROM grouped_totals "
                                 "GROUP BY c"], ids=["month-of-year", "month-percentile", "category-percentile"])
def test_a_cells_total_over_several_groups_reaches_dpproxy_summed_and_cut(
        admin: psycopg.Connection, table: str, sql: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Summed over the cell's buckets and grid indices in the backend (their cuts would not add up
    # to the cut of their sum), then cut: a tie made of two long rows stays a tie, and no value the
    # backend sends is longer than its integer part and D + 1 fraction digits, whatever a row holds.
    relation = _relation((-50.0, 50.0))
    policy = relation.columns["y"].policy
    assert policy is not None
    tie = _tie(policy.sum_grid, 5)
    with localcontext(_EXACT):
        high = tie + _TINY
    nines = Decimal("0." + "9" * _DIGITS)
    _insert(admin, [(high, "a", "2021-06-10"), (-_TINY, "a", "2022-06-10"),
                    (nines, "b", "2021-07-10"), (nines, "b", "2022-07-10"), (Decimal(-7), "b", "2022-07-11")])
    plan = plan_aggregate_query(sql, relation)
    avg = "AVG" in sql
    rows = admin.execute(backend_sql(plan, seed=3)).fetchall()
    assert max(len(str(v)) for row in rows for v in row) <= 2 + 1 + policy.total_digits + 1 + 1  # -dd.D+1 digits
    cells = _cells(admin, plan)
    first, second = (cells[5], cells[6]) if plan.groups[0].kind == "time" else (cells[0], cells[1])
    if avg:
        assert [first[0][1], second[0][1]] == [2, 3]
    assert first[0][0] == tie
    assert -second[0][0].as_tuple().exponent == policy.total_digits + 1  # cut, with its sticky 5
    middle = Fraction(centre(*policy.bounds)) if avg else Fraction(0)  # type: ignore[misc]
    released = _released_points(plan, relation, monkeypatch, [first, second])
    assert released == [policy.sum_grid.rounded(Fraction(tie) - 2 * middle),
                        policy.sum_grid.rounded(2 * Fraction(nines) - 7 - 3 * middle)]
    if not avg:
        assert released[0] % 2 == 0  # the tie rounded to even


# Every date part (and a joint factor of two keys) over a column whose rows fall on every day of
# two years and a bit: the backend's cells are dpproxy's, one row each.
_PART_KEYS = ["EXTRACT(MONTH FROM ts)", "EXTRACT(QUARTER FROM ts)", "EXTRACT(DAY FROM ts)", "EXTRACT(DOW FROM ts)",
              "EXTRACT(ISODOW FROM ts)", "EXTRACT(DOY FROM ts)", "EXTRACT(WEEK FROM ts)", "CAST(ts AS DATE)",
              "CASE WHEN mod(CAST(extract(dow from ts) AS integer) + 6, 7) = 0 THEN 7 "
              "ELSE mod(CAST(extract(dow from ts) AS integer) + 6, 7) END",
              "date_trunc('week', ts + INTERVAL '1 day') + INTERVAL '-1 day'"]


@pytest.mark.parametrize("key", [*([k] for k in _PART_KEYS), ["EXTRACT(MONTH FROM ts)", "date_trunc('year', ts)"],
                                 ["EXTRACT(DOW FROM ts)", "c"]], ids=str)
@pytest.mark.parametrize("percentile", [False, True], ids=["sum", "sum-percentile"])
def test_a_date_parts_cells_are_summed_in_the_backend_as_dpproxy_numbers_them(
        admin: psycopg.Connection, table: str, key: list[str], percentile: bool) -> None:
    relation = _relation((-50.0, 100.0), ("day", "year"))
    admin.execute(f"INSERT INTO {_TABLE} SELECT (g % 97) / 7.0 - 3, (ARRAY['a', 'b', 'q'])[1 + g % 3], "
                  "'2020-12-20 13:00+00'::timestamptz + g * interval '1 day' FROM generate_series(0, 800) g")
    admin.execute(f"INSERT INTO {_TABLE} VALUES ('NaN', 'a', '2021-02-03'), ('Infinity', 'b', '2021-02-04'), "
                  f"('-Infinity', 'a', '2022-02-04'), (-1e20, 'a', '2021-08-08'), ({_FINE}, 'b', '2022-11-30')")
    items = ", ".join(str(i + 1) for i in range(len(key)))
    extra = ", percentile_disc(0.5) WITHIN GROUP (ORDER BY y)" if percentile else ""
    plan = plan_aggregate_query(f"SELECT {', '.join(key)}, SUM(y), COUNT(*){extra} FROM {_TABLE} GROUP BY {items}",
                                relation)
    assert plan.domain.joined
    cells = _cells(admin, plan)
    # Each cell's exact total, from each group's buckets as dpproxy numbers them (what the backend sent before).
    groups = admin.execute(read_through(
        f"SELECT {', '.join(k.cell_sql() for k in plan.groups)}, sum({clamped(relation.columns['y'])}), count(*) "
        f"FROM {_TABLE} GROUP BY {', '.join(k.row_sql() for k in plan.groups)}")).fetchall()
    expected: dict[int, list[Any]] = {}
    for *reported, total, count in groups:
        cell = plan.domain.cell([k.cell_of(None if v is None else str(v).encode()) for k, v in zip(plan.groups, reported)])
        if cell is None:
            continue
        found = expected.setdefault(cell, [Decimal(0), 0])
        found[0] = _EXACT.add(found[0], total)
        found[1] += count
    assert len(expected) >= 4  # quarters, or more cells
    assert {i for i, parts in enumerate(cells) if parts[1][0] is not None} == set(expected)
    digits = relation.columns["y"].policy.total_digits  # type: ignore[union-attr]
    for cell, (total, count) in expected.items():
        assert cells[cell][1][0] == count
        assert Fraction(cells[cell][0][0]) == Fraction(_cut(total, digits))
    rows = admin.execute(backend_sql(plan, seed=3)).fetchall()
    assert max(len(str(v)) for row in rows for v in row if isinstance(v, Decimal)) <= digits + 10  # not the row's 240
    audited = {name: AuditColumn(column.type_oid) for name, column in relation.columns.items()}
    assert audit_backend_sql(backend_sql(plan, seed=3), ("public", _TABLE), audited) == []
    if not percentile:  # one row per cell
        assert len(rows) == len(expected)


def _cut(total: Decimal, digits: int) -> Decimal:
    """``decided_total`` of ``total``, computed here: total when it has at most ``digits`` fraction
    digits, else floor(T·10^D)·10^-D + 5·10^-(D+1)."""
    scaled = _EXACT.scaleb(total, digits)
    whole = scaled.to_integral_value(rounding=ROUND_FLOOR, context=_EXACT)
    if whole == scaled:
        return total
    return _EXACT.add(_EXACT.scaleb(whole, -digits), _EXACT.scaleb(Decimal(5), -(digits + 1)))


def test_one_row_of_a_new_other_value_or_long_fraction_changes_no_backend_row_nor_its_length(
        admin: psycopg.Connection, table: str) -> None:
    # What dpproxy reads is what its work on the answer follows: one row per reported cell, each
    # total of at most D + 1 fraction digits, whichever rows the cells hold (no timing measured).
    relation = _relation((-50.0, 100.0))
    policy = relation.columns["y"].policy
    assert policy is not None
    _insert(admin, [(Decimal(i) / 7 if i % 2 else Decimal(i), c, None)
                    for i, c in enumerate(["a", "b", "c", "d", "x", None] * 20)])
    plan = plan_aggregate_query(f"SELECT c, SUM(y), AVG(y) FROM {_TABLE} GROUP BY c", relation)

    def read() -> tuple[int, int]:
        """The backend rows and their totals' most fraction digits."""
        rows = admin.execute(backend_sql(plan, seed=3)).fetchall()
        digits = [-Decimal(value).as_tuple().exponent for row in rows for value in row[1:] if value is not None]
        return len(rows), max(digits)

    base = read()
    assert base == (5, base[1]) and base[1] <= policy.total_digits + 1
    for value, key in [(f"{_FINE}", "'a'"), (f"{_FINE}", "'new'"), ("1e9", "NULL"), ("-1e9", "'other'")]:
        admin.execute(f"INSERT INTO {_TABLE} (y, c) SELECT {value}, {key} FROM generate_series(1, 30)")
        admin.execute(f"INSERT INTO {_TABLE} (y, c) SELECT {value}, 'v' || g FROM generate_series(1, 30) g")
        assert read()[0] == base[0] and read()[1] <= policy.total_digits + 1
