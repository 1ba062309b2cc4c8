"""The benchmark's PostgreSQL: pgserver's binaries, listening on TCP and on a unix socket.

pgserver initialises the data directory (as an unprivileged user when run as root) and
starts PostgreSQL on a unix socket only. The benchmark compares dpproxy, which clients reach
over TCP, with PostgreSQL over TCP too, so the server is restarted here with
``-h 127.0.0.1 -p PORT`` (and the same socket directory) and a ``max_connections`` large
enough for the idle-connection test, where every dpproxy session holds a backend.
"""

from __future__ import annotations

import os
import socket
import warnings
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ADMIN", "BenchPostgres", "Endpoint", "SCRAM_USER", "free_port"]

ADMIN = "postgres"  # the superuser pgserver's initdb creates
SCRAM_USER = ("bench_scram", "bench_scram")  # direct-scram's login and password


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom a client connects: one PostgreSQL-protocol server."""

    name: str
    host: str  # an IP address, or a unix socket directory
    port: int
    user: str
    dbname: str
    password: str | None = None

    def conninfo(self, **extra: str) -> str:
        parts = {"host": self.host, "port": str(self.port), "user": self.user, "dbname": self.dbname}
        if self.password is not None:
            parts["password"] = self.password
        parts.update(extra)
        return " ".join(f"{key}={value}" for key, value in parts.items())

    def uri(self) -> str:
        """A libpq URI (for the policy's backend.dsn and sqlalchemy-free tools)."""
        if self.host.startswith("/"):
            return f"postgresql://{self.user}@/{self.dbname}?host={self.host}&port={self.port}"
        return f"postgresql://{self.user}@{self.host}:{self.port}/{self.dbname}"

    @property
    def transport(self) -> str:
        return "unix socket" if self.host.startswith("/") else "TCP"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class BenchPostgres:
    """PostgreSQL in ``data_dir`` on 127.0.0.1:``port`` and a unix socket; ``stop`` shuts it down."""

    def __init__(self, data_dir: Path, max_connections: int, port: int | None = None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
            import pgserver
            from pgserver import _commands

        data_dir.mkdir(parents=True, exist_ok=True)
        server = pgserver.get_server(data_dir, cleanup_mode=None)  # initdb, start on a socket
        self.data_dir = data_dir
        self.socket_dir = str(server.get_postmaster_info().socket_dir)
        self.port = port or free_port()
        self.bin_dir = _commands.POSTGRES_BIN_PATH
        self._pg_ctl = _commands.pg_ctl  # type: ignore[attr-defined]
        self.system_user: str | None = server.system_user  # who runs PostgreSQL when we are root
        self._ctl(["-w", "-m", "fast", "stop"])
        options = f"-h 127.0.0.1 -p {self.port} -k {self.socket_dir} -c max_connections={max_connections}"
        self._ctl(["-w", "-t", "60", "-l", str(data_dir / "log"), "-o", options, "start"])

    def _ctl(self, args: list[str]) -> None:
        self._pg_ctl(args, pgdata=self.data_dir, user=self.system_user, timeout=90)

    def scram_endpoint(self, dbname: str) -> Endpoint:
        """``direct-scram``: PostgreSQL on TCP as a login role that must authenticate with
        SCRAM-SHA-256, as clients reach dpproxy, so that a connection's cost is compared with
        the same handshake on both sides (the other direct endpoints trust their user)."""
        import psycopg

        user, password = SCRAM_USER
        with psycopg.connect(self.endpoint(ADMIN, dbname).conninfo(), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,)).fetchone() is None:
                conn.execute(f"CREATE ROLE {user} LOGIN")
            conn.execute("SET password_encryption = 'scram-sha-256'")
            conn.execute(f"ALTER ROLE {user} PASSWORD '{password}'")
            hba = Path(conn.execute("SHOW hba_file").fetchone()[0])  # type: ignore[index]
            rule = f"host all {user} 127.0.0.1/32 scram-sha-256\n"
            text = hba.read_text()
            if rule not in text:
                stat = hba.stat()
                hba.write_text(rule + text)  # first: it must win over the trust rules
                os.chown(hba, stat.st_uid, stat.st_gid)
                conn.execute("SELECT pg_reload_conf()")
        return Endpoint("direct-scram", "127.0.0.1", self.port, user, dbname, password)

    def endpoint(self, user: str, dbname: str, tcp: bool = True) -> Endpoint:
        name = "direct-tcp" if tcp else "direct-unix"
        return Endpoint(name, "127.0.0.1" if tcp else self.socket_dir, self.port, user, dbname)

    def stop(self) -> None:
        self._ctl(["-w", "-m", "fast", "stop"])
