"""polars' two PostgreSQL engines, connectorx and Arrow's ADBC driver, as clients of dpproxy,
for tests/test_client_polars.py.

Usage: python tests/polars_check.py URI [pandas]
(``pandas``: only connectorx's pandas read.) Prints one JSON object: per engine, what it introspected, the DP answers it read, the ε each
statement spent (read back with SHOW dpproxy.budget on a connection of its own) and how a
refused statement reached the caller. Run apart from the test process, which runs dpproxy in
a thread: connectorx keeps Python's GIL while it waits for the server.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import adbc_driver_manager
import adbc_driver_postgresql.dbapi as adbc
import connectorx
import polars as pl
import pyarrow as pa
import psycopg

COUNT = "SELECT COUNT(*) AS n FROM adult WHERE age > 30"
SUM_AVG = "SELECT SUM(capital_gain) AS s, AVG(age) AS a FROM adult WHERE sex = 'Female'"
HISTOGRAM = "SELECT sex, COUNT(*) AS n FROM adult GROUP BY sex"


def main(uri: str, only_pandas: bool = False) -> dict[str, Any]:
    with psycopg.connect(uri, autocommit=True) as budget:
        def spent() -> float:
            row = budget.execute("SHOW dpproxy.budget").fetchone()
            assert row is not None
            return float(row[1])

        def charged(step: Callable[[], Any]) -> dict[str, Any]:
            """What ``step`` returned (or how it failed) and the ε it spent."""
            before = spent()
            try:
                out: dict[str, Any] = {"value": step()}
            except Exception as exc:  # the client's own error type is what the test looks at
                out = {"error": type(exc).__module__ + "." + type(exc).__name__, "message": str(exc),
                       "sqlstate": getattr(exc, "sqlstate", None)}
            out["charged"] = spent() - before
            return out

        if only_pandas:
            return {"connectorx": {"pandas": charged(lambda: _pandas(uri))}}
        return {"connectorx": _connectorx(uri, charged), "adbc": _adbc(uri, charged)}


def _pandas(uri: str) -> list[dict[str, Any]]:
    """connectorx's pandas destination first counts the answer's rows:
    SELECT count(*) FROM (query) AS CXTMPTAB_COUNT."""
    return connectorx.read_sql(uri, COUNT, return_type="pandas").to_dict("records")  # type: ignore[no-any-return]


def _connectorx(uri: str, charged: Callable[[Callable[[], Any]], dict[str, Any]]) -> dict[str, Any]:
    def read(query: str, **options: Any) -> list[dict[str, Any]]:
        return pl.read_database_uri(query, uri, engine="connectorx", **options).to_dicts()

    return {
        "count": charged(lambda: read(COUNT)),
        "sum_avg": charged(lambda: [{k: float(v) for k, v in row.items()} for row in read(SUM_AVG)]),
        "histogram": charged(lambda: read(HISTOGRAM)),
        "pandas": charged(lambda: _pandas(uri)),
        "csv": charged(lambda: connectorx.read_sql(uri, COUNT, protocol="csv", return_type="arrow").to_pylist()),
        "refused": charged(lambda: read("SELECT * FROM adult")),
        "partitioned": charged(lambda: read("SELECT age FROM adult", partition_on="age", partition_num=2)),
        "partitioned_aggregate": charged(lambda: read(COUNT, partition_on="n", partition_num=2)),
    }


def _adbc(uri: str, charged: Callable[[Callable[[], Any]], dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "count": charged(lambda: pl.read_database_uri(COUNT, uri, engine="adbc").to_dicts()),
        "histogram": charged(lambda: pl.read_database_uri(HISTOGRAM, uri, engine="adbc").to_dicts()),
    }
    with adbc.connect(uri) as conn:
        objects = conn.adbc_get_objects(depth="all", db_schema_filter="public").read_all().to_pylist()
        tables = [table for catalog in objects for schema in catalog["catalog_db_schemas"] or []
                  for table in schema["db_schema_tables"] or []]
        out["objects"] = {table["table_name"]: [column["column_name"] for column in table["table_columns"]]
                          for table in tables}
        out["constraints"] = {table["table_name"]: [c["constraint_type"] for c in table["table_constraints"] or []]
                              for table in tables}
        out["schema"] = {field.name: str(field.type) for field in conn.adbc_get_table_schema("adult", db_schema_filter="public")}

        def statistics() -> list[Any]:
            """ADBC's approximate statistics: pg_stats (null fractions, distinct counts) and reltuples."""
            handle = conn.adbc_connection.get_statistics(None, "public", "adult", True)
            return pa.RecordBatchReader._import_from_c(handle.address).read_all().to_pylist()  # type: ignore[no-any-return]

        out["statistics"] = charged(statistics)
        conn.rollback()  # the refusal failed ADBC's transaction, as any error does on PostgreSQL

        def fetch(query: str, *params: object) -> list[Any]:
            with conn.cursor() as cursor:
                cursor.execute(query, params or None)
                return [list(row) for row in cursor.fetchall()]

        out["bound"] = charged(lambda: fetch("SELECT COUNT(*) AS n FROM adult WHERE age > $1", 30))
        out["sum_avg"] = charged(lambda: [[float(v) for v in row] for row in fetch(
            "SELECT SUM(capital_gain) AS s, AVG(age) AS a FROM adult WHERE sex = $1", "Female")])
        out["refused"] = charged(lambda: fetch("SELECT age FROM adult WHERE age > $1", 30))
        conn.rollback()
        out["after_refusal"] = fetch("SELECT 1 AS one")
        out["polars_on_connection"] = charged(lambda: pl.read_database(HISTOGRAM, conn).to_dicts())
    assert issubclass(adbc_driver_manager.OperationalError, adbc_driver_manager.Error)
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2:] == ["pandas"])))
