"""A passthrough result passed on while it arrives: the rows of a statement too large to hold.

A passthrough statement (catalog, public tables) may return any number of rows: held whole,
one client's ``SELECT`` of a large public table, or of ``generate_series``, took the memory
every session of the process shares (3,000,000 rows of ~100 bytes: ~1 GB, most of it kept
afterwards). So its rows come from libpq in chunks (``BackendSession.relay``) and, past the
first ones, are passed on as the client takes them: dpproxy holds at most a chunk and what
the client's socket has not yet taken, and the backend waits for the client, as it would if
the client were connected to it directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Awaitable, Callable

from .errors import BackendError

__all__ = ["HELD_RESULT_BYTES", "Ended", "Pull", "RowStream"]

Ended = Callable[[str | None, int], None]
"""Told once how a result ended for its client: None when it had the whole result or closed
its portal before the end, else the SQLSTATE of the error that ended it; and how many rows it
was handed."""

Pull = Callable[[], Awaitable[tuple[list[bytes], str | None]]]
"""The next chunk's DataRow messages, with the command tag once the statement has ended
(None before); raises the statement's error where PostgreSQL raised it."""

HELD_RESULT_BYTES = 64 * 1024 * 1024
"""How much of results' rests one session keeps in memory (``hold``): for suspended portals
while other statements run, or for a client too slow to take its rows while they arrive."""


_BATCH_ROWS = 1024  # rows handed out at a time (libpq's chunks are of CHUNK_ROWS, as many)


class RowStream:
    """The rows of one running statement, handed out once, in order, as the backend sends them.

    Contract: ``take`` yields them (at most ``limit``) and raises the statement's error after
    the rows that came before it, as PostgreSQL sends them. While the stream is open its
    backend connection runs the statement and can run nothing else: before another request,
    ``hold`` reads the rest into memory (at most ``HELD_RESULT_BYTES``; past that, ``take``
    raises 54000 after the rows held so far and the rest is read for nothing), or, once the
    stream's portal is gone (``abandoned``), ``discard`` reads it to its end for nothing.
    ``status`` is the transaction status byte from before the statement, which it keeps while
    it runs (libpq reports a running statement as neither idle nor in a block).
    ``when_ended`` learns, once, how the result ended for the client (``Ended``).
    """

    def __init__(self, pull: Pull, rows: list[bytes], status: bytes):
        self._pull = pull
        self._rows = rows  # arrived; those from ``_first`` on not yet handed out
        self._first = 0
        self._ended = False  # the statement has ended (its tag, or its error, has come)
        self._error: BaseException | None = None  # to be raised by take, after the rows before it
        self.tag = ""
        self.status = status
        self.abandoned = False
        self.handed_out = 0  # rows yielded by ``take``
        self._ended_for_client: Ended | None = None

    def when_ended(self, report: Ended) -> None:
        """Call ``report`` once the client has had all it will get of this result."""
        self._ended_for_client = report

    def cut_off(self, sqlstate: str | None) -> None:
        """The session ends before the result did: its end is reported with ``sqlstate``
        (None: the client said Terminate, closing its portals as it may)."""
        self._report(sqlstate)

    def _report(self, sqlstate: str | None) -> None:
        report, self._ended_for_client = self._ended_for_client, None
        if report is not None:
            report(sqlstate, self.handed_out)

    @property
    def open(self) -> bool:
        """The statement is still running on the backend connection."""
        return not self._ended

    @property
    def held_bytes(self) -> int:
        """The size of the rows arrived and not yet handed out."""
        return sum(map(len, self._rows[self._first:])) if self._first else sum(map(len, self._rows))

    @property
    def _waiting(self) -> int:
        """How many rows have arrived and not been handed out."""
        return len(self._rows) - self._first

    def _keep_only(self, rows: list[bytes]) -> None:
        self._rows, self._first = rows, 0

    def abandon(self) -> None:
        """Its portal is gone: drop what is held now; the rest is read for nothing (``discard``)."""
        self.abandoned = True
        self._keep_only([])
        self._error = None
        self._report(None)

    @property
    def exhausted(self) -> bool:
        """Every row has been handed out and the statement has ended without an error to tell."""
        return self._ended and not self._waiting and self._error is None

    async def take(self, limit: int | None = None) -> AsyncIterator[list[bytes]]:
        """The next rows, a chunk at a time, ``limit`` at most (None: to the end)."""
        left = limit
        while left is None or left > 0:
            if not self._waiting:
                if self._error is not None:
                    error, self._error = self._error, None
                    self._report(_sqlstate(error))
                    raise error
                if self._ended:
                    self._report(None)
                    return
                try:
                    await self._next()
                except Exception as exc:
                    self._report(_sqlstate(exc))
                    raise
                continue
            # Held rows go out a chunk's worth at a time too: all at once, they were joined into
            # one write beside the list they came from (three times the cap at its peak).
            batch = self._handed(_BATCH_ROWS if left is None else min(left, _BATCH_ROWS))
            if left is not None:
                left -= len(batch)
            self.handed_out += len(batch)
            yield batch

    def _handed(self, most: int) -> list[bytes]:
        """The next ``most`` waiting rows at most, taken off what is held.

        Linear in the rows held, however they are taken: cutting each batch off the front of
        the list moved all the rows behind it, N²/2048 pointer moves for N held rows (~65 ms
        per million). The batch is sliced at an offset instead, and the rows before it are cut
        off only once they are half the list, so that what was handed out is not kept long.
        """
        first = self._first
        if first == 0 and most >= len(self._rows):
            batch, self._rows = self._rows, []
            return batch
        end = min(first + most, len(self._rows))
        batch = self._rows[first:end]
        if end == len(self._rows):
            self._keep_only([])
        elif end > len(self._rows) // 2:
            self._keep_only(self._rows[end:])
        else:
            self._first = end
        return batch

    async def hold(self, limit_bytes: int = HELD_RESULT_BYTES) -> None:
        """Read the rest of the result into memory, so that the connection can serve another request."""
        held = self.held_bytes
        while not self._ended:
            before = len(self._rows)
            try:
                await self._next(keep=True)
            except Exception as exc:
                self._error = exc
                return
            held += sum(len(row) for row in self._rows[before:])
            if held > limit_bytes:
                self._error = BackendError(
                    "54000",
                    f"the rest of this result is larger than the {limit_bytes // (1024 * 1024)} MB dpproxy "
                    "holds for a client that is not reading it",
                    hint="Read a result to its end before the next statement, and as it arrives; "
                         "or fetch it in parts through a cursor (DECLARE … FETCH).",
                )
                await self._read_to_end()

    async def discard(self) -> None:
        """Read the rest of the result for nothing (its portal was closed)."""
        self._keep_only([])
        self._error = None
        await self._read_to_end()

    async def _next(self, keep: bool = False) -> None:
        try:
            rows, tag = await self._pull()
        except BaseException:
            self._ended = True
            raise
        if keep:
            self._rows += rows
        else:
            self._keep_only(rows)
        if tag is not None:
            self.tag, self._ended = tag, True

    async def _read_to_end(self) -> None:
        while not self._ended:
            try:
                _, tag = await self._pull()
            except Exception:
                self._ended = True
                return
            if tag is not None:
                self.tag, self._ended = tag, True


def _sqlstate(error: BaseException) -> str:
    """The SQLSTATE an error reaches the client with (XX000 for one that carries none)."""
    sqlstate = getattr(error, "sqlstate", None)
    return sqlstate if isinstance(sqlstate, str) else "XX000"
