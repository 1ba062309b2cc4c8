"""A DP statement's relation locks, taken by a step that runs just before the statement, in
one pipeline with it, after the charge; the charge goes back when the step fails.

A DP statement waits for a lock the operator holds on what it reads (an ``ACCESS EXCLUSIVE``
lock of DDL, ``LOCK TABLE`` or a VACUUM truncating a table's tail; on a hot standby, each such
lock taken on the primary, replayed). How long depends on the operator, never on the rows, but
a wait that outlasts ``statement_timeout`` (or that the client cancels) fails the statement with
57014, and charged, the analyst would pay for that failure. So the locks are taken by a step of
their own: the statement's backend SQL planned and started under ``LIMIT 0``
(:func:`lock_step_sql`), which takes every lock its run takes before reading (the table, its
partitions, its indexes; a view's underlying tables) and reads no row.

The step and the run go to the backend in one libpq pipeline, after the charge: the step(s), a
Flush, the run, one Sync (``BackendSession.after_steps``): one round trip per statement.
PostgreSQL runs them in one transaction (implicit outside a client's block, the block's inside
one), so the step's locks are held until the run ends: a lock the operator asks for after the
step waits for the statement, never the statement for it after its charge.

Why the charge can be made first and given back: whether it stands is decided only by the
step's outcome, and no row decides that. The step reads no row (``LIMIT 0`` runs no plan node),
so it succeeds, waits or fails by the operator's locks, the server's state and the statement's
text and parameters alone. PostgreSQL skips the rest of a pipeline after a failed statement up
to its Sync: a step that failed (a wait ended by ``statement_timeout`` or a cancel, a standby's
recovery conflict, an error of a value the column types cannot read) means the run never
executed, nothing was read and nothing released, and the charge is refunded, once
(``StepFailed``). The run's outcome is seen only after the charge, as before, and whatever
happens to the run keeps it. ``statement_timeout`` does not join the two: in the extended
protocol it starts when a query message arrives and is cancelled at an Execute's completion, so
the run gets the whole of it whatever the step waited. A connection lost before the step's
result arrived (terminated, or killed, while the step waited) is refundable too, from the
order of the results, not from any timing: the Flush after the step makes the backend send the
step's end before it reads the run, so a run that started follows a step's end the proxy can
read; lost after that end, the charge stands.

The same step raises the errors of values the column types cannot read: a literal
(``age = 'abc'``) fails its parse analysis, a parameter (``age = $1`` bound to 'abc') its input
conversion at Bind; decided by the statement and its parameters, never by a row. They now come
after the charge, refunded, as the same error with the same SQLSTATE, message and hint.

A hot standby's recovery conflict that cancels the step outside a block (the primary's lock
replayed while the step held the table) sends the pipeline once more under the same charge:
nothing was read yet. A conflict that cancels the run is the run's (``_release_past_a_conflict``
runs it once more, alone, under the charge, whose outcome no step can then change).

What is left after the charge: a TOAST relation's lock (taken only when a row read has a long
value stored apart, so never by a step that reads no row); a series limit's ranking, whose run
follows the plan's as a statement of its own (its step is in the plan's pipeline, but outside a
block its locks end at that pipeline's Sync); and a run retried after a recovery conflict.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from policies.errors import SQLSTATE
from policies.tables import Relation
from proxy.backend.connection import BackendSession
from proxy.backend.errors import BackendError, StepFailed

__all__ = ["LOCK_HINT", "LOCK_STEP_MARK", "RECOVERY_CONFLICTS", "LocksNotTaken", "lock_step_sql", "with_locks"]

T = TypeVar("T")

# What a hot standby cancels a statement with when it conflicts with the WAL it replays; a
# read-only statement outside a serializable transaction meets them for no other reason.
RECOVERY_CONFLICTS = frozenset({SQLSTATE.SERIALIZATION_FAILURE, SQLSTATE.DEADLOCK_DETECTED})

LOCK_HINT = ("Another session holds a lock on this table or on a relation the statement reads (the operator's "
             "DDL, LOCK TABLE or a VACUUM truncating the table; on a hot standby, one replayed from the "
             "primary); nothing was charged. Retry once it is released.")


class LocksNotTaken(Exception):
    """A lock step failed, so the run never executed: its charge goes back. ``error`` is what
    the client is told, as the step's error (a wait's 57014 naming the table, with LOCK_HINT)."""

    def __init__(self, error: BackendError):
        super().__init__(error.message)
        self.error = error


LOCK_STEP_MARK = "/* dpproxy lock step */ "
"""How every lock step's text begins: a comment, so that an operator (and a test) reading
pg_stat_activity tells the step from its run, which is the same statement without ``LIMIT 0``."""


def lock_step_sql(sql: str) -> str:
    """The lock step of the backend SQL ``sql``: planned and started, it takes ``sql``'s locks;
    its ``LIMIT 0`` runs no plan node, so no row is read and no expression meets a row.

    It is ``sql`` itself under ``LIMIT 0``, so the planner plans every output column of ``sql``
    as the run does: were an output column unreferenced (as under ``SELECT 1 FROM (sql)``), the
    planner would replace it with a NULL before planning ``sql`` and never fold its constants,
    so an error the run's planning raises there (``count(*) FILTER (WHERE i IN (1,
    CAST(5000000000 AS int)))``: 22003, whatever the rows) would fail the run, whose charge
    stands, not the step. It selected the whole row of ``sql`` as a subquery before (``SELECT
    locked FROM (sql) AS locked LIMIT 0``), which plans the same columns with one query level
    more: 10–25 % more of the backend's instructions for the step (benchmarks/profile.md, "Each
    aggregate kind's added time, in parts").

    ``sql`` is a backend SQL (:func:`rewriter.rewrite.backend_sql`): a SELECT with no LIMIT or
    FETCH of its own at its top level, which a second LIMIT could not follow."""
    return f"{LOCK_STEP_MARK}{sql} LIMIT 0"


async def with_locks(backend: BackendSession, steps: Sequence[tuple[str, Relation]],
                     run: Callable[[tuple[str, ...]], Awaitable[T]]) -> T:
    """``run`` (a DP statement's release, sent after the lock steps it is given, in one pipeline)
    with the lock steps of ``steps`` (each a backend SQL the release runs, and the table it names).

    A step that failed (StepFailed: the run never executed) raises LocksNotTaken: a wait ended by
    ``statement_timeout`` or a cancel as 57014 naming its table, with LOCK_HINT; any other error
    as it is. A hot standby's recovery conflict that cancelled a step outside a block sends the
    pipeline once more (nothing was read); in a block, which the conflict aborted, it is raised."""
    sent = tuple(lock_step_sql(sql) for sql, _ in steps)
    outside_a_block = backend.transaction_status == b"I"
    try:
        return await run(sent)
    except StepFailed as failed:
        if failed.error.sqlstate not in RECOVERY_CONFLICTS or not outside_a_block:
            raise _not_taken(failed, steps) from None
    try:
        return await run(sent)
    except StepFailed as failed:
        raise _not_taken(failed, steps) from None


def _not_taken(failed: StepFailed, steps: Sequence[tuple[str, Relation]]) -> LocksNotTaken:
    """What the client is told of the failed step: its error, a wait's 57014 naming its table."""
    exc = failed.error
    if exc.sqlstate != SQLSTATE.QUERY_CANCELED:
        return LocksNotTaken(exc)
    # Past the lock steps is the run's work_mem setting (rewriter/sort_memory.py), of the last one's run.
    table = steps[min(failed.index, len(steps) - 1)][1]
    return LocksNotTaken(BackendError(
        exc.sqlstate, f"{exc.message} while waiting for a lock on {table.schema}.{table.name}", hint=LOCK_HINT))
