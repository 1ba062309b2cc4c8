"""The catalog reads pgAdmin 4 needs to connect and to show a table's properties, answered.

pgAdmin 4 (9.18) failed to connect through dpproxy: its first statement reads
``pg_show_all_settings()`` (the function behind the allowlisted ``pg_settings``), and at connect
it reads ``pg_stat_gssapi`` (its own backend's GSSAPI status) and counts
``pg_replication_slots``; a refusal of any of them ends its connect. Its table properties join
``pg_depend.classid = cls.tableoid`` on ``pg_class`` (the neutralised pg_class had no
``tableoid``: 42703) and read ``pg_seclabels`` and ``aclexplode(relacl)``, its database
properties ``pg_db_role_setting``, its tree's *Extensions* ``pg_available_extensions()``. None
of these carries a number a row decides; the two statistics views are answered with no row
(their columns, nothing read). So are the four its *Dashboard* reads (sessions, the
database's counters, locks, prepared transactions), whatever the rows and other sessions do;
the functions behind them, and the statistics its *Statistics* tabs show, stay refused
(tests/test_client_pgadmin.py drives the real pgAdmin).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from conftest import RunningProxy, TestDatabase, spent_epsilon

# pgAdmin's first statement on every connection (pgadmin/utils/driver/psycopg3/connection.py).
PGADMIN_CONNECT = ("SET DateStyle=ISO; SET client_min_messages=notice; SELECT set_config('bytea_output','hex',false)"
                   " FROM pg_show_all_settings() WHERE name = 'bytea_output'; SET client_encoding='utf-8';")
PGADMIN_REPLICATION_TYPE = """SELECT CASE
    WHEN (SELECT count(extname) FROM pg_catalog.pg_extension WHERE extname='bdr') > 0
    THEN 'pgd'
    WHEN (SELECT COUNT(*) FROM pg_catalog.pg_replication_slots) > 0
    THEN 'log'
    ELSE NULL
END as type;"""
PGADMIN_GSSAPI = "SELECT gss_authenticated, encrypted FROM pg_catalog.pg_stat_gssapi WHERE pid = pg_backend_pid()"
SLOT = "h53_pgadmin_probe"


@pytest.fixture
def slot(admin: psycopg.Connection) -> Iterator[None]:
    """A physical replication slot on the backend, as a server with a standby has."""
    admin.execute("SELECT pg_catalog.pg_create_physical_replication_slot(%s)", (SLOT,))
    try:
        yield
    finally:
        admin.execute("SELECT pg_catalog.pg_drop_replication_slot(%s)", (SLOT,))


def _shape(cursor: psycopg.Cursor) -> list[tuple[str, int]]:
    assert cursor.description is not None
    return [(c.name, c.type_code) for c in cursor.description]


def test_pgadmins_connect_statement_sets_bytea_output_through_pg_show_all_settings(proxy: RunningProxy) -> None:
    with proxy.connect() as conn:
        conn.execute(PGADMIN_CONNECT)
        assert conn.execute("SHOW bytea_output").fetchone() == ("hex",)
        row = conn.execute("SELECT name, setting FROM pg_show_all_settings() WHERE name = 'DateStyle'").fetchone()
        assert row == ("DateStyle", "ISO, MDY")


def test_replication_slots_are_answered_with_no_row_whatever_the_backend_holds(
    proxy: RunningProxy, admin: psycopg.Connection, slot: None
) -> None:
    direct = admin.execute("SELECT * FROM pg_catalog.pg_replication_slots")
    assert [r[0] for r in direct.fetchall()] == [SLOT]
    with proxy.connect() as conn:
        cursor = conn.execute("SELECT * FROM pg_catalog.pg_replication_slots")
        assert cursor.fetchall() == [] and _shape(cursor) == _shape(direct)
        assert conn.execute(PGADMIN_REPLICATION_TYPE).fetchall() == [(None,)]
        # Qualified column references and an alias read the same empty relation.
        assert conn.execute("SELECT pg_catalog.pg_replication_slots.restart_lsn FROM pg_catalog.pg_replication_slots"
                            ).fetchall() == []
        assert conn.execute("SELECT count(*) FROM pg_replication_slots AS s WHERE s.slot_name = %s",
                            (SLOT,), prepare=False).fetchall() == [(0,)]


@pytest.mark.parametrize("sql", [
    "SELECT slot_name FROM pg_replication_slots",
    'SELECT slot_name FROM "pg_catalog"."pg_replication_slots"',
    "SELECT slot_name FROM ONLY pg_catalog.pg_replication_slots",
    "SELECT s.slot_name FROM pg_catalog.pg_replication_slots s, pg_catalog.pg_replication_slots t",
    "SELECT (SELECT max(slot_name) FROM pg_replication_slots)",
    "SELECT 1 WHERE EXISTS (SELECT 1 FROM pg_replication_slots)",
    "WITH s AS (SELECT * FROM pg_replication_slots) SELECT slot_name FROM s",
    "SELECT x.n FROM (SELECT slot_name AS n FROM pg_replication_slots) x",
    "SELECT r.slot_name FROM pg_namespace n CROSS JOIN LATERAL (SELECT slot_name FROM pg_replication_slots) r",
    "SELECT slot_name FROM pg_replication_slots UNION ALL SELECT slot_name FROM pg_replication_slots",
])
def test_every_spelling_of_replication_slots_reads_no_row(proxy: RunningProxy, slot: None, sql: str) -> None:
    """The allowlist admits the view only as rewritten: a reference the rewrite missed would
    read the real rows (the slot here)."""
    with proxy.connect() as conn:
        conn.execute("SET search_path = pg_catalog, public")
        rows = conn.execute(sql).fetchall()
        assert rows in ([], [(None,)]), rows
        with conn.cursor() as cursor, cursor.copy(f"COPY ({sql}) TO STDOUT") as copy:
            copied = b"".join(bytes(chunk) for chunk in copy)
        assert SLOT.encode() not in copied
        with conn.transaction():
            conn.execute(f"DECLARE c CURSOR FOR {sql}")
            assert conn.execute("FETCH ALL FROM c").fetchall() == rows


def test_gssapi_status_is_answered_with_no_row(proxy: RunningProxy, admin: psycopg.Connection) -> None:
    assert admin.execute(PGADMIN_GSSAPI).fetchall() != []
    with proxy.connect() as conn:
        cursor = conn.execute(PGADMIN_GSSAPI)
        assert cursor.fetchall() == []
        assert [name for name, _ in _shape(cursor)] == ["gss_authenticated", "encrypted"]
        assert conn.execute("SELECT count(*) FROM pg_stat_gssapi").fetchall() == [(0,)]


def test_pg_class_tableoid_is_carried_where_a_statement_names_it(proxy: RunningProxy, admin: psycopg.Connection
                                                                 ) -> None:
    """pgAdmin's primary-key query joins ``dep.classid = cls.tableoid``; ``SELECT *`` keeps
    pg_class's own columns and reltuples stays neutralised beside tableoid."""
    sql = ("SELECT cls.relname, dep.deptype FROM pg_catalog.pg_index idx "
           "JOIN pg_catalog.pg_class cls ON cls.oid = indexrelid "
           "LEFT JOIN pg_catalog.pg_depend dep ON (dep.classid = cls.tableoid AND dep.objid = cls.oid "
           "AND dep.refobjsubid = '0' AND dep.deptype = 'i') "
           "WHERE indrelid = 'public.lookup'::regclass")
    with proxy.connect() as conn:
        assert conn.execute(sql).fetchall() == admin.execute(sql).fetchall() == [("lookup_pkey", "i")]
        assert conn.execute("SELECT c.tableoid::regclass::text, c.reltuples FROM pg_class c WHERE relname = 'adult'"
                            ).fetchall() == [("pg_class", -1.0)]
        star = conn.execute("SELECT * FROM pg_catalog.pg_class WHERE relname = 'adult'")
        assert _shape(star) == _shape(admin.execute("SELECT * FROM pg_catalog.pg_class WHERE relname = 'adult'"))


@pytest.mark.parametrize(("sql", "rows"), [
    # a table's privileges, as its properties list them
    ("SELECT a.privilege_type, a.is_grantable FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a "
     "WHERE c.oid = 'public.adult'::regclass AND a.grantee = 'dpproxy_service'::regrole", [("SELECT", False)]),
    ("SELECT provider, label FROM pg_catalog.pg_seclabels WHERE objoid = 'public.adult'::regclass", []),
    ("SELECT setconfig FROM pg_catalog.pg_db_role_setting WHERE setdatabase = 0 AND setrole = 0", []),
    # the tree's Extensions
    ("SELECT x.extname AS name, n.nspname AS schema, e.comment FROM pg_catalog.pg_extension x "
     "LEFT JOIN pg_catalog.pg_namespace n ON x.extnamespace=n.oid "
     "JOIN pg_catalog.pg_available_extensions() e ON x.extname=e.name WHERE x.extname = 'plpgsql'",
     [("plpgsql", "pg_catalog", "PL/pgSQL procedural language")]),
    ("SELECT name, version FROM pg_catalog.pg_available_extension_versions() WHERE name = 'plpgsql'",
     [("plpgsql", "1.0")]),
])
def test_pgadmins_catalog_reads_answer_as_postgresql(proxy: RunningProxy, admin: psycopg.Connection, sql: str,
                                                     rows: list[tuple[object, ...]]) -> None:
    with proxy.connect() as conn:
        assert conn.execute(sql).fetchall() == admin.execute(sql).fetchall() == rows


@pytest.mark.parametrize("sql", [
    # the functions behind pgAdmin's Dashboard's views, which answer with no row (sessions,
    # transactions, tuples in and out, block I/O, locks, prepared transactions)
    "SELECT pg_catalog.pg_stat_get_db_xact_commit(oid) FROM pg_catalog.pg_database",
    "SELECT pg_catalog.pg_stat_get_db_tuples_inserted(oid) FROM pg_catalog.pg_database",
    "SELECT pg_catalog.pg_stat_get_db_blocks_fetched(oid) FROM pg_catalog.pg_database",
    "SELECT count(*) FROM pg_catalog.pg_stat_get_activity(NULL)",
    "SELECT pg_catalog.pg_stat_get_backend_activity(s) FROM pg_catalog.pg_stat_get_backend_idset() s",
    "SELECT relation::regclass, mode FROM pg_catalog.pg_lock_status()",
    "SELECT gid FROM pg_catalog.pg_prepared_xact()",
    # its Statistics tabs (a table's scans and tuples, a column's null fraction, the replication)
    "SELECT n_live_tup FROM pg_catalog.pg_stat_all_tables WHERE relname = 'adult'",
    "SELECT heap_blks_read FROM pg_catalog.pg_statio_all_tables WHERE relname = 'adult'",
    "SELECT null_frac FROM pg_catalog.pg_stats WHERE tablename = 'adult'",
    "SELECT sent_lsn FROM pg_catalog.pg_stat_replication",
    # an emptied relation is no way round: its neighbours stay refused
    "SELECT * FROM pg_catalog.pg_stat_ssl",
    "SELECT pg_catalog.pg_get_replication_slots()",
])
def test_pgadmins_statistics_stay_refused(proxy: RunningProxy, sql: str) -> None:
    with proxy.connect() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            conn.execute(sql)
        assert refused.value.diag.message_hint


# pgAdmin's Dashboard: the graphs' statement (dashboard_stats.sql) and its Sessions tab's
# (activity.sql), shortened to what differs; both answered from views with no row.
PGADMIN_GRAPHS = """SELECT 'session_stats' AS chart_name, pg_catalog.row_to_json(t) AS chart_data FROM (SELECT
   (SELECT count(*) FROM pg_catalog.pg_stat_activity) AS "Total",
   (SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE state = 'active') AS "Active") t
UNION ALL
SELECT 'ti_stats', pg_catalog.row_to_json(t) FROM (SELECT
   (SELECT sum(xact_commit) + sum(xact_rollback) FROM pg_catalog.pg_stat_database) AS "Transactions",
   (SELECT sum(tup_inserted) FROM pg_catalog.pg_stat_database
    WHERE datname = (SELECT datname FROM pg_catalog.pg_database WHERE datname = current_database())) AS "Inserts",
   (SELECT sum(blks_read) FROM pg_catalog.pg_stat_database) AS "Reads") t"""
PGADMIN_SESSIONS = """SELECT pid, datname, usename, query, state, backend_type,
    array_to_string(pg_catalog.pg_blocking_pids(pid), ', ') AS blocking_pids,
    pg_catalog.to_char(backend_start, 'YYYY-MM-DD HH24:MI:SS TZ') AS backend_start,
    CASE WHEN state = 'active' THEN ROUND((extract(epoch from now() - query_start) / 60)::numeric, 2) ELSE 0 END
      AS active_since
FROM pg_catalog.pg_stat_activity ORDER BY pid"""
PGADMIN_LOCKS = """SELECT pid, locktype, datname, relation::regclass, page, tuple, classid::regclass, objid, mode, granted
FROM pg_catalog.pg_locks l LEFT OUTER JOIN pg_catalog.pg_database d ON (l.database = d.oid) ORDER BY pid, locktype"""
PGADMIN_PREPARED = """SELECT gid, database, owner, transaction,
    pg_catalog.to_char(prepared, 'YYYY-MM-DD HH24:MI:SS TZ') AS prepared FROM pg_catalog.pg_prepared_xacts"""
DASHBOARD_VIEWS = ("pg_stat_activity", "pg_stat_database", "pg_locks", "pg_prepared_xacts")


def _dashboard(conn: psycopg.Connection) -> list[object]:
    return [conn.execute(sql).fetchall() for sql in (PGADMIN_GRAPHS, PGADMIN_SESSIONS, PGADMIN_LOCKS, PGADMIN_PREPARED)]


def test_pgadmins_dashboard_reads_no_row_whatever_the_rows_and_other_sessions(
    proxy: RunningProxy, admin: psycopg.Connection, test_db: TestDatabase
) -> None:
    """The session counts are 0, every counter NULL (a sum over no row), no session, lock or
    prepared transaction listed: the same before and after writes, and while another session
    holds an open transaction that wrote into a protected table (its locks, its statement text
    and its transaction id are on the server: the direct reads show them)."""
    with proxy.connect() as conn:
        quiet = _dashboard(conn)
        assert quiet == [[("session_stats", {"Total": 0, "Active": 0}),
                          ("ti_stats", {"Transactions": None, "Inserts": None, "Reads": None})], [], [], []]
        admin.execute("CREATE TABLE dashboard_writes AS SELECT generate_series(1, 300) AS n")
        try:
            admin.execute("DELETE FROM dashboard_writes WHERE n % 3 = 0")
            with psycopg.connect(test_db.admin_dsn) as other:
                other.execute("INSERT INTO adult SELECT * FROM adult LIMIT 5")
                locks = "SELECT count(*) FROM pg_catalog.pg_locks WHERE relation = 'public.adult'::regclass"
                assert admin.execute(locks).fetchone() != (0,)
                texts = admin.execute("SELECT query FROM pg_catalog.pg_stat_activity WHERE query LIKE 'INSERT INTO adult%'")
                assert texts.fetchall() != []
                busy = _dashboard(conn)
                other.rollback()
        finally:
            admin.execute("DROP TABLE dashboard_writes")
        assert busy == quiet


@pytest.mark.parametrize("view", DASHBOARD_VIEWS)
def test_each_dashboard_view_has_postgresqls_columns_and_no_row_in_every_spelling(
    proxy: RunningProxy, admin: psycopg.Connection, view: str
) -> None:
    """Read directly, each has rows (this session's own, its locks; pg_prepared_xacts may have
    none); through dpproxy, however it is written, none."""
    direct = admin.execute(f"SELECT * FROM pg_catalog.{view}")
    if view != "pg_prepared_xacts":
        assert direct.fetchall() != []
    with proxy.connect() as conn:
        cursor = conn.execute(f"SELECT * FROM pg_catalog.{view}")
        assert cursor.fetchall() == [] and _shape(cursor) == _shape(direct)
        conn.execute("SET search_path = pg_catalog, public")
        for sql in (f"SELECT count(*) FROM {view}", f'SELECT count(*) FROM "pg_catalog"."{view}" AS v',
                    f"WITH v AS (SELECT * FROM {view}) SELECT count(*) FROM v",
                    f"SELECT count(*) FROM pg_namespace n CROSS JOIN LATERAL (SELECT * FROM {view}) v",
                    f"SELECT (SELECT count(*) FROM {view}) + (SELECT count(*) FROM pg_catalog.{view})"):
            assert conn.execute(sql).fetchall() == [(0,)], sql


def test_pg_blocking_pids_answers_null(proxy: RunningProxy) -> None:
    """The backends a backend waits for name other sessions' locks: each call is NULL, its
    argument never evaluated."""
    with proxy.connect() as conn:
        row = conn.execute("SELECT pg_catalog.pg_blocking_pids(pg_backend_pid()), pg_blocking_pids(0)").fetchone()
        assert row == (None, None)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM adult WHERE age > (SELECT count(*) FROM pg_stat_activity)",
    "SELECT COUNT(*) FROM adult a JOIN pg_catalog.pg_locks l ON l.pid = a.age",
    "SELECT t.c, s.xact_commit FROM (SELECT COUNT(*) AS c FROM adult) t, pg_stat_database s",
])
def test_a_dp_statement_never_reads_a_dashboard_view(proxy: RunningProxy, sql: str) -> None:
    """Only passthrough statements empty the views: a DP statement naming one is refused
    before the charge (no subquery, no join on a protected table), never run on the real rows."""
    with proxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql)
        assert refused.value.diag.sqlstate == "DP001" and refused.value.diag.message_hint
        conn.rollback()
        assert spent_epsilon(conn) == before
        # A public table beside one reads it empty, as a catalog statement does.
        assert conn.execute("SELECT count(*) FROM lookup, pg_catalog.pg_stat_activity").fetchall() == [(0,)]


@pytest.mark.parametrize("sql", [
    "SELECT to_char(COUNT(*), '9V9EEEE') FROM adult",  # 42601 on the backend, whatever the rows
    "SELECT pg_catalog.to_char(MAX(age), 'FM999') FROM adult",
])
def test_to_char_formats_catalog_values_but_never_a_dp_answer(proxy: RunningProxy, sql: str) -> None:
    """pgAdmin's Dashboard formats times with to_char, answered in catalog statements; over a DP
    answer a format it rejects would fail after the charge: refused before it, nothing charged."""
    with proxy.connect() as conn:
        assert conn.execute("SELECT to_char(pg_postmaster_start_time(), 'YYYY')").fetchone()[0].isdigit()  # type: ignore[index]
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error, match=r"to_char\(\) is not allowed.*rule: function-allowlist") as refused:
            conn.execute(sql)
        assert refused.value.diag.sqlstate == "DP001" and refused.value.diag.message_hint
        conn.rollback()
        assert spent_epsilon(conn) == before
