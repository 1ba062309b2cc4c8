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
from tests.bi_data import PEOPLE_POLICY, create_people
from tests.conftest import TEST_POLICY, RunningProxy, TestDatabase, make_policy, policy_registry, refused_uncharged, running_proxy
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


def _diverging(registry: TableRegistry, statements: Iterator[str]) -> tuple[int, list[str]]:
    answered, found = 0, []
    for sql in statements:
        planned = backend_of(sql, registry)
        if planned is None:
            continue
        answered += 1
        backends, columns, booleans = planned
        found += [f"{sql!r}: {divergence}\n  backend: {backends}"
                  for divergence in divergences(sql, backends, columns, booleans)]
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
    # A comment between the tokens is no space to PostgreSQL: it reads interval(3) '1' still.
    "SELECT count(*) FROM people WHERE signed_up > now() - interval /* p */ (3) '1'",
    "SELECT count(*) FROM people WHERE signed_up > now() - interval -- p\n(3) '1'",
])
def test_an_interval_with_a_precision_before_its_value_is_refused_before_any_charge(
        people_proxy: RunningProxy, sql: str) -> None:
    # sqlglot read interval(3) '1' as interval '3' + interval '1': answered for another condition.
    error = refused_uncharged(people_proxy, sql)
    assert (error.diag.sqlstate, error.diag.message_primary) == (
        "0A000", "interval(p) '...' is not supported on protected table people (rule: interval-precision)")
    with people_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM people WHERE signed_up > now() - interval '1 day'").fetchone()


# (the literal as written, what sqlglot wrote for it, each as PostgreSQL reads it)
_MISREAD_INTERVALS = [
    ("interval '1 day ago'", "interval '1 DAY'", "-1 days", "1 day"),
    ("interval '1 day 1:30'", "interval '1 DAY'", "1 day 01:30:00", "1 day"),
    ("interval '.5 day'", "interval '5 DAY'", "12:00:00", "5 days"),
    ("interval 'P2M'", "interval '2 MINUTE'", "2 mons", "00:02:00"),
    ("interval '1 hour 30'", "interval '1 HOUR'", "01:00:30", "01:00:00"),
    ("interval '- 2 day'", "interval '2 DAY'", "-2 days", "2 days"),
    ("interval '1.5' hour", "interval '1.5 HOUR'", "01:00:00", "01:30:00"),
    ("interval '1:30' hour", "interval '1:30 HOUR'", "01:00:00", "01:30:00"),
    ("INTERVAL '2.5' MONTH", "interval '2.5 MONTH'", "2 mons", "2 mons 15 days"),
]


@pytest.mark.parametrize(("written", "rendered", "meant", "ran"), _MISREAD_INTERVALS)
def test_an_interval_literal_sqlglot_reads_otherwise_is_refused_before_any_charge(
        people_proxy: RunningProxy, test_db: TestDatabase, written: str, rendered: str, meant: str, ran: str) -> None:
    # sqlglot kept one number and unit of the string and dropped the rest (a sign's "ago", a time,
    # a leading "."), or folded a single field into the string where PostgreSQL keeps whole units:
    # answered, and charged, for another interval than the analyst's.
    with psycopg.connect(test_db.admin_dsn) as admin:
        assert admin.execute(f"SELECT ({written})::text, ({rendered})::text").fetchone() == (meant, ran)
    for sql in (f"SELECT count(*) FROM people WHERE signed_up > now() - {written}",
                f"SELECT count(*) FILTER (WHERE signed_up > now() - {written}) FROM people"):
        error = refused_uncharged(people_proxy, sql)
        assert (error.diag.sqlstate, error.diag.message_primary) == (
            "0A000", f"the interval literal {written}, which dpproxy's DP planner reads otherwise than PostgreSQL, "
            "is not supported on protected table people (rule: interval-form)"), error.diag.message_primary
        assert "'-1 day', not '1 day ago'" in (error.diag.message_hint or "")


@pytest.mark.parametrize(("written", "meant", "named"), [  # meant: None where PostgreSQL fails (42883)
    ("interval '1 day' + 5", None, "interval '1 day' + 5"),  # answered as 1 day 00:00:05
    ("interval '1' day + 1.5", None, "interval '1' day + 1.5"),  # as 1 day 00:00:01.5
    ("interval '1 day' + '1 day ago'", "00:00:00", "interval '1 day' + '1 day ago'"),  # as 2 days
    ("interval '1 day' + '.5 day' + '1'", "1 day 12:00:01", "interval '1 day' + '.5 day'"),  # as 6 days 00:00:01
])
def test_a_constant_added_to_an_interval_literal_is_refused_before_any_charge(
        people_proxy: RunningProxy, test_db: TestDatabase, written: str, meant: str | None, named: str) -> None:
    # sqlglot reads a constant after an interval literal's + as one more interval literal
    # (INTERVAL 'v1' u1 + 'v2' u2): a number, which PostgreSQL refuses to add to an interval
    # (42883, whatever the rows), became seconds, and a string was read as such literals are.
    with psycopg.connect(test_db.admin_dsn) as admin:
        if meant is None:
            with pytest.raises(psycopg.errors.UndefinedFunction):
                admin.execute(f"SELECT ({written})::text")
        else:
            assert admin.execute(f"SELECT ({written})::text").fetchone() == (meant,)
    error = refused_uncharged(people_proxy, f"SELECT count(*) FROM people WHERE signed_up > now() - ({written})")
    assert (error.diag.sqlstate, error.diag.message_primary) == (
        "0A000", f"the interval literal {named}, which dpproxy's DP planner reads otherwise than PostgreSQL, "
        "is not supported on protected table people (rule: interval-form)"), error.diag.message_primary


def test_an_interval_literal_with_a_unicode_escape_character_is_refused_before_any_charge(
        people_proxy: RunningProxy, test_db: TestDatabase) -> None:
    # sqlglot keeps U&'...' UESCAPE '!''s escapes as written: interval U&'1 day !0061go' UESCAPE '!',
    # one day back to PostgreSQL ('1 day ago'), ran as interval '1 day !0061go', no interval at all.
    written = "interval U&'1 day !0061go' UESCAPE '!'"
    with psycopg.connect(test_db.admin_dsn) as admin:
        assert admin.execute(f"SELECT ({written})::text").fetchone() == ("-1 days",)
    error = refused_uncharged(people_proxy, f"SELECT count(*) FROM people WHERE signed_up > now() - {written}")
    assert (error.diag.sqlstate, error.diag.message_primary) == (
        "0A000", f"the interval literal {written}, which dpproxy's DP planner reads otherwise than PostgreSQL, "
        "is not supported on protected table people (rule: interval-form)"), error.diag.message_primary


@pytest.mark.parametrize(("sql", "literal"), [
    ("SELECT count(*) FROM people WHERE signed_up > now() - interval /* c */ '1 day ago'", "interval /* c */ '1 day ago'"),
    ("SELECT count(*) FROM people WHERE signed_up > now() - interval '1.5' -- c\nhour", "interval '1.5' -- c\nhour"),
])
def test_a_comment_does_not_hide_an_interval_literal_sqlglot_reads_otherwise(people_proxy: RunningProxy, sql: str,
                                                                          literal: str) -> None:
    # The scanner returns comments as tokens: one between INTERVAL and its string, or between the
    # string and its field, hid the literal from the check, and it was answered as sqlglot read it.
    error = refused_uncharged(people_proxy, sql)
    assert (error.diag.sqlstate, error.diag.message_primary) == (
        "0A000", f"the interval literal {literal}, which dpproxy's DP planner reads otherwise than PostgreSQL, "
        "is not supported on protected table people (rule: interval-form)"), error.diag.message_primary


@pytest.mark.parametrize("interval", [
    "interval '1 day'", "interval '-3 years'", "interval '90' minute", "interval '+5' day", "interval '1 year 2 months'",
    "interval '1 2:03' day to minute", "interval '1-2' year to month", "interval 'P1Y2M'", "interval '1:30'",
    "interval '1.5'", "CAST('1:30' AS interval hour)", "'1 day ago'::interval", "interval /* c */ '1 day'",
    "interval '2' /* c */ hour /* d */ to minute", "(interval '1 day' + '1 hour')", "(interval '1 day' + '30')",
    "(interval '1 day' - 5 * interval '1 second')",
])
def test_an_interval_literal_read_alike_is_answered(people_proxy: RunningProxy, interval: str) -> None:
    # sqlglot keeps these as PostgreSQL reads them: verbatim, or one number and unit rewritten alike.
    with people_proxy.connect(autocommit=True) as conn:
        assert conn.execute(f"SELECT count(*) FROM people WHERE signed_up > now() - {interval}").fetchone() is not None
