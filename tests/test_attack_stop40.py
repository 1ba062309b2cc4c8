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

Found by benchmarks/timing_fuzz.py, and fixed since (docs/threat-model.md, Timing, "This stop's
value forms"): a value within those bounds that a wide row's toaster stored in the TOAST relation
was fetched again (two buffer hits) by every term, clamp and sort comparison that read it, and a
text compressed in the row decompressed again; a bounded value is now read only where it is stored
in the row uncompressed, told from the header (``rewriter.text_bounds.in_line_text``,
``in_line_numeric``), pinned below on every storage form on PostgreSQL 15 and 16.

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

from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal

import psycopg
import pytest

from proxy.backend.pool import PINNED_SETTINGS
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours, same_on_neighbours
from tests.buffer_hits import buffer_hits
from tests.post_charge_wait import LONG_NUMBER, LONG_TEXT, PAD, SHORT_TEXT, WIDE_PAD, keep_apart, store_apart, toast_index
from rewriter.text_bounds import NUMERIC_MAX_BYTES, in_line_bit, in_line_numeric, in_line_range, in_line_text
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


def test_a_numeric_parameter_beside_a_numeric_domain_is_answered_alike_on_neighbours(stop40_proxy: RunningProxy) -> None:
    """A parameter sent as numeric is cast to numeric once, as beside a numeric column. Sent as
    double precision beside an unconstrained numeric (or a domain over one) it is refused before the
    charge (rule ``numeric-parameter``, tests/test_attack_stop45.py): PostgreSQL compares it in double
    precision, the cast in numeric."""
    for column in ("p", "n"):
        outcome = _outcome(stop40_proxy, f"SELECT count(*) FROM {{t}} WHERE {column} > %s", (Decimal("1.5"),))
        assert outcome[0] == "answer", outcome
        refused = _outcome(stop40_proxy, f"SELECT count(*) FROM {{t}} WHERE {column} > %s", (1.5,))
        assert refused[:2] == ("error", "0A000") and "numeric-parameter" in str(refused[2]), refused


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


# Found by benchmarks/timing_fuzz.py (docs/threat-model.md, Timing, "Values stored apart"), and
# closed: a value within the bounds (881 digits, ~450 bytes; 250 bytes of text) that a wide row's
# toaster stored apart was fetched from the TOAST relation again by every term and every sort
# comparison that read it (2 buffer hits each: 64 terms, ~128 more than an ordinary row). Now only a
# value stored in the row, uncompressed, is read (rewriter/text_bounds.py: ``in_line_text``,
# ``in_line_numeric``); another reads as NULL. Each pair: the same 100 rows and one row with a pad
# kept in the row; in "flat" the row's value is ordinary and stays in the row, in "apart" it is the
# long one, stored apart.
_APART_TABLES = {"n": ("(id int, t text, n numeric)", "g, 'row ' || g, g % 100", "0, 'row 0'"),
                 "t": ("(id int, n numeric, t text)", "g, g % 100, 'row ' || g", "0, 1")}
_APART_POLICY = ATTACK_POLICY_HEAD + "".join(
    f"  public.s40_{kind}_{column}:\n    access: protected\n    epsilon: 1.0\n    columns:\n"
    "      n: {{bounds: [0, 100], group_by: true}}\n      t: {{categories: ['row 1', 'row 2', 'row 3'], group_by: true}}\n"
    for column in _APART_TABLES for kind in ("flat", "apart", "packed", "null"))


def _create_pair(admin: psycopg.Connection, suffix: str, ddl: str, rows: str) -> None:
    """``s40_flat_<suffix>`` and ``s40_apart_<suffix>`` (``ddl``), each of 100 rows (``rows``, a select
    list over ``g``), readable by dpproxy: the row that tells them apart is added by the caller."""
    for kind in ("flat", "apart"):
        name = f"s40_{kind}_{suffix}"
        admin.execute(f"DROP TABLE IF EXISTS {name}")
        admin.execute(f"CREATE TABLE {name} {ddl}")
        admin.execute(f"INSERT INTO {name} SELECT {rows} FROM generate_series(1, 100) g")
        admin.execute(f"GRANT SELECT ON {name} TO dpproxy_service")


@pytest.fixture(scope="module")
def apart_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        for column, (ddl, rows, head) in _APART_TABLES.items():
            _create_pair(admin, column, ddl, rows)
            keep_apart(admin, f"s40_flat_{column}", column)
            admin.execute(f"INSERT INTO s40_flat_{column} SELECT {head}, {'1' if column == 'n' else repr('row 0')}, {PAD}")
            value = LONG_NUMBER if column == "n" else LONG_TEXT
            store_apart(admin, f"s40_apart_{column}", column, f"{head}, {value}", most=512 if column == "n" else 256)
            # "packed": a value within the bounds that the toaster compressed in the row (the pad is
            # never compressed, STORAGE PLAIN); "null": NULL there
            packed = "repeat('1', 240)::numeric" if column == "n" else "repeat('z', 250)"
            for kind, value in (("packed", packed), ("null", "NULL")):
                admin.execute(f"CREATE TABLE IF NOT EXISTS s40_{kind}_{column} AS SELECT * FROM s40_flat_{column} WHERE id > 0")
                admin.execute(f"TRUNCATE s40_{kind}_{column}")
                admin.execute(f"INSERT INTO s40_{kind}_{column} SELECT * FROM s40_flat_{column} WHERE id > 0")
                admin.execute(f"ALTER TABLE s40_{kind}_{column} ALTER COLUMN pad SET STORAGE PLAIN, "
                              f"ALTER COLUMN {column} SET STORAGE {'MAIN' if column == 'n' else 'EXTENDED'}")
                admin.execute(f"INSERT INTO s40_{kind}_{column} SELECT {head}, {value}, {PAD} || {PAD}")
                admin.execute(f"GRANT SELECT ON s40_{kind}_{column} TO dpproxy_service")
            compressed = admin.execute(f"SELECT pg_catalog.pg_column_compression({column}) FROM s40_packed_{column} "
                                       "WHERE id = 0").fetchone()
            assert compressed is not None and compressed[0] is not None, "the packed value was not compressed"
    with running_proxy(test_db, tmp_path_factory, _APART_POLICY) as running:
        yield running


def _extra_buffers(proxy: RunningProxy, test_db: TestDatabase, name: str, sql: str, warm: bool = False,
                   params: Sequence[object] | None = None, plan_cache_mode: str = "auto") -> dict[str, int]:
    """The shared buffers the backend SQL of ``sql`` reads on ``s40_flat_<name>`` and on ``s40_apart_<name>``
    (``params``: bound to its ``%s`` through the proxy and to the backend SQL's ``$1``… after it, planned
    under ``plan_cache_mode``: a generic plan keeps the parameters unknown).
    ``warm``: after one run of each, in the same session: the first fetch of a value stored apart in
    a session opens the table's TOAST relation (~40 catalog buffers, once a backend connection;
    docs/threat-model.md, "A lock on a table's TOAST relation"), which a statement that fetches the
    value once (a hashed raw conjunct) pays and one that never fetches it does not."""
    seen: list[str] = []
    hits = {}
    with recording_released_sql(lambda plan, backend: seen.append(backend)), \
            proxy.connect() as conn, psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("SET jit = off")
        admin.execute(f"SET plan_cache_mode = {plan_cache_mode}")
        for kind in ("flat", "apart"):
            seen.clear()
            conn.execute(sql.replace("{t}", f"s40_{kind}_{name}"), params).fetchall()
            assert seen, "no backend SQL ran"
            if warm:
                for backend in seen:
                    (admin.execute(backend) if params is None else psycopg.RawCursor(admin).execute(backend, params)).fetchall()
            hits[kind] = max(sum(buffer_hits(admin, backend, params) for backend in seen) for _ in range(2))
    return hits


def _or_chain(term: str, count: int = 64) -> str:
    return "(" + " OR ".join(term.format(i=i) for i in range(count)) + ")"


_NUMBERS = ", ".join(f"{1000 + i}.5" for i in range(64))
_STRINGS = ", ".join(f"'z{i}'" for i in range(64))


@pytest.mark.parametrize("column, sql", [
    ("n", f"SELECT count(*) FROM {{t}} WHERE n IN ({_NUMBERS})"),
    ("n", "SELECT count(*) FROM {t} WHERE " + _or_chain("n > {i}.5")),
    ("n", "SELECT count(*) FROM {t} WHERE " + _or_chain("n BETWEEN {i}.25 AND {i}.75", 32)),
    ("n", "SELECT count(*) FROM {t} WHERE n IS NOT NULL AND (id > 0 OR " + _or_chain("n = {i}.5") + ")"),
    ("n", "SELECT " + ", ".join(f"sum(n) FILTER (WHERE id >= -{i})" for i in range(64)) + " FROM {t}"),
    ("n", "SELECT " + ", ".join(f"avg(n) FILTER (WHERE id >= -{i})" for i in range(16)) + " FROM {t}"),
    ("n", "SELECT " + ", ".join(f"count(*) FILTER (WHERE n < {i}.5)" for i in range(64)) + " FROM {t}"),
    ("n", "SELECT " + ", ".join(f"sum(CASE WHEN n > {i}.5 THEN 1 ELSE 0 END)" for i in range(64)) + " FROM {t}"),
    ("n", "SELECT width_bucket(n, 0, 100, 10) AS k, count(*), sum(n) FROM {t} WHERE " + _or_chain("n <> {i}.5", 32)
     + " GROUP BY 1"),
    ("n", "SELECT count(DISTINCT n) FROM {t}"),
    ("t", f"SELECT count(*) FROM {{t}} WHERE t IN ({_STRINGS})"),  # hashed: one fetch, before the fix too
    ("t", "SELECT count(*) FROM {t} WHERE " + _or_chain("t > 'z{i}'")),
    ("t", "SELECT count(*) FROM {t} WHERE " + _or_chain("t BETWEEN 'y{i}' AND 'z{i}'", 32)),
    ("t", "SELECT " + ", ".join(f"count(*) FILTER (WHERE t < 'z{i}')" for i in range(64)) + " FROM {t}"),
    ("t", "SELECT " + ", ".join(f"count(CASE WHEN t > 'z{i}' THEN 1 END)" for i in range(64)) + " FROM {t}"),
    ("t", "SELECT t, count(*) FROM {t} WHERE " + _or_chain("t <> 'z{i}'", 32) + " GROUP BY t"),
    ("t", "SELECT count(DISTINCT t) FROM {t}"),
])
def test_a_value_stored_apart_within_the_bounds_is_read_once_however_many_terms_compare_it(
        apart_proxy: RunningProxy, test_db: TestDatabase, column: str, sql: str) -> None:
    """The backend SQL of a statement whose terms compare or clamp the value (or whose sort or
    histogram key reads it) reads at most the two buffers of one fetch more on the table whose row
    holds it apart than on the one whose row holds an ordinary value: what the row adds does not grow
    with the terms. Before the fix each term fetched it again: 2 buffer hits a term (~128 for 64)."""
    hits = _extra_buffers(apart_proxy, test_db, column, sql)
    assert hits["apart"] - hits["flat"] <= 2, hits


_RANDOM = "(SELECT substr(pg_catalog.string_agg(md5(random()::text), ''), 1, {n}) FROM generate_series(1, {n} / 32 + 2))"
_TEXT_VALUES = {"empty": "''", "short": "'abc'", **{str(n): _RANDOM.format(n=n) for n in (126, 127, 128, 250, 100_000)},
                "multibyte": "repeat('äあ𝔸', 20)", "compressible": "repeat('a', 300)"}
_DIGITS = "(SELECT ('1' || pg_catalog.string_agg(lpad((random() * 1e8)::int8::text, 8, '0'), ''))::numeric " \
          "FROM generate_series(1, {n} / 8))"
_NUMERIC_VALUES = {"small": "1.5", "NaN": "'NaN'", **{f"{n} digits": _DIGITS.format(n=n) for n in (40, 200, 240, 256, 880)},
                   **{f"{n} repeated digits": f"repeat('1', {n})::numeric" for n in (300, 420, 500, 640, 700, 1000, 2000)}}
# (storage of the value's column, whether a pad kept in the row, never compressed, makes the row wide:
# 3,648 bytes, which push out even a value of 25 bytes)
_LAYOUTS = (("EXTENDED", False), ("EXTENDED", True), ("MAIN", True), ("EXTERNAL", True), ("EXTERNAL", False))


def _stored_forms(dsn: str, column_type: str, values: dict[str, str], test: str) -> list[tuple[str, int, bool, bool]]:
    """Each value of ``values`` stored as a one-row table's ``x`` of ``column_type`` in each layout:
    (label, its pg_column_size, whether it is in the row uncompressed, ``test`` of it)."""
    forms = []
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("DO $$ BEGIN CREATE DOMAIN s40_text AS text; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        for label, value in values.items():
            for storage, wide in _LAYOUTS:
                admin.execute("DROP TABLE IF EXISTS s40_form")
                admin.execute(f"CREATE TABLE s40_form (x {column_type}, pad text)")
                admin.execute(f"ALTER TABLE s40_form ALTER COLUMN x SET STORAGE {storage}, ALTER COLUMN pad SET STORAGE PLAIN")
                admin.execute(f"INSERT INTO s40_form SELECT {value}, {f'{PAD} || {PAD}' if wide else 'NULL'}")
                toast = toast_index(admin, "s40_form").removesuffix("_index")
                row = admin.execute(f"SELECT (SELECT count(*) FROM {toast}), pg_catalog.pg_column_compression(x), "
                                    f"pg_catalog.pg_column_size(x), {test} FROM s40_form").fetchone()
                assert row is not None
                chunks, compression, size, in_line = row
                forms.append((f"{label}, {storage}{', wide' if wide else ''}", size, chunks == 0 and compression is None,
                              bool(in_line)))
        admin.execute("DROP TABLE s40_form")
    return forms


@pytest.fixture(params=["pg16", "pg15"])
def stored_forms_dsn(request: pytest.FixtureRequest) -> str:
    database: TestDatabase = request.getfixturevalue("test_db" if request.param == "pg16" else "pg15_db")
    return database.admin_dsn


@pytest.mark.parametrize("column_type", ["text", "bytea", "varchar(300)", "char(300)", "s40_text"])
def test_a_text_is_read_exactly_when_stored_in_the_row_uncompressed(stored_forms_dsn: str, column_type: str) -> None:
    """``pg_column_size(x) > octet_length(x)``, from the header, tells every stored form apart: in
    the row with a 1- or 4-byte header, compressed in the row, out of line with and without
    compression (PostgreSQL 15 and 16 have no function that says so directly)."""
    form = {"bytea": "convert_to({}, 'UTF8')", "varchar(300)": "left({}, 300)", "char(300)": "left({}, 300)"}.get(column_type, "{}")
    values = {label: form.format(value) for label, value in _TEXT_VALUES.items()}
    forms = _stored_forms(stored_forms_dsn, column_type, values, in_line_text("x"))
    assert {label for label, _, truth, _ in forms if not truth}, "no value was stored apart or compressed"
    assert [(label, size) for label, size, truth, in_line in forms if in_line != truth] == []


# Bounds at and around each stored value's size in bytes (0, 3, 126, 127, 128, 180 multibyte, 250, 300),
# and the largest the policy takes.
_BOUNDS = (1, 2, 3, 125, 126, 127, 128, 179, 180, 181, 249, 250, 251, 256, 299, 300, 301, 1_073_741_823)


@pytest.mark.parametrize("column_type", ["text", "bytea", "char(300)"])
def test_the_bound_and_the_in_row_test_in_one_comparison_agree_with_the_two_tests(
        stored_forms_dsn: str, column_type: str) -> None:
    """``int4smaller(pg_column_size(x), b + 1) > octet_length(x)`` (one comparison, four calls a row)
    is true, false or NULL exactly where ``octet_length(x) <= b AND pg_column_size(x) >
    octet_length(x)`` is, on every stored form, for bounds at and around each value's size."""
    form = {"bytea": "convert_to({}, 'UTF8')", "char(300)": "left({}, 300)"}.get(column_type, "{}")
    values = {label: form.format(value) for label, value in {**_TEXT_VALUES, "NULL": "NULL"}.items()}
    both = " AND ".join(
        f"({in_line_text('x', bound)}) IS NOT DISTINCT FROM "
        f"((pg_catalog.octet_length(x) <= {bound}) AND ({in_line_text('x')}))" for bound in _BOUNDS)
    forms = _stored_forms(stored_forms_dsn, column_type, values, both)
    assert {label for label, _, truth, _ in forms if not truth and not label.startswith("NULL")}
    assert [label for label, _, _, agree in forms if not agree] == []


def test_a_numeric_is_read_only_when_stored_in_the_row_uncompressed_within_the_bound(stored_forms_dsn: str) -> None:
    """An odd ``pg_column_size`` of an uncompressed numeric is one in the row with a 1-byte header;
    a value stored apart (even) is never read, nor one in the row with a 4-byte header (at least 128
    bytes: the two cannot be told apart from the header), the cost of the check."""
    forms = _stored_forms(stored_forms_dsn, "numeric", _NUMERIC_VALUES, in_line_numeric("x"))
    assert {label for label, _, truth, _ in forms if not truth}, "no value was stored apart or compressed"
    assert [(label, size) for label, size, truth, in_line in forms
            if in_line != (truth and size <= NUMERIC_MAX_BYTES)] == []
    assert any(in_line for label, _, _, in_line in forms if label.startswith("240 digits"))
    assert any(not truth and size <= NUMERIC_MAX_BYTES for _, size, truth, _ in forms), "none stored apart in 127 bytes"
    assert any(not truth and size % 2 for _, size, truth, _ in forms), "none compressed in an odd size"


_BITS = "(SELECT pg_catalog.string_agg(CASE WHEN random() < 0.5 THEN '1' ELSE '0' END, '') FROM generate_series(1, {n}))"


@pytest.mark.parametrize("bits", [200, 2048])
def test_a_bit_string_is_read_exactly_when_stored_in_the_row_uncompressed(stored_forms_dsn: str, bits: int) -> None:
    """A ``bit(n)`` value holds 4 + ⌈n/8⌉ bytes of data, fixed by its type: ``pg_column_size`` is
    that and a 1- or 4-byte header in the row, that alone stored apart uncompressed, less
    compressed (``octet_length`` of a bit string would read it)."""
    values = {"random": f"CAST({_BITS.format(n=bits)} AS bit({bits}))", "zeros": f"CAST(repeat('0', {bits}) AS bit({bits}))"}
    forms = _stored_forms(stored_forms_dsn, f"bit({bits})", values, in_line_bit("x", bits))
    assert {label for label, _, truth, _ in forms if not truth}, "no value was stored apart or compressed"
    assert [(label, size) for label, size, truth, in_line in forms if in_line != truth] == []


@pytest.mark.parametrize("column_type, values", [
    ("int8range", {"both": "int8range(1, 2)", "extremes": "int8range(-9223372036854775807, 9223372036854775806)",
                   "one": "int8range(NULL, 5)", "empty": "'empty'::int8range", "unbounded": "int8range(NULL, NULL)"}),
    ("tsrange", {"both": "tsrange('2000-01-01', '2000-01-01', '[]')", "one": "tsrange('2020-01-01', NULL)"}),
    ("tstzrange", {"both": "tstzrange('2020-01-01', '2021-01-01')", "empty": "'empty'::tstzrange"}),
])
def test_a_range_is_read_exactly_when_stored_in_the_row_uncompressed(
        stored_forms_dsn: str, column_type: str, values: dict[str, str]) -> None:
    """A range of 8-byte bounds holds 5, 13 or 21 bytes of data; only the last could be stored
    apart (the toaster takes values of more than 24 bytes), where its size, 21, is no size a value
    in the row has. None was, in any layout: the toaster weighs a value in the form the row holds
    it, with a 1-byte header (22 bytes), so the check reads every one."""
    forms = _stored_forms(stored_forms_dsn, column_type, values, in_line_range("x"))
    assert [(label, size) for label, size, truth, in_line in forms if in_line != truth] == []
    assert [(label, size) for label, size, truth, _ in forms if not truth] == []


@pytest.mark.parametrize("column, sql", [
    ("n", "SELECT count(*), sum(n) FROM {t} WHERE n > 0.5"),
    ("t", "SELECT count(*) FROM {t} WHERE t > 'y'"),
    ("t", "SELECT count(DISTINCT t) FROM {t}"),
])
def test_a_value_compressed_in_the_row_within_the_bounds_reads_as_null(
        apart_proxy: RunningProxy, test_db: TestDatabase, column: str, sql: str) -> None:
    """A value within the bounds that the toaster compressed in a wide row was decompressed again by
    every reference (CPU, which no buffer count shows); it now reads as NULL: the backend SQL's exact
    result on its table is the one on the same table with NULL there."""
    seen: list[str] = []
    results = {}
    with recording_released_sql(lambda plan, backend: seen.append(backend)), \
            apart_proxy.connect() as conn, psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        for kind in ("packed", "null"):
            seen.clear()
            conn.execute(sql.replace("{t}", f"s40_{kind}_{column}")).fetchall()
            assert seen, "no backend SQL ran"
            results[kind] = [admin.execute(backend.replace(f"s40_{kind}_{column}", "{t}").replace(
                "{t}", f"s40_{kind}_{column}")).fetchall() for backend in seen]
    assert results["packed"] == results["null"], results


# Left open (docs/threat-model.md, Timing, "Left open"): a value of a type dpproxy reads as it is
# because a declared size bounds it is not checked for its placement, so a wide row or STORAGE
# EXTERNAL that stores it apart still has it fetched again (2 buffer hits) by each reference. Each
# pair as above: 100 rows and one with a pad kept in the row (WIDE_PAD, which pushes out even 32
# bytes); in "flat" that row's value is ordinary and in the row, in "apart" it is stored apart. A
# char(64) value always takes 64 bytes: its flat row has the narrower PAD, which leaves it in the row.
_DECLARED_APART = {"varchar64": ("varchar(64)", SHORT_TEXT, "'row ' || g", "'row 0'", WIDE_PAD, 64),
                   "char64": ("char(64)", SHORT_TEXT, "'row ' || g", "'row 0'", PAD, 65),  # padded: 65 in the row
                   "numeric60": ("numeric(60, 0)", "repeat('7', 60)::numeric", "g % 100", "1", WIDE_PAD, 40)}  # 32 bytes
_DECLARED_POLICY = ATTACK_POLICY_HEAD + "".join(
    f"  public.s40_{kind}_{name}:\n    access: protected\n    epsilon: 1.0\n    columns:\n"
    + ("      v: {{bounds: [0, 100]}}\n" if name == "numeric60" else "      v: {{categories: ['row 1', 'row 2']}}\n")
    for name in _DECLARED_APART for kind in ("flat", "apart"))


@pytest.fixture(scope="module")
def declared_apart_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        for name, (column_type, value, rows, ordinary, flat_pad, most) in _DECLARED_APART.items():
            _create_pair(admin, name, f"(id int, v {column_type})", f"g, {rows}")
            keep_apart(admin, f"s40_flat_{name}", "v")
            admin.execute(f"INSERT INTO s40_flat_{name} SELECT 0, {ordinary}, {flat_pad}")
            in_row = admin.execute(f"SELECT {in_line_numeric('v') if name == 'numeric60' else in_line_text('v')} "
                                   f"FROM s40_flat_{name} WHERE id = 0").fetchone()
            assert in_row == (True,), f"s40_flat_{name}'s value is not in the row"
            store_apart(admin, f"s40_apart_{name}", "v", f"0, {value}", most=most, pad=WIDE_PAD)
    with running_proxy(test_db, tmp_path_factory, _DECLARED_POLICY) as running:
        yield running


def _text_literal(i: int) -> str:
    """A string of 64 characters, the stored value's size (``texteq`` reads a value only when the sizes agree)."""
    return "'" + f"z{i}".ljust(64, "z") + "'"


def _in_lists(literal: Callable[[int], str]) -> str:
    """16 OR'ed IN lists of 8 values each: below the 9 values from which PostgreSQL hashes a list."""
    return "(" + " OR ".join("v IN (" + ", ".join(literal(8 * j + k) for k in range(8)) + ")" for j in range(16)) + ")"


_DECLARED_CONSTRUCTS = [
    ("numeric60", "IN", "SELECT count(*) FROM {t} WHERE v IN (" + ", ".join(f"{10 ** 59 + i}" for i in range(64)) + ")"),
    ("numeric60", "OR", "SELECT count(*) FROM {t} WHERE " + _or_chain("v < {i}")),  # each false for 7…7
    ("numeric60", "BETWEEN", "SELECT count(*) FROM {t} WHERE " + _or_chain("v BETWEEN {i} AND 1{i}", 32)),
    ("numeric60", "DISTINCT", "SELECT count(DISTINCT v) FROM {t}"),
    *[(name, construct, sql) for name in ("varchar64", "char64") for construct, sql in (
        ("IN", "SELECT count(*) FROM {t} WHERE " + _in_lists(_text_literal)),
        ("OR", "SELECT count(*) FROM {t} WHERE " + _or_chain("v > 'z{i}'")),
        ("BETWEEN", "SELECT count(*) FROM {t} WHERE " + _or_chain("v BETWEEN 'y{i}' AND 'z{i}'", 32)),
        ("DISTINCT", "SELECT count(DISTINCT v) FROM {t}"))],
]


@pytest.mark.parametrize("name, construct, sql", _DECLARED_CONSTRUCTS,
                         ids=[f"{name}-{construct}" for name, construct, _ in _DECLARED_CONSTRUCTS])
def test_a_value_of_a_declared_size_stored_apart_is_read_once_however_many_terms_compare_it(
        declared_apart_proxy: RunningProxy, test_db: TestDatabase, name: str, construct: str, sql: str) -> None:
    """As for a text or an unconstrained numeric above: at most one fetch (2 buffers) more on the
    table whose row holds the value apart (each reference fetched it again, 2 hits each, before the
    value was read through its in-line check). A top-level IN also compares the raw column, hashed:
    one fetch for the hash (and one more were the hash to match, which these values do not)."""
    hits = _extra_buffers(declared_apart_proxy, test_db, name, sql, warm=True)
    assert hits["apart"] - hits["flat"] <= 2, hits


_STORED_DECLARED = {"varchar64": "k" * 64, "char64": "k" * 64, "numeric60": Decimal("7" * 60)}
"""Per table of ``_DECLARED_APART``: row 0's value stored apart (SHORT_TEXT: 64 characters)."""


@pytest.mark.parametrize("plan_cache_mode", ["auto", "force_generic_plan"])
@pytest.mark.parametrize("name", list(_DECLARED_APART))
@pytest.mark.parametrize("stored", [True, False])
def test_a_bound_parameters_raw_comparison_fetches_a_value_stored_apart_at_most_once(
        declared_apart_proxy: RunningProxy, test_db: TestDatabase, name: str, stored: bool, plan_cache_mode: str) -> None:
    """A top-level ``v = $1`` also compares the raw column with the parameter, so that a plain index
    serves it (rewriter/raw_equality.py ``parameter_raw_equality``): one comparison, which fetches the
    value stored apart at most once (2 buffers), bound to the stored value itself or to another of
    its size, in a custom plan and in a generic one (where a list would not hash)."""
    value: object = _STORED_DECLARED[name] if stored else (Decimal("7" * 59 + "1") if name == "numeric60" else "z" * 64)
    # another statement for each value and plan mode, so that none repeats an earlier release
    sql = "SELECT count(*) FROM {t} WHERE v = %s AND id > -" + str(1 + stored + 2 * (plan_cache_mode == "auto"))
    hits = _extra_buffers(declared_apart_proxy, test_db, name, sql, warm=True, params=[value],
                          plan_cache_mode=plan_cache_mode)
    assert hits["apart"] - hits["flat"] <= 2, hits


@pytest.mark.parametrize("name", list(_DECLARED_APART))
@pytest.mark.parametrize("stored", [True, False])
def test_a_bound_lists_raw_conjunct_fetches_a_value_stored_apart_at_most_twice_however_many_parameters(
        declared_apart_proxy: RunningProxy, test_db: TestDatabase, name: str, stored: bool) -> None:
    """A top-level ``v IN ($1, …, $16)`` also compares the raw column with the list, hashed, so that a
    plain index serves it (rewriter/raw_equality.py ``parameter_list_equality``): planned with its
    values bound, as dpproxy's backend plans every statement (``plan_cache_mode`` pinned), the array
    is a constant PostgreSQL hashes, and the value stored apart is fetched once for the hash (2
    buffers) and once more by the equality where the hash matches (the list holds the stored value
    itself): not once a parameter. 16 values each of the stored value's size (``texteq`` reads a
    value whose size equals the other's)."""
    others: list[object] = ([Decimal("7" * 58 + f"{i:02d}") for i in range(16)] if name == "numeric60"
                            else [f"z{i}".ljust(64, "z") for i in range(16)])
    values = [_STORED_DECLARED[name], *others[1:]] if stored else others
    sql = "SELECT count(*) FROM {t} WHERE v IN (" + ", ".join(["%s"] * 16) + ") AND id > -" + str(5 + stored)
    hits = _extra_buffers(declared_apart_proxy, test_db, name, sql, warm=True, params=values,
                          plan_cache_mode=PINNED_SETTINGS["plan_cache_mode"])
    assert hits["apart"] - hits["flat"] <= (4 if stored else 2), hits
