"""One client connection, from the startup packet to Terminate.

Data flows one way: protocol bytes in → rewriter (split, resolve, classify) →
policies/budget → backend → mechanisms → protocol bytes out.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import ssl
from collections import Counter
from collections.abc import Iterator
from typing import Awaitable, Callable, Protocol

from policies.errors import SQLSTATE, Refusal
from proxy.backend.connection import (
    FORWARDED_STARTUP,
    BackendError,
    BackendLost,
    BackendSession,
    pooled_session,
    startup_key,
    startup_settings,
)
from proxy.backend.pool import BackendPool
from proxy.ops import metrics
from proxy.wire import protocol
from proxy.wire.encodings import client_encoding, encoding_named
from proxy.wire.auth import authenticate
from proxy.wire.client_hello import NO_APPLICATION_PROTOCOL_ALERT, ClientHello, read_client_hello
from proxy.wire.protocol import ProtocolError
from rewriter.catalog import ascii_safe_encoding, exact_floats
from rewriter.function_check import inexact_floats, unsafe_client_encoding
from rewriter.references import first_parameter
from rewriter.statements import Statement

from .executor import Executor, StatementHost
from .extended import ExtendedProtocol
from .startup_options import with_options
from .tls_handshake import refuse_buffered, start_tls_after
from .workers import session_pid

__all__ = ["STARTUP_KINDS", "Session", "SessionHost", "SessionTable"]

log = logging.getLogger("dpproxy.session")

_FLUSHING = frozenset({b"Q", b"S", b"H", b"F"})
# After these the backend connection goes back to the pool when the backend is idle: the
# messages answered with ReadyForQuery, and Flush. Between an extended-protocol Parse and
# its Sync the backend holds nothing of the session (statements and portals live in
# dpproxy; every backend request is complete), so a client that prepares with Flush
# (asyncpg) and waits does not keep a connection from the others.
_RELEASING = frozenset({b"Q", b"S", b"F", b"H"})
_ADMIN_SHUTDOWN = "terminating connection due to administrator command"
# Replies held for Sync/Flush are sent once they pass this size, and the session waits for
# the client to take them before it reads on: PostgreSQL too sends whenever its output buffer
# fills. Without it, Bind/Execute pairs of a few bytes each (or one Query of many statements)
# piled up results in memory until a Sync that never had to come: one client could exhaust
# the memory every session of the process shares.
_OUT_FLUSH_BYTES = 256 * 1024
_FATAL_DRAIN_S = 5.0
_UNENCRYPTED_AFTER_SSL_REQUEST = "received unencrypted data after SSL request"
_SLOW_CLIENT_S = 1.0
_NO_PARAMETER_HINT = ("A simple query (psql's, or a driver's without parameters) sends no value for $1, $2 …: "
                      "write each value as a literal, or bind it over the extended protocol (psql's \\bind, a "
                      "driver's parameters).")
# Kinds of startup settings whose ParameterStatus values are remembered (SessionHost.
# startup_reports), the oldest forgotten first: the key holds the client's values (any
# search_path), so a client logging in with new ones each time would grow it for good.
# Clients use a handful of kinds; a forgotten kind's next session borrows a connection at
# startup, as its first did.
STARTUP_KINDS = 256


class SessionTable:
    """The sessions that have started, by their BackendKeyData pid: where a CancelRequest goes.

    ``worker``: this process's number among ``listen.workers`` siblings (None: the only one);
    it is part of every pid handed out, and ``forward`` passes a CancelRequest for a sibling's
    session on (``proxy.serving.workers``).
    """

    def __init__(self, worker: int | None = None,
                 forward: Callable[[int, int], Awaitable[None]] | None = None) -> None:
        self._by_pid: dict[int, Session] = {}
        self.worker = worker
        self.forward = forward
        self.connections = 0
        """Client connections open now, in any phase (``listen.max_connections``)."""
        self._per_user: Counter[str] = Counter()
        self._cancelling: set[asyncio.Task[None]] = set()

    def admit(self, user: str, limit: int | None) -> bool:
        """Count one more session of ``user`` in, unless it has ``limit`` already (None: no limit).

        Counted from authentication to the session's end (``leave``), so that logins racing
        each other cannot pass the limit together.
        """
        if limit is not None and self._per_user[user] >= limit:
            return False
        self._per_user[user] += 1
        return True

    def leave(self, user: str) -> None:
        self._per_user[user] -= 1
        if not self._per_user[user]:
            del self._per_user[user]

    def new_pid(self) -> int:
        while True:
            pid = session_pid(self.worker)
            if pid not in self._by_pid:
                return pid

    def add(self, session: Session) -> None:
        self._by_pid[session.pid] = session
        metrics.connection_opened()

    def remove(self, session: Session) -> None:
        if self._by_pid.get(session.pid) is session:
            del self._by_pid[session.pid]
            metrics.connection_closed()

    async def cancel(self, pid: int, secret: int) -> None:
        """Cancel the backend query of the session with this key, here or at its worker.

        Returns at once, the cancel running apart: the CancelRequest's connection closes at the
        same time whatever the key found. Passing a cancel on to the backend takes a round trip
        when the session holds its connection (inside a block, while a quantised DP answer
        waits for its boundary) and none when it is put off to that boundary (while the backend
        computes); a connection left open until then would say which, and whether a guessed
        secret was right.
        """
        task = asyncio.ensure_future(self._route(pid, secret))
        self._cancelling.add(task)  # a reference, until it is done
        task.add_done_callback(self._cancelling.discard)

    async def _route(self, pid: int, secret: int) -> None:
        if pid in self._by_pid or self.forward is None:
            await self.cancel_here(pid, secret)
        else:
            await self.forward(pid, secret)

    async def cancel_here(self, pid: int, secret: int) -> None:
        """Cancel the backend query of this process's session with this key, if the secret matches."""
        session = self._by_pid.get(pid)
        if session is not None and session.secret == secret:
            await session.cancel()

    def __len__(self) -> int:
        return len(self._by_pid)

    def __iter__(self) -> Iterator[Session]:
        return iter(list(self._by_pid.values()))


class SessionHost(StatementHost, Protocol):
    """What a client connection needs from the server that accepted it."""

    database: str
    tls: ssl.SSLContext | None
    # ParameterStatus values by client startup settings (connection.startup_key), so that
    # sessions after the first of a kind borrow a backend connection only when they query.
    startup_reports: dict[tuple[tuple[str, str], ...], dict[str, str]]
    sessions: SessionTable
    pool: BackendPool


class Session:
    """Serves one client: authenticates it, then answers its queries until it leaves."""

    def __init__(self, server: SessionHost, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.server = server
        self.reader = reader
        self.writer = writer
        self.pid = server.sessions.new_pid()
        self.secret = secrets.randbits(31)
        self.user = ""
        self.backend: BackendSession | None = None
        self.executor: Executor | None = None
        self.extended: ExtendedProtocol | None = None
        self.peer = _peer(writer)
        self._reported: dict[str, str] = {}
        self._reported_generation = 0
        self._messages: protocol.MessageReader | None = None  # from the StartupMessage on
        self._out: list[bytes] = []
        self._out_counted = 0  # entries of _out whose sizes are in _out_bytes
        self._out_bytes = 0
        # For a graceful shutdown (Server.close): busy from a message's arrival until the
        # session waits for the next one; shut_down ends an idle session at once.
        self.busy = False
        self.shutting_down = False
        self._task: asyncio.Task[object] | None = None
        self._admitted = False  # counted among its user's sessions (SessionTable.admit)
        self._terminated = False  # the client said Terminate

    # ------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        self._task = asyncio.current_task()
        self.server.sessions.connections += 1
        try:
            try:
                async with asyncio.timeout(self.server.policy.listen.startup_timeout_s):
                    startup = await self._negotiate()
                    if startup is None:
                        return
                    await self._start(startup)
            except TimeoutError:
                raise ProtocolError("timeout during startup and authentication") from None
            await self._serve()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client went away; nothing to answer
        except asyncio.CancelledError:
            await self._fatal(SQLSTATE.ADMIN_SHUTDOWN, _ADMIN_SHUTDOWN)
        except ProtocolError as exc:
            await self._fatal(exc.sqlstate, exc.message)
        except Refusal as exc:
            await self._fatal(exc.sqlstate, exc.message, exc.hint)
        except BackendError as exc:  # no connection to the backend (BackendLost, or none at startup)
            await self._fatal(exc.sqlstate, exc.message, exc.hint)
        except Exception:
            log.exception("session %s failed", self.peer)
            await self._fatal(SQLSTATE.INTERNAL_ERROR, "internal error in dpproxy")
        finally:
            self.server.sessions.connections -= 1
            await self._close()

    async def _negotiate(self) -> protocol.Startup | None:
        """Answer SSL/GSSENC requests until the StartupMessage (None: it was a CancelRequest,
        or a connection to close without a word).

        SSLRequest gets 'S' and a TLS handshake when the policy configures TLS, else 'N';
        GSSENCRequest always gets 'N'. A TLS handshake as the connection's first bytes (direct
        TLS) is taken when TLS is configured and the client offers ALPN ``postgresql``, and is
        otherwise closed, logged, as PostgreSQL 17 does.
        """
        limit = self.server.policy.listen.max_message_bytes
        encrypted = False
        for attempt in range(3):
            head = b""
            if attempt == 0:
                head = await self.reader.readexactly(1)
                if head == protocol.TLS_HANDSHAKE:
                    if not await self._direct_tls():
                        return None
                    encrypted = True
                    continue
            startup = await protocol.read_startup(self.reader, limit, head)
            if startup.code == protocol.SSL_REQUEST and self.server.tls is not None and not encrypted:
                # A client waits for 'S' before its handshake: bytes already read past the
                # SSLRequest came in plaintext, and after start_tls they would be read as if
                # they had come through TLS (a man in the middle's injected StartupMessage
                # would pass tls.required). PostgreSQL refuses them too (CVE-2021-23214).
                refuse_buffered(self.reader, _UNENCRYPTED_AFTER_SSL_REQUEST)
                self.writer.write(b"S")
                await self.writer.drain()
                # and what arrived while 'S' was being sent
                refuse_buffered(self.reader, _UNENCRYPTED_AFTER_SSL_REQUEST)
                try:
                    hello = await read_client_hello(self.reader)
                    if self._alpn_refused(hello, "TLS connection"):
                        return None
                    await start_tls_after(self.reader, self.writer, self.server.tls, hello.records)
                except (ssl.SSLError, ProtocolError) as exc:
                    # As PostgreSQL: a log line, and no plaintext ErrorResponse to a client that
                    # had 'S' and speaks TLS (it sees the TLS alert, if any), as on the direct path.
                    log.warning("closed a TLS connection from %s: the handshake failed: %s", self.peer, exc)
                    return None
                encrypted = True
                continue
            if startup.code in (protocol.SSL_REQUEST, protocol.GSSENC_REQUEST):
                self.writer.write(protocol.SSL_NOT_SUPPORTED)
                await self.writer.drain()
                continue
            if startup.code == protocol.CANCEL_REQUEST:
                await self.server.sessions.cancel(startup.cancel_pid, startup.cancel_secret)
                return None
            tls = self.server.policy.listen.tls
            if tls is not None and tls.required and not encrypted:
                raise Refusal(SQLSTATE.INVALID_AUTHORIZATION, "dpproxy requires TLS: connect with sslmode=require",
                              "Set sslmode=require (or verify-full) in the client's connection settings.")
            return startup
        raise ProtocolError("too many SSL/GSSENC requests")

    async def _direct_tls(self) -> bool:
        """The connection began with a TLS handshake: do it (True), or refuse it with a log line
        and nothing to the client, which speaks TLS and could read no ErrorResponse (False).

        As on PostgreSQL 17: refused when TLS is not configured, when the handshake fails, and
        when the client does not offer ALPN ``postgresql`` (a client of another protocol, say
        HTTPS, sent here must not get as far as a startup packet): offering others, with the
        alert no_application_protocol; offering none, once the handshake is done.
        """
        if self.server.tls is None:
            log.warning("closed a direct TLS connection from %s: TLS is not configured (listen.tls); "
                        "the client must connect without sslnegotiation=direct", self.peer)
            return False
        try:
            hello = await read_client_hello(self.reader, protocol.TLS_HANDSHAKE)
            if self._alpn_refused(hello, "direct TLS connection"):
                return False
            alpn = await start_tls_after(self.reader, self.writer, self.server.tls, hello.records)
        except (ssl.SSLError, ProtocolError) as exc:
            log.warning("closed a direct TLS connection from %s: the handshake failed: %s", self.peer, exc)
            return False
        if alpn != protocol.TLS_ALPN:
            log.warning('closed a direct TLS connection from %s: the client offered no ALPN protocol '
                        '(direct TLS needs "%s")', self.peer, protocol.TLS_ALPN)
            return False
        return True

    def _alpn_refused(self, hello: ClientHello, what: str) -> bool:
        """Whether ``hello`` offers ALPN protocols without ``postgresql``: then, as PostgreSQL
        17 does, the handshake is answered with the fatal alert no_application_protocol and
        the connection is to be closed (a ClientHello without ALPN is not refused here)."""
        if hello.alpn is None or protocol.TLS_ALPN.encode() in hello.alpn:
            return False
        log.warning('closed a %s from %s: the client offered ALPN protocols without "%s"',
                    what, self.peer, protocol.TLS_ALPN)
        self.writer.write(NO_APPLICATION_PROTOCOL_ALERT)
        return True

    async def _start(self, startup: protocol.Startup) -> None:
        params = startup.parameters
        self.user = params.get("user", "")
        if not self.user:
            raise Refusal(SQLSTATE.INVALID_AUTHORIZATION, "no PostgreSQL user name specified in startup packet")
        policy = self.server.policy
        if self.server.sessions.connections > policy.listen.max_connections:
            raise Refusal(SQLSTATE.TOO_MANY_CONNECTIONS, "sorry, too many clients already",
                          "Try again later; an administrator can raise listen.max_connections.")
        negotiated = protocol.negotiate_protocol_version(startup)
        if negotiated is not None:
            self.writer.write(negotiated)  # before authentication, as PostgreSQL sends it
        # Held in the output buffer, so a refusal below is still preceded by them.
        account = policy.users.get(self.user)
        # Read from here on by one MessageReader, which _serve goes on with: what a client sent
        # after its password (pipelined) is kept.
        self._messages = protocol.MessageReader(self.reader, policy.listen.max_message_bytes)
        self._out.append(await authenticate(self._messages, self.writer, self.user, account))
        assert account is not None  # authenticate refuses a user the policy does not name
        if not self.server.sessions.admit(self.user, account.max_sessions):
            raise Refusal(SQLSTATE.TOO_MANY_CONNECTIONS, f'too many connections for role "{self.user}"',
                          f"{self.user} may have {account.max_sessions} sessions open at once "
                          "(users.<name>.max_sessions): close one first.")
        self._admitted = True
        database = params.get("database") or self.user
        if database != self.server.database:
            raise Refusal(
                SQLSTATE.INVALID_CATALOG_NAME,
                f'database "{database}" does not exist',
                f'dpproxy serves the database "{self.server.database}".',
            )
        # By the setting names the backend session takes them under: PostgreSQL reads a
        # startup parameter's name in any case (Extra_Float_Digits), and so does
        # startup_settings, so the checks must see the values that will be applied.
        params, ignored = with_options(params, FORWARDED_STARTUP)
        settings = startup_settings(params)
        if not exact_floats("extra_float_digits", settings.get("extra_float_digits", "1")):
            raise inexact_floats()
        # PostgreSQL reads dpproxy's UTF-8 text in this encoding: only one that reads every
        # ASCII byte as itself (rewriter.catalog.ascii_safe_encoding).
        encoding = settings.get("client_encoding")
        if encoding is not None and not ascii_safe_encoding(encoding):
            raise unsafe_client_encoding(encoding)
        key = startup_key(settings)
        known = self.server.startup_reports.get(key)
        application_name = _application_name(params.get("application_name", ""))
        reported = None if known is None else dict(known, application_name=application_name)
        self.backend = pooled_session(self.server.pool, settings, reported)
        # A statement waiting for a pooled connection is dropped if its client goes meanwhile.
        self.backend.client_gone = self._messages.closed
        if known is None:
            # The first session of its kind borrows a connection now: its parameters are
            # needed at once (and a backend that refuses them refuses the session).
            await self.backend.connection()
            reports = self.server.startup_reports
            while len(reports) >= STARTUP_KINDS:
                del reports[next(iter(reports))]
            reports[key] = self.backend.reported_parameters()
            await self.backend.release()
        self.executor = Executor(self.server, self.backend, self.user, self.peer)
        self.executor.settings.start(params, policy)  # a startup dpproxy.epsilon, checked as SET checks it
        self.extended = ExtendedProtocol(self.executor, self._out, self._flush_if_large)
        self.executor.deallocate = self.extended.deallocate
        self.executor.portal_exists = self.extended.portals.__contains__
        self._reported = self._client_parameters()
        self._out.append(protocol.parameter_statuses(self._reported))
        client_encoding.set(encoding_named(self._reported.get("client_encoding")))
        self._out.append(protocol.backend_key_data(self.pid, self.secret))
        self._out.extend(protocol.notice_response(protocol.Notice(text, "WARNING", "01000")) for text in ignored)
        self._out.append(protocol.ready_for_query(b"I"))
        self._flush()
        await self.writer.drain()
        self.server.sessions.add(self)
        log.info("session %s user=%s connected", self.peer, self.user)

    def _client_parameters(self) -> dict[str, str]:
        assert self.backend is not None
        values = self.backend.reported_parameters()
        # The client sees itself, not the service role dpproxy uses on the backend.
        values["session_authorization"] = self.user
        values["is_superuser"] = "off"
        return values

    async def _close(self) -> None:
        self.busy = False  # its statements are over: a shutdown need not wait for the close
        self.server.sessions.remove(self)
        if self._admitted:
            self._admitted = False
            self.server.sessions.leave(self.user)
        if self.executor is not None:
            # Results left unfinished: closed by the client's Terminate, else cut off by a
            # shutdown (57P01) or by the client going away (08006).
            cut_off = SQLSTATE.ADMIN_SHUTDOWN if self.shutting_down else "08006"
            self.executor.close(None if self._terminated else cut_off)
        await self._give_back_backend()
        try:
            unsent = self.writer.transport.get_write_buffer_size()
            self.writer.close()
            if unsent or self.writer.get_extra_info("ssl_object") is not None:
                # What is still unsent (or TLS's closing handshake) goes out first; a client that
                # reads nothing gets its connection cut instead of keeping the session's task and
                # socket for ever.
                await asyncio.wait_for(self.writer.wait_closed(), _FATAL_DRAIN_S)
            else:
                # A plain socket with nothing to send closes at once: no timer, and no task for
                # wait_for to run it in (a fifth of what a connection's close cost).
                await self.writer.wait_closed()
        except TimeoutError:
            self.writer.transport.abort()
        except (ConnectionError, OSError):
            pass

    async def _give_back_backend(self) -> None:
        if self.backend is not None:
            try:
                await self.backend.close()
            except Exception:  # pragma: no cover - best effort on teardown
                log.debug("closing backend failed", exc_info=True)

    async def _fatal(self, sqlstate: str, message: str, hint: str | None = None) -> None:
        try:
            self._flush()
            self.writer.write(protocol.error_response(sqlstate, message, hint, severity="FATAL"))
        except (ConnectionError, OSError):
            return
        # The backend connection goes back before the session waits for the client to take
        # this last message, and that wait is bounded: a client that reads nothing must keep
        # neither a pooled connection nor the session.
        await self._give_back_backend()
        try:
            await asyncio.wait_for(self.writer.drain(), _FATAL_DRAIN_S)
        except (ConnectionError, OSError, TimeoutError):
            pass

    # ------------------------------------------------------------ message loop

    async def _serve(self) -> None:
        messages = self._messages
        assert messages is not None and self.executor is not None and self.extended is not None
        # A reload may have changed the limit since authentication.
        messages.max_bytes = self.server.policy.listen.max_message_bytes
        while True:
            self.busy = False
            if self.shutting_down:
                await self._fatal(SQLSTATE.ADMIN_SHUTDOWN, _ADMIN_SHUTDOWN)
                return
            if not messages.has_message():
                # About to wait for the client, who may send no Sync or Flush for as long as it
                # likes after a Parse (which resolves names on the backend), Bind or Execute:
                # outside a block the connection goes back to the pool first, or pool.size
                # such clients would leave every other session with 53300.
                await self.executor.backend.release()
            kind, payload = await self._next_message(messages)
            self.busy = True
            if kind in (b"Q", b"F") and self.extended.skipping:
                # As PostgreSQL: after an extended-protocol error every message up to Sync is
                # ignored, a Query too (run, a DP one was charged for a statement never run there).
                continue
            if kind == b"Q":
                self.extended.forget_unnamed()
                try:
                    sql = protocol.decode_cstring(payload, "Query")
                except protocol.InvalidText as exc:
                    self._error(exc.sqlstate, exc.message, exc.hint)  # the statement fails, the session goes on
                    ok = False
                else:
                    ok = await self._simple_query(sql)
                if not ok:
                    await self.executor.fail_block()  # an error fails the block it came in
                await self._end_implicit(ok)  # its own, or that of an extended-protocol pipeline before it
                self.extended.sync()  # a COMMIT or ROLLBACK in it ended the block's portals
                self._ready()
            elif kind == b"S":
                # The pipeline's implicit transaction ends, rolled back if a message of it failed,
                # and its portals with it: abandoned first, not read to their end for the COMMIT.
                if self.executor.implicit:
                    self.extended.end_portals()
                await self._end_implicit(not self.extended.skipping)
                self.extended.sync()
                self._ready()
            elif kind == b"F":
                self._error(SQLSTATE.FEATURE_NOT_SUPPORTED, "the FunctionCall message is not supported by dpproxy")
                await self.executor.fail_block()  # an error fails the block it came in
                await self._end_implicit(False)
                self._ready()
            elif kind in (b"P", b"B", b"D", b"E", b"C", b"H"):
                failed_before = self.extended.skipping
                await self.extended.handle(kind, payload)
                if self.extended.skipping and not failed_before:
                    await self.executor.fail_block()  # an error fails the block it came in
                    # As PostgreSQL: the error goes out at once (with the replies before it), not
                    # at the Sync, so a client that waits for each reply without sending Sync or
                    # Flush learns that the rest of its pipeline will be ignored.
                    self._flush()
                await self._flush_if_large()
            elif kind == b"X":
                self._terminated = True
                return
            elif kind in (b"d", b"c", b"f"):
                continue  # stray COPY data outside COPY is ignored, as PostgreSQL does
            else:
                raise ProtocolError(f"invalid frontend message type {kind!r}")
            if kind in _FLUSHING and self._out:
                # Like PostgreSQL, replies to Parse/Bind/Describe/Execute wait for Sync or Flush.
                self._flush()
            if kind in _RELEASING:
                # The client has its answer: outside a transaction block the backend connection
                # goes back to the pool (proxy/backend/pool.py), before the session waits for
                # the client to take the answer: a client that does not read must not keep a
                # connection from the others.
                await self.executor.backend.release()
            if kind in _FLUSHING:
                await self._drain()

    async def _next_message(self, messages: protocol.MessageReader) -> tuple[bytes, bytes]:
        """The next message, within the idle timeouts when the policy sets them."""
        listen = self.server.policy.listen
        if not (listen.idle_timeout_s or listen.idle_in_transaction_timeout_s):
            return await messages.next()
        # A suspended portal whose statement still runs holds a connection as a block does.
        # So does a cursor WITH HOLD on the backend (pinned).
        backend = self.executor.backend if self.executor is not None else None
        in_transaction = self._status_byte() != b"I" or (backend is not None and (backend.streaming or backend.pinned))
        timeout = listen.idle_in_transaction_timeout_s if in_transaction else listen.idle_timeout_s
        if not timeout:
            return await messages.next()
        try:
            return await asyncio.wait_for(messages.next(), timeout)
        except TimeoutError:
            if in_transaction:
                raise Refusal(SQLSTATE.IDLE_IN_TRANSACTION_TIMEOUT,
                              "terminating connection due to idle-in-transaction timeout") from None
            raise Refusal(SQLSTATE.IDLE_SESSION_TIMEOUT, "terminating connection due to idle-session timeout") from None

    def _status_byte(self) -> bytes:
        return self.executor.transaction_status() if self.executor is not None else b"I"

    def _flush(self) -> None:
        if self.writer.transport.is_closing():
            # The client has gone (its socket reset or closed under a write): uvloop's write
            # would raise RuntimeError, ending a routine disconnect as an internal error.
            raise ConnectionResetError("the client closed its connection")
        self.writer.write(b"".join(self._out))
        self._out.clear()
        self._out_counted = self._out_bytes = 0

    async def _flush_if_large(self) -> None:
        """Send the held replies once they exceed _OUT_FLUSH_BYTES, and wait for the client."""
        out = self._out
        if len(out) < self._out_counted:  # pragma: no cover - only _flush empties it
            self._out_counted = self._out_bytes = 0
        self._out_bytes += sum(map(len, itertools.islice(out, self._out_counted, None)))
        self._out_counted = len(out)
        if self._out_bytes > _OUT_FLUSH_BYTES:
            self._flush()
            assert self.executor is not None
            backend = self.executor.backend
            await backend.release()  # kept inside a transaction block, and while rows still arrive
            if backend.streaming and self._status_byte() == b"I":
                # Rows arriving for a client that does not take them keep a pooled connection
                # from the others: past a moment, the rest is held (up to a cap) and the
                # connection given back, as for a result that came whole.
                try:
                    await asyncio.wait_for(self.writer.drain(), _SLOW_CLIENT_S)
                    return
                except TimeoutError:
                    await backend.hold_stream()
                    await backend.release()
            await self._drain()

    async def _drain(self) -> None:
        """Wait until the client has taken what was written (the transport's buffer is low).

        While it waits the session may hold a backend connection of the pool, and then the
        wait is bounded. Inside a transaction block, like an idle one, by
        ``listen.idle_in_transaction_timeout_s`` when the policy sets it. While a statement's
        rows are passed on as they arrive (its statement still running on the connection), by
        the backend's ``statement_timeout``: rows the client does not take keep a statement
        running no longer than PostgreSQL lets one run.
        """
        assert self.executor is not None
        policy = self.server.policy
        streaming = self.executor.backend.streaming
        in_block = self._status_byte() != b"I"
        bounds = [policy.listen.idle_in_transaction_timeout_s if in_block else 0.0,
                  policy.backend.statement_timeout_ms / 1000 if streaming else 0.0]
        timeout = min((b for b in bounds if b), default=0.0)
        if not timeout:
            await self.writer.drain()
            return
        try:
            await asyncio.wait_for(self.writer.drain(), timeout)
        except TimeoutError:
            if streaming and timeout == bounds[1]:
                raise Refusal(SQLSTATE.QUERY_CANCELED,
                              "terminating connection: the client did not read its statement's rows "
                              "within the backend's statement timeout",
                              "Read results as they arrive; an administrator can raise "
                              "backend.statement_timeout_ms.") from None
            raise Refusal(SQLSTATE.IDLE_IN_TRANSACTION_TIMEOUT,
                          "terminating connection due to idle-in-transaction timeout") from None

    def _ready(self) -> None:
        """ReadyForQuery, preceded by ParameterStatus for any reported setting that changed."""
        assert self.executor is not None
        if self.executor.generation != self._reported_generation:
            self._reported_generation = self.executor.generation
            current = self._client_parameters()
            self._out.extend(
                protocol.parameter_status(name, value)
                for name, value in current.items()
                if self._reported.get(name) != value
            )
            self._reported = current
            # The client reads and writes in a new client_encoding from here on; so does dpproxy.
            client_encoding.set(encoding_named(current.get("client_encoding")))
        self._out.append(protocol.ready_for_query(self.executor.transaction_status()))

    async def _simple_query(self, sql: str) -> bool:
        """Run a Query message's statements; False if one failed (those after it did not run).
        The session then ends the implicit transaction they ran in, if any (``_end_implicit``)."""
        assert self.executor is not None
        try:
            statements = await self.executor.split(sql)
        except Refusal as exc:
            self._error(exc.sqlstate, exc.message, exc.hint)
            return False
        if not statements:
            self._out.append(protocol.empty_query_response())
            return True
        for statement in statements:
            # As in PostgreSQL, several statements in one Query run in an implicit transaction
            # (an extended-protocol pipeline before it may have opened it already); one that a
            # COMMIT or ROLLBACK among them ends is followed by another for the rest.
            if len(statements) > 1 and self.executor.transaction_status() == b"I":
                try:
                    await self.executor.begin_implicit()
                except BackendLost:
                    raise
                except BackendError as exc:  # no connection came (53300, or a cancel while waiting: 57014)
                    self._error(exc.sqlstate, exc.message, exc.hint, exc.detail)
                    return False
            ok = await self._run_simple(statement)
            await self._flush_if_large()
            if not ok:
                return False
        return True

    async def _end_implicit(self, committed: bool) -> None:
        """End the implicit transaction open, if any (executor.end_implicit): at the end of a
        simple Query, and at Sync (rolled back if an error came since the last one)."""
        assert self.executor is not None
        try:
            await self.executor.end_implicit(committed)
        except BackendLost:
            raise
        except BackendError as exc:  # the COMMIT failed: the client is told, as PostgreSQL tells it
            self._error(exc.sqlstate, exc.message, exc.hint, exc.detail)

    async def _run_simple(self, statement: Statement) -> bool:
        assert self.executor is not None
        if statement.references.params and statement.kind != "PrepareStmt":
            # No Bind supplies a $n of a simple Query: PostgreSQL's parse analysis fails it (42P02)
            # before anything runs. Run as it was, the backend's own Bind said "bind message
            # supplies 0 parameters" (08P01), a protocol error the analyst never sent.
            self._error(SQLSTATE.UNDEFINED_PARAMETER, f"there is no parameter ${first_parameter(statement.node)}",
                        _NO_PARAMETER_HINT)
            return False
        try:
            plan = await self.executor.plan(statement)
            result, notices = await self.executor.run(plan, simple=True)
        except Refusal as exc:
            self._error(exc.sqlstate, exc.message, exc.hint)
            return False
        except BackendLost:
            raise  # the session cannot go on without its backend connection: FATAL, then close
        except BackendError as exc:
            self._error(exc.sqlstate, exc.message, exc.hint, exc.detail)
            return False
        self._out.extend(protocol.notice_response(text) for text in notices)
        if result.fields:
            self._out.append(protocol.row_description(result.fields))
            if result.stream is None:
                self._out.extend(result.data_rows())
        tag = result.tag
        if result.stream is not None:
            # Rows then the statement's error, if it fails on the way, as PostgreSQL sends them.
            try:
                async for rows in result.stream.take():
                    self._out.extend(rows)
                    await self._flush_if_large()
            except BackendLost:
                raise
            except BackendError as exc:
                self._error(exc.sqlstate, exc.message, exc.hint, exc.detail)
                return False
            tag = result.stream.tag
        if result.copy is not None:
            self._out.append(result.copy)
        self._out.append(protocol.command_complete(tag))
        return True

    def _error(self, sqlstate: str, message: str, hint: str | None = None, detail: str | None = None) -> None:
        self._out.append(protocol.error_response(sqlstate, message, hint, detail))

    async def cancel(self) -> None:
        if self.executor is not None:
            await self.executor.cancel()  # deferred to the quantum's boundary during a quantised DP answer
        elif self.backend is not None:
            await self.backend.cancel()

    def shut_down(self) -> None:
        """End this session with FATAL 57P01: at once if it is waiting for a message, else
        right after it has answered the message it is handling."""
        self.shutting_down = True
        if not self.busy and self._task is not None:
            self._task.cancel()


def _application_name(value: str) -> str:
    """application_name as PostgreSQL stores it: printable ASCII only, at most 63 bytes."""
    return "".join(c if 32 <= ord(c) <= 126 else "?" for c in value)[:63]


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer or "local")
