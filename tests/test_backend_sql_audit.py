"""Every backend SQL dpproxy writes evaluates only total operations per row and per group (tests/backend_sql_audit.py).

A real dpproxy answers a representative corpus (the neighbour fuzzer's generator with a fixed
seed, the type matrix's WHERE forms, aggregates and keys on four column types, sample and
aggregate at each numeric type's widest bounds with each partitioning, and every recorded
Superset statement); the backend SQL of each answer is captured where the executor sends it
and audited. Any node that the table of total operations does not list fails
the test with the statement and the node. The audit's own table is pinned by unit cases: the
past holes are findings, the shapes the rewriter writes are not.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

import sqlglot

from policies.tables import ColumnInfo, quote_identifier
from rewriter.floor_bins import floor_bin, floor_shape
from tests.backend_sql_audit import TOTAL, AuditColumn, Finding, audit_backend_sql
from tests.bi_data import PEOPLE_POLICY, create_people
from tests.bi_statements import PEOPLE_OID, load_recorded
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy, running_proxy
from tests.neighbour_cases import TABLE_DDL, adversarial_rows, domain_ddl, generate_case, policy_columns
from tests.released_sql import recording_released_sql
from tests.test_neighbour_fuzz import BASES, Client
from tests.type_matrix import CURATED, roles, where_roles

CASES = 600
REPORTED = int(os.environ.get("DPPROXY_AUDIT_REPORT", "5"))
SEED = 23
_TABLE = "bsa_fuzz"
_PARTNERS = {"integer": "i4", "numeric": "n", "float8": "f8", "real": "f4", "date": "d", "timestamp": "ts",
             "timestamptz": "tz", "text": "t"}
# Type-matrix columns of the fuzz table, with the curated type whose values probe them.
_MATRIX = {"i8": "bigint", "n": "numeric", "tz": "timestamptz", "d": "date"}


@dataclass(frozen=True)
class Captured:
    """One backend SQL a DP answer ran, with the protected relation it reads."""

    sql: str
    table: tuple[str, str]
    columns: dict[str, AuditColumn]


def _audit_column(column: ColumnInfo) -> AuditColumn:
    return AuditColumn(column.type_oid, column.container, column.deterministic_collation)


@pytest.fixture(scope="module")
def captured() -> Iterator[list[Captured]]:
    """Every backend SQL the executor runs for a DP release while the module's tests run."""
    seen: list[Captured] = []

    def capture(plan: Any, sql: str) -> None:
        columns = {name: _audit_column(column) for name, column in plan.table.columns.items()}
        seen.append(Captured(sql, (plan.table.schema, plan.table.name), columns))

    with recording_released_sql(capture):
        yield seen


@pytest.fixture(scope="module")
def fuzz_table_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory,
                     captured: list[Captured]) -> Iterator[RunningProxy]:
    rows = BASES["base"] + adversarial_rows(random.Random(SEED), 6)
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {_TABLE}")
        for statement in domain_ddl():
            conn.execute(statement)
        conn.execute(f"CREATE TABLE {_TABLE} ({TABLE_DDL})")
        conn.execute(f"INSERT INTO {_TABLE} VALUES {', '.join(rows)}")
        conn.execute(f"GRANT SELECT ON {_TABLE} TO dpproxy_service")
    columns = policy_columns().replace("{", "{{").replace("}", "}}")
    policy = (ATTACK_POLICY_HEAD.replace("repeats: {{enabled: true}}", "repeats: {{enabled: false}}")
              + f"  public.{_TABLE}: {{{{access: protected, epsilon: 1.0, delta: 1.0e-6, partitions: 3, "
              f"columns: {columns}}}}}\n")
    with running_proxy(test_db, tmp_path_factory, policy) as running:
        yield running


def _assert_total(captured: list[Captured], at_least: int, unparsed: Callable[[str], bool] | None = None) -> None:
    """No captured statement evaluates an operation off the table, per row or per group. With ``unparsed``, a
    statement it says fails PostgreSQL's parse analysis is let through: it runs on no row."""
    statements = {c.sql: c for c in captured}
    assert len(statements) >= at_least, f"only {len(statements)} backend statements captured"
    problems: list[str] = []
    for sql, capture in statements.items():
        findings = audit_backend_sql(sql, capture.table, capture.columns)
        if findings and unparsed is not None and unparsed(sql):
            continue
        problems += [f"{finding}\n    in: {sql}" for finding in findings]
    assert not problems, f"{len(problems)} operations not on the table of total ones; the first {REPORTED}:\n" + (
        "\n".join(problems[:REPORTED]))


def test_every_backend_sql_of_the_fuzzers_statements_is_total(fuzz_table_proxy: RunningProxy,
                                                              captured: list[Captured], admin: psycopg.Connection) -> None:
    captured.clear()
    rng = random.Random(SEED)
    client = Client(fuzz_table_proxy)
    try:
        for _ in range(CASES):
            client.run(generate_case(rng), _TABLE)
    finally:
        client.conn.close()
    # The fuzz table's dn is a domain over numeric, compared by the backend as its base type.
    _assert_total([replace(c, columns=_resolved(admin, c.columns)) for c in captured], CASES // 4)


def test_every_backend_sql_of_the_type_matrix_forms_is_total(fuzz_table_proxy: RunningProxy,
                                                             captured: list[Captured]) -> None:
    captured.clear()
    cases = {case.sql_type: case for case in CURATED}
    with fuzz_table_proxy.connect() as conn:
        for column, type_name in _MATRIX.items():
            probes = where_roles(cases[type_name], column, _PARTNERS)
            probes += [probe for group in roles(column, "t") for probe in group]
            for probe in probes:
                try:
                    conn.execute(probe.sql.replace("{t}", _TABLE), probe.params or None)
                except psycopg.Error:
                    pass  # refused, or failed on every table alike: the matrix test's concern
    _assert_total(captured, 100)


def test_every_backend_sql_of_the_recorded_superset_statements_is_total(
        test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, captured: list[Captured]) -> None:
    captured.clear()
    people_oid = create_people(test_db)
    proxy = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("bsa-ledger") / "ledger.sqlite3", PEOPLE_POLICY))
    try:
        with proxy.connect() as conn:
            for expected in load_recorded():
                conn.pgconn.exec_(expected.sql.replace(PEOPLE_OID, str(people_oid)).encode())
    finally:
        proxy.stop()
    _assert_total(captured, 25)


_USER_TYPES = ("money", "interval", "uuid", "inet", "int4range", "numrange", "tm_mood", "tm_positive", "bit(3)", "jsonb",
               "time", "bytea", "vector", "tm_vrange")


def test_every_backend_sql_of_the_type_matrix_forms_on_other_types_is_total(
        test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, captured: list[Captured]) -> None:
    """Curated types outside the fuzz table (enums and domains among them) in WHERE, as
    aggregates and as keys, beside a declared category key."""
    captured.clear()
    cases = {case.sql_type: case for case in CURATED if case.sql_type in _USER_TYPES}
    names = {sql_type: f"c{index}" for index, sql_type in enumerate(cases)}
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for case in cases.values():
            if case.setup:
                conn.execute(case.setup)
        conn.execute("DROP TABLE IF EXISTS bsa_types")
        conn.execute("CREATE TABLE bsa_types (k text, " + ", ".join(f"{names[t]} {t}" for t in cases) + ")")
        for values in ([f"'{case.ordinary[0]}'" for case in cases.values()],
                       [f"'{case.ordinary[1]}'" for case in cases.values()]):
            conn.execute(f"INSERT INTO bsa_types VALUES ('a', {', '.join(values)})")
        conn.execute("GRANT SELECT ON bsa_types TO dpproxy_service")
        policy = ATTACK_POLICY_HEAD + ("  public.bsa_types: {{access: protected, epsilon: 1.0, delta: 1.0e-6, "
                                       "columns: {{k: {{categories: [a, b], group_by: true}}}}}}\n")
        with running_proxy(test_db, tmp_path_factory, policy) as proxy, proxy.connect() as client:
            partners = {sql_type: name for sql_type, name in names.items()}
            for sql_type, case in cases.items():
                probes = where_roles(case, names[sql_type], partners)
                probes += [probe for group in roles(names[sql_type], "k", full=False) for probe in group]
                for probe in probes:
                    try:
                        client.execute(probe.sql.replace("{t}", "bsa_types"), probe.params or None)
                    except psycopg.Error:
                        pass
        # An enum compared with a number (enum_col > 0) has no operator: it fails parse analysis, on
        # no row, after its charge (rewriter.predicates cannot tell an enum from a domain over a
        # number, which may be compared with one). Such statements run nothing per row.
        _assert_total([replace(c, columns=_resolved(conn, c.columns)) for c in captured], 30,
                      unparsed=lambda sql: _fails_parse_analysis(conn, sql))


def _fails_parse_analysis(conn: psycopg.Connection, sql: str) -> bool:
    try:
        conn.execute(f"SELECT 1 FROM ({sql}) AS parsed LIMIT 0")
    except psycopg.errors.UndefinedFunction:
        return True
    return False


def _resolved(conn: psycopg.Connection, columns: dict[str, AuditColumn]) -> dict[str, AuditColumn]:
    """``columns`` with a domain read as its base type and an enum marked, as the backend's catalog says."""
    resolved = {}
    for name, column in columns.items():
        row = conn.execute("SELECT typtype, typbasetype FROM pg_catalog.pg_type WHERE oid = %s",
                           (column.type_oid,)).fetchone()
        if row is not None and row[0] == "d":
            column = replace(column, type_oid=int(row[1]))
        elif row is not None and row[0] == "e":
            column = replace(column, enum=True)
        resolved[name] = column
    return resolved


# The audit itself: the past holes are findings, the shapes the rewriter writes are not.
_COLUMNS = {"i": AuditColumn(23), "b8": AuditColumn(20), "n": AuditColumn(1700), "f": AuditColumn(701), "t": AuditColumn(25),
            "d": AuditColumn(1082), "ts": AuditColumn(1114), "o": AuditColumn(26), "nr": AuditColumn(3906),
            "pa": AuditColumn(1017, container=True), "ci": AuditColumn(25, deterministic_collation=False),
            "e": AuditColumn(16385), "m": AuditColumn(16390, enum=True), "r8": AuditColumn(3926)}
_T = '"public"."x"'


def _findings(where: str, select: str = "pg_catalog.count(*)") -> list[Finding]:
    return audit_backend_sql(f"SELECT {select} FROM {_T} WHERE {where}", ("public", "x"), _COLUMNS)


@pytest.mark.parametrize("where", [
    "t OPERATOR(pg_catalog.~~) E'a\\\\'",  # a pattern ending in an escape
    "ci OPERATOR(pg_catalog.~~) 'a%'",  # LIKE on a nondeterministic collation
    "t OPERATOR(pg_catalog.~~) '%" + "a" * 65 + "'",  # a part the matcher compares at every position
    "t OPERATOR(pg_catalog.!~~) E'x%" + "\\\\%" * 65 + "'",  # escaped %s are no wildcards
    "pg_catalog.lower(nr) OPERATOR(pg_catalog.<) CAST('1.5' AS pg_catalog.float8)",  # a range's bound
    "pg_catalog.upper(t) OPERATOR(pg_catalog.=) 'A'",  # more than 1 GB asked for a 256 MB value
    "t OPERATOR(pg_catalog.~~*) 'a%'",  # ILIKE lowers the value first
    "n OPERATOR(pg_catalog.<) CAST('1.5' AS pg_catalog.float8)",  # numeric converted to double per row
    "n OPERATOR(pg_catalog.<) f",
    "CAST(n AS double precision) OPERATOR(pg_catalog.>) 0",
    "b8 OPERATOR(pg_catalog.=) o",  # a bigint cast to oid per row
    "pa OPERATOR(pg_catalog.=) '{}'",  # array element comparison looked up per row
    "(i OPERATOR(pg_catalog.+) 1) OPERATOR(pg_catalog.>) 0",
    "pg_catalog.date_trunc('month', d) OPERATOR(pg_catalog.>) '2000-01-01'",  # unbounded date_trunc
    "pg_catalog.pg_sleep(1) IS NULL",
    "x.i OPERATOR(pg_catalog.>) 0",
    "e OPERATOR(pg_catalog.=) '[1,2,3]'",  # an extension's comparison (pgvector's: different dimensions)
    "n OPERATOR(pg_catalog.=) ANY (ARRAY[CAST('1.5' AS pg_catalog.float8)])",  # numeric converted to double per row
    "t OPERATOR(pg_catalog.=) ANY (ARRAY[t])",  # an array of per-row values
    "n OPERATOR(pg_catalog.<) ANY (ARRAY[CAST(1 AS pg_catalog.numeric)])",
])
def test_the_audit_finds_operations_that_can_raise_on_a_row(where: str) -> None:
    assert _findings(where), where


def _binned(key: str, column_type: int, bounds: tuple[float, float]) -> str:
    """The backend's cell of Metabase's binning ``key`` over a column of ``bounds``, as a WHERE."""
    shape = floor_shape(sqlglot.parse_one(key, read="postgres"))
    assert shape is not None
    key_sql = floor_bin(shape, column_type, bounds)
    return f"{key_sql.cell_sql(key_sql.row_sql(quote_identifier(shape.column.name)))} IS NULL"


@pytest.mark.parametrize("key, column_type, bounds", [
    ("floor((f - 0.1) / 0.05) * 0.05 + 0.1", 701, (0.0, 1.0)),
    ("floor(f / 10) * 10", 701, (0.0, 1000.0)),  # W > 1: a subnormal f is binned without dividing
    ("floor((f - 5e278) / 2e279) * 2e279 + 5e278", 701, (-1e280, 1e280)),
    ("floor((i - 15) / 4) * 4 + 15", 23, (17.0, 90.0)),
    ("floor((i - 10.0) / 10.0) * 10.0 + 10.0", 23, (17.0, 90.0)),
    ("floor((n - -7.5) / 150.0) * 150.0 + -7.5", 1700, (-1000.0, 1000.0)),
    ("floor(i)", 23, (-5.0, 5.0)),
])
def test_the_audit_accepts_metabase_binning_as_the_rewriter_writes_it(key, column_type, bounds) -> None:
    assert not _findings(_binned(key, column_type, bounds))


@pytest.mark.parametrize("where", [
    # without the abs(x) < w·2^-1022 guard, 5e-324 / 10 raises an underflow
    "CASE WHEN (f OPERATOR(pg_catalog.>=) CAST('0.0' AS pg_catalog.float8)) AND (f OPERATOR(pg_catalog.<=) "
    "CAST('1.0' AS pg_catalog.float8)) THEN pg_catalog.floor((f OPERATOR(pg_catalog./) (10))) END IS NULL",
    # unbounded, or bounded so wide that the difference overflows
    "pg_catalog.floor((f OPERATOR(pg_catalog.-) (0.5))) IS NULL",
    "CASE WHEN (f OPERATOR(pg_catalog.>=) CAST('-1e308' AS pg_catalog.float8)) AND (f OPERATOR(pg_catalog.<=) "
    "CAST('1e308' AS pg_catalog.float8)) THEN pg_catalog.floor((f OPERATOR(pg_catalog.-) (-1e308))) END IS NULL",
    "CASE WHEN (i OPERATOR(pg_catalog.>=) CAST('0' AS pg_catalog.numeric)) AND (i OPERATOR(pg_catalog.<=) "
    "CAST('2147483647' AS pg_catalog.numeric)) THEN pg_catalog.floor((i OPERATOR(pg_catalog.-) (-10))) END IS NULL",
])
def test_the_audit_finds_binning_that_can_raise_on_a_row(where: str) -> None:
    assert _findings(where), where


@pytest.mark.parametrize("select", [
    "pg_catalog.sum(f)",  # float sums overflow
    "pg_catalog.sum(CAST(f AS bigint))",  # an unbounded double to bigint
    "pg_catalog.width_bucket(f, 0.0, 1.0, 3)",  # NaN raises
    "pg_catalog.sum(CAST((pg_catalog.float8smaller(pg_catalog.float8larger(f, CAST(-1.0 AS double precision)), "
    "CAST(1.0 AS double precision)) OPERATOR(pg_catalog.*) CAST('1e-320' AS double precision)) AS bigint))",  # underflow
])
def test_the_audit_finds_aggregate_arguments_that_can_raise(select: str) -> None:
    assert _findings("TRUE", select), select


@pytest.mark.parametrize("sql", [
    "SELECT pg_catalog.count(DISTINCT e) FROM {t}",
    "SELECT e, pg_catalog.count(*) FROM {t} GROUP BY e",
    "SELECT DISTINCT e FROM {t}",
    "SELECT pg_catalog.count(*) FROM (SELECT e FROM {t} ORDER BY e) AS s",
    "SELECT pg_catalog.min(e) FROM {t}",
    "SELECT pg_catalog.count(*) FROM {t} GROUP BY ci",  # a nondeterministic collation's hash of a long value
])
def test_the_audit_finds_rows_sorted_grouped_or_told_apart_by_a_type_not_built_in(sql: str) -> None:
    assert audit_backend_sql(sql.format(t=_T), ("public", "x"), _COLUMNS), sql


@pytest.mark.parametrize("sql", [
    "SELECT pg_catalog.count(DISTINCT m), pg_catalog.count(DISTINCT t), pg_catalog.count(e) FROM {t} WHERE e IS NULL",
    "SELECT i, pg_catalog.count(*) FROM {t} GROUP BY i",
    "SELECT pg_catalog.count(DISTINCT ci) FROM {t} GROUP BY CASE WHEN (pg_catalog.octet_length(ci) "
    "OPERATOR(pg_catalog.<=) 16777216) THEN ci END",
])
def test_the_audit_accepts_counting_a_type_not_built_in_and_sorting_built_in_ones(sql: str) -> None:
    assert audit_backend_sql(sql.format(t=_T), ("public", "x"), _COLUMNS) == [], sql


@pytest.mark.parametrize("where", [
    "i OPERATOR(pg_catalog.>=) 5 AND i OPERATOR(pg_catalog.<=) CAST($1 AS pg_catalog.numeric)",
    "t OPERATOR(pg_catalog.~~) 'a\\\\%' OR pg_catalog.lower(CASE WHEN (pg_catalog.octet_length(t) "
    "OPERATOR(pg_catalog.<=) 16777216) THEN t END) OPERATOR(pg_catalog.=) $2",
    "CASE WHEN (pg_catalog.octet_length(t) OPERATOR(pg_catalog.<=) 16777216) THEN t END OPERATOR(pg_catalog.~~*) 'a%'",
    "f OPERATOR(pg_catalog.=) 'NaN' AND n OPERATOR(pg_catalog.<>) 1e-400 AND d OPERATOR(pg_catalog.<) ts",
    "NOT (n IS NULL)",
    # the hashed raw conjunct beside a top-level = or IN on a column of a declared size
    "t OPERATOR(pg_catalog.=) ANY (ARRAY[CAST('a' AS pg_catalog.text), CAST('b' AS pg_catalog.text)]) "
    "AND n OPERATOR(pg_catalog.=) ANY (ARRAY[CAST((-5) AS pg_catalog.numeric), CAST('NaN' AS pg_catalog.numeric)]) "
    "AND r8 OPERATOR(pg_catalog.=) ANY (ARRAY[CAST('[1,2)' AS pg_catalog.int8range)])",
])
def test_the_audit_accepts_the_safe_predicate_language(where: str) -> None:
    assert _findings(where) == []


def test_the_audit_accepts_a_guarded_fixed_point_sum_and_a_nan_guarded_bucket() -> None:
    clamp = ("pg_catalog.float8smaller(pg_catalog.float8larger(f, CAST(-1e+280 AS double precision)), "
             "CAST(1e+280 AS double precision))")
    term = (f"CASE WHEN (pg_catalog.abs({clamp}) OPERATOR(pg_catalog.<) CAST('2e+264' AS double precision)) "
            f"THEN CAST(0 AS double precision) ELSE ({clamp} OPERATOR(pg_catalog.*) "
            f"CAST('2.5e-265' AS double precision)) END")
    bucket = ("CASE WHEN (f OPERATOR(pg_catalog.=) 'NaN') THEN NULL ELSE pg_catalog.width_bucket("
              "CAST(f AS double precision), CAST(-10.0 AS double precision), CAST(10.0 AS double precision), 4) END")
    sql = (f"SELECT k0, p0 FROM (SELECT {bucket} AS k0, pg_catalog.sum(CAST({term} AS bigint)) AS p0 FROM {_T} "
           f"GROUP BY {bucket} OFFSET 0) AS cells WHERE k0 IS NOT NULL")
    assert audit_backend_sql(sql, ("public", "x"), _COLUMNS) == []
    unguarded = sql.replace("CAST('2e+264' AS double precision)", "CAST('1e-300' AS double precision)")
    assert audit_backend_sql(unguarded, ("public", "x"), _COLUMNS), "a product that can underflow"


def test_the_audit_accepts_a_variance_s_bounded_numeric_arithmetic_and_finds_an_unbounded_one() -> None:
    """A variance's centred point d = p(x) − C, clamped on its grid, and d·d (rewriter.rewrite.centred_points):
    numeric arithmetic on values bounded by the clamp; the same on an unclamped numeric column is a finding."""
    point = ("pg_catalog.int8smaller(pg_catalog.int8larger(CAST((pg_catalog.float8smaller(pg_catalog.float8larger(f, "
             "CAST(-1.0 AS double precision)), CAST(1.0 AS double precision)) OPERATOR(pg_catalog.*) "
             "CAST('2251799813685248.0' AS double precision)) AS bigint), CAST('-2251799813685248' AS bigint)), "
             "CAST('2251799813685248' AS bigint))")
    centred = f"(CAST({point} AS pg_catalog.numeric) OPERATOR(pg_catalog.-) CAST('0' AS pg_catalog.numeric))"
    sql = (f"SELECT pg_catalog.count(f), pg_catalog.sum({centred}), "
           f"pg_catalog.sum(({centred} OPERATOR(pg_catalog.*) {centred})) FROM {_T}")
    assert audit_backend_sql(sql, ("public", "x"), _COLUMNS) == []
    unbounded = f"SELECT pg_catalog.sum((n OPERATOR(pg_catalog.*) n)) FROM {_T}"  # NaN, and no bound
    assert audit_backend_sql(unbounded, ("public", "x"), _COLUMNS), "a product of unbounded numerics"


@pytest.mark.parametrize("end, total", [
    ("CAST('9999-12-31 00:00:00+00' AS pg_catalog.timestamptz) OPERATOR(pg_catalog.+) "
     "CAST('864000000000 seconds' AS pg_catalog.interval)", True),
    ("CAST('294276-01-01 00:00:00+00' AS pg_catalog.timestamptz) OPERATOR(pg_catalog.+) "
     "CAST('1 year' AS pg_catalog.interval)", False),  # past timestamptz's range, on the first row it meets
])
def test_the_audit_accepts_an_epoch_bucket_whose_range_end_cannot_overflow(end: str, total: bool) -> None:
    columns = {"tz": AuditColumn(1184)}
    key = (f"CASE WHEN (tz OPERATOR(pg_catalog.>=) CAST('1970-01-01 00:00:00+00' AS pg_catalog.timestamptz)) AND "
           f"(tz OPERATOR(pg_catalog.<) ({end})) THEN pg_catalog.floor((EXTRACT(EPOCH FROM tz) "
           f"OPERATOR(pg_catalog./) 864000000000)) END")
    sql = (f"SELECT k0, p0 FROM (SELECT {key} AS k0, pg_catalog.count(*) AS p0 FROM {_T} GROUP BY {key} OFFSET 0) "
           "AS cells WHERE k0 IS NOT NULL")
    assert (audit_backend_sql(sql, ("public", "x"), columns) == []) == total


_DAY = ("CASE WHEN (ts OPERATOR(pg_catalog.>=) CAST('2021-01-01 00:00:00' AS pg_catalog.timestamp)) AND "
        "(ts OPERATOR(pg_catalog.<) CAST('2023-01-01 00:00:00' AS pg_catalog.timestamp)) "
        "THEN pg_catalog.date_trunc('day', ts) END")


@pytest.mark.parametrize("cell, total", [
    ("pg_catalog.to_char(b0, 'IW')", True),  # a date part of a group's bucket
    ("pg_catalog.date_trunc('week', (b0 OPERATOR(pg_catalog.+) CAST('1 day' AS pg_catalog.interval)))", True),
    ("pg_catalog.date_trunc('week', (b0 OPERATOR(pg_catalog.+) CAST('300 years' AS pg_catalog.interval)))", False),
    ("pg_catalog.date_trunc('week', (t0 OPERATOR(pg_catalog.+) CAST('1 day' AS pg_catalog.interval)))", False),
])
def test_the_audit_accepts_a_date_parts_cell_of_a_bounded_bucket_and_no_shift_that_can_overflow(
        cell: str, total: bool) -> None:
    # rewriter.rewrite._grouped_sql: the cells a date part joins, summed over their buckets, with a
    # percentile's grid counts per (cell, index) and the other parts per cell (grouping sets).
    inner = (f"SELECT pg_catalog.to_char({_DAY}, 'YYYY-MM-DD') AS k0, {_DAY} AS b0, ts AS t0, i AS g, "
             f"pg_catalog.count(*) AS p0, pg_catalog.sum(n) AS p1 FROM {_T} GROUP BY {_DAY}, ts, i OFFSET 0")
    sql = (f"SELECT pg_catalog.min(k0), g, CASE WHEN (GROUPING(g) OPERATOR(pg_catalog.=) 0) THEN pg_catalog.sum(p0) "
           f"END, CASE WHEN (GROUPING(g) OPERATOR(pg_catalog.=) 1) THEN pg_catalog.sum(p1) END FROM ({inner}) AS cells "
           f"WHERE k0 IS NOT NULL GROUP BY GROUPING SETS (({cell}, g), ({cell}))")
    assert (audit_backend_sql(sql, ("public", "x"), _COLUMNS) == []) == total


# Per group: sample and aggregate's partition values, as the rewriter writes them (rewriter/rewrite.py).
_CLAMP_N = ("pg_catalog.numeric_smaller(pg_catalog.numeric_larger({v}, CAST(-1e+280 AS numeric)), "
            "CAST(1e+280 AS numeric))")
_CLAMP_I = "pg_catalog.int4smaller(pg_catalog.int4larger({v}, CAST(0 AS integer)), CAST(100 AS integer))"
_TINY = "CAST('2.2250738585072014e-308' AS pg_catalog.numeric)"


def _to_double(value: str) -> str:
    return (f"CAST(CASE WHEN (pg_catalog.abs({value}) OPERATOR(pg_catalog.<) {_TINY}) THEN CAST(0 AS pg_catalog.numeric) "
            f"ELSE {value} END AS double precision)")


def _numeric_mean(filter_: str = "") -> str:
    total = _to_double(f"pg_catalog.sum({_CLAMP_N.format(v='n')}){filter_}")
    count = f"pg_catalog.count(n){filter_}"
    floor = f"(CAST({count} AS double precision) OPERATOR(pg_catalog.*) CAST('2.2250738585072014e-308' AS double precision))"
    return (f"CASE WHEN (pg_catalog.abs({total}) OPERATOR(pg_catalog.<) {floor}) THEN CAST(0 AS double precision) "
            f"ELSE ({total} OPERATOR(pg_catalog./) {count}) END")


def _partitions(*parts: str, key: str = "pg_catalog.floor((pg_catalog.random() OPERATOR(pg_catalog.*) 3))") -> str:
    inner = ", ".join(f"{part} AS p{i}" for i, part in enumerate(parts))
    outer = ", ".join(f"pg_catalog.encode(pg_catalog.string_agg(pg_catalog.float8send(p{i}), CAST('' AS pg_catalog.bytea)), "
                      f"'hex')" for i in range(len(parts)))
    return (f'SELECT {outer} FROM (SELECT {inner} FROM (SELECT "i", "n", "t", {key} AS "partition" FROM {_T}) AS filtered '
            f'GROUP BY "partition") AS partitions')


_HASH_KEY = ("((COALESCE(pg_catalog.hashint4extended(\"i\", 7), 0) OPERATOR(pg_catalog.&) 9223372036854775807) "
             "OPERATOR(pg_catalog.%) 512)")
_FILTER = " FILTER (WHERE (t OPERATOR(pg_catalog.=) 'a'))"


@pytest.mark.parametrize("sql", [
    _partitions(_numeric_mean(), _numeric_mean(_FILTER)),
    _partitions(f"(CAST(pg_catalog.sum({_CLAMP_I.format(v='i')}){_FILTER} AS double precision) OPERATOR(pg_catalog./) "
                f"pg_catalog.count(i){_FILTER})", key=_HASH_KEY),
    _partitions(_to_double(_CLAMP_N.format(v="pg_catalog.min(n)")), f"CAST({_CLAMP_I.format(v='pg_catalog.max(i)')} "
                "AS double precision)"),
    f"SELECT pg_catalog.sum(p0) FROM (SELECT pg_catalog.count(*) AS p0 FROM {_T} GROUP BY t) AS partitions",
    f"SELECT k0, p0 FROM (SELECT t AS k0, pg_catalog.count(*) AS p0 FROM {_T} GROUP BY t OFFSET 0) AS cells "
    "WHERE k0 IS NOT NULL ORDER BY p0",
])
def test_the_audit_accepts_the_expressions_sample_and_aggregate_writes_over_aggregates(sql: str) -> None:
    assert audit_backend_sql(sql, ("public", "x"), _COLUMNS) == []


@pytest.mark.parametrize("sql", [
    # a sum of values up to 1e300 overflows double precision from the second row on
    _partitions(_to_double(f"pg_catalog.sum({_CLAMP_N.format(v='n').replace('280', '300')})")),
    _partitions(_to_double("pg_catalog.sum(n)")),  # unclamped: NaN, Infinity, any size
    _partitions(f"CAST(pg_catalog.sum(n) AS double precision)"),  # 1e-400 underflows the cast
    # a count of another column, or under another FILTER, may be 0 where the sum is not NULL
    _partitions(f"(CAST(pg_catalog.sum({_CLAMP_I.format(v='i')}) AS double precision) OPERATOR(pg_catalog./) "
                "pg_catalog.count(n))"),
    _partitions(f"(CAST(pg_catalog.sum({_CLAMP_I.format(v='i')}){_FILTER} AS double precision) OPERATOR(pg_catalog./) "
                "pg_catalog.count(i))"),
    _partitions("(CAST(pg_catalog.sum(COALESCE(i, 0)) AS double precision) OPERATOR(pg_catalog./) pg_catalog.count(i))"),
    # a numeric mean without its floor: a partition's 2.2e-308 over two rows underflows
    _partitions(f"({_to_double(f'pg_catalog.sum({_CLAMP_N.format(v=chr(110))})')} OPERATOR(pg_catalog./) "
                "pg_catalog.count(n))"),
    # one value's bytes per group of an unbounded key: no limit on the text
    f"SELECT pg_catalog.encode(pg_catalog.string_agg(pg_catalog.float8send(p0), CAST('' AS pg_catalog.bytea)), 'hex') "
    f"FROM (SELECT CAST(pg_catalog.count(*) AS double precision) AS p0 FROM {_T} GROUP BY t) AS partitions",
    f"SELECT pg_catalog.count(*) FROM {_T} GROUP BY t HAVING (pg_catalog.sum(i) OPERATOR(pg_catalog./) "
    "pg_catalog.count(*)) OPERATOR(pg_catalog.>) 1",
    f"SELECT pg_catalog.count(*) FROM {_T} GROUP BY t ORDER BY CAST(pg_catalog.sum(n) AS double precision)",
    f"SELECT p0 OPERATOR(pg_catalog.+) 1 FROM (SELECT pg_catalog.count(*) AS p0 FROM {_T} GROUP BY t) AS cells",
    f"SELECT k0 FROM (SELECT t AS k0, pg_catalog.sum(i) AS p0 FROM {_T} GROUP BY t) AS cells "
    "WHERE CAST(p0 AS integer) OPERATOR(pg_catalog.>) 0",
])
def test_the_audit_finds_expressions_over_aggregates_that_can_raise(sql: str) -> None:
    assert audit_backend_sql(sql, ("public", "x"), _COLUMNS), sql


def test_the_grounds_of_the_per_group_reasons_hold_on_the_backend(test_db: TestDatabase) -> None:
    """"numeric-to-double" at its limits, "divide-by-count" of ±Infinity, NaN, the least nonzero
    dividend over the largest count, and NULL over a count of 0: none raises."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("SELECT CAST(1.7976931348623157e308::numeric AS double precision), "
                     "CAST(-1.7976931348623157e308::numeric AS double precision), "
                     "CAST(2.2250738585072014e-308::numeric AS double precision), "
                     "CAST(-2.2250738585072014e-308::numeric AS double precision), "
                     "'Infinity'::float8 / 1::bigint, '-Infinity'::float8 / 1::bigint, 'NaN'::float8 / 1::bigint, "
                     "1::float8 / 9223372036854775807::bigint, "
                     "(2.2250738585072014e-308::float8 * 9223372036854775807::bigint) / 9223372036854775807::bigint, "
                     "NULL::float8 / 0::bigint").fetchone()
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            conn.execute("SELECT CAST(1e-400::numeric AS double precision)")  # why the cast needs its guard


@pytest.mark.parametrize("sql", [
    f'SELECT pg_catalog.count(*) FROM {_T} JOIN "public"."y" ON TRUE',
    f"WITH c AS (SELECT CAST(i AS pg_catalog.int2) AS s FROM {_T}) SELECT pg_catalog.count(*) FROM c",
    f"SELECT (SELECT pg_catalog.sum(i) FROM {_T}) OPERATOR(pg_catalog.+) 1",
])
def test_the_audit_reads_a_table_it_does_not_follow_as_a_finding(sql: str) -> None:
    """A join, a CTE or a scalar subquery: the audit would not see what they evaluate."""
    assert audit_backend_sql(sql, ("public", "x"), _COLUMNS)


def test_every_reason_on_the_table_is_cited_by_a_check_and_every_citation_is_on_the_table() -> None:
    source = (Path(__file__).parent / "backend_sql_audit.py").read_text()
    checks = source.split("TOTAL: dict[str, str] = {", 1)[1].split("\n}\n", 1)[1]
    cited = set(re.findall(r'# "([a-z-]+)"', checks))
    assert cited == set(TOTAL), (cited ^ set(TOTAL))


def test_date_and_time_types_compare_across_types_without_error_on_the_backend(test_db: TestDatabase) -> None:
    """The ground of "compare-datetime": the backend saturates instead of raising (PostgreSQL ≥ 13)."""
    extremes = ("'5874897-12-31'::date", "'4713-01-01 BC'::date", "'294276-12-31 23:59:59'::timestamp",
                "'4713-01-01 00:00 BC'::timestamp", "'infinity'::date")
    others = ("'2000-01-01'::timestamp", "'2000-01-01 00:00+00'::timestamptz", "'2000-01-01'::date")
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for zone in ("UTC", "Pacific/Kiritimati", "Etc/GMT+12"):
            conn.execute(f"SET TimeZone = '{zone}'")
            for value in extremes:
                for other in others:
                    conn.execute(f"SELECT {value} < {other}, {value} = {other}").fetchone()
