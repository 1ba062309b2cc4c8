"""An unconstrained numeric's comparisons with a literal on the raw column too, on a table with a quantum
(rewriter/raw_equality.py).

The stored-form bound (rewriter/text_bounds.py) made ``n = 5`` a comparison of ``CASE WHEN
pg_column_compression(n) IS NULL AND pg_column_size(n) <= 127 AND (pg_column_size(n) % 2 = 1 OR
pg_column_size(n) <= 20) THEN n END``, which no index can hold:
a selective equality on a large indexed table became a sequential scan. On a table with
``answer_quantum_ms`` each ``=``, ``<``, ``<=``, ``>``, ``>=`` (an IN list's values, BETWEEN's two
ends) of such a column with a literal, where false and NULL decide alike, is now
``("n" = 5 AND <n's bound> = 5)``, the bounded conjunct still deciding, so a B-tree index on ``n``
serves it. Pinned: the backend SQL on tables with and without a quantum, the plan of the SQL dpproxy
sends (EXPLAIN on a direct connection), and the exact counts of both forms on tables holding the
adversarial values of tests/test_numeric_bounds.py, NaN and ±Infinity.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours, same_on_neighbours
from tests.plan_nodes import plan_node_types
from tests.raw_reads import projected, raw_reads
from tests.test_numeric_bounds import _AT, _COMPRESSED, _PAST, _RANDOM

_DOMAIN = 16_400  # a domain over numeric: its OID in the unit tests' relation only


def _relation(name: str, quantum_ms: int) -> Relation:
    columns = (ColumnInfo("id", 23, -1, 1, None), ColumnInfo("n", 1700, -1, 2, ColumnPolicy(bounds=(0, 100))),
               ColumnInfo("dn", _DOMAIN, -1, 3, None, base_type_oid=1700, base_type_modifier=-1),
               ColumnInfo("np", 1700, (1000 << 16) + 4, 4, None), ColumnInfo("x", 23, -1, 5, ColumnPolicy(bounds=(0, 100))))
    policy = TablePolicy(epsilon=1.0, answer_quantum_ms=quantum_ms)
    return Relation(1, "public", name, policy, {column.name: column for column in columns})


def _sql(statement: str, quantum_ms: int = 20, table: str = "rn") -> str:
    return backend_sql(plan_aggregate_query(statement.replace("{t}", table), _relation(table, quantum_ms)), 0)


_BOUNDED_N = ('CASE WHEN pg_catalog.pg_column_compression("n") IS NULL AND '
              '(pg_catalog.pg_column_size("n") OPERATOR(pg_catalog.<=) 127) AND (((pg_catalog.pg_column_size("n") OPERATOR(pg_catalog.%) 2) '
              'OPERATOR(pg_catalog.=) 1) OR (pg_catalog.pg_column_size("n") OPERATOR(pg_catalog.<=) 20)) THEN "n" END')


def _bounded(column: str) -> str:
    return _BOUNDED_N.replace('"n"', f'"{column}"')


def _raw(column: str, symbol: str, value: str) -> str:
    """The raw comparison of ``column`` beside its bounded twin."""
    return f'(("{column}" OPERATOR(pg_catalog.{symbol}) {value}) AND ({_bounded(column)} OPERATOR(pg_catalog.{symbol}) {value}))'


@pytest.mark.parametrize("where, expected", [
    ("n = 5", [_raw("n", "=", "5")]),
    ("5 = n", [_raw("n", "=", "5")]),
    ("n IN (5, 6.5, -7)", [_raw("n", "=", value) for value in ("5", "6.5", "(-7)")]),
    ("n < 5", [_raw("n", "<", "5")]),
    ("5 < n", [_raw("n", ">", "5")]),
    ("n >= 1e3 AND n <= 2", [_raw("n", ">=", "1e3"), _raw("n", "<=", "2")]),
    ("n BETWEEN 1 AND 2", [_raw("n", ">=", "1"), _raw("n", "<=", "2")]),
    ("n = 'NaN' OR x > 3", [_raw("n", "=", "'NaN'")]),
    ("dn = 5", [_raw("dn", "=", "5")]),
])
def test_a_comparison_with_a_literal_also_compares_the_raw_column_on_a_table_with_a_quantum(
        where: str, expected: list[str]) -> None:
    sql = _sql(f"SELECT count(*), sum(x) FROM {{t}} WHERE {where}")
    column = "dn" if where.startswith("dn") else "n"
    for term in expected:
        if projected(sql, column):  # read twice or more: the raw value is the projection's output
            term = term.replace(_bounded(column), f'"{column}"').replace(f'(("{column}"', '(("raw 2"' if column == "n" else '(("raw 3"', 1)
        assert term in sql, sql


@pytest.mark.parametrize("where", [
    "NOT (n = 5)", "n NOT IN (5, 6)", "n <> 5", "(n = 5) IS TRUE", "(n > 5) IS FALSE", "NOT (n > 1 OR x > 3)",
    "n = $1", "n = CAST(5 AS numeric)", "n = x", "n > x",
])
def test_a_comparison_where_false_and_null_may_differ_or_with_no_literal_keeps_the_bounded_value(where: str) -> None:
    sql = _sql(f"SELECT count(*) FROM {{t}} WHERE {where}")
    assert raw_reads(sql, "n") == 0, sql
    assert _BOUNDED_N in sql, sql


def test_a_table_without_a_quantum_and_a_declared_precision_keep_their_forms() -> None:
    """Without a quantum the SQL is the bounded form (the raw read of a long value would show in the
    time); numeric(1000, 0), whose values may be stored apart, is read through the same check, and
    compares the raw column only in one hashed conjunct beside a top-level ``=`` (with or without a
    quantum; tests/test_declared_raw_equality.py), never term by term."""
    sql = _sql("SELECT count(*) FROM {t} WHERE n = 5 OR n IN (6, 7) OR n BETWEEN 1 AND 2", quantum_ms=0)
    assert sql == ('SELECT pg_catalog.count(*) FROM (SELECT ' + _BOUNDED_N + ' AS "n" FROM "public"."rn") AS "rn" WHERE '
                   '((("n" OPERATOR(pg_catalog.=) 5) OR (("n" OPERATOR(pg_catalog.=) 6) OR ("n" OPERATOR(pg_catalog.=) 7))) '
                   'OR (("n" OPERATOR(pg_catalog.>=) 1) AND ("n" OPERATOR(pg_catalog.<=) 2)))'), sql
    assert _sql("SELECT count(*) FROM {t} WHERE n = 5", quantum_ms=0) == (
        f'SELECT pg_catalog.count(*) FROM "public"."rn" WHERE ({_BOUNDED_N} OPERATOR(pg_catalog.=) 5)')
    nines = ", ".join(["CAST(5 AS pg_catalog.numeric)"] * 9)
    assert _sql("SELECT count(*) FROM {t} WHERE np = 5") == (
        'SELECT pg_catalog.count(*) FROM "public"."rn" '
        f'WHERE ("np" OPERATOR(pg_catalog.=) ANY (ARRAY[{nines}])) AND ({_bounded("np")} OPERATOR(pg_catalog.=) 5)')
    for quantum_ms in (0, 20):
        assert raw_reads(_sql("SELECT count(*) FROM {t} WHERE np = 5 OR np < 2", quantum_ms=quantum_ms), "np") == 0


# --- On a real PostgreSQL: plans and answers -------------------------------------------------------

_DDL = "(id int, n numeric, dn rn_num, np numeric(1000, 0), x int)"


@pytest.fixture(scope="module")
def admin(test_db: TestDatabase) -> Iterator[psycopg.Connection]:
    """A direct connection, with the domain the tables use and ``rn_indexed``: 20,000 rows of 1,000
    values (20 rows each) and a B-tree index on ``n``."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP DOMAIN IF EXISTS rn_num CASCADE")
        conn.execute("CREATE DOMAIN rn_num AS numeric")
        conn.execute("DROP TABLE IF EXISTS rn_indexed")
        conn.execute(f"CREATE TABLE rn_indexed {_DDL}")
        conn.execute("INSERT INTO rn_indexed SELECT g, (g % 1000) / 10.0, g % 1000, g % 1000, g % 100 "
                     "FROM generate_series(1, 20000) g")
        conn.execute("CREATE INDEX ON rn_indexed (n)")
        conn.execute("ANALYZE rn_indexed")
        yield conn


@pytest.mark.parametrize("where", ["n = 7", "n IN (7, 8.5, 9.9)", "n BETWEEN 7 AND 7.2", "n < 0.3", "n = 7 AND x > 3"])
def test_an_index_on_the_column_serves_the_sql_dpproxy_sends_on_a_table_with_a_quantum(
        admin: psycopg.Connection, where: str) -> None:
    statement = f"SELECT count(*), sum(x) FROM {{t}} WHERE {where}"
    quantum, bounded = _sql(statement, table="rn_indexed"), _sql(statement, quantum_ms=0, table="rn_indexed")
    assert "Seq Scan" not in plan_node_types(admin, quantum), quantum
    assert "Seq Scan" in plan_node_types(admin, bounded), bounded  # no index holds the bounded form
    direct = admin.execute(f"SELECT count(*), sum(x) FROM rn_indexed WHERE {where}").fetchone()
    assert admin.execute(quantum).fetchone() == admin.execute(bounded).fetchone() == direct


# The adversarial values of tests/test_numeric_bounds.py (131,072 random digits out of line, 40,000
# compressible ones compressed in the row, 1,000 nines read, 1,100 digits past the bound), NULL, NaN
# and ±Infinity: the one row each neighbour adds to rn_0, and all of them in rn_all.
_VALUES = {"random": _RANDOM, "compressed": _COMPRESSED, "past": _PAST, "at": _AT, "null": "NULL",
           "nan": "'NaN'::numeric", "inf": "'Infinity'::numeric", "minus_inf": "'-Infinity'::numeric", "five": "5"}
_NEIGHBOURS = {f"rn_{name}": f"(0, {value}, {value}, 1, 1)" for name, value in _VALUES.items() if name != "five"}
_ALL = " UNION ALL ".join(f"SELECT {index}, {value}, {value}, 1, {index} FROM generate_series(1, 2)"
                          for index, value in enumerate(_VALUES.values()))
_BASE_ROWS = "SELECT g, g % 100, g % 100, g % 100, g % 100 FROM generate_series(1, 300) g"
_TABLES = ("rn_0", *_NEIGHBOURS, "rn_all")

_PAST_DIGITS = "".join(str(1 + g % 9) for g in range(1, 1101))
_LITERALS = ("5", "7", "0", "100", "'NaN'", "'Infinity'", "'-Infinity'", "9" * 1000, _PAST_DIGITS, "1234" * 10_000)
# Conditions with the raw form, where false and NULL decide alike: each literal compared both ways.
_POSITIVE = [
    *(f"n {symbol} {value}" for value in _LITERALS for symbol in ("=", "<", ">=")),
    *(f"dn {symbol} {value}" for value in _LITERALS[:7] for symbol in ("=", ">")),
    "n IN (5, 'NaN', 'Infinity', 7)", "n BETWEEN 0 AND 100", "n BETWEEN '-Infinity' AND 'Infinity'",
    "n = 5 OR n IS NULL", "n > 1 AND x > 1", "n = 5 OR NOT (n = 5)", f"n = {_PAST_DIGITS} OR n = 'NaN'",
]
# Where they may differ: the bounded form stays.
_NEGATIVE = [
    "NOT (n = 5)", "n <> 5", "n NOT IN (5, 'NaN')", "(n = 5) IS FALSE", "(n > 1) IS NOT TRUE", "NOT (n > 1 OR x > 12)",
    f"NOT (n = {_PAST_DIGITS})", "NOT (NOT (n >= 'Infinity'))",
]


@pytest.fixture(scope="module")
def neighbours(admin: psycopg.Connection, test_db: TestDatabase) -> list[str]:
    create_neighbours(test_db.admin_dsn, "rn_0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    create_neighbours(test_db.admin_dsn, "rn_all", {}, _DDL, _ALL)
    stored = dict(admin.execute("SELECT 'random', pg_column_size(n) FROM rn_random UNION ALL "
                                "SELECT coalesce(pg_column_compression(n), 'none'), pg_column_size(n) FROM rn_compressed "
                                "WHERE id = 0").fetchall())
    assert stored["random"] > 65_000 and stored["pglz"] < 2_000, stored  # the stored forms the bound is about
    return list(_TABLES)


def _count(admin: psycopg.Connection, sql: str) -> tuple[object, ...]:
    row = admin.execute(sql).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize("condition", [*_POSITIVE, *_NEGATIVE], ids=lambda condition: condition[:60])
def test_the_raw_form_counts_exactly_what_the_bounded_form_counts_on_every_neighbour(
        admin: psycopg.Connection, neighbours: list[str], condition: str) -> None:
    """The exact backend counts (and clamped sums) of the SQL sent with a quantum equal those of the
    bounded SQL sent without one, in WHERE and in a FILTER, on the base table, each neighbour and a
    table holding every adversarial value twice."""
    statement = f"SELECT count(*), sum(x), count(*) FILTER (WHERE {condition}) FROM {{t}} WHERE {condition}"
    for table in neighbours:
        quantum, bounded = _sql(statement, table=table), _sql(statement, quantum_ms=0, table=table)
        assert (raw_reads(quantum, "n") + raw_reads(quantum, "dn") > 0) == (condition in _POSITIVE), quantum[-300:]
        assert _count(admin, quantum) == _count(admin, bounded), (table, condition)


@pytest.mark.parametrize("statement", ["SELECT avg(CAST(n > 1 AS int)) FROM {t}",
                                       "SELECT sum(CASE WHEN n = 'NaN' OR n < 50 THEN x END) FROM {t}"])
def test_a_share_and_a_conditional_sum_count_what_the_bounded_form_counts(
        admin: psycopg.Connection, neighbours: list[str], statement: str) -> None:
    """A share's numerator and a CASE's condition become FILTERs, the share's denominator ``p OR NOT p``
    holding p both ways: the exact values are the bounded form's on every table."""
    for table in neighbours:
        quantum, bounded = _sql(statement, table=table), _sql(statement, quantum_ms=0, table=table)
        assert raw_reads(quantum, "n") > 0, quantum
        assert _count(admin, quantum) == _count(admin, bounded), (table, statement)


def test_the_adversarial_values_are_read_as_the_bound_says(admin: psycopg.Connection, neighbours: list[str]) -> None:
    """The counts above compare something: of rn_all's pairs, 5, the 1,000 nines, NaN and ±Infinity
    are read, the others are NULL to the bound (and the 40,000 digits equal their literal raw)."""
    compressed = "1234" * 10_000
    bounded = _count(admin, _sql(f"SELECT count(*) FROM {{t}} WHERE n = {compressed} OR n >= 'NaN' OR n IS NULL",
                                 table="rn_all"))
    raw = _count(admin, f"SELECT count(*) FILTER (WHERE n = {compressed}), count(*) FILTER (WHERE n >= 'NaN') FROM rn_all")
    assert (bounded, raw) == ((2 + 4 * 2,), (2, 2)), (bounded, raw)  # NaN; random, compressed, past, NULL


_POLICY_TABLE = """
    access: protected
    epsilon: 1.0
    answer_quantum_ms: 20
    columns:
      n: {bounds: [0, 100]}
      x: {bounds: [0, 100]}
"""
_POLICY = ATTACK_POLICY_HEAD + "  public.rn_0: &N" + _POLICY_TABLE.replace("{", "{{").replace("}", "}}") + "".join(
    f"  public.{name}: *N\n" for name in _NEIGHBOURS)


@pytest.fixture(scope="module")
def quantum_proxy(neighbours: list[str], test_db: TestDatabase,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


@pytest.mark.parametrize("condition", ["n = 5", "n IN (5, 'NaN', 7)", "n BETWEEN 0 AND 50", "n < 'Infinity'",
                                       "n = 5 OR NOT (n = 5)", "NOT (n = 5)"])
def test_a_quantum_table_answers_the_same_way_on_every_neighbour(quantum_proxy: RunningProxy, condition: str) -> None:
    with quantum_proxy.connect() as conn:
        outcome = same_on_neighbours(conn, f"SELECT count(*), sum(n) FROM {{t}} WHERE {condition}",
                                     ("rn_0", *_NEIGHBOURS), spent_epsilon)
    assert outcome[0] == "answer", outcome
