"""SHOW dpproxy.columns: the policy's choices, visible from SQL (psql, a BI tool's SQL editor)."""

from __future__ import annotations

import os
import subprocess

import psycopg
import pytest

from conftest import RunningProxy, psql_path

_COLUMNS = ["table_name", "column_name", "data_type", "bounds", "categories", "aggregates", "group_by", "epsilon",
            "delta"]


@pytest.mark.parametrize("prepare", [False, True], ids=["simple", "extended"])
def test_show_columns_lists_each_protected_column_with_what_it_accepts(proxy: RunningProxy, prepare: bool):
    with proxy.connect(autocommit=True) as conn:
        cur = conn.execute("SHOW dpproxy.columns", prepare=prepare)
        assert [d.name for d in cur.description] == _COLUMNS
        rows = {(r[0], r[1]): r[2:] for r in cur.fetchall()}
    assert {table for table, _ in rows} == {"adult", "clamp_test"}  # protected only; lookup is public
    assert rows[("adult", "*")] == (None, None, None, "COUNT(*) laplace", None, 1.0, 1e-6)
    assert rows[("adult", "age")] == ("integer", "[17, 90]", None, "COUNT laplace, SUM laplace, "
                                      "AVG sum_count, MIN sample_aggregate, MAX sample_aggregate, PERCENTILE exponential, "
                                      "VARIANCE moments",
                                      None, 1.0,
                                      1e-6)  # AVG by the default
    assert rows[("adult", "hours_per_week")][3] == ("COUNT laplace, SUM laplace, AVG sample_aggregate, "
                                                    "MIN sample_aggregate, MAX sample_aggregate, PERCENTILE exponential, "
                                                    "VARIANCE moments")  # the column's avg
    assert rows[("adult", "sex")] == ("text", "at most 256 bytes, stored in the row uncompressed (another value reads as NULL)", '["Male", "Female"]', "COUNT laplace, MODE exponential", None,
                                      1.0, 1e-6)
    assert rows[("adult", "fnlwgt")][3] == "COUNT laplace"  # no bounds in the policy: COUNT only
    assert rows[("clamp_test", "ratio")][1:3] == ("[-2.5, 2.5]", None)


def test_show_columns_shows_the_session_s_epsilon(proxy: RunningProxy):
    with proxy.connect(autocommit=True) as conn:
        conn.execute("SET dpproxy.epsilon = 0.25")
        epsilons = {row[7] for row in conn.execute("SHOW dpproxy.columns").fetchall()}
    assert epsilons == {0.25}


def test_psql_shows_the_policy_columns(proxy: RunningProxy):
    env = {**os.environ, "PGPASSWORD": "analyst", "PGSSLMODE": "prefer", "PGCONNECT_TIMEOUT": "10"}
    result = subprocess.run(
        [psql_path(), "-X", "-h", proxy.host, "-p", str(proxy.port), "-U", "analyst", "-d", "dpproxy_test",
         "-c", "SHOW dpproxy.columns"], capture_output=True, text=True, env=env, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "MODE exponential" in result.stdout and "[17, 90]" in result.stdout


def test_show_columns_shows_bounds_exactly_as_declared():
    # ``:g`` showed [0, 1.23457e+06] for bounds [0, 1234567]: a bound the policy does not have.
    from policies.model import ColumnPolicy, TablePolicy
    from policies.tables import ColumnInfo, Relation, TableRegistry
    from proxy.serving.policy_view import columns_result

    declared = {"n": (0, 1234567), "x": (-0.1, 2.5e-7), "big": (-1e20, 1e20)}
    columns = {name: ColumnInfo(name, 701, -1, i + 1, ColumnPolicy(bounds=bounds))
               for i, (name, bounds) in enumerate(declared.items())}
    registry = TableRegistry({1: Relation(1, "public", "t", TablePolicy(epsilon=1.0), columns)})
    shown = {row[1].decode(): row[3].decode() for row in columns_result(registry, lambda _: 1.0).rows[1:]}
    assert shown == {"n": "[0, 1234567]", "x": "[-0.1, 2.5e-07]", "big": "[-1e+20, 1e+20]"}


def test_show_columns_shows_a_date_range_as_dates_and_a_timestamp_range_as_times():
    # A date column's [2021-01-01, 2024-12-31] was shown as [2021-01-01 00:00:00, 2024-12-31 00:00:00].
    from policies.model import ColumnPolicy, TablePolicy
    from policies.tables import ColumnInfo, Relation, TableRegistry
    from proxy.serving.policy_view import columns_result

    declared = {"d": 1082, "ts": 1114, "tz": 1184}
    columns = {name: ColumnInfo(name, oid, -1, i + 1, ColumnPolicy(bounds=("2021-01-01", "2024-12-31")))
               for i, (name, oid) in enumerate(declared.items())}
    registry = TableRegistry({1: Relation(1, "public", "t", TablePolicy(epsilon=1.0), columns)})
    shown = {row[1].decode(): row[3].decode() for row in columns_result(registry, lambda _: 1.0).rows[1:]}
    assert shown == {"d": "[2021-01-01, 2024-12-31]", "ts": "[2021-01-01 00:00:00, 2024-12-31 00:00:00]",
                     "tz": "[2021-01-01 00:00:00, 2024-12-31 00:00:00]"}
