"""The listening server: accepts clients, holds the policy in force, routes cancel requests.

Lifecycle: ``create`` checks the policy against the backend, ``start`` listens (and serves
metrics if the policy asks), ``reload`` puts a changed policy in force without dropping
connections (SIGHUP), ``close`` shuts down gracefully (SIGTERM).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import ssl
from dataclasses import replace
from pathlib import Path
from typing import Final

import psycopg
import sqlalchemy as sa

from policies.loader import PolicyError, load_policy
from policies.model import Policy
from policies.tables import TableRegistry, quote_identifier
from proxy.backend.connection import BackendError, build_registry, connect, function_names
from proxy.backend.column_facts import redefined
from proxy.backend.grants import unreadable
from proxy.backend.row_failures import fallible_protected
from proxy.backend.partition_fit import usefulness_warnings
from proxy.backend.relation_reads import public_leaking
from proxy.backend.pool import BackendPool
from proxy.dp.answer import DPAnswer
from proxy.dp.budget import BudgetKeeper
from proxy.dp.repeats import RepeatCache, RepeatStore, SharedRepeatCache
from proxy.ops import metrics
from proxy.ops.audit import AuditLog
from proxy.wire import protocol

from . import startup
from .bound_port import start_on_one_port
from .session import Session, SessionTable
from .workers import CancelRelay, ReservationRelay, WorkerRole

__all__ = ["Server"]

log = logging.getLogger("dpproxy.server")

FUNCTION_NAMES_REFRESH_S: Final = 10.0
"""How often each process reads the backend's function names again, and checks again that no
public relation reads a protected one, that the service role still reads every protected one
and that every protected one is defined as when the policy was loaded (Server._watch_function_names)."""


class Server:
    """dpproxy in front of one PostgreSQL database, serving many clients on one event loop.

    ``worker``: this server is one of ``listen.workers`` processes sharing the port, the
    repeat store and cancel routing (``proxy.serving.workers``); None: the only one.
    """

    def __init__(self, policy: Policy, registry: TableRegistry, database: str, worker: WorkerRole | None = None):
        """Load the TLS files, open the ledger and the audit log; StartupError if one fails."""
        self.policy = policy
        self.worker = worker
        self.registry = registry
        self.database = database
        try:
            self.tls = _tls_context(policy)
        except OSError as exc:  # ssl.SSLError is one too
            assert policy.listen.tls is not None
            raise startup.tls_failure(policy.listen.tls, exc) from exc
        try:
            self.budget = BudgetKeeper.open(policy)
        except (ValueError, OSError, sa.exc.SQLAlchemyError) as exc:
            raise startup.ledger_failure(policy.ledger, exc) from exc
        try:
            self.audit = AuditLog.from_config(policy.audit)
        except OSError as exc:
            self.budget.close()
            raise startup.audit_failure(policy.audit.path or "", exc) from exc
        self.repeats: RepeatStore[DPAnswer]
        settings = policy.repeats
        if worker is None:
            self.repeats = RepeatCache(settings.ttl_s, settings.max_entries, settings.enabled)
        else:
            self.repeats = SharedRepeatCache(worker.repeats_path, settings.ttl_s, settings.max_entries,
                                             settings.enabled)
        self.metrics: metrics.MetricsEndpoint | None = None
        self.startup_reports: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        self.sessions = SessionTable(None if worker is None else worker.index)
        self.cancel_relay: CancelRelay | None = None
        self.reservation_relay: ReservationRelay | None = None
        if worker is not None:
            self.cancel_relay = CancelRelay(worker, self.sessions.cancel_here)
            self.sessions.forward = self.cancel_relay.forward
            self.reservation_relay = ReservationRelay(worker, self.budget.give_back)
            self.budget.settle_elsewhere = self.reservation_relay.settle_siblings
        # Backend connections every session borrows from; reads the backend settings in force.
        self.pool = BackendPool(lambda: self.policy.backend)
        self._server: asyncio.base_events.Server | None = None
        self._connections: dict[asyncio.Task[None], Session] = {}
        self._closing = False
        self._hurry = asyncio.Event()
        self._reloading = asyncio.Lock()
        self._misfit: list[str] = []  # the problems of the last failed re-resolution (_resolve_again)
        self._gauges: asyncio.Task[None] | None = None
        self._functions: asyncio.Task[None] | None = None

    @classmethod
    async def create(cls, policy: Policy, worker: WorkerRole | None = None) -> "Server":
        """Connect to the backend once to resolve the policy's tables and learn its database.

        Raises PolicyError if the policy does not fit the backend, StartupError if the
        backend cannot be reached or a resource the policy names cannot be opened.
        """
        try:
            registry, database = await _resolve(policy, report=False)
        except (psycopg.Error, BackendError) as exc:
            raise startup.backend_failure(policy.backend, exc) from exc
        return cls(policy, registry, database, worker)

    async def start(self, host: str | None = None, port: int | None = None) -> tuple[str, int]:
        """Start listening (and the metrics endpoint, if configured); return the bound (host, port).

        ``host`` and ``port`` override the policy's (command-line options). Port 0 picks a
        free one, the same on every address of the host (``bound_port``). Raises StartupError
        if an address cannot be bound. A worker binds with SO_REUSEPORT beside its siblings and
        leaves the metrics endpoint to its supervisor.
        """
        listen = self.policy.listen
        if self.cancel_relay is not None:
            await self.cancel_relay.start()
        if self.reservation_relay is not None:
            await self.reservation_relay.start()
        if self.policy.metrics is not None and self.worker is None:
            where = self.policy.metrics
            try:
                self.metrics = metrics.MetricsEndpoint(where.host, where.port)
            except OSError as exc:
                raise startup.metrics_failure(where.host, where.port, exc) from exc
        bind_host, bind_port = host or listen.host, listen.port if port is None else port
        try:
            self._server = await start_on_one_port(self._accept, bind_host, bind_port, limit=2**20,
                                                   reuse_port=True if self.worker else None)
        except OSError as exc:
            self._close_metrics()
            raise startup.listen_failure(bind_host, bind_port, exc, host is not None, port is not None) from exc
        sockname = self._server.sockets[0].getsockname()
        # What exists now (imported modules, the policy: over 100,000 objects) lives as long as
        # the process. Out of the collector's reach, it is not walked by every full collection,
        # which holds the interpreter (and so every session) for as long as the walk takes; a
        # long statement's analysis set off a dozen of them, of ~200 ms each.
        gc.freeze()
        if self.worker is None:
            log.info("dpproxy listening on %s:%s for database %s", sockname[0], sockname[1], self.database)
        else:
            log.info("worker %d listening on %s:%s", self.worker.index, sockname[0], sockname[1])
            self._gauges = asyncio.create_task(_write_gauges())
        self._functions = asyncio.create_task(self._watch_function_names())
        return sockname[0], sockname[1]

    async def _watch_function_names(self) -> None:
        """Read the backend's function names again every FUNCTION_NAMES_REFRESH_S.

        ``x.f`` calls a function ``f(x)`` when ``x`` has no field ``f`` (attribute notation), so
        a name after a dot is checked against the allowlist when it is a function's name
        (rewriter.function_check). A function created after startup (an extension installed,
        ``pgstattuple`` say) would otherwise pass as a field name until the next reload.

        The same look checks again what start and reload check of public relations: a view
        redefined to read a protected table (``CREATE OR REPLACE VIEW``), a protected table made
        an inheritance child of a public one (``ALTER TABLE ... INHERIT``) or a partition of it
        attached since would pass its rows through, exactly. Such a public relation leaves the
        registry (default-deny) until a reload puts a policy in force that the backend fits.

        And that the service role still reads every protected table: with its SELECT revoked,
        each DP query on the table would be charged and then fail with 42501. Such a table is
        marked unreadable in the registry (statements on it are refused before the charge,
        rewriter.classify) until a look finds the privilege back.

        And that no protected view has been redefined to compute something that can fail on a
        row (proxy.backend.row_failures): its statements are refused before the charge until a
        look finds the view total again.

        And that every protected table's columns are as the registry was built from
        (proxy.backend.column_facts): a table altered or dropped since would be judged by facts no
        longer true, so the policy in force is resolved again (``_resolve_again``); where it no longer
        fits, the table's statements are refused before the charge until a reload (or a look finds
        the definition back as loaded).
        """
        while True:
            await asyncio.sleep(FUNCTION_NAMES_REFRESH_S)
            registry = self.registry
            try:
                backend = await connect(self.policy, report=False)  # of its own for a moment: no pool slot kept
                try:
                    names = await function_names(backend)
                    leaking = await public_leaking(backend, registry.by_oid)
                    lost = await unreadable(backend, registry.by_oid)
                    fallible = await fallible_protected(backend, registry.by_oid)
                    changed = await redefined(backend, registry.definitions)
                finally:
                    await backend.close()
            except (BackendError, psycopg.Error) as exc:
                log.debug("reading the backend's function names failed: %s", exc)
                continue
            if registry is not self.registry:
                continue  # a reload put another registry in force meanwhile: it was checked itself
            changed = {oid: change for oid, change in changed.items() if oid in registry.by_oid}
            if changed:
                again = await self._resolve_again(registry, changed)
                if again is None:
                    continue
                registry, changed = again
            for oid in sorted(leaking):
                relation = registry.by_oid[oid]
                log.error("public relation %s.%s now reads a protected table (or is its inheritance child or "
                          "partition): refused until a reload with a policy the backend fits", relation.schema,
                          relation.name)
            if leaking:
                registry = replace(registry, by_oid={oid: relation for oid, relation in registry.by_oid.items()
                                                     if oid not in leaking})
            if names != registry.function_names:
                registry = replace(registry, function_names=names)
            if lost != registry.unreadable:
                _log_grant_changes(registry, lost)
                registry = replace(registry, unreadable=lost)
            if fallible != registry.fallible:
                for oid in fallible.keys() - registry.fallible.keys():
                    log.error("protected relation %s now reads through %s: refused until it is gone",
                              registry.by_oid[oid].display_name, fallible[oid])
                registry = replace(registry, fallible=fallible)
            if changed != registry.redefined:
                _log_definition_changes(registry, changed)
                registry = replace(registry, redefined=changed)
            if registry is not self.registry:
                self.registry = registry
                self._plans_stale()  # a statement prepared before would run as it was judged

    async def _resolve_again(
        self, registry: TableRegistry, changed: dict[int, str]
    ) -> tuple[TableRegistry, dict[int, str]] | None:
        """After DDL changed protected tables (``changed``), resolve the policy in force against the
        backend again, as a reload of the same file would: None if it still fits and the new
        registry is in force, so that a migration (``ADD COLUMN``, ``integer`` made ``bigint``)
        needs no signal. If it no longer fits (the reason logged), each changed table is resolved
        again on its own (:meth:`_resolve_alone`): ``registry`` with those that fit taken in, and
        the changes of those that do not, which stay refused until a reload of a policy that fits
        (``bounds`` on a column made text). A problem elsewhere (another table's SELECT revoked)
        thus no longer keeps a harmlessly altered table refused. Tried at every look while a
        table differs (a table may be altered again into one that fits); the same problems are
        logged once."""
        async with self._reloading:
            if registry is not self.registry:
                return None  # a reload put another registry in force meanwhile
            try:
                fresh, database = await _resolve(self.policy, report=False)
            except PolicyError as exc:
                if exc.problems != self._misfit:
                    for problem in exc.problems:
                        log.error("after a change of a protected table, the policy in force no longer fits: %s",
                                  problem)
                self._misfit = exc.problems
                return await self._resolve_alone(registry, changed)
            except (psycopg.Error, BackendError) as exc:
                log.debug("resolving the policy again failed: %s", exc)
                return registry, changed
            if database != self.database:
                return registry, changed
            for oid, change in changed.items():
                log.warning("protected table %s changed (%s): the policy in force was resolved against it "
                            "again and still fits; answering by its new definition", registry.by_oid[oid].display_name,
                            change)
            self.registry, self._misfit = fresh, []
            self._plans_stale()
            return None

    async def _resolve_alone(
        self, registry: TableRegistry, changed: dict[int, str]
    ) -> tuple[TableRegistry, dict[int, str]]:
        """``registry`` with each changed table the policy in force still fits taken in, resolved
        by the policy of that table alone; and the changes left. A table alone gets every check
        the whole policy's resolution makes of it (its columns against the policy, its labels,
        its partitioning, that the service role reads it, that it computes nothing that can
        fail on a row); what involves other relations, public ones that read it, the look
        checks of the registry anyway. Taken in only under its own OID: a table dropped and
        created again is answered after a resolution of the whole policy, or a reload."""
        left = dict(changed)
        for oid in changed:
            relation = registry.by_oid[oid]
            name = next((key for key, table in self.policy.tables.items() if table is relation.policy), None)
            if name is None:
                continue
            try:
                alone, database = await _resolve(self.policy.model_copy(update={"tables": {name: relation.policy}}),
                                                 report=False)
            except (PolicyError, psycopg.Error, BackendError):
                continue  # its own problems were logged with the whole policy's
            if database != self.database or oid not in alone.by_oid:
                continue
            registry = replace(registry, by_oid={**registry.by_oid, oid: alone.by_oid[oid]},
                               definitions={**registry.definitions, oid: alone.definitions[oid]})
            log.warning("protected table %s changed (%s): the policy of that table was resolved against it again "
                        "and still fits; answering by its new definition (the policy's other problems are logged "
                        "above)", relation.display_name, left.pop(oid))
        return registry, left

    async def reload(self, path: str | Path) -> bool:
        """Put the policy at ``path`` in force; True if it was, False if it was refused.

        The new policy is validated and checked against the backend first; any problem is
        logged (file:line: key: what) and the policy in force stays. Open connections keep
        running: each statement reads the policy and table registry in force when it is
        planned, plans made earlier (prepared statements) are planned again, and sessions of
        users the new policy no longer lists end with 57P01 after their current statement.
        The audit log is reopened (log rotation). listen.host/port, ledger and metrics
        changes take effect at the next restart; that is logged.
        """
        async with self._reloading:  # one at a time: the last file read is the one in force
            try:
                prepared = await self._prepare(Path(path))
            except PolicyError as exc:
                for problem in exc.problems:
                    log.error("reload refused: %s", problem)
                log.error("policy %s was not reloaded; the policy in force is unchanged", path)
                metrics.policy_reloaded(False)
                return False
            self._apply(*prepared)
        metrics.policy_reloaded(True)
        log.info("policy %s reloaded: %d user(s), %d table(s)", path, len(self.policy.users), len(self.policy.tables))
        return True

    async def _prepare(self, path: Path) -> tuple[Policy, TableRegistry, ssl.SSLContext | None, AuditLog | None]:
        """Everything a reload swaps in, or PolicyError saying why not; changes nothing."""
        # In a thread: loading derives each password user's SCRAM keys (PBKDF2, milliseconds
        # each), which must not stall the sessions being served.
        policy = await asyncio.to_thread(load_policy, path)
        try:
            registry, database = await _resolve(policy)
        except PolicyError as exc:
            raise PolicyError([f"{path}: {problem}" for problem in exc.problems]) from None
        except (psycopg.Error, BackendError) as exc:
            raise PolicyError([f"{path}: backend: {str(exc).strip()}"]) from None
        if database != self.database:
            raise PolicyError([f"{path}: backend: the database changed from {self.database} to {database}; "
                               "that takes a restart"])
        try:
            tls = _tls_context(policy)
            audit = AuditLog.from_config(policy.audit) if policy.audit != self.policy.audit else None
        except OSError as exc:  # ssl.SSLError is one too
            raise PolicyError([f"{path}: {exc}"]) from None
        return policy, registry, tls, audit

    def _apply(self, policy: Policy, registry: TableRegistry, tls: ssl.SSLContext | None, audit: AuditLog | None) -> None:
        """Swap in a checked policy (no awaits: no statement sees half of it)."""
        for key in _restart_only_changes(self.policy, policy):
            log.warning("policy reload: %s changed; that takes effect when dpproxy restarts", key)
        self.policy, self.registry, self.tls, self._misfit = policy, registry, tls, []
        self.budget.policy = policy
        self.repeats.enabled = policy.repeats.enabled
        self.repeats.ttl_s = policy.repeats.ttl_s
        self.repeats.max_entries = policy.repeats.max_entries
        if audit is None:
            self.audit.reopen()
        else:
            self.audit, old_audit = audit, self.audit
            old_audit.close()
        self._plans_stale()
        for session in self.sessions:
            if session.user not in policy.users:
                session.shut_down()

    def _plans_stale(self) -> None:
        """Every session plans its statements again: those made under the registry (or policy)
        that was in force until now may be judged otherwise under the one in force now."""
        for session in self.sessions:
            if session.executor is not None:
                session.executor.generation += 1

    async def serve_forever(self) -> None:
        assert self._server is not None
        async with self._server:
            await self._server.serve_forever()

    def stop_accepting(self) -> None:
        """Refuse new connections from now on (the first step of :meth:`close`)."""
        self._closing = True
        if self._server is not None:
            self._server.close()

    async def close(self, grace_s: float = 0.0) -> None:
        """Shut down: stop accepting, let running statements finish, end every session.

        New connections are refused at once. Sessions waiting for a message end at once with
        FATAL 57P01; a session handling a message answers it first, then gets 57P01. After
        ``grace_s`` seconds (or ``hurry``) the statements still running are cancelled on the
        backend and their sessions end with 57P01. Then the ledger, the audit log and the
        metrics endpoint are closed, and the queued metric observations applied.
        """
        self.stop_accepting()
        for session in list(self._connections.values()):
            session.shut_down()
        if self._connections:
            finished = asyncio.ensure_future(asyncio.wait(list(self._connections)))
            hurry = asyncio.ensure_future(self._hurry.wait())
            await asyncio.wait({finished, hurry}, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
            finished.cancel()
            hurry.cancel()
        await self._cut_off(list(self._connections.items()))
        if self._server is not None:
            await self._server.wait_closed()
        await self.pool.close()
        if self.cancel_relay is not None:
            await self.cancel_relay.close()
        if self.reservation_relay is not None:
            await self.reservation_relay.close()
        for task in (self._gauges, self._functions):
            if task is not None:
                task.cancel()
        self.repeats.close()
        self._close_metrics()
        await self.budget.settle()
        self.budget.close()
        self.audit.close()
        metrics.flush()  # a worker's last observations, for its supervisor's /metrics

    def hurry(self) -> None:
        """End the grace period of a running ``close`` now (a second SIGTERM or Ctrl-C)."""
        self._hurry.set()

    async def _cut_off(self, late: list[tuple[asyncio.Task[None], Session]]) -> None:
        """Cancel the backend statements of sessions still running, then end them."""
        busy = [session for _, session in late if session.busy]
        if busy:
            log.warning("grace period over: cancelling %d running statements", len(busy))
            await asyncio.wait([asyncio.ensure_future(s.cancel()) for s in busy], timeout=5)
        for task, _ in late:
            task.cancel()
        await asyncio.gather(*(task for task, _ in late), return_exceptions=True)

    def _close_metrics(self) -> None:
        if self.metrics is not None:
            self.metrics.close()
            self.metrics = None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:  # accepted just before the listener closed
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        session = Session(self, reader, writer)
        self._connections[task] = session
        try:
            await session.run()
        except asyncio.CancelledError:
            pass  # cancelled again while closing (close's cut-off): the session is over either way
        finally:
            del self._connections[task]

    @property
    def session_count(self) -> int:
        return len(self.sessions)


def _log_grant_changes(registry: TableRegistry, lost: dict[int, str]) -> None:
    """Log each protected table the service role lost SELECT on since the last look, or has back."""
    for oid, role in lost.items():
        if oid not in registry.unreadable:
            table, grantee = registry.by_oid[oid], quote_identifier(role)
            log.error("the service role %s lost SELECT on protected table %s: statements on it are refused "
                      "until GRANT SELECT ON %s TO %s", grantee, table.display_name, table.qualified_name, grantee)
    for oid in registry.unreadable:
        if oid not in lost:
            log.info("the service role reads protected table %s again: answering it again",
                     registry.by_oid[oid].display_name)


def _log_definition_changes(registry: TableRegistry, changed: dict[int, str]) -> None:
    """Log each protected table whose definition changed since the last look, or is back as loaded."""
    for oid, change in changed.items():
        if registry.redefined.get(oid) != change:
            log.error("protected table %s changed since the policy was loaded: %s; its statements are refused "
                      "until a reload (SIGHUP) of a policy that fits it", registry.by_oid[oid].display_name, change)
    for oid in registry.redefined:
        if oid not in changed:
            log.info("protected table %s is defined as when the policy was loaded again: answering it again",
                     registry.by_oid[oid].display_name)


async def _write_gauges() -> None:
    """A worker's callback gauges, written every second for its supervisor's /metrics."""
    while True:
        metrics.write_watched()
        await asyncio.sleep(1.0)


async def _resolve(policy: Policy, report: bool = True) -> tuple[TableRegistry, str]:
    """The policy's tables resolved on its backend, and the backend's database name
    (``report``: see ``backend.connect``)."""
    backend = await connect(policy, report=report)
    try:
        registry = await build_registry(backend, policy)
        for warning in await usefulness_warnings(backend, registry, policy):
            log.warning("policy: %s", warning)
        return registry, (await backend.connection()).info.dbname
    finally:
        await backend.close()


def _restart_only_changes(old: Policy, new: Policy) -> list[str]:
    """The policy keys whose change a reload cannot apply to a running process."""
    changed = []
    if (old.listen.host, old.listen.port) != (new.listen.host, new.listen.port):
        changed.append("listen.host/listen.port")
    if old.ledger != new.ledger:
        changed.append("ledger")
    if old.metrics != new.metrics:
        changed.append("metrics")
    if old.listen.workers != new.listen.workers:
        changed.append("listen.workers")
    return changed


def _tls_context(policy: Policy) -> ssl.SSLContext | None:
    """The server-side TLS context for client connections, if the policy configures one."""
    tls = policy.listen.tls
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # Chosen when the client offers it (libpq 17 does, after an SSLRequest too): a direct TLS
    # client that did not is refused (Session._direct_tls).
    context.set_alpn_protocols([protocol.TLS_ALPN])
    context.load_cert_chain(tls.cert, tls.key)
    return context
