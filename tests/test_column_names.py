"""rewriter.column_names names output columns as PostgreSQL's FigureColname does: checked
against PostgreSQL itself, expression by expression."""

from __future__ import annotations

import psycopg
import pytest

from rewriter.column_names import output_names
from rewriter.statements import split_statements

EXPRESSIONS = [
    "date_trunc('month', d)", "count(*)", 't COLLATE "C"', "round(x, 2)", "x::numeric(10,2)", "CAST(x AS int)",
    "extract(month from d)", "coalesce(x, 0)", "greatest(x, 1)", "least(x, 1)", "current_date", "x + 1", "t || 'a'",
    "(x)", "-x", "date_part('month', d)", "nullif(x, 0)", "CASE WHEN x > 0 THEN 1 END",
    "CASE WHEN x > 0 THEN 1 ELSE x END", "x IS NULL", "substring(t, 1, 2)", "trim(t)", "position('a' in t)", "now()",
    "current_timestamp", "current_timestamp(2)", "localtime", "current_user", "session_user", "current_schema",
    "x::text", "'a'::text", "1", "ARRAY[1, 2]", "ROW(1, 2)", "(1, 2)", "d::date", "date_trunc('month', d)::date",
    "avg(x)::int", "sum(x) / count(*)", "percentile_cont(0.5) WITHIN GROUP (ORDER BY x)",
    "mode() WITHIN GROUP (ORDER BY t)", "count(DISTINCT t)", "x::double precision", "x::bigint", "x::varchar",
    "x::int::text", "(SELECT 1)", "(SELECT x AS y)", "EXISTS (SELECT 1)", "ARRAY(SELECT 1)", "x IN (1, 2)",
    "NOT (x > 1)", "width_bucket(x, 0, 10, 5)", "interval '1 day'", "'a'", "NULL", "(ARRAY[1, 2])[1]",
    "pg_catalog.upper(t)", "overlay(t placing 'a' from 1)", "t LIKE 'a'", "x AS named", "*", "nt.*",
]


@pytest.fixture(scope="module")
def described(pg_dsn: str) -> dict[str, list[str]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE nt (x int, d timestamp, t text)")
        names = {}
        for expression in EXPRESSIONS:
            cursor = conn.execute(f"SELECT {expression} FROM nt LIMIT 0")
            assert cursor.description is not None
            names[expression] = [d.name for d in cursor.description]
        return names


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_each_expression_is_named_as_postgresql_names_it(described: dict[str, list[str]], expression: str) -> None:
    names = output_names(split_statements(f"SELECT {expression} FROM nt")[0].node)
    if expression.endswith("*"):
        assert names == [None]  # the relation's columns, named by PostgreSQL from the table
    else:
        assert names == described[expression]


def test_a_level_down_the_from_chain_is_named_too() -> None:
    sql = "SELECT max(n) FROM (SELECT date_trunc('week', d), count(*) AS n FROM (SELECT d FROM nt) a) b"
    node = split_statements(sql)[0].node
    assert output_names(node) == ["max"]
    assert output_names(node, 1) == ["date_trunc", "n"]
    assert output_names(node, 2) == ["d"]
    assert output_names(node, 3) is None
