"""Statements dpproxy refuses: each with a SQLSTATE, a message naming the rule, and a hint."""

from __future__ import annotations

import psycopg
import pytest

from conftest import RunningProxy, refused_uncharged

REFUSED = [
    ("SELECT * FROM adult", "DP001", "no-row-access"),
    ("SELECT age FROM adult", "DP001", "no-row-access"),
    ("SELECT age, COUNT(*) FROM adult GROUP BY age", "DP001", "no-group-by"),
    ("SELECT COUNT(*) FROM adult a JOIN adult b ON a.age = b.age", "DP001", "no-join"),
    ("SELECT COUNT(*) FROM adult, lookup", "DP001", "no-join"),
    ("SELECT COUNT(*) FROM adult WHERE age > (SELECT 1)", "DP001", "no-subquery"),
    ("SELECT COUNT(*) FROM (SELECT age + 1 AS a FROM adult) s", "DP001", "no-subquery"),
    ("WITH s AS (SELECT * FROM adult) SELECT COUNT(*) FROM s a, s b", "DP001", "no-subquery"),
    ("SELECT COUNT(*) FROM adult TABLESAMPLE SYSTEM (1)", "DP001", "no-subquery"),  # was answered for the whole table
    ("SELECT COUNT(*) FROM (SELECT * FROM adult TABLESAMPLE BERNOULLI (50)) AS t", "DP001", "no-subquery"),
    ("SELECT AVG(age) OVER () FROM adult", "DP001", "no-window"),
    ("SELECT COUNT(*) OVER (PARTITION BY sex) FROM adult", "DP001", "no-window"),
    ("SELECT COUNT(*) FROM adult UNION SELECT COUNT(*) FROM adult", "DP001", "no-join"),
    ("SELECT SUM(DISTINCT age) FROM adult", "DP001", "no-distinct"),
    ("SELECT DISTINCT COUNT(*) FROM adult", "DP001", "no-distinct"),
    ("SELECT COUNT(*) FILTER (WHERE age + 1 > 3) FROM adult", "DP001", "safe-predicate"),
    ("SELECT COUNT(*) + age FROM adult", "DP001", "no-row-access"),
    ("SELECT string_agg(sex, ',') FROM adult", "DP001", "function-allowlist"),
    ("SELECT COUNT(*) FROM adult WHERE age / 0 = 1", "DP001", "safe-predicate"),
    ("SELECT COUNT(*) FROM adult WHERE age::text = '40'", "DP001", "safe-predicate"),
    ("SELECT COUNT(*) FROM adult WHERE pg_sleep(1) IS NULL", "DP001", "function-allowlist"),
    # Each would fail on the backend after the charge (42883 integer = boolean, 42804 a WHERE of an
    # integer), answer another question (IS JSON as IS NULL), or fold into no type of the column's.
    ("SELECT COUNT(*) FROM adult WHERE 1 = TRUE", "DP001", "safe-predicate"),
    ("SELECT COUNT(*) FROM adult WHERE age", "DP001", "safe-predicate"),
    ("SELECT COUNT(*) FROM adult WHERE sex IS JSON", "DP001", "safe-predicate"),
    ("SELECT COUNT(*) FROM adult WHERE sex > now()", "DP001", "safe-predicate"),
    ("SELECT SUM(fnlwgt) FROM adult", "DP001", "bounds-required"),
    # Sample and aggregate groups the rows into partitions: their distinct counts would be added up.
    ("SELECT COUNT(DISTINCT age), MIN(age) FROM adult", "DP001", "aggregate-combination"),
    ("SELECT COUNT(*) FROM adult LIMIT 1 + 1", "DP001", "limit"),
    ("SELECT COUNT(*) FROM adult ORDER BY COUNT(*) FETCH FIRST 1 ROWS WITH TIES", "DP001", "limit"),
    ("SELECT * FROM secret_unlisted", "42501", "default-deny"),
    ("SELECT * FROM pg_stats", "42501", "catalog-allowlist"),
    ("SELECT * FROM pg_catalog.pg_stat_user_tables", "42501", "catalog-allowlist"),
    ("SELECT last_value FROM pg_sequences", "42501", "catalog-allowlist"),
    ("SELECT * FROM pg_catalog.pg_statistic", "42501", "catalog-allowlist"),
    ("SELECT pg_read_file('PG_VERSION')", "42501", "function-allowlist"),
    ("SELECT lo_get(1)", "42501", "function-allowlist"),
    # The columns of a probe that asks for no row are answered free, but not through a function call.
    ("SELECT ('adult'::regclass).pg_stat_get_live_tuples FROM adult LIMIT 0", "42501", "function-allowlist"),
    ("SELECT pg_stat_get_live_tuples('adult'::regclass)", "42501", "function-allowlist"),
    ("SELECT query_to_xml('select * from adult', true, true, '')", "42501", "function-allowlist"),
    # A sequence's position is a serial key's row count, pg_sequences' last_value under another name.
    ("SELECT pg_sequence_last_value('lookup_id_seq')", "42501", "function-allowlist"),
    ("SELECT lastval()", "42501", "function-allowlist"),
    ("INSERT INTO adult (age) VALUES (1)", "25006", "read-only"),
    ("DELETE FROM adult", "25006", "read-only"),
    ("SELECT * INTO TEMP copied FROM lookup", "25006", "read-only"),  # a table left on a pooled connection
    ("CREATE TABLE t (x int)", "25006", "read-only"),
    ("COPY adult TO STDOUT", "0A000", "statement-not-allowed"),
    ("PREPARE TRANSACTION 'kept'", "0A000", "statement-not-allowed"),
    ("EXPLAIN ANALYZE SELECT COUNT(*) FROM adult", "0A000", "statement-not-allowed"),
    ("SET default_transaction_read_only = off", "42501", "safe-settings"),
    ("SET ROLE dpproxy_service", "42501", "safe-settings"),
    ("SELECT set_config('statement' || '_timeout', '1', false)", "42501", "safe-settings"),  # a computed name
    ("BEGIN READ WRITE", "25006", "read-only"),
    ("SELECT FROM nowhere_at_all", "42P01", "undefined-relation"),
    ("SELEC 1", "42601", "syntax"),
]


@pytest.mark.parametrize("sql,sqlstate,rule", REFUSED, ids=[r[0][:48] for r in REFUSED])
def test_refused_with_sqlstate_rule_and_hint(proxy: RunningProxy, sql: str, sqlstate: str, rule: str):
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
        diag = info.value.diag
        assert diag.sqlstate == sqlstate, diag.message_primary
        if sqlstate not in ("42601", "42P01"):
            assert f"rule: {rule}" in diag.message_primary or rule == "no-join"
            assert diag.message_hint
        # The connection is still usable after a refusal.
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_an_unknown_relation_is_hinted_with_the_tables_of_the_policy(proxy: RunningProxy):
    # A newcomer's "adults" for "adult": PostgreSQL's own message, and a hint naming what there is.
    with proxy.connect() as conn:
        with pytest.raises(psycopg.errors.UndefinedTable) as info:
            conn.execute("SELECT count(*) FROM adults")
    assert info.value.diag.message_primary == 'relation "adults" does not exist'
    assert info.value.diag.message_hint == "The tables dpproxy's policy names: adult, clamp_test, lookup."


WORDED = [
    ("DO $$BEGIN END$$", "DO is not supported through dpproxy (rule: statement-not-allowed)"),
    ("VALUES ((SELECT count(*) FROM adult))", "VALUES is not allowed on protected table adult (rule: not-a-select)"),
    ("SELECT count(*) FROM adult WHERE ctid > '(0,1)'",
     "system column ctid (the row's physical identity) is not allowed on protected table adult (rule: no-row-access)"),
    ("SELECT sum(xmin) FROM adult",
     "system column xmin (the row's physical identity) is not allowed on protected table adult (rule: no-row-access)"),
    ("SELECT count(*) FROM adult WHERE CASE WHEN age > 3 THEN true END",
     "CASE is not allowed in WHERE on protected table adult (rule: safe-predicate)"),
    ("SELECT count(*) FROM adult WHERE COALESCE(age, 0) > 3",
     "COALESCE is not allowed in WHERE on protected table adult (rule: safe-predicate)"),
    ("SELECT count(*) FROM adult WHERE age % 2 = 1", "operator % is not allowed in WHERE on protected table adult (rule: safe-predicate)"),
    ("SELECT count(*) FROM adult WHERE age + 1 > 3", "operator + is not allowed in WHERE on protected table adult (rule: safe-predicate)"),
    ("SELECT count(*) FROM adult WHERE sex || 'x' = 'Malex'",
     "operator || is not allowed in WHERE on protected table adult (rule: safe-predicate)"),
    ("SELECT count(*) FROM adult WHERE age IS DISTINCT FROM 40",
     "IS DISTINCT FROM is not allowed in WHERE on protected table adult (rule: safe-predicate)"),
    ("SELECT count(*) FROM adult WHERE age IS NOT DISTINCT FROM 40",
     "IS NOT DISTINCT FROM is not allowed in WHERE on protected table adult (rule: safe-predicate)"),
    ("SELECT count(*) FROM adult WHERE sex ~ '^M'",
     "operator ~ (a regular expression) is not allowed in WHERE on protected table adult (rule: safe-predicate)"),
    ("SELECT count(*) FROM adult WHERE sex !~* '^m'",
     "operator ~* (a regular expression) is not allowed in WHERE on protected table adult (rule: safe-predicate)"),
    ("SELECT count(*) FROM adult WHERE sex SIMILAR TO 'M%'",
     "SIMILAR TO is not allowed on protected table adult (rule: function-allowlist)"),
    ("SELECT count(*) FROM adult WHERE age = ANY('{40,41}')",
     "a comparison with ANY(array) is not allowed in WHERE on protected table adult (rule: safe-predicate)"),
    ("SELECT count(*) FROM adult WHERE age = ANY(ARRAY[40, 41])",
     "a comparison with ANY(array) is not allowed in WHERE on protected table adult (rule: safe-predicate)"),
    ("SELECT count(*) FROM adult WHERE age <> ALL(ARRAY[40, 41])",
     "a comparison with ALL(array) is not allowed in WHERE on protected table adult (rule: safe-predicate)"),
    ("SELECT count(*) FROM adult WHERE age = SOME(%s)",
     "a comparison with SOME(array) is not allowed in WHERE on protected table adult (rule: safe-predicate)"),
]


@pytest.mark.parametrize("sql,message", WORDED, ids=[w[0][:48] for w in WORDED])
def test_refusals_name_the_construct_as_the_analyst_wrote_it(proxy: RunningProxy, sql: str, message: str):
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql, ([40, 41],) if "%s" in sql else None)
    assert info.value.diag.message_primary == message


def test_a_comparison_with_an_array_is_refused_with_the_in_list_to_write(proxy: RunningProxy):
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT count(*) FROM adult WHERE age = ANY(%s)", ([40, 41],))
    assert info.value.diag.sqlstate == "DP001"
    assert "age IN (40, 41)" in (info.value.diag.message_hint or "")


@pytest.mark.parametrize("sql,hint", [
    ("SELECT AVG(sex) FROM adult",
     "sex answers COUNT(sex), COUNT(DISTINCT sex), MODE() WITHIN GROUP (ORDER BY sex). SUM, AVG, MIN, MAX, "
     "percentiles, VARIANCE and STDDEV take a numeric column of adult that has bounds in the policy."),
    ("SELECT SUM(education) FROM adult",
     "education answers COUNT(education), COUNT(DISTINCT education). SUM, AVG, MIN, MAX, "
     "percentiles, VARIANCE and STDDEV take a numeric column of adult that has bounds in the policy."),
    ("SELECT MAX(interview_date) FROM adult",
     "A date or time column answers COUNT(interview_date); its earliest or latest time is not answered. SUM, AVG, "
     "MIN, MAX, percentiles, VARIANCE and STDDEV take a numeric column of adult that has bounds in the policy."),
])
def test_an_aggregate_of_a_column_that_is_not_numeric_says_what_that_column_answers(proxy: RunningProxy, sql: str,
                                                                                    hint: str):
    # The hint was the generic list of aggregates, which names SUM(col) and MAX(col) as allowed.
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql)
    assert info.value.sqlstate == "DP001" and info.value.diag.message_hint == hint


def test_union_names_its_rule(proxy: RunningProxy):
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT COUNT(*) FROM adult UNION SELECT COUNT(*) FROM adult")
    assert "UNION" in info.value.diag.message_primary or "JOIN" in info.value.diag.message_primary


def test_public_table_passes_through_unchanged(proxy: RunningProxy):
    with proxy.connect() as conn:
        rows = conn.execute("SELECT code, label FROM lookup ORDER BY code").fetchall()
    assert rows == [("F", "Female"), ("M", "Male")]


def test_pg_class_row_counts_are_neutralised(proxy: RunningProxy, admin):
    admin.execute("ANALYZE adult")
    with proxy.connect() as conn:
        rows = conn.execute("SELECT reltuples, relpages FROM pg_class WHERE oid = 'public.adult'::regclass").fetchall()
        star = conn.execute("SELECT * FROM pg_catalog.pg_class c WHERE c.relname = 'adult'")
        names = [d.name for d in star.description]
        star_row = star.fetchone()
        # SQLAlchemy qualifies columns by schema and table.
        qualified = conn.execute("SELECT pg_catalog.pg_class.reltuples FROM pg_catalog.pg_class "
                                 "WHERE pg_catalog.pg_class.relname = 'adult_age_idx'").fetchall()
    assert rows == [(-1.0, 0)] and qualified == [(-1.0,)]
    assert star_row[names.index("reltuples")] == -1.0
    # By oid: test_attacks makes a shadow_schema.adult, never analysed (reltuples -1).
    assert admin.execute("SELECT reltuples FROM pg_class WHERE oid = 'public.adult'::regclass").fetchone()[0] > 40000


def test_pg_class_is_neutralised_after_non_ascii_text_and_under_only(proxy: RunningProxy):
    with proxy.connect() as conn:
        # oid = 'adult'::regclass: other tests create a shadow_schema.adult of the same name.
        labelled = conn.execute("SELECT 'Größe ✓' AS label, reltuples FROM pg_catalog.pg_class "
                                "WHERE oid = 'public.adult'::regclass").fetchall()
        only = conn.execute("SELECT c.reltuples FROM ONLY pg_class c WHERE c.oid = 'public.adult'::regclass").fetchall()
    assert labelled == [("Größe ✓", -1.0)] and only == [(-1.0,)]


def test_a_refused_function_is_named_with_the_reason(proxy: RunningProxy):
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT pg_stat_get_live_tuples('adult'::regclass)")
    diag = info.value.diag
    assert "function pg_stat_get_live_tuples() is not available through dpproxy: it reads statistics" in (
        diag.message_primary or "")
    assert "formatting functions" in (diag.message_hint or "") and "sizes answer NULL" in (diag.message_hint or "")


def test_median_is_refused_with_the_percentile_that_is_one(proxy: RunningProxy):
    with proxy.connect() as conn, pytest.raises(psycopg.Error) as info:
        conn.execute("SELECT median(age) FROM adult")
    assert "(rule: function-allowlist)" in (info.value.diag.message_primary or "")
    assert (info.value.diag.message_hint or "").startswith(
        "A median is PERCENTILE_CONT(0.5) WITHIN GROUP (ORDER BY col). Aggregates: COUNT")


@pytest.mark.parametrize("sql,start", [
    ("SELECT count(*) FROM adult WHERE sex = \"Male\"",
     "Double quotes name a column; a string is written in single quotes: 'Male'. Columns: age,"),
    ("SELECT count(*) FROM adult WHERE \"Sex\" = 'Male'", "Perhaps you meant sex. Columns: age,"),
    ("SELECT count(*) FROM adult WHERE sex = Male", "Columns: age,"),
])
def test_a_string_in_double_quotes_is_hinted_as_one(proxy: RunningProxy, sql: str, start: str):
    with proxy.connect() as conn, pytest.raises(psycopg.Error) as info:
        conn.execute(sql)
    assert info.value.diag.sqlstate == "42703"
    assert (info.value.diag.message_hint or "").startswith(start), info.value.diag.message_hint


@pytest.mark.parametrize("sql,symbol", [
    ("SELECT count(*) FROM adult WHERE sex == 'Male'", "=="),
    ("SELECT count(*) FILTER (WHERE age == 40) FROM adult", "=="),
    ("SELECT count(*) FROM adult WHERE sex <=> 'Male'", "<=>"),
    # PostgreSQL has no prefix ! or !! (since 14); sqlglot read both as NOT (the parse differential, h122).
    ("SELECT count(*) FROM adult WHERE ! (sex = 'Male')", "!"),
    ("SELECT count(*) FROM adult WHERE !! (sex = 'Male')", "!!"),
    ("SELECT count(*) FROM adult WHERE sex ! LIKE 'M%'", "!"),
])
def test_an_operator_postgresql_lacks_is_refused_as_postgresql_refuses_it_before_any_charge(
        proxy: RunningProxy, sql: str, symbol: str):
    # sqlglot read sex == 'Male' as sex = 'Male': it was answered and charged, where PostgreSQL
    # fails with 42883 whatever the rows.
    error = refused_uncharged(proxy, sql)
    assert error.diag.sqlstate == "42883"
    assert error.diag.message_primary == f"operator does not exist: {symbol} (rule: undefined-operator)"


@pytest.mark.parametrize("sql,number,decimal", [
    ("SELECT count(*) FROM adult WHERE age > 0x28", "0x28", "40"),
    ("SELECT count(*) FROM adult WHERE age > 0b101000", "0b101000", "40"),
    ("SELECT count(*) FILTER (WHERE age > 0o50) FROM adult", "0o50", "40"),
    ("SELECT count(*) FROM adult WHERE capital_gain > 1_000", "1_000", "1000"),
    ("SELECT sum(age) FROM adult WHERE capital_gain > 1_000.5", "1_000.5", "1000.5"),
])
def test_a_number_postgresql_15_and_the_dp_planner_read_apart_is_refused_before_any_charge(
        proxy: RunningProxy, sql: str, number: str, decimal: str):
    # sqlglot read 0x28 as the bit string x'28' (rendered CAST(x'28' AS numeric)) and 0b101000 as
    # b'101000'; PostgreSQL 16 reads 40, PostgreSQL 15 the number 0 and the name x28.
    error = refused_uncharged(proxy, sql)
    assert error.diag.sqlstate == "0A000"
    assert error.diag.message_primary.startswith(f"the number {number}, "), error.diag.message_primary
    assert error.diag.message_primary.endswith("(rule: number-form)")
    assert error.diag.message_hint == f"Write it in decimal: {decimal}."
    with proxy.connect(autocommit=True) as conn:  # the forms in a string or a comment are no number
        assert conn.execute("SELECT count(*) FROM adult WHERE sex = '0x28' -- 0x28").fetchone() is not None


@pytest.mark.parametrize("sql,sqlstate,message", [
    ("SELECT count(*) FROM adult WHERE age IS UNKNOWN", "42804",
     "argument of IS UNKNOWN must be type boolean, not the type of column age (rule: is-unknown)"),
    ("SELECT count(*) FILTER (WHERE sex IS NOT UNKNOWN) FROM adult", "42804",
     "argument of IS NOT UNKNOWN must be type boolean, not the type of column sex (rule: is-unknown)"),
    ("SELECT count(*) FROM adult WHERE (age > 40) IS UNKNOWN", "0A000",
     "IS UNKNOWN of anything but a boolean column is not supported on protected table adult (rule: is-unknown)"),
])
def test_is_unknown_of_anything_but_a_boolean_column_is_refused_before_any_charge(
        proxy: RunningProxy, sql: str, sqlstate: str, message: str):
    # sqlglot read age IS UNKNOWN as age IS NULL: answered and charged, where PostgreSQL fails with
    # 42804 whatever the rows (the parse differential, h122).
    error = refused_uncharged(proxy, sql)
    assert (error.diag.sqlstate, error.diag.message_primary) == (sqlstate, message)
    assert "write IS" in (error.diag.message_hint or "")



def test_copy_of_a_query_that_asks_for_no_row_is_refused_and_the_session_goes_on(proxy: RunningProxy):
    # The SELECT is answered with its columns and no row; its COPY ended the session with XX000
    # (found by the parse differential's harness, h122).
    with proxy.connect(autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as info:
            with conn.cursor().copy("COPY (SELECT age FROM adult LIMIT 0) TO STDOUT") as copy:
                list(copy)
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert info.value.diag.sqlstate == "0A000"
    assert info.value.diag.message_primary.endswith("(rule: copy-no-row)")
