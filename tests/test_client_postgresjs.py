"""postgres.js (porsager's ``postgres`` package) through dpproxy.

postgres.js implements the protocol itself: at connect it fetches the array types
(``select b.oid, b.typarray from pg_catalog.pg_type a left join ...``), every tagged
template is a named prepared statement with its parameters typed by the server's Describe,
and statements issued together are pipelined on one connection. tests/node/postgresjs.js
drives it (``npm ci`` of tests/node's lockfile into a temporary directory) and prints JSON.
"""

from __future__ import annotations

from typing import Any

import pytest

from clients import exact_count, node_script
from conftest import TEST_DATABASE, RunningProxy


@pytest.fixture(scope="module")
def run(histogram_proxy: RunningProxy, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return node_script("postgresjs.js", tmp_path_factory.mktemp("postgresjs"), histogram_proxy.host,
                       str(histogram_proxy.port), TEST_DATABASE, "analyst", "analyst")


def test_postgresjs_introspects_tables_and_columns(run: dict[str, Any]):
    assert {"adult", "lookup"} <= set(run["tables"])
    assert "age integer" in run["columns"] and "sex text" in run["columns"]


def test_postgresjs_prepared_statements_with_parameters_are_noised_and_charged_once(run: dict[str, Any], admin):
    exact = exact_count(admin, "age > 30")
    for step in ("count", "again", "unnamed"):
        assert abs(int(run[step]) - exact) < 30 and run["charges"][step] == 1, step
    exact_sum, exact_avg = admin.execute(
        "SELECT (SELECT sum(capital_gain) FROM adult WHERE sex = 'Female'), (SELECT avg(age) FROM adult WHERE age > 30)"
    ).fetchone()
    assert abs(int(run["sum"]) - exact_sum) < 2e6 and run["charges"]["sum"] == 1  # Laplace scale 2e5
    assert abs(float(run["avg"]) - float(exact_avg)) < 1 and run["charges"]["avg"] == 1


def test_postgresjs_histogram_over_a_declared_key_is_charged_once(run: dict[str, Any], admin):
    exact = dict(admin.execute("SELECT sex, count(*) FROM adult GROUP BY sex").fetchall())
    got = {sex: int(n) for sex, n in run["histogram"]}
    assert got.keys() == exact.keys() and all(abs(got[k] - exact[k]) < 30 for k in exact)
    assert run["charges"]["histogram"] == 1


def test_postgresjs_pipelined_statements_are_answered_in_order_each_charged_once(run: dict[str, Any], admin):
    """The second round's three Bind/Execute/Sync go out in one write, before any answer."""
    young, middle = exact_count(admin, "age < 30"), exact_count(admin, "age >= 30 AND age < 50")
    for answers in run["pipeline"]:
        assert abs(int(answers[0]) - young) < 30 and abs(int(answers[1]) - middle) < 30 and answers[2] == 1
    assert run["charges"]["pipeline"] == [2, 2]  # two DP statements and a constant, each round


def test_postgresjs_cursor_reads_a_histogram_row_by_row_charged_once(run: dict[str, Any], admin):
    """.cursor(1): Execute with a row limit of 1 and Flush, the portal suspended between rows."""
    exact = dict(admin.execute("SELECT sex, count(*) FROM adult GROUP BY sex").fetchall())
    assert [len(rows) for rows in run["cursor"]] == [1, 1]
    got = {sex: int(n) for rows in run["cursor"] for sex, n in rows}
    assert got.keys() == exact.keys() and all(abs(got[k] - exact[k]) < 30 for k in exact)
    assert run["charges"]["cursor"] == 1


def test_postgresjs_transaction_and_simple_protocol_answers_are_charged_once(run: dict[str, Any], admin):
    assert abs(int(run["transaction"]) - exact_count(admin, "sex = 'Female'")) < 30
    assert run["charges"]["transaction"] == 1
    count, two = run["simple"]
    assert abs(int(count) - exact_count(admin, "age > 60")) < 30 and two == 2 and run["charges"]["simple"] == 1


def test_postgresjs_refusal_is_its_postgres_error_with_sqlstate_and_hint(run: dict[str, Any]):
    refused = run["refused"]
    assert refused["name"] == "PostgresError" and refused["code"] == "DP001"
    assert "(rule: no-row-access)" in refused["message"] and refused["hint"].startswith("Protected tables answer")
    assert run["after_refusal"] == 1 and run["charges"]["refused"] == 0
