"""The benchmark's optional dpproxy targets, without running a benchmark.

``dpproxy-base`` runs dpproxy from another source tree, so its policy must be one an older
policy model accepts and still mean the same; the report sets every dpproxy beside direct
PostgreSQL under its label (the baseline's commit). The end-to-end run is in
tests/test_benchmark_smoke.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from benchmarks.connections import ConnectionCost
from benchmarks.environment import BASELINE, TWO_WORKERS
from benchmarks.instructions import benchmark_policy
from benchmarks.latency import QUERIES
from benchmarks.pgbench import PgbenchResult
from benchmarks.postgres import Endpoint
from benchmarks.report import Results, render
from benchmarks.run import main
from benchmarks.servers import commit_of, write_policy
from policies.loader import load_policy

ROOT = Path(__file__).resolve().parent.parent
BACKEND = Endpoint("direct-unix", "/tmp", 5432, "dpproxy_service", "bench")
TABLES = {1000: "adult_1000", 48842: "adult_48842"}


def _policy(directory: Path, **options: Any) -> Path:
    directory.mkdir()
    return write_policy(directory / "policy.yaml", BACKEND, 6543, TABLES, **options)


def test_portable_policy_means_the_same_without_the_keys_an_older_dpproxy_rejects(tmp_path: Path) -> None:
    full = _policy(tmp_path / "full", pool_size=5)
    portable = _policy(tmp_path / "portable", portable=True)
    written = yaml.safe_load(portable.read_text())
    assert "pool" not in written["backend"]
    for table in written["tables"].values():
        assert "partitioning" not in table  # `auto` is newer than b8591d1's policy model
        assert table["avg"] == "sample_aggregate"  # not a default: stated, as every version needs it
    # max_sort_memory_mb, newer than it too, is the one key whose default the portable policy keeps
    raised = {name: table.model_copy(update={"max_sort_memory_mb": 16_384})
              for name, table in load_policy(portable).tables.items()}
    assert raised == load_policy(full).tables
    assert yaml.safe_load(full.read_text())["backend"]["pool"] == {"size": 5}


def test_workers_go_to_listen_and_each_policy_keeps_its_ledger_beside_it(tmp_path: Path) -> None:
    policy = _policy(tmp_path / TWO_WORKERS, workers=2)
    written = yaml.safe_load(policy.read_text())
    assert written["listen"]["workers"] == 2 and load_policy(policy).listen.workers == 2
    assert written["ledger"]["url"] == f"sqlite:///{tmp_path / TWO_WORKERS / 'ledger.sqlite3'}"
    assert "workers" not in yaml.safe_load(_policy(tmp_path / "one-process").read_text())["listen"]


def test_commit_of_names_a_checkout_and_says_unknown_elsewhere(tmp_path: Path) -> None:
    commit = commit_of(ROOT).split()[0]
    assert commit != "unknown" and all(c in "0123456789abcdef" for c in commit)
    assert commit_of(tmp_path) == "unknown"


def test_the_baseline_target_needs_its_source_tree() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--quick", "--targets", f"dpproxy,{BASELINE},direct-tcp"])
    assert exited.value.code == 2


def _runs(tps: float) -> list[PgbenchResult]:
    return [PgbenchResult(tps, 1.0, 2.0, int(tps), 0)]


def test_report_sets_every_dpproxy_beside_direct_under_its_label() -> None:
    results = Results(settings={}, machine={}, labels={BASELINE: f"{BASELINE} (abc1234)"})
    for name, tps in (("dpproxy", 400.0), (BASELINE, 300.0), (TWO_WORKERS, 600.0), ("direct-tcp", 1000.0)):
        results.pgbench[(1000, 8, "simple", name)] = _runs(tps)
        results.catalog[(0, 8, "simple", name)] = _runs(tps / 2)
    results.connection_cost = [ConnectionCost(name, 1, p50, p50, 10, 0)
                                for name, p50 in (("dpproxy", 2.0), (BASELINE, 3.0), ("direct-tcp", 1.0),
                                                  ("direct-scram", 4.0))]
    report = render(results)
    heading = f"| {BASELINE} (abc1234) tps (ratio) | {TWO_WORKERS} tps (ratio) |"
    pgbench = report.split("## pgbench")[1].split("\n## ")[0]
    assert heading in pgbench
    assert "| 1,000 | 8 | simple | 400 | 1,000 | **0.40** |" in pgbench
    assert pgbench.rstrip().endswith(" 300 (0.30) | 600 (0.60) |")
    catalog = report.split("## Catalog statements")[1].split("\n## ")[0]
    assert heading in catalog
    assert catalog.rstrip().endswith("| 150 (0.30) | 300 (0.60) |")
    connections = report.split("## Client connections")[1]
    assert f"| 1 | {BASELINE} (abc1234) | 10 | 3.00 | 3.00 | 3.00 | 0.75 | 0 |" in connections


def test_report_without_the_optional_targets_is_unchanged() -> None:
    results = Results(settings={}, machine={})
    for name, tps in (("dpproxy", 400.0), ("direct-tcp", 1000.0)):
        results.catalog[(0, 8, "simple", name)] = _runs(tps)
    catalog = render(results).split("## Catalog statements")[1]
    assert "| clients | mode | dpproxy tps | direct tps | **ratio** | dpproxy p50 / p99 ms | direct p50 / p99 ms |\n" \
        in catalog
    assert "In parentheses" not in catalog


def test_the_latency_policy_answers_each_avg_probe_by_the_mechanism_it_is_named_for(tmp_path: Path) -> None:
    # benchmarks/latency.py: "AVG" is sample and aggregate, "AVG, sum_count" the policy default.
    assert "hours_per_week" in QUERIES["AVG"] and "education_num" in QUERIES["AVG, sum_count"]
    for policy in (_policy(tmp_path / "full"), _policy(tmp_path / "portable", portable=True)):
        for table in load_policy(policy).tables.values():
            assert table.avg_method("hours_per_week") == "sample_aggregate"
            assert table.avg_method("education_num") == "sum_count"
    # benchmarks.bytecodes and .instructions: AVG by the default, AVG_SA by sample and aggregate
    counted = benchmark_policy(tmp_path / "counted", BACKEND, 6543, portable=False)
    for table in load_policy(counted).tables.values():
        assert table.avg_method("hours_per_week") == "sum_count"
        assert table.avg_method("education_num") == "sample_aggregate"
