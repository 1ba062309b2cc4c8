"""The round-trip check of GROUP BY keys: the cell each row lands in through dpproxy's backend SQL
against PostgreSQL's evaluation of the analyst's key, and a grouped statement's whole answer, the
noise off, against PostgreSQL's (docs/threat-model.md, "The round-trip check"; statements from
:mod:`tests.key_generator` over ``gk``, :mod:`tests.key_data`).

dpproxy groups each row by its *cell* (rewriter/group_keys.py: a per-row CASE or hashed ``= ANY``
of a category, an integer within its bounds, a bin's or a time bucket's index within the declared
range) and releases each cell under a label from the policy, of which its outer statement
(rewriter/post_process.py) computes the analyst's key. Where that is not PostgreSQL's key for a
row, the row is counted under another key than the one it has: a hole in what comes back.

:meth:`KeyRoundTrip.cells`, for ``SELECT <keys>, count(*) AS n FROM gk GROUP BY ...``, under the
profiles of :data:`ZONES` (TimeZone and DateStyle; the backend session has the client's):

* dpproxy's cell of each row: its backend SQL run once a row (``LATERAL``, the table read as that
  row alone), each group's keys read by ``GroupKey.cell_of`` and ``KeyDomain.cell`` as the release
  reads them; each cell's key as the outer statement computes it from the cell's labels
  (``KeyDomain.labels``), released with the cell's number as its count;
* PostgreSQL's key of each row: the key expressions evaluated on the row (row by row where the
  table as a whole fails: that row is in PostgreSQL's answer nowhere).

A row counted under a key that is not PostgreSQL's (the ``other`` cell excepted, for a value no
declared category's key is), or counted where PostgreSQL fails on it, or left out of every cell
though it is within the key's declared domain and PostgreSQL's key is a cell's, is a mismatch.

:meth:`KeyRoundTrip.answers`: a statement with a condition, HAVING, ORDER BY, LIMIT, OFFSET, derived
tables and CTEs around or under the aggregate. Both run on the rows within every key's declared
domain (``other``'s rows left out): PostgreSQL's answer of the statement, against dpproxy's outer
statement over its release with the noise off (each cell's exact ``count(*)`` from the backend SQL;
the statement asks ``HAVING count(*) > 0``, so the empty cells, which dpproxy releases and
PostgreSQL has no group for, drop out). Rows (in order where the statement orders them), or SQLSTATE,
must agree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import pq

from proxy.backend.connection import ResultSet
from policies.errors import Refusal
from proxy.dp.answer import DPAnswer, release_params
from rewriter.classify import DPQuery
from rewriter.dp_query import Aggregate, AggregateQuery
from rewriter.group_keys import TIMESTAMPTZ, GroupKey
from rewriter.rewrite import backend_sql, split_cells
from rewriter.types import INTEGER_TYPES
from tests.key_generator import KeyCase
from tests.round_trip import Mismatch, RoundTrip, sqlstate

__all__ = ["KeyChecked", "KeyRoundTrip", "ZONES", "regular_rows"]

# Session profiles: TimeZone and DateStyle (a DST zone, one of half hours, one a day ahead of UTC, one
# whose DST starts and ends at midnight: 2000-10-08 has no 00:00, 2000-02-26 two 23:00s)
ZONES = (("UTC", "ISO, MDY"), ("America/St_Johns", "SQL, DMY"), ("Europe/Berlin", "German, DMY"),
         ("Pacific/Kiritimati", "Postgres, MDY"), ("America/Sao_Paulo", "ISO, DMY"))
Rows = list[tuple[str | None, ...]]
Outcome = tuple[str, Any]  # ("rows", Rows) or ("error", SQLSTATE)
_TABLE = re.compile(r'"public"\."gk"( AS\b)?')
_FROM = re.compile(r"\bFROM gk\b")


@dataclass
class KeyChecked:
    """Sizes of a run: statements generated, planned (a GROUP BY dpproxy answers), compared (statement ×
    profile), rows compared (the cells check) and set apart, refusals compared with PostgreSQL's outcome,
    the SQLSTATE differences listed, mismatches, and the planned statements by kind of key."""

    generated: int = 0
    planned: int = 0
    compared: int = 0
    rows: int = 0
    dropped: int = 0  # rows outside a key's declared domain left out of every cell (as documented)
    failing: int = 0  # rows dpproxy counts whose key PostgreSQL fails to compute (the row's value decides)
    claimed: int = 0  # statements refused with a SQLSTATE of PostgreSQL's own (class 42 or 22)
    uncharged: list[str] = field(default_factory=list)  # refused with another SQLSTATE than PostgreSQL fails with
    mismatches: list[Mismatch] = field(default_factory=list)
    kinds: dict[str, int] = field(default_factory=dict)  # planned statements by the kind of each key


def _read_as(backend: str, rows: str) -> str:
    """``backend`` with ``gk`` read as the subquery ``rows``."""
    return _TABLE.sub(lambda match: f"({rows}) AS" if match.group(1) else f'({rows}) AS "gk"', backend)


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def regular_rows(key: GroupKey) -> str:
    """The condition on a ``gk`` row that it is within ``key``'s declared domain, ``other`` left out:
    a declared category (by the column's ``=``), an integer or floor bin's column within its bounds, a
    bin's not NULL or NaN, a time within the declared range (its last day included; an epoch bucket's
    range in UTC, as Grafana's buckets are counted)."""
    column, policy = f'gk."{key.column.name}"', key.column.policy
    assert policy is not None
    if key.kind == "category":
        assert policy.categories is not None
        return f"{column} = ANY(CAST(ARRAY[{', '.join(map(_literal, policy.categories))}] AS {key.column.type_name}[]))"
    if key.kind == "bin":
        return f"{column} IS NOT NULL" + ("" if key.column.type_oid in INTEGER_TYPES else f" AND {column} <> 'NaN'")
    if key.kind in ("time", "epoch"):
        assert policy.time_bounds is not None
        lo, hi = policy.time_bounds
        kind = key.column.type_name
        zone = "+00" if key.kind == "epoch" and key.column.type_oid == TIMESTAMPTZ else ""  # epoch buckets are UTC days
        return (f"{column} >= CAST({_literal(lo.isoformat(sep=' ') + zone)} AS {kind}) "
                f"AND {column} < CAST({_literal(hi.isoformat(sep=' ') + zone)} AS {kind}) + interval '1 day'")
    assert policy.bounds is not None
    return f"{column} BETWEEN {policy.bounds[0]!r} AND {policy.bounds[1]!r}"


def _other(key: GroupKey, label: str) -> bool:
    """Whether ``label`` is ``key``'s ``other`` cell's."""
    policy = key.column.policy
    return key.kind == "category" and policy is not None and policy.other is not None and label == key.column.labels()[-1]


def _exact_answer(plan: AggregateQuery, counts: list[int]) -> DPAnswer:
    """A release of ``plan``'s cells with the noise off: each cell's labels and its count (the cells
    check releases each cell's number as its count, to tell the outer statement's rows apart)."""
    released: list[list[bytes | None]] = [[*(label.encode() for label in labels), str(count).encode()]
                                          for labels, count in zip(plan.domain.labels(), counts)]
    return DPAnswer(ResultSet([], released, ""), 0.0, 0.0, ())


class KeyRoundTrip:
    """Plans statements as dpproxy does (through ``trip``) and compares their cells and answers with
    PostgreSQL's on the database at ``dsn``, each under :data:`ZONES`' first profile and one other in
    turn (or, ``all_profiles``, under each)."""

    def __init__(self, trip: RoundTrip, dsn: str, all_profiles: bool = False) -> None:
        self._trip = trip
        self._all_profiles = all_profiles
        self._connections: list[psycopg.Connection[Any]] = []
        for zone, date_style in ZONES:
            conn = psycopg.connect(dsn, autocommit=True)
            for setting in ("statement_timeout = 5000", f"TimeZone = '{zone}'", f"DateStyle = '{date_style}'"):
                conn.execute(f"SET {setting}")
            self._connections.append(conn)

    def close(self) -> None:
        for conn in self._connections:
            conn.close()

    # ------------------------------------------------------------ the cells of each row

    def cells(self, cases: Iterable[KeyCase], first: bool = False) -> KeyChecked:
        """Check each case's cells row by row (``first``: stop at the first mismatch)."""
        checked = KeyChecked()
        for index, (case, decision) in enumerate(self._planned(cases, checked, first)):
            plan = decision.plan
            for conn in self._profiles(index):
                checked.compared += 1
                found = self._cell_mismatch(conn, case.statement, plan, list(case.keys), checked)
                if found is not None:
                    checked.mismatches.append(found)
                    break
        return checked

    def _profiles(self, index: int) -> list[psycopg.Connection[Any]]:
        """The sessions the ``index``-th statement is checked in: the first profile's (UTC) and, in
        turn, one other (every profile with ``all_profiles``)."""
        if self._all_profiles or len(self._connections) < 3:
            return self._connections
        return [self._connections[0], self._connections[1 + index % (len(self._connections) - 1)]]

    def _planned(self, cases: Iterable[KeyCase], checked: KeyChecked, first: bool) -> Iterator[tuple[KeyCase, DPQuery]]:
        """Each of ``cases`` dpproxy plans as a GROUP BY, with its plan; a refusal that claims PostgreSQL's
        own error (a SQLSTATE of class 42 or 22) is compared with PostgreSQL's outcome on ``gk`` first."""
        for case in cases:
            if first and checked.mismatches:
                return
            checked.generated += 1
            decision = self._trip.decide(case.statement)
            if isinstance(decision, Refusal):
                self._refused(case.statement, decision, checked)
                continue
            if decision is None or not decision.plan.groups:
                continue
            checked.planned += 1
            for kind in case.kinds:
                checked.kinds[kind] = checked.kinds.get(kind, 0) + 1
            yield case, decision

    def _refused(self, statement: str, refusal: Refusal, checked: KeyChecked) -> None:
        """A refusal as PostgreSQL's error (``42803``, ``42703`` ...) where PostgreSQL answers is a
        mismatch; where it fails otherwise, a SQLSTATE difference (both uncharged)."""
        if refusal.sqlstate[:2] not in ("42", "22"):
            return
        checked.claimed += 1
        asked = _outcome(self._connections[0], statement)
        if asked[0] == "rows":
            checked.mismatches.append(Mismatch(statement, "PostgreSQL answers", f"refused: {refusal}",
                                               (("rows",), ("error", refusal.sqlstate))))
        elif asked[1] != refusal.sqlstate:
            checked.uncharged.append(f"{statement!r}: PostgreSQL {asked[1]}, dpproxy {refusal.sqlstate} ({refusal})")

    def _cell_mismatch(self, conn: psycopg.Connection[Any], statement: str, plan: AggregateQuery,
                       keys: list[str], checked: KeyChecked) -> Mismatch | None:
        zone = conn.execute("SHOW TimeZone").fetchone()
        where = f"under TimeZone {zone[0] if zone else '?'}"
        labels = list(plan.domain.labels())
        cell_keys = self._cell_keys(conn, plan, labels)
        if cell_keys[0] == "error":
            return Mismatch(statement, where, "outer statement over every cell", (("answered",), cell_keys))
        released: dict[int, tuple[str | None, ...]] = cell_keys[1]
        ran = _row_cells(conn, plan)
        if ran[0] == "error":
            return Mismatch(statement, where, "the backend SQL row by row", (("answered",), ran))
        counted: dict[int, int] = {}
        for row_id, cell in ran[1]:
            if cell is not None:
                if cell not in released:  # split_cells would count it in cell -1 (the last), or fail
                    return Mismatch(statement, where, f"row {row_id}", (("a cell",), ("cell", cell, "of", len(labels))))
                if int(row_id or 0) in counted:
                    return Mismatch(statement, where, f"row {row_id}", (("one cell",), ("cells", counted[int(row_id or 0)], cell)))
                counted[int(row_id or 0)] = cell
        regular = " AND ".join(f"({regular_rows(key)})" for key in plan.groups)
        asked = self._keys_of_rows(conn, keys, regular)
        cell_of_text = {texts: cell for cell, texts in released.items()}
        for row_id, (texts, within) in sorted(asked.items()):
            checked.rows += 1
            cell = counted.get(row_id)
            if cell is None:
                if texts is not None and texts in cell_of_text and within:
                    return Mismatch(statement, where, f"row {row_id}", (("cell", texts), ("in no cell",)))
                checked.dropped += texts is not None and texts in cell_of_text
                continue
            if texts is None:  # a value PostgreSQL cannot compute the key of (f / 3 underflows, 22003; the year of
                checked.failing += 1  # infinity as an integer, 0A000), which no error of dpproxy's may tell
                continue
            for index, (key, asked_text, ran_text) in enumerate(zip(plan.groups, texts, released[cell])):
                if asked_text == ran_text:
                    continue
                declared = {other[index] for other_cell, other in released.items()
                            if not _other(key, labels[other_cell][index])}
                if _other(key, labels[cell][index]) and asked_text not in declared:
                    continue  # an undeclared value or NULL, in other
                return Mismatch(statement, where, f"row {row_id}", (("key", texts), ("cell", released[cell])))
        return None

    @staticmethod
    def _cell_keys(conn: psycopg.Connection[Any], plan: AggregateQuery,
                   labels: list[tuple[str, ...]]) -> Outcome:
        """Each cell's keys as the outer statement computes them from its labels (``("rows", {cell:
        keys})``), the cell's number released as its count; or the outer statement's SQLSTATE."""
        if plan.post is None:
            return ("rows", dict(enumerate(labels)))
        params = release_params(plan, _exact_answer(plan, list(range(len(labels)))))
        outcome = _outcome(conn, plan.post.sql, params.values, params.types)
        if outcome[0] == "error":
            return outcome
        return ("rows", {int(row[-1] or 0): tuple(row[:-1]) for row in outcome[1]})

    @staticmethod
    def _keys_of_rows(conn: psycopg.Connection[Any], keys: list[str], regular: str
                      ) -> dict[int, tuple[tuple[str | None, ...] | None, bool]]:
        """Each row's keys as PostgreSQL evaluates them (None where it fails on the row), and
        whether the row is within every key's declared domain."""
        query = f"SELECT id, ({regular}), {', '.join(keys)} FROM gk"
        whole = _outcome(conn, query)
        if whole[0] == "rows":
            return {int(row[0] or 0): (tuple(row[2:]), row[1] == "t") for row in whole[1]}
        found: dict[int, tuple[tuple[str | None, ...] | None, bool]] = {}
        ids = _outcome(conn, f"SELECT id, ({regular}) FROM gk")
        assert ids[0] == "rows", (regular, ids)
        for row_id, within in ids[1]:
            one = _outcome(conn, f"{query} WHERE id = {row_id}")
            assert one[0] == "rows" or not str(one[1]).startswith("42"), (query, one)  # the row's value decides
            found[int(row_id or 0)] = (tuple(one[1][0][2:]) if one[0] == "rows" else None, within == "t")
        return found

    # ------------------------------------------------------------ every aggregate's parts per cell

    def parts(self, cases: Iterable[KeyCase], first: bool = False) -> KeyChecked:
        """Check each case's aggregates cell by cell (``first``: stop at the first mismatch): the
        parts dpproxy releases a cell from, of its backend SQL over the whole of ``gk`` (the rows of
        every cell, ``other``'s among them, grouped as they are served), against PostgreSQL's own
        aggregates (:func:`_expected_parts`) over the rows dpproxy puts in that cell (the cells
        check pins those rows to PostgreSQL's keys)."""
        checked = KeyChecked()
        for index, (case, decision) in enumerate(self._planned(cases, checked, first)):
            plan = decision.plan
            expected_sql = [_expected_parts(agg) for agg in plan.aggregates]
            if plan.series is not None or None in expected_sql:
                continue
            for conn in self._profiles(index):
                checked.compared += 1
                found = self._parts_mismatch(conn, case.statement, plan, ", ".join(map(str, expected_sql)), checked)
                if found is not None:
                    checked.mismatches.append(found)
                    break
        return checked

    @staticmethod
    def _parts_mismatch(conn: psycopg.Connection[Any], statement: str, plan: AggregateQuery, expected_sql: str,
                        checked: KeyChecked) -> Mismatch | None:
        zone = conn.execute("SHOW TimeZone").fetchone()
        where = f"under TimeZone {zone[0] if zone else '?'}"
        cells = _row_cells(conn, plan)
        grouped = _outcome(conn, _read_as(backend_sql(plan, seed=0), "SELECT * FROM public.gk"))
        if cells[0] == "error" or grouped[0] == "error":
            return Mismatch(statement, where, "the backend SQL", (("answered",), cells if cells[0] == "error" else grouped))
        keys = len(plan.groups)
        rows: list[list[Any]] = [[None if value is None else value.encode() for value in row[:keys]]
                                 + [None if value is None else int(value) for value in row[keys:]] for row in grouped[1]]
        members: dict[int, list[str]] = {}
        for row_id, cell in cells[1]:
            if cell is not None:
                members.setdefault(cell, []).append(str(row_id))
        for cell, parts in enumerate(split_cells(plan, rows)):
            checked.rows += 1
            ids = ",".join(members.get(cell, []))
            asked = _outcome(conn, f"SELECT {expected_sql} FROM gk WHERE id = ANY('{{{ids}}}'::int[])")
            released = tuple(_number(value) for agg in parts for value in agg)
            if asked[0] == "error" or tuple(_number(value) for value in asked[1][0]) != released:
                return Mismatch(statement, where, f"cell {cell} ({list(plan.domain.labels())[cell]}), rows {ids}",
                                (asked, ("parts", released)))
        return None

    # ------------------------------------------------------------ whole answers, the noise off

    def answers(self, cases: Iterable[KeyCase], first: bool = False) -> KeyChecked:
        """Check each case's answer on the rows within its keys' declared domains (``first``: stop
        at the first mismatch)."""
        checked = KeyChecked()
        for index, (case, decision) in enumerate(self._planned(cases, checked, first)):
            plan = decision.plan
            if plan.series is not None or any(agg.kind != "count" for agg in plan.aggregates):
                continue
            for conn in self._profiles(index):
                checked.compared += 1
                regular = self._computed_rows(conn, plan, list(case.keys))
                asked = _outcome(conn, _FROM.sub(f"FROM (SELECT * FROM gk WHERE {regular} OFFSET 0) AS gk", case.statement))
                ran = self._released(conn, plan, regular)
                if "ORDER BY" not in case.statement:
                    asked, ran = _unordered(asked), _unordered(ran)
                if asked != ran:
                    zone = conn.execute("SHOW TimeZone").fetchone()
                    checked.mismatches.append(Mismatch(case.statement, f"under TimeZone {zone[0] if zone else '?'}",
                                                       plan.post.sql if plan.post else "(no outer statement)",
                                                       (asked, ran)))
                    break
        return checked

    def _computed_rows(self, conn: psycopg.Connection[Any], plan: AggregateQuery, keys: list[str]) -> str:
        """The condition on a ``gk`` row that it is within every key's declared domain and PostgreSQL
        computes its keys (a value whose key fails, 22003, is left out: dpproxy answers without it)."""
        regular = " AND ".join(f"({regular_rows(key)})" for key in plan.groups)
        rows = self._keys_of_rows(conn, keys, regular)
        chosen = [str(row_id) for row_id, (texts, within) in rows.items() if texts is not None and within]
        return f"gk.id = ANY('{{{','.join(chosen)}}}'::int[])"

    @staticmethod
    def _released(conn: psycopg.Connection[Any], plan: AggregateQuery, regular: str) -> Outcome:
        """dpproxy's answer with the noise off: the backend SQL over the rows ``regular`` chooses,
        each cell's exact counts released, the outer statement over them."""
        ran = _outcome(conn, _read_as(backend_sql(plan, seed=0), f"SELECT * FROM public.gk WHERE {regular} OFFSET 0"))
        if ran[0] == "error":
            return ran
        keys = len(plan.groups)
        rows: list[list[Any]] = [[None if value is None else value.encode() for value in row[:keys]]
                                 + [None if value is None else int(value) for value in row[keys:]] for row in ran[1]]
        counts = [int(parts[0][0] or 0) for parts in split_cells(plan, rows)]
        answer = _exact_answer(plan, counts)
        if plan.post is None:
            return ("rows", [tuple(None if value is None else value.decode() for value in row) for row in answer.result.rows])
        params = release_params(plan, answer)
        return _outcome(conn, plan.post.sql, params.values, params.types)


def _row_cells(conn: psycopg.Connection[Any], plan: AggregateQuery) -> Outcome:
    """dpproxy's cell of each ``gk`` row (``("rows", [(id, cell or None)])``): its backend SQL run
    once a row (``LATERAL``, the table read as that row alone), each group's keys read by
    ``GroupKey.cell_of`` and ``KeyDomain.cell`` as the release reads them; or its SQLSTATE."""
    lateral = (f"SELECT __row.id, __cells.* FROM public.gk AS __row CROSS JOIN LATERAL "
               f"({_read_as(backend_sql(plan, seed=0), 'SELECT * FROM public.gk WHERE gk.id = __row.id')}) AS __cells")
    ran = _outcome(conn, lateral)
    if ran[0] == "error":
        return ran
    return ("rows", [(row[0], plan.domain.cell([key.cell_of(None if value is None else value.encode())
                                                for key, value in zip(plan.groups, row[1:len(plan.groups) + 1])]))
                     for row in ran[1]])


def _expected_parts(agg: Aggregate) -> str | None:
    """PostgreSQL's own aggregates that ``agg``'s backend parts (``rewriter.rewrite.aggregate_parts``)
    must equal over a cell's rows, written from what the analyst asked: ``count(*)``, ``count([DISTINCT]
    col)`` (PostgreSQL's ``=`` telling values apart), a SUM's or ``sum_count`` AVG's total of the
    integer column clamped to its bounds (and its count), a MODE's count of each declared category
    by the column's ``=``; None for what the parts check does not compare (a FILTER, another kind or
    mechanism, a column of another type)."""
    if agg.filter_sql is not None:
        return None
    if agg.column is None:
        return "count(*)"
    column, policy = f'gk."{agg.column.name}"', agg.column.policy
    if agg.kind == "count":
        return f"count({'DISTINCT ' if agg.distinct else ''}{column})"
    if agg.kind == "mode" and policy is not None and policy.categories is not None:
        return ", ".join(f"count(*) FILTER (WHERE {column} = {_literal(category)})" for category in policy.categories)
    if (agg.kind == "sum" or agg.mechanism == "sum_count") and agg.column.type_oid in INTEGER_TYPES:
        assert policy is not None and policy.bounds is not None
        lo, hi = (int(bound) for bound in policy.bounds)  # NULL stays NULL (LEAST/GREATEST would make it lo)
        total = f"sum(CASE WHEN {column} < {lo} THEN {lo} WHEN {column} > {hi} THEN {hi} ELSE {column} END)"
        return total if agg.kind == "sum" else f"{total}, count({column})"
    return None


def _number(value: Any) -> int:
    """A part's value as an integer: NULL (an empty set's sum) is 0, as the mechanisms read it."""
    return 0 if value is None else int(value)


def _unordered(outcome: Outcome) -> Outcome:
    return (outcome[0], sorted(outcome[1], key=repr)) if outcome[0] == "rows" else outcome


def _outcome(conn: psycopg.Connection[Any], sql: str, values: Any = None, types: Any = None) -> Outcome:
    """``sql``'s rows as text, or its SQLSTATE."""
    result = conn.pgconn.exec_params(sql.encode(), list(values or []), list(types or []) or None)
    if result.status != pq.ExecStatus.TUPLES_OK:
        return ("error", sqlstate(result))
    return ("rows", [tuple(None if (value := result.get_value(r, c)) is None else value.decode()
                           for c in range(result.nfields)) for r in range(result.ntuples)])
