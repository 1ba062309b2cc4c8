"""psqlODBC through unixODBC and pyodbc, against dpproxy: SQLTables, SQLColumns,
SQLPrimaryKeys, SQLStatistics, and DP aggregates with and without a parameter.

psqlODBC sends multi-statement Queries (``BEGIN;SELECT ...``), wraps statements in
savepoints, prepares parameterised statements as ``_PLAN0x...`` and DEALLOCATEs them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyodbc
import pytest

from clients import exact_count, psqlodbc_driver
from conftest import TEST_DATABASE, RunningProxy


def _connect(proxy: RunningProxy, options: str = "") -> pyodbc.Connection:
    return pyodbc.connect(
        f"DRIVER={{{psqlodbc_driver()}}};SERVER={proxy.host};PORT={proxy.port};DATABASE={TEST_DATABASE};"
        "UID=analyst;PWD=analyst" + options,
        timeout=10,
    )


@pytest.fixture
def odbc(proxy: RunningProxy) -> Iterator[pyodbc.Connection]:
    """A pyodbc connection through dpproxy (autocommit off, as pyodbc defaults)."""
    conn = _connect(proxy)
    try:
        yield conn
    finally:
        conn.close()


def test_odbc_catalog_functions_see_the_schema(odbc: pyodbc.Connection, admin):
    cursor = odbc.cursor()
    tables = {row.table_name for row in cursor.tables(schema="public", tableType="TABLE")}
    assert {"adult", "lookup"} <= tables
    columns = {row.column_name: row.type_name for row in cursor.columns(table="adult", schema="public")}
    assert columns["age"] == "int4" and columns["sex"] == "text"
    assert [row.column_name for row in cursor.primaryKeys("lookup", schema="public")] == ["code"]
    statistics = [tuple(row) for row in cursor.statistics("adult", schema="public")]
    assert any(row[5] == "adult_age_idx" for row in statistics)
    exact = exact_count(admin)
    assert not [row for row in statistics if exact in row], "SQLStatistics revealed adult's row count"


def test_odbc_noised_counts_with_and_without_a_parameter(odbc: pyodbc.Connection, admin):
    cursor = odbc.cursor()
    (plain,) = cursor.execute("SELECT COUNT(*) FROM adult WHERE age > 30").fetchone()
    answers = [cursor.execute("SELECT COUNT(*) FROM adult WHERE age > ?", 30).fetchone()[0] for _ in range(3)]
    odbc.commit()
    exact = exact_count(admin, "age > 30")
    assert all(abs(int(a) - exact) < 30 for a in [plain, *answers])


def test_odbc_refusal_is_an_error_and_the_connection_goes_on(odbc: pyodbc.Connection):
    cursor = odbc.cursor()
    with pytest.raises(pyodbc.Error, match="DP001|not allowed"):
        cursor.execute("SELECT age FROM adult").fetchall()
    odbc.rollback()
    assert cursor.execute("SELECT 1").fetchone()[0] == 1


def test_odbc_use_declare_fetch_reads_through_cursors(proxy: RunningProxy, admin):
    # UseDeclareFetch: psqlODBC declares a cursor for each SELECT and fetches Fetch rows at a time.
    conn = _connect(proxy, ";UseDeclareFetch=1;Fetch=1")
    try:
        cursor = conn.cursor()
        (count,) = cursor.execute("SELECT COUNT(*) FROM adult WHERE age > ?", 30).fetchone()
        assert abs(int(count) - exact_count(admin, "age > 30")) < 30
        rows = cursor.execute("SELECT code, label FROM lookup ORDER BY code").fetchall()
        assert [tuple(row) for row in rows] == [("F", "Female"), ("M", "Male")]
        conn.commit()
    finally:
        conn.close()

