"""A category GROUP BY key on a column under a nondeterministic ICU collation (case-insensitive:
'Male', 'MALE' and 'male' are one value to PostgreSQL, 'Mâle' another), on PostgreSQL 15 with ICU.

Each row lands in the cell of the first declared category its value equals under the column's
collation, as PostgreSQL's GROUP BY puts it in that category's group; the rest (undeclared values,
'Mâle', NULL) in ``other``. Checked for both ways a category key is grouped (rewriter/group_keys.py):
fewer than nine categories, a CASE a row; nine or more, which under a nondeterministic collation
keep the CASE (the hashed ``= ANY`` hashes by bytes): COUNT, COUNT(col), SUM and COUNT(DISTINCT)
per cell against PostgreSQL's own aggregates over its groups. ε so large that the answers come back
exact. Labels: dpproxy releases the declared one ('Female'), PostgreSQL prints any value of the group
('FEMALE'); the counts are the same. Two declared categories equal under the collation are refused
at load (the second cell would be always empty).
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlparse

import psycopg
import pytest

from tests.conftest import (ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy, refused_at_load,
                            refused_uncharged, running_proxy)

_COLLATION = ("CREATE COLLATION IF NOT EXISTS dp_nocase (provider = icu, locale = 'und-u-ks-level2', "
              "deterministic = false)")
_FEW = ["Male", "Female"]
_MANY = ["Male", "Female", "x", "a", "b", "c", "d", "e", "f", "g"]  # nine or more
_TABLE = """  public.{name}:
    access: protected
    epsilon: 50000.0
    delta: 1.0e-6
    columns:
      v: {{{{bounds: [0, 100]}}}}
      few: {{{{categories: [{few}], group_by: true, other: other}}}}
      many: {{{{categories: [{many}], group_by: true, other: other}}}}
"""
_ROWS = ("SELECT g, g % 7, (ARRAY['Male', 'MALE', 'male', 'Female', 'FEMALE', 'x', NULL, 'Mâle'])[1 + g % 8], "
         "(ARRAY['Male', 'MALE', 'male', 'Female', 'FEMALE', 'x', NULL, 'Mâle', 'X', 'A'])[1 + g % 10] "
         "FROM generate_series(1, 80) g")


def _create(database: TestDatabase, table: str, *statements: str) -> None:
    """``table`` made anew by ``statements`` (run as the admin) and granted to the service role."""
    with psycopg.connect(database.admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP TABLE IF EXISTS {table}")
        for statement in statements:
            admin.execute(statement)
        admin.execute(f"GRANT SELECT ON {table} TO dpproxy_service")


@pytest.fixture(scope="module")
def nocase_proxy(pg15_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    _create(pg15_db, "nd_keys", _COLLATION,
            "CREATE TABLE nd_keys (id int, v int, few text COLLATE dp_nocase, many text COLLATE dp_nocase)",
            f"INSERT INTO nd_keys {_ROWS}")
    policy = ATTACK_POLICY_HEAD + _TABLE.format(name="nd_keys", few=", ".join(_FEW), many=", ".join(_MANY))
    with running_proxy(pg15_db, tmp_path_factory, policy) as running:
        yield running


_AGGREGATES = "count(*), count(v), sum(v), count(DISTINCT v)"


@pytest.mark.parametrize("key", ["few", "many", "CAST(many AS TEXT)", "few::varchar"])
def test_a_nondeterministic_category_key_counts_each_row_in_its_postgresql_groups_cell(
        nocase_proxy: RunningProxy, pg15_db: TestDatabase, key: str) -> None:
    column = key.removeprefix("CAST(").split()[0].split(":")[0]
    declared = _FEW if column == "few" else _MANY
    with psycopg.connect(pg15_db.admin_dsn) as admin, nocase_proxy.connect(autocommit=True) as conn:
        # PostgreSQL's cells: each declared category's under the column's own =, the rest other's
        cell = " ".join(f"WHEN {column} = '{category}' THEN '{category}'" for category in declared)
        exact = {row[0]: tuple(int(value or 0) for value in row[1:]) for row in admin.execute(
            f"SELECT CASE {cell} ELSE 'other' END, {_AGGREGATES} FROM nd_keys GROUP BY 1").fetchall()}
        groups = [tuple(int(value or 0) for value in row[1:]) for row in admin.execute(
            f"SELECT {column}, {_AGGREGATES} FROM nd_keys GROUP BY 1").fetchall()]
        answered = {row[0]: tuple(round(float(value)) for value in row[1:]) for row in conn.execute(
            f"SELECT {key}, {_AGGREGATES} FROM nd_keys GROUP BY 1").fetchall()}
    assert exact["Male"][0] == 30 - 6 * (column == "many")  # Male, MALE and male: one group to PostgreSQL
    for label, values in answered.items():
        expected = exact.get(label, (0, 0, 0, 0))
        assert values == expected, (label, values, expected)
        if label != "other" and values[0]:
            assert expected in groups, (label, expected, groups)  # one of PostgreSQL's groups, whole


def test_two_categories_equal_under_a_nondeterministic_collation_are_refused_at_load(
        nocase_proxy: RunningProxy, pg15_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    policy = ATTACK_POLICY_HEAD + _TABLE.format(name="nd_keys", few="Male, MALE", many=", ".join(_MANY))
    problems = refused_at_load(make_policy(pg15_db, tmp_path_factory.mktemp("nd") / "ledger.sqlite3", policy))
    assert any("nd_keys.columns.few" in problem for problem in problems), problems


# A category key on a column whose collation is not the database's default (C.UTF-8 here): the outer
# statement (HAVING, ORDER BY, an enclosing WHERE) compares and orders the released labels under the
# column's own collation, as PostgreSQL compares the column's values. ``s`` is case-insensitive, its
# collation in schema public; ``u`` deterministic ICU, which orders 'a' < 'A' < 'b' < 'B'.
_OWN_COLLATIONS = ("CREATE COLLATION IF NOT EXISTS public.dp_ci (provider = icu, locale = 'und-u-ks-level2', "
                   "deterministic = false)")
_COLLATED_TABLE = """  public.collated_keys:
    access: protected
    epsilon: 50000.0
    delta: 1.0e-6
    columns:
      s: {{categories: [a, B], group_by: true, other: other}}
      u: {{categories: [A, B, a], group_by: true, other: other}}
"""


@pytest.fixture(scope="module")
def collated_proxy(pg15_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    # s: a and B 28 rows each, c (other) 14; u: A, B and a 20 each, c (other) 10
    _create(pg15_db, "collated_keys", _OWN_COLLATIONS,
            'CREATE TABLE collated_keys (s text COLLATE public.dp_ci, u text COLLATE "und-x-icu")',
            "INSERT INTO collated_keys SELECT (ARRAY['a', 'B', 'a', 'B', 'c'])[1 + g % 5], "
            "(ARRAY['A', 'B', 'a', 'A', 'B', 'a', 'c'])[1 + g % 7] FROM generate_series(0, 69) g")
    with running_proxy(pg15_db, tmp_path_factory, ATTACK_POLICY_HEAD + _COLLATED_TABLE) as running:
        yield running


@pytest.mark.parametrize("statement", [
    "SELECT s, count(*) FROM collated_keys GROUP BY s HAVING s = 'b'",
    "SELECT * FROM (SELECT s AS k, count(*) AS n FROM collated_keys GROUP BY s) v WHERE k = 'A'",
    "SELECT s, count(*) FROM collated_keys GROUP BY s ORDER BY s LIMIT 2",
    "SELECT u, count(*) FROM collated_keys GROUP BY u HAVING u < 'b' ORDER BY u",
    "SELECT u, count(*) FROM collated_keys GROUP BY u HAVING u IN ('a', 'A', 'B') ORDER BY u DESC",
])
def test_a_category_key_is_compared_and_ordered_under_its_columns_collation_after_the_release(
        collated_proxy: RunningProxy, pg15_db: TestDatabase, statement: str) -> None:
    with psycopg.connect(pg15_db.admin_dsn) as admin, collated_proxy.connect(autocommit=True) as conn:
        expected = [(row[0], int(row[1])) for row in admin.execute(statement).fetchall()]
        answered = [(row[0], round(float(row[1]))) for row in conn.execute(statement).fetchall()]
    assert expected, statement  # the statement keeps some of PostgreSQL's groups
    assert answered == expected, statement


@pytest.mark.parametrize("statement", [
    "SELECT s, count(*) FROM collated_keys GROUP BY s HAVING s LIKE 'a%'",
    "SELECT * FROM (SELECT s AS k, count(*) AS n FROM collated_keys GROUP BY s) v WHERE k ILIKE 'A%'",
    "SELECT s, count(*) FROM collated_keys GROUP BY s HAVING s ~ 'a'",
    "SELECT s, count(*) FROM collated_keys GROUP BY s HAVING position('a' in s) > 0",
])
def test_a_pattern_match_on_a_nondeterministic_key_fails_as_in_postgresql_before_the_charge(
        collated_proxy: RunningProxy, pg15_db: TestDatabase, statement: str) -> None:
    """Under the key's own collation the outer statement's LIKE, regular expression or substring search
    fails as PostgreSQL's does on the column (0A000); tried over the release before the charge, uncharged."""
    with psycopg.connect(pg15_db.admin_dsn) as admin, pytest.raises(psycopg.Error) as postgres:
        admin.execute(statement)
    error = refused_uncharged(collated_proxy, statement)
    assert (error.sqlstate, postgres.value.sqlstate) == ("0A000", "0A000"), (statement, error)


@pytest.mark.parametrize("collate", ["public.dp_ci", '"public"."dp_ci"', '"public".dp_ci'])
def test_the_analysts_own_collate_of_the_keys_collation_is_still_refused(
        collated_proxy: RunningProxy, collate: str) -> None:
    """dpproxy's COLLATE of the key's collation is let through, on its own ``unnest`` only: the analyst's
    naming it (another schema than pg_catalog) stays refused before any charge (as a misreading of the
    name, 42803, or by ``pg-catalog-names``, 42501)."""
    with collated_proxy.connect(autocommit=True) as conn:
        for statement in (f"SELECT s, count(*) FROM collated_keys GROUP BY s HAVING s COLLATE {collate} = 'b'",
                          f"SELECT s, count(*) FROM collated_keys GROUP BY s ORDER BY s COLLATE {collate}",
                          f"SELECT * FROM (SELECT s AS k, count(*) AS n FROM collated_keys GROUP BY s) v "
                          f"WHERE k COLLATE {collate} = 'A'"):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(statement)
            assert refused.value.sqlstate in ("42501", "42803"), (statement, refused.value)


@pytest.fixture(scope="module")
def icu_default_db(pg15_db: TestDatabase) -> TestDatabase:
    """A database whose default collation is ICU's root locale (``a`` < ``B``), on PostgreSQL 15."""
    with psycopg.connect(pg15_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS dp_icu_default")
        admin.execute("CREATE DATABASE dp_icu_default TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'und'")
    database = TestDatabase(*(urlparse(dsn)._replace(path="/dp_icu_default").geturl()
                              for dsn in (pg15_db.admin_dsn, pg15_db.service_dsn)))
    _create(database, "c_keys", 'CREATE TABLE c_keys (c text COLLATE "C")',
            "INSERT INTO c_keys SELECT (ARRAY['a', 'B', 'B', 'c'])[1 + g % 4] FROM generate_series(0, 39) g")
    return database


@pytest.mark.parametrize("statement", [
    "SELECT c, count(*) FROM c_keys GROUP BY c ORDER BY c LIMIT 2",
    "SELECT c, count(*) FROM c_keys GROUP BY c HAVING c < 'a'",
])
def test_a_c_collated_category_key_in_a_database_of_another_default_is_ordered_bytewise(
        icu_default_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, statement: str) -> None:
    policy = ATTACK_POLICY_HEAD + """  public.c_keys:
    access: protected
    epsilon: 50000.0
    delta: 1.0e-6
    columns:
      c: {{categories: [a, B], group_by: true, other: other}}
"""
    with running_proxy(icu_default_db, tmp_path_factory, policy) as proxy, \
            psycopg.connect(icu_default_db.admin_dsn) as admin, \
            psycopg.connect(proxy.dsn(database="dp_icu_default"), autocommit=True) as conn:
        expected = [(row[0], int(row[1])) for row in admin.execute(statement).fetchall()]
        answered = [(row[0], round(float(row[1]))) for row in conn.execute(statement).fetchall()]
    assert expected and expected[0][0] == "B", statement  # 'B' before 'a' by bytes, after it under ICU's
    assert answered == expected, statement
