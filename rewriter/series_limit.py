"""A GROUP BY restricted to the series a second GROUP BY ranks first: Superset's *Series limit*.

Superset 6.1 draws a line or bar chart over time with a dimension and a series limit as::

    SELECT DATE_TRUNC('MONTH', signed_up) AS signed_up, sex AS sex, COUNT(*) AS count
    FROM public.people
    JOIN (SELECT sex AS sex__, COUNT(*) AS mme_inner__ FROM public.people WHERE <W>
          GROUP BY sex ORDER BY COUNT(*) DESC LIMIT 5) AS series_limit ON sex = sex__
    WHERE <W> GROUP BY DATE_TRUNC('MONTH', signed_up), sex ORDER BY count DESC LIMIT 10000

It is answered as two histograms over declared keys of the same table and post-processing of
both (:class:`rewriter.dp_query.SeriesLimit`):

* the *ranking*, the subquery: a GROUP BY over declared keys, released as any histogram is, and
  its ORDER BY/LIMIT/HAVING run over its noised cells; the cells it keeps are the series;
* the restricted GROUP BY, the statement without the join: released as any histogram is;
* its cells kept where their join keys are those of a cell the ranking kept, then its own
  post-processing.

**Why that is the statement's answer, and releases nothing more.** Every key of the ranking is
a join key, so its rows are one per cell and an outer row joins at most one of them: the join
keeps exactly the outer rows whose join keys are among the kept cells' keys, each once. Each
outer join key is one of its GROUP BY keys of the same kind (same column, unit, bins), so those
rows are exactly the rows of the outer cells whose keys match: keeping cells is keeping rows.
Which cells the ranking keeps is a function of its released values (post-processing); keeping
the outer's cells by it is a function of both releases. By sequential composition the answer
costs the ε of the two releases together: dpproxy charges the statement's ε once and splits it
evenly over the aggregates of both (the ranking's metric is one more column of the query), as
it splits ε over any statement's columns (docs/bi-tools.md). Cells are matched by their keys:
an ``other`` cell by its label, as it is drawn.

Only this shape is judged here: one protected table, INNER JOIN to one subquery over the same
table (no LATERAL, USING, NATURAL, column aliases), joined ON a conjunction of equalities
between a key of the statement's GROUP BY and an output key of the subquery, covering every
key of the subquery; and no parameters. Anything else is refused (``no-subquery``), as before.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterator

import pglast
import pglast.ast
import pglast.enums
import sqlglot
from pglast.stream import RawStream
from sqlglot import exp
from sqlglot.errors import ParseError

from policies.errors import Refusal
from policies.tables import Relation

from .dp_query import AggregateQuery, SeriesLimit, plan_aggregate_query
from .group_keys import group_key
from .post_process import default_name
from .like_patterns import case_folded_refusal
from .predicate_terms import terms_refusal
from .scope import Scope
from .text_bounds import work_refusal

__all__ = ["plan_series_limited", "ranks_series"]

_HINT = (
    "A subquery joined to a protected table is answered only as a series limit (Superset's): "
    "SELECT keys, aggregates FROM {table} JOIN (SELECT key AS key__, COUNT(*) AS m FROM {table} [WHERE ...] "
    "GROUP BY key ORDER BY m DESC LIMIT n) AS s ON key = key__ [WHERE ...] GROUP BY keys, both GROUP BYs over "
    "declared keys and the join on every key of the subquery."
)


def ranks_series(node: dict[str, Any]) -> bool:
    """Whether a SelectStmt (pglast's JSON tree) reads one relation joined to one subquery: the
    shape :func:`plan_series_limited` judges."""
    sources = node.get("fromClause") or []
    if len(sources) != 1 or "JoinExpr" not in sources[0]:
        return False
    join = sources[0]["JoinExpr"]
    return "RangeVar" in join.get("larg", {}) and "RangeSubselect" in join.get("rarg", {})


def plan_series_limited(sql: str, table: Relation, function_names: frozenset[str] | None = None) -> AggregateQuery:
    """The plan of ``sql``, a GROUP BY over ``table`` joined to a subquery over ``table`` that
    ranks its series; refused (``no-subquery``) unless it is exactly that shape."""
    (raw,) = pglast.parse_sql(sql)
    select: Any = raw.stmt
    join = _join(select, table)
    subquery: Any = join.rarg.subquery
    ranking = plan_aggregate_query(RawStream()(subquery), table, function_names, ranking=True)
    outputs = _ranking_outputs(subquery, ranking, table, function_names)
    select.fromClause = (join.larg,)
    outer = plan_aggregate_query(RawStream()(select), table, function_names, joined=frozenset(outputs))
    # A row reaches the conditions of both: their terms, the ILIKE patterns lowered for it and their
    # reads of text add up.
    limited = not table.policy.answer_quantum_ms
    refused = terms_refusal(ranking.terms + outer.terms) if limited else None
    refused = refused or case_folded_refusal(ranking.ilike_bytes + outer.ilike_bytes)
    refused = refused or (work_refusal(ranking.text_work + outer.text_work, ranking.single_reads + outer.single_reads)
                          if limited else None)
    if refused is not None:
        raise _refuse(table, f"{refused[0]} (the series limit's subquery and the statement together) are refused on",
                      "safe-predicate", refused[1])
    if not outer.groups:
        raise _refuse(table, "a series limit needs a GROUP BY over declared keys on")
    outer_scope = Scope(table, frozenset({_qualifier(join.larg)}), function_names)
    pairs = tuple(_pair(equality, join.rarg.alias.aliasname, outputs, outer, ranking, outer_scope, table)
                  for equality in _equalities(join.quals, table))
    if {ranked for _, ranked in pairs} != set(range(len(ranking.groups))):
        # A ranking key left out of the join would let one outer row join several ranked rows.
        raise _refuse(table, "a series limit must join on every GROUP BY key of its subquery on")
    return replace(outer, series=SeriesLimit(ranking, tuple(dict.fromkeys(pairs))))


def _refuse(table: Relation, message: str, rule: str = "no-subquery", hint: str | None = None) -> Refusal:
    return Refusal("DP001", f"{message} protected table {table.display_name} (rule: {rule})",
                   _HINT.format(table=table.display_name) if hint is None else hint, rule)


def _join(select: Any, table: Relation) -> Any:
    """The statement's one INNER JOIN of its table to a subquery; refused otherwise."""
    sources: Any = select.fromClause if isinstance(select, pglast.ast.SelectStmt) else None
    if not sources or len(sources) != 1 or select.withClause:
        raise _refuse(table, "subqueries are not allowed on")
    join = sources[0]
    if (not isinstance(join, pglast.ast.JoinExpr) or join.jointype != pglast.enums.JoinType.JOIN_INNER
            or join.isNatural or join.usingClause or join.alias is not None or join.quals is None
            or not isinstance(join.larg, pglast.ast.RangeVar) or not isinstance(join.rarg, pglast.ast.RangeSubselect)):
        raise _refuse(table, "subqueries are not allowed on")
    subselect = join.rarg
    if (subselect.lateral or subselect.alias is None or subselect.alias.colnames
            or subselect.alias.aliasname == _qualifier(join.larg)):
        raise _refuse(table, "subqueries are not allowed on")
    inner: Any = subselect.subquery
    sources = inner.fromClause if isinstance(inner, pglast.ast.SelectStmt) else None
    if not sources or len(sources) != 1 or not isinstance(sources[0], pglast.ast.RangeVar):
        raise _refuse(table, "a series limit's subquery must read the table itself on")
    if "ParamRef" in _node_kinds(select):
        raise _refuse(table, "parameters in a series limit are not supported on", "parameters")
    return join


def _node_kinds(node: Any) -> set[str]:
    """The kinds of every node in a pglast tree (``ParamRef`` for a parameter)."""
    return {type(child).__name__ for child in _walk(node)}


def _walk(node: Any) -> Iterator[Any]:
    if isinstance(node, pglast.ast.Node):
        yield node
        for name in node:
            yield from _walk(getattr(node, name))
    elif isinstance(node, tuple):
        for item in node:
            yield from _walk(item)


def _qualifier(relation: Any) -> str:
    """What qualifies the table's columns: its alias, else its name (as in PostgreSQL)."""
    return str(relation.alias.aliasname if relation.alias is not None else relation.relname)


def _ranking_outputs(subquery: Any, ranking: AggregateQuery, table: Relation,
                     function_names: frozenset[str] | None) -> dict[str, int | None]:
    """The subquery's output names, each to the ranking key it is (None: not a key)."""
    scope = Scope(table, frozenset({_qualifier(subquery.fromClause[0])}), function_names)
    identities = [key.identity for key in ranking.groups]
    outputs: dict[str, int | None] = {}
    for target in subquery.targetList:
        item = _expression(RawStream()(target.val), table)
        name = str(target.name) if target.name else default_name(item)
        try:
            identity = group_key(item, scope).identity
        except Refusal:
            identity = None
        outputs[name] = identities.index(identity) if identity in identities else None
    return outputs


def _expression(text: str, table: Relation) -> exp.Expression:
    try:
        node = sqlglot.parse_one(text, read="postgres")
    except ParseError as error:
        raise _refuse(table, "cannot analyse this series limit on", "unparsed") from error
    assert isinstance(node, exp.Expression)
    return node


def _equalities(quals: Any, table: Relation) -> list[Any]:
    """The ON clause as its equalities: one ``a = b``, or an AND of them."""
    kind = type(quals).__name__
    if kind == "BoolExpr" and quals.boolop == pglast.enums.BoolExprType.AND_EXPR:
        return [equality for arg in quals.args for equality in _equalities(arg, table)]
    if (kind == "A_Expr" and quals.kind == pglast.enums.A_Expr_Kind.AEXPR_OP
            and [getattr(name, "sval", None) for name in quals.name] in (["="], ["pg_catalog", "="])):
        return [quals]
    raise _refuse(table, "a series limit joins ON equalities of keys only on")


def _pair(equality: Any, alias: str, outputs: dict[str, int | None], outer: AggregateQuery, ranking: AggregateQuery,
          scope: Scope, table: Relation) -> tuple[int, int]:
    """(outer key, ranking key) an equality of the ON clause joins."""
    sides = [equality.lexpr, equality.rexpr]
    ranked = [_ranking_column(side, alias, outputs, table) for side in sides]
    if sum(name is not None for name in ranked) != 1:
        raise _refuse(table, "a series limit joins a key of the table to a key of its subquery on")
    index = ranked.index(next(name for name in ranked if name is not None))
    name, other = ranked[index], sides[1 - index]
    assert name is not None
    ranking_key = outputs.get(name)
    if ranking_key is None:
        raise _refuse(table, f"a series limit joins on its subquery's GROUP BY keys, not {name}, on")
    identity = group_key(_expression(RawStream()(other), table), scope).identity
    keys = [key.identity for key in outer.groups]
    if identity not in keys or identity != ranking.groups[ranking_key].identity:
        # Keeping rows by anything but a key of their own cell would not be keeping cells.
        raise _refuse(table, "a series limit joins a GROUP BY key of the statement to the same key of its subquery on")
    return keys.index(identity), ranking_key


def _ranking_column(side: Any, alias: str, outputs: dict[str, int | None], table: Relation) -> str | None:
    """The subquery output ``side`` names (``alias.name``, or ``name`` no table column has), or None."""
    if type(side).__name__ != "ColumnRef":
        return None
    fields = [getattr(field, "sval", None) for field in side.fields]
    if len(fields) == 2 and fields[0] == alias and fields[1] in outputs:
        return fields[1]
    if len(fields) == 1 and fields[0] in outputs:
        if fields[0] in table.columns:
            raise Refusal("42702", f'column reference "{fields[0]}" is ambiguous', _HINT.format(table=table.display_name),
                          "column-reference")
        return fields[0]
    return None
