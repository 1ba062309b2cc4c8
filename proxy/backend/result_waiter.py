"""Waiting for libpq results on the event loop with one socket registration per connection.

psycopg's own async wait registers the backend socket with the event loop for every wait
and removes it afterwards, and arms a timer: with uvloop that is a new poll handle (ioctl,
fcntl) and three epoll_ctl calls per query, about a sixth of dpproxy's CPU per query on a
small table (benchmarks/profile.md). A ResultWaiter keeps the socket registered while the
connection lives and reads results from the readiness callback; it works on psycopg's
libpq connection (``psycopg.pq.PGconn``), so the wire protocol stays libpq's.

When libpq finds the connection lost it closes the socket at once, and the kernel may hand
its file descriptor number to the next connection opened (another session's). The waiter
therefore stops watching the descriptor in the same callback that sees the loss, and never
watches a descriptor again once its connection is bad: a stale registration would steal or
remove the readiness callback of that other connection, leaving its session waiting forever.

Even so, under a backend restart with many sessions querying, a readiness event was seen to
go missing now and then (a socket at EOF, its reader registered, no callback; the cause was
not found). So, as a safety net, a request in flight has its socket read, and its reader
registered afresh, once every ``RECHECK_S`` seconds by one timer per event loop: a missed
event delays an answer or a lost connection by at most that long, never for ever.

A request whose result may be too large to hold (a passthrough statement in libpq's chunked
rows mode) is read one result at a time instead (``start``, ``next_result``): between two
calls the socket is not read at all, so while the caller is slow to pass rows on (its client
reads slowly), the backend's rows wait in the kernel's socket buffers and then in
PostgreSQL, not in dpproxy's memory.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Callable, Final

from psycopg import errors, pq

__all__ = ["NotSent", "ResultWaiter"]

_ExecStatus = pq.ExecStatus
_STOP_AFTER = (_ExecStatus.COPY_IN, _ExecStatus.COPY_OUT, _ExecStatus.COPY_BOTH)
_OK = pq.ConnStatus.OK

RECHECK_S: Final = 1.0
"""How often the safety net reads the sockets of requests still in flight."""


class NotSent(Exception):
    """A request was not sent: the connection was already lost (``__cause__`` says how)."""


class ResultWaiter:
    """Sends one request at a time on a nonblocking PGconn and awaits its results.

    While attached, the socket's readiness callback consumes input whether or not a request
    is in flight (so notices and a closed connection are noticed at once). Code that lets
    psycopg drive the same socket must ``detach()`` first and ``attach()`` after, because
    the event loop keeps one reader per file descriptor.
    """

    def __init__(self, pgconn: pq.abc.PGconn):
        self._pgconn = pgconn
        self._fd = pgconn.socket
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: asyncio.Future[list[pq.abc.PGresult]] | None = None
        self._results: list[pq.abc.PGresult] = []
        self._failure: Exception | None = None
        self._streaming = False
        self._until_sync = False  # the request in flight is a pipeline: its results end at its Sync

    @property
    def busy(self) -> bool:
        """A request is in flight (or its results are still being read after its caller left)."""
        return self._pending is not None or self._streaming

    @property
    def streaming(self) -> bool:
        """A request sent with ``start`` has results not yet read with ``next_result``."""
        return self._streaming

    def attach(self) -> None:
        """Start watching the socket (idempotent; never once the connection is lost)."""
        if self._loop is None and self._failure is None and self._pgconn.status == _OK:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self._fd, self._readable)

    def detach(self) -> None:
        """Stop watching the socket, e.g. before psycopg waits on it itself."""
        if self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._loop = None

    def read_idle(self) -> None:
        """With no request in flight, read now what the backend sent since (a FATAL, then the end
        of the stream) instead of waiting for the loop's next readiness callback, so that the
        connection's status is current: the loop can read a FATAL in one turn and the close in
        the next, and a request taken in between believed the connection alive."""
        if self._loop is not None and not self.busy:
            self._readable()

    async def round_trip(self, send: Callable[[], None]) -> list[pq.abc.PGresult]:
        """Send a request with ``send`` (a libpq ``send_*`` call) and return all its results.

        Raises NotSent if the connection was lost before the request left, and
        psycopg.OperationalError if it is lost afterwards. Callers serialise
        requests (one in flight at a time), as libpq requires; a request whose caller was
        cancelled is still read to its end before the next one is sent.
        """
        await self._send(send)
        assert self._loop is not None
        pending = self._pending = self._loop.create_future()
        self._results = []
        # A result may already be buffered; and libpq may have found the connection lost
        # while sending (it reads the server's last words when a write fails), closing the
        # socket outside any readiness callback: stop watching it now, not at session end.
        self._collect()
        self._fail_if_lost()
        watchdog = _watchdog(self._loop)
        watchdog.add(self)
        try:
            results = await pending
        except asyncio.CancelledError:
            if self._pending is pending and self._failure is None:
                # Cancelling the task cancelled ``pending``; keep reading into a fresh future.
                self._pending = self._loop.create_future()
            raise
        finally:
            watchdog.discard(self)
        self._pending = None
        return results

    async def pipeline(self, send: Callable[[], None]) -> tuple[list[pq.abc.PGresult], Exception | None]:
        """Send a pipeline with ``send`` (libpq's pipeline mode, entered by ``send`` and ended by
        one ``pipeline_sync``) and return its results in order, to its PIPELINE_SYNC result,
        with None; or, when the connection is lost on the way, the results read before the loss
        (in the order the backend sent them) and the loss. Raises NotSent as ``round_trip`` does.
        """
        if self._pending is not None:  # a cancelled request still read to its end, as _send would
            await asyncio.wait([self._pending])
            self._pending = None
        self._until_sync = True
        self._results = []
        failure: Exception | None = None
        try:
            results = await self.round_trip(send)
        except asyncio.CancelledError:
            raise  # still read to its Sync before the next request is sent
        except errors.OperationalError as exc:
            results, failure = list(self._results), exc
        except BaseException:
            self._until_sync = False
            raise
        self._until_sync = False
        return results, failure

    async def start(self, send: Callable[[], None]) -> None:
        """Send a request like ``round_trip``, whose results the caller then reads one at a
        time with ``next_result`` until it returns None (no other request may go before).

        Raises NotSent, and psycopg.OperationalError, as ``round_trip`` does.
        """
        await self._send(send)
        self._streaming = True

    async def next_result(self) -> pq.abc.PGresult | None:
        """The next result of the request sent with ``start``; None after its last one.

        Raises psycopg.OperationalError if the connection is lost (no result follows). The
        socket is read only while this waits.
        """
        assert self._streaming, "next_result without start"
        pgconn = self._pgconn
        while True:
            if self._failure is not None:
                self._streaming = False
                raise self._failure
            if not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None or result.status in _STOP_AFTER or (
                        result.status == _ExecStatus.FATAL_ERROR and pgconn.status != _OK):
                    # The end (a closed connection sends no end-of-results marker): idle again.
                    self._streaming = False
                    self._fail_if_lost()
                return result
            self.attach()
            if self._loop is None:  # not watched: the connection is known lost
                if self._failure is None:
                    self._fail(errors.OperationalError("the connection to the server was lost"))
                continue
            pending = self._pending = self._loop.create_future()
            watchdog = _watchdog(self._loop)
            watchdog.add(self)
            try:
                await pending
            except errors.OperationalError:
                pass  # raised from _failure above
            finally:
                self._pending = None
                watchdog.discard(self)

    def result_ready(self) -> bool:
        """The streamed request's next result has arrived: ``next_result`` would not wait."""
        return self._failure is None and not self._pgconn.is_busy()

    async def _send(self, send: Callable[[], None]) -> None:
        """Send one request (after the results of the one before it are read)."""
        assert not self._streaming, "a request sent while another's results are still being read"
        self.attach()
        if self._pending is not None:
            await asyncio.wait([self._pending])
            self._pending = None
        if self._failure is None and self._pgconn.status != _OK:
            self._fail(errors.OperationalError("the connection to the server was lost"))
        if self._failure is not None:
            raise NotSent() from self._failure
        try:
            send()
        except errors.OperationalError as exc:
            self._fail(exc)  # libpq refuses to send on a connection it found broken
            raise NotSent() from exc
        try:
            while self._pgconn.flush():  # only when the socket's send buffer is full
                await self._writable()
        except errors.OperationalError as exc:
            self._fail(exc)
            raise

    def _recheck(self) -> None:
        """The safety net: read what the socket holds and register its reader afresh."""
        if self._pending is None or self._pending.done() or self._loop is None:
            return
        self._readable()
        if self._loop is not None and not self._pending.done():
            self.detach()
            self.attach()

    def _readable(self) -> None:
        try:
            self._pgconn.consume_input()
        except errors.OperationalError as exc:
            self._fail(exc)
            return
        if self._streaming:
            pending = self._pending
            if pending is not None and not pending.done():
                pending.set_result([])  # next_result looks at what arrived
            else:
                self.detach()  # read again when next_result is called: the rows wait in the kernel
            self._fail_if_lost()
            return
        if self._pending is None and self._until_sync:
            # A pipeline still being written: its first statements' results can arrive before its
            # last bytes leave (a long run behind a lock step). They wait in libpq for round_trip's
            # _collect; read as idle chatter, they were dropped, and the run's result was taken
            # for the step's.
            self._fail_if_lost()
            return
        if self._pending is None or self._pending.done():
            # Nothing in flight: consume whatever arrives (notices) and stay idle.
            while not self._pgconn.is_busy() and self._pgconn.get_result() is not None:
                pass
            self._fail_if_lost()
            return
        self._collect()
        self._fail_if_lost()

    def _collect(self) -> None:
        pgconn = self._pgconn
        pending = self._pending
        assert pending is not None
        while not pgconn.is_busy():
            result = pgconn.get_result()
            if self._until_sync:
                # In a pipeline, None ends one query's results; its Sync's result ends them all.
                if result is None:
                    continue
                if result.status == _ExecStatus.PIPELINE_SYNC:
                    self._until_sync = False
                    if not pending.done():
                        pending.set_result(self._results)
                    return
            if result is None or result.status in _STOP_AFTER:
                if result is not None:
                    self._results.append(result)
                if not pending.done():
                    pending.set_result(self._results)
                return
            self._results.append(result)
            if result.status == _ExecStatus.FATAL_ERROR and pgconn.status != pq.ConnStatus.OK:
                # The backend closed the connection after the error (e.g. terminated): there
                # will be no end-of-results marker.
                if not pending.done():
                    pending.set_result(self._results)
                return

    def _fail_if_lost(self) -> None:
        """Stop watching as soon as libpq has dropped the connection (and closed its socket)."""
        if self._failure is None and self._pgconn.status != _OK:
            self._fail(errors.OperationalError("the connection to the server was lost"))

    def _fail(self, exc: Exception) -> None:
        self.detach()
        self._failure = exc
        if self._pending is not None and not self._pending.done():
            self._pending.set_exception(exc)

    async def _writable(self) -> None:
        assert self._loop is not None
        ready: asyncio.Future[None] = self._loop.create_future()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        self._loop.add_writer(self._fd, wake)
        try:
            await ready
        finally:
            self._loop.remove_writer(self._fd)


class _Watchdog:
    """One event loop's timer that rechecks, every RECHECK_S, the requests in flight."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._waiters: set[ResultWaiter] = set()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, waiter: ResultWaiter) -> None:
        self._waiters.add(waiter)
        if self._timer is None:
            self._timer = self._loop.call_later(RECHECK_S, self._tick)

    def discard(self, waiter: ResultWaiter) -> None:
        self._waiters.discard(waiter)

    def _tick(self) -> None:
        self._timer = None
        for waiter in list(self._waiters):
            waiter._recheck()
        if self._waiters:
            self._timer = self._loop.call_later(RECHECK_S, self._tick)


_watchdogs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watchdog] = weakref.WeakKeyDictionary()


def _watchdog(loop: asyncio.AbstractEventLoop) -> _Watchdog:
    watchdog = _watchdogs.get(loop)
    if watchdog is None:
        watchdog = _watchdogs[loop] = _Watchdog(loop)
    return watchdog
