"""The parse differential's checks themselves: each reports what it is there to find
(tests/parse_differential.py, tests/release_differential.py), and not what reads alike."""

from __future__ import annotations

import pytest

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
