"""What a client connection costs, and how many clients one PostgreSQL serves through dpproxy.

* ``connection_cost``: clients that connect, run ``SELECT 1`` and close, one after another on
  each of ``concurrency`` threads, against each endpoint in turn (order alternating by
  round); the p50 and p99 of that whole cycle. Through dpproxy it includes SCRAM with dpproxy
  and, without a pool (before issue 21), the fork of a backend for every client that runs a
  statement; with the pool, a connection already open is borrowed.
* ``clients_served``: ``clients`` connections opened at once, each runs one DP query and
  stays open until all have tried (so that nothing is freed meanwhile); how many were
  answered, and the errors of the others. Run against a PostgreSQL with a low
  ``max_connections`` it shows whether clients need a backend each.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg

from .postgres import Endpoint

__all__ = ["ConnectionCost", "Served", "clients_served", "connection_cost"]


@dataclass(frozen=True)
class ConnectionCost:
    endpoint: str
    concurrency: int
    p50_ms: float
    p99_ms: float
    cycles: int
    errors: int


@dataclass
class Served:
    clients: int
    answered: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


def connection_cost(endpoints: list[Endpoint], concurrency: int, cycles: int, rounds: int = 3) -> list[ConnectionCost]:
    """p50/p99 of connect + SELECT 1 + close, ``cycles`` per thread and round, endpoints alternating."""
    samples: dict[str, list[float]] = {e.name: [] for e in endpoints}
    errors: Counter[str] = Counter()
    for round_ in range(rounds):
        for endpoint in endpoints if round_ % 2 == 0 else endpoints[::-1]:
            _cycle(endpoint, concurrency, cycles, samples[endpoint.name], errors)
    return [
        ConnectionCost(e.name, concurrency, _quantile(samples[e.name], 0.5), _quantile(samples[e.name], 0.99),
                       len(samples[e.name]), errors[e.name])
        for e in endpoints
    ]


def _cycle(endpoint: Endpoint, concurrency: int, cycles: int, out: list[float], errors: Counter[str]) -> None:
    conninfo = endpoint.conninfo(connect_timeout="30")
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(cycles):
            started = time.perf_counter()
            try:
                with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as conn:
                    conn.execute("SELECT 1").fetchall()
            except psycopg.Error:
                with lock:
                    errors[endpoint.name] += 1
                continue
            elapsed = time.perf_counter() - started
            with lock:
                out.append(elapsed)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def clients_served(endpoint: Endpoint, clients: int, sql: str) -> Served:
    """``clients`` sessions at once, each running ``sql`` once and staying open until all tried."""
    served = Served(clients)
    lock = threading.Lock()
    tried = threading.Barrier(clients + 1)
    done = threading.Event()
    conninfo = endpoint.conninfo(connect_timeout="60")

    def client() -> None:
        conn = None
        try:
            conn = psycopg.connect(conninfo, autocommit=True, prepare_threshold=None)
            conn.execute(sql).fetchall()
            with lock:
                served.answered += 1
        except psycopg.Error as exc:
            with lock:
                served.errors[_first_line(exc)] += 1
        finally:
            try:
                tried.wait(timeout=300)
            except threading.BrokenBarrierError:
                pass
            done.wait(300)
            if conn is not None:
                conn.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        tried.wait(timeout=300)
    except threading.BrokenBarrierError:
        pass
    served.seconds = time.perf_counter() - started
    done.set()
    for thread in threads:
        thread.join(60)
    return served


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = next((t for t in text if "FATAL" in t or "ERROR" in t), text[0] if text else type(exc).__name__)
    return line.split("FATAL:", 1)[-1].split("ERROR:", 1)[-1].strip()[:120]


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0] * 1000
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, min(98, round(q * 100) - 1))] * 1000
