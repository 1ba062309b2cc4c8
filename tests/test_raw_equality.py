"""Text equality on the raw column where it gives the bounded comparison's answer (rewriter/raw_equality.py).

The value bound made ``t = 'x'`` a comparison of ``CASE WHEN octet_length(t) <= 256 THEN t END``,
which no B-tree index on ``t`` serves: a selective equality on a large table became a sequential
scan. On a table with ``answer_quantum_ms`` it is now rendered on the raw column where false and
NULL decide alike (a literal of at most the bound, a deterministic text or varchar column, no NOT
above it), so the index serves; elsewhere the bounded form stays. An index on the bounded value
``CASE WHEN octet_length(t) <= 256 THEN t END`` served it until the bound also checked that the value
is stored in the row (``pg_column_size``, not immutable: no index holds that check; docs/threat-model.md,
"Values stored apart"); it serves neither form now. Pinned: the backend SQL, the plans (EXPLAIN on a direct connection), and the answers,
equal to the bounded form's on tables with long values and on neighbouring tables.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from policies.model import ColumnPolicy, TablePolicy
from proxy.demo.embedded import SERVICE_ROLE
from policies.tables import ColumnInfo, Relation
from rewriter.dp_query import plan_aggregate_query
from rewriter.raw_equality import literal_bytes
from rewriter.rewrite import backend_sql
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours, same_on_neighbours
from tests.plan_nodes import plan_node_types
from tests.post_charge_wait import LONG_TEXT, store_apart
from tests.raw_reads import projected, raw_reads

BOUND = 256  # the default max_text_bytes


def _relation(name: str, quantum_ms: int) -> Relation:
    columns = (ColumnInfo("id", 23, -1, 1, None), ColumnInfo("t", 25, -1, 2, None),
               ColumnInfo("x", 23, -1, 3, ColumnPolicy(bounds=(0, 100))), ColumnInfo("c", 1042, 300 + 4, 4, None),
               ColumnInfo("ci", 25, -1, 5, None, deterministic_collation=False), ColumnInfo("w", 1043, 300 + 4, 6, None),
               ColumnInfo("narrow", 1043, 10 + 4, 7, None))
    policy = TablePolicy(epsilon=1.0, answer_quantum_ms=quantum_ms)
    return Relation(1, "public", name, policy, {column.name: column for column in columns})


def _sql(statement: str, quantum_ms: int = 20, table: str = "tr") -> str:
    return backend_sql(plan_aggregate_query(statement.replace("{t}", table), _relation(table, quantum_ms)), 0)


_BOUND_T = ('CASE WHEN (pg_catalog.int4smaller(pg_catalog.pg_column_size("t"), CAST(257 AS integer)) OPERATOR(pg_catalog.>) '
            'pg_catalog.octet_length("t")) THEN "t" END')
_BOUNDED = ("t", "w", "c", "ci", "narrow")  # the columns read through a bound


@pytest.mark.parametrize("where", [
    "t = 'x'", "'x' = t", "t IN ('a', 'b')", "t = 'x' OR x > 3", "(t = 'x' AND x > 3) OR t = 'y'",
    "t = '" + "a" * BOUND + "'", "t = '" + "é" * (BOUND // 4) + "'", "t = ''", "w = 'x'",
])
def test_equality_with_a_short_literal_compares_the_raw_column_on_a_table_with_a_quantum(where: str) -> None:
    sql = _sql(f"SELECT count(*), sum(x) FROM {{t}} WHERE {where}")
    column = "w" if where.startswith("w") else "t"
    assert raw_reads(sql, column) >= 1, sql
    if projected(sql, column):  # read twice or more: through the projection, the raw value its output
        assert f') AND ("{column}" OPERATOR(pg_catalog.=) \'' in sql, sql  # the bounded value beside it
    else:  # read once: the bound in place
        assert f'(("{column}" OPERATOR(pg_catalog.=) \'' in sql and 'FROM "public"."tr" WHERE' in sql, sql
        assert f') AND ({_BOUND_T.replace(chr(34) + "t" + chr(34), chr(34) + column + chr(34))} OPERATOR(pg_catalog.=) \'' in sql, sql


@pytest.mark.parametrize("where", [
    "NOT (t = 'x')", "t NOT IN ('a', 'b')", "t <> 'x'", "(t = 'x') IS TRUE", "(t = 'x') IS FALSE",
    "NOT (t = 'x' OR x > 3)", "t = '" + "a" * (BOUND + 1) + "'", "t = '" + "é" * (BOUND // 4 + 1) + "'",
    "c = 'x'", "ci = 'x'", "t = CAST('x' AS text)", "lower(t) = 'x'", "t = $1", "t > 'x'", "t LIKE 'x'",
])
def test_equality_where_false_and_null_may_differ_keeps_the_bounded_value(where: str) -> None:
    sql = _sql(f"SELECT count(*) FROM {{t}} WHERE {where}")
    assert not any(raw_reads(sql, column) for column in _BOUNDED), sql
    assert "CASE WHEN (pg_catalog.int4smaller(pg_catalog.pg_column_size(" in sql, sql


def test_a_table_without_a_quantum_keeps_the_bounded_value_and_a_narrow_varchar_gets_one_hashed_raw_conjunct() -> None:
    """Without a quantum the raw form's index search could read a long value (the module's lever). A
    varchar(10), read through its in-line check alone (its values may be stored apart), compares
    the raw column only in the hashed conjunct beside a top-level ``=`` (tests/test_declared_raw_equality.py),
    with or without a quantum, and never term by term."""
    sql = _sql("SELECT count(*) FROM {t} WHERE t = 'x'", quantum_ms=0)
    assert raw_reads(sql, "t") == 0 and _BOUND_T in sql, sql
    for quantum_ms in (0, 20):
        narrow = _sql("SELECT count(*) FROM {t} WHERE narrow = 'x' OR (narrow = 'y' AND x > 3)", quantum_ms=quantum_ms)
        assert raw_reads(narrow, "narrow") == 0, narrow
        assert 'CASE WHEN (pg_catalog.pg_column_size("narrow") OPERATOR(pg_catalog.>) pg_catalog.octet_length("narrow"))' in narrow
        assert raw_reads(_sql("SELECT count(*) FROM {t} WHERE narrow = 'x'", quantum_ms=quantum_ms), "narrow") == 1


def test_each_occurrence_is_rendered_by_where_it_stands() -> None:
    """A share's denominator holds p both ways (``p OR NOT p``); a FILTER is a condition of its own;
    a column read elsewhere is read through its bound there; the raw value of a FILTER above sample and
    aggregate's rows is their output, under a name no column has."""
    share = _sql("SELECT avg(CAST(t = 'x' AS int)) FROM {t}")
    assert raw_reads(share, "t") == 2 and "(NOT (\"t\" OPERATOR(pg_catalog.=) 'x'))" in share, share
    both = _sql("SELECT count(*) FILTER (WHERE t = 'x'), count(DISTINCT t) FROM {t} WHERE NOT (t = 'y')")
    assert raw_reads(both, "t") == 1 and f'{_BOUND_T} AS "t", "t" AS "raw 2"' in both, both
    once = _sql("SELECT count(*) FILTER (WHERE t = 'x') FROM {t}")
    assert raw_reads(once, "t") == 1 and f"(\"t\" OPERATOR(pg_catalog.=) 'x') AND ({_BOUND_T} OPERATOR" in once, once
    table = _relation("tr", 20)
    clash = Relation(1, "public", "tr", table.policy,
                     {**table.columns, "raw 2": ColumnInfo("raw 2", 23, -1, 8, ColumnPolicy(bounds=(0, 1)))})
    sql = backend_sql(plan_aggregate_query('SELECT max("raw 2") FILTER (WHERE t = \'x\') FROM tr', clash), 0)
    assert '"t" AS "_raw 2"' in sql and '(("_raw 2" OPERATOR(pg_catalog.=) \'x\') AND ("t" OPERATOR' in sql, sql


def test_a_literal_is_weighed_at_four_bytes_a_character_outside_ascii() -> None:
    assert [literal_bytes(text) for text in ("", "abc", "é", "a𝔸")] == [0, 3, 4, 5]


# --- On a real PostgreSQL: plans and answers -------------------------------------------------------

_INDEXED_ROWS = 20_000
_DDL = "(id int, t text, x int, c char(300), ci text, w varchar(300), narrow varchar(10))"
_RANDOM_3MB = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 94000) g)"


@pytest.fixture(scope="module")
def indexed(test_db: TestDatabase) -> Iterator[psycopg.Connection]:
    """``tr_plain`` (an index on t) and ``tr_bounded`` (an index on t's bounded value), 20,000 rows of
    1,000 keys each and one of 100 kB just after 'k7' (a B-tree entry holds it compressed), on a direct connection."""
    rows = (f"SELECT g, 'k' || g % 1000, g % 100, 'c', 'ci', 'w' || g % 1000, 'n' FROM generate_series(1, {_INDEXED_ROWS}) g "
            "UNION ALL SELECT 0, repeat('k7', 50000), 1, 'c', 'ci', 'w', 'n'")
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for name, index in (("tr_plain", "(t)"), ("tr_bounded", f"((CASE WHEN octet_length(t) <= {BOUND} THEN t END))")):
            conn.execute(f"DROP TABLE IF EXISTS {name}")
            conn.execute(f"CREATE TABLE {name} {_DDL}")
            conn.execute(f"INSERT INTO {name} {rows}")
            conn.execute(f"CREATE INDEX ON {name} {index}")
            conn.execute(f"ANALYZE {name}")
        yield conn


@pytest.mark.parametrize("where", ["t = 'k7'", "t IN ('k7', 'k8')", "t = 'k7' AND x > 3"])
def test_an_index_on_the_column_serves_the_raw_equality_on_a_table_with_a_quantum(
        indexed: psycopg.Connection, where: str) -> None:
    sql = _sql(f"SELECT count(*), sum(x) FROM {{t}} WHERE {where}", table="tr_plain")
    assert "Seq Scan" not in plan_node_types(indexed, sql), sql
    assert indexed.execute(sql).fetchone() == indexed.execute(
        f"SELECT count(*), sum(LEAST(GREATEST(x, 0), 100)) FROM tr_plain WHERE {where}").fetchone()


@pytest.mark.parametrize("quantum_ms", [0, 20])
def test_an_index_on_the_value_bounded_by_its_length_alone_no_longer_serves(indexed: psycopg.Connection,
                                                                           quantum_ms: int) -> None:
    """The cost of reading only values stored in the row (docs/threat-model.md): the bounded value's
    check of the stored form is not immutable, so no index holds it, and the one docs/threat-model.md
    advised before, on the length check alone, matches no expression of the backend SQL; nor is a
    plain index used without a quantum (no raw form there)."""
    bounded = _sql("SELECT count(*) FROM {t} WHERE t IN ('k7', 'k8')", quantum_ms=quantum_ms, table="tr_bounded")
    assert "Seq Scan" in plan_node_types(indexed, bounded), bounded
    plain = _sql("SELECT count(*) FROM {t} WHERE t = 'k7'", quantum_ms=0, table="tr_plain")
    assert "Seq Scan" in plan_node_types(indexed, plain), plain


def test_a_value_stored_apart_reads_as_null_whatever_plan_serves_the_raw_equality(
        test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """On a table with a quantum, ``t = '<a value>'`` compares the raw column beside the bounded one,
    and when the statement reads no other column PostgreSQL chooses an index-only scan: the bounded
    value's check of the stored form (``pg_column_size``) then reads the index's copy, always in the
    index tuple, so a value stored apart in the row read as itself there and as NULL under any other
    plan, which the statistics and the visibility map choose (the whole table, not the row). dpproxy
    pins ``enable_indexonlyscan`` off on its backend connections (proxy/backend/pool.py): the
    answer is the heap's, NULL. Found while measuring the candidate closures of the declared-size
    lever (benchmarks/declared_apart.py)."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS tr_apart")
        conn.execute(f"CREATE TABLE tr_apart {_DDL}")
        conn.execute(f"INSERT INTO tr_apart SELECT g, 'k' || g % 1000, g % 100, 'c', 'ci', 'w', 'n' "
                     f"FROM generate_series(1, {_INDEXED_ROWS}) g")
        store_apart(conn, "tr_apart", "t", f"0, {LONG_TEXT}, 1, 'c', 'ci', 'w', 'n'", most=BOUND)
        conn.execute("CREATE INDEX ON tr_apart (t)")
        conn.execute(f"GRANT SELECT ON tr_apart TO {SERVICE_ROLE}")
        conn.execute("VACUUM ANALYZE tr_apart")
        value = conn.execute("SELECT t FROM tr_apart WHERE id = 0").fetchone()
        assert value is not None
        statement = f"SELECT count(*) FROM tr_apart WHERE t = '{value[0]}'"
        sql = _sql(statement.replace("tr_apart", "{t}"), table="tr_apart")
        # Where the hole was: PostgreSQL's own choice, unpinned, reads the index's copy.
        unpinned = (plan_node_types(conn, sql), conn.execute(sql).fetchall())
    assert unpinned == ({"Aggregate", "Index Only Scan"}, [(1,)]) or "Index Only Scan" not in unpinned[0], unpinned
    assert "Index Only Scan" in unpinned[0], f"the test needs PostgreSQL to choose the index-only scan: {unpinned}"
    policy = ATTACK_POLICY_HEAD + "  public.tr_apart:" + _TABLE.replace("EPSILON", "1000.0")
    with running_proxy(test_db, tmp_path_factory, policy) as proxy, proxy.connect() as analyst:
        row = analyst.execute(statement).fetchone()
    assert row is not None and round(float(row[0])) == 0, row


# An exact table (ε 1000) with a quantum, and its rows by t: 3 'short', 2 at the bound, 4 past it, one of
# 3 MB, 5 NULL; x is the row number. Each statement's count must be the bounded form's, counted directly.
_EXACT = "tr_exact"
_EXACT_ROWS = (f"SELECT g, CASE WHEN g <= 3 THEN 'short' WHEN g <= 5 THEN repeat('a', {BOUND}) "
               f"WHEN g <= 9 THEN repeat('a', {BOUND + 1}) WHEN g = 10 THEN {_RANDOM_3MB} END, g, 'c', 'ci', 'w', 'n' "
               "FROM generate_series(1, 15) g")
_TABLE = """
    access: protected
    epsilon: EPSILON
    delta: 1.0e-6
    answer_quantum_ms: 20
    columns:
      x: {{bounds: [0, 100]}}
"""
_NEIGHBOURS = {
    "tr_long": f"(0, {_RANDOM_3MB}, 1, 'c', 'ci', 'w', 'n')",
    "tr_periodic": "(0, repeat('short', 1000), 1, 'c', 'ci', 'w', 'n')",
    "tr_at": f"(0, repeat('a', {BOUND}), 1, 'c', 'ci', 'w', 'n')",
    "tr_over": f"(0, repeat('a', {BOUND + 1}), 1, 'c', 'ci', 'w', 'n')",
    "tr_null": "(0, NULL, NULL, NULL, NULL, NULL, NULL)",
}
_POLICY = (ATTACK_POLICY_HEAD + f"  public.{_EXACT}:" + _TABLE.replace("EPSILON", "1000.0")
           + "  public.tr_0: &N" + _TABLE.replace("EPSILON", "1.0") + "".join(f"  public.{name}: *N\n" for name in _NEIGHBOURS))
_AT = "a" * BOUND

_CONDITIONS = [
    "t = 'short'", f"t IN ('short', '{_AT}')", f"t = '{_AT}'", "NOT (t = 'short')", "t <> 'short'",
    "t NOT IN ('short')", "(t = 'short') IS FALSE", "(t = 'short') IS NOT TRUE", "t = 'short' OR t IS NULL",
    "NOT (t = 'short' OR x > 12)", f"NOT (t = 'short' AND t = '{_AT}')", "t = 'short' OR NOT (t = 'short')",
    "t = 'short' AND x > 1", f"NOT (NOT (t = '{_AT}'))", f"t = '{_AT}a'",
]


@pytest.fixture(scope="module")
def raw_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    create_neighbours(test_db.admin_dsn, _EXACT, {}, _DDL, _EXACT_ROWS)
    create_neighbours(test_db.admin_dsn, "tr_0", _NEIGHBOURS, _DDL,
                      "SELECT g, (ARRAY['short', 'k1', 'k2'])[1 + g % 3], g % 100, 'c', 'ci', 'w', 'n' "
                      "FROM generate_series(1, 300) g")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _bounded_count(admin: psycopg.Connection, condition: str) -> int:
    row = admin.execute(f"SELECT count(*) FROM (SELECT CASE WHEN octet_length(t) <= {BOUND} AND "
                        f"pg_column_size(t) > octet_length(t) THEN t END AS t, x "
                        f"FROM {_EXACT}) AS s WHERE {condition}").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("condition", _CONDITIONS)
def test_the_answer_is_the_bounded_forms_with_long_values_negations_and_nulls(
        raw_proxy: RunningProxy, test_db: TestDatabase, condition: str) -> None:
    with raw_proxy.connect() as conn, psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        expected = _bounded_count(admin, condition)
        where = conn.execute(f"SELECT count(*) FROM {_EXACT} WHERE {condition}").fetchone()
        filtered = conn.execute(f"SELECT count(*) FILTER (WHERE {condition}) FROM {_EXACT}").fetchone()
    assert where is not None and filtered is not None
    assert (round(float(where[0])), round(float(filtered[0]))) == (expected, expected)


def test_a_share_counts_the_rows_where_its_condition_is_not_null_as_the_bounded_form_does(
        raw_proxy: RunningProxy, test_db: TestDatabase) -> None:
    """AVG(CAST(p AS INT)) averages over the rows where p is not NULL: 3 'short' of the 5 values the
    bound reads (NULL, past the bound and 3 MB are not among them), with p raw in the numerator."""
    with raw_proxy.connect() as conn:
        row = conn.execute(f"SELECT avg(CAST(t = 'short' AS int)) FROM {_EXACT}").fetchone()
    assert row is not None and abs(float(row[0]) - 3 / 5) < 0.02, row


@pytest.mark.parametrize("condition", _CONDITIONS)
def test_raw_equality_is_answered_the_same_way_on_every_neighbour(raw_proxy: RunningProxy, condition: str) -> None:
    with raw_proxy.connect() as conn:
        outcome = same_on_neighbours(conn, f"SELECT count(*), sum(x) FROM {{t}} WHERE {condition}",
                                     ("tr_0", *_NEIGHBOURS), spent_epsilon)
    assert outcome[0] == "answer", outcome
