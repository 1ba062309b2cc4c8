"""The round-trip check of bound parameters: what PostgreSQL reads in a prepared statement with its
declared types and bound values, against what dpproxy's backend receives for it (the backend SQL and
the parameter types it is sent with), compared on the round-trip table (docs/threat-model.md, "The
round-trip check"; cases from :mod:`tests.parameter_generator`).

For each case dpproxy plans, the statement goes through the executor's steps before the charge, as
they are: the declared types' checks (``check_parameter_types``, ``check_numeric_parameters``), the raw conjuncts the types settle
(``settled_lists``), the folding of row-independent expressions with the bound values in a backend
session of dpproxy's own (``bind_constants``, which may describe the backend SQL to learn the types of
unspecified parameters). Then

* the analyst's reading: the statement is described on PostgreSQL with the declared types (the
  parameter types it infers, or its error), and its condition chooses rows of the round-trip table
  with the values bound to those types;
* the backend's: the backend SQL is described with the types dpproxy sends (the types the backend
  infers, or its error), and its WHERE and the released aggregate's FILTER choose rows with the same
  values bound to those.

A :class:`tests.round_trip.Mismatch` is a case dpproxy answers (its steps before the charge pass)
whose rows, or SQLSTATE, differ from the analyst's: the charge buys an answer to another question.
A step before the charge that fails with another SQLSTATE than PostgreSQL's reading (both uncharged)
is kept apart (:attr:`ParameterChecked.uncharged`), as are the types dpproxy describes to the client
where they differ from the analyst's statement's (:attr:`ParameterChecked.described`). Everything
runs under the first of :data:`tests.constant_values.PROFILES`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import pq

from policies.errors import Refusal
from policies.model import Policy
from proxy.backend.connection import BackendSession, BoundParams, connect
from proxy.backend.errors import BackendError
from proxy.dp.folding import bind_constants
from proxy.dp.parameter_types import check_listed_parameters, check_numeric_parameters, check_parameter_types, settled_lists
from proxy.dp.percentile_params import bind_fractions, fraction_param_types
from rewriter.rewrite import backend_sql
from tests.constant_values import PROFILES
from tests.parameter_generator import ParameterCase
from tests.round_trip import ALIKE, READ, Checked, Mismatch, RoundTrip, backend_condition, sqlstate

__all__ = ["ParameterChecked", "ParameterRoundTrip"]

_ROWS = "SELECT coalesce(array_agg(id ORDER BY id), '{{}}')::text FROM " + READ + " WHERE {}"


@dataclass
class ParameterChecked(Checked):
    """:class:`tests.round_trip.Checked`, with the cases refused at their bound types or values,
    the uncharged SQLSTATE differences and the described parameter types that differ."""

    refused_bound: int = 0
    uncharged: list[Mismatch] = field(default_factory=list)
    described: list[Mismatch] = field(default_factory=list)


class ParameterRoundTrip:
    """Runs :mod:`tests.parameter_generator` cases through dpproxy's plan and pre-charge steps, and
    through PostgreSQL, on the database at ``dsn`` (``policy``: dpproxy's, for its own session)."""

    def __init__(self, trip: RoundTrip, policy: Policy, dsn: str) -> None:
        self._trip = trip
        self._loop = asyncio.new_event_loop()
        settings = _settings(PROFILES[0])
        self._session: BackendSession = self._loop.run_until_complete(connect(policy))
        for setting in settings:
            self._loop.run_until_complete(self._session.execute(f"SET {setting}"))
        self._conn = psycopg.connect(dsn, autocommit=True)
        for setting in settings:
            self._conn.execute(f"SET {setting}")

    def close(self) -> None:
        self._conn.close()
        self._loop.run_until_complete(self._session.close())
        self._loop.close()

    def check(self, cases: Iterable[ParameterCase], first: bool = False) -> ParameterChecked:
        """Check each case (``first``: stop at the first mismatch)."""
        checked = ParameterChecked()
        for case, decision in self._trip.planned(cases, lambda case: case.statement, checked, first):
            analyst_types, asked = self._read(case.statement, case.condition, case.types, case.values)
            described, _ = self._described(backend_sql(settled_lists(decision.plan, case.types), seed=0),
                                           fraction_param_types(decision.plan, case.types))
            if analyst_types is not None and described is not None and described != analyst_types:
                checked.described.append(Mismatch(case.statement, f"types {analyst_types}", f"types {described}",
                                                  (asked, ("described", case.types))))
            params = BoundParams(case.values, [0] * len(case.values), case.types)
            try:
                plan, params = bind_fractions(decision.plan, params)
                check_parameter_types(plan, params)
                check_numeric_parameters(plan, params)
                check_listed_parameters(plan, params)
                plan = settled_lists(plan, params.types)
                plan, params = self._loop.run_until_complete(bind_constants(plan, params, self._session))
            except Refusal:
                checked.refused_bound += 1
                continue
            except BackendError as exc:  # PostgreSQL's error folding a value: before any charge
                if asked != ("error", exc.sqlstate) and (asked, ("error", exc.sqlstate)) not in ALIKE:
                    checked.uncharged.append(Mismatch(case.statement, case.condition, "(folding)",
                                                      (asked, ("error", exc.sqlstate))))
                continue
            sql = backend_sql(plan, seed=0)
            ran = backend_condition(sql) or "TRUE"
            checked.evaluated += 1
            _, outcome = self._read(sql, ran, params.types, params.values)
            if outcome != asked and (asked, outcome) not in ALIKE:
                checked.mismatches.append(Mismatch(case.statement, f"{case.condition} {_shown(case)}",
                                                   f"{ran} types {tuple(params.types)}", (asked, outcome)))
        return checked

    def _read(self, statement: str, condition: str, types: Sequence[int],
              values: Sequence[bytes | None]) -> tuple[list[int] | None, tuple[str, Any]]:
        """The parameter types PostgreSQL infers for ``statement`` declared ``types`` (None where it
        fails), and the rows ``condition`` chooses with ``values`` bound to them (or the SQLSTATE)."""
        inferred, error = self._described(statement, types)
        if inferred is None:
            return None, ("error", error)
        query = _ROWS.format(condition)
        self._conn.execute("BEGIN")
        try:
            result = self._conn.pgconn.exec_params(query.encode(), list(values), inferred)
            if result.status != pq.ExecStatus.TUPLES_OK:
                return inferred, ("error", sqlstate(result))
            return inferred, ("value", result.get_value(0, 0).decode() if result.ntuples else None)
        finally:
            self._conn.execute("ROLLBACK")

    def _described(self, statement: str, types: Sequence[int]) -> tuple[list[int] | None, str | None]:
        """The parameter types PostgreSQL infers for ``statement`` with ``types`` declared, or its SQLSTATE."""
        pgconn = self._conn.pgconn
        result = pgconn.prepare(b"", statement.encode(), list(types) or None)
        if result.status != pq.ExecStatus.COMMAND_OK:
            return None, sqlstate(result)
        described = pgconn.describe_prepared(b"")
        return [described.param_type(i) for i in range(described.nparams)], None


def _settings(profile: tuple[str, str, str, int]) -> list[str]:
    zone, date_style, interval_style, float_digits = profile
    return ["statement_timeout = 5000", f"TimeZone = '{zone}'", f"DateStyle = '{date_style}'",
            f"IntervalStyle = '{interval_style}'", f"extra_float_digits = {float_digits}"]


def _shown(case: ParameterCase) -> str:
    return f"types {case.types} values {case.values}"
