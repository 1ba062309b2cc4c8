"""A DP statement reads a text value only up to the table's max_text_bytes, and its conditions' reads
of text are limited in work (rewriter/text_bounds.py).

One row holding a long value someone chose (3 MB, or 1 kB of one repeated character) made a DP
statement measurably slower, the more so the more terms read it: an existence oracle from one
statement on a table without ``answer_quantum_ms`` (benchmarks/row_cost.py). A longer value now
reads as NULL in every construct, and the conditions of a statement may weigh at most
MAX_TEXT_WORK; past it the statement is refused before the charge, the same way on every
neighbouring table. Real dpproxy, real PostgreSQL; decisions and answers are pinned, never timings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest

from policies.loader import PolicyError, parse_policy
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter.like_patterns import MAX_PART_AFTER_PERCENT
from rewriter.text_bounds import CASE_FOLD_WORK, COMPARISON_WORK, LIKE_WORK, MAX_TEXT_WORK, column_sql, read_in_place, value_bytes
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours, same_on_neighbours

BOUND = 256  # the default max_text_bytes
_DDL = "(id int PRIMARY KEY, t text, cat text, v varchar(10), x int)"
_BASE_ROWS = ("SELECT g, 'row ' || g, (ARRAY['a', 'b', 'c'])[1 + g % 3], 'v' || g % 5, g % 100 "
              "FROM generate_series(1, 300) g")
_RANDOM_3MB = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 94000) g)"
# One row each: the long value a timing attack needs, values at and past the bound, and NULL.
_NEIGHBOURS = {
    "tb_long": f"(0, {_RANDOM_3MB}, {_RANDOM_3MB}, 'v', 1)",
    "tb_periodic": "(0, repeat('a', 1000), repeat('a', 1000), 'v', 1)",
    "tb_at": f"(0, repeat('a', {BOUND}), 'a', repeat('z', 10), 1)",
    "tb_over": f"(0, repeat('a', {BOUND + 1}), repeat('b', {BOUND + 1}), 'v', 1)",
    "tb_null": "(0, NULL, NULL, NULL, NULL)",
}
_NAMES = ("tb_0", *_NEIGHBOURS)
_TABLE = """
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      x: {{bounds: [0, 100]}}
      cat: {{categories: [a, b, c], group_by: true}}
"""
_EXACT = "tb_exact"  # ε so large that a count comes back exact
_QUANTUM = "tb_q"
_POLICY = (ATTACK_POLICY_HEAD + "  public.tb_0: &C" + _TABLE + "".join(f"  public.{name}: *C\n" for name in _NEIGHBOURS)
           + f"  public.{_QUANTUM}:" + _TABLE + "    answer_quantum_ms: 20\n"
           + f"  public.{_EXACT}:" + _TABLE.replace("epsilon: 1.0", "epsilon: 1000.0").replace("true}", "true, other: other}")
           + "    partitioning: ctid_hash\n")
# tb_exact's text values by how many rows hold them: 3 short, 2 at the bound, 4 past it, 1 of 3 MB, 5 NULL.
_EXACT_ROWS = (f"SELECT g, CASE WHEN g <= 3 THEN 'short' WHEN g <= 5 THEN repeat('a', {BOUND}) "
               f"WHEN g <= 9 THEN repeat('a', {BOUND + 1}) WHEN g = 10 THEN {_RANDOM_3MB} END, "
               f"CASE WHEN g <= 2 THEN 'a' WHEN g <= 5 THEN repeat('a', {BOUND + 1}) END, 'v', g "
               "FROM generate_series(1, 15) g")


@pytest.fixture(scope="module")
def bounds_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    create_neighbours(test_db.admin_dsn, "tb_0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    create_neighbours(test_db.admin_dsn, _QUANTUM, {}, _DDL, _BASE_ROWS)
    create_neighbours(test_db.admin_dsn, _EXACT, {}, _DDL, _EXACT_ROWS)
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _count(conn: psycopg.Connection, sql: str) -> int:
    row = conn.execute(sql.replace("{t}", _EXACT)).fetchone()
    assert row is not None
    return round(float(row[0]))


@pytest.mark.parametrize("sql, expected", [
    ("SELECT count(*) FROM {t} WHERE t IS NULL", 5 + 4 + 1),  # NULL, past the bound, 3 MB
    ("SELECT count(t) FROM {t}", 3 + 2),
    ("SELECT count(*) FROM {t} WHERE t LIKE 'a%'", 2),
    ("SELECT count(*) FROM {t} WHERE t > ''", 3 + 2),
    ("SELECT count(*) FROM {t} WHERE lower(t) LIKE '%a'", 2),
    ("SELECT count(*) FROM {t} WHERE t ILIKE 'A%'", 2),
    ("SELECT count(*) FROM {t} WHERE t NOT IN ('short')", 2),
    ("SELECT count(*) FILTER (WHERE t = '" + "a" * (BOUND + 1) + "') FROM {t}", 0),
    ("SELECT count(*) FILTER (WHERE t = '" + "a" * BOUND + "') FROM {t}", 2),
    ("SELECT count(DISTINCT t) FROM {t}", 2),
    ("SELECT count(*) FROM {t} WHERE cat IS NULL", 3 + 10),
])
def test_a_text_value_longer_than_the_bound_reads_as_null(bounds_proxy: RunningProxy, sql: str, expected: int) -> None:
    with bounds_proxy.connect() as conn:
        assert _count(conn, sql) == expected


def test_a_categorical_key_puts_a_value_past_the_bound_in_other_with_null(bounds_proxy: RunningProxy) -> None:
    """A value read as NULL is no declared category: ``other`` collects it, as it collects NULL (the three
    values of 257 bytes and the ten NULL or longer ones). The key groups the bounded value, never the 3 MB one."""
    with bounds_proxy.connect() as conn:
        rows = conn.execute(f"SELECT cat, count(*) FROM {_EXACT} GROUP BY cat").fetchall()
    assert {row[0]: round(float(row[1])) for row in rows} == {"a": 2, "b": 0, "c": 0, "other": 13}


def test_sample_and_aggregate_reads_the_table_through_the_bound_with_ctid_partitions(bounds_proxy: RunningProxy) -> None:
    """``ctid_hash`` reads the row's ctid beside the bounded text columns, in the partitions' rows."""
    with bounds_proxy.connect() as conn:
        row = conn.execute(f"SELECT max(x) FROM {_EXACT} WHERE t IS NOT NULL").fetchone()
    assert row is not None and row[0] is not None


@pytest.mark.parametrize("sql", [
    "SELECT min(x) FILTER (WHERE t = 'row 1' OR cat = 'a'), max(x) FROM {t}",
    "SELECT max(x) FILTER (WHERE cat IN ('a', 'b')) FROM {t} WHERE t <> 'row 2'",
])
def test_sample_and_aggregate_filters_compare_raw_values_through_the_partitions_rows(bounds_proxy: RunningProxy,
                                                                                    sql: str) -> None:
    """On a table with a quantum a FILTER's text equality is compared raw beside its bounded twin
    (rewriter/raw_equality.py); above sample and aggregate's partition rows the raw value is their output
    (rewriter.text_bounds.bounded_outputs). It was not: the backend failed the statement (42703,
    column "raw 2" does not exist)."""
    with bounds_proxy.connect() as conn:
        row = conn.execute(sql.replace("{t}", _QUANTUM)).fetchone()
    assert row is not None and all(value is not None for value in row)


def _column(name: str, type_oid: int, modifier: int = -1, attnum: int = 1) -> ColumnInfo:
    return ColumnInfo(name, type_oid, modifier, attnum, None)


def test_the_backend_sql_reads_a_long_value_by_its_stored_size_only() -> None:
    """``octet_length`` reads the header (no detoasting); a varchar(n) of 4·n bytes within the bound
    is read through the in-line check alone (it may be stored apart, docs/threat-model.md), one too
    short for the toaster (4 + 4·n ≤ 24 bytes) as it is, a wider one and a char(n) bounded like
    text, other types untouched."""
    columns = {column.name: column for column in (
        _column("t", 25, attnum=1), _column("short", 1043, 10 + 4, 2), _column("wide", 1043, 100 + 4, 3),
        _column("c", 1042, 80 + 4, 4), _column("x", 23, attnum=5), _column("tiny", 1043, 5 + 4, 6))}
    policy = TablePolicy(epsilon=1.0)
    table = Relation(1, "public", "tb", policy, columns, "ctid")
    assert [read_in_place(column_sql(column), table) for column in columns.values()] == [
        'CASE WHEN (pg_catalog.int4smaller(pg_catalog.pg_column_size("t"), CAST(257 AS integer)) OPERATOR(pg_catalog.>) pg_catalog.octet_length("t")) THEN "t" END',
        'CASE WHEN (pg_catalog.pg_column_size("short") OPERATOR(pg_catalog.>) pg_catalog.octet_length("short")) THEN "short" END',
        'CASE WHEN (pg_catalog.int4smaller(pg_catalog.pg_column_size("wide"), CAST(257 AS integer)) OPERATOR(pg_catalog.>) pg_catalog.octet_length("wide")) THEN "wide" END',
        'CASE WHEN (pg_catalog.int4smaller(pg_catalog.pg_column_size("c"), CAST(257 AS integer)) OPERATOR(pg_catalog.>) pg_catalog.octet_length("c")) THEN "c" END',
        '"x"', '"tiny"']
    assert [value_bytes(columns[name], policy) for name in ("t", "short", "wide", "c", "x", "tiny")] == [256, 40, 256, 256, None, 20]


def test_the_bound_and_the_in_row_test_are_one_comparison_of_four_calls_a_row() -> None:
    """A bounded text is read through one comparison, ``int4smaller(pg_column_size(t), bound + 1) >
    octet_length(t)``: four function calls for every row the statement reads it on, where the bound
    and the in-row test joined by AND took five (``octet_length`` twice), ~28 % of the check's work
    (benchmarks/profile.md, "The backend's share of a DP statement on 48,842 rows")."""
    column = _column("t", 25)
    sql = read_in_place(column_sql(column), Relation(1, "public", "tb", TablePolicy(epsilon=1.0, max_text_bytes=300), {"t": column}))
    calls = re.findall(r"pg_catalog\.(\w+)\(", sql)
    assert sorted(calls) == ["int4smaller", "octet_length", "pg_column_size"], sql
    assert " AND " not in sql and "CAST(301 AS integer)" in sql


def _likes(count: int) -> str:
    return " OR ".join(f"t LIKE '%{'a' * (MAX_PART_AFTER_PERCENT - 1)}{i % 10}'" for i in range(count))


_ONE_LIKE = BOUND * LIKE_WORK * MAX_PART_AFTER_PERCENT  # 327,680: one LIKE of the longest part allowed
_ONE_LOWER = BOUND * (COMPARISON_WORK + CASE_FOLD_WORK)  # 13,056: lower(t) = '…'
_LOWERS = MAX_TEXT_WORK // _ONE_LOWER  # 45


def _lowers(count: int) -> str:
    return " OR ".join(f"lower(t) = 'x{i}'" for i in range(count))


# (statement, its work): each past the limit; the same with one term fewer is answered.
_OVER = [
    ("SELECT count(*) FROM {t} WHERE " + _likes(2), 2 * _ONE_LIKE, "SELECT count(*) FROM {t} WHERE " + _likes(1)),
    ("SELECT count(*) FILTER (WHERE " + _lowers(_LOWERS + 1) + ") FROM {t}", (_LOWERS + 1) * _ONE_LOWER,
     "SELECT count(*) FILTER (WHERE " + _lowers(_LOWERS) + ") FROM {t}"),
    ("SELECT count(*) FILTER (WHERE " + _likes(1) + ") FROM {t} WHERE " + _likes(1), 2 * _ONE_LIKE,
     "SELECT count(*) FILTER (WHERE " + _likes(1) + ") FROM {t} WHERE x > 1"),
    # Superset's series limit: two plans, each within the limit, whose conditions a row reaches both
    ("SELECT cat, count(*) AS count FROM {t} JOIN (SELECT cat AS cat__, count(*) AS m FROM {t} WHERE " + _likes(1)
     + " GROUP BY cat ORDER BY count(*) DESC LIMIT 1) AS series_limit ON cat = cat__ WHERE " + _likes(1) + " GROUP BY cat",
     None, "SELECT cat, count(*) AS count FROM {t} JOIN (SELECT cat AS cat__, count(*) AS m FROM {t} WHERE " + _likes(1)
     + " GROUP BY cat ORDER BY count(*) DESC LIMIT 1) AS series_limit ON cat = cat__ WHERE x > 1 GROUP BY cat"),
]


@pytest.mark.parametrize("over, work, within", _OVER)
def test_conditions_past_the_work_limit_are_refused_uncharged_on_every_neighbour(
        bounds_proxy: RunningProxy, over: str, work: int | None, within: str) -> None:
    with bounds_proxy.connect() as conn:
        outcome = same_on_neighbours(conn, over, _NAMES, spent_epsilon)
        assert outcome[:2] == ("error", "DP001"), outcome
        message, hint = str(outcome[2]), str(outcome[3])
        if work is not None:
            assert f"work of {work:,} units in all (at most {MAX_TEXT_WORK:,} in one statement" in message
        assert "rule: safe-predicate" in message
        assert "shorter LIKE parts" in hint and "answer_quantum_ms" in hint
        answered = same_on_neighbours(conn, within, _NAMES, spent_epsilon)
        assert answered[0] == "answer", answered


def test_a_pattern_parameter_is_weighed_by_its_own_part_when_bound(bounds_proxy: RunningProxy) -> None:
    """Planned at one character after %, a bound pattern adds what its longest part weighs more, and
    past the limit the statement is refused at Bind, before the charge, on every neighbour."""
    sql = "SELECT count(*) FROM {t} WHERE t LIKE %s OR t ILIKE %s"
    part = "%" + "a" * (MAX_PART_AFTER_PERCENT - 1) + "b"
    with psycopg.connect(bounds_proxy.dsn(), autocommit=True) as conn:  # the extended protocol
        short = same_on_neighbours(conn, sql, _NAMES, spent_epsilon, params=("a%", "%b%"))
        assert short[0] == "answer", short
        one_long = same_on_neighbours(conn, sql, _NAMES, spent_epsilon, params=(part, "%b%"))
        assert one_long[0] == "answer", one_long
        both = same_on_neighbours(conn, sql, _NAMES, spent_epsilon, params=(part, part))
        work = 2 * _ONE_LIKE + BOUND * CASE_FOLD_WORK
        assert both[:2] == ("error", "DP001") and f"work of {work:,} units" in str(both[2]), both
        assert "rule: safe-predicate" in str(both[2]) and "answer_quantum_ms" in str(both[3])


def test_ordinary_conditions_on_text_are_answered_the_same_on_every_neighbour(bounds_proxy: RunningProxy) -> None:
    with bounds_proxy.connect() as conn:
        for sql in ("SELECT count(*) FROM {t} WHERE t LIKE '%row 1%' OR t IN ('a', 'b', 'c')",
                    "SELECT cat, count(*) FROM {t} WHERE t IS NOT NULL GROUP BY cat",
                    "SELECT count(DISTINCT t), count(t) FROM {t} WHERE lower(t) LIKE 'row%'",
                    "SELECT mode() WITHIN GROUP (ORDER BY cat) FROM {t}"):
            assert same_on_neighbours(conn, sql, _NAMES, spent_epsilon)[0] == "answer", sql


def test_a_table_with_an_answer_quantum_is_not_work_limited_but_still_bounded(bounds_proxy: RunningProxy) -> None:
    """The quantum hides what a row adds below it, as for the terms; the bound still decides answers."""
    with bounds_proxy.connect() as conn:
        before = spent_epsilon(conn)
        conn.execute(_OVER[0][0].replace("{t}", _QUANTUM)).fetchall()
        assert spent_epsilon(conn) > before


def _policy(table: str) -> str:
    return ("backend: {dsn: 'postgresql://x@localhost/db'}\nusers:\n  a: {password: a, budget: {epsilon: 1}}\n"
            "tables:\n  public.t:\n    epsilon: 1.0\n" + table)


@pytest.mark.parametrize("table, error", [
    ("    max_text_bytes: 0\n", "max_text_bytes"),
    ("    max_text_bytes: 1073741824\n", "max_text_bytes"),
    ("    max_text_bytes: 4\n    columns:\n      c: {categories: [abcde]}\n",
     "columns.c: a category of 5 bytes is longer than the table's max_text_bytes 4"),
    ("    max_text_bytes: 3\n    columns:\n      c: {categories: [äbc, ab]}\n",  # bytes, not characters
     "columns.c: a category of 4 bytes is longer than the table's max_text_bytes 3"),
])
def test_the_policy_refuses_a_text_bound_that_is_out_of_range_or_shorter_than_a_category(table: str, error: str) -> None:
    with pytest.raises(PolicyError, match=error):
        parse_policy(_policy(table))


def test_the_policy_takes_a_text_bound_that_fits_the_categories() -> None:
    policy = parse_policy(_policy("    max_text_bytes: 4\n    columns:\n      c: {categories: [äbc, ab]}\n"))
    assert policy.tables["public.t"].max_text_bytes == 4
    assert ColumnPolicy(categories=("a",)) is not None and TablePolicy(epsilon=1.0).max_text_bytes == BOUND
