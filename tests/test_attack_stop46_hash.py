"""Stop 46, continued: a hash aggregate's admission limit wherever a DP statement hashes.

A hash aggregate admits ``work_mem`` × ``hash_mem_multiplier`` over the planner's estimate of a
group's entry (``hashentrysize``: the estimated width of every column its input carries) groups
before it spills, however little they take (tests/test_attack_stop46_red.py). The groups a
filter makes are then a timing step at that edge. Pinned here, each with its neighbouring rows
on both sides of the edge it had:

* **The table-bound fallback weighed a group's states, not the planner's estimate of its input.**
  A GROUP BY above its cells' bound (or any table-bound plan that hashes groups) runs with
  ``work_mem`` from the table's size (``rewriter.sort_memory.table_bound_sql``): 256 bytes a row
  and each group's states. A ``char(2000)`` column never analysed is estimated at 8,004 bytes (four
  bytes a character), read by a FILTER, so ~2,000 of 5,000 groups were admitted: the row that
  opened a group past the edge was told by the spill.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, dropped_around, running_proxy
from tests.test_attack_stop46_red import _hashed_in_memory

_CELLS = 5_000
_UNANALYSED_POLICY = ATTACK_POLICY_HEAD + f"""
  public.unanalysed:
    access: protected
    epsilon: 1.0
    max_cells: {_CELLS}
    max_sort_memory_mb: 16
    columns:
      x: {{{{bounds: [0, {_CELLS - 1}], group_by: true}}}}
      c: {{{{categories: [a, b]}}}}
"""


@pytest.fixture(scope="module")
def unanalysed_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """Table unanalysed: one row a cell of x, its char(2000) c NULL (so the rows are narrow and the
    table's bound small), vacuumed but never analysed, autovacuum off: the planner estimates c at
    its type's 8,004 bytes."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as connection, \
            dropped_around(connection, "unanalysed") as admin:
        admin.execute("CREATE TABLE unanalysed (x integer, c char(2000)) WITH (autovacuum_enabled = off)")
        admin.execute(f"INSERT INTO unanalysed SELECT i, NULL FROM generate_series(0, {_CELLS - 1}) i")
        admin.execute("VACUUM unanalysed")
        admin.execute("GRANT SELECT ON unanalysed TO dpproxy_service")
        with running_proxy(test_db, tmp_path_factory, _UNANALYSED_POLICY) as running:
            yield running


@pytest.mark.parametrize("k", [100, _CELLS // 2, _CELLS - 1])
def test_table_bound_groups_whose_filter_reads_an_unanalysed_char_column_stay_in_memory(
        unanalysed_proxy: RunningProxy, test_db: TestDatabase, k: int) -> None:
    """5,000 cells of x (above the 16 MB ceiling by their cells' bound: table-bound), a FILTER on a
    char(2000) never analysed. Before, the table's bound (~14 MB: 16 MB, the ceiling) admitted ~2,000
    groups of the 8 kB the planner estimates: 2,500 and 4,999 cells spilled, 100 did not."""
    _hashed_in_memory(unanalysed_proxy, test_db, "unanalysed",
                      f"SELECT x, count(*) FILTER (WHERE c = 'a') FROM unanalysed WHERE x <= {k} GROUP BY x")


def test_a_table_bound_group_by_over_an_unanalysed_char_column_is_answered(unanalysed_proxy: RunningProxy) -> None:
    """The estimate raises the setting only (it takes no memory): the statement is not refused."""
    with unanalysed_proxy.connect() as conn:
        rows = conn.execute("SELECT x, count(*) FILTER (WHERE c = 'a') FROM unanalysed GROUP BY x").fetchall()
    assert 0 < len(rows) <= _CELLS


_VIEW_POLICY = ATTACK_POLICY_HEAD + """
  public.sizes_view:
    access: protected
    epsilon: 1.0
    columns:
      x: {{bounds: [0, 999], group_by: true}}
      s: {{bounds: [0, 10000]}}
"""


@pytest.fixture(scope="module")
def sizes_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """View sizes_view: x and the octet_length of a 7,000-byte text u stored in its row, of table
    sizes_base (one row a cell of x, analysed)."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as connection, \
            dropped_around(connection, "sizes_base") as admin:
        admin.execute("CREATE TABLE sizes_base (x integer, u text STORAGE PLAIN)")
        admin.execute("INSERT INTO sizes_base SELECT i, repeat('u', 7000) FROM generate_series(0, 999) i")
        admin.execute("VACUUM ANALYZE sizes_base")
        admin.execute("CREATE VIEW sizes_view AS SELECT x, octet_length(u) AS s FROM sizes_base")
        try:
            admin.execute("GRANT SELECT ON sizes_base, sizes_view TO dpproxy_service")
            with running_proxy(test_db, tmp_path_factory, _VIEW_POLICY) as running:
                yield running
        finally:
            admin.execute("DROP VIEW sizes_view")


@pytest.mark.parametrize("sql", ["SELECT x, sum(s) FROM sizes_view WHERE x <= {k} GROUP BY x",
                                 "SELECT x, count(*) FILTER (WHERE s > 5) FROM sizes_view WHERE x <= {k} GROUP BY x"])
@pytest.mark.parametrize("k", [100, 500, 999])
def test_groups_reading_a_view_column_computed_from_a_wide_column_stay_in_memory(
        sizes_proxy: RunningProxy, test_db: TestDatabase, sql: str, k: int) -> None:
    _hashed_in_memory(sizes_proxy, test_db, "sizes_view", sql.format(k=k))


_SPREAD = 12  # text columns of spread_base, each set (to 7,000 bytes) in one row of twelve and NULL elsewhere
_SPREAD_POLICY = ATTACK_POLICY_HEAD + """
  public.spread_view:
    access: protected
    epsilon: 1.0
    columns:
      x: {{bounds: [0, 999], group_by: true}}
      s: {{bounds: [0, 10000]}}
"""


@pytest.fixture(scope="module")
def spread_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """View spread_view: x and the size of whichever of twelve text columns of spread_base is set."""
    values = ", ".join(f"CASE WHEN i % {_SPREAD} = {i} THEN repeat('u', 7000) END" for i in range(_SPREAD))
    sizes = ", ".join(f"octet_length(u{i})" for i in range(_SPREAD))
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as connection, \
            dropped_around(connection, "spread_base") as admin:
        admin.execute(f"CREATE TABLE spread_base (x integer, {', '.join(f'u{i} text STORAGE PLAIN' for i in range(_SPREAD))})")
        admin.execute(f"INSERT INTO spread_base SELECT i, {values} FROM generate_series(0, 999) i")
        admin.execute("VACUUM ANALYZE spread_base")
        admin.execute(f"CREATE VIEW spread_view AS SELECT x, COALESCE({sizes}) AS s FROM spread_base")
        try:
            admin.execute("GRANT SELECT ON spread_base, spread_view TO dpproxy_service")
            with running_proxy(test_db, tmp_path_factory, _SPREAD_POLICY) as running:
                yield running
        finally:
            admin.execute("DROP VIEW spread_view")


def test_groups_reading_a_view_column_computed_from_several_wide_columns_stay_in_memory(
        spread_proxy: RunningProxy, test_db: TestDatabase) -> None:
    """The scan carries all twelve columns the view's column is computed from, each averaging 7,004 bytes
    where set: an entry of 84 kB, which one column's weight (a 32 kB tuple) did not cover (spilled)."""
    _hashed_in_memory(spread_proxy, test_db, "spread_view", "SELECT x, count(*) FILTER (WHERE s > 5) FROM spread_view GROUP BY x")
