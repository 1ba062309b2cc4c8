"""A PostgreSQL of one test module's own, for tests that restart it, crash it or kill its backends
(doing that to the suite's shared server would disturb every other test)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import psycopg

from proxy.demo.embedded import SERVICE_ROLE


@dataclass(frozen=True)
class OwnServer:
    """The server's data directory, the system user it runs as (None: the caller), and libpq
    URIs of one database as a superuser and as dpproxy's service role."""

    data: Path
    system_user: str | None
    admin_dsn: str
    service_dsn: str


@contextmanager
def own_postgres(database: str, prefix: str) -> Iterator[OwnServer]:
    """A pgserver PostgreSQL in a fresh directory named from ``prefix``, with ``database`` and the
    service role (no privileges yet); stopped and removed on exit."""
    import pgserver

    data = Path(tempfile.mkdtemp(prefix=prefix))
    server = pgserver.get_server(data, cleanup_mode="stop")  # type: ignore[attr-defined]
    try:
        root = server.get_uri("postgres")
        with psycopg.connect(root, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {database}")
            conn.execute(f"CREATE ROLE {SERVICE_ROLE} LOGIN")
        admin_dsn = urlparse(root)._replace(path=f"/{database}").geturl()
        yield OwnServer(data, server.system_user, admin_dsn, urlparse(admin_dsn)._replace(netloc=f"{SERVICE_ROLE}@").geturl())
    finally:
        server.cleanup()
        shutil.rmtree(data, ignore_errors=True)
