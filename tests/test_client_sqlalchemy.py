"""SQLAlchemy 2 (postgresql+psycopg) through dpproxy: dialect start-up, the inspector,
text() queries with and without a bound parameter, the ORM's counts, and pandas ``read_sql``.

On first connect the dialect runs ``select pg_catalog.version()``, ``current_schema()``,
``show transaction isolation level``, ``show standard_conforming_strings`` and psycopg's
TypeInfo lookup for hstore inside a savepoint; every checkout begins a transaction and
every check-in rolls it back.
"""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pytest
import sqlalchemy
from sqlalchemy import Column, Engine, Integer, MetaData, Table, Text, create_engine, func, inspect, select, text
from sqlalchemy.orm import DeclarativeBase, Session

from clients import exact_count
from conftest import TEST_DATABASE, TEST_POLICY, RunningProxy, TestDatabase, make_policy


def _engine(proxy: RunningProxy) -> Engine:
    url = sqlalchemy.URL.create("postgresql+psycopg", username="analyst", password="analyst", host=proxy.host,
                                port=proxy.port, database=TEST_DATABASE)
    return create_engine(url, pool_size=2, connect_args={"connect_timeout": 10})


@pytest.fixture(scope="module")
def engine(proxy: RunningProxy) -> Iterator[Engine]:
    engine = _engine(proxy)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture(scope="module")
def repeating_engine(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """An engine on a dpproxy with repeats on, as deployed (the suite's proxy has them off)."""
    policy = TEST_POLICY.replace("repeats: {{enabled: false}}", "repeats: {{enabled: true}}")
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("repeats") / "ledger.sqlite3", policy))
    engine = _engine(proxy)
    try:
        yield engine
    finally:
        engine.dispose()
        proxy.stop()


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


class _Base(DeclarativeBase):
    pass


class Adult(_Base):
    """adult as an application maps it. The ORM needs a primary key to map a class; adult has
    none, so ``age`` is declared one here (only SQLAlchemy sees it)."""

    __table__ = Table("adult", MetaData(), Column("age", Integer, primary_key=True),
                      Column("hours_per_week", Integer), Column("sex", Text))


def test_pandas_read_sql_of_text_query_keeps_column_names(engine: Engine, admin):
    with engine.connect() as conn:
        frame = pd.read_sql(text("SELECT count(*) AS n, avg(age) AS avg_age FROM adult WHERE age > :age"), conn,
                            params={"age": 30})
    assert list(frame.columns) == ["n", "avg_age"] and len(frame) == 1
    assert abs(frame["n"][0] - exact_count(admin, "age > 30")) < 50  # ε/2: scale 2, fails by chance with p ≈ 2e-11
    assert 17 <= frame["avg_age"][0] <= 90


def test_pandas_read_sql_of_core_select_keeps_labels(engine: Engine, admin):
    query = select(func.count().label("people"), func.sum(Adult.hours_per_week).label("hours")).where(Adult.age > 40)
    frame = pd.read_sql(query, engine)
    assert list(frame.columns) == ["people", "hours"]
    assert abs(frame["people"][0] - exact_count(admin, "age > 40")) < 50  # ε/2: scale 2, fails by chance with p ≈ 2e-11


def test_sqlalchemy_orm_select_func_count_is_answered_as_count_1(engine: Engine, admin):
    """SQLAlchemy labels the column ``count_1`` on the wire and keys it ``count`` in the result."""
    query = select(func.count()).select_from(Adult).where(Adult.age > 40)
    with engine.connect() as conn:
        on_the_wire = conn.execute(query)
        assert [c.name for c in on_the_wire.cursor.description] == ["count_1"]
        on_the_wire.close()
    with Session(engine) as session:
        result = session.execute(query)
        assert list(result.keys()) == ["count"]
        count = result.scalar_one()
    assert abs(count - exact_count(admin, "age > 40")) < 30


def test_sqlalchemy_orm_query_count_wraps_a_subquery_and_is_answered(engine: Engine, admin):
    """``Query.count()`` sends ``SELECT count(*) AS count_1 FROM (SELECT adult.age AS adult_age, ...
    FROM adult WHERE adult.age > $1) AS anon_1``: a wrapper that only projects and filters."""
    with Session(engine) as session:
        count = session.query(Adult).filter(Adult.age > 40).count()
    assert abs(count - exact_count(admin, "age > 40")) < 30


def test_pandas_read_sql_of_a_repeat_has_the_names_the_new_statement_asks_for(repeating_engine: Engine):
    """A repeat shares the released values only: its columns are named as the new statement says."""
    sql = "SELECT count(*){alias}, avg(age) AS mean_age FROM adult WHERE age > 44"
    first = pd.read_sql(text(sql.format(alias=" AS total_people")), repeating_engine)
    renamed = pd.read_sql(text(sql.format(alias=" AS other_name")), repeating_engine)
    bare = pd.read_sql(text(sql.format(alias="")), repeating_engine)
    assert list(first.columns) == ["total_people", "mean_age"]
    assert list(renamed.columns) == ["other_name", "mean_age"]
    assert list(bare.columns) == ["count", "mean_age"]
    assert renamed["other_name"][0] == bare["count"][0] == first["total_people"][0]
