"""Metabase's numeric binning, ``floor((col - A) / W) * W + A``, answered as a histogram over public bins.

Each statement runs through dpproxy and directly on PostgreSQL: the released keys are every
bin from the one holding the lower bound to the one holding the upper bound, with the type and
text PostgreSQL gives the direct query's key for the same bin; the direct query's bins (over the
rows within the bounds) are among them, and with a huge ε the counts agree. Rows outside the
bounds, NULL and NaN are in no bin. Neighbouring tables (one adversarial row more) give the same
cells and no error. What is not a public bin stays refused before the charge (docs/bi-tools.md).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction

import psycopg
import pytest
from conftest import TEST_POLICY, RunningProxy, TestDatabase, running_proxy, spent_epsilon

from proxy.demo.embedded import SERVICE_ROLE
from rewriter.floor_bins import Number, numeric_indices

_COLUMNS = """\
    columns:
      age: {{bounds: [17, 90], group_by: true}}
      big: {{bounds: [-1000, 1000], group_by: true}}
      amount: {{bounds: [0.5, 99.5], group_by: true}}
      score: {{bounds: [0, 1], group_by: true}}
      ratio: {{bounds: [-5, 5], group_by: true}}
      income: {{bounds: [0, 1000]}}
"""
_HUGE = 20000  # ε of the tables whose counts are compared with PostgreSQL's: noise of scale 5e-5
_TABLES = ("fb", "fb_base", "fb_lo", "fb_hi", "fb_out", "fb_nan", "fb_tiny")
POLICY = TEST_POLICY + "".join(
    f"  public.{table}:\n    access: protected\n    epsilon: {_HUGE if table in ('fb', 'fb_tiny') else 1.0}\n"
    "    delta: 1.0e-6\n    max_cells: 60\n" + _COLUMNS
    for table in _TABLES
)
_TYPES = {"age": "integer", "big": "bigint", "amount": "numeric", "score": "double precision", "ratio": "real"}
_DDL = "(age integer, big bigint, amount numeric, score double precision, ratio real, income numeric)"
# The edges: each bound, the values just inside and outside it (nextafter for the floats), and
# beyond every domain NULL, NaN, ±infinity, -0.0 and the smallest subnormal double.
_TABLE_SQL = f"""
DROP TABLE IF EXISTS {", ".join(_TABLES)};
CREATE TABLE fb {_DDL};
INSERT INTO fb SELECT 17 + i % 74, -1000 + (i * 7) % 2001, 0.5 + (i % 991) / 10.0, (i % 101) / 100.0,
                      ((i % 101) - 50) / 10.0, i % 1000
FROM generate_series(1, 3000) AS i;
INSERT INTO fb VALUES (17, -1000, 0.5, 0, -5, 0), (90, 1000, 99.5, 1, 5, 0),
    (16, -1001, 0.49999, -4.9e-324, -5.0000005, 0), (91, 1001, 99.50001, 1.0000000000000002, 5.0000005, 0),
    (NULL, NULL, NULL, NULL, NULL, NULL), (NULL, NULL, 'NaN', 'NaN', 'NaN', NULL),
    (NULL, NULL, 'Infinity', '-Infinity', 'Infinity', NULL), (NULL, NULL, NULL, '-0', '-0', NULL),
    (NULL, NULL, 0.50000000000000000001, 0.9999999999999999, 4.9999995, NULL);
CREATE TABLE fb_base AS SELECT * FROM fb WHERE age BETWEEN 17 AND 90 AND score BETWEEN 0.2 AND 0.8;
CREATE TABLE fb_lo AS SELECT * FROM fb_base;
INSERT INTO fb_lo VALUES (17, -1000, 0.5, 0, -5, 0);
CREATE TABLE fb_hi AS SELECT * FROM fb_base;
INSERT INTO fb_hi VALUES (90, 1000, 99.5, 1, 5, 0);
CREATE TABLE fb_out AS SELECT * FROM fb_base;
INSERT INTO fb_out VALUES (-2147483648, -9223372036854775808, -1e300, -1e308, -3e38, 0);
CREATE TABLE fb_nan AS SELECT * FROM fb_base;
INSERT INTO fb_nan VALUES (NULL, NULL, 'NaN', 'NaN', 'NaN', NULL);
CREATE TABLE fb_tiny AS SELECT * FROM fb_base;
INSERT INTO fb_tiny VALUES (NULL, NULL, 1e-300, 4.9e-324, 1e-45, NULL);
"""

# Metabase's binning of each column (apply-binning in metabase.driver.sql.query-processor, A and W
# doubles from the fingerprint, printed as Clojure prints them), with the bounds the direct query
# is restricted to for comparison.
_SHAPES = [
    # Auto bin of an integer column: numeric arithmetic (decimal literals), bins 10.0 … 90.0
    ('((floor((("public"."{t}"."age" - 10.0) / 10.0)) * 10.0) + 10.0)', "age BETWEEN 17 AND 90"),
    # the same with integer literals: integer division (truncating), floor of a double
    ('((floor((("public"."{t}"."age" - 15) / 4)) * 4) + 15)', "age BETWEEN 17 AND 90"),
    # A not aligned with lo, W not dividing the range, a negative A
    ('((floor((("public"."{t}"."big" - -7.5) / 150.0)) * 150.0) + -7.5)', "big BETWEEN -1000 AND 1000"),
    # numeric column, A = 0 left out as Metabase leaves it
    ('(floor(("public"."{t}"."amount" / 2.5)) * 2.5)', "amount BETWEEN 0.5 AND 99.5"),
    ('((floor((("public"."{t}"."amount" - 0.3) / 7.0)) * 7.0) + 0.3)', "amount BETWEEN 0.5 AND 99.5"),
    # double precision: binary rounding at the edges (0.1 is not a double), W < 1
    ('((floor((("public"."{t}"."score" - 0.1) / 0.05)) * 0.05) + 0.1)', "score BETWEEN 0 AND 1"),
    ('(floor(("public"."{t}"."score" / 0.1)) * 0.1)', "score BETWEEN 0 AND 1"),
    ('((floor((("public"."{t}"."score" - 0.0) / 1.0E-1)) * 1.0E-1) + 0.0)', "score BETWEEN 0 AND 1"),
    # W > 1: a subnormal difference divided by it would underflow in PostgreSQL (fb_tiny)
    ('(floor(("public"."{t}"."score" / 2.5)) * 2.5)', "score BETWEEN 0 AND 1"),
    # real: the float4 value read as a double
    ('((floor((("public"."{t}"."ratio" - -5.0) / 0.75)) * 0.75) + -5.0)', "ratio BETWEEN -5 AND 5"),
    # the simpler forms
    ('floor("public"."{t}"."ratio")', "ratio BETWEEN -5 AND 5"),
    ('floor(("public"."{t}"."amount" / 5))', "amount BETWEEN 0.5 AND 99.5"),
]


@pytest.fixture(scope="module")
def fbproxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(_TABLE_SQL)
        conn.execute(f"GRANT SELECT ON {', '.join(_TABLES)} TO {SERVICE_ROLE}")
    with running_proxy(test_db, tmp_path_factory, POLICY) as running:
        yield running


def _statement(key: str, table: str = "fb", where: str = "") -> str:
    """Metabase's breakout with COUNT, the key also as text (its exact printed form)."""
    key = key.format(t=table)
    return (f'SELECT {key} AS "k", CAST({key} AS text) AS "k_text", count(*) AS "count" FROM "public"."{table}" '
            f"{where}GROUP BY {key} ORDER BY {key} ASC")


def _run(conn: psycopg.Connection, sql: str) -> tuple[list[tuple[str, int]], list[tuple]]:
    cursor = conn.execute(sql)
    assert cursor.description is not None
    return [(c.name, c.type_code) for c in cursor.description], cursor.fetchall()


@pytest.mark.parametrize("key, within", _SHAPES)
def test_binning_releases_every_bin_of_the_bounds_as_postgresql_prints_it(fbproxy, admin, key, within):
    with fbproxy.connect() as conn:
        shape, rows = _run(conn, _statement(key))
    direct_shape, direct = _run(admin, _statement(key, where=f"WHERE {within} "))
    assert shape == direct_shape  # names and types
    released = {text: count for _, text, count in rows}
    assert len(released) == len(rows)  # one row per bin
    values = [value for value, _, _ in rows]
    assert values == sorted(values)  # ascending
    exact = {text: count for _, text, count in direct}
    assert set(exact) <= set(released)  # the direct query's bins, printed alike, are released
    for text, count in released.items():
        assert abs(count - exact.get(text, 0)) <= 1, text  # noise of scale 1e-5
    # From the bin of lo to the bin of hi, and no more: the first and last bins hold lo and hi.
    low, high = within.split(" BETWEEN ")[1].split(" AND ")
    column = within.split(" ")[0]
    kind = _TYPES[column]
    bounds = admin.execute(f"SELECT CAST({key.format(t='b')} AS text) FROM (VALUES (CAST({low} AS {kind})), "
                           f"(CAST({high} AS {kind}))) AS b({column})".replace('"public".', "")).fetchall()
    assert [rows[0][1], rows[-1][1]] == [text for (text,) in bounds]


def test_metabase_source_wrapper_selecting_the_binned_column_is_answered(fbproxy, admin):
    # Metabase: the breakout's binning computed in the "source" subquery, grouped above it
    key = '((floor((("public"."fb"."age" - 10.0) / 10.0)) * 10.0) + 10.0)'
    sql = (f'SELECT "source"."age" AS "age", count(*) AS "count" FROM (SELECT {key} AS "age" FROM "public"."fb") '
           'AS "source" GROUP BY "source"."age" ORDER BY "source"."age" ASC')
    with fbproxy.connect() as conn:
        shape, rows = _run(conn, sql)
    direct_shape, _ = _run(admin, sql)
    assert shape == direct_shape
    assert [str(r[0]) for r in rows] == [f"{10 * i}.0" for i in range(1, 10)]


def test_metabase_binning_over_a_source_wrapper_of_plain_columns_is_answered(fbproxy, admin):
    # Metabase ≥ 0.50: the binning written over "source"."score", a plain column of the wrapper
    sql = ('SELECT (floor(("source"."score" / 0.25)) * 0.25) AS "score", count(*) AS "count" FROM '
           '(SELECT "public"."fb"."score" AS "score", "public"."fb"."age" AS "age" FROM "public"."fb") AS "source" '
           'GROUP BY (floor(("source"."score" / 0.25)) * 0.25) ORDER BY (floor(("source"."score" / 0.25)) * 0.25) ASC')
    with fbproxy.connect() as conn:
        shape, rows = _run(conn, sql)
    direct_shape, _ = _run(admin, sql)
    assert shape == direct_shape
    assert [r[0] for r in rows] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_binning_beside_a_category_and_an_average_gives_their_cross_product(fbproxy):
    key = '(floor(("public"."fb"."score" / 0.5)) * 0.5)'
    with fbproxy.connect() as conn:
        _, rows = _run(conn, f'SELECT {key} AS "s", avg("public"."fb"."income") AS "avg" FROM "public"."fb" '
                             f"GROUP BY {key} ORDER BY {key}")
    assert [r[0] for r in rows] == [0.0, 0.5, 1.0] and all(r[1] is not None for r in rows)


def test_the_epsilon_is_charged_once_for_all_bins(fbproxy):
    with fbproxy.connect() as conn:
        conn.execute("SET dpproxy.epsilon = 0.25")
        before = spent_epsilon(conn)
        _run(conn, _statement(_SHAPES[0][0]))
        assert spent_epsilon(conn) == pytest.approx(before + 0.25)


@pytest.mark.parametrize("neighbour", ["fb_lo", "fb_hi", "fb_out", "fb_nan", "fb_tiny"])
@pytest.mark.parametrize("key", [key for key, _ in _SHAPES])
def test_one_adversarial_row_changes_no_cell_and_raises_nothing(fbproxy, key, neighbour):
    with fbproxy.connect() as conn:
        _, base = _run(conn, _statement(key, "fb_base"))
        _, plus = _run(conn, _statement(key, neighbour))
    assert [r[:2] for r in plus] == [r[:2] for r in base]


def test_a_difference_that_would_underflow_is_binned_not_raised(fbproxy, admin):
    # PostgreSQL raises "value out of range: underflow" for 4.9e-324 / 10: the row's existence
    # must not show. dpproxy puts the row in its bin (0) without dividing.
    sql = _statement('(floor(("public"."{t}"."score" / 10)) * 10)', "fb_tiny")
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        admin.execute(sql)
    with fbproxy.connect() as conn:
        _, rows = _run(conn, sql)
    (inside,) = admin.execute("SELECT count(*) FROM fb_tiny WHERE score BETWEEN 0 AND 1").fetchone()
    assert [(r[1], round(r[2])) for r in rows] == [("0", inside)]


def _refused_uncharged(proxy: RunningProxy, key: str) -> psycopg.errors.Diagnostic:
    """The error of a COUNT grouped by ``key`` on fb, after checking that it charged nothing."""
    with proxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as info:
            conn.execute(f'SELECT {key} AS "k", count(*) FROM "public"."fb" GROUP BY {key}')
        assert spent_epsilon(conn) == before
    return info.value.diag


@pytest.mark.parametrize("key, advice", [
    ('((floor((("public"."fb"."age" - 10.0) / 0)) * 0) + 10.0)', "positive bin width"),
    ('((floor((("public"."fb"."age" - 10.0) / -5.0)) * -5.0) + 10.0)', "positive bin width"),
    ('((floor((("public"."fb"."age" - "public"."fb"."big") / 10.0)) * 10.0) + "public"."fb"."big")', "number literals"),
    ('(floor(("public"."fb"."age" / "public"."fb"."big")) * "public"."fb"."big")', "number literals"),
    ('(floor(("public"."fb"."score" / 1e400)) * 1e400)', "number literals"),
    ('(floor(("public"."fb"."income" / 10.0)) * 10.0)', "group_by: true"),
    ('((floor((("public"."fb"."score" - -1e300) / 1e-10)) * 1e-10) + -1e300)', "overflows"),
    ('(floor(("public"."fb"."score" / 1e-300)) * 1e-300)', "exceed 2^53"),
])
def test_binning_that_is_no_public_histogram_is_refused_before_the_charge(fbproxy, key, advice):
    diag = _refused_uncharged(fbproxy, key)
    assert diag.sqlstate == "DP001" and "rule: no-group-by" in (diag.message_primary or "")
    assert advice in (diag.message_primary or "") + (diag.message_hint or "")


def test_more_bins_than_max_cells_are_refused_with_a_wider_width(fbproxy):
    # 201 bins over [-1000, 1000], max_cells 60
    diag = _refused_uncharged(fbproxy, '(floor(("public"."fb"."big" / 10.0)) * 10.0)')
    assert diag.sqlstate == "DP001" and "rule: max-cells" in (diag.message_primary or "")
    assert "201 cells" in (diag.message_primary or "") and "wider bin width W: at least 34.5" in (diag.message_hint or "")


def test_the_numeric_upper_end_allows_postgresqls_rounding_of_a_quotient_below_an_integer(admin):
    # PostgreSQL rounds a numeric quotient to a scale of about 16 significant digits: a value whose
    # exact quotient is 2e8 - 6.7e-14 (x = 3e21 - 1, W = 1.5e13) is binned at 2e8, not at 2e8 - 1.
    x, w = 3 * 10**21 - 1, 15 * 10**12
    (index,) = admin.execute(f"SELECT floor(CAST({x} AS numeric) / {w}.0)").fetchone()
    assert index == 2 * 10**8 and math.floor(Fraction(x, w)) == 2 * 10**8 - 1
    width = Number(f"{w}.0", Fraction(w), False)
    assert numeric_indices(Fraction(x - 4), Fraction(x), None, width) == (2 * 10**8 - 1, 2 * 10**8)


def test_the_bins_alone_are_a_list_of_values_read_from_the_policy_at_no_cost(fbproxy, admin):
    # a filter's list of values: the declared bins, the table never read, ε 0
    key = '(floor(("public"."fb"."score" / 0.5)) * 0.5)'
    sql = f'SELECT DISTINCT {key} AS "s" FROM "public"."fb" ORDER BY 1'
    with fbproxy.connect() as conn:
        before = spent_epsilon(conn)
        shape, rows = _run(conn, sql)
        assert spent_epsilon(conn) == before
    direct_shape, _ = _run(admin, sql)
    assert shape == direct_shape and [r[0] for r in rows] == [0.0, 0.5, 1.0]


def test_a_bins_index_beside_its_value_is_a_grouping_error_as_in_postgresql(fbproxy, admin):
    # grouped by the bin's value, the index alone is not a grouping expression (42803) ...
    sql = ('SELECT floor(("public"."fb"."score" / 0.5)) AS "i", count(*) FROM "public"."fb" '
           'GROUP BY (floor(("public"."fb"."score" / 0.5)) * 0.5)')
    with pytest.raises(psycopg.errors.GroupingError):
        admin.execute(sql)
    with fbproxy.connect() as conn:
        with pytest.raises(psycopg.errors.GroupingError):
            conn.execute(sql)
    # ... while grouped by the index, its value is an expression of it
    sql = ('SELECT (floor(("public"."fb"."score" / 0.5)) * 0.5) AS "v", count(*) FROM "public"."fb" '
           'GROUP BY floor(("public"."fb"."score" / 0.5)) ORDER BY 1')
    with fbproxy.connect() as conn:
        shape, rows = _run(conn, sql)
    assert shape == _run(admin, sql)[0] and [r[0] for r in rows] == [0.0, 0.5, 1.0]
