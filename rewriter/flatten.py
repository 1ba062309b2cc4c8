"""Flatten subquery wrappers that only project and filter into one SELECT on the base table.

BI tools and ORMs wrap a table in derived tables: Superset's virtual dataset
``SELECT COUNT(*) FROM (SELECT * FROM people WHERE age > 30) AS virtual_table``, SQLAlchemy's
``Query.count()`` ``SELECT count(*) FROM (SELECT people.id AS people_id ... FROM people WHERE ...)
AS anon_1``, Power BI's ``FROM (SELECT "age" FROM "public"."people" "$Table") "_"``. Such a
wrapper selects plain columns (or ``*``) of the level below under new names and filters them,
so the statement releases exactly what one aggregate over the base table with every level's
WHERE ANDed releases. The outer level's column names are mapped through the projections to
the base table's columns; every WHERE is then validated like any other (:mod:`rewriter.predicates`).

A wrapper may also select a grouping key expression, ``date_trunc(unit, col)``,
``width_bucket(col, ...)`` or ``EXTRACT(YEAR FROM col)``, maybe cast (Metabase's ``SELECT "source"."d" AS "d", count(*) FROM
(SELECT date_trunc('month', "public"."t"."d") AS "d" FROM "public"."t") AS "source" GROUP BY
"source"."d"``): a reference to it above is replaced by the expression, which is then judged
where it is used, exactly as if written there (a declared GROUP BY key, or refused).

A wrapper level that does anything else (LIMIT/OFFSET, DISTINCT, GROUP BY, aggregates,
window functions, other computed projections such as ``age + 1 AS a``, joins) is refused: each
could change which rows are aggregated in a way the plan does not model. An inner ORDER BY
without LIMIT does not change the set of rows and is dropped. So is refused a column list after
the table's or a wrapper's alias (``AS t(a, b)``): it renames columns by position, which the
names here are not mapped by.
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from policies.errors import Refusal

from .group_keys import key_over_columns
from .identifiers import identifier
from .post_process import default_name
from .scope import Scope

__all__ = ["flatten"]

_WRAPPER_CLAUSES = frozenset({"expressions", "from_", "where", "order", "kind"})
_WRAPPER_HINT = (
    "A subquery on a protected table may only select its plain columns (or *), renamed or not, "
    "and filter them with WHERE, e.g. SELECT COUNT(*) FROM (SELECT * FROM {table} WHERE age > 30) AS t. "
    "Computed columns (age + 1 AS a), LIMIT, DISTINCT, GROUP BY and aggregates inside it are not "
    "supported yet."
)


def flatten(tree: exp.Select, scope: Scope) -> tuple[exp.Select, Scope]:
    """``tree`` with every wrapper in its FROM folded in; the scope of the base table it reads.

    Returns ``tree`` itself when its FROM is not a subquery. The result's columns outside
    the base table's own level are unqualified names of base-table columns.
    """
    source = tree.args.get("from_")
    alias = source.this.args.get("alias") if source is not None else None
    if isinstance(alias, exp.TableAlias) and alias.args.get("columns"):
        raise _refuse(scope, f"a column list after an alias ({alias.sql(dialect='postgres')}) is not allowed on "
                             "protected table")
    if source is None or not isinstance(source.this, exp.Subquery) or tree.args.get("joins"):
        return tree, scope
    subquery = source.this
    inner = subquery.this
    if not isinstance(inner, exp.Select):
        raise _refuse(scope, "only a SELECT of plain columns may wrap protected table")
    for key, value in inner.args.items():
        if value and key not in _WRAPPER_CLAUSES:
            raise _refuse(scope, f"the {key.upper().rstrip('_')} clause inside a subquery is not allowed on protected table")
    inner, inner_scope = flatten(inner, scope)
    base = inner.args.get("from_")
    if base is None or not isinstance(base.this, exp.Table):
        raise _refuse(scope, "only a SELECT of plain columns may wrap protected table")
    alias = base.this.args.get("alias")
    if alias is not None:
        inner_scope = replace(inner_scope, qualifiers=frozenset({identifier(alias)}))
    names, ambiguous = _projection(inner, inner_scope)
    outer_alias = subquery.args.get("alias")
    qualifiers = frozenset({identifier(outer_alias)}) if outer_alias is not None else frozenset()
    tree = _grouped_by_outputs(tree.copy(), names)
    tree.set("from_", None)
    outputs = {default_name(item) for item in tree.expressions}
    for column in list(tree.find_all(exp.Column)):
        if isinstance(column.this, exp.Star) or _output_name(column, outputs, names):
            continue
        mapped = _mapped(column, names, ambiguous, qualifiers, scope)
        if column.parent is tree and column.arg_key == "expressions":
            # An output column keeps its name: a level above may refer to it (a middle wrapper's
            # "SELECT x FROM (SELECT age AS x ...)" still makes x visible, not age).
            column.replace(exp.alias_(mapped, exp.to_identifier(identifier(column.this), quoted=True)))
        else:
            column.replace(mapped)
    where = tree.args.get("where")
    inner_where = inner.args.get("where")
    if inner_where is not None:
        condition = inner_where.this if where is None else exp.and_(exp.paren(inner_where.this), exp.paren(where.this))
        tree.set("where", exp.Where(this=condition))
    tree.set("from_", base.copy())
    return tree, inner_scope


def _grouped_by_outputs(tree: exp.Select, names: dict[str, exp.Expression]) -> exp.Select:
    """``tree`` with each bare GROUP BY name that the level below does not make visible but an
    output is named (``SELECT t AS k ... FROM (SELECT * FROM people) AS v GROUP BY k``) as that
    output's expression, as PostgreSQL reads it (an input column's name first, then an output's):
    mapped to the base table with the rest, it is never read as a base-table column of that name."""
    group = tree.args.get("group")
    if group is None:
        return tree
    aliased = {identifier(item.args["alias"]): item.this for item in tree.expressions if isinstance(item, exp.Alias)}
    for item in group.expressions:
        if isinstance(item, exp.Column) and not item.table and identifier(item.this) not in names \
                and identifier(item.this) in aliased:
            item.replace(aliased[identifier(item.this)].copy())
    return tree


def _output_name(column: exp.Column, outputs: set[str], names: dict[str, exp.Expression]) -> bool:
    """Whether ``column`` is an unqualified ORDER BY name left as it is: an output column's, which
    PostgreSQL resolves before input columns, or none the wrapper makes visible.

    A qualified one (Metabase's ``ORDER BY "source"."sex"``) names the wrapper's column.
    """
    if column.find_ancestor(exp.Order) is None or column.table:
        return False
    name = identifier(column.this)
    return name in outputs or name not in names


def _projection(inner: exp.Select, scope: Scope) -> tuple[dict[str, exp.Expression], frozenset[str]]:
    """The names a wrapper level makes visible, each mapped to what it stands for on the base
    table: a column (unqualified), or a grouping key expression over columns (:func:`_key_projection`);
    and those it makes visible twice (``SELECT *, age``), which PostgreSQL finds ambiguous."""
    names: dict[str, exp.Expression] = {}
    ambiguous: set[str] = set()

    def visible(name: str, meaning: exp.Expression) -> None:
        if name in names:
            ambiguous.add(name)
        names[name] = meaning

    for item in inner.expressions:
        alias = None
        if isinstance(item, exp.Alias):
            alias = identifier(item.args["alias"])
            item = item.this
        if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
            qualifier = item.args.get("table") if isinstance(item, exp.Column) else None
            if qualifier is not None and identifier(qualifier) not in scope.qualifiers:
                raise scope.refuse(f"{item.sql('postgres')} does not belong to protected table", "column-reference")
            for name in scope.table.columns:
                visible(name, _base_column(name))
            continue
        if isinstance(item, exp.Column):
            column = scope.column(item)
            visible(alias or column.name, _base_column(column.name))
            continue
        if not _key_projection(item):
            raise _refuse(scope, "computed columns inside a subquery are not allowed on protected table")
        visible(alias or default_name(item), _on_base_columns(item, scope))
    return names, frozenset(ambiguous)


def _key_projection(item: exp.Expression) -> bool:
    """Whether a computed wrapper column is written as a grouping key: ``date_trunc(unit, col)``
    (``col`` maybe cast to a time type), ``width_bucket(col, lo, hi, n)``, the year's ``EXTRACT``,
    maybe cast (Metabase's ``"source"`` subquery selects its breakouts so, Tableau's Custom SQL
    its dates; :func:`rewriter.group_keys.key_over_columns`). Referring to it above is writing
    the expression there: what it may be used for (a GROUP BY key, or nothing) is decided
    there, on the expression, as for any other."""
    return key_over_columns(item)


def _on_base_columns(item: exp.Expression, scope: Scope) -> exp.Expression:
    """``item`` with each column reference as the unqualified base-table column it names."""
    item = item.copy()
    for column in list(item.find_all(exp.Column)):
        column.replace(_base_column(scope.column(column).name))
    return item


def _base_column(name: str) -> exp.Column:
    return exp.column(exp.to_identifier(name, quoted=True))


def _mapped(
    column: exp.Column, names: dict[str, exp.Expression], ambiguous: frozenset[str], qualifiers: frozenset[str],
    scope: Scope,
) -> exp.Expression:
    """An outer level's column reference as the base-table column it names (refused, as
    PostgreSQL refuses it, when the level below makes two columns of that name visible)."""
    if column.args.get("db") or column.args.get("catalog"):
        raise scope.refuse("schema-qualified column references are not allowed on protected table", "column-reference")
    qualifier = column.args.get("table")
    if qualifier is not None and identifier(qualifier) not in qualifiers:
        raise scope.refuse(f"column {column.sql('postgres')} does not belong to protected table", "column-reference")
    name = identifier(column.this)
    if name in ambiguous:
        raise Refusal("42702", f'column reference "{name}" is ambiguous',
                      f"The subquery or CTE makes two columns named {name} visible; give them different names.",
                      "ambiguous-column")
    base = names.get(name)
    if base is None:
        raise Refusal("42703", f'column "{name}" does not exist', "Columns: " + ", ".join(names), "undefined-column")
    return base.copy()


def _refuse(scope: Scope, message: str) -> Refusal:
    refusal = scope.refuse(message, "no-subquery")
    return Refusal(refusal.sqlstate, refusal.message, _WRAPPER_HINT.format(table=scope.table.display_name), "no-subquery")
