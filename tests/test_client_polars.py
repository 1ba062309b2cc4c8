"""polars' PostgreSQL engines through dpproxy: connectorx and Arrow's ADBC driver.

Both read a result as ``COPY (query) TO STDOUT WITH BINARY`` after a Parse/Describe of the
query; ADBC also lists schemas, tables and columns with catalog queries of its own
(``adbc_get_objects`` asks for ``pg_my_temp_schema()``). tests/polars_check.py drives both in a
subprocess (connectorx keeps the GIL while it waits, and dpproxy runs in this process) and
prints what they got; each DP statement's ε is read back with SHOW dpproxy.budget.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from clients import exact_count
from conftest import HISTOGRAM_POLICY, TEST_DATABASE, RunningProxy, TestDatabase, running_proxy

_CHECK = Path(__file__).parent / "polars_check.py"


def _uri(proxy: RunningProxy) -> str:
    return f"postgresql://analyst:analyst@{proxy.host}:{proxy.port}/{TEST_DATABASE}"


def _run_check(proxy: RunningProxy, *args: str) -> dict[str, Any]:
    result = subprocess.run([sys.executable, str(_CHECK), _uri(proxy), *args], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def polars_run(histogram_proxy: RunningProxy) -> dict[str, Any]:
    return _run_check(histogram_proxy)


def _exact_histogram(admin: psycopg.Connection) -> dict[str, int]:
    return dict(admin.execute("SELECT sex, count(*) FROM adult GROUP BY sex").fetchall())  # type: ignore[arg-type]


@pytest.mark.parametrize("engine", ["connectorx", "adbc"])
def test_polars_reads_a_noised_count_and_histogram_charged_once_each(polars_run: dict[str, Any], admin, engine: str):
    run = polars_run[engine]
    ((count,),) = [row.values() for row in run["count"]["value"]]
    assert abs(count - exact_count(admin, "age > 30")) < 30 and run["count"]["charged"] == 1
    histogram = {row["sex"]: row["n"] for row in run["histogram"]["value"]}
    exact = _exact_histogram(admin)
    assert histogram.keys() == exact.keys() and all(abs(histogram[k] - exact[k]) < 30 for k in exact)
    assert run["histogram"]["charged"] == 1


def test_connectorx_sum_and_avg_are_noised_and_charged_once(polars_run: dict[str, Any], admin):
    exact_sum, exact_avg = admin.execute(
        "SELECT sum(capital_gain), avg(age) FROM adult WHERE sex = 'Female'").fetchone()
    (row,) = polars_run["connectorx"]["sum_avg"]["value"]
    # capital_gain's bounds are [0, 100000]: its sum's Laplace scale at ε 1/2 is 2e5.
    assert abs(row["s"] - exact_sum) < 2e6 and abs(row["a"] - float(exact_avg)) < 1
    assert polars_run["connectorx"]["sum_avg"]["charged"] == 1


def test_connectorx_csv_protocol_reads_the_same_release(polars_run: dict[str, Any], admin):
    csv = polars_run["connectorx"]["csv"]
    assert abs(csv["value"][0]["n"] - exact_count(admin, "age > 30")) < 30 and csv["charged"] == 1


def test_connectorx_refusal_is_its_runtime_error_with_dpproxy_s_message_and_hint(polars_run: dict[str, Any]):
    refused = polars_run["connectorx"]["refused"]
    assert refused["error"] == "builtins.RuntimeError" and refused["charged"] == 0
    assert "SELECT * is not allowed on protected table adult (rule: no-row-access)" in refused["message"]
    assert "HINT: Protected tables answer only aggregates" in refused["message"]


@pytest.mark.parametrize("step", ["partitioned", "partitioned_aggregate"])
def test_connectorx_partitioned_read_is_refused_before_its_range_query_is_charged(polars_run: dict[str, Any],
                                                                                  step: str):
    refused = polars_run["connectorx"][step]
    assert refused["error"] == "builtins.RuntimeError" and refused["charged"] == 0
    assert "(rule: partitioned-read)" in refused["message"] and "leave out partition_on" in refused["message"]


def test_connectorx_pandas_read_counts_the_answer_s_rows_as_a_second_release_without_repeats(
        polars_run: dict[str, Any], admin):
    """connectorx's pandas destination first sends SELECT count(*) FROM (query) AS CXTMPTAB_COUNT:
    a statement over the query's release. Without repeats (this policy) that is a release of its
    own; with repeats (the default, below) the COPY that follows is its repeat."""
    pandas = polars_run["connectorx"]["pandas"]
    assert abs(pandas["value"][0]["n"] - exact_count(admin, "age > 30")) < 30 and pandas["charged"] == 2


def test_connectorx_pandas_read_costs_one_release_with_repeats(test_db: TestDatabase,
                                                               tmp_path_factory: pytest.TempPathFactory):
    policy = HISTOGRAM_POLICY.replace("repeats: {{enabled: false}}", "repeats: {{enabled: true}}")
    with running_proxy(test_db, tmp_path_factory, policy) as repeating:
        run = _run_check(repeating, "pandas")
    assert run["connectorx"]["pandas"]["charged"] == 1


def test_adbc_lists_tables_and_columns_and_reads_a_table_s_schema(polars_run: dict[str, Any]):
    adbc = polars_run["adbc"]
    assert {"adult", "lookup"} <= adbc["objects"].keys() and "age" in adbc["objects"]["adult"]
    assert adbc["constraints"]["lookup"] == ["PRIMARY KEY"]  # depth="all" reads pg_constraint too
    assert adbc["schema"]["age"] == "int32" and adbc["schema"]["sex"] == "string"


def test_adbc_bound_parameters_are_noised_and_charged_once(polars_run: dict[str, Any], admin):
    adbc = polars_run["adbc"]
    assert abs(adbc["bound"]["value"][0][0] - exact_count(admin, "age > 30")) < 30 and adbc["bound"]["charged"] == 1
    (_, avg), = adbc["sum_avg"]["value"]
    exact_avg = admin.execute("SELECT avg(age) FROM adult WHERE sex = 'Female'").fetchone()[0]
    assert abs(avg - float(exact_avg)) < 1 and adbc["sum_avg"]["charged"] == 1
    assert adbc["polars_on_connection"]["charged"] == 1


def test_adbc_refusal_is_its_operational_error_with_sqlstate(polars_run: dict[str, Any]):
    refused = polars_run["adbc"]["refused"]
    assert refused["error"] == "adbc_driver_manager.OperationalError" and refused["sqlstate"] == "DP001"
    assert "not allowed on protected table adult (rule: no-row-access)" in refused["message"]
    assert refused["charged"] == 0 and polars_run["adbc"]["after_refusal"] == [[1]]


def test_adbc_statistics_are_refused_as_the_catalog_of_statistics(polars_run: dict[str, Any]):
    """adbc_get_statistics reads pg_stats (null fractions, distinct counts) joined to reltuples:
    numbers computed from the rows, refused by the catalog allowlist."""
    refused = polars_run["adbc"]["statistics"]
    assert refused["error"] == "adbc_driver_manager.ProgrammingError" and refused["sqlstate"] == "42501"
    assert "pg_catalog.pg_stats is not available through dpproxy (rule: catalog-allowlist)" in refused["message"]
