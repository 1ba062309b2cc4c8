"""The sample-and-aggregate partition key: by default (``auto``) a keyed hash of the primary
key's values where there is one, else ``random()``; with ``partitioning: row_hash`` a keyed hash
of the primary key or of every hashable column; with ``partitioning: ctid_hash`` a keyed hash of
each row's ctid, refused where there is no usable ctid; and plans PostgreSQL can run in parallel.

Privacy rests on a row's partition depending on that row alone (rewriter/rewrite.py's module
docstring): pinned here for ``row_hash`` on two neighbouring tables loaded separately, in
different orders, for many fresh seeds, and for ``ctid_hash`` on a real table by deleting and
inserting other rows. The row hash must not raise for any value of any column type a table can
hold (else it would tell whether a filter matches a row): pinned on a table of every kind of
column, NULLs and extreme values included.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from scipy import stats

from conftest import TEST_POLICY, TestDatabase, make_policy, policy_registry

from policies.loader import PolicyError
from policies.tables import Relation, TableRegistry
from proxy.demo.embedded import SERVICE_ROLE
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import HASH_FUNCTIONS, backend_sql, partition_key, partition_seed, seeded, split_row
from rewriter.text_bounds import read_through

M = 16
KEY_POLICY = TEST_POLICY[: TEST_POLICY.index("tables:")] + f"""
tables:
  public.pk_table: &keyed
    epsilon: 1.0
    delta: 1.0e-6
    partitions: {M}
    avg: sample_aggregate  # AVG is partitioned only by sample and aggregate (the default is sum_count)
    partitioning: ctid_hash
    columns: &columns
      v: {{{{bounds: [0, 100]}}}}
      partition: {{{{bounds: [0, 100]}}}}
  public.pk_parted: *keyed
  public.pk_view:
    epsilon: 1.0
    partitions: {M}
    avg: sample_aggregate
    columns: *columns
  public.pk_random:
    epsilon: 1.0
    partitions: {M}
    avg: sample_aggregate
    partitioning: random
    columns: *columns
  public.nb_keyed_small: &keyed_rows
    epsilon: 1.0
    delta: 1.0e-6
    partitions: {M}
    avg: sample_aggregate
    columns:
      v: {{{{bounds: [0, 100]}}}}
  public.nb_keyed_large: *keyed_rows
  public.nb_small: &rows
    <<: *keyed_rows
    partitioning: row_hash
  public.nb_large: *rows
  public.pk_types:
    epsilon: 1.0
    delta: 1.0e-6
    partitions: {M}
    avg: sample_aggregate
    partitioning: row_hash
    columns:
      v: {{{{bounds: [0, 100]}}}}
      f8: {{{{bounds: [-1.0, 1.0]}}}}
      n: {{{{bounds: [-1.0, 1.0]}}}}
  public.pk_date_key: *rows
  public.pk_date_key_auto: *keyed_rows
  public.pk_unhashable:
    epsilon: 1.0
    avg: sample_aggregate
    partitioning: row_hash
"""

_TABLES = """
DROP VIEW IF EXISTS pk_view;
DROP TABLE IF EXISTS pk_table, pk_parted;
CREATE TABLE pk_table (v integer, partition integer);
INSERT INTO pk_table SELECT i % 101, i % 7 FROM generate_series(1, 2000) i;
CREATE VIEW pk_view AS SELECT * FROM pk_table;
CREATE TABLE pk_parted (v integer, partition integer) PARTITION BY RANGE (v);
CREATE TABLE pk_parted_low PARTITION OF pk_parted FOR VALUES FROM (MINVALUE) TO (50);
CREATE TABLE pk_parted_high PARTITION OF pk_parted FOR VALUES FROM (50) TO (MAXVALUE);
INSERT INTO pk_parted SELECT * FROM pk_table;
DROP TABLE IF EXISTS pk_random, nb_small, nb_large, nb_keyed_small, nb_keyed_large, pk_types, pk_date_key, pk_date_key_auto,
  pk_unhashable;
DROP DOMAIN IF EXISTS pk_small_int;
CREATE TABLE pk_random AS SELECT * FROM pk_table;
-- Neighbouring tables: nb_large is nb_small plus one row, loaded on its own in another order,
-- so that the rows they share sit at other ctids. A few rows are NULL in some column, and
-- rows 1-10 appear twice (duplicates share a partition: a function of the row alone).
CREATE TABLE nb_small (v integer, label text, w double precision);
INSERT INTO nb_small SELECT i % 101, CASE WHEN i % 13 = 0 THEN NULL ELSE 'row ' || i END,
       CASE WHEN i % 17 = 0 THEN NULL ELSE i / 7.0 END
FROM generate_series(1, 2000) i;
INSERT INTO nb_small SELECT * FROM nb_small WHERE label IN ('row 1', 'row 2', 'row 3', 'row 4', 'row 5', 'row 6', 'row 7', 'row 8', 'row 9', 'row 10');
CREATE TABLE nb_large (v integer, label text, w double precision);
INSERT INTO nb_large SELECT * FROM (SELECT * FROM nb_small UNION ALL SELECT 42, 'the extra row', NULL) AS t ORDER BY md5(t::text);
CREATE TABLE nb_keyed_small (id bigint PRIMARY KEY, v integer);
INSERT INTO nb_keyed_small SELECT i, i % 101 FROM generate_series(1, 2000) i;
CREATE TABLE nb_keyed_large (id bigint PRIMARY KEY, v integer);
INSERT INTO nb_keyed_large SELECT * FROM (SELECT * FROM nb_keyed_small UNION ALL SELECT 5000, 42) AS t ORDER BY md5(t::text);
-- Every kind of column: the hashable types (HASH_FUNCTIONS), and others that must be left out
-- of the hash (some have no extended hash function at all, json, point and xml among them;
-- pgserver's build has no libxml, so xml holds only NULLs).
CREATE DOMAIN pk_small_int AS integer;
CREATE TABLE pk_types (
  v integer, b boolean, i2 smallint, i8 bigint, f4 real, f8 double precision, n numeric, t text,
  vc varchar(20), c char(3), ts timestamp, u uuid,
  d date, tz timestamptz, j json, jb jsonb, pt point, x xml, arr integer[], bin bytea,
  iv interval, ip inet, dom pk_small_int
);
INSERT INTO pk_types VALUES
  (NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
   NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
  (0, true, -32768, -9223372036854775808, 'NaN', 'NaN', 'NaN', '', '', '', '-infinity',
   '00000000-0000-0000-0000-000000000000', '-infinity', '-infinity', '{}', '{}', '(0,0)', NULL, '{}', '',
   '-178000000 years', '::1', -1),
  (100, false, 32767, 9223372036854775807, 'Infinity', '-Infinity', 'Infinity', repeat('é', 5000), 'x',
   'abc', 'infinity', 'ffffffff-ffff-ffff-ffff-ffffffffffff', 'infinity', 'infinity', '[1, "a"]', '{"a": null}',
   '(1e300,-1e300)', NULL, '{1,NULL,3}', '\\x00ff', '178000000 years', '10.0.0.1', 2147483647),
  (50, true, 0, 0, '-0', '-0', '-Infinity', 'text', 'várchar', 'ab', '4713-01-01 BC 00:00',
   'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '5874897-12-31', '294276-12-31 23:59:59+00', 'null', '1', '(NaN,NaN)',
   NULL, '{NULL}', '\\x', '0', '::', 0),
  (7, NULL, 1, NULL, 1e-38, 1e308, 1e-300, NULL, NULL, NULL, '294276-12-31 23:59:59', NULL,
   NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
-- A primary key of a type the hash leaves out: all hashable columns are hashed instead.
CREATE TABLE pk_date_key (day date PRIMARY KEY, v integer);
INSERT INTO pk_date_key SELECT DATE '2000-01-01' + i, i % 101 FROM generate_series(1, 200) i;
CREATE TABLE pk_date_key_auto AS SELECT * FROM pk_date_key;
ALTER TABLE pk_date_key_auto ADD PRIMARY KEY (day);
-- No hashable column at all (so no column sample and aggregate could aggregate either).
CREATE TABLE pk_unhashable (d date, j json, dom pk_small_int);
"""


@pytest.fixture(scope="module")
def registry(test_db: TestDatabase) -> TableRegistry:
    """The tables above, and the policy's registry as dpproxy builds it when it starts."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(_TABLES)
        conn.execute(f"GRANT SELECT ON pk_table, pk_view, pk_parted, pk_random, nb_small, nb_large, nb_keyed_small, "
                     f"nb_keyed_large, pk_types, pk_date_key, pk_date_key_auto, pk_unhashable TO {SERVICE_ROLE}")
    return policy_registry(make_policy(test_db, Path("unused.sqlite3"), KEY_POLICY))


def _relation(registry: TableRegistry, name: str) -> Relation:
    return next(r for r in registry.by_oid.values() if r.name == name)


def _partitions(conn: psycopg.Connection, relation: Relation, seed: int, table: str | None = None) -> dict[str, int]:
    """Each row's partition under ``seed``, by ctid, computed by the key dpproxy writes."""
    sql = f"SELECT ctid::text, {read_through(partition_key(relation, seed))} FROM {table or relation.qualified_name}"
    return {ctid: int(p) for ctid, p in conn.execute(sql).fetchall()}


def test_a_view_cannot_be_partitioned_by_ctid_hash(test_db: TestDatabase, registry) -> None:
    policy = make_policy(test_db, Path("unused.sqlite3"), KEY_POLICY.replace(
        "  public.pk_view:\n    epsilon: 1.0\n", "  public.pk_view:\n    epsilon: 1.0\n    partitioning: ctid_hash\n"
    ))
    with pytest.raises(PolicyError, match="pk_view.partitioning: ctid_hash needs a table"):
        policy_registry(policy)


def test_partitioning_by_default_hashes_a_primary_key_and_is_random_without_one(registry):
    keyed = _relation(registry, "nb_keyed_small")  # no partitioning in the policy: auto
    assert (keyed.partition_key, keyed.hashed_columns) == ("row", ("id",))
    sql = backend_sql(plan_aggregate_query("SELECT AVG(v) FROM nb_keyed_small", keyed), seed=8)
    assert "hashint8extended(\"id\", 9)" in sql and "random" not in sql and "ctid" not in sql, sql
    for name in ("pk_view", "pk_date_key_auto"):  # no primary key; one the hash leaves out (date)
        relation = _relation(registry, name)
        assert (relation.partition_key, relation.hashed_columns) == ("random", ()), name
    view = _relation(registry, "pk_view")
    sql = backend_sql(plan_aggregate_query("SELECT AVG(v) FROM pk_view", view), seed=partition_seed())
    assert "pg_catalog.random()" in sql and "hash" not in sql and "ctid" not in sql
    assert _relation(registry, "pk_random").partition_key == "random"
    assert _relation(registry, "pk_table").partition_key == "ctid"
    assert _relation(registry, "pk_parted").partition_key == "ctid"
    table_sql = backend_sql(plan_aggregate_query("SELECT AVG(v) FROM pk_table", _relation(registry, "pk_table")), seed=7)
    assert "hashtidextended(ctid, 7)" in table_sql and "random" not in table_sql


def test_row_hash_hashes_the_primary_key_else_every_hashable_column(registry):
    assert _relation(registry, "nb_small").hashed_columns == ("v", "label", "w")
    # A primary key of a type the hash leaves out (date): every hashable column instead.
    assert _relation(registry, "pk_date_key").hashed_columns == ("v",)
    types = _relation(registry, "pk_types")
    assert types.hashed_columns == ("v", "b", "i2", "i8", "f4", "f8", "n", "t", "vc", "c", "ts", "u")
    assert {types.columns[name].type_oid for name in types.hashed_columns} == set(HASH_FUNCTIONS)  # each one tried
    # Nothing hashable (date, json, a domain): random(), rather than one partition for every row.
    unhashable = _relation(registry, "pk_unhashable")
    assert (unhashable.partition_key, unhashable.hashed_columns) == ("random", ())


def test_a_rows_partition_does_not_depend_on_the_other_rows(registry, admin):
    relation, seed = _relation(registry, "pk_table"), partition_seed()
    admin.execute("DROP TABLE IF EXISTS pk_scratch")
    admin.execute("CREATE TABLE pk_scratch AS SELECT * FROM pk_table")
    try:
        before = _partitions(admin, relation, seed, "pk_scratch")
        assert set(before.values()) == set(range(M))  # m partitions, every one used by 2000 rows
        removed = sorted(before)[100]
        admin.execute("DELETE FROM pk_scratch WHERE ctid = %s::tid", (removed,))
        admin.execute("VACUUM pk_scratch")  # the freed slot may go to the row inserted next
        admin.execute("INSERT INTO pk_scratch VALUES (50, 3)")
        after = _partitions(admin, relation, seed, "pk_scratch")
    finally:
        admin.execute("DROP TABLE IF EXISTS pk_scratch")
    kept = set(before) - {removed}
    assert len(after) == len(before) and kept < set(after)
    assert {ctid: after[ctid] for ctid in kept} == {ctid: before[ctid] for ctid in kept}
    assert set(after.values()) <= set(range(M))


def test_each_seed_gives_its_own_partitioning(registry, admin):
    relation = _relation(registry, "pk_table")
    assert _partitions(admin, relation, 12345) == _partitions(admin, relation, 12345)  # deterministic
    first, second = _partitions(admin, relation, 1), _partitions(admin, relation, 2)
    same = sum(first[ctid] == second[ctid] for ctid in first) / len(first)
    assert same < 3 / M  # ≈ 1/m for unrelated partitionings
    plan = plan_aggregate_query("SELECT MIN(v) FROM pk_table", relation)
    assert backend_sql(plan, seed=99) == backend_sql(plan, seed=99) != backend_sql(plan, seed=100)


def test_sample_and_aggregate_runs_on_tables_views_and_partitioned_tables(registry, admin):
    for name in ("pk_table", "pk_view", "pk_parted"):
        plan = plan_aggregate_query("SELECT AVG(v), MAX(v), COUNT(*), MIN(partition) FROM " + name, _relation(registry, name))
        parts = split_row(plan, admin.execute(backend_sql(plan, seed=partition_seed())).fetchone())
        assert len(parts[0][0]) == M and parts[2] == (2000,), name  # 2000 rows fill all 16 partitions
        assert all(0 <= v <= 100 for v in parts[1][0])
        assert all(0 <= v <= 6 for v in parts[3][0])  # MIN of the column named like the key


def test_the_partitioned_aggregate_can_run_in_parallel(registry, admin):
    plan = plan_aggregate_query("SELECT AVG(v) FROM pk_table WHERE v > 3", _relation(registry, "pk_table"))
    with admin.transaction():
        # pk_table is small: let PostgreSQL consider workers as it would for a large table.
        for setting in ("min_parallel_table_scan_size = 0", "parallel_setup_cost = 0", "parallel_tuple_cost = 0"):
            admin.execute(f"SET LOCAL {setting}")
        plan_text = "\n".join(row[0] for row in admin.execute("EXPLAIN " + backend_sql(plan, seed=5)).fetchall())
    assert "Gather" in plan_text and "Partial HashAggregate" in plan_text, plan_text


def test_only_hash_partitioned_queries_depend_on_the_seed(registry):
    table, keyed, view = (_relation(registry, name) for name in ("pk_table", "nb_keyed_small", "pk_view"))
    for relation, sql, expected in (
        (table, "SELECT AVG(v) FROM pk_table", True),
        (table, "SELECT COUNT(*), SUM(v) FROM pk_table", False),
        (keyed, "SELECT MAX(v) FROM nb_keyed_small", True),
        (keyed, "SELECT COUNT(*) FROM nb_keyed_small", False),
        (view, "SELECT AVG(v) FROM pk_view", False),
    ):
        plan = plan_aggregate_query(sql, relation)
        assert seeded(plan) is expected, sql
        assert (backend_sql(plan, seed=1) != backend_sql(plan, seed=2)) is expected, sql


# ------------------------------------------------------------------ row_hash: the neighbouring-table proof

SEEDS = 100


def _row_partitions(conn: psycopg.Connection, relation: Relation, seed: int, table: str) -> list[tuple[tuple, int]]:
    """Every row of ``table`` (its values) with its partition under ``relation``'s key and ``seed``."""
    columns = ", ".join(f'"{name}"' for name in relation.columns)
    rows = conn.execute(f"SELECT {read_through(partition_key(relation, seed))}, {columns} FROM {table}").fetchall()
    return [(tuple(row[1:]), int(row[0])) for row in rows]


@pytest.mark.parametrize("small, large, extra", [
    ("nb_small", "nb_large", (42, "the extra row", None)),
    ("nb_keyed_small", "nb_keyed_large", (5000, 42)),
])
def test_neighbouring_tables_differ_in_exactly_one_partition_for_every_seed(registry, admin, small, large, extra):
    """The proof of rewriter/rewrite.py's docstring, checked: ``large`` is ``small`` plus one
    row, loaded separately in another order (other ctids). For each of 100 fresh seeds, under
    the key dpproxy writes for ``small``: every row ``small`` holds (duplicates and NULLs
    included) has the same partition in both tables, and the partitions' contents (as
    multisets of rows) are equal except one, which differs by the extra row alone. No
    assumption on the hash enters this check; it holds for every seed."""
    relation = _relation(registry, small)
    assert relation.partition_key == "row"
    assert relation.columns.keys() == _relation(registry, large).columns.keys()
    extra_partitions = []
    for _ in range(SEEDS):
        seed = partition_seed()
        before, after = _row_partitions(admin, relation, seed, small), _row_partitions(admin, relation, seed, large)
        assert len(after) == len(before) + 1
        where = {}
        for row, partition in before:
            assert where.setdefault(row, partition) == partition  # a row's partition is a function of the row
        added = Counter(after) - Counter(before)
        assert Counter(before) - Counter(after) == Counter()  # every row of small, in its partition, is in large
        assert list(added) == [(extra, added and next(iter(added))[1])] and sum(added.values()) == 1
        contents = [Counter(row for row, p in rows if p == k) for rows in (before, after) for k in range(M)]
        differing = [k for k in range(M) if contents[k] != contents[M + k]]
        extra_partition = next(iter(added))[1]
        assert differing == [extra_partition]
        assert contents[M + extra_partition] - contents[extra_partition] == Counter([extra])
        extra_partitions.append(extra_partition)
    # Each seed its own partitioning: the extra row lands all over (a fixed key would put it in
    # one partition every time). 100 draws in 16 partitions from a random function fail this
    # χ² test (15 degrees of freedom, p < 1e-7) with probability 1e-7.
    counts = [extra_partitions.count(k) for k in range(M)]
    assert stats.chisquare(counts).pvalue > 1e-7, counts


def test_row_hash_fills_the_partitions_evenly(registry, admin):
    """An accuracy check, not a privacy one: 2,000 distinct rows in 16 partitions are spread as a
    random function would spread them. Each of the 4 seeds' χ² test (15 degrees of freedom) fails
    by chance with p = 1e-7 when the hash behaves like a random function: 4e-7 in all."""
    relation = _relation(registry, "nb_keyed_small")
    for _ in range(4):
        counts = Counter(p for _, p in _row_partitions(admin, relation, partition_seed(), "nb_keyed_small"))
        assert set(counts) == set(range(M))
        assert stats.chisquare([counts[k] for k in range(M)]).pvalue > 1e-7, counts


def test_duplicate_rows_share_a_partition(registry, admin):
    """Rows equal on every hashed column always land together: private (a function of the row),
    but it is why a key-less table gets ``random`` by default."""
    relation = _relation(registry, "nb_small")
    rows = _row_partitions(admin, relation, partition_seed(), "nb_small")
    twice = [row for row, n in Counter(row for row, _ in rows).items() if n == 2]
    assert len(twice) == 10
    assert all(len({p for r, p in rows if r == row}) == 1 for row in twice)


def test_the_row_hash_never_raises_for_any_value_of_any_column_type(registry, admin):
    """NULLs, NaN, ±Infinity, -0, extreme integers, dates and timestamps, long and empty text:
    the key evaluates on every row, and sample-and-aggregate AVG, MIN and MAX of every protected
    column run, with a filter that matches each row alone (an error on one row would say it
    matches). The 5 rows across 16 partitions leave some empty: that is fine here."""
    relation = _relation(registry, "pk_types")
    for _ in range(20):
        keys = admin.execute(f"SELECT {read_through(partition_key(relation, partition_seed()))} FROM pk_types").fetchall()
        assert len(keys) == 5 and all(0 <= k < M for (k,) in keys)
    for v in (None, 0, 7, 50, 100):
        where = "v IS NULL" if v is None else f"v = {v}"
        sql = f"SELECT AVG(v), MIN(f8), MAX(n), AVG(n), MIN(v), COUNT(*) FROM pk_types WHERE {where}"
        plan = plan_aggregate_query(sql, relation)
        parts = split_row(plan, admin.execute(backend_sql(plan, seed=partition_seed())).fetchone())
        assert parts[-1] == (1,)
        assert all(len(values) <= 1 for (values,) in parts[:-1])


def test_row_hash_sample_and_aggregate_can_run_in_parallel(registry, admin):
    """Workers compute the key: under Gather, either a partial aggregate per worker (the plan on
    large tables, benchmarks/results.md) or a parallel scan whose output carries the hash."""
    for name in ("nb_small", "nb_keyed_small", "pk_types"):
        plan = plan_aggregate_query(f"SELECT AVG(v), MAX(v) FROM {name} WHERE v > 3", _relation(registry, name))
        with admin.transaction():
            for setting in ("min_parallel_table_scan_size = 0", "parallel_setup_cost = 0", "parallel_tuple_cost = 0"):
                admin.execute(f"SET LOCAL {setting}")
            lines = [row[0] for row in admin.execute("EXPLAIN (VERBOSE) " + backend_sql(plan, seed=5)).fetchall()]
        plan_text = "\n".join(lines)
        assert "Gather" in plan_text, (name, plan_text)
        scan = next(i for i, line in enumerate(lines) if "Parallel Seq Scan" in line)
        if "Partial HashAggregate" not in plan_text:
            assert "extended(" in lines[scan + 1] and "Output:" in lines[scan + 1], (name, plan_text)


def test_random_partitioning_draws_and_groups_in_one_process(registry, admin):
    """Why a table with a primary key hashes it by default: random() is PARALLEL RESTRICTED, so
    workers may scan but the leader draws every row's partition and groups them all."""
    plan = plan_aggregate_query("SELECT AVG(v) FROM pk_random WHERE v > 3", _relation(registry, "pk_random"))
    with admin.transaction():
        for setting in ("min_parallel_table_scan_size = 0", "parallel_setup_cost = 0", "parallel_tuple_cost = 0"):
            admin.execute(f"SET LOCAL {setting}")
        lines = [row[0] for row in admin.execute("EXPLAIN (VERBOSE) " + backend_sql(plan, seed=5)).fetchall()]
    plan_text = "\n".join(lines)
    assert "Partial" not in plan_text, plan_text
    in_workers = lines[next((i for i, line in enumerate(lines) if "Parallel Seq Scan" in line), len(lines)):]
    assert not any("random()" in line for line in in_workers), plan_text  # Gather's own output draws it
