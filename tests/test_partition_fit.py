"""A policy whose sample and aggregate would answer mostly noise is reported: by check-config
(at the line of the table's key, exit 0) and by serve at start, with the fix."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from conftest import RunningProxy, TestDatabase, make_policy

from policies.model import TablePolicy
from proxy.backend.partition_fit import partition_warnings

POLICY = """\
backend:
  dsn: "{dsn}"
  connect_timeout_s: 5
users:
  analyst:
    password: secret
    budget: {{epsilon: 10}}
tables:
  public.adult:
    epsilon: 1.0
    partitions: 10000
    avg: sample_aggregate
    columns:
      age: {{bounds: [17, 90]}}
  public.tiny_pf:
    epsilon: 1.0
    columns:
      x: {{bounds: [0, 10]}}
"""


@pytest.fixture(scope="module")
def analysed(test_db: TestDatabase) -> Iterator[None]:
    """``adult`` (48,842 rows) and ``tiny_pf`` (50 rows), with planner statistics."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS tiny_pf")
        conn.execute("CREATE TABLE tiny_pf AS SELECT i AS x FROM generate_series(1, 50) AS i")
        conn.execute("GRANT SELECT ON tiny_pf TO dpproxy_service")
        conn.execute("ANALYZE adult")
        conn.execute("ANALYZE tiny_pf")
    yield
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE tiny_pf")


def test_check_config_warns_of_too_many_partitions_at_the_tables_line(test_db, analysed, tmp_path: Path):
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(dsn=test_db.service_dsn))
    run = subprocess.run([sys.executable, "-m", "proxy.cli", "check-config", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr  # a warning, not a refusal: the guarantee holds
    assert "checked against the backend" in run.stdout, run.stdout
    adult, tiny = run.stderr.strip().splitlines()
    assert adult == (f"warning: {path}:11: tables.public.adult.partitions: about 48,842 rows for 10000 partitions "
                     "(4.88 rows each, 30 or more needed): AVG, MIN and MAX by sample and aggregate will be mostly "
                     "noise; set partitions: 1628 or lower (30 rows each), or avg: sum_count for AVG "
                     "(docs/mechanisms.md, Choosing m; fewer rows after a WHERE make it worse)")
    assert tiny.startswith(f"warning: {path}:15: tables.public.tiny_pf.partitions: about 50 rows for 512 partitions")
    # tiny_pf answers AVG by the default noisy sum / noisy count, which has no partitions: only
    # MIN and MAX are named.
    assert ("): MIN and MAX by sample and aggregate will be mostly noise; the table is too small for sample and "
            "aggregate at any partitions: do not rely on MIN and MAX (docs/mechanisms.md, Choosing m)") in tiny, tiny


def test_serve_logs_the_warning_when_it_starts(test_db, analysed, tmp_path: Path, caplog: pytest.LogCaptureFixture):
    policy = make_policy(test_db, tmp_path / "ledger.sqlite3", POLICY.replace(
        "users:", 'ledger: {{url: "sqlite:///{ledger}"}}\nusers:'))
    with caplog.at_level(logging.WARNING, logger="dpproxy"):
        proxy = RunningProxy(policy)
        proxy.stop()
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "partitions" in r.getMessage()]
    assert [w.split(":")[1].strip() for w in warned] == ["tables.public.adult.partitions", "tables.public.tiny_pf.partitions"]


@pytest.mark.parametrize("rows, policy, warned", [
    (None, {}, False),                                  # never analysed: no estimate, no guess
    (15_360, {}, False),                                # 512 × 30 rows: enough
    (15_359, {}, True),
    (1_000, {"avg": "sum_count"}, True),                # MIN and MAX still use sample and aggregate
    (1_000, {"avg": "sample_aggregate"}, True),
    (1_000, {"delta": 0.0}, False),                     # no δ: no sample and aggregate at all (AVG: sum_count)
    (1_000, {"access": "public"}, False),
])
def test_partition_warning_fires_only_where_sample_and_aggregate_is_used_on_too_few_rows(rows, policy, warned):
    table = TablePolicy.model_validate({"epsilon": 1.0, "columns": {"x": {"bounds": [0, 1]}}, **policy})
    assert bool(partition_warnings("t", table, rows)) is warned


@pytest.mark.parametrize("table_avg, column_avg, what, fix", [
    ({}, {}, "MIN and MAX", ""),  # the default: AVG by noisy sum / noisy count has no partitions
    ({"avg": "sample_aggregate"}, {}, "AVG, MIN and MAX", ", or avg: sum_count for AVG"),
    ({}, {"avg": "sample_aggregate"}, "AVG of x, MIN and MAX", ", or avg: sum_count for AVG"),
    ({"avg": "sample_aggregate"}, {"avg": "sum_count"}, "AVG of y, MIN and MAX", ", or avg: sum_count for AVG"),
])
def test_partition_warning_names_avg_only_where_it_is_answered_by_sample_and_aggregate(table_avg, column_avg, what, fix):
    table = TablePolicy.model_validate({"epsilon": 1.0, **table_avg,
                                        "columns": {"x": {"bounds": [0, 1], **column_avg}, "y": {"bounds": [0, 1]}}})
    (warning,) = partition_warnings("t", table, 1_000)
    assert warning == ("tables.t.partitions: about 1,000 rows for 512 partitions (1.95 rows each, 30 or more needed): "
                       f"{what} by sample and aggregate will be mostly noise; set partitions: 33 or lower (30 rows each)"
                       f"{fix} (docs/mechanisms.md, Choosing m; fewer rows after a WHERE make it worse)")
