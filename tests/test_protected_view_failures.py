"""A protected view (or row-level security policy) that computes something that can fail on a row.

Found: a policy could protect a view such as ``SELECT id, income / hours AS hourly FROM t``. The
backend computes a view's expressions on the rows it reads, so ``SELECT SUM(hourly) FROM v WHERE
id = 7`` failed exactly when row 7 held hours 0, and every accepted statement on the view was an
exact error oracle, whatever the noise. Such a policy is now refused at start, reload and
``check-config`` (proxy.backend.row_failures, which reads the backend's stored parse trees), and a
view redefined so while dpproxy runs is refused before the charge until it is total again.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy, refused_at_load, running_proxy

_POLICY = ATTACK_POLICY_HEAD + """\
  public.rf_view:
    access: protected
    epsilon: 1.0
    columns:
      id: {{bounds: [0, 1000]}}
"""
_TOTAL = "SELECT id, hours FROM rf_base"
_HOURLY_POLICY = _POLICY + "      hourly: {{bounds: [0, 1000]}}\n"


@contextmanager
def _base(test_db: TestDatabase, view: str = _TOTAL, *setup: str) -> Iterator[psycopg.Connection]:
    """rf_base (id, hours, income, note; row 7 has hours 0) and the view rf_view over it."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS rf_base CASCADE")
        admin.execute("CREATE TABLE rf_base AS SELECT g AS id, CASE WHEN g = 7 THEN 0 ELSE g % 5 + 1 END AS hours, "
                      "g * 10 AS income, g::text AS note FROM generate_series(1, 200) g")
        for statement in setup:
            admin.execute(statement)
        admin.execute(f"CREATE VIEW rf_view AS {view}")
        admin.execute("GRANT SELECT ON rf_base, rf_view TO dpproxy_service")
        try:
            yield admin
        finally:
            admin.execute("DROP TABLE IF EXISTS rf_base CASCADE")
            admin.execute("DROP FUNCTION IF EXISTS rf_half(integer)")
            admin.execute("DROP TYPE IF EXISTS rf_pair")
            admin.execute("DROP SCHEMA IF EXISTS rf_own CASCADE")


_FAILING_VIEWS = [
    ("SELECT id, income / hours AS hourly FROM rf_base", "int4div(integer, integer)"),
    ("SELECT id, income + hours AS total FROM rf_base", "int4pl(integer, integer)"),  # overflows
    ("SELECT id, abs(hours) AS h FROM rf_base", "abs(integer)"),  # abs of the minimum overflows
    ("SELECT id, note::int AS n FROM rf_base", "a cast through text"),
    ("SELECT id FROM rf_base WHERE note LIKE '1%'", "textlike(text, text)"),
    ("SELECT id, lower(note) AS l FROM rf_base", "lower(text)"),  # fails on a 256 MB value where LC_CTYPE is not C
    ("SELECT id, (SELECT b.id FROM rf_base b WHERE b.hours = rf_base.hours) AS twin FROM rf_base",
     "a scalar subquery"),
    ("SELECT id FROM rf_base WHERE 100 / hours > 1", "int4div(integer, integer)"),
    ("SELECT id, rf_half(hours) AS h FROM rf_base", "rf_half(integer)"),  # a body dpproxy cannot read
    # A wait per row read (the post-charge wait tests/post_charge_wait.py cannot place this way).
    ("SELECT id FROM rf_base WHERE pg_advisory_xact_lock_shared(id) IS NOT NULL", "pg_advisory_xact_lock_shared(bigint)"),
    # ARRAY[ARRAY[...], ...] fails when the rows' inner arrays differ in size: refused whatever they hold.
    ("SELECT id, ARRAY[ARRAY[id], ARRAY[hours]] AS a FROM rf_base", "a multidimensional ARRAY[...]"),
    # Names the stored tree prints unquoted or escaped: a field's name, braces, a backslash, a quote.
    ('WITH ":opfuncid" AS (SELECT id AS "}{", hours FROM rf_base) SELECT "}{" AS id, hours AS "a\\", 1 / hours AS """x"'
     ' FROM ":opfuncid"', "int4div(integer, integer)"),
]
_FAILING_IDS = ["division", "addition", "abs", "text-cast", "like", "case-fold", "scalar-subquery", "where", "user-function",
                "advisory-lock", "multidimensional-array", "odd-names"]


@pytest.mark.parametrize(("view", "named"), _FAILING_VIEWS, ids=_FAILING_IDS)
def test_a_protected_view_computing_what_can_fail_on_a_row_is_refused_at_load(
    test_db: TestDatabase, tmp_path: Path, view: str, named: str
) -> None:
    function = "CREATE FUNCTION rf_half(integer) RETURNS integer LANGUAGE sql IMMUTABLE AS 'SELECT $1 / 2'"
    with _base(test_db, view, function):
        problems = refused_at_load(make_policy(test_db, tmp_path / "ledger.sqlite3", _POLICY))
    assert len(problems) == 1 and problems[0].startswith("tables.public.rf_view: view rf_view "), problems
    assert named in problems[0] and "materialized view" in problems[0], problems


def test_a_protected_view_computing_a_node_of_a_kind_the_check_does_not_know_is_refused_at_load(
    test_db: TestDatabase, tmp_path: Path
) -> None:
    # A cast to a domain runs its CHECK on each row the view reads (row 7's hours 0 fails it) and
    # calls no function: only the rule that a node of an unknown kind is a problem catches it.
    setup = ("CREATE SCHEMA rf_own", "CREATE DOMAIN rf_own.positive AS integer CHECK (VALUE > 0)")
    with _base(test_db, "SELECT id, hours::rf_own.positive AS h FROM rf_base", *setup):
        problems = refused_at_load(make_policy(test_db, tmp_path / "ledger.sqlite3", _POLICY))
    assert len(problems) == 1 and "coercetodomain" in problems[0], problems


def test_a_view_of_a_failing_view_and_a_failing_row_level_security_policy_are_refused_too(
    test_db: TestDatabase, tmp_path: Path
) -> None:
    policy = make_policy(test_db, tmp_path / "ledger.sqlite3", _POLICY)
    inner = "CREATE VIEW rf_inner AS SELECT id, income / hours AS hourly FROM rf_base"
    with _base(test_db, "SELECT id, hourly FROM rf_inner", inner) as admin:
        admin.execute("GRANT SELECT ON rf_inner TO dpproxy_service")
        (problem,) = refused_at_load(policy)
        assert "view rf_inner calls int4div(integer, integer)" in problem, problem
    rls = ("ALTER TABLE rf_base ENABLE ROW LEVEL SECURITY",
           "CREATE POLICY rf_some ON rf_base FOR SELECT USING (income / hours > 5)")
    with _base(test_db, _TOTAL, *rls):
        (problem,) = refused_at_load(policy)
        assert "row-level security policy rf_some on rf_base calls int4div(integer, integer)" in problem, problem


_TOTAL_VIEWS = [
    "SELECT id, hours AS h FROM rf_base",
    "SELECT id, note, GREATEST(hours, 2) AS g, COALESCE(hours, 0) AS c, hours::bigint AS b, "
    "hours::numeric AS n, id::text AS t, CASE WHEN hours > 2 THEN 'many' ELSE 'few' END AS k FROM rf_base "
    "WHERE id IN (1, 2, 3, 7) AND note <> 'x' AND hours IS NOT NULL "
    "AND EXISTS (SELECT 1 FROM rf_base b WHERE b.id = rf_base.id)",
    # max and sorts of a text computed from a fixed-length value: of the stored note, they would read
    # a value of any length whole (refused, tests/test_attack_stop42.py)
    "SELECT hours AS id, COUNT(*) AS rows, SUM(income) AS income, MAX(id::text) AS last FROM rf_base GROUP BY hours",
    "WITH c AS (SELECT DISTINCT id, hours, id::text AS note FROM rf_base ORDER BY note) SELECT id, count(*) OVER "
    "(ORDER BY hours RANGE BETWEEN 1 PRECEDING AND CURRENT ROW) AS near FROM c UNION SELECT 0, 0",
]
_TOTAL_IDS = ["rename", "comparisons-and-widening-casts", "per-person-aggregates", "sorts-and-integer-windows"]


@pytest.mark.parametrize("view", _TOTAL_VIEWS, ids=_TOTAL_IDS)
def test_a_protected_view_of_total_expressions_is_answered(
    test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, view: str
) -> None:
    with _base(test_db, view), running_proxy(test_db, tmp_path_factory, _POLICY) as proxy, proxy.connect() as conn:
        assert conn.execute("SELECT COUNT(*) FROM rf_view WHERE id > 2").fetchone() is not None


@pytest.mark.parametrize("view", _TOTAL_VIEWS, ids=_TOTAL_IDS)
def test_a_protected_view_of_total_expressions_is_answered_on_postgresql_17_and_18(
    newer_pg_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, view: str
) -> None:
    """Their stored parse trees carry fields and nodes 16's do not (18's ``varreturningtype``):
    the check reads them as it reads 16's."""
    test_a_protected_view_of_total_expressions_is_answered(newer_pg_db, tmp_path_factory, view)


@pytest.mark.parametrize(("view", "named"), _FAILING_VIEWS[:4], ids=_FAILING_IDS[:4])
def test_a_protected_view_computing_what_can_fail_on_a_row_is_refused_at_load_on_postgresql_17_and_18(
    newer_pg_db: TestDatabase, tmp_path: Path, view: str, named: str
) -> None:
    test_a_protected_view_computing_what_can_fail_on_a_row_is_refused_at_load(newer_pg_db, tmp_path, view, named)


def test_a_materialized_view_is_read_as_stored_so_its_division_ran_at_refresh(
    test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory
) -> None:
    policy = _POLICY.replace("public.rf_view:", "public.rf_stored:")
    with _base(test_db) as admin:
        admin.execute("CREATE MATERIALIZED VIEW rf_stored AS SELECT id, income / NULLIF(hours, 0) AS hourly FROM rf_base")
        admin.execute("GRANT SELECT ON rf_stored TO dpproxy_service")
        with running_proxy(test_db, tmp_path_factory, policy) as proxy, proxy.connect() as conn:
            assert conn.execute("SELECT COUNT(*) FROM rf_stored WHERE id = 7").fetchone() is not None


def _remaining(proxy: RunningProxy) -> float:
    return float(proxy._call(proxy.server.budget.balance("analyst")).remaining_epsilon)


def test_a_view_redefined_to_fail_on_a_row_is_refused_before_the_charge_until_it_is_total_again(
    test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the code before, ``SUM(hourly) ... WHERE id = 7`` failed (charged) and ``id = 8`` was
    answered: the error told row 7's hours exactly."""
    from proxy.serving import server

    monkeypatch.setattr(server, "FUNCTION_NAMES_REFRESH_S", 0.2)
    with _base(test_db, "SELECT id, hours AS hourly FROM rf_base") as admin, \
            running_proxy(test_db, tmp_path_factory, _HOURLY_POLICY) as proxy, proxy.connect() as conn:
        conn.execute("SELECT SUM(hourly) FROM rf_view WHERE id = 7")
        admin.execute("CREATE OR REPLACE VIEW rf_view AS SELECT id, income / hours AS hourly FROM rf_base")
        time.sleep(1.0)  # a few re-checks
        before = _remaining(proxy)
        for row in (7, 8):
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
                conn.execute(f"SELECT SUM(hourly) FROM rf_view WHERE id = {row}")
            assert "can fail on a row: view rf_view calls int4div(integer, integer) (rule: row-failure)" \
                in str(refused.value), str(refused.value)
            assert "materialized view" in (refused.value.diag.message_hint or "")
        assert _remaining(proxy) == before  # nothing charged

        admin.execute("CREATE OR REPLACE VIEW rf_view AS SELECT id, hours AS hourly FROM rf_base")
        time.sleep(1.0)
        assert conn.execute("SELECT SUM(hourly) FROM rf_view WHERE id > 7").fetchone() is not None
        assert _remaining(proxy) == before - 1


# Each passed the check before and failed on a row its neighbouring table lacks (the setup's last
# statement adds that row): a row-valued <> of (k, point) pairs with equal k, GREATEST of such
# anonymous rows, a point[] = of equal
# size, max of point[] over two rows, a DISTINCT of (k, point) rows with a repeated k, a RANGE
# window reaching past the last timestamp, a recursive WITH over a cycle, SUM and round of a
# numeric of 131072 nines (past the numeric format), a function of a user's
# named as a built-in one, LIKE through an operator a user declared the negator of =, and a
# division hidden behind two column names holding a double quote.
_NEIGHBOURS = {
    "row-comparison": (("CREATE TYPE rf_pair AS (k int, p point)", "ALTER TABLE rf_base ADD a rf_pair, ADD b rf_pair",
                        "UPDATE rf_base SET a = ROW(1, point(0, 0)), b = ROW(2, point(0, 0))",
                        "UPDATE rf_base SET b = ROW(1, point(1, 1)) WHERE id = 7"),
                       "SELECT id FROM rf_base WHERE a <> b", "record_ne(record, record)"),
    "greatest-of-rows": (("ALTER TABLE rf_base ADD p point", "UPDATE rf_base SET p = point(0, 0), hours = 1",
                          "UPDATE rf_base SET hours = 2 WHERE id = 7"),
                         "SELECT id FROM rf_base WHERE GREATEST(ROW(hours, p), ROW(2, p)) IS NOT NULL", "GREATEST/LEAST"),
    "array-comparison": (("ALTER TABLE rf_base ADD a point[], ADD b point[]",
                          "UPDATE rf_base SET a = ARRAY[point(0, 0)], b = ARRAY[point(0, 0), point(1, 1)]",
                          "UPDATE rf_base SET b = ARRAY[point(1, 1)] WHERE id = 7"),
                         "SELECT id FROM rf_base WHERE a = b", "array_eq(anyarray, anyarray)"),
    "array-max": (("ALTER TABLE rf_base ADD a point[]", "UPDATE rf_base SET a = ARRAY[point(0, 0)] WHERE id = 7",
                   "UPDATE rf_base SET a = ARRAY[point(1, 0)], hours = 0 WHERE id = 8"),
                  "SELECT hours AS id, max(a) AS a FROM rf_base GROUP BY hours", "max(anyarray)"),
    "distinct-rows": (("ALTER TABLE rf_base ADD p point", "UPDATE rf_base SET p = point(0, 0)",
                       "UPDATE rf_base SET id = 8 WHERE id = 7"),
                      "SELECT count(*) AS id FROM (SELECT DISTINCT ROW(id, p) FROM rf_base) s", "record_eq(record, record)"),
    "range-window": (("ALTER TABLE rf_base ADD at timestamp", "UPDATE rf_base SET at = '2020-01-01'::timestamp + id * interval '1 day'",
                      "UPDATE rf_base SET at = '294276-12-30' WHERE id = 7"),
                     "SELECT id, count(*) OVER (ORDER BY at RANGE BETWEEN '7 days' PRECEDING AND '7 days' FOLLOWING) AS near "
                     "FROM rf_base", "in_range(timestamp without time zone, timestamp without time zone, interval"),
    "recursive-with": (("ALTER TABLE rf_base ADD boss int", "UPDATE rf_base SET boss = id - 1",
                        "UPDATE rf_base SET boss = 7 WHERE id = 1"),
                       "WITH RECURSIVE up(id, boss) AS (SELECT id, boss FROM rf_base UNION ALL SELECT up.id, b.boss FROM up "
                       "JOIN rf_base b ON b.id = up.boss) SELECT id, count(*) AS depth FROM up GROUP BY id", "a recursive WITH"),
    "own-abs": (("CREATE SCHEMA rf_own", "CREATE FUNCTION rf_own.abs(integer) RETURNS integer LANGUAGE sql "
                 "IMMUTABLE AS 'SELECT 10 / $1'", "UPDATE rf_base SET hours = 1", "UPDATE rf_base SET hours = 0 WHERE id = 7"),
                "SELECT id, rf_own.abs(hours) AS h FROM rf_base", "rf_own.abs(integer)"),
    "own-negator": (("CREATE SCHEMA rf_own", "CREATE OPERATOR rf_own.@@@ (function = pg_catalog.textlike, leftarg = text, "
                     "rightarg = text, negator = OPERATOR(pg_catalog.=))", "UPDATE rf_base SET note = '\\' WHERE id = 7"),
                    "SELECT id FROM rf_base WHERE 'x' LIKE note", "textlike(text, text)"),
    "numeric-sum": (("ALTER TABLE rf_base ADD amount numeric", "UPDATE rf_base SET amount = repeat('9', 131072)::numeric",
                     "UPDATE rf_base SET hours = 4 WHERE id = 7"),
                    "SELECT hours AS id, sum(amount) AS total FROM rf_base WHERE id IN (3, 7) GROUP BY hours",
                    "sum(numeric)"),
    "numeric-round": (("ALTER TABLE rf_base ADD amount numeric", "UPDATE rf_base SET amount = id + 0.5",
                       "UPDATE rf_base SET amount = repeat('9', 131072)::numeric + 0.5 WHERE id = 7"),
                      "SELECT id, round(amount) AS r FROM rf_base", "round(numeric)"),
    "quoted-names": (("UPDATE rf_base SET hours = 1", "UPDATE rf_base SET hours = 0 WHERE id = 7"),
                     'SELECT id, income AS "a""", income / hours AS "b""" FROM rf_base', "int4div(integer, integer)"),
}


@pytest.mark.parametrize("case", list(_NEIGHBOURS))
def test_a_view_that_passed_the_check_and_failed_on_one_neighbours_row_is_refused(
    test_db: TestDatabase, tmp_path: Path, case: str
) -> None:
    (*setup, failing_row), view, named = _NEIGHBOURS[case]
    with _base(test_db, view, *setup) as admin:
        admin.execute("SET statement_timeout = '2s'")
        every_column = "SELECT count(*), sum(hashtext(rf_view::text)) FROM rf_view"
        admin.execute(every_column).fetchone()  # the table without the row: answered
        problems = refused_at_load(make_policy(test_db, tmp_path / "ledger.sqlite3", _POLICY))
        admin.execute(failing_row)
        with pytest.raises(psycopg.errors.DatabaseError):  # its neighbour with the row: fails
            admin.execute(every_column).fetchone()
    assert len(problems) == 1 and problems[0].startswith("tables.public.rf_view: view rf_view "), problems
    assert named in problems[0], problems


def test_a_protected_view_of_a_foreign_table_is_refused_as_its_server_computes_the_rows(
    test_db: TestDatabase, tmp_path: Path
) -> None:
    """A foreign table's rows are computed where dpproxy cannot look: file_fdw fails on a
    malformed line, postgres_fdw on a remote view's division, each on one row."""
    remote = ("CREATE FOREIGN DATA WRAPPER rf_wrapper", "CREATE SERVER rf_elsewhere FOREIGN DATA WRAPPER rf_wrapper",
              "CREATE FOREIGN TABLE rf_remote (id integer) SERVER rf_elsewhere")
    with _base(test_db, "SELECT id FROM rf_remote UNION ALL SELECT id FROM rf_base", *remote) as admin:
        try:
            (problem,) = refused_at_load(make_policy(test_db, tmp_path / "ledger.sqlite3", _POLICY))
        finally:
            admin.execute("DROP FOREIGN DATA WRAPPER rf_wrapper CASCADE")
    assert "foreign table rf_remote computes its rows on its server" in problem, problem
