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
from rewriter.types import BOOL
from tests.bi_data import PEOPLE_POLICY, PEOPLE_TABLE, create_people
from tests.conftest import TEST_POLICY, RunningProxy, TestDatabase, make_policy, policy_registry, refused_uncharged, running_proxy
from tests.constant_values import ConstantEvaluator
from tests.differential_corpus import CONSTANT_STATEMENTS, adult_statements, variants
from tests.neighbour_cases import TABLE_DDL, domain_ddl, generate_case, policy_columns
from tests.parse_differential import divergences

SEED = 122
FUZZ_CASES = 400
VARIANTS_PER_STATEMENT = 6
_TABLE = "pdiff"


@pytest.fixture(scope="module")
def registry(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> TableRegistry:
    """The test policy's tables, ``people`` (its keys opted in to GROUP BY) and the neighbour fuzzer's table, as dpproxy registers them."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for statement in domain_ddl():
            conn.execute(statement)
        conn.execute(f"DROP TABLE IF EXISTS {_TABLE}")
        conn.execute(f"CREATE TABLE {_TABLE} ({TABLE_DDL})")
        conn.execute(f"GRANT SELECT ON {_TABLE} TO dpproxy_service")
    create_people(test_db)
    columns = policy_columns().replace("{", "{{").replace("}", "}}")
    text = TEST_POLICY + PEOPLE_TABLE + (f"  public.{_TABLE}: {{{{access: protected, epsilon: 1.0, delta: 1.0e-6, partitions: 3, "
                          f"columns: {columns}}}}}\n")
    ledger: Path = tmp_path_factory.mktemp("pdiff-ledger") / "ledger.sqlite3"
    return policy_registry(make_policy(test_db, ledger, text))


def backend_of(sql: str, registry: TableRegistry) -> tuple[list[str], frozenset[str], frozenset[str]] | None:
    """The backend SQL dpproxy runs for ``sql`` (a series limit's ranking first) and the protected
    table's columns and its boolean ones; None where dpproxy refuses ``sql`` or does not plan it."""
    by_name = {relation.name: relation for relation in registry.by_oid.values()}
    try:
        statements = split_statements(sql)
        if len(statements) != 1:
            return None
        statement = statements[0]
        resolved = {ref: (ResolvedRelation(by_name[ref.name].oid, "public", ref.name) if ref.name in by_name else None)
                    for ref in statement.references.relations}
        decision = classify(statement, resolved, registry)
    except (Refusal, SqlglotError, RecursionError):  # refused (the executor refuses the last two as unparsed)
        return None
    if isinstance(decision, CopyOut):
        decision = decision.inner
    if not isinstance(decision, DPQuery):
        return None
    plan = decision.plan
    ranking = [backend_sql(plan.series.ranking, seed=0)] if plan.series is not None else []
    columns = plan.table.columns
    return (ranking + [backend_sql(plan, seed=0)], frozenset(columns),
            frozenset(name for name, column in columns.items() if BOOL in (column.type_oid, column.base_type_oid)))


def _corpus() -> Iterator[str]:
    rng = random.Random(SEED)
    for _ in range(FUZZ_CASES):
        yield generate_case(rng).sql.replace("{table}", _TABLE)
    yield from adult_statements()
    yield from CONSTANT_STATEMENTS


@pytest.fixture(scope="module")
def same(test_db: TestDatabase) -> Iterator[ConstantEvaluator]:
    """Constant expressions evaluated on the test database (tests/constant_values.py)."""
    evaluator = ConstantEvaluator(test_db.admin_dsn)
    yield evaluator
    evaluator.close()


def _diverging(registry: TableRegistry, statements: Iterator[str],
               same: ConstantEvaluator | None = None) -> tuple[int, list[str]]:
    answered, found = 0, []
    for sql in statements:
        planned = backend_of(sql, registry)
        if planned is None:
            continue
        answered += 1
        backends, columns, booleans = planned
        found += [f"{sql!r}: {divergence}\n  backend: {backends}"
                  for divergence in divergences(sql, backends, columns, booleans, same)]
    return answered, found


def test_every_answered_statement_of_the_corpora_reads_alike_in_its_backend_sql(
        registry: TableRegistry, same: ConstantEvaluator) -> None:
    answered, found = _diverging(registry, _corpus(), same)
    assert answered >= 250, answered
    assert not found, "\n".join(found[:20])


def test_every_answered_lexical_variant_reads_alike_in_its_backend_sql(
        registry: TableRegistry, same: ConstantEvaluator) -> None:
    rng = random.Random(SEED)
    answered, found = _diverging(registry, (variant for sql in _corpus()
                                            for variant in variants(sql, rng, VARIANTS_PER_STATEMENT)), same)
    assert answered >= 300, answered
    assert not found, "\n".join(found[:40])


@pytest.fixture(scope="module")
def people_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over ``people``, whose ``signed_up`` is a timestamp (tests/bi_data.py)."""
    create_people(test_db)
    with running_proxy(test_db, tmp_path_factory, PEOPLE_POLICY) as running:
        yield running


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM people WHERE signed_up < CURRENT_TIMESTAMP(0)",
    "SELECT count(*) FILTER (WHERE signed_up > CURRENT_TIMESTAMP(3) - interval '3 years') FROM people",
])
def test_current_timestamp_with_a_precision_is_refused_before_any_charge(people_proxy: RunningProxy, sql: str) -> None:
    # sqlglot wrote CURRENT_TIMESTAMP(0) back as CURRENT_TIMESTAMP: the comparison was answered
    # without the rounding PostgreSQL applies, another condition than the analyst's.
    error = refused_uncharged(people_proxy, sql)
    assert (error.diag.sqlstate, error.diag.message_primary) == (
        "0A000", "CURRENT_TIMESTAMP(n) is not supported on protected table people (rule: timestamp-precision)")
    with people_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM people WHERE signed_up < CURRENT_TIMESTAMP").fetchone() is not None


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM people WHERE signed_up > now() - interval '1 day' - interval(3) '1'",
    "SELECT count(*) FILTER (WHERE signed_up > now() - INTERVAL (0) '3 years') FROM people",
])
def test_an_interval_with_a_precision_before_its_value_is_refused_before_any_charge(
        people_proxy: RunningProxy, sql: str) -> None:
    # sqlglot read interval(3) '1' as interval '3' + interval '1': answered for another condition.
    error = refused_uncharged(people_proxy, sql)
    assert (error.diag.sqlstate, error.diag.message_primary) == (
        "0A000", "interval(p) '...' is not supported on protected table people (rule: interval-precision)")
    with people_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM people WHERE signed_up > now() - interval '1 day'").fetchone()


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM people WHERE signed_up > interval '1 day' + '2023-01-01'::date",
    "SELECT count(*) FROM people WHERE signed_up > now() - (interval '1' day + $$2 hours$$::interval)",
    "SELECT count(*) FILTER (WHERE signed_up < interval '1 day' + '5' * 2) FROM people",
    "SELECT count(*) FROM people WHERE signed_up > now() - interval '1 day' + 1",
])
def test_an_interval_plus_a_string_is_refused_before_any_charge(people_proxy: RunningProxy, sql: str) -> None:
    # sqlglot read interval '1 day' + '2023-01-01'::date as CAST(interval '1 day' + interval '2023-01-01'
    # AS date), which failed (22007) where PostgreSQL answers, and interval '1 day' + '5' * 2 as
    # interval '1 day' + interval '5' * 2, and now() - interval '1 day' + 1 as ... + interval '1', both
    # answered where PostgreSQL fails (42883).
    error = refused_uncharged(people_proxy, sql)
    assert (error.diag.sqlstate, error.diag.message_primary) == (
        "0A000", "interval '...' + a literal is not supported on protected table people (rule: interval-sum)")
    with people_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM people WHERE signed_up > interval '1 day' + date '2023-01-01'"
                            ).fetchone() is not None


@pytest.mark.parametrize(("sql", "value"), [
    ("SELECT count(*) FROM people WHERE signed_up > timestamp '2024-06-01' + interval '400 days ago'", "400 days ago"),
    ("SELECT count(*) FILTER (WHERE signed_up > timestamp '2024-06-01' - interval '1 day 10:00') FROM people",
     "1 day 10:00"),
    ("SELECT count(*) FROM people WHERE signed_up > timestamp '2024-06-01' - interval '1.5' year", "1.5"),
    ("SELECT count(*) FROM people WHERE signed_up > timestamp '2024-06-01' - interval 'P1M'", "P1M"),
])
def test_an_interval_literal_sqlglot_reads_in_part_is_refused_before_any_charge(
        people_proxy: RunningProxy, sql: str, value: str) -> None:
    # sqlglot kept the one number and unit it found in the string: interval '400 days ago' was run as
    # interval '400 days' (another count: 0 where PostgreSQL counts 1,650), '1 day 10:00' as '1 day',
    # 'P1M' (a month) as '1 M' (a minute); interval '1.5' year (1 year) as interval '1.5 year'.
    error = refused_uncharged(people_proxy, sql)
    assert (error.diag.sqlstate, error.diag.message_primary) == (
        "0A000", f"the interval literal {value!r} is not supported on protected table people (rule: interval-form)")
    with people_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM people WHERE signed_up > timestamp '2024-06-01' "
                            "+ '400 days ago'::interval - interval '1' day").fetchone() is not None


@pytest.mark.parametrize(("sql", "symbol"), [
    ("SELECT count(*) FROM adult WHERE age !=-1", "!=-"),
    ("SELECT count(*) FROM adult WHERE age > 50 %-7", "%-"),
    ("SELECT count(*) FILTER (WHERE age > 50 %+7) FROM adult", "%+"),
])
def test_an_operator_glued_to_a_sign_is_refused_as_postgresql_reads_it(
        people_proxy: RunningProxy, sql: str, symbol: str) -> None:
    # PostgreSQL's scanner reads !=- and %- as operators of those names, which it does not have (42883);
    # sqlglot read age !=-1 as age != -1 and 50 %-7 as 50 % -7, and both were answered and charged.
    error = refused_uncharged(people_proxy, sql)
    assert (error.diag.sqlstate, error.diag.message_primary) == (
        "42883", f"operator does not exist: {symbol} (rule: undefined-operator)")
    with people_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM adult WHERE age != -1 AND age > 50 % -7").fetchone() is not None
