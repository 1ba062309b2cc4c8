"""rewriter.rewrite.aggregate_parts is kept per plan aggregate: a cached plan's statements read
their aggregates' parts (to split the backend row) without writing the clamps' SQL again, and
an aggregate that differs in anything gets its own parts."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter import rewrite
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import aggregate_parts, split_row

_INT4, _FLOAT8 = 23, 701


def _relation() -> Relation:
    age = ColumnPolicy(bounds=(17, 90))
    hours = ColumnPolicy(bounds=(1.0, 99.0), avg="sample_aggregate")
    policy = TablePolicy(epsilon=1.0, delta=1e-6, partitions=8, columns={"age": age, "hours": hours})
    return Relation(0, "public", "t", policy,
                    {"age": ColumnInfo("age", _INT4, -1, 1, age), "hours": ColumnInfo("hours", _FLOAT8, -1, 2, hours)},
                    "random")


def test_a_plans_statements_split_their_rows_without_writing_the_clamps_again(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_aggregate_query("SELECT MIN(age), MAX(age), SUM(age), AVG(hours) FROM t WHERE hours > 40", _relation())
    written = [0]
    clamped = rewrite.clamped

    def counted(*args: Any, **kwargs: Any) -> str:
        written[0] += 1
        return clamped(*args, **kwargs)

    monkeypatch.setattr(rewrite, "clamped", counted)
    row = (None, None, 0, None)
    split_row(plan, row)
    after_first = written[0]
    for _ in range(5):
        assert [len(parts) for parts in split_row(plan, row)] == [1, 1, 1, 1]
    assert written[0] == after_first


def test_an_aggregate_that_differs_gets_its_own_parts() -> None:
    plan = plan_aggregate_query("SELECT MIN(age) FROM t", _relation())
    agg = plan.aggregates[0]
    filtered = replace(agg, filter_sql='("age" OPERATOR(pg_catalog.>) 40)', filter_columns=("age",))
    other_kind = replace(agg, kind="max")
    assert aggregate_parts(agg) != aggregate_parts(filtered) != aggregate_parts(other_kind) != aggregate_parts(agg)
    assert "FILTER" in aggregate_parts(filtered)[0].sql and "max" in aggregate_parts(other_kind)[0].sql
    assert aggregate_parts(agg) is aggregate_parts(agg)
