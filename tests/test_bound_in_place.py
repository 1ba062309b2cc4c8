"""Every read of a bounded column in the backend SQL is its bound, written in place (rewriter/text_bounds.py).

A DP statement reads a text value (and an unconstrained numeric, a value of a declared size that may be
stored apart) only through its bound: ``CASE WHEN <its header says it is short and in the row> THEN col
END``, so that a long value, or one stored apart, reads as NULL without being read. The bound is written
where each construct reads the column (:func:`rewriter.text_bounds.read_in_place`), not through a
projection the planner pulls up. Here the backend SQL of every statement shape that reads such a column
(conditions, FILTERs, GROUP BY keys, aggregates, MODE, COUNT(DISTINCT), percentiles, sample and
aggregate's rows and partition key, raw conjuncts), and of the suite's corpora (tests/differential_corpus.py),
is parsed with PostgreSQL's own parser (pglast), and each column reference that a SELECT reading the
table evaluates must sit inside that column's bound, or be one of the raw reads
:mod:`rewriter.raw_equality` proves give the bounded answer; every backend SQL of the shapes runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg.pq import ExecStatus
import pytest
from pglast import ast, parse_sql
from pglast.enums import A_Expr_Kind, BoolExprType
from pglast.stream import RawStream
from sqlglot.errors import SqlglotError

from policies.errors import Refusal
from policies.tables import Relation, TableRegistry
from rewriter.classify import DPQuery, ResolvedRelation, classify
from rewriter.dp_query import AggregateQuery
from rewriter.rewrite import backend_sql
from rewriter.statements import split_statements
from rewriter.text_bounds import bounded_value, declared_apart, raw_alias
from tests.bi_data import PEOPLE_TABLE, create_people
from tests.conftest import TEST_POLICY, TestDatabase, make_policy, policy_registry
from tests.differential_corpus import RELEASE_STATEMENTS, adult_statements, recorded_statements

_DDL = "(id int PRIMARY KEY, t text, cat text, v varchar(10), n numeric, x int, hours int)"
_KEYLESS_DDL = "(id int, t text, cat text, v varchar(10), n numeric, x int, hours int)"
_ROWS = ("SELECT g, 'row ' || g, (ARRAY['a', 'b', 'c'])[1 + g % 3], 'v' || g % 5, g % 7, g % 100, g % 60 "
         "FROM generate_series(1, 200) g")
_COLUMNS = """
    columns:
      x: {{bounds: [0, 100], group_by: true}}
      hours: {{bounds: [0, 99], avg: sample_aggregate}}
      n: {{bounds: [0, 10]}}
      cat: {{categories: [a, b, c], group_by: true}}
"""
# The table read every way: by default, with a quantum (raw comparisons), with ctid partitions, and
# hashed by every column (no primary key: text in the row_hash key).
_TABLES = {
    "bip": "",
    "bip_q": "    answer_quantum_ms: 5\n",
    "bip_c": "    partitioning: ctid_hash\n",
    "bip_h": "    partitioning: row_hash\n",
}
_POLICY = TEST_POLICY + PEOPLE_TABLE + "".join(
    f"  public.{name}:\n    access: protected\n    epsilon: 1.0\n    delta: 1.0e-6\n    partitions: 8\n{extra}{_COLUMNS}"
    for name, extra in _TABLES.items())
# The adult table on a quantum, whose equalities on sex are compared raw beside the bound.
_QUANTUM_ADULT = _POLICY.replace("  public.adult:\n    access: protected\n",
                                 "  public.adult:\n    access: protected\n    answer_quantum_ms: 1\n")

# Every construct that reads a column, on text (t, cat), a varchar of a declared size (v) and an
# unconstrained numeric (n).
SHAPES = (
    "SELECT count(*) FROM {t} WHERE t = 'a'",
    "SELECT count(*) FROM {t} WHERE t = 'a' OR t = 'b' OR x > 3",
    "SELECT count(*) FROM {t} WHERE t IN ('a', 'b') AND x > 3",
    "SELECT count(*) FROM {t} WHERE t LIKE 'row 1%'",
    "SELECT count(*) FROM {t} WHERE t ILIKE '%OW 1'",
    "SELECT count(*) FROM {t} WHERE lower(t) = 'row 1' OR upper(t) = 'ROW 2'",
    "SELECT count(*) FROM {t} WHERE t IS NULL OR t IS NOT NULL",
    "SELECT count(*) FROM {t} WHERE t BETWEEN 'a' AND 'm'",
    "SELECT count(*) FROM {t} WHERE NOT (t = 'a') AND t <> 'b'",
    "SELECT count(*) FROM {t} WHERE t NOT IN ('a', 'b')",
    "SELECT count(*) FROM {t} WHERE t = $1",
    "SELECT count(*) FROM {t} WHERE t LIKE $1",
    "SELECT count(*) FROM {t} WHERE v = 'v1'",
    "SELECT count(*) FROM {t} WHERE v IN ('v1', 'v2') AND t = 'row 3'",
    "SELECT count(*) FROM {t} WHERE v = $1",
    "SELECT count(*) FROM {t} WHERE v IN ($1, $2, $3)",
    "SELECT count(*) FROM {t} WHERE n = 5 OR n > 3",
    "SELECT count(*) FROM {t} WHERE n BETWEEN 1 AND 4",
    "SELECT count(*) FROM {t} WHERE cat = 'a'",
    "SELECT count(t), count(cat), count(v), count(n) FROM {t}",
    "SELECT count(DISTINCT t) FROM {t}",
    "SELECT count(DISTINCT cat), count(DISTINCT v) FROM {t} WHERE t = 'row 1'",
    "SELECT sum(x) FILTER (WHERE t = 'a'), count(*) FILTER (WHERE t LIKE 'a%') FROM {t}",
    "SELECT sum(n), avg(n) FROM {t} WHERE t <> 'a'",
    "SELECT sum(x) FILTER (WHERE v = 'v1' OR n = 2) FROM {t}",
    "SELECT cat, count(*) FROM {t} GROUP BY cat",
    "SELECT cat, count(*), sum(x) FROM {t} WHERE t = 'row 1' GROUP BY cat",
    "SELECT cat, count(DISTINCT t) FROM {t} GROUP BY cat",
    "SELECT x, count(*) FROM {t} WHERE t LIKE 'row%' GROUP BY x",
    "SELECT cat, x, count(*) FILTER (WHERE t = 'b') FROM {t} GROUP BY cat, x",
    "SELECT mode() WITHIN GROUP (ORDER BY cat) FROM {t}",
    "SELECT mode() WITHIN GROUP (ORDER BY cat) FROM {t} WHERE t = 'a'",
    "SELECT min(x), max(x) FROM {t}",
    "SELECT min(x) FILTER (WHERE t = 'a'), max(x) FROM {t} WHERE cat = 'b'",
    "SELECT avg(hours) FROM {t} WHERE t LIKE 'row 1%'",
    "SELECT avg(hours) FILTER (WHERE v = 'v1') FROM {t}",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x) FROM {t} WHERE t = 'a'",
    "SELECT cat, percentile_disc(0.5) WITHIN GROUP (ORDER BY x) FROM {t} WHERE t <> 'a' GROUP BY cat",
    "SELECT variance(x) FROM {t} WHERE t = 'a'",
)
_SHAPES_PLANNED = 30  # at least so many shapes are answered on each table (the rest refused there)


@pytest.fixture(scope="module")
def registries(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> dict[str, TableRegistry]:
    """The registry dpproxy builds for the shapes' tables, people and adult; and one with adult on a quantum."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for name in _TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {name}")
            conn.execute(f"CREATE TABLE {name} {_KEYLESS_DDL if name == 'bip_h' else _DDL}")
            conn.execute(f"INSERT INTO {name} {_ROWS}")
            conn.execute(f"GRANT SELECT ON {name} TO dpproxy_service")
    create_people(test_db)
    ledger: Path = tmp_path_factory.mktemp("bip-ledger") / "ledger.sqlite3"
    return {"default": policy_registry(make_policy(test_db, ledger, _POLICY)),
            "quantum": policy_registry(make_policy(test_db, ledger, _QUANTUM_ADULT))}


def planned(sql: str, registry: TableRegistry) -> AggregateQuery | None:
    """dpproxy's plan of ``sql``, a DP statement; None where it refuses it or plans no DP query."""
    by_name = {relation.name: relation for relation in registry.by_oid.values()}
    try:
        (statement,) = split_statements(sql)
        resolved = {ref: (ResolvedRelation(by_name[ref.name].oid, "public", ref.name) if ref.name in by_name else None)
                    for ref in statement.references.relations}
        decision = classify(statement, resolved, registry)
    except (Refusal, SqlglotError, RecursionError, ValueError):
        return None
    inner = getattr(decision, "inner", decision)
    return inner.plan if isinstance(inner, DPQuery) else None


def _children(node: ast.Node) -> Iterator[ast.Node]:
    for slot in type(node).__slots__:
        value = getattr(node, slot, None)
        if isinstance(value, ast.Node):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (item for item in value if isinstance(item, ast.Node))


def _column_name(node: ast.Node) -> str | None:
    if isinstance(node, ast.ColumnRef) and len(node.fields) == 1 and isinstance(node.fields[0], ast.String):
        return str(node.fields[0].sval)
    return None


class _Reads:
    """The column references of one backend SQL that read a bounded column past its bound."""

    def __init__(self, table: Relation) -> None:
        self.table = table
        self.bounds: dict[str, str] = {}
        for name, column in table.columns.items():
            bounded = bounded_value(column, table.policy)
            if bounded != f'"{name}"':
                (raw,) = parse_sql(f"SELECT {bounded}")
                self.bounds[name] = RawStream()(raw.stmt.targetList[0].val)
        self.findings: list[str] = []

    def _bound_of(self, node: ast.Node) -> str | None:
        """The column whose bound ``node`` is, exactly as rewriter/text_bounds.py writes it, or None."""
        if not isinstance(node, ast.CaseExpr) or len(node.args) != 1:
            return None
        name = _column_name(node.args[0].result)
        return name if name in self.bounds and RawStream()(node) == self.bounds[name] else None

    def _raw_twin(self, raw: ast.Node, twin: ast.Node) -> bool:
        """``c op v`` beside ``<c's bound> op v`` in one AND: a raw comparison and its bounded twin, on a
        table with a quantum (rewriter.raw_equality.raw_comparison; PostgreSQL's parser flattens the
        ANDs around them, so they are told by being neighbours)."""
        if not (isinstance(raw, ast.A_Expr) and isinstance(twin, ast.A_Expr) and self.table.policy.answer_quantum_ms):
            return False
        name = _column_name(raw.lexpr)
        return (name in self.bounds and self._bound_of(twin.lexpr) == name
                and RawStream()(raw.rexpr) == RawStream()(twin.rexpr) and raw.name == twin.name)

    def conjunction(self, terms: list[ast.Node], where: str) -> None:
        """The terms of one AND, each raw comparison beside its twin let be."""
        raw = {i for i in range(len(terms) - 1) if self._raw_twin(terms[i], terms[i + 1])}
        for i, term in enumerate(terms):
            if i not in raw:
                self.expression(term, where)

    def _raw_conjunct(self, node: ast.Node) -> bool:
        """``c = ANY (ARRAY[…])``, ``c = $k`` or ``$k = c`` on a column of a declared size: a WHERE's top-level
        raw conjunct (rewriter.raw_equality.hashed_raw_equality and the parameters' forms)."""
        if not isinstance(node, ast.A_Expr) or node.kind not in (A_Expr_Kind.AEXPR_OP, A_Expr_Kind.AEXPR_OP_ANY):
            return False
        for side, other in ((node.lexpr, node.rexpr), (node.rexpr, node.lexpr)):
            name = _column_name(side)
            if name in self.bounds and declared_apart(self.table.columns[name], self.table.policy):
                return not any(_column_name(part) is not None for part in _walk(other))
        return False

    def _raw_output(self, target: ast.ResTarget) -> bool:
        """``c AS "raw N"``: a subquery's output of a raw value, for the raw comparisons above it, on a table
        with a quantum or of a column of a declared size (rewriter.text_bounds.bounded_outputs)."""
        name = _column_name(target.val)
        if name not in self.bounds or target.name != raw_alias(self.table, self.table.columns[name]):
            return False
        return bool(self.table.policy.answer_quantum_ms) or declared_apart(self.table.columns[name], self.table.policy)

    def expression(self, node: ast.Node, where: str) -> None:
        if self._bound_of(node) is not None:
            return
        if isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.AND_EXPR:
            self.conjunction(list(node.args), where)
            return
        name = _column_name(node)
        if name in self.bounds:
            self.findings.append(f"{name} read raw in {where}")
        for child in _children(node):
            self.expression(child, where)

    def select(self, stmt: ast.Node) -> None:
        for part in (stmt.larg, stmt.rarg):
            if part is not None:
                self.select(part)
        reads_table = False
        for item in stmt.fromClause or ():
            if isinstance(item, ast.RangeSubselect):
                self.select(item.subquery)
            elif isinstance(item, ast.RangeVar):
                assert item.relname == self.table.name, RawStream()(stmt)
                reads_table = True
        if not reads_table:
            return
        conjuncts = _conjuncts(stmt.whereClause) if stmt.whereClause is not None else []
        self.conjunction([conjunct for conjunct in conjuncts if not self._raw_conjunct(conjunct)], "WHERE")
        outputs = [target for target in stmt.targetList or () if not self._raw_output(target)]
        for where, nodes in (("the outputs", outputs), ("GROUP BY", stmt.groupClause),
                             ("HAVING", [stmt.havingClause]), ("ORDER BY", stmt.sortClause)):
            for node in nodes or ():
                if node is not None:
                    self.expression(node, where)


def _walk(node: ast.Node) -> Iterator[ast.Node]:
    yield node
    for child in _children(node):
        yield from _walk(child)


def _conjuncts(node: ast.Node) -> list[ast.Node]:
    if isinstance(node, ast.BoolExpr) and node.boolop == BoolExprType.AND_EXPR:
        return [conjunct for arg in node.args for conjunct in _conjuncts(arg)]
    return [node]


def unbounded_reads(sql: str, table: Relation) -> list[str]:
    """Where ``sql`` (a backend SQL over ``table``) reads a bounded column other than through its bound."""
    reads = _Reads(table)
    (raw,) = parse_sql(sql)
    reads.select(raw.stmt)
    return reads.findings


def _backends(plan: AggregateQuery) -> list[str]:
    sqls = [backend_sql(plan, seed=0), backend_sql(plan, seed=(1 << 62) + 12345)]
    if plan.series is not None:
        sqls.append(backend_sql(plan.series.ranking, seed=0))
    return sqls


@pytest.mark.parametrize("name", list(_TABLES))
def test_every_construct_reads_a_bounded_column_through_its_bound_written_in_place(
        name: str, registries: dict[str, TableRegistry], test_db: TestDatabase) -> None:
    """Each statement shape's backend SQL: every reference a SELECT reading the table evaluates is inside its
    column's bound (or a proven raw read), and the SQL runs (its parameters bound to text)."""
    registry = registries["default"]
    answered = 0
    with psycopg.connect(test_db.service_dsn, autocommit=True) as conn:
        for shape in SHAPES:
            plan = planned(shape.format(t=name), registry)
            if plan is None:
                continue
            answered += 1
            for sql in _backends(plan):
                assert unbounded_reads(sql, plan.table) == [], (shape, sql)
                parameters = 3 if "$3" in sql else 1 if "$1" in sql else 0
                result = conn.pgconn.exec_params(sql.encode(), [b"v1"] * parameters)
                assert result.status == ExecStatus.TUPLES_OK, (shape, sql, result.error_message)
    assert answered >= _SHAPES_PLANNED, answered


@pytest.mark.parametrize("policy", ["default", "quantum"])
def test_the_corpora_read_each_bounded_column_through_its_bound(policy: str, registries: dict[str, TableRegistry]) -> None:
    """The suite's recorded, attack and release statements on adult and people: the same, without running them."""
    registry = registries[policy]
    checked = 0
    for sql in dict.fromkeys([*recorded_statements(), *adult_statements(), *RELEASE_STATEMENTS]):
        plan = planned(sql, registry)
        if plan is None:
            continue
        for backend in _backends(plan):
            checked += 1
            assert unbounded_reads(backend, plan.table) == [], (sql, backend)
    assert checked > 200, checked


def test_the_check_finds_a_column_read_raw(registries: dict[str, TableRegistry]) -> None:
    """The check itself: a column read beside its bound, or in a bound of another column's form, is found."""
    plan = planned("SELECT count(*) FROM bip WHERE t = 'a'", registries["default"])
    assert plan is not None
    sql = backend_sql(plan, seed=0)
    assert unbounded_reads(sql, plan.table) == []
    assert unbounded_reads(sql.replace(" WHERE ", ' WHERE "t" IS NOT NULL AND ', 1), plan.table) == ["t read raw in WHERE"]
    assert unbounded_reads(sql.replace("CAST(257 AS integer)", "CAST(258 AS integer)"), plan.table) == ["t read raw in WHERE"] * 3


def test_a_column_read_once_is_bounded_in_place_and_one_read_more_through_a_projection(
        registries: dict[str, TableRegistry]) -> None:
    """In place the planner has no subquery to pull up (-0.04 M instructions a run and a lock step); a
    bound written twice is parsed and analysed twice, which costs more than the pull-up (an IN list of 50
    texts +2.0 M: benchmarks/profile.md), so there the table is read through a projection, its bound once."""
    once = planned("SELECT count(*) FROM bip WHERE t = 'a' AND x > 3", registries["default"])
    more = planned("SELECT count(*) FROM bip WHERE t IN ('a', 'b') AND x > 3", registries["default"])
    assert once is not None and more is not None
    bound = bounded_value(once.table.columns["t"], once.table.policy)
    in_place, projected = backend_sql(once, seed=0), backend_sql(more, seed=0)
    assert in_place.startswith('SELECT pg_catalog.count(*) FROM "public"."bip" WHERE') and in_place.count(bound) == 1, in_place
    assert f'FROM (SELECT {bound} AS "t", "x" AS "x" FROM "public"."bip") AS "bip" WHERE' in projected, projected
    assert projected.count(bound) == 1, projected
