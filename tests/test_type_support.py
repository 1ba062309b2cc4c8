"""A statement that fails on every table because of its column's type is refused before its charge.

``count(DISTINCT col)`` needs an ordering of the column's type, MODE and a category key an
equality with the labels: on ``json``, ``point``, ``box`` ... PostgreSQL has none, and the
statement failed on the backend after ε was charged (found by tests/test_type_matrix.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import (
    ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy, refused_at_load, running_proxy, spent_epsilon,
)

_TABLE = "  public.typed_probe: {{access: protected, epsilon: 1.0, columns: {{t: {{categories: [a, b], group_by: true}}}}}}\n"


@pytest.fixture(scope="module")
def typed_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS typed_probe")
        conn.execute("CREATE TABLE typed_probe (t text, j json, b box, p point[], x xid)")
        conn.execute("INSERT INTO typed_probe VALUES ('a', '{}', '((0,0),(1,1))', '{\"(0,0)\"}', '1')")
        conn.execute("GRANT SELECT ON typed_probe TO dpproxy_service")
    with running_proxy(test_db, tmp_path_factory, ATTACK_POLICY_HEAD + _TABLE) as running:
        yield running


@pytest.mark.parametrize("column", ["j", "b", "p", "x"])
def test_count_distinct_of_a_type_postgresql_cannot_sort_is_refused_before_the_charge(typed_proxy, column: str) -> None:
    with typed_proxy.connect(connect_timeout=10) as conn:
        before = spent_epsilon(conn)
        for sql in (f"SELECT COUNT(DISTINCT {column}) FROM typed_probe",
                    f"SELECT t, COUNT(DISTINCT {column}) FROM typed_probe GROUP BY t"):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(sql)
            assert refused.value.sqlstate == "DP001" and "rule: aggregate-argument" in str(refused.value)
            assert refused.value.diag.message_hint
        assert spent_epsilon(conn) == before
        assert conn.execute(f"SELECT COUNT({column}), COUNT(DISTINCT t) FROM typed_probe").fetchall()


def test_categories_on_a_type_without_an_equality_are_a_policy_error(test_db: TestDatabase, tmp_path) -> None:
    table = "  public.typed_probe: {{access: protected, epsilon: 1.0, columns: {{j: {{categories: ['{{}}', '[]']}}}}}}\n"
    policy = make_policy(test_db, tmp_path / "ledger.sqlite3", ATTACK_POLICY_HEAD + table)
    (problem,) = refused_at_load(policy)
    assert problem.startswith("tables.public.typed_probe.columns.j: categories need a type PostgreSQL can compare")
    assert "json" in problem
