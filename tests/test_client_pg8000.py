"""pg8000 (pure-Python driver) through dpproxy: its native and DB-API interfaces.

pg8000 sends parameterised statements in three Sync-separated round trips
(Parse/Flush/Sync, Describe statement, Bind/Execute) and plain ones as simple Queries.
"""

from __future__ import annotations

from collections.abc import Iterator

import pg8000.dbapi
import pg8000.native
import pytest

from clients import exact_count
from conftest import TEST_DATABASE, RunningProxy


@pytest.fixture
def native(proxy: RunningProxy) -> Iterator[pg8000.native.Connection]:
    conn = pg8000.native.Connection("analyst", host=proxy.host, port=proxy.port, database=TEST_DATABASE,
                                    password="analyst", timeout=30)
    try:
        yield conn
    finally:
        conn.close()


def test_pg8000_introspects_tables_and_columns(native: pg8000.native.Connection):
    tables = native.run("SELECT table_schema, table_name FROM information_schema.tables "
                        "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2")
    assert {"adult", "lookup"} <= {name for _, name in tables}
    columns = native.run("SELECT a.attname, pg_catalog.format_type(a.atttypid, a.atttypmod) "
                         "FROM pg_catalog.pg_attribute a WHERE a.attrelid = 'public.adult'::regclass "
                         "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum")
    assert ["age", "integer"] in columns


def test_pg8000_native_counts_plain_parameterised_and_prepared(native: pg8000.native.Connection, admin):
    exact = exact_count(admin, "age > 30")
    ((plain,),) = native.run("SELECT COUNT(*) FROM adult WHERE age > 30")
    ((with_param,),) = native.run("SELECT COUNT(*) FROM adult WHERE age > :age", age=30)
    statement = native.prepare("SELECT COUNT(*) FROM adult WHERE age > :age")
    prepared = [statement.run(age=30)[0][0] for _ in range(3)]
    statement.close()
    assert all(abs(a - exact) < 30 for a in [plain, with_param, *prepared])


def test_pg8000_dbapi_transaction_commits_a_noised_count(proxy: RunningProxy, admin):
    conn = pg8000.dbapi.connect("analyst", host=proxy.host, port=proxy.port, database=TEST_DATABASE,
                                password="analyst", timeout=30)
    try:
        cursor = conn.cursor()
        cursor.execute("SELECT COUNT(*) FROM adult WHERE sex = %s", ("Female",))
        (count,) = cursor.fetchone()
        conn.commit()
    finally:
        conn.close()
    assert abs(count - exact_count(admin, "sex = 'Female'")) < 30


def test_pg8000_refusal_raises_with_sqlstate(native: pg8000.native.Connection):
    with pytest.raises(pg8000.native.DatabaseError) as info:
        native.run("SELECT age FROM adult WHERE age > :age", age=30)
    assert info.value.args[0]["C"] == "DP001"
    assert native.run("SELECT 1") == [[1]]
