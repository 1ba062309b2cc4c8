"""Long values beyond ``text``: a domain over text, ``bytea`` and a domain over it are read only up to
the table's max_text_bytes, and a column whose values can be of any length with no header telling
their size (``jsonb``, ``tsvector``, ``numrange``, ``varbit``, ``path``, arrays) is never read: only
counted and tested for NULL (rewriter/text_bounds.py, ``ColumnInfo.unbounded_length``).

Before, a 3 MB value of any of these types was read whole by every comparison and by
``COUNT(DISTINCT)``, however many terms read it: the timing lever rewriter/text_bounds.py closed
for text (benchmarks/results.md). Real dpproxy, real PostgreSQL; decisions and answers are pinned,
never timings.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from policies.tables import ColumnInfo, Relation
from policies.model import TablePolicy
from rewriter.text_bounds import COMPARISON_WORK, MAX_TEXT_WORK, column_sql, read_in_place, value_bytes
from tests.conftest import (ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy, refused_at_load, running_proxy,
                            spent_epsilon)
from tests.neighbour_outcome import create_neighbours, same_on_neighbours

BOUND = 256  # the default max_text_bytes
_DOMAINS = """
    DROP DOMAIN IF EXISTS lv_outer, lv_text, lv_short, lv_bytes CASCADE;
    CREATE DOMAIN lv_text AS text;
    CREATE DOMAIN lv_outer AS lv_text;  -- a domain over a domain: bounded by the base type at the end of the chain
    CREATE DOMAIN lv_short AS varchar(10);
    CREATE DOMAIN lv_bytes AS bytea;
"""
_DDL = ("(id int PRIMARY KEY, d lv_text, dd lv_outer, s lv_short, b bytea, bd lv_bytes, jb jsonb, tv tsvector, "
        "nr numrange, ia int[], vb varbit, pa path, ir int4range, ip inet, b3 bit(3), bl bit(4096), x int)")
_ORDINARY = ("'row ' || g, 'row ' || g, 's' || g % 5, convert_to('row ' || g, 'UTF8'), convert_to('row ' || g, 'UTF8'), "
             "jsonb_build_object('k', g), to_tsvector('simple', 'row ' || g), numrange(g, g + 1), ARRAY[g], "
             "B'101', path '((0,0),(1,1))', int4range(g, g + 1), '10.0.0.1', B'101', repeat('1', 4096)::bit(4096), g % 100")
_BASE_ROWS = f"SELECT g, {_ORDINARY} FROM generate_series(1, 300) g"
_RANDOM_3MB = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 94000) g)"
_LONG = (f"(0, {_RANDOM_3MB}, {_RANDOM_3MB}, 's', convert_to({_RANDOM_3MB}, 'UTF8'), convert_to({_RANDOM_3MB}, 'UTF8'), "
         "(SELECT jsonb_agg(md5(g::text)) FROM generate_series(1, 80000) g), "
         "(SELECT string_agg(md5(g::text), ' ')::tsvector FROM generate_series(1, 25000) g), "
         "numrange(0, ('1' || repeat('0', 100000))::numeric), (SELECT array_agg(g) FROM generate_series(1, 800000) g), "
         "repeat('101', 8000000)::varbit, "
         "(SELECT ('(' || string_agg(format('(%s,%s)', g, g), ',') || ')')::path FROM generate_series(1, 150000) g), "
         "int4range(0, 1), 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128', B'111', repeat('0', 4096)::bit(4096), 1)")
_NEIGHBOURS = {
    "lv_long": _LONG,
    "lv_at": f"(0, repeat('a', {BOUND}), repeat('a', {BOUND}), 's', convert_to(repeat('a', {BOUND}), 'UTF8'), "
             f"convert_to(repeat('a', {BOUND}), 'UTF8'), '1', 'a', numrange(0, 1), '{{1}}', B'1', path '((0,0))', "
             "int4range(0, 1), '::/0', B'000', repeat('1', 4096)::bit(4096), 1)",
    "lv_null": "(0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
}
_NAMES = ("lv_0", *_NEIGHBOURS)
_TABLE = """
    access: protected
    epsilon: 1.0
    columns:
      x: {{bounds: [0, 100]}}
"""
_EXACT = "lv_exact"  # ε so large that a count comes back exact
_WIDE = "lv_wide"  # a bound of 100 kB: a comparison of d or b then weighs 100,000 units
_WIDE_BYTES = 100_000
_POLICY = (ATTACK_POLICY_HEAD + "  public.lv_0: &C" + _TABLE + "".join(f"  public.{name}: *C\n" for name in _NEIGHBOURS)
           + f"  public.{_EXACT}:" + _TABLE.replace("epsilon: 1.0", "epsilon: 1000.0")
           + f"  public.{_WIDE}:" + _TABLE + f"    max_text_bytes: {_WIDE_BYTES}\n")
# lv_exact's values of d, dd, b and bd by how many rows hold them: 3 short, 2 at the bound, 4 past it, 1 of 3 MB, 5 NULL.
_VALUE = (f"CASE WHEN g <= 3 THEN 'short' WHEN g <= 5 THEN repeat('a', {BOUND}) WHEN g <= 9 THEN repeat('a', {BOUND + 1}) "
          f"WHEN g = 10 THEN {_RANDOM_3MB} END")
_EXACT_ROWS = (f"SELECT g, {_VALUE}, {_VALUE}, 's', convert_to({_VALUE}, 'UTF8'), convert_to({_VALUE}, 'UTF8'), "
               "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, g FROM generate_series(1, 15) g")


@pytest.fixture(scope="module")
def long_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(_DOMAINS)
    create_neighbours(test_db.admin_dsn, "lv_0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    create_neighbours(test_db.admin_dsn, _EXACT, {}, _DDL, _EXACT_ROWS)
    create_neighbours(test_db.admin_dsn, _WIDE, {}, _DDL, _BASE_ROWS)
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


_BOUNDED_READS = [
    ("SELECT count(*) FROM {t} WHERE {c} IS NULL", 5 + 4 + 1),  # NULL, past the bound, 3 MB
    ("SELECT count({c}) FROM {t}", 3 + 2),
    ("SELECT count(*) FROM {t} WHERE {c} > ''", 3 + 2),
    ("SELECT count(*) FROM {t} WHERE {c} NOT IN ('short')", 2),
    ("SELECT count(*) FILTER (WHERE {c} = '" + "a" * (BOUND + 1) + "') FROM {t}", 0),
    ("SELECT count(*) FILTER (WHERE {c} = '" + "a" * BOUND + "') FROM {t}", 2),
    ("SELECT count(DISTINCT {c}) FROM {t}", 2),
]


@pytest.mark.parametrize("column", ["d", "dd", "b", "bd"])
@pytest.mark.parametrize("sql, expected", _BOUNDED_READS)
def test_a_domain_or_bytea_value_longer_than_the_bound_reads_as_null(
        long_proxy: RunningProxy, column: str, sql: str, expected: int) -> None:
    """A domain over text (or over such a domain), bytea and a domain over bytea are read as text is:
    a value past max_text_bytes is NULL in every construct, one within it is read as it is."""
    with long_proxy.connect() as conn:
        row = conn.execute(sql.replace("{c}", column).replace("{t}", _EXACT)).fetchone()
    assert row is not None and round(float(row[0])) == expected


def _column(name: str, type_oid: int, modifier: int = -1, attnum: int = 1, base: tuple[int, int] = (0, -1)) -> ColumnInfo:
    return ColumnInfo(name, type_oid, modifier, attnum, None, base_type_oid=base[0], base_type_modifier=base[1])


def test_the_backend_sql_bounds_a_domain_by_its_base_type() -> None:
    """A domain over text or bytea is bounded by its stored size; a domain over varchar(10) carries the
    bound already (40 bytes) and is read through the check of its placement alone (its values may be
    stored apart: docs/threat-model.md); a domain over an integer is untouched."""
    domain = 16_400  # a user type's OID
    columns = {column.name: column for column in (
        _column("d", domain, attnum=1, base=(25, -1)), _column("s", domain + 1, attnum=2, base=(1043, 10 + 4)),
        _column("b", 17, attnum=3), _column("i", domain + 2, attnum=4, base=(23, -1)))}
    policy = TablePolicy(epsilon=1.0)
    table = Relation(1, "public", "lv", policy, columns)
    assert [read_in_place(column_sql(column), table) for column in columns.values()] == [
        'CASE WHEN (pg_catalog.int4smaller(pg_catalog.pg_column_size("d"), CAST(257 AS integer)) OPERATOR(pg_catalog.>) pg_catalog.octet_length("d")) THEN "d" END',
        'CASE WHEN (pg_catalog.pg_column_size("s") OPERATOR(pg_catalog.>) pg_catalog.octet_length("s")) THEN "s" END',
        'CASE WHEN (pg_catalog.int4smaller(pg_catalog.pg_column_size("b"), CAST(257 AS integer)) OPERATOR(pg_catalog.>) pg_catalog.octet_length("b")) THEN "b" END',
        '"i"']
    assert [value_bytes(columns[name], policy) for name in ("d", "s", "b", "i")] == [256, 40, 256, None]


# Each read of a value of unbounded length a DP statement could make: refused before the charge.
_UNBOUNDED_READS = [
    *(f"SELECT count(*) FROM {{t}} WHERE {column} = {value}" for column, value in (
        ("jb", "'1'"), ("tv", "'a'"), ("nr", "'[0,1)'"), ("vb", "'1'"), ("pa", "'((0,0))'"))),
    "SELECT count(*) FROM {t} WHERE tv > 'a' OR x > 1",
    "SELECT count(*) FILTER (WHERE jb IN ('1', '2')) FROM {t}",
    *(f"SELECT count(DISTINCT {column}) FROM {{t}}" for column in ("jb", "tv", "nr", "ia", "vb", "pa")),
    "SELECT count(*) FROM {t} WHERE bl = '1'",  # bit(n) of more than 2,048 bits
    "SELECT count(DISTINCT bl) FROM {t}",
]


@pytest.mark.parametrize("sql", _UNBOUNDED_READS)
def test_reading_a_value_of_unbounded_length_is_refused_uncharged_on_every_neighbour(
        long_proxy: RunningProxy, sql: str) -> None:
    with long_proxy.connect() as conn:
        outcome = same_on_neighbours(conn, sql, _NAMES, spent_epsilon)
    assert outcome[:2] == ("error", "DP001"), outcome
    message, hint = str(outcome[2]), str(outcome[3])
    assert "can be of any length" in message, message
    assert ("rule: aggregate-argument" if "DISTINCT" in sql else "rule: safe-predicate") in message
    assert "max_text_bytes" in hint and ("IS [NOT] NULL" in hint or "counts its non-NULL values" in hint), hint


@pytest.mark.parametrize("sql", [
    "SELECT count(jb), count(tv), count(nr), count(ia), count(vb), count(pa) FROM {t}",
    "SELECT count(*) FROM {t} WHERE jb IS NULL OR tv IS NOT NULL OR ia IS NULL",
    "SELECT count(*) FROM {t} WHERE ir = '[0,1)' OR ir > '[5,6)'",  # a range of a fixed-length type: two bounds
    "SELECT count(DISTINCT ir) FROM {t}",
    "SELECT count(*) FROM {t} WHERE ip > '10.0.0.0' OR b3 = '101'",  # inet: at most 22 bytes; bit(3)
    "SELECT count(DISTINCT ip), count(DISTINCT b3), count(bl) FROM {t}",
    "SELECT count(*) FROM {t} WHERE d > 'row' OR dd IN ('a', 'b') OR b = 'x' OR bd < 'y'",
    "SELECT count(DISTINCT d), count(DISTINCT b), count(DISTINCT s) FROM {t}",
])
def test_counts_and_bounded_reads_are_answered_the_same_on_every_neighbour(long_proxy: RunningProxy, sql: str) -> None:
    with long_proxy.connect() as conn:
        assert same_on_neighbours(conn, sql, _NAMES, spent_epsilon)[0] == "answer", sql


@pytest.mark.parametrize("column", ["d", "b"])
def test_comparisons_of_a_domain_or_bytea_are_weighed_by_the_bound(long_proxy: RunningProxy, column: str) -> None:
    """At max_text_bytes 100,000 a comparison weighs 100,000 units: six fit the limit, seven are refused
    before the charge, as for a text column."""
    values = ", ".join(f"'v{i}'" for i in range(7))
    with long_proxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(f"SELECT count(*) FROM {_WIDE} WHERE {column} IN ({values})")
        assert refused.value.sqlstate == "DP001" and spent_epsilon(conn) == before
        work = 7 * _WIDE_BYTES * COMPARISON_WORK
        assert f"work of {work:,} units in all (at most {MAX_TEXT_WORK:,}" in str(refused.value)
        assert "rule: safe-predicate" in str(refused.value)
        within = ", ".join(f"'v{i}'" for i in range(6))
        assert conn.execute(f"SELECT count(*) FROM {_WIDE} WHERE {column} IN ({within})").fetchone() is not None


def test_show_columns_says_which_values_are_bounded_and_which_are_not_read(long_proxy: RunningProxy) -> None:
    with long_proxy.connect() as conn:
        bounds = {row[1]: row[3] for row in conn.execute("SHOW dpproxy.columns").fetchall() if row[0] == _EXACT}
    for column in ("d", "dd", "b", "bd"):
        assert bounds[column] == f"at most {BOUND} bytes, stored in the row uncompressed (another value reads as NULL)", (column, bounds[column])
    assert bounds["s"] == "at most 40 bytes, stored in the row uncompressed (another value reads as NULL)"
    for column in ("jb", "tv", "nr", "ia", "vb", "pa", "bl"):
        assert bounds[column] == "not read: values of any length are only counted and tested for NULL", column
    assert bounds["ir"] is None and bounds["ip"] is None and bounds["b3"] is None


@pytest.mark.parametrize("column, entry", [
    ("tv", "{categories: [a, b]}"),
    ("jb", "{categories: ['1', '2'], group_by: true}"),
])
def test_the_policy_refuses_categories_on_a_column_of_unbounded_length(
        long_proxy: RunningProxy, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory,
        column: str, entry: str) -> None:
    """MODE and a categorical key compare the column with each category, reading the whole value."""
    text = ATTACK_POLICY_HEAD + f"  public.{_EXACT}:" + _TABLE + f"      {column}: {{{entry}}}\n"
    problems = refused_at_load(make_policy(test_db, tmp_path_factory.mktemp("ledger") / "l.sqlite3", text))
    assert any(f"columns.{column}: categories" in problem and "can be of any length" in problem
               and "leave it out of the policy's columns" in problem for problem in problems), problems


def test_citext_on_postgresql_15_is_only_counted_and_shown_as_not_read(
        pg15_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """citext (Debian's PostgreSQL 15 contrib; pgserver's 16 has no citext) is an extension's type of
    any length: not built in, so never compared or counted distinct (before any charge), and not bounded
    by max_text_bytes either, which SHOW dpproxy.columns says. A 3 MB value changes none of it."""
    with psycopg.connect(pg15_db.admin_dsn, autocommit=True) as admin:
        admin.execute("CREATE EXTENSION IF NOT EXISTS citext")
    create_neighbours(pg15_db.admin_dsn, "lv_ci", {"lv_ci_long": f"(0, {_RANDOM_3MB}, 1)"}, "(id int, c citext, x int)",
                      "SELECT g, 'row ' || g, g % 100 FROM generate_series(1, 50) g")
    policy = ATTACK_POLICY_HEAD + "  public.lv_ci: &C" + _TABLE + "  public.lv_ci_long: *C\n"
    with running_proxy(pg15_db, tmp_path_factory, policy) as running, running.connect() as conn:
        for sql in ("SELECT count(*) FROM {t} WHERE c = 'row 1'", "SELECT count(DISTINCT c) FROM {t}"):
            outcome = same_on_neighbours(conn, sql, ("lv_ci", "lv_ci_long"), spent_epsilon)
            assert outcome[:2] == ("error", "DP001") and "not built into PostgreSQL" in str(outcome[2]), outcome
        assert same_on_neighbours(conn, "SELECT count(c) FROM {t} WHERE c IS NOT NULL", ("lv_ci", "lv_ci_long"),
                                  spent_epsilon)[0] == "answer"
        bounds = {row[1]: row[3] for row in conn.execute("SHOW dpproxy.columns").fetchall() if row[0] == "lv_ci"}
    assert bounds["c"] == "not read: values of any length are only counted and tested for NULL"
