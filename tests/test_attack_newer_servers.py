"""PostgreSQL 17 and 18 as the backend (tests/pg_versions.py), attacked where they differ from 16.

Found and fixed:

* PostgreSQL 18's ``pg_class.relallfrozen`` (the pages VACUUM found all frozen: after a
  ``VACUUM (FREEZE)``, or autovacuum's freezing, the table's page count) passed through catalog
  queries while ``relpages`` and ``relallvisible`` were neutralised: ``SELECT relallfrozen FROM
  pg_class WHERE relname = 'adult'`` answered 906, adult's exact size in pages. It is now a
  constant 0 like them.
* 17's ``transaction_timeout`` and ``restrict_nonsystem_relation_kind`` as an operator's defaults
  (tests/test_attack_operator_settings.py).

Held, and pinned here:

* 18's virtual generated columns (``GENERATED ALWAYS AS (expr)``, virtual by default) run their
  expression when a row is read: ``g int GENERATED ALWAYS AS (100 / (a - 5))`` fails a read of
  ``g`` on the one row with ``a = 5``, an exact error oracle on any statement that reads it. The
  check of protected relations' expressions (proxy.backend.row_failures) reads their stored
  expressions and refuses the table at load, whether the policy declares the column or not, and
  one added or redefined while dpproxy runs before the charge; a virtual column of a total
  expression is answered, and a stored generated column (computed when its row is written) too.
* A client asking for protocol 3.2 (18's longer cancel keys) is answered in 3.0, and a backend
  connection in 3.2 (a DSN's ``max_protocol_version=latest``) is cancelled through dpproxy.
* The catalog columns 17 and 18 add to the relations on the catalog allowlist carry no row
  count or size but ``relallfrozen`` (``test_the_catalog_columns_…`` lists them).
* What 17 and 18 add to the language (``casefold``, ``random(min, max)``, ``uuidv7``, the
  SQL/JSON functions and ``JSON_TABLE``, ``crc32c``, integer-to-bytea casts, ``MERGE …
  RETURNING``, 18's ``OLD``/``NEW`` in RETURNING, ``COPY … ON_ERROR``, ``EXPLAIN (SERIALIZE)``,
  the new catalog functions and views) in a statement on a protected table: each is refused by
  an allowlist from the statement's text, before any charge (``NEW_CONSTRUCTS``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from rewriter.catalog import NEUTRALISED_PG_CLASS_COLUMNS, allowed_catalog_relation
from tests.conftest import (ATTACK_POLICY_HEAD, TEST_POLICY, RunningProxy, TestDatabase, make_policy,
                            refused_at_load, running_proxy, spent_epsilon)
from tests.neighbour_outcome import masked_outcome
from tests.pg_versions import DROPPED_CATALOG_COLUMNS
from tests.wire import assert_cancel_stops_a_slow_query

# The columns 17 and 18 add to the catalog relations passthrough may read (against 16), each with
# why it carries no row count or size, or how it is neutralised.
NEW_CATALOG_COLUMNS = {
    ("pg_class", "relallfrozen"): "neutralised: pages VACUUM found all frozen, the table's size",
    ("pg_collation", "colllocale"): "a collation's locale name",
    ("pg_database", "datlocale"): "a database's locale name",
    ("pg_database", "dathasloginevt"): "whether a login event trigger exists",
    ("pg_constraint", "conenforced"): "whether a constraint is enforced",
    ("pg_constraint", "conperiod"): "whether a key is WITHOUT OVERLAPS",
    ("pg_publication", "pubgencols"): "which generated columns a publication sends",
    **{("pg_replication_slots", column): "pg_replication_slots answers no row (EMPTIED_RELATIONS)"
       for column in ("failover", "synced", "invalidation_reason", "inactive_since", "two_phase_at")},
    **{("pg_stat_database", column): "pg_stat_database answers no row (EMPTIED_RELATIONS)"
       for column in ("parallel_workers_to_launch", "parallel_workers_launched")},
}
# The columns of the allowlisted relations, compared between pgserver's 16 (test_db) and 17 or 18.
_CATALOG_COLUMNS = """
SELECT n.nspname::text, c.relname::text, a.attname::text FROM pg_catalog.pg_attribute a
JOIN pg_catalog.pg_class c ON c.oid = a.attrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname IN ('pg_catalog', 'information_schema') AND a.attnum > 0 AND NOT a.attisdropped
"""


@pytest.fixture(scope="module")
def proxy18(pg18_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy under the suite's policy on PostgreSQL 18."""
    with running_proxy(pg18_db, tmp_path_factory, TEST_POLICY) as running:
        yield running


def test_the_servers_are_the_versions_the_lockfile_pins(newer_pg_db: TestDatabase) -> None:
    with psycopg.connect(newer_pg_db.admin_dsn) as admin:
        assert admin.info.server_version // 10000 in (17, 18)
        assert admin.execute("SHOW server_version").fetchone()[0] in ("17.10", "18.4")  # type: ignore[index]


def test_the_catalog_columns_postgresql_17_and_18_add_to_the_allowlisted_relations_are_reviewed(
        test_db: TestDatabase, newer_pg_db: TestDatabase) -> None:
    """A column a new release adds to a relation on the catalog allowlist (information_schema's
    included) passes through as it is: each must be one reviewed here (a count or a size among
    them neutralised)."""
    with psycopg.connect(test_db.admin_dsn) as old, psycopg.connect(newer_pg_db.admin_dsn) as new:
        before, after = ({(relation, column) for schema, relation, column in conn.execute(_CATALOG_COLUMNS).fetchall()
                          if allowed_catalog_relation(schema, relation)} for conn in (old, new))
    assert after - before <= set(NEW_CATALOG_COLUMNS), after - before
    assert before - after <= DROPPED_CATALOG_COLUMNS, before - after
    counts = {column for (relation, column) in after - before if relation == "pg_class"}
    assert counts <= set(NEUTRALISED_PG_CLASS_COLUMNS)


def test_pg_class_relallfrozen_is_neutralised_on_postgresql_18(pg18_db: TestDatabase, proxy18: RunningProxy) -> None:
    """On the code before, ``relallfrozen`` answered adult's exact size in pages after a freeze."""
    with psycopg.connect(pg18_db.admin_dsn, autocommit=True) as admin:
        for _ in range(3):  # the first VACUUM after the load freezes the rows, the next marks their pages
            admin.execute("VACUUM (FREEZE) adult")
            (frozen,) = admin.execute("SELECT relallfrozen FROM pg_class WHERE relname = 'adult'").fetchone()  # type: ignore[misc]
            if frozen:
                break
    assert frozen > 100  # what a statement through dpproxy must not learn
    with proxy18.connect() as conn:
        assert conn.execute("SELECT relallfrozen FROM pg_class WHERE relname = 'adult'").fetchone() == (0,)
        assert conn.execute("SELECT c.relallfrozen FROM pg_catalog.pg_class c WHERE c.relname = 'adult'"
                            ).fetchone() == (0,)
        whole = conn.execute("SELECT * FROM pg_catalog.pg_class WHERE relname = 'adult'")
        names = [column.name for column in whole.description or ()]
        assert dict(zip(names, whole.fetchone() or ()))["relallfrozen"] == 0
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relallfrozen > 0").fetchone() == (0,)


@pytest.mark.parametrize(("sql", "reason"), [
    ("SELECT * FROM pg_catalog.pg_aios", "catalog relation pg_catalog.pg_aios is not available"),
    ("SELECT * FROM pg_stat_io", "catalog relation pg_catalog.pg_stat_io is not available"),
    ("SELECT * FROM pg_stat_get_backend_io(pg_backend_pid())", "it reads statistics about the rows"),
    ("SELECT * FROM pg_stat_get_backend_wal(pg_backend_pid())", "it reads statistics about the rows"),
    ("SELECT * FROM pg_get_sequence_data('adult_age_seq')", "it reveals sequence positions"),
    ("SELECT pg_column_toast_chunk_id(code) FROM lookup", "is not on dpproxy's allowlist"),
])
def test_the_statistics_and_positions_postgresql_18_adds_are_refused(proxy18: RunningProxy, sql: str,
                                                                   reason: str) -> None:
    with proxy18.connect() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            conn.execute(sql)
    assert reason in str(refused.value), str(refused.value)


# ------------------------------------------------------------------ 18's virtual generated columns

_VG_POLICY = ATTACK_POLICY_HEAD + """
  public.{table}:
    access: protected
    epsilon: 1.0
    columns:
      a: {{bounds: [0, 10]}}
"""
# a = 5 on row 7 of gen_near only: 100 / (a - 5) fails there.
_VG_ROWS = "SELECT g, CASE WHEN g % 10 = 5 THEN 6 ELSE g % 10 END FROM generate_series(1, 300) g"


@contextmanager
def _generated(database: TestDatabase, column: str) -> Iterator[psycopg.Connection]:
    """gen0 (id, a, ``column``) and its neighbour gen_near, which adds the row (7, 5); dropped after."""
    with psycopg.connect(database.admin_dsn, autocommit=True) as admin:
        try:
            for name in ("gen0", "gen_near"):
                admin.execute(f"DROP TABLE IF EXISTS {name}")
                admin.execute(f"CREATE TABLE {name} (id int8, a int4, {column})")
                admin.execute(f"INSERT INTO {name} (id, a) {_VG_ROWS}")
                admin.execute(f"GRANT SELECT ON {name} TO dpproxy_service")
            admin.execute("INSERT INTO gen_near (id, a) VALUES (7, 5)")
            yield admin
        finally:
            admin.execute("DROP TABLE IF EXISTS gen0, gen_near")


def test_a_virtual_generated_column_that_can_fail_on_a_row_refuses_its_table_at_load(
        pg18_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # 18's default kind: no VIRTUAL keyword needed. Declared in the policy or not, the table is refused.
    with _generated(pg18_db, "g int4 GENERATED ALWAYS AS (100 / (a - 5))") as admin:
        assert admin.execute("SELECT attgenerated FROM pg_attribute WHERE attrelid = 'gen0'::regclass "
                             "AND attname = 'g'").fetchone() == ("v",)
        # The oracle it would be: reading g fails on the neighbour only, COUNT(*) alone reads no g.
        admin.execute("SELECT count(*) FROM gen0 WHERE g > 0").fetchone()
        with pytest.raises(psycopg.errors.DivisionByZero):
            admin.execute("SELECT count(*) FROM gen_near WHERE g > 0").fetchone()
        for table in ("gen0", "gen_near"):
            for declared in ("", "      g: {{bounds: [0, 100]}}\n"):
                policy = make_policy(pg18_db, tmp_path_factory.mktemp("ledger") / "l.sqlite3",
                                     _VG_POLICY.replace("{table}", table) + declared)
                (problem,) = refused_at_load(policy)
                assert problem.startswith(f"tables.public.{table}: virtual generated column g of {table} calls "), problem
                assert "int4div(integer, integer)" in problem and "STORED" in problem, problem


@pytest.mark.parametrize(("column", "named"), [
    # The column's own type is a coercion too, run when the row is read: out of range, too long.
    ("g int2 GENERATED ALWAYS AS (a * 10000)", "int2(integer)"),
    ("g numeric(3, 1) GENERATED ALWAYS AS (a * 100)", "numeric(numeric, integer)"),
    ("g varchar(1) GENERATED ALWAYS AS ((a * 10)::text)", "varchar(character varying, integer, boolean)"),
    ("g int4 GENERATED ALWAYS AS (a) VIRTUAL, h int8 GENERATED ALWAYS AS (1 / a::int8)", "int48div(integer, bigint)"),
], ids=["out-of-range", "numeric-precision", "too-long", "second-column"])
def test_a_virtual_generated_column_whose_type_or_expression_can_fail_on_a_row_refuses_its_table_at_load(
        pg18_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, column: str, named: str) -> None:
    with _generated(pg18_db, column):
        policy = make_policy(pg18_db, tmp_path_factory.mktemp("ledger") / "l.sqlite3", _VG_POLICY.replace("{table}", "gen0"))
        (problem,) = refused_at_load(policy)
    assert problem.startswith("tables.public.gen0: virtual generated column ") and named in problem, problem


def test_a_protected_view_reading_a_virtual_generated_column_that_can_fail_is_refused_at_load(
        pg18_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # The view's own tree holds only a reference to g; g's expression is the table's.
    with _generated(pg18_db, "g int4 GENERATED ALWAYS AS (100 / (a - 5))") as admin:
        admin.execute("CREATE VIEW gen_view AS SELECT id, a, g FROM gen0")
        admin.execute("GRANT SELECT ON gen_view TO dpproxy_service")
        policy = make_policy(pg18_db, tmp_path_factory.mktemp("ledger") / "l.sqlite3",
                             _VG_POLICY.replace("{table}", "gen_view") + "      g: {{bounds: [0, 100]}}\n")
        try:
            (problem,) = refused_at_load(policy)
        finally:
            admin.execute("DROP VIEW gen_view")
    assert problem.startswith("tables.public.gen_view: virtual generated column g of gen0 calls "), problem


def test_a_stored_generated_column_and_a_virtual_one_of_a_total_expression_are_answered_alike_on_neighbours(
        pg18_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # Stored: computed when the row is written (gen_near's row 7 would fail its INSERT, so the
    # neighbour holds a = 5 in a NULLIF instead). Virtual of a widening cast: total.
    columns = ("s int4 GENERATED ALWAYS AS (100 / NULLIF(a - 5, 0)) STORED, "
               "t int8 GENERATED ALWAYS AS (a::int8) VIRTUAL")
    policy = (_VG_POLICY + "      s: {{bounds: [-100, 100]}}\n      t: {{bounds: [0, 10]}}\n"
              "  public.gen_near:\n    access: protected\n    epsilon: 1.0\n    columns:\n"
              "      a: {{bounds: [0, 10]}}\n      s: {{bounds: [-100, 100]}}\n      t: {{bounds: [0, 10]}}\n")
    with _generated(pg18_db, columns), \
            running_proxy(pg18_db, tmp_path_factory, policy.replace("{table}", "gen0")) as proxy, proxy.connect() as conn:
        for sql in ("SELECT COUNT(*) FROM {t} WHERE s > 0", "SELECT SUM(s), SUM(t) FROM {t}",
                    "SELECT AVG(t), COUNT(*) FROM {t} WHERE t = 5", "SELECT COUNT(*) FROM {t}"):
            before = spent_epsilon(conn)
            outcomes = {table: masked_outcome(conn, sql, table) for table in ("gen0", "gen_near")}
            assert len(set(outcomes.values())) == 1 and outcomes["gen0"][0] == "answer", (sql, *map(repr, outcomes.values()))
            assert spent_epsilon(conn) == before + 2


def test_a_virtual_generated_column_added_or_redefined_while_dpproxy_runs_is_refused_before_the_charge(
        pg18_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    from proxy.serving import server

    monkeypatch.setattr(server, "FUNCTION_NAMES_REFRESH_S", 0.2)
    policy = _VG_POLICY.replace("{table}", "gen_near") + "      t: {{bounds: [0, 10]}}\n"
    with _generated(pg18_db, "t int8 GENERATED ALWAYS AS (a::int8) VIRTUAL") as admin, \
            running_proxy(pg18_db, tmp_path_factory, policy) as proxy, proxy.connect() as conn:
        assert conn.execute("SELECT SUM(t) FROM gen_near WHERE id = 7").fetchone() is not None
        for change, undo in (("ADD COLUMN g int4 GENERATED ALWAYS AS (100 / (a - 5))", "DROP COLUMN g"),
                             ("ALTER COLUMN t SET EXPRESSION AS (100 / (a - 5))", "ALTER COLUMN t SET EXPRESSION AS (a::int8)")):
            admin.execute(f"ALTER TABLE gen_near {change}")
            time.sleep(1.0)  # a few re-checks
            before = spent_epsilon(conn)
            for sql in ("SELECT COUNT(*) FROM gen_near WHERE id = 7", "SELECT SUM(t) FROM gen_near WHERE id = 7"):
                with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
                    conn.execute(sql)
                assert "virtual generated column" in str(refused.value) and "(rule: row-failure)" in str(refused.value)
                assert "STORED" in (refused.value.diag.message_hint or "")
            assert spent_epsilon(conn) == before  # nothing charged
            admin.execute(f"ALTER TABLE gen_near {undo}")
            time.sleep(1.0)
            assert conn.execute("SELECT SUM(t) FROM gen_near WHERE id > 7").fetchone() is not None


# ------------------------------------------------------------------ protocol 3.2


def test_a_client_asking_for_protocol_3_2_and_a_backend_speaking_it_cancel_through_dpproxy(
        pg18_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """18 speaks protocol 3.2, whose cancel keys are up to 256 bytes: dpproxy's backend
    connections speak it when the operator's DSN asks (``max_protocol_version=latest``), and its
    cancel reaches them; a client asking for it is answered in 3.0 (4-byte keys) and cancels."""
    database = TestDatabase(pg18_db.admin_dsn, pg18_db.service_dsn + "&max_protocol_version=latest")
    with psycopg.connect(database.service_dsn) as direct:
        assert direct.pgconn.full_protocol_version == 30002  # what the backend connections speak
    with running_proxy(database, tmp_path_factory, TEST_POLICY) as proxy, \
            psycopg.connect(proxy.dsn(), max_protocol_version="latest", autocommit=True) as conn:
        assert conn.pgconn.full_protocol_version == 30000
        assert conn.execute("SELECT COUNT(*) FROM adult WHERE age > 40").fetchone() is not None
        assert_cancel_stops_a_slow_query(conn, after_s=0.5)
        assert conn.execute("SHOW server_version").fetchone() == ("18.4",)



# ------------------------------------------------------------------ 17's and 18's new functions and syntax

@pytest.fixture(scope="module")
def newer_proxy(newer_pg_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy under the suite's policy on PostgreSQL 17, then 18."""
    with running_proxy(newer_pg_db, tmp_path_factory, TEST_POLICY) as running:
        yield running


# What 17 and 18 add (and 16's newest) in every place a statement on protected table adult may
# hold an expression: a DP statement's WHERE, aggregate arguments and FROM, a statement that
# writes, a catalog read naming the table. None is on an allowlist; each is refused from the
# statement's text, before any charge, whatever the rows.
NEW_CONSTRUCTS = [
    "SELECT count(*) FROM adult WHERE casefold(sex) = 'male'",  # 18
    "SELECT count(*) FROM adult WHERE age > random(1, 100)",  # 17: random(min, max)
    "SELECT count(*) FROM adult WHERE uuidv7() IS NOT NULL",  # 18
    "SELECT count(*) FROM adult WHERE uuid_extract_timestamp(gen_random_uuid()) IS NOT NULL",  # 17
    "SELECT count(*) FROM adult WHERE sex = ANY (array_sample(ARRAY['Male', 'Female'], 1))",  # 16
    "SELECT count(*) FROM adult WHERE sex = ANY (array_reverse(ARRAY['Male']))",  # 18
    "SELECT count(*) FROM adult WHERE array_sort(ARRAY[age]) = ARRAY[40]",  # 18
    "SELECT any_value(age) FROM adult",  # 16
    "SELECT count(*) FROM adult WHERE JSON_EXISTS(jsonb_build_object('a', age), '$.a ? (@ > 40)')",  # 17
    "SELECT count(*) FROM adult WHERE age = JSON_VALUE('{\"a\": 40}', '$.a' RETURNING int)",  # 17, row-free
    "SELECT count(*) FROM adult WHERE age = JSON_VALUE(jsonb_build_object('a', 1 / (age - 40)), '$.a' RETURNING int)",
    "SELECT sum(JSON_VALUE(jsonb_build_object('a', age), '$.a' RETURNING int)) FROM adult",
    "SELECT count(*) FROM adult, JSON_TABLE('[1, 2]'::jsonb, '$[*]' COLUMNS (x int PATH '$')) j",  # 17
    "SELECT count(*) FROM adult WHERE crc32c(sex::bytea) > 0",  # 18
    "SELECT count(*) FROM adult WHERE reverse(sex::bytea) IS NOT NULL",  # 18: reverse(bytea)
    "SELECT count(*) FROM adult WHERE CAST(age AS bytea) = '\\x00000028'",  # 18: integer to bytea
    "SELECT count(*) FROM adult WHERE age > gamma(3)",  # 18
    "SELECT count(*) FROM adult WHERE to_bin(age) = '101000'",  # 18
    "SELECT count(*) FROM adult WHERE pg_basetype('int4'::regtype) IS NOT NULL",  # 17
    "SELECT count(*) FROM adult WHERE sex IS JSON",  # 16
    "SELECT avg(age) FROM adult WHERE age > 40 AND to_regtypemod('int4') IS NULL",  # 17
    "MERGE INTO adult a USING lookup l ON false WHEN NOT MATCHED THEN DO NOTHING RETURNING *",  # 17
    "MERGE INTO lookup l USING adult a ON false WHEN NOT MATCHED BY SOURCE THEN DELETE RETURNING merge_action(), old.*",
    "UPDATE adult SET age = age RETURNING old.age, new.age",  # 18
    "DELETE FROM adult WHERE age = 40 RETURNING old.*",  # 18
    "COPY adult FROM STDIN (ON_ERROR ignore)",  # 17
    "EXPLAIN (SERIALIZE, MEMORY) SELECT count(*) FROM adult",  # 17
    "SELECT pg_get_acl('pg_class'::regclass, 'adult'::regclass, 0)",  # 18
    "SELECT * FROM pg_get_loaded_modules()",  # 18
    "SELECT * FROM pg_catalog.pg_wait_events",  # 17
    "SELECT * FROM pg_catalog.pg_stat_checkpointer",  # 17
    "SELECT count(*) FROM adult WHERE age IN (SELECT x FROM JSON_TABLE('[40]'::jsonb, '$[*]' COLUMNS (x int PATH '$')) j)",
]


@pytest.mark.parametrize("sql", NEW_CONSTRUCTS)
def test_what_postgresql_17_and_18_add_is_refused_before_the_charge_on_a_protected_table(
        newer_proxy: RunningProxy, sql: str) -> None:
    with newer_proxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql)
        assert spent_epsilon(conn) == before, (sql, refused.value)
    # dpproxy's refusal, never the backend's: a backend error came after the statement ran
    assert refused.value.sqlstate in ("DP001", "42501", "0A000", "25006", "42601"), (sql, refused.value.sqlstate,
                                                                                      str(refused.value))
    assert "rule: " in str(refused.value) or refused.value.sqlstate == "42601", (sql, str(refused.value))
