"""The round-trip check: what PostgreSQL reads in a generated condition against what it reads in the
backend SQL dpproxy writes for it, compared by tree and, where the trees differ, by what each
selects on a real PostgreSQL (docs/threat-model.md, "The round-trip check").

dpproxy classifies a statement with pglast and writes its backend SQL from sqlglot's reading of
it; where the two read it differently, the analyst is answered (and charged) for a statement
PostgreSQL does not mean. For each statement of :mod:`tests.expression_generator` that dpproxy
plans, this module takes

* the analyst's condition, as PostgreSQL parses it in the statement, and
* the backend SQL's own: its WHERE and the released aggregate's FILTER, ANDed, as PostgreSQL
  parses :func:`rewriter.rewrite.backend_sql` (the folded constants left inline, as the plan
  describes them; dpproxy folds that same expression in a query of its own, exactly),

and compares their trees (with their literals as PostgreSQL types them, and never an IN list,
which PostgreSQL compares in its values' common type) after the rewriter's named additions are
taken off (:func:`tests.parse_differential.canonical`): ``pg_catalog.`` before a function, operator or type
(*catalog-qualification*), ``OPERATOR(...)`` spelling (*operator-spelling*), the text bound's
``CASE WHEN <size test> THEN col END`` (*text-bound*), AND nesting and parentheses
(*boolean-structure*), BETWEEN and IN as PostgreSQL expands them (*expansion*). A difference left
(a cast the rewriter adds, a folded constant, a raw conjunct, anything sqlglot wrote otherwise) is
evaluated: both conditions choose rows of the round-trip table (a few dozen rows of edge values) on
a real PostgreSQL, under each of :data:`tests.constant_values.PROFILES` (one transaction each, so
``now()`` is one instant for both), and a :class:`Mismatch` is reported when the rows chosen or
the SQLSTATE differ (but *fold-cast*: the rewriter folds a computed value cast to the column's
type, so a value of no type the column compares with, ``d = '20000501' - 7``, fails there with
42846, cannot cast, where PostgreSQL fails with 42883, no operator: both whatever the rows, before
any charge). Of ``SUM``/``AVG`` of an expression, the per-row value PostgreSQL sums is
compared with the plan's column under its FILTER, its clamp (*clamp*, an addition) left off.

A statement dpproxy refuses is fine: it is counted, not compared.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import pq
from pglast import ast, parse_sql
from pglast.parser import ParseError, parse_sql_json
from pglast.stream import RawStream
from sqlglot.errors import SqlglotError

from policies.errors import Refusal
from policies.tables import TableRegistry
from rewriter.classify import DPQuery, ResolvedRelation, classify
from rewriter.dp_query import AggregateQuery
from rewriter.function_check import nodes_of
from rewriter.rewrite import backend_sql
from rewriter.statements import split_statements
from rewriter.text_bounds import read_in_place
from tests.constant_values import PROFILES
from tests.parse_differential import canonical

__all__ = ["ALIKE", "READ", "ROWS", "TABLE_DDL", "TABLE_POLICY", "Checked", "Mismatch", "RoundTrip", "backend_condition", "sqlstate"]

TABLE_DDL = ("id int, i int4, n numeric(10,2), f float8, t text, v varchar(8), c char(3), d date, ts timestamp, "
             "tz timestamptz, iv interval, b bool")
TABLE_POLICY = ("  public.rt: {access: protected, epsilon: 1.0, delta: 1.0e-6, columns: {i: {bounds: [0, 100]}, "
                "n: {bounds: [-1000, 1000]}, f: {bounds: [-1, 1]}, t: {categories: [a, b]}, "
                "d: {bounds: [2000-01-01, 2000-12-31]}, ts: {bounds: [2000-01-01, 2001-01-01]}, "
                "tz: {bounds: [2000-01-01, 2001-01-01]}}}\n")
# Edge values per column; row k takes each column's value k modulo its count (and NULL every 7th row).
_VALUES: dict[str, tuple[str, ...]] = {
    "i": ("0", "5", "100", "-5", "2147483647", "-2147483648", "42", "7", "6", "4"),
    "n": ("4.5", "0", "-0.005", "99999999.99", "'NaN'", "0.5", "-4.5", "12.25", "5", "1000.5", "0.1"),
    "f": ("0.5", "'NaN'", "'Infinity'", "'-Infinity'", "-0.0", "1e-3", "0.25", "1e308", "5e-324", "0.75", "0.1"),
    "t": ("'a'", "'b'", "''", "'A'", "'ab'", "'ab '", "'a%'", "'a_'", "'\\'", "'O''Brien'", "'Ω'", "E'a\\nb'", "'abc'"),
    "v": ("'a'", "'b'", "''", "'ab '", "'A'", "'a%'", "'abcdefgh'"),
    "c": ("'a'", "'ab'", "'ab '", "''", "'abc'", "'A'"),
    "d": ("'2000-05-01'", "'2000-05-02'", "'2000-04-30'", "'infinity'", "'-infinity'", "'2000-01-01'", "'4713-01-01 BC'",
          "'1970-01-01'", "'2000-12-31'", "'2000-05-17'"),
    "ts": ("'2000-05-01 12:00'", "'2000-05-01 11:59:59.999999'", "'2000-05-01 00:00'", "'infinity'", "'-infinity'",
           "'2000-05-01 12:00:00.5'", "'1999-12-31 23:59'", "'2000-05-02'", "'294276-12-31 23:59:59'"),
    "tz": ("'2000-05-01 12:00+00'", "'2000-05-01 10:00+00'", "'2000-05-01 12:00+14'", "'infinity'", "'-infinity'",
           "'2000-05-01 12:00:00.5+00'", "'1999-12-31 23:59-12'", "'2000-04-30 12:00+00'", "'2000-05-01 20:00+00'"),
    "iv": ("'1 day'", "'2 hours'", "'1 day 1 hour'", "'-1 day'", "'1 mon'", "'24 hours'", "'61 years 1 day'",
           "'9 mons'", "'00:00:00.5'", "'1:30'", "'1 year'"),
    "b": ("true", "false"),
}
ROWS = 40
Case = TypeVar("Case")
# (the analyst's outcome, the backend's) that are one outcome read through an addition: *fold-cast*
ALIKE = {(("error", "42883"), ("error", "42846"))}
# The table as a condition reads it: each column also as the raw conjuncts name it (rewriter/raw_equality.py,
# "raw <attnum>": *raw-conjunct*, an addition that compares the stored value beside the bounded one).
READ = "(SELECT rt.*, " + ", ".join(f'{name} AS "raw {attnum}"' for attnum, name in enumerate(
    ["id", *_VALUES], start=1)) + " FROM rt) AS rt"


def rows_sql() -> str:
    """The INSERT of the round-trip table's :data:`ROWS` rows."""
    rows = []
    for k in range(ROWS):
        values = [str(k)] + [("NULL" if k % 7 == 6 and name != "b" or k == ROWS - 1 else pool[k % len(pool)])
                             for name, pool in _VALUES.items()]
        rows.append("(" + ", ".join(values) + ")")
    return "INSERT INTO rt VALUES " + ", ".join(rows)


@dataclass(frozen=True)
class Mismatch:
    """A statement dpproxy answers whose backend SQL chooses other rows (or values, or fails otherwise)."""

    statement: str
    asked: str  # the analyst's condition or argument, as PostgreSQL reads it
    ran: str  # the backend SQL's
    outcomes: tuple[Any, Any]  # (the analyst's, the backend's) under the first profile that differed

    def __str__(self) -> str:
        return f"{self.statement!r}\n  asked: {self.asked}\n  ran:   {self.ran}\n  outcomes: {self.outcomes}"


@dataclass
class Checked:
    """Sizes of a run: statements generated, planned (answered), alike by tree, evaluated, mismatches."""

    generated: int = 0
    planned: int = 0
    same_tree: int = 0
    evaluated: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)


def _where(sql: str) -> Any:
    """The pglast JSON of the condition in ``SELECT 1 WHERE <sql>``."""
    return json.loads(parse_sql_json(f"SELECT 1 WHERE {sql}"))["stmts"][0]["stmt"]["SelectStmt"]["whereClause"]


def _literals(tree: Any) -> list[str]:
    """Every literal of ``tree`` (pglast JSON) as PostgreSQL typed it (an integer, a numeric, a
    string ...), without its place, sorted."""
    return sorted(json.dumps({key: value for key, value in const.items() if key != "location"}, sort_keys=True)
                  for const in nodes_of({"root": tree}, "A_Const"))


def _alike_by_tree(asked: Any, ran: Any) -> bool:
    """Whether the conditions ``asked`` and ``ran`` (pglast JSON) are one tree once the named additions
    are taken off (:func:`tests.parse_differential.canonical`), with the same literals as PostgreSQL
    types them (``canonical`` reads ``10`` and ``1e1`` as one number; ``5 / 10`` is not ``5 / 1e1``).
    An IN list is always evaluated: PostgreSQL compares it in its values' common type, not as the
    ``=`` ORs ``canonical`` reads it as."""
    return (not any(expression.get("kind") == "AEXPR_IN" for expression in nodes_of({"root": asked}, "A_Expr"))
            and _literals(asked) == _literals(ran) and canonical(asked) == canonical(ran))


def backend_condition(sql: str) -> str | None:
    """The backend SQL's outer WHERE and its first aggregate's FILTER, ANDed (None: neither)."""
    select = parse_sql(sql)[0].stmt
    assert isinstance(select, ast.SelectStmt), sql
    parts = [select.whereClause] if select.whereClause is not None else []
    for target in select.targetList or ():
        found = getattr(target.val, "agg_filter", None)
        if found is not None:
            parts.append(found)
            break
    return " AND ".join(f"({RawStream()(part)})" for part in parts) or None


class RoundTrip:
    """Plans statements as dpproxy does against ``registry`` and compares what they read with
    what their backend SQL reads, evaluating differences on the database at ``dsn``."""

    def __init__(self, registry: TableRegistry, dsn: str) -> None:
        self._by_name = {relation.name: relation for relation in registry.by_oid.values()}
        self._registry = registry
        self._connections: list[psycopg.Connection[Any]] = []
        for zone, date_style, interval_style, float_digits in PROFILES:
            conn = psycopg.connect(dsn)
            for setting in ("statement_timeout = 5000", f"TimeZone = '{zone}'", f"DateStyle = '{date_style}'",
                            f"IntervalStyle = '{interval_style}'", f"extra_float_digits = {float_digits}"):
                conn.execute(f"SET {setting}")
            conn.commit()
            self._connections.append(conn)

    def close(self) -> None:
        for conn in self._connections:
            conn.close()

    def plan(self, sql: str) -> DPQuery | None:
        """dpproxy's plan of ``sql``; None where it refuses it (or plans no DP query)."""
        decision = self.decide(sql)
        return decision if isinstance(decision, DPQuery) else None

    def decide(self, sql: str) -> DPQuery | Refusal | None:
        """dpproxy's plan of ``sql``, or its refusal; None where it refuses it unparsed (or plans no DP query)."""
        try:
            statement, = split_statements(sql)
            resolved = {ref: (ResolvedRelation(self._by_name[ref.name].oid, "public", ref.name)
                              if ref.name in self._by_name else None) for ref in statement.references.relations}
            decision = classify(statement, resolved, self._registry)
        except Refusal as refusal:
            return refusal
        except (SqlglotError, RecursionError, ValueError):  # refused, as the executor does
            return None
        return decision if isinstance(decision, DPQuery) else None

    def _planned(self, pairs: Iterable[tuple[str, str]], checked: Checked) -> Iterator[tuple[str, str, AggregateQuery]]:
        """Each (statement, condition or argument, plan) of ``pairs`` dpproxy plans, counted in ``checked``."""
        for (statement, asked), decision in self.planned(pairs, lambda pair: pair[0], checked):
            yield statement, asked, decision.plan

    def planned(self, cases: Iterable[Case], statement: Callable[[Case], str], checked: Checked,
                first: bool = False) -> Iterator[tuple[Case, DPQuery]]:
        """Each of ``cases`` whose ``statement`` dpproxy plans, with its plan, counted in ``checked``
        (``first``: none after the first mismatch)."""
        for case in cases:
            if first and checked.mismatches:
                return
            checked.generated += 1
            decision = self.plan(statement(case))
            if decision is not None:
                checked.planned += 1
                yield case, decision

    def conditions(self, pairs: Iterable[tuple[str, str]], first: bool = False) -> Checked:
        """Check each (statement, condition) of ``pairs``: the rows the condition chooses (``first``:
        stop at the first mismatch)."""
        checked = Checked()
        for statement, asked, plan in self._planned(pairs, checked):
            if first and checked.mismatches:
                break
            backend = backend_sql(plan, seed=0)
            try:
                ran = backend_condition(backend) or "TRUE"
            except ParseError as exc:  # the backend SQL itself is no statement PostgreSQL reads
                checked.mismatches.append(Mismatch(statement, asked, backend, (("parsed", None), ("error", str(exc)))))
                continue
            if _alike_by_tree(_where(asked), _where(ran)):
                checked.same_tree += 1
                continue
            checked.evaluated += 1
            self._compare(checked, statement, asked, ran, "SELECT coalesce(array_agg(id ORDER BY id), '{{}}')::text "
                          f"FROM {READ} WHERE {{}}")
        return checked

    def arguments(self, pairs: Iterable[tuple[str, str]]) -> Checked:
        """Check each (statement, argument) of ``pairs``: ``SUM``/``AVG``'s per-row value against the
        plan's column under its FILTER (no clamp)."""
        checked = Checked()
        for statement, asked, plan in self._planned(pairs, checked):
            aggregate, summed = plan.aggregates[0], statement.lower().startswith("select sum")
            if aggregate.column is None and not summed:  # an AVG of a condition: a proportion, not a column's mean
                continue
            column = aggregate.column.name if aggregate.column is not None else "1"
            ran = f"CASE WHEN {read_in_place(aggregate.filter_sql, plan.table)} THEN {column} END" if aggregate.filter_sql else column
            checked.evaluated += 1
            total = "coalesce(({})::numeric, 0)" if summed else "({})::numeric"
            self._compare(checked, statement, asked, ran, f"SELECT array_agg({total} ORDER BY id)::text FROM rt")
        return checked

    def _compare(self, checked: Checked, statement: str, asked: str, ran: str, query: str) -> None:
        for conn in self._connections:
            with conn.transaction(force_rollback=True):
                outcomes = (self._outcome(conn, query.format(asked)), self._outcome(conn, query.format(ran)))
            if outcomes[0] != outcomes[1] and outcomes not in ALIKE:
                checked.mismatches.append(Mismatch(statement, asked, ran, outcomes))
                return

    @staticmethod
    def _outcome(conn: psycopg.Connection[Any], sql: str) -> tuple[str, Any]:
        """The value ``sql`` returns, or the SQLSTATE it fails with."""
        try:
            with conn.transaction():
                row = conn.execute(sql).fetchone()
        except psycopg.Error as exc:
            return ("error", exc.sqlstate)
        return ("value", row[0] if row else None)


def sqlstate(result: pq.abc.PGresult) -> str:
    """The SQLSTATE of a failed libpq result ("?" where none came)."""
    state = result.error_field(pq.DiagnosticField.SQLSTATE)
    return state.decode() if state else "?"
