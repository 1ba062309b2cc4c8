"""The parse differential: in every DP statement dpproxy accepts, PostgreSQL reads the same columns
and conditions in the statement as in the backend SQL dpproxy runs for it (tests/parse_differential.py).

The statements are the suite's corpora and a bounded number of lexical variants of them
(tests/differential_corpus.py). Each is classified and planned as dpproxy does, against the
registry dpproxy builds from a real PostgreSQL; a statement dpproxy refuses is not read further.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg
import pytest
from sqlglot.errors import SqlglotError

from policies.errors import Refusal
from policies.tables import ColumnInfo, TableRegistry
from rewriter import classify as classify_module
from rewriter.classify import CopyOut, DPQuery, ResolvedRelation, classify
from rewriter.dp_query import Aggregate, AggregateQuery
from rewriter.predicates import PredicateRenderer
from rewriter.rewrite import backend_sql
from rewriter.statements import split_statements
from rewriter.types import BOOL
from rewriter.text_bounds import read_through
from tests.bi_data import PEOPLE_POLICY, PEOPLE_TABLE, create_people
from tests.conftest import TEST_POLICY, RunningProxy, TestDatabase, make_policy, policy_registry, refused_uncharged, running_proxy
from tests.constant_values import ConstantEvaluator
from tests.labelled_data import LABELLED_TABLE, create_labelled
from tests.differential_corpus import CONSTANT_STATEMENTS, RELEASE_STATEMENTS, adult_statements, recorded_statements, variants
from tests.neighbour_cases import TABLE_DDL, domain_ddl, generate_case, policy_columns
from tests.parse_differential import divergences
from tests.series_differential import pair_divergences, series_parts
from tests.release_differential import Labelled, Released, label_divergences, mode_divergences, plain_divergences, \
    release_divergences

SEED = 122
FUZZ_CASES = 400
VARIANTS_PER_STATEMENT = 6
_TABLE = "pdiff"


@pytest.fixture(scope="module")
def registry(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> TableRegistry:
    """The test policy's tables, ``people`` (its keys opted in to GROUP BY), ``labelled`` and the neighbour
    fuzzer's table, as dpproxy registers them."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for statement in domain_ddl():
            conn.execute(statement)
        conn.execute(f"DROP TABLE IF EXISTS {_TABLE}")
        conn.execute(f"CREATE TABLE {_TABLE} ({TABLE_DDL})")
        conn.execute(f"GRANT SELECT ON {_TABLE} TO dpproxy_service")
    create_people(test_db)
    create_labelled(test_db)
    columns = policy_columns().replace("{", "{{").replace("}", "}}")
    text = TEST_POLICY + PEOPLE_TABLE + LABELLED_TABLE + (f"  public.{_TABLE}: {{{{access: protected, epsilon: 1.0, delta: 1.0e-6, partitions: 3, "
                          f"columns: {columns}}}}}\n")
    ledger: Path = tmp_path_factory.mktemp("pdiff-ledger") / "ledger.sqlite3"
    return policy_registry(make_policy(test_db, ledger, text))


@dataclass(frozen=True)
class Planned:
    """What dpproxy runs for a DP statement: its backend SQL, the protected table's name, columns and
    boolean ones, the outer statement over the release (None where it post-processes nothing), the
    aggregates it releases, the labels each category key's cells are released as (None for another
    kind of key), each MODE's, whether it is answered as released and whether its LIMIT/OFFSET leave
    no row; and of a series limit, the ranking's plan and the key pairs its cells are kept by."""

    backends: list[str]
    table: str
    columns: frozenset[str]
    booleans: frozenset[str]
    post: str | None
    released: tuple[Released, ...]
    labels: tuple[Labelled | None, ...]
    modes: tuple[Labelled, ...]  # each MODE's column and the categories it may answer, in release order
    plain: bool  # answered without post-processing: each output an aggregate, released in order
    no_rows: bool = False
    ranking: Planned | None = None
    pairs: tuple[tuple[int, int], ...] = ()


def backend_of(sql: str, registry: TableRegistry) -> Planned | None:
    """What dpproxy runs for ``sql``; None where dpproxy refuses ``sql`` or does not plan it."""
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
    return _planned(decision.plan)


def _planned(plan: AggregateQuery) -> Planned:
    """What dpproxy runs for ``plan`` (:class:`Planned`)."""
    columns = plan.table.columns
    return Planned([backend_sql(plan, seed=0)], plan.table.name, frozenset(columns),
                   frozenset(name for name, column in columns.items() if BOOL in (column.type_oid, column.base_type_oid)),
                   plan.post.sql if plan.post is not None else None,
                   tuple(Released(aggregate.kind, aggregate.column.name if aggregate.column else None, _read(aggregate.filter_sql, plan),
                                  _fraction(aggregate), aggregate.distinct) for aggregate in plan.aggregates),
                   tuple(_labelled(key.column) if key.kind == "category" else None for key in plan.groups),
                   tuple(_labelled(aggregate.column, modal=True) for aggregate in plan.aggregates
                         if aggregate.kind == "mode" and aggregate.column is not None),
                   plan.post is None and not plan.groups, plan.limit_zero,
                   _planned(plan.series.ranking) if plan.series is not None else None,
                   plan.series.pairs if plan.series is not None else ())


def _read(condition: str | None, plan: AggregateQuery) -> str | None:
    """A FILTER with each column read by its name (rewriter.text_bounds.read_through)."""
    return None if condition is None else read_through(condition, plan.table)


def _labelled(column: ColumnInfo, modal: bool = False) -> Labelled:
    """What dpproxy releases for ``column``'s categories: a key's cells (``other`` last), a MODE's
    answer (the categories only)."""
    assert column.policy is not None and column.policy.categories is not None
    labels = column.labels()
    return Labelled(column.name, column.type_name, labels[:len(column.policy.categories)] if modal else labels)


def _fraction(aggregate: Aggregate) -> str | None:
    """A percentile's fraction as tests/release_differential.py reads the statement's: ``1/4``,
    ``1/4,1/2`` (an array), ``$1`` or ``1-$1`` (a parameter, under DESC); None for another aggregate."""
    if aggregate.fraction_parameter is not None:
        return f"{'1-' if aggregate.fraction_parameter.desc else ''}${aggregate.fraction_parameter.number}"
    if aggregate.fractions:
        return ",".join(str(fraction) for fraction in aggregate.fractions)
    return str(aggregate.fraction) if aggregate.fraction is not None else None


def _corpus() -> Iterator[str]:
    rng = random.Random(SEED)
    for _ in range(FUZZ_CASES):
        yield generate_case(rng).sql.replace("{table}", _TABLE)
    yield from adult_statements()
    yield from CONSTANT_STATEMENTS
    yield from RELEASE_STATEMENTS
    yield from recorded_statements()


@pytest.fixture(scope="module")
def same(test_db: TestDatabase) -> Iterator[ConstantEvaluator]:
    """Constant expressions evaluated on the test database (tests/constant_values.py)."""
    evaluator = ConstantEvaluator(test_db.admin_dsn)
    yield evaluator
    evaluator.close()


def _diverging(registry: TableRegistry, statements: Iterator[str], same: ConstantEvaluator | None = None,
               reached: Counter[str] | None = None) -> tuple[int, list[str]]:
    """How many of ``statements`` dpproxy answers, and each divergence of those; ``reached`` counts
    the statements each comparison reads."""
    answered, found = 0, []
    reached = Counter() if reached is None else reached
    for sql in statements:
        planned = backend_of(sql, registry)
        if planned is None:
            continue
        answered += 1
        if planned.ranking is None:
            found += _part_divergences(sql, planned, same, reached)
            continue
        reached["series limit"] += 1
        parts = series_parts(sql)
        if parts is None:
            found.append(f"{sql!r}: a series limit whose parts are not read")
            continue
        found += _part_divergences(parts.ranking, planned.ranking, same, reached)
        found += _part_divergences(parts.restricted, planned, same, reached)
        found += [f"{sql!r}: {divergence}" for divergence in pair_divergences(parts, planned.pairs)]
    return answered, found


def _part_divergences(sql: str, planned: Planned, same: ConstantEvaluator | None, reached: Counter[str]) -> list[str]:
    """Each divergence of ``sql`` (a statement, or one part of a series limit) from ``planned``."""
    printed = same.printed if same is not None else None
    found = [f"{sql!r}: {divergence}\n  backend: {planned.backends}"
             for divergence in divergences(sql, planned.backends, planned.columns, planned.booleans, same)]
    found += [f"{sql!r}: {divergence}\n  backend: {planned.backends[-1]}"
              for divergence in label_divergences(planned.backends[-1], planned.labels, printed)
              + mode_divergences(planned.backends[-1], planned.modes, printed)]
    reached["category labels"] += any(planned.labels)
    reached["MODE labels"] += bool(planned.modes)
    if planned.post is not None:
        found += [f"{sql!r}: {divergence}\n  backend: {planned.backends[-1]}\n  post: {planned.post}"
                  for divergence in release_divergences(sql, planned.backends[-1], planned.post, planned.released,
                                                        planned.table, planned.columns, planned.booleans, same, reached)]
    elif planned.plain:
        reached["answered as released"] += 1
        found += [f"{sql!r}: {divergence}\n  released: {planned.released}"
                  for divergence in plain_divergences(sql, planned.released, planned.table, planned.booleans, same,
                                                      planned.no_rows)]
    else:
        reached["not compared after the release"] += 1
    return found


def _reaches_every_comparison(reached: Counter[str], least: int) -> None:
    """Each comparison read at least ``least`` statements (a tenth of that for the rarer shapes), and
    none was skipped: a corpus or planner change that starves one is a failure, not a silent pass."""
    floors = {"release level": least, "answered as released": least, "category labels": least // 4,
              "enclosing level": least // 10, "MODE labels": least // 10, "DISTINCT": least // 25,
              "series limit": least // 25}
    assert all(reached[name] >= floor for name, floor in floors.items()), reached
    assert not {name for name in reached if name.startswith("skipped") or name.startswith("not compared")}, reached


def test_every_answered_statement_of_the_corpora_reads_alike_in_its_backend_sql(
        registry: TableRegistry, same: ConstantEvaluator) -> None:
    reached: Counter[str] = Counter()
    answered, found = _diverging(registry, _corpus(), same, reached)
    assert answered >= 250, answered
    assert not found, "\n".join(found[:20])
    _reaches_every_comparison(reached, 200)


def test_every_answered_lexical_variant_reads_alike_in_its_backend_sql(
        registry: TableRegistry, same: ConstantEvaluator) -> None:
    rng = random.Random(SEED)
    reached: Counter[str] = Counter()
    answered, found = _diverging(registry, (variant for sql in _corpus()
                                            for variant in variants(sql, rng, VARIANTS_PER_STATEMENT)), same, reached)
    assert answered >= 300, answered
    assert not found, "\n".join(found[:40])
    _reaches_every_comparison(reached, 800)


@pytest.fixture
def fresh_plans() -> Iterator[None]:
    """The classifier's cache emptied before and after: a plan made while the rewriter is patched
    is not kept for the other tests, nor one made before it served here."""
    classify_module._classify.cache_clear()
    yield
    classify_module._classify.cache_clear()


# What a mutation of the rewriter's WHERE makes of its SQL: negated, under an OR, beside a condition
# of its own. Each keeps the statement's condition as a subexpression of the backend's.
_WHERE_MUTATIONS = {
    "negated": lambda sql: f"NOT ({sql})",
    "under an OR": lambda sql: f"({sql}) OR (\"age\" OPERATOR(pg_catalog.>) 80)",
    "a conjunct added": lambda sql: f"{sql} AND (NOT (\"age\" OPERATOR(pg_catalog.>) 80))",
}


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM adult WHERE age > 30",
    "SELECT sex, count(*) FROM people WHERE age > 30 AND sex <> 'Female' GROUP BY sex",
    "SELECT count(*) FROM (SELECT * FROM adult WHERE sex = 'Male') AS virtual_table WHERE age > 30",
])
@pytest.mark.parametrize("mutation", sorted(_WHERE_MUTATIONS))
def test_a_where_the_rewriter_negates_or_widens_is_a_divergence(
        registry: TableRegistry, monkeypatch: pytest.MonkeyPatch, fresh_plans: None, sql: str, mutation: str) -> None:
    planned = backend_of(sql, registry)
    assert planned is not None
    assert not divergences(sql, planned.backends, planned.columns, planned.booleans)
    classify_module._classify.cache_clear()
    where = PredicateRenderer.where
    monkeypatch.setattr(PredicateRenderer, "where",
                        lambda renderer, predicate, uses: _WHERE_MUTATIONS[mutation](where(renderer, predicate, uses)))
    mutated = backend_of(sql, registry)
    assert mutated is not None and mutated.backends != planned.backends
    reported = divergences(sql, mutated.backends, mutated.columns, mutated.booleans)
    assert any(item.what in ("condition", "backend condition") for item in reported), (mutated.backends, reported)


# What a mutation of the labels dpproxy releases for a column's categories makes of them: as the
# policy declares them (before stop 45: 'Male' of a char(6)), or in another order than the backend counts.
_LABEL_MUTATIONS = {
    "as declared": lambda column: (*column.policy.categories, *((column.policy.other,) if column.policy.other else ())),
    "reordered": lambda column: tuple(reversed(column.printed_labels)),
}


@pytest.mark.parametrize("sql", [
    "SELECT mode() WITHIN GROUP (ORDER BY code) FROM labelled",
    "SELECT count(*), mode() WITHIN GROUP (ORDER BY flag) FILTER (WHERE day = '2024-01-02') FROM labelled",
    "SELECT code, count(*) FROM labelled GROUP BY code",
    "SELECT DISTINCT code FROM labelled",
])
@pytest.mark.parametrize("mutation", sorted(_LABEL_MUTATIONS))
def test_a_category_released_otherwise_than_postgresql_prints_it_is_a_divergence(
        registry: TableRegistry, same: ConstantEvaluator, monkeypatch: pytest.MonkeyPatch, fresh_plans: None,
        sql: str, mutation: str) -> None:
    planned = backend_of(sql, registry)
    assert planned is not None and (planned.modes or any(planned.labels))
    reported = label_divergences(planned.backends[-1], planned.labels, same.printed) \
        + mode_divergences(planned.backends[-1], planned.modes, same.printed)
    assert not reported, reported
    classify_module._classify.cache_clear()
    monkeypatch.setattr(ColumnInfo, "labels", _LABEL_MUTATIONS[mutation])
    mutated = backend_of(sql, registry)
    assert mutated is not None
    reported = label_divergences(mutated.backends[-1], mutated.labels, same.printed) \
        + mode_divergences(mutated.backends[-1], mutated.modes, same.printed)
    assert reported and {item.what for item in reported} <= {"category key", "MODE"}, reported


_SERIES = ("SELECT date_trunc('month', signed_up) AS m, sex, count(*) AS n FROM people JOIN (SELECT sex AS sex__, "
           "count(*) AS c FROM people WHERE age > 30 GROUP BY sex ORDER BY c DESC LIMIT 1) AS series_limit ON sex = sex__ "
           "WHERE income < 50000 GROUP BY 1, sex ORDER BY n DESC LIMIT 100")


def _swapped_wheres(plan: AggregateQuery) -> AggregateQuery:
    assert plan.series is not None
    ranking = replace(plan.series.ranking, where_sql=plan.where_sql)
    return replace(plan, where_sql=plan.series.ranking.where_sql, series=replace(plan.series, ranking=ranking))


def _ranked_otherwise(plan: AggregateQuery) -> AggregateQuery:
    assert plan.series is not None and plan.series.ranking.post is not None
    post = replace(plan.series.ranking.post, sql=plan.series.ranking.post.sql.replace(" DESC LIMIT 1", " LIMIT 1"))
    return replace(plan, series=replace(plan.series, ranking=replace(plan.series.ranking, post=post)))


def _paired_otherwise(plan: AggregateQuery) -> AggregateQuery:
    assert plan.series is not None
    return replace(plan, series=replace(plan.series, pairs=((0, 0),)))


# What a mutation of a series limit's plan makes of it: each level's WHERE answered at the other (one
# set of conjuncts still: the check that pooled them saw none), the ranking's order reversed, the
# cells kept by the month where the join reads sex.
_SERIES_MUTATIONS = {"WHEREs swapped": _swapped_wheres, "ranked otherwise": _ranked_otherwise,
                     "paired otherwise": _paired_otherwise}


@pytest.mark.parametrize("mutation", sorted(_SERIES_MUTATIONS))
def test_a_series_limit_planned_otherwise_at_either_level_is_a_divergence(
        registry: TableRegistry, same: ConstantEvaluator, monkeypatch: pytest.MonkeyPatch, fresh_plans: None,
        mutation: str) -> None:
    assert _diverging(registry, iter([_SERIES]), same) == (1, [])
    classify_module._classify.cache_clear()
    planner = classify_module.plan_series_limited
    monkeypatch.setattr(classify_module, "plan_series_limited",
                        lambda *arguments: _SERIES_MUTATIONS[mutation](planner(*arguments)))
    answered, found = _diverging(registry, iter([_SERIES]), same)
    assert answered == 1 and found, mutation


def _without_distinct(plan: AggregateQuery) -> AggregateQuery:
    assert plan.post is not None
    return replace(plan, post=replace(plan.post, sql=plan.post.sql.replace("SELECT DISTINCT", "SELECT")))


def _with_distinct(plan: AggregateQuery) -> AggregateQuery:
    assert plan.post is not None
    return replace(plan, post=replace(plan.post, sql=plan.post.sql.replace("SELECT", "SELECT DISTINCT", 1)))


def _other_key(plan: AggregateQuery) -> AggregateQuery:
    assert plan.post is not None
    return replace(plan, post=replace(plan.post, sql=plan.post.sql.replace("_k1 AS", "_k2 AS", 1)))


def _no_rows_flipped(plan: AggregateQuery) -> AggregateQuery:
    return replace(plan, limit_zero=not plan.limit_zero)


# A DISTINCT over the release dropped or added, a key released for another, an answer of one row
# left out under LIMIT/OFFSET where PostgreSQL returns it (or the reverse)
@pytest.mark.parametrize(("sql", "mutation"), [
    ("SELECT DISTINCT n FROM (SELECT sex, count(*) AS n FROM people GROUP BY sex) AS q", _without_distinct),
    ("SELECT n FROM (SELECT sex, count(*) AS n FROM people GROUP BY sex) AS q", _with_distinct),
    ("SELECT DISTINCT sex, date_trunc('year', signed_up) AS y FROM people ORDER BY 2, 1", _other_key),
    ("SELECT count(*) FROM adult LIMIT 1 OFFSET 0", _no_rows_flipped),
    ("SELECT count(*) FROM adult OFFSET 1", _no_rows_flipped),
])
def test_a_distinct_key_or_row_count_planned_otherwise_is_a_divergence(
        registry: TableRegistry, same: ConstantEvaluator, monkeypatch: pytest.MonkeyPatch, fresh_plans: None,
        sql: str, mutation: Callable[[AggregateQuery], AggregateQuery]) -> None:
    assert _diverging(registry, iter([sql]), same) == (1, [])
    classify_module._classify.cache_clear()
    planner = classify_module.plan_aggregate_query
    monkeypatch.setattr(classify_module, "plan_aggregate_query", lambda *arguments, **options: mutation(planner(*arguments, **options)))
    answered, found = _diverging(registry, iter([sql]), same)
    assert answered == 1 and found, sql


@pytest.fixture(scope="module")
def people_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over ``people``, whose ``signed_up`` is a timestamp (tests/bi_data.py)."""
    create_people(test_db)
    with running_proxy(test_db, tmp_path_factory, PEOPLE_POLICY) as running:
        yield running


def _refused_as(proxy: RunningProxy, sql: str, expected: tuple[str, str], answered: str) -> None:
    """``sql`` is refused before any charge with ``expected`` (SQLSTATE, message) and the session
    still answers ``answered``, the form the refusal's hint names."""
    error = refused_uncharged(proxy, sql)
    assert (error.diag.sqlstate, error.diag.message_primary) == expected
    with proxy.connect(autocommit=True) as conn:
        assert conn.execute(answered).fetchone() is not None


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM people WHERE signed_up < CURRENT_TIMESTAMP(0)",
    "SELECT count(*) FILTER (WHERE signed_up > CURRENT_TIMESTAMP(3) - interval '3 years') FROM people",
])
def test_current_timestamp_with_a_precision_is_refused_before_any_charge(people_proxy: RunningProxy, sql: str) -> None:
    # sqlglot wrote CURRENT_TIMESTAMP(0) back as CURRENT_TIMESTAMP: the comparison was answered
    # without the rounding PostgreSQL applies, another condition than the analyst's.
    _refused_as(people_proxy, sql, (
        "0A000", "CURRENT_TIMESTAMP(n) is not supported on protected table people (rule: timestamp-precision)"),
        "SELECT count(*) FROM people WHERE signed_up < CURRENT_TIMESTAMP")


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
    _refused_as(people_proxy, sql, (
        "0A000", "interval(p) '...' is not supported on protected table people (rule: interval-precision)"),
        "SELECT count(*) FROM people WHERE signed_up > now() - interval '1 day'")


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM people WHERE signed_up > interval '1 day' + '2023-01-01'::date",
    "SELECT count(*) FROM people WHERE signed_up > now() - (interval '1' day + $$2 hours$$::interval)",
    "SELECT count(*) FILTER (WHERE signed_up < interval '1 day' + '5' * 2) FROM people",
])
def test_an_interval_plus_a_string_is_refused_before_any_charge(people_proxy: RunningProxy, sql: str) -> None:
    # sqlglot read interval '1 day' + '2023-01-01'::date as CAST(interval '1 day' + interval '2023-01-01'
    # AS date), which failed (22007) where PostgreSQL answers, and interval '1 day' + '5' * 2 as
    # interval '1 day' + interval '5' * 2, answered where PostgreSQL fails (42883).
    _refused_as(people_proxy, sql, (
        "0A000", "interval '...' + '...'::type is not supported on protected table people (rule: interval-sum)"),
        "SELECT count(*) FROM people WHERE signed_up > interval '1 day' + date '2023-01-01'")


@pytest.mark.parametrize(("sql", "symbol"), [
    ("SELECT count(*) FROM adult WHERE age !=-1", "!=-"),
    ("SELECT count(*) FROM adult WHERE age > 50 %-7", "%-"),
    ("SELECT count(*) FILTER (WHERE age > 50 %+7) FROM adult", "%+"),
])
def test_an_operator_glued_to_a_sign_is_refused_as_postgresql_reads_it(
        people_proxy: RunningProxy, sql: str, symbol: str) -> None:
    # PostgreSQL's scanner reads !=- and %- as operators of those names, which it does not have (42883);
    # sqlglot read age !=-1 as age != -1 and 50 %-7 as 50 % -7, and both were answered and charged.
    _refused_as(people_proxy, sql, (
        "42883", f"operator does not exist: {symbol} (rule: undefined-operator)"),
        "SELECT count(*) FROM adult WHERE age != -1 AND age > 50 % -7")


@pytest.mark.parametrize(("sql", "where"), [
    ("SELECT EXTRACT(year FROM signed_up) AS y, count(*) FROM people GROUP BY +1", "GROUP BY on protected table people"),
    ("SELECT sex, count(*) FROM people GROUP BY 1 ORDER BY +2 DESC LIMIT 1", "ORDER BY on protected table people"),
    ("SELECT round(avg(age), 1), count(*) FROM adult ORDER BY +1", "ORDER BY on protected table adult"),
])
def test_a_constant_expression_as_a_group_or_order_position_is_refused_before_any_charge(
        people_proxy: RunningProxy, sql: str, where: str) -> None:
    # PostgreSQL reads only a bare number as an output's position: GROUP BY +1 groups by the constant
    # (42803 beside an ungrouped column) and ORDER BY +2 orders by nothing. sqlglot dropped the +:
    # the histogram was answered where PostgreSQL fails, and ORDER BY +2 DESC LIMIT 1 answered with
    # the largest count where PostgreSQL returns any row.
    _refused_as(people_proxy, sql, (
        "0A000", f"a constant expression in {where.replace(' on ', ' is not supported on ')} (rule: constant-position)"),
        "SELECT sex, count(*) FROM people GROUP BY 1 ORDER BY 2 DESC LIMIT 1")


@pytest.mark.parametrize(("condition", "ran", "found"), [
    ("age > 40 + 1", "age > CAST((40 OPERATOR(pg_catalog.+) 1) AS pg_catalog.numeric)", False),
    ("age > 40 + 1", "age > 41", False),
    ("age > 40 + 1", "age > CAST((40 OPERATOR(pg_catalog.+) 2) AS pg_catalog.numeric)", True),
    ("age > 7 / 2", "age > CAST((7.0 / 2) AS pg_catalog.numeric)", True),
    ("age > CAST('1e3' AS int)", "age > CAST(1e3 AS pg_catalog.int4)", True),
    ("signed_up > date '01/02/2024' + 0", "signed_up > CAST('2024-01-02' AS pg_catalog.date) + 0", True),
    ("signed_up > now() - interval '1 day'", "signed_up > CAST((CURRENT_TIMESTAMP - CAST('1 DAY' AS interval)) "
                                             "AS pg_catalog.timestamp)", False),
    ("signed_up > timestamptz '2024-03-10 12:00' - interval '1 day'",
     "signed_up > CAST((CAST('2024-03-10 12:00' AS timestamptz) - CAST('24 hours' AS interval)) AS pg_catalog.timestamp)",
     True),
])
def test_a_constant_is_compared_by_its_value_on_the_backend_under_each_session_profile(
        same: ConstantEvaluator, condition: str, ran: str, found: bool) -> None:
    # 7 / 2 is 3 (integer division), 7.0 / 2 is 3.5; '1e3' is no integer (22P02), 1e3 is 1000;
    # '01/02/2024' is 2 January under DateStyle MDY and 1 February under DMY; a day is not 24 hours
    # across a change of daylight saving time in America/St_Johns (2:00 on 10 March 2024).
    columns = frozenset({"age", "signed_up"})
    reported = divergences(f"SELECT count(*) FROM t WHERE {condition}", [f"SELECT count(*) FROM t WHERE {ran}"],
                           columns, same=same)
    assert bool(reported) == found, reported


@pytest.mark.parametrize("sql", [
    "SELECT count(*) FROM people WHERE signed_up > timestamptz '2024-06-01 00:00:00+05:30'::text",
    "SELECT count(*) FROM adult WHERE age > numeric '40.5'::int",
    "SELECT count(*) FILTER (WHERE age > float8 '40.7'::int) FROM adult",
])
def test_a_typed_literal_cast_again_is_refused_before_any_charge(people_proxy: RunningProxy, sql: str) -> None:
    # PostgreSQL reads numeric '40.5'::int as (numeric '40.5')::int, 41; sqlglot as
    # CAST(CAST('40.5' AS int) AS numeric), which failed (22P02) where PostgreSQL answers, and
    # timestamptz '...'::text as a timestamptz, answered where PostgreSQL fails (42883).
    error = refused_uncharged(people_proxy, sql)
    assert (error.diag.sqlstate, error.diag.message_primary.split(" is not supported")[1]) == (
        "0A000", f" on protected table {'people' if 'people' in sql else 'adult'} (rule: typed-literal-cast)")
    with people_proxy.connect(autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM adult WHERE age > (numeric '40.5')::int").fetchone() is not None


# (the literal as written, what sqlglot wrote for it, each as PostgreSQL reads it)
_MISREAD_INTERVALS = [
    ("interval '1 day ago'", "interval '1 DAY'", "-1 days", "1 day"),
    ("interval '1 day 1:30'", "interval '1 DAY'", "1 day 01:30:00", "1 day"),
    ("interval '.5 day'", "interval '5 DAY'", "12:00:00", "5 days"),
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


@pytest.mark.parametrize(("sql", "name"), [
    ("SELECT sex, count(*) AS age FROM people GROUP BY sex ORDER BY age + 0", "age"),
    ("SELECT sex AS age, count(*) FROM people GROUP BY sex ORDER BY -age", "age"),
    ("SELECT sex, count(*) AS n FROM people GROUP BY sex ORDER BY n + 0", "n"),
])
def test_a_name_in_an_order_by_expression_is_an_input_column_as_postgresql_reads_it(
        people_proxy: RunningProxy, test_db: TestDatabase, sql: str, name: str) -> None:
    # Within an ORDER BY expression PostgreSQL reads a name as an input column, even where an output
    # has it: age + 0 is the ungrouped column age (42803), n + 0 no column at all (42703). dpproxy left
    # any output's name there to its outer statement over the release, where no input column has it:
    # 42703 for age too (refused before any charge, with PostgreSQL's code for another mistake).
    with psycopg.connect(test_db.admin_dsn) as admin, pytest.raises(psycopg.Error) as direct:
        admin.execute(sql)
    error = refused_uncharged(people_proxy, sql)
    assert error.diag.sqlstate == direct.value.diag.sqlstate, (error.diag.message_primary, direct.value.diag.message_primary)
    assert error.diag.message_primary.startswith(f'column "{name}"'), error.diag.message_primary
    with people_proxy.connect(autocommit=True) as conn:  # a key's name there is the key, as in PostgreSQL
        assert conn.execute("SELECT age AS a, count(*) AS age FROM people GROUP BY age ORDER BY age + 0").fetchone()


@pytest.mark.parametrize("sql", [
    "SELECT sex AS age, count(*) FROM people GROUP BY sex ORDER BY (age)",
    "SELECT sex AS age, count(*) FROM people GROUP BY sex ORDER BY ((age)) DESC",
    "SELECT sex AS s, count(*) AS n FROM people GROUP BY sex ORDER BY (n) DESC",
    "SELECT sex, count(*) AS age FROM people GROUP BY sex ORDER BY (age)",
])
def test_an_order_by_item_that_is_an_outputs_name_in_parentheses_sorts_by_that_output(
        people_proxy: RunningProxy, test_db: TestDatabase, sql: str) -> None:
    # PostgreSQL keeps no parentheses in its tree: ORDER BY (age) is ORDER BY age, the output's name
    # (the key sex, or the count). dpproxy read (age) as the ungrouped input column: 42803.
    labels = {}
    for reader, dsn in (("PostgreSQL", test_db.admin_dsn), ("dpproxy", people_proxy.dsn())):
        with psycopg.connect(dsn, autocommit=True) as conn:
            labels[reader] = [row[0] for row in conn.execute(sql).fetchall()]
    assert labels["dpproxy"] == labels["PostgreSQL"], labels


@pytest.mark.parametrize("sql", [
    'SELECT U&"e" FROM (SELECT count(*) AS u, sum(age) AS "e" FROM people) AS t',
    'SELECT U&"\\0065" AS x FROM (SELECT count(*) AS u, sum(age) AS "e" FROM people) AS t',
    'SELECT sex, n FROM (SELECT sex, count(*) AS n FROM people GROUP BY sex) AS t WHERE U&"\\006e" > 10',
    'SELECT count(*) FROM people WHERE U&"!0061ge" UESCAPE \'!\' > 30',
])
def test_a_name_with_unicode_escapes_is_refused_before_any_charge(
        people_proxy: RunningProxy, test_db: TestDatabase, sql: str) -> None:
    # sqlglot reads U&"e" as U & "e", the bitwise AND of two columns: with a column of each name it
    # was answered with u & e (count & sum) where PostgreSQL answers e, the sum; the others failed
    # with another error (42703, an operator refused) where PostgreSQL answers.
    with psycopg.connect(test_db.admin_dsn) as admin:
        assert admin.execute(sql).fetchall()
    error = refused_uncharged(people_proxy, sql)
    assert (error.diag.sqlstate, error.diag.message_primary.split(", which")[1]) == (
        "0A000", ' dpproxy\'s DP planner reads as U & "...", is not supported on protected table people (rule: unicode-name)')


@pytest.mark.parametrize("grouped", ["(1)", "((1))", "(s)", "(sex)", "(1), 1"])
def test_a_parenthesised_group_by_item_is_read_as_postgresql_reads_it(people_proxy: RunningProxy, test_db: TestDatabase,
                                                                       grouped: str) -> None:
    # PostgreSQL's grammar keeps no parentheses in its parse tree: GROUP BY (1) is the position 1, as
    # GROUP BY 1 (not a constant, as +1 is), and GROUP BY (s) the output named s. dpproxy refused both
    # (DP001, no-group-by) as expressions that are no declared key.
    sql = f"SELECT sex AS s, count(*) FROM people GROUP BY {grouped}"
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        keys = sorted(str(row[0]) for row in admin.execute(sql).fetchall())
    with people_proxy.connect(autocommit=True) as conn:
        rows = conn.execute(sql).fetchall()
    assert sorted(str(row[0]) for row in rows) == keys == ["Female", "Male"], rows


def _interval_corpus() -> list[str]:
    """ISO 8601 and PostgreSQL-verbose interval strings: one designator of each unit with whole,
    fractional and negative numbers (with and without T), several designators, the alternative
    form, and ``@`` with each spacing, unit and ``ago``."""
    numbers = ["1", "2", "0", "-1", "1.5", "0.5", "-0.25", "10", ".5"]
    corpus = [f"{p}{t}{n}{u}" for p in ("P", "p") for t in ("", "T", "t") for n in numbers for u in "YyMmWwDdHhSs"]
    corpus += ["P1Y2M3DT4H5M6S", "P1Y2M", "P1DT2H", "PT1H30M", "P0001-02-03T04:05:06", "P1DT", "PT", "P"]
    corpus += [f"{at}{n} {u}{ago}" for at in ("@ ", "@", " @  ") for n in ("1", "-2", "1.5")
               for u in ("day", "days", "hour", "m", "mon", "month", "min", "s", "week", "y", "year", "ms")
               for ago in ("", " ago")]
    return corpus


def test_an_iso_or_verbose_interval_is_let_through_only_where_sqlglot_writes_what_postgresql_reads(
        test_db: TestDatabase) -> None:
    # interval 'P1D', 'PT1.5H' and '@ 1 day' were refused (interval-form) though sqlglot writes them as
    # PostgreSQL reads them ('1 DAY', '1.5 HOUR'); 'P2M' (two months, written '2 MINUTE') and '@ 1 day
    # ago' ('1 DAY') are not. Each string of the corpus let through reads, on PostgreSQL, exactly as
    # sqlglot's rendering of it (its fields as text), or fails alike. An ISO 8601 value sqlglot split
    # wrongly ('P2M' as '2 MINUTE', 'P1DT' as '1 DT') is kept as written by dpproxy's reading now, and
    # a unit PostgreSQL abbreviates ('@ 1 m', a minute) is let through where sqlglot writes it in full.
    from rewriter.misreadings import _interval_read_alike
    from rewriter.sqlglot_parse import parse_postgres

    let_through = []
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("SET IntervalStyle = postgres")
        for value in _interval_corpus():
            if not _interval_read_alike(value, None, None):
                continue
            literal = "interval '" + value + "'"
            rendered = parse_postgres(f"SELECT {literal}").expressions[0].sql("postgres")
            read = []
            for sql in (literal, rendered):
                try:
                    read.append(admin.execute(f"SELECT ({sql})::text").fetchone())
                except psycopg.Error as exc:
                    read.append(exc.sqlstate)
            assert read[0] == read[1], (value, rendered, read)
            let_through.append(value)
    assert {"P1D", "PT1.5H", "@ 1 day", "PT2M", "P0.5D", "P1W", "P1Y2M3DT4H5M6S", "P-1D", "@1 mon"} <= set(let_through)
    assert {"P1DT", "P2M", "P1.5M", "@ 1 m", "@1.5 ms", "@ -2 s"} <= set(let_through)
    assert not {"@ 1 day ago", "p1d", "@ 1 m ago"} & set(let_through)


@pytest.mark.parametrize("written", ["interval 'P1D'", "interval 'PT1.5H'", "interval '@ 1 day'", "interval 'P1W'",
                                     "interval 'P1DT'", "interval 'P2M'", "interval '@ 1 m'", "interval '1 m'"])
def test_an_iso_or_verbose_interval_sqlglot_reads_alike_is_answered(people_proxy: RunningProxy, written: str) -> None:
    with people_proxy.connect(autocommit=True) as conn:
        assert conn.execute(f"SELECT count(*) FROM people WHERE signed_up > now() - {written}").fetchone() is not None
