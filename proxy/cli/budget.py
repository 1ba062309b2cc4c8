"""``dpproxy budget show|grant|reset``: read and adjust analysts' budgets in the ledger.

Each command loads the policy (``-c``), opens the ledger it names and works on the
current period of each user's budget, with the limits the policy gives. Nothing here
connects to the backend database. Exit codes: 0 done, 1 for an unusable policy, an
unknown user, a refused amount or a ledger that cannot be reached (``proxy.startup``: one
line naming ledger.url's line in the policy).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable, Sequence

import sqlalchemy as sa

from policies.ledger import Balance, Budget, Ledger
from policies.loader import load_policy
from policies.model import Policy
from proxy.serving.startup import ledger_failure

__all__ = ["add_budget_commands", "balance_table", "grant", "reset", "show"]

_HEADERS = ("user", "period start", "spent ε", "limit ε", "remaining ε", "spent δ", "remaining δ")


def add_budget_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``budget show|grant|reset`` on the ``dpproxy`` sub-command parser."""
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument("-c", "--config", required=True, type=Path, help="policy file (YAML)")
    budget = commands.add_parser("budget", help="show, grant or reset analysts' privacy budgets")
    actions = budget.add_subparsers(dest="action", required=True)

    show_cmd = actions.add_parser(
        "show", parents=[config], help="spent and remaining ε and δ in the current period",
        description="limit ε is the policy's budget plus this period's grants.",
    )
    show_cmd.add_argument("user", nargs="?", help="one user (default: every user in the policy)")
    show_cmd.set_defaults(run=show)

    grant_cmd = actions.add_parser(
        "grant", parents=[config], help="add ε (and δ) to a user's budget for the current period"
    )
    grant_cmd.add_argument("user")
    grant_cmd.add_argument("--epsilon", type=float, required=True, help="ε to add")
    grant_cmd.add_argument("--delta", type=float, default=0.0, help="δ to add (default 0)")
    grant_cmd.set_defaults(run=grant)

    reset_cmd = actions.add_parser(
        "reset", parents=[config], help="set a user's spend in the current period back to 0 (grants stay)"
    )
    reset_cmd.add_argument("user")
    reset_cmd.set_defaults(run=reset)


def show(args: argparse.Namespace) -> int:
    """Print the balance of ``args.user``, or of every user in the policy."""
    def run(policy: Policy, ledger: Ledger) -> list[Balance]:
        users = sorted(policy.users) if args.user is None else [args.user]
        return [ledger.balance(user, _budget(policy, user)) for user in users]

    return _with_ledger(args, run)


def grant(args: argparse.Namespace) -> int:
    """Add ``args.epsilon`` and ``args.delta`` to ``args.user``'s current period; print the balance."""
    def run(policy: Policy, ledger: Ledger) -> list[Balance]:
        balance = ledger.grant(args.user, args.epsilon, args.delta, budget=_budget(policy, args.user))
        print(f"granted {args.user} ε {args.epsilon:g} and δ {args.delta:g} for the current period")
        return [balance]

    return _with_ledger(args, run)


def reset(args: argparse.Namespace) -> int:
    """Set ``args.user``'s spend in the current period to zero; print the balance."""
    def run(policy: Policy, ledger: Ledger) -> list[Balance]:
        balance = ledger.reset(args.user, _budget(policy, args.user))
        print(f"reset the spend of {args.user} in the current period to 0")
        return [balance]

    return _with_ledger(args, run)


def balance_table(balances: Sequence[Balance]) -> str:
    """Balances as an aligned text table: user and period left-aligned, amounts right-aligned."""
    rows = [_HEADERS] + [
        (
            b.user,
            "-" if b.period_start is None else b.period_start.date().isoformat(),
            *(_amount(v) for v in (b.spent_epsilon, b.limit_epsilon, b.remaining_epsilon,
                                   b.spent_delta, b.remaining_delta)),
        )
        for b in balances
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADERS))]
    return "\n".join(
        "  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        .rstrip()
        for row in rows
    )


def _with_ledger(args: argparse.Namespace, run: Callable[[Policy, Ledger], list[Balance]]) -> int:
    """Load the policy, open its ledger, ``run``, print the balances it returns; an exit code."""
    command = f"dpproxy budget {args.action}"
    # Without secrets: budgets need neither the backend's DSN nor the analysts' passwords.
    policy = load_policy(args.config, secrets=False)  # PolicyError: main prints each problem at its line
    if args.user is not None and args.user not in policy.users:
        print(f"{command}: unknown user {args.user!r}; the users of {args.config} are "
              f"{', '.join(sorted(policy.users))}", file=sys.stderr)
        return 1
    try:
        opened = Ledger.from_url(policy.ledger.url, policy.ledger.schema_name)
    except (ValueError, OSError, sa.exc.SQLAlchemyError) as exc:
        raise ledger_failure(policy.ledger, exc) from exc  # one line, at ledger.url's line
    try:
        with opened as ledger:
            balances = run(policy, ledger)
    except ValueError as exc:
        print(f"{command}: {exc}", file=sys.stderr)
        return 1
    except sa.exc.SQLAlchemyError as exc:
        # Not the URL: a PostgreSQL ledger URL may carry a password.
        cause = getattr(exc, "orig", None) or exc
        print(f"{command}: the ledger failed: {str(cause).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    print(balance_table(balances))
    return 0


def _budget(policy: Policy, user: str) -> Budget:
    config = policy.users[user].budget
    return Budget(config.epsilon, config.delta, config.period)


def _amount(value: float) -> str:
    return f"{value:.12g}"
