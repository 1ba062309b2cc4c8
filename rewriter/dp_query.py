"""Validate a SELECT on a protected table and turn it into an ``AggregateQuery`` plan.

Accepted shape (docs/query-shapes.md):
``SELECT agg [AS alias] [, ...] FROM <protected table> [AS t] [WHERE <safe predicate>]
[ORDER BY ...] [LIMIT n]`` where ``agg`` is COUNT(*), COUNT(col), SUM(col), AVG(col),
MIN(col), MAX(col), MODE() WITHIN GROUP (ORDER BY col) or PERCENTILE_CONT/PERCENTILE_DISC(p)
WITHIN GROUP (ORDER BY col), each maybe restricted by a safe
predicate (``FILTER (WHERE p)`` or a CASE form that means it, :mod:`rewriter.conditional`). Everything else is refused with
the rule it breaks. The plan, not the client's text, is what later reaches the backend.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import cached_property
from typing import Callable, Literal

from sqlglot import exp
from sqlglot.errors import ParseError

from policies.errors import SQLSTATE, Refusal
from policies.tables import ColumnInfo, Relation

from .column_names import output_names
from .conditional import unconditional
from .constants import Folding
from .date_hints import date_shape_advice
from .flatten import flatten
from .group_keys import TIME_TYPES, GroupKey, KeyRange, column_key_count, group_by_hint, group_key, key_form, key_ranges
from .ctes import inline_ctes
from .identifiers import identifier
from .key_domain import KeyDomain, key_domain
from .percentiles import FractionParameter, decimal_text, is_percentile, percentile_call
from .post_process import PostProcess, aggregate_nodes, outer_statement
from .shares import counted_shares
from .predicates import PredicateRenderer
from .listed_parameters import ListedParameters
from .raw_equality import ParameterList
from .scope import Scope
from .single_reads import SingleRead, categories, distinct_read, hash_read, key_read, mode_read
from .sqlglot_parse import VARIANCE_FUNCTIONS, parse_postgres
from .statements import split_statements
from .text_bounds import work_refusal
from .types import (ARRAY_TYPES, FINITE_NUMBER_TYPES, FLOAT4, FLOAT8, INT2, INT4, INT8, INTEGER_TYPES, MAX_ABS_BOUND,
                    MAX_ABS_VARIANCE_BOUND, NUMBER_ARRAY_NAMES, NUMERIC, NUMERIC_TYPES, SESSION_PRINTED_TYPES,
                    aggregate_result_type)

__all__ = ["Aggregate", "AggregateQuery", "SeriesLimit", "asks_for_no_row", "plan_aggregate_query", "too_many_cells"]

AggregateKind = Literal["count", "sum", "avg", "min", "max", "mode", "percentile_cont", "percentile_disc",
                        "var_pop", "var_samp", "stddev_pop", "stddev_samp"]
PERCENTILES = frozenset({"percentile_cont", "percentile_disc"})
# STDDEV is STDDEV_SAMP and VARIANCE is VAR_SAMP in PostgreSQL: one kind (one release) each.
VARIANCES = frozenset({"var_pop", "var_samp", "stddev_pop", "stddev_samp"})

_SIMPLE_AGGREGATES: dict[type[exp.Expression], AggregateKind] = {
    exp.Count: "count",
    exp.Sum: "sum",
    exp.Avg: "avg",
    exp.Min: "min",
    exp.Max: "max",
    exp.Stddev: "stddev_samp",
    exp.StddevSamp: "stddev_samp",
    exp.StddevPop: "stddev_pop",
    exp.Variance: "var_samp",  # sqlglot reads variance() and var_samp() alike
    exp.VariancePop: "var_pop",
}
Mechanism = Literal["laplace", "sample_aggregate", "sum_count", "exponential", "quantile", "moments"]



@dataclass(frozen=True)
class Aggregate:
    """One output column: an aggregate over a column (``column`` None for COUNT(*)).

    ``mechanism`` is how the column is released (docs/mechanisms.md): ``laplace`` for COUNT and SUM,
    ``sample_aggregate`` for MIN, MAX and AVG where the column or table says ``avg:
    sample_aggregate``, ``sum_count`` for AVG otherwise (the default), ``exponential`` for MODE,
    ``quantile`` for PERCENTILE_CONT/PERCENTILE_DISC (the exponential mechanism over the column's
    grid, ``fraction`` its p, DESC applied), ``moments`` for VAR_POP/VAR_SAMP/STDDEV_POP/STDDEV_SAMP
    (noisy count, centred sum and centred sum of squares).
    """

    kind: AggregateKind
    column: ColumnInfo | None
    output_name: str
    result_type_oid: int
    mechanism: Mechanism = "laplace"
    distinct: bool = False  # COUNT(DISTINCT column): Δ = 1 as for COUNT
    # FILTER (WHERE p) (rewriter.conditional): the aggregate is over the rows where p holds, p
    # rendered in WHERE's safe language (a template of the plan's folding until it is bound),
    # and the columns p reads.
    filter_sql: str | None = None
    filter_columns: tuple[str, ...] = ()
    # Fraction digits the statement's constants give a numeric result (``SUM(CASE WHEN p THEN
    # col ELSE 0.0 END)``: 1), which the printed value has at least; None when they give none.
    scale: int | None = None
    fraction: Fraction | None = None
    # A percentile whose fraction is a bound parameter: ``fraction`` is None until the
    # statement's values are read (proxy.dp.percentile_params), then set, and this dropped.
    fraction_parameter: FractionParameter | None = None
    # The array form (``percentile_cont(ARRAY[0.25, 0.5, 0.75])``): its fractions in order, DESC
    # applied, ``fraction`` None; released as one array at ε/k of the column's share each.
    fractions: tuple[Fraction, ...] = ()

    @property
    def finite_number(self) -> bool:
        """Whether every release of this aggregate is one finite non-NULL number
        (``rewriter.certain_errors`` reasons from it): a number column's (``FINITE_NUMBER_TYPES``),
        but not a MODE's (a declared label, which may be NaN) nor an array of percentiles."""
        return self.kind != "mode" and not self.fractions and self.result_type_oid in FINITE_NUMBER_TYPES


@dataclass(frozen=True)
class AggregateQuery:
    """A validated DP query: what to compute, on which table, under which filter.

    With ``folding``, ``where_sql`` still holds row-independent expressions: it may be
    described, but runs only after :func:`proxy.dp.folding.bind_constants` has folded them.
    """

    table: Relation
    aggregates: tuple[Aggregate, ...]
    where_sql: str | None
    limit_zero: bool
    folding: Folding | None = None
    # When the statement asks for more than the released row (expressions over aggregates,
    # HAVING, constants, GROUP BY): the outer statement over the released values. Then
    # ``aggregates`` are the distinct aggregates released, each named by its SQL.
    post: PostProcess | None = None
    # GROUP BY over declared keys (rewriter/group_keys.py): the release is one row per cell
    # of their domains' product, each aggregate noised per cell; empty for one aggregate row.
    groups: tuple[GroupKey, ...] = ()
    # WHERE conjuncts bounding a time key's column: its buckets outside them are left out
    # once the values are known (proxy/dp/narrowing.py), before the charge.
    ranges: tuple[KeyRange, ...] = ()
    # A GROUP BY joined to a subquery that ranks its series (rewriter/series_limit.py): its
    # cells are kept where the ranking keeps theirs.
    series: SeriesLimit | None = None
    # The values and comparisons of its WHERE and FILTERs (rewriter/predicate_terms.py), and the
    # UTF-8 bytes of their literal ILIKE patterns (rewriter/like_patterns.py), for a statement of
    # two plans to count both.
    terms: int = field(default=0, compare=False)
    ilike_bytes: int = field(default=0, compare=False)
    # What those conditions and its single reads weigh by their reads of text values
    # (rewriter/text_bounds.py), likewise, and the single reads (rewriter/single_reads.py), to name them.
    text_work: int = field(default=0, compare=False)
    single_reads: tuple[SingleRead, ...] = field(default=(), compare=False)
    # NOTICEs on literals not among a column's declared categories (rewriter/category_notes.py): from
    # the statement and the policy alone, sent before the answer's own; they change nothing else.
    notes: tuple[str, ...] = field(default=(), compare=False)
    # The raw conjuncts over lists of parameters in where_sql (rewriter/raw_equality.py), each left
    # out when the statement is bound with types it does not hold for (proxy/dp/parameter_types.py).
    parameter_lists: tuple[ParameterList, ...] = ()
    # The parameters its conditions cast to numeric beside a numeric column (rewriter/predicates.py),
    # each with the column's declared precision (None: none), whose declared types and values are
    # checked when they are bound (proxy/dp/parameter_types.py).
    numeric_parameters: tuple[tuple[int, int | None], ...] = ()
    # Its IN lists holding parameters (rewriter/listed_parameters.py), likewise.
    listed_parameters: tuple[ListedParameters, ...] = ()

    @property
    def predicates(self) -> tuple[str, ...]:
        """Every predicate the backend evaluates per row: the WHERE and the aggregates' FILTERs."""
        filters = tuple(agg.filter_sql for agg in self.aggregates if agg.filter_sql is not None)
        return ((self.where_sql,) if self.where_sql is not None else ()) + filters

    @property
    def keys_only(self) -> bool:
        """A GROUP BY that asks for no aggregate: its answer is the declared keys, from the policy alone."""
        return bool(self.groups) and not self.aggregates

    @cached_property
    def domain(self) -> KeyDomain:
        """The release's cells (:mod:`rewriter.key_domain`), worked out once per plan: the cell
        count, the backend rows' cells and the labels all read it."""
        return key_domain(self.groups, self.table.policy.max_cells)

    @property
    def cells(self) -> int:
        """How many cells the release has: the product of the keys' domains, date keys over one
        column taken together (1 without GROUP BY)."""
        return self.domain.size if self.groups else 1


@dataclass(frozen=True)
class SeriesLimit:
    """The series a GROUP BY keeps: those another GROUP BY over the same table, ``ranking``,
    keeps after its post-processing (Superset's *Series limit*; rewriter/series_limit.py).

    ``ranking``'s outer statement returns, last, the number of each cell it keeps. ``pairs``
    match each key of ``ranking`` (second) with the restricted plan's key (first) it is joined
    to; every key of ``ranking`` is in one pair.
    """

    ranking: AggregateQuery
    pairs: tuple[tuple[int, int], ...]


def plan_aggregate_query(
    sql: str, table: Relation, function_names: frozenset[str] | None = None, ranking: bool = False,
    joined: frozenset[str] = frozenset(),
) -> AggregateQuery:
    """Validate ``sql`` (one SELECT that references ``table`` and nothing else) into a plan.

    ``function_names``: every function name of the backend, for the outer statement's check
    of attribute-notation calls (``rewriter.function_check``). ``ranking``: the statement ranks
    the series of another (:class:`SeriesLimit`): it must be a GROUP BY, and its outer statement
    also returns each kept row's cell number. ``joined``: the names a subquery joined to the table
    makes visible (:attr:`Scope.joined`)."""
    scope = Scope(table, frozenset({table.name}), function_names, joined)
    try:
        tree = parse_postgres(sql)
    except ParseError as exc:
        raise scope.refuse("cannot analyse this query on protected table", "unparsed") from exc
    if not isinstance(tree, exp.Select):
        raise scope.refuse(*_set_operation_refusal(tree))
    _check_variance_arguments(tree, scope)
    inlined = inline_ctes(tree, scope)
    if inlined is not tree:  # PostgreSQL's output names are read from the text (_names): the inlined one
        tree, sql = inlined, inlined.sql(dialect="postgres")
    tree, enclosing, depth = _release_level(tree)
    names = (_names(sql, depth), _names(sql, 0) if enclosing is not None else None)
    tree, scope = flatten(tree, scope)
    distinct = _distinct_as_grouping(tree)
    scope = _check_clauses(tree, scope)
    try:
        groups = _grouping(tree, scope)
    except Refusal as refusal:
        if distinct and refusal.rule == "no-group-by":
            raise Refusal(
                refusal.sqlstate,
                f"SELECT DISTINCT {', '.join(item.sql('postgres') for item in tree.args['group'].expressions)} is not "
                f"allowed on protected table {scope.table.display_name} (rule: no-distinct)",
                "SELECT DISTINCT is answered only over declared GROUP BY keys, with every declared key whatever the "
                "rows hold. " + group_by_hint(scope),
                "no-distinct",
            ) from None
        raise
    post = None
    if ranking and (enclosing is not None or not groups):
        raise scope.refuse("a subquery that ranks series must be a GROUP BY over declared keys of", "no-subquery")
    tree = counted_shares(tree, scope)
    conditions = PredicateRenderer(scope)
    if not groups:
        _check_one_row_order(tree, scope)
    if enclosing is None and not groups and _plain(tree) and not _mode_printed_by_the_session(tree, scope):
        aggregates = _named(tuple(_aggregate(item, scope, conditions) for item in tree.expressions), names[0])
    else:
        aggregates, post = _post_processed(tree, scope, conditions, enclosing, groups, names, ordinal=ranking)
    _check_combination(aggregates, groups, scope)
    where = tree.args.get("where")
    uses = Counter(node.sql("postgres") for node in tree.find_all(exp.Parameter))
    where_sql = conditions.where(where.this, uses) if where is not None else None
    folding = conditions.folding(where_sql, tuple(agg.filter_sql for agg in aggregates))
    if folding is not None:  # the plan holds the expressions in place (to describe); execution folds them
        where_sql = folding.inline if where_sql is not None else None
        aggregates = tuple(replace(agg, filter_sql=text) for agg, text in zip(aggregates, folding.inline_filters()))
    ranges = key_ranges(where.this if where is not None else None, groups, scope)
    reads = (*_single_reads(table, aggregates, groups), *conditions.raw_reads)
    text_work = conditions.text_work + sum(read.work for read in reads)
    refused = work_refusal(text_work, reads) if not table.policy.answer_quantum_ms else None
    if refused is not None:
        heavy = scope.refuse(f"{refused[0]} are refused on protected table", "safe-predicate")
        heavy.hint = refused[1]
        raise heavy
    plan = AggregateQuery(table, aggregates, where_sql, _no_rows(tree, scope, grouped=bool(groups)), folding=folding,
                          post=post, groups=groups, ranges=ranges, terms=conditions.terms,
                          ilike_bytes=conditions.ilike_bytes,
                          text_work=text_work, single_reads=reads, notes=conditions.notes,
                          parameter_lists=tuple(conditions.parameter_lists),
                          numeric_parameters=conditions.numeric_parameters,
                          listed_parameters=conditions.listed_parameters)
    if not ranges:  # no time bound can narrow a key: the cells are known now
        too_many = too_many_cells(plan)
        if too_many is not None:
            raise too_many
    return plan


def _single_reads(table: Relation, aggregates: tuple[Aggregate, ...], groups: tuple[GroupKey, ...]) -> tuple[SingleRead, ...]:
    """What of a statement's aggregates and keys reads each row's text value once a row, besides its
    conditions (rewriter/single_reads.py): each ``COUNT(DISTINCT)`` and MODE, each categorical key,
    and, where sample and aggregate partitions the rows by ``row_hash``, each hashed column."""
    policy = table.policy
    reads = [distinct_read(agg.column, policy) if agg.distinct else mode_read(agg.column, policy)
             for agg in aggregates if agg.column is not None and (agg.distinct or agg.kind == "mode")]
    reads += [key_read(key.column, policy) for key in groups if key.kind == "category"]
    if table.partition_key == "row" and any(agg.mechanism == "sample_aggregate" for agg in aggregates):
        reads += [hash_read(table.columns[name], policy) for name in table.hashed_columns]
    return tuple(read for read in reads if read is not None)


def _named(aggregates: tuple[Aggregate, ...], names: list[str | None] | None) -> tuple[Aggregate, ...]:
    """A one-row answer's variances named as PostgreSQL names them: one kind answers two
    spellings (``variance``/``var_samp``, ``stddev``/``stddev_samp``), and an unaliased call is
    named by the function as written (``names``: PostgreSQL's, ``rewriter.column_names``)."""
    if names is None or len(names) != len(aggregates):
        return aggregates
    return tuple(replace(agg, output_name=name) if agg.kind in VARIANCES and name else agg
                 for agg, name in zip(aggregates, names))


def _check_variance_arguments(tree: exp.Expression, scope: Scope) -> None:
    """Refuse a variance or standard deviation called with other than one argument (PostgreSQL
    has none of two, ``stddev(x, y)``), before anything else reads the statement."""
    for call in tree.find_all(exp.Anonymous):
        if call.name.upper() in VARIANCE_FUNCTIONS:
            raise Refusal(
                SQLSTATE.DP_QUERY_SHAPE,
                f"{call.name}() takes one column on protected table {scope.table.display_name}, not "
                f"{len(call.expressions)} arguments (rule: aggregate-argument)",
                f"Ask {call.name}(col) of one numeric column with bounds in the policy; for two columns, one call each.",
                "aggregate-argument",
            )


def too_many_cells(plan: AggregateQuery) -> Refusal | None:
    """The refusal (``max-cells``) of a GROUP BY with more cells than its table answers, or None.

    Counted after the WHERE's time bounds narrow the time keys (``proxy.dp.narrowing``): a
    Grafana panel of daily buckets by category over a week of a years-long declared range asks
    for a week's cells. The count depends on the statement and the policy only.
    """
    limit = plan.table.policy.max_cells
    if plan.cells <= limit:
        return None
    cells = f"more than {limit}" if plan.groups and plan.domain.exceeded else str(plan.cells)
    return Refusal(
        SQLSTATE.DP_QUERY_SHAPE,
        f"GROUP BY over {len(plan.groups)} keys has {cells} cells, more than the {limit} "
        f"protected table {plan.table.display_name} answers (rule: max-cells)",
        "Group by fewer keys or a coarser time unit, narrow the time range in the WHERE, or ask the policy's "
        "owner to raise max_cells.",
        "max-cells",
    )


def _is_aggregate(item: exp.Expression) -> bool:
    if isinstance(item, exp.Filter):
        item = item.this
    return isinstance(item, exp.AggFunc) or (isinstance(item, exp.WithinGroup) and isinstance(item.this, exp.Mode)) \
        or is_percentile(item)


def _plain(tree: exp.Select) -> bool:
    """Whether the statement is its released row as it is: only (aliased) aggregates, no HAVING,
    and an ORDER BY, if any, of aggregates only (over one row it orders nothing). Any other
    ORDER BY goes to post-processing, where PostgreSQL judges it as it would the statement
    (``ORDER BY 5`` is 42P10, ``ORDER BY 1/0`` 22012, both before the charge) and a column
    outside an aggregate is refused: dropped, it was answered where PostgreSQL fails."""
    if tree.args.get("having") is not None:
        return False
    order = tree.args.get("order")
    if order is not None and not all(_is_aggregate(key.this) for key in order.expressions):
        return False
    items = [item.this if isinstance(item, exp.Alias) else item for item in tree.expressions]
    return all(_is_aggregate(item) or item.find(exp.AggFunc) is None for item in items) and all(
        _is_aggregate(item) or isinstance(item, (exp.Column, exp.Star)) for item in items
    )


def _mode_printed_by_the_session(tree: exp.Select, scope: Scope) -> bool:
    """Whether the statement asks a MODE of a column whose values PostgreSQL prints by the session's
    settings (:data:`rewriter.types.SESSION_PRINTED_TYPES`: a date in its DateStyle). Its categories
    are printed at load, under the service's settings (``ColumnInfo.printed_labels``); such a MODE is
    answered through the outer statement (post-processing), where the released category is printed
    again in the session, as a GROUP BY's keys are (``SET DateStyle = 'SQL, DMY'``: ``01/05/2000``)."""
    for node in tree.find_all(exp.WithinGroup):
        if isinstance(node.this, exp.Mode):
            for column in node.expression.find_all(exp.Column):
                info = scope.table.columns.get(identifier(column.this)) if isinstance(column.this, exp.Identifier) else None
                if info is not None and info.value_type[0] in SESSION_PRINTED_TYPES:
                    return True
    return False


def _derived_levels(tree: exp.Select) -> list[exp.Select]:
    """``tree`` and the SELECTs nested in its FROM, each the only FROM item of the one above."""
    levels = [tree]
    while True:
        source = levels[-1].args.get("from_")
        if source is None or levels[-1].args.get("joins") or not isinstance(source.this, exp.Subquery):
            return levels
        if not isinstance(source.this.this, exp.Select):
            return levels
        levels.append(source.this.this)


def _names(sql: str, depth: int) -> list[str | None] | None:
    """PostgreSQL's names for the output columns of the SELECT ``depth`` FROM-levels down ``sql``."""
    try:
        (statement,) = split_statements(sql)
    except (Refusal, ValueError):  # pragma: no cover - the statement was split before it was planned
        return None
    return output_names(statement.node, depth)


def _release_level(tree: exp.Select) -> tuple[exp.Select, Callable[[exp.Select], exp.Expression] | None, int]:
    """The aggregate level of a query over one released row, and how to put it back.

    ``SELECT MAX(n) FROM (SELECT count(*) AS n FROM people WHERE ...) AS t``: the lowest level
    with aggregates of its own is the release (planned as the plain query it is, so the same
    repeat); the levels above it are post-processing and run over the released row. Returns
    ``tree`` and None when the outermost level is the aggregate level (or none is); and the
    aggregate level's depth in the chain of FROM subqueries.
    """
    levels = _derived_levels(tree)
    for depth in reversed(range(len(levels))):
        own = [*levels[depth].expressions, levels[depth].args.get("having")]
        if any(item is not None and item.find(exp.AggFunc) is not None for item in own):
            break
    else:
        return tree, None, 0
    if depth == 0:
        return tree, None, 0

    def enclosing(outer: exp.Select) -> exp.Expression:
        whole = tree.copy()
        _derived_levels(whole)[depth].replace(outer)
        return whole

    return levels[depth].copy(), enclosing, depth


def _post_processed(
    tree: exp.Select,
    scope: Scope,
    conditions: PredicateRenderer,
    enclosing: Callable[[exp.Select], exp.Expression] | None = None,
    groups: tuple[GroupKey, ...] = (),
    names: tuple[list[str | None] | None, list[str | None] | None] = (None, None),
    ordinal: bool = False,
) -> tuple[tuple[Aggregate, ...], PostProcess]:
    """The distinct aggregates the statement uses (the release) and its outer statement
    (``names``: PostgreSQL's names of the aggregate level's and the outermost level's output
    columns, ``rewriter.column_names``)."""
    if not groups and not any(item.find(exp.AggFunc) for item in tree.expressions):
        raise scope.refuse("non-aggregate output is not allowed on protected table", "no-row-access")
    released: list[Aggregate] = []
    index: dict[_ReleaseKey, int] = {}
    spelled: dict[str, int] = {}  # each aggregate as written: a repeat is that release, read once
    grouped = bool(groups)

    def release(node: exp.Expr) -> int:
        assert isinstance(node, exp.Expression)
        text = node.sql("postgres")
        if text in spelled:
            # Not rendered again: its FILTER's terms are evaluated once, in the one release
            # (``count(*) FILTER (WHERE b IN (…))`` repeated in HAVING is not twice the terms).
            return spelled[text]
        agg, written, key = _released_as(node, scope, conditions, grouped)
        if key not in index:
            name = _sql_name(agg) + (f" filter (where {written})" if written is not None else "")
            released.append(replace(agg, output_name=name))
            index[key] = len(released)
        spelled[text] = index[key]
        return index[key]

    identities = [key.identity for key in groups]

    def key_of(node: exp.Expression) -> int | None:
        try:
            identity = group_key(node, scope).identity
        except Refusal:
            return None
        return identities.index(identity) + 1 if identity in identities else None

    post = outer_statement(
        tree, release, lambda message, rule: scope.refuse(f"{message} protected table", rule), enclosing,
        keys=len(groups), key_of=key_of if groups else None, function_names=scope.function_names,
        names=names[0], top_names=names[1], ordinal=ordinal,
        cell_array=lambda k: NUMBER_ARRAY_NAMES[released[k - 1].result_type_oid] if released[k - 1].fractions else None,
        finite=lambda k: released[k - 1].finite_number, columns=frozenset(scope.table.columns) | scope.joined,
        key_collations=[key.column.collation if key.kind == "category" else None for key in groups],
    )
    return tuple(released), post


# What makes two uses of an aggregate one release: kind, column, mechanism, DISTINCT, result
# type, condition as written, scale.
_ReleaseKey = tuple[str, str | None, str, bool, int, str | None, int | None, Fraction | FractionParameter | None,
                    tuple[Fraction, ...]]


def _released_as(
    node: exp.Expression, scope: Scope, conditions: PredicateRenderer, grouped: bool = False
) -> tuple[Aggregate, str | None, _ReleaseKey]:
    """The aggregate ``node`` asks for (refused as :func:`_aggregate` refuses it), its condition
    as written, and the key under which uses of one release are answered by one column."""
    agg = _aggregate(node, scope, conditions, grouped)
    condition = unconditional(node, scope).condition if agg.filter_sql is not None else None
    # By the condition as written: a folded one's template differs at each use (its tokens).
    written = condition.sql("postgres") if condition is not None else None
    key = (agg.kind, agg.column.name if agg.column else None, agg.mechanism, agg.distinct, agg.result_type_oid,
           written, agg.scale, agg.fraction if agg.fraction_parameter is None else agg.fraction_parameter,
           agg.fractions)
    return agg, written, key


def _check_one_row_order(tree: exp.Select, scope: Scope) -> None:
    """Refuse a one-row answer's ORDER BY over an aggregate that nothing else in the statement
    asks for (``SELECT count(*) FROM t ORDER BY sum(x)``), before any charge.

    One row stays where it is whatever its ORDER BY: PostgreSQL computes the aggregate and
    orders nothing by it. dpproxy could compute it only by releasing it, with a share of the
    statement's ε taken from the columns asked for and spent on a value never shown; dropped
    unread, as it was, ``ORDER BY sum(nosuch)`` was answered where PostgreSQL fails. An
    aggregate the statement selects or filters on (HAVING) is released anyway: ordering by it,
    or by an expression of it, costs nothing more. Each aggregate is checked as a selected one
    would be first (an unknown column, SUM of a text column ... keep their own errors), and so
    is every column of the ORDER BY key (``ORDER BY nosuch + sum(x)`` is PostgreSQL's 42703).
    """
    order = tree.args.get("order")
    if order is None:
        return

    def key(node: exp.Expression) -> _ReleaseKey:
        # Rendered by a throwaway of its own: the plan's renders the release, and counts its terms
        # once (one shared here counted an aggregate repeated in ORDER BY twice).
        return _released_as(node, scope, PredicateRenderer(scope))[2]

    having = tree.args.get("having")
    asked = {key(node) for item in [*tree.expressions, *([having] if having is not None else [])]
             for node in aggregate_nodes(item)}
    for item in order.expressions:
        for node in aggregate_nodes(item):
            if key(node) not in asked:
                for column in order.find_all(exp.Column):
                    scope.column(column)  # PostgreSQL's 42703 first: ORDER BY nosuch + sum(x) is invalid SQL
                raise Refusal(
                    SQLSTATE.DP_QUERY_SHAPE,
                    f"ORDER BY {node.sql('postgres')} orders the one-row answer by an aggregate it does not select, "
                    f"on protected table {scope.table.display_name} (rule: order-by-unselected)",
                    "One row needs no order: drop the ORDER BY, or order by an output column (ORDER BY 1). "
                    "The aggregate would be released, and charged, only to be thrown away.",
                    "order-by-unselected",
                )


def _distinct_as_grouping(tree: exp.Select) -> bool:
    """Turn ``SELECT DISTINCT`` of plain output expressions into the GROUP BY of them; whether it did.

    With no aggregate, no GROUP BY and no HAVING, ``SELECT DISTINCT a, b`` is ``SELECT a, b
    GROUP BY a, b`` in PostgreSQL (Superset's column values: ``SELECT DISTINCT sex AS
    column_values FROM t``). Over declared keys that is answered as their cells' keys, from the
    policy alone; anything else is refused as the GROUP BY would be. DISTINCT ON, ``*`` and
    DISTINCT beside aggregates or of a constant are left for the clause check to refuse.
    """
    distinct = tree.args.get("distinct")
    if not isinstance(distinct, exp.Distinct) or distinct.args.get("on") is not None:
        return False
    if any(tree.args.get(key) is not None for key in ("group", "having")):
        return False
    items = [item.this if isinstance(item, exp.Alias) else item for item in tree.expressions]
    if any(item.find(exp.AggFunc, exp.Star, exp.WithinGroup) is not None or item.find(exp.Column) is None
           for item in items):
        return False  # a constant would be read as a GROUP BY position
    tree.set("distinct", None)
    tree.set("group", exp.Group(expressions=[item.copy() for item in items]))
    return True


def _grouping(tree: exp.Select, scope: Scope) -> tuple[GroupKey, ...]:
    """The declared keys of the statement's GROUP BY, in its order (none without GROUP BY).

    As in PostgreSQL, an item is an output position (``GROUP BY 1``), an input column, an
    output column's name when no input column has it, or an expression; each must be a key
    the policy opts in (:mod:`rewriter.group_keys`).
    """
    group = tree.args.get("group")
    if group is None:
        return ()
    if any(group.args.get(key) for key in ("grouping_sets", "cube", "rollup", "totals")) or group.find(
        exp.GroupingSets, exp.Cube, exp.Rollup
    ):
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"ROLLUP, CUBE and GROUPING SETS are not allowed on protected table {scope.table.display_name} "
            "(rule: no-group-by)",
            "Each row would count in several groups (its own and the totals): ask the totals as a query of "
            "their own. " + group_by_hint(scope),
            "no-group-by",
        )
    keys: list[GroupKey] = []
    for item in group.expressions:
        node = _group_item(item, tree, scope)
        if node.find(exp.AggFunc) is not None:
            raise Refusal("42803", "aggregate functions are not allowed in GROUP BY", group_by_hint(scope), "no-group-by")
        key = group_key(node, scope)
        if key.identity not in [known.identity for known in keys]:
            keys.append(key)
    return tuple(keys)  # their cells are counted once the WHERE's time bounds are known (too_many_cells)


def _group_item(item: exp.Expression, tree: exp.Select, scope: Scope) -> exp.Expression:
    """A GROUP BY item resolved as PostgreSQL resolves it: a position or an output name to its expression.
    Parentheses around it are PostgreSQL's grammar only (its parse tree has none): ``GROUP BY (1)`` is
    position 1, ``GROUP BY (a)`` the output named a."""
    while isinstance(item, exp.Paren):
        item = item.this
    outputs = tree.expressions
    if isinstance(item, exp.Literal) and not item.is_string:
        # Python refuses int() of more than 4,300 digits; no select list is that long anyway.
        position = int(item.this) if item.this.isdigit() and len(item.this) <= 9 else 0
        if not 1 <= position <= len(outputs):
            raise Refusal("42P10", f"GROUP BY position {item.this} is not in select list", group_by_hint(scope),
                          "no-group-by")
        chosen = outputs[position - 1]
        return chosen.this if isinstance(chosen, exp.Alias) else chosen
    if isinstance(item, exp.Column) and not item.table and identifier(item.this) not in scope.table.columns:
        name = identifier(item.this)
        for output in outputs:
            if isinstance(output, exp.Alias) and identifier(output.args["alias"]) == name:
                return output.this
    if not key_form(item):
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"GROUP BY {item.sql('postgres')} is not allowed on protected table {scope.table.display_name} "
            "(rule: no-group-by)",
            group_by_hint(scope, date_shape_advice(item)),
            "no-group-by",
        )
    return item


def _check_combination(aggregates: tuple[Aggregate, ...], groups: tuple[GroupKey, ...], scope: Scope) -> None:
    """Refuse COUNT(DISTINCT ...) where its groups would be added up (partitions, a date part's
    buckets), and percentiles where the backend cannot count their grid (:func:`_check_percentiles`).

    Per a category key with ``other`` it is answered: the backend groups the rows by their cell
    (:meth:`rewriter.group_keys.GroupKey.group_sql`: ``other`` is one group, whatever undeclared
    values its rows hold), so each cell's count is PostgreSQL's ``count(DISTINCT col)`` over the
    cell's rows, a value held by two undeclared categories counted once, sensitivity 1. (When the
    backend grouped by raw value and dpproxy added up ``other``'s groups, it was counted once a
    category, so it was refused.) A date part's cell still collects several buckets' groups."""
    _check_percentiles(aggregates, scope)
    if not any(agg.distinct for agg in aggregates):
        return
    if any(agg.mechanism == "sample_aggregate" for agg in aggregates):
        raise scope.refuse("COUNT(DISTINCT ...) with AVG, MIN or MAX by sample and aggregate in one query is not "
                           "allowed on protected table", "aggregate-combination")
    if any(key.part not in (None, "date") for key in groups):
        # A date part's cell collects several buckets (month of year: one per year), each of
        # which the backend counts distinct values in: their sum is not the cell's count.
        refusal = scope.refuse("COUNT(DISTINCT ...) per date part (month of year, day of week, a Sunday week, "
                               "a year of finer buckets) is not allowed on protected table", "aggregate-combination")
        raise Refusal(refusal.sqlstate, refusal.message,
                      "Group COUNT(DISTINCT ...) by DATE_TRUNC of a declared unit, or by CAST(col AS DATE), "
                      "whose cells are one time bucket each. " + scope.hint, refusal.rule)


def _check_percentiles(aggregates: tuple[Aggregate, ...], scope: Scope) -> None:
    """Refuse percentiles beside what their grid's grouping would break, before any charge.

    The backend counts a percentile's column per grid index by grouping the rows by it
    (``rewriter.rewrite``); every other part is added up over those groups. Sample and
    aggregate's per-partition values and COUNT(DISTINCT ...) cannot be added up that way, and
    percentiles of two columns would group by the product of their grids.
    """
    columns = {agg.column.name for agg in aggregates if agg.kind in PERCENTILES and agg.column is not None}
    if not columns:
        return
    if len(columns) > 1:
        refusal = scope.refuse("percentiles of more than one column in one query are not allowed on protected table",
                               "aggregate-combination")
        raise Refusal(refusal.sqlstate, refusal.message,
                      "Ask each column's percentiles in a query of its own (several fractions of one column may share "
                      "one query). " + scope.hint, refusal.rule)
    if any(agg.distinct or agg.mechanism == "sample_aggregate" for agg in aggregates):
        raise scope.refuse("a percentile beside COUNT(DISTINCT ...) or AVG, MIN or MAX by sample and aggregate in one "
                           "query is not allowed on protected table", "aggregate-combination")


def _sql_name(agg: Aggregate) -> str:
    """How a released aggregate is named in the notice: its SQL, e.g. ``sum(income)``."""
    column = agg.column.name if agg.column else "*"
    if agg.kind == "mode":
        return f"mode() within group (order by {column})"
    if agg.fraction is not None:
        return f"{agg.kind}({decimal_text(agg.fraction)}) within group (order by {column})"
    if agg.fractions:
        listed = ", ".join(decimal_text(f) for f in agg.fractions)
        return f"{agg.kind}(array[{listed}]) within group (order by {column})"
    if agg.fraction_parameter is not None:
        return f"{agg.kind}(${agg.fraction_parameter.number}) within group (order by {column})"
    return f"{agg.kind}({'distinct ' if agg.distinct else ''}{column})"


def _set_operation_refusal(tree: exp.Expr) -> tuple[str, str]:
    """The message and rule for a statement on a protected table that is not one SELECT."""
    if isinstance(tree, exp.SetOperation):
        return "UNION/INTERSECT/EXCEPT is not allowed on protected table", "no-set-operations"
    if isinstance(tree, exp.Values):
        return "VALUES is not allowed on protected table", "not-a-select"
    return "only SELECT of aggregates is allowed on protected table", "not-a-select"


# Clauses that make a statement something other than one aggregate row of one table.
_CLAUSE_RULES: dict[str, tuple[str, str]] = {
    "joins": ("JOIN is not allowed on protected table", "no-join"),
    "laterals": ("LATERAL is not allowed on protected table", "no-join"),
    "group": ("GROUP BY is not allowed on protected table", "no-group-by"),
    "distinct": ("SELECT DISTINCT is not allowed on protected table", "no-distinct"),
    "with_": ("WITH (CTE) is not allowed with protected table", "no-subquery"),
    "windows": ("window functions are not allowed on protected table", "no-window"),
    "qualify": ("window functions are not allowed on protected table", "no-window"),
    "into": ("SELECT INTO is not allowed on protected table", "no-write"),
    "locks": ("row locks are not allowed on protected table", "no-row-access"),
    "sample": ("TABLESAMPLE is not allowed on protected table", "no-subquery"),
}


def _check_clauses(tree: exp.Select, scope: Scope) -> Scope:
    """Refuse every clause beyond SELECT/FROM/WHERE/ORDER BY/LIMIT; return the FROM scope."""
    for key, value in tree.args.items():
        if not value or key in ("expressions", "from_", "where", "group", "having", "limit", "offset", "order", "kind"):
            continue
        message, rule = _CLAUSE_RULES.get(key, (f"the {key.upper()} clause is not allowed on protected table", "unsupported-clause"))
        raise scope.refuse(message, rule)
    source = tree.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table) or source.this.args.get("joins"):
        raise scope.refuse("subqueries are not allowed on protected table", "no-subquery")
    if source.this.args.get("sample") is not None:
        # sqlglot hangs TABLESAMPLE on the table, not the SELECT; the rewrite would drop it
        # and answer for the whole table.
        raise scope.refuse(*_CLAUSE_RULES["sample"])
    for node in tree.walk():
        if isinstance(node, (exp.Subquery, exp.Exists)) or (isinstance(node, exp.Select) and node is not tree):
            raise scope.refuse("subqueries are not allowed on protected table", "no-subquery")
        if isinstance(node, exp.Window):
            raise scope.refuse("window functions are not allowed on protected table", "no-window")
    alias = source.this.args.get("alias")
    if alias is not None:
        # As in PostgreSQL, an aliased table is qualified by its alias only.
        return replace(scope, qualifiers=frozenset({identifier(alias)}))
    return scope


def _column_values_refusal(item: exp.Column, scope: Scope) -> Refusal:
    """The refusal of a column's values as an output (``no-row-access``), whatever the policy.

    A chart that bins or lists raw values itself (Superset's Histogram chart sends ``SELECT age
    AS age FROM t``) gets, on a column opted in to GROUP BY, a hint at the histogram dpproxy does
    answer: the noised count per declared key. The hint reads the policy only, never the rows.
    """
    column = scope.column(item)  # PostgreSQL's 42703 first: SELECT nosuch, count(*) names no column
    refusal = scope.refuse("selecting column values is not allowed on protected table", "no-row-access")
    if column.policy is None or not column.policy.group_by:
        return refusal
    table = scope.table.display_name
    example = (f": SELECT {column.name}, COUNT(*) FROM {table} GROUP BY {column.name}"
               if column_key_count(column) is not None else "")
    advice = (f"To count rows per value of {column.name}, group by one of its declared keys instead of reading "
              f"the values{example} (in a BI tool: a chart with the key as a dimension and a COUNT metric, such as "
              "a bar chart, rather than raw records or a chart that bins them itself, such as Superset's Histogram).")
    return Refusal(refusal.sqlstate, refusal.message, group_by_hint(scope, advice), refusal.rule)


def _aggregate(item: exp.Expression, scope: Scope, conditions: PredicateRenderer, grouped: bool = False) -> Aggregate:
    """The aggregate ``item`` asks for, with its mechanism; per cell of a GROUP BY when ``grouped``.

    A conditional aggregate (``rewriter.conditional``) is its plain aggregate restricted to the
    rows where its condition holds, rendered by ``conditions`` as the statement's WHERE is.
    """
    alias: str | None = None
    if isinstance(item, exp.Alias):
        alias = identifier(item.args["alias"])
        item = item.this
    read = unconditional(item, scope)
    agg = _plain_aggregate(read.aggregate, scope, grouped, alias)
    if read.counted_type is not None:
        agg = replace(agg, result_type_oid=read.counted_type)
    if read.scale is not None:
        agg = replace(agg, scale=read.scale)
    if read.condition is None:
        return agg
    # MODE's FILTER is a FILTER of each category's count: PostgreSQL evaluates it once a category.
    template = conditions.template(read.condition, categories(agg.column) if agg.kind == "mode" else 1)
    columns = dict.fromkeys(scope.column(column).name for column in read.condition.find_all(exp.Column))
    return replace(agg, filter_sql=template, filter_columns=tuple(columns))


def _plain_aggregate(item: exp.Expression, scope: Scope, grouped: bool, alias: str | None) -> Aggregate:
    """The aggregate ``item`` (unaliased, without a condition) asks for."""
    if isinstance(item, exp.Star) or (isinstance(item, exp.Column) and isinstance(item.this, exp.Star)):
        raise scope.refuse("SELECT * is not allowed on protected table", "no-row-access")
    fraction: Fraction | FractionParameter | tuple[Fraction, ...] | None = None
    if isinstance(item, exp.WithinGroup) and isinstance(item.this, exp.Mode):
        kind: AggregateKind = "mode"
        order = item.expression.expressions
        if len(order) != 1:
            raise scope.refuse("MODE() takes one ORDER BY column on protected table", "aggregate-argument")
        argument: exp.Expression = order[0].this
    elif isinstance(item, exp.WithinGroup) and is_percentile(item):
        kind, argument, fraction = percentile_call(item, scope)
    elif isinstance(item, exp.Sum) and _is_one(item.this):
        # Tableau's "Number of Records": SUM(1) adds 1 per row, the count of rows (bigint, as
        # count(*)), so it is released as count(*) is, once, under the name PostgreSQL gives it.
        return Aggregate("count", None, alias or "sum", aggregate_result_type("count", None),
                         _mechanism("count", scope, grouped))
    elif type(item) in _SIMPLE_AGGREGATES:
        kind = _SIMPLE_AGGREGATES[type(item)]
        argument = item.this
    elif isinstance(item, exp.AggFunc):
        raise scope.refuse(f"aggregate {item.sql_name().lower()}() is not allowed on protected table", "aggregate-not-allowed")
    elif isinstance(item, exp.Column):
        raise _column_values_refusal(item, scope)
    elif item.find(exp.AggFunc) is not None:
        raise scope.refuse("expressions on or around aggregates are not allowed on protected table", "aggregate-expression")
    else:
        raise scope.refuse("non-aggregate output is not allowed on protected table", "no-row-access")
    distinct = kind == "count" and isinstance(argument, exp.Distinct)
    if distinct:
        assert isinstance(argument, exp.Distinct)
        if len(argument.expressions) != 1:
            raise scope.refuse("COUNT(DISTINCT ...) takes one column on protected table", "aggregate-argument")
        argument = argument.expressions[0]
        if not isinstance(argument, exp.Column):
            raise scope.refuse("COUNT(DISTINCT ...) takes a plain column on protected table", "aggregate-argument")
        counted = scope.column(argument)
        if not counted.builtin:
            raise Refusal(
                SQLSTATE.DP_QUERY_SHAPE,
                f"COUNT(DISTINCT {counted.name}) is not answered on protected table {scope.table.display_name}: "
                "the column's type is not built into PostgreSQL (rule: aggregate-argument)",
                f"Counting distinct values sorts them with the type's own comparison, which may fail on some values "
                f"only (pgvector's vector on two of different dimensions); COUNT({counted.name}) counts its non-NULL "
                "values.",
                "aggregate-argument",
            )
        if counted.unbounded_length:
            raise Refusal(
                SQLSTATE.DP_QUERY_SHAPE,
                f"COUNT(DISTINCT {counted.name}) is not answered on protected table {scope.table.display_name}: "
                "the column's values can be of any length (rule: aggregate-argument)",
                "Counting distinct values sorts and compares whole values, and PostgreSQL has no header telling "
                "such a value's size to bound it by, as max_text_bytes bounds text: one row with a long value would "
                f"make the statement measurably slower. COUNT({counted.name}) counts its non-NULL values.",
                "aggregate-argument",
            )
        if not counted.distinct_countable:
            raise Refusal(
                SQLSTATE.DP_QUERY_SHAPE,
                f"COUNT(DISTINCT {counted.name}) is not answered on protected table {scope.table.display_name}: "
                "PostgreSQL cannot sort the column's type to count its distinct values (rule: aggregate-argument)",
                f"Such a statement fails on the backend whatever the rows; COUNT({counted.name}) counts its non-NULL values.",
                "aggregate-argument",
            )
    cast = _CAST_TARGETS.get(argument.to.this) if isinstance(argument, exp.Cast) and kind != "mode" else None
    if isinstance(argument, exp.Cast) and cast is not None and not argument.to.expressions:
        argument = argument.this
    column = _aggregate_column(kind, argument, scope)
    argument_type = column.type_oid if column else None
    if cast is not None and column is not None:
        _check_widening(kind, column, cast, scope)
        argument_type = cast
    result_type = aggregate_result_type(kind, argument_type)
    parameter = fraction if isinstance(fraction, FractionParameter) else None
    exact = fraction if isinstance(fraction, Fraction) else None
    fractions = fraction if isinstance(fraction, tuple) else ()
    if fractions:
        result_type = ARRAY_TYPES[result_type]  # PostgreSQL's: float8[] for _cont, the column's array for _disc
    return Aggregate(kind, column, alias or kind, result_type, _mechanism(kind, scope, grouped, column), distinct,
                     fraction=exact, fraction_parameter=parameter, fractions=fractions)


# Casts an aggregate's column may be given (Tableau writes AVG(CAST(col AS DOUBLE PRECISION)),
# SUM(CAST(col AS BIGINT))): when the cast changes no value (or, numeric to double precision,
# rounds it to the nearest double, far below any noise), kind(CAST(col AS t)) is kind(col) in
# t's result type, so it is released as kind(col) is and only its type follows the cast.
_CAST_TARGETS: dict[object, int] = {
    exp.DataType.Type.SMALLINT: INT2, exp.DataType.Type.INT: INT4, exp.DataType.Type.BIGINT: INT8,
    exp.DataType.Type.FLOAT: FLOAT4, exp.DataType.Type.DOUBLE: FLOAT8, exp.DataType.Type.DECIMAL: NUMERIC,
}
_EXACT_IN = {FLOAT4: 2.0**24, FLOAT8: 2.0**53}  # integers a float holds exactly, in magnitude
_WIDER = {INT2: {INT2, INT4, INT8, NUMERIC}, INT4: {INT4, INT8, NUMERIC}, INT8: {INT8, NUMERIC},
          NUMERIC: {NUMERIC, FLOAT8}, FLOAT4: {FLOAT4, FLOAT8}, FLOAT8: {FLOAT8}}


def _check_widening(kind: AggregateKind, column: ColumnInfo, target: int, scope: Scope) -> None:
    """Refuse a cast of an aggregate's column that could change a value (a narrowing or rounding
    one, a typmod): the answer would no longer be kind(col)'s. An integer column goes to a float
    only when its bounds are within the integers the float holds exactly (the clamp keeps every
    value within them). Nothing here releases more: the release is kind(col)'s either way."""
    if target in _WIDER.get(column.type_oid, set()):
        return
    exact = _EXACT_IN.get(target)
    bounds = column.policy.bounds if column.policy is not None else None
    if (exact is not None and column.type_oid in INTEGER_TYPES and bounds is not None
            and max(abs(float(bounds[0])), abs(float(bounds[1]))) <= exact):
        return
    if kind == "count" and exact is not None and column.type_oid in INTEGER_TYPES:
        return  # COUNT counts non-NULL values, which a cast to a float keeps
    raise scope.refuse(
        f"{kind.upper()}(CAST({column.name} AS ...)) with a cast that may change a value is not answered on protected table",
        "aggregate-argument",
    )


def _is_one(node: exp.Expression | None) -> bool:
    """Whether ``node`` is the integer literal 1 (SUM(1) is then COUNT(*): both bigint, one per row)."""
    return isinstance(node, exp.Literal) and not node.is_string and node.this == "1"


def _mechanism(kind: AggregateKind, scope: Scope, grouped: bool = False, column: ColumnInfo | None = None) -> Mechanism:
    """The mechanism that releases ``kind`` under the policy (per cell when ``grouped``).

    AVG follows the column's ``avg``, else the table's (default ``sum_count``). Per cell of a
    GROUP BY, AVG is always a noisy sum over a noisy count (pure ε, good on few rows); MIN and
    MAX by sample and aggregate would need hundreds of rows in every cell.
    """
    if kind in ("count", "sum"):
        return "laplace"
    if kind == "mode":
        return "exponential"
    if kind in PERCENTILES:
        return "quantile"
    if kind in VARIANCES:
        return "moments"
    column_avg = column.policy.avg if column is not None and column.policy is not None else None
    if kind == "avg" and (grouped or (column_avg or scope.table.policy.avg) == "sum_count"):
        return "sum_count"
    if grouped:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{kind.upper()} per group is not answered on protected table {scope.table.display_name} "
            "(rule: aggregate-not-allowed)",
            f"{kind.upper()} is answered by sample and aggregate, which needs hundreds of rows in each group to say "
            f"anything: ask it without GROUP BY, with a WHERE for the group you want; per group, COUNT, SUM, AVG, "
            "COUNT(DISTINCT col), MODE, VARIANCE and STDDEV are answered.",
            "aggregate-not-allowed",
        )
    if scope.table.policy.delta <= 0:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"{kind.upper()} on protected table {scope.table.display_name} needs delta > 0 in the "
            "policy (rule: delta-required)",
            "MIN, MAX and AVG set to avg: sample_aggregate are answered by sample and aggregate, which is "
            "(ε, δ)-DP: give the table a delta such as 1e-6 (or leave AVG on its pure-ε default, avg: sum_count).",
            "delta-required",
        )
    return "sample_aggregate"


def _aggregate_column(kind: AggregateKind, argument: exp.Expression | None, scope: Scope) -> ColumnInfo | None:
    if kind == "count" and (isinstance(argument, exp.Star) or isinstance(argument, exp.Literal)):
        return None  # count(1), count('x'): a non-NULL constant counts every row, as count(*) does
    if isinstance(argument, exp.Distinct):
        raise scope.refuse(f"{kind.upper()}(DISTINCT ...) is not allowed on protected table", "no-distinct")
    if not isinstance(argument, exp.Column) or isinstance(argument.this, exp.Star):
        raise scope.refuse(f"{kind.upper()} takes a plain column on protected table", "aggregate-argument")
    column = scope.column(argument)
    if kind == "count":
        return column
    if kind == "mode":
        return _categorical(column, scope)
    if column.type_oid not in NUMERIC_TYPES:
        refusal = scope.refuse(f"{kind.upper()} needs a numeric column; {column.name} is not numeric on",
                               "aggregate-argument")
        refusal.hint = _not_numeric_hint(column, scope.table.display_name)
        raise refusal
    if column.policy is None or column.policy.bounds is None:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"column {column.name} of protected table {scope.table.display_name} has no bounds in the policy (rule: bounds-required)",
            "Add bounds: [lo, hi] for this column to the policy to allow SUM/AVG/MIN/MAX, percentiles, "
            "VARIANCE and STDDEV on it.",
            "bounds-required",
        )
    limit = MAX_ABS_BOUND.get(column.type_oid)
    if limit is not None and column.policy.sensitivity > limit:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"the bounds of column {column.name} of protected table {scope.table.display_name} are too "
            f"large for {kind.upper()} (rule: bounds-too-large)",
            f"Bounds of this column type may be at most {limit:g} in magnitude: beyond that the backend's "
            "sum could overflow depending on the rows. Ask the policy's owner for tighter bounds.",
            "bounds-too-large",
        )
    if kind in VARIANCES and column.policy.sensitivity > MAX_ABS_VARIANCE_BOUND:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"the bounds of column {column.name} of protected table {scope.table.display_name} are too "
            f"large for {kind.upper()} (rule: bounds-too-large)",
            f"VARIANCE and STDDEV take columns whose bounds are at most {MAX_ABS_VARIANCE_BOUND:g} in magnitude: "
            "the variance of wider values can exceed double precision's range. Ask the policy's owner for tighter "
            "bounds.",
            "bounds-too-large",
        )
    return column


def _not_numeric_hint(column: ColumnInfo, table: str) -> str:
    """What a column that is not numeric answers instead of SUM, AVG, MIN and MAX, by its policy."""
    policy = column.policy
    name = column.name
    rest = (f"SUM, AVG, MIN, MAX, percentiles, VARIANCE and STDDEV take a numeric column of {table} that has bounds "
            "in the policy.")
    if column.type_oid in TIME_TYPES:
        grouped = (f" and GROUP BY DATE_TRUNC('month', {name})" if policy is not None and policy.time_units else "")
        return f"A date or time column answers COUNT({name}){grouped}; its earliest or latest time is not answered. {rest}"
    answers = [f"COUNT({name})", f"COUNT(DISTINCT {name})"]
    if policy is not None and policy.categories is not None:
        answers.append(f"MODE() WITHIN GROUP (ORDER BY {name})")
        if policy.group_by is True:
            answers.append(f"GROUP BY {name}")
    return f"{name} answers {', '.join(answers)}. {rest}"


def _categorical(column: ColumnInfo, scope: Scope) -> ColumnInfo:
    if column.policy is None or column.policy.categories is None:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"MODE() needs a categorical column; {column.name} of protected table "
            f"{scope.table.display_name} has no categories in the policy (rule: categories-required)",
            "Declare the column's possible values in the policy, e.g. "
            f"{column.name}: {{categories: [a, b, c]}}; MODE answers only with a declared category.",
            "categories-required",
        )
    return column


def asks_for_no_row(sql: str, table: Relation) -> bool:
    """Whether ``sql`` is a SELECT whose own LIMIT/FETCH/OFFSET leave no row (``LIMIT 0``).

    Decided from the text alone; a statement this cannot read asks for rows.
    """
    try:
        tree = parse_postgres(sql)
    except ParseError:
        return False
    if not isinstance(tree, exp.Select) or tree.args.get("limit") is None:
        return False
    try:
        return _no_rows(tree, Scope(table, frozenset({table.name})))
    except Refusal:
        return False


def _no_rows(tree: exp.Select, scope: Scope, grouped: bool = False) -> bool:
    """Whether LIMIT/FETCH FIRST/OFFSET leave none of the released rows (then nothing is released).

    ``LIMIT n``, ``LIMIT ALL``, ``LIMIT NULL``, ``FETCH FIRST [n] ROW[S] ONLY`` and ``OFFSET k``
    take non-negative integer literals: they act on the released rows only, so ``LIMIT 0``
    (and, on the one aggregate row, ``OFFSET k`` with k > 0) answer no row, from the statement
    alone, at no cost. A GROUP BY's rows after an OFFSET depend on HAVING over noised values,
    so only ``LIMIT 0`` is known to leave none.
    """
    limit = tree.args.get("limit")
    count: exp.Expression | None = None
    if isinstance(limit, exp.Fetch):
        options = limit.args.get("limit_options")
        if limit.args.get("direction", "FIRST").upper() not in ("FIRST", "NEXT") or (
            options is not None and (options.args.get("percent") or options.args.get("with_ties"))
        ):
            raise scope.refuse("FETCH takes FIRST/NEXT n ROWS ONLY on protected table", "limit")
        count = limit.args.get("count")
    elif limit is not None:
        count = limit.expression
    rows = _row_count(count, "LIMIT", scope)
    offset = tree.args.get("offset")
    skipped = _row_count(offset.expression if offset is not None else None, "OFFSET", scope)
    return rows == 0 or (not grouped and (skipped or 0) > 0)


def _row_count(value: exp.Expression | None, clause: str, scope: Scope) -> int | None:
    """A LIMIT/OFFSET count: None for none, ALL or NULL; refused unless a non-negative integer literal
    (22003 beyond bigint, as PostgreSQL)."""
    if value is None or isinstance(value, exp.Null) or (isinstance(value, exp.Var) and value.name.upper() == "ALL"):
        return None
    if not (isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit()):
        raise scope.refuse(f"{clause} takes a non-negative integer literal on protected table", "limit")
    digits = value.this.lstrip("0") or "0"
    if len(digits) > 19 or int(digits) >= 2**63:  # checked by length first: int() refuses 4,300 digits
        raise Refusal("22003", "bigint out of range",
                      f"{clause} takes at most 9223372036854775807.", "limit")
    return int(digits)
