"""``dpproxy check-config`` against the backend: what ``serve`` would refuse, found before it runs.

The file is validated first (``policies.loader``). Then, if the policy's backend answers, the
same check ``serve`` and a reload make runs on it (``proxy.backend.build_registry``): every
table and column must exist, bounds need a numeric column and categories a text one, integer
columns integer bounds, ``ctid_hash`` a relation that has a stable ctid, the service role may
read each protected table. A backend that answers but refuses the policy's login (no such
database or role, a wrong password) is a problem at ``backend.dsn``'s line, as ``serve`` would
stop there; only when no backend answers is the check left at the file. Each problem is
reported at the line of its key in the file.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import psycopg

from policies.loader import PolicyError, key_line
from policies.model import Policy
from proxy.backend.connection import BackendError, build_registry, connect
from proxy.backend.partition_fit import usefulness_warnings
from proxy.serving.startup import backend_reason, backend_rejects_policy

__all__ = ["BackendCheck", "check_against_backend", "locate"]


@dataclass(frozen=True)
class BackendCheck:
    """The outcome: ``reached`` False (with ``reason``) means only the file was checked: no
    backend answered, or one answered that it cannot take connections for the moment. A backend
    that refuses the policy's login (no such database or role, a wrong password) is a problem."""

    reached: bool
    problems: list[str] = field(default_factory=list)
    reason: str | None = None
    tables: int = 0
    warnings: list[str] = field(default_factory=list)  # policies that work but answer mostly noise


async def check_against_backend(policy: Policy, text: str, source: str) -> BackendCheck:
    """Check ``policy`` (read from ``text``, named ``source`` in problems) on its backend."""
    timeout = 2 * policy.backend.connect_timeout_s + policy.backend.statement_timeout_ms / 1000
    try:
        problems, warnings = await asyncio.wait_for(_problems(policy), timeout)
    except (BackendError, psycopg.Error) as exc:
        reason = backend_reason(policy.backend, exc)
        if backend_rejects_policy(exc):  # the backend is there and says the DSN is wrong: serve would stop
            key = "dsn_env" if policy.backend.dsn_env else "dsn"
            return BackendCheck(True, [locate(f"backend.{key}: {reason}", policy, text, source)])
        return BackendCheck(False, reason=reason)
    except (OSError, asyncio.TimeoutError) as exc:
        reason = str(exc).strip() or f"no answer within {timeout:g}s"
        return BackendCheck(False, reason=reason.splitlines()[0])
    return BackendCheck(True, [locate(problem, policy, text, source) for problem in problems],
                        tables=len(policy.tables), warnings=[locate(w, policy, text, source) for w in warnings])


def locate(problem: str, policy: Policy, text: str, source: str) -> str:
    """``problem`` (``tables.<name>...: what``) prefixed with ``source:line`` of its key in ``text``."""
    return f"{source}:{key_line(text, _keys(problem, policy))}: {problem}"


async def _problems(policy: Policy) -> tuple[list[str], list[str]]:
    """What ``serve`` would refuse, and what it would warn about."""
    session = await connect(policy, report=False)
    try:
        registry = await build_registry(session, policy)
        return [], await usefulness_warnings(session, registry, policy)
    except PolicyError as exc:
        return exc.problems, []
    finally:
        await session.close()


def _keys(problem: str, policy: Policy) -> list[str]:
    """The policy keys a ``tables.<name>[.columns.<column>|.<key>]: ...`` or ``backend.<key>: ...``
    problem is about."""
    dotted = problem.split(": ", 1)[0]
    for name in sorted(policy.tables, key=len, reverse=True):
        prefix = f"tables.{name}"
        if dotted == prefix or dotted.startswith(prefix + "."):
            rest = dotted[len(prefix) + 1 :]
            if rest.startswith("columns."):
                return ["tables", name, "columns", rest.removeprefix("columns.")]
            return ["tables", name, *([rest] if rest else [])]
    return dotted.split(".") if dotted.startswith("backend.") else []
