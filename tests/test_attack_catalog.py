"""Catalog and passthrough statements must not reveal anything about a protected table's rows.

Attack found: PostgreSQL's attribute notation calls a function without a FuncCall in the
parse tree. ``x.f`` (or ``(x).f``) is ``f(x)`` when x has no field f, so the function
allowlist, which only looked at FuncCalls, let through ``('...'::text).ts_stat`` (which runs
the SQL it is given: every row of the protected table) and
``('adult'::regclass).pg_relation_size`` (sizes, never neutralised), in catalog statements
and in the post-processing of a DP answer alike.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from conftest import RunningProxy, TestDatabase


@pytest.fixture(scope="module")
def analysed(test_db: TestDatabase) -> None:
    """adult with real statistics, so that reltuples, relpages and sizes hold real values."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE adult")


ATTRIBUTE_CALLS = [
    # runs the SQL text: exact per-value counts of the protected table
    "SELECT ('SELECT pg_catalog.to_tsvector(''simple'', sex) FROM public.adult'::text).ts_stat",
    "SELECT x.ts_stat FROM (SELECT 'SELECT pg_catalog.to_tsvector(''simple'', sex) FROM public.adult'::text) AS x(q)",
    # sizes and statistics through attribute notation
    "SELECT ('public.adult'::regclass).pg_relation_size",
    "SELECT ('public.adult'::regclass).pg_total_relation_size",
    "SELECT ('public.adult'::regclass::oid).pg_stat_get_live_tuples",
    "SELECT c.oid.pg_stat_get_live_tuples FROM pg_catalog.pg_class c WHERE relname = 'adult'",
    "SELECT ('public.adult'::regclass).pg_relation_filenode",
]


@pytest.mark.parametrize("sql", ATTRIBUTE_CALLS)
def test_attribute_notation_cannot_call_a_function_off_the_allowlist(proxy: RunningProxy, analysed: None, sql: str) -> None:
    with proxy.connect() as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="function-allowlist"):
            conn.execute(sql).fetchall()


@pytest.mark.parametrize("outer", [
    "('SELECT pg_catalog.to_tsvector(''simple'', sex) FROM public.adult'::text).ts_stat",
    "('public.adult'::regclass).pg_relation_size",
])
def test_attribute_notation_cannot_call_a_function_in_post_processing(
    proxy: RunningProxy, analysed: None, outer: str
) -> None:
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error, match="function-allowlist"):
            conn.execute(f"SELECT COUNT(*), {outer} FROM adult").fetchall()


def test_a_derived_columns_attribute_call_in_an_outer_query_is_refused_and_its_fields_still_work(
    proxy: RunningProxy, analysed: None
) -> None:
    """``n.ts_stat`` where ``n`` is a column of the derived table (a text holding SQL) is
    ts_stat(n), even when the statement also names an output column ts_stat; ``t.n`` of the
    same derived table is its field."""
    sql = "'SELECT pg_catalog.to_tsvector(''simple'', sex) FROM public.adult'::text"
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error, match="function-allowlist"):
            conn.execute(f"SELECT n.ts_stat FROM (SELECT {sql} AS n, COUNT(*) AS ts_stat FROM adult) AS t").fetchall()
        (row,) = conn.execute("SELECT t.n + 1 AS next FROM (SELECT COUNT(*) AS n FROM adult) AS t").fetchall()
        assert abs(row[0] - 48843) < 50


def test_field_notation_for_columns_and_record_fields_still_works(proxy: RunningProxy, analysed: None) -> None:
    with proxy.connect() as conn:
        row = conn.execute(
            "SELECT c.oid, c.relname, n.nspname, (pg_catalog.pg_identify_object('pg_class'::regclass, c.oid, 0)).name, "
            "(information_schema._pg_expandarray(i.indkey)).n "
            "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "JOIN pg_catalog.pg_index i ON i.indrelid = c.oid WHERE c.relname = 'adult'"
        ).fetchone()
        assert row is not None and row[1] == "adult" and row[3] == "adult" and row[4] == 1
        assert conn.execute("SELECT l.code FROM public.lookup l ORDER BY 1").fetchall() == [("F",), ("M",)]


def test_pg_class_statistics_stay_neutralised_however_the_row_is_read(
    proxy: RunningProxy, analysed: None, admin: psycopg.Connection
) -> None:
    # By oid and namespace: other modules create relations named adult or lookup in other schemas
    # (test_attacks' shadow_schema.adult, never analysed), which must not stand in for public's.
    exact = admin.execute("SELECT reltuples::text, relpages::text FROM pg_class WHERE oid = 'public.adult'::regclass").fetchone()
    assert exact is not None and exact[0] != "-1"
    probes = [
        "SELECT c::text FROM pg_catalog.pg_class c WHERE relname = 'adult'",
        "SELECT pg_catalog.row_to_json(c)::text FROM pg_class c WHERE relname = 'adult'",
        "SELECT pg_catalog.array_agg(c)::text FROM ONLY pg_catalog.pg_class AS c WHERE relname IN ('adult', 'adult_age_idx')",
        "SELECT count(*)::text FROM pg_class WHERE relname = 'adult' AND reltuples > 1000",
        "SELECT relname::text FROM pg_catalog.pg_class WHERE relname IN ('adult', 'lookup') ORDER BY reltuples, relname",
    ]
    with proxy.connect() as conn:
        for sql in probes:
            text = " ".join(str(v) for row in conn.execute(sql).fetchall() for v in row)
            assert exact[0] not in text and f"{exact[1]}," not in text, sql
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname = 'adult' AND reltuples > 1000").fetchone() == (0,)
        assert [r[0] for r in conn.execute(
            "SELECT relname::text FROM pg_class WHERE relname IN ('adult', 'lookup') "
            "AND relnamespace = 'public'::regnamespace ORDER BY reltuples DESC, relname"
        )] == ["adult", "lookup"]


def test_a_function_created_after_startup_is_checked_in_attribute_notation_too(
    test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The backend's function names were read at startup and reload only: a function created
    # afterwards (an extension installed) passed as a field name, `x.f` calling f(x) unchecked.
    from conftest import running_proxy
    from proxy.serving import server

    monkeypatch.setattr(server, "FUNCTION_NAMES_REFRESH_S", 0.2)
    with running_proxy(test_db, tmp_path_factory) as proxy, psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP FUNCTION IF EXISTS public.dp_late_probe(text)")
        try:
            admin.execute("CREATE FUNCTION public.dp_late_probe(text) RETURNS int LANGUAGE sql "
                          "AS 'SELECT pg_catalog.count(*)::int FROM public.adult'")
            admin.execute("GRANT EXECUTE ON FUNCTION public.dp_late_probe(text) TO PUBLIC")
            time.sleep(1.0)  # a few refreshes
            with proxy.connect() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                conn.execute("SELECT ('x'::text).dp_late_probe")
            assert "attribute notation" in str(refused.value)
        finally:
            admin.execute("DROP FUNCTION IF EXISTS public.dp_late_probe(text)")
