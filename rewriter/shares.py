"""The share of rows where a condition holds, ``AVG(CASE WHEN p THEN 1 ELSE 0 END)``, as two released counts.

Superset and Metabase users write a rate as the average of an indicator:
``AVG(CASE WHEN p THEN 1 ELSE 0 END)``, ``AVG(CAST(p AS INT))``, Tableau ``AVG(IIF(p, 1, 0))``.
PostgreSQL's value is ``n / d``: n the rows where p holds, d the rows the average runs over
(every row for the ``ELSE 0`` form; the rows where p is not NULL for the other two, which
skip a NULL indicator). :func:`counted_shares` rewrites each such AVG into post-processing of
the two counts (:mod:`rewriter.post_process`)::

    CAST(GREATEST(0, LEAST(n, GREATEST(d, 1))) AS NUMERIC) / GREATEST(d, 1)

with ``n = COUNT(*) FILTER (WHERE p)`` and ``d = COUNT(*)`` or ``COUNT(*) FILTER (WHERE p OR NOT
p)`` (true exactly where p is not NULL). The result is numeric, as PostgreSQL's AVG of integers,
and its digits are PostgreSQL's numeric division of the two released integers, as its AVG
divides the exact ones. It is never NULL: PostgreSQL's AVG is NULL when no row is averaged, and
whether any row is is what a DP answer never tells, so a noised d below 1 counts as 1 (as
``SUM(CASE ...)`` is released as a noised 0, never NULL). The clamp keeps the share in [0, 1],
where every average of 0s and 1s lies.

Why it is private: n and d are each the count of an accepted statement whose WHERE is
``(where) AND p`` (``(where) AND (p OR NOT p)``, or the WHERE alone), released as any two
columns are, with ε split over the statement's distinct released aggregates: exactly what the
accepted ``COUNT(*) FILTER (WHERE p) * 1.0 / COUNT(*)`` charges (and a repeat of it is free). The
division, clamp and cast read nothing but the two released values (post-processing).
"""

from __future__ import annotations

from sqlglot import exp

from .conditional import share
from .scope import Scope

__all__ = ["counted_shares"]


def counted_shares(tree: exp.Select, scope: Scope) -> exp.Select:
    """``tree`` (an aggregate level) with each share of rows among its outputs, HAVING and ORDER BY
    replaced by the division of two counts; ``tree`` itself when it has none."""
    if all(share(node, scope) is None for node in _averages(tree)):
        return tree  # most statements: left as they are, uncopied
    rewritten = tree.copy()
    for node in _averages(rewritten):
        read = share(node, scope)
        if read is not None:
            node.replace(_division(read.numerator, read.denominator))
    return rewritten


def _averages(tree: exp.Select) -> list[exp.Expression]:
    """The AVGs (with their FILTER) of ``tree``'s outputs, HAVING and ORDER BY, outside windows."""
    places = [*tree.expressions, tree.args.get("having"), tree.args.get("order")]
    found: list[exp.Expression] = []
    for place in places:
        if place is None:
            continue
        for node in place.find_all(exp.Avg):
            item = node.parent if isinstance(node.parent, exp.Filter) else node
            if not isinstance(item.parent, exp.Window):
                found.append(item)
    return found


def _division(numerator: exp.Expression, denominator: exp.Expression | None) -> exp.Expression:
    rows = _count(denominator)
    at_least_one = exp.Greatest(this=rows, expressions=[exp.Literal.number(1)])
    clamped = exp.Greatest(this=exp.Literal.number(0),
                           expressions=[exp.Least(this=_count(numerator), expressions=[at_least_one.copy()])])
    return exp.Paren(this=exp.Div(this=exp.Cast(this=clamped, to=exp.DataType.build("NUMERIC")),
                                  expression=at_least_one))


def _count(condition: exp.Expression | None) -> exp.Expression:
    """``COUNT(*)``, under ``FILTER (WHERE condition)`` when there is one."""
    count = exp.Count(this=exp.Star())
    return count if condition is None else exp.Filter(this=count, expression=exp.Where(this=condition))
