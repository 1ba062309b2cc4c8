"""The proxy's side of the budget ledger: charge a DP query before its answer leaves.

A charge is one atomic conditional update in the ledger (policies.ledger), made before the
backend runs the query. A query refused for budget costs nothing. A query that fails after
it was charged stays charged: whether it fails can itself depend on the data, so a refund
would leak. If the ledger cannot be reached the query is refused, never answered uncharged.
"""

from __future__ import annotations

import asyncio
import logging

from policies.errors import SQLSTATE, Refusal
from policies.ledger import Balance, Budget, Ledger
from policies.model import Policy

__all__ = ["BudgetKeeper"]

log = logging.getLogger("dpproxy.budget")


class BudgetKeeper:
    """Charges and reports each user's privacy budget, per the policy in force."""

    def __init__(self, ledger: Ledger, policy: Policy):
        self.ledger = ledger
        self.policy = policy

    @classmethod
    def open(cls, policy: Policy) -> "BudgetKeeper":
        return cls(Ledger.from_url(policy.ledger.url, policy.ledger.schema_name), policy)

    def budget(self, user: str) -> Budget:
        config = self.policy.users[user].budget
        return Budget(config.epsilon, config.delta, config.period)

    async def charge(self, user: str, epsilon: float, delta: float, fingerprint: str | None = None) -> Balance:
        """Charge (ε, δ) to ``user`` or raise Refusal (DP002) saying what was asked and what is left."""
        budget = self.budget(user)
        try:
            result = await asyncio.to_thread(self.ledger.charge, user, epsilon, delta, budget, None, fingerprint)
        except Exception as exc:
            log.error("budget ledger failed: %s", exc)
            raise _ledger_unavailable() from None
        if not result.accepted:
            left = result.balance
            period = f" It renews every {budget.period} (UTC)." if budget.period else ""
            raise Refusal(
                SQLSTATE.DP_BUDGET_EXHAUSTED,
                f"privacy budget exhausted: this query costs ε={epsilon:g}, δ={delta:g}; "
                f"{user} has ε={left.remaining_epsilon:g}, δ={left.remaining_delta:g} left (rule: budget)",
                "Lower the cost with SET dpproxy.epsilon = <smaller value>, or ask an administrator "
                "for more (dpproxy budget grant)." + period,
                "budget",
            )
        return result.balance

    async def balance(self, user: str) -> Balance:
        try:
            return await asyncio.to_thread(self.ledger.balance, user, self.budget(user))
        except Exception as exc:
            log.error("budget ledger failed: %s", exc)
            raise _ledger_unavailable() from None

    def close(self) -> None:
        self.ledger.close()


def _ledger_unavailable() -> Refusal:
    return Refusal(
        SQLSTATE.DP_LEDGER_UNAVAILABLE,
        "the privacy budget ledger is unavailable, so no DP query can be answered (rule: ledger)",
        "Try again later; an administrator can see the cause in dpproxy's log.",
        "ledger",
    )
