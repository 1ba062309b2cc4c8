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
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from proxy.demo.embedded import SERVICE_ROLE

from .postgres import BenchPostgres, Endpoint, free_port
from .servers import ServerProcess, find_pgbouncer, start_dpproxy, start_pgbouncer, start_relay, write_policy
from .tables import prepare_database, table_name

__all__ = ["DATABASE", "Environment", "environment"]

DATABASE = "bench"


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
        missing = [name for name in names if name not in every]
        if missing:
            raise ValueError(f"no endpoint {', '.join(missing)} (pgbouncer needs `apt install pgbouncer`)")
        return [every[name] for name in names]

    def available(self, names: list[str]) -> list[str]:
        """``names`` without the endpoints this machine cannot run (pgbouncer not installed)."""
        return [name for name in names if name != "pgbouncer" or self.pgbouncer is not None]


@contextmanager
def environment(
    sizes: list[int], data_dir: Path | None, max_connections: int, pool_size: int | None = None,
    dpproxy_source: Path | None = None,
) -> Iterator[Environment]:
    """Start PostgreSQL (in ``data_dir``, kept; else a temporary one), load, start dpproxy."""
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
        policy = write_policy(workdir / "policy.yaml", backend, port, tables, pool_size)
        proxy, dpproxy = start_dpproxy(policy, port, DATABASE, dpproxy_source)
        servers.append(proxy)
        relay_process, relay = start_relay(backend, free_port(), workdir)
        servers.append(relay_process)
        pgbouncer, bouncer_process = None, None
        executable = find_pgbouncer()
        if executable is not None:
            bouncer_process, pgbouncer = start_pgbouncer(executable, backend, free_port(), workdir, postgres.system_user)
            servers.append(bouncer_process)
        yield Environment(postgres, proxy, dpproxy, relay, pgbouncer, tables, workdir, bouncer_process)
    finally:
        for server in servers:
            server.stop()
        if postgres is not None:
            postgres.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def note(text: str) -> None:
    """Progress, on stderr (stdout carries the report)."""
    print(f"[bench] {text}", file=sys.stderr, flush=True)
