"""Statements whose post-processing fails whatever is released are refused before the charge.

The outer statement over a release was tried before the charge over NULL aggregates only, where
a strict operator raises nothing: ``stddev(x) / 0`` and ``1 / (count(*) - count(*))`` (one
release, less itself) were charged and then failed on every release. ``rewriter.certain_errors``
proves such failures from the statement's tree; statements that fail on some releases only are
still answered, and charged, as before. The neighbours are test_attack_histograms' (``hn0`` and
``hn1`` … ``hn5``, each one adversarial row more).
"""

from __future__ import annotations

import psycopg
import pytest
from sqlglot import exp

from rewriter.certain_errors import fails_on_every_release
from rewriter.post_process import RELEASE_ALIAS
from rewriter.sqlglot_parse import parse_postgres
from tests.conftest import RunningProxy, spent_epsilon
from tests.neighbour_outcome import masked_outcome, same_on_neighbours
from tests.test_attack_histograms import _NEIGHBOURS, hist_proxy

__all__ = ["hist_proxy"]  # the fixture, used here as it is there

_TABLES = ["hn0", *_NEIGHBOURS]
_R = RELEASE_ALIAS


def _proved(outer_sql: str, finite: frozenset[int] = frozenset({1, 2})) -> bool:
    """Whether the outer statement ``outer_sql`` (its release columns ``r._dp<k>``, its keys
    ``r._k<k>``) is proved to fail on every release, ``finite`` its finite number columns."""
    tree = parse_postgres(outer_sql.replace("r.", f"{_R}."))
    assert isinstance(tree, exp.Select)
    tree.set("from_", parse_postgres(f"SELECT 1 FROM (VALUES (1, 2)) AS {_R}(_dp1, _dp2)").args["from_"])

    def keys_only(condition: exp.Expr, select: exp.Select) -> bool:
        return all(column.name.startswith("_k") for column in condition.find_all(exp.Column))

    return fails_on_every_release(tree, _R, lambda k: k in finite, keys_only)


@pytest.mark.parametrize("outer", [
    "SELECT 1 / (r._dp1 - r._dp1)",
    "SELECT r._dp1 / 0",
    "SELECT r._dp1 / 0.0 AS a, r._dp2",
    "SELECT r._dp1 % 0",
    "SELECT round(r._dp1 / 0, 2)",
    "SELECT CAST(r._dp1 AS numeric(30, 2)) / (r._dp2 * 2 - r._dp2 * 2)",
    "SELECT r._dp2 ORDER BY -abs(r._dp1) / CAST(0 AS bigint)",
    "SELECT r._dp1 / 0 > 1",
    "SELECT r._k1, r._dp1 / 0 WHERE r._k1 = 'a'",  # a filter on the keys: the same cells whatever is released
    "SELECT r._k1, r._dp1 / 0 ORDER BY r._dp2 DESC LIMIT 5 OFFSET 1",  # as many rows whatever their order
])
def test_a_division_by_a_zero_no_release_changes_is_proved_to_fail(outer: str) -> None:
    assert _proved(outer)


@pytest.mark.parametrize("outer, finite", [
    ("SELECT 1 / (r._dp1 - r._dp2)", {1, 2}),  # two releases: their difference is 0 on some only
    ("SELECT r._dp1 / (r._dp1 - 1)", {1, 2}),  # 0 when the release is 1
    ("SELECT 1 / r._dp1", {1, 2}),  # a noisy count of 0 fails, others do not
    ("SELECT r._dp1 / 0", {2}),  # not known finite (real: may round to infinity, whose NaN ÷ 0 is NaN)
    ("SELECT nullif(r._dp1, 5) / 0", {1, 2}),  # NULL ÷ 0 is NULL
    ("SELECT CAST(r._dp1 AS text) / 0", {1, 2}),
    ("SELECT CASE WHEN r._dp1 > 0 THEN r._dp1 / 0 ELSE 0 END", {1, 2}),  # not evaluated on every release
    ("SELECT coalesce(1, r._dp1 / 0)", {1, 2}),
    ("SELECT r._dp1 / 0 WHERE r._dp2 > 5", {1, 2}),  # HAVING on an aggregate: no row on some releases
    ("SELECT r._dp1 / 0 LIMIT ALL", {1, 2}),  # a LIMIT that is not a whole-number literal is not read
    ("SELECT generate_series(1, r._dp2), r._dp1 / 0", {1, 2}),  # no row when the release is 0
    ("SELECT CAST(r._dp1 + 1000 AS numeric(2, 0))", {1, 2}),  # fails on every release ≥ 0: not proved (a limit)
    ("SELECT CASE WHEN r._dp1 = 12345 THEN 1 ELSE 1 / (r._dp2 - r._dp2) END", {1, 2}),
])
def test_a_failure_that_some_release_avoids_is_not_proved(outer: str, finite: set[int]) -> None:
    assert not _proved(outer, frozenset(finite))


_INNER = f"(SELECT r._dp1 AS x, r._dp2 AS y FROM (VALUES (1, 2)) AS r(_dp1, _dp2))"


def _proved_enclosing(sql: str) -> bool:
    """Whether ``sql``, an outer statement enclosing the SELECT over the release (``{inner}``, its
    outputs ``x`` and ``y`` the two finite release columns), is proved to fail on every release."""
    tree = parse_postgres(sql.format(inner=_INNER).replace("r.", f"{_R}.").replace("AS r(", f"AS {_R}("))
    assert isinstance(tree, exp.Select)
    return fails_on_every_release(tree, _R, lambda k: k in {1, 2}, lambda condition, select: False)


@pytest.mark.parametrize("sql", [
    "SELECT x / 0 FROM {inner} AS q",
    "SELECT q.x / 0 AS a FROM {inner} AS q ORDER BY a",
    "SELECT 1 / (x - x) FROM {inner} AS q",
    "SELECT y FROM {inner} AS q ORDER BY x % 0",
    "SELECT b / 0 FROM (SELECT x AS b FROM {inner} AS q) AS w",  # two levels up
    "SELECT * FROM (SELECT x / 0 AS z FROM {inner} AS q) AS w",  # a star is the outputs below
    "SELECT x / 0 FROM {inner} AS q LIMIT 1",
])
def test_a_certain_division_in_a_query_enclosing_the_release_is_proved(sql: str) -> None:
    assert _proved_enclosing(sql)


@pytest.mark.parametrize("sql", [
    "SELECT 1 FROM (SELECT x / 0 AS z FROM {inner} AS q) AS w",  # not named above: PostgreSQL need not compute it
    "SELECT x / 0 FROM {inner} AS q WHERE y > 5",  # a filter on a release: no row on some
    "SELECT max(x / 0) FROM {inner} AS q",  # an aggregate above the release
    "SELECT x / 0 FROM {inner} AS q GROUP BY x",
    "SELECT x / 0, generate_series(1, y) FROM {inner} AS q",  # no row when the release is 0
    "SELECT x / 0 FROM (SELECT x, generate_series(1, y) AS g FROM {inner} AS q) AS w",  # the same, not named
    "SELECT CASE WHEN x >= 0 THEN x / 0 END FROM {inner} AS q",  # skipped on some releases
    "SELECT x / 0 FROM {inner} AS q, {inner} AS p",  # a join
    "SELECT x / 0 FROM {inner} AS q LIMIT ALL",
])
def test_a_failure_above_the_release_that_some_release_avoids_is_not_proved(sql: str) -> None:
    assert not _proved_enclosing(sql)


def _doubling(levels: int) -> str:
    """``v / 0`` over ``levels`` wrapper queries, each naming the level below twice (``v + v``)."""
    sql = "SELECT x AS v FROM {inner} AS q"
    for level in range(levels):
        sql = f"SELECT v + v AS v FROM ({sql}) AS w{level}"
    return f"SELECT v / 0 FROM ({sql}) AS top"


def test_wrappers_that_double_the_inlined_tree_are_not_read_through() -> None:
    """Each level doubles the tree the proof inlines: 25 levels, under 2 KB of text, took the
    event loop hours and the process gigabytes; past a bound on its nodes the proof gives up,
    and the statement is answered and charged as an unproved one is."""
    assert _proved_enclosing(_doubling(3))
    assert not _proved_enclosing(_doubling(15))


# Each failed after its charge, on every release: now refused before it, the same on every neighbour.
_CERTAIN = [
    "SELECT 1 / (count(*) - count(*)) FROM {t}",
    "SELECT stddev(x) / 0 FROM {t}",
    "SELECT count(*) / 0 FROM {t}",  # fails only on a non-NULL value: the trial over NULL let it pass
    "SELECT sum(n) % 0, avg(f) FROM {t}",
    "SELECT 1 / (avg(f) - avg(f)) AS a FROM {t}",
    "SELECT sum(x) AS s FROM {t} ORDER BY round(sum(x) / 0.0, 2)",
    "SELECT t, sum(x) / 0 FROM {t} GROUP BY t",
    "SELECT date_trunc('month', d) AS m, 1 / (count(*) - count(*)) FROM {t} GROUP BY 1",
    # A query enclosing the aggregates: a FROM subquery, a CTE (read as one), two levels, its ORDER BY.
    "SELECT x / 0 FROM (SELECT count(*) AS x FROM {t}) AS q",
    "SELECT q.x % 0, q.s FROM (SELECT count(*) AS x, sum(n) AS s FROM {t}) AS q",
    "SELECT x / 0 FROM (SELECT t, count(*) AS x FROM {t} GROUP BY t) AS q",
    "WITH c AS (SELECT avg(f) AS a FROM {t}) SELECT 1 / (a - a) FROM c",
    "SELECT y / 0 FROM (SELECT x AS y FROM (SELECT sum(x) AS x FROM {t}) AS a) AS b",
    "SELECT x FROM (SELECT count(*) AS x FROM {t}) AS q ORDER BY x / 0",
]


@pytest.mark.parametrize("sql", _CERTAIN)
def test_a_statement_that_fails_on_every_release_is_refused_uncharged_on_every_neighbour(
    hist_proxy: RunningProxy, sql: str
) -> None:
    with hist_proxy.connect() as conn:
        outcome = same_on_neighbours(conn, sql, _TABLES, spent_epsilon)
    assert outcome[0] == "error" and outcome[1] == "22012" and outcome[2] == "division by zero", outcome
    assert "Nothing was charged" in str(outcome[3]), outcome


def test_an_error_the_keys_decide_says_nothing_was_charged(hist_proxy: RunningProxy) -> None:
    with hist_proxy.connect() as conn:
        outcome = same_on_neighbours(conn, "SELECT t::int, count(*) FROM {t} GROUP BY t", _TABLES, spent_epsilon)
    assert outcome[:2] == ("error", "22P02") and "Nothing was charged" in str(outcome[3]), outcome


def _charged(proxy: RunningProxy, sql: str, epsilon: float) -> tuple[float, tuple[object, ...]]:
    """The ε ``sql`` (on hn0, at ``epsilon``: a release of its own, not a repeat of another
    test's) was charged, and what it showed."""
    with proxy.connect() as conn:
        conn.execute(f"SET dpproxy.epsilon = {epsilon}")
        before = spent_epsilon(conn)
        outcome = masked_outcome(conn, sql, "hn0")
        return spent_epsilon(conn) - before, outcome


@pytest.mark.parametrize("epsilon, sql", list(enumerate([
    "SELECT count(*)::numeric(2, 0) FROM {t}",  # fails when the noisy count has 3 digits, not when 2
    "SELECT sum(x) / count(*) FROM {t} WHERE x > 100",  # fails when the noisy count is 0
    "SELECT count(*) / 0 FROM {t} HAVING count(*) > 100",  # no row, and no failure, when the count is ≤ 100
    "SELECT CASE WHEN count(*) > 1000 THEN 1 / (count(*) - count(*)) ELSE 0 END FROM {t}",
    "SELECT sum(r) / 0 FROM {t}",  # real: a release may round to infinity, and its NaN ÷ 0 is NaN
    "SELECT CASE WHEN x >= 0 THEN x / 0 END FROM (SELECT count(*) AS x FROM {t}) AS q",  # not proved: a CASE
    "SELECT 1 FROM (SELECT count(*) / 0 AS x FROM {t}) AS q",  # a division no output names
], 1)))
def test_a_statement_that_fails_on_some_releases_only_is_still_charged(hist_proxy: RunningProxy, epsilon: int,
                                                                       sql: str) -> None:
    # answered, or failed after its charge (the error's DETAIL carries the charge's notice)
    charged, outcome = _charged(hist_proxy, sql, 0.5 + epsilon / 1000)
    assert charged == pytest.approx(0.5 + epsilon / 1000), outcome
    assert outcome[0] == "answer" or "dpproxy: ε charged" in str(outcome[4]), outcome


def test_a_certain_failure_on_no_cell_is_an_answer(hist_proxy: RunningProxy) -> None:
    # The division fails on every cell, but the HAVING on the keys keeps none: no row, no error.
    charged, outcome = _charged(hist_proxy, "SELECT t, count(*) / 0 FROM {t} GROUP BY t HAVING t || 'x' = 'nox'", 0.7)
    assert outcome[0] == "answer" and outcome[2] == 0, outcome
    assert charged == pytest.approx(0.7)


def test_a_refused_statement_is_refused_again_and_never_charged(hist_proxy: RunningProxy) -> None:
    # The trial is remembered only when it passed: a refusal is found again, still free.
    with hist_proxy.connect() as conn:
        before = spent_epsilon(conn)
        for _ in range(2):
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute("SELECT stddev(x) / 0 FROM hn0")
        assert spent_epsilon(conn) == before
