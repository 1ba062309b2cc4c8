"""A CTE read once is the derived table it names: answered as the flattened statement (rewriter/ctes.py)."""

from __future__ import annotations

import psycopg
import pytest

from conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy

_POLICY = ATTACK_POLICY_HEAD + """\
  public.adult:
    access: protected
    epsilon: 1.0
    columns:
      age: {{bounds: [17, 90]}}
      capital_gain: {{bounds: [0, 100000]}}
      sex: {{categories: [Male, Female], group_by: true}}
  public.lookup:
    access: public
"""


@pytest.fixture(scope="module")
def proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> RunningProxy:
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _spent(proxy: RunningProxy) -> float:
    return float(proxy._call(proxy.server.budget.balance("analyst")).spent_epsilon)


@pytest.mark.parametrize(("sql", "flat", "names"), [
    ("WITH adults AS (SELECT * FROM adult WHERE age >= 30) SELECT COUNT(*) FROM adults",
     "SELECT COUNT(*) FROM adult WHERE age >= 30", ["count"]),
    ("WITH a AS (SELECT * FROM adult WHERE age >= 31), b AS (SELECT age AS years, capital_gain FROM a "
     "WHERE capital_gain > 10) SELECT COUNT(*) AS n, SUM(years) FROM b",
     "SELECT COUNT(*) AS n, SUM(age) FROM adult WHERE age >= 31 AND capital_gain > 10", ["n", "sum"]),
    ("SELECT COUNT(*) FROM (WITH w AS (SELECT * FROM adult WHERE age > 40) SELECT * FROM w) AS t",
     "SELECT COUNT(*) FROM adult WHERE age > 40", ["count"]),
    ("WITH w AS MATERIALIZED (SELECT * FROM adult WHERE sex = 'Female') SELECT SUM(w.age) AS total FROM w",
     "SELECT SUM(age) AS total FROM adult WHERE sex = 'Female'", ["total"]),
    # Superset 6.1's virtual dataset on PostgreSQL keeps its CTE inside the virtual_table subquery
    # (tests/data/superset-statements.md, cte-*); on engines without CTEs in subqueries it hoists it.
    ("SELECT AVG(CASE WHEN age > 41 THEN 1 ELSE 0 END) AS rate FROM (WITH adults AS (SELECT * FROM adult "
     "WHERE age >= 30) SELECT * FROM adults) AS virtual_table LIMIT 10000",
     "SELECT AVG(CASE WHEN age > 41 THEN 1 ELSE 0 END) AS rate FROM adult WHERE age >= 30 LIMIT 10000", ["rate"]),
    ("WITH adults AS (SELECT * FROM adult WHERE age >= 32) SELECT COUNT(*) AS count FROM (SELECT * FROM adults) "
     "AS virtual_table LIMIT 10000", "SELECT COUNT(*) AS count FROM adult WHERE age >= 32 LIMIT 10000", ["count"]),
], ids=["wrapper", "chain", "inside-a-derived-table", "materialized", "superset-virtual-table-indicator",
        "superset-hoisted"])
def test_a_cte_read_once_is_answered_as_the_same_release_as_the_flat_statement(
    proxy: RunningProxy, sql: str, flat: str, names: list[str]
) -> None:
    with proxy.connect() as conn:
        before = _spent(proxy)
        cur = conn.execute(sql)
        assert [column.name for column in cur.description] == names
        answer = cur.fetchall()
        assert _spent(proxy) == before + 1
        assert conn.execute(flat).fetchall() == answer  # a free repeat: the same release
        assert _spent(proxy) == before + 1


def test_post_processing_through_a_cte_and_the_extended_protocol(proxy: RunningProxy) -> None:
    with proxy.connect() as conn:
        (twice,) = conn.execute("WITH c AS (SELECT COUNT(*) AS n FROM adult WHERE age > 50) "
                                "SELECT n * 2 AS twice FROM c").fetchone()
        assert twice % 2 == 0
        cur = conn.execute("WITH w AS (SELECT * FROM adult WHERE age > %s) SELECT COUNT(*) FROM w", (60,),
                           prepare=True)
        assert cur.fetchone() is not None


@pytest.mark.parametrize(("sql", "what"), [
    ("WITH w AS (SELECT * FROM adult) SELECT COUNT(*) FROM w a, w b", "a CTE read more than once"),
    ("WITH w AS (SELECT * FROM adult) SELECT COUNT(*) FROM w UNION ALL SELECT COUNT(*) FROM w",
     "UNION/INTERSECT/EXCEPT"),
    ("WITH RECURSIVE w AS (SELECT * FROM adult) SELECT COUNT(*) FROM w", "WITH RECURSIVE"),
    ("WITH w(x) AS (SELECT age FROM adult) SELECT SUM(x) FROM w", "a CTE with a column list"),
    ("WITH w AS (SELECT * FROM adult), z AS (SELECT 1) SELECT COUNT(*) FROM w", "a CTE that is never read"),
    ("WITH w AS (SELECT age + 1 AS a FROM adult) SELECT SUM(a) FROM w", "computed columns inside a subquery"),
    ("WITH w AS (SELECT * FROM adult LIMIT 10) SELECT COUNT(*) FROM w", "LIMIT"),
    ("WITH w AS (SELECT * FROM adult) SELECT COUNT(*) FROM (WITH w AS (SELECT * FROM adult) SELECT * FROM w) t",
     "subqueries are not allowed"),  # the table read twice
    # PostgreSQL reads the catalog's pg_class in a's body (a CTE sees only those before it): the
    # statement counts catalog rows there, and dpproxy must not answer it as a count of adult.
    ("WITH a AS (SELECT * FROM pg_class), pg_class AS (SELECT * FROM adult WHERE age > 30) SELECT COUNT(*) FROM a",
     "a CTE named before it is defined"),
    ("WITH a AS (SELECT * FROM b), b AS (SELECT * FROM adult) SELECT COUNT(*) FROM a",
     "a CTE named before it is defined"),  # PostgreSQL: relation "b" does not exist
    ("WITH w AS (SELECT * FROM adult) SEARCH DEPTH FIRST BY age SET o SELECT COUNT(*) FROM w", "SEARCH/CYCLE"),
    ("WITH w AS (SELECT * FROM adult) SELECT COUNT(*) FROM w TABLESAMPLE SYSTEM (1)", "TABLESAMPLE"),
    # The alias's column list renames by position: age here is PostgreSQL's workclass.
    ("WITH w AS (SELECT * FROM adult) SELECT SUM(age) FROM w AS x(capital_gain, age)", "column list"),
    ("SELECT SUM(age) FROM (SELECT * FROM adult) AS x(capital_gain, age)", "column list"),
    ("SELECT SUM(age) FROM adult AS a(fnlwgt, workclass, age)", "column list"),  # SUM of fnlwgt to PostgreSQL
])
def test_a_cte_that_is_no_plain_wrapper_read_once_is_refused_before_the_charge(
    proxy: RunningProxy, sql: str, what: str
) -> None:
    with proxy.connect() as conn:
        before = _spent(proxy)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql)
        assert refused.value.sqlstate == "DP001", refused.value
        assert what in str(refused.value) and "(rule: no-" in str(refused.value), str(refused.value)
        assert _spent(proxy) == before


@pytest.mark.parametrize("sql", [
    "WITH w AS (SELECT *, age FROM adult) SELECT SUM(age) FROM w",
    "SELECT SUM(x) FROM (SELECT age AS x, capital_gain AS x FROM adult) AS t",
])
def test_a_name_a_wrapper_makes_visible_twice_is_ambiguous_as_in_postgresql(proxy: RunningProxy, sql: str) -> None:
    with proxy.connect() as conn:
        before = _spent(proxy)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql)
        assert refused.value.sqlstate == "42702", refused.value
        assert _spent(proxy) == before


@pytest.mark.parametrize(("sql", "flat"), [
    # Names fold as PostgreSQL folds them: unquoted ASCII letters lowered, then 63 bytes kept.
    ("WITH W AS (SELECT * FROM adult WHERE age > 32) SELECT COUNT(*) AS \"N\" FROM w",
     "SELECT COUNT(*) AS \"N\" FROM adult WHERE age > 32"),
    ("WITH " + "c" * 63 + "x AS (SELECT * FROM adult WHERE age > 32) SELECT COUNT(*) AS \"N\" FROM " + "c" * 63 + "y",
     "SELECT COUNT(*) AS \"N\" FROM adult WHERE age > 32"),
    ("WITH \"w\"\"x\" AS NOT MATERIALIZED (SELECT * FROM public.adult WHERE age > 32) "
     "SELECT COUNT(*) AS \"N\" FROM \"w\"\"x\" AS \"a b\" WHERE \"a b\".age < 60",
     "SELECT COUNT(*) AS \"N\" FROM adult WHERE age > 32 AND age < 60"),
    ("WITH w AS (SELECT * FROM adult WHERE age > 32) SELECT sex, COUNT(*) AS \"É\" FROM w GROUP BY sex",
     "SELECT sex, COUNT(*) AS \"É\" FROM adult WHERE age > 32 GROUP BY sex"),  # a histogram
], ids=["case-folding", "63-byte-truncation", "quoted-names", "histogram"])
def test_a_cte_is_described_and_repeated_as_the_flat_statement(proxy: RunningProxy, sql: str, flat: str) -> None:
    with proxy.connect() as conn:
        cur = conn.execute(sql)
        described = [(column.name, column.type_code) for column in cur.description]
        answer = cur.fetchall()
        before = _spent(proxy)
        cur = conn.execute(flat, prepare=True)  # the extended protocol's Describe, a free repeat
        assert [(column.name, column.type_code) for column in cur.description] == described
        assert cur.fetchall() == answer
        with conn.cursor().copy(f"COPY ({sql}) TO STDOUT") as copy:
            assert b"".join(bytes(block) for block in copy).count(b"\n") == len(answer)
        assert _spent(proxy) == before


@pytest.mark.parametrize(("sql", "sqlstate"), [
    ("WITH adult AS (SELECT * FROM adult WHERE age > 30) SELECT COUNT(*) FROM adult", "42501"),  # cte-shadowing
    ("WITH lookup AS (SELECT * FROM adult) SELECT COUNT(*) FROM lookup", "42501"),
    ("WITH \"Adult\" AS (SELECT * FROM adult WHERE age > 30) SELECT COUNT(*) FROM Adult", "DP001"),  # adult, unread CTE
    ("WITH \"W\" AS (SELECT * FROM adult WHERE age > 30) SELECT COUNT(*) FROM W", "42P01"),  # as in PostgreSQL
    ("WITH w AS (SELECT * FROM adult WHERE age > 30) SELECT COUNT(*) FROM public.w", "42P01"),
    ("WITH d AS (DELETE FROM adult RETURNING *) SELECT COUNT(*) FROM d", "25006"),
    ("WITH d AS (INSERT INTO lookup VALUES ('x', 'y') RETURNING *) SELECT COUNT(*) FROM adult", "25006"),
    ("WITH w AS (SELECT * FROM adult WHERE age > 30) SELECT COUNT(*) FROM w, lookup", "DP001"),
    ("WITH w AS (SELECT * FROM adult WHERE age > 30) SELECT COUNT(*) FROM lookup WHERE EXISTS (SELECT 1 FROM w)",
     "DP001"),
    ("WITH c AS (SELECT relname FROM pg_class) SELECT COUNT(*) FROM adult WHERE sex IN (SELECT relname FROM c)", "DP001"),
    ("WITH w AS (SELECT * FROM adult WHERE age > 30) SELECT COUNT(*) FILTER (WHERE age IN (SELECT 1)) FROM w", "DP001"),
    ("WITH w AS (SELECT * FROM adult WHERE age > 30 UNION ALL SELECT * FROM adult) SELECT COUNT(*) FROM w", "DP001"),
    ("WITH v AS (VALUES (1)), w AS (SELECT * FROM adult) SELECT COUNT(*) FROM w", "DP001"),
    ("WITH w AS (SELECT * FROM adult WHERE age > 30) SELECT COUNT(*) FROM w()", "DP001"),
    ("WITH r AS (SELECT sex AS s FROM adult GROUP BY sex ORDER BY COUNT(*) DESC LIMIT 1) "
     "SELECT sex, COUNT(*) FROM adult JOIN r ON sex = s GROUP BY sex", "DP001"),  # a series limit through a CTE
    ("SELECT (WITH w AS (SELECT * FROM adult WHERE age > 30) SELECT COUNT(*) FROM w)", "DP001"),
])
def test_probes_of_names_scopes_and_mixed_relations_stay_refused(proxy: RunningProxy, sql: str, sqlstate: str) -> None:
    with proxy.connect() as conn:
        before = _spent(proxy)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql)
        assert refused.value.sqlstate == sqlstate, refused.value
        assert _spent(proxy) == before


def test_a_cte_over_pg_class_reads_the_neutralised_catalog(proxy: RunningProxy) -> None:
    with proxy.connect() as conn:
        for sql in ("WITH c AS (SELECT reltuples, relname FROM pg_catalog.pg_class) SELECT reltuples FROM c",
                    "WITH pg_class AS (SELECT * FROM \"pg_class\") SELECT reltuples, relname FROM pg_class",
                    "WITH c AS MATERIALIZED (SELECT * FROM PG_CATALOG.PG_CLASS) SELECT (SELECT reltuples FROM c LIMIT 1)"):
            sql += " WHERE relname = 'adult'" if "LIMIT" not in sql else ""
            assert conn.execute(sql).fetchone()[0] == -1, sql
