"""Fold a DP query's row-independent WHERE expressions with its bound parameters, before any charge.

The plan is made once (at Parse for the extended protocol); the values come with each
execution. :func:`bind_constants` runs before the repeat lookup and before the budget is
charged: it checks the LIKE/ILIKE patterns bound as parameters exactly as strictly as literal
patterns, without sending anything to the backend, and evaluates every folded expression of
the statement in one round trip that reads no table (:func:`rewriter.constants.fold_query`),
in the analyst's own session. Its errors are PostgreSQL's, returned as they are: they cannot
depend on the rows, and nothing has been charged. Why folding is safe is argued in
:mod:`rewriter.constants`.
"""

from __future__ import annotations

from dataclasses import replace

from policies.errors import SQLSTATE, Refusal
from proxy.backend.connection import BackendSession, BoundParams
from proxy.dp.bound_values import evaluated
from proxy.wire.encodings import ClientEncoding
from rewriter.constants import Folding, fold_query, folded_comparison
from rewriter.dp_query import AggregateQuery
from rewriter.like_patterns import case_folded_bytes, case_folded_refusal, longest_part_after_percent, pattern_refusal
from rewriter.rewrite import backend_sql
from rewriter.text_bounds import LIKE_WORK, work_refusal

__all__ = ["bind_constants"]

# Parameter types a LIKE pattern may be sent as: unspecified (PostgreSQL infers text), text,
# varchar. Not bpchar (it drops trailing spaces, so "a\ " would reach LIKE as "a\"), not bytea
# or any other type whose conversion to text changes the bytes that were checked.
_PATTERN_TYPES = frozenset({0, 25, 1043})


async def bind_constants(
    plan: AggregateQuery, params: BoundParams, backend: BackendSession
) -> tuple[AggregateQuery, BoundParams]:
    """The plan with its WHERE and FILTERs folded for ``params``, and the parameters to run it with.

    A plan without ``folding`` comes back as it is, with no round trip. Raises Refusal
    (DP001) for a pattern parameter PostgreSQL could reject per row, and BackendError for
    an expression PostgreSQL cannot evaluate.
    """
    folding = plan.folding
    if folding is None:
        return plan, params
    encoding = backend.client_encoding
    patterns = {number: _check_pattern(plan, params, number, encoding) for number in folding.like_parameters}
    refused = case_folded_refusal(folding.ilike_bytes + sum(case_folded_bytes(patterns[number])
                                                             for number in folding.ilike_parameters))
    if refused is not None:
        raise _pattern_refused(refused, plan)
    refused = _work_refusal(plan, folding, patterns)
    if refused is not None:
        raise _pattern_refused(refused, plan)
    if not folding.folds:
        return replace(plan, folding=None), params
    values, params = await evaluated(plan, params, fold_query(folding.folds), backend)
    comparisons = _comparisons(folding, values, backend.client_encoding)
    where_sql = folding.filled(comparisons) if folding.template is not None else None
    aggregates = plan.aggregates
    if folding.filters:  # the aggregates' FILTERs (rewriter.conditional), folded with the WHERE
        aggregates = tuple(agg if text is None else replace(agg, filter_sql=folding.fill(text, comparisons))
                           for agg, text in zip(plan.aggregates, folding.filters, strict=True))
    return replace(plan, where_sql=where_sql, aggregates=aggregates, folding=None), params


def _folded(folding: Folding, values: list[bytes | None], encoding: ClientEncoding) -> str:
    """The WHERE with each fold's comparison in place (``values``: :func:`fold_query`'s row)."""
    return folding.filled(_comparisons(folding, values, encoding))


def _comparisons(folding: Folding, values: list[bytes | None], encoding: ClientEncoding) -> list[str]:
    """Each fold's comparison with its value, in the order of ``folding.folds``."""
    comparisons = []
    for index, fold in enumerate(folding.folds):
        value, below, above = values[3 * index : 3 * index + 3]
        text = value.decode(encoding.codec) if value is not None else None
        comparisons.append(folded_comparison(fold, text, below == b"t", above == b"t"))
    return comparisons


def _work_refusal(plan: AggregateQuery, folding: Folding, patterns: dict[int, str]) -> tuple[str, str] | None:
    """Why the statement's reads of text weigh too much once its pattern parameters are known, or None:
    the plan's text work (each pattern parameter's part after % counted as one character) and what
    each bound pattern's longest part adds (rewriter.text_bounds; no limit with answer_quantum_ms)."""
    if plan.table.policy.answer_quantum_ms:
        return None
    work = plan.text_work + sum(size * LIKE_WORK * (max(longest_part_after_percent(patterns[number]), 1) - 1)
                                for number, size in folding.like_weights)
    return work_refusal(work, plan.single_reads)


def _check_pattern(plan: AggregateQuery, params: BoundParams, number: int, encoding: ClientEncoding) -> str:
    """Refuse the value bound to $``number`` as a LIKE pattern if PostgreSQL could reject it per row, or if
    its matching could take measurably longer on one long value (``pattern_refusal``); else the pattern
    ("" for NULL or a missing parameter)."""
    if number > len(params.values):
        return ""  # the backend refuses the statement for the missing parameter before it reads a row
    table = plan.table.display_name
    if params.types[number - 1] not in _PATTERN_TYPES:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"a LIKE/ILIKE pattern parameter ${number} must be sent as text on protected table {table} "
            "(rule: safe-predicate)",
            "Send the pattern with type text or unspecified; its value is checked as text.",
            "safe-predicate",
        )
    value = params.values[number - 1]
    if value is None:
        return ""
    try:
        # In the session's client_encoding, as PostgreSQL reads it: every encoding a session
        # may use has no ASCII byte inside a multibyte character, so every backslash seen here
        # is one for PostgreSQL too.
        pattern = bytes(value).decode(encoding.codec)
    except UnicodeDecodeError:
        raise Refusal(
            SQLSTATE.DP_QUERY_SHAPE,
            f"a LIKE/ILIKE pattern parameter ${number} that is not valid {encoding.name} is refused on protected "
            f"table {table} (rule: safe-predicate)",
            f"Send the pattern as {encoding.name} text, the session's client_encoding.",
            "safe-predicate",
        ) from None
    refused = pattern_refusal(pattern)
    if refused is not None:
        raise _pattern_refused(refused, plan)
    return pattern


def _pattern_refused(refused: tuple[str, str], plan: AggregateQuery) -> Refusal:
    """The refusal of a pattern parameter for ``refused`` (reason, hint)."""
    return Refusal(
        SQLSTATE.DP_QUERY_SHAPE,
        f"{refused[0]}; such a pattern is refused on protected table {plan.table.display_name} (rule: safe-predicate)",
        refused[1],
        "safe-predicate",
    )
