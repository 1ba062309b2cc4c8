"""Turn a DP plan's exact backend row into the noised row the client receives.

The query's ε is split evenly over its k aggregate columns (sequential composition),
each column is released by its mechanism (``proxy.column_release``), and the row is
encoded with the names and types PostgreSQL would have reported for the original query.
δ is not split (SPEC §4): the answer's δ is the sum of its columns' δ, the table's δ for
each sample-and-aggregate column and 0 for the others.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from mechanisms.release import Release
from rewriter.dp_query import Aggregate, AggregateQuery
from rewriter.rewrite import split_row
from rewriter.types import INTEGER_TYPES, NUMERIC

from .backend import ResultSet
from .column_release import release_column
from .protocol import Field
from .values import TYPE_SIZES, encode_text

__all__ = ["DPAnswer", "release_row"]


@dataclass(frozen=True)
class DPAnswer:
    """The noised result and what it cost: total ε and δ, and each column's release."""

    result: ResultSet
    epsilon: float
    delta: float
    releases: tuple[Release[Any], ...]

    def notice(self) -> str:
        """One line for the analyst: the cost and each column's noise."""
        columns = ", ".join(
            f"{field.name}: {rel.mechanism} scale {rel.scale:.4g} (95% within ±{rel.error95:.4g})"
            for field, rel in zip(self.result.fields, self.releases)
        )
        return f"dpproxy: ε charged {self.epsilon:g}, δ {self.delta:g}; {columns}"

    def named_for(self, plan: AggregateQuery) -> DPAnswer:
        """The same released values headed as ``plan`` (a repeat) names its columns.

        A repeat has the same backend SQL, hence the same aggregates and types; only the
        names the statement gives them may differ.
        """
        result = ResultSet(result_fields(plan), self.result.rows, self.result.tag)
        return replace(self, result=result)


def result_fields(plan: AggregateQuery) -> list[Field]:
    """The RowDescription PostgreSQL would send for the original query."""
    return [
        Field(agg.output_name, agg.result_type_oid, TYPE_SIZES.get(agg.result_type_oid, -1))
        for agg in plan.aggregates
    ]


def release_row(plan: AggregateQuery, exact: Sequence[Any], epsilon: float) -> DPAnswer:
    """Noise every column of the backend row ``exact`` (``backend_sql(plan)``'s) with ε/k each.

    The total cost is (ε, Σ δ_column).
    """
    fields = result_fields(plan)
    if plan.limit_zero:
        return DPAnswer(ResultSet(fields, [], "SELECT 0"), 0.0, 0.0, ())
    share = epsilon / len(plan.aggregates)
    parts = split_row(plan, exact)
    releases = tuple(
        release_column(agg, agg_parts, share, plan.table.policy) for agg, agg_parts in zip(plan.aggregates, parts)
    )
    row = [
        encode_text(rel.value, agg.result_type_oid, _numeric_scale(agg))
        for agg, rel in zip(plan.aggregates, releases)
    ]
    delta = sum(rel.delta for rel in releases)
    return DPAnswer(ResultSet(fields, [row], "SELECT 1"), epsilon, delta, releases)


def _numeric_scale(agg: Aggregate) -> int | None:
    """Fraction digits of a numeric SUM/MIN/MAX result (None: as many as the value needs).

    A function of the schema alone: a numeric(p, s) column's s, 0 for SUM of an integer
    column. The exact sum's own scale would say how many fraction digits the rows hold (one
    row with a longer fraction, or NaN, changes it), so it is never used.
    """
    if agg.result_type_oid != NUMERIC or agg.kind not in ("sum", "min", "max"):
        return None
    column = agg.column
    if column is None:
        return None
    if column.type_modifier >= 4:
        return (column.type_modifier - 4) & 0xFFFF
    return 0 if agg.kind == "sum" and column.type_oid in INTEGER_TYPES else None


def query_delta(plan: AggregateQuery) -> float:
    """The δ an answer to ``plan`` will cost, known before it runs (charged up front).

    The table's δ for each sample-and-aggregate column, 0 for every other mechanism;
    ``release_row`` reports the same sum after the fact.
    """
    return sum(plan.table.policy.delta for agg in plan.aggregates if agg.mechanism == "sample_aggregate")
