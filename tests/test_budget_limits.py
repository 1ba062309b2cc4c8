"""Budgets the ledger cannot represent exactly are refused when the policy is loaded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from policies.ledger import MAX_CHARGE_EPSILON, Budget, Ledger
from policies.loader import PolicyError, parse_policy
from policies.model import MAX_BUDGET_EPSILON

POLICY = """backend: {{dsn: "postgresql://unused@localhost/unused"}}
ledger: {{url: "sqlite:///{ledger}"}}
users:
  analyst:
    password: analyst
    budget: {{epsilon: {epsilon}, delta: 0.5}}
tables: {{}}
"""


def test_a_budget_above_the_maximum_is_a_file_line_error_naming_the_maximum(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as refused:
        parse_policy(POLICY.format(ledger=tmp_path / "l.sqlite3", epsilon=1e15), "policy.yaml")
    assert refused.value.problems == [
        "policy.yaml:6: users.analyst.budget.epsilon: Input should be less than or equal to 1000000"
    ]


def test_check_config_refuses_a_budget_above_the_maximum(tmp_path: Path) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text(POLICY.format(ledger=tmp_path / "l.sqlite3", epsilon=1e15))
    done = subprocess.run([sys.executable, "-m", "proxy.cli", "check-config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert f"{config}:6: users.analyst.budget.epsilon" in done.stderr + done.stdout


def test_the_largest_budget_is_spendable_to_its_last_unit(tmp_path: Path) -> None:
    policy = parse_policy(POLICY.format(ledger=tmp_path / "l.sqlite3", epsilon=MAX_BUDGET_EPSILON), "policy.yaml")
    assert MAX_BUDGET_EPSILON < MAX_CHARGE_EPSILON  # room for grants on top
    budget = Budget(policy.users["analyst"].budget.epsilon, 0.5)
    with Ledger(f"sqlite:///{tmp_path / 'l.sqlite3'}") as ledger:
        assert ledger.charge("analyst", MAX_BUDGET_EPSILON - 1e-6, 0.0, budget).accepted
        assert ledger.charge("analyst", 1e-6, 0.0, budget).accepted
        assert not ledger.charge("analyst", 1e-12, 0.0, budget).accepted
        assert ledger.balance("analyst", budget).spent_epsilon == MAX_BUDGET_EPSILON
