"""A DP statement's sorts and hash tables never spill to disk, whatever rows its filter reaches
(rewriter/sort_memory.py); on a table whose bound is above ``max_sort_memory_mb`` they are refused.

Before, one row at the edge of ``work_mem`` tipped a ``COUNT(DISTINCT)``'s sort (or a GROUP BY's)
into writing all its rows to temporary files, a step of 10–35 % of the statement's time that told
the row's presence (benchmarks/work_mem_step.py). Here the service role's ``work_mem`` is 64 kB
(the least PostgreSQL allows, set as the role's default, which dpproxy does not pin) and its
``log_temp_files`` 0, so PostgreSQL logs every temporary file it writes for it, with the client's
``application_name`` (which its backend session takes on) and the statement: every construct that
sorts or hashes rows, at filters below, across and far past any 64 kB edge, in and out of a
transaction block, must write none. On a PostgreSQL of this module's own: the role's settings
would reach every other test's sorts on the shared one.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import ATTACK_POLICY_HEAD, TEST_DATABASE, RunningProxy, refused_uncharged, spent_epsilon
from explained_plans import explained_after_step, plan_nodes
from own_postgres import OwnServer, own_postgres

from policies.loader import parse_policy
from proxy.demo.embedded import SERVICE_ROLE
from rewriter.dp_query import AggregateQuery, plan_aggregate_query
from rewriter.rewrite import backend_sql, grouped_values, partition_seed
from policies.model import ColumnPolicy
from policies.tables import ColumnInfo, Relation
from rewriter.sort_memory import (GROUP_BYTES, MIN_ROW_BYTES, NUMERIC_STATE_BYTES, ROW_BYTES, SLACK_BYTES, memory_steps,
                                  numeric_total_bytes, sort_memory_kb_sql, sort_memory_refusal)

ROWS = 20_000

# Repeats off: a statement asked again must run again, its setting step with it.
POLICY = ATTACK_POLICY_HEAD.replace("repeats: {{enabled: true}}", "repeats: {{enabled: false}}") + """\
  public.events:
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
{extra}    columns:
      id: {{bounds: [0, {rows}]}}
      age: {{bounds: [0, 100], group_by: true}}
      t: {{categories: [x]}}
      cat: {{categories: [a, b, c], group_by: true}}
      label: {{categories: [a, b], group_by: true, other: other}}
      code: {{categories: [c0, c1, c2, c3, c4, c5, c6, c7, c8, c9], group_by: true, other: other}}
      score: {{bounds: [0, 10], group_by: true}}
      n: {{bounds: [0, 100], avg: sample_aggregate}}
      ts: {{bounds: ["2024-01-01", "2025-12-31"], group_by: [month]}}
{views}  public.growing:
    access: protected
    epsilon: 1.0
    max_sort_memory_mb: 1
    columns:
      id: {{bounds: [0, {rows}]}}
      t: {{categories: [x]}}
  public.parts:
    access: protected
    epsilon: 1.0
    columns:
      id: {{bounds: [0, {rows}]}}
      t: {{categories: [x]}}
"""

# The protected views: one that joins events with 50 rows each, a simple view of events, a simple view of that.
VIEWS = ("expanded", "narrow", "narrower")
_VIEW_POLICY = """\
  public.{view}:
    access: protected
    epsilon: 1.0
{{view_extra}}    columns:
      id: {{{{bounds: [0, {{rows}}]}}}}
      t: {{{{categories: [x]}}}}
"""
POLICY = POLICY.replace("{views}", "".join(_VIEW_POLICY.format(view=view) for view in VIEWS))

# Each construct whose backend SQL sorts or hashes the rows a filter reaches.
SORTING = (
    "SELECT COUNT(DISTINCT t) FROM events WHERE id <= {k}",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY age) FROM events WHERE id <= {k}",
    "SELECT MIN(age) FROM events WHERE id <= {k}",
    "SELECT cat, COUNT(DISTINCT t) FROM events WHERE id <= {k} GROUP BY cat",
)
# Each GROUP BY of plain aggregates over declared keys (a category's, with other, of ten categories, an
# integer's, of distinct integers, a month's, a month of the year's buckets): its groups are its cells, whatever values the rows hold.
GROUPED = (
    "SELECT cat, COUNT(*) FROM events WHERE id <= {k} GROUP BY cat",
    "SELECT label, COUNT(*), SUM(age) FROM events WHERE id <= {k} GROUP BY label",
    "SELECT code, COUNT(*) FROM events WHERE id <= {k} GROUP BY code",  # ten categories: a hashed list
    "SELECT age, COUNT(*) FROM events WHERE id <= {k} GROUP BY age",
    "SELECT score, COUNT(*) FROM events WHERE id <= {k} GROUP BY score",  # distinct values, most past the bounds
    "SELECT date_trunc('month', ts) AS m, COUNT(*) FROM events WHERE id <= {k} GROUP BY 1",
    "SELECT EXTRACT(MONTH FROM ts) AS m, COUNT(*), SUM(age) FROM events WHERE id <= {k} GROUP BY 1",
)
# 101 cells, each with an exact sum of values of 16,383 fraction digits (~34 kB a cell): ~9 MB.
WIDE_SUMS = "SELECT age, SUM(n) FROM events WHERE id <= {k} GROUP BY age"
# Filters below, across and far past the 64 kB edge of each (about 500 rows for a sort of these).
FILTERS = (100, 600, 2_500, ROWS)


@pytest.fixture(scope="module")
def server() -> Iterator[OwnServer]:
    with own_postgres(TEST_DATABASE, "dpproxy-test-sort-memory-") as own:
        with psycopg.connect(own.admin_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE events (id integer, age integer, t text, cat text, label text, n numeric, "
                         "ts timestamp, code text, score integer)")
            # Distinct values that every row holds (the cat and label columns' raw values are
            # distinct too: before, a key grouped by them first), in id order: the analyst's filter
            # picks the first k. Half the n values have 16,383 fraction digits in 7 bytes, which
            # widen each group's exact sum to ~34 kB; the ages come in runs of 200 rows, so that
            # each new age's group arrives after the earlier groups' sums have widened (a hash
            # aggregate checks its memory as it adds a group).
            conn.execute(f"INSERT INTO events SELECT i, (i - 1) * 100 / {ROWS}, md5(i::text), "
                         f"CASE WHEN i % 4 = 0 THEN 'a' ELSE md5(i::text) END, "
                         f"CASE WHEN i % 3 = 0 THEN 'b' ELSE md5(i::text) END, "
                         f"CASE WHEN i % 2 = 0 THEN CAST('1e-16383' AS numeric) ELSE 99.5 END, "
                         f"TIMESTAMP '2024-01-01' + i * INTERVAL '50 minutes', "
                         f"CASE WHEN i % 5 = 0 THEN 'c' || (i % 10) ELSE md5(i::text) END, i "
                         f"FROM generate_series(1, {ROWS}) i")
            conn.execute("VACUUM ANALYZE events")
            conn.execute("CREATE TABLE parts (id integer, t text) PARTITION BY RANGE (id)")
            conn.execute("CREATE TABLE parts_low PARTITION OF parts FOR VALUES FROM (0) TO (10000)")
            conn.execute("CREATE TABLE parts_high PARTITION OF parts FOR VALUES FROM (10000) TO (MAXVALUE)")
            conn.execute(f"INSERT INTO parts SELECT i, md5(i::text) FROM generate_series(1, {ROWS}) i")
            conn.execute("VACUUM ANALYZE parts")
            # A view that joins its table with another: 50 rows for each of the table's; a simple
            # view of the table (its rows, its columns); a simple view of that view.
            # A table of 100 rows at load, grown past its 1 MB ceiling by a test.
            conn.execute("CREATE TABLE growing (id integer, t text)")
            conn.execute("INSERT INTO growing SELECT i, md5(i::text) FROM generate_series(1, 100) i")
            conn.execute("CREATE TABLE copies (c integer)")
            conn.execute("INSERT INTO copies SELECT generate_series(1, 50)")
            conn.execute("CREATE VIEW expanded AS SELECT e.id, e.t FROM events e CROSS JOIN copies")
            conn.execute("CREATE VIEW narrow AS SELECT id, t FROM events WHERE age < 95")
            conn.execute("CREATE VIEW narrower AS SELECT id AS id, t FROM narrow WHERE id > 0")
            conn.execute(f"GRANT SELECT ON events, parts, parts_low, parts_high, copies, expanded, narrow, narrower, growing "
                         f"TO {SERVICE_ROLE}")
            conn.execute(f"ALTER ROLE {SERVICE_ROLE} SET work_mem = '64kB'")
            # An operator's planner setting that would make a GROUP BY sort its rows.
            conn.execute(f"ALTER ROLE {SERVICE_ROLE} SET enable_hashagg = off")
            conn.execute(f"ALTER ROLE {SERVICE_ROLE} SET log_temp_files = 0")
            conn.execute(f"ALTER ROLE {SERVICE_ROLE} SET log_min_error_statement = log")
            conn.execute("ALTER SYSTEM SET log_line_prefix = '%m [%p] %a: '")
            conn.execute("SELECT pg_reload_conf()")
        yield own


def _proxy(server: OwnServer, tmp_path: Path, extra: str = "", view_extra: str = "") -> RunningProxy:
    text = POLICY.format(dsn=server.service_dsn, ledger=tmp_path / "ledger.sqlite3", rows=ROWS, extra=extra,
                         view_extra=view_extra)
    return RunningProxy(parse_policy(text, "sort-memory.yaml"))


@pytest.fixture(scope="module")
def proxy(server: OwnServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    running = _proxy(server, tmp_path_factory.mktemp("sort-memory"))
    try:
        yield running
    finally:
        running.stop()


APPLICATION = "sort-memory-test"  # in the log's line prefix: the lines of this test's statements


@contextmanager
def temporary_files(server: OwnServer) -> Iterator[list[str]]:
    """The log lines of the temporary files PostgreSQL wrote for ``APPLICATION``'s statements in the
    block but dpproxy's own on the catalog (filled in at its end). Each file is logged when it is
    removed, at the latest when the statement's transaction ends, before dpproxy has its rows. A DP
    statement's, removed as its pipeline's transaction ends, is logged without its statement; a
    simple query's is followed by it (``log_min_error_statement``), which tells a checkout's
    reading of the settings (from ``pg_settings``, sorted by name: past 64 kB too) apart."""
    log = server.data / "log"
    start = log.stat().st_size
    found: list[str] = []
    yield found
    with log.open("rb") as text:
        text.seek(start)
        lines = text.read().decode(errors="replace").splitlines()
    for line, after in zip(lines, [*lines[1:], ""]):
        if f"{APPLICATION}: LOG:  temporary file:" in line and not ("STATEMENT:" in after and "pg_settings" in after):
            found.append(line)


def _connect(proxy: RunningProxy, autocommit: bool = True) -> psycopg.Connection:
    return proxy.connect(autocommit=autocommit, application_name=APPLICATION)


def test_the_detector_sees_a_sort_past_64_kb(server: OwnServer) -> None:
    """As the service role, the DP statement's SQL on every row, sent straight to PostgreSQL, spills."""
    with temporary_files(server) as found, \
            psycopg.connect(server.service_dsn, autocommit=True, application_name=APPLICATION) as conn:
        conn.execute("SELECT count(DISTINCT t) FROM (SELECT t FROM events ORDER BY random()) AS s").fetchall()
    assert found


@pytest.mark.parametrize("sql", SORTING + GROUPED + (WIDE_SUMS,))
def test_no_filter_tips_a_dp_statements_sort_into_spilling(proxy: RunningProxy, server: OwnServer, sql: str) -> None:
    with temporary_files(server) as found, _connect(proxy) as conn:
        for k in FILTERS:
            assert conn.execute(sql.format(k=k)).fetchall()
    assert found == []


def test_in_a_block_the_statement_sorts_in_memory_and_the_blocks_work_mem_is_given_back(
    proxy: RunningProxy, server: OwnServer
) -> None:
    with temporary_files(server) as found, _connect(proxy, autocommit=False) as conn:
        for k in FILTERS:
            for sql in (SORTING[0], GROUPED[0]):
                assert conn.execute(sql.format(k=k)).fetchall()
                assert _block_settings(conn) == ("64kB", "on", "off")
        conn.commit()
        assert _block_settings(conn) == ("64kB", "on", "off")
        conn.rollback()
    assert found == []


def _block_settings(conn: psycopg.Connection) -> tuple[str, ...]:
    """The session's work_mem, enable_sort and enable_hashagg, as a client reads them."""
    return tuple(str(conn.execute(f"SHOW {name}").fetchone()[0]) for name in ("work_mem", "enable_sort", "enable_hashagg"))


def test_a_group_by_on_a_table_above_the_ceiling_is_answered_within_its_cells_memory(
    server: OwnServer, tmp_path: Path
) -> None:
    """The table's bound (~20 MB) is above a ceiling of 1 MB, yet a GROUP BY of counts and integer
    sums over declared keys is answered and charged, its groups' hash within 64 kB's role default
    raised to its cells' bound (under 1 MB), whatever the filter: no temporary file. Before, it was
    refused (54000), its groups sized by the rows' raw values. A GROUP BY whose cells' exact
    numeric sums need more than the ceiling (~9 MB here) is still refused, uncharged."""
    running = _proxy(server, tmp_path, extra="    max_sort_memory_mb: 1\n")
    try:
        with temporary_files(server) as found, _connect(running) as conn:
            for sql in GROUPED:
                for k in FILTERS:
                    spent = spent_epsilon(conn)
                    assert conn.execute(sql.format(k=k)).fetchall()
                    assert spent_epsilon(conn) > spent
        assert found == []
        refused = refused_uncharged(running, WIDE_SUMS.format(k=600))
        assert refused.sqlstate == "54000" and "(rule: sort-memory)" in str(refused), refused
    finally:
        running.stop()


@pytest.mark.parametrize("sql", GROUPED + (WIDE_SUMS,))
def test_a_group_by_hashes_its_cells_and_never_sorts_rows(proxy: RunningProxy, server: OwnServer, sql: str) -> None:
    """The backend SQL, after its setting step, as the service role under the operator's
    ``enable_hashagg = off`` and 64 kB (the role's): PostgreSQL hashes, every aggregate node holds at most the
    cells' groups (a category key groups by the row's cell, not its ~15,000 raw values) and no
    node sorts or spills."""
    plan = _plan(proxy, sql.format(k=ROWS))
    steps = memory_steps(plan, in_block=False)
    assert steps is not None and steps.restore is None
    with psycopg.connect(server.service_dsn) as conn:
        assert conn.execute("SHOW enable_hashagg").fetchone() == ("off",)
    nodes = list(plan_nodes(explained_after_step(server.service_dsn, plan)))
    aggregates = [node for node in nodes if node["Node Type"] == "Aggregate"]
    assert aggregates and all(node["Strategy"] == "Hashed" for node in aggregates), aggregates
    assert not [node for node in nodes if "Sort" in node["Node Type"]]
    assert max(node["Actual Rows"] for node in aggregates) <= grouped_values(plan)
    assert all(node.get("HashAgg Batches", 1) == 1 and not node.get("Disk Usage") for node in aggregates)


NOT_SORTING = (
    "SELECT COUNT(*) FROM events WHERE id <= 600",
    "SELECT SUM(age) FROM events WHERE id <= 600",
    "SELECT AVG(age) FROM events WHERE id <= 600",  # sum and count, the policy default
    "SELECT VARIANCE(age) FROM events WHERE id <= 600",
    "SELECT MODE() WITHIN GROUP (ORDER BY cat) FROM events WHERE id <= 600",
    "SELECT COUNT(*), SUM(age) FROM events WHERE id <= 600",
)


def _table(proxy: RunningProxy, name: str) -> Relation:
    (table,) = (relation for relation in proxy.server.registry.by_oid.values() if relation.name == name)
    return table


def _plan(proxy: RunningProxy, sql: str) -> AggregateQuery:
    return plan_aggregate_query(sql, _table(proxy, "events"))


def test_the_bound_of_a_partitioned_table_counts_its_partitions_pages(proxy: RunningProxy, server: OwnServer) -> None:
    """A partitioned table has no pages of its own: its bound, at load and in each statement's step,
    adds up its partitions'; a plain table's reads its own size alone (the cheaper step)."""
    parts, events = _table(proxy, "parts"), _table(proxy, "events")
    assert parts.sort_memory_tree and not events.sort_memory_tree
    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        (leaves,) = conn.execute("SELECT pg_relation_size('parts_low') + pg_relation_size('parts_high')").fetchone()
        (stepped,) = conn.execute(f"SELECT {sort_memory_kb_sql(parts.oid, True)}").fetchone()
        (own,) = conn.execute(f"SELECT {sort_memory_kb_sql(parts.oid, False)}").fetchone()
    assert leaves > 1_000_000
    covered = -(-((leaves + SLACK_BYTES) // MIN_ROW_BYTES + 1) * ROW_BYTES // 1024)
    assert parts.sort_memory_kb == stepped == covered
    assert own < covered // 10  # its own size: none
    with _connect(proxy) as conn:
        assert conn.execute("SELECT COUNT(DISTINCT t) FROM parts WHERE id <= 5000").fetchall()


@pytest.mark.parametrize("sql", NOT_SORTING)
def test_a_statement_that_sorts_nothing_gets_no_setting_step(proxy: RunningProxy, sql: str) -> None:
    """COUNT, SUM and the other plain aggregates run as before, with no step more (their speed), and
    their backend SQL indeed neither sorts nor groups."""
    plan = _plan(proxy, sql)
    assert memory_steps(plan, in_block=False) is None
    text = backend_sql(plan, seed=partition_seed())
    assert not re.search(r"GROUP BY|ORDER BY|DISTINCT", text), text
    with _connect(proxy) as conn:
        assert conn.execute(sql).fetchall()


@pytest.mark.parametrize("sql", SORTING + GROUPED)
def test_every_statement_that_sorts_or_groups_gets_the_setting_step(proxy: RunningProxy, sql: str) -> None:
    plan = _plan(proxy, sql.format(k=600))
    assert re.search(r"GROUP BY|ORDER BY|DISTINCT", backend_sql(plan, seed=partition_seed()))
    steps = memory_steps(plan, in_block=False)
    assert steps is not None and steps.restore is None
    in_block = memory_steps(plan, in_block=True)
    assert in_block is not None and in_block.restore is not None


def test_above_the_ceiling_the_sorting_statements_are_refused_uncharged(
    server: OwnServer, tmp_path: Path
) -> None:
    """The table's bound (~13 MB: 1.3 MB of pages, each able to hold 291 rows of 256 bytes) is
    above a ceiling of 1 MB: the statements that sort are refused before any charge, with 54000 and
    a hint naming the setting; COUNT is answered; with answer_quantum_ms they are answered too."""
    running = _proxy(server, tmp_path, extra="    max_sort_memory_mb: 1\n")
    try:
        for sql in SORTING:
            refused = refused_uncharged(running, sql.format(k=600))
            assert refused.sqlstate == "54000", refused
            assert "(rule: sort-memory)" in str(refused)
            assert refused.diag.message_hint is not None and "max_sort_memory_mb" in refused.diag.message_hint
            assert "Nothing was charged" in refused.diag.message_hint
        with running.connect() as conn:
            spent = spent_epsilon(conn)
            assert conn.execute("SELECT COUNT(*) FROM events WHERE id <= 600").fetchall()
            assert spent_epsilon(conn) > spent
    finally:
        running.stop()
    (tmp_path / "quantum").mkdir()
    quantum = _proxy(server, tmp_path / "quantum", extra="    max_sort_memory_mb: 1\n    answer_quantum_ms: 1\n")
    try:
        with quantum.connect() as conn:
            # With a quantum the operator's work_mem holds, so a sort within 64 kB is answered.
            assert conn.execute(SORTING[0].format(k=100)).fetchall()
    finally:
        quantum.stop()



VIEW_SORTING = "SELECT COUNT(DISTINCT t) FROM {view} WHERE id <= {k}"
ONE_MB = "    max_sort_memory_mb: 1\n"


@pytest.mark.parametrize("ceiling", ["1 MB", "256 MB"])
def test_a_view_that_expands_its_rows_refuses_its_sorting_statements_uncharged(
    proxy: RunningProxy, server: OwnServer, tmp_path: Path, ceiling: str
) -> None:
    """``expanded`` joins each row of events with 50 others: no pages bound its rows, so the
    ceiling was its only bound and, past it, its COUNT(DISTINCT)'s sort spilled at a filter the
    analyst chose (before: temporary files at 1 MB from k = 600). Now refused before any charge,
    54000, the hint naming answer_quantum_ms, whatever the ceiling; its COUNT is answered."""
    running = _proxy(server, tmp_path, view_extra=ONE_MB) if ceiling == "1 MB" else proxy
    try:
        with temporary_files(server) as found:
            refusals = [_answered_or_refused(running, VIEW_SORTING.format(view="expanded", k=k)) for k in FILTERS]
        assert found == []  # before: the sort's temporary files, from the filter that tipped it
        for refused in refusals:
            assert refused is not None and refused.sqlstate == "54000", refused
            assert "(rule: sort-memory)" in str(refused)
            assert refused.diag.message_hint is not None and "answer_quantum_ms" in refused.diag.message_hint
        with _connect(running) as conn:
            assert conn.execute("SELECT COUNT(*) FROM expanded WHERE id <= 600").fetchall()
    finally:
        if running is not proxy:
            running.stop()


def _answered_or_refused(proxy: RunningProxy, sql: str) -> psycopg.Error | None:
    """None when ``sql`` is answered through ``proxy`` (and charged); its error when it is
    refused, once nothing was charged for it."""
    with _connect(proxy) as conn:
        spent = spent_epsilon(conn)
        try:
            assert conn.execute(sql).fetchall()
        except psycopg.Error as error:
            assert spent_epsilon(conn) == spent
            return error
        assert spent_epsilon(conn) > spent
    return None


@pytest.mark.parametrize("view", ["narrow", "narrower"])
def test_a_simple_view_is_bounded_by_its_tables_pages(
    proxy: RunningProxy, server: OwnServer, tmp_path: Path, view: str
) -> None:
    """``narrow`` (events' rows and columns, filtered) and ``narrower`` (a simple view of it) hold
    at most events' rows, each with its values: their bound is events', read from events' pages.
    At 256 MB their COUNT(DISTINCT) is answered, with no temporary file; at a ceiling of 1 MB, below
    events' bound (~13 MB), refused before any charge as events' is (before: answered under the
    ceiling, 1 MB, and spilling at the filters past it)."""
    relation, events = _table(proxy, view), _table(proxy, "events")
    assert relation.sort_memory_bases == (events.oid,) and relation.sort_memory_kb == events.sort_memory_kb
    with temporary_files(server) as found:
        assert all(_answered_or_refused(proxy, VIEW_SORTING.format(view=view, k=k)) is None for k in FILTERS)
    assert found == []
    running = _proxy(server, tmp_path, view_extra=ONE_MB)
    try:
        with temporary_files(server) as found:
            refusals = [_answered_or_refused(running, VIEW_SORTING.format(view=view, k=k)) for k in FILTERS]
        assert found == []
        assert all(refused is not None and refused.sqlstate == "54000" for refused in refusals), refusals
    finally:
        running.stop()


def test_a_table_grown_past_its_ceiling_after_load_still_sorts_in_memory(server: OwnServer, tmp_path: Path) -> None:
    """``growing`` had 100 rows (a bound below its 1 MB ceiling) when the policy was loaded; grown
    to 20,000 (~13 MB) since, its COUNT(DISTINCT) runs with ``work_mem`` at its bound read by the
    statement's own step, never the load's: no temporary file at any filter. It is answered
    until a reload refuses it (rewriter/sort_memory.py, "The ceiling")."""
    running = _proxy(server, tmp_path)
    try:
        with psycopg.connect(server.admin_dsn, autocommit=True) as admin:
            admin.execute(f"INSERT INTO growing SELECT i, md5(i::text) FROM generate_series(101, {ROWS}) i")
        with temporary_files(server) as found:
            assert all(_answered_or_refused(running, f"SELECT COUNT(DISTINCT t) FROM growing WHERE id <= {k}") is None
                       for k in FILTERS)
        assert found == []
    finally:
        running.stop()
        with psycopg.connect(server.admin_dsn, autocommit=True) as admin:
            admin.execute("TRUNCATE growing")
            admin.execute("INSERT INTO growing SELECT i, md5(i::text) FROM generate_series(1, 100) i")


# Sorting statements whose groups each keep an exact numeric total: a percentile's grid indices
# beside a numeric SUM (with and without GROUP BY), sample and aggregate's partitions of a numeric AVG.
WIDE_SORTING = (
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY id), SUM(n) FROM events WHERE id <= {k}",
    "SELECT AVG(n) FROM events WHERE id <= {k}",
    "SELECT age, percentile_cont(0.5) WITHIN GROUP (ORDER BY id), SUM(n) FROM events WHERE id <= {k} GROUP BY age",
)


def _spilled(server: OwnServer, plan: AggregateQuery) -> list[dict[str, Any]]:
    """The sort and aggregate nodes that wrote to disk when ``plan``'s backend SQL ran after its
    setting step, as the service role with hashing on (the planner's choice where an operator has
    not turned it off: it estimates a ``numeric`` state far below 34 kB), read from ``EXPLAIN
    (ANALYZE)`` (deterministic, where a direct session's temporary files may reach the log after
    it is read)."""
    return [node for node in plan_nodes(explained_after_step(server.service_dsn, plan, "SET enable_hashagg = on"))
            if node.get("HashAgg Batches", 1) > 1 or node.get("Disk Usage") or node.get("Sort Space Type") == "Disk"]


@pytest.mark.parametrize("sql", WIDE_SORTING)
def test_a_sorting_statements_numeric_totals_are_weighed_per_group(server: OwnServer, tmp_path: Path, sql: str) -> None:
    """At a ceiling just above events' bound, each group's exact numeric total (~34 kB: values of
    99.5 and 1e-16383) outgrew the 256 bytes a row: a percentile's 10,000 grid cells of two rows
    beside a numeric SUM, hashed, spilled, with or without GROUP BY (at 1,000 cells of 20 rows and
    14 MB: a peak of 28.7 MB, 5 batches, 224 kB on disk). Now weighed per group (``NUMERIC_STATE_BYTES``), such a statement, and
    sample and aggregate's 512 partitions of a numeric AVG (16.7 MB, within this table's bound's
    hash memory), are refused uncharged where that is above the ceiling, and never spill where answered."""
    with psycopg.connect(server.admin_dsn) as conn:
        (kb,) = conn.execute(f"SELECT {sort_memory_kb_sql('CAST(%s AS regclass)', False)}", ("events",)).fetchone()
    # 10,000 grid cells of id: two rows a cell, one of each value, so each group's total widens.
    running = _proxy(server, tmp_path, extra=f"    max_sort_memory_mb: {-(-kb // 1024)}\n    quantile_cells: 10000\n")
    try:
        plan = plan_aggregate_query(sql.format(k=ROWS), _table(running, "events"))
        assert sort_memory_refusal(plan) is not None or _spilled(server, plan) == []
        refused = _answered_or_refused(running, sql.format(k=600))
        assert refused is not None and refused.sqlstate == "54000" and "(rule: sort-memory)" in str(refused), refused
    finally:
        running.stop()


@pytest.mark.parametrize("sql", WIDE_SORTING[:2])
def test_a_sorting_statements_numeric_totals_fit_its_setting(proxy: RunningProxy, server: OwnServer, sql: str) -> None:
    """Within the ceiling (256 MB) they are answered, and their groups' hash tables never spill."""
    assert _spilled(server, _plan(proxy, sql.format(k=ROWS))) == []
    with temporary_files(server) as found:
        assert _answered_or_refused(proxy, sql.format(k=ROWS)) is None
    assert found == []


def test_sample_and_aggregates_numeric_partition_sums_are_weighed_as_exact_totals(
    proxy: RunningProxy, server: OwnServer, tmp_path: Path
) -> None:
    """A sample-and-aggregate AVG of a ``numeric`` column sums each of its 512 partitions exactly:
    each partition's state is weighed as an exact total's 40 kB (twice: ~41 MB on top of events'
    ~13 MB bound), so at a ceiling 20 MB above the bound it is refused uncharged, where at a sum's
    1 kB a state (~2.5 MB) it would be answered; MIN of an integer column (by sample and aggregate
    too, its partitions keeping a value each) is answered."""
    events = _table(proxy, "events")
    running = _proxy(server, tmp_path, extra=f"    max_sort_memory_mb: {-(-events.sort_memory_kb // 1024) + 20}\n")
    try:
        refused = _answered_or_refused(running, "SELECT AVG(n) FROM events WHERE id <= 600")
        assert refused is not None and refused.sqlstate == "54000" and "(rule: sort-memory)" in str(refused), refused
        assert _answered_or_refused(running, "SELECT MIN(age) FROM events WHERE id <= 600") is None
    finally:
        running.stop()


@pytest.mark.parametrize(("precision", "scale", "values"), [
    (12, 2, ("9999999999.99", "-0.01")),
    (30, 10, ("99999999999999999999.9999999999", "-0.0000000001")),
    (1000, 900, ("9" * 100 + "." + "9" * 900, "-0." + "0" * 899 + "1")),
])
def test_a_declared_numerics_group_total_takes_no_more_than_it_is_weighed(
        server: OwnServer, precision: int, scale: int, values: tuple[str, str]) -> None:
    """A ``numeric(p, s)`` column's exact total spans at most its declared digits and its bounds',
    so it is weighed by them (:func:`rewriter.sort_memory.numeric_total_bytes`), not at an
    unconstrained total's 40 kB: 1,000 groups of its widest and its least values, hashed, take at
    most that and a group's ``GROUP_BYTES`` each."""
    declared = f"numeric({precision}, {scale})"
    column = ColumnInfo("n", 1700, ((precision << 16) | scale) + 4, 1, ColumnPolicy(bounds=(-1e300, 1e300)))
    weighed = numeric_total_bytes(column)
    assert weighed < NUMERIC_STATE_BYTES
    with psycopg.connect(server.admin_dsn) as conn:
        conn.execute(f"CREATE TEMPORARY TABLE wide_totals (g integer, n {declared})")
        conn.execute("INSERT INTO wide_totals SELECT i %% 1000, CASE WHEN i %% 2 = 0 THEN %s::numeric ELSE %s::numeric END "
                     "FROM generate_series(1, 20000) AS i", values)
        conn.execute("SET work_mem = '512MB'")
        conn.execute("SET enable_sort = off")
        (explained,) = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) SELECT g, sum(LEAST(GREATEST(n, -1e300), 1e300)) "
                                    "FROM wide_totals GROUP BY g").fetchone()
    node = explained[0]["Plan"]
    assert node["Strategy"] == "Hashed" and node["Actual Rows"] == 1000, node
    assert node["Peak Memory Usage"] * 1024 <= 1000 * (weighed + GROUP_BYTES), (node["Peak Memory Usage"], weighed)
