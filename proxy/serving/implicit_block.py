"""Which statements an extended-protocol pipeline's implicit transaction would undo.

In PostgreSQL the extended-protocol messages up to a Sync run in one implicit transaction:
an error before the Sync rolls back everything since the last one, a ``SET`` included
(pgjdbc's batches, psycopg's pipeline mode and asyncpg's executemany rely on it). dpproxy's
backend sessions are read-only, so a session's settings (backend ones and ``dpproxy.*``) are
all such a transaction could undo: the executor opens the implicit transaction on the backend
just before the first statement of a pipeline that changes them, and it ends at the Sync
(or a simple Query), committed, or rolled back if the pipeline failed. A pipeline of reads
alone opens none, and costs no round trip more.
"""

from __future__ import annotations

from rewriter.classify import DpproxyCommand, Passthrough
from rewriter.statements import Statement

__all__ = ["changes_session"]


def changes_session(statement: Statement | None, decision: object) -> bool:
    """Whether ``statement`` (its ``decision``) changes a session-level setting that a rollback
    of its transaction would undo: a session-level SET or RESET (of a backend setting or of
    ``dpproxy.epsilon``), or a SELECT calling ``set_config``.

    Not SET LOCAL and SET TRANSACTION (they end with the transaction anyway), and not DISCARD
    ALL, which PostgreSQL refuses inside a transaction block.
    """
    if statement is None:
        return False
    if isinstance(decision, DpproxyCommand):
        return decision.verb in ("set", "reset", "keep") and not decision.local
    if not isinstance(decision, Passthrough):
        return False
    if statement.kind == "VariableSetStmt":
        node = statement.node
        return not node.get("is_local") and node.get("name") != "TRANSACTION"
    return statement.kind == "SelectStmt" and any(
        name.endswith("set_config") for name in statement.references.functions
    )
