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
* **A protected view's column weighed its own type, not the values it is computed from.** PostgreSQL
  flattens the view and computes an aggregate's argument or FILTER above the scan, so the scan carries
  the columns beneath at their statistics' widths: ``octet_length(u)`` (an integer, 8 bytes) over a u
  of 7,000-byte values spilled 1,000 cells from ~500; twelve such columns under one COALESCE, an
  entry of 84 kB. Each column of a view that may compute its columns now weighs the values
  ``EXPLAIN (VERBOSE)`` shows it carries, each at the widest column the view reads
  (proxy/backend/view_widths.py).

Checked, and held (a sort, bounded by the table's rows, or a hash whose limit is now covered):
``COUNT(DISTINCT)`` (an aggregate with DISTINCT, which PostgreSQL never hashes: a sorted group), a
percentile's (cell, grid index) groups and sample and aggregate's partitions (table-bound, their
groups now weighed at the estimate too, above).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, dropped_around, running_proxy, spent_epsilon
from tests.test_attack_stop46_red import hashed_in_memory

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
    hashed_in_memory(unanalysed_proxy, test_db, "unanalysed",
                      f"SELECT x, count(*) FILTER (WHERE c = 'a') FROM unanalysed WHERE x <= {k} GROUP BY x")


def test_a_table_bound_group_by_over_an_unanalysed_char_column_is_answered(unanalysed_proxy: RunningProxy) -> None:
    """The estimate raises the setting only (it takes no memory): the statement is not refused."""
    with unanalysed_proxy.connect() as conn:
        rows = conn.execute("SELECT x, count(*) FILTER (WHERE c = 'a') FROM unanalysed GROUP BY x").fetchall()
    assert 0 < len(rows) <= _CELLS


def _sizes_policy(view: str, ceiling_mb: int) -> str:
    """A policy protecting ``view``: x, its key of 1,000 integer cells, and s, a size."""
    return ATTACK_POLICY_HEAD + f"""
  public.{view}:
    access: protected
    epsilon: 1.0
    max_sort_memory_mb: {ceiling_mb}
    columns:
      x: {{{{bounds: [0, 999], group_by: true}}}}
      s: {{{{bounds: [0, 10000]}}}}
"""


@contextmanager
def _view_behind_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, texts: int,
                       view: str, ceiling_mb: int = 256) -> Iterator[RunningProxy]:
    """Table ``view``_base: one row a cell of x and ``texts`` text columns u0, u1 … stored in their
    rows, each 7,000 bytes where set and set in turn (one row of ``texts``), analysed; view ``view``
    of x and s, the size of whichever is set; behind a dpproxy protecting the view with ``ceiling_mb``
    as its ``max_sort_memory_mb``. Dropped on exit."""
    base = f"{view}_base"
    values = ", ".join(f"CASE WHEN i % {texts} = {i} THEN repeat('u', 7000) END" for i in range(texts))
    sizes = ", ".join(f"octet_length(u{i})" for i in range(texts))
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as connection, dropped_around(connection, base) as admin:
        admin.execute(f"CREATE TABLE {base} (x integer, {', '.join(f'u{i} text STORAGE PLAIN' for i in range(texts))})")
        admin.execute(f"INSERT INTO {base} SELECT i, {values} FROM generate_series(0, 999) i")
        admin.execute(f"VACUUM ANALYZE {base}")
        admin.execute(f"CREATE VIEW {view} AS SELECT x, COALESCE({sizes}) AS s FROM {base}")
        try:
            admin.execute(f"GRANT SELECT ON {base}, {view} TO dpproxy_service")
            with running_proxy(test_db, tmp_path_factory, _sizes_policy(view, ceiling_mb)) as running:
                yield running
        finally:
            admin.execute(f"DROP VIEW {view}")


@pytest.fixture(scope="module")
def sizes_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """View sizes_view: x and the octet_length of a 7,000-byte text u0, one row a cell."""
    with _view_behind_proxy(test_db, tmp_path_factory, 1, "sizes_view") as running:
        yield running


@pytest.mark.parametrize("sql", ["SELECT x, sum(s) FROM sizes_view WHERE x <= {k} GROUP BY x",
                                 "SELECT x, count(*) FILTER (WHERE s > 5) FROM sizes_view WHERE x <= {k} GROUP BY x"])
@pytest.mark.parametrize("k", [100, 500, 999])
def test_groups_reading_a_view_column_computed_from_a_wide_column_stay_in_memory(
        sizes_proxy: RunningProxy, test_db: TestDatabase, sql: str, k: int) -> None:
    """s is an integer, weighed 8 bytes, but PostgreSQL computes it above the scan, which carries u0
    at its statistics' 7,004 bytes. Before, ~500 of the 1,000 groups were admitted: the sum at 999
    cells and the FILTER at 500 and 999 spilled, 100 did not."""
    hashed_in_memory(sizes_proxy, test_db, "sizes_view", sql.format(k=k))


_SPREAD = 12  # text columns the view's s is computed from


@pytest.fixture(scope="module")
def spread_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with _view_behind_proxy(test_db, tmp_path_factory, _SPREAD, "spread_view") as running:
        yield running


def test_groups_reading_a_view_column_computed_from_several_wide_columns_stay_in_memory(
        spread_proxy: RunningProxy, test_db: TestDatabase) -> None:
    """The scan carries all twelve columns the view's column is computed from, each averaging 7,004 bytes
    where set: an entry of 84 kB, which one column's weight (a 32 kB tuple) did not cover (spilled)."""
    hashed_in_memory(spread_proxy, test_db, "spread_view",
                      "SELECT x, count(*) FILTER (WHERE s > 5) FROM spread_view GROUP BY x")


def test_a_view_group_by_whose_carried_values_pass_the_ceiling_is_refused_uncharged(
        test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """At a 16 MB ceiling the 1,000 cells of a sum of s, weighed at the 32 kB u0 it carries, need
    ~68 MB: the view, which may compute its values, has no bound of its own to fall back to, so the
    statement is refused before its charge (54000, ``sort-memory``), not run to spill."""
    with _view_behind_proxy(test_db, tmp_path_factory, 1, "small_view", ceiling_mb=16) as proxy, \
            proxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.errors.ProgramLimitExceeded) as refused:
            conn.execute("SELECT x, sum(s) FROM small_view GROUP BY x")
        assert "(rule: sort-memory)" in str(refused.value) and "fewer columns read" in str(refused.value)
        assert spent_epsilon(conn) == before
