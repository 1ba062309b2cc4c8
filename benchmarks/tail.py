"""Where the slow queries come from: one client's DP COUNTs timed one by one, in order.

    python -m benchmarks.tail --queries 20000

Starts the benchmark environment (benchmarks/environment.py) with the 1,000-row table,
sends COUNTs with a two-column WHERE through dpproxy on one psycopg connection (simple
protocol), and prints the latency percentiles and how the slow queries (over 2.5 × the
median) are spaced: a slow query every n-th one points at work done every n queries (the
ledger write every ``ledger.reserve`` answers, the audit writer's batch every 20 ms).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from pathlib import Path

import psycopg

from .environment import environment

__all__ = ["main"]

_WARM_UP = 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--queries", type=int, default=20_000)
    parser.add_argument("--data-dir", type=Path, help="keep PostgreSQL's data here between runs")
    args = parser.parse_args()
    with environment([1000], args.data_dir, 100) as env:
        table = env.tables[1000]
        with psycopg.connect(env.dpproxy.conninfo(), autocommit=True, prepare_threshold=None) as conn:
            latencies = [_timed(conn, table, i) for i in range(_WARM_UP + args.queries)][_WARM_UP:]
    report(latencies)


def _timed(conn: psycopg.Connection, table: str, i: int) -> float:
    started = time.perf_counter()
    conn.execute(f"SELECT COUNT(*) FROM {table} WHERE age > {20 + i % 40} AND hours_per_week > 30").fetchall()
    return (time.perf_counter() - started) * 1e6


def report(latencies: list[float]) -> None:
    q = statistics.quantiles(latencies, n=100)
    median = q[49]
    print(f"{len(latencies):,} queries, µs: mean {statistics.mean(latencies):.0f}, p50 {median:.0f}, "
          f"p90 {q[89]:.0f}, p99 {q[98]:.0f}, max {max(latencies):.0f}")
    slow = [i for i, x in enumerate(latencies) if x > 2.5 * median]
    excess = sum(x - median for x in latencies if x > median)
    print(f"slow (> 2.5 × p50): {len(slow):,} queries, "
          f"{sum(latencies[i] - median for i in slow) / max(excess, 1e-9):.0%} of the time above the median")
    gaps = Counter(b - a for a, b in zip(slow, slow[1:]))
    print("most common spacing between slow queries:", ", ".join(f"{g} ({n})" for g, n in gaps.most_common(8)))


if __name__ == "__main__":
    main()
