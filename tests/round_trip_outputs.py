"""The round-trip check of outputs and post-processing: what PostgreSQL makes of a statement's outputs
over given aggregate values, against what dpproxy's outer statement makes of the same values released
(rewriter/post_process.py; docs/threat-model.md, "The round-trip check"; cases from
:mod:`tests.output_generator`).

For each case dpproxy plans:

* the analyst's reading: the statement is described on PostgreSQL as it is (its columns' names and
  type OIDs), and evaluated with each aggregate replaced by a parameter declared with the aggregate's
  own type (``count(*)`` a bigint, ``avg(i)`` a numeric ...) bound to the case's value, ``FROM rt``
  dropped and HAVING read as the WHERE of the one row: its rows as text, or its SQLSTATE;
* dpproxy's: the outer statement (``plan.post``) described and run with the plan's release types
  (``release_params``' types: each aggregate's ``result_type_oid``) bound to the same values, each
  found by the aggregate's kind and column; without an outer statement, the plan's own columns
  (``result_fields``), the values being the release itself.

A :class:`tests.round_trip.Mismatch` is a case whose names, type OIDs, rows or SQLSTATE differ.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg import pq

from proxy.dp.answer import result_fields
from rewriter.dp_query import AggregateQuery
from tests.output_generator import AGGREGATES, OutputCase
from tests.round_trip import Checked, Mismatch, RoundTrip, sqlstate

__all__ = ["OutputRoundTrip"]

Outcome = tuple[Any, ...]


class OutputRoundTrip:
    """Runs :mod:`tests.output_generator` cases through dpproxy's plan and its outer statement, and
    through PostgreSQL, on the database at ``dsn``."""

    def __init__(self, trip: RoundTrip, dsn: str) -> None:
        self._trip = trip
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._conn.execute("SET statement_timeout = 5000")
        self._types = {text: self._described(f"SELECT {text} FROM rt", [])[1][0] for text in AGGREGATES}

    def close(self) -> None:
        self._conn.close()

    def check(self, cases: Iterable[OutputCase], first: bool = False) -> Checked:
        """Check each case (``first``: stop at the first mismatch)."""
        checked = Checked()
        for case, decision in self._trip.planned(cases, lambda case: case.statement, checked, first):
            plan = decision.plan
            values = self._released(plan, case)
            if values is None:  # an aggregate the generator does not name (cannot happen: counted, not compared)
                continue
            checked.evaluated += 1
            asked = self._analysts(case, rows=plan.post is not None)
            ran = self._dpproxys(plan, values)
            if asked != ran:
                checked.mismatches.append(Mismatch(case.statement, repr(case.released), plan.post.sql if plan.post else
                                                   "(no outer statement)", (asked, ran)))
        return checked

    def _released(self, plan: AggregateQuery, case: OutputCase) -> list[bytes | None] | None:
        """The value of each of ``plan``'s aggregates, as the case releases the one of that kind and column."""
        by_identity = {AGGREGATES[text]: value for text, value in case.released.items()}
        identities = [(agg.kind, agg.column.name if agg.column is not None else None) for agg in plan.aggregates]
        if any(identity not in by_identity for identity in identities):
            return None
        return [by_identity[identity] for identity in identities]

    def _analysts(self, case: OutputCase, rows: bool) -> Outcome:
        """PostgreSQL's columns for the statement, and (``rows``) its rows over the case's values (or SQLSTATE)."""
        names, types = self._described(case.statement, [])
        if names is None:
            return ("error", types)
        if not rows:
            return (names, types, None)
        texts = sorted(case.released, key=len, reverse=True)
        outer = case.statement.replace(" FROM rt", "").replace(" HAVING ", " WHERE ")
        for number, text in enumerate(texts, start=1):
            outer = outer.replace(text, f"${number}")
        rows = self._rows(outer, [case.released[text] for text in texts], [self._types[text] for text in texts])
        return (names, types, rows)

    def _dpproxys(self, plan: AggregateQuery, values: list[bytes | None]) -> Outcome:
        """dpproxy's columns for the statement, and its outer statement's rows over ``values``."""
        release_types = [agg.result_type_oid for agg in plan.aggregates]
        if plan.post is None:
            fields = result_fields(plan)  # the values as released: their encoding is checked elsewhere
            return ([field.name for field in fields], [field.type_oid for field in fields], None)
        names, types = self._described(plan.post.sql, release_types)
        if names is None:
            return ("error", types)
        return (names, types, self._rows(plan.post.sql, values, release_types))

    def _described(self, sql: str, param_types: Sequence[int]) -> tuple[list[str] | None, Any]:
        """(names, type OIDs) of ``sql``'s columns, or (None, its SQLSTATE)."""
        pgconn = self._conn.pgconn
        prepared = pgconn.prepare(b"", sql.encode(), list(param_types) or None)
        if prepared.status != pq.ExecStatus.COMMAND_OK:
            return None, sqlstate(prepared)
        described = pgconn.describe_prepared(b"")
        columns = range(described.nfields)
        return [(described.fname(c) or b"").decode() for c in columns], [described.ftype(c) for c in columns]

    def _rows(self, sql: str, values: Sequence[bytes | None], types: Sequence[int]) -> Any:
        result = self._conn.pgconn.exec_params(sql.encode(), list(values), list(types))
        if result.status != pq.ExecStatus.TUPLES_OK:
            return ("error", sqlstate(result))
        return [tuple(None if (value := result.get_value(r, c)) is None else value.decode() for c in range(result.nfields))
                for r in range(result.ntuples)]
