"""Values of a declared size read through their in-line check, and the one hashed raw conjunct that
keeps a plain index (rewriter/text_bounds.py ``declared_apart``, rewriter/raw_equality.py
``hashed_raw_equality``; docs/threat-model.md, Timing, values of a declared size stored apart).

A ``varchar(n)``/``char(n)`` within ``max_text_bytes``, a ``numeric(p, s)`` and an ``int8range``
were read as they are, so a value a wide row stored apart was fetched again by each reference
(tests/test_attack_stop40.py pins the buffers). Each reference now reads the bounded value, and a
WHERE's first top-level ``=``/IN of literals on such a column also compares the raw column as one
hashed ``= ANY``, AND'ed before the condition. Pinned here: where the conjunct goes and where it
does not, that answers are the bounded form's (a value stored apart reads as NULL, as on a
neighbour holding NULL there, and in-line values as plain SQL reads them), and that a plain B-tree
index serves a selective ``=`` and IN through the rewriter's SQL.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal

import psycopg
import pytest

from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from proxy.dp.parameter_types import settled_lists
from rewriter.dp_query import plan_aggregate_query
from rewriter.rewrite import backend_sql
from rewriter.text_bounds import in_line_numeric, in_line_text, read_in_place, read_through
from tests.backend_sql_audit import AuditColumn, audit_backend_sql
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.plan_nodes import plan_node_types
from tests.post_charge_wait import WIDE_PAD, keep_apart
from tests.raw_reads import projected, raw_reads
from tests.released_sql import recording_released_sql

_HASHED_FROM = 9  # PostgreSQL hashes x = ANY (<constant array>) from 9 values (MIN_ARRAY_SIZE_FOR_HASHED_SAOP)
_NUMERIC_60 = (60 << 16) + 4  # numeric(60, 0)'s type modifier
_COLUMNS = (ColumnInfo("id", 23, -1, 1, None), ColumnInfo("v", 1043, 64 + 4, 2, None),
            ColumnInfo("c", 1042, 64 + 4, 3, None), ColumnInfo("n", 1700, _NUMERIC_60, 4, ColumnPolicy(bounds=(0, 100))),
            ColumnInfo("r", 3926, -1, 5, None), ColumnInfo("b", 1560, 200, 6, None),
            ColumnInfo("tiny", 1043, 5 + 4, 7, None), ColumnInfo("pad", 25, -1, 8, None))


_DECLARED = ("v", "c", "n", "r", "b")  # the columns of a declared size read through their in-line check


def _raw_name(sql: str, quoted: str) -> str:
    """The name ``sql`` compares the raw value of the column ``quoted`` by: the column itself where the
    bound is written in place, its raw output where the table is read through a projection (tests/raw_reads.py)."""
    column = quoted.strip('"')
    return re.findall(rf'{quoted} AS ("_*raw \d+")', sql)[0] if projected(sql, column) else quoted


def _relation(name: str) -> Relation:
    return Relation(1, "public", name, TablePolicy(epsilon=1.0), {column.name: column for column in _COLUMNS})


def _sql(statement: str, table: str = "dr") -> str:
    return backend_sql(plan_aggregate_query(statement.replace("{t}", table), _relation(table)), 0)


@pytest.mark.parametrize("where, raw, cast", [
    ("v = 'a'", '"v"', "text"), ("'a' = v", '"v"', "text"), ("v IN ('a', 'b')", '"v"', "text"),
    ("v = 'a' AND id > 3", '"v"', "text"), ("id > 3 AND (v IN ('a', 'b') AND id < 9)", '"v"', "text"),
    ("c = 'a '", '"c"', "bpchar"), ("n = 1.5", '"n"', "numeric"), ("n IN (1, (-2), 'NaN')", '"n"', "numeric"),
    ("r = '[1,2)'", '"r"', "int8range"),
])
def test_a_top_level_equality_on_a_value_of_a_declared_size_adds_one_hashed_raw_conjunct(
        where: str, raw: str, cast: str) -> None:
    """The literals cast as the column's ``=`` casts them, without the column's modifier (which
    would round 1.5 or cut a string), repeated to the 9 values from which PostgreSQL hashes."""
    sql = _sql(f"SELECT count(*) FROM {{t}} WHERE {where}")
    assert sql.count(" ANY (ARRAY[") == 1, sql
    name = _raw_name(sql, raw)
    assert f"WHERE ({name} OPERATOR(pg_catalog.=) ANY (ARRAY[CAST(" in sql, sql
    listed = sql.split(" ANY (ARRAY[", 1)[1].split("]))", 1)[0]
    assert listed.count(f" AS pg_catalog.{cast})") == _HASHED_FROM, sql
    assert f"THEN {raw} END" in sql and sum(raw_reads(sql, column) for column in _DECLARED) == 1, sql


def test_each_column_gets_one_conjunct_for_its_first_construct() -> None:
    sql = _sql("SELECT count(*) FROM {t} WHERE v = 'a' AND v IN ('a', 'b') AND n = 1 AND c IN ('x', 'y')")
    assert sql.count(" ANY (ARRAY[") == 3, sql
    assert "'b' AS pg_catalog.text" not in sql, sql  # v's IN list, the second construct on v, has none


@pytest.mark.parametrize("where, conjunct", [
    ("v = $1", '("v" OPERATOR(pg_catalog.=) $1)'), ("$1 = c", '($1 OPERATOR(pg_catalog.=) "c")'),
    ("v IN ($1)", '("v" OPERATOR(pg_catalog.=) $1)'),
    ("n = $2", '("n" OPERATOR(pg_catalog.=) CAST($2 AS pg_catalog.numeric))'),
    ("r = $1 AND id > 3", '("r" OPERATOR(pg_catalog.=) $1)'),
    ("id > $2 AND (v = $1 AND id < 9)", '("v" OPERATOR(pg_catalog.=) $1)'),
])
def test_a_top_level_equality_with_one_parameter_adds_one_raw_comparison_after_the_condition(
        where: str, conjunct: str) -> None:
    """A bound parameter (BI tools' and drivers' filters) keeps the index too: one comparison of the
    raw column with the parameter as the bounded term reads it, in the term's order, AND'ed after the
    condition (which types the parameter first), uncast (so that ``=`` resolves and coerces as in
    the bounded term)."""
    sql = _sql(f"SELECT count(*) FROM {{t}} WHERE {where}")
    assert sql.endswith(f" AND {conjunct}"), sql
    assert " ANY (ARRAY[" not in sql and sum(raw_reads(sql, column) for column in _DECLARED) == 1, sql


@pytest.mark.parametrize("where", [
    "v = 'a' OR id > 3", "NOT (v = 'a')", "v NOT IN ('a', 'b')", "(v = 'a') IS TRUE", "v = $1 OR id > 3",
    "v IN ('a', $1)", "v IN ($1, CAST($2 AS text))", "v IN ($1, $2) AND id = $1", "b IN ($1, $2)", "NOT (v = $1)", "v = CAST($1 AS text)", "n = $1 + 1", "b = $1",
    "lower(v) = 'a'", "v > 'a'", "v <> 'a'", "v BETWEEN 'a' AND 'b'", "(v = 'a' AND id > 3) OR id < 0",
    "b = '1'", "v = c",
])
def test_no_raw_conjunct_where_it_could_fetch_again_change_the_answer_or_miss_a_value(where: str) -> None:
    """Under OR, NOT or IS TRUE a raw term could keep or fetch what the bounded one does not; a list
    mixing a parameter with other values, or a parameter with a cast one, or holding a parameter used
    elsewhere too (typed there), would be one array of a common type that may convert a value
    otherwise than its own term does (a list that missed a value would drop rows the condition
    keeps); a cast or a computed value is the analyst's own; ``bit``'s equality does not hash (a
    list would fetch once a value)."""
    sql = _sql(f"SELECT count(*) FROM {{t}} WHERE {where}")
    assert " ANY (ARRAY[" not in sql and not any(raw_reads(sql, column) for column in _DECLARED), sql


@pytest.mark.parametrize("where, raw, values, numbers", [
    ("v IN ($1, $2, $3)", '"v"', ["$1", "$2", "$3"], (1, 2, 3)),
    ("c IN ($2, $1) AND id > 3", '"c"', ["$2", "$1"], (2, 1)),
    ("v IN ($1, $1, $2)", '"v"', ["$1", "$2"], (1, 2)),
    ("n IN ($1, $2)", '"n"', ["CAST($1 AS pg_catalog.numeric)", "CAST($2 AS pg_catalog.numeric)"], ()),
    ("r IN ($1, $2)", '"r"', ["$1", "$2"], (1, 2)),
    ("id > $3 AND (v IN ($1, $2) AND id < 9)", '"v"', ["$1", "$2"], (1, 2)),
])
def test_a_top_level_list_of_parameters_adds_one_hashed_raw_conjunct_after_the_condition(
        where: str, raw: str, values: list[str], numbers: tuple[int, ...]) -> None:
    """A list of bound parameters (JDBC's, psycopg's, Superset's multi-value filters) keeps the index
    too: the raw column compared with the list as the terms render it, repeated to the 9 values from
    which PostgreSQL hashes a constant array (every statement is planned with its values bound),
    AND'ed after the condition (which types the parameters first); its bare parameters are named,
    for their declared types to settle whether it stays (proxy/dp/parameter_types.py)."""
    plan = plan_aggregate_query(f"SELECT count(*) FROM dr WHERE {where}", _relation("dr"))
    sql = backend_sql(plan, 0)
    listed = (values * _HASHED_FROM)[:_HASHED_FROM]
    conjunct = f"({raw} OPERATOR(pg_catalog.=) ANY (ARRAY[{', '.join(listed)}]))"
    assert sql.endswith(f" AND {conjunct.replace(raw, _raw_name(sql, raw), 1)}") and sql.count(" ANY (ARRAY[") == 1, sql
    assert [(read_in_place(listed.sql, plan.table), listed.parameters) for listed in plan.parameter_lists] == [(conjunct, numbers)]


@pytest.mark.parametrize("types, kept", [
    ((), True), ((0, 0), True), ((1043, 1043, 1043), True), ((25, 25), True), ((1042, 1042, 23), True),
    ((25, 1043), False), ((0, 25), False), ((25,), False), ((1042, 19), False), ((19, 19), False),
])
def test_a_list_of_parameters_keeps_its_raw_conjunct_only_when_they_are_declared_of_one_type(
        types: tuple[int, ...], kept: bool) -> None:
    """Bound (and described) with its parameters declared of different types, the list's raw conjunct
    is left out and the condition is the bounded one alone (a parameter past the declared ones is
    unspecified; $3's type is no list's). ``name`` (19) never: ``texteqname`` does not hash."""
    plan = plan_aggregate_query("SELECT count(*) FROM dr WHERE v IN ($1, $2) AND id > $3", _relation("dr"))
    settled = settled_lists(plan, types)
    assert (raw_reads(backend_sql(settled, 0), "v") > 0) is kept
    assert settled.parameter_lists == (plan.parameter_lists if kept else ())
    assert backend_sql(settled, 0) == backend_sql(plan, 0) if kept else read_through(settled.where_sql or "") == (
        '((("v" OPERATOR(pg_catalog.=) $1) OR ("v" OPERATOR(pg_catalog.=) $2)) AND ("id" OPERATOR(pg_catalog.>) $3))')


def test_a_filter_gets_no_raw_conjunct_and_a_value_too_short_to_be_stored_apart_is_read_as_it_is() -> None:
    sql = _sql("SELECT count(*) FILTER (WHERE v = 'a'), count(*) FROM {t} WHERE tiny = 'x'")
    assert " ANY (ARRAY[" not in sql and not any(raw_reads(sql, column) for column in _DECLARED), sql
    assert 'CASE WHEN (pg_catalog.pg_column_size("v") OPERATOR(pg_catalog.>) pg_catalog.octet_length("v")) THEN "v" END' in sql
    assert '("tiny" OPERATOR(pg_catalog.=) \'x\')' in sql, sql


# --- On a real PostgreSQL: answers and plans ------------------------------------------------------

_DDL = "(id int, v varchar(64), c char(64), n numeric(60, 0), r int8range, b bit(200), tiny varchar(5), pad text)"
_STORED = {"v": "'" + "k" * 64 + "'", "c": "'" + "k" * 64 + "'", "n": "7" * 60}
"""Row 0's values in ``dr_apart``, each stored apart (64 characters, a 60-digit number: 32 bytes)."""


def _create(admin: psycopg.Connection, name: str, row0: str) -> None:
    """``name`` of ``_DDL``: 100 ordinary rows, and row 0 (``row0``: its v, c and n) beside a wide
    pad kept in the row, which pushes v, c and n (``STORAGE EXTERNAL``) out of it when they are long."""
    admin.execute(f"DROP TABLE IF EXISTS {name}")
    admin.execute(f"CREATE TABLE {name} {_DDL.replace(', pad text', '')}")
    keep_apart(admin, name, "v")
    admin.execute(f"ALTER TABLE {name} " + ", ".join(f"ALTER COLUMN {column} SET STORAGE EXTERNAL" for column in "cn"))
    rows = "SELECT g, 'row ' || g % 10, 'row ' || g % 10, g % 10, int8range(g % 3, 5), NULL, 't', NULL FROM generate_series(1, 100) g"
    for values in (rows, f"SELECT 0, {row0}, int8range(1, 5), NULL, 't', {WIDE_PAD}"):
        admin.execute(f"INSERT INTO {name} {values}")
    admin.execute(f"VACUUM ANALYZE {name}")
    admin.execute(f"GRANT SELECT ON {name} TO dpproxy_service")


@pytest.fixture(scope="module")
def declared_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """``dr_apart`` (row 0's v, c and n stored apart) and ``dr_null`` (NULL there), on one proxy."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        _create(admin, "dr_apart", ", ".join(_STORED.values()))
        _create(admin, "dr_null", "NULL, NULL, NULL")
        placed = admin.execute(f"SELECT {in_line_text('v')}, {in_line_text('c')}, {in_line_numeric('n')} "
                               "FROM dr_apart WHERE id = 0").fetchone()
        assert placed == (False, False, False), placed
    policy = ATTACK_POLICY_HEAD + "".join(
        f"  public.dr_{kind}:\n    access: protected\n    epsilon: 1000.0\n    columns:\n" + "      n: {{bounds: [0, 100]}}\n"
        for kind in ("apart", "null"))
    with running_proxy(test_db, tmp_path_factory, policy) as running:
        yield running


_AUDITED = {column.name: AuditColumn(column.type_oid) for column in _COLUMNS}

_CONDITIONS = [
    "v = 'row 1'", f"v = {_STORED['v']}", f"v IN ('row 1', 'row 2', {_STORED['v']})", "v = 'row 1' AND id > 50",
    "id > 50 AND v IN ('row 3', 'row 4')", "c = 'row 1'", "c = 'row 1   '", "c IN ('row 1', 'row 2 ')",
    f"c = {_STORED['c']}", "n = 1", "n = 1.0", "n = 1.5", f"n IN (1, 2.00, 3, {_STORED['n']})", "n = 'NaN'",
    "v = 'row 1' AND c = 'row 1' AND n = 1", "r = '[1,5)'", "r IN ('[0,5)', '[2,5)')",
    "v = 'row 1' OR id = 3", "NOT (v = 'row 1')", "v IN ('row 1') AND n IN (1, 2)",
    # past the column's modifier: cast with it, they would fail (numeric field overflow) or be cut to
    # a value a row holds; without it they compare as the bounded terms do
    "n = 1e200", "n IN (1, 12345678901234567890123456789012345678901234567890123456789012345)",
    "v = 'row 1" + " " * 70 + "'", "c = 'row 1" + " " * 70 + "'", "v IN ('" + "k" * 65 + "', 'row 2')",
]


@pytest.mark.parametrize("condition", _CONDITIONS)
def test_the_raw_conjunct_changes_no_answer(declared_proxy: RunningProxy, test_db: TestDatabase, condition: str) -> None:
    """The backend SQL's exact count on the table whose row 0 holds values stored apart is its count
    on the neighbour with NULL there (the values read as NULL, even where the raw conjunct's hash
    matches them), and that is plain SQL's count of the condition on the neighbour (no in-line
    value is dropped or kept by the raw conjunct). The SQL evaluates only total operations
    (tests/backend_sql_audit.py: the conjunct is its "any-equality")."""
    _assert_answers_alike(declared_proxy, test_db, condition)


def _assert_answers_alike(proxy: RunningProxy, test_db: TestDatabase, condition: str, params: list[object] | None = None,
                          binary: bool = False) -> None:
    """The backend SQL dpproxy runs for ``count(*) … WHERE <condition>`` on ``dr_apart`` and on
    ``dr_null`` (audited), run with ``params`` bound (in ``binary``; the statement prepared and run
    twice through the proxy, the second a repeat), counts alike on both, and as plain SQL on dr_null."""
    seen: list[str] = []
    counts = {}
    with recording_released_sql(lambda plan, backend: seen.append(backend)), \
            proxy.connect() as conn, psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        for kind in ("apart", "null"):
            seen.clear()
            statement = f"SELECT count(*) FROM dr_{kind} WHERE {condition}"
            for _ in range(1 if params is None else 2):
                conn.execute(statement, params, prepare=params is not None, binary=binary).fetchall()
            assert len(seen) == 1, seen
            assert audit_backend_sql(seen[0], ("public", f"dr_{kind}"), _AUDITED) == [], seen[0]
            counts[kind] = psycopg.RawCursor(admin).execute(seen[0], params, binary=binary).fetchall()
            assert params is None or any(raw_reads(seen[0], column) for column in _DECLARED) or " OR " in condition or None in params, seen[0]
        plain = admin.execute(f"SELECT count(*) FROM dr_null WHERE {condition}", params, binary=binary).fetchall()
    assert counts["apart"] == counts["null"] == plain, (counts, plain, seen)


_BOUND = [
    ("v = %s", ["row 1"]), ("v = %s", ["k" * 64]), ("v IN (%s)", ["row 2"]), ("%s = v AND id > 50", ["row 1"]),
    ("c = %s", ["row 1"]), ("c = %s", ["row 1   "]), ("c = %s", ["k" * 64]), ("n = %s", [1]), ("n = %s", ["1.0"]),
    ("n = %s", [Decimal("7" * 60)]), ("n = %s", [Decimal("1.5")]), ("r = %s", ["[1,5)"]),
    ("v = %s AND c = %s AND n = %s", ["row 1", "row 1", Decimal(1)]), ("v = %s OR id = 3", ["row 1"]),
    ("v = %s", ["row 1" + " " * 70]), ("c = %s", ["row 1" + " " * 70]), ("n = %s", [Decimal("1e200")]),
    ("v = %s", [None]), ("n = %s", [None]),
    # lists of parameters (the raw conjunct hashed over them): values stored apart, padded, duplicated, NULL
    ("v IN (%s, %s, %s)", ["row 1", "row 2", "k" * 64]), ("v IN (%s, %s)", ["row 1", "row 1"]),
    ("c IN (%s, %s)", ["row 1   ", "k" * 64]), ("c IN (%s, %s, %s)", ["row 1", "row 2" + " " * 70, "x"]),
    ("n IN (%s, %s)", [1, Decimal("7" * 60)]), ("n IN (%s, %s, %s)", [Decimal(1), Decimal("2.0"), "3"]),
    ("n IN (%s, %s)", [Decimal("1e200"), 2]), ("r IN (%s, %s)", ["[1,5)", "[2,5)"]),
    ("v IN (%s, %s) AND n IN (%s, %s)", ["row 1", "row 3", 1, 3]), ("id > 50 AND v IN (%s, %s)", ["row 3", "row 4"]),
    ("v IN (%s, %s)", ["row 1", None]), ("n IN (%s, %s)", [None, None]),
]


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("condition, params", _BOUND)
def test_the_raw_comparison_with_a_bound_parameter_changes_no_answer(
        declared_proxy: RunningProxy, test_db: TestDatabase, condition: str, params: list[object], binary: bool) -> None:
    """As for literals, through psycopg's extended protocol (its text parameters unspecified; in
    binary, text, numeric or an integer type), prepared and bound twice: the backend SQL's
    exact count with the parameters bound is the same on the table holding values stored apart and
    on its neighbour holding NULL, and is plain SQL's on the neighbour. (``id <> …``: another
    statement in text and in binary, which would otherwise repeat the first's release.)"""
    _assert_answers_alike(declared_proxy, test_db, f"({condition}) AND id <> {-1 - binary}", params, binary)


def test_a_bound_value_the_column_type_cannot_hold_fails_before_any_charge_as_without_the_raw_comparison(
        declared_proxy: RunningProxy) -> None:
    """The raw comparison adds no conversion of its own: a bound value the column's type cannot read
    fails at Bind, once, with the bounded term's error, and is refunded."""
    with declared_proxy.connect() as conn:
        before = spent_epsilon(conn)
        for where, value in (("n = %s", "abc"), ("r = %s", "[2,1)"), ("v = %s AND n = %s", "x")):
            with pytest.raises(psycopg.Error) as failed:
                conn.execute(f"SELECT count(*) FROM dr_apart WHERE {where}", [value] * where.count("%s")).fetchall()
            assert failed.value.sqlstate in ("22P02", "22000"), (where, failed.value.sqlstate, str(failed.value))
        assert spent_epsilon(conn) == before


_INDEXED_ROWS = 20_000


@pytest.fixture(scope="module")
def indexed(test_db: TestDatabase) -> Iterator[psycopg.Connection]:
    """``dr_indexed``: 20,000 rows of 1,000 keys a column, a plain B-tree index on each of v, c and n,
    on a direct connection whose index-only scans are off, as dpproxy's backend connections' are."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS dr_indexed")
        conn.execute(f"CREATE TABLE dr_indexed {_DDL}")
        conn.execute("INSERT INTO dr_indexed SELECT g, 'k' || g % 1000, 'k' || g % 1000, g % 1000, NULL, NULL, 't', "
                     f"NULL FROM generate_series(1, {_INDEXED_ROWS}) g")
        for column in ("v", "c", "n"):
            conn.execute(f"CREATE INDEX ON dr_indexed ({column})")
        conn.execute("VACUUM ANALYZE dr_indexed")
        conn.execute("SET enable_indexonlyscan = off")
        yield conn


@pytest.mark.parametrize("where", ["v = 'k7'", "v IN ('k7', 'k8')", "c = 'k7'", "c IN ('k7', 'k8', 'k9')",
                                   "n = 7", "n IN (7, 8)", "v = 'k7' AND id > 3 AND (n < 5 OR n > 6)"])
def test_a_plain_index_serves_a_selective_equality_through_the_raw_conjunct(indexed: psycopg.Connection, where: str) -> None:
    """The rewriter's own SQL, planned on a table with a plain index: an Index Scan or a Bitmap
    scan, where every reference reading the bounded value alone is a sequential scan."""
    sql = _sql(f"SELECT count(*) FROM {{t}} WHERE {where}", table="dr_indexed")
    nodes = plan_node_types(indexed, sql)
    assert "Seq Scan" not in nodes and nodes & {"Index Scan", "Bitmap Index Scan"}, (nodes, sql)
    bounded_only = _sql(f"SELECT count(*) FROM {{t}} WHERE ({where}) OR id < 0", table="dr_indexed")
    assert "Seq Scan" in plan_node_types(indexed, bounded_only), bounded_only
    exact = indexed.execute(sql).fetchone()
    assert exact == indexed.execute(f"SELECT count(*) FROM dr_indexed WHERE {where}").fetchone()


@pytest.mark.parametrize("where, params", [
    ("v = $1", ["k7"]), ("v IN ($1)", ["k7"]), ("$1 = c", ["k7"]), ("n = $1", [7]), ("n = $1", ["7"]),
    ("v = $1 AND id > $2 AND n = $3", ["k7", 3, Decimal(7)]),
    ("v IN ($1, $2, $3)", ["k7", "k8", "k9"]), ("c IN ($1, $2)", ["k7", "k8"]), ("n IN ($1, $2)", [7, 8]),
    ("n IN ($1, $2, $3)", [Decimal(7), 8, "9"]), ("v IN ($1, $2) AND id > $3", ["k7", "k8", 3]),
])
@pytest.mark.parametrize("binary", [False, True])
def test_a_plain_index_serves_an_equality_with_a_bound_parameter(indexed: psycopg.Connection, where: str,
                                                                 params: list[object], binary: bool) -> None:
    """As with literals, for the values drivers bind (psycopg's text parameters go unspecified, its
    binary ones as text, a Decimal as numeric, an int as an integer type): the rewriter's SQL planned
    with them bound is an index or bitmap scan, and counts what plain SQL counts with them."""
    sql = _sql(f"SELECT count(*) FROM {{t}} WHERE {where}", table="dr_indexed")
    nodes = plan_node_types(indexed, sql, params)
    assert "Seq Scan" not in nodes and nodes & {"Index Scan", "Bitmap Index Scan"}, (nodes, sql)
    exact = psycopg.RawCursor(indexed).execute(sql, params, binary=binary).fetchone()
    plain = psycopg.RawCursor(indexed).execute(f"SELECT count(*) FROM dr_indexed WHERE {where}", params,
                                               binary=binary).fetchone()
    assert exact == plain and exact != (0,), (exact, plain)


@pytest.mark.parametrize("where", ["v = 'abc'", "v IN ('ABC', 'x')", "c = 'abc'", "c IN ('ABC ', 'x')", "v = 'ABC' AND c = 'abc'"])
def test_the_raw_conjunct_compares_in_the_columns_collation_even_a_nondeterministic_one(pg15_db: TestDatabase,
                                                                                       where: str) -> None:
    """The cast literals carry their type's default collation, which yields to the column's: the raw
    conjunct compares as the bounded term does, under a case-insensitive ICU collation too (no
    conflict error, no row dropped that the condition keeps). On PostgreSQL 15, built with ICU."""
    columns = (ColumnInfo("id", 23, -1, 1, None), ColumnInfo("v", 1043, 64 + 4, 2, None, deterministic_collation=False),
               ColumnInfo("c", 1042, 8 + 4, 3, None, deterministic_collation=False))
    relation = Relation(1, "public", "dr_ci", TablePolicy(epsilon=1.0), {column.name: column for column in columns})
    sql = backend_sql(plan_aggregate_query(f"SELECT count(*) FROM dr_ci WHERE {where}", relation), 0)
    assert " ANY (ARRAY[" in sql, sql
    with psycopg.connect(pg15_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DO $$ BEGIN CREATE COLLATION dr_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false); "
                     "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        conn.execute("DROP TABLE IF EXISTS dr_ci")
        conn.execute("CREATE TABLE dr_ci (id int, v varchar(64) COLLATE dr_ci, c char(8) COLLATE dr_ci)")
        conn.execute("INSERT INTO dr_ci VALUES (1, 'Abc', 'Abc'), (2, 'abc', 'abc  '), (3, 'x', 'X'), (4, 'y', 'y')")
        exact = conn.execute(sql).fetchone()
        assert exact == conn.execute(f"SELECT count(*) FROM dr_ci WHERE {where}").fetchone() and exact != (0,), exact


def test_a_literal_the_column_type_cannot_hold_fails_before_any_charge_as_without_the_raw_conjunct(
        declared_proxy: RunningProxy) -> None:
    """The raw conjunct's casts fail where the bounded term's coercion does, while parsing: the same
    error, refused before anything is charged."""
    with declared_proxy.connect() as conn:
        before = spent_epsilon(conn)
        for where in ("n = 'abc'", "n IN (1, 'abc')", "r = '[2,1)'"):
            with pytest.raises(psycopg.Error) as failed:
                conn.execute(f"SELECT count(*) FROM dr_apart WHERE {where}").fetchall()
            assert failed.value.sqlstate in ("22P02", "22000"), (where, failed.value.sqlstate, str(failed.value))
        assert spent_epsilon(conn) == before


_TYPED_COLUMNS = (ColumnInfo("id", 23, -1, 1, None), ColumnInfo("v", 1043, 64 + 4, 2, None),
                  ColumnInfo("nm", 19, -1, 3, None), ColumnInfo("ch", 18, -1, 4, None))
_TYPED = Relation(1, "public", "dr_typed", TablePolicy(epsilon=1.0), {column.name: column for column in _TYPED_COLUMNS})


@pytest.fixture(scope="module")
def typed(test_db: TestDatabase) -> Iterator[psycopg.Connection]:
    """``dr_typed``: a value with a trailing blank, one of 64 characters, and ``name``/``"char"`` columns."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS dr_typed")
        conn.execute('CREATE TABLE dr_typed (id int, v varchar(64), nm name, ch "char")')
        conn.execute(f"INSERT INTO dr_typed VALUES (1, 'ab ', 'a', 'a'), (2, '{'k' * 64}', 'a', 'a'), (3, 'zz', 'b', 'b'), (4, 'a', 'a', 'a')")
        yield conn


def _count_prepared(conn: psycopg.Connection, sql: str, types: tuple[str, ...], params: list[object]) -> object:
    """``sql`` prepared with its parameters declared ``types`` and run with ``params``, as a client's
    Parse and Bind do: its count, or the SQLSTATE it fails with."""
    cursor = psycopg.ClientCursor(conn)
    cursor.execute(f"PREPARE dr_typed_q ({', '.join(types)}) AS {sql}")
    try:
        row = cursor.execute("EXECUTE dr_typed_q (" + ", ".join(["%s"] * len(params)) + ")", params).fetchone()
        return row[0] if row is not None else None
    except psycopg.Error as exc:
        return exc.sqlstate
    finally:
        conn.execute("DEALLOCATE dr_typed_q")


@pytest.mark.parametrize("where, types, params", [
    ("v IN ($1, $2)", ("bpchar", "name"), ["ab", "zz"]),  # one name[]: 'ab ' no longer equals 'ab'
    ("v IN ($1, $2)", ("name", "text"), ["zz", "k" * 64]),  # one name[]: the 64 characters cut to 63
    ("v IN ($1, $2)", ('"char"', "text"), ["a", "zz"]),  # no common type: the array fails
    ("v IN ($1, $2)", ("bpchar", "text"), ["ab", "zz"]), ("v IN ($1, $2)", ("unknown", "text"), ["ab ", "zz"]),
    ("v IN ($1, $2)", ("text", "text"), ["ab ", "k" * 64]), ("v IN ($1, $2)", ("bpchar", "bpchar"), ["ab", "zz"]),
    ("v IN ($1, $2)", ("varchar", "varchar"), ["ab ", "zz"]), ("v IN ($1, $2)", ('"char"', '"char"'), ["a", "z"]),
    ("v IN ($1, $2)", ("name", "name"), ["ab ", "k" * 64]),
    # all unspecified, $1 typed by another term first: name, "char"
    ("nm = $1 AND v IN ($1, $2)", ("unknown", "unknown"), ["a", "k" * 64]),
    ("ch = $1 AND v IN ($1, $2)", ("unknown", "unknown"), ["a", "zz"]),
])
def test_a_list_of_parameters_of_different_types_keeps_its_answer(typed: psycopg.Connection, where: str,
                                                                   types: tuple[str, ...], params: list[object]) -> None:
    """dpproxy's SQL for a list of parameters declared of different types (or typed by another term),
    settled for the declared types as the executor settles it, counts what the terms count (plain
    SQL's ``v = $1 OR v = $2``, as dpproxy reads IN): one array of their common type would drop a row
    a term keeps (``name[]``) or fail (``"char"`` and ``text``), so the raw conjunct is left out; of
    one type, it stays."""
    plan = plan_aggregate_query(f"SELECT count(*) FROM dr_typed WHERE {where}", _TYPED)
    oids = tuple(0 if name == "unknown" else typed.execute("SELECT %s::regtype::oid", [name]).fetchone()[0]  # type: ignore[index]
                 for name in types)
    sql = backend_sql(settled_lists(plan, oids), 0)
    plain = where.replace("v IN ($1, $2)", "(v = $1 OR v = $2)")
    expected = _count_prepared(typed, f"SELECT count(*) FROM dr_typed WHERE {plain}", types, params)
    assert isinstance(expected, int) and expected > 0, expected
    assert _count_prepared(typed, sql, types, params) == expected, sql
    assert (raw_reads(sql, "v") > 0) == (where.startswith("v IN") and len(set(types)) == 1 and types[0] != "name"), sql


_DESCRIBED_AND_BOUND = """
import sys
import psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True)
pg = conn.pgconn
types = [int(oid) for oid in sys.argv[3].split(",")]
prepared = pg.prepare(b"dr_list", sys.argv[2].encode(), types)
described = pg.describe_prepared(b"dr_list")
result = pg.exec_prepared(b"dr_list", [b"r", b"row 1"])
print(prepared.status, described.status, described.nparams, result.status, (result.error_message or b"").decode(), sep="|")
"""


@pytest.mark.parametrize("types, raw", [((18, 25), False), ((19, 25), False), ((1043, 1043), True), ((0, 0), True)])
def test_a_list_of_parameters_declared_of_different_types_is_described_and_answered_through_the_proxy(
        declared_proxy: RunningProxy, test_db: TestDatabase, types: tuple[int, ...], raw: bool) -> None:
    """A client's Parse declaring a list's parameters ``"char"`` and ``text`` (or ``name`` and
    ``text``), its Describe, then its Bind: the executor leaves the list's raw conjunct out before it
    describes or runs the statement, which is answered and charged once, its exact count plain
    SQL's; with the conjunct, the array of no common type failed the Describe and, after the charge,
    the answer (42804). Declared of one type, the conjunct stays."""
    statement = f"SELECT count(*) FROM dr_null WHERE v IN ($1, $2) AND id <> -{sum(types) + 3}"
    seen: list[str] = []
    with recording_released_sql(lambda plan, backend: seen.append(backend)), declared_proxy.connect() as conn:
        before = spent_epsilon(conn)
        # libpq's blocking calls hold the GIL, and the proxy runs in this process: a subprocess drives them.
        driven = subprocess.run([sys.executable, "-c", _DESCRIBED_AND_BOUND, declared_proxy.dsn(), statement,
                                 ",".join(map(str, types))], capture_output=True, text=True, timeout=60)
        assert driven.returncode == 0, driven.stderr
        ok, tuples = int(psycopg.pq.ExecStatus.COMMAND_OK), int(psycopg.pq.ExecStatus.TUPLES_OK)
        assert driven.stdout.rstrip("\n").split("|") == [str(ok), str(ok), "2", str(tuples), ""], driven.stdout
        assert spent_epsilon(conn) == before + 1000.0
    assert len(seen) == 1 and (raw_reads(seen[0], "v") > 0) is raw, seen
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        exact = admin.pgconn.exec_params(seen[0].encode(), [b"r", b"row 1"], list(types))
        plain = admin.pgconn.exec_params(statement.replace("v IN ($1, $2)", "(v = $1 OR v = $2)").encode(),
                                         [b"r", b"row 1"], list(types))
        assert exact.get_value(0, 0) == plain.get_value(0, 0) not in (None, b"0"), (exact.error_message, seen[0])
