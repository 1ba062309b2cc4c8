"""Reconciliation of spend after a test: budget keeper = audit log = metrics = ledger.

The ledger also holds this process's unused reservation, so while dpproxy runs the
authority is the budget keeper's view (ledger spend minus unused reservation); after a clean
shutdown the reservation is released and the ledger itself must agree.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from conftest import RunningProxy
from policies.ledger import Budget, Ledger
from proxy.ops import metrics

__all__ = ["Spend", "audit_lines", "charged_metric", "spend_while_running", "assert_reconciled"]

_TOLERANCE = 1e-9


@dataclass(frozen=True)
class Spend:
    """What one user was charged, as the budget keeper and the ε metric saw it."""

    keeper: float
    metric: float


def charged_metric(user: str) -> float:
    """``dpproxy_epsilon_charged_total`` for ``user`` in this process (0 before any charge),
    with every observation queued so far applied (as a scrape does)."""
    metrics.flush()
    return REGISTRY.get_sample_value("dpproxy_epsilon_charged_total", {"user": user}) or 0.0


def spend_while_running(proxy: RunningProxy, user: str) -> Spend:
    """The keeper's spend for ``user`` and the metric, read on the proxy's loop after every
    audit callback already queued there has run."""
    balance = proxy._call(proxy.server.budget.balance(user))  # type: ignore[no-untyped-call]
    return Spend(balance.spent_epsilon, charged_metric(user))


def audit_lines(path: Path, user: str, at_least: int = 0, timeout_s: float = 5.0) -> list[dict[str, Any]]:
    """The audit log's lines for ``user`` (waiting up to ``timeout_s`` for ``at_least`` of them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = path.read_text(encoding="utf-8") if path.exists() else ""
        lines = [line for line in map(json.loads, text.splitlines()) if line["user"] == user]
        if len(lines) >= at_least or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def assert_reconciled(
    proxy: RunningProxy, audit_path: Path, user: str, metric_before: float, running: Spend | None = None
) -> float:
    """Stop ``proxy`` (unless stopped already, with ``running`` read before) and assert
    keeper = Σ audit ε = metric = ledger for ``user``; return the spend."""
    if running is None:
        running = spend_while_running(proxy, user)
        proxy.stop()  # closes the audit log (every line written) and releases unused reservations
    audit = sum(float(line["epsilon"] or 0.0) for line in audit_lines(audit_path, user))
    ledger = Ledger.from_url(proxy.policy.ledger.url, proxy.policy.ledger.schema_name)
    try:
        config = proxy.policy.users[user].budget
        spent = ledger.balance(user, Budget(config.epsilon, config.delta, config.period)).spent_epsilon
    finally:
        ledger.close()
    assert running.keeper == pytest.approx(audit, abs=_TOLERANCE), "budget keeper vs audit log"
    metric = charged_metric(user) - metric_before  # after the stop: every statement has been counted
    assert metric == pytest.approx(audit, abs=_TOLERANCE), "metric vs audit log"
    assert spent == pytest.approx(audit, abs=_TOLERANCE), "ledger (after release) vs audit log"
    return audit
