"""Which statements an extended-protocol pipeline's implicit transaction would undo or bound.

In PostgreSQL the extended-protocol messages up to a Sync run in one implicit transaction:
an error before the Sync rolls back everything since the last one, a ``SET`` included
(pgjdbc's batches, psycopg's pipeline mode and asyncpg's executemany rely on it), and a
``SET LOCAL`` lasts until the Sync. dpproxy's backend sessions are read-only, so a session's
settings (backend ones and ``dpproxy.*``) are all such a transaction could change: the
executor opens the implicit transaction on the backend just before the first statement of a
pipeline that sets one, and it ends at the Sync (or a simple Query), committed, or rolled
back if the pipeline failed. A pipeline of reads alone opens none, and costs no round trip more.
"""

from __future__ import annotations

from rewriter.classify import DpproxyCommand, Passthrough
from rewriter.statements import Statement
from proxy.wire.protocol import Notice

__all__ = ["changes_settings", "outside_a_block_warning"]


def changes_settings(statement: Statement | None, decision: object) -> bool:
    """Whether ``statement`` (its ``decision``) sets a setting whose change the pipeline's
    transaction decides: SET, SET LOCAL, SET TRANSACTION and RESET (of a backend setting or of
    ``dpproxy.epsilon``), or a SELECT calling ``set_config``. Not DISCARD ALL, which
    PostgreSQL refuses inside a transaction (a pipeline's too, after its first statement).
    """
    if statement is None:
        return False
    if isinstance(decision, DpproxyCommand):
        return decision.verb in ("set", "reset", "keep")
    if not isinstance(decision, Passthrough):
        return False
    if statement.kind == "VariableSetStmt":
        return True
    return statement.kind == "SelectStmt" and any(
        name.endswith("set_config") for name in statement.references.functions
    )


def outside_a_block_warning(statement: Statement, decision: object) -> Notice | None:
    """The WARNING PostgreSQL gives a SET LOCAL or SET TRANSACTION in a pipeline outside a
    transaction block (it lasts until the Sync all the same): dpproxy runs it in a block of
    its own on the backend, which gives none."""
    if isinstance(decision, DpproxyCommand):
        local = decision.local and decision.verb != "show"
    else:
        local = statement.kind == "VariableSetStmt" and bool(statement.node.get("is_local"))
    if local:
        return Notice("SET LOCAL can only be used in transaction blocks", "WARNING", "25P01")
    if statement.kind == "VariableSetStmt" and statement.node.get("name") == "TRANSACTION":
        return Notice("SET TRANSACTION can only be used in transaction blocks", "WARNING", "25P01")
    return None
