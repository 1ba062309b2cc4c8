"""Per-query latency of one client, dpproxy against PostgreSQL, interleaved query by query.

One psycopg connection per endpoint, in autocommit on the simple query protocol. Each
iteration runs the statement once on every endpoint, in an order that rotates, so that
drift (caches, other load) hits all sides alike. dpproxy's added latency is its percentile
minus PostgreSQL's at the same percentile.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg

from .postgres import Endpoint
from .stats import percentile

__all__ = ["QUERIES", "Latency", "Probe", "added_latency", "measure"]

QUERIES = {
    "COUNT": "SELECT COUNT(*) FROM {table} WHERE age > 40 AND sex = 'Female'",
    "SUM": "SELECT SUM(hours_per_week) FROM {table} WHERE age > 40",
    "AVG": "SELECT AVG(hours_per_week) FROM {table} WHERE age > 40",
    "MIN/MAX": "SELECT MIN(age), MAX(age) FROM {table} WHERE hours_per_week > 40",
    "3 columns": "SELECT COUNT(*), SUM(hours_per_week), SUM(capital_gain) FROM {table} WHERE sex = 'Male'",
}


@dataclass(frozen=True)
class Probe:
    """One statement on one endpoint, timed under ``label``."""

    label: str
    endpoint: Endpoint
    sql: str


@dataclass(frozen=True)
class Latency:
    p50_ms: float
    p99_ms: float

    @classmethod
    def of(cls, samples: list[float]) -> "Latency":
        return cls(percentile(samples, 50), percentile(samples, 99))


def measure(probes: list[Probe], iterations: int, warmup: int = 5) -> dict[str, Latency]:
    """Run every probe ``iterations`` times, interleaved; the latency percentiles of each."""
    connections = [
        psycopg.connect(p.endpoint.conninfo(), autocommit=True, prepare_threshold=None) for p in probes
    ]
    samples: dict[str, list[float]] = {p.label: [] for p in probes}
    try:
        for i in range(warmup + iterations):
            for k in range(len(probes)):
                j = (i + k) % len(probes)
                started = time.perf_counter()
                connections[j].execute(probes[j].sql).fetchall()
                elapsed = (time.perf_counter() - started) * 1000
                if i >= warmup:
                    samples[probes[j].label].append(elapsed)
    finally:
        for conn in connections:
            conn.close()
    return {label: Latency.of(values) for label, values in samples.items()}


def added_latency(proxied: Latency, direct: Latency) -> Latency:
    return Latency(proxied.p50_ms - direct.p50_ms, proxied.p99_ms - direct.p99_ms)
