"""Which statements an implicit transaction (a pipeline's, a query string's) would undo or bound,
and which it refuses or warns of.

In PostgreSQL the extended-protocol messages up to a Sync run in one implicit transaction:
an error before the Sync rolls back everything since the last one, a ``SET`` included
(pgjdbc's batches, psycopg's pipeline mode and asyncpg's executemany rely on it), and a
``SET LOCAL`` lasts until the Sync. dpproxy's backend sessions are read-only, so a session's
settings (backend ones and ``dpproxy.*``) are all such a transaction could change: the
executor opens the implicit transaction on the backend just before the first statement of a
pipeline that sets one (or declares a cursor WITH HOLD, which only a commit keeps), in dpproxy
alone while only ``dpproxy.*`` is set, and it ends at the Sync (or a simple Query), committed,
or rolled back if the pipeline failed. A pipeline of reads alone opens none, and costs no round
trip more.

PostgreSQL's implicit transaction is not a transaction block, and dpproxy's is one on the
backend (a BEGIN): what PostgreSQL refuses or warns of outside a block is refused or warned of
here before the backend could accept it (``refused_in_implicit``, ``ending_warning``).
"""

from __future__ import annotations

from policies.errors import SQLSTATE, Refusal
from rewriter.classify import DeclareCursor, DpproxyCommand, Passthrough
from rewriter.statements import Statement
from proxy.wire.protocol import Notice

__all__ = ["changes_settings", "changes_transaction", "ending_warning", "outside_a_block_warning", "refused_in_implicit"]

# PostgreSQL's names for the transaction statements that need a transaction block.
_SAVEPOINT_COMMANDS = {
    "TRANS_STMT_SAVEPOINT": "SAVEPOINT",
    "TRANS_STMT_RELEASE": "RELEASE SAVEPOINT",
    "TRANS_STMT_ROLLBACK_TO": "ROLLBACK TO SAVEPOINT",
}
_ENDS = {"TRANS_STMT_COMMIT": "COMMIT", "TRANS_STMT_ROLLBACK": "ROLLBACK"}


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


def changes_transaction(decision: object) -> bool:
    """Whether a pipeline's rollback must undo ``decision``, a statement that is no setting:
    a DECLARE of a cursor WITH HOLD, which outlives the pipeline only if it commits."""
    return isinstance(decision, DeclareCursor) and decision.options.hold


def refused_in_implicit(statement: Statement, decision: object, pipeline: bool) -> Refusal | None:
    """The 25P01 error PostgreSQL gives ``statement`` in an implicit transaction (a
    ``pipeline``'s, else a query string's of several statements), which is no block: a
    savepoint's statements, COMMIT or ROLLBACK AND CHAIN, and in a pipeline a DECLARE
    without HOLD (a query string's implicit transaction counts as a block for it)."""
    if statement.kind == "TransactionStmt":
        kind = str(statement.node.get("kind"))
        command = _SAVEPOINT_COMMANDS.get(kind)
        if command is None and kind in _ENDS and statement.node.get("chain"):
            command = f"{_ENDS[kind]} AND CHAIN"
    elif pipeline and isinstance(decision, DeclareCursor) and not decision.options.hold:
        command = "DECLARE CURSOR"
    else:
        command = None
    if command is None:
        return None
    return Refusal(SQLSTATE.NO_ACTIVE_SQL_TRANSACTION, f"{command} can only be used in transaction blocks",
                   "Begin a transaction block (BEGIN) first: statements sent together before a Sync, or in "
                   "one query string, run in an implicit transaction, which is not one.")


def ending_warning(statement: Statement) -> Notice | None:
    """The WARNING PostgreSQL gives a COMMIT or ROLLBACK that ends an implicit transaction
    (there is no block to end; it ends the transaction all the same)."""
    if statement.kind == "TransactionStmt" and statement.node.get("kind") in _ENDS:
        return Notice("there is no transaction in progress", "WARNING", "25P01")
    return None


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
