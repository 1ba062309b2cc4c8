"""The extended query protocol: Parse, Bind, Describe, Execute, Close, Sync, Flush.

Keeps the per-connection registry of named and unnamed prepared statements and portals,
and PostgreSQL's error rule: after an error, every message up to the next Sync is
discarded. Statements are classified once, at Parse; a portal's result is computed at
its first Describe or Execute and then handed out in Execute's row-limited pieces
(PortalSuspended), so a statement's result types never change between Describe and
Execute. A large passthrough result is handed out as it arrives (``RowStream``): a portal
dropped before its end (Close, Sync outside a block, a new unnamed portal) abandons the rest.
Inside a transaction block, a passthrough SELECT's portal that is named, or first executed
with a row limit, runs on the backend as a cursor of its own instead, a FETCH per Execute
(``BackendPortal``): only as far as the client reads it, as on PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from policies.errors import SQLSTATE, Refusal
from proxy.backend.connection import BackendError, BackendLost, BoundParams, ResultSet
from proxy.serving.backend_portals import BackendPortal
from proxy.wire import protocol
from proxy.wire.binary import UnsupportedBinaryType
from proxy.wire.protocol import Field, ProtocolError

__all__ = ["MAX_HELD", "MAX_HELD_BYTES", "ExtendedProtocol", "PreparedStatement", "Runner"]

# What one session may keep in prepared statements and portals (their texts, parse trees and
# bound parameter values) until Close, DEALLOCATE or, for portals, a Sync outside a
# transaction block. It lives in the process every session shares: unbounded, 100 Binds of 4 MB kept
# 434 MB. Drivers' statement caches keep a few hundred short statements.
MAX_HELD = 10_000
MAX_HELD_BYTES = 64 * 1024 * 1024

# What the runner made of a statement (proxy.executor.Plan); opaque to this module.
Plan = Any


@dataclass
class PreparedStatement:
    """A parsed statement: its text, declared parameter types, and what the runner made of it
    (``plan_bytes``: about the memory that keeps, Runner.plan_bytes)."""

    text: str
    param_types: tuple[int, ...]
    plan: Plan
    description: tuple[list[int], list[Field] | None] | None = None
    plan_bytes: int = 0

    @property
    def size(self) -> int:
        return len(self.text) + self.plan_bytes


@dataclass
class Portal:
    """A bound statement, its result once computed, and how many rows Execute has sent."""

    statement: PreparedStatement
    params: BoundParams
    result_formats: tuple[int, ...]
    result: ResultSet | None = None
    cursor: BackendPortal | None = None  # its rows come from a backend cursor, a FETCH per Execute
    sent: int = 0
    notices: list[str] = field(default_factory=list)

    @property
    def size(self) -> int:
        # A parameter keeps its value and some 64 bytes of its own: 65,535 empty ones are 4 MiB.
        return sum(len(value) for value in self.params.values if value is not None) + 64 * len(self.params.values)


_Held = TypeVar("_Held", PreparedStatement, Portal)


class Runner(Protocol):
    """What the extended protocol needs from statement execution (proxy.executor)."""

    async def prepare(self, text: str) -> Plan: ...

    def parameter_count(self, plan: Plan) -> int:
        """The highest ``$n`` the planned statement refers to (0: none)."""
        ...

    def plan_bytes(self, plan: Plan) -> int:
        """About the memory ``plan`` keeps (its parse tree): what a prepared statement holds."""
        ...

    async def describe(self, plan: Plan, param_types: tuple[int, ...]) -> tuple[list[int], list[Field] | None]: ...

    async def known_fields(self, plan: Plan, result_formats: tuple[int, ...]) -> list[Field] | None:
        """The columns if they are known without running the statement (DP answers), else None."""
        ...

    async def cursor_fields(self, name: str) -> list[Field] | None:
        """The columns of SQL cursor ``name`` (None: there is none)."""
        ...

    def has_cursor(self, name: str) -> bool:
        """Whether the session has SQL cursor ``name`` (DECLARE): in PostgreSQL a cursor is a
        portal, and a Bind cannot name a portal after it."""
        ...

    async def run(
        self, plan: Plan, params: BoundParams, result_formats: tuple[int, ...]
    ) -> tuple[ResultSet, list[str]]: ...

    async def open_portal(
        self, plan: Plan, params: BoundParams, result_formats: tuple[int, ...]
    ) -> BackendPortal | None:
        """The portal run in pieces as a backend cursor, declared now; None: run it whole."""
        ...

    async def fetch_portal(
        self, portal: BackendPortal, limit: int, result_formats: tuple[int, ...]
    ) -> tuple[ResultSet, list[str]]:
        """One Execute's rows of a backend portal (``limit`` at most, 0: the rest)."""
        ...

    def drop_portal(self, portal: BackendPortal) -> None:
        """A backend portal's client portal is gone: its cursor is closed on the backend."""
        ...

    def transaction_status(self) -> bytes: ...


class ExtendedProtocol:
    """Handles one connection's extended-protocol messages, writing replies to ``out``."""

    def __init__(self, runner: Runner, out: list[bytes], flush: Callable[[], Awaitable[None]] | None = None):
        """``flush``: sends ``out`` on when it has grown large (awaited between a stream's chunks)."""
        self.runner = runner
        self.out = out
        self.flush = flush
        self.statements: dict[str, PreparedStatement] = {}
        self.portals: dict[str, Portal] = {}
        self.skipping = False
        self._held_bytes = 0  # the sizes of everything in statements and portals

    def deallocate(self, name: str | None) -> bool:
        """DEALLOCATE name (None: ALL); False if there is no such statement."""
        if name is None:
            for statement in self.statements.values():
                self._held_bytes -= statement.size
            self.statements.clear()
            return True
        return self._forget(self.statements, name)

    def forget_unnamed(self) -> None:
        """A simple Query destroys the unnamed statement and portal, as in PostgreSQL."""
        self._forget(self.statements, "")
        self._forget(self.portals, "")

    def sync(self) -> None:
        """Sync ends error recovery; outside a transaction block the portals end too (after a
        simple Query as well: a COMMIT or ROLLBACK in it ends the block's portals)."""
        self.skipping = False
        if self.runner.transaction_status() == b"I":
            self.end_portals()

    def end_portals(self) -> None:
        """Every portal ends (its transaction does): a result not handed out whole is abandoned."""
        for name in list(self.portals):
            self._forget(self.portals, name)

    def _forget(self, held: dict[str, _Held], name: str) -> bool:
        """Drop statement or portal ``name``; False if there was none. A portal dropped before
        its result's end abandons the rest, read for nothing before the next request."""
        item = held.pop(name, None)
        if item is None:
            return False
        self._held_bytes -= item.size
        if isinstance(item, Portal) and item.result is not None and item.result.stream is not None:
            item.result.stream.abandon()
        if isinstance(item, Portal) and item.cursor is not None:
            self.runner.drop_portal(item.cursor)
        return True

    def _keep(self, held: dict[str, _Held], name: str, item: _Held) -> None:
        """Keep ``item`` as ``name`` (replacing the unnamed one); see ``_check_room``."""
        self._check_room(held, name, item.size)
        self._forget(held, name)
        held[name] = item
        self._held_bytes += item.size

    def _check_room(self, held: dict[str, _Held], name: str, size: int) -> None:
        """Refuse (54000) keeping an item of ``size`` as ``name`` if the session would then hold
        more than MAX_HELD statements and portals or MAX_HELD_BYTES."""
        replaced = held.get(name)
        count = len(self.statements) + len(self.portals) + (replaced is None)
        if count > MAX_HELD or self._held_bytes + size - (replaced.size if replaced else 0) > MAX_HELD_BYTES:
            raise Refusal(
                SQLSTATE.PROGRAM_LIMIT_EXCEEDED,
                f"too many prepared statements and portals in this session: at most {MAX_HELD}, holding at most "
                f"{MAX_HELD_BYTES // (1024 * 1024)} MiB (statement texts and parse trees, parameter values)",
                "Close (DEALLOCATE) the prepared statements and portals no longer needed; portals end at "
                "Sync outside a transaction block.",
            )

    async def handle(self, kind: bytes, payload: bytes) -> None:
        """Process one of P, B, D, E, C, H (the session answers Sync with ReadyForQuery)."""
        if kind == b"H" or self.skipping:
            return
        try:
            await self._dispatch(kind, payload)
        except Refusal as exc:
            self._fail(exc.sqlstate, exc.message, exc.hint)
        except BackendLost:
            raise  # ends the session (FATAL), as in the simple protocol
        except BackendError as exc:
            self._fail(exc.sqlstate, exc.message, exc.hint, exc.detail)
        except UnsupportedBinaryType as exc:
            self._fail(SQLSTATE.FEATURE_NOT_SUPPORTED, str(exc), "Request text format for this column.")
        except protocol.InvalidText as exc:
            self._fail(exc.sqlstate, exc.message, exc.hint)
        except ProtocolError as exc:
            # A malformed message whose length was right (a bad Describe target, a truncated
            # Bind): as PostgreSQL, the statement fails (08P01) and the session goes on.
            self._fail(exc.sqlstate, exc.message)

    def _fail(self, sqlstate: str, message: str, hint: str | None = None, detail: str | None = None) -> None:
        self.out.append(protocol.error_response(sqlstate, message, hint, detail))
        self.skipping = True

    async def _dispatch(self, kind: bytes, payload: bytes) -> None:
        if kind == b"P":
            await self._parse(protocol.decode_parse(payload))
        elif kind == b"B":
            self._bind(protocol.decode_bind(payload))
        elif kind == b"D":
            await self._describe(protocol.decode_describe(payload))
        elif kind == b"E":
            await self._execute(protocol.decode_execute(payload))
        elif kind == b"C":
            message = protocol.decode_close(payload)
            if message.kind == b"S":
                self._forget(self.statements, message.name)
            else:
                self._forget(self.portals, message.name)
            self.out.append(protocol.CLOSE_COMPLETE)
        else:  # pragma: no cover - the session only routes the kinds above here
            raise ProtocolError(f"unexpected message {kind!r}")

    async def _parse(self, message: protocol.Parse) -> None:
        if message.statement and message.statement in self.statements:
            raise Refusal("42P05", f'prepared statement "{message.statement}" already exists')
        self._check_room(self.statements, message.statement, len(message.query))  # before the analysis it would cost
        plan = await self.runner.prepare(message.query)
        prepared = PreparedStatement(message.query, message.param_types, plan, plan_bytes=self.runner.plan_bytes(plan))
        self._keep(self.statements, message.statement, prepared)
        self.out.append(protocol.PARSE_COMPLETE)

    def _bind(self, message: protocol.Bind) -> None:
        statement = self._statement(message.statement)
        if message.portal and (message.portal in self.portals or self.runner.has_cursor(message.portal)):
            raise Refusal("42P03", f'cursor "{message.portal}" already exists')  # PostgreSQL's words for both
        count = len(message.params)
        # As PostgreSQL: the statement's parameters are its declared types, or as many as its
        # highest $n if that is more. Checked here, before a DP answer could be charged.
        required = max(len(statement.param_types), self.runner.parameter_count(statement.plan))
        if count != required:
            raise Refusal(SQLSTATE.PROTOCOL_VIOLATION, f"bind message supplies {count} parameters, but prepared "
                          f'statement "{message.statement}" requires {required}')
        formats = protocol.formats_for(message.param_formats, count)
        types = statement.param_types + (0,) * max(0, count - len(statement.param_types))
        params = BoundParams(message.params, formats, types[:count])
        self._keep(self.portals, message.portal, Portal(statement, params, message.result_formats))
        self.out.append(protocol.BIND_COMPLETE)

    async def _describe(self, message: protocol.Describe) -> None:
        if message.kind == b"S":
            statement = self._statement(message.name)
            if statement.description is None:
                statement.description = await self.runner.describe(statement.plan, statement.param_types)
            params, fields = statement.description
            self.out.append(protocol.parameter_description(params))
            self.out.append(protocol.row_description(fields) if fields else protocol.NO_DATA)
            return
        if message.name not in self.portals:
            # In PostgreSQL a SQL cursor is a portal too: psycopg describes its named cursors so.
            cursor = await self.runner.cursor_fields(message.name) if message.name else None
            if cursor is not None:
                self.out.append(protocol.row_description(cursor) if cursor else protocol.NO_DATA)
                return
        portal = self._portal(message.name)
        # A DP portal describes itself without running (and so without spending budget);
        # other statements run here and Execute hands out the stored result; a named portal
        # (a client that may run it in pieces) is declared as a backend cursor if it can be.
        fields = await self.runner.known_fields(portal.statement.plan, portal.result_formats)
        backend_portal = await self._cursor(portal) if fields is None and message.name else None
        if backend_portal is not None:
            fields = backend_portal.fields
        if fields is None:
            fields = (await self._result(portal)).fields
        self.out.append(protocol.row_description(fields) if fields else protocol.NO_DATA)

    async def _execute(self, message: protocol.Execute) -> None:
        portal = self._portal(message.portal)
        begun = portal.result is not None or portal.cursor is not None
        if begun and self.runner.transaction_status() == b"E":
            # As PostgreSQL: a suspended portal hands out nothing more once its block has failed.
            raise Refusal(SQLSTATE.IN_FAILED_TRANSACTION,
                          "current transaction is aborted, commands ignored until end of transaction block")
        limit = message.max_rows
        cursor = await self._cursor(portal) if not begun and (message.portal or limit) else portal.cursor
        if cursor is not None:
            await self._execute_piece(message.portal, portal, cursor, limit)
            return
        result = await self._result(portal)
        self.out.extend(protocol.notice_response(text) for text in portal.notices)
        portal.notices.clear()
        if result.stream is not None:
            sent = await self._hand_out(result, limit)
            # As PostgreSQL: suspended once the limit is reached, even if no row is left.
            suspended = bool(limit) and sent == limit
            tag = result.stream.tag
        else:
            remaining = max(0, result.row_count - portal.sent)
            batch = result.data_rows(portal.sent, portal.sent + limit if limit else None)
            self.out.extend(batch)
            if result.copy is not None and portal.sent == 0:
                self.out.append(result.copy)
                portal.sent = 1  # a COPY has no rows; this marks its data as sent
            portal.sent += len(batch)
            sent = len(batch)
            suspended = bool(limit) and remaining >= limit
            tag = result.tag
        if suspended and result.fields:
            self.out.append(protocol.PORTAL_SUSPENDED)
        elif not result.fields and tag == "" and not result.row_count:
            self.out.append(protocol.empty_query_response())
        else:
            self.out.append(protocol.command_complete(_this_execute(tag, sent)))

    async def _execute_piece(self, name: str, portal: Portal, cursor: BackendPortal, limit: int) -> None:
        """One Execute of a portal run as a backend cursor: a FETCH of ``limit`` rows (0: the
        rest), then PortalSuspended or the SELECT's tag counting this Execute's rows."""
        try:
            result, notices = await self.runner.fetch_portal(cursor, limit, portal.result_formats)
        except BackendError as exc:
            if exc.sqlstate == "34000":  # its cursor went with a savepoint rolled back to, as the portal would
                raise Refusal("34000", f'portal "{name}" does not exist') from None
            raise
        self.out.extend(protocol.notice_response(text) for text in notices)
        if result.stream is None:
            rows = result.data_rows()
            self.out.extend(rows)
            sent = len(rows)
        else:
            try:
                sent = await self._hand_out(result, None)
            except BackendError as exc:
                cursor.failed(exc.sqlstate)
                raise
        if cursor.handed(sent, limit):
            self.out.append(protocol.PORTAL_SUSPENDED)
        else:
            self.out.append(protocol.command_complete(f"SELECT {sent}"))

    async def _hand_out(self, result: ResultSet, limit: int | None) -> int:
        """Pass a streamed result's next rows on (``limit`` at most; 0 or None: to its end),
        flushing between chunks; how many."""
        assert result.stream is not None
        sent = 0
        async for rows in result.stream.take(limit or None):
            self.out.extend(rows)
            sent += len(rows)
            if self.flush is not None:
                await self.flush()
        return sent

    async def _cursor(self, portal: Portal) -> BackendPortal | None:
        """The portal's backend cursor, declared now if the runner makes it one (None: not)."""
        if portal.cursor is None and portal.result is None:
            portal.cursor = await self.runner.open_portal(portal.statement.plan, portal.params, portal.result_formats)
        return portal.cursor

    async def _result(self, portal: Portal) -> ResultSet:
        if portal.result is None:
            portal.result, portal.notices = await self.runner.run(
                portal.statement.plan, portal.params, portal.result_formats
            )
        return portal.result

    def _statement(self, name: str) -> PreparedStatement:
        statement = self.statements.get(name)
        if statement is None:
            raise Refusal("26000", f'prepared statement "{name}" does not exist')
        return statement

    def _portal(self, name: str) -> Portal:
        portal = self.portals.get(name)
        if portal is None:
            raise Refusal("34000", f'portal "{name}" does not exist')
        return portal


def _this_execute(tag: str, sent: int) -> str:
    """A SELECT's command tag counts the rows of the Execute that ends it, as PostgreSQL's
    does (``SELECT 29000`` after a first piece of 1,000 rows of 30,000)."""
    return f"SELECT {sent}" if tag.startswith("SELECT ") else tag
