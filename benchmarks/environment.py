"""Everything a benchmark runs against: PostgreSQL with the tables, and dpproxy in front of it.

Five endpoints serve the same database ``bench`` (pgbouncer only where it is installed):

* ``dpproxy``     — the proxy on TCP 127.0.0.1, user ``analyst`` (SCRAM), which reaches
  PostgreSQL over its unix socket as the service role;
* ``direct-tcp``  — PostgreSQL on TCP 127.0.0.1, as the service role (trust auth);
* ``direct-unix`` — PostgreSQL on its unix socket, as the service role;
* ``relay``       — a do-nothing asyncio byte relay (benchmarks/relay.py) on TCP 127.0.0.1
  in front of the unix socket: the floor of an asyncio proxy's cost;
* ``pgbouncer``   — pgbouncer in transaction mode on TCP 127.0.0.1 in front of the unix
  socket, when it is installed (benchmarks/servers.py).

dpproxy's clients use TCP, so ``direct-tcp`` is the like-for-like comparison; ``direct-unix``
shows what the transport alone is worth.

Two more dpproxy servers, the ``VARIANTS``, are started only when a run asks for them, so
that an older or differently configured dpproxy is measured in the same rounds as this one:

* ``dpproxy-base`` — dpproxy run from another source tree (``baseline_source``, e.g. a
  worktree of an older commit), named in the report by that tree's commit; its policy is
  ``write_policy(portable=True)`` without ``backend.pool``, which an older policy model accepts;
* ``dpproxy-2w``   — this dpproxy with ``listen.workers: 2`` (two serving processes on one port).

Each dpproxy server has its own port and its own directory for policy, ledger, audit file
and log: a baseline's ledger code may differ from this tree's, and the two workers of
``dpproxy-2w`` contend for their own ledger only, as they would in a deployment.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from proxy.demo.embedded import SERVICE_ROLE

from .postgres import BenchPostgres, Endpoint, free_port
from .servers import (
    ServerProcess, commit_of, find_pgbouncer, start_dpproxy, start_pgbouncer, start_relay, write_policy,
)
from .tables import prepare_database, table_name

__all__ = ["BASELINE", "DATABASE", "Environment", "ProxyTarget", "TWO_WORKERS", "VARIANTS", "environment"]

DATABASE = "bench"
BASELINE, TWO_WORKERS = "dpproxy-base", "dpproxy-2w"
VARIANTS = (BASELINE, TWO_WORKERS)  # the optional dpproxy servers, in the report's order
WORKERS = 2  # dpproxy-2w's listen.workers


@dataclass(frozen=True)
class ProxyTarget:
    """One optional dpproxy server: its endpoint, policy file (next to its ledger) and process;
    ``label`` names it in the report."""

    endpoint: Endpoint
    policy: Path
    process: ServerProcess
    label: str


@dataclass
class Environment:
    postgres: BenchPostgres
    proxy: ServerProcess
    dpproxy: Endpoint
    relay: Endpoint
    pgbouncer: Endpoint | None  # None when pgbouncer is not installed
    tables: dict[int, str]  # rows → table name
    workdir: Path
    pgbouncer_process: ServerProcess | None = None
    variants: dict[str, ProxyTarget] = field(default_factory=dict)  # the VARIANTS started, by name

    def stop_pgbouncer(self) -> None:
        """Stop pgbouncer, closing the server connections it pools (they would count as the
        service role's backends in the idle-clients section)."""
        if self.pgbouncer_process is not None:
            self.pgbouncer_process.stop()

    @property
    def direct_tcp(self) -> Endpoint:
        return self.postgres.endpoint(SERVICE_ROLE, DATABASE, tcp=True)

    @property
    def direct_unix(self) -> Endpoint:
        return self.postgres.endpoint(SERVICE_ROLE, DATABASE, tcp=False)

    def endpoints(self, names: list[str]) -> list[Endpoint]:
        every = {e.name: e for e in (self.dpproxy, self.direct_tcp, self.direct_unix, self.relay, self.pgbouncer) if e}
        every.update((name, target.endpoint) for name, target in self.variants.items())
        missing = [name for name in names if name not in every]
        if missing:
            raise ValueError(f"no endpoint {', '.join(missing)} (pgbouncer needs `apt install pgbouncer`, "
                             f"{BASELINE} --baseline-source)")
        return [every[name] for name in names]

    def available(self, names: list[str]) -> list[str]:
        """``names`` without the endpoints this machine cannot run (pgbouncer not installed)."""
        return [name for name in names if name != "pgbouncer" or self.pgbouncer is not None]

    def proxies(self, names: list[str]) -> list[Endpoint]:
        """dpproxy and those of ``names`` that are VARIANTS started here, in the report's order."""
        return [self.dpproxy] + [self.variants[name].endpoint for name in VARIANTS
                                 if name in names and name in self.variants]

    def policy_of(self, endpoint: Endpoint) -> Path | None:
        """The policy of the dpproxy server behind ``endpoint``; None for the other endpoints."""
        if endpoint is self.dpproxy:
            return self.workdir / "policy.yaml"
        target = self.variants.get(endpoint.name)
        return target.policy if target is not None and target.endpoint is endpoint else None

    def labels(self) -> dict[str, str]:
        """How the report names each variant started (the baseline by its commit)."""
        return {name: target.label for name, target in self.variants.items()}


@contextmanager
def environment(
    sizes: list[int], data_dir: Path | None, max_connections: int, pool_size: int | None = None,
    dpproxy_source: Path | None = None, baseline_source: Path | None = None, two_workers: bool = False,
) -> Iterator[Environment]:
    """Start PostgreSQL (in ``data_dir``, kept; else a temporary one), load, start dpproxy;
    ``dpproxy-base`` too when ``baseline_source`` is given, ``dpproxy-2w`` when ``two_workers``."""
    workdir = Path(tempfile.mkdtemp(prefix="dpproxy-bench-"))
    postgres: BenchPostgres | None = None
    servers: list[ServerProcess] = []
    try:
        started = time.monotonic()
        postgres = BenchPostgres(data_dir or workdir / "pgdata", max_connections)
        prepare_database(postgres, DATABASE, sizes)
        note(f"PostgreSQL on 127.0.0.1:{postgres.port}, tables {sizes} ready in {time.monotonic() - started:.1f}s")
        tables = {rows: table_name(rows) for rows in sizes}
        backend = postgres.endpoint(SERVICE_ROLE, DATABASE, tcp=False)
        port = free_port()
        policy = write_policy(workdir / "policy.yaml", backend, port, tables, pool_size,
                              portable=dpproxy_source is not None)
        proxy, dpproxy = start_dpproxy(policy, port, DATABASE, dpproxy_source)
        servers.append(proxy)
        variants = {}
        if baseline_source is not None:
            variants[BASELINE] = _start_variant(workdir / BASELINE, backend, tables, None, baseline_source,
                                                f"{BASELINE} ({commit_of(baseline_source)})", portable=True)
            servers.append(variants[BASELINE].process)
        if two_workers:
            variants[TWO_WORKERS] = _start_variant(workdir / TWO_WORKERS, backend, tables, pool_size, dpproxy_source,
                                                   TWO_WORKERS, workers=WORKERS)
            servers.append(variants[TWO_WORKERS].process)
        relay_process, relay = start_relay(backend, free_port(), workdir)
        servers.append(relay_process)
        pgbouncer, bouncer_process = None, None
        executable = find_pgbouncer()
        if executable is not None:
            bouncer_process, pgbouncer = start_pgbouncer(executable, backend, free_port(), workdir, postgres.system_user)
            servers.append(bouncer_process)
        yield Environment(postgres, proxy, dpproxy, relay, pgbouncer, tables, workdir, bouncer_process, variants)
    finally:
        for server in servers:
            server.stop()
        if postgres is not None:
            postgres.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def _start_variant(
    directory: Path, backend: Endpoint, tables: dict[int, str], pool_size: int | None, source: Path | None,
    label: str, workers: int | None = None, portable: bool = False,
) -> ProxyTarget:
    """Write a policy in ``directory`` (with its ledger, audit file and log) and start a dpproxy
    named after ``directory`` on a port of its own."""
    directory.mkdir()
    port = free_port()
    policy = write_policy(directory / "policy.yaml", backend, port, tables, pool_size, workers=workers,
                          portable=portable)
    process, endpoint = start_dpproxy(policy, port, DATABASE, source, name=directory.name, workers=workers or 1)
    return ProxyTarget(endpoint, policy, process, label)


def note(text: str) -> None:
    """Progress, on stderr (stdout carries the report)."""
    print(f"[bench] {text}", file=sys.stderr, flush=True)
