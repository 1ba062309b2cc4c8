"""The parse differential's checks themselves: each reports what it is there to find
(tests/parse_differential.py, tests/release_differential.py), and not what reads alike."""

from __future__ import annotations

import pytest

from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql
from tests.parse_differential import divergences
from tests.release_differential import release_divergences

_ADULT = frozenset({"age", "sex", "hours_per_week", "capital_gain"})
_PEOPLE = frozenset({"id", "age", "income", "sex", "signed_up"})
_BY_YEAR = "SELECT EXTRACT(year FROM signed_up) AS y, count(*) FROM people GROUP BY 1 ORDER BY 2 DESC LIMIT 3"
_POST = ("SELECT EXTRACT(YEAR FROM dpproxy_release._k1) AS y, dpproxy_release._dp1 AS count FROM "
         "(SELECT pg_catalog.unnest($1) AS _k1, pg_catalog.unnest($2) AS _dp1) AS dpproxy_release ORDER BY 2 DESC LIMIT 3")


def _grouped_by(unit: str) -> str:
    key = (f"CASE WHEN (signed_up >= '2023-01-01') AND (signed_up < '2025-01-01') "
           f"THEN pg_catalog.date_trunc('{unit}', signed_up) END")
    return f"SELECT k0, p0 FROM (SELECT {key} AS k0, count(*) AS p0 FROM public.people GROUP BY {key}) AS cells"


@pytest.mark.parametrize(("backend_filter", "found"), [
    ("age OPERATOR(pg_catalog.>) 30", False),
    ("30 OPERATOR(pg_catalog.<) age", False),
    ("NOT (age > 30)", True),
    ("age > 30 AND sex = 'Male'", True),
    ("age >= 30", True),
])
def test_a_conditional_aggregate_is_compared_with_the_filter_as_a_whole(backend_filter: str, found: bool) -> None:
    statement = "SELECT sum(CASE WHEN age > 30 THEN age ELSE 0 END) FROM adult"
    backend = f"SELECT pg_catalog.sum(age) FILTER (WHERE {backend_filter}) FROM public.adult"
    reported = [str(item) for item in divergences(statement, [backend], _ADULT) if item.what == "aggregate condition"]
    assert bool(reported) == found, reported


@pytest.mark.parametrize(("unit", "found"), [("year", False), ("month", False), ("day", False), ("week", True)])
def test_a_date_part_of_a_truncated_time_is_alike_only_where_the_truncation_keeps_it(unit: str, found: bool) -> None:
    # date_trunc('week', t) starts a week in the year before for the first days of a year
    reported = release_divergences(_BY_YEAR, _grouped_by(unit), _POST, [("count", None, None)], "people", _PEOPLE)
    assert bool(reported) == found, reported


@pytest.mark.parametrize("post", [
    _POST.replace("ORDER BY 2 DESC", "ORDER BY 2"),
    _POST.replace("LIMIT 3", "LIMIT 4"),
    _POST.replace("EXTRACT(YEAR", "EXTRACT(MONTH"),
    _POST.replace("dpproxy_release._dp1 AS count", "dpproxy_release._dp1 OPERATOR(pg_catalog.*) 2 AS count"),
    _POST.replace("ORDER BY 2 DESC LIMIT 3", "LIMIT 3"),
])
def test_an_outer_statement_that_computes_or_orders_otherwise_is_a_divergence(post: str) -> None:
    reported = release_divergences(_BY_YEAR, _grouped_by("year"), post, [("count", None, None)], "people", _PEOPLE)
    assert reported


def test_released_aggregates_are_told_apart_by_the_rows_they_count() -> None:
    statement = "SELECT count(*) FILTER (WHERE age > 30) AS a, count(*) AS b FROM adult ORDER BY a"
    post = ("SELECT dpproxy_release._dp{} AS a, dpproxy_release._dp{} AS b FROM ((VALUES ($1, $2))) "
            "AS dpproxy_release (_dp1, _dp2) ORDER BY a")
    released = [("count", None, None), ("count", None, '("age" OPERATOR(pg_catalog.>) 30)')]
    backend = "SELECT count(*), count(*) FILTER (WHERE age > 30) FROM public.adult"
    assert not release_divergences(statement, backend, post.format(2, 1), released, "adult", _ADULT)
    assert release_divergences(statement, backend, post.format(1, 2), released, "adult", _ADULT)


# A table with answer_quantum_ms, whose text t and unconstrained numeric n are compared on their raw
# values too, and whose varchar(64) code and numeric(60, 0) p get a hashed raw equality (rewriter/raw_equality.py).
_RAW_TABLE = Relation(1, "public", "tr", TablePolicy(epsilon=1.0, answer_quantum_ms=20), {column.name: column for column in (
    ColumnInfo("t", 25, -1, 2, None), ColumnInfo("x", 23, -1, 3, ColumnPolicy(bounds=(0, 100))),
    ColumnInfo("n", 1700, -1, 4, ColumnPolicy(bounds=(0, 100))), ColumnInfo("code", 1043, 64 + 4, 5, None),
    ColumnInfo("p", 1700, (60 << 16) + 4, 7, None))})


def _raw_backend(where: str) -> tuple[str, str]:
    statement = f"SELECT count(*) FROM tr WHERE {where}"
    backend = backend_sql(plan_aggregate_query(statement, _RAW_TABLE), 0)
    assert '"raw ' in backend, backend
    return statement, backend


@pytest.mark.parametrize("where", [
    "t = 'x'", "t = 'x' OR x > 3", "(t = 'x' AND x > 3) OR t = 'y'", "n > 5 AND n <= 7", "code = 'abc' AND x > 2",
    "code = $1", "$1 = code", "p IN (1, 2, 2)", "x > 1 AND p = $1",
])
def test_the_raw_comparisons_and_equalities_the_rewriter_adds_are_read_as_the_statement(where: str) -> None:
    statement, backend = _raw_backend(where)
    assert not divergences(statement, [backend], frozenset(_RAW_TABLE.columns)), backend


@pytest.mark.parametrize(("where", "written", "mutated"), [
    ("t = 'x' OR x > 3", """("raw 2" OPERATOR(pg_catalog.=) 'x')""", """("raw 2" OPERATOR(pg_catalog.=) 'y')"""),
    ("t = 'x'", """("raw 2" OPERATOR(pg_catalog.=) 'x')""", """("raw 2" OPERATOR(pg_catalog.<>) 'x')"""),
    ("p IN (1, 2)", "CAST(2 AS pg_catalog.numeric)", "CAST(1 AS pg_catalog.numeric)"),  # 2 dropped: the rows where p = 2 lost
    ("x > 1 AND p = $1", """("raw 7" OPERATOR(pg_catalog.=) CAST($1""", """("raw 7" OPERATOR(pg_catalog.=) CAST($2"""),
])
def test_a_raw_comparison_or_equality_that_is_not_the_statements_is_a_divergence(
        where: str, written: str, mutated: str) -> None:
    statement, backend = _raw_backend(where)
    assert written in backend, backend
    reported = divergences(statement, [backend.replace(written, mutated)], frozenset(_RAW_TABLE.columns))
    assert any(item.what in ("condition", "backend condition") for item in reported), reported
