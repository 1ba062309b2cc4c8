"""The proxy's side of the budget ledger: charge a DP query before its answer leaves.

The ledger (policies.ledger) is written atomically and durably, so it is the authority on
what a user may spend. To keep that write off most queries, the keeper *reserves*
``ledger.reserve`` queries' worth of (ε, δ) in one atomic ledger charge and spends the
reservation locally. Once less than half of a reservation is left, a background task
reserves another, so a steady stream of answers spends from memory and never waits for
the ledger; only an answer the reservation cannot cover waits. When a reservation cannot
be had, it charges exactly what the query costs. The ledger therefore always holds at
least what was really spent: budgets can never be exceeded, by one proxy or by several
sharing a ledger. Unused reservations are released on a clean shutdown; a crash (kill -9)
loses less than one and a half reservations per user, which stay counted as spent.

Three rules keep a reservation from spending or stranding budget it should not:

* A reservation belongs to the budget (ε, δ, period) it was charged under. Once a reload
  changes a user's budget, the next answer finds the reservation stale, gives it back to
  the ledger and charges under the new limit; no answer after the reload spends from it.
* The unused part of a reservation is never more than what the ledger still has left
  after it (the ledger checks this in the same conditional UPDATE: ``keep_epsilon``), so
  near exhaustion queries are charged one by one and nothing is held back.
* A reservation unused for ``ledger.release_idle_s`` seconds goes back to the ledger,
  so another replica sharing the ledger can spend it: every ε of a budget can be spent
  through any mix of replicas, at worst after waiting that long (docs/deployment.md).

A query refused for budget costs nothing. A query that fails after it was charged stays
charged: whether it fails can itself depend on the data, so a refund would leak. If the
ledger cannot be reached the query is refused, never answered uncharged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Awaitable, Callable, TypeVar

from policies.errors import SQLSTATE, Refusal
from policies.ledger import (
    MAX_CHARGE_DELTA, MAX_CHARGE_EPSILON, Balance, Budget, ChargeResult, Ledger, exact_decimal as _exact,
)
from policies.model import MIN_EPSILON, Policy
from policies.periods import next_period_start, period_key

__all__ = ["BudgetKeeper", "Charged"]

T = TypeVar("T")
B = TypeVar("B", bound=Balance)

_MAX_EPS, _MAX_DLT = Decimal(MAX_CHARGE_EPSILON), Decimal(MAX_CHARGE_DELTA)
_ZERO = Decimal(0)

log = logging.getLogger("dpproxy.budget")


@dataclass
class _Reservation:
    """Budget charged to the ledger but not yet spent by this process, in one period."""

    period: str
    at: datetime
    epsilon: Decimal
    delta: Decimal
    ledger: Balance  # the ledger's view after the last write
    budget: Budget  # the limits it was charged under: spendable only while they are in force
    used: float = field(default_factory=time.monotonic)  # when last spent from or topped up
    refill: bool = True  # False once the ledger refused a refill, until a full reservation is had

    def covers(self, epsilon: Decimal, delta: Decimal) -> bool:
        return self.epsilon >= epsilon and self.delta >= delta

    def balance(self) -> Balance:
        """The user's balance as it really is: the unused reservation is not spent yet."""
        return self._unspent(Balance)

    def charged(self, period: str) -> Charged:
        """``balance()`` as the answer spending from it in ``period`` reports it."""
        return self._unspent(Charged, period)

    def _unspent(self, kind: Callable[..., B], *more: str) -> B:
        # Built field by field: ``dataclasses.replace`` and a copy into ``Charged`` cost an
        # answer more than the rest of its charge (tests/test_budget_refill.py pins the fields).
        ledger = self.ledger
        return kind(
            ledger.user,
            float(max(_ZERO, _exact(ledger.spent_epsilon) - self.epsilon)),
            float(max(_ZERO, _exact(ledger.spent_delta) - self.delta)),
            ledger.limit_epsilon, ledger.limit_delta, ledger.period_start, ledger.granted_epsilon,
            ledger.granted_delta, *more,
        )


@dataclass(frozen=True)
class Charged(Balance):
    """The balance after a charge, and the ledger period (row key) the charge was counted in."""

    period: str = ""


class BudgetKeeper:
    """Charges and reports each user's privacy budget, per the policy in force."""

    def __init__(self, ledger: Ledger, policy: Policy):
        self.ledger = ledger
        self.policy = policy
        self._reserved: dict[str, _Reservation] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._refills: dict[str, asyncio.Task[None]] = {}
        self._budgets: dict[str, tuple[object, Budget]] = {}  # user → (policy entry, its Budget)
        self._sweeper: asyncio.Task[None] | None = None
        self.settle_elsewhere: Callable[[str], Awaitable[None]] | None = None
        """Set when other processes of this ``dpproxy serve`` hold reservations of their own
        (``listen.workers``): has them give a user's back to the ledger, before ``balance``."""

    @classmethod
    def open(cls, policy: Policy) -> "BudgetKeeper":
        return cls(Ledger.from_url(policy.ledger.url, policy.ledger.schema_name), policy)

    def budget(self, user: str) -> Budget:
        """The user's budget under the policy in force.

        The same ``Budget`` object as long as its values stay the same, a new one once a
        reload changed them: a reservation is spendable only under the object it was
        charged under.
        """
        config = self.policy.user(user).budget
        cached = self._budgets.get(user)
        if cached is None or cached[0] is not config:
            if cached is None or cached[0] != config:
                cached = (config, Budget(config.epsilon, config.delta, config.period))
            else:
                cached = (config, cached[1])
            self._budgets[user] = cached
        return cached[1]

    async def charge(self, user: str, epsilon: float, delta: float, fingerprint: str | None = None) -> Charged:
        """Charge (ε, δ) to ``user`` or raise Refusal (DP002) saying what was asked and what is left."""
        eps, dlt = _exact(epsilon), _exact(delta)
        budget = self.budget(user)
        now = datetime.now(timezone.utc)
        period = period_key(budget.period, now)
        held = self._spend(user, budget, period, eps, dlt)  # no await: nothing can interleave
        if held is not None:
            charged = held.charged(period)
        else:
            async with self._locks.setdefault(user, asyncio.Lock()):
                # A refill or another charge may have topped the reservation up meanwhile,
                # or a reload may have changed the budget.
                budget = self.budget(user)
                period = period_key(budget.period, now)
                held = self._spend(user, budget, period, eps, dlt)
                if held is not None:
                    charged = held.charged(period)
                else:
                    await self._release_stale(user, budget)
                    balance = await self._charge_ledger(user, eps, dlt, budget, now, fingerprint)
                    charged = Charged(**vars(balance), period=period)  # the balance's fields, and the period
        self._refill_if_low(user, eps, dlt, budget, now, fingerprint)
        return charged

    def refund(self, user: str, epsilon: float, delta: float, charged: Charged) -> None:
        """Give back a charge whose query was never sent to the backend (so nothing about it
        can depend on the data). It returns to this process's reservation, which the ledger
        already counts, only if that reservation is of the period the charge was counted in:
        a charge made before midnight and given back after it was counted in yesterday's
        ledger row, so today's reservation must not grow by it. Otherwise it stays spent."""
        held = self._reserved.get(user)
        if held is None or held.period != charged.period:
            log.warning("could not refund ε=%g to %s: its budget period has ended", epsilon, user)
            return
        held.epsilon += _exact(epsilon)
        held.delta += _exact(delta)

    def _spend(self, user: str, budget: Budget, period: str, eps: Decimal, dlt: Decimal) -> _Reservation | None:
        """Spend from this process's reservation and return it; None when it does not cover
        the charge or was charged under other limits than ``budget``, the ones in force."""
        held = self._reserved.get(user)
        if held is None or held.budget is not budget or held.period != period or not held.covers(eps, dlt):
            return None
        held.epsilon -= eps
        held.delta -= dlt
        held.used = time.monotonic()
        return held

    async def _release_stale(self, user: str, budget: Budget) -> None:
        """Give back a reservation charged under limits no longer in force; with the user's lock held.

        A reload lowering a budget must not leave it spendable, and the ledger must then
        hold only the real spend, so that the new limit is measured against that.
        """
        held = self._reserved.get(user)
        if held is None or held.budget is budget:
            return
        await self._give_back(user, held)
        if held.epsilon or held.delta:  # the ledger failed: the query is refused (DP005)
            raise _ledger_unavailable()
        del self._reserved[user]

    async def _give_back(self, user: str, held: _Reservation) -> None:
        """Release ``held``'s unused amounts to the ledger; on failure they stay held (and counted spent)."""
        eps, dlt = held.epsilon, held.delta
        if not (eps or dlt):
            return
        held.epsilon = held.delta = Decimal(0)  # claimed: nothing spends them while the ledger is written
        try:
            await self._ledger_call(self.ledger.release, user, float(eps), float(dlt), held.budget, held.at)
        except Refusal:
            held.epsilon += eps
            held.delta += dlt

    async def _charge_ledger(
        self, user: str, eps: Decimal, dlt: Decimal, budget: Budget, now: datetime, fingerprint: str | None
    ) -> Balance:
        """Charge the ledger for ``reserve`` queries' worth, else for this one; with the user's lock held."""
        period = period_key(budget.period, now)
        held = self._reserved.get(user)
        have_eps = have_dlt = Decimal(0)
        if held is not None and held.period == period:
            # Claimed for this charge, so that answers spending the reservation while the
            # ledger is written cannot spend it too.
            have_eps, have_dlt = held.epsilon, held.delta
            held.epsilon = held.delta = Decimal(0)
        reserve = self.policy.ledger.reserve
        result = None
        for multiple in dict.fromkeys((reserve, 1)):
            top_eps = max(Decimal(0), eps * multiple - have_eps)
            top_dlt = max(Decimal(0), dlt * multiple - have_dlt)
            if top_eps > _MAX_EPS or top_dlt > _MAX_DLT:
                continue  # more than one ledger charge may be: no budget can cover it
            # What would stay unused must also be left in the ledger after this charge.
            keep_eps = have_eps + top_eps - eps
            keep_dlt = have_dlt + top_dlt - dlt
            try:
                result = await self._ledger_call(
                    self.ledger.charge, user, float(top_eps), float(top_dlt), budget, now, fingerprint,
                    float(keep_eps), float(keep_dlt),
                )
            except BaseException:
                if have_eps or have_dlt:  # the claim goes back, the query is not answered
                    self._add(user, budget, period, now, have_eps, have_dlt, None)
                raise
            if result.accepted:
                held = self._add(user, budget, period, now, keep_eps, keep_dlt, result.balance)
                held.refill = multiple == reserve
                return held.balance()
        if result is None:  # even this one query costs more than a budget can hold
            result = ChargeResult(False, await self._ledger_call(self.ledger.balance, user, budget, now))
        held = self._add(user, budget, period, now, have_eps, have_dlt, result.balance)
        held.refill = False
        left = held.balance()
        raise Refusal(
            SQLSTATE.DP_BUDGET_EXHAUSTED,
            f"privacy budget exhausted: this query costs ε={float(eps):g}, δ={float(dlt):g}; "
            f"{user} has ε={left.remaining_epsilon:g}, δ={left.remaining_delta:g} left (rule: budget)",
            _exhausted_hint(float(eps), float(dlt), left, budget.period, now),
            "budget",
        )

    def _add(
        self, user: str, budget: Budget, period: str, now: datetime, eps: Decimal, dlt: Decimal,
        ledger: Balance | None,
    ) -> _Reservation:
        """Put (ε, δ) into the user's reservation for ``period`` under ``budget``, with the
        ledger's latest view."""
        held = self._reserved.get(user)
        if held is None or held.period != period or held.budget is not budget:
            if ledger is None:
                raise AssertionError("a new reservation needs the ledger's balance")
            held = self._reserved[user] = _Reservation(period, now, Decimal(0), Decimal(0), ledger, budget)
        held.epsilon += eps
        held.delta += dlt
        held.used = time.monotonic()
        if ledger is not None:
            held.ledger = ledger
        if held.epsilon or held.delta:
            self._sweep_soon()
        return held

    def _refill_if_low(
        self, user: str, eps: Decimal, dlt: Decimal, budget: Budget, now: datetime, fingerprint: str | None
    ) -> None:
        """Add a whole reservation in the background once less than half of one is left.

        The answers that follow keep spending what is left while the ledger is written, so
        a steady stream of queries never waits for the ledger, and the ledger is still
        written once per ``reserve`` answers.
        """
        held = self._reserved.get(user)
        reserve = self.policy.ledger.reserve
        if held is None or not held.refill or reserve == 1 or user in self._refills:
            return
        if held.covers(eps * reserve / 2, dlt * reserve / 2):
            return
        task = asyncio.ensure_future(self._refill(user, eps * reserve, dlt * reserve, budget, now, fingerprint))
        self._refills[user] = task
        task.add_done_callback(lambda _: self._refills.pop(user, None))

    async def _refill(
        self, user: str, eps: Decimal, dlt: Decimal, budget: Budget, now: datetime, fingerprint: str | None
    ) -> None:
        async with self._locks.setdefault(user, asyncio.Lock()):
            period = period_key(budget.period, now)
            held = self._reserved.get(user)
            if user not in self.policy.users:
                return  # a reload dropped the user: the reservation goes back when dpproxy stops
            if held is None or held.budget is not self.budget(user) or held.period != period or not held.refill:
                return  # a reload changed the budget: the next answer releases the reservation
            try:
                result = await self._ledger_call(
                    self.ledger.charge, user, float(eps), float(dlt), budget, now, fingerprint,
                    float(held.epsilon + eps), float(held.delta + dlt),
                )
            except Refusal:
                result = None  # logged by _ledger_call; the next uncovered answer tries again
            if result is not None and result.accepted:
                self._add(user, budget, period, now, eps, dlt, result.balance)
            else:
                self._add(user, budget, period, now, Decimal(0), Decimal(0), result.balance if result else None).refill = False

    def _sweep_soon(self) -> None:
        """Make sure the task giving idle reservations back is running (from the event loop)."""
        if self._sweeper is not None and not self._sweeper.done():
            return
        try:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        except RuntimeError:  # no event loop (a synchronous caller): nothing to sweep from
            self._sweeper = None

    async def _sweep(self) -> None:
        """Give back reservations unused for ``ledger.release_idle_s``; ends once none is held."""
        idle_s = self.policy.ledger.release_idle_s
        while True:
            held_now = {user: held for user, held in self._reserved.items() if held.epsilon or held.delta}
            if not held_now:
                return
            now = time.monotonic()
            due = [user for user, held in held_now.items() if now - held.used >= idle_s]
            for user in due:
                lock = self._locks.setdefault(user, asyncio.Lock())
                if lock.locked():
                    continue  # a charge or refill is writing the ledger: the reservation is in use
                async with lock:
                    held = self._reserved.get(user)
                    if held is not None and time.monotonic() - held.used >= idle_s:
                        await self._give_back(user, held)
                        held.used = time.monotonic()  # if the ledger failed: retry after another idle period
            soonest = min(held.used for held in held_now.values()) + idle_s
            await asyncio.sleep(max(0.01, soonest - time.monotonic()))

    async def settle(self) -> None:
        """Wait for the reservation refills under way and stop giving back idle ones (before ``close``)."""
        while self._refills:
            await asyncio.gather(*self._refills.values(), return_exceptions=True)
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None

    async def give_back(self, user: str) -> None:
        """Give ``user``'s unused reservation back to the ledger now (a sibling worker's
        ``SHOW dpproxy.budget``); the next answer reserves afresh. On a ledger failure it stays
        held, and counted spent."""
        if user not in self.policy.users:
            return
        async with self._locks.setdefault(user, asyncio.Lock()):
            held = self._reserved.get(user)
            if held is not None:
                await self._give_back(user, held)

    async def balance(self, user: str, settled: bool = False) -> Balance:
        """The user's balance, counting this process's unused reservation as not spent; with
        ``settled``, the other workers' too, once they gave them back (``settle_elsewhere``):
        ``SHOW dpproxy.budget``, not the notices of answers, which would otherwise undo the
        reservations of every worker.

        Read under the user's lock: the idle sweep giving the reservation back between the
        ledger read and the reservation read would count it as spent once too often.
        """
        if settled and self.settle_elsewhere is not None:
            await self.settle_elsewhere(user)
        async with self._locks.setdefault(user, asyncio.Lock()):
            ledger = await self._ledger_call(self.ledger.balance, user, self.budget(user))
            held = self._reserved.get(user)
        budget = self.budget(user)
        if held is None or held.budget is not budget or held.period != period_key(budget.period, datetime.now(timezone.utc)):
            return ledger
        return replace(held, ledger=ledger).balance()

    def release_all(self) -> None:
        """Give unused reservations back to the ledger (on a clean shutdown)."""
        for user, held in self._reserved.items():
            if (held.epsilon or held.delta) and user in self.policy.users:
                try:
                    self.ledger.release(user, float(held.epsilon), float(held.delta), held.budget, held.at)
                except Exception as exc:  # the reservation simply stays counted as spent
                    log.warning("could not release %s's unused budget reservation: %s", user, exc)
        self._reserved.clear()

    async def _ledger_call(self, function: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.to_thread(function, *args)
        except Exception as exc:
            log.error("budget ledger failed: %s", exc)
            raise _ledger_unavailable() from None

    def close(self) -> None:
        self.release_all()
        self.ledger.close()


def _exhausted_hint(epsilon: float, delta: float, left: Balance, period: str | None, now: datetime) -> str:
    """What an analyst whose budget cannot pay for a query can do: lower ε only where what is
    left could pay for some query, drop MIN/MAX where δ is short, ask for more, or wait for the
    renewal, whose time the policy and the clock decide."""
    ways = []
    if epsilon > left.remaining_epsilon >= MIN_EPSILON:
        ways.append("lower the cost with SET dpproxy.epsilon (no more than what is left)")
    if delta > left.remaining_delta:
        ways.append("leave out MIN, MAX and AVG by sample and aggregate, the only aggregates that cost δ")
    ways.append("ask an administrator for more (dpproxy budget grant)")
    hint = "Either " + ", or ".join(ways) + "." if len(ways) > 1 else ways[0][0].upper() + ways[0][1:] + "."
    renewal = next_period_start(period, now)
    if renewal is not None:
        hint += f" It renews every {period}, next at {renewal:%Y-%m-%d %H:%M} UTC."
    return hint


def _ledger_unavailable() -> Refusal:
    return Refusal(
        SQLSTATE.DP_LEDGER_UNAVAILABLE,
        "the privacy budget ledger is unavailable, so no DP query can be answered (rule: ledger)",
        "Try again later; an administrator can see the cause in dpproxy's log.",
        "ledger",
    )
