"""Connections to the backing PostgreSQL, through psycopg, as the one service role.

Each client session gets its own backend connection (session semantics: SET, search_path
and transactions behave as on PostgreSQL). Backend sessions are read-only and carry a
statement_timeout; the client's credentials never reach the backend.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Literal, Mapping, Sequence

import psycopg
from psycopg import pq
from psycopg.pq.abc import PGresult

from policies.loader import PolicyError
from policies.model import Policy
from policies.tables import ColumnInfo, Relation, TableRegistry
from proxy.ops.metrics import observe_backend
from proxy.wire.protocol import Field
from rewriter.classify import ResolvedRelation
from rewriter.references import RelationRef
from rewriter.rewrite import hashed_columns

from .policy_fit import column_fit_problems
from .result_waiter import NotSent, ResultWaiter

__all__ = [
    "BackendError", "BackendLost", "BackendSession", "BoundParams", "ResultSet", "build_registry", "connect",
    "lazy_session", "startup_key",
]

# Parameters PostgreSQL reports to clients at startup (and after a SET of one of them).
REPORTED_PARAMETERS = (
    "application_name", "client_encoding", "DateStyle", "default_transaction_read_only",
    "in_hot_standby", "integer_datetimes", "IntervalStyle", "is_superuser",
    "server_encoding", "server_version", "session_authorization",
    "standard_conforming_strings", "TimeZone",
)

# Startup parameters a client may pass on to its backend session.
_FORWARDED_STARTUP = {
    "application_name": "application_name", "client_encoding": "client_encoding",
    "datestyle": "DateStyle", "timezone": "TimeZone", "intervalstyle": "IntervalStyle",
    "extra_float_digits": "extra_float_digits", "search_path": "search_path",
}

log = logging.getLogger("dpproxy.backend")

# libpq's transaction status → ReadyForQuery's status byte (idle, and anything else, is b"I").
_STATUS_BYTE: dict[int, bytes] = {pq.TransactionStatus.INTRANS: b"T", pq.TransactionStatus.INERROR: b"E"}


class BackendError(Exception):
    """The backend refused or failed a statement; carries PostgreSQL's diagnostics."""

    def __init__(self, sqlstate: str, message: str, detail: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message
        self.detail = detail
        self.hint = hint


class BackendLost(BackendError):
    """The session's backend connection is gone: the client session must end (FATAL).

    ``reached`` is False when the statement that found the loss was never sent, so nothing
    it did can depend on the data. The SQLSTATE is 57P01 when PostgreSQL said it was
    terminating the connection (shutdown, pg_terminate_backend), else 08006. The message
    names no host, port or role; libpq's own text goes to dpproxy's log.
    """

    def __init__(self, sqlstate: str, reached: bool):
        super().__init__(
            sqlstate,
            "terminating connection because the connection to the backend database was lost",
            hint="Reconnect; session settings (SET) must be set again. "
                 "An administrator can see the cause in dpproxy's log.",
        )
        self.reached = reached


@dataclass(frozen=True)
class BoundParams:
    """A client's Bind parameters, passed to the backend as they came."""

    values: Sequence[bytes | None]
    formats: Sequence[int]
    types: Sequence[int]


@dataclass
class ResultSet:
    """A statement's result as the client will see it: columns, encoded rows, command tag."""

    fields: list[Field]
    rows: list[list[bytes | None]]
    tag: str
    notices: list[str] = field(default_factory=list)
    copy: bytes | None = None  # COPY TO STDOUT: CopyOutResponse, CopyData..., CopyDone, sent in place of rows


def _opener(policy: Policy, startup: Mapping[str, str] | None) -> Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]:
    """How to open a read-only backend connection carrying the client's safe startup parameters."""
    options = {
        "default_transaction_read_only": "on",
        "statement_timeout": str(policy.backend.statement_timeout_ms),
    }
    for key, value in (startup or {}).items():
        name = _FORWARDED_STARTUP.get(key.lower())
        if name is not None:
            options[name] = value.strip("'\"") if name == "client_encoding" else value

    async def open_connection() -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(
            policy.backend.dsn or "",
            autocommit=True,
            prepare_threshold=None,
            connect_timeout=max(1, int(policy.backend.connect_timeout_s)),
            options=" ".join(f"-c {_escape_option(k)}={_escape_option(v)}" for k, v in options.items()),
        )

    return open_connection


async def connect(
    policy: Policy, startup: Mapping[str, str] | None = None, *, report: bool = True
) -> "BackendSession":
    """A backend session whose connection is open now (its parameters are needed at once).

    A failure to connect (PostgreSQL down, too many clients …) is logged and raises
    BackendError with PostgreSQL's SQLSTATE, or 08006 when none came back. With
    ``report=False`` psycopg's own error is raised, unlogged, for a caller that tells the
    operator itself (startup, ``check-config``: ``proxy.startup.backend_failure``).
    """
    opener = _opener(policy, startup)
    try:
        return BackendSession(opener, await opener())
    except psycopg.Error as exc:
        if not report:
            raise
        raise _connect_error(exc) from None


def lazy_session(policy: Policy, startup: Mapping[str, str] | None, reported: Mapping[str, str]) -> "BackendSession":
    """A backend session that connects at its first statement.

    ``reported`` stands in for the backend's ParameterStatus values until then: the values
    an earlier connection with the same startup settings reported. Idle clients thus hold no
    PostgreSQL connection (max_connections stays for the ones that query).
    """
    return BackendSession(_opener(policy, startup), None, reported)


def startup_key(startup: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The startup settings that shape a backend session's reported parameters."""
    return tuple(sorted((k.lower(), v) for k, v in startup.items()
                        if k.lower() in _FORWARDED_STARTUP and k.lower() != "application_name"))


def _escape_option(text: str) -> str:
    return text.replace("\\", "\\\\").replace(" ", "\\ ")


class BackendSession:
    """One client's backend connection (opened on first use) and what the proxy needs from it."""

    def __init__(
        self,
        opener: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]],
        conn: psycopg.AsyncConnection[Any] | None = None,
        reported: Mapping[str, str] | None = None,
    ):
        self._open = opener
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._reported = dict(reported or {})
        self._notices: list[str] = []
        self._waiter: ResultWaiter | None = None
        if conn is not None:
            self._adopt(conn)

    def _adopt(self, conn: psycopg.AsyncConnection[Any]) -> None:
        conn.add_notice_handler(lambda diag: self._notices.append(diag.message_primary or ""))
        self._conn = conn
        self._waiter = ResultWaiter(conn.pgconn)

    async def connection(self) -> psycopg.AsyncConnection[Any]:
        """The open connection, connecting now if this is the session's first statement."""
        if self._conn is None:
            try:
                self._adopt(await self._open())
            except psycopg.Error as exc:
                raise _connect_error(exc) from None
        assert self._conn is not None
        return self._conn

    async def usable(self) -> None:
        """Connect if not yet connected; raise BackendLost (not reached) if the connection
        is known to be gone. A DP query calls this before it is charged."""
        conn = await self.connection()
        if conn.pgconn.status != pq.ConnStatus.OK:
            raise self._lost(None, reached=False)

    @property
    def transaction_status(self) -> bytes:
        """The ReadyForQuery status byte matching the backend's transaction state."""
        if self._conn is None:
            return b"I"
        # libpq's status as a plain int: conn.info would build a ConnectionInfo and an enum
        # on every call, and this runs for every ReadyForQuery.
        return _STATUS_BYTE.get(self._conn.pgconn.transaction_status, b"I")

    def reported_parameters(self) -> dict[str, str]:
        if self._conn is None:
            return dict(self._reported)
        values = {}
        for name in REPORTED_PARAMETERS:
            value = self._conn.info.parameter_status(name)
            if value is not None:
                values[name] = value
        return values

    async def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run dpproxy's own query (never a client's) and return its rows as Python values."""
        conn = await self.connection()
        assert self._waiter is not None
        self._waiter.detach()  # psycopg waits on the socket itself here
        try:
            async with conn.cursor() as cur:
                await cur.execute(sql, params or None)
                return [tuple(row) for row in await cur.fetchall()]
        except psycopg.Error as exc:
            if conn.pgconn.status != pq.ConnStatus.OK:
                raise self._lost(exc.diag.sqlstate, reached=True, cause=exc) from None
            raise _backend_error(exc) from None
        finally:
            self._waiter.attach()  # not if the connection was lost: its socket number may be reused

    async def fetch_row(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
        """Like fetch_all, for a query that returns exactly one row."""
        (row,) = await self.fetch_all(sql, params)
        return row

    async def resolve(self, refs: Iterable[RelationRef]) -> dict[RelationRef, ResolvedRelation | None]:
        """Resolve relation names to OIDs under this session's search_path, as PostgreSQL would."""
        refs = list(dict.fromkeys(refs))
        if not refs:
            return {}
        rows = await self.fetch_all(_RESOLVE_SQL, ([r.qualified for r in refs],))
        resolved: dict[RelationRef, ResolvedRelation | None] = {}
        for ref, (oid, schema, name) in zip(refs, rows):
            resolved[ref] = ResolvedRelation(int(oid), schema, name) if oid is not None else None
        return resolved

    async def execute(self, sql: str, params: BoundParams | None = None, result_format: int = 0) -> ResultSet:
        """Run one statement as sent, with the client's raw parameters, in one result format.

        Without parameters it goes as a simple Query; with them through libpq's extended
        protocol, values and their format codes passed on byte for byte.
        """
        result = await self._statement(sql, params, result_format)
        return ResultSet(_fields(result), _rows(result), _tag(result), list(self._notices))

    async def first_row(self, sql: str, params: BoundParams | None = None) -> tuple[list[bytes | None], list[int]]:
        """Run a statement like ``execute`` and return only its first row as text, with each
        column's type OID (what a DP query's exact aggregates need, and nothing more)."""
        result = await self._statement(sql, params, 0)
        columns = range(result.nfields)
        return [result.get_value(0, c) for c in columns], [result.ftype(c) for c in columns]

    async def _statement(self, sql: str, params: BoundParams | None, result_format: int) -> PGresult:
        pgconn = (await self.connection()).pgconn
        query = sql.encode("utf-8")
        if params is None and result_format == 0:
            return await self._round_trip(lambda: pgconn.send_query(query))
        p = params or BoundParams((), (), ())
        return await self._round_trip(
            lambda: pgconn.send_query_params(query, p.values, p.types or None, p.formats or None, result_format)
        )

    async def describe(self, sql: str, param_types: Sequence[int]) -> tuple[list[int], list[Field]]:
        """Parse ``sql`` on the backend without running it: its parameter types and columns."""
        pgconn = (await self.connection()).pgconn
        query = sql.encode("utf-8")
        await self._round_trip(lambda: pgconn.send_prepare(b"", query, list(param_types) or None))
        result = await self._round_trip(lambda: pgconn.send_describe_prepared(b""))
        return [result.param_type(i) for i in range(result.nparams)], _fields(result)

    async def _round_trip(self, send: Callable[[], None]) -> PGresult:
        """Send one request with libpq and wait for its single result without blocking the loop."""
        self._notices.clear()
        conn = await self.connection()
        assert self._waiter is not None
        async with conn.lock:
            started = time.perf_counter()
            try:
                results = await self._waiter.round_trip(send)
            except NotSent as exc:
                raise self._lost(None, reached=False, cause=exc.__cause__) from None
            except psycopg.Error as exc:
                if conn.pgconn.status != pq.ConnStatus.OK:
                    raise self._lost(exc.diag.sqlstate, reached=True, cause=exc) from None
                raise _backend_error(exc) from None
            finally:
                observe_backend(time.perf_counter() - started)
        result = results[-1]
        if result.status == pq.ExecStatus.FATAL_ERROR:
            error = _result_error(result)
            if conn.pgconn.status != pq.ConnStatus.OK:
                raise self._lost(error.sqlstate, reached=True, cause=error)
            raise error
        return result

    def _lost(self, sqlstate: str | None, reached: bool, cause: BaseException | None = None) -> BackendLost:
        """The error ending a session whose connection is gone; libpq's text goes to the log only."""
        log.warning("backend connection lost (%s): %s", "during a statement" if reached else "before a statement",
                    cause if cause is not None else "libpq reports the connection bad")
        return BackendLost("57P01" if sqlstate == "57P01" else "08006", reached)

    async def cancel(self) -> None:
        try:
            if self._conn is not None and self._conn.pgconn.status == pq.ConnStatus.OK:
                await self._conn.cancel_safe(timeout=5.0)
        except psycopg.Error:
            pass

    async def close(self) -> None:
        if self._waiter is not None:
            self._waiter.detach()
        if self._conn is not None:
            await self._conn.close()


# dpproxy's own queries run on the analyst's backend session, under the search_path the
# analyst set: every function, operator and type is pg_catalog's (see rewriter/qualify.py).
_RESOLVE_SQL = """
SELECT c.oid, n.nspname, c.relname
FROM pg_catalog.unnest(%s::pg_catalog.text[]) WITH ORDINALITY AS r(name, i)
LEFT JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(r.name)
LEFT JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
ORDER BY r.i
"""


def _result_error(result: PGresult) -> BackendError:
    def field(code: pq.DiagnosticField) -> str | None:
        value = result.error_field(code)
        return value.decode("utf-8", "replace") if value is not None else None

    return BackendError(
        field(pq.DiagnosticField.SQLSTATE) or "XX000",
        field(pq.DiagnosticField.MESSAGE_PRIMARY) or "backend error",
        field(pq.DiagnosticField.MESSAGE_DETAIL),
        field(pq.DiagnosticField.MESSAGE_HINT),
    )


def _backend_error(exc: psycopg.Error) -> BackendError:
    """PostgreSQL's error for a statement; an error libpq raised itself (no SQLSTATE from the
    server, its text naming host and port) is logged and told as a generic one."""
    diag = exc.diag
    if diag.sqlstate is None:
        log.warning("backend error without a SQLSTATE: %s", str(exc).strip())
        if isinstance(exc, psycopg.OperationalError):
            return BackendError("08006", "the connection to the backend database failed", hint=_SEE_LOG)
        return BackendError("XX000", "the backend database connection reported an internal error", hint=_SEE_LOG)
    return BackendError(diag.sqlstate, diag.message_primary or "backend error", diag.message_detail, diag.message_hint)


_SEE_LOG = "An administrator can see the cause in dpproxy's log."
# Connection refusals an analyst may be told about as they are; anything else (the service
# role's authentication, an unknown host) is a configuration matter for the operator only.
_TOLD_AT_CONNECT = {
    "53300": "the backend database has too many connections",
    "57P03": "the backend database is starting up or shutting down",
}


def _connect_error(exc: psycopg.Error) -> BackendError:
    """A failure to open a backend connection, without libpq's text (host, port, role)."""
    log.warning("could not connect to the backend: %s", str(exc).strip())
    sqlstate = exc.diag.sqlstate or ""
    if sqlstate not in _TOLD_AT_CONNECT:
        text = str(exc)
        sqlstate = next((code for code, _ in _CONNECT_TEXTS if _ in text), "08006")
    return BackendError(sqlstate, _TOLD_AT_CONNECT.get(sqlstate, "could not connect to the backend database"),
                        hint=_SEE_LOG)


# libpq reports connection refusals as text only (no SQLSTATE): these are recognised.
_CONNECT_TEXTS = (
    ("53300", "too many clients already"),
    ("53300", "too many connections for "),
    ("53300", "remaining connection slots are reserved"),
    ("57P03", "the database system is starting up"),
    ("57P03", "the database system is shutting down"),
)


def _fields(result: PGresult) -> list[Field]:
    return [
        Field(
            name=(result.fname(i) or b"").decode("utf-8"),
            type_oid=result.ftype(i),
            type_size=result.fsize(i),
            type_modifier=result.fmod(i),
            table_oid=result.ftable(i),
            column_number=result.ftablecol(i),
            format=result.fformat(i),
        )
        for i in range(result.nfields)
    ]


def _rows(result: PGresult) -> list[list[bytes | None]]:
    nfields = result.nfields
    get = result.get_value
    return [[get(r, c) for c in range(nfields)] for r in range(result.ntuples)]


def _tag(result: PGresult) -> str:
    return (result.command_status or b"").decode("utf-8")


async def build_registry(session: BackendSession, policy: Policy) -> TableRegistry:
    """Resolve the policy's tables on the backend: OIDs, columns, types; check the policy fits."""
    refs = {name: _policy_ref(name) for name in policy.tables}
    resolved = await session.resolve(refs.values())
    hashable = await _ctid_hashable(session, [target.oid for target in resolved.values() if target is not None])
    primary_keys = await _primary_keys(session, [target.oid for target in resolved.values() if target is not None])
    relations: dict[int, Relation] = {}
    problems: list[str] = []
    for name, table_policy in policy.tables.items():
        target = resolved.get(refs[name])
        if target is None:
            problems.append(f"tables.{name}: no such relation on the backend")
            continue
        columns = await _columns(session, target.oid, table_policy.columns)
        for column_name, column_policy in table_policy.columns.items():
            info = columns.get(column_name)
            if info is None:
                problems.append(f"tables.{name}.columns.{column_name}: no such column on the backend")
            else:
                problems += column_fit_problems(name, column_name, column_policy, info)
        if table_policy.partitioning == "ctid_hash" and target.oid not in hashable:
            problems.append(
                f"tables.{name}.partitioning: ctid_hash needs a table, materialized view or "
                "partitioned table on PostgreSQL >= 14; use random"
            )
        # row_hash hashes columns chosen from the schema (rewriter.rewrite.hashed_columns), auto
        # only a primary key; without such columns, random().
        row_columns = hashed_columns(columns, primary_keys.get(target.oid, ()), key_only=table_policy.partitioning == "auto") \
            if table_policy.partitioning in ("auto", "row_hash") else ()
        key: Literal["row", "ctid", "random"] = (
            "ctid" if table_policy.partitioning == "ctid_hash" else "row" if row_columns else "random"
        )
        relations[target.oid] = Relation(
            target.oid, target.schema, target.name, table_policy, columns, partition_key=key, hashed_columns=row_columns,
        )
    if problems:
        raise PolicyError(problems)
    pg_class = await session.fetch_row(
        "SELECT pg_catalog.array_agg(attname::pg_catalog.text ORDER BY attnum) FROM pg_catalog.pg_attribute "
        "WHERE attrelid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass "
        "AND attnum OPERATOR(pg_catalog.>) 0 AND NOT attisdropped"
    )
    return TableRegistry(relations, tuple(pg_class[0]))


async def _ctid_hashable(session: BackendSession, oids: list[int]) -> set[int]:
    """The relations whose rows sample and aggregate can partition by a hash of their ctid.

    Tables, materialized views and partitioned tables have a ctid that stays put while other
    rows come and go (views have none; a foreign table's is not the remote row's), and the
    hash, ``hashtidextended``, exists from PostgreSQL 14 on.
    """
    if not oids:
        return set()
    rows = await session.fetch_all(
        "SELECT c.oid FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[]) "
        "AND c.relkind OPERATOR(pg_catalog.=) ANY('{r,m,p}'::pg_catalog.\"char\"[]) "
        "AND pg_catalog.to_regprocedure('pg_catalog.hashtidextended(pg_catalog.tid,pg_catalog.int8)') IS NOT NULL",
        (oids,),
    )
    return {int(oid) for (oid,) in rows}


async def _primary_keys(session: BackendSession, oids: list[int]) -> dict[int, tuple[str, ...]]:
    """Each relation's primary key columns, in key order (relations without one are absent)."""
    if not oids:
        return {}
    rows = await session.fetch_all(
        "SELECT i.indrelid, pg_catalog.array_agg(a.attname::pg_catalog.text ORDER BY k.n) "
        "FROM pg_catalog.pg_index i, pg_catalog.unnest(i.indkey::pg_catalog.int2[]) WITH ORDINALITY AS k(attnum, n) "
        "JOIN pg_catalog.pg_attribute a ON a.attnum OPERATOR(pg_catalog.=) k.attnum "
        "WHERE i.indisprimary AND i.indrelid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[]) "
        "AND a.attrelid OPERATOR(pg_catalog.=) i.indrelid GROUP BY i.indrelid",
        (oids,),
    )
    return {int(oid): tuple(names) for oid, names in rows}


def _policy_ref(name: str) -> RelationRef:
    schema, _, table = name.rpartition(".")
    return RelationRef(schema or None, table)


async def _columns(session: BackendSession, oid: int, policies: Mapping[str, Any]) -> dict[str, ColumnInfo]:
    rows = await session.fetch_all(
        "SELECT a.attname, a.atttypid, a.atttypmod, a.attnum, COALESCE(c.collisdeterministic, true), "
        "COALESCE(t.typarray, 0) "
        "FROM pg_catalog.pg_attribute a "
        "LEFT JOIN pg_catalog.pg_collation c ON c.oid OPERATOR(pg_catalog.=) a.attcollation "
        "LEFT JOIN pg_catalog.pg_type t ON t.oid OPERATOR(pg_catalog.=) a.atttypid "
        "WHERE a.attrelid OPERATOR(pg_catalog.=) %s::pg_catalog.oid AND a.attnum OPERATOR(pg_catalog.>) 0 "
        "AND NOT a.attisdropped ORDER BY a.attnum",
        (oid,),
    )
    return {
        name: ColumnInfo(name, int(typ), int(mod), int(num), policies.get(name), bool(deterministic), int(array))
        for name, typ, mod, num, deterministic, array in rows
    }
