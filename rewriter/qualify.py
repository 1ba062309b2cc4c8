"""Pin every function, operator, type and collation of a passthrough statement to pg_catalog.

PostgreSQL looks unqualified names up along the session's search_path, and among
same-name functions or operators it prefers an exact argument-type match from *any* schema
on the path over a pg_catalog one that needs a coercion, so putting pg_catalog first is not
enough: a ``public.version()``, ``public.upper(name)`` or ``public.=(name, name)`` planted by a
database owner would run with the analyst's query. The allowlists compare names as text; this
module makes the text mean PostgreSQL's own objects. Each accepted passthrough statement is
parsed, every unqualified function call, operator, type name and collation is qualified with
``pg_catalog`` (operators as ``OPERATOR(pg_catalog.op)``), and the tree is deparsed.

Forms whose operator SQL cannot qualify are rewritten to equivalents that can: LIKE/ILIKE/
SIMILAR TO become their operators, IN lists OR/AND chains, BETWEEN comparisons, NULLIF and
``CASE x WHEN`` searched CASEs, IS [NOT] DISTINCT FROM a NULL-aware comparison, JOIN ... USING
an ON clause. What cannot be rewritten safely (ORDER BY ... USING, NATURAL JOIN, a USING join
whose merged column is used unqualified, IS DISTINCT FROM on rows, ``%TYPE``, a name qualified
with another schema) is refused with 0A000 / 42501. Relations are resolved to OIDs before
classification (catalog views are bound to OIDs at creation); given their schemas, each
unqualified one is written with the schema it was resolved in, so that a resolution the
session remembers still names the relation judged when the statement runs.
"""

from __future__ import annotations

from typing import Any, Callable

from pglast import ast, parse_sql
from pglast.parser import ParseError
from pglast.enums import A_Expr_Kind, BoolExprType, BoolTestType, NullTestType, SubLinkType
from pglast.stream import RawStream

from policies.errors import SQLSTATE, Refusal

from .neutralise import neutralise_calls
from .sized_cache import sized_cache

__all__ = ["qualify"]

PG_CATALOG = "pg_catalog"
# information_schema's functions and domains are PostgreSQL's own too (created with the catalog).
_OWN_SCHEMAS = frozenset({PG_CATALOG, "information_schema"})
_CATALOG_ONLY = frozenset({PG_CATALOG})
_OWN_SCHEMA_ONLY = "Write the name without a schema (dpproxy pins it to pg_catalog) or with pg_catalog."


def qualify(sql: str, user: str | None = None, schemas: tuple[tuple[str, str], ...] = (),
            collations: frozenset[tuple[str, str]] = frozenset()) -> str:
    """``sql`` (one statement) with its functions, operators, types and collations in pg_catalog.

    Raises Refusal for forms that cannot be pinned; the result means the same as ``sql``
    with the default search_path, whatever search_path the session has, except that size
    functions answer NULL and, with ``user``, current_user & co. answer ``user``
    (neutralise.neutralise_calls). ``schemas`` pins relations: each unqualified relation
    named ``name`` of a ``(name, schema)`` pair is written ``schema.name``, the relation
    dpproxy resolved and judged, whatever the search_path finds when the statement runs.
    ``collations`` (schema and name) are the only ones outside pg_catalog a statement may name, and
    only as dpproxy writes them in an outer statement (rewriter/post_process.py): on a released key's
    ``pg_catalog.unnest($k)``, a form the analyst's SQL cannot take there (its parameters are refused).
    """
    return _qualify(sql, user, schemas, collations)


@sized_cache(4096, 4 * 1024 * 1024, lambda text, sql, user, schemas, collations: len(sql) + len(text))
def _qualify(sql: str, user: str | None, schemas: tuple[tuple[str, str], ...],
             collations: frozenset[tuple[str, str]]) -> str:
    try:
        (raw,) = parse_sql(sql)
    except ParseError as exc:
        raise Refusal(SQLSTATE.SYNTAX_ERROR, str(exc.args[0]), rule="syntax") from exc
    tree = _walk(neutralise_calls(raw.stmt, user), collations)
    if schemas:
        _pin_relations(tree, dict(schemas))
    # The deparser's parentheses decide what the text means; read it back to be sure it
    # means the tree we built. Whatever the deparser cannot print, or prints so that it
    # means something else, is refused, never sent.
    try:
        text = str(RawStream()(tree))
        same = parse_sql(text)[0].stmt == tree
    except (ParseError, NotImplementedError, ValueError, TypeError, AttributeError, RecursionError):
        same = False
    if not same:
        raise _refuse("this statement's form", "Add parentheses or write the expression more simply.")
    return text


def _pin_relations(node: Any, schemas: dict[str, str]) -> None:
    """Qualify each unqualified RangeVar under ``node`` whose name ``schemas`` maps."""
    if isinstance(node, tuple):
        for item in node:
            _pin_relations(item, schemas)
        return
    if not isinstance(node, ast.Node):
        return
    if isinstance(node, ast.RangeVar) and node.schemaname is None and node.relname in schemas:
        node.schemaname = schemas[node.relname]
    for attr in node:
        value = getattr(node, attr)
        if isinstance(value, (ast.Node, tuple)):
            _pin_relations(value, schemas)


def _walk(node: Any, collations: frozenset[tuple[str, str]] = frozenset()) -> Any:
    """Rewrite ``node``'s subtree bottom-up; return what replaces ``node`` (``collations``: qualify's)."""
    if isinstance(node, tuple):
        return tuple(_walk(item, collations) for item in node)
    if not isinstance(node, ast.Node):
        return node
    for attr in node:
        value = getattr(node, attr)
        if isinstance(value, (ast.Node, tuple)):
            setattr(node, attr, _walk(value, collations))
    if collations and _released_key_collation(node, collations):
        return node
    handler = _HANDLERS.get(type(node))
    return handler(node) if handler is not None else node


def _refuse(what: str, hint: str, sqlstate: str = SQLSTATE.FEATURE_NOT_SUPPORTED) -> Refusal:
    return Refusal(sqlstate, f"{what} is not supported through dpproxy (rule: pg-catalog-names)", hint,
                   "pg-catalog-names")


def _name(parts: tuple[ast.String, ...] | None, what: str,
          schemas: frozenset[str] = _OWN_SCHEMAS) -> tuple[ast.String, ...]:
    """``parts`` with pg_catalog in front when unqualified; refused when a schema not in ``schemas`` is named."""
    parts = tuple(parts or ())
    if len(parts) == 1:
        return (ast.String(sval=PG_CATALOG), *parts)
    if len(parts) == 2 and parts[0].sval in schemas:
        return parts
    shown = ".".join(str(part.sval) for part in parts)
    raise _refuse(f"{what} {shown}", _OWN_SCHEMA_ONLY, SQLSTATE.INSUFFICIENT_PRIVILEGE)


def _operator(symbol: str) -> tuple[ast.String, ...]:
    return (ast.String(sval=PG_CATALOG), ast.String(sval=symbol))


def _op(symbol: str, left: Any, right: Any) -> ast.A_Expr:
    return ast.A_Expr(kind=A_Expr_Kind.AEXPR_OP, name=_operator(symbol), lexpr=left, rexpr=right,
                      rexpr_list_start=0, rexpr_list_end=0, location=-1)


def _bool(kind: BoolExprType, *args: Any) -> ast.BoolExpr:
    return ast.BoolExpr(boolop=kind, args=args, location=-1)


def _is_null(expr: Any) -> ast.NullTest:
    return ast.NullTest(arg=expr, nulltesttype=NullTestType.IS_NULL, argisrow=False, location=-1)


def _func_call(node: ast.FuncCall) -> ast.FuncCall:
    node.funcname = _name(node.funcname, "function")
    return node


def _type_name(node: ast.TypeName) -> ast.TypeName:
    if node.pct_type:
        raise _refuse("%TYPE", "Name the type itself.")
    node.names = _name(node.names, "type")
    return node


def _released_key_collation(node: Any, collations: frozenset[tuple[str, str]]) -> bool:
    """Whether ``node`` is dpproxy's ``pg_catalog.unnest($k) COLLATE schema.name`` of one of ``collations``
    (its arguments already walked, so the function is pinned to pg_catalog)."""
    if not isinstance(node, ast.CollateClause) or not isinstance(node.arg, ast.FuncCall):
        return False
    name = tuple(part.sval for part in node.collname or ())
    called = tuple(part.sval for part in node.arg.funcname or ())
    arguments = node.arg.args or ()
    return (len(name) == 2 and (name[0], name[1]) in collations and called == (PG_CATALOG, "unnest")
            and len(arguments) == 1 and isinstance(arguments[0], ast.ParamRef))


def _collate(node: ast.CollateClause) -> ast.CollateClause:
    node.collname = _name(node.collname, "collation", _CATALOG_ONLY)
    return node


def _table_sample(node: ast.RangeTableSample) -> ast.RangeTableSample:
    # The method is a handler function looked up by name, and the deparser cannot qualify it.
    raise _refuse("TABLESAMPLE", "Leave out TABLESAMPLE.")


def _sublink(node: ast.SubLink) -> ast.SubLink:
    if node.subLinkType in (SubLinkType.ANY_SUBLINK, SubLinkType.ALL_SUBLINK, SubLinkType.ROWCOMPARE_SUBLINK):
        # IN (SELECT ...) has no operName; it means = ANY (SELECT ...).
        node.operName = _name(node.operName or (ast.String(sval="="),), "operator", _CATALOG_ONLY)
    return node


def _case(node: ast.CaseExpr) -> ast.CaseExpr:
    """CASE x WHEN v compares with an unqualified =: make it CASE WHEN x = v."""
    if node.arg is not None:
        node.args = tuple(
            ast.CaseWhen(expr=_op("=", node.arg, when.expr), result=when.result, location=-1)
            for when in node.args or ()
        )
        node.arg = None
    return node


def _sort_by(node: ast.SortBy) -> ast.SortBy:
    if node.useOp:
        raise _refuse("ORDER BY ... USING", "Use ASC or DESC.")
    return node


def _a_expr(node: ast.A_Expr) -> Any:
    kind = node.kind
    symbol = node.name[-1].sval if node.name else "="
    if kind in (A_Expr_Kind.AEXPR_OP, A_Expr_Kind.AEXPR_OP_ANY, A_Expr_Kind.AEXPR_OP_ALL):
        node.name = _name(node.name, "operator", _CATALOG_ONLY)
        return node
    if kind in (A_Expr_Kind.AEXPR_LIKE, A_Expr_Kind.AEXPR_ILIKE, A_Expr_Kind.AEXPR_SIMILAR):
        # PostgreSQL itself turns these into the operator ~~, ~~*, ~ (or their negations).
        return _op(symbol, node.lexpr, node.rexpr)
    if kind == A_Expr_Kind.AEXPR_IN:
        # x IN (a, b) is x = a OR x = b; x NOT IN (a, b) is x <> a AND x <> b (SQL's definition).
        join = BoolExprType.OR_EXPR if symbol == "=" else BoolExprType.AND_EXPR
        terms = [_op(symbol, node.lexpr, item) for item in _items(node.rexpr)]
        return terms[0] if len(terms) == 1 else _bool(join, *terms)
    if kind == A_Expr_Kind.AEXPR_NULLIF:
        left, right = node.lexpr, node.rexpr
        return ast.CaseExpr(args=(ast.CaseWhen(expr=_op("=", left, right), result=ast.A_Const(isnull=True),
                                               location=-1),),
                            defresult=left, location=-1)
    if kind in (A_Expr_Kind.AEXPR_DISTINCT, A_Expr_Kind.AEXPR_NOT_DISTINCT):
        return _distinct(node, negated=kind == A_Expr_Kind.AEXPR_DISTINCT)
    if kind in _BETWEEN_KINDS:
        return _between(node)
    raise _refuse(f"the operator form {getattr(kind, 'name', kind)}", "Write it with a plain operator.")


def _distinct(node: ast.A_Expr, negated: bool) -> Any:
    left, right = node.lexpr, node.rexpr
    if any(isinstance(side, (ast.RowExpr, ast.SubLink)) for side in (left, right)):
        raise _refuse("IS DISTINCT FROM on rows", "Compare the columns one by one.")
    # a IS NOT DISTINCT FROM b  ==  (a = b) IS TRUE OR (a IS NULL AND b IS NULL)
    same = _bool(
        BoolExprType.OR_EXPR,
        ast.BooleanTest(arg=_op("=", left, right), booltesttype=BoolTestType.IS_TRUE, location=-1),
        _bool(BoolExprType.AND_EXPR, _is_null(left), _is_null(right)),
    )
    return _bool(BoolExprType.NOT_EXPR, same) if negated else same


# BETWEEN kinds: True where the value must lie inside the bounds.
_BETWEEN_KINDS = {
    A_Expr_Kind.AEXPR_BETWEEN: True, A_Expr_Kind.AEXPR_BETWEEN_SYM: True,
    A_Expr_Kind.AEXPR_NOT_BETWEEN: False, A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM: False,
}


def _between(node: ast.A_Expr) -> Any:
    value, (low, high) = node.lexpr, _items(node.rexpr)
    inside = _BETWEEN_KINDS[A_Expr_Kind(int(node.kind or 0))]

    def within(lo: Any, hi: Any) -> ast.BoolExpr:
        if inside:
            return _bool(BoolExprType.AND_EXPR, _op(">=", value, lo), _op("<=", value, hi))
        return _bool(BoolExprType.OR_EXPR, _op("<", value, lo), _op(">", value, hi))

    if node.kind in (A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_NOT_BETWEEN):
        return within(low, high)
    # SYMMETRIC: either order of the bounds (as PostgreSQL expands it).
    return _bool(BoolExprType.OR_EXPR if inside else BoolExprType.AND_EXPR, within(low, high), within(high, low))


def _select(node: ast.SelectStmt) -> ast.SelectStmt:
    """Turn each JOIN ... USING of this SELECT's FROM into JOIN ... ON with pg_catalog's =."""
    joins = [join for item in node.fromClause or () for join in _joins(item)]
    for join in joins:
        if join.isNatural:
            raise _refuse("NATURAL JOIN", "Join with ON or with JOIN ... USING (the columns).")
        if join.usingClause:
            _using_to_on(node, join)
    return node


def _joins(item: Any) -> list[ast.JoinExpr]:
    if not isinstance(item, ast.JoinExpr):
        return []
    return [item, *_joins(item.larg), *_joins(item.rarg)]


def _using_to_on(select: ast.SelectStmt, join: ast.JoinExpr) -> None:
    columns = [str(part.sval) for part in join.usingClause or ()]
    left, right = _side_name(join.larg), _side_name(join.rarg)
    merged_used = _unqualified_uses(select, set(columns))
    if left is None or right is None or join.join_using_alias is not None or merged_used:
        raise _refuse(
            "this JOIN ... USING",
            "dpproxy rewrites USING (col) to ON left.col = right.col; that needs both sides named "
            "(a table or an alias), no alias for the join, no SELECT * and every use of col qualified.",
        )
    terms = [
        _op("=", _column(left, column), _column(right, column)) for column in columns
    ]
    join.quals = terms[0] if len(terms) == 1 else _bool(BoolExprType.AND_EXPR, *terms)
    join.usingClause = None


def _side_name(side: Any) -> str | None:
    if isinstance(side, ast.RangeVar):
        return str(side.alias.aliasname) if side.alias else str(side.relname)
    alias = getattr(side, "alias", None)
    return str(alias.aliasname) if alias is not None else None


def _items(value: Any) -> tuple[Any, ...]:
    """An A_Expr's list operand (IN, BETWEEN) as a tuple."""
    return tuple(value) if isinstance(value, tuple) else (value,)


def _column(table: str, column: str) -> ast.ColumnRef:
    return ast.ColumnRef(fields=(ast.String(sval=table), ast.String(sval=column)), location=-1)


def _unqualified_uses(select: ast.SelectStmt, columns: set[str]) -> bool:
    """True if ``select`` has ``SELECT *`` or names one of ``columns`` without a table (anywhere)."""
    for target in select.targetList or ():
        value = getattr(target, "val", None)
        fields = value.fields or () if isinstance(value, ast.ColumnRef) else ()
        if len(fields) == 1 and isinstance(fields[0], ast.A_Star):
            return True
    found = False

    def visit(node: Any) -> None:
        nonlocal found
        if isinstance(node, tuple):
            for item in node:
                visit(item)
        elif isinstance(node, ast.Node):
            if isinstance(node, ast.ColumnRef) and len(node.fields or ()) == 1:
                field = (node.fields or ())[0]
                found |= isinstance(field, ast.String) and field.sval in columns
            for attr in node:
                visit(getattr(node, attr))

    visit(select)
    return found


_HANDLERS: dict[type, Callable[[Any], Any]] = {
    ast.FuncCall: _func_call,
    ast.TypeName: _type_name,
    ast.CollateClause: _collate,
    ast.SubLink: _sublink,
    ast.RangeTableSample: _table_sample,
    ast.CaseExpr: _case,
    ast.SortBy: _sort_by,
    ast.A_Expr: _a_expr,
    ast.SelectStmt: _select,
}
