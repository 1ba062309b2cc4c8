"""``dpproxy scram-verifier``: a user's ``scram_verifier`` for the policy, so that the file (and
the environment of ``serve``) holds no password.

The password is read from the variable ``--password-env`` names, else asked for twice on the
terminal, else read as the first line of standard input; the verifier, in PostgreSQL's
``pg_authid.rolpassword`` format with a fresh random salt, is the only line printed.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys

from policies.credentials import derive_scram_verifier, format_scram_verifier

__all__ = ["add_credential_commands", "scram_verifier"]


def add_credential_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``scram-verifier`` on the ``dpproxy`` sub-command parser."""
    command = commands.add_parser(
        "scram-verifier", help="a SCRAM-SHA-256 verifier of a password, for a user's scram_verifier in a policy",
        description="Prints SCRAM-SHA-256$4096:<salt>$<StoredKey>:<ServerKey>, as PostgreSQL stores a password. "
                    "The password: --password-env's variable, else asked on the terminal, else stdin's first line.",
    )
    command.add_argument("--password-env", metavar="VAR", help="read the password from this environment variable")
    command.set_defaults(run=scram_verifier)


def scram_verifier(args: argparse.Namespace) -> int:
    """Print the verifier of the password ``args`` says where to find; 1 if there is none."""
    if args.password_env is not None and args.password_env not in os.environ:
        print(f"dpproxy scram-verifier: environment variable {args.password_env} is not set", file=sys.stderr)
        return 1
    password = _password(args.password_env)
    if not password:
        print("dpproxy scram-verifier: no password given (empty, or the two entries differ)", file=sys.stderr)
        return 1
    print(format_scram_verifier(derive_scram_verifier(password)))
    return 0


def _password(env: str | None) -> str | None:
    if env is not None:
        return os.environ[env]
    if sys.stdin.isatty():
        first = getpass.getpass("password: ")
        return first if getpass.getpass("again: ") == first else None
    return sys.stdin.readline().rstrip("\r\n")
