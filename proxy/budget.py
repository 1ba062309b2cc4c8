"""The proxy's side of the budget ledger: charge a DP query before its answer leaves.

The ledger (policies.ledger) is written atomically and durably, so it is the authority on
what a user may spend. To keep that write off most queries, the keeper *reserves*
``ledger.reserve`` queries' worth of (ε, δ) in one atomic ledger charge and spends the
reservation locally; when a reservation cannot be had, it charges exactly what the query
costs. The ledger therefore always holds at least what was really spent: budgets can
never be exceeded, by one proxy or by several sharing a ledger. Unused reservations are
released on a clean shutdown; a crash (kill -9) loses at most one reservation per user,
which stays counted as spent.

A query refused for budget costs nothing. A query that fails after it was charged stays
charged: whether it fails can itself depend on the data, so a refund would leak. If the
ledger cannot be reached the query is refused, never answered uncharged.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from decimal import Decimal

from policies.errors import SQLSTATE, Refusal
from policies.ledger import Balance, Budget, Ledger
from policies.model import Policy
from policies.periods import period_key

__all__ = ["BudgetKeeper"]

log = logging.getLogger("dpproxy.budget")


@dataclass
class _Reservation:
    """Budget charged to the ledger but not yet spent by this process, in one period."""

    period: str
    at: datetime
    epsilon: Decimal
    delta: Decimal
    ledger: Balance  # the ledger's view after the last write

    def covers(self, epsilon: Decimal, delta: Decimal) -> bool:
        return self.epsilon >= epsilon and self.delta >= delta

    def balance(self) -> Balance:
        """The user's balance as it really is: the unused reservation is not spent yet."""
        return replace(
            self.ledger,
            spent_epsilon=float(max(Decimal(0), _exact(self.ledger.spent_epsilon) - self.epsilon)),
            spent_delta=float(max(Decimal(0), _exact(self.ledger.spent_delta) - self.delta)),
        )


class BudgetKeeper:
    """Charges and reports each user's privacy budget, per the policy in force."""

    def __init__(self, ledger: Ledger, policy: Policy):
        self.ledger = ledger
        self.policy = policy
        self._reserved: dict[str, _Reservation] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @classmethod
    def open(cls, policy: Policy) -> "BudgetKeeper":
        return cls(Ledger.from_url(policy.ledger.url, policy.ledger.schema_name), policy)

    def budget(self, user: str) -> Budget:
        config = self.policy.users[user].budget
        return Budget(config.epsilon, config.delta, config.period)

    async def charge(self, user: str, epsilon: float, delta: float, fingerprint: str | None = None) -> Balance:
        """Charge (ε, δ) to ``user`` or raise Refusal (DP002) saying what was asked and what is left."""
        eps, dlt = _exact(epsilon), _exact(delta)
        budget = self.budget(user)
        now = datetime.now(timezone.utc)
        async with self._locks.setdefault(user, asyncio.Lock()):
            held = self._reserved.get(user)
            if held is not None and held.period != period_key(budget.period, now):
                held = None  # a new period: the old reservation no longer matters
            if held is not None and held.covers(eps, dlt):
                held.epsilon -= eps
                held.delta -= dlt
                return held.balance()
            have_eps = held.epsilon if held else Decimal(0)
            have_dlt = held.delta if held else Decimal(0)
            for multiple in dict.fromkeys((self.policy.ledger.reserve, 1)):
                top_eps = max(Decimal(0), eps * multiple - have_eps)
                top_dlt = max(Decimal(0), dlt * multiple - have_dlt)
                result = await self._ledger_call(
                    self.ledger.charge, user, float(top_eps), float(top_dlt), budget, now, fingerprint
                )
                if result.accepted:
                    reservation = _Reservation(
                        period_key(budget.period, now), now,
                        have_eps + top_eps - eps, have_dlt + top_dlt - dlt, result.balance,
                    )
                    self._reserved[user] = reservation
                    return reservation.balance()
            left = result.balance if held is None else replace(held, ledger=result.balance).balance()
            period = f" It renews every {budget.period} (UTC)." if budget.period else ""
            raise Refusal(
                SQLSTATE.DP_BUDGET_EXHAUSTED,
                f"privacy budget exhausted: this query costs ε={epsilon:g}, δ={delta:g}; "
                f"{user} has ε={left.remaining_epsilon:g}, δ={left.remaining_delta:g} left (rule: budget)",
                "Lower the cost with SET dpproxy.epsilon = <smaller value>, or ask an administrator "
                "for more (dpproxy budget grant)." + period,
                "budget",
            )

    async def balance(self, user: str) -> Balance:
        """The user's balance, counting this process's unused reservation as not spent."""
        ledger = await self._ledger_call(self.ledger.balance, user, self.budget(user))
        held = self._reserved.get(user)
        if held is None or held.period != period_key(self.budget(user).period, datetime.now(timezone.utc)):
            return ledger
        return replace(held, ledger=ledger).balance()

    def release_all(self) -> None:
        """Give unused reservations back to the ledger (on a clean shutdown)."""
        for user, held in self._reserved.items():
            if (held.epsilon or held.delta) and user in self.policy.users:
                try:
                    self.ledger.release(user, float(held.epsilon), float(held.delta), self.budget(user), held.at)
                except Exception as exc:  # the reservation simply stays counted as spent
                    log.warning("could not release %s's unused budget reservation: %s", user, exc)
        self._reserved.clear()

    async def _ledger_call(self, function, *args):  # type: ignore[no-untyped-def]
        try:
            return await asyncio.to_thread(function, *args)
        except Exception as exc:
            log.error("budget ledger failed: %s", exc)
            raise _ledger_unavailable() from None

    def close(self) -> None:
        self.release_all()
        self.ledger.close()


def _exact(value: float) -> Decimal:
    """A float as the decimal it prints as (the ledger reads amounts the same way)."""
    return Decimal(repr(float(value)))


def _ledger_unavailable() -> Refusal:
    return Refusal(
        SQLSTATE.DP_LEDGER_UNAVAILABLE,
        "the privacy budget ledger is unavailable, so no DP query can be answered (rule: ledger)",
        "Try again later; an administrator can see the cause in dpproxy's log.",
        "ledger",
    )
