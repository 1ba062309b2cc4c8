"""Refusals: every statement dpproxy will not answer ends in one of these.

Each carries the SQLSTATE sent to the client, a message naming the rule that was broken,
and a hint saying what is allowed. The codes are documented in docs/sqlstates.md.
"""

from __future__ import annotations

__all__ = ["Refusal", "SQLSTATE"]


class SQLSTATE:
    """The SQLSTATEs dpproxy sends. Standard PostgreSQL codes where one fits, class DP else."""

    SYNTAX_ERROR = "42601"
    INSUFFICIENT_PRIVILEGE = "42501"
    UNDEFINED_TABLE = "42P01"
    UNDEFINED_PARAMETER = "42P02"
    FEATURE_NOT_SUPPORTED = "0A000"
    READ_ONLY_SQL_TRANSACTION = "25006"
    INVALID_PARAMETER_VALUE = "22023"
    CHARACTER_NOT_IN_REPERTOIRE = "22021"
    UNTRANSLATABLE_CHARACTER = "22P05"
    CANT_CHANGE_RUNTIME_PARAM = "55P02"
    INVALID_PASSWORD = "28P01"
    INVALID_AUTHORIZATION = "28000"
    INVALID_CATALOG_NAME = "3D000"
    PROTOCOL_VIOLATION = "08P01"
    QUERY_CANCELED = "57014"
    SERIALIZATION_FAILURE = "40001"
    DEADLOCK_DETECTED = "40P01"
    ADMIN_SHUTDOWN = "57P01"
    IDLE_SESSION_TIMEOUT = "57P05"
    IDLE_IN_TRANSACTION_TIMEOUT = "25P03"
    IN_FAILED_TRANSACTION = "25P02"
    NO_ACTIVE_SQL_TRANSACTION = "25P01"
    PROGRAM_LIMIT_EXCEEDED = "54000"
    TOO_MANY_CONNECTIONS = "53300"
    STATEMENT_TOO_COMPLEX = "54001"
    TOO_MANY_COLUMNS = "54011"
    OBJECT_NOT_IN_PREREQUISITE_STATE = "55000"
    INTERNAL_ERROR = "XX000"
    # dpproxy's own class: a DP rule, not a PostgreSQL one.
    DP_QUERY_SHAPE = "DP001"
    DP_BUDGET_EXHAUSTED = "DP002"
    DP_EPSILON_ABOVE_MAXIMUM = "DP003"
    DP_BACKEND_FAILURE = "DP004"
    DP_LEDGER_UNAVAILABLE = "DP005"


class Refusal(Exception):
    """A statement or request that dpproxy refuses, with what to tell the client."""

    def __init__(self, sqlstate: str, message: str, hint: str | None = None, rule: str | None = None):
        super().__init__(message)
        self.sqlstate = sqlstate
        self.message = message
        self.hint = hint
        self.rule = rule or sqlstate

    def __repr__(self) -> str:
        return f"Refusal({self.sqlstate}, {self.message!r}, rule={self.rule!r})"
