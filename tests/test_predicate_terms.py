"""The conditions of one DP statement hold at most MAX_PREDICATE_TERMS values and comparisons.

A row that reaches an IN list or an OR chain is compared with each of its terms, so in
``id = 42 AND age IN (<60,000 numbers>)`` row 42 added 1–2 ms when it was there
(benchmarks/row_cost.py): an existence oracle from one statement. Past the limit the statement
is refused before the charge, the same way on every neighbouring table, wherever its terms are
(WHERE, FILTER, CASE, wrappers, a post-processed statement, a histogram, bound parameters); at
the limit, and on a table with ``answer_quantum_ms``, it is answered. Real dpproxy, real
PostgreSQL; the decision is pinned, never a timing.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlglot

from rewriter.predicate_terms import MAX_PREDICATE_TERMS, predicate_terms
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours, same_on_neighbours
from tests.test_attack_stop36 import _BASE_ROWS, _DDL, _NEIGHBOURS, _TABLE

_NT = {name.replace("s36", "pt72"): row for name, row in _NEIGHBOURS.items()}
_NAMES = ("pt72_0", *_NT)
_QUANTUM = "pt72_q"
_POLICY = (ATTACK_POLICY_HEAD + "  public.pt72_0: &C" + _TABLE + "".join(f"  public.{name}: *C\n" for name in _NT)
           + f"  public.{_QUANTUM}:" + _TABLE + "    answer_quantum_ms: 20\n")
LIMIT = MAX_PREDICATE_TERMS


def _values(count: int, start: int = 1000) -> str:
    return ", ".join(str(start + i) for i in range(count))


@pytest.fixture(scope="module")
def terms_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    create_neighbours(test_db.admin_dsn, "pt72_0", _NT, _DDL, _BASE_ROWS)
    create_neighbours(test_db.admin_dsn, _QUANTUM, {}, _DDL, _BASE_ROWS)
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


@pytest.mark.parametrize("condition, terms", [
    ("b = 1", 1),
    ("b IN (1, 2, 3)", 3),
    ("b NOT IN (1, 2, 3)", 3),
    ("b BETWEEN 1 AND 2", 2),
    ("b NOT BETWEEN 1 AND 2", 2),
    ("(b = 1 OR b IN (2, 3)) AND NOT (s LIKE 'a%' OR s IS NULL)", 5),
    ("(b IN (1, 2) OR a = 1) IS TRUE", 3),
    ("b IN ($1, $2, $3, $4)", 4),
])
def test_the_terms_of_a_condition_are_its_values_and_comparisons(condition: str, terms: int) -> None:
    tree = sqlglot.parse_one(f"SELECT 1 WHERE {condition}", read="postgres")
    assert predicate_terms(tree.args["where"].this) == terms


# Each statement spreads LIMIT + 1 terms over its conditions; the same at LIMIT terms is answered.
_OVER = [
    "SELECT count(*) FROM {t} WHERE b IN ({over})",
    "SELECT count(*) FROM {t} WHERE b NOT IN ({over})",
    "SELECT count(*) FROM {t} WHERE b IN ({half}) OR a IN ({rest})",
    "SELECT count(*) FROM {t} WHERE b NOT IN ({half}) AND c NOT IN ({rest})",
    "SELECT count(*) FROM {t} WHERE b BETWEEN 0 AND 1 OR b IN ({over_less_2})",
    "SELECT count(*) FILTER (WHERE b IN ({half})) FROM {t} WHERE a IN ({rest})",
    "SELECT count(*) FILTER (WHERE b IN ({half})), sum(b) FILTER (WHERE b IN ({rest})) FROM {t}",
    "SELECT sum(CASE WHEN b IN ({half}) THEN b ELSE 0 END) FROM {t} WHERE a IN ({rest})",
    "WITH w AS (SELECT * FROM {t} WHERE b IN ({half})) SELECT count(*) FROM w WHERE a IN ({rest})",
    "SELECT count(*) FROM (SELECT * FROM {t} WHERE b IN ({half})) AS w WHERE a IN ({rest})",
    "SELECT count(*) * 2 AS twice FROM {t} WHERE b IN ({over})",
    "SELECT x FROM (SELECT count(*) AS x FROM {t} WHERE b IN ({over})) AS q",
    "SELECT s, count(*) FROM {t} WHERE b IN ({over}) GROUP BY s",
    "SELECT s, count(*) FILTER (WHERE b IN ({half})) FROM {t} WHERE a IN ({rest}) GROUP BY s ORDER BY 1",
    # Superset's series limit: two plans, each under the limit, whose conditions a row reaches both
    "SELECT s, count(*) AS count FROM {t} JOIN (SELECT s AS s__, count(*) AS mme_inner__ FROM {t} WHERE b IN ({half}) "
    "GROUP BY s ORDER BY count(*) DESC LIMIT 1) AS series_limit ON s = s__ WHERE a IN ({rest}) GROUP BY s",
]


def _fill(form: str, total: int) -> str:
    half = total // 2
    return form.format(t="{t}", over=_values(total), half=_values(half), rest=_values(total - half, 5000),
                       over_less_2=_values(total - 2))


@pytest.mark.parametrize("form", _OVER)
def test_conditions_past_the_limit_are_refused_uncharged_on_every_neighbour(terms_proxy: RunningProxy, form: str) -> None:
    with terms_proxy.connect() as conn:
        outcome = same_on_neighbours(conn, _fill(form, LIMIT + 1), _NAMES, spent_epsilon)
        assert outcome[:2] == ("error", "DP001"), outcome
        message, hint = str(outcome[2]), str(outcome[3])
        assert f"conditions with {LIMIT + 1} values and comparisons in all (at most {LIMIT} in one statement)" in message
        assert "rule: safe-predicate" in message
        assert "fewer values" in hint and "answer_quantum_ms" in hint
        at_limit = same_on_neighbours(conn, _fill(form, LIMIT), _NAMES, spent_epsilon)
        assert at_limit[0] == "answer", at_limit


def test_bound_parameters_count_as_the_values_they_stand_for(terms_proxy: RunningProxy) -> None:
    """``b IN ($1, …, $257)``: refused at Parse from its text, before anything is bound or charged;
    one array parameter standing for a list (``b = ANY($1)``) is refused whatever its length."""
    with psycopg.connect(terms_proxy.dsn(), autocommit=True) as conn:  # the extended protocol
        for count, answered in ((LIMIT, True), (LIMIT + 1, False)):
            sql = "SELECT count(*) FROM {t} WHERE b IN (" + ", ".join(["%s"] * count) + ")"  # $1 … as psycopg sends it
            outcome = same_on_neighbours(conn, sql, _NAMES, spent_epsilon, params=tuple(range(count)))
            assert (outcome[0] == "answer") == answered, outcome
            if not answered:
                assert outcome[1] == "DP001" and f"at most {LIMIT} in one statement" in str(outcome[2])
        array = same_on_neighbours(conn, "SELECT count(*) FROM {t} WHERE b = ANY(%s)", _NAMES, spent_epsilon,
                                   params=(list(range(10)),))
        assert array[:2] == ("error", "DP001") and "ANY(array)" in str(array[2])
        listed = same_on_neighbours(conn, "SELECT count(*) FROM {t} WHERE b IN (%s)", _NAMES, spent_epsilon,
                                    params=(list(range(10)),))
        assert listed[0] == "error", listed  # an int4[] is no int4: PostgreSQL's error, uncharged


def test_a_table_with_an_answer_quantum_takes_long_lists(terms_proxy: RunningProxy) -> None:
    """The quantum hides what a row adds below it, as for every other timing lever: no limit there."""
    with terms_proxy.connect() as conn:
        before = spent_epsilon(conn)
        for form in _OVER:
            conn.execute(_fill(form, 4 * LIMIT).replace("{t}", _QUANTUM)).fetchall()
        assert spent_epsilon(conn) > before
