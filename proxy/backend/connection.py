"""Connections to the backing PostgreSQL, through psycopg, as the one service role.

Each client session borrows backend connections from the server's pool (proxy/backend/pool.py)
per transaction, or per statement outside one, and its settings (SET, search_path, startup
parameters) go with it to whichever connection it holds: to the client, SET, search_path and
transactions behave as on PostgreSQL. Backend sessions are read-only and carry a
statement_timeout; the client's credentials never reach the backend.
"""

from __future__ import annotations

import difflib
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Iterable, Literal, Mapping, Sequence

import psycopg
from psycopg import pq
from psycopg.pq.abc import PGconn, PGresult

from policies.loader import PolicyError
from policies.model import Policy
from policies.relation_keys import QUOTED_FORM, key_parts
from policies.tables import ColumnInfo, Definition, Relation, TableRegistry
from proxy.ops import metrics
from proxy.ops.metrics import observe_backend
from proxy.wire.encodings import ClientEncoding, encoding_named, untranslatable
from proxy.wire.protocol import Field, ProtocolError, data_row, formats_for
from rewriter.classify import ResolvedRelation
from rewriter.references import RelationRef
from rewriter.rewrite import hashed_columns
from rewriter.sort_memory import MemorySteps, sort_memory_kb_sql

from .data_rows import data_rows
from .cancellable import CancellableWait
from .errors import BackendError, BackendLost, BackendUnavailable, ClientGone, StepFailed
from .column_facts import column_facts
from .policy_fit import column_fit_problems, unbounded_categories_problems
from .type_support import ValueType, builtin_types, distinct_countable, label_comparison_problem, type_names, value_types
from .database_encoding import database_encoding_problems
from .relation_reads import public_reads_protected
from .grants import schemas_without_usage, unreadable_protected
from .row_failures import failing_protected
from .view_rows import view_row_bases
from .view_widths import view_input_bytes
from .pool import UNKNOWN, BackendPool, PooledConnection, PoolTimeout, State, open_backend
from .result_waiter import NotSent
from .row_stream import HELD_RESULT_BYTES, RowStream
from .unread_rows import UnreadRows, text_rows

__all__ = [
    "BackendError", "BackendLost", "BackendSession", "BackendUnavailable", "BoundParams", "ClientGone", "ResultSet", "build_registry", "connect",
    "FORWARDED_STARTUP", "function_names", "OWN_APPLICATION_NAME",
    "pooled_session", "startup_key", "startup_settings",
]

# Parameters PostgreSQL reports to clients at startup (and after a SET of one of them), each
# relayed when the backend reports it: search_path from PostgreSQL 18 on. (Not
# scram_iterations, 16's: it is the backend's, and dpproxy does its own authentication.)
REPORTED_PARAMETERS = (
    "application_name", "client_encoding", "DateStyle", "default_transaction_read_only",
    "in_hot_standby", "integer_datetimes", "IntervalStyle", "is_superuser",
    "search_path", "server_encoding", "server_version", "session_authorization",
    "standard_conforming_strings", "TimeZone",
)

# The reported settings that change how PostgreSQL reads a literal, or how the text of an
# answer is written (BackendSession.literal_settings).
_LITERAL_SETTINGS = ("DateStyle", "IntervalStyle", "TimeZone", "client_encoding")
_LITERAL_NAMES = tuple(name.encode() for name in _LITERAL_SETTINGS)


def _decoded(value: bytes | None) -> str | None:
    return None if value is None else value.decode("utf-8", "replace")


# Startup parameters a client may pass on to its backend session.
_FORWARDED_STARTUP = {
    "application_name": "application_name", "client_encoding": "client_encoding",
    "datestyle": "DateStyle", "timezone": "TimeZone", "intervalstyle": "IntervalStyle",
    "extra_float_digits": "extra_float_digits", "search_path": "search_path",
}

FORWARDED_STARTUP = frozenset(_FORWARDED_STARTUP)
"""The startup parameters, by lower-case name, that a backend session takes on."""

log = logging.getLogger("dpproxy.backend")

# libpq's transaction status → ReadyForQuery's status byte (idle, and anything else, is b"I").
_STATUS_BYTE: dict[int, bytes] = {pq.TransactionStatus.INTRANS: b"T", pq.TransactionStatus.INERROR: b"E"}
_UNKNOWN = pq.TransactionStatus.UNKNOWN  # libpq's status of a connection that is gone
_TUPLES_CHUNK = pq.ExecStatus.TUPLES_CHUNK

CHUNK_ROWS = 1024
"""Rows per chunk of a relayed result (libpq's chunked rows mode): what dpproxy holds of a
result at a time, beyond what the client's socket has not taken yet."""
_WHOLE_ROWS = 2048  # a relayed result is streamed past this many rows, even if they came at once


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
    relayed: list[bytes] | None = None
    """The rows as DataRow messages built from libpq's result (``BackendSession.relay``), in
    place of ``rows``, which is then empty: a passthrough result nothing in dpproxy reads."""
    stream: RowStream | None = None
    """A relayed result still arriving, in place of ``relayed``: its rows are taken from it
    (``RowStream.take``) and its tag is the stream's once it has ended."""

    @property
    def row_count(self) -> int:
        return len(self.relayed) if self.relayed is not None else len(self.rows)

    def data_rows(self, start: int = 0, stop: int | None = None) -> list[bytes]:
        """The DataRow messages of rows ``start`` to ``stop`` (None: the last), ready to send."""
        if self.relayed is not None:
            return self.relayed[start:stop]
        return [data_row(row) for row in self.rows[start:stop]]


def startup_settings(startup: Mapping[str, str] | None) -> dict[str, str]:
    """The client's startup parameters a backend session takes on, by their setting names."""
    settings: dict[str, str] = {}
    for key, value in (startup or {}).items():
        name = _FORWARDED_STARTUP.get(key.lower())
        if name is not None:
            settings[name] = value.strip("'\"") if name == "client_encoding" else value
    return settings


OWN_APPLICATION_NAME = "dpproxy"
"""The application_name of the connections dpproxy opens for its own work, so that an operator
reading pg_stat_activity can tell them from the ones it holds for clients."""


async def connect(
    policy: Policy, startup: Mapping[str, str] | None = None, *, report: bool = True
) -> "BackendSession":
    """A backend session on a connection of its own, open now, outside the pool (dpproxy's own
    work: resolving the policy at startup and reload, ``check-config``, the periodic re-check,
    tests). Without ``startup`` its application_name is OWN_APPLICATION_NAME.

    A failure to connect (PostgreSQL down, too many clients …) is logged and raises
    BackendError with PostgreSQL's SQLSTATE, or 08006 when none came back. With
    ``report=False`` psycopg's own error is raised, unlogged, for a caller that tells the
    operator itself (startup, ``check-config``: ``proxy.startup.backend_failure``).
    """
    try:
        settings = startup_settings(startup) if startup is not None else {"application_name": OWN_APPLICATION_NAME}
        conn = await open_backend(policy.backend, settings)
    except psycopg.Error as exc:
        if not report:
            raise
        raise _connect_error(exc) from None
    return BackendSession(None, dedicated=PooledConnection(conn, ()))


def pooled_session(
    pool: BackendPool, settings: Mapping[str, str], reported: Mapping[str, str] | None
) -> "BackendSession":
    """A client's backend session, borrowing connections from ``pool`` (none until its first
    statement), with the client's startup ``settings`` (as ``startup_settings`` gives them).
    ``reported`` stands in for the backend's ParameterStatus values while it holds no
    connection: the values an earlier session with the same startup settings saw (None: there
    was none, so they are read from the first connection it borrows)."""
    return BackendSession(pool, given=tuple(sorted(settings.items())), reported=reported)


def startup_key(settings: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The startup settings that shape a backend session's reported parameters, from the
    client's startup ``settings`` (as ``startup_settings`` gives them).

    Made from the settings the session takes on (one value per setting, the last given), not
    from the packet's pairs: ``TimeZone`` and ``timezone`` both given, in one order or the
    other, are two different sessions, whose keys must differ too.
    """
    return tuple(sorted((name.lower(), value) for name, value in settings.items() if name != "application_name"))


# The settings a session has made on its connection (SET, set_config, startup parameters):
# what a connection checked out for it next must have too. Values travel as hex of their
# UTF-8, both ways, so that neither the session's client_encoding nor the one the connection
# had before can change a byte of them. The transaction_* settings are left out: each
# transaction takes them afresh from default_transaction_*, so they carry nothing between
# transactions, but one non-local SET of them leaves source 'session' that RESET ALL never
# clears, and set_config of them after a transaction's first query fails (25001) — read
# back, they would pass from the connection into the next holder's settings, and from there
# fail each of its later checkouts (rewriter/classify.py keeps clients from setting them so).
_SERIALIZABLE_DEFAULT = ("default_transaction_isolation", "serializable")
_TRANSACTION_SCOPED = ("transaction_isolation", "transaction_read_only", "transaction_deferrable")
_SESSION_SETTINGS_SQL = (
    "SELECT name, pg_catalog.encode(pg_catalog.convert_to(setting, 'UTF8'), 'hex') FROM pg_catalog.pg_settings "
    "WHERE source OPERATOR(pg_catalog.=) 'session' "
    + "".join(f"AND name OPERATOR(pg_catalog.<>) '{name}' " for name in _TRANSACTION_SCOPED)
    + "ORDER BY name"
)


# Put before dpproxy's own statements in a string of several, which PostgreSQL runs as one
# implicit transaction: at READ COMMITTED, whatever the session's default isolation, so that
# they never wait for a serializable snapshot (a deferrable serializable transaction's first
# snapshot waits for the operator's serializable writers to end), which could outlast
# statement_timeout. SET LOCAL: gone with the transaction.
_READ_COMMITTED = "SET LOCAL transaction_isolation = 'read committed'; "


def _text_sql(text: str) -> str:
    """``text`` as an SQL expression of ASCII characters only, whatever the client encoding."""
    return f"pg_catalog.convert_from(pg_catalog.decode('{text.encode('utf-8').hex()}', 'hex'), 'UTF8')"


class BackendSession:
    """One client's backend session: a connection borrowed from the pool per transaction (or
    per statement outside one), carrying the client's settings wherever it runs.

    Contract: the session holds a connection from its first backend request until
    ``release()``, which the client session calls when it answers ReadyForQuery with the
    backend idle; inside a transaction block it keeps it. At checkout the connection is given
    this session's settings when it has others (``RESET ALL`` + ``set_config`` in one round
    trip); after a statement that may have changed them (``state_may_change``) they are read
    back from ``pg_settings`` at release, so the next checkout restores exactly what the
    backend had. ``cancel`` reaches only the connection held at that moment, which is then
    never reused. A connection lost while the session held none is simply not used again:
    the session goes on. A session built by ``connect`` (``dedicated``) keeps one connection
    of its own and never releases it.
    """

    def __init__(
        self,
        pool: BackendPool | None,
        *,
        given: State = (),
        reported: Mapping[str, str] | None = None,
        dedicated: PooledConnection | None = None,
    ):
        self._pool = pool
        self._given = given  # the startup settings, as the client gave them
        self._state: State = pool.canonical_state(given) if pool is not None else ()
        self._held: PooledConnection | None = dedicated
        self._dedicated = dedicated is not None
        self._dirty = False  # a statement may have changed the settings since they were read
        self._state_lost = False  # the settings could not be read back: the session cannot go on
        self._reported = dict(reported or {})
        # The held connection's ParameterStatus values may be news (always, when none were given).
        self._reported_stale = reported is None
        self._sent_on_checkout = 0
        self._no_notices: list[str] = []
        self._stream: RowStream | None = None  # the last relayed result read as it arrives
        self._checkout_wait = CancellableWait()  # waiting for the pool, until a CancelRequest
        self._held_streams: list[RowStream] = []  # results whose rests were held for their portals
        self._dropped_portals: list[bytes] = []  # backend cursors of ended portals, closed before the next request
        self._last_status = b"I"  # the held connection's status as last read (transaction_status)
        self.client_gone: Callable[[], Awaitable[None]] | None = None
        """Returns when the client's connection ends (``MessageReader.closed``): a wait for a
        pooled connection ends then (``_acquire``). None: never watched."""
        self.pinned = False
        """A cursor WITH HOLD lives on the held connection: it is not given back to the pool,
        and is closed, not pooled, at the session's end (proxy/serving/cursors.py)."""

    # ------------------------------------------------------------ checkout and release

    async def connection(self) -> psycopg.AsyncConnection[Any]:
        """The held connection, checking one out (and giving it this session's settings) if none is."""
        return (await self._checkout()).conn

    async def _checkout(self) -> PooledConnection:
        if self._held is not None:
            return self._held
        assert self._pool is not None
        if self._state_lost:
            raise self._lost(None, reached=False)
        for attempt in (1, 2):
            held = await self._acquire()
            self._sent_on_checkout = 0
            if held.state == self._state:
                break
            try:
                await self._apply_state(held)
                self._reported_stale = True
                break
            except BackendLost:
                # Found lost while idle in the pool (a backend restart): nothing of this
                # session was on it. Another one, once.
                self._pool.release(held, reusable=False)
                if attempt == 2:
                    raise
            except BaseException:
                held.state = UNKNOWN
                self._pool.release(held, reusable=False)
                raise
        self._held = held
        return held

    async def _acquire(self) -> PooledConnection:
        """A connection from the pool; a CancelRequest (``cancel``) ends the wait with 57014,
        as PostgreSQL's ends a statement waiting for a lock, and the client's going away
        (``client_gone``) with ``ClientGone``: nothing of the statement reached the backend, so
        nothing is charged, and the statement would not be answered to anyone. A connection the
        pool hands over just as the wait ends so (or as the session's task is cancelled, at a
        shutdown) goes back to the pool."""
        assert self._pool is not None
        idle = self._pool.acquire_idle(self._state)
        if idle is not None:
            return idle  # the common case: no wait, so no task a cancel would have to end
        try:
            return await self._checkout_wait.wait(
                self._pool.acquire(self._state),
                lambda: BackendUnavailable("57014", "canceling statement due to user request"),
                give_back=self._give_back, client_gone=self.client_gone)
        except PoolTimeout as exc:
            raise BackendUnavailable(
                "53300",
                f"no backend connection became free within {exc.waited_s:g} s "
                f"(all {exc.size} of dpproxy's backend connections are in use)",
                hint="Retry later; an administrator can raise backend.pool.size or "
                     "backend.pool.checkout_timeout_s in the policy.",
            ) from None
        except psycopg.Error as exc:
            raise _connect_error(exc) from None

    def _give_back(self, held: PooledConnection) -> None:
        """Return a connection checked out for a wait that ended without taking it."""
        assert self._pool is not None
        self._pool.release(held, reusable=True)

    async def _apply_state(self, held: PooledConnection) -> None:
        """Give ``held`` exactly this session's settings, in one round trip, and learn how the
        backend stores them (so that later checkouts find a connection that matches)."""
        assert self._pool is not None
        metrics.pool_reset()
        calls = ", ".join(f"pg_catalog.set_config({_text_sql(name)}, {_text_sql(value)}, false)"
                          for name, value in self._state)
        sql = _READ_COMMITTED + "RESET ALL; " + (f"SELECT {calls}; " if calls else "") + _SESSION_SETTINGS_SQL
        held.state = UNKNOWN
        results = await self._own_round_trip(held, sql.encode())
        failed = next((r for r in results if r.status == pq.ExecStatus.FATAL_ERROR), None)
        if failed is not None:
            raise _result_error(failed, _connection_encoding(held.conn.pgconn))
        stored = _settings_of(results[-1])
        held.state = stored
        if self._state == self._pool.canonical_state(self._given):
            self._pool.learn_state(self._given, stored)
        self._state = stored

    async def _own_round_trip(self, held: PooledConnection, sql: bytes) -> list[PGresult]:
        """One of dpproxy's own requests (never a client's) on ``held``; BackendLost if it is gone."""
        async with held.conn.lock:
            try:
                return await held.waiter.round_trip(lambda: held.conn.pgconn.send_query(sql))
            except NotSent as exc:
                raise self._lost(None, reached=False, cause=exc.__cause__) from None
            except psycopg.Error as exc:
                raise self._lost(exc.diag.sqlstate, reached=False, cause=exc) from None

    async def restore_startup(self, name: str | None) -> None:
        """After RESET ``name`` (None: RESET ALL, DISCARD ALL), give back the startup value the
        client gave for it, as PostgreSQL does: its startup parameters are a pooled
        connection's session settings, which RESET would otherwise drop."""
        wanted = None if name is None else name.lower().replace(" ", "")
        settings = [(n, v) for n, v in self._given if wanted is None or n.lower() == wanted]
        if not settings:
            return
        calls = ", ".join(f"pg_catalog.set_config({_text_sql(n)}, {_text_sql(v)}, false)" for n, v in settings)
        # In the client's transaction block it runs as the block's statement, at its isolation.
        own = _READ_COMMITTED if self.transaction_status == b"I" else ""
        await self._round_trip(lambda pgconn: pgconn.send_query(f"{own}SELECT {calls}".encode()))
        self._dirty = True

    def state_may_change(self) -> None:
        """A statement that may change session settings is about to run (SET, RESET, DISCARD,
        set_config, a transaction's end): read them back before the connection is released."""
        self._dirty = True

    async def release(self) -> None:
        """Give the held connection back to the pool, if the backend is idle (else keep it).

        Called when the client is answered ReadyForQuery. A connection in a transaction, after
        an error, cancelled or lost is closed instead of pooled. One still running a suspended
        portal's statement is kept; once that portal is gone (``RowStream.abandoned``), the
        rest of its result is read first.
        """
        held = self._held
        if held is None or self._dedicated or self.pinned or self.transaction_status != b"I":
            return
        if self._stream is not None and self._stream.open:
            if not self._stream.abandoned:
                return  # a suspended portal's statement still runs on it
            await self._settle_stream()
        assert self._pool is not None
        idle = held.healthy and held.conn.pgconn.transaction_status == pq.TransactionStatus.IDLE \
            and not held.waiter.busy
        if idle and (self._reported_stale or self._dirty):
            # Reading them costs a dozen libpq calls: only when settings may have moved.
            self._reported = self._read_reported(held.conn)
            self._reported_stale = False
        if self._dirty and idle:
            # Twice at most: a cancel signal sent during the statement may arrive late and
            # cancel the first read (the connection is then closed, not pooled, below).
            for _ in range(2):
                try:
                    results = await self._own_round_trip(held, (_READ_COMMITTED + _SESSION_SETTINGS_SQL).encode())
                except BackendLost:
                    break
                if results and results[-1].status == pq.ExecStatus.TUPLES_OK:
                    self._state = held.state = _settings_of(results[-1])
                    self._dirty = False
                    break
        if self._dirty:
            self._state_lost = True  # what this session had set is not known any more
        self._held = None
        self._pool.release(held, reusable=not self._state_lost)

    async def close(self) -> None:
        """End the session: a dedicated connection is closed, a borrowed one given back (its
        settings marked unknown if they may have changed, so the next holder resets them)."""
        held, self._held = self._held, None
        self._stream = None  # still running, its connection is closed below, not pooled
        self._held_streams = []
        if held is None:
            return
        if self._dedicated:
            held.waiter.detach()
            await held.conn.close()
            return
        assert self._pool is not None
        if self._dirty:
            held.state = UNKNOWN
        self._pool.release(held, reusable=not self.pinned)  # a cursor WITH HOLD must not reach another session

    async def usable(self) -> None:
        """Check a connection out if none is held, skipping one found lost before any request;
        raise BackendLost (not reached) if the held connection is known to be gone. A DP query
        calls this before it is charged."""
        held = await self._checkout()
        held.waiter.read_idle()
        if not held.healthy and self._sent_on_checkout == 0 and not self._dedicated:
            self._drop_held()
            held = await self._checkout()
        if not held.healthy:
            raise self._lost(None, reached=False)

    def _drop_held(self) -> None:
        """Close the held connection (found lost before this checkout sent anything)."""
        held, self._held = self._held, None
        assert held is not None and self._pool is not None
        self._pool.release(held, reusable=False)

    @property
    def transaction_status(self) -> bytes:
        """The ReadyForQuery status byte matching the backend's transaction state."""
        if self._held is None:
            return b"I"
        if self._stream is not None and self._stream.open:
            return self._stream.status  # libpq's is "active" while the statement runs
        # libpq's status as a plain int: conn.info would build a ConnectionInfo and an enum
        # on every call, and this runs for every ReadyForQuery.
        status = self._held.conn.pgconn.transaction_status
        if status == _UNKNOWN:
            # Lost since it was last read (while a quantised answer waited, say): the status
            # the client was last told, so that a block is not taken for idle and its
            # connection swapped for another under it; its next request ends the session.
            return self._last_status
        self._last_status = _STATUS_BYTE.get(status, b"I")
        return self._last_status

    @property
    def may_serialize(self) -> bool:
        """Whether a transaction begun now may be SERIALIZABLE: its default isolation is, as this
        session's settings were last read back (the backend's own default is READ COMMITTED,
        ``open_backend``), or a statement since may have changed it (SET, set_config, RESET)."""
        return self._dirty or _SERIALIZABLE_DEFAULT in self._state

    @property
    def holds_connection(self) -> bool:
        return self._held is not None

    @property
    def streaming(self) -> bool:
        """A relayed result is still arriving on the held connection (a statement runs on it)."""
        return self._stream is not None and self._stream.open

    @property
    def literal_settings(self) -> tuple[str | None, ...]:
        """DateStyle, IntervalStyle, TimeZone and client_encoding as the backend last reported
        them to this session: the settings under which PostgreSQL reads a plain date, time or
        interval literal, and the encoding an answer's text is written in. Read from the held connection when there is one (so a SET earlier in the same
        message counts), else as reported when the session last gave one back."""
        if self._held is None:
            return tuple(self._reported.get(name) for name in _LITERAL_SETTINGS)
        status = self._held.conn.pgconn.parameter_status
        return tuple(_decoded(status(name)) for name in _LITERAL_NAMES)

    @property
    def client_encoding(self) -> ClientEncoding:
        """The client_encoding this session's text goes to the backend in: the held
        connection's, else as reported when the session last gave one back (a checkout
        restores it)."""
        if self._held is None:
            return encoding_named(self._reported.get("client_encoding"))
        return _connection_encoding(self._held.conn.pgconn)

    def reported_parameters(self) -> dict[str, str]:
        if self._held is None:
            return dict(self._reported)
        return self._read_reported(self._held.conn)

    @staticmethod
    def _read_reported(conn: psycopg.AsyncConnection[Any]) -> dict[str, str]:
        values = {}
        for name in REPORTED_PARAMETERS:
            value = conn.info.parameter_status(name)
            if value is not None:
                values[name] = value
        return values

    @property
    def _notices(self) -> list[str]:
        return self._held.notices if self._held is not None else self._no_notices

    # ------------------------------------------------------------ statements

    async def fetch_all(
        self, sql: str, params: Sequence[Any] = (), *, read_committed: bool = False
    ) -> list[tuple[Any, ...]]:
        """Run dpproxy's own query (never a client's) and return its rows as Python values;
        ``read_committed``: outside a transaction block, in a READ COMMITTED block of its own."""
        await self._settle_stream()
        await self._close_dropped_portals()
        held = await self._checkout()
        conn = held.conn
        held.waiter.detach()  # psycopg waits on the socket itself here
        self._sent_on_checkout += 1
        try:
            async with conn.cursor() as cur:
                if read_committed:
                    await cur.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                try:
                    await cur.execute(sql, params or None)
                    rows = [tuple(row) for row in await cur.fetchall()]
                finally:
                    if read_committed and conn.pgconn.status == pq.ConnStatus.OK:
                        # Read-only: COMMIT and ROLLBACK alike end it; this ends a failed one too.
                        await cur.execute("ROLLBACK")
                return rows
        except psycopg.Error as exc:
            if conn.pgconn.status != pq.ConnStatus.OK:
                raise self._lost(exc.diag.sqlstate, reached=True, cause=exc) from None
            raise _backend_error(exc) from None
        finally:
            held.waiter.attach()  # not if the connection was lost: its socket number may be reused

    async def fetch_row(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...]:
        """Like fetch_all, for a query that returns exactly one row."""
        (row,) = await self.fetch_all(sql, params)
        return row

    async def resolve(self, refs: Iterable[RelationRef]) -> dict[RelationRef, ResolvedRelation | None]:
        """Resolve relation names to OIDs under this session's search_path, as PostgreSQL would.

        Outside a transaction block, in a session that may be SERIALIZABLE, at READ COMMITTED in a
        block of its own (see ``_READ_COMMITTED``); in the client's block, as its statement."""
        refs = list(dict.fromkeys(refs))
        if not refs:
            return {}
        names = ([r.qualified for r in refs],)
        if self.transaction_status == b"I" and self.may_serialize:
            rows = await self.fetch_all(_RESOLVE_SQL, names, read_committed=True)
        else:
            rows = await self.fetch_all(_RESOLVE_SQL, names)
        resolved: dict[RelationRef, ResolvedRelation | None] = {}
        for ref, (oid, schema, name) in zip(refs, rows):
            resolved[ref] = ResolvedRelation(int(oid), schema, name) if oid is not None else None
        return resolved

    async def execute(
        self, sql: str, params: BoundParams | None = None, result_format: int = 0, *, one_statement: bool = False
    ) -> ResultSet:
        """Run one statement as sent, with the client's raw parameters, in one result format.

        Without parameters it goes as a simple Query; with them, or with ``one_statement``,
        through libpq's extended protocol (values and their format codes passed on byte for
        byte), where PostgreSQL refuses a text that holds more than one statement (42601).
        """
        result = await self._statement(sql, params, result_format, one_statement)
        return ResultSet(_fields(result, self.client_encoding), text_rows(result), _tag(result), list(self._notices))

    async def relay(
        self, sql: str, params: BoundParams | None = None, result_formats: Sequence[int] = (), *,
        one_statement: bool = False,
    ) -> ResultSet:
        """Run one statement like ``execute``, its rows left as the DataRow messages the client
        gets, never decoded into values: for a passthrough statement, whose result dpproxy
        sends as the backend gave it, in the client's ``result_formats`` (one for all, or one
        per column).

        A result that arrives whole, or nearly (no more than a chunk still to wait for), comes
        back whole (``ResultSet.relayed``); a failed statement then returns no row at all. A
        larger one comes back as a ``ResultSet.stream`` whose rows are read from the backend
        as they are taken: until it has ended, this session's next request first holds or
        discards its rest (``RowStream``), and the connection is not released.
        """
        uniform = result_formats[0] if len(result_formats) == 1 else 0
        send_statement = _sender(sql, params, uniform, one_statement)

        def send(pgconn: PGconn) -> None:
            send_statement(pgconn)
            pgconn.set_chunked_rows_mode(CHUNK_ROWS)

        held = await self._request_connection()
        status = _STATUS_BYTE.get(held.conn.pgconn.transaction_status, b"I")
        async with held.conn.lock:
            started = time.perf_counter()
            try:
                await held.waiter.start(lambda: send(held.conn.pgconn))
            except (NotSent, psycopg.Error) as exc:
                raise self._failure(exc, held) from None
            finally:
                self._sent_on_checkout += 1
            try:
                result = await self._next_result(held)
            finally:
                observe_backend(time.perf_counter() - started)
            fields = _fields(result, _connection_encoding(held.conn.pgconn))
            try:
                formats = formats_for(result_formats, len(fields)) if len(result_formats) > 1 else ()
            except ProtocolError:
                await self._read_to_end(held)
                raise
            binary = frozenset(i for i, (f, fmt) in enumerate(zip(fields, formats)) if fmt == 1 and f.format == 0)
            if binary:
                fields = [replace(f, format=1) if i in binary else f for i, f in enumerate(fields)]

            # libpq gives the command tag with the last chunk; the zero-row result after it has none.
            tag = ""

            async def pull() -> tuple[list[bytes], str | None]:
                nonlocal tag
                chunk = await self._next_result(held)
                tag = _tag(chunk) or tag
                if chunk.status == _TUPLES_CHUNK:
                    return await self._encoded(held, chunk, binary), None
                await self._read_to_end(held)
                return [], tag

            rows: list[bytes] = []
            while result.status == _TUPLES_CHUNK:
                tag = _tag(result) or tag
                rows += await self._encoded(held, result, binary)
                if len(rows) >= _WHOLE_ROWS or not held.waiter.result_ready():
                    # The rest is still on its way (or too much has come): pass it on as it comes.
                    self._stream = RowStream(pull, rows, status)
                    return ResultSet(fields, [], "", list(self._notices), stream=self._stream)
                result = await self._next_result(held)
            await self._read_to_end(held)
        return ResultSet(fields, [], _tag(result) or tag, list(self._notices), relayed=rows)

    async def _encoded(self, held: PooledConnection, chunk: PGresult, binary: frozenset[int]) -> list[bytes]:
        """A chunk's rows as DataRows; on a value dpproxy cannot convert to binary, the rest of
        the result is read for nothing first, so that the connection is idle again."""
        try:
            return data_rows(chunk, binary)
        except Exception:
            await self._read_to_end(held)
            raise

    async def _next_result(self, held: PooledConnection) -> PGresult:
        """The next result of the request in flight on ``held`` (sent with ``ResultWaiter.start``);
        the statement's error raised as ``_round_trip`` raises it, once the request has ended."""
        waiter = held.waiter
        try:
            result = await waiter.next_result()
            if result is not None and result.status == pq.ExecStatus.FATAL_ERROR and waiter.streaming:
                await waiter.next_result()  # the end of the request's results
        except psycopg.Error as exc:
            raise self._failure(exc, held) from None
        if result is None:  # pragma: no cover - a statement always has a last result
            raise BackendError("XX000", "the backend sent no result", hint=_SEE_LOG)
        if result.status == pq.ExecStatus.FATAL_ERROR:
            error = _result_error(result, _connection_encoding(held.conn.pgconn))
            if held.conn.pgconn.status != pq.ConnStatus.OK:
                raise self._lost(error.sqlstate, reached=True, cause=error)
            raise error
        return result

    async def _read_to_end(self, held: PooledConnection) -> None:
        """Read what is left of the request in flight on ``held``, for nothing."""
        while held.waiter.streaming:
            try:
                if await held.waiter.next_result() is None:
                    return
            except psycopg.Error as exc:
                raise self._failure(exc, held) from None

    async def first_row(self, sql: str, params: BoundParams | None = None, steps: Sequence[str] = (),
                        memory: MemorySteps | None = None) -> tuple[list[bytes | None], list[int]]:
        """Run a statement like ``execute`` and return only its first row as text, with each
        column's type OID (what a DP query's exact aggregates need, and nothing more); after
        ``steps`` and ``memory``'s setting in one pipeline when there are any (``after_steps``)."""
        result = await self._after(steps, sql, params, memory)
        columns = range(result.nfields)
        return [result.get_value(0, c) for c in columns], [result.ftype(c) for c in columns]

    async def first_row_parsed(self, statement: str, sql: str, params: BoundParams) -> list[bytes | None]:
        """``sql``'s first row as text, run with ``params``, after ``statement`` is parsed (never
        run) with their declared types, in one pipeline: one round trip. The statement's Parse
        error is raised, ``sql`` skipped, as PostgreSQL reports a statement's before it reads any
        value bound to it."""

        def send(pgconn: PGconn) -> None:
            pgconn.send_prepare(b"", _encoded(statement, pgconn), list(params.types) or None)
            _sender(sql, params, 0, True)(pgconn)

        result = await self._pipelined_last(send, 2)
        return [result.get_value(0, c) for c in range(result.nfields)]

    async def unread(self, sql: str, params: BoundParams | None = None, steps: Sequence[str] = (),
                     memory: MemorySteps | None = None) -> UnreadRows:
        """Run a statement like ``execute``, in text, and return its rows unread: a DP query's
        exact aggregates per cell, which may be many (``UnreadRows``: read them off the event
        loop when they are); after ``steps`` and ``memory``'s setting in one pipeline when there
        are any (``after_steps``)."""
        return UnreadRows(await self._after(steps, sql, params, memory))

    async def _after(self, steps: Sequence[str], sql: str, params: BoundParams | None,
                     memory: MemorySteps | None) -> PGresult:
        if steps or memory is not None:
            return await self.after_steps(steps, sql, params, memory)
        return await self._statement(sql, params, 0)

    async def after_steps(self, steps: Sequence[str], sql: str, params: BoundParams | None,
                          memory: MemorySteps | None = None) -> PGresult:
        """Run ``steps``, then ``sql``, each with ``params``, in text, in one libpq pipeline with
        one Sync at its end, and return the result of ``sql``: one round trip, and one implicit
        transaction outside a block, so the locks the steps take are held until ``sql`` ends.

        ``memory`` (rewriter/sort_memory.py): its setting is the last step (sent without
        parameters), and its restore, if any, follows ``sql``; a restore that fails after ``sql``
        ran is raised as ``sql``'s own error would be.

        A step that fails raises StepFailed: PostgreSQL skips what follows it in the pipeline up
        to the Sync, so ``sql`` never executed. A Flush request follows the steps, so the
        backend sends their results before it reads ``sql``; the results arrive in the order the
        statements ran, and a connection lost before the last step's result came (the loss
        arriving as a step's result, or no result of it at all) is BackendLost with ``reached``
        False: ``sql`` had not started. Lost after it, ``reached`` is True. ``sql``'s own error
        is raised as ``_round_trip`` raises it.
        """
        p = params or BoundParams((), (), ())
        setting, restore = memory if memory is not None else (None, None)

        def send(pgconn: PGconn) -> None:
            for step in steps:
                pgconn.send_query_params(_encoded(step, pgconn), p.values, p.types or None, p.formats or None, 0)
            if setting is not None:
                pgconn.send_query_params(_encoded(setting, pgconn), None, None, None, 0)
            pgconn.send_flush_request()
            pgconn.send_query_params(_encoded(sql, pgconn), p.values, p.types or None, p.formats or None, 0)
            if restore is not None:
                pgconn.send_query_params(_encoded(restore, pgconn), None, None, None, 0)

        conn, results, failure = await self._pipelined(send)
        encoding = _connection_encoding(conn.pgconn)
        lost = conn.pgconn.status != pq.ConnStatus.OK
        sent = len(steps) + (setting is not None)  # the steps sent ahead of sql, its result's index
        ran = sent + 1 + (restore is not None)
        for index, result in enumerate(results[:ran]):
            if result.status != pq.ExecStatus.FATAL_ERROR:
                continue
            error = _result_error(result, encoding)
            if lost:
                raise self._lost(error.sqlstate, reached=index >= sent, cause=error)
            # A step failed only where libpq says the run was skipped; anything else is the run's
            # (charged): the refund must never rest on the results' positions alone.
            if index < sent and len(results) > sent \
                    and results[sent].status == pq.ExecStatus.PIPELINE_ABORTED:
                raise StepFailed(index, error)
            raise error
        if len(results) < sent:  # no word of the last step's end: the Flush after it was not reached
            raise self._lost(None, reached=False, cause=failure)
        if failure is not None or lost:
            raise self._lost(None, reached=True, cause=failure)
        return results[sent]

    async def _pipelined(
        self, send: Callable[[PGconn], None]
    ) -> tuple[psycopg.AsyncConnection[Any], list[PGresult], Exception | None]:
        """Send the requests ``send`` makes in one libpq pipeline, ended by one Sync: one round
        trip. Returns the connection, the results read in order (to the Sync's), and the loss
        when the connection was lost on the way (``ResultWaiter.pipeline``); raises as
        ``_failure`` says when nothing could be sent."""
        held = await self._request_connection()
        conn = held.conn

        def pipeline(pgconn: PGconn) -> None:
            pgconn.enter_pipeline_mode()
            send(pgconn)
            pgconn.pipeline_sync()

        async with conn.lock:
            started = time.perf_counter()
            try:
                results, failure = await held.waiter.pipeline(lambda: pipeline(conn.pgconn))
            except (NotSent, psycopg.Error) as exc:
                raise self._failure(exc, held) from None
            finally:
                self._sent_on_checkout += 1
                observe_backend(time.perf_counter() - started)
                if conn.pgconn.pipeline_status != pq.PipelineStatus.OFF and conn.pgconn.status == pq.ConnStatus.OK:
                    try:
                        conn.pgconn.exit_pipeline_mode()
                    except psycopg.Error:
                        pass  # results still unread (the task was cancelled): the waiter reads them
        return conn, results, failure

    async def _statement(
        self, sql: str, params: BoundParams | None, result_format: int, one_statement: bool = False
    ) -> PGresult:
        return await self._round_trip(_sender(sql, params, result_format, one_statement))

    async def describe(self, sql: str, param_types: Sequence[int]) -> tuple[list[int], list[Field]]:
        """Parse ``sql`` on the backend without running it: its parameter types and columns.

        The Parse and the Describe go in one pipeline (one round trip); a Parse that fails
        raises its error, the Describe after it skipped. Parsing takes a snapshot: outside a
        transaction block, in a session that may be SERIALIZABLE, it parses in a READ COMMITTED
        block of its own (see ``_READ_COMMITTED``)."""
        own = self.transaction_status == b"I" and self.may_serialize
        if own:
            await self._round_trip(lambda pgconn: pgconn.send_query(b"BEGIN ISOLATION LEVEL READ COMMITTED"))
        try:
            result = await self._described(sql, param_types)
        finally:
            if own and self.transaction_status != b"I":
                await self._round_trip(lambda pgconn: pgconn.send_query(b"ROLLBACK"))
        return [result.param_type(i) for i in range(result.nparams)], _fields(result, self.client_encoding)

    async def _described(self, sql: str, param_types: Sequence[int]) -> PGresult:
        """The Describe result of ``sql`` parsed as the unnamed statement, both in one pipeline."""

        def send(pgconn: PGconn) -> None:
            pgconn.send_prepare(b"", _encoded(sql, pgconn), list(param_types) or None)
            pgconn.send_describe_prepared(b"")

        return await self._pipelined_last(send, 2)

    async def _pipelined_last(self, send: Callable[[PGconn], None], count: int) -> PGresult:
        """The last of the ``count`` results of the requests ``send`` makes in one pipeline
        (``_pipelined``); the first error among them raised, a connection lost as BackendLost."""
        conn, results, failure = await self._pipelined(send)
        lost = conn.pgconn.status != pq.ConnStatus.OK
        for result in results:
            if result.status == pq.ExecStatus.FATAL_ERROR:
                error = _result_error(result, _connection_encoding(conn.pgconn))
                if lost:
                    raise self._lost(error.sqlstate, reached=True, cause=error)
                raise error
        if failure is not None or lost or len(results) < count:
            raise self._lost(None, reached=True, cause=failure)
        return results[count - 1]

    async def declare_portal(self, name: str, sql: str, params: BoundParams | None) -> list[Field]:
        """Declare ``sql``, with the client's raw parameters, as backend cursor ``name`` (NO
        SCROLL, WITHOUT HOLD: it ends with the transaction block, as a protocol portal does),
        and return its columns, in text: one round trip, nothing run yet. A portal the client
        runs in row-limited pieces is passed on so (proxy/serving/backend_portals.py): each
        piece a FETCH, and a portal left before its end costs what it costs on PostgreSQL.
        The DECLARE's error is raised as ``describe``'s is; it fails the client's block, as
        the statement's own error at its Bind or first Execute would on PostgreSQL."""
        p = params or BoundParams((), (), ())

        def send(pgconn: PGconn) -> None:
            declare = _encoded(f"DECLARE {name} NO SCROLL CURSOR WITHOUT HOLD FOR {sql}", pgconn)
            pgconn.send_query_params(declare, p.values, p.types or None, p.formats or None, 0)
            pgconn.send_describe_portal(name.encode("ascii"))

        return _fields(await self._pipelined_last(send, 2), self.client_encoding)

    def drop_portal(self, name: str) -> None:
        """Backend cursor ``name`` (``declare_portal``) is no longer wanted: it is closed
        before the next request, with a protocol Close, which is no error for a cursor already
        gone with its transaction (a later cursor never has its name)."""
        self._dropped_portals.append(name.encode("ascii"))

    async def _close_dropped_portals(self) -> None:
        """Close the dropped portals' backend cursors (``drop_portal``) in one round trip, on
        a connection still in their transaction (outside a block they are gone already)."""
        names, self._dropped_portals = self._dropped_portals, []
        if not names or self._held is None or self.transaction_status == b"I":
            return

        def send(pgconn: PGconn) -> None:
            for name in names:
                pgconn.send_close_portal(name)

        await self._pipelined_last(send, len(names))

    async def describe_portal(self, name: str) -> list[Field]:
        """The columns of the backend portal (SQL cursor) ``name``."""
        result = await self._round_trip(lambda pgconn: pgconn.send_describe_portal(_encoded(name, pgconn)))
        return _fields(result, self.client_encoding)

    async def _round_trip(self, send: Callable[[PGconn], None]) -> PGresult:
        """Send one request with libpq and wait for its single result without blocking the loop."""
        held = await self._request_connection()
        conn = held.conn
        async with conn.lock:
            started = time.perf_counter()
            try:
                results = await held.waiter.round_trip(lambda: send(conn.pgconn))
            except (NotSent, psycopg.Error) as exc:
                raise self._failure(exc, held) from None
            finally:
                self._sent_on_checkout += 1
                observe_backend(time.perf_counter() - started)
        result = results[-1]
        if result.status == pq.ExecStatus.FATAL_ERROR:
            error = _result_error(result, _connection_encoding(conn.pgconn))
            if conn.pgconn.status != pq.ConnStatus.OK:
                raise self._lost(error.sqlstate, reached=True, cause=error)
            raise error
        return result

    async def _request_connection(self) -> PooledConnection:
        """The connection the next request goes on, free for it.

        A relayed result still arriving is first held (its portal may still want it) or, its
        portal gone, read to its end. A pooled connection found lost before the first request
        of its checkout left (the backend restarted while it was idle) is closed and another
        taken: nothing of this session was on it but settings, which the checkout restores.
        """
        await self._settle_stream()
        await self._close_dropped_portals()
        held = await self._checkout()
        held.waiter.read_idle()
        if not held.healthy and self._sent_on_checkout == 0 and not self._dedicated:
            self._drop_held()
            held = await self._checkout()
        held.notices.clear()
        return held

    async def hold_stream(self) -> None:
        """Read the rest of a relayed result still arriving into memory (``RowStream.hold``),
        so that the connection can be released while the client takes it."""
        await self._settle_stream()

    async def _settle_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is None or not stream.open:
            return
        if stream.abandoned:
            if stream.status == b"I":
                # Its statement runs in a transaction of its own (no block, no pipeline's): it is
                # cancelled, as PostgreSQL drops a closed portal's, rather than run to its end
                # for nothing, which held the session's next request seconds or up to the
                # statement timeout. Inside a block the cancel would fail the block: read on.
                await self.cancel()
            await stream.discard()
            return
        # One session holds HELD_RESULT_BYTES at most, over all its suspended portals.
        held = [s for s in self._held_streams if s.held_bytes]
        await stream.hold(max(0, HELD_RESULT_BYTES - sum(s.held_bytes for s in held)))
        self._held_streams = [*held, stream]

    def _failure(self, exc: NotSent | psycopg.Error, held: PooledConnection) -> BackendError:
        """A request's failure as the error to raise: the connection lost (before the request
        left, or after), or the backend's error for the statement."""
        if isinstance(exc, NotSent):
            return self._lost(None, reached=False, cause=exc.__cause__)
        if held.conn.pgconn.status != pq.ConnStatus.OK:
            return self._lost(exc.diag.sqlstate, reached=True, cause=exc)
        return _backend_error(exc)

    def _lost(self, sqlstate: str | None, reached: bool, cause: BaseException | None = None) -> BackendLost:
        """The error ending a session whose connection is gone; libpq's text goes to the log only."""
        log.warning("backend connection lost (%s): %s", "during a statement" if reached else "before a statement",
                    cause if cause is not None else "libpq reports the connection bad")
        return BackendLost("57P01" if sqlstate == "57P01" else "08006", reached)

    async def cancel(self) -> None:
        """Cancel what runs on the connection held now (none held: nothing runs, nothing is
        sent; a statement waiting for a pooled connection stops waiting, with 57014).

        The connection is marked so that it is closed, not pooled, when released: a cancel
        signal arriving late must never hit another session's statement.
        """
        held = self._held
        if held is None:
            self._checkout_wait.cancel()  # nothing was sent yet: the wait just ends
            return
        if not held.healthy:
            return
        held.cancelled = True
        try:
            await held.conn.cancel_safe(timeout=5.0)
        except psycopg.Error:
            pass


# dpproxy's own queries run on the analyst's backend session, under the search_path the
# analyst set: every function, operator and type is pg_catalog's (see rewriter/qualify.py).
_RESOLVE_SQL = """
SELECT c.oid, n.nspname, c.relname
FROM pg_catalog.unnest(%s::pg_catalog.text[]) WITH ORDINALITY AS r(name, i)
LEFT JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(r.name)
LEFT JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
ORDER BY r.i
"""


def _sender(sql: str, params: BoundParams | None, result_format: int, one_statement: bool) -> Callable[[PGconn], None]:
    """How to send one client statement: a simple Query without parameters, a result format or
    the one-statement rule; else the extended protocol, the client's values passed on as they came."""
    if params is None and result_format == 0 and not one_statement:
        return lambda pgconn: pgconn.send_query(_encoded(sql, pgconn))
    p = params or BoundParams((), (), ())
    return lambda pgconn: pgconn.send_query_params(
        _encoded(sql, pgconn), p.values, p.types or None, p.formats or None, result_format)


def _connection_encoding(pgconn: PGconn) -> ClientEncoding:
    """The client_encoding the backend reads this connection's text in, and writes its own."""
    return encoding_named(pgconn.parameter_status(b"client_encoding"))


def _encoded(sql: str, pgconn: PGconn) -> bytes:
    """``sql`` as the connection's session reads it: the text dpproxy analysed, character for character.

    Raises the backend's 22P05 for a character the encoding lacks (a name from the policy, say);
    nothing is sent then.
    """
    encoding = _connection_encoding(pgconn)
    try:
        return sql.encode(encoding.codec)
    except UnicodeEncodeError:
        refusal = untranslatable(sql, encoding)
        assert refusal is not None
        raise BackendError(refusal.sqlstate, refusal.message, hint=refusal.hint) from None


def _result_error(result: PGresult, encoding: ClientEncoding) -> BackendError:
    def field(code: pq.DiagnosticField) -> str | None:
        value = result.error_field(code)
        return value.decode(encoding.codec, "replace") if value is not None else None

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


def _connect_error(exc: psycopg.Error) -> BackendUnavailable:
    """A failure to open a backend connection, without libpq's text (host, port, role)."""
    log.warning("could not connect to the backend: %s", str(exc).strip())
    sqlstate = exc.diag.sqlstate or ""
    if sqlstate not in _TOLD_AT_CONNECT:
        text = str(exc)
        sqlstate = next((code for code, _ in _CONNECT_TEXTS if _ in text), "08006")
    return BackendUnavailable(sqlstate, _TOLD_AT_CONNECT.get(sqlstate, "could not connect to the backend database"),
                              hint=_SEE_LOG)


# libpq reports connection refusals as text only (no SQLSTATE): these are recognised.
_CONNECT_TEXTS = (
    ("53300", "too many clients already"),
    ("53300", "too many connections for "),
    ("53300", "remaining connection slots are reserved"),
    ("57P03", "the database system is starting up"),
    ("57P03", "the database system is shutting down"),
)


def _fields(result: PGresult, encoding: ClientEncoding) -> list[Field]:
    return [
        Field(
            name=(result.fname(i) or b"").decode(encoding.codec, "replace"),
            type_oid=result.ftype(i),
            type_size=result.fsize(i),
            type_modifier=result.fmod(i),
            table_oid=result.ftable(i),
            column_number=result.ftablecol(i),
            format=result.fformat(i),
        )
        for i in range(result.nfields)
    ]


def _tag(result: PGresult) -> str:
    return (result.command_status or b"").decode("utf-8")


def _settings_of(result: PGresult) -> State:
    """(name, setting) rows of ``_SESSION_SETTINGS_SQL`` as a state."""
    rows = []
    for r in range(result.ntuples):
        name, value = result.get_value(r, 0), result.get_value(r, 1)
        rows.append(((name or b"").decode("ascii"), bytes.fromhex((value or b"").decode("ascii")).decode("utf-8")))
    return tuple(rows)


async def build_registry(session: BackendSession, policy: Policy) -> TableRegistry:
    """Resolve the policy's tables on the backend: OIDs, columns, types; check the policy fits."""
    refs = {name: _policy_ref(name) for name in policy.tables}
    no_usage = await schemas_without_usage(session, {name: ref.schema for name, ref in refs.items()})
    for name, _ in no_usage:
        del refs[name]
    resolved = await session.resolve(refs.values())
    row_stores = await _row_stores(session, [target.oid for target in resolved.values() if target is not None])
    primary_keys = await _primary_keys(session, [target.oid for target in resolved.values() if target is not None])
    definitions = await column_facts(session, [target.oid for target in resolved.values() if target is not None])
    relations: dict[int, Relation] = {}
    names: dict[int, str] = {}
    problems: list[str] = await database_encoding_problems(session) + [problem for _, problem in no_usage]
    for name, table_policy in policy.tables.items():
        if name not in refs:
            continue  # in a schema the role cannot use: told above
        target = resolved.get(refs[name])
        if target is None:
            dotted = f" (a schema or table whose name holds a dot is written with {QUOTED_FORM})" \
                if '"' not in name and name.count(".") > 1 else ""
            problems.append(f"tables.{name}: no such relation on the backend{dotted}")
            continue
        columns = await _columns(session, definitions.get(target.oid, ()), table_policy.columns)
        for column_name, column_policy in table_policy.columns.items():
            info = columns.get(column_name)
            if info is None:
                close = difflib.get_close_matches(column_name, list(columns), n=1, cutoff=0.6)
                meant = f" (did you mean {close[0]}?)" if close else ""
                problems.append(f"tables.{name}.columns.{column_name}: no such column on the backend{meant}")
            else:
                fit = column_fit_problems(name, column_name, column_policy, info)
                found = fit or await _unreadable_labels(session, name, info) \
                    or await _equal_labels(session, name, target.oid, info) \
                    or unbounded_categories_problems(name, column_name, column_policy, info)
                problems += found
                if not found and column_policy.categories is not None:
                    columns[column_name] = replace(info, printed_labels=await _printed_labels(session, info))
        if table_policy.partitioning == "ctid_hash" and not row_stores.get(target.oid, False):
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
        names[target.oid] = name
    bounds = await _sort_memory(session, [oid for oid, relation in relations.items() if relation.access == "protected"])
    relations = {oid: replace(relation, sort_memory_kb=bounds[oid][0], sort_memory_tree=bounds[oid][1],
                              sort_memory_bases=bounds[oid][2]) if oid in bounds
                 else relation for oid, relation in relations.items()}
    problems += await public_reads_protected(session, relations, names)
    problems += await unreadable_protected(session, relations, names)
    problems += await failing_protected(session, relations, names)
    if problems:
        raise PolicyError(problems)
    for oid, relation in relations.items():  # asked of the view, so only once the service role can read it
        if relation.sort_memory_bases is None:  # a view that may compute its columns
            carried = await view_input_bytes(session, oid, relation.qualified_name, relation.columns)
            relations[oid] = replace(relation, view_input_bytes=carried)
    catalog_columns: dict[str, tuple[str, ...]] = {}  # each neutralised catalog's columns, as the backend has them
    for catalog in ("pg_class", "pg_database"):
        row = await session.fetch_row(
            "SELECT pg_catalog.array_agg(attname::pg_catalog.text ORDER BY attnum) FROM pg_catalog.pg_attribute "
            f"WHERE attrelid OPERATOR(pg_catalog.=) 'pg_catalog.{catalog}'::pg_catalog.regclass "
            "AND attnum OPERATOR(pg_catalog.>) 0 AND NOT attisdropped"
        )
        catalog_columns[catalog] = tuple(row[0])
    protected = {oid: definitions.get(oid, ()) for oid, relation in relations.items() if relation.access == "protected"}
    return TableRegistry(relations, catalog_columns["pg_class"], await function_names(session), definitions=protected,
                         pg_database_columns=catalog_columns["pg_database"])


async def function_names(session: BackendSession) -> frozenset[str]:
    """Every function name of the backend (``TableRegistry.function_names``)."""
    (names,) = await session.fetch_row(
        "SELECT pg_catalog.array_agg(DISTINCT proname::pg_catalog.text) FROM pg_catalog.pg_proc"
    )
    return frozenset(names)


async def _unreadable_labels(session: BackendSession, table: str, column: ColumnInfo) -> list[str]:
    """The column's categories (and ``other`` label) its type cannot read, or cannot compare.

    A query compares the column with each category, and a histogram sends its keys as values
    of the column's type: with one label the type cannot read (``unknown`` for a boolean, a
    value an enum lacks), every such query would fail on the backend after its charge.
    """
    policy = column.policy
    if policy is None or policy.categories is None:
        return []
    labels = [*policy.categories, *([policy.other] if policy.other is not None else [])]
    (type_name,) = await session.fetch_row("SELECT pg_catalog.format_type(%s, %s)", (column.type_oid, column.type_modifier))
    cast = f"SELECT CAST(v AS {type_name}) FROM pg_catalog.unnest(%s::pg_catalog.text[]) AS v"
    try:
        await session.fetch_all(cast, (labels,))
    except BackendError:
        pass
    else:
        problem = await label_comparison_problem(session, type_name, labels[0], bool(policy.group_by))
        if problem is None:
            return []
        return [f"tables.{table}.columns.{column.name}: categories need a type PostgreSQL can compare with a label "
                f"(MODE and a GROUP BY compare the column with each category{' and group by it' if policy.group_by else ''}); "
                f"{type_name} cannot be ({problem}), so every such query would fail after its charge"]
    unreadable = []
    for label in labels:
        try:
            await session.fetch_all(cast, ([label],))
        except BackendError as exc:
            unreadable.append(f"tables.{table}.columns.{column.name}: {label!r} is not a value of the column's type "
                              f"{type_name} ({exc.message})")
    return unreadable


async def _printed_labels(session: BackendSession, column: ColumnInfo) -> tuple[str, ...]:
    """The column's categories, then ``other``, each as PostgreSQL prints the value of the column's
    type read from it (its output function, which ``format('%s', ...)`` calls; a cast to text would
    drop a ``char(n)``'s padding and write a boolean as ``true``): what a MODE or a GROUP BY over the
    column answers in PostgreSQL for the rows equal to it (:meth:`ColumnInfo.labels`)."""
    policy = column.policy
    assert policy is not None and policy.categories is not None
    labels = [*policy.categories, *([policy.other] if policy.other is not None else [])]
    (type_name,) = await session.fetch_row("SELECT pg_catalog.format_type(%s, %s)", (column.type_oid, column.type_modifier))
    rows = await session.fetch_all(
        f"SELECT pg_catalog.format('%%s', CAST(v AS {type_name})) "
        "FROM pg_catalog.unnest(%s::pg_catalog.text[]) WITH ORDINALITY AS u(v, i) ORDER BY i", (labels,))
    return tuple(str(row[0]) for row in rows)


async def _equal_labels(session: BackendSession, table: str, relation: int, column: ColumnInfo) -> list[str]:
    """The pairs of the column's categories that are one value by its ``=``, under its collation.

    MODE counts each category, and a histogram puts a row in the cell of the first category it
    equals (``CASE WHEN col = 'Male' ... WHEN col = 'male' ...``): under a case-insensitive
    (nondeterministic) collation, or for ``char(n)`` (trailing spaces) or ``boolean`` (``t`` and
    ``true``), the second of two such labels would be a key no row can reach, answered as noise
    around nothing whatever the table holds. Each label is read as one (``_unreadable_labels``).
    """
    policy = column.policy
    if policy is None or policy.categories is None or len(policy.categories) < 2:
        return []
    (type_name, collation) = await session.fetch_row(
        "SELECT pg_catalog.format_type(%s, %s), (SELECT pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.||) '.' "
        "OPERATOR(pg_catalog.||) pg_catalog.quote_ident(c.collname) FROM pg_catalog.pg_attribute a "
        "JOIN pg_catalog.pg_collation c ON c.oid OPERATOR(pg_catalog.=) a.attcollation "
        "JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.collnamespace "
        "WHERE a.attrelid OPERATOR(pg_catalog.=) %s AND a.attnum OPERATOR(pg_catalog.=) %s)",
        (column.type_oid, column.type_modifier, relation, column.attnum))
    collate = f" COLLATE {collation}" if collation is not None else ""
    pairs = await session.fetch_all(
        f"SELECT a.v, b.v FROM pg_catalog.unnest(%s::pg_catalog.text[]) WITH ORDINALITY AS a(v, i), "
        f"pg_catalog.unnest(%s::pg_catalog.text[]) WITH ORDINALITY AS b(v, i) "
        f"WHERE a.i OPERATOR(pg_catalog.<) b.i "
        f"AND CAST(a.v AS {type_name}){collate} OPERATOR(pg_catalog.=) CAST(b.v AS {type_name}) ORDER BY a.i, b.i",
        (list(policy.categories), list(policy.categories)))
    under = f" under its collation {collation}" if collation is not None else ""
    return [f"tables.{table}.columns.{column.name}: categories {first!r} and {second!r} are one value of the column's "
            f"type {type_name}{under} (its = holds for them), so no row could be counted in {second!r}; "
            "declare one of them" for first, second in pairs]


async def _sort_memory(session: BackendSession, oids: list[int]) -> dict[int, tuple[int, bool, tuple[int, ...] | None]]:
    """Each relation's ``Relation.sort_memory_kb`` as its size is now (a view's, its bases'), whether
    it has partitions or inheritance children (``sort_memory_tree``), and the relations whose pages
    bound a view's rows (``sort_memory_bases``, proxy/backend/view_rows.py) (rewriter/sort_memory.py)."""
    if not oids:
        return {}
    rows = await session.fetch_all(
        f"SELECT c.oid, {sort_memory_kb_sql('CAST(c.oid AS pg_catalog.regclass)')}, "
        "c.relkind OPERATOR(pg_catalog.=) 'p' OR c.relhassubclass, "
        "c.relkind OPERATOR(pg_catalog.<>) ALL('{r,m,p}'::pg_catalog.\"char\"[]) "
        "FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[])", [oids])
    bounds: dict[int, tuple[int, bool, tuple[int, ...] | None]] = {}
    for oid, kb, tree, unpaged in rows:
        bases = await view_row_bases(session, int(oid)) if unpaged else ()
        if bases:
            (kb,) = await session.fetch_row(f"SELECT {sort_memory_kb_sql(bases)}")
        bounds[int(oid)] = (int(kb), bool(tree), bases)
    return bounds


async def _row_stores(session: BackendSession, oids: list[int]) -> dict[int, bool]:
    """The relations that store their rows themselves, each with whether sample and aggregate
    can partition its rows by a hash of their ctid.

    Tables, materialized views and partitioned tables have a ctid that stays put while other
    rows come and go (views have none; a foreign table's is not the remote row's), and the
    hash, ``hashtidextended``, exists from PostgreSQL 14 on.
    """
    if not oids:
        return {}
    rows = await session.fetch_all(
        "SELECT c.oid, pg_catalog.to_regprocedure('pg_catalog.hashtidextended(pg_catalog.tid,pg_catalog.int8)') "
        "IS NOT NULL FROM pg_catalog.pg_class c WHERE c.oid OPERATOR(pg_catalog.=) ANY(%s::pg_catalog.oid[]) "
        "AND c.relkind OPERATOR(pg_catalog.=) ANY('{r,m,p}'::pg_catalog.\"char\"[])",
        (oids,),
    )
    return {int(oid): bool(hashable) for oid, hashable in rows}


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
    return RelationRef(*key_parts(name))


async def _columns(session: BackendSession, definition: Definition, policies: Mapping[str, Any]) -> dict[str, ColumnInfo]:
    """A relation's columns as the rewriter judges them: its catalog facts, with what the backend
    says of their types (built in, countable by ``count(DISTINCT ...)``, a domain's base type, of
    unbounded length: ``type_support.value_types``; its name, ``type_support.type_names``) and the policy's."""
    builtin = await builtin_types(session, [column.type_oid for column in definition])
    # A foreign type's comparison parses and runs on a NULL, and may still fail on two values.
    countable = await distinct_countable(
        session, [(column.type_oid, column.type_modifier) for column in definition if column.type_oid in builtin])
    read_as = await value_types(session, [(column.type_oid, column.type_modifier) for column in definition])
    names = await type_names(session, [(column.type_oid, column.type_modifier) for column in definition])
    unknown = ValueType(0, -1, True)  # a type the catalog lacks is not read
    return {
        c.name: ColumnInfo(c.name, c.type_oid, c.type_modifier, c.attnum, policies.get(c.name), c.deterministic_collation,
                           c.array_type_oid, c.container, (c.type_oid, c.type_modifier) in countable, c.enum,
                           c.type_oid in builtin, *read_as.get((c.type_oid, c.type_modifier), unknown),
                           type_name=names.get((c.type_oid, c.type_modifier), ""), byte_order=c.byte_order,
                           collation=c.collation)
        for c in definition
    }
