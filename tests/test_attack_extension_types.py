"""Columns of types not built into PostgreSQL, attacked on neighbouring tables (pgvector's ``vector``).

An extension's type compares, sorts and hashes with C code of its own, which may raise on some
pairs of values only: pgvector's ``vector`` raises "different vector dimensions" when two values
of different dimensions meet, and an unconstrained ``vector`` column may mix dimensions. A range
over ``vector`` (``CREATE TYPE ... AS RANGE (subtype = vector)``) compares its bounds with the
subtype's btree comparison (pgvector 0.6's does not raise; what another version's does is its own).

Found: ``COUNT(DISTINCT e)`` was charged and then failed (DP004) exactly when two compared rows
differed in dimension, so ``COUNT(DISTINCT e) ... WHERE id IN (7, 8)`` told whether rows 7 and 8
do (privacy), and so did ``COUNT(DISTINCT)`` of an array or a composite holding vectors; a
comparison on a column of a user's range type ran the subtype's comparison per row, as did MODE
and GROUP BY over its declared categories, which the loader accepted;
a comparison PostgreSQL has no operator for (``e = '[1,2,3]'``, 42883) was charged. Now such a
column is counted and tested for NULL and nothing else: any other use is refused from the text,
before any charge, and the loader refuses categories, bounds or group_by on it
(``ColumnInfo.builtin``).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import (ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy, refused_at_load, running_proxy,
                            spent_epsilon)
from tests.neighbour_outcome import create_neighbours, masked_outcome

_SETUP = (
    "CREATE EXTENSION IF NOT EXISTS vector",
    "DROP TABLE IF EXISTS vx0, vx1, vx2, vk",
    "DROP DOMAIN IF EXISTS vx_vec",
    "DROP TYPE IF EXISTS vx_vrange, vx_irange, vx_pair",
    "CREATE DOMAIN vx_vec AS vector",
    "CREATE TYPE vx_vrange AS RANGE (subtype = vector)",
    "CREATE TYPE vx_irange AS RANGE (subtype = integer)",
    "CREATE TYPE vx_pair AS (n integer, e vector)",
)
_DDL = "(id int8, v int4, e vector, ea vector[], ed vx_vec, er vx_vrange, ec vx_pair, ir vx_irange)"
_BASE_ROWS = ("SELECT g, g % 50, '[1,2,3]', '{\"[1,2,3]\"}', '[1,2,3]', '[\"[1,2,3]\",\"[1,2,4]\"]', "
              "'(1,\"[1,2,3]\")', '[1,3)' FROM generate_series(1, 200) g")
# One row more, whose every vector is of another dimension than the base rows' (a range's two
# bounds alike: its input compares them).
_NEIGHBOURS = {
    "vx1": "(201, 1, '[1,2]', '{\"[1,2]\"}', '[1,2]', '[\"[1,2]\",\"[1,3]\"]', '(1,\"[1,2]\")', '[2,5)')",
    "vx2": "(7, 1, '[1,2,3,4]', '{\"[1,2,3,4]\"}', '[1,2,3,4]', '[\"[1,2,3,4]\",\"[1,2,3,5]\"]', '(1,\"[1,2,3,4]\")', "
           "'empty')",
}
_POLICY = ATTACK_POLICY_HEAD + """
  public.vx0: &T
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      v: {{bounds: [0, 100]}}
""" + "".join(f"  public.{name}: *T\n" for name in _NEIGHBOURS)
# A value of each foreign column's type, as a literal.
_LITERALS = {"e": "'[1,2,3]'", "ea": "'{\"[1,2,3]\"}'", "ed": "'[1,2,3]'", "er": "'[\"[1,2,3]\",\"[1,2,4]\"]'",
             "ec": "'(1,\"[1,2,3]\")'", "ir": "'[1,3)'"}
_REFUSED = (
    "SELECT COUNT(DISTINCT {c}) FROM {t}",
    "SELECT COUNT(DISTINCT {c}) FROM {t} WHERE id IN (7, 201)",
    "SELECT COUNT(*) FROM {t} WHERE {c} = {x}",
    "SELECT COUNT(*) FROM {t} WHERE id = 7 AND {c} = {x}",
    "SELECT COUNT(*) FROM {t} WHERE {c} <> {x}",
    "SELECT COUNT(*) FROM {t} WHERE {c} < {x}",
    "SELECT COUNT(*) FROM {t} WHERE {c} IN ({x}, {x})",
    "SELECT COUNT(*) FROM {t} WHERE {c} BETWEEN {x} AND {x}",
    "SELECT COUNT(*) FROM {t} WHERE NOT ({c} >= {x})",
    "SELECT COUNT(*) FROM {t} WHERE {c} IS DISTINCT FROM {x}",
    "SELECT COUNT(*) FROM {t} WHERE {c} LIKE 'a%'",
    "SELECT COUNT(*) FILTER (WHERE {c} = {x}) FROM {t}",
    "SELECT SUM(CASE WHEN {c} = {x} THEN 1 ELSE 0 END) FROM {t}",
    "WITH w AS (SELECT * FROM {t} WHERE {c} = {x}) SELECT COUNT(*) FROM w",
    "SELECT COUNT(*) FROM (SELECT id, {c} FROM {t} WHERE {c} > {x}) AS s",
    "SELECT COUNT(*) FROM {t} WHERE {c} = e",
    "SELECT {c}, COUNT(*) FROM {t} GROUP BY 1",
    "SELECT DISTINCT {c} FROM {t}",
    "SELECT MODE() WITHIN GROUP (ORDER BY {c}) FROM {t}",
    "SELECT MIN({c}) FROM {t}",
    "SELECT COUNT(*) FROM {t} GROUP BY {c}",
    "SELECT COUNT(*) FROM {t} WHERE {c} = ANY(ARRAY[{x}])",
    "SELECT COUNT(*) FROM {t} WHERE ({c} = {x}) IS TRUE",
    "SELECT COUNT(*) FROM {t} ORDER BY {c}",  # a column outside an aggregate, as PostgreSQL's 42803
)
_ANSWERED = (
    "SELECT COUNT({c}) FROM {t}",
    "SELECT COUNT(*) FROM {t} WHERE {c} IS NULL",
    "SELECT COUNT(*) FROM {t} WHERE {c} IS NOT NULL AND v < 10",
    "SELECT COUNT(*) FROM {t} WHERE id = 7 AND {c} IS NOT NULL",
)


@pytest.fixture(scope="module")
def vector_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        for statement in _SETUP:
            admin.execute(statement)
    create_neighbours(test_db.admin_dsn, "vx0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _same_on_neighbours(conn: psycopg.Connection, template: str, column: str) -> tuple[object, ...]:
    """The one outcome of ``template`` on ``column`` on ``vx0`` and its neighbours, none charged unless answered."""
    sql = template.replace("{c}", column).replace("{x}", _LITERALS[column])
    outcomes = {}
    for table in ("vx0", *_NEIGHBOURS):
        before = spent_epsilon(conn)
        outcomes[table] = masked_outcome(conn, sql, table)
        assert outcomes[table][0] == "answer" or spent_epsilon(conn) == before, (sql, table, outcomes[table])
    assert len(set(outcomes.values())) == 1, (sql, outcomes)
    return outcomes["vx0"]


def test_the_neighbours_rows_make_the_backend_raise(test_db: TestDatabase, vector_proxy: RunningProxy) -> None:
    """The ground of the attack: on the backend itself, the added row's vector fails what vx0's rows pass."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        for sql in ("SELECT count(DISTINCT e) FROM {t}", "SELECT count(DISTINCT ea) FROM {t}",
                    "SELECT count(DISTINCT ec) FROM {t}", "SELECT count(*) FROM {t} WHERE ea = '{{\"[1,2,3]\"}}'",
                    "SELECT e, count(*) FROM {t} GROUP BY e"):
            admin.execute(sql.format(t="vx0")).fetchall()
            with pytest.raises(psycopg.errors.DataException, match="different vector dimensions"):
                admin.execute(sql.format(t="vx1")).fetchall()


@pytest.mark.parametrize("column", sorted(_LITERALS))
@pytest.mark.parametrize("template", _REFUSED)
def test_a_column_of_a_type_not_built_in_is_used_only_to_count_refused_from_the_text(
        vector_proxy: RunningProxy, template: str, column: str) -> None:
    with vector_proxy.connect() as conn:
        outcome = _same_on_neighbours(conn, template, column)
    assert outcome[0] == "error" and str(outcome[1]).startswith("DP0") and outcome[1] != "DP004", outcome


@pytest.mark.parametrize("column", sorted(_LITERALS))
@pytest.mark.parametrize("template", _ANSWERED)
def test_a_column_of_a_type_not_built_in_is_counted_and_tested_for_null(
        vector_proxy: RunningProxy, template: str, column: str) -> None:
    with vector_proxy.connect() as conn:
        assert _same_on_neighbours(conn, template, column)[0] == "answer"


def test_count_distinct_of_a_vector_column_names_the_reason(vector_proxy: RunningProxy) -> None:
    with vector_proxy.connect() as conn, pytest.raises(psycopg.Error) as refused:
        conn.execute("SELECT COUNT(DISTINCT e) FROM vx0")
    assert refused.value.sqlstate == "DP001"
    assert "not built into PostgreSQL" in str(refused.value) and "aggregate-argument" in str(refused.value)
    assert "COUNT(e)" in (refused.value.diag.message_hint or "")


@pytest.mark.parametrize("entry", [
    "er: {{categories: ['[\"[1,2,3]\",\"[1,2,4]\"]', '[\"[1,2]\",\"[1,3]\"]']}}",
    "er: {{categories: ['[\"[1,2,3]\",\"[1,2,4]\"]', '[\"[1,2]\",\"[1,3]\"]'], group_by: true}}",
    "ir: {{categories: ['[1,3)', '[2,5)'], group_by: true}}",
    "e: {{categories: ['[1,2,3]', '[1,2]']}}",
    "ed: {{bounds: [0, 10]}}",
    "ec: {{categories: ['(1,\"[1,2,3]\")', '(2,\"[1,2,3]\")']}}",
])
def test_the_loader_refuses_a_declared_domain_on_a_column_of_a_type_not_built_in(
        test_db: TestDatabase, vector_proxy: RunningProxy, tmp_path_factory: pytest.TempPathFactory, entry: str) -> None:
    text = ATTACK_POLICY_HEAD + f"  public.vx0: {{{{access: protected, epsilon: 1.0, columns: {{{{{entry}}}}}}}}}\n"
    problems = refused_at_load(make_policy(test_db, tmp_path_factory.mktemp("vx") / "ledger.sqlite3", text))
    column = entry.split(":")[0]
    assert len(problems) == 1 and problems[0].startswith(f"tables.public.vx0.columns.{column}: ")
    assert "not built into PostgreSQL" in problems[0], problems


@pytest.mark.parametrize("partitioning", ["auto", "row_hash"])
def test_a_primary_key_of_a_type_not_built_in_is_never_hashed(
        test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, partitioning: str) -> None:
    """``row_hash`` hashes built-in types only (``rewriter.rewrite.HASH_FUNCTIONS``): a vector
    key is passed over, as a table without a key's would be (auto: random(); row_hash: the
    table's other hashable columns)."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("CREATE EXTENSION IF NOT EXISTS vector")
        admin.execute("DROP TABLE IF EXISTS vk")
        admin.execute("CREATE TABLE vk (e vector PRIMARY KEY, v int4)")
        admin.execute("GRANT SELECT ON vk TO dpproxy_service")
    text = ATTACK_POLICY_HEAD + (f"  public.vk: {{{{access: protected, epsilon: 1.0, delta: 1.0e-6, "
                                 f"partitioning: {partitioning}, columns: {{{{v: {{{{bounds: [0, 10]}}}}}}}}}}}}\n")
    with running_proxy(test_db, tmp_path_factory, text) as running:
        relation = next(r for r in running.server.registry.by_oid.values() if r.name == "vk")
        assert "e" not in relation.hashed_columns
        assert (relation.partition_key, relation.hashed_columns) == (
            ("random", ()) if partitioning == "auto" else ("row", ("v",)))
        with running.connect() as conn:
            assert conn.execute("SELECT MAX(v) FROM vk").fetchone() is not None
