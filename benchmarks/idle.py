"""Memory of dpproxy with many idle clients: each logged in (SCRAM) and then left alone.

Connections are opened in batches up to each checkpoint; at each one the proxy's RSS, the
number of backend sessions dpproxy holds on PostgreSQL for clients (``pg_stat_activity`` for
the service role, less the connection dpproxy opens for a moment every 10 s for its own
re-check, named OWN_APPLICATION_NAME) and those backends' private memory (USS) are read. A client dpproxy cannot
serve (e.g. PostgreSQL's ``max_connections`` reached, before dpproxy pooled its backend
connections) is counted with its error, and the run goes on to the next checkpoint.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

import psutil
import psycopg

from proxy.backend.connection import OWN_APPLICATION_NAME
from proxy.demo.embedded import SERVICE_ROLE

from .postgres import Endpoint
from .servers import ServerProcess

__all__ = ["IdleResult", "IdleStep", "idle_connections"]

_BATCH = 50


@dataclass(frozen=True)
class IdleStep:
    attempted: int
    open: int
    proxy_rss: int
    backends: int
    backend_uss: int


@dataclass
class IdleResult:
    baseline_rss: int
    steps: list[IdleStep]
    errors: Counter[str] = field(default_factory=Counter)
    rss_after_close: int = 0


def idle_connections(
    proxy: ServerProcess, endpoint: Endpoint, admin: Endpoint, checkpoints: list[int]
) -> IdleResult:
    return asyncio.run(_idle(proxy, endpoint, admin, checkpoints))


async def _idle(proxy: ServerProcess, endpoint: Endpoint, admin: Endpoint, checkpoints: list[int]) -> IdleResult:
    monitor = await psycopg.AsyncConnection.connect(admin.conninfo(), autocommit=True)
    result = IdleResult(proxy.rss(), [])
    clients: list[psycopg.AsyncConnection] = []
    attempted = 0
    try:
        for target in checkpoints:
            while attempted < target:
                batch = min(_BATCH, target - attempted)
                opened = await asyncio.gather(
                    *(psycopg.AsyncConnection.connect(endpoint.conninfo(connect_timeout="30"), autocommit=True)
                      for _ in range(batch)),
                    return_exceptions=True,
                )
                attempted += batch
                for conn in opened:
                    if isinstance(conn, BaseException):
                        result.errors[_first_line(conn)] += 1
                    else:
                        clients.append(conn)
            await asyncio.sleep(1.0)  # let the proxy settle after the burst of logins
            backends, uss = await _backends(monitor)
            result.steps.append(IdleStep(attempted, len(clients), proxy.rss(), backends, uss))
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
        await asyncio.sleep(1.0)
        result.rss_after_close = proxy.rss()
        await monitor.close()
    return result


async def _backends(monitor: psycopg.AsyncConnection) -> tuple[int, int]:
    """How many backend sessions the service role holds for clients, and their summed private memory."""
    cur = await monitor.execute("SELECT pid FROM pg_stat_activity WHERE usename = %s AND application_name <> %s",
                                (SERVICE_ROLE, OWN_APPLICATION_NAME))
    pids = [pid for (pid,) in await cur.fetchall()]
    uss = 0
    for pid in pids:
        try:
            uss += psutil.Process(pid).memory_full_info().uss
        except psutil.Error:
            pass
    return len(pids), uss


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:160]
