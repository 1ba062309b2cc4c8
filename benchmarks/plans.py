"""The plan dpproxy makes of a DP statement, for the benchmarks that run its backend SQL directly."""

from __future__ import annotations

import asyncio
from pathlib import Path

from policies.loader import load_policy
from proxy.backend.connection import build_registry, connect
from rewriter.classify import DPQuery, classify
from rewriter.dp_query import AggregateQuery
from rewriter.statements import split_statements

__all__ = ["plan_of"]


def plan_of(policy_path: Path, sql: str) -> AggregateQuery:
    """The plan dpproxy makes of the DP statement ``sql`` under the policy at ``policy_path``."""
    return asyncio.run(_plan(policy_path, sql))


async def _plan(policy_path: Path, sql: str) -> AggregateQuery:
    policy = load_policy(policy_path)
    backend = await connect(policy)
    try:
        registry = await build_registry(backend, policy)
        statement = split_statements(sql)[0]
        resolved = await backend.resolve(statement.references.relations)
        decision = classify(statement, resolved, registry)
    finally:
        await backend.close()
    assert isinstance(decision, DPQuery), decision
    return decision.plan
