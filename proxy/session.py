"""One client connection, from the startup packet to Terminate.

Data flows one way: protocol bytes in → rewriter (split, resolve, classify) →
policies/budget → backend → mechanisms → protocol bytes out.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import TYPE_CHECKING

from policies.errors import SQLSTATE, Refusal
from rewriter.classify import DPQuery, DpproxyCommand, Passthrough, classify
from rewriter.rewrite import backend_sql
from rewriter.statements import Statement, split_statements

from . import protocol
from .answer import release_row
from .auth import authenticate
from .backend import BackendError, BackendSession, ResultSet, connect
from .protocol import ProtocolError

if TYPE_CHECKING:
    from .server import Server

__all__ = ["Session"]

log = logging.getLogger("dpproxy.session")

_SESSION_CHANGING = {"VariableSetStmt", "DiscardStmt"}


class Session:
    """Serves one client: authenticates it, then answers its queries until it leaves."""

    def __init__(self, server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.pid = secrets.randbelow(2**31 - 1) + 1
        self.secret = secrets.randbits(31)
        self.user = ""
        self.backend: BackendSession | None = None
        self.peer = _peer(writer)
        self._reported: dict[str, str] = {}

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        try:
            startup = await self._negotiate()
            if startup is None:
                return
            await self._start(startup)
            await self._serve()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away; nothing to answer
        except asyncio.CancelledError:
            await self._fatal(SQLSTATE.ADMIN_SHUTDOWN, "terminating connection due to administrator command")
        except ProtocolError as exc:
            await self._fatal(exc.sqlstate, exc.message)
        except Refusal as exc:
            await self._fatal(exc.sqlstate, exc.message, exc.hint)
        except BackendError as exc:
            await self._fatal(exc.sqlstate, f"backend: {exc.message}", exc.hint)
        except Exception:
            log.exception("session %s failed", self.peer)
            await self._fatal(SQLSTATE.INTERNAL_ERROR, "internal error in dpproxy")
        finally:
            await self._close()

    async def _negotiate(self) -> protocol.Startup | None:
        """Answer SSL/GSSENC requests with 'N' until the StartupMessage (None: a CancelRequest)."""
        limit = self.server.policy.listen.max_message_bytes
        for _ in range(3):
            startup = await protocol.read_startup(self.reader, limit)
            if startup.code in (protocol.SSL_REQUEST, protocol.GSSENC_REQUEST):
                self.writer.write(protocol.SSL_NOT_SUPPORTED)
                await self.writer.drain()
                continue
            if startup.code == protocol.CANCEL_REQUEST:
                await self.server.cancel(startup.cancel_pid, startup.cancel_secret)
                return None
            return startup
        raise ProtocolError("too many SSL/GSSENC requests")

    async def _start(self, startup: protocol.Startup) -> None:
        params = startup.parameters
        self.user = params.get("user", "")
        if not self.user:
            raise Refusal(SQLSTATE.INVALID_AUTHORIZATION, "no PostgreSQL user name specified in startup packet")
        policy = self.server.policy
        await authenticate(
            self.reader, self.writer, self.user, policy.users.get(self.user), policy.listen.max_message_bytes
        )
        database = params.get("database") or self.user
        if database != self.server.database:
            raise Refusal(
                SQLSTATE.INVALID_CATALOG_NAME,
                f'database "{database}" does not exist',
                f'dpproxy serves the database "{self.server.database}".',
            )
        self.backend = await connect(policy, params)
        self._reported = self._client_parameters()
        out = [protocol.parameter_status(k, v) for k, v in self._reported.items()]
        out.append(protocol.backend_key_data(self.pid, self.secret))
        out.append(protocol.ready_for_query(b"I"))
        self.writer.write(b"".join(out))
        await self.writer.drain()
        self.server.register(self)
        log.info("session %s user=%s connected", self.peer, self.user)

    def _client_parameters(self) -> dict[str, str]:
        assert self.backend is not None
        values = self.backend.reported_parameters()
        # The client sees itself, not the service role dpproxy uses on the backend.
        values["session_authorization"] = self.user
        values["is_superuser"] = "off"
        return values

    async def _close(self) -> None:
        self.server.unregister(self)
        if self.backend is not None:
            try:
                await self.backend.close()
            except Exception:  # pragma: no cover - best effort on teardown
                log.debug("closing backend failed", exc_info=True)
        try:
            self.writer.close()
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass

    async def _fatal(self, sqlstate: str, message: str, hint: str | None = None) -> None:
        try:
            self.writer.write(protocol.error_response(sqlstate, message, hint, severity="FATAL"))
            await self.writer.drain()
        except (ConnectionError, OSError):
            pass

    # ------------------------------------------------------------ message loop

    async def _serve(self) -> None:
        limit = self.server.policy.listen.max_message_bytes
        while True:
            kind, payload = await protocol.read_message(self.reader, limit)
            if kind == b"Q":
                await self._simple_query(protocol.decode_cstring(payload, "Query"))
            elif kind == b"X":
                return
            elif kind in (b"d", b"c", b"f"):
                continue  # stray COPY data outside COPY is ignored, as PostgreSQL does
            elif kind == b"F":
                self._write_error(SQLSTATE.FEATURE_NOT_SUPPORTED, "the FunctionCall message is not supported by dpproxy")
                self.writer.write(protocol.ready_for_query(self._status()))
            elif kind in (b"P", b"B", b"D", b"E", b"C", b"S", b"H"):
                self._write_error(
                    SQLSTATE.FEATURE_NOT_SUPPORTED,
                    "the extended query protocol is not supported yet by dpproxy",
                    "Use the simple query protocol (e.g. psql, or psycopg without parameters).",
                )
                if kind == b"S":
                    self.writer.write(protocol.ready_for_query(self._status()))
            else:
                raise ProtocolError(f"invalid frontend message type {kind!r}")
            await self.writer.drain()

    def _status(self) -> bytes:
        return self.backend.transaction_status if self.backend is not None else b"I"

    async def _simple_query(self, sql: str) -> None:
        try:
            statements = split_statements(sql)
        except Refusal as exc:
            self._write_refusal(exc)
            statements = None
        if statements == ():
            self.writer.write(protocol.empty_query_response())
        for statement in statements or ():
            try:
                result, notices = await self._execute(statement)
            except Refusal as exc:
                self._write_refusal(exc)
                break
            except BackendError as exc:
                self._write_error(exc.sqlstate, exc.message, exc.hint, exc.detail)
                break
            self._write_result(result, notices)
        self.writer.write(protocol.ready_for_query(self._status()))

    async def _execute(self, statement: Statement) -> tuple[ResultSet, list[str]]:
        assert self.backend is not None
        refs = statement.references.relations
        resolved = await self.backend.resolve(refs) if refs else {}
        decision = classify(statement, resolved, self.server.registry)
        if isinstance(decision, DPQuery):
            return await self._answer_dp(decision)
        if isinstance(decision, DpproxyCommand):
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                f"{decision.verb.upper()} {decision.name} is not supported yet",
                rule="dpproxy-command",
            )
        assert isinstance(decision, Passthrough)
        result = await self.backend.passthrough(decision.sql)
        if statement.kind in _SESSION_CHANGING:
            self._report_changed_parameters()
        return result, result.notices

    async def _answer_dp(self, decision: DPQuery) -> tuple[ResultSet, list[str]]:
        assert self.backend is not None
        plan = decision.plan
        epsilon = self.server.query_epsilon(self.user, plan.table)
        if plan.limit_zero:
            answer = release_row(plan, (), epsilon)
            return answer.result, []
        try:
            exact = await self.backend.fetch_row(backend_sql(plan))
        except BackendError as exc:
            raise _sanitised(exc) from None
        answer = release_row(plan, exact, epsilon)
        return answer.result, [answer.notice()]

    def _report_changed_parameters(self) -> None:
        current = self._client_parameters()
        for name, value in current.items():
            if self._reported.get(name) != value:
                self.writer.write(protocol.parameter_status(name, value))
        self._reported = current

    # ------------------------------------------------------------ writing

    def _write_result(self, result: ResultSet, notices: list[str]) -> None:
        out = [protocol.notice_response(text) for text in notices]
        if result.fields:
            out.append(protocol.row_description(result.fields))
            out.extend(protocol.data_row(row) for row in result.rows)
        out.append(protocol.command_complete(result.tag))
        self.writer.write(b"".join(out))

    def _write_refusal(self, exc: Refusal) -> None:
        self._write_error(exc.sqlstate, exc.message, exc.hint)

    def _write_error(self, sqlstate: str, message: str, hint: str | None = None, detail: str | None = None) -> None:
        self.writer.write(protocol.error_response(sqlstate, message, hint, detail))

    async def cancel(self) -> None:
        if self.backend is not None:
            await self.backend.cancel()


def _sanitised(exc: BackendError) -> Refusal:
    """A backend failure during a DP query, without any detail that could depend on the data."""
    if exc.sqlstate == SQLSTATE.QUERY_CANCELED:
        return Refusal(SQLSTATE.QUERY_CANCELED, "canceling statement due to user request or statement timeout")
    if exc.sqlstate.startswith("42"):
        # Errors found while planning (unknown column, type mismatch) depend on the schema
        # and the statement only, never on the rows.
        return Refusal(exc.sqlstate, exc.message, exc.hint)
    return Refusal(
        SQLSTATE.DP_BACKEND_FAILURE,
        "the backend failed to compute this DP aggregate",
        "The error's details are withheld because they could depend on protected rows.",
    )


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer or "local")
