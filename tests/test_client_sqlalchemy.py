"""SQLAlchemy 2 (postgresql+psycopg) through dpproxy: dialect start-up, the inspector, and
text() queries with and without a bound parameter.

On first connect the dialect runs ``select pg_catalog.version()``, ``current_schema()``,
``show transaction isolation level``, ``show standard_conforming_strings`` and psycopg's
TypeInfo lookup for hstore inside a savepoint; every checkout begins a transaction and
every check-in rolls it back.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy
from sqlalchemy import Engine, create_engine, inspect, text

from clients import exact_count
from conftest import TEST_DATABASE, RunningProxy


@pytest.fixture(scope="module")
def engine(proxy: RunningProxy) -> Iterator[Engine]:
    url = sqlalchemy.URL.create("postgresql+psycopg", username="analyst", password="analyst", host=proxy.host,
                                port=proxy.port, database=TEST_DATABASE)
    engine = create_engine(url, pool_size=2, connect_args={"connect_timeout": 10})
    try:
        yield engine
    finally:
        engine.dispose()


def test_sqlalchemy_inspector_sees_tables_columns_keys_and_indexes(engine: Engine):
    inspector = inspect(engine)
    assert {"adult", "lookup"} <= set(inspector.get_table_names())
    columns = {c["name"]: str(c["type"]) for c in inspector.get_columns("adult")}
    assert columns["age"] == "INTEGER" and columns["sex"] == "TEXT"
    assert inspector.get_pk_constraint("lookup")["constrained_columns"] == ["code"]
    assert [(i["name"], i["column_names"]) for i in inspector.get_indexes("adult")] == [("adult_age_idx", ["age"])]
    assert inspector.has_table("adult") and "adult" not in inspector.get_view_names()
    assert inspector.get_foreign_keys("adult") == [] and inspector.get_table_comment("adult")["text"] is None


def test_sqlalchemy_text_queries_return_noised_counts(engine: Engine, admin):
    with engine.connect() as conn:
        plain = conn.execute(text("SELECT COUNT(*) FROM adult WHERE age > 30")).scalar_one()
        bound = conn.execute(text("SELECT COUNT(*) FROM adult WHERE age > :age"), {"age": 30}).scalar_one()
        total = conn.execute(text("SELECT SUM(hours_per_week) AS total FROM adult WHERE sex = :sex"),
                             {"sex": "Female"}).scalar_one()
    exact = exact_count(admin, "age > 30")
    assert abs(plain - exact) < 30 and abs(bound - exact) < 30
    assert total > 0


def test_sqlalchemy_refusal_is_a_dbapi_error_and_the_pool_goes_on(engine: Engine):
    with engine.connect() as conn:
        with pytest.raises(sqlalchemy.exc.DBAPIError) as info:
            conn.execute(text("SELECT age FROM adult"))
        assert info.value.orig.sqlstate == "DP001"  # type: ignore[union-attr]
    with engine.connect() as conn:
        assert conn.execute(text("SELECT 1")).scalar_one() == 1
