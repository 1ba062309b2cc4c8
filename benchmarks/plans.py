"""The plan dpproxy makes of a DP statement, for the benchmarks that run its backend SQL directly."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from policies.loader import load_policy
from proxy.backend.connection import build_registry, connect
from proxy.demo.embedded import SERVICE_ROLE
from rewriter.classify import DPQuery, classify
from rewriter.dp_query import AggregateQuery
from rewriter.rewrite import backend_sql
from rewriter.statements import split_statements

from .postgres import BenchPostgres, free_port
from .servers import write_policy
from .tables import prepare_database, table_name

__all__ = ["DATABASE", "backend_sqls", "plan_of"]

DATABASE = "bench"


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


@contextmanager
def backend_sqls(sizes: list[int], data_dir: Path | None, statements: Callable[[str], dict[str, str]],
                 ) -> Iterator[tuple[BenchPostgres, dict[tuple[int, str], tuple[str, str]]]]:
    """PostgreSQL (in ``data_dir``, kept; else a temporary one) with the benchmark's tables of
    ``sizes`` in :data:`DATABASE`, and for each table and each named statement of
    ``statements(table)``, that statement and the backend SQL dpproxy sends for it (the benchmark
    policy's plan, :func:`rewriter.rewrite.backend_sql`); the server is stopped on leaving."""
    postgres = BenchPostgres(data_dir or Path(tempfile.mkdtemp(prefix="dpproxy-plans-")) / "pgdata", 20)
    try:
        prepare_database(postgres, DATABASE, sizes)
        tables = {rows: table_name(rows) for rows in sizes}
        policy = write_policy(Path(tempfile.mkdtemp(prefix="dpproxy-plans-")) / "policy.yaml",
                              postgres.endpoint(SERVICE_ROLE, DATABASE, tcp=False), free_port(), tables)
        yield postgres, {(rows, name): (direct, backend_sql(plan_of(policy, direct), seed=0))
                         for rows, table in tables.items() for name, direct in statements(table).items()}
    finally:
        postgres.stop()
