"""Stop 46, the round-trip check of GROUP BY keys' findings (tests/round_trip_keys.py over
tests/key_generator.py): statements dpproxy answered, refused or failed otherwise than PostgreSQL.

* A bare GROUP BY name that no level below makes visible but an output is named, over a derived
  table or a CTE (``SELECT t AS k, count(*) FROM (SELECT * FROM gk) AS v GROUP BY k``): PostgreSQL
  reads it as the output (an input column's name first, then an output's), as dpproxy does without
  the wrapper; the wrapper's mapping of names read it as an input column none has, and refused the
  statement with PostgreSQL's 42703, uncharged, where PostgreSQL answers it
  (rewriter/flatten.py, ``_grouped_by_outputs``).
* ``x COLLATE "C"::text``, which PostgreSQL reads as ``(x COLLATE "C")::text``: sqlglot read a cast of
  the collation's name, a column ``"C"``, and the statement (``... HAVING t COLLATE "C"::text > 'A'``,
  ``ORDER BY t COLLATE "C"::text``) was refused with 42703, column "C" does not exist, where PostgreSQL
  answers. Refused now as what it is, a spelling dpproxy's planner misreads (0A000, rule
  ``collation-cast``, before any charge), the parenthesised form answered.
* A collation qualified with its schema, ``ORDER BY t COLLATE pg_catalog."C"``: sqlglot read the name as
  a column ``"C"`` of a table ``pg_catalog``, and the statement was refused with 42803 (column "C" must
  appear in the GROUP BY clause) where PostgreSQL answers; read as the collation now
  (rewriter/sqlglot_parse.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import TEST_POLICY, RunningProxy, TestDatabase, refused_uncharged, running_proxy
from tests.key_data import KEY_POLICY, create_key_table


@pytest.fixture(scope="module")
def gk_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over ``gk`` (tests/key_data.py), each of its columns a declared key."""
    create_key_table(test_db)
    with running_proxy(test_db, tmp_path_factory, TEST_POLICY + KEY_POLICY.replace("{", "{{").replace("}", "}}")) as running:
        yield running


def _keys(proxy: RunningProxy, sql: str) -> list[object]:
    with proxy.connect(autocommit=True) as conn:
        return [row[0] for row in conn.execute(sql).fetchall()]


@pytest.mark.parametrize(("sql", "alike"), [
    # A GROUP BY output name over a derived table or CTE: refused with 42703 (column "k" does not exist)
    ("SELECT t AS k, count(*) AS n FROM (SELECT * FROM gk) AS virtual_table GROUP BY k ORDER BY k",
     "SELECT t AS k, count(*) AS n FROM gk GROUP BY t ORDER BY k"),
    ("WITH src AS (SELECT * FROM gk WHERE i > 2) SELECT DATE_TRUNC('month', w) AS k, count(*) AS n FROM src "
     "GROUP BY k ORDER BY k", "SELECT DATE_TRUNC('month', w) AS k, count(*) AS n FROM gk GROUP BY 1 ORDER BY k"),
    # ... whose name is a column of the table the wrapper does not make visible: the output, not gk.t
    ("SELECT i AS t, count(*) AS n FROM (SELECT i FROM gk) AS s GROUP BY t ORDER BY t",
     "SELECT i AS t, count(*) AS n FROM gk GROUP BY i ORDER BY t"),
    # A collation qualified with pg_catalog: refused with 42803 (column "C" must appear in the GROUP BY clause)
    ('SELECT t AS k, count(*) AS n FROM gk GROUP BY 1 ORDER BY t COLLATE pg_catalog."C" DESC',
     'SELECT t AS k, count(*) AS n FROM gk GROUP BY 1 ORDER BY t COLLATE "C" DESC'),
    ('SELECT t AS k, count(*) AS n FROM gk GROUP BY 1 ORDER BY (t COLLATE pg_catalog."C")::text',
     'SELECT t AS k, count(*) AS n FROM gk GROUP BY 1 ORDER BY (t COLLATE "C")::text'),
    ("SELECT t AS k, count(*) AS n FROM gk GROUP BY 1 ORDER BY t COLLATE pg_catalog.default DESC",
     'SELECT t AS k, count(*) AS n FROM gk GROUP BY 1 ORDER BY t COLLATE "default" DESC'),
])
def test_a_statement_postgresql_answers_is_answered_with_the_keys_of_its_plain_spelling(
        gk_proxy: RunningProxy, test_db: TestDatabase, sql: str, alike: str) -> None:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(sql)  # PostgreSQL answers it
    assert _keys(gk_proxy, sql) == _keys(gk_proxy, alike)


@pytest.mark.parametrize("sql", [
    "SELECT t AS k, count(*) AS n FROM gk GROUP BY 1 HAVING t COLLATE \"C\"::text > 'A'",
    "SELECT t AS k, count(*) AS n FROM gk GROUP BY 1 ORDER BY t COLLATE pg_catalog.\"C\"::text DESC",
    "SELECT t AS k, count(*) AS n FROM gk GROUP BY 1 ORDER BY t COLLATE \"C\" /* c */ ::text",
])
def test_a_collation_name_cast_with_a_double_colon_is_refused_before_any_charge(
        gk_proxy: RunningProxy, test_db: TestDatabase, sql: str) -> None:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(sql)  # PostgreSQL answers it
    refused = refused_uncharged(gk_proxy, sql)
    # it was refused as 42703, column "C" does not exist: a cast of the collation's name read as a column
    assert refused.sqlstate == "0A000" and "collation-cast" in str(refused), refused
    parenthesised = sql.replace("t COLLATE", "(t COLLATE").replace('"::text', '")::text').replace('" /* c */ ::text', '")::text')
    assert _keys(gk_proxy, parenthesised)
