"""A DP statement's relation locks, waited for before its charge.

A DP statement waits for a lock the operator holds on what it reads (an ``ACCESS EXCLUSIVE``
lock of DDL, ``LOCK TABLE`` or a VACUUM truncating a table's tail; on a hot standby, each such
lock taken on the primary, replayed). How long depends on the operator, never on the rows, but
a wait that outlasts ``statement_timeout`` (or that the client cancels) fails the statement with
57014. Charged first, the analyst paid for that failure; a refund decided afterwards would not
do (one ``statement_timeout`` covered the wait and the read together, so near its edge the rows'
reading time decided which). So the locks are waited for first: the statement's backend SQL is
planned and started under ``LIMIT 0`` (:func:`lock_step_sql`), which takes every lock its run
takes before reading (the table, its partitions, its indexes; a view's underlying tables) and
reads no row. A wait that fails is an uncharged 57014 that says what it waited for.

Inside a client's transaction block the step's locks are held to the block's end, as PostgreSQL
holds them. Outside one the step is a statement of its own, whose locks end with it: one round
trip, where a block of dpproxy's own to hold them to the run would cost two more (``BEGIN`` and
``COMMIT``). A lock the operator takes in the moment between the step and the run (the charge)
is then met after the charge, as every lock was before.

The same statement raises, before the charge, the errors of values the column types cannot
read: a literal (``age = 'abc'``) fails its parse analysis, a parameter (``age = $1`` bound to
'abc') its input conversion at Bind; decided by the statement and its parameters, never by a row.

What is left after the charge: a TOAST relation's lock (taken only when a row read has a long
value stored apart, so never by a step that reads no row), and a lock taken between the step and
the run, above.
"""

from __future__ import annotations

from policies.errors import SQLSTATE
from policies.tables import Relation
from proxy.backend.connection import BackendSession, BoundParams
from proxy.backend.errors import BackendError, BackendLost, BackendUnavailable

__all__ = ["LOCK_HINT", "RECOVERY_CONFLICTS", "lock_step_sql", "take_locks"]

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


async def take_locks(backend: BackendSession, sql: str, params: BoundParams, table: Relation) -> None:
    """Wait for the locks of ``sql`` (a DP statement's backend SQL, with its ``params``); a wait
    ended by ``statement_timeout`` or a cancel is raised as 57014 naming ``table``, with
    LOCK_HINT. A hot standby's recovery conflict that cancels the step outside a block (the
    primary's lock replayed while the step held the table) takes it once more: nothing was
    charged or read yet; in a block, which the conflict aborted, it is raised as it is."""
    step = lock_step_sql(sql)
    bound = params if params.values else None
    for attempt in (1, 2):
        outside_a_block = backend.transaction_status == b"I"
        try:
            await backend.execute(step, bound)
            return
        except (BackendLost, BackendUnavailable):
            raise
        except BackendError as exc:
            if exc.sqlstate in RECOVERY_CONFLICTS and outside_a_block and attempt == 1:
                continue
            if exc.sqlstate != SQLSTATE.QUERY_CANCELED:
                raise
            raise BackendError(exc.sqlstate,
                               f"{exc.message} while waiting for a lock on {table.schema}.{table.name}",
                               hint=LOCK_HINT) from None
