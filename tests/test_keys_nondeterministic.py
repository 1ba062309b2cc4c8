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

import psycopg
import pytest

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy, refused_at_load, running_proxy

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


@pytest.fixture(scope="module")
def nocase_proxy(pg15_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(pg15_db.admin_dsn, autocommit=True) as admin:
        admin.execute(_COLLATION)
        admin.execute("DROP TABLE IF EXISTS nd_keys")
        admin.execute("CREATE TABLE nd_keys (id int, v int, few text COLLATE dp_nocase, many text COLLATE dp_nocase)")
        admin.execute(f"INSERT INTO nd_keys {_ROWS}")
        admin.execute("GRANT SELECT ON nd_keys TO dpproxy_service")
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
