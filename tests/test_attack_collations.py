"""ICU and nondeterministic collations on protected text columns, on PostgreSQL 15 (tests/pg15.py),
and on 17 and 18 (tests/pg_versions.py) with their builtin provider's collations besides.

pgserver's PostgreSQL 16 is built without ICU, so these run on Debian's 15: a column of an ICU
deterministic collation, of a case-insensitive (``und-u-ks-level2``) and of a case- and
accent-insensitive (``und-u-ks-level1``) nondeterministic one, and a database created with the
ICU provider. Every accepted DP form must come out the same on neighbouring tables (one row
'MALE', 'Mâle', 'male' or NULL more), LIKE/ILIKE on a nondeterministic column is refused before
the charge, and a histogram over declared categories keeps its keys: a row equal to a category
by the column's ``=`` is counted in that category's cell.

Found: two categories one value by the column's ``=`` (``[Male, male]`` under a case-insensitive
collation; on any PostgreSQL ``[a, 'a ']`` on ``char(n)``, ``[true, t]`` on ``boolean``) were
loaded, and the histogram's second key could hold no row: ``CASE WHEN s = 'Male' ... WHEN s =
'male'`` sends every such row to the first. The policy is now refused at load, naming the pair.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy, refused_at_load, running_proxy
from tests.neighbour_outcome import create_neighbours, masked_outcome

_COLLATIONS = {"icu": '"und-x-icu"', "ci": "dp_nocase", "ai": "dp_noaccent"}
_NONDETERMINISTIC = ("CREATE COLLATION IF NOT EXISTS dp_nocase (provider = icu, locale = 'und-u-ks-level2', "
                     "deterministic = false); "
                     "CREATE COLLATION IF NOT EXISTS dp_noaccent (provider = icu, locale = 'und-u-ks-level1', "
                     "deterministic = false)")
_NEIGHBOURS = {"upper": "('MALE', 3)", "accent": "('Mâle', 3)", "lower": "('male', 3)", "null": "(NULL, 3)"}
_BASE_ROWS = "SELECT (ARRAY['Male', 'Female', 'x'])[1 + g % 3], g % 10 FROM generate_series(1, 30) g"
_ICU_DATABASE = "dpproxy_icu"
_TABLE = """  public.{name}:
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    partitions: 3
    partitioning: row_hash
    columns:
      s: {{{{categories: [Male, Female], group_by: true, other: Other}}}}
      a: {{{{bounds: [0, 10], avg: sample_aggregate}}}}
"""
# Every DP form on the text column (and an AVG whose partitions hash it), and the ways an analyst
# may name a collation: refused the same way on every table, or answered on each.
_STATEMENTS = [
    "SELECT COUNT(*) FROM {t} WHERE s = 'male'",
    "SELECT COUNT(*) FROM {t} WHERE s <> 'male'",
    "SELECT COUNT(*) FROM {t} WHERE s < 'male'",
    "SELECT COUNT(*) FROM {t} WHERE s IN ('male', 'x')",
    "SELECT COUNT(*) FROM {t} WHERE s BETWEEN 'a' AND 'n'",
    "SELECT COUNT(*) FROM {t} WHERE s IS NULL",
    "SELECT COUNT(*) FROM {t} WHERE upper(s) = 'MALE'",
    "SELECT COUNT(*) FROM {t} WHERE s LIKE 'M%'",
    "SELECT COUNT(*) FROM {t} WHERE s ILIKE 'm%'",
    "SELECT COUNT(*) FROM {t} WHERE a = 3 AND lower(s) NOT LIKE 'm%'",
    "SELECT COUNT(*) FROM {t} WHERE s = 'x' OR s LIKE '%'",
    "SELECT COUNT(DISTINCT s) FROM {t}",
    "SELECT MODE() WITHIN GROUP (ORDER BY s) FROM {t}",
    "SELECT s, COUNT(*) FROM {t} GROUP BY s",
    "SELECT s, COUNT(*), AVG(a) FROM {t} WHERE s <> 'Female' GROUP BY s ORDER BY s",
    "SELECT AVG(a) FROM {t} WHERE s = 'Male'",
    "SELECT COUNT(*) FROM {t} WHERE s COLLATE \"C\" = 'male'",
    "SELECT COUNT(*) FROM {t} WHERE s = 'male' COLLATE \"C\"",
    "SELECT COUNT(*) FROM {t} WHERE s COLLATE \"und-x-icu\" < 'male'",
    "SELECT COUNT(*) FROM {t} WHERE s COLLATE dp_nocase LIKE 'M%'",
    "SELECT COUNT(*) FROM {t} WHERE s LIKE 'M%' COLLATE dp_nocase",
    "SELECT s COLLATE \"C\", COUNT(*) FROM {t} GROUP BY s COLLATE \"C\"",
    "SELECT s, COUNT(*) FROM {t} GROUP BY s ORDER BY s COLLATE \"und-x-icu\"",
]


def _tables(family: str) -> list[str]:
    return [f"coll_{family}", *(f"coll_{family}_{name}" for name in _NEIGHBOURS)]


@pytest.fixture(scope="module")
def icu_database(pg15_db: TestDatabase) -> TestDatabase:
    """A database created with the ICU provider (its default collation ICU's), on PostgreSQL 15."""
    return _provider_database(pg15_db, _ICU_DATABASE, "LOCALE_PROVIDER icu ICU_LOCALE 'und-u-ks-level2' LOCALE 'C.UTF-8'")


def _provider_database(server: TestDatabase, name: str, provider: str) -> TestDatabase:
    """A database ``name`` of ``server`` created with ``provider``'s clauses, holding coll_db and
    its neighbours."""
    with psycopg.connect(server.admin_dsn, autocommit=True) as admin:
        if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            admin.execute(f"CREATE DATABASE {name} {provider} TEMPLATE template0")
    database = TestDatabase(*(dsn.replace("/dpproxy_test", f"/{name}") for dsn in (server.admin_dsn, server.service_dsn)))
    with psycopg.connect(database.admin_dsn, autocommit=True) as admin:
        admin.execute("GRANT USAGE ON SCHEMA public TO dpproxy_service")
    create_neighbours(database.admin_dsn, "coll_db", {f"coll_db_{k}": row for k, row in _NEIGHBOURS.items()},
                      "(s text, a int)", _BASE_ROWS)
    return database


@pytest.fixture(scope="module")
def collation_proxy(pg15_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(pg15_db.admin_dsn, autocommit=True) as admin:
        admin.execute(_NONDETERMINISTIC)
    for family, collation in _COLLATIONS.items():
        create_neighbours(pg15_db.admin_dsn, f"coll_{family}", {f"coll_{family}_{k}": row for k, row in _NEIGHBOURS.items()},
                          f"(s text COLLATE {collation}, a int)", _BASE_ROWS)
    policy = ATTACK_POLICY_HEAD + "".join(_TABLE.format(name=name) for family in _COLLATIONS for name in _tables(family))
    with running_proxy(pg15_db, tmp_path_factory, policy) as running:
        yield running


# PostgreSQL 17's and 18's builtin provider: C.UTF-8 (17) and full Unicode case mapping (18),
# where upper('ß') is 'SS' and lower() may change a value's length.
_BUILTIN = {17: "pg_c_utf8", 18: "pg_unicode_fast"}


@pytest.fixture(scope="module")
def collation_proxy_newer(newer_pg_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The ICU and nondeterministic families, and one of the builtin provider, on 17, then 18."""
    with psycopg.connect(newer_pg_db.admin_dsn, autocommit=True) as admin:
        admin.execute(_NONDETERMINISTIC)
        builtin = _BUILTIN[admin.info.server_version // 10000]
    for family, collation in {**_COLLATIONS, "builtin": builtin}.items():
        create_neighbours(newer_pg_db.admin_dsn, f"coll_{family}",
                          {f"coll_{family}_{k}": row for k, row in _NEIGHBOURS.items()},
                          f"(s text COLLATE {collation}, a int)", _BASE_ROWS)
    policy = ATTACK_POLICY_HEAD + "".join(_TABLE.format(name=name) for family in (*_COLLATIONS, "builtin")
                                          for name in _tables(family))
    with running_proxy(newer_pg_db, tmp_path_factory, policy) as running:
        yield running


def _outcomes(conn: psycopg.Connection, family: str) -> dict[str, dict[str, tuple[object, ...]]]:
    """Each statement's outcome on each table of ``family``, where they are not all the same."""
    differing = {}
    for sql in _STATEMENTS:
        outcomes = {table: masked_outcome(conn, sql, table, keys=1 if "GROUP BY" in sql else 0)
                    for table in _tables(family)}
        if len(set(outcomes.values())) > 1:
            differing[sql] = outcomes
    return differing


@pytest.mark.parametrize("family", list(_COLLATIONS))
def test_no_dp_form_on_an_icu_or_nondeterministic_column_lets_one_row_decide_its_outcome(
        collation_proxy: RunningProxy, family: str) -> None:
    with collation_proxy.connect() as conn:
        assert _outcomes(conn, family) == {}
        refused = masked_outcome(conn, "SELECT COUNT(*) FROM {t} WHERE s ILIKE 'm%'", f"coll_{family}")
        if family == "icu":  # deterministic: LIKE is answered
            assert refused[0] == "answer", refused
        else:
            assert refused[:2] == ("error", "DP001") and "whose collation is nondeterministic" in str(refused[2])


@pytest.mark.parametrize("family", [*_COLLATIONS, "builtin"])
def test_no_dp_form_on_an_icu_nondeterministic_or_builtin_column_lets_one_row_decide_its_outcome_on_17_and_18(
        collation_proxy_newer: RunningProxy, family: str) -> None:
    """18 runs LIKE on nondeterministic collations (15 to 17 fail it whatever the rows): dpproxy
    refuses it the same on every version, before the charge."""
    if family == "builtin":
        with collation_proxy_newer.connect() as conn:
            assert _outcomes(conn, family) == {}
            assert masked_outcome(conn, "SELECT COUNT(*) FROM {t} WHERE s ILIKE 'm%'", "coll_builtin")[0] == "answer"
    else:
        test_no_dp_form_on_an_icu_or_nondeterministic_column_lets_one_row_decide_its_outcome(collation_proxy_newer, family)


def test_no_dp_form_in_a_database_of_the_icu_provider_lets_one_row_decide_its_outcome(
        icu_database: TestDatabase, tmp_path: Path) -> None:
    _database_outcomes(icu_database, _ICU_DATABASE, tmp_path)


def test_no_dp_form_in_a_database_of_postgresql_18s_builtin_unicode_provider_lets_one_row_decide_its_outcome(
        pg18_db: TestDatabase, tmp_path: Path) -> None:
    """PG_UNICODE_FAST: full Unicode case mapping (upper('ß') is 'SS') for every text column."""
    database = _provider_database(pg18_db, "dpproxy_builtin",
                                  "LOCALE_PROVIDER builtin BUILTIN_LOCALE 'PG_UNICODE_FAST' LOCALE 'C.UTF-8'")
    _database_outcomes(database, "dpproxy_builtin", tmp_path)


def _database_outcomes(database: TestDatabase, database_name: str, tmp_path: Path) -> None:
    policy = ATTACK_POLICY_HEAD + "".join(_TABLE.format(name=name) for name in _tables("db"))
    running = RunningProxy(make_policy(database, tmp_path / "ledger.sqlite3", policy))
    try:
        with psycopg.connect(running.dsn(database=database_name), autocommit=True, prepare_threshold=None) as conn:
            assert _outcomes(conn, "db") == {}
            # The database's default collation is deterministic whatever its locale: LIKE is answered.
            assert masked_outcome(conn, "SELECT COUNT(*) FROM {t} WHERE s LIKE 'M%'", "coll_db")[0] == "answer"
    finally:
        running.stop()


def test_a_row_equal_to_a_category_under_the_collation_is_counted_in_that_categorys_key(
        collation_proxy: RunningProxy, pg15_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The keys are the declared ones, each once, whatever spelling the rows have."""
    with psycopg.connect(pg15_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS coll_ci_many")
        admin.execute("CREATE TABLE coll_ci_many AS SELECT CAST('MÂLE' AS text) COLLATE dp_noaccent AS s, 1 AS a "
                      "FROM generate_series(1, 1000)")
        admin.execute("GRANT SELECT ON coll_ci_many TO dpproxy_service")
    policy = ATTACK_POLICY_HEAD + _TABLE.format(name="coll_ci_many")
    with running_proxy(pg15_db, tmp_path_factory, policy) as running, running.connect() as conn:
        rows = dict(conn.execute("SELECT s, COUNT(*) FROM coll_ci_many GROUP BY s").fetchall())
    assert list(rows) == ["Male", "Female", "Other"]
    assert abs(rows["Male"] - 1000) < 60 and abs(rows["Other"]) < 60, rows


def test_categories_one_value_under_a_nondeterministic_collation_are_refused_at_load(
        collation_proxy: RunningProxy, pg15_db: TestDatabase, tmp_path: Path) -> None:
    table = _TABLE.format(name="coll_ci").replace("[Male, Female]", "[Male, Female, male]")
    (problem,) = refused_at_load(make_policy(pg15_db, tmp_path / "ledger.sqlite3", ATTACK_POLICY_HEAD + table))
    assert problem.startswith("tables.public.coll_ci.columns.s: categories 'Male' and 'male' are one value of the "
                              "column's type text under its collation public.dp_nocase"), problem


@pytest.mark.parametrize(("ddl", "categories", "pair"), [
    ("char(4)", "[a, 'a  ', b]", "'a' and 'a  '"),
    ("boolean", "['true', 't']", "'true' and 't'"),
])
def test_categories_one_value_of_the_columns_type_are_refused_at_load(
        test_db: TestDatabase, tmp_path: Path, ddl: str, categories: str, pair: str) -> None:
    """Not a matter of ICU: on pgserver's 16, char(n) ignores trailing spaces and boolean reads t as true."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS coll_typed")
        admin.execute(f"CREATE TABLE coll_typed (s {ddl})")
        admin.execute("GRANT SELECT ON coll_typed TO dpproxy_service")
    table = f"  public.coll_typed: {{{{access: protected, epsilon: 1.0, columns: {{{{s: {{{{categories: {categories}, group_by: true}}}}}}}}}}}}\n"
    (problem,) = refused_at_load(make_policy(test_db, tmp_path / "ledger.sqlite3", ATTACK_POLICY_HEAD + table))
    assert problem.startswith(f"tables.public.coll_typed.columns.s: categories {pair} are one value of the column's type"), problem


# A row no analyst would write, which a neighbouring table may hold: text values long enough
# that lower()/upper() (four bytes a character where LC_CTYPE is not C, two under ICU), ILIKE
# (which lowers first) and the hash of a nondeterministic ICU collation (GROUP BY) ask
# PostgreSQL for more than 1 GB. lz4: the values are built in seconds, not pglz's minute.
_HUGE_ROW = "(repeat('a', 270000000), repeat('b', 540000000), 3)"
_HUGE_FORMS = [
    "SELECT COUNT(*) FROM {t} WHERE lower(s) = 'x'",
    "SELECT COUNT(*) FROM {t} WHERE s ILIKE 'x%'",
    "SELECT COUNT(*) FROM {t} WHERE a = 3 AND s NOT ILIKE 'x%'",
    "SELECT COUNT(*) FROM {t} WHERE upper(c) = 'X' OR lower(s) LIKE 'x%'",
    "SELECT c, COUNT(*) FROM {t} GROUP BY c",
]
# Not here: c <> 'x', MODE and COUNT(DISTINCT c) compare the 540 MB value without asking for
# memory, but take seconds to, which the statement timeout can tell (a limit of
# docs/threat-model.md, "Timing").


def test_a_value_too_long_to_case_fold_or_hash_does_not_decide_whether_a_statement_fails(
        collation_proxy: RunningProxy, pg15_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Found: each form failed with XX000 (invalid memory alloc request size) on the neighbour
    only. The values are NULL to those functions past 16 MiB (rewriter.sql_text.short_text)."""
    ddl = "(s text COMPRESSION lz4, c text COMPRESSION lz4 COLLATE dp_nocase, a int)"
    create_neighbours(pg15_db.admin_dsn, "coll_huge", {"coll_huge_1": _HUGE_ROW}, ddl,
                      "SELECT 'x', (ARRAY['Male', 'Female'])[1 + g % 2], g % 10 FROM generate_series(1, 30) g")
    policy = ATTACK_POLICY_HEAD + "".join(_TABLE.format(name=name).replace("      s:", "      c:")
                                          for name in ("coll_huge", "coll_huge_1"))
    try:
        with running_proxy(pg15_db, tmp_path_factory, policy) as running, running.connect() as conn:
            for sql in _HUGE_FORMS:
                outcomes = {table: masked_outcome(conn, sql, table, keys=1 if "GROUP BY" in sql else 0)
                            for table in ("coll_huge", "coll_huge_1")}
                assert len(set(outcomes.values())) == 1 and outcomes["coll_huge"][0] == "answer", (sql, outcomes)
    finally:
        with psycopg.connect(pg15_db.admin_dsn, autocommit=True) as admin:
            admin.execute("DROP TABLE IF EXISTS coll_huge, coll_huge_1")
