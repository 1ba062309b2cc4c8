"""Statements on a protected table whose outcome was not PostgreSQL's, though nothing leaked (each was
refused or failed before any charge, or answered with the value PostgreSQL computes): dpproxy now
answers what PostgreSQL answers and fails as PostgreSQL fails.

* An IN list with a typed value beside untyped strings, ``d IN (date '2000-05-01', '2000-05-02')``,
  was refused (rule ``in-list-types``); where every typed value has the column's own type PostgreSQL
  compares the list in that type, as dpproxy's ``d = a OR d = b`` does, and it is answered. A list
  typed otherwise than its column is refused, a list of one such type too: ``v IN ('ab'::char(3),
  'a'::char(3))`` on a varchar column was answered for ``v = 'ab'::char(3) OR ...``, which counts the
  row holding ``'ab '`` PostgreSQL's list does not.
* ``round(x, n)`` of a double precision over a released aggregate (``round(avg(i)::float8, 2)``):
  PostgreSQL has no ``round(double precision, integer)`` (42883); sqlglot's rendering cast ``x`` to
  numeric, and dpproxy answered. It fails as PostgreSQL's now, uncharged.
* A name no column has, within an ORDER BY expression or a GROUP BY's output (``ORDER BY nosuch +
  0``): 42803 or DP001 where PostgreSQL's is 42703, which it is now.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import TEST_POLICY, RunningProxy, TestDatabase, refused_uncharged, running_proxy, spent_epsilon

_TABLE = "pgo_values"
_POLICY = TEST_POLICY + (
    f"  public.{_TABLE}: {{{{access: protected, epsilon: 1.0, delta: 1.0e-6, columns: {{{{i: {{{{bounds: [0, 100]}}}}, "
    "t: {{categories: [a, b], group_by: true}}, d: {{bounds: [2000-01-01, 2000-12-31]}}, f: {{bounds: [-1, 1]}}}}}}\n")
# Values on which the readings differ: trailing blanks (text and varchar keep them, char does not
# count them), an integer a double precision rounds a numeric to (16777217.0000000001 is 16777217).
_ROWS = [("ab", "ab", "ab", "2000-05-01", 1), ("ab ", "ab ", "ab ", "2000-05-02", 16777217), ("a", "a", "a", "2000-05-03", 2),
         ("b", "b", "b", "2000-01-01", 3), ("", "", "", "2000-12-31", 0)]


@pytest.fixture(scope="module")
def outcomes_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over ``pgo_values`` (t text, v varchar(8), c char(3), d date, i int4, f float8)."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP TABLE IF EXISTS {_TABLE}")
        admin.execute(f"CREATE TABLE {_TABLE} (t text, v varchar(8), c char(3), d date, i int4, f float8)")
        with admin.cursor() as cursor:
            cursor.executemany(f"INSERT INTO {_TABLE} SELECT %s, %s, %s, %s::date, %s, 0.5 FROM generate_series(1, 3)",
                               _ROWS)
        admin.execute(f"GRANT SELECT ON {_TABLE} TO dpproxy_service")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _rows(test_db: TestDatabase, condition: str) -> int:
    """How many rows of the table PostgreSQL's own reading of ``condition`` keeps."""
    with psycopg.connect(test_db.admin_dsn) as admin:
        return int(admin.execute(f"SELECT count(*) FROM {_TABLE} WHERE {condition}").fetchone()[0])


def _expanded(condition: str) -> str:
    """``x IN (a, b)`` as dpproxy writes it: ``(x = a OR x = b)`` (a list of plain values only)."""
    column, values = condition.split(" IN (")
    return "(" + " OR ".join(f"{column} = {value}" for value in values.removesuffix(")").split(", ")) + ")"


def _postgresql_error(test_db: TestDatabase, sql: str) -> psycopg.Error:
    with psycopg.connect(test_db.admin_dsn) as admin, pytest.raises(psycopg.Error) as failed:
        admin.execute(sql)
    return failed.value


@pytest.mark.parametrize("condition", [
    "d IN (date '2000-05-01', '2000-05-02')",
    "d IN ('2000-05-01'::pg_catalog.date, '2000-05-03', date '2000-01-01')",
    "v IN ('ab '::varchar(2), 'a')",
    "c IN ('ab'::char(1), 'ab ')",
    "t IN ('ab'::char(3), 'a'::varchar, 'b')",  # text: the list's common type, and text = char's own
    "v IN ('ab '::text, 'a')",  # varchar with text: compared as text both ways
    "c IN ('ab '::varchar, 'a')",  # char with varchar (SQLAlchemy's x IN ($1::VARCHAR)): as char both ways
    "lower(t) IN ('ab'::text, 'a')",
    "i IN (1::int2, 16777217::int8, 2.5::numeric, 3)",  # integers and numeric: exact values both ways
])
def test_an_in_list_typed_as_its_column_is_answered_as_postgresql_compares_it(
        outcomes_proxy: RunningProxy, test_db: TestDatabase, condition: str) -> None:
    # PostgreSQL's own readings of the list and of dpproxy's ORs keep the same rows here ...
    assert _rows(test_db, condition) == _rows(test_db, _expanded(condition))
    # ... and dpproxy answers, charged (it refused the typed value beside untyped strings: in-list-types).
    with outcomes_proxy.connect(autocommit=True) as conn:
        spent = spent_epsilon(conn)
        assert conn.execute(f"SELECT count(*) FROM {_TABLE} WHERE {condition}").fetchone() is not None
        assert spent_epsilon(conn) > spent


@pytest.mark.parametrize("condition", [
    "v IN ('ab'::char(3), 'a'::char(3))",  # one type, but not the column's: was answered, for other rows
    "v IN ('ab'::char(3), 'a')",
    "v IN ('ab'::char(3), 'a'::text)",
    "i IN (16777217.0000000001::numeric, 5::float8)",  # as double precision in the list, as numeric alone
])
def test_an_in_list_typed_otherwise_than_its_column_is_refused_before_any_charge(
        outcomes_proxy: RunningProxy, test_db: TestDatabase, condition: str) -> None:
    # PostgreSQL compares the list in its common type, each of the ORs in its own: other rows
    assert _rows(test_db, condition) != _rows(test_db, _expanded(condition))
    error = refused_uncharged(outcomes_proxy, f"SELECT count(*) FROM {_TABLE} WHERE {condition}")
    assert (error.sqlstate, str(error.diag.message_primary).endswith("(rule: in-list-types)")) == ("0A000", True), \
        error.diag.message_primary
    assert "column's own type" in str(error.diag.message_hint), error.diag.message_hint


@pytest.mark.parametrize("output", ["round(avg(i)::float8, 2)", "round(count(*)::float8 / 3, 2)",
                                    "round(round(avg(i), 1)::float8, 2)", "round(avg(f), 2)"])
def test_round_of_a_double_precision_over_a_released_aggregate_fails_as_postgresql_uncharged(
        outcomes_proxy: RunningProxy, test_db: TestDatabase, output: str) -> None:
    # PostgreSQL has round(numeric, integer) only; sqlglot wrote ROUND(CAST(x AS DECIMAL), n), answered.
    sql = f"SELECT {output} FROM {_TABLE}"
    assert _postgresql_error(test_db, sql).sqlstate == "42883"
    error = refused_uncharged(outcomes_proxy, sql)
    assert error.sqlstate == "42883" and "round(double precision, integer) does not exist" in str(error), str(error)


@pytest.mark.parametrize("output", ["round(avg(i), 2)", "round(avg(f)::numeric, 1)", "round(avg(i) / 2.0, 2)",
                                    "round(avg(f))"])
def test_round_of_a_numeric_over_a_released_aggregate_is_answered(outcomes_proxy: RunningProxy, output: str) -> None:
    with outcomes_proxy.connect(autocommit=True) as conn:
        assert conn.execute(f"SELECT {output} FROM {_TABLE}").fetchone() is not None


@pytest.mark.parametrize("sql", [
    f"SELECT count(*) FROM {_TABLE} ORDER BY nosuch + 0",
    f"SELECT t, count(*) FROM {_TABLE} GROUP BY t ORDER BY nosuch + 0",  # was 42803
    f"SELECT t, count(*) FROM {_TABLE} GROUP BY t ORDER BY nosuch",
    f"SELECT nosuch, count(*) FROM {_TABLE}",  # was DP001
    f"SELECT nosuch + 1, count(*) FROM {_TABLE} GROUP BY t",
])
def test_a_name_no_column_has_fails_as_postgresql_uncharged(
        outcomes_proxy: RunningProxy, test_db: TestDatabase, sql: str) -> None:
    assert _postgresql_error(test_db, sql).sqlstate == "42703"
    error = refused_uncharged(outcomes_proxy, sql)
    assert error.sqlstate == "42703" and 'column "nosuch" does not exist' in str(error.diag.message_primary), str(error)


def test_a_column_of_the_table_outside_the_groups_is_still_a_grouping_error(
        outcomes_proxy: RunningProxy, test_db: TestDatabase) -> None:
    sql = f"SELECT t, count(*) FROM {_TABLE} GROUP BY t ORDER BY i + 0"
    assert _postgresql_error(test_db, sql).sqlstate == "42803"
    assert refused_uncharged(outcomes_proxy, sql).sqlstate == "42803"


@pytest.mark.parametrize(("condition", "sqlstate"), [
    # found at DPPROXY_FUZZ_SEED=7 (20,000 conditions): dpproxy's fold cast '20000501' - 7, an integer,
    # to date first (42846), where PostgreSQL transforms every value of the list before it compares
    ("d NOT IN (date '2000-05-01' + 1, '20000501' - 7, 'May 1, 2000' + 1, date '2000-05-01')", "22P02"),
    ("d NOT IN ('20000501' - 7, (E'2000\\05\\01')::date, CAST(date '2000-05-01' AS date))", "22007"),
    ("d IN ('20000501' - 7, date '2000-05-01')", "42883"),  # no operator date = integer
    ("d IN ('bad', current_date - 1)", "22007"),  # the untyped string, compared first
    ("d = '20000501' - 7", "42883"),
    ("d >= current_date - 1 AND d < '20000501' - 7", "42883"),
    # an untyped string in a list typed as its column, read as the column's type (in-list-types answers it)
    ("d IN (date '2000-05-01', 'nodate')", "22007"),
    ("i IN (1::int4, 'x')", "22P02"),
])
def test_a_condition_that_fails_fails_with_postgresqls_sqlstate_uncharged(
        outcomes_proxy: RunningProxy, test_db: TestDatabase, condition: str, sqlstate: str) -> None:
    sql = f"SELECT count(*) FROM {_TABLE} WHERE {condition}"
    assert _postgresql_error(test_db, sql).sqlstate == sqlstate
    assert refused_uncharged(outcomes_proxy, sql).sqlstate == sqlstate


@pytest.mark.parametrize("condition", ["d IN (current_date, current_date - 1, '2000-05-01')",
                                       "i IN ('2' + 1, 5)", "d NOT IN (date '2000-05-01' + 1, '2000-05-01')",
                                       "d >= current_date - 365 AND i IN (2 * 2, 1)"])
def test_a_list_of_computed_values_postgresql_answers_is_answered(outcomes_proxy: RunningProxy, condition: str) -> None:
    with outcomes_proxy.connect(autocommit=True) as conn:
        assert conn.execute(f"SELECT count(*) FROM {_TABLE} WHERE {condition}").fetchone() is not None
