"""A session's dpproxy.* settings and the SHOW/SET/RESET statements that read and change them.

``SET dpproxy.epsilon = x`` lowers the ε of the session's DP queries; it is refused (DP003)
above the most the policy allows this user on any table, and a table's own ε still caps it,
and refused (22023) below ``MIN_EPSILON``. It behaves as a PostgreSQL setting in transactions
(``TransactionalValue``): undone by ROLLBACK and ROLLBACK TO SAVEPOINT, SET LOCAL until the
transaction's end; the executor reports each transaction event (``transaction_ended`` & co.).
In a failed transaction block every dpproxy.* statement is refused (25P02), as PostgreSQL
refuses SET and SHOW there.
``SHOW dpproxy.budget`` returns the caller's spent and remaining ε and δ as a result set;
``SHOW dpproxy.columns`` what the policy accepts on each protected column (policy_view.py).
"""

from __future__ import annotations

import math

from policies.errors import SQLSTATE, Refusal
from policies.model import MIN_EPSILON, Policy
from policies.tables import Relation, TableRegistry
from proxy.backend.connection import ResultSet
from proxy.dp.budget import BudgetKeeper
from proxy.wire.binary import TEXT
from proxy.wire.protocol import Field, Notice
from proxy.wire.values import encode_text
from rewriter.classify import DpproxyCommand
from rewriter.types import FLOAT8

from .policy_view import COLUMNS_FIELDS, columns_result
from .transactional import TransactionalValue

__all__ = ["BUDGET_FIELDS", "MAX_SAVEPOINTS", "SessionSettings"]

# Open savepoints one transaction may have: each keeps a frame here, in the process every
# session shares, and a client may send SAVEPOINT without end. (PostgreSQL slows every
# snapshot once a transaction has more than 64 subtransactions: clients nest a few.)
MAX_SAVEPOINTS = 10_000

# SHOW dpproxy.budget's notice where replicas may share the ledger (docs/deployment.md,
# "Reservations, replicas and reloads"): what they reserved is not known here, only that it
# is counted as spent until they give it back, so the figures shown are never above the truth.
_RESERVATIONS_ELSEWHERE = (
    "spent counts in full the budget reservations other dpproxy processes sharing this ledger may hold "
    "unused for you (each given back after {idle} s without an answer for you there); "
    "remaining is what can be spent now"
)


def _shared_reservations(policy: Policy) -> bool:
    """Whether other processes' reservations may be counted in the ledger's spend unasked: a
    ledger other replicas can share (not SQLite, one machine's file, where only this process's
    ``listen.workers`` siblings write, and are asked), and reservations of more than one answer."""
    return policy.ledger.reserve > 1 and not policy.ledger.url.startswith("sqlite")


BUDGET_FIELDS = [
    Field("user", TEXT),
    Field("spent_epsilon", FLOAT8, 8),
    Field("remaining_epsilon", FLOAT8, 8),
    Field("spent_delta", FLOAT8, 8),
    Field("remaining_delta", FLOAT8, 8),
    Field("period_start", TEXT),
]
_EPSILON_FIELDS = [Field("dpproxy.epsilon", TEXT)]


class SessionSettings:
    """One session's dpproxy settings, read against the policy in force."""

    def __init__(self, user: str):
        self.user = user
        self._default: float | None = None  # what RESET gives back: the startup packet's, else none
        self._epsilon = TransactionalValue[float | None](None)

    def start(self, startup: dict[str, str], policy: Policy) -> None:
        """Take ``dpproxy.epsilon`` from the startup parameters, as PostgreSQL takes a setting
        there: the session's value and what RESET returns to. Refused as a SET would be."""
        given = [value for name, value in startup.items() if name.lower() == "dpproxy.epsilon"]
        if given:
            self._default = self._checked(given[-1], policy)
            self._epsilon = TransactionalValue[float | None](self._default)

    @property
    def epsilon(self) -> float | None:
        """The session's ``SET dpproxy.epsilon`` in force now (None: the policy's)."""
        return self._epsilon.value

    def reset_all(self) -> None:
        """RESET ALL (or DISCARD ALL): dpproxy.* back to their defaults, as PostgreSQL's own."""
        self._epsilon.set(self._default)

    def transaction_statement(self, node: dict[str, object], before: bytes, after: bytes) -> None:
        """A transaction statement (its parse tree ``node``) has run on the backend, which was
        in transaction status ``before`` and is now in ``after``: follow what it did."""
        kind = node.get("kind")
        value = self._epsilon
        if kind in ("TRANS_STMT_BEGIN", "TRANS_STMT_START"):
            if before == b"I":
                value.begin()
        elif kind in ("TRANS_STMT_COMMIT", "TRANS_STMT_ROLLBACK"):
            # COMMIT of a failed block rolls back (PostgreSQL answers it ROLLBACK).
            if kind == "TRANS_STMT_COMMIT" and before == b"T":
                value.commit()
            else:
                value.rollback()
            if node.get("chain") and after != b"I":
                value.begin()
        elif kind == "TRANS_STMT_SAVEPOINT":
            value.savepoint(str(node.get("savepoint_name")))
        elif kind == "TRANS_STMT_RELEASE":
            value.release(str(node.get("savepoint_name")))
        elif kind == "TRANS_STMT_ROLLBACK_TO":
            value.rollback_to(str(node.get("savepoint_name")))

    def savepoint_room(self) -> None:
        """Refuse (54000), before it is sent, a SAVEPOINT beyond ``MAX_SAVEPOINTS`` open ones."""
        if self._epsilon.savepoints >= MAX_SAVEPOINTS:
            raise Refusal(SQLSTATE.PROGRAM_LIMIT_EXCEEDED,
                          f"too many savepoints in this transaction: dpproxy keeps at most {MAX_SAVEPOINTS} open",
                          "Release savepoints no longer needed (RELEASE SAVEPOINT), or end the transaction.")

    def implicit_block(self, ends: bool | None) -> None:
        """The implicit transaction of a query string of several statements began (None),
        or ended with a commit (True) or a rollback (False)."""
        if ends is None:
            self._epsilon.begin()
        elif ends:
            self._epsilon.commit()
        else:
            self._epsilon.rollback()

    def query_epsilon(self, policy: Policy, table: Relation) -> float:
        """ε of one query on ``table``: the table's, capped by the user's maximum and the session's SET."""
        epsilon = table.policy.epsilon
        assert epsilon is not None
        for cap in (policy.user(self.user).max_query_epsilon, self.epsilon):
            if cap is not None:
                epsilon = min(epsilon, cap)
        return epsilon

    def fields(self, command: DpproxyCommand) -> list[Field] | None:
        if command.verb != "show":
            return None
        return {"dpproxy.budget": BUDGET_FIELDS, "dpproxy.columns": COLUMNS_FIELDS}.get(command.name, _EPSILON_FIELDS)

    async def run(
        self, command: DpproxyCommand, policy: Policy, budget: BudgetKeeper, registry: TableRegistry, status: bytes
    ) -> tuple[ResultSet, list[str]]:
        """Answer ``command`` with the backend in transaction status ``status``: its result and notices."""
        if status == b"E":
            raise Refusal(SQLSTATE.IN_FAILED_TRANSACTION,
                          "current transaction is aborted, commands ignored until end of transaction block")
        return await self._run(command, policy, budget, registry), self._notices(command, policy)

    def _notices(self, command: DpproxyCommand, policy: Policy) -> list[str]:
        if command.local and command.verb != "show" and not self._epsilon.in_block:
            # and it changed nothing, as in PostgreSQL
            return [Notice("SET LOCAL can only be used in transaction blocks", "WARNING", "25P01")]
        if command.name == "dpproxy.budget" and command.verb == "show" and _shared_reservations(policy):
            return [Notice(_RESERVATIONS_ELSEWHERE.format(idle=f"{policy.ledger.release_idle_s:g}"), "NOTICE", "00000")]
        return []

    async def _run(
        self, command: DpproxyCommand, policy: Policy, budget: BudgetKeeper, registry: TableRegistry
    ) -> ResultSet:
        if command.name == "dpproxy.columns" and command.verb == "show":
            return columns_result(registry, lambda table: self.query_epsilon(policy, table))
        if command.name == "dpproxy.budget" and command.verb == "show":
            balance = await budget.balance(self.user, settled=True)
            row = [self.user.encode()] + [
                encode_text(v, FLOAT8)
                for v in (balance.spent_epsilon, balance.remaining_epsilon, balance.spent_delta, balance.remaining_delta)
            ] + [balance.period_start.isoformat().encode() if balance.period_start else None]
            return ResultSet(list(BUDGET_FIELDS), [row], "SHOW")
        if command.name != "dpproxy.epsilon":
            raise Refusal("42704", f'unrecognized configuration parameter "{command.name}"',
                          "dpproxy settings: dpproxy.epsilon (SET/SHOW/RESET), dpproxy.budget and dpproxy.columns (SHOW).")
        if command.verb == "show":
            value = "default" if self.epsilon is None else f"{self.epsilon:g}"
            return ResultSet(list(_EPSILON_FIELDS), [[value.encode()]], "SHOW")
        if command.verb == "reset":
            self._epsilon.set(self._default, command.local)
            return ResultSet([], [], "RESET" if not command.local else "SET")
        if command.verb == "set":
            self._epsilon.set(self._checked(command.value, policy), command.local)
        return ResultSet([], [], "SET")

    def _checked(self, value: str | None, policy: Policy) -> float:
        try:
            epsilon = float(value) if value is not None else math.nan
        except ValueError:
            epsilon = math.nan
        if not (epsilon > 0 and math.isfinite(epsilon)):
            raise Refusal(SQLSTATE.INVALID_PARAMETER_VALUE,
                          f'invalid value for dpproxy.epsilon: "{value}"', "Give a positive number, e.g. SET dpproxy.epsilon = 0.1.")
        if epsilon < MIN_EPSILON:
            raise Refusal(
                SQLSTATE.INVALID_PARAMETER_VALUE,
                f"dpproxy.epsilon = {epsilon:g} is below the minimum {MIN_EPSILON:g} (rule: epsilon-minimum)",
                f"Give a value of at least {MIN_EPSILON:g}; smaller ε adds noise beyond any use.",
                "epsilon-minimum",
            )
        maximum, limit = self._maximum(policy)
        if epsilon > maximum:
            raise Refusal(
                SQLSTATE.DP_EPSILON_ABOVE_MAXIMUM,
                f"dpproxy.epsilon = {epsilon:g} is above {maximum:g}, {limit} (rule: epsilon-maximum)",
                f"SET dpproxy.epsilon can only lower the per-query ε: give at most {maximum:g}, or ask the policy's "
                "owner to raise that limit.",
                "epsilon-maximum",
            )
        return epsilon

    def _maximum(self, policy: Policy) -> tuple[float, str]:
        """The largest per-query ε this user may set, and which limit of the policy sets it."""
        user_cap = policy.user(self.user).max_query_epsilon
        tables = {name: t.epsilon for name, t in policy.tables.items() if t.access == "protected" and t.epsilon}
        highest = max(tables.values(), default=0.0)
        if user_cap is not None and user_cap < highest:
            return user_cap, f"{self.user}'s max_query_epsilon (users.{self.user}.max_query_epsilon in the policy)"
        name = max(tables, key=lambda table: tables[table], default=None)
        if name is None:
            return 0.0, "as the policy protects no table"
        return highest, f"the largest per-query ε of a protected table (tables.{name}.epsilon in the policy)"
