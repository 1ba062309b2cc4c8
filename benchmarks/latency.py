"""Per-query latency of one client, dpproxy against PostgreSQL, interleaved query by query.

Each probe is a statement on one client: a psycopg connection in autocommit on the simple
query protocol, or anything else that can time a statement (benchmarks/smartnoise.py). Each
iteration runs the statement once on every probe, in an order that rotates, so that drift
(caches, other load) hits all sides alike. dpproxy's added latency is its percentile minus
PostgreSQL's at the same percentile.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol

import psycopg

from .postgres import Endpoint
from .stats import percentile

__all__ = ["QUERIES", "Latency", "Probe", "Timer", "added_latency", "measure"]

QUERIES = {
    "COUNT": "SELECT COUNT(*) FROM {table} WHERE age > 40 AND sex = 'Female'",
    "SUM": "SELECT SUM(hours_per_week) FROM {table} WHERE age > 40",
    "AVG": "SELECT AVG(hours_per_week) FROM {table} WHERE age > 40",  # sample and aggregate (the benchmark policy)
    # the policy default, a noisy sum over a noisy count: education_num is set to it (benchmarks/servers.py)
    "AVG, sum_count": "SELECT AVG(education_num) FROM {table} WHERE age > 40",
    "MIN/MAX": "SELECT MIN(age), MAX(age) FROM {table} WHERE hours_per_week > 40",
    "3 columns": "SELECT COUNT(*), SUM(hours_per_week), SUM(capital_gain) FROM {table} WHERE sex = 'Male'",
}


class Timer(Protocol):
    """A client that runs a statement to its last row and says how long that took."""

    def time_ms(self, sql: str) -> float: ...

    def close(self) -> None: ...


class PsycopgTimer:
    """One psycopg connection in autocommit, simple protocol (no server-side prepare)."""

    def __init__(self, endpoint: Endpoint):
        self._conn = psycopg.connect(endpoint.conninfo(), autocommit=True, prepare_threshold=None)

    def time_ms(self, sql: str) -> float:
        started = time.perf_counter()
        self._conn.execute(sql).fetchall()
        return (time.perf_counter() - started) * 1000

    def close(self) -> None:
        self._conn.close()


@dataclass(frozen=True)
class Probe:
    """One statement on one client, timed under ``label``."""

    label: str
    sql: str
    connect: Callable[[], Timer]

    @classmethod
    def on(cls, label: str, endpoint: Endpoint, sql: str) -> "Probe":
        """``sql`` on a psycopg connection to ``endpoint``."""
        return cls(label, sql, lambda: PsycopgTimer(endpoint))


@dataclass(frozen=True)
class Latency:
    p50_ms: float
    p99_ms: float

    @classmethod
    def of(cls, samples: list[float]) -> "Latency":
        return cls(percentile(samples, 50), percentile(samples, 99))


def measure(probes: list[Probe], iterations: int, warmup: int = 5) -> dict[str, Latency]:
    """Run every probe ``iterations`` times, interleaved; the latency percentiles of each."""
    timers: list[Timer] = []
    samples: dict[str, list[float]] = {p.label: [] for p in probes}
    try:
        for probe in probes:
            timers.append(probe.connect())
        for i in range(warmup + iterations):
            for k in range(len(probes)):
                j = (i + k) % len(probes)
                elapsed = timers[j].time_ms(probes[j].sql)
                if i >= warmup:
                    samples[probes[j].label].append(elapsed)
    finally:
        for timer in timers:
            timer.close()
    return {label: Latency.of(values) for label, values in samples.items()}


def added_latency(proxied: Latency, direct: Latency) -> Latency:
    return Latency(proxied.p50_ms - direct.p50_ms, proxied.p99_ms - direct.p99_ms)
