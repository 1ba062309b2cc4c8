"""A DP statement's relation locks, taken before its charge and held until its answer.

A DP statement waits for a lock the operator holds on what it reads (an ``ACCESS EXCLUSIVE``
lock of DDL, ``LOCK TABLE`` or a VACUUM truncating a table's tail; on a hot standby, each such
lock taken on the primary, replayed). How long depends on the operator, never on the rows, but
a wait that outlasts ``statement_timeout`` (or that the client cancels) fails the statement with
57014. Charged first, the analyst paid for that failure; a refund decided afterwards would not
do (one ``statement_timeout`` covered the wait and the read together, so near its edge the rows'
reading time decided which). So the locks are taken first: the statement's backend SQL is
planned and started under ``LIMIT 0`` (:func:`lock_step_sql`), which takes every lock its run
takes before reading (the table, its partitions, its indexes; a view's underlying tables) and
reads no row, in the transaction the DP SQL then runs in. Outside a client's transaction block
that is a block of dpproxy's own (:class:`PreChargeLocks`), opened by the lock step itself and
ended before the answer is sent; in a client's block the locks are held to its end, as
PostgreSQL holds them. A wait that fails is an uncharged 57014 that says what it waited for.

The same statement raises, before the charge, the errors of values the column types cannot
read: a literal (``age = 'abc'``) fails its parse analysis, a parameter (``age = $1`` bound to
'abc') its input conversion at Bind; decided by the statement and its parameters, never by a row.

What is left after the charge: a TOAST relation's lock (taken only when a row read has a long
value stored apart, so never by a step that reads no row), and the moment between the charge
and the run for a statement the hot standby's conflict made run again (outside the block, see
``Executor._release_past_a_conflict``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from policies.errors import SQLSTATE
from policies.tables import Relation
from proxy.backend.connection import BackendSession, BoundParams
from proxy.backend.errors import BackendError, BackendLost, BackendUnavailable

from .safe_snapshot import end_own_block

__all__ = ["LOCK_HINT", "RECOVERY_CONFLICTS", "PreChargeLocks", "holding_locks", "lock_step_sql"]

# What a hot standby cancels a statement with when it conflicts with the WAL it replays; a
# read-only statement outside a serializable transaction meets them for no other reason.
RECOVERY_CONFLICTS = frozenset({SQLSTATE.SERIALIZATION_FAILURE, SQLSTATE.DEADLOCK_DETECTED})

LOCK_HINT = ("Another session holds a lock on this table or on a relation the statement reads (the operator's "
             "DDL, LOCK TABLE or a VACUUM truncating the table; on a hot standby, one replayed from the "
             "primary); nothing was charged. Retry once it is released.")


def lock_step_sql(sql: str) -> str:
    """The lock step of the backend SQL ``sql``: planned and started, it takes ``sql``'s locks;
    its ``LIMIT 0`` runs no plan node, so no row is read and no expression meets a row."""
    return f"SELECT 1 FROM ({sql}) AS locked LIMIT 0"


class PreChargeLocks:
    """The lock steps of one DP statement, and whether they opened a block of dpproxy's own."""

    def __init__(self, backend: BackendSession):
        self._backend = backend
        self.own_block = False
        """A transaction block of dpproxy's own is open (``holding_locks`` ends it)."""

    async def take(self, sql: str, params: BoundParams, table: Relation) -> None:
        """Take the locks of ``sql`` (a DP statement's backend SQL, with its ``params``) in the
        backend's transaction, opening a block of dpproxy's own if it has none; a wait ended by
        ``statement_timeout`` or a cancel is raised as 57014 naming ``table``, with LOCK_HINT.
        A hot standby's recovery conflict that cancels the step in dpproxy's own block (the
        primary's lock replayed while the step held the table) rolls it back and takes it once
        more: nothing was charged or read yet."""
        for attempt in (1, 2):
            try:
                await self._step(sql, params if params.values else None)
                return
            except (BackendLost, BackendUnavailable):
                raise
            except BackendError as exc:
                if exc.sqlstate in RECOVERY_CONFLICTS and self.own_block and attempt == 1:
                    await self.leave_block()
                    continue
                if exc.sqlstate != SQLSTATE.QUERY_CANCELED:
                    raise
                raise BackendError(exc.sqlstate,
                                   f"{exc.message} while waiting for a lock on {table.schema}.{table.name}",
                                   hint=LOCK_HINT) from None

    async def _step(self, sql: str, bound: BoundParams | None) -> None:
        backend = self._backend
        step = lock_step_sql(sql)
        if backend.transaction_status == b"I":
            self.own_block = True
            if bound is None:
                await backend.execute(f"BEGIN; {step}")  # one round trip
                return
            await backend.execute("BEGIN")
        await backend.execute(step, bound)

    async def leave_block(self) -> None:
        """Roll dpproxy's own block back (after a failure in it), so that a statement can run
        again outside any block; nothing if there is none."""
        if self.own_block:
            self.own_block = False
            await end_own_block(self._backend)


@asynccontextmanager
async def holding_locks(backend: BackendSession) -> AsyncIterator[PreChargeLocks]:
    """The body's lock steps (``PreChargeLocks.take``) hold their locks to its end: a block they
    opened is committed after it (read-only, so nothing is written), or rolled back when it
    failed."""
    locks = PreChargeLocks(backend)
    try:
        yield locks
    except Exception:
        # Not on the session's end (CancelledError): its connection, still in the block, is
        # closed rather than pooled.
        await locks.leave_block()
        raise
    if locks.own_block:
        locks.own_block = False
        await backend.execute("COMMIT")
