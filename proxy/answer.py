"""Turn a DP plan's exact backend row into the noised row the client receives.

The query's ε is split evenly over its k aggregate columns (sequential composition),
each column is released by its mechanism, and the row is encoded with the names and
types PostgreSQL would have reported for the original query.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Sequence

from mechanisms.laplace import release_count, release_sum
from mechanisms.release import Release
from rewriter.dp_query import Aggregate, AggregateQuery
from rewriter.types import INTEGER_TYPES, NUMERIC

from .backend import ResultSet
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


def result_fields(plan: AggregateQuery) -> list[Field]:
    """The RowDescription PostgreSQL would send for the original query."""
    return [
        Field(agg.output_name, agg.result_type_oid, TYPE_SIZES.get(agg.result_type_oid, -1))
        for agg in plan.aggregates
    ]


def release_row(plan: AggregateQuery, exact: Sequence[Any], epsilon: float) -> DPAnswer:
    """Noise every column of the exact row with ε/k each; total cost (ε, 0)."""
    fields = result_fields(plan)
    if plan.limit_zero:
        return DPAnswer(ResultSet(fields, [], "SELECT 0"), 0.0, 0.0, ())
    share = epsilon / len(plan.aggregates)
    releases = tuple(_release(agg, value, share) for agg, value in zip(plan.aggregates, exact))
    row = [
        encode_text(rel.value, agg.result_type_oid, _numeric_scale(agg, value))
        for agg, rel, value in zip(plan.aggregates, releases, exact)
    ]
    delta = sum(rel.delta for rel in releases)
    return DPAnswer(ResultSet(fields, [row], "SELECT 1"), epsilon, delta, releases)


def _release(agg: Aggregate, exact: Any, epsilon: float) -> Release[Any]:
    if agg.kind == "count":
        return release_count(int(exact), epsilon)
    if agg.kind == "sum":
        assert agg.column is not None and agg.column.policy is not None
        # SUM over no rows is NULL in SQL; releasing 0 + noise hides that the filter was empty.
        value = exact if exact is not None else 0
        integer = agg.column.type_oid in INTEGER_TYPES
        return release_sum(int(value) if integer else float(value), epsilon, agg.column.policy.sensitivity, integer)
    raise ValueError(f"no mechanism for {agg.kind}")


def _numeric_scale(agg: Aggregate, exact: Any) -> int | None:
    if agg.result_type_oid != NUMERIC:
        return None
    if isinstance(exact, Decimal):
        exponent = exact.as_tuple().exponent
        return max(0, -exponent) if isinstance(exponent, int) else None
    column = agg.column
    if column is not None and column.type_modifier >= 4:
        return (column.type_modifier - 4) & 0xFFFF
    return 0 if exact is None or isinstance(exact, int) else None
