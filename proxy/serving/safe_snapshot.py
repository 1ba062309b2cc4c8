"""A serializable DP statement's snapshot, taken before its charge.

Backend transactions are read-only and DEFERRABLE (``proxy.backend.pool.open_backend``): at
SERIALIZABLE, a transaction's first snapshot waits until no concurrent serializable read-write
transaction of the operator's can make it unsafe. How long depends on the operator's writers,
never on the rows, but a wait that outlasts ``statement_timeout`` (or that the client cancels)
fails the statement with 57014. Charged first, a DP statement paid for that failure; so the
snapshot is taken first, by a trivial ``SELECT`` in the transaction the DP statement then runs
in (outside a client's block, one of dpproxy's own around it), and a wait that fails is an
uncharged 57014 that says what it waited for.

At READ COMMITTED each statement takes its own snapshot, and REPEATABLE READ never waits: only a
transaction that may be SERIALIZABLE pays the extra round trip (two more outside a block: the
snapshot with BEGIN, then COMMIT).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from policies.errors import SQLSTATE
from proxy.backend.connection import BackendSession
from proxy.backend.errors import BackendError, BackendLost, BackendUnavailable

__all__ = ["WAIT_HINT", "begins_serializable", "in_safe_snapshot", "take_snapshot"]

WAIT_HINT = ("A SERIALIZABLE statement through dpproxy waits for concurrent serializable writers to end before "
             "it reads (its transactions are DEFERRABLE); nothing was charged. Retry later, or use READ "
             "COMMITTED or REPEATABLE READ.")


def begins_serializable(node: dict[str, Any]) -> bool:
    """Whether a BEGIN or START TRANSACTION (its parse tree) asks for ISOLATION LEVEL SERIALIZABLE."""
    for option in node.get("options") or []:
        element = option.get("DefElem", {})
        if element.get("defname") == "transaction_isolation":
            level = element.get("arg", {}).get("A_Const", {}).get("sval", {}).get("sval", "")
            return str(level).lower() == "serializable"
    return False


async def take_snapshot(backend: BackendSession, sql: str = "SELECT") -> None:
    """Run ``sql`` (a trivial ``SELECT``, which takes the transaction's snapshot if it has none,
    waiting for a safe one at SERIALIZABLE); a wait ended by statement_timeout or a cancel is
    raised as 57014 saying what it waited for."""
    try:
        await backend.execute(sql)
    except (BackendLost, BackendUnavailable):
        raise  # lost, or no connection could be had (a cancel then ended the wait for one)
    except BackendError as exc:
        if exc.sqlstate != SQLSTATE.QUERY_CANCELED:
            raise
        raise BackendError(exc.sqlstate, f"{exc.message} while waiting for a safe serializable snapshot",
                           hint=WAIT_HINT) from None


@asynccontextmanager
async def in_safe_snapshot(backend: BackendSession) -> AsyncIterator[None]:
    """Run the body (a DP statement: its checks, charge, release) in a transaction whose snapshot
    is taken first: for a transaction that may be SERIALIZABLE.

    In a client's transaction block the snapshot is taken in it (if the block has one already,
    nothing waits). Outside one, the body runs in a block of dpproxy's own, ended before the
    statement's answer is sent: COMMIT (read-only, so nothing is written), or ROLLBACK when the
    body failed.
    """
    if backend.transaction_status != b"I":
        await take_snapshot(backend)
        yield
        return
    try:
        await take_snapshot(backend, "BEGIN; SELECT")
        yield
    except Exception:
        # Not on the session's end (CancelledError): its connection, still in the block, is
        # closed rather than pooled.
        await _rollback(backend)
        raise
    await backend.execute("COMMIT")


async def _rollback(backend: BackendSession) -> None:
    """End dpproxy's own block after a failure, which is raised whatever happens here (a
    connection found lost meanwhile ends the session then)."""
    for _ in range(2):  # a cancel signal sent during the body may arrive late and cancel the first
        if backend.transaction_status == b"I":
            return  # ended, or BEGIN never ran (no connection could be had)
        try:
            await backend.execute("ROLLBACK")
        except BackendLost:
            return
        except BackendError:
            continue
