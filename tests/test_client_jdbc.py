"""pgjdbc, the PostgreSQL JDBC driver, through dpproxy: DatabaseMetaData, Statement,
PreparedStatement with prepareThreshold=1, a transaction and a refusal.

tests/java/DpproxyJdbcCheck.java is compiled once per session against the pgjdbc jar on
this machine and prints one fact per line; the tests check those facts.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from clients import exact_count, pgjdbc_jar, require_tool
from conftest import TEST_DATABASE, RunningProxy

_SOURCE = Path(__file__).parent / "java" / "DpproxyJdbcCheck.java"


@pytest.fixture(scope="module")
def jdbc_run(proxy: RunningProxy, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Compile and run the JDBC program once; its output as KEY -> values, in order."""
    jar = pgjdbc_jar()
    classes = tmp_path_factory.mktemp("jdbc")
    javac = require_tool("javac", "default-jdk-headless")
    java = require_tool("java", "default-jdk-headless")
    subprocess.run([javac, "-d", str(classes), "-cp", str(jar), str(_SOURCE)], check=True, timeout=120)
    result = subprocess.run(
        [java, "-cp", f"{jar}:{classes}", "DpproxyJdbcCheck", proxy.host, str(proxy.port), TEST_DATABASE,
         "analyst", "analyst"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    facts: dict[str, list[str]] = defaultdict(list)
    for line in result.stdout.splitlines():
        key, _, value = line.partition(" ")
        facts[key].append(value)
    assert facts["DONE"] == ["ok"], result.stdout
    return facts


def test_jdbc_metadata_lists_tables_columns_keys_and_types(jdbc_run: dict[str, list[str]]):
    assert {"adult", "lookup"} <= set(jdbc_run["TABLE"])
    assert "age int4" in jdbc_run["COLUMN"] and "sex text" in jdbc_run["COLUMN"]
    assert jdbc_run["PRIMARY_KEY"] == ["code"]
    assert int(jdbc_run["TYPES"][0]) > 50
    assert jdbc_run["PRODUCT"][0][:2].isdigit()


def test_jdbc_index_info_cardinality_is_not_the_row_count(jdbc_run: dict[str, list[str]], admin):
    (index,) = jdbc_run["INDEX"]
    name, column, cardinality, pages = index.split()
    assert (name, column) == ("adult_age_idx", "age")
    assert int(cardinality) != exact_count(admin)
    assert (int(cardinality), int(pages)) == (-1, 0)  # what dpproxy reports instead of reltuples/relpages


def test_jdbc_statement_and_prepared_statement_return_noised_counts(jdbc_run: dict[str, list[str]], admin):
    over_30 = exact_count(admin, "age > 30")
    assert abs(int(jdbc_run["STATEMENT_COUNT"][0]) - over_30) < 30
    assert jdbc_run["STATEMENT_TYPE"] == ["int8"]
    prepared = [line.split() for line in jdbc_run["PREPARED"]]
    assert len(prepared) == 4  # the first run names the statement, the others re-Bind it in binary
    # COUNT(*), SUM(capital_gain) share ε: the count's scale is 2, so ±50 fails by chance with
    # p ≈ 4·2e-11 (±30 did with p ≈ 1.5e-6); the sum (~4e7, scale 2e5) is never ≤ 0.
    assert all(abs(int(count) - over_30) < 50 and float(total) > 0 for count, total in prepared)


def test_jdbc_transaction_commits(jdbc_run: dict[str, list[str]], admin):
    assert abs(int(jdbc_run["TRANSACTION_COUNT"][0]) - exact_count(admin, "sex = 'Female'")) < 30
    assert jdbc_run["COMMITTED"] == ["ok"]


def test_jdbc_fetch_size_result_closed_early_in_a_block_is_not_computed_to_its_end(jdbc_run: dict[str, list[str]]):
    """setFetchSize with autocommit off, the ResultSet closed after 150 rows, then COMMIT. On
    PostgreSQL the rest is never computed; dpproxy read it for nothing at the COMMIT (5.5-8 s
    for 3,000,000 rows), and here the millionth row's division by zero failed the block: COMMIT
    answered ROLLBACK and the SET before the query was undone."""
    assert jdbc_run["EARLY_CLOSED"] == ["150 early_close_committed"]


def test_jdbc_fetch_size_reads_a_large_result_in_pieces_with_a_dp_query_between(jdbc_run: dict[str, list[str]], admin):
    # Row-limited Execute on a result passed on as it arrives; the DP query in between needs
    # the connection, so the portal's rest is held for it, then handed out.
    assert jdbc_run["FETCHED"] == [f"200000 {200000 * 200001 // 2}"]
    assert abs(int(jdbc_run["FETCH_BETWEEN"][0]) - exact_count(admin, "true")) < 50


def test_jdbc_refusal_carries_sqlstate_and_connection_goes_on(jdbc_run: dict[str, list[str]]):
    assert jdbc_run["REFUSED"] == ["DP001"]
    assert jdbc_run["AFTER_REFUSAL"] == ["1"]


def test_jdbc_refusal_with_autocommit_off_fails_the_transaction_as_on_postgresql(jdbc_run: dict[str, list[str]]):
    """The statement after it is refused (25P02), as PostgreSQL refuses it (before: the
    transaction went on). The commit, answered ROLLBACK, raises nothing: pgjdbc raises only
    with its raiseExceptionOnSilentRollback property, off by default."""
    assert jdbc_run["BLOCK_REFUSED"] == ["DP001"]
    assert jdbc_run["BLOCK_AFTER_REFUSAL"] == ["25P02"]
    assert jdbc_run["BLOCK_COMMIT"] == ["ok"]


def test_jdbc_batch_that_fails_rolls_back_the_sets_before_it_as_on_postgresql(jdbc_run: dict[str, list[str]]):
    """pgjdbc sends a batch's statements and then one Sync: one implicit transaction on PostgreSQL,
    so its SETs are undone when a later one fails. dpproxy once kept them, and reported the kept
    DateStyle German, on which pgjdbc closes its connection (it requires ISO)."""
    assert jdbc_run["BATCH_FAILED"] == ["22023"]
    assert jdbc_run["BATCH_UNDONE"] == ["true ISO, MDY"]
