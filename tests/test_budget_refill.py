"""The budget keeper's reservation refill: answers never wait for the ledger while the
reservation lasts, and the ledger never holds less than what was really spent."""

from __future__ import annotations

import asyncio
import random
import threading
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator

import pytest

from policies.ledger import Budget, ChargeResult, Ledger
from policies.loader import parse_policy
from policies.model import Policy
from proxy.dp.budget import BudgetKeeper

POLICY = """
backend: {{dsn: "postgresql://unused@localhost/unused"}}
ledger: {{url: "sqlite:///{ledger}", reserve: {reserve}}}
users:
  analyst:
    password: analyst
    budget: {{epsilon: {epsilon}, delta: 0.5}}
tables: {{}}
"""


class GatedLedger(Ledger):
    """A real SQLite ledger whose charges can be held back, and which counts them."""

    def __init__(self, url: str):
        super().__init__(url)
        self.gate = threading.Event()
        self.gate.set()
        self.charges: list[float] = []

    def charge(self, user: str, epsilon: float, delta: float, budget: Budget,
               now: datetime | None = None, fingerprint: str | None = None,
               keep_epsilon: float = 0.0, keep_delta: float = 0.0) -> ChargeResult:
        self.charges.append(epsilon)
        assert self.gate.wait(10), "the test never opened the gate"
        return super().charge(user, epsilon, delta, budget, now, fingerprint, keep_epsilon, keep_delta)


def _policy(tmp_path: Path, reserve: int, epsilon: float) -> Policy:
    return parse_policy(POLICY.format(ledger=tmp_path / "ledger.sqlite3", reserve=reserve, epsilon=epsilon), "test")


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[GatedLedger]:
    ledger = GatedLedger(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    yield ledger
    ledger.gate.set()
    ledger.close()


def _spent(ledger: Ledger, epsilon: float) -> float:
    return ledger.balance("analyst", Budget(epsilon, 0.5)).spent_epsilon


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in 5 s")


def test_answers_keep_spending_the_reservation_while_its_refill_is_written(tmp_path, ledger):
    keeper = BudgetKeeper(ledger, _policy(tmp_path, reserve=10, epsilon=1000))

    async def scenario() -> None:
        for _ in range(6):  # 1 ledger write of 10; after the 6th answer 4 are left: refill
            await keeper.charge("analyst", 1.0, 0.0)
        ledger.gate.clear()
        await _until(lambda: len(ledger.charges) == 2)  # the refill waits on the ledger
        assert ledger.charges == [10.0, 10.0]
        for _ in range(4):  # covered by what is left: none of them waits for the ledger
            await asyncio.wait_for(keeper.charge("analyst", 1.0, 0.0), timeout=2)
        eleventh = asyncio.ensure_future(keeper.charge("analyst", 1.0, 0.0))
        await asyncio.sleep(0.2)
        assert not eleventh.done()  # nothing left: it waits for the refill, not a new write
        ledger.gate.set()
        balance = await asyncio.wait_for(eleventh, timeout=5)
        assert ledger.charges == [10.0, 10.0]
        assert _spent(ledger, 1000) == pytest.approx(20.0)  # 11 spent, 9 reserved
        assert balance.spent_epsilon == pytest.approx(11.0)
        await keeper.settle()

    asyncio.run(scenario())
    keeper.release_all()
    assert _spent(ledger, 1000) == pytest.approx(11.0)


def test_a_refused_refill_is_not_retried_and_later_answers_charge_exactly(tmp_path, ledger):
    keeper = BudgetKeeper(ledger, _policy(tmp_path, reserve=10, epsilon=22.5))

    async def scenario() -> list[str]:
        outcomes = []
        for _ in range(24):
            try:
                await keeper.charge("analyst", 1.0, 0.0)
                outcomes.append("ok")
            except Exception as exc:  # Refusal
                outcomes.append(getattr(exc, "sqlstate", repr(exc)))
            await asyncio.sleep(0.01)  # lets a refill run
        await keeper.settle()
        return outcomes

    outcomes = asyncio.run(scenario())
    assert outcomes == ["ok"] * 22 + ["DP002"] * 2
    # 10 reserved; the refill of 10 is refused (it would hold back 14 with 2.5 left after
    # it) and not tried again; from the 11th answer on, a reservation would hold back more
    # than is left, so each answer tries one, then charges its exact cost; the refused ones
    # cost nothing.
    assert ledger.charges == [10.0, 10.0] + [10.0, 1.0] * 14
    assert _spent(ledger, 22.5) == pytest.approx(22.0)


def test_racing_answers_and_refills_never_let_the_ledger_fall_below_the_spend(tmp_path, ledger):
    limit = 60.0
    keeper = BudgetKeeper(ledger, _policy(tmp_path, reserve=5, epsilon=limit))
    costs = random.Random(7).choices([0.25, 0.5, 1.0, 2.0], k=120)
    accepted: list[float] = []
    low_water: list[float] = []

    async def client(mine: list[float]) -> None:
        for cost in mine:
            try:
                await keeper.charge("analyst", cost, 0.0)
            except Exception as exc:
                assert getattr(exc, "sqlstate", None) == "DP002", exc
            else:
                accepted.append(cost)
                low_water.append(_spent(ledger, limit) - sum(accepted))
            await asyncio.sleep(0)

    async def scenario() -> None:
        await asyncio.gather(*(client(costs[i::8]) for i in range(8)))
        await keeper.settle()

    asyncio.run(scenario())
    assert min(low_water) >= -1e-9  # the ledger held at least the real spend at every answer
    assert sum(accepted) <= limit
    keeper.release_all()
    assert _spent(ledger, limit) == pytest.approx(sum(accepted), abs=1e-9)


def test_a_reload_lowering_the_budget_while_a_refill_is_written_leaves_nothing_of_it_spendable(tmp_path, ledger):
    keeper = BudgetKeeper(ledger, _policy(tmp_path, reserve=10, epsilon=1000))

    async def scenario() -> list[str]:
        for _ in range(6):  # 10 reserved; after the 6th answer the refill starts
            await keeper.charge("analyst", 1.0, 0.0)
        ledger.gate.clear()
        await _until(lambda: len(ledger.charges) == 2)  # the refill, under the old limit, waits
        keeper.policy = _policy(tmp_path, reserve=10, epsilon=8)  # what Server.reload does
        ledger.gate.set()
        outcomes = []
        for _ in range(4):
            try:
                await asyncio.wait_for(keeper.charge("analyst", 1.0, 0.0), timeout=5)
                outcomes.append("ok")
            except Exception as exc:  # Refusal
                outcomes.append(getattr(exc, "sqlstate", repr(exc)))
        await keeper.settle()
        return outcomes

    assert asyncio.run(scenario()) == ["ok", "ok", "DP002", "DP002"]  # 6 + 2 = the new limit of 8
    assert _spent(ledger, 8) == pytest.approx(8.0)  # the old reservation and its refill were given back
    keeper.release_all()
    assert _spent(ledger, 8) == pytest.approx(8.0)


class UnreleasableLedger(Ledger):
    """A real SQLite ledger on which every release fails, and which counts the attempts."""

    def __init__(self, url: str):
        super().__init__(url)
        self.releases = 0

    def release(self, user: str, epsilon: float, delta: float, budget: Budget, now: datetime | None = None):  # type: ignore[no-untyped-def]
        self.releases += 1
        raise OSError("the ledger is unreachable")


def test_an_idle_reservation_the_ledger_cannot_take_back_stays_held_and_is_retried_once_per_idle_period(tmp_path):
    ledger = UnreleasableLedger(f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    text = POLICY.format(ledger=tmp_path / "ledger.sqlite3", reserve=10, epsilon=1000)
    keeper = BudgetKeeper(ledger, parse_policy(text.replace("reserve: 10}", "reserve: 10, release_idle_s: 0.1}"), "t"))

    async def scenario() -> None:
        await keeper.charge("analyst", 1.0, 0.0)  # 10 charged, 9 held
        await asyncio.sleep(0.65)  # idle: a give-back at 0.1 s, then one per 0.1 s idle at most
        assert 1 <= ledger.releases <= 7, ledger.releases
        await asyncio.wait_for(keeper.charge("analyst", 1.0, 0.0), timeout=2)  # still held: from memory
        await keeper.settle()

    try:
        asyncio.run(scenario())
        assert _spent(ledger, 1000) == pytest.approx(10.0)  # never less than the spend
    finally:
        ledger.close()


def test_an_answer_from_the_reservation_reports_every_field_of_the_ledgers_balance_with_its_spend():
    """The charge builds its ``Charged`` field by field (no ``dataclasses.replace``): every
    field of the ledger's balance must come through, the spend net of what is still held."""
    from dataclasses import fields, replace
    from decimal import Decimal

    from policies.ledger import Balance
    from proxy.dp.budget import Charged, _Reservation

    at = datetime(2026, 1, 5)
    ledger = Balance("analyst", 3.3, 0.25, 10.5, 0.75, at, granted_epsilon=0.5, granted_delta=0.125)
    held = _Reservation("week:2026-01-05", at, Decimal("1.1"), Decimal("0.05"), ledger,
                        Budget(10.0, 0.5, "week"))
    expected = replace(ledger, spent_epsilon=2.2, spent_delta=0.2)
    assert held.balance() == expected
    charged = held.charged("week:2026-01-05")
    assert type(charged) is Charged and charged.period == "week:2026-01-05"
    assert {f.name: getattr(charged, f.name) for f in fields(Balance)} == vars(expected)


def test_a_float_amount_is_read_as_its_decimal_once():
    from decimal import Decimal

    from policies.ledger import exact_decimal

    assert exact_decimal(0.1) == Decimal("0.1")
    assert exact_decimal(0.1) is exact_decimal(0.1)
