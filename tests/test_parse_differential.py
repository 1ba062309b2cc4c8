"""The parse differential: in every DP statement dpproxy accepts, PostgreSQL reads the same columns
and conditions in the statement as in the backend SQL dpproxy runs for it (tests/parse_differential.py).

The statements are the suite's corpora and a bounded number of lexical variants of them
(tests/differential_corpus.py). Each is classified and planned as dpproxy does, against the
registry dpproxy builds from a real PostgreSQL; a statement dpproxy refuses is not read further.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlglot.errors import SqlglotError

from policies.errors import Refusal
from policies.tables import TableRegistry
from rewriter.classify import CopyOut, DPQuery, ResolvedRelation, classify
from rewriter.rewrite import backend_sql
from rewriter.statements import split_statements
from tests.conftest import TEST_POLICY, TestDatabase, make_policy, policy_registry
from tests.differential_corpus import adult_statements, variants
from tests.neighbour_cases import TABLE_DDL, domain_ddl, generate_case, policy_columns
from tests.parse_differential import divergences

SEED = 122
FUZZ_CASES = 400
VARIANTS_PER_STATEMENT = 6
_TABLE = "pdiff"


@pytest.fixture(scope="module")
def registry(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> TableRegistry:
    """The test policy's tables and the neighbour fuzzer's table, as dpproxy registers them."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for statement in domain_ddl():
            conn.execute(statement)
        conn.execute(f"DROP TABLE IF EXISTS {_TABLE}")
        conn.execute(f"CREATE TABLE {_TABLE} ({TABLE_DDL})")
        conn.execute(f"GRANT SELECT ON {_TABLE} TO dpproxy_service")
    columns = policy_columns().replace("{", "{{").replace("}", "}}")
    text = TEST_POLICY + (f"  public.{_TABLE}: {{{{access: protected, epsilon: 1.0, delta: 1.0e-6, partitions: 3, "
                          f"columns: {columns}}}}}\n")
    ledger: Path = tmp_path_factory.mktemp("pdiff-ledger") / "ledger.sqlite3"
    return policy_registry(make_policy(test_db, ledger, text))


def backend_of(sql: str, registry: TableRegistry) -> tuple[list[str], frozenset[str]] | None:
    """The backend SQL dpproxy runs for ``sql`` (a series limit's ranking first) and the protected
    table's columns; None where dpproxy refuses ``sql`` or does not plan it."""
    by_name = {relation.name: relation for relation in registry.by_oid.values()}
    try:
        statements = split_statements(sql)
        if len(statements) != 1:
            return None
        statement = statements[0]
        resolved = {ref: (ResolvedRelation(by_name[ref.name].oid, "public", ref.name) if ref.name in by_name else None)
                    for ref in statement.references.relations}
        decision = classify(statement, resolved, registry)
    except (Refusal, SqlglotError, RecursionError, AssertionError):  # refused (the executor refuses the last two as unparsed)
        return None
    if isinstance(decision, CopyOut):
        decision = decision.inner
    if not isinstance(decision, DPQuery):
        return None
    plan = decision.plan
    ranking = [backend_sql(plan.series.ranking, seed=0)] if plan.series is not None else []
    return ranking + [backend_sql(plan, seed=0)], frozenset(plan.table.columns)


def _corpus() -> Iterator[str]:
    rng = random.Random(SEED)
    for _ in range(FUZZ_CASES):
        yield generate_case(rng).sql.replace("{table}", _TABLE)
    yield from adult_statements()


def _diverging(registry: TableRegistry, statements: Iterator[str]) -> tuple[int, list[str]]:
    answered, found = 0, []
    for sql in statements:
        planned = backend_of(sql, registry)
        if planned is None:
            continue
        answered += 1
        backends, columns = planned
        found += [f"{sql!r}: {divergence}\n  backend: {backends}" for divergence in divergences(sql, backends, columns)]
    return answered, found


def test_every_answered_statement_of_the_corpora_reads_alike_in_its_backend_sql(registry: TableRegistry) -> None:
    answered, found = _diverging(registry, _corpus())
    assert answered >= 250, answered
    assert not found, "\n".join(found[:20])


def test_every_answered_lexical_variant_reads_alike_in_its_backend_sql(registry: TableRegistry) -> None:
    rng = random.Random(SEED)
    answered, found = _diverging(registry, (variant for sql in _corpus()
                                            for variant in variants(sql, rng, VARIANTS_PER_STATEMENT)))
    assert answered >= 300, answered
    assert not found, "\n".join(found[:40])
