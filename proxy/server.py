"""The listening server: accepts clients, holds the policy in force, routes cancel requests."""

from __future__ import annotations

import asyncio
import logging
import ssl
from policies.model import Policy
from policies.tables import TableRegistry

from .backend import ResultSet, build_registry, connect
from .audit import AuditLog
from .budget import BudgetKeeper
from .repeats import RepeatCache
from .session import Session

__all__ = ["Server"]

log = logging.getLogger("dpproxy.server")


class Server:
    """dpproxy in front of one PostgreSQL database, serving many clients on one event loop."""

    def __init__(self, policy: Policy, registry: TableRegistry, database: str):
        self.policy = policy
        self.registry = registry
        self.database = database
        self.budget = BudgetKeeper.open(policy)
        self.audit = AuditLog.from_config(policy.audit)
        self.tls = _tls_context(policy)
        self.repeats: RepeatCache[tuple[ResultSet, str]] = RepeatCache(
            policy.repeats.ttl_s, policy.repeats.max_entries, policy.repeats.enabled
        )
        self._sessions: dict[int, Session] = {}
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def create(cls, policy: Policy) -> "Server":
        """Connect to the backend once to resolve the policy's tables and learn its database."""
        backend = await connect(policy)
        try:
            registry = await build_registry(backend, policy)
            database = backend.conn.info.dbname
        finally:
            await backend.close()
        return cls(policy, registry, database)

    async def start(self, host: str | None = None, port: int | None = None) -> tuple[str, int]:
        """Start listening; return the bound (host, port) (port 0 picks a free one)."""
        listen = self.policy.listen
        self._server = await asyncio.start_server(
            self._accept, host or listen.host, listen.port if port is None else port, limit=2**20
        )
        sockname = self._server.sockets[0].getsockname()
        log.info("dpproxy listening on %s:%s for database %s", sockname[0], sockname[1], self.database)
        return sockname[0], sockname[1]

    async def serve_forever(self) -> None:
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    async def close(self) -> None:
        """Stop accepting, then end every session."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.budget.close()
        self.audit.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await Session(self, reader, writer).run()
        finally:
            self._tasks.discard(task)

    # ------------------------------------------------------------ sessions

    def register(self, session: Session) -> None:
        self._sessions[session.pid] = session

    def unregister(self, session: Session) -> None:
        if self._sessions.get(session.pid) is session:
            del self._sessions[session.pid]

    async def cancel(self, pid: int, secret: int) -> None:
        """Cancel the backend query of the session with this key, if the secret matches."""
        session = self._sessions.get(pid)
        if session is not None and session.secret == secret:
            await session.cancel()

    @property
    def session_count(self) -> int:
        return len(self._sessions)


def _tls_context(policy: Policy) -> ssl.SSLContext | None:
    """The server-side TLS context for client connections, if the policy configures one."""
    tls = policy.listen.tls
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.cert, tls.key)
    return context
