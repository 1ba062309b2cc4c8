"""``dpproxy budget show|grant|reset`` as an operator runs it, against a SQLite ledger."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from policies.ledger import Budget, Ledger
from proxy.cli.main import main

# The backend DSN points at an unroutable address (TEST-NET-1): a budget command that tried
# to reach the backend would hang until the test's timeout instead of passing.
POLICY = """
backend: {{dsn: "postgresql://nobody@192.0.2.1:1/none?connect_timeout=30"}}
ledger: {{url: "sqlite:///{ledger}"}}
users:
  analyst:
    password: x
    budget: {{epsilon: 100, delta: 1.0e-4, period: month}}
  bob:
    password: y
    budget: {{epsilon: 10}}
tables: {{}}
"""
ANALYST_BUDGET = Budget(100, 1e-4, "month")
HEADER = ["user", "period start", "spent ε", "limit ε", "remaining ε", "spent δ", "remaining δ"]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(ledger=tmp_path / "ledger.sqlite3"), encoding="utf-8")
    return path


def _budget(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy.cli", "budget", *args],
        capture_output=True, text=True, encoding="utf-8", timeout=20,
    )


def _table(stdout: str) -> dict[str, dict[str, str]]:
    """The table that ends ``stdout`` as {user: {header: cell}}, after checking its header."""
    lines = stdout.splitlines()
    header = max(i for i, line in enumerate(lines) if line.startswith("user "))
    assert re.split(r"\s{2,}", lines[header]) == HEADER
    table = {}
    for row in lines[header + 1 :]:
        cells = re.split(r"\s{2,}", row)
        assert len(cells) == len(HEADER), row
        table[cells[0]] = dict(zip(HEADER, cells))
    return table


def test_show_lists_every_policy_user_with_nothing_spent(config: Path) -> None:
    result = _budget("show", "-c", str(config))
    assert result.returncode == 0, result.stderr
    table = _table(result.stdout)
    assert list(table) == ["analyst", "bob"]
    assert table["analyst"]["spent ε"] == "0"
    assert table["analyst"]["limit ε"] == table["analyst"]["remaining ε"] == "100"
    assert table["analyst"]["remaining δ"] == "0.0001"
    assert re.fullmatch(r"\d{4}-\d{2}-01", table["analyst"]["period start"])
    assert table["bob"]["period start"] == "-"
    assert table["bob"]["remaining ε"] == "10"


def test_show_one_user_prints_only_that_user(config: Path) -> None:
    result = _budget("show", "bob", "-c", str(config))
    assert result.returncode == 0, result.stderr
    assert list(_table(result.stdout)) == ["bob"]


def test_grant_raises_the_limit_for_the_current_period(config: Path, tmp_path: Path) -> None:
    result = _budget("grant", "analyst", "--epsilon", "5", "--delta", "1e-5", "-c", str(config))
    assert result.returncode == 0, result.stderr
    assert "granted analyst ε 5" in result.stdout
    row = _table(result.stdout)["analyst"]
    assert row["limit ε"] == row["remaining ε"] == "105"
    assert row["remaining δ"] == "0.00011"

    shown = _table(_budget("show", "analyst", "-c", str(config)).stdout)["analyst"]
    assert shown["limit ε"] == "105"
    with Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite3'}") as ledger:
        assert ledger.balance("analyst", ANALYST_BUDGET).limit_epsilon == 105


def test_reset_zeroes_a_spend_charged_through_the_ledger(config: Path, tmp_path: Path) -> None:
    with Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite3'}") as ledger:
        assert ledger.charge("analyst", 2.5, 1e-6, ANALYST_BUDGET).accepted
    before = _table(_budget("show", "-c", str(config)).stdout)["analyst"]
    assert before["spent ε"] == "2.5"
    assert before["remaining ε"] == "97.5"
    assert before["spent δ"] == "1e-06"

    result = _budget("reset", "analyst", "-c", str(config))
    assert result.returncode == 0, result.stderr
    row = _table(result.stdout)["analyst"]
    assert row["spent ε"] == row["spent δ"] == "0"
    assert row["remaining ε"] == "100"
    with Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.sqlite3'}") as ledger:
        assert ledger.balance("analyst", ANALYST_BUDGET).spent_epsilon == 0
        assert [entry.kind for entry in ledger.history("analyst")] == ["charge", "reset"]


@pytest.mark.parametrize("command", [["show", "carol"], ["grant", "carol", "--epsilon", "1"], ["reset", "carol"]])
def test_an_unknown_user_is_an_error_naming_the_known_ones(config: Path, tmp_path: Path, command: list[str]) -> None:
    result = _budget(*command, "-c", str(config))
    assert result.returncode == 1
    assert "unknown user 'carol'" in result.stderr
    assert "analyst, bob" in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "ledger.sqlite3").exists()  # refused before the ledger was opened


def test_a_negative_grant_is_refused(config: Path) -> None:
    result = _budget("grant", "bob", "--epsilon", "-1", "-c", str(config))
    assert result.returncode == 1
    assert "grant epsilon must be a finite number >= 0" in result.stderr


def test_an_invalid_policy_is_reported_with_its_location(tmp_path: Path) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text("backend: {dsn: x}\nusers: {}\ntables: {}\n", encoding="utf-8")
    result = _budget("show", "-c", str(config))
    assert result.returncode == 1
    assert f"{config}:2: users" in result.stderr


def test_budget_commands_never_connect_to_the_backend(
    config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a budget command connected to the backend")

    monkeypatch.setattr(psycopg, "connect", refuse)
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", refuse)
    assert main(["budget", "grant", "bob", "--epsilon", "1", "-c", str(config)]) == 0
    assert main(["budget", "reset", "bob", "-c", str(config)]) == 0
    capsys.readouterr()
    assert main(["budget", "show", "-c", str(config)]) == 0
    assert _table(capsys.readouterr().out)["bob"]["limit ε"] == "11"


def test_budget_commands_run_without_the_backend_dsn_or_the_passwords_in_the_environment(tmp_path: Path) -> None:
    # The policy an operator deploys keeps its secrets in the environment of `serve`; on the
    # host where they run `dpproxy budget` those variables are not set, and they are not needed.
    config = tmp_path / "policy.yaml"
    config.write_text(
        "backend: {dsn_env: DPPROXY_TEST_UNSET_DSN}\n"
        f'ledger: {{url: "sqlite:///{tmp_path / "ledger.sqlite3"}"}}\n'
        "users:\n"
        "  analyst: {password_env: DPPROXY_TEST_UNSET_PASSWORD, budget: {epsilon: 100}}\n"
        "tables: {}\n", encoding="utf-8")
    result = _budget("show", "-c", str(config))
    assert result.returncode == 0, result.stderr
    assert _table(result.stdout)["analyst"]["remaining ε"] == "100"
    assert _budget("grant", "analyst", "--epsilon", "1", "-c", str(config)).returncode == 0


def test_a_policy_loaded_without_secrets_still_needs_each_users_credential_named(tmp_path: Path) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text("backend: {dsn_env: DPPROXY_TEST_UNSET_DSN}\n"
                      "users:\n  analyst: {budget: {epsilon: 100}}\ntables: {}\n", encoding="utf-8")
    result = _budget("show", "-c", str(config))
    assert result.returncode == 1
    assert f"{config}:3: users.analyst: a user needs password, password_env or scram_verifier" in result.stderr
