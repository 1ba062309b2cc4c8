"""Post-processing of one released aggregate row, as SQL that reads no relation.

``SELECT round(avg(income), 2) AS a, 'total' AS label FROM people WHERE ... HAVING count(*) > 0
ORDER BY 1 LIMIT 10`` is split into the release, the distinct aggregates it uses (answered and
charged exactly as the plain ``SELECT avg(income), count(*) FROM people WHERE ...``), and an
outer statement over the released values only::

    SELECT pg_catalog.round(r._dp1, 2) AS a, 'total' AS label
    FROM (VALUES ($1, $2)) AS r(_dp1, _dp2) WHERE r._dp2 OPERATOR(pg_catalog.>) 0 ORDER BY 1 LIMIT 10

run on the backend with the noised values as parameters typed as the aggregates are, so that
PostgreSQL's own semantics, types and output formats apply.

Why this releases nothing more (the post-processing theorem: Dwork & Roth, "The Algorithmic
Foundations of Differential Privacy", 2014, Prop. 2.1): the outer statement's result, its
errors (``integer out of range``) and its timing are functions of the released values and the
statement's text alone. That holds because, checked on PostgreSQL's own parse tree of the outer
text, it references no relation (no RangeVar) and no subquery (no SubLink); every function it
calls passes the allowlist of catalog passthrough, and every one the analyst wrote is a value
function (``rewriter.catalog.VALUE_FUNCTIONS``, checked by rewriter.classify on the whole
statement: none reads data, files, the catalog, sizes or statistics, sleeps or changes the
session); it casts to value types only, and no call lets a released value decide how long the
answer is (:func:`rewriter.function_check.check_value_expressions`); its names are
pinned to pg_catalog (:mod:`rewriter.qualify`); and it runs in the analyst's read-only session after the release. Client parameters in the
post-processing part are refused (a clear hint says to use literals): the outer statement has
parameters of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Callable

import sqlglot
from sqlglot import exp

from policies.errors import SQLSTATE, Refusal
from policies.sql_names import quote_identifier

from .catalog import SESSION_EFFECT_FUNCTIONS
from .certain_errors import fails_on_every_release
from .date_parts import date_part_shape
from .floor_bins import floor_shape
from .function_check import check_functions, check_value_expressions
from .group_keys import year_extract
from .identifiers import identifier
from .qualify import qualify
from .statements import split_statements

__all__ = ["PostProcess", "aggregate_nodes", "default_name", "outer_statement", "RELEASE_ALIAS"]

RELEASE_ALIAS = "dpproxy_release"


@dataclass(frozen=True)
class PostProcess:
    """The outer statement over the released row: ``$k`` is the k-th released aggregate.

    ``trial_sql`` is the same statement without its LIMIT and OFFSET and without each WHERE or
    HAVING conjunct that reads an aggregate (``_trial``), tried besides ``sql`` before the
    charge (proxy.dp.answer.trial_params): over NULL aggregates a filter on them (``HAVING
    count(*) > 0``) keeps no row, and an output that fails on a key or a MODE's label would then
    fail only after the charge, on the rows the noise lets through. A conjunct over the keys
    alone stays: it drops the same cells whatever is released.

    ``certain``: the statement fails on every release that leaves it a row
    (:func:`rewriter.certain_errors.fails_on_every_release`, from its text and the release's
    types alone), so ``sql`` is tried before the charge over one fixed release as well
    (proxy.dp.answer.witness_params): its error there is refused, uncharged.
    """

    sql: str
    trial_sql: str
    certain: bool = False


def default_name(item: exp.Expression) -> str:
    """The column name PostgreSQL gives an unaliased output expression (its FigureColname)."""
    if isinstance(item, exp.Alias):
        return item.alias_or_name
    if isinstance(item, exp.Column):
        return item.name
    if isinstance(item, (exp.WithinGroup, exp.Filter)):
        return default_name(item.this)
    if isinstance(item, exp.Cast):
        inner = default_name(item.this)
        return inner if inner != "?column?" else item.to.sql("postgres").lower()
    if isinstance(item, exp.Case):
        return "case"
    if isinstance(item, exp.Anonymous):
        return item.name.lower()
    if isinstance(item, exp.Func) and not isinstance(item, (exp.Binary, exp.Unary)):
        return item.sql_name().lower()
    return "?column?"


def outer_statement(
    tree: exp.Select,
    released: Callable[[exp.Expr], int],
    refuse: Callable[[str, str], Refusal],
    enclosing: Callable[[exp.Select], exp.Expression] | None = None,
    keys: int = 0,
    key_of: Callable[[exp.Expression], int | None] | None = None,
    function_names: frozenset[str] | None = None,
    names: Sequence[str | None] | None = None,
    top_names: Sequence[str | None] | None = None,
    ordinal: bool = False,
    cell_array: Callable[[int], str | None] | None = None,
    finite: Callable[[int], bool] | None = None,
    columns: frozenset[str] = frozenset(),
    key_collations: Sequence[tuple[str, str] | None] = (),
) -> PostProcess:
    """The outer statement of ``tree`` (one aggregate level over the base table).

    ``enclosing(select)`` puts the aggregate level's outer statement back into the queries
    that enclosed it (``SELECT MAX(n) FROM (<aggregate level>) AS t``), when there were any.

    ``released(node)`` gives the 1-based release column of an aggregate node. Column
    references outside aggregates read rows and are refused (``no-row-access``), except an
    ORDER BY name of an output column.

    With ``keys`` GROUP BY keys, the release has one row per cell: ``$1 … $keys`` are arrays
    of the cells' keys and the aggregates' arrays follow; ``key_of(node)`` gives the 1-based
    key a grouping expression (a column, ``date_trunc``, ``width_bucket``) stands for, or None.
    Any other column reference is a grouping error, as in PostgreSQL.

    ``names`` are PostgreSQL's names of the aggregate level's output columns, ``top_names``
    those of the outermost level's when it encloses the aggregate level
    (``rewriter.column_names``): each unaliased output column is given its name, since the
    outer statement is sqlglot's rendering, whose function names may differ from the
    analyst's (``date_trunc`` is rendered ``DATE_TRUNC`` but named ``timestamp_trunc`` by
    sqlglot; ``now()`` is rendered ``CURRENT_TIMESTAMP``).

    ``ordinal`` (a GROUP BY that ranks the series of another, ``rewriter.series_limit``): one
    more output column, last, the 1-based number of the cell each row comes from, read from
    one more array after the aggregates' (its cells' numbers in order).

    ``cell_array(k)``: the SQL type of the k-th released column when each cell's value is itself
    an array (``percentile_cont(ARRAY[…])`` per cell), else None. Such a column's cells come as
    an array of their texts, each cast back to the type (an array of arrays would be one
    two-dimensional array, which ``unnest`` flattens).

    ``finite(k)``: the k-th released column is a finite non-NULL number in every release (what
    :attr:`PostProcess.certain` is proved from); None: no column is taken to be one.

    ``columns``: the table's column names. Within an ORDER BY expression PostgreSQL reads a name
    as an input column's even where an output has it (``ORDER BY age + 0``, ``age`` the alias of
    ``count(*)``): one of ``columns`` is judged as any column there (a key, else 42803); a name no
    input column has is left for the outer statement to fail on, PostgreSQL's 42703 before the charge
    when an output column has it, and is PostgreSQL's 42703 here when none has it (``ORDER BY nosuch
    + 0``: PostgreSQL finds no such column before it judges the grouping). A series limit's ranking
    outputs, visible to the statement through its join, are among ``columns``.

    ``key_collations``: the k-th key's column's own collation (schema and name; None: the database's
    default), under which its released labels, a ``text[]`` of the default one, are compared and
    ordered (``HAVING s = 'b'`` on a case-insensitive column keeps its ``B``), as PostgreSQL compares the
    column's values. dpproxy's ``COLLATE`` on the key's ``unnest`` is the one the outer statement's
    qualification lets name a schema other than pg_catalog (:func:`rewriter.qualify.qualify`).
    """
    outer = tree.copy()
    for key in ("from_", "where", "joins", "group"):
        outer.set(key, None)
    outer.set("expressions", _named(outer.expressions, names))
    aliases = {item.alias for item in outer.expressions}
    having = outer.args.get("having")
    outer.set("having", None)
    if having is not None:
        outer.set("where", exp.Where(this=having.this))
    whole = enclosing(outer) if enclosing is not None else outer
    if top_names is not None and isinstance(whole, exp.Select):
        whole.set("expressions", _named(whole.expressions, top_names, every=False))
    if any(column.table == RELEASE_ALIAS for column in whole.find_all(exp.Column)):
        raise refuse(f"the name {RELEASE_ALIAS} is reserved on", "column-reference")
    order = outer.args.get("order")

    def output_name(column: exp.Column) -> bool:
        """A name in ORDER BY that an output column has and no input column does (see ``columns``),
        or an ORDER BY item that is an output column's name alone: left for PostgreSQL to resolve."""
        return (order is not None and column.find_ancestor(exp.Order) is order and not column.table
                and column.name in aliases and (bare_output_name(column) or identifier(column.this) not in columns))

    def bare_output_name(column: exp.Column) -> bool:
        """An ORDER BY item that is an output column's name alone, which PostgreSQL resolves to
        that column, in parentheses or not (its grammar keeps none: ``ORDER BY (s)`` is ``ORDER BY
        s``). Within an expression (``ORDER BY t COLLATE "C"``, ``lower(t)``) a name is an input
        column's, a key here: an output alias there is PostgreSQL's 42703."""
        item: exp.Expression = column
        while isinstance(item.parent, exp.Paren):
            item = item.parent
        return (order is not None and isinstance(item.parent, exp.Ordered) and item.parent.parent is order
                and not column.table and column.name in aliases)

    if key_of is not None:
        _replace_keys(outer, key_of, bare_output_name)
    _replace_aggregates(outer, released)
    # After the released aggregates are replaced by their columns: a parameter in one's FILTER
    # is the release's (bound and folded with the WHERE's), any other one is the outer
    # statement's, which runs with the release's arrays as its parameters.
    if whole.find(exp.Placeholder, exp.Parameter) is not None:
        raise refuse("parameters after the aggregates (HAVING, LIMIT, output expressions, outer queries) "
                     "are not supported on", "parameters")
    for column in list(outer.find_all(exp.Column)):
        if column.table == RELEASE_ALIAS or output_name(column):
            continue
        if columns and not column.table and identifier(column.this) not in columns:
            # PostgreSQL looks a name up before it judges its grouping (ORDER BY nosuch + 0 is 42703)
            raise Refusal("42703", f'column "{identifier(column.this)}" does not exist',
                          "Columns: " + ", ".join(sorted(columns)), "undefined-column")
        if key_of is not None:
            raise Refusal("42803", f'column "{column.name}" must appear in the GROUP BY clause or be used in an '
                          "aggregate function", "Output columns of a GROUP BY are its keys and aggregates.",
                          "no-row-access")
        if column.find_ancestor(exp.Order) is not None:
            raise refuse(f"ORDER BY column {column.name}, outside an aggregate, is not allowed on", "no-row-access")
        raise refuse("selecting column values is not allowed on", "no-row-access")
    count = max(released_count(outer), default=0)
    if ordinal:
        outer.append("expressions", exp.alias_(exp.column("_cell", table=RELEASE_ALIAS), "dpproxy_cell"))
    casts = [cell_array(k) if cell_array is not None and keys else None for k in range(1, count + 1)]
    outer.set("from_", _release_source(count, keys, ordinal, casts, key_collations))
    certain = (isinstance(whole, exp.Select) and finite is not None
               and fails_on_every_release(whole, RELEASE_ALIAS, finite, _keys_only))
    _rounds_as_written(whole)  # after the proof, which reads round as sqlglot's node
    own = frozenset(collation for collation in key_collations if collation is not None)
    return PostProcess(checked(whole.sql("postgres"), function_names, own),
                       checked(_trial(whole).sql("postgres"), function_names, own), certain)


def _rounds_as_written(whole: exp.Expression) -> None:
    """Write each ``round(x, n)`` of ``whole`` as the analyst did. sqlglot's PostgreSQL rendering casts
    an ``x`` it types double precision to numeric first (``round(avg(age)::float8, 2)`` became
    ``ROUND(CAST(CAST(... AS DOUBLE PRECISION) AS DECIMAL), 2)``), which answered what PostgreSQL, having
    no ``round(double precision, integer)``, fails (42883): as written, the outer statement fails so
    too, when it is tried before the charge."""
    for node in list(whole.find_all(exp.Round)):
        if node.args.get("decimals") is not None:
            node.replace(exp.Anonymous(this="round", expressions=[node.this, node.args["decimals"]]))


def _trial(whole: exp.Expression) -> exp.Expression:
    """``whole`` without what the noise decides of which rows it keeps: LIMIT and OFFSET, and each
    WHERE or HAVING conjunct that reads a released aggregate (over NULL aggregates it keeps no
    row). A conjunct over the cells' keys and constants alone stays: it drops the same cells
    whatever is released (``HAVING x > 0`` before ``100 / x``), as in PostgreSQL."""
    trial = whole.copy()
    for select in trial.find_all(exp.Select):
        for key in ("limit", "offset"):
            select.set(key, None)
        for key in ("where", "having"):
            clause = select.args.get(key)
            if clause is None:
                continue
            parts = clause.this.flatten() if isinstance(clause.this, exp.And) else [clause.this]
            kept = [part for part in parts if _keys_only(part, select)]
            select.set(key, type(clause)(this=exp.and_(*kept)) if kept else None)
    return trial


def _keys_only(condition: exp.Expr, select: exp.Select) -> bool:
    """Whether every column ``condition`` (of ``select``'s WHERE or HAVING) reads is a cell's key:
    ``_k<i>`` of the release, or an output column of a subquery in ``select``'s FROM that reads
    keys only (an enclosing query's ``WHERE x > 0``). Anything else, a released aggregate or a
    name not traced, counts as decided by the noise."""
    for column in condition.find_all(exp.Column):
        if column.table == RELEASE_ALIAS:
            if not column.name.startswith("_k"):
                return False
            continue
        source = select.args.get("from_")
        inner = source.this if source is not None and isinstance(source.this, exp.Subquery) else None
        if inner is None or select.args.get("joins") or not isinstance(inner.this, exp.Select) \
                or column.table not in ("", inner.alias):
            return False
        outputs = [item for item in inner.this.expressions if item.alias_or_name == column.name]
        if len(outputs) != 1 or not _keys_only(outputs[0], inner.this):
            return False
    return True


def _named(items: list[exp.Expression], names: Sequence[str | None] | None, *,
           every: bool = True) -> list[exp.Expression]:
    """``items`` aliased: by ``names`` (one per item; None for ``*``) when given, else by
    ``default_name`` (``every``) or not at all; an item with an alias, or a star, keeps its own."""
    if names is not None and len(names) != len(items):
        names = None
    named: list[exp.Expression] = []
    for i, item in enumerate(items):
        name = names[i] if names is not None else None
        star = isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star))
        if isinstance(item, exp.Alias) or star or (name is None and not every):
            named.append(item)
            continue
        alias = exp.alias_(item, exp.to_identifier(name or default_name(item), quoted=True))
        assert isinstance(alias, exp.Expression)
        named.append(alias)
    return named


def _release_source(count: int, keys: int, ordinal: bool = False, casts: Sequence[str | None] = (),
                    collations: Sequence[tuple[str, str] | None] = ()) -> exp.Expression:
    """``FROM`` the released values: one row of ``$1 … $count``, or one row per cell when grouped
    (``$1 … $keys`` the cells' keys, each under its collation in ``collations`` if it has one, then
    the aggregates, each an array in cell order, then with ``ordinal`` the cells' numbers as
    ``_cell``; an aggregate with a type in ``casts`` is an array of texts, each cast to it)."""
    if not keys:
        values = ", ".join(f"${i}" for i in range(1, count + 1))
        columns = ", ".join(f"_dp{i}" for i in range(1, count + 1))
        sql = f"SELECT 1 FROM (VALUES ({values})) AS {RELEASE_ALIAS}({columns})"
    else:
        under = [*collations, *[None] * keys]
        arrays = [f"pg_catalog.unnest(${i}){_collate(under[i - 1])} AS _k{i}" for i in range(1, keys + 1)]
        cells = [f"pg_catalog.unnest(${keys + i})" for i in range(1, count + 1)]
        arrays += [f"CAST({cell} AS {cast}) AS _dp{i}" if cast else f"{cell} AS _dp{i}"
                   for i, (cell, cast) in enumerate(zip(cells, [*casts, *[None] * count]), 1)]
        arrays += [f"pg_catalog.unnest(${keys + count + 1}) AS _cell"] if ordinal else []
        sql = f"SELECT 1 FROM (SELECT {', '.join(arrays)}) AS {RELEASE_ALIAS}"
    source = sqlglot.parse_one(sql, read="postgres").args["from_"]
    assert isinstance(source, exp.Expression)
    return source


def _collate(collation: tuple[str, str] | None) -> str:
    """`` COLLATE schema.name`` of ``collation``, quoted as written in the catalog; nothing for None."""
    return f" COLLATE {quote_identifier(collation[0])}.{quote_identifier(collation[1])}" if collation else ""


def _replace_keys(
    node: exp.Expression, key_of: Callable[[exp.Expression], int | None], output_name: Callable[[exp.Column], bool]
) -> None:
    """Replace each grouping expression outside aggregates by its key column, outermost first."""
    for child in list(node.iter_expressions()):
        if isinstance(child, (exp.AggFunc, exp.WithinGroup, exp.Filter)):
            continue
        if isinstance(child, exp.Column) and output_name(child):
            continue
        if date_part_shape(child) is not None and not isinstance(child, exp.Column):
            index = key_of(child)
            if index is not None:  # a date key computed from its cell's representative time (rewriter.key_domain)
                for column in list(child.find_all(exp.Column)):
                    column.replace(exp.column(f"_k{index}", table=RELEASE_ALIAS))
                continue
        shape = floor_shape(child)
        if shape is not None:
            index = key_of(child)
            if index is not None:  # a numeric bin: its index released, ``* W + A`` computed here from it
                shape.floor.replace(exp.column(f"_k{index}", table=RELEASE_ALIAS))
                continue
        if isinstance(child, exp.Extract) and year_extract(child):
            index = key_of(child)
            if index is not None:  # EXTRACT(YEAR FROM col): the year of its bucket's start
                child.set("expression", exp.column(f"_k{index}", table=RELEASE_ALIAS))
                continue
        # A cast or TRUNC of a key is post-processing of it: the key is what it casts or truncates.
        index = (key_of(child) if isinstance(child, (exp.Column, exp.Func, exp.Mul))
                 and not isinstance(child, (exp.Cast, exp.Trunc)) else None)
        if index is not None:
            child.replace(exp.column(f"_k{index}", table=RELEASE_ALIAS))
        else:
            _replace_keys(child, key_of, output_name)


def aggregate_nodes(node: exp.Expression) -> list[exp.Expression]:
    """The aggregate calls in ``node`` (itself included) as each is released: the outermost ones,
    ``agg(...) FILTER (WHERE p)`` whole, MODE's WITHIN GROUP whole."""
    found: list[exp.Expression] = []
    for call in list(node.find_all(exp.AggFunc, exp.WithinGroup)):
        if isinstance(call, exp.AggFunc) and isinstance(call.parent, exp.WithinGroup):
            continue
        if call.find_ancestor(exp.AggFunc, exp.WithinGroup) is not None:
            continue
        enclosing_filter = call.find_ancestor(exp.Filter)
        if enclosing_filter is not None and enclosing_filter.this is not call:
            continue  # inside a FILTER's condition, which the release refuses
        chosen = call.parent if isinstance(call.parent, exp.Filter) else call
        assert isinstance(chosen, exp.Expression)
        found.append(chosen)
    return found


def _replace_aggregates(outer: exp.Select, released: Callable[[exp.Expr], int]) -> None:
    for node in aggregate_nodes(outer):
        index = released(node)
        node.replace(exp.column(f"_dp{index}", table=RELEASE_ALIAS))


def released_count(outer: exp.Select) -> list[int]:
    """The release columns ``outer`` names (``_dp<k>``)."""
    return [int(c.name[3:]) for c in outer.find_all(exp.Column) if c.table == RELEASE_ALIAS and c.name.startswith("_dp")]


def checked(sql: str, function_names: frozenset[str] | None = None,
            collations: frozenset[tuple[str, str]] = frozenset()) -> str:
    """``sql`` pinned to pg_catalog, after checking it reads no relation and calls allowed functions
    only (``function_names``: the backend's, for attribute-notation calls; rewriter.function_check);
    ``collations``: the keys' own, which dpproxy's ``COLLATE`` on a key's ``unnest`` may name."""
    (statement,) = split_statements(sql)
    kinds = statement.references.node_kinds
    if statement.references.relations or kinds & {"RangeVar", "SubLink", "RangeFunction", "JoinExpr"}:
        raise Refusal(SQLSTATE.DP_QUERY_SHAPE, "post-processing may not read a relation (rule: no-subquery)",
                      "Expressions over the aggregates may use constants and functions only.", "no-subquery")
    effects = {name.removeprefix("pg_catalog.") for name in statement.references.functions} & SESSION_EFFECT_FUNCTIONS
    if effects:
        # set_config() would move search_path behind the executor's back (its relation cache
        # is keyed by what may move it), and a pure function of the released row has no effects.
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"function {sorted(effects)[0]}() changes the session; it is not allowed over a DP answer "
            "(rule: function-allowlist)",
            "Expressions over the aggregates must be pure: run set_config() as a statement of its own.",
            "function-allowlist",
        )
    check_functions(statement, function_names)
    check_value_expressions(statement)
    return qualify(sql, collations=collations)



