"""Prometheus metrics: what dpproxy decided, how long it took, what it charged, who is connected.

Contract
--------
* Every metric object lives here, in prometheus_client's default registry (so the process
  and Python collectors come along). Callers use the ``observe_*`` functions and the
  connection gauge helpers, never the objects.
* ``observe_statement`` is called once per statement, where its outcome is known (the
  executor's audit hook). It, ``observe_backend`` and ``observe_pool_checkout`` only append
  their numbers to a queue (the event loop's whole per-statement cost); a daemon thread,
  ``dpproxy-metrics``, applies them to the metric objects in batches (``BATCH_S`` after the
  first one), and ``/metrics`` applies what is still queued before it collects. So a scrape
  of one process shows every statement answered before it; under ``listen.workers`` the
  supervisor's scrape may lag a worker's last ``BATCH_S`` of observations. ``flush`` applies
  the queue now (at shutdown). Labels are bounded sets: the decision (``dp``, ``passthrough``,
  ``command``, ``refused``, ``error``), the reason (a refusal rule or a SQLSTATE, empty
  when answered) and the login name (users come from the policy).
* No metric carries a result, an exact value or statement text. Latencies of DP queries
  do depend on the data (how many rows match a filter), which is why the endpoint is for
  operators only (docs/threat-model.md).
* ``MetricsEndpoint`` serves ``/metrics`` over HTTP from a daemon thread; ``close`` frees
  the port.
* Under ``listen.workers`` > 1 each worker is started with ``PROMETHEUS_MULTIPROC_DIR`` set
  (prometheus_client's multiprocess mode: values go to files there) and the supervisor
  serves them summed (``MetricsEndpoint(..., directory)``). Gauges then add up over the live
  workers; the pool gauges, read by callback in one process, are written by
  ``write_watched`` instead, which a worker calls every second. The process collector's
  series (CPU, memory, file descriptors, start time) cannot be summed that way: the
  supervisor serves them per process instead, labelled ``worker`` (its number, or
  ``supervisor``), read with psutil at each scrape (``ProcessesCollector``).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections import deque
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Final, Iterable, Iterator, Mapping

import psutil
from prometheus_client import (
    REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, multiprocess, start_http_server,
)
from prometheus_client.registry import RestrictedRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = [
    "MetricsEndpoint",
    "ProcessesCollector",
    "connection_closed",
    "connection_opened",
    "observe_backend",
    "observe_pool_checkout",
    "pool_discarded",
    "pool_reset",
    "watch_pool",
    "worker_gone",
    "flush",
    "write_watched",
    "pool_timed_out",
    "observe_statement",
    "policy_reloaded",
]

log = logging.getLogger("dpproxy.metrics")

disable_created_metrics()  # no *_created series: they double the output and nobody graphs them

# Catalog round trips take a millisecond; sample-and-aggregate over a large table, seconds.
_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# The refusal rule of DP002 (policies.errors / proxy.budget): the budget could not pay.
BUDGET_RULE: Final = "budget"

STATEMENTS = Counter(
    "dpproxy_statements",
    "Statements by what dpproxy decided: dp, passthrough, command, refused (reason: the rule) "
    "or error (reason: the SQLSTATE).",
    ["decision", "reason"],
)
STATEMENT_SECONDS = Histogram(
    "dpproxy_statement_duration_seconds",
    "End-to-end time of one statement in dpproxy, from planning to its answer, by decision.",
    ["decision"],
    buckets=_BUCKETS,
)
BACKEND_SECONDS = Histogram(
    "dpproxy_backend_duration_seconds",
    "Time of one round trip to the backend PostgreSQL (send to last result).",
    buckets=_BUCKETS,
)
EPSILON = Counter("dpproxy_epsilon_charged", "Privacy budget ε charged, per user.", ["user"])
DELTA = Counter("dpproxy_delta_charged", "Privacy budget δ charged, per user.", ["user"])
BUDGET_REFUSALS = Counter(
    "dpproxy_budget_refusals", "DP queries refused because the user's budget could not pay (DP002).", ["user"]
)
# Set in the environment of the workers of a ``listen.workers`` group (see the contract).
MULTIPROCESS: Final = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
CONNECTIONS = Gauge("dpproxy_open_connections", "Authenticated client sessions open now.",
                    multiprocess_mode="livesum")
POOL_CONNECTIONS = Gauge(
    "dpproxy_backend_pool_connections",
    "Backend connections of the pool by state: in_use (checked out by a session) or idle.",
    ["state"],
    multiprocess_mode="livesum",
)
POOL_WAIT_SECONDS = Histogram(
    "dpproxy_backend_pool_checkout_wait_seconds",
    "Time a session waited to check a backend connection out of the pool (0 when one was free).",
    buckets=(0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60),
)
POOL_TIMEOUTS = Counter(
    "dpproxy_backend_pool_timeouts", "Checkouts that gave up after backend.pool.checkout_timeout_s (53300)."
)
POOL_RESETS = Counter(
    "dpproxy_backend_pool_resets",
    "Checkouts that re-applied the session's settings to a connection last used with other ones (RESET ALL + SETs).",
)
POOL_DISCARDS = Counter(
    "dpproxy_backend_pool_discarded",
    "Backend connections closed instead of reused, by reason (lost, in_transaction, cancelled, idle, "
    "config, shrunk, error, closing).",
    ["reason"],
)
RELOADS = Counter("dpproxy_policy_reloads", "Policy reloads (SIGHUP) by outcome: applied or refused.", ["outcome"])


BATCH_S: Final = 0.02
"""How long the metrics thread lets observations gather after the first one before applying them."""
_IDLE_S: Final = 1.0
"""How often the metrics thread looks at the queue without being woken."""

# Observations waiting for the metrics thread: (function, arguments). The event loop only
# appends (atomic under the GIL) and wakes the thread when it may be asleep. Unbounded: the
# thread does no I/O (multiprocess values are memory-mapped), so it cannot stall behind a disk.
_pending: deque[tuple[Callable[..., None], tuple[Any, ...]]] = deque()
_wake = threading.Event()
_thread: threading.Thread | None = None
_start_lock = threading.Lock()


def observe_statement(
    decision: str, reason: str | None, user: str, epsilon: float, delta: float, latency_s: float
) -> None:
    """Count one statement with its decision and reason, its latency, and what it charged."""
    _pending.append((_count_statement, (decision, reason, user, epsilon, delta, latency_s)))
    if not _wake.is_set():
        _wake_up()


def _count_statement(
    decision: str, reason: str | None, user: str, epsilon: float, delta: float, latency_s: float
) -> None:
    count, seconds = _statement_series(decision, reason or "")
    count.inc()
    seconds.observe(latency_s)
    if epsilon > 0 and math.isfinite(epsilon):
        _user_series(EPSILON, user).inc(epsilon)
    if delta > 0 and math.isfinite(delta):
        _user_series(DELTA, user).inc(delta)
    if decision == "refused" and reason == BUDGET_RULE:
        BUDGET_REFUSALS.labels(user).inc()


# ``labels()`` validates and looks up under a lock on every call; the label sets are small.
@lru_cache(maxsize=1024)
def _statement_series(decision: str, reason: str) -> tuple[Any, Any]:
    return STATEMENTS.labels(decision, reason), STATEMENT_SECONDS.labels(decision)


@lru_cache(maxsize=1024)
def _user_series(metric: Counter, user: str) -> Any:
    return metric.labels(user)


def observe_backend(latency_s: float) -> None:
    """Record one backend round trip."""
    _pending.append((BACKEND_SECONDS.observe, (latency_s,)))
    if not _wake.is_set():
        _wake_up()


def flush() -> None:
    """Apply every queued observation now, in the calling thread."""
    while True:
        try:
            function, arguments = _pending.popleft()
        except IndexError:
            return
        try:
            function(*arguments)
        except Exception:  # a metric must never take the thread (or a scrape) down
            log.exception("metrics: recording an observation failed")


def _wake_up() -> None:
    """Wake the metrics thread, starting it in this process first if it is not running."""
    global _thread
    if _thread is None:
        with _start_lock:
            if _thread is None:
                _thread = threading.Thread(target=_apply_batches, name="dpproxy-metrics", daemon=True)
                _thread.start()
    _wake.set()


def _apply_batches() -> None:
    while True:
        if _wake.wait(_IDLE_S):
            # Let a batch gather: one wake-up and GIL hand-off per batch, not per statement.
            time.sleep(BATCH_S)
        _wake.clear()  # before draining, so an observation appended meanwhile wakes us again
        flush()


def _forget_thread() -> None:
    global _thread, _start_lock
    _thread, _start_lock = None, threading.Lock()
    _wake.clear()


os.register_at_fork(after_in_child=_forget_thread)  # a forked child has no metrics thread


class _FlushingRegistry(CollectorRegistry):
    """The default registry, collected after the queued observations are applied: a scrape
    shows every observation made before it."""

    def collect(self) -> Iterator[Metric]:
        flush()
        yield from REGISTRY.collect()

    def restricted_registry(self, names: Iterable[str]) -> RestrictedRegistry:
        flush()
        return REGISTRY.restricted_registry(names)


_watched: list[tuple[Any, Callable[[], float]]] = []


def watch_pool(in_use: Callable[[], float], idle: Callable[[], float]) -> None:
    """Read the pool's connections in use and idle when metrics are collected (nothing per checkout)."""
    for state, read in (("in_use", in_use), ("idle", idle)):
        if MULTIPROCESS:
            _watched.append((POOL_CONNECTIONS.labels(state), read))
        else:
            POOL_CONNECTIONS.labels(state).set_function(read)


def write_watched() -> None:
    """Multiprocess mode: write the current value of every gauge read by callback."""
    for gauge, read in _watched:
        gauge.set(read())


def observe_pool_checkout(wait_s: float) -> None:
    """Record how long a checkout waited for a backend connection."""
    _pending.append((POOL_WAIT_SECONDS.observe, (wait_s,)))
    if not _wake.is_set():
        _wake_up()


def pool_timed_out() -> None:
    POOL_TIMEOUTS.inc()


def pool_reset() -> None:
    POOL_RESETS.inc()


def pool_discarded(reason: str) -> None:
    POOL_DISCARDS.labels(reason).inc()


def connection_opened() -> None:
    CONNECTIONS.inc()


def connection_closed() -> None:
    CONNECTIONS.dec()


def policy_reloaded(applied: bool) -> None:
    RELOADS.labels("applied" if applied else "refused").inc()


def worker_gone(pid: int, directory: Path) -> None:
    """Drop a worker that exited from the live gauges served from ``directory``."""
    multiprocess.mark_process_dead(pid, str(directory))


class ProcessesCollector:
    """The process collector's series for several processes, one per ``worker`` label.

    ``processes`` gives the label and pid of each process to report at the time of a scrape;
    one that has exited meanwhile is left out.
    """

    def __init__(self, processes: Callable[[], Mapping[str, int]]):
        self._processes = processes

    def collect(self) -> Iterator[Metric]:
        labels = ["worker"]
        cpu = CounterMetricFamily("process_cpu_seconds", "Total user and system CPU time spent in seconds.",
                                  labels=labels)
        resident = GaugeMetricFamily("process_resident_memory_bytes", "Resident memory size in bytes.", labels=labels)
        virtual = GaugeMetricFamily("process_virtual_memory_bytes", "Virtual memory size in bytes.", labels=labels)
        fds = GaugeMetricFamily("process_open_fds", "Number of open file descriptors.", labels=labels)
        started = GaugeMetricFamily("process_start_time_seconds",
                                    "Start time of the process since unix epoch in seconds.", labels=labels)
        families: tuple[CounterMetricFamily | GaugeMetricFamily, ...] = (cpu, resident, virtual, fds, started)
        for label, pid in self._processes().items():
            try:
                process = psutil.Process(pid)
                with process.oneshot():
                    times, memory = process.cpu_times(), process.memory_info()
                    values = (times.user + times.system, memory.rss, memory.vms, process.num_fds(),
                              process.create_time())
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            for family, value in zip(families, values):
                family.add_metric([label], value)
        yield from families


class MetricsEndpoint:
    """The ``/metrics`` HTTP endpoint on (host, port), served from a daemon thread: this
    process's metrics, or (``directory``) those the workers of a group write there, with
    the process series of each of ``processes`` (label → pid) beside them."""

    def __init__(self, host: str, port: int, directory: Path | None = None,
                 processes: Callable[[], Mapping[str, int]] | None = None):
        """Bind and start serving; raise OSError if the address cannot be bound."""
        if directory is None:
            self._server, self._thread = start_http_server(port, host, registry=_FlushingRegistry())
        else:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=str(directory))
            if processes is not None:
                registry.register(ProcessesCollector(processes))
            self._server, self._thread = start_http_server(port, host, registry=registry)
        bound = self._server.server_address
        self.host, self.port = str(bound[0]), int(bound[1])
        log.info("metrics on http://%s:%s/metrics", self.host, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
