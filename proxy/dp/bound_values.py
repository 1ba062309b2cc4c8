"""Evaluate values of a DP statement's bound parameters, in PostgreSQL's order of errors.

Folding (:mod:`proxy.dp.folding`) and narrowing (:mod:`proxy.dp.narrowing`) each run one query
reading no table over some of the statement's parameters, before any charge. PostgreSQL reads a
prepared statement in steps: its Parse resolves every operator and type with the declared
parameter types (``ts <> $1`` with ``$1`` declared integer: 42883), and only Bind reads the
values. So the statement's backend SQL is parsed with the declared types first, in the same round
trip (or described, where a type is left to PostgreSQL, whose inferred types the query then
needs): ``ts <> $1 OR d >= $2::timestamptz`` bound to ``(5, 'abc')`` fails with the statement's
42883, as on PostgreSQL, not with the 22007 of ``'abc'``.
"""

from __future__ import annotations

from proxy.backend.connection import BackendSession, BoundParams
from rewriter.dp_query import AggregateQuery
from rewriter.listed_parameters import INFERRED
from rewriter.rewrite import backend_sql

__all__ = ["evaluated"]


async def evaluated(plan: AggregateQuery, params: BoundParams, query: str,
                    backend: BackendSession) -> tuple[list[bytes | None], BoundParams]:
    """``query``'s first row (text) with ``params``, once ``plan``'s backend SQL has parsed with
    their declared types (its error raised first, as BackendError); and the parameters as
    ``query`` ran with them: the unspecified ones given the types the statement infers."""
    if not params.values:
        values, _ = await backend.first_row(query)
        return values, params
    statement = backend_sql(plan, seed=0)
    if INFERRED.isdisjoint(params.types):
        return await backend.first_row_parsed(statement, query, params), params
    # The query uses only some of the parameters; PostgreSQL must be told the types of the
    # others, which it infers from the whole statement.
    types, _ = await backend.describe(statement, params.types)
    params = BoundParams(params.values, params.formats, tuple(types))
    values, _ = await backend.first_row(query, params)
    return values, params
