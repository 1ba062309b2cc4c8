"""The parse differential's checks themselves: each reports what it is there to find
(tests/parse_differential.py, tests/release_differential.py), and not what reads alike."""

from __future__ import annotations

import pytest

from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql
from tests.parse_differential import divergences
from tests.raw_reads import raw_reads
from tests.release_differential import Labelled, Released, label_divergences, plain_divergences, release_divergences

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
    reported = release_divergences(_BY_YEAR, _grouped_by(unit), _POST, [Released("count", None, None, None)], "people", _PEOPLE)
    assert bool(reported) == found, reported


@pytest.mark.parametrize("post", [
    _POST.replace("ORDER BY 2 DESC", "ORDER BY 2"),
    _POST.replace("LIMIT 3", "LIMIT 4"),
    _POST.replace("EXTRACT(YEAR", "EXTRACT(MONTH"),
    _POST.replace("dpproxy_release._dp1 AS count", "dpproxy_release._dp1 OPERATOR(pg_catalog.*) 2 AS count"),
    _POST.replace("ORDER BY 2 DESC LIMIT 3", "LIMIT 3"),
])
def test_an_outer_statement_that_computes_or_orders_otherwise_is_a_divergence(post: str) -> None:
    reported = release_divergences(_BY_YEAR, _grouped_by("year"), post, [Released("count", None, None, None)], "people", _PEOPLE)
    assert reported


def test_released_aggregates_are_told_apart_by_the_rows_they_count() -> None:
    statement = "SELECT count(*) FILTER (WHERE age > 30) AS a, count(*) AS b FROM adult ORDER BY a"
    post = ("SELECT dpproxy_release._dp{} AS a, dpproxy_release._dp{} AS b FROM ((VALUES ($1, $2))) "
            "AS dpproxy_release (_dp1, _dp2) ORDER BY a")
    released = [Released("count", None, None, None), Released("count", None, '("age" OPERATOR(pg_catalog.>) 30)', None)]
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
    assert any(raw_reads(backend, column) for column in _RAW_TABLE.columns), backend
    return statement, backend


@pytest.mark.parametrize("where", [
    "t = 'x'", "t = 'x' OR x > 3", "(t = 'x' AND x > 3) OR t = 'y'", "n > 5 AND n <= 7", "code = 'abc' AND x > 2",
    "code = $1", "$1 = code", "p IN (1, 2, 2)", "x > 1 AND p = $1",
])
def test_the_raw_comparisons_and_equalities_the_rewriter_adds_are_read_as_the_statement(where: str) -> None:
    statement, backend = _raw_backend(where)
    assert not divergences(statement, [backend], frozenset(_RAW_TABLE.columns)), backend


@pytest.mark.parametrize(("where", "written", "mutated"), [
    # a column read once has its bound written in place, its raw comparison the quoted column itself
    ("t = 'x' OR x > 3", """("t" OPERATOR(pg_catalog.=) 'x')""", """("t" OPERATOR(pg_catalog.=) 'y')"""),
    ("t = 'x'", """("t" OPERATOR(pg_catalog.=) 'x')""", """("t" OPERATOR(pg_catalog.<>) 'x')"""),
    ("p IN (1, 2)", "CAST(2 AS pg_catalog.numeric)", "CAST(1 AS pg_catalog.numeric)"),  # 2 dropped: the rows where p = 2 lost
    ("x > 1 AND p = $1", """("p" OPERATOR(pg_catalog.=) CAST($1""", """("p" OPERATOR(pg_catalog.=) CAST($2"""),
])
def test_a_raw_comparison_or_equality_that_is_not_the_statements_is_a_divergence(
        where: str, written: str, mutated: str) -> None:
    statement, backend = _raw_backend(where)
    assert written in backend, backend
    reported = divergences(statement, [backend.replace(written, mutated)], frozenset(_RAW_TABLE.columns))
    assert any(item.what in ("condition", "backend condition") for item in reported), reported


_COUNT_AND_SUM = ("SELECT pg_catalog.count(*), pg_catalog.sum(pg_catalog.int4smaller(pg_catalog.int4larger(\"age\", "
                  "CAST(17 AS integer)), CAST(90 AS integer))) FROM \"public\".\"adult\"")
_ENCLOSING_POST = ("SELECT a OPERATOR(pg_catalog.*) 2 AS b FROM (SELECT dpproxy_release._dp1 AS a, dpproxy_release._dp2 AS s "
                   "FROM ((VALUES ($1, $2))) AS dpproxy_release (_dp1, _dp2)) AS q ORDER BY b")
_COUNT_AND_SUM_RELEASED = [Released("count", None, None, None), Released("sum", "age", None, None)]


@pytest.mark.parametrize("statement", [
    "SELECT a * 2 AS b FROM (SELECT count(*) AS a, sum(age) AS s FROM adult) AS q ORDER BY b",
    "WITH q AS (SELECT count(*) AS a, sum(age) AS s FROM adult) SELECT a * 2 AS b FROM q ORDER BY b",
    "SELECT a * 2 AS b FROM (SELECT count(*) AS a, sum(age) AS s FROM (SELECT * FROM adult) AS t) AS q ORDER BY b",
])
@pytest.mark.parametrize(("post", "found"), [
    (_ENCLOSING_POST, False),
    (_ENCLOSING_POST.replace("a OPERATOR(pg_catalog.*) 2", "s OPERATOR(pg_catalog.*) 2"), True),
    (_ENCLOSING_POST.replace("_dp1 AS a, dpproxy_release._dp2 AS s", "_dp2 AS a, dpproxy_release._dp1 AS s"), True),
    (_ENCLOSING_POST.replace(" ORDER BY b", ""), True),
    (_ENCLOSING_POST.replace("AS q ORDER BY b", "AS q WHERE a OPERATOR(pg_catalog.>) 0 ORDER BY b"), True),
])
def test_an_enclosing_query_or_cte_is_compared_level_by_level(statement: str, post: str, found: bool) -> None:
    reported = release_divergences(statement, _COUNT_AND_SUM, post, _COUNT_AND_SUM_RELEASED, "adult", _ADULT)
    assert bool(reported) == found, reported


_BY_MONTH = ('SELECT "source"."k0" AS "k0", count(*) AS "count" FROM (SELECT date_trunc(\'month\', signed_up) AS "k0", * '
             'FROM people) AS "source" GROUP BY 1 ORDER BY 1')
_BY_MONTH_POST = ("SELECT dpproxy_release._k1 AS k0, dpproxy_release._dp1 AS count FROM (SELECT pg_catalog.unnest($1) AS _k1, "
                  "pg_catalog.unnest($2) AS _dp1) AS dpproxy_release ORDER BY 1")


@pytest.mark.parametrize(("unit", "found"), [("month", False), ("week", True)])
def test_a_key_a_derived_table_names_is_read_as_its_expression(unit: str, found: bool) -> None:
    # Metabase groups by "source"."k0", an output of the table it reads: date_trunc('month', signed_up)
    reported = release_divergences(_BY_MONTH, _grouped_by(unit), _BY_MONTH_POST, [Released("count", None, None, None)],
                                   "people", _PEOPLE)
    assert bool(reported) == found, reported


_SHARES = "SELECT avg(CASE WHEN age > 40 THEN 1 ELSE 0 END) AS r, avg((age > 40)::int) FROM adult"
_SHARE = "CAST(GREATEST(0, LEAST(dpproxy_release._dp{}, GREATEST(dpproxy_release._dp{}, 1))) AS numeric) " \
         "OPERATOR(pg_catalog./) GREATEST(dpproxy_release._dp{}, 1)"
_SHARES_RELEASED = [Released("count", None, None, None),
                    Released("count", None, '(("age" OPERATOR(pg_catalog.>) 40) OR (NOT ("age" OPERATOR(pg_catalog.>) 40)))', None),
                    Released("count", None, '("age" OPERATOR(pg_catalog.>) 40)', None)]


@pytest.mark.parametrize(("first", "second", "found"), [
    ((3, 1, 1), (3, 2, 2), False),
    ((3, 2, 2), (3, 2, 2), True),  # the ELSE 0 form averages over every row, not the rows where p is known
    ((3, 1, 1), (3, 1, 1), True),  # the cast skips the rows where p is NULL
    ((2, 1, 1), (3, 2, 2), True),
    ((3, 1, 3), (3, 2, 2), True),
])
def test_a_share_is_read_as_the_division_of_the_counts_postgresql_averages_over(
        first: tuple[int, int, int], second: tuple[int, int, int], found: bool) -> None:
    post = (f"SELECT {_SHARE.format(*first)} AS r, {_SHARE.format(*second)} AS avg FROM ((VALUES ($1, $2, $3))) "
            "AS dpproxy_release (_dp1, _dp2, _dp3)")
    reported = release_divergences(_SHARES, "SELECT 1", post, _SHARES_RELEASED, "adult", _ADULT)
    assert bool(reported) == found, reported


@pytest.mark.parametrize(("released", "found"), [
    ([Released("percentile_cont", "age", None, "9/10"), Released("percentile_disc", "age", None, "3/4")], False),
    ([Released("percentile_cont", "age", None, "9/10"), Released("percentile_disc", "age", None, "1/4")], True),
    ([Released("percentile_disc", "age", None, "3/4"), Released("percentile_cont", "age", None, "9/10")], True),
    ([Released("percentile_cont", "age", None, "1/2"), Released("percentile_disc", "age", None, "3/4")], True),
    ([Released("percentile_cont", "age", None, "9/10")], True),
])
def test_an_answer_released_as_it_is_is_compared_aggregate_by_aggregate(released: list[Released], found: bool) -> None:
    statement = ("SELECT percentile_cont(0.9) WITHIN GROUP (ORDER BY age), "
                 "percentile_disc(0.25) WITHIN GROUP (ORDER BY age DESC) FROM adult")  # DESC: 1 - 0.25
    reported = plain_divergences(statement, released, "adult")
    assert bool(reported) == found, reported


@pytest.mark.parametrize(("distinct", "found"), [(True, False), (False, True)])
def test_a_distinct_count_is_told_from_a_count(distinct: bool, found: bool) -> None:
    reported = plain_divergences("SELECT count(DISTINCT age) FROM (SELECT * FROM adult) AS t", [
        Released("count", "age", None, None, distinct)], "adult")
    assert bool(reported) == found, reported


_BY_SEX = ("SELECT k0, pg_catalog.sum(p0) FROM (SELECT CASE WHEN (\"sex\" OPERATOR(pg_catalog.=) 'Male') THEN 0 WHEN "
           "(\"sex\" OPERATOR(pg_catalog.=) 'Female') THEN 1{} END AS k0, pg_catalog.count(*) AS p0 FROM \"public\".\"people\" "
           "GROUP BY \"sex\" OFFSET 0) AS cells WHERE k0 IS NOT NULL GROUP BY k0")


@pytest.mark.parametrize(("otherwise", "labels", "found"), [
    ("", ("Male", "Female"), False),
    (" ELSE 2", ("Male", "Female", "other"), False),
    ("", ("Female", "Male"), True),
    ("", ("Male", "Female", "other"), True),
    (" ELSE 2", ("Male", "Female"), True),
])
def test_a_category_keys_cells_are_released_under_the_labels_the_backend_numbers(
        otherwise: str, labels: tuple[str, ...], found: bool) -> None:
    reported = label_divergences(_BY_SEX.format(otherwise), [Labelled("sex", "text", labels)])
    assert bool(reported) == found, reported


_BY_SEX_POST = ("SELECT dpproxy_release._k1 AS sex, dpproxy_release._dp1 AS {} FROM (SELECT pg_catalog.unnest($1) AS _k1, "
                "pg_catalog.unnest($2) AS _dp1) AS dpproxy_release ORDER BY {}")


@pytest.mark.parametrize(("name", "order", "ran", "found"), [
    ("n", "n DESC", "n DESC", False),
    ("n", "n DESC", "dpproxy_release._dp1 DESC", False),  # the output n stands for
    ("age", "age", "age", False),  # an output's bare name: the output, though the table has age
    ("age", "age + 0", "age OPERATOR(pg_catalog.+) 0", True),  # the column age to PostgreSQL, none over the release
    ("n", "n DESC", "dpproxy_release._k1 DESC", True),
])
def test_an_order_by_name_is_read_as_postgresql_reads_it(name: str, order: str, ran: str, found: bool) -> None:
    statement = f"SELECT sex, count(*) AS {name} FROM people GROUP BY sex ORDER BY {order}"
    key = ("CASE WHEN (\"sex\" OPERATOR(pg_catalog.=) 'Male') THEN 0 WHEN (\"sex\" OPERATOR(pg_catalog.=) 'Female') "
           "THEN 1 END")
    backend = f"SELECT k0, p0 FROM (SELECT {key} AS k0, count(*) AS p0 FROM public.people GROUP BY sex) AS cells"
    reported = release_divergences(statement, backend, _BY_SEX_POST.format(name, ran),
                                   [Released("count", None, None, None)], "people", _PEOPLE)
    assert bool(reported) == found, reported


def test_an_enclosing_querys_where_is_no_condition_on_the_rows() -> None:
    # WHERE n > 10 reads the released count: the outer statement's, compared level by level
    statement = "SELECT sex, n FROM (SELECT sex, count(*) AS n FROM people GROUP BY sex) AS t WHERE n > 10"
    backend = "SELECT k0, p0 FROM (SELECT sex AS k0, count(*) AS p0 FROM public.people GROUP BY sex) AS cells"
    assert not divergences(statement, [backend], _PEOPLE)
    assert divergences("SELECT sex, count(*) AS n FROM people WHERE age > 10 GROUP BY sex", [backend], _PEOPLE)


_BY_AGE = "SELECT age, count(*) AS n FROM people GROUP BY age ORDER BY {}"
_BY_AGE_POST = ("SELECT dpproxy_release._k1 AS age, dpproxy_release._dp1 AS n FROM (SELECT pg_catalog.unnest($1) AS _k1, "
                "pg_catalog.unnest($2) AS _dp1) AS dpproxy_release ORDER BY {}")
_AGE_KEY = ("SELECT k0, p0 FROM (SELECT CASE WHEN (age >= 17) AND (age <= 90) THEN age END AS k0, count(*) AS p0 "
            "FROM public.people GROUP BY age) AS cells")


@pytest.mark.parametrize(("order", "ran", "found"), [
    ("n DESC NULLS FIRST", "n DESC", False),  # DESC puts NULLs first unless told
    ("n NULLS LAST", "n ASC", False),
    ("n DESC NULLS LAST", "n DESC", True),
    ("n ASC NULLS FIRST", "n", True),
    ("n DESC", "n DESC NULLS LAST", True),
    ('age COLLATE "C"', 'dpproxy_release._k1 COLLATE pg_catalog."C"', False),
    ('age COLLATE "C"', 'dpproxy_release._k1 COLLATE pg_catalog."POSIX"', True),
    ('age COLLATE "C"', "dpproxy_release._k1", True),
    ("n USING >", "n DESC", True),
])
def test_an_order_by_is_compared_with_its_nulls_order_and_collation(order: str, ran: str, found: bool) -> None:
    reported = release_divergences(_BY_AGE.format(order), _AGE_KEY, _BY_AGE_POST.format(ran),
                                   [Released("count", None, None, None)], "people", _PEOPLE)
    assert bool(reported) == found, reported
