"""COUNT(DISTINCT col) per group with a catch-all (``other``) key, counted once per cell.

It was refused (``aggregate-combination``) since the first histograms (issue 19): the backend then
grouped the rows by their raw value and dpproxy added up the groups that fell in one cell, so a value
held in two undeclared categories was counted once in each and twice in ``other``. Grouping moved to
the cells (rewriter/group_keys.py: a category key groups by the row's cell, or, of nine categories
or more, by its value where it is a declared one and NULL for ``other``), so each cell is one
backend group and its count is PostgreSQL's ``count(DISTINCT col)`` over the cell's rows, whose
sensitivity is 1 as for any COUNT(DISTINCT). Real dpproxy and PostgreSQL; ε so large that a count
comes back exact.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours, same_on_neighbours

_MANY = [f"c{i}" for i in range(10)]  # nine or more: grouped by a hashed list (rewriter/group_keys.py)
_TABLE = """
    access: protected
    epsilon: 1000.0
    delta: 1.0e-6
    columns:
      v: {{bounds: [0, 100]}}
      few: {{categories: [a, b], group_by: true, other: other}}
      many: {{categories: [""" + ", ".join(_MANY) + """], group_by: true, other: other}}
"""
_DDL = "(id int PRIMARY KEY, v int, few text, many text)"
# Undeclared values x and y (and NULL) share v's values: ``other`` holds each v once, not once a value.
_ROWS = ("SELECT g, g % 7, (ARRAY['a', 'x', 'y', NULL])[1 + g % 4], 'c' || (g % 12) "
         "FROM generate_series(1, 60) g")
# One row more each: a new v in other, a known v in other, a row of NULLs, a new v in a declared category.
_NEIGHBOURS = {
    "cdo_new_in_other": "(0, 50, 'z', 'c11')",
    "cdo_known_in_other": "(0, 3, 'y', 'c10')",
    "cdo_nulls": "(0, NULL, NULL, NULL)",
    "cdo_new_declared": "(0, 60, 'a', 'c1')",
}
_BASE = "cdo_0"
_TABLES = (_BASE, *_NEIGHBOURS)
_POLICY = ATTACK_POLICY_HEAD + f"  public.{_BASE}: &C" + _TABLE + "".join(f"  public.{name}: *C\n" for name in _NEIGHBOURS)
_CELLS = {"few": ["a", "b"], "many": _MANY}


@pytest.fixture(scope="module")
def other_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    create_neighbours(test_db.admin_dsn, _BASE, _NEIGHBOURS, _DDL, _ROWS)
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _exact(admin: psycopg.Connection, table: str, key: str) -> dict[str, int]:
    """PostgreSQL's count(DISTINCT v) per cell of ``key``: each declared category, the rest in other."""
    cells = ", ".join(f"'{category}'" for category in _CELLS[key])
    rows = admin.execute(f"SELECT CASE WHEN {key} IN ({cells}) THEN {key} ELSE 'other' END AS k, count(DISTINCT v) "
                         f"FROM {table} GROUP BY 1").fetchall()
    return {**dict.fromkeys([*_CELLS[key], "other"], 0), **{k: int(n) for k, n in rows}}


def _answered(conn: psycopg.Connection, table: str, key: str) -> dict[str, int]:
    rows = conn.execute(f"SELECT {key}, count(DISTINCT v) FROM {table} GROUP BY {key}").fetchall()
    return {k: round(float(n)) for k, n in rows}


@pytest.mark.parametrize("key", ["few", "many"])
def test_count_distinct_per_cell_with_an_other_key_counts_each_value_once_in_other(
        other_proxy: RunningProxy, test_db: TestDatabase, key: str) -> None:
    with psycopg.connect(test_db.admin_dsn) as admin, other_proxy.connect() as conn:
        exact = _exact(admin, _BASE, key)
        assert exact["other"] == 7  # v's seven values, held by x, y and NULL rows alike (their sum: 21)
        assert _answered(conn, _BASE, key) == exact


@pytest.mark.parametrize("key", ["few", "many"])
def test_one_row_more_moves_one_cells_count_distinct_by_at_most_one(
        other_proxy: RunningProxy, test_db: TestDatabase, key: str) -> None:
    """The sensitivity the noise is scaled to: Δ = 1 over all the cells, as the cells partition the rows."""
    with psycopg.connect(test_db.admin_dsn) as admin, other_proxy.connect() as conn:
        base = _answered(conn, _BASE, key)
        for table in _NEIGHBOURS:
            answer = _answered(conn, table, key)
            assert answer == _exact(admin, table, key)
            assert sum(abs(answer[cell] - base[cell]) for cell in base) <= 1, (table, base, answer)


@pytest.mark.parametrize(("sql", "keys"), [("SELECT few, count(DISTINCT v) FROM {t} GROUP BY few", 1),
                                           ("SELECT many, few, count(DISTINCT v), count(*) FROM {t} GROUP BY many, few", 2),
                                           ("SELECT few, count(DISTINCT many) FROM {t} GROUP BY 1 ORDER BY 2 DESC", 0)])
def test_count_distinct_per_other_key_answers_alike_on_neighbouring_tables(
        other_proxy: RunningProxy, sql: str, keys: int) -> None:
    with other_proxy.connect() as conn:
        outcome = same_on_neighbours(conn, sql, _TABLES, spent_epsilon, keys=keys)
    assert outcome[0] == "answer", outcome
