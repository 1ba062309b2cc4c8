"""The errors of a backend request, raised to the statement's runner and the session."""

from __future__ import annotations

__all__ = ["BackendError", "BackendLost", "BackendUnavailable", "ClientGone", "StepFailed"]


class BackendError(Exception):
    """The backend refused or failed a statement; carries PostgreSQL's diagnostics."""

    def __init__(self, sqlstate: str, message: str, detail: str | None = None, hint: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message
        self.detail = detail
        self.hint = hint


class BackendUnavailable(BackendError):
    """No backend connection could be had for a statement (the pool stayed exhausted, or a new
    connection was refused): nothing was sent, so the statement's failure cannot depend on
    the data. The client session goes on."""


class BackendLost(BackendError):
    """The session's backend connection is gone: the client session must end (FATAL).

    ``reached`` is False when the statement that found the loss was never sent, so nothing
    it did can depend on the data. The SQLSTATE is 57P01 when PostgreSQL said it was
    terminating the connection (shutdown, pg_terminate_backend), else 08006. The message
    names no host, port or role; libpq's own text goes to dpproxy's log.
    """

    def __init__(self, sqlstate: str, reached: bool):
        super().__init__(
            sqlstate,
            "terminating connection because the connection to the backend database was lost",
            hint="Reconnect; session settings (SET) must be set again. "
                 "An administrator can see the cause in dpproxy's log.",
        )
        self.reached = reached


class ClientGone(ConnectionResetError):
    """The client closed its connection while its statement waited for a backend connection:
    the statement never reached the backend, nothing was charged for it, and the session ends
    as for any client that went away (nobody is left to read an answer)."""

    sqlstate = "08006"  # connection_failure: what the statement's audit line records


class StepFailed(Exception):
    """A statement sent ahead of a run in the run's pipeline (a DP statement's lock step,
    ``proxy/serving/relation_locks.py``) failed with ``error``: PostgreSQL skipped everything
    after it up to the pipeline's Sync, so the run never executed. ``index`` says which of the
    steps it was. Not a BackendError, so that no handler of the run's errors takes it for one."""

    def __init__(self, index: int, error: BackendError):
        super().__init__(error.message)
        self.index = index
        self.error = error
