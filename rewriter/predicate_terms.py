"""How many values and comparisons the conditions of one DP statement may hold.

A row that reaches a condition is compared with each of its terms: PostgreSQL up to 17 evaluates
an IN list (which dpproxy renders as ``x = a OR x = b …``) or an OR chain term by term, and 18
turns such a chain into a hashed array whose table it builds at the first row that reaches it.
Either way one row costs time in proportion to the terms, so ``id = 42 AND age IN (<60,000
numbers>)`` ran 1–2 ms longer when row 42 was there: an existence oracle in one statement on a
table without ``answer_quantum_ms``. Measured with benchmarks/row_cost.py (figures in
benchmarks/results.md), the first row reaching N terms (IN lists on integer, numeric, text and
date columns, chains of text comparisons) added, on PostgreSQL 16, 0.01–0.03 ms at 256,
0.03–0.09 ms at 512, 0.05–0.14 ms at 1,024 and 0.25–0.58 ms at 4,096; on 15 about the same; on
18 0.02–0.06 ms at 256 and 0.10–0.21 ms at 1,024; against run-to-run jitter of 0.01–0.05 ms.

So the conditions of one statement (its WHERE, its aggregates' FILTER and CASE conditions,
whatever wrappers they came in) may hold at most :data:`MAX_PREDICATE_TERMS` terms in all,
counted from the text before they are rendered (:func:`predicate_terms`): each value of an IN
list (literal or parameter) is one, a BETWEEN two, every other comparison, LIKE, IS NULL or
boolean column one. A table with ``answer_quantum_ms`` is not limited: its answers arrive at a
whole multiple of the quantum, which hides what a row adds below it, as it does every other
lever of docs/threat-model.md's Timing section (an analyst who wants long lists there gets
them; the statement-size limits of :mod:`rewriter.limits` still hold).
"""

from __future__ import annotations

from sqlglot import exp

__all__ = ["MAX_PREDICATE_TERMS", "predicate_terms", "terms_refusal"]

MAX_PREDICATE_TERMS = 256
"""The most values and comparisons the conditions of one DP statement may hold (a row: ≤ 0.03 ms on 16, 0.06 on 18)."""

_CONNECTIVES = (exp.And, exp.Or, exp.Not, exp.Paren)


def predicate_terms(condition: exp.Expression) -> int:
    """The terms of ``condition`` as the module docstring counts them.

    Walks the AND/OR/NOT structure only (never an IN list's values), without recursion: a
    statement's chains are as long as :mod:`rewriter.limits` lets them be.
    """
    terms, pending = 0, [condition]
    while pending:
        node = pending.pop()
        if isinstance(node, _CONNECTIVES):
            pending.extend(part for part in (node.this, node.args.get("expression")) if isinstance(part, exp.Expression))
        elif isinstance(node, exp.Is) and isinstance(node.expression, exp.Boolean):
            pending.append(node.this)  # (condition) IS TRUE: the condition's terms
        elif isinstance(node, exp.In):
            terms += max(len(node.expressions), 1)
        else:
            terms += 2 if isinstance(node, exp.Between) else 1
    return terms


def terms_refusal(terms: int) -> tuple[str, str] | None:
    """Why conditions of ``terms`` terms in all are refused, and the hint, or None."""
    if terms <= MAX_PREDICATE_TERMS:
        return None
    return (f"conditions with {terms} values and comparisons in all (at most {MAX_PREDICATE_TERMS} in one statement)",
            "PostgreSQL compares each row that reaches a condition with each of its values, so a long IN list or "
            "chain makes one row take measurably longer, which would tell whether that row is there. Ask with fewer "
            "values (a range, or several statements), or have the operator set answer_quantum_ms on the table, "
            "which lifts this limit.")
