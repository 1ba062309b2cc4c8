"""Decide what happens to each statement: DP aggregate, passthrough, dpproxy command, or refusal.

The decision is made from the statement's kind and from the relations it references,
resolved to OIDs on the backend by the caller (``resolved``); names are never compared
as strings against the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Union

import pglast
import pglast.ast
from pglast.stream import RawStream

from policies.errors import SQLSTATE, Refusal
from policies.tables import Relation, TableRegistry, quote_identifier

from .catalog import (
    CATALOG_SCHEMAS, EMPTIED_RELATIONS, PASSTHROUGH_ONLY_FUNCTIONS, SAFE_SETTINGS, SESSION_EFFECT_FUNCTIONS,
    allowed_catalog_relation, allowed_function, ascii_safe_encoding, exact_floats, value_function,
)
from .constants import FUNCTIONS as FOLDABLE_FUNCTIONS
from .copy import CopyOptions, copy_query
from .cursors import CursorOptions, Fetch, declare_query, declare_sql, fetch_of
from .function_check import catalog_function_refusal, check_functions, inexact_floats, unsafe_client_encoding
from .dp_query import AggregateQuery, asks_for_no_row, plan_aggregate_query
from .misreadings import refuse_misreadings
from .neutralise import empty_relations, neutralise_pg_class, neutralise_pg_database
from .partitioned_reads import refuse_partitioned_read
from .qualify import qualify
from .references import RelationRef
from .series_limit import plan_series_limited, ranks_series
from .sized_cache import sized_cache
from .sort_memory import within_sort_memory
from .statements import Statement, split_statements

__all__ = [
    "CloseCursor",
    "ColumnsOnly",
    "CopyOut",
    "DeclareCursor",
    "DPQuery",
    "Deallocate",
    "Decision",
    "DpproxyCommand",
    "FetchCursor",
    "Passthrough",
    "ResolvedRelation",
    "classify",
]

PG_CLASS_OID = 1259
PG_DATABASE_OID = 1262


@dataclass(frozen=True)
class ResolvedRelation:
    """What a relation name means on the backend, under the session's search_path."""

    oid: int
    schema: str
    name: str


@dataclass(frozen=True)
class Passthrough:
    """Send ``sql`` to the backend as it is (catalog, session, transaction, public tables)."""

    sql: str


@dataclass(frozen=True)
class ColumnsOnly:
    """A row-level SELECT on a protected table that asks for no row (``LIMIT 0``): a BI tool's
    probe of a dataset's columns. Answered with the RowDescription of ``sql`` from the
    backend's Parse/Describe and no row; nothing runs on the table, nothing is charged."""

    sql: str


@dataclass(frozen=True)
class DPQuery:
    """Answer with differential privacy according to ``plan``."""

    plan: AggregateQuery


@dataclass(frozen=True)
class DpproxyCommand:
    """A statement about dpproxy itself: ``SHOW dpproxy.x`` or ``SET dpproxy.x = value``."""

    verb: str  # "show" | "set" | "reset" | "keep" (SET ... FROM CURRENT)
    name: str
    value: str | None = None
    local: bool = False  # SET LOCAL: until the end of the transaction


@dataclass(frozen=True)
class CopyOut:
    """COPY (SELECT ...) TO STDOUT: answered as ``inner`` (the SELECT's decision), written as COPY writes rows."""

    inner: Union[Passthrough, DPQuery]
    options: CopyOptions


@dataclass(frozen=True)
class Deallocate:
    """DEALLOCATE: client statements live in dpproxy's registry, not on the backend."""

    name: str | None  # None: ALL


@dataclass(frozen=True)
class DeclareCursor:
    """DECLARE name CURSOR FOR query: answered where ``inner``, the query's decision, is.

    A DP answer (or a protected table's columns) is computed at DECLARE, as the query alone
    would be, and its rows kept by dpproxy for FETCH; a passthrough query's ``sql`` is the
    DECLARE to send to the backend, around the query as judged (rewriter.cursors).
    """

    name: str
    inner: Union[Passthrough, DPQuery, ColumnsOnly]
    options: CursorOptions


@dataclass(frozen=True)
class FetchCursor:
    """FETCH or MOVE: served from the cursor named, wherever it was declared (the statement
    reads nothing else, so its decision is made when it runs, from the session's cursors)."""

    fetch: Fetch


@dataclass(frozen=True)
class CloseCursor:
    """CLOSE name (None: CLOSE ALL)."""

    name: str | None


Decision = Union[Passthrough, DPQuery, ColumnsOnly, DpproxyCommand, Deallocate, CopyOut, DeclareCursor, FetchCursor,
                 CloseCursor]

_TRANSACTION_KINDS = {
    "TRANS_STMT_BEGIN", "TRANS_STMT_START", "TRANS_STMT_COMMIT", "TRANS_STMT_ROLLBACK",
    "TRANS_STMT_SAVEPOINT", "TRANS_STMT_RELEASE", "TRANS_STMT_ROLLBACK_TO",
}
_HARMLESS_SESSION_STATEMENTS = {"DiscardStmt", "UnlistenStmt"}
_WRITES = {
    "InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt", "TruncateStmt",
}
# Statements that can also sit inside another one: in a WITH (at any depth) or a subquery's WITH.
_NESTED_WRITES = frozenset({"InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt"})
# DDL over a query, which clients send to learn the query's columns (ibis's con.sql creates a
# temporary view). Refused whatever the query: a temporary object would stay on a pooled backend
# connection, where the next session to borrow it sees it, and the backend's sessions are
# read-only. The hint names what answers the same need (docs/bi-tools.md, ibis).
_CREATES_FROM_QUERY = {
    "ViewStmt": "CREATE VIEW",
    "CreateTableAsStmt": "CREATE TABLE AS (or MATERIALIZED VIEW)",
}
_CREATE_FROM_QUERY_HINT = (
    "dpproxy creates no views or tables. For a query's columns, run the query with LIMIT 0 (its "
    "columns and no row, nothing charged); for its answer, run the query itself. ibis: give "
    "con.sql the columns, con.sql(query, schema={...}), or build the expression from con.table(...)."
)
_NOT_SUPPORTED = {
    "ExplainStmt": "EXPLAIN (its plans and ANALYZE output reveal row counts)",
    "DoStmt": "DO",
    "CallStmt": "CALL",
    "ListenStmt": "LISTEN",
    "NotifyStmt": "NOTIFY",
    "PrepareStmt": "PREPARE (use the extended query protocol)",
    "ExecuteStmt": "EXECUTE",
    "LockStmt": "LOCK",
    "VacuumStmt": "VACUUM/ANALYZE",
    "CheckPointStmt": "CHECKPOINT",
    "LoadStmt": "LOAD",
}


def classify(
    statement: Statement,
    resolved: Mapping[RelationRef, ResolvedRelation | None],
    registry: TableRegistry,
    user: str | None = None,
) -> Decision:
    """Decide ``statement``'s fate; raise Refusal with SQLSTATE, message and hint if refused.

    ``resolved`` maps each relation the statement references to its backend identity
    (None: no such relation, or only a CTE of that name). ``user`` is the analyst's login
    name, which current_user & co. answer in passthrough statements (None: left as they are).
    The decision is a pure function of the four, so it is cached (refusals are not).
    """
    return _classify(statement, tuple(resolved.items()), registry, user)


# Weighed by the statement's text and parse tree, which its key keeps.
@sized_cache(8192, 2 * 1024 * 1024, lambda _, statement, *rest: len(statement.text) + statement.tree_bytes)
def _classify(
    statement: Statement,
    resolved_items: tuple[tuple[RelationRef, ResolvedRelation | None], ...],
    registry: TableRegistry,
    user: str | None,
) -> Decision:
    resolved = dict(resolved_items)
    kind = statement.kind
    if kind not in _WRITES and statement.references.node_kinds & _NESTED_WRITES:
        # WITH d AS (DELETE ... RETURNING ...) SELECT ...: refused here, not by the backend's
        # read-only transaction, so that nothing data-modifying ever leaves dpproxy.
        raise Refusal(
            SQLSTATE.READ_ONLY_SQL_TRANSACTION,
            "dpproxy is read-only: data-modifying statements are not allowed, also not in WITH "
            "(rule: read-only)",
            "Only SELECT of DP aggregates, catalog queries and session statements are accepted.",
            "read-only",
        )
    if kind == "SelectStmt":
        return _query(statement, resolved, registry, user)
    if kind == "CopyStmt":
        return _copy(statement, resolved, registry, user)
    if kind == "DeclareCursorStmt":
        return _declare(statement, resolved, registry, user)
    if kind == "FetchStmt":
        return FetchCursor(fetch_of(statement.node))
    if kind == "ClosePortalStmt":
        return CloseCursor(statement.node.get("portalname"))
    if kind == "TransactionStmt":
        return _transaction(statement)
    if kind == "VariableSetStmt":
        return _set(statement)
    if kind == "VariableShowStmt":
        name = statement.node.get("name", "")
        if name.startswith("dpproxy."):
            return DpproxyCommand("show", name)
        return Passthrough(statement.text)
    if kind == "DeallocateStmt":
        return Deallocate(None if statement.node.get("isall") else statement.node.get("name"))
    if kind in _HARMLESS_SESSION_STATEMENTS:
        return Passthrough(statement.text)
    if kind in _WRITES:
        raise Refusal(
            SQLSTATE.READ_ONLY_SQL_TRANSACTION,
            "dpproxy is read-only: data-modifying statements are not allowed (rule: read-only)",
            "Only SELECT of DP aggregates, catalog queries and session statements are accepted.",
            "read-only",
        )
    if kind in _NOT_SUPPORTED:
        raise Refusal(
            SQLSTATE.FEATURE_NOT_SUPPORTED,
            f"{_NOT_SUPPORTED[kind]} is not supported through dpproxy (rule: statement-not-allowed)",
            "Only SELECT of DP aggregates, catalog queries and session statements are accepted.",
            "statement-not-allowed",
        )
    if kind in _CREATES_FROM_QUERY:
        raise Refusal(
            SQLSTATE.READ_ONLY_SQL_TRANSACTION,
            f"{_CREATES_FROM_QUERY[kind]} is not allowed through dpproxy, also not a temporary one (rule: read-only)",
            _CREATE_FROM_QUERY_HINT,
            "read-only",
        )
    raise Refusal(
        SQLSTATE.READ_ONLY_SQL_TRANSACTION,
        f"{_statement_name(kind)} is not allowed through dpproxy (rule: read-only)",
        "dpproxy does not change schemas, roles or data; connect to PostgreSQL directly as an administrator.",
        "read-only",
    )


def _statement_name(kind: str) -> str:
    return kind.removesuffix("Stmt") + " statement"


def _query(
    statement: Statement,
    resolved: Mapping[RelationRef, ResolvedRelation | None],
    registry: TableRegistry,
    user: str | None,
) -> Decision:
    """A SELECT, as a statement of its own or a cursor's query."""
    if statement.node.get("intoClause"):
        # SELECT INTO creates a table (a temporary one would stay on a pooled backend
        # connection); the backend's read-only sessions refuse it too, but only later.
        raise Refusal(
            SQLSTATE.READ_ONLY_SQL_TRANSACTION,
            "SELECT INTO creates a table and is not allowed through dpproxy (rule: read-only)",
            "Only SELECT of DP aggregates, catalog queries and session statements are accepted.",
            "read-only",
        )
    return _select(statement, resolved, registry, user)


def _declare(
    statement: Statement,
    resolved: Mapping[RelationRef, ResolvedRelation | None],
    registry: TableRegistry,
    user: str | None,
) -> DeclareCursor:
    """DECLARE CURSOR is judged as its query: the same rules, rule names and rewriting."""
    text, options = declare_query(statement.text, statement.node)
    (query,) = split_statements(text)
    effects = sorted(name for name in query.references.functions
                     if name.removeprefix("pg_catalog.") in SESSION_EFFECT_FUNCTIONS)
    if effects:
        # Run at each FETCH, it would change the session's settings where dpproxy does not look.
        raise Refusal(
            SQLSTATE.FEATURE_NOT_SUPPORTED,
            f"function {effects[0]}() changes the session; it is not allowed in a cursor's query "
            "(rule: function-allowlist)",
            "Run set_config() as a statement of its own.",
            "function-allowlist",
        )
    inner = _query(query, resolved, registry, user)
    name = str(statement.node.get("portalname", ""))
    if isinstance(inner, Passthrough):
        return DeclareCursor(name, Passthrough(declare_sql(name, options, inner.sql)), options)
    assert isinstance(inner, (DPQuery, ColumnsOnly))
    return DeclareCursor(name, inner, options)


_HINTED_TABLES = 20


def _policy_tables_hint(registry: TableRegistry) -> str:
    """What a statement naming no existing relation is told: the tables the policy names (table
    names are not protected; a newcomer's typo of one is the usual cause)."""
    names = sorted(relation.display_name for relation in registry.by_oid.values())
    listed = ", ".join(names[:_HINTED_TABLES])
    if len(names) > _HINTED_TABLES:
        listed += f" and {len(names) - _HINTED_TABLES} more"
    return f"The tables dpproxy's policy names: {listed or 'none'}."


def _select(
    statement: Statement,
    resolved: Mapping[RelationRef, ResolvedRelation | None],
    registry: TableRegistry,
    user: str | None,
) -> Decision:
    refs = statement.references
    protected: list[Relation] = []
    references_emptied = False
    neutralised: set[int] = set()  # pg_class and pg_database, where the statement reads them
    for ref in refs.relations:
        target = resolved.get(ref)
        if target is None:
            if ref.schema is None and ref.name in refs.cte_names:
                continue  # a CTE of this name, and no relation it could shadow
            raise Refusal(
                SQLSTATE.UNDEFINED_TABLE,
                f'relation "{ref.qualified.replace(chr(34), "")}" does not exist',
                _policy_tables_hint(registry),
                rule="undefined-relation",
            )
        if ref.schema is None and ref.name in refs.cte_names:
            # A CTE shadows a real relation here; which one a reference means depends on
            # scoping rules we do not replicate, so only harmless shadowing is accepted.
            if registry.get(target.oid) is not None or target.schema not in CATALOG_SCHEMAS:
                raise Refusal(
                    SQLSTATE.INSUFFICIENT_PRIVILEGE,
                    f'a CTE named "{ref.name}" shadows a table; rename the CTE (rule: cte-shadowing)',
                    rule="cte-shadowing",
                )
        relation = registry.get(target.oid)
        if relation is not None:
            if relation.access == "protected":
                protected.append(relation)
            continue
        if target.schema in CATALOG_SCHEMAS:
            if not allowed_catalog_relation(target.schema, target.name):
                raise Refusal(
                    SQLSTATE.INSUFFICIENT_PRIVILEGE,
                    f"catalog relation {target.schema}.{target.name} is not available through dpproxy "
                    "(rule: catalog-allowlist)",
                    "Statistics, activity counters and large objects can reveal protected data; "
                    "schema catalogs (pg_class, pg_attribute, information_schema ...) are available.",
                    "catalog-allowlist",
                )
            if target.oid in (PG_CLASS_OID, PG_DATABASE_OID):
                neutralised.add(target.oid)
            references_emptied |= target.schema == "pg_catalog" and target.name in EMPTIED_RELATIONS
            continue
        raise Refusal(
            SQLSTATE.INSUFFICIENT_PRIVILEGE,
            f"relation {target.schema}.{target.name} is not in the dpproxy policy (rule: default-deny)",
            "Only tables the policy names (protected or public) and the system catalogs can be queried.",
            "default-deny",
        )
    if protected:
        return _protected(statement, protected, registry)
    check_functions(statement, registry.function_names)
    # Each relation is written as the one resolved and judged here: a resolution remembered
    # since (Executor._resolve) must not let the search_path find another when it runs, one
    # an administrator created meanwhile in an earlier schema.
    pinned = {(ref.name, target.schema): target for ref, target in resolved.items()
              if ref.schema is None and target is not None and ref.name not in refs.cte_names}
    text = qualify(statement.text, user, tuple(sorted(pinned)))
    for oid, neutralise, columns in ((PG_CLASS_OID, neutralise_pg_class, registry.pg_class_columns),
                                     (PG_DATABASE_OID, neutralise_pg_database, registry.pg_database_columns)):
        if oid in neutralised:
            # Its subquery names only the catalog relation, keyword types and constants.
            text = neutralise(
                text,
                columns,
                lambda schema, name, oid=oid: _means_oid(RelationRef(schema, name), resolved, oid)
                or (schema is not None and pinned.get((name, schema), _NOT_PINNED).oid == oid),
            )
    if references_emptied:
        text = empty_relations(
            text,
            lambda schema, name: _means_emptied(RelationRef(schema, name), resolved)
            or (schema is not None and _is_emptied(pinned.get((name, schema), _NOT_PINNED))),
        )
    return Passthrough(text)


def _copy(
    statement: Statement,
    resolved: Mapping[RelationRef, ResolvedRelation | None],
    registry: TableRegistry,
    user: str | None,
) -> CopyOut:
    """COPY (SELECT ...) TO STDOUT is judged as the SELECT; every other COPY is refused."""
    text, options = copy_query(statement.text, statement.node)
    (query,) = split_statements(text)
    inner = _select(query, resolved, registry, user)
    if isinstance(inner, ColumnsOnly):
        # Answered as a SELECT (its columns, no row), a COPY of it had no path and ended the session (XX000).
        raise Refusal(
            SQLSTATE.FEATURE_NOT_SUPPORTED,
            "COPY of a query that asks for no row of a protected table is not supported (rule: copy-no-row)",
            "Run the SELECT itself (answered with its columns and no row), or COPY a DP aggregate.",
            "copy-no-row",
        )
    assert isinstance(inner, (Passthrough, DPQuery))
    return CopyOut(inner, options)


_NOT_PINNED = ResolvedRelation(0, "", "")


def _unreadable(table: Relation, role: str) -> Refusal:
    """The refusal of a statement on a protected table the service role lost SELECT on: refused
    from the catalog's privileges alone, before any charge (charged, it would fail with
    "permission denied" for a reason no row decides)."""
    return Refusal(
        SQLSTATE.INSUFFICIENT_PRIVILEGE,
        f"dpproxy's service role {quote_identifier(role)} has lost its SELECT privilege on protected table "
        f"{table.display_name} (rule: service-role-grant)",
        f"An administrator must run GRANT SELECT ON {table.qualified_name} TO {quote_identifier(role)}; "
        "dpproxy checks again every few seconds and answers again once it is back. Nothing was charged.",
        "service-role-grant",
    )


def _fallible(table: Relation, expression: str) -> Refusal:
    """The refusal of a statement on a protected relation redefined, since the policy was loaded,
    to read through an expression that can fail on a row (charged, whether it failed would say
    whether the statement's rows hold such a row) or that PostgreSQL computes at each reference
    from a value of any length (how long it took would say whether a row holds a long one), or a
    table stored through an access method other than heap; ``expression`` says which
    (``row_failures.fallible_protected``)."""
    return Refusal(
        SQLSTATE.OBJECT_NOT_IN_PREREQUISITE_STATE,
        f"protected relation {table.display_name} now reads through {expression} (rule: row-failure)",
        "An administrator must compute that column into a table or a materialized view (a virtual generated "
        "column: declare it STORED), leave it out of the view, or store a table with heap (ALTER TABLE ... SET "
        "ACCESS METHOD heap); dpproxy checks again every few seconds and answers again once it is gone. Nothing was charged.",
        "row-failure",
    )


def _redefined(table: Relation, change: str) -> Refusal:
    """The refusal of a statement on a protected relation whose definition changed since the policy
    was loaded: judged by column facts that are no longer true, it could be charged and then fail
    on the backend, on some rows only."""
    return Refusal(
        SQLSTATE.OBJECT_NOT_IN_PREREQUISITE_STATE,
        f"protected relation {table.display_name} changed since dpproxy loaded its policy: {change} "
        "(rule: schema-changed)",
        "The table's definition changed since the policy was loaded and the policy in force no longer fits it "
        "(dpproxy's log says why): an administrator must fix the policy and reload dpproxy (SIGHUP); dpproxy "
        "also answers again if the definition is put back as it was. Nothing was charged.",
        "schema-changed",
    )


def _is_emptied(target: ResolvedRelation | None) -> bool:
    return target is not None and target.schema == "pg_catalog" and target.name in EMPTIED_RELATIONS


def _means_emptied(ref: RelationRef, resolved: Mapping[RelationRef, ResolvedRelation | None]) -> bool:
    return _is_emptied(resolved.get(ref))


def _means_oid(ref: RelationRef, resolved: Mapping[RelationRef, ResolvedRelation | None], oid: int) -> bool:
    target = resolved.get(ref)
    return target is not None and target.oid == oid


def _protected(statement: Statement, protected: list[Relation], registry: TableRegistry) -> DPQuery | ColumnsOnly:
    for table in protected:
        role = registry.unreadable.get(table.oid)
        if role is not None:
            raise _unreadable(table, role)
        expression = registry.fallible.get(table.oid)
        if expression is not None:
            raise _fallible(table, expression)
        change = registry.redefined.get(table.oid)
        if change is not None:
            raise _redefined(table, change)
    relation = protected[0]
    refuse_partitioned_read(statement.node, relation)
    refs = statement.references
    _refuse_misread_operators(refs.operators, relation)
    refuse_misreadings(statement.text, statement.node, relation)
    if len(refs.relations) > 1 and ranks_series(statement.node) and len(protected) == len(refs.relations) and all(
        other.oid == relation.oid for other in protected
    ):
        # The table joined to a subquery over itself: answered only as a series limit.
        _check_function_names(refs.functions, relation)
        return DPQuery(within_sort_memory(plan_series_limited(statement.text, relation, registry.function_names)))
    # A CTE's name is no relation: one read once is the derived table it names (rewriter.ctes).
    read = [ref for ref in refs.relations if not (ref.schema is None and ref.name in refs.cte_names)]
    if len(read) > 1:
        message = "JOIN is not allowed on protected table"
        rule = "no-join"
        if refs.node_kinds & {"SubLink", "RangeSubselect", "CommonTableExpr"}:
            message, rule = "subqueries are not allowed on protected table", "no-subquery"
        elif statement.node.get("op", "SETOP_NONE") != "SETOP_NONE":
            message, rule = "UNION/INTERSECT/EXCEPT is not allowed on protected table", "no-set-operations"
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{message} {relation.display_name} (rule: {rule})",
            "Query one protected table at a time, with aggregates only: "
            f"SELECT COUNT(*), SUM(col) FROM {relation.display_name} [WHERE ...].",
            rule,
        )
    _check_function_names(refs.functions, relation)
    try:
        return DPQuery(within_sort_memory(plan_aggregate_query(statement.text, relation, registry.function_names)))
    except Refusal as refusal:
        if refusal.rule == "no-row-access" and asks_for_no_row(statement.text, relation):
            check_functions(statement, registry.function_names)
            return ColumnsOnly(qualify(statement.text))
        raise


# Operators PostgreSQL does not have that sqlglot, which plans DP queries, reads as others: a == b
# was answered (and charged) as a = b, and ! (a = b) and !! (a = b) as NOT (a = b), where PostgreSQL
# fails the statement whatever the rows (it has no prefix ! or !! since version 14).
# Each with what to write instead.
_MISREAD_OPERATORS = {"==": "WHERE col = 'x'", "<=>": "WHERE col IS NOT DISTINCT FROM 'x'",
                      "!": "WHERE NOT (col = 'x')", "!!": "WHERE NOT (col = 'x')"}


def _refuse_misread_operators(operators: frozenset[str], relation: Relation) -> None:
    """Refuse, as PostgreSQL would (42883), an operator of :data:`_MISREAD_OPERATORS`, and one whose
    name ends in a sign: PostgreSQL's scanner keeps ``+``/``-`` in an operator that has one of
    ``~!@#%^&|`?`` (``age !=-1`` is the operator ``!=-``, ``50 %-7`` is ``%-``), where sqlglot reads the
    sign as the next number's (``age != -1``) and answered."""
    for symbol in sorted(operators):
        if symbol in _MISREAD_OPERATORS:
            instead = f"PostgreSQL has no {symbol} operator of its own: write {_MISREAD_OPERATORS[symbol]}"
        elif len(symbol) > 1 and symbol[-1] in "+-":
            instead = (f"PostgreSQL reads {symbol} as one operator, which it does not have: put a space "
                       f"before the sign ({symbol[:-1]} {symbol[-1]}1)")
        else:
            continue
        raise Refusal(
            "42883",
            f"operator does not exist: {symbol} (rule: undefined-operator)",
            f"On protected table {relation.display_name}, {instead}.",
            "undefined-operator",
        )


def _check_function_names(functions: frozenset[str], relation: Relation) -> None:
    """Refuse a function no part of a DP query may call (sqlglot would see it too; refusing
    here keeps both parsers in agreement).

    Functions of folded constants (rewriter.constants) are checked again, with their arguments,
    there; other allowed functions can only serve post-processing (rewriter.post_process):
    WHERE and aggregate arguments refuse them.
    """
    effects = sorted(name for name in functions if name.removeprefix("pg_catalog.") in SESSION_EFFECT_FUNCTIONS)
    if effects:
        # Wherever it stands (a one-row answer's ORDER BY is dropped unrun), it would be a
        # setting the client asked for and the backend never made.
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"function {effects[0]}() changes the session; it is not allowed in a statement on protected table "
            f"{relation.display_name} (rule: function-allowlist)",
            "Run set_config() as a statement of its own.",
            "function-allowlist",
        )
    catalog_only = sorted(name for name in functions if name.removeprefix("pg_catalog.") in PASSTHROUGH_ONLY_FUNCTIONS)
    if catalog_only:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"function {catalog_only[0]}() is not allowed in a statement on protected table {relation.display_name} "
            "(rule: function-allowlist)",
            "Format the answer in the client: over a DP answer it could fail after the charge.",
            "function-allowlist",
        )
    catalog = sorted(name for name in functions - _DP_FUNCTIONS
                     if allowed_function(name) and name not in _OTHER_AGGREGATES and not value_function(name))
    if catalog:
        raise catalog_function_refusal(catalog[0], relation.display_name)
    unknown = {
        name for name in functions - _DP_FUNCTIONS
        if name in _OTHER_AGGREGATES
        or not (value_function(name) or name.removeprefix("pg_catalog.") in FOLDABLE_FUNCTIONS)
    }
    if unknown:
        name = sorted(unknown)[0]
        # PostgreSQL's parser writes x SIMILAR TO p as x ~ similar_to_escape(p): name what was typed.
        written = "SIMILAR TO" if name.removeprefix("pg_catalog.") == "similar_to_escape" else f"function {name}()"
        # PostgreSQL has no median(): the newcomer's first guess gets the aggregate that is one.
        median = ("A median is PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY col). "
                  if name.removeprefix("pg_catalog.") == "median" else "")
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{written} is not allowed on protected table {relation.display_name} (rule: function-allowlist)",
            median + "Aggregates: COUNT, SUM, AVG, MIN, MAX, MODE(), PERCENTILE_CONT/PERCENTILE_DISC(p) WITHIN GROUP, "
            "VARIANCE/VAR_SAMP/VAR_POP and STDDEV/STDDEV_SAMP/STDDEV_POP; in WHERE: lower(), upper(), and the "
            "date/time and arithmetic functions of computed values: " + ", ".join(sorted(FOLDABLE_FUNCTIONS)) + ".",
            "function-allowlist",
        )


_DP_FUNCTIONS = frozenset({"count", "sum", "avg", "min", "max", "mode", "percentile_cont", "percentile_disc", "lower",
                           "upper", "date_trunc", "width_bucket", "stddev", "stddev_samp", "stddev_pop", "variance",
                           "var_samp", "var_pop"})

# Aggregates and window functions catalog queries may call, never a protected table.
_OTHER_AGGREGATES = frozenset({
    "array_agg", "string_agg", "bool_and", "bool_or", "every", "json_agg", "jsonb_agg", "json_object_agg",
    "row_number", "rank", "dense_rank", "unnest", "generate_series", "generate_subscripts",
})


def _transaction(statement: Statement) -> Passthrough:
    node = statement.node
    if node.get("kind") not in _TRANSACTION_KINDS:
        raise Refusal(
            SQLSTATE.FEATURE_NOT_SUPPORTED,
            "two-phase commit is not supported through dpproxy (rule: statement-not-allowed)",
            "Use BEGIN, COMMIT, ROLLBACK, SAVEPOINT and RELEASE.",
            "statement-not-allowed",
        )
    _refuse_transaction_modes(node.get("options") or [])
    return Passthrough(statement.text)


def _refuse_transaction_modes(options: list[dict[str, Any]]) -> None:
    """Refuse READ WRITE and NOT DEFERRABLE among a BEGIN's or SET TRANSACTION's modes.

    Backend transactions are read-only and deferrable (proxy/backend/pool.py): a serializable
    one that is not deferrable can fail with 40001 because a concurrent writer changed a row it
    reads, which would make an accepted DP query's failure say which rows were being written.
    """
    for option in options:
        element = option.get("DefElem", {})
        value = element.get("arg", {}).get("A_Const", {}).get("ival", {}).get("ival", 0)
        if element.get("defname") == "transaction_read_only" and not value:
            raise Refusal(
                SQLSTATE.READ_ONLY_SQL_TRANSACTION,
                "dpproxy sessions are read-only: READ WRITE is not allowed (rule: read-only)",
                "Leave out READ WRITE; transactions through dpproxy are read-only.",
                "read-only",
            )
        if element.get("defname") == "transaction_deferrable" and not value:
            raise Refusal(
                SQLSTATE.FEATURE_NOT_SUPPORTED,
                "transactions through dpproxy are DEFERRABLE: NOT DEFERRABLE is not allowed (rule: deferrable)",
                "Leave out NOT DEFERRABLE. A SERIALIZABLE transaction then waits for a safe snapshot and "
                "never fails because of concurrent writers.",
                "deferrable",
            )


def _set(statement: Statement) -> Decision:
    node = statement.node
    kind = node.get("kind")
    name = (node.get("name") or "").lower()
    if name.startswith("dpproxy."):
        local = bool(node.get("is_local"))
        if kind == "VAR_SET_VALUE":
            return DpproxyCommand("set", name, _set_value(node), local)
        if kind == "VAR_SET_CURRENT":
            return DpproxyCommand("keep", name, None, local)
        return DpproxyCommand("reset", name, None, local)
    if kind in ("VAR_RESET", "VAR_RESET_ALL"):
        return Passthrough(statement.text)  # back to the session defaults dpproxy set
    if name not in SAFE_SETTINGS:
        raise Refusal(
            SQLSTATE.INSUFFICIENT_PRIVILEGE,
            f'setting "{name}" cannot be changed through dpproxy (rule: safe-settings)',
            "Only presentation and session settings may be changed: " + ", ".join(sorted(SAFE_SETTINGS)),
            "safe-settings",
        )
    _refuse_transaction_modes(node.get("args") or [])
    if kind != "VAR_SET_DEFAULT" and not exact_floats(name, _set_value(node)):
        raise inexact_floats()
    if name in ("client_encoding", "names") and kind != "VAR_SET_DEFAULT" and not ascii_safe_encoding(_set_value(node)):
        raise unsafe_client_encoding(_set_value(node))
    if name in _TRANSACTION_SCOPED and not node.get("is_local"):
        return Passthrough(_as_local(statement.text))
    return Passthrough(statement.text)


# SET TRANSACTION ... and SET transaction_isolation act on the current transaction only, but
# PostgreSQL keeps them as a session-level SET: transaction_isolation (and _read_only) stay
# with source 'session' on the backend after the transaction, where RESET ALL and DISCARD ALL
# cannot clear them. On a pooled connection that is a trace the next analyst's session reads
# in pg_settings. SET LOCAL has the same effect on the transaction and leaves nothing.
_TRANSACTION_SCOPED = frozenset({"transaction", "transaction_isolation"})


def _as_local(text: str) -> str:
    """``text``, one SET statement, as the same SET LOCAL."""
    (raw,) = pglast.parse_sql(text)
    statement = raw.stmt
    assert isinstance(statement, pglast.ast.VariableSetStmt)
    statement.is_local = True
    return str(RawStream()(statement))


def _set_value(node: dict[str, Any]) -> str | None:
    args = node.get("args") or []
    if len(args) != 1:
        return None
    const = args[0].get("A_Const", {})
    for key in ("fval", "sval", "ival"):
        if key in const:
            inner = const[key]
            return str(inner.get(key, 0)) if isinstance(inner, dict) else str(inner)
    return None
