"""node-postgres (the ``pg`` package) through dpproxy.

tests/node holds a package.json and its lockfile; ``npm ci`` installs them into a
temporary directory once per session, then tests/node/check.js runs and prints JSON.
"""

from __future__ import annotations

from typing import Any

import pytest

from clients import exact_count, node_script
from conftest import TEST_DATABASE, RunningProxy


@pytest.fixture(scope="module")
def node_run(proxy: RunningProxy, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Install pg from the lockfile, run check.js once, return what it printed."""
    return node_script("check.js", tmp_path_factory.mktemp("node"), proxy.host, str(proxy.port), TEST_DATABASE,
                       "analyst", "analyst")


def test_node_pg_introspects_tables_columns_and_types(node_run: dict[str, Any]):
    assert {"adult", "lookup"} <= set(node_run["tables"])
    assert "age integer" in node_run["columns"]
    assert node_run["types"] == ["int8", "numeric"]


def test_node_pg_counts_are_noised_over_simple_extended_and_named(node_run: dict[str, Any], admin):
    exact = exact_count(admin, "age > 30")
    answers = [node_run["simple"], node_run["extended"], *node_run["named"]]
    assert len(answers) == 4 and all(abs(int(a) - exact) < 30 for a in answers)
    assert abs(int(node_run["transaction"]) - exact_count(admin, "sex = 'Female'")) < 30


def test_node_pg_pool_answers_concurrent_queries(node_run: dict[str, Any], admin):
    exact = exact_count(admin, "age < 30")
    assert len(node_run["pool"]) == 6 and all(abs(int(a) - exact) < 30 for a in node_run["pool"])


def test_node_pg_refusal_has_sqlstate_and_connection_goes_on(node_run: dict[str, Any]):
    assert node_run["refused"] == "DP001"
    assert node_run["after_refusal"] == 1
