"""The benchmark still runs end to end (``python -m benchmarks.run --quick``).

Only that it works: it starts its own PostgreSQL and dpproxy, drives them with pgbench and
psycopg (and pgbouncer, when installed), times SmartNoise SQL in its own venv (installed from
the package index on the first run), and prints the ratio table. No figure is asserted; speed is what the benchmark
reports (benchmarks/README.md), never a test's pass condition.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


from benchmarks.servers import commit_of, find_pgbouncer
from benchmarks.smartnoise import default_venv, find_smartnoise

ROOT = Path(__file__).resolve().parent.parent


# Fewer repetitions than --quick's own: these tests check that every section runs and reports,
# not what it measures. pgbench and the catalog script by both protocols at 8 clients (the
# rows asserted; 1 client takes the same code paths), a few runs of each timed query and connection.
SMALLER = ["--clients", "8", "--latency-iterations", "5", "--smartnoise-iterations", "1", "--connection-cycles", "5"]


def test_quick_benchmark_runs_and_prints_the_ratio_table():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", *SMALLER],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = done.stdout
    assert "## pgbench: throughput ratio dpproxy / direct PostgreSQL" in report
    assert "| 1,000 | 8 | extended |" in report
    assert "## Per-query latency" in report
    assert "## Idle client connections" in report
    assert "## A 1,000-cell DP histogram vs the plain GROUP BY on 1,000 rows" in report
    assert "## Catalog statements: throughput ratio dpproxy / direct PostgreSQL" in report
    assert "| 8 | extended |" in report.split("## Catalog statements")[1]
    assert "Errors:" not in report, report
    if find_pgbouncer() is not None:  # ./run-tests installs it; the comparison is optional elsewhere
        assert "pgbouncer tps (ratio)" in report, report
    if os.environ.get("CI") or find_smartnoise(default_venv()) is not None:  # CI reaches the package index
        smartnoise = report.split("## SmartNoise SQL on the same queries")[1].split("\n## ")[0]
        count = next(line for line in smartnoise.splitlines() if line.startswith("| 1,000 | COUNT |"))
        assert count.endswith("× |"), report  # timed, and set against dpproxy's added latency
        assert "| 1,000 | MIN/MAX | not supported: ValueError" in smartnoise, report  # SmartNoise cannot rewrite MIN
    # Idle clients hold no backend (pgbouncer's pooled connections are gone). dpproxy's pool keeps
    # the idle connections earlier sections used (up to backend.pool.idle_timeout_s), so the count
    # is not 0 as it was before the pool, but it does not grow with the clients.
    idle = report.split("## Idle client connections")[1].split("\n## ")[0].splitlines()
    idle_rows = [line.split("|") for line in idle if line.startswith("| ") and line[2].isdigit()]
    assert idle_rows and len({row[5].strip() for row in idle_rows}) == 1, report
    assert int(idle_rows[0][5]) <= 20, report  # at most backend.pool.size
    # Clients served through the pool: every one of them.
    assert "**20 of 20 answered**" in report, report
    # The large passthrough result: every row read through dpproxy and directly, and by the client
    # that paused (20,000 rows are far less than dpproxy holds for it).
    large = report.split("## A large passthrough result: 20,000 rows through dpproxy vs direct")[1].split("\n## ")[0]
    for name in ("dpproxy", "direct-tcp"):
        assert f"| {name} | 20,000 |" in large, report
    assert "| 20,000 of 20,000 | none |" in large, report
    assert "did not end with every row" not in large, report


def test_quick_benchmark_sets_an_older_and_a_two_worker_dpproxy_beside_this_one():
    """``--baseline-source`` (this very tree here, standing in for a worktree of an older commit)
    and ``dpproxy-2w`` run in the same rounds as dpproxy, each with its ratio to direct-tcp in
    the pgbench, catalog and connections tables and its added latency in the same rotation of
    probes as dpproxy's, the baseline named by its commit."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--only", "pgbench,catalog,connections,latency",
         "--clients", "8", "--modes", "extended", "--targets", "dpproxy,dpproxy-base,dpproxy-2w,direct-tcp",
         "--baseline-source", str(ROOT), "--connection-cycles", "5", "--latency-iterations", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = done.stdout
    label = f"dpproxy-base ({commit_of(ROOT)})"
    for section in ("## pgbench", "## Catalog statements"):
        table = report.split(section)[1].split("\n## ")[0]
        assert f"| {label} tps (ratio) | dpproxy-2w tps (ratio) |" in table, report
        row = next(line for line in table.splitlines() if "| 8 | extended |" in line)
        assert "not run" not in row and "failed" not in row, report
    connections = report.split("## Client connections")[1]
    for name in ("dpproxy", label, "dpproxy-2w", "direct-tcp", "direct-scram"):  # direct-scram: PostgreSQL asking SCRAM
        row = next(line for line in connections.splitlines() if line.startswith(f"| 8 | {name} |"))
        assert row.endswith("| 0 |"), report  # no connection failed
    latency = report.split("## Per-query latency")[1].split("\n## ")[0]
    for query in ("| 1,000 | COUNT |", f"| 1,000 | COUNT, {label} |", "| 1,000 | COUNT, dpproxy-2w |"):
        assert query in latency, report
    assert "Errors:" not in report, report


def test_bytecode_counts_run_and_name_the_python_functions():
    """``python -m benchmarks.bytecodes``: a few statements, a counted table per workload."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bytecodes", "--workloads", "COUNT", "--statements", "5", "--warmup", "3",
         "--top", "5", "--connections", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for protocol in ("simple", "extended"):
        assert f"### COUNT {protocol}: " in done.stdout
    assert "proxy/serving/executor.py:Executor._answer" in done.stdout  # the DP answer's own checks, among the top
    assert "### connection: " in done.stdout and " bytecodes per connection" in done.stdout


def test_instruction_counts_run_under_callgrind():
    """``python -m benchmarks.instructions`` with a handful of statements (valgrind, which ./run-tests installs).

    Its start uninstrumented: instrumenting dpproxy's imports took ~4/5 of this test's time."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.instructions", "--workloads", "catalog", "--statements", "8",
         "--warmup", "8", "--uninstrumented-start", "--connections", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "| catalog | simple | " in done.stdout and "| catalog | extended | " in done.stdout
    assert "| connection | connect, SELECT 1, close | " in done.stdout
