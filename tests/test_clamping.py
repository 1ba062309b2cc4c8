"""Clamping in the backend SQL: values forced into [lo, hi], NULL left NULL.

A NULL row must change no exact part: SUM, AVG, MIN and MAX skip NULL, and ``avg: sum_count``
pairs its clamped sum with ``count(column)``, which does not count NULL. Clamping NULL to lo
(as ``LEAST(GREATEST(x, lo), hi)`` does) let one NULL row move the sum_count centred sum by
|lo| instead of at most (hi − lo)/2: with bounds [2000, 2010], by 2000 against a noise scale
of 10 at ε = 1.
"""

from __future__ import annotations

import math

import numpy as np
import psycopg
import pytest

from mechanisms.sum_count import release_mean
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql, clamped, collected, partition_values, per_partition, split_row
from rewriter.text_bounds import read_through

_INT4, _FLOAT8 = 23, 701


def _relation(table: str, type_oid: int, bounds: tuple[float, float], **policy: object) -> Relation:
    column_policy = ColumnPolicy(bounds=bounds)
    table_policy = TablePolicy(epsilon=1.0, delta=1e-6, partitions=4, columns={"y": column_policy}, **policy)
    return Relation(0, "public", table, table_policy, {"y": ColumnInfo("y", type_oid, -1, 1, column_policy)}, "ctid")


@pytest.fixture
def neighbours(admin: psycopg.Connection):
    """nb_clamp: ten rows of 2005; nb_clamp_null: the same plus one NULL row."""
    admin.execute("DROP TABLE IF EXISTS nb_clamp, nb_clamp_null")
    admin.execute("CREATE TABLE nb_clamp (y integer)")
    admin.execute("INSERT INTO nb_clamp SELECT 2005 FROM generate_series(1, 10)")
    admin.execute("CREATE TABLE nb_clamp_null AS SELECT * FROM nb_clamp")
    admin.execute("INSERT INTO nb_clamp_null VALUES (NULL)")
    yield admin
    admin.execute("DROP TABLE nb_clamp, nb_clamp_null")


@pytest.mark.parametrize("sql,policy", [
    ("SELECT SUM(y) FROM {table}", {}),
    ("SELECT AVG(y) FROM {table}", {"avg": "sum_count"}),
    ("SELECT AVG(y), MIN(y), MAX(y) FROM {table}", {"avg": "sample_aggregate"}),
    ("SELECT AVG(y) FROM {table}", {}),  # the default: sum_count
])
def test_a_null_row_changes_no_exact_part(neighbours, sql, policy):
    parts = {}
    for table in ("nb_clamp", "nb_clamp_null"):
        plan = plan_aggregate_query(sql.format(table=table), _relation(table, _INT4, (2000, 2010), **policy))
        row = split_row(plan, neighbours.execute(backend_sql(plan, seed=11)).fetchone())
        parts[table] = [tuple(_as_released(v) for v in column) for column in row]
    assert parts["nb_clamp"] == parts["nb_clamp_null"]


def _as_released(part: object) -> object:
    """Partition values as the mechanism sees them: m = 4 values, the missing ones as the midpoint 2005."""
    if not isinstance(part, np.ndarray):
        return part
    return sorted(part.tolist() + [2005.0] * (4 - len(part)))


def test_sum_count_avg_of_neighbours_differing_by_a_null_row_is_the_same_release(neighbours):
    plan = plan_aggregate_query("SELECT AVG(y) FROM nb_clamp_null", _relation("nb_clamp_null", _INT4, (2000, 2010), avg="sum_count"))
    ((total, count),) = split_row(plan, neighbours.execute(backend_sql(plan, seed=0)).fetchone())
    assert (total, count) == (20050, 10)  # the centred sum is 0, as without the NULL row
    releases = [release_mean(float(total), int(count), 2000, 2010, 1.0).value for _ in range(400)]
    # P(release < 2007) = 0.921 (Lap(10) over max(10 + DiscreteLap(2), 1)): the binomial frequency
    # fails by chance with p ≈ 3.5e-10. A NULL clamped to lo would move the centred sum by 2000 and
    # put every release at 2010 (frequency 0).
    assert 0.8 < sum(r < 2007 for r in releases) / len(releases) < 0.99


def test_clamping_matches_least_greatest_except_that_null_stays_null(admin):
    column = _relation("t", _FLOAT8, (-2.5, 2.5)).columns["y"]
    assert column.policy is not None
    values = ["NULL", "'NaN'", "'Infinity'", "'-Infinity'", "-3", "-2.5", "0", "-0.0", "1.25", "2.5", "7"]
    rows = admin.execute(
        f"SELECT y, {read_through(clamped(column))}, LEAST(GREATEST(y, -2.5), 2.5) FROM (VALUES "
        + ", ".join(f"({v}::float8)" for v in values) + ") AS t(y)"
    ).fetchall()
    for y, ours, least_greatest in rows:
        if y is None:
            assert ours is None and least_greatest == -2.5  # the old clamp's NULL → lo
        else:
            assert ours == least_greatest and -2.5 <= ours <= 2.5, y  # NaN → hi, ±Infinity → hi/lo


_EVERY_TYPE = [
    ("smallint", 21, (-2, 5), ["-32768", "-3", "-2", "0", "5", "6", "32767"]),
    ("integer", 23, (1, 99), ["-2147483648", "0", "1", "50", "99", "100", "2147483647"]),
    ("bigint", 20, (0, 10**12), ["-9223372036854775808", "-1", "0", "7", "1000000000001", "9223372036854775807"]),
    ("real", 700, (-1.5, 0.25), ["'NaN'", "'-Infinity'", "-2", "-1.5", "0.1", "0.25", "3", "'Infinity'"]),
    ("double precision", 701, (-1.5, 0.25), ["'NaN'", "'-Infinity'", "-2", "-1.5", "0.1", "0.25", "3", "'Infinity'"]),
    ("numeric", 1700, (-1.5, 0.25), ["'NaN'", "-2", "-1.5", "0.1000", "0.25", "3.14159"]),
]


@pytest.mark.parametrize("type_name,type_oid,bounds,values", _EVERY_TYPE)
def test_clamping_of_every_numeric_type_keeps_null_and_lands_in_the_bounds(admin, type_name, type_oid, bounds, values):
    column = _relation("t", type_oid, bounds).columns["y"]
    lo, hi = bounds
    rows = admin.execute(
        f"SELECT y, {read_through(clamped(column))}, pg_catalog.pg_typeof({read_through(clamped(column))})::text FROM (VALUES "
        + ", ".join(f"(CAST({v} AS {type_name}))" for v in ["NULL", *values]) + ") AS t(y)"
    ).fetchall()
    for y, ours, ours_type in rows:
        if y is None:
            assert ours is None
            continue
        expected = hi if y != y else min(max(y, lo), hi)  # NaN (y != y) comes out as hi
        if type_name == "real":  # y is read back from real's shortest text, ours is the exact double
            expected = float(np.float32(expected))
        assert ours == expected, (y, ours)
        # As with the CASE, SUM, AVG, MIN and MAX see the column's type; a real is clamped as a
        # double, to exactly the bounds the noise is scaled to (tests/test_attack_mechanisms.py).
        assert ours_type == ("double precision" if type_name == "real" else type_name)


@pytest.mark.parametrize("type_name,type_oid,bounds,values", _EVERY_TYPE)
def test_partition_values_are_the_aggregates_of_clamped_values_as_double_precision(
    admin, type_name, type_oid, bounds, values
):
    column = _relation("t", type_oid, bounds).columns["y"]
    ours = read_through(", ".join(per_partition(kind, column) for kind in ("avg", "min", "max")))
    exact = ", ".join(f"pg_catalog.{kind}({read_through(clamped(column))})" for kind in ("avg", "min", "max"))
    groups = [(i % 2, v) for i, v in enumerate(values)] + [(2, "NULL"), (2, "NULL"), (0, "NULL")]
    rows = admin.execute(
        f"SELECT g, {ours}, {exact}, pg_catalog.pg_typeof({read_through(per_partition('avg', column))})::text FROM (VALUES "
        + ", ".join(f"({g}, CAST({v} AS {type_name}))" for g, v in groups) + ") AS t(g, y) GROUP BY g ORDER BY g"
    ).fetchall()
    assert [row[0] for row in rows] == [0, 1, 2]
    for g, avg, low, high, exact_avg, exact_low, exact_high, avg_type in rows:
        if g == 2:  # only NULLs: no value, so the partition counts as empty
            assert (avg, low, high) == (None, None, None)
            continue
        assert avg_type == "double precision"
        if type_oid in (700, 701):  # a float column's mean comes in points of its sum grid (exact sums)
            assert column.policy is not None
            avg *= column.policy.sum_grid.step
        assert avg == pytest.approx(float(exact_avg), rel=1e-12) and (low, high) == (float(exact_low), float(exact_high))


@pytest.mark.parametrize("settings", ["", "SET extra_float_digits = 0; SET bytea_output = escape"])
def test_partition_values_come_back_bit_for_bit_whatever_the_session_settings(admin, settings):
    """The partition part carries each value's 8 bytes: a client's SET of extra_float_digits
    (which rounds float text) or bytea_output cannot change what the mechanism reads."""
    values = [38.0, 40.5, 1 / 3, -0.0, 5e-324, 1.7976931348623157e308, float("inf"), float("-inf")]
    literals = ", ".join(f"(CAST('{v!r}' AS double precision))" for v in values) + ", (NULL), (CAST('NaN' AS double precision))"
    with admin.transaction():
        for statement in filter(None, settings.split("; ")):
            admin.execute(statement.replace("SET", "SET LOCAL"))
        (text,) = admin.execute(f"SELECT {collected('p0')} FROM (VALUES {literals}) AS t(p0)").fetchone()
    got = partition_values(text)
    assert len(got) == len(values) + 1  # NULL left out: that partition counts as empty
    assert [v.hex() for v in got[:-1].tolist()] == [v.hex() for v in values] and math.isnan(got[-1])
