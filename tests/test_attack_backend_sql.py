"""What the backend SQL audit (tests/backend_sql_audit.py) found, attacked on neighbouring tables.

Each probe runs one statement on ``ab0`` and on neighbours that each add one row, and asserts
what an analyst sees (outcome, SQLSTATE, columns, notices with numbers masked) is the same on
all of them, and that an error is not charged.

Found and fixed: a bigint column compared with a parameter the client declared as ``oid`` (or
``regclass`` ...), or with an ``oid`` column, made PostgreSQL convert every row's value to
``oid``, which fails with "OID out of range" only on a row holding a negative or too large
value (privacy); two columns of types with no operator between them (``integer < text``)
were charged and then failed with 42883 (budget), as was a column compared with a constant of a
type it has no operator for (``s <> FALSE``, ``ts > 5``): the pre-charge parse check ran only
for predicates holding a quoted literal or parameters; such comparisons are now refused from
the text (``rewriter/predicates.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours

_DDL = "(id int8, v int4, s text, o oid, m money, e ab_mood)"
_BASE_ROWS = "SELECT g, g % 50, 'a', g::oid, g::numeric::money, 'sad' FROM generate_series(1, 200) g"
_NEIGHBOURS = {
    "ab1": "(-1, 1, 'a', 1, '-92233720368547758.08', 'happy')",
    "ab2": "(9223372036854775807, 1, 'a', 4294967295, '92233720368547758.07', NULL)",
}
_POLICY = ATTACK_POLICY_HEAD + """
  public.ab0: &T
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      v: {{bounds: [0, 100]}}
""" + "".join(f"  public.{name}: *T\n" for name in _NEIGHBOURS)

_OID, _REGCLASS = 26, 2205


@pytest.fixture(scope="module")
def audit_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS ab0, ab1, ab2")
        admin.execute("DROP TYPE IF EXISTS ab_mood")
        admin.execute("CREATE TYPE ab_mood AS ENUM ('sad', 'happy')")
    create_neighbours(test_db.admin_dsn, "ab0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _same_on_neighbours(conn: psycopg.Connection, sql: str, values: list[bytes], types: list[int]) -> tuple[object, ...]:
    """The one outcome ``sql`` has on ``ab0`` and every neighbour, none of them charged unless answered."""
    outcomes = {}
    for table in ("ab0", *_NEIGHBOURS):
        before = spent_epsilon(conn)
        outcomes[table] = _outcome(conn, sql, table, values, types)
        assert outcomes[table][0] == "answer" or spent_epsilon(conn) == before, (table, outcomes[table])
    assert len(set(outcomes.values())) == 1, outcomes
    return outcomes["ab0"]


def _outcome(conn: psycopg.Connection, sql: str, table: str, values: list[bytes], types: list[int]) -> tuple[object, ...]:
    """``sql`` on ``table`` through the extended protocol with parameters of declared ``types``."""
    result = conn.pgconn.exec_params(sql.replace("{t}", table).encode(), values, types)
    if result.status == psycopg.pq.ExecStatus.TUPLES_OK:
        return ("answer", result.nfields, result.ntuples)
    return ("error", result.error_field(psycopg.pq.DiagnosticField.SQLSTATE))


@pytest.mark.parametrize("param_type", [_OID, _REGCLASS])
def test_a_bigint_compared_with_an_oid_parameter_is_not_an_oracle(audit_proxy: RunningProxy, param_type: int) -> None:
    with audit_proxy.connect() as conn:
        assert _same_on_neighbours(conn, "SELECT COUNT(*) FROM {t} WHERE id = $1", [b"5"], [param_type]) == (
            "error", b"DP001")


@pytest.mark.parametrize("predicate", ["id = o", "o <> id", "v < s", "s >= id"])
def test_two_columns_that_postgresql_would_convert_or_cannot_compare_are_refused_uncharged(
        audit_proxy: RunningProxy, predicate: str) -> None:
    with audit_proxy.connect() as conn:
        assert _same_on_neighbours(conn, f"SELECT COUNT(*) FROM {{t}} WHERE {predicate}", [], []) == ("error", b"DP001")


@pytest.mark.parametrize("predicate", ["s <> FALSE", "v = TRUE", "s > 5", "s = 1e400", "m > 0.5", "e > 0", "e = TRUE",
                                       "e = CAST('sad' AS text)"])
def test_a_column_compared_with_a_constant_it_has_no_operator_for_is_refused_uncharged(
        audit_proxy: RunningProxy, predicate: str) -> None:
    with audit_proxy.connect() as conn:
        assert _same_on_neighbours(conn, f"SELECT COUNT(*) FROM {{t}} WHERE {predicate}", [], [])[0] == "error"


@pytest.mark.parametrize("predicate", ["id = v", "v < id", "s = s", "id <> o::int8", "o = 5", "m > '0.5'", "e = 'sad'"])
def test_two_columns_of_one_family_are_compared(audit_proxy: RunningProxy, predicate: str) -> None:
    with audit_proxy.connect() as conn:
        outcome = _same_on_neighbours(conn, f"SELECT COUNT(*) FROM {{t}} WHERE {predicate}", [], [])
        assert outcome == (("error", b"DP001") if "::" in predicate else ("answer", 1, 1))


def test_a_bigint_compared_with_a_bigint_parameter_is_answered(audit_proxy: RunningProxy) -> None:
    with audit_proxy.connect() as conn:
        assert _outcome(conn, "SELECT COUNT(*) FROM {t} WHERE id = $1", "ab1", [b"5"], [20]) == ("answer", 1, 1)
        assert _outcome(conn, "SELECT COUNT(*) FROM {t} WHERE id = $1", "ab1", [b"5"], [0]) == ("answer", 1, 1)
