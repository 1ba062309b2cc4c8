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
      sex: {{categories: [Male, Female]}}
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
