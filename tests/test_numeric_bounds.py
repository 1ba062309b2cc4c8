"""A ``numeric`` of no declared precision is read only when stored in the row, uncompressed, in at most 127 bytes.

Such a value can hold 131,072 digits (~64 kB, stored out of line, or compressed in the row when
its digits repeat), and every term and every aggregate's clamp that read it detoasted it again:
one such row added milliseconds to 256 IN values or 250 FILTERed sums, a timing oracle on its
presence (docs/threat-model.md, Timing). Now a DP statement reads the column through
``CASE WHEN pg_column_compression(n) IS NULL AND pg_column_size(n) <= 127 AND (pg_column_size(n) % 2 = 1
OR pg_column_size(n) <= 20) THEN n END`` (rewriter/text_bounds.py; 512 bytes, with no parity test, until values
stored apart within it were found: tests/test_attack_stop40.py; the 20 bytes read whatever their header:
tests/test_numeric_four_byte_header.py), which reads the header only; another value
reads as NULL in every construct. ``numeric(p, s)`` columns are read as they were. Real dpproxy, real PostgreSQL; the
reads are witnessed by ``EXPLAIN (BUFFERS)``'s buffer counts, never by timings.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest

from policies.model import TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter.text_bounds import column_sql, read_in_place
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours, same_on_neighbours
from tests.released_sql import recording_released_sql

BOUND = 127  # the most bytes an unconstrained numeric is read in (rewriter.text_bounds.NUMERIC_MAX_BYTES)
_DOMAINS = """
    DROP DOMAIN IF EXISTS nb_num, nb_fixed CASCADE;
    CREATE DOMAIN nb_num AS numeric;
    CREATE DOMAIN nb_fixed AS numeric(12, 2);
"""
_DDL = "(id int, n numeric, dn nb_num, np numeric(1000, 0), x int)"
_BASE_ROWS = "SELECT g, g % 100, g % 100, g % 100, g % 100 FROM generate_series(1, 300) g"
# 131,072 random digits: 65,540 bytes, stored out of line, uncompressed.
_RANDOM = "(SELECT string_agg((random() * 9)::int::text, '') FROM generate_series(1, 131072))::numeric"
# 40,000 digits (20 kB) compressed in the row to a few hundred bytes.
_COMPRESSED = "repeat('1234', 10000)::numeric"
_PAST = "(SELECT string_agg((1 + g % 9)::text, '') FROM generate_series(1, 1100) g)::numeric"  # 558 bytes, in the row
_AT = "repeat('9', 248)::numeric"  # 127 bytes in the row, its 1-byte header included: read
_DECLARED = "repeat('9', 1000)::numeric"  # 508 bytes: numeric(1000)'s widest, read from a numeric(1000, 0)
_NEIGHBOURS = {
    "nb_random": f"(0, {_RANDOM}, {_RANDOM}, 1, 1)",
    "nb_compressed": f"(0, {_COMPRESSED}, {_COMPRESSED}, 1, 1)",
    "nb_past": f"(0, {_PAST}, {_PAST}, 1, 1)",
    "nb_at": f"(0, {_AT}, {_AT}, {_DECLARED}, 1)",
    "nb_null": "(0, NULL, NULL, NULL, 1)",
}
_NAMES = ("nb_0", *_NEIGHBOURS)
_COLUMNS = """
    columns:
      n: {{bounds: [0, 100], group_by: true}}
      np: {{bounds: [0, 100]}}
      x: {{bounds: [0, 100]}}
"""
_TABLE = "    access: protected\n    epsilon: 1.0\n" + _COLUMNS
_EXACT = "nb_exact"  # ε so large that a count or a sum comes back (nearly) exact
_POLICY = (ATTACK_POLICY_HEAD + "  public.nb_0: &C\n" + _TABLE + "".join(f"  public.{name}: *C\n" for name in _NEIGHBOURS)
           + f"  public.{_EXACT}:\n    access: protected\n    epsilon: 1000.0\n" + _COLUMNS)
# nb_exact's n and dn by rows: 3 of 5, 2 of 248 nines (read), 4 of 1,100 digits (past the bound),
# one of 131,072 random digits, one of 40,000 compressed, 5 NULL.
_VALUE = f"CASE WHEN g <= 3 THEN 5 WHEN g <= 5 THEN {_AT} WHEN g <= 9 THEN {_PAST} WHEN g = 10 THEN {_RANDOM} " \
         f"WHEN g = 11 THEN {_COMPRESSED} END"
_EXACT_ROWS = f"SELECT g, {_VALUE}, {_VALUE}, CASE WHEN g <= 2 THEN {_DECLARED} ELSE g END, g FROM generate_series(1, 16) g"


@pytest.fixture(scope="module")
def captured() -> Iterator[list[str]]:
    """Every backend SQL the executor runs for a DP release while the module's tests run."""
    seen: list[str] = []
    with recording_released_sql(lambda plan, sql: seen.append(sql)):
        yield seen


@pytest.fixture(scope="module")
def numeric_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory,
                  captured: list[str]) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(_DOMAINS)
    create_neighbours(test_db.admin_dsn, "nb_0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    create_neighbours(test_db.admin_dsn, _EXACT, {}, _DDL, _EXACT_ROWS)
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        stored = dict(admin.execute("SELECT 'random', pg_column_size(n) FROM nb_random WHERE id = 0 UNION ALL "
                                    "SELECT coalesce(pg_column_compression(n), 'none'), pg_column_size(n) "
                                    "FROM nb_compressed WHERE id = 0").fetchall())
    assert stored["random"] > 65_000 and stored["pglz"] < 2_000, stored  # the forms the tests are about
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _column(name: str, type_oid: int, modifier: int = -1, attnum: int = 1, base: tuple[int, int] = (0, -1)) -> ColumnInfo:
    return ColumnInfo(name, type_oid, modifier, attnum, None, base_type_oid=base[0], base_type_modifier=base[1])


def test_the_backend_sql_bounds_a_numeric_of_no_declared_precision_by_its_stored_form() -> None:
    """numeric and a domain over it are read through their stored form's header; numeric(12, 2) and a
    domain over numeric(12, 2) carry a bound already and are read as they are."""
    domain = 16_400
    columns = {column.name: column for column in (
        _column("n", 1700, attnum=1), _column("dn", domain, attnum=2, base=(1700, -1)),
        _column("np", 1700, (12 << 16 | 2) + 4, attnum=3), _column("dp", domain + 1, attnum=4, base=(1700, (12 << 16 | 2) + 4)))}
    table = Relation(1, "public", "nb", TablePolicy(epsilon=1.0), columns)
    assert [read_in_place(column_sql(column), table) for column in columns.values()] == [
        'CASE WHEN pg_catalog.pg_column_compression("n") IS NULL AND '
        '(pg_catalog.pg_column_size("n") OPERATOR(pg_catalog.<=) 127) AND '
        '(((pg_catalog.pg_column_size("n") OPERATOR(pg_catalog.%) 2) OPERATOR(pg_catalog.=) 1) OR '
        '(pg_catalog.pg_column_size("n") OPERATOR(pg_catalog.<=) 20)) THEN "n" END',
        'CASE WHEN pg_catalog.pg_column_compression("dn") IS NULL AND '
        '(pg_catalog.pg_column_size("dn") OPERATOR(pg_catalog.<=) 127) AND '
        '(((pg_catalog.pg_column_size("dn") OPERATOR(pg_catalog.%) 2) OPERATOR(pg_catalog.=) 1) OR '
        '(pg_catalog.pg_column_size("dn") OPERATOR(pg_catalog.<=) 20)) THEN "dn" END',
        '"np"', '"dp"']


_MANY = 200
# Each construct that reads n, with those that read it many times.
_CONSTRUCTS = [
    "SELECT count(*) FROM {t} WHERE {c} IN (" + ", ".join(str(1000 + i) for i in range(_MANY)) + ")",
    "SELECT " + ", ".join(f"sum({{c}}) FILTER (WHERE id > {i})" for i in range(_MANY)) + " FROM {t}",
    "SELECT sum({c}) FROM {t}",
    "SELECT avg({c}) FROM {t}",
    "SELECT min({c}), max({c}) FROM {t}",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY {c}) FROM {t}",
    "SELECT variance({c}), stddev({c}) FROM {t}",
    "SELECT count({c}), count(DISTINCT {c}) FROM {t}",
    "SELECT count(*) FROM {t} WHERE {c} > 1 OR {c} IS NULL",
]
_GROUPED = "SELECT width_bucket(n, 0, 100, 10) AS b, count(*) FROM {t} GROUP BY 1"
# A domain column has no bounds (policy): it is compared and counted.
_DOMAIN_CONSTRUCTS = [
    _CONSTRUCTS[0].replace("{c}", "dn"),
    "SELECT " + ", ".join(f"count(*) FILTER (WHERE dn > {i})" for i in range(_MANY)) + " FROM {t}",
    "SELECT count(dn), count(DISTINCT dn) FROM {t}",
]


def _buffer_hits(admin: psycopg.Connection, sql: str) -> int:
    row = admin.execute(f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {sql}").fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    top = plan[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


@pytest.mark.parametrize("sql", [*(c.replace("{c}", "n") for c in _CONSTRUCTS), _GROUPED, *_DOMAIN_CONSTRUCTS])
def test_a_long_numeric_adds_no_buffer_reads_however_many_terms_read_it(
        numeric_proxy: RunningProxy, captured: list[str], test_db: TestDatabase, sql: str) -> None:
    """The backend SQL dpproxy sends for a statement on the neighbour with an out-of-line value of
    131,072 digits reads as many buffers as on the neighbour with NULL: its TOAST is never read
    (before, each of the 200 terms read its ~10 chunks' pages again)."""
    hits = {}
    # Another user than the other tests': a repeat of their statement would be answered from the store.
    with numeric_proxy.connect(user="plain", password="plain") as conn, \
            psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("SET jit = off")
        for name in ("nb_null", "nb_random"):
            captured.clear()
            conn.execute(sql.replace("{t}", name)).fetchall()
            assert captured, "no backend SQL ran"
            for run in range(2):  # the second run's count: the pages are cached either way
                hits[name] = sum(_buffer_hits(admin, backend) for backend in captured)
    assert hits["nb_random"] - hits["nb_null"] <= 2, hits


_EXACT_READS = [
    ("SELECT count(*) FROM {t} WHERE {c} IS NULL", 4 + 1 + 1 + 5),  # past the bound, random, compressed, NULL
    ("SELECT count({c}) FROM {t}", 3 + 2),
    ("SELECT count(*) FROM {t} WHERE {c} > 1", 3 + 2),
    ("SELECT count(*) FROM {t} WHERE {c} IN (5, 7)", 3),
    ("SELECT count(*) FILTER (WHERE {c} < 0 OR {c} >= 5) FROM {t}", 3 + 2),
    ("SELECT count(DISTINCT {c}) FROM {t}", 2),
    ("SELECT sum({c}) FROM {t}", 3 * 5 + 2 * 100),  # the 248 nines clamped to 100 (n only: dn has no bounds)
]


@pytest.mark.parametrize("column, sql, expected", [*(("n", *read) for read in _EXACT_READS),
                                                   *(("dn", *read) for read in _EXACT_READS[:-1])])
def test_a_numeric_stored_compressed_or_past_127_bytes_reads_as_null(
        numeric_proxy: RunningProxy, column: str, sql: str, expected: int) -> None:
    """A value of 1,100 digits (558 bytes, in the row), 131,072 random digits (out of line) or 40,000
    repeating ones (compressed in the row) reads as NULL; 248 digits (127 bytes) and short values are read."""
    with numeric_proxy.connect() as conn:
        row = conn.execute(sql.replace("{c}", column).replace("{t}", _EXACT)).fetchone()
    assert row is not None and abs(float(row[0]) - expected) < 1, (row, expected)


def test_a_numeric_of_declared_precision_past_127_bytes_reads_as_null_as_one_of_none_does(numeric_proxy: RunningProxy) -> None:
    """numeric(1000, 0) holds 1,000 nines in 508 bytes: read as it was, such a value stored apart was
    fetched again by each reference (docs/threat-model.md, values of a declared size stored apart);
    it is read through the same in-line check as a numeric of no declared precision now, so one of
    more than 127 bytes reads as NULL in conditions, counts and clamps: the cost of the check."""
    with numeric_proxy.connect() as conn:
        row = conn.execute(f"SELECT count(np), count(*) FILTER (WHERE np > 1000), sum(np) FROM {_EXACT}").fetchone()
    assert row is not None and [round(float(value)) for value in row[:2]] == [14, 0], row
    assert abs(float(row[2]) - sum(range(3, 17))) < 5, row  # the nines unread; noise of scale 0.3


@pytest.mark.parametrize("sql", [*(c.replace("{c}", "n") for c in _CONSTRUCTS[2:]), _GROUPED,
                                 "SELECT count(*) FROM {t} WHERE dn IN (1, 2) OR np > 50"])
def test_answers_on_neighbours_with_long_numerics_differ_only_in_the_noised_values(
        numeric_proxy: RunningProxy, sql: str) -> None:
    with numeric_proxy.connect() as conn:
        assert same_on_neighbours(conn, sql, _NAMES, spent_epsilon)[0] == "answer", sql


def test_show_columns_says_a_numeric_of_no_declared_precision_is_read_only_in_its_bounded_stored_form(
        numeric_proxy: RunningProxy) -> None:
    """SHOW dpproxy.columns said ``[0, 100]`` for ``n`` as for ``np``, though a value of ``n``
    stored compressed, apart or in more than 127 bytes reads as NULL; it says so now, for ``n`` and for
    ``dn`` (a domain over numeric the policy gives no bounds: COUNT(dn) reads it so too), and for
    ``numeric(1000, 0)`` (a value of a declared size may be stored apart: it is read so too), not
    for an integer."""
    with numeric_proxy.connect() as conn:
        shown = {row[1]: row[3] for row in conn.execute("SHOW dpproxy.columns").fetchall() if row[0] == "nb_0"}
    stored = f"read only when stored in the row uncompressed in at most {BOUND} bytes (another value reads as NULL)"
    assert shown == {"*": None, "id": None, "n": f"[0, 100], {stored}", "dn": stored, "np": f"[0, 100], {stored}",
                     "x": "[0, 100]"}, shown
