"""A 1,000-cell DP histogram through dpproxy against the plain GROUP BY on PostgreSQL.

Three probes, interleaved: the plain ``GROUP BY width_bucket(age, …, 998)`` run directly
(1,000 buckets: 998 bins and the two outside them), the SQL dpproxy sends the backend for the
same statement (one grouped pass that reports each group's cell) run directly, and the DP
histogram through dpproxy (which also noises every cell and builds the 1,000-row answer). The
rewritten SQL's ratio is what the rewrite costs inside PostgreSQL; the DP histogram's what
dpproxy's own work adds on top. ``seq_scans`` counts the scans of the table each side starts,
from PostgreSQL's statistics: one statement per histogram, never one per cell.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from rewriter.rewrite import backend_sql, partition_seed

from .latency import Latency, Probe, measure
from .plans import plan_of
from .postgres import Endpoint

__all__ = ["HISTOGRAM", "HistogramComparison", "compare_histogram"]

HISTOGRAM = "SELECT width_bucket(age, 17, 91, 998) AS bin, COUNT(*), SUM(hours_per_week) FROM {table} GROUP BY 1"
# PostgreSQL's statistics reach other sessions within PGSTAT_IDLE_INTERVAL (10 s) of a backend going idle.
_STATS_DELAY_S = 11.0


@dataclass(frozen=True)
class HistogramComparison:
    rows: int
    cells: int
    direct: Latency
    rewritten: Latency
    dpproxy: Latency
    backend_sql: str
    seq_scans_direct: int
    seq_scans_dpproxy: int


def compare_histogram(
    policy_path: Path, proxy: Endpoint, direct: Endpoint, table: str, rows: int, iterations: int
) -> HistogramComparison:
    sql = HISTOGRAM.format(table=table)
    plan = plan_of(policy_path, sql)
    rewritten = backend_sql(plan, seed=partition_seed())
    scans_direct = _seq_scans(direct, table, sql)
    scans_dpproxy = _seq_scans(direct, table, sql, via=proxy)
    times = measure(
        [Probe.on("direct", direct, sql), Probe.on("rewritten", direct, rewritten), Probe.on("dpproxy", proxy, sql)],
        iterations,
    )
    return HistogramComparison(rows, plan.cells, times["direct"], times["rewritten"], times["dpproxy"], rewritten,
                               scans_direct, scans_dpproxy)


def _seq_scans(direct: Endpoint, table: str, sql: str, via: Endpoint | None = None) -> int:
    """How many sequential scans of ``table`` one run of ``sql`` (on ``via``, else directly) starts."""
    with psycopg.connect(direct.conninfo(), autocommit=True) as stats:
        before = _scans_of(stats, table)
        with psycopg.connect((via or direct).conninfo(), autocommit=True, prepare_threshold=None) as conn:
            conn.execute(sql).fetchall()
        time.sleep(_STATS_DELAY_S)
        return _scans_of(stats, table) - before


def _scans_of(conn: psycopg.Connection, table: str) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT seq_scan FROM pg_stat_user_tables WHERE relid = %s::regclass", (table,)).fetchone()
    assert row is not None, table
    return int(row[0])
