"""The backend connection pool: client sessions borrow PostgreSQL connections, as
pgbouncer's transaction mode does, instead of each opening its own.

Contract
--------
* ``BackendPool.acquire(state)`` checks a connection out; ``release(conn, reusable)`` gives
  it back. The pool never holds more than ``backend.pool.size`` connections (in use and
  idle together). When all are in use, ``acquire`` waits in FIFO order for at most
  ``backend.pool.checkout_timeout_s`` and then raises ``PoolTimeout``.
* Which session holds a connection when is the caller's business (``BackendSession``):
  from the first statement of a transaction until the backend is idle again (ReadyForQuery
  'I'), outside a transaction for one client message cycle (a simple Query, or the
  extended protocol's messages up to Sync).
* Every connection carries ``state``: the session-level settings it has now (``SET``,
  ``set_config``, startup parameters), as sorted ``(name, value)`` pairs read from
  ``pg_settings`` (``source = 'session'``), or ``UNKNOWN``. ``acquire`` prefers an idle
  connection whose state is the caller's; otherwise the caller re-applies its own
  (``BackendSession``: ``RESET ALL`` and ``set_config`` in one round trip). GUCs are the only
  backend session state dpproxy lets a client create (rewriter/classify.py refuses PREPARE,
  DECLARE, LISTEN, temporary tables, advisory locks; client prepared statements and portals
  live in dpproxy), so a connection whose settings are the caller's carries nothing of
  another session. docs/deployment.md, "Backend connection pool", lists each kind of state.
* A connection is reused only if it is healthy, idle (not in or after a transaction),
  nothing was cancelled on it, and it was opened under the backend settings now in force
  (``dsn``, ``statement_timeout_ms``, ``connect_timeout_s``: a reload applies to new
  connections). Anything else is closed (``pool_discarded`` counts why). Idle connections
  whose socket the backend closed (a restart, ``pg_terminate_backend``) are noticed by their
  ``ResultWaiter``, which stays attached while the connection is idle, and are never handed out.
* Idle connections unused for ``backend.pool.idle_timeout_s`` are closed.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Final, Mapping

import psycopg
from psycopg import pq

from policies.model import BackendConfig
from proxy.ops import metrics
from proxy.wire.protocol import Notice

from .result_waiter import ResultWaiter

__all__ = ["PINNED_SETTINGS", "PINNED_WHERE_KNOWN", "UNKNOWN", "BackendPool", "PoolTimeout", "PooledConnection", "State", "open_backend"]

State = tuple[tuple[str, str], ...]
#: The state of a connection whose settings are not known (never equal to a session's).
UNKNOWN: Final[State] = (("", "unknown"),)

_OK = pq.ConnStatus.OK
_IDLE = pq.TransactionStatus.IDLE


PINNED_SETTINGS: Final[Mapping[str, str]] = {
    "default_transaction_read_only": "on",
    "default_transaction_deferrable": "on",
    # Only an analyst who asks for SERIALIZABLE waits for the operator's serializable writers
    # (proxy/serving/safe_snapshot.py); a role's default of it made every DP statement wait.
    "default_transaction_isolation": "read committed",
    "standard_conforming_strings": "on",
    "extra_float_digits": "1",
    "idle_in_transaction_session_timeout": "0",
    # A DP statement waits for the operator's locks (DDL, REINDEX, VACUUM truncation; on a standby,
    # all of them replayed) until statement_timeout: one on a table's TOAST relation or its index
    # is waited for only when a row read has a long value stored apart, so a lock_timeout of the
    # role's, the database's or postgresql.conf failed a DP statement (after its charge) exactly
    # on the neighbour holding such a row. A client can neither SET it nor forward it.
    "lock_timeout": "0",
    # No JIT: LLVM's compile of a long expression cannot be interrupted (open_backend).
    "jit_above_cost": "-1",
    # A histogram's release query takes its keys and values as text arrays ('{5,NULL}'): with
    # array_nulls off a NULL element was the text "NULL", and every histogram failed with 22P02.
    "array_nulls": "on",
    # dpproxy reads names and its own catalog answers as UTF-8 (a session's own client_encoding
    # is set on top); SQL_ASCII, passed through unconverted, refused the policy at load.
    "client_encoding": "UTF8",
    # A pooled connection is idle between checkouts: ended by the operator's timeout, the next
    # statement on it failed (and the policy's load, between its catalog queries).
    "idle_session_timeout": "0",
    # An analyst's error (a typo, 1/0) ended the backend connection and with it the client's session.
    "exit_on_error": "off",
    # Off, a protected table's row-level security policy is not bypassed: PostgreSQL fails every
    # query the policy would filter (42501), after dpproxy charged it.
    "row_security": "on",
    # A bounded value is read only where it is stored in the row (rewriter/text_bounds.py), which
    # its header tells; an index-only scan hands the check the index's copy, always in line, so a
    # value stored apart was read under that plan and NULL under any other, and the plan follows
    # the statistics and the visibility map, the whole table. A client can neither SET nor forward it.
    "enable_indexonlyscan": "off",
    # Every statement planned with its bound values, as PostgreSQL plans an unnamed statement by
    # default: a raw conjunct over a list of parameters (rewriter/raw_equality.py) is then a constant
    # array, hashed, which reads a row's value stored apart once. An operator's force_generic_plan
    # left it an array of parameters compared in turn, reading that value once a parameter: how
    # often the neighbour's row was read followed the statement. A client can neither SET nor forward it.
    "plan_cache_mode": "force_custom_plan",
}
"""The settings every backend connection starts with, whatever the role, the database or
postgresql.conf set (``RESET`` returns to them); ``statement_timeout`` comes from the policy.
Settings only a superuser can change (``temp_file_limit``, ``log_*``) cannot be pinned so."""


PINNED_WHERE_KNOWN: Final[Mapping[str, str]] = {
    # PostgreSQL 17: the time a whole transaction may take, ending the connection (FATAL). A
    # default of the role's, the database's or postgresql.conf failed a DP statement after its
    # charge when its rows took long (or, in a block, the rows and the quantum's wait together),
    # and a small one failed the policy's load. A client can neither SET it nor forward it.
    "transaction_timeout": "0",
    # PostgreSQL 17, and the minor releases of 12 to 16 since August 2024 (Debian's 15.18 has it):
    # 'view' failed every DP statement on a protected view, after its charge, whatever the rows.
    "restrict_nonsystem_relation_kind": "",
}
"""``PINNED_SETTINGS`` that not every supported server has: each backend connection starts with
those its server has (an unknown name in the startup options fails the connection), as
``_known_pins`` remembers per DSN and server version."""

# For each of PINNED_WHERE_KNOWN, the first minor release of each major version that has it;
# every major version after the last listed has it.
_SINCE: Final[Mapping[str, Mapping[int, int]]] = {
    "transaction_timeout": {17: 0},
    "restrict_nonsystem_relation_kind": {12: 20, 13: 16, 14: 13, 15: 8, 16: 4, 17: 0},
}

# Per DSN: the server version last connected to there and the PINNED_WHERE_KNOWN names its
# connections start with.
_known_pins: dict[str, tuple[int, frozenset[str]]] = {}


def _pins_of(version: int) -> frozenset[str]:
    """The names of ``PINNED_WHERE_KNOWN`` a server of ``version`` (``server_version_num``) has."""
    major, minor = divmod(version, 10000)
    return frozenset(name for name, since in _SINCE.items()
                     if major > max(since) or (major in since and minor >= since[major]))


def _opened_with(config: BackendConfig) -> tuple[object, ...]:
    """The backend settings a connection is opened with: a change means new connections."""
    return (config.dsn, config.statement_timeout_ms, config.connect_timeout_s)


async def open_backend(config: BackendConfig, settings: Mapping[str, str] | None = None) -> psycopg.AsyncConnection[Any]:
    """A read-only backend connection with a statement_timeout and no idle-in-transaction
    timeout, plus ``settings`` as startup options.

    Inside a block the backend is idle while a quantised DP answer waits for its boundary, for
    the quantum minus the time the rows took: a timeout of the role's, the database's or
    postgresql.conf ending the connection then would tell how long the rows took.

    Its transactions are DEFERRABLE by default (``rewriter.classify`` refuses NOT DEFERRABLE),
    which changes only SERIALIZABLE ones: a read-only serializable transaction that is not
    deferrable fails with 40001 when a concurrent serializable writer of the operator's changed
    a row it reads (PostgreSQL's read-only anomaly), so whether a DP query over ``id = 42``
    failed said whether row 42 was being written; and its predicate locks made the writers fail
    instead. A deferrable one waits for a snapshot no writer can make unsafe, then takes no
    predicate locks and cannot fail so.

    Its ``default_transaction_isolation`` is READ COMMITTED, PostgreSQL's own default, whatever
    the role, the database or postgresql.conf set: a session is SERIALIZABLE only when its
    analyst asked (``BackendSession.may_serialize`` knows so without asking the backend), so
    that dpproxy takes a serializable DP statement's snapshot before the charge only then
    (``proxy.serving.safe_snapshot``). A serializable default of the operator's would have made
    every DP statement wait for the operator's serializable writers.

    Its ``standard_conforming_strings`` is on, as dpproxy's parser reads every statement: off
    (a legacy role, database or postgresql.conf setting), PostgreSQL read ``'\\'' UNION ALL
    SELECT s FROM protected --'``, one string literal to dpproxy, as a query of the protected
    rows, passed through as catalog text. A client can neither SET it nor forward it, and RESET
    returns to this value.

    Its ``extra_float_digits`` is 1 unless the client's startup packet names another (dpproxy
    refuses one below 1 there, in SET and in set_config): ``RESET extra_float_digits`` returned
    to a default below 1 of the role's, the database's or postgresql.conf, the rounded float
    text the exact-floats rule keeps out of every exact aggregate dpproxy reads as text.

    It never compiles a statement with JIT (``jit_above_cost`` -1, which a client can neither
    SET nor forward; ``SET jit`` stays harmless): LLVM's compile of a long expression cannot be
    interrupted, and outlasts ``statement_timeout`` by minutes (a DP query with a 6,000-value
    IN list held its backend connection 150 s under a 2 s timeout on Debian's PostgreSQL 15),
    and whether PostgreSQL compiles at all follows the plan's cost, from the table's statistics.

    The other ``PINNED_SETTINGS`` keep a routine default of the operator's from breaking
    dpproxy for every row (tests/test_attack_operator_settings.py); ``PINNED_WHERE_KNOWN`` adds
    those of newer servers (17's ``transaction_timeout``) where the server has them.
    """
    dsn = config.dsn or ""
    # A DSN's first connection starts without them (an unknown name would fail it, and a server
    # older than 17 log a FATAL line at every start) and tells the server's version; the next
    # connections start with the names that version has (a name a server lacks anyway is left
    # out, and the connection tried again).
    version, pins = _known_pins.get(dsn, (0, frozenset()))
    retried = False
    while True:
        try:
            conn = await _connect(config, settings, pins)
        except psycopg.OperationalError as exc:
            # "unrecognized configuration parameter" in the server's language, naming it.
            unknown = frozenset(name for name in pins if name in str(exc))
            if unknown:
                pins -= unknown
                continue
            if version or retried:
                raise
            # Even a connection that runs nothing was ended within its own start by a default of
            # the operator's (a role's transaction_timeout of 1 ms, on a busy machine: as we read
            # PostgreSQL 17, setting it inside the start's transaction arms it). Once more, with
            # them all.
            retried, pins = True, frozenset(PINNED_WHERE_KNOWN)
            continue
        if conn.info.server_version != version:  # the first connection, or another server since
            version = conn.info.server_version
            if _pins_of(version) != pins:
                pins = _pins_of(version)
                await conn.close()
                continue
        _known_pins[dsn] = (version, pins)
        return conn


async def _connect(config: BackendConfig, settings: Mapping[str, str] | None,
                   versioned: frozenset[str]) -> psycopg.AsyncConnection[Any]:
    """``open_backend``'s connection with ``PINNED_SETTINGS`` and the ``versioned`` names of
    ``PINNED_WHERE_KNOWN`` as startup options."""
    options = {**PINNED_SETTINGS, **{name: PINNED_WHERE_KNOWN[name] for name in sorted(versioned)},
               "statement_timeout": str(config.statement_timeout_ms)}
    options.update(settings or {})
    return await psycopg.AsyncConnection.connect(
        config.dsn or "",
        autocommit=True,
        prepare_threshold=None,
        connect_timeout=max(1, int(config.connect_timeout_s)),
        options=" ".join(f"-c {_escape_option(k)}={_escape_option(v)}" for k, v in options.items()),
    )


def _escape_option(text: str) -> str:
    return text.replace("\\", "\\\\").replace(" ", "\\ ")


@dataclass(eq=False)
class PooledConnection:
    """One backend connection and what the pool and its current holder know about it."""

    conn: psycopg.AsyncConnection[Any]
    opened_with: tuple[object, ...]
    state: State = ()
    notices: list[str] = field(default_factory=list)
    cancelled: bool = False  # a CancelRequest was sent for it: never reused
    idle_since: float = 0.0
    waiter: ResultWaiter = field(init=False)

    def __post_init__(self) -> None:
        self.waiter = ResultWaiter(self.conn.pgconn)
        self.conn.add_notice_handler(lambda diag: self.notices.append(
            Notice(diag.message_primary or "", diag.severity_nonlocalized or "NOTICE", diag.sqlstate or "00000")))

    @property
    def healthy(self) -> bool:
        return self.conn.pgconn.status == _OK

    def reusable(self) -> str | None:
        """Why it must not be reused (a ``pool_discarded`` reason), or None if it may be."""
        if not self.healthy:
            return "lost"
        if self.cancelled:
            return "cancelled"
        if self.conn.pgconn.transaction_status != _IDLE or self.waiter.busy:
            return "in_transaction"
        return None


class PoolTimeout(Exception):
    """No connection became free within ``backend.pool.checkout_timeout_s``."""

    def __init__(self, waited_s: float, size: int):
        super().__init__(f"no backend connection free after {waited_s:g} s (pool size {size})")
        self.waited_s = waited_s
        self.size = size


class BackendPool:
    """Backend connections shared by all sessions of one server, opened on demand."""

    def __init__(self, config: Callable[[], BackendConfig]):
        """``config`` returns the backend settings in force (read afresh: a reload changes them)."""
        self._config = config
        self._idle: list[PooledConnection] = []  # least recently released first
        self._in_use = 0  # checked out, or being opened for a checkout
        self._waiters: deque[asyncio.Future[PooledConnection | None]] = deque()
        self._closing: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False
        # A session's startup settings as given → as the backend stores them (canonical_state).
        self._canonical: dict[State, State] = {}
        metrics.watch_pool(lambda: self._in_use, lambda: len(self._idle))

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def waiting(self) -> int:
        """Checkouts waiting now for a connection or a free slot."""
        return sum(not waiter.done() for waiter in self._waiters)

    def canonical_state(self, given: State) -> State:
        """The state ``given`` settings were last seen to produce on the backend, else ``given``."""
        return self._canonical.get(given, given)

    def learn_state(self, given: State, stored: State) -> None:
        if len(self._canonical) >= 1024:
            self._canonical.clear()
        self._canonical[given] = stored

    def acquire_idle(self, state: State) -> PooledConnection | None:
        """An idle connection at once, as ``acquire`` would take it first; None when none is idle."""
        conn = self._take_idle(state, self._config())
        if conn is not None:
            metrics.observe_pool_checkout(0.0)
            conn.notices.clear()
        return conn

    async def acquire(self, state: State) -> PooledConnection:
        """A connection for one checkout, preferably one whose settings are ``state``.

        Raises PoolTimeout when none became free in time, and psycopg.Error when a new
        connection could not be opened (the slot is freed for the next waiter).
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        config = self._config()
        deadline = started + config.pool.checkout_timeout_s
        while True:
            conn = self._take_idle(state, config)
            if conn is None and self._in_use + len(self._idle) < config.pool.size:
                self._in_use += 1
                try:
                    conn = PooledConnection(await open_backend(config), _opened_with(config), ())
                except BaseException:
                    self._in_use -= 1
                    self._wake_one()
                    raise
            if conn is not None:
                metrics.observe_pool_checkout(loop.time() - started)
                conn.notices.clear()
                return conn
            remaining = deadline - loop.time()
            if remaining <= 0:
                metrics.pool_timed_out()
                raise PoolTimeout(config.pool.checkout_timeout_s, config.pool.size)
            handed = await self._wait(remaining)
            if handed is not None:
                metrics.observe_pool_checkout(loop.time() - started)
                handed.notices.clear()
                return handed

    async def _wait(self, timeout: float) -> PooledConnection | None:
        """Wait for a released connection (returned) or a freed slot (None)."""
        waiter: asyncio.Future[PooledConnection | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait([waiter], timeout=timeout)
        except BaseException:
            self._unwait(waiter)
            raise
        if waiter.done():
            return waiter.result()
        self._unwait(waiter)
        return None

    def _unwait(self, waiter: asyncio.Future[PooledConnection | None]) -> None:
        """Stop waiting; a connection handed over meanwhile goes back to the pool."""
        if waiter.done() and not waiter.cancelled():
            handed = waiter.result()
            if handed is not None:
                self.release(handed, reusable=True)
            else:
                self._wake_one()
            return
        waiter.cancel()
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def _take_idle(self, state: State, config: BackendConfig) -> PooledConnection | None:
        """An idle connection, the most recently used with ``state`` first; stale ones are closed."""
        opened_with = _opened_with(config)
        expiry = config.pool.idle_timeout_s
        now = time.monotonic()
        for conn in list(self._idle):
            reason = "lost" if not conn.healthy else "config" if conn.opened_with != opened_with else None
            if reason is None and expiry and now - conn.idle_since > expiry:
                reason = "idle"
            if reason is not None:
                self._idle.remove(conn)
                self._discard(conn, reason)
        if not self._idle:
            return None
        chosen = next((c for c in reversed(self._idle) if c.state == state), self._idle[-1])
        self._idle.remove(chosen)
        self._in_use += 1
        return chosen

    def release(self, conn: PooledConnection, reusable: bool) -> None:
        """Give back a checked-out connection; it is closed unless ``reusable`` and fit for reuse."""
        self._in_use -= 1
        config = self._config()
        reason = conn.reusable() if reusable else "error"
        if reason is None and self._closed:
            reason = "closing"
        if reason is None and conn.opened_with != _opened_with(config):
            reason = "config"
        if reason is None and self._in_use + len(self._idle) >= config.pool.size:
            reason = "shrunk"  # a reload made the pool smaller
        if reason is not None:
            self._discard(conn, reason)
            self._wake_one()
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._in_use += 1
                waiter.set_result(conn)
                return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)
        self._schedule_sweep(config.pool.idle_timeout_s)

    def _wake_one(self) -> None:
        """A slot was freed: the first waiter may open a connection."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _discard(self, conn: PooledConnection, reason: str) -> None:
        metrics.pool_discarded(reason)
        conn.waiter.detach()
        task = asyncio.get_running_loop().create_task(_close(conn))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _schedule_sweep(self, idle_timeout_s: float) -> None:
        if self._sweeper is None and idle_timeout_s > 0:
            self._sweeper = asyncio.get_running_loop().call_later(idle_timeout_s, self._sweep)

    def _sweep(self) -> None:
        """Close the connections idle longer than ``idle_timeout_s``."""
        self._sweeper = None
        config = self._config()
        expiry = config.pool.idle_timeout_s
        now = time.monotonic()
        for conn in list(self._idle):
            if not expiry or now - conn.idle_since >= expiry or not conn.healthy:
                self._idle.remove(conn)
                self._discard(conn, "idle" if conn.healthy else "lost")
        if self._idle and expiry:
            oldest = min(conn.idle_since for conn in self._idle)
            self._sweeper = asyncio.get_running_loop().call_later(max(0.05, oldest + expiry - now), self._sweep)

    async def close(self) -> None:
        """Close the idle connections; those still checked out are closed when released."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in self._idle:
            self._discard(conn, "closing")
        self._idle.clear()
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=5)


async def _close(conn: PooledConnection) -> None:
    try:
        await conn.conn.close()
    except Exception:  # pragma: no cover - closing a broken connection is best effort
        pass
