"""Stop 45, the round-trip check's findings with bound parameters (tests/round_trip_parameters.py over
tests/parameter_generator.py): statements dpproxy answered for another reading than PostgreSQL's of
the prepared statement with its declared types, each refused before any charge now
(proxy/dp/parameter_types.py), and one it failed where PostgreSQL answers.

* A parameter compared with a numeric column and declared with a type PostgreSQL does not compare
  with numeric in numeric: the rewriter casts it to numeric (so that no row's value is converted), so
  ``n = $1`` declared text, which PostgreSQL fails (42883, whatever the rows), was answered and charged,
  and declared double precision it compared the parameter rounded to 15 digits in numeric where
  PostgreSQL compares every value converted to double precision: bound to 4.500000000000001,
  ``n = $1`` holds for no row of 4.5 to PostgreSQL and held for every one to dpproxy (rule
  ``numeric-parameter``).
* An IN list of parameters declared with types that change the list's common type: ``d IN ($1, $2)``
  on a date column with ``$1`` unspecified and ``$2`` declared timestamp reads ``$1`` as a timestamp to
  PostgreSQL and as a date to dpproxy's ``d = $1 OR d = $2``: ``'2000-05-01 11:59:59.999999'`` chose
  the 2000-05-01 rows to dpproxy only; ``c NOT IN ($1, $2)`` on a ``char(3)`` column, both declared
  text, compares as text to PostgreSQL (``'ab '`` is not the row's ``'ab'``) and as bpchar in each
  ``c = $k`` (it is) (rule ``in-list-parameter-types``).
* A parameter declared ``unknown`` (705) whose expression dpproxy folds (``i = $1 % 7``): the backend
  SQL no longer mentions it, and was sent with the type unknown, which PostgreSQL cannot resolve
  (42P18, uncharged) where it answers the analyst's statement. Its type is now described first, as an
  unspecified one's was.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import psycopg
import pytest
from psycopg import pq

from tests.conftest import TEST_POLICY, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.round_trip import TABLE_DDL, TABLE_POLICY, rows_sql

_TEXT, _UNKNOWN, _INT2, _INT4, _INT8, _NUMERIC, _FLOAT8, _BPCHAR, _TIMESTAMP = 25, 705, 21, 23, 20, 1700, 701, 1042, 1114


@pytest.fixture(scope="module")
def rt_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over the round-trip table (tests/round_trip.py)."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS rt")
        conn.execute(f"CREATE TABLE rt ({TABLE_DDL})")
        conn.execute(rows_sql())
        conn.execute("GRANT SELECT ON rt TO dpproxy_service")
    policy = TEST_POLICY + TABLE_POLICY.replace("{", "{{").replace("}", "}}")
    with running_proxy(test_db, tmp_path_factory, policy) as running:
        yield running


def _run(conn: psycopg.Connection, sql: str, values: Sequence[bytes | None], types: Sequence[int]) -> tuple[str | None, str]:
    """(SQLSTATE or None, the first value or the error's message) of ``sql`` prepared with ``types``."""
    result = conn.pgconn.exec_params(sql.encode(), list(values), list(types))
    if result.status != pq.ExecStatus.TUPLES_OK:
        state = result.error_field(pq.DiagnosticField.SQLSTATE)
        return (state.decode() if state else "?"), (result.error_message or b"").decode()
    value = result.get_value(0, 0)
    return None, value.decode() if value is not None else ""


def _refused(proxy: RunningProxy, sql: str, values: Sequence[bytes | None], types: Sequence[int], rule: str) -> None:
    with proxy.connect(autocommit=True) as conn:
        spent = spent_epsilon(conn)
        state, message = _run(conn, sql, values, types)
        assert (state, f"(rule: {rule})" in message) == ("0A000", True), (state, message)
        assert spent_epsilon(conn) == spent


@pytest.mark.parametrize(("sql", "values", "types", "postgresql"), [
    ("SELECT count(*) FROM rt WHERE n = $1", [b"4.5"], [_TEXT], "42883"),
    ("SELECT count(*) FROM rt WHERE i >= 0 AND ($1 = n)", [b"99999999.995"], [_TEXT], "42883"),
    ("SELECT count(*) FILTER (WHERE n IN ($1, $2)) FROM rt", [b"-0.005", b"1e-3"], [_TEXT, _FLOAT8], "42883"),
    ("SELECT count(*) FROM rt WHERE n = $1", [b"4.500000000000001"], [_FLOAT8], "0"),
    ("SELECT count(*) FROM rt WHERE n >= $1", [b"4.500000000000001"], [_FLOAT8], "16"),
    ("SELECT count(*) FROM rt WHERE n = $1", [b"0.10000000000000002"], [_FLOAT8], "0"),  # 0.1 holds to the cast
    ("SELECT count(*) FROM rt WHERE n NOT BETWEEN $1 AND $2", [b"NaN", b"-0.005"], [0, 1043], "42883"),
])
def test_a_parameter_postgresql_compares_with_a_numeric_column_otherwise_is_refused_before_any_charge(
        rt_proxy: RunningProxy, test_db: TestDatabase, sql: str, values: list[bytes], types: list[int],
        postgresql: str) -> None:
    # dpproxy cast the parameter to numeric and answered: n = $1 declared text, which PostgreSQL
    # fails, and declared float8, which it compares in double precision (another row count).
    with psycopg.connect(test_db.admin_dsn) as admin:
        state, value = _run(admin, sql, values, types)
        assert (state or value) == postgresql
    _refused(rt_proxy, sql, values, types, "numeric-parameter")


@pytest.mark.parametrize(("sql", "values", "types"), [
    ("SELECT count(*) FROM rt WHERE n = $1 AND i > $2", [b"4.5", b"0"], [0, _INT4]),
    ("SELECT count(*) FROM rt WHERE n BETWEEN $1 AND $2", [b"4.5", b"5"], [_NUMERIC, _INT8]),
    ("SELECT count(*) FROM rt WHERE n IN ($1, $2)", [b"4.5", b"5"], [_UNKNOWN, _INT2]),
    # numeric(10, 2): a double precision of at most 15 digits compares alike in double precision and in numeric
    ("SELECT count(*) FROM rt WHERE n >= $1", [b"4.5"], [_FLOAT8]),
    ("SELECT count(*) FROM rt WHERE n < $1", [b"NaN"], [_FLOAT8]),
])
def test_a_numeric_integer_or_unspecified_parameter_beside_a_numeric_column_is_answered(
        rt_proxy: RunningProxy, sql: str, values: list[bytes], types: list[int]) -> None:
    with rt_proxy.connect(autocommit=True) as conn:
        state, message = _run(conn, sql, values, types)
        assert state is None, message


@pytest.mark.parametrize(("sql", "values", "types"), [
    ("SELECT count(*) FILTER (WHERE d IN ($1, $2)) FROM rt", [b"2000-05-01 11:59:59.999999", b"infinity"], [0, _TIMESTAMP]),
    ("SELECT count(*) FROM rt WHERE d IN ($1, '2000-05-01 12:00')", [b"2000-05-02"], [_TIMESTAMP]),
    ("SELECT count(*) FROM rt WHERE d IN ($1, timestamp '2000-05-01 12:00')", [b"2000-05-01 11:00"], [0]),
    ("SELECT count(*) FROM rt WHERE i IN ($1, $2)", [b"5", b"5.5"], [_INT4, _FLOAT8]),
    # (DPPROXY_FUZZ_SEED=2) bpchar beside another string type: each = compares as bpchar, the list as text
    ("SELECT count(*) FILTER (WHERE v IN ($1, $1)) FROM rt", [b"ab "], [_BPCHAR]),
    ("SELECT count(*) FROM rt WHERE c NOT IN ($1, $2)", [b"ab ", b"abc"], [_TEXT, _TEXT]),
])
def test_an_in_list_whose_parameters_types_change_its_common_type_is_refused_before_any_charge(
        rt_proxy: RunningProxy, test_db: TestDatabase, sql: str, values: list[bytes], types: list[int]) -> None:
    # PostgreSQL reads the list in its values' common type, which the declared types change;
    # dpproxy's d = $1 OR d = $2 read $1 as a date: the first chose the 2000-05-01 rows to dpproxy only.
    with psycopg.connect(test_db.admin_dsn) as admin:
        assert _run(admin, sql, values, types)[0] is None
    # a typed value not of the column's type is refused by its written type already, at Parse
    rule = "in-list-types" if "timestamp '" in sql else "in-list-parameter-types"
    _refused(rt_proxy, sql, values, types, rule)


@pytest.mark.parametrize(("sql", "values", "types"), [
    ("SELECT count(*) FROM rt WHERE d IN ($1, $2)", [b"2000-05-01", b"2000-05-02"], [0, _UNKNOWN]),
    ("SELECT count(*) FROM rt WHERE d IN ($1, $2)", [b"2000-05-01", b"2000-05-02 12:00"], [_TIMESTAMP, _TIMESTAMP]),
    ("SELECT count(*) FROM rt WHERE i IN ($1, $2, 7)", [b"5", b"100000"], [_INT2, _INT4]),
    ("SELECT count(*) FROM rt WHERE t IN ($1, $2, 'b')", [b"a", b"ab"], [0, 0]),
    ("SELECT count(*) FROM rt WHERE t IN ($1, $2)", [b"a", b"ab"], [_TEXT, _TEXT]),
    ("SELECT count(*) FROM rt WHERE c IN ($1, $2)", [b"a", b"ab "], [_BPCHAR, _BPCHAR]),
    ("SELECT count(*) FROM rt WHERE c IN ($1, $2)", [b"a", b"ab "], [0, 0]),
])
def test_an_in_list_of_parameters_of_one_type_is_answered(
        rt_proxy: RunningProxy, sql: str, values: list[bytes], types: list[int]) -> None:
    with rt_proxy.connect(autocommit=True) as conn:
        state, message = _run(conn, sql, values, types)
        assert state is None, message


@pytest.mark.parametrize(("sql", "values"), [
    ("SELECT count(*) FROM rt WHERE i = $1 % 7", [b"0"]),
    ("SELECT count(*) FILTER (WHERE n = $1 + 0.5) FROM rt", [b".5"]),
    ("SELECT count(*) FROM rt WHERE d >= $1::timestamptz", [b"infinity"]),
])
def test_a_folded_parameter_declared_unknown_is_answered_as_postgresql_answers(
        rt_proxy: RunningProxy, test_db: TestDatabase, sql: str, values: list[bytes]) -> None:
    # Its value folded, the backend SQL no longer read it: sent declared unknown, 42P18.
    with psycopg.connect(test_db.admin_dsn) as admin:
        assert _run(admin, sql, values, [_UNKNOWN])[0] is None
    with rt_proxy.connect(autocommit=True) as conn:
        state, message = _run(conn, sql, values, [_UNKNOWN])
        assert state is None, message


@pytest.mark.parametrize(("sql", "rule"), [
    ("SELECT count(*) FROM rt WHERE n < round(floor(5), 1)", "round-cast"),
    ("SELECT count(*) FILTER (WHERE n > round(round(5), 1)) FROM rt", "round-cast"),
    ("SELECT count(*), round(pi(), 2) FROM rt", "round-cast"),
    ("SELECT round(sum(f)::float8, 2) FROM rt", None),
    ("SELECT round(round(count(*) * 100) / 100, 2) AS x FROM rt", None),
    ("SELECT round(ceil(count(i)), 1), count(*) FROM rt", None),
])
def test_round_of_a_double_precision_fails_as_postgresql_before_any_charge(
        rt_proxy: RunningProxy, test_db: TestDatabase, sql: str, rule: str | None) -> None:
    # PostgreSQL has round(numeric, integer) only: round(5), ceil(count(*)) and sum of a float
    # column are double precision, and it fails (42883) whatever the rows; sqlglot wrote
    # round(CAST(x AS numeric), n), answered and charged (found by the round-trip check of outputs).
    # Of a constant it is refused with PostgreSQL's own 42883 (rule round-cast, wherever it stands:
    # round(pi(), 2) beside an aggregate was 0A000); over released aggregates post-processing writes it
    # as the analyst did, and the backend fails it with PostgreSQL's own 42883, uncharged.
    with psycopg.connect(test_db.admin_dsn) as admin:
        assert _run(admin, sql, [], [])[0] == "42883"
    if rule is not None:
        with rt_proxy.connect(autocommit=True) as conn:
            spent = spent_epsilon(conn)
            state, message = _run(conn, sql, [], [])
            assert (state, f"(rule: {rule})" in message, spent_epsilon(conn)) == ("42883", True, spent), message
        return
    with rt_proxy.connect(autocommit=True) as conn:
        spent = spent_epsilon(conn)
        assert _run(conn, sql, [], [])[0] == "42883"
        assert spent_epsilon(conn) == spent


@pytest.mark.parametrize("sql", [
    "SELECT round(avg(i), 2), round(sum(n), 1), round(count(*), 2), round(ceil(avg(n)), 2) FROM rt",
    "SELECT round(sum(f)::numeric, 2) FROM rt",
    "SELECT count(*) FROM rt WHERE n < round(floor(5.5), 1)",
])
def test_round_of_a_numeric_or_integer_is_answered(rt_proxy: RunningProxy, sql: str) -> None:
    with rt_proxy.connect(autocommit=True) as conn:
        state, message = _run(conn, sql, [], [])
        assert state is None, message
