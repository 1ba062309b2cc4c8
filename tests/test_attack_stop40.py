"""Stop 40: what dpproxy accepts on columns of a domain type, and on text under an answer quantum.

The DP statements run on a base table and on neighbours that each add one adversarial row (a
numeric of 1e400 and of 1e-400, NaN, ±Infinity, dates and timestamps at their types' limits, a
text of 300 bytes, one whose last character straddles the 256-byte bound, trailing blanks);
what the analyst sees but the noised values must be the same on all, and a refusal costs
nothing. Real dpproxy, real PostgreSQL.

Found and fixed, pinned here:

* A column of a domain over ``numeric`` compared with a float (``p > CAST(1.5 AS double
  precision)``, ``p > 1.5::float8``, a ``real``, an IN list or BETWEEN holding one, in WHERE, a
  FILTER or a CASE) was answered: the check that refuses the comparison for a ``numeric`` column
  looked at the column's type OID, the domain's, not at its base type. PostgreSQL converts every
  row's value to double precision, which fails for 1e400 and 1e-400: the statement was charged,
  then failed with DP004 exactly on the table holding such a row, an error oracle. A
  ``double precision`` parameter was not cast to numeric either, with the same outcome. The
  check now reads the domain's base type (``ColumnInfo.value_type``), as the value bound does.
* The same for a domain over ``double precision`` beside a literal beyond its range (``fl >
  1e400``): charged, then DP004 on every table. The literal is now cast while parsing, so the
  22003 comes before the charge.
* A domain column compared with a constant of another family (``d > 5`` on a domain over
  ``date``, ``p > TRUE``): 42883 after the charge, on every table. The family check now takes a
  domain's base type, and refuses these before the charge.

The fuzzer's table has a column of a domain over numeric now (tests/neighbour_cases.py), which
finds the first of these at seed 17 without the fix.

Found, and fixed since (docs/threat-model.md, Timing; tests/test_numeric_bounds.py): a ``numeric``
of unconstrained precision holding 131,072 digits (~64 kB, stored out of line or compressed) was
detoasted again by every term and every aggregate's clamp that read the column, as a long text was
before its value bound. On PostgreSQL 16, 1,000 rows, best of 40 runs: +1.2 ms to ``n IN (<256
numbers>)`` (+2.3 ms when the digits compress), +12 ms to 250 ``sum(n) FILTER (WHERE id > k)`` (31
→ 43 ms); ``EXPLAIN (BUFFERS)`` counted 10 more buffer hits per term for that row. A timing oracle
on a table without ``answer_quantum_ms``, within every limit. Such a column is now read through
``CASE WHEN pg_column_compression(n) IS NULL AND pg_column_size(n) <= 512 THEN n END``, which reads
the header only: a value stored compressed or in more than 512 bytes reads as NULL in every
construct (rewriter/text_bounds.py). The neighbours' 1e400 and 1e-400 take a few bytes and are
read as before.

Tried, and held:

* Raw equality on a table with a quantum (``t = 'x'``, IN, OR/AND nesting, FILTER, CASE, HAVING
  on a key, a series limit's two queries, COUNT(DISTINCT), MODE) against rows of 300 bytes, a
  multibyte character straddling byte 256, 64 and 65 four-byte characters, trailing blanks, ``''``
  and NULL, on text, varchar, varchar(5) and a "C"-collated column: the same outcome on
  neighbours, and the exact counts of the raw and the bounded backend SQL equal on each of them
  for seventeen conditions (``IS NOT FALSE``/``IS NOT TRUE``, ``NOT NOT``, NOT over OR, IS NULL
  beside). ``COLLATE`` on either side, ``(t = 'x') = TRUE``, CASE and COALESCE in WHERE are refused;
  a wrapper output named ``"raw 2"`` is flattened to the bounded column, never the raw projection.
* Domains over text: the bounded ``CASE WHEN octet_length(d) <= N THEN d END`` is of the base type
  (PostgreSQL resolves a CASE of a domain and an untyped NULL to the base type), so a ``NOT NULL``
  or ``CHECK (VALUE <> '')`` domain never coerces a NULL or a constant; category cells are integer
  indices; categories or COUNT(DISTINCT) on a ``NOT NULL`` domain are refused (the typed-NULL
  probe fails), before any charge; LIKE and lower() of a domain are refused.
* Domains over int, numeric, date, timestamp and timestamptz compared with values of their own
  family (dates at infinity and at the types' limits, NaN, ±Infinity): the same outcome; a literal
  the base type cannot read is PostgreSQL's 22P02 before the charge; bounds and folded values on a
  domain are refused.
* bytea: an invalid hex literal is 22023 before the charge; equality with a literal or a bound
  bytes parameter, COUNT(DISTINCT) of it: the same outcome.
* The padded exponential draw: one candidate, all scores equal (the coin's probability exactly
  1, which OpenDP's randomized response takes), 1,000 candidates at a scale of 1e-300.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import psycopg
import pytest

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours, same_on_neighbours
from tests.post_charge_wait import LONG_NUMBER, LONG_TEXT, PAD, keep_apart, store_apart
from tests.released_sql import recording_released_sql

_DOMAINS = {"s40_num": "numeric", "s40_float": "double precision", "s40_day": "date", "s40_time": "timestamp"}
_DDL = "(id int, p s40_num, fl s40_float, dd s40_day, ts s40_time, n numeric)"
_BASE_ROWS = ("SELECT g, g, g, '2020-01-01'::date + g, '2020-01-01'::timestamp + g * interval '1 day', g "
              "FROM generate_series(1, 100) g")
# One adversarial row each (columns as _DDL).
_NEIGHBOURS = {
    "s40_1": "(1001, CAST('1e400' AS numeric), 1e308, '5874897-12-31', '294276-12-31 23:59:59', CAST('1e400' AS numeric))",
    "s40_2": "(1002, CAST('1e-400' AS numeric), 'NaN', '4713-01-01 BC', '4713-01-01 00:00 BC', CAST('1e-400' AS numeric))",
    "s40_3": "(1003, 'NaN', 'Infinity', 'infinity', '-infinity', 'NaN')",
    "s40_4": "(1004, '-Infinity', '-Infinity', '-infinity', 'infinity', '-Infinity')",
    "s40_5": "(1005, NULL, NULL, NULL, NULL, NULL)",
}
_NAMES = ("s40_0", *_NEIGHBOURS)
_TABLE = """
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
"""
_POLICY = ATTACK_POLICY_HEAD + "  public.s40_0: &D" + _TABLE + "".join(f"  public.{name}: *D\n" for name in _NEIGHBOURS)


@pytest.fixture(scope="module")
def stop40_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        for name, base in _DOMAINS.items():
            admin.execute(f"DO $$ BEGIN CREATE DOMAIN {name} AS {base}; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    create_neighbours(test_db.admin_dsn, "s40_0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _outcome(proxy: RunningProxy, sql: str, params: tuple[object, ...] | None = None) -> tuple[object, ...]:
    """``sql``'s masked outcome, the same on every table, an error charged nothing."""
    with proxy.connect() as conn:
        return same_on_neighbours(conn, sql, _NAMES, spent_epsilon, params=params)


@pytest.mark.parametrize("condition", [
    "p > CAST(1.5 AS double precision)", "p > 1.5::float8", "p < CAST(1.5 AS real)", "CAST(2 AS float8) < p",
    "p IN (1, 2.5, CAST(3 AS float8))", "p BETWEEN CAST(1 AS float8) AND 5",
])
def test_a_numeric_domain_compared_with_a_float_is_refused_before_the_charge(stop40_proxy: RunningProxy,
                                                                            condition: str) -> None:
    """PostgreSQL would convert each row's numeric to double precision, failing for 1e400 and 1e-400."""
    for sql in (f"SELECT count(*) FROM {{t}} WHERE {condition}",
                f"SELECT count(*) FILTER (WHERE {condition}) FROM {{t}}",
                f"SELECT count(CASE WHEN {condition} THEN 1 END) FROM {{t}}"):
        outcome = _outcome(stop40_proxy, sql)
        assert outcome[:2] == ("error", "DP001") and "real/double precision" in str(outcome[2]), (sql, outcome)


def test_a_float_parameter_beside_a_numeric_domain_is_answered_alike_on_neighbours(stop40_proxy: RunningProxy) -> None:
    """A parameter sent as double precision is cast to numeric once, as beside a numeric column."""
    for column in ("p", "n"):
        outcome = _outcome(stop40_proxy, f"SELECT count(*) FROM {{t}} WHERE {column} > %s", (1.5,))
        assert outcome[0] == "answer", outcome


@pytest.mark.parametrize("condition", ["fl > 1e400", "fl > -1e-400", "fl IN (1, 1e400)", "1e400 < fl"])
def test_a_float_domain_beside_a_number_beyond_its_range_fails_before_the_charge(stop40_proxy: RunningProxy,
                                                                                condition: str) -> None:
    outcome = _outcome(stop40_proxy, f"SELECT count(*) FROM {{t}} WHERE {condition}")
    assert outcome[:2] == ("error", "22003"), outcome


@pytest.mark.parametrize("condition", ["dd > 5", "p > TRUE", "ts > CAST(5 AS int4)", "fl = CAST('x' AS text)"])
def test_a_domain_compared_with_a_constant_of_another_family_is_refused_before_the_charge(
        stop40_proxy: RunningProxy, condition: str) -> None:
    """PostgreSQL has no operator for the pair: 42883, after the charge, on every table."""
    outcome = _outcome(stop40_proxy, f"SELECT count(*) FROM {{t}} WHERE {condition}")
    assert outcome[:2] == ("error", "DP001") and "a constant of a type" in str(outcome[2]), outcome


@pytest.mark.parametrize("condition", [
    "p > 1.5", "p = 'NaN'", "p > CAST(1 AS numeric)", "p < 1e400", "fl > 1.5", "fl > CAST(1 AS numeric)",
    "dd > '2020-02-01'", "dd > CAST('2020-01-01' AS timestamptz)", "ts > CAST('2020-01-01 00:00+00' AS timestamptz)",
    "ts > CAST('2020-01-01' AS date)", "p IS NULL",
])
def test_a_domain_compared_with_a_value_of_its_own_family_is_answered_alike_on_neighbours(
        stop40_proxy: RunningProxy, condition: str) -> None:
    outcome = _outcome(stop40_proxy, f"SELECT count(*), count(DISTINCT p), count(DISTINCT dd) FROM {{t}} WHERE {condition}")
    assert outcome[0] == "answer", outcome


# Open, found by benchmarks/timing_fuzz.py (docs/threat-model.md, Timing, "Drawn cases"): a value
# within the bounds (881 digits, ~450 bytes; 250 bytes of text) that a wide row's toaster stored
# apart is fetched from the TOAST relation again by every term and every sort comparison that
# reads it. Each pair: the same 100 rows and one row with a pad kept in the row; in "flat" the
# row's value is ordinary and stays in the row, in "apart" it is the long one, stored apart.
_APART_TABLES = {"n": ("(id int, t text, n numeric)", "g, 'row ' || g, g % 100", "0, 'row 0'"),
                 "t": ("(id int, n numeric, t text)", "g, g % 100, 'row ' || g", "0, 1")}
_APART_POLICY = ATTACK_POLICY_HEAD + "".join(
    f"  public.s40_{kind}_{column}:\n    access: protected\n    epsilon: 1.0\n    columns:\n      n: {{{{bounds: [0, 100]}}}}\n"
    for column in _APART_TABLES for kind in ("flat", "apart"))


@pytest.fixture(scope="module")
def apart_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        for column, (ddl, rows, head) in _APART_TABLES.items():
            for kind in ("flat", "apart"):
                name = f"s40_{kind}_{column}"
                admin.execute(f"DROP TABLE IF EXISTS {name}")
                admin.execute(f"CREATE TABLE {name} {ddl}")
                admin.execute(f"INSERT INTO {name} SELECT {rows} FROM generate_series(1, 100) g")
                admin.execute(f"GRANT SELECT ON {name} TO dpproxy_service")
            keep_apart(admin, f"s40_flat_{column}", column)
            admin.execute(f"INSERT INTO s40_flat_{column} SELECT {head}, {'1' if column == 'n' else repr('row 0')}, {PAD}")
            value = LONG_NUMBER if column == "n" else LONG_TEXT
            store_apart(admin, f"s40_apart_{column}", column, f"{head}, {value}", most=512 if column == "n" else 256)
    with running_proxy(test_db, tmp_path_factory, _APART_POLICY) as running:
        yield running


def _buffer_hits(admin: psycopg.Connection, sql: str) -> int:
    row = admin.execute(f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) {sql}").fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return int(plan[0]["Plan"]["Shared Hit Blocks"]) + int(plan[0]["Plan"]["Shared Read Blocks"])


# Strict, and only for the assertion: it fails the day the lever is closed (drop the mark then),
# and an error of the harness (a database error, no SQL recorded) is not taken for the lever.
@pytest.mark.xfail(strict=True, raises=AssertionError,
                   reason="open: a value stored apart within the bounds is fetched again by each term")
@pytest.mark.parametrize("column, sql", [
    ("n", "SELECT count(*) FROM {t} WHERE n IN (" + ", ".join(f"{1000 + i}.5" for i in range(64)) + ")"),
    ("t", "SELECT count(*) FROM {t} WHERE (" + " OR ".join(f"t > 'z{i}'" for i in range(64)) + ")"),
    ("t", "SELECT count(DISTINCT t) FROM {t}"),
])
def test_a_value_stored_apart_within_the_bounds_is_read_once_however_many_terms_compare_it(
        apart_proxy: RunningProxy, test_db: TestDatabase, column: str, sql: str) -> None:
    """The backend SQL of a statement whose 64 terms compare the value (or whose sort compares it;
    a text IN list is hashed and fetches it once)
    reads at most the two buffers of one fetch more on the table whose row holds it apart than on
    the one whose row holds an ordinary value: what the row adds must not grow with the terms, as
    it does not for a value past the bounds (tests/test_numeric_bounds.py). Today each IN value
    fetches it again: 2 buffer hits a term (~128 in all), a timing lever within every limit."""
    seen: list[str] = []
    hits = {}
    with recording_released_sql(lambda plan, backend: seen.append(backend)), \
            apart_proxy.connect() as conn, psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("SET jit = off")
        for kind in ("flat", "apart"):
            seen.clear()
            conn.execute(sql.replace("{t}", f"s40_{kind}_{column}")).fetchall()
            assert seen, "no backend SQL ran"
            hits[kind] = max(sum(_buffer_hits(admin, backend) for backend in seen) for _ in range(2))
    assert hits["apart"] - hits["flat"] <= 2, hits
