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
