"""A DP query's outcome must not depend on the rows, and everything it runs is pg_catalog's.

Issue 17, points 1 and 2: a LIKE pattern that PostgreSQL rejects only when a row reaches it,
a sum that overflows only for some rows, a conversion that fails only for some values are
each an exact oracle on the rows; and functions, operators and types resolved through the
analyst's ``search_path`` let a planted object run inside a DP query. Real PostgreSQL, real
dpproxy.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import psycopg
import pytest
from conftest import TEST_POLICY, make_policy, refused_at_load, spent_epsilon

from policies.errors import Refusal
from policies.model import ColumnPolicy, TablePolicy
from policies.tables import ColumnInfo, Relation
from rewriter.dp_query import plan_aggregate_query
from rewriter.like_patterns import (
    MAX_CASE_FOLDED_PATTERNS,
    MAX_PART_AFTER_PERCENT,
    costly_pattern_reason,
    invalid_pattern_reason,
)
from rewriter.rewrite import backend_sql
from rewriter.text_bounds import read_in_place


def _outcome(proxy, sql: str) -> str:  # type: ignore[no-untyped-def]
    """'answer' or the SQLSTATE the statement ended in; the session stays usable."""
    with proxy.connect(connect_timeout=10) as conn:
        try:
            conn.execute(sql).fetchall()
            return "answer"
        except psycopg.Error as exc:
            assert exc.sqlstate is not None
            return exc.sqlstate


@pytest.mark.parametrize(
    "predicate",
    [
        "sex LIKE '\\'",
        "sex LIKE 'Scot%\\'",
        "sex NOT LIKE '\\'",
        "sex ILIKE '\\'",
        "sex NOT ILIKE 'M\\'",
        "lower(sex) LIKE '\\'",
        "sex LIKE 'M' ESCAPE '!'",
        "sex LIKE sex",  # the pattern a row's own value, which may end in the escape character
        "sex ILIKE lower(sex)",
    ],
)
def test_an_invalid_like_pattern_is_refused_whatever_the_rows(proxy, predicate: str) -> None:
    # The binary search of the issue: "age <= N" decides whether any row reaches the pattern.
    outcomes = {_outcome(proxy, f"SELECT COUNT(*) FROM adult WHERE age <= {n} AND {predicate}") for n in (0, 200)}
    assert outcomes == {"DP001"}


def test_a_valid_like_pattern_with_escapes_is_answered(proxy) -> None:
    assert _outcome(proxy, "SELECT COUNT(*) FROM adult WHERE age <= 200 AND sex LIKE 'M\\a%\\\\' ") == "answer"


_LONG = "a" * (MAX_PART_AFTER_PERCENT + 1)


@pytest.mark.parametrize(
    "pattern, refused",
    [
        ("%" + "a" * MAX_PART_AFTER_PERCENT, False),
        ("%" + _LONG, True),
        ("%" + "a" * MAX_PART_AFTER_PERCENT + "%" + "a" * MAX_PART_AFTER_PERCENT + "%", False),
        ("%x%" + _LONG + "%", True),
        ("%%" + _LONG, True),
        ("%" + "_" * (MAX_PART_AFTER_PERCENT + 1), True),  # each _ is compared as a character is
        (_LONG * 10 + "%", False),  # before the first %: compared once, at the value's start
        (_LONG * 10, False),
        ("%" + "\\%" * MAX_PART_AFTER_PERCENT, False),  # an escaped character is one character
        ("%" + "\\%" * (MAX_PART_AFTER_PERCENT + 1), True),  # an escaped % is no wildcard
        ("%" + "\\\\%" * 40, False),  # an escaped backslash, then a wildcard
        ("%" + "\\\\\\%" * 40, True),  # an escaped backslash and an escaped %: 80 characters
        ("%" + "é" * (MAX_PART_AFTER_PERCENT + 1), True),  # characters, not bytes
    ],
)
def test_a_like_pattern_part_after_a_percent_is_limited(pattern: str, refused: bool) -> None:
    """The matcher compares the part after a % at every position of a value: its length, counted as
    PostgreSQL reads the pattern, is what one long value multiplies (benchmarks/row_cost.py)."""
    assert (costly_pattern_reason(pattern) is not None) == refused


@pytest.mark.parametrize(
    "predicate",
    [
        f"sex LIKE '%{_LONG}'",
        f"sex NOT LIKE '%{_LONG}%'",
        f"sex ILIKE '%M%{_LONG}'",
        f"lower(sex) LIKE '%{_LONG}'",
    ],
)
@pytest.mark.parametrize(
    "form",
    [
        "SELECT COUNT(*) FROM adult WHERE age <= {n} AND {p}",
        "SELECT COUNT(*) FILTER (WHERE age <= {n} AND {p}) FROM adult",
        "SELECT SUM(CASE WHEN age <= {n} AND {p} THEN 1 ELSE 0 END) FROM adult",
        "SELECT AVG(hours_per_week) FROM adult WHERE age <= {n} AND {p}",
    ],
)
def test_a_like_pattern_whose_matching_one_long_value_slows_is_refused_before_the_charge(
    proxy, form: str, predicate: str
) -> None:
    """'%' and 2,000 characters took PostgreSQL 10 s on one 3 MB value (ILIKE 17 s), a millisecond
    without that row: refused from the text, whatever the rows, with the rule and a hint, uncharged."""
    with proxy.connect(connect_timeout=10) as conn:
        before = spent_epsilon(conn)
        for n in (0, 200):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(form.format(n=n, p=predicate)).fetchall()
            assert refused.value.sqlstate == "DP001"
            assert "rule: safe-predicate" in str(refused.value)
            assert f"at most {MAX_PART_AFTER_PERCENT} characters" in (refused.value.diag.message_hint or "")
        assert spent_epsilon(conn) == before
        limit = "%" + "a" * MAX_PART_AFTER_PERCENT
        conn.execute(form.format(n=200, p=predicate.replace("%" + _LONG, limit))).fetchall()


@pytest.mark.parametrize(
    "where, refused",
    [
        ("sex ILIKE '" + "M" * MAX_CASE_FOLDED_PATTERNS + "'", False),
        ("sex ILIKE '" + "M" * MAX_CASE_FOLDED_PATTERNS + "%'", True),
        ("sex NOT ILIKE '" + "M" * (MAX_CASE_FOLDED_PATTERNS // 2) + "' AND lower(sex) ILIKE '"
         + "M" * (MAX_CASE_FOLDED_PATTERNS // 2 + 1) + "'", True),  # the statement's patterns together
        ("sex LIKE '" + "M" * (4 * MAX_CASE_FOLDED_PATTERNS) + "%'", False),  # LIKE lowers nothing
    ],
)
def test_ilike_patterns_are_limited_in_all_because_each_row_lowers_them(proxy, where: str, refused: bool) -> None:
    """PostgreSQL lowers an ILIKE pattern for every row it compares: with 500,000 characters one row
    reaching it (``id = 42 AND ...``) added 13.5 ms. Refused from the text, whatever the rows, uncharged."""
    for sql in (f"SELECT COUNT(*) FROM adult WHERE age <= 0 AND {where}",
                f"SELECT COUNT(*) FILTER (WHERE age <= 200 AND {where}) FROM adult"):
        with proxy.connect(connect_timeout=10) as conn:
            before = spent_epsilon(conn)
            try:
                conn.execute(sql).fetchall()
                outcome = "answer"
            except psycopg.Error as exc:
                outcome = exc.sqlstate
                assert "rule: safe-predicate" in str(exc) and "lowers an ILIKE pattern" in (exc.diag.message_hint or "")
                assert spent_epsilon(conn) == before
        assert outcome == ("DP001" if refused else "answer"), sql


def test_the_like_pattern_rule_matches_postgresql(admin) -> None:
    """Every pattern over {a, %, _, \\} of up to 5 characters: refused exactly when PostgreSQL can fail on it."""
    admin.execute(
        "CREATE FUNCTION pg_temp.like_fails(v text, p text, insensitive boolean) RETURNS boolean "
        "LANGUAGE plpgsql AS $$ BEGIN IF insensitive THEN PERFORM v ILIKE p; ELSE PERFORM v LIKE p; END IF; "
        "RETURN false; EXCEPTION WHEN invalid_escape_sequence THEN RETURN true; END $$"
    )
    patterns = ["".join(chars) for size in range(6) for chars in itertools.product("a%_\\", repeat=size)]
    values = ["", "a", "aa", "aaaaa", "\\", "a\\", "%"]
    rows = admin.execute(
        "SELECT p, bool_or(pg_temp.like_fails(v, p, false)), bool_or(pg_temp.like_fails(v, p, true)) "
        "FROM unnest(%s::text[]) AS p, unnest(%s::text[]) AS v GROUP BY p",
        (patterns, values),
    ).fetchall()
    assert len(rows) == len(patterns)
    for pattern, fails, fails_insensitive in rows:
        refused = invalid_pattern_reason(pattern) is not None
        assert fails == fails_insensitive
        if not refused:
            assert not fails, pattern  # an accepted pattern never fails, on any of the values
    # A value that walks the whole pattern and has a character left for a trailing escape (with
    # none left, PostgreSQL stops without error) fails exactly the refused patterns: an odd run of
    # three escapes at the end is refused as one is, an even run accepted.
    walking = [_walking_value(pattern[:-1]) + "a" for pattern in patterns]
    rows = admin.execute(
        "SELECT p, pg_temp.like_fails(v, p, false) FROM unnest(%s::text[], %s::text[]) AS u(p, v)",
        (patterns, walking),
    ).fetchall()
    assert len(rows) == len(patterns)
    for pattern, fails in rows:
        assert fails == (invalid_pattern_reason(pattern) is not None), pattern


def _walking_value(pattern: str) -> str:
    """A value the pattern matches to its end: escaped characters as they are, ``_`` as 'a', ``%`` as nothing."""
    value, escaped = [], False
    for char in pattern:
        if escaped:
            value.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char != "%":
            value.append("a" if char == "_" else char)
    return "".join(value)


@pytest.mark.parametrize(
    "predicate",
    [
        "a IN (1, 2)", "a NOT IN (1, NULL)", "a NOT IN (1, 2)", "NOT (a IN (3, '4'))", "a BETWEEN 1 AND 3",
        "a NOT BETWEEN 2 AND NULL", "a NOT BETWEEN 1 AND 2", "a IS NULL", "a IS NOT NULL", "NOT (a > 1 OR s = 'x')",
        "s LIKE 'x%' OR s NOT ILIKE 'X\\%'", "lower(s) = 'x' AND upper(s) <> 'Y'", "-2 < a AND a <= '3'::int4",
        "a = CAST('2' AS numeric(5, 2))", "s = 'it''s'", "s LIKE 'a\\\\b'", "NOT a >= 2 AND TRUE",
    ],
)
def test_the_rendered_predicate_means_what_the_analyst_wrote(admin, predicate: str) -> None:
    """Same rows, NULLs included, as PostgreSQL's own reading of the predicate."""
    admin.execute("CREATE TEMP TABLE IF NOT EXISTS meaning_probe (a integer, s text)")
    admin.execute("TRUNCATE meaning_probe")
    admin.execute(
        "INSERT INTO meaning_probe VALUES (1, 'x'), (2, 'X%'), (3, NULL), (NULL, 'y'), (NULL, NULL), (4, 'it''s'), "
        "(-1, 'a\\b'), (2, 'X\\%')"
    )
    columns = {"a": ColumnInfo("a", 23, -1, 1, None), "s": ColumnInfo("s", 25, -1, 2, None)}
    table = Relation(1, "pg_temp", "meaning_probe", TablePolicy(epsilon=1.0), columns)
    rendered = read_in_place(plan_aggregate_query(f"SELECT COUNT(*) FROM meaning_probe WHERE {predicate}", table).where_sql or "", table)
    expected = admin.execute(f"SELECT array_agg(ctid ORDER BY ctid) FROM meaning_probe WHERE {predicate}").fetchone()
    actual = admin.execute(f"SELECT array_agg(ctid ORDER BY ctid) FROM meaning_probe WHERE {rendered}").fetchone()
    assert actual == expected, rendered


def test_a_sum_of_floats_cannot_overflow_on_the_rows(admin, proxy) -> None:
    """float8 near 1e308 overflows in sum() for two rows, not for one: bounds that allow it are refused."""
    admin.execute("DROP TABLE IF EXISTS overflow_probe")
    admin.execute("CREATE TABLE overflow_probe (k integer, v double precision, r real)")
    admin.execute("INSERT INTO overflow_probe VALUES (1, 1e308, 3e38), (2, 1e308, 3e38)")
    try:
        columns = {
            "k": ColumnInfo("k", 23, -1, 1, None),
            "v": ColumnInfo("v", 701, -1, 2, ColumnPolicy(bounds=(0, 1e308))),
            "r": ColumnInfo("r", 700, -1, 3, ColumnPolicy(bounds=(0, 1e20))),
        }
        oid = admin.execute("SELECT 'overflow_probe'::regclass::oid").fetchone()[0]
        table = Relation(int(oid), "public", "overflow_probe", TablePolicy(epsilon=1.0), columns)
        with pytest.raises(Refusal) as refused:
            plan_aggregate_query("SELECT SUM(v) FROM overflow_probe WHERE k <= 2", table)
        assert refused.value.rule == "bounds-too-large"
        # A real column within its limit is summed exactly on its fixed-point grid (bigint terms
        # below 2^52, a numeric total): no overflow on any rows.
        step = columns["r"].policy.sum_grid.step
        for k in (1, 2):
            sql = backend_sql(plan_aggregate_query(f"SELECT SUM(r) FROM overflow_probe WHERE k <= {k}", table), 0)
            (total,) = admin.execute(sql).fetchone()
            assert float(total) * step == pytest.approx(k * 1e20, rel=1e-6)
    finally:
        admin.execute("DROP TABLE overflow_probe")


def test_a_numeric_column_is_never_converted_to_float_per_row(admin) -> None:
    """numeric → double precision fails for values beyond 1.8e308: only some rows would raise."""
    columns = {"n": ColumnInfo("n", 1700, -1, 1, None), "f": ColumnInfo("f", 701, -1, 2, None)}
    table = Relation(1, "public", "t", TablePolicy(epsilon=1.0), columns)
    for predicate in ("n = CAST(1.5 AS double precision)", "n < 1::float4", "n = f", "n BETWEEN 1 AND 2::float8"):
        with pytest.raises(Refusal):
            plan_aggregate_query(f"SELECT COUNT(*) FROM t WHERE {predicate}", table)
    # Shown on the real server: the same comparison fails only when such a row is reached.
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        admin.execute("SELECT count(*) FROM (VALUES (1e400::numeric)) AS t(n) WHERE n = 1.5::float8")


def test_a_float_parameter_compared_with_a_numeric_column_is_converted_once(admin) -> None:
    """Sent as double precision, ``n = $1`` would convert each reached row's n to float8 (1e400 fails)."""
    admin.execute("CREATE TEMP TABLE numeric_probe (k integer, n numeric)")
    admin.execute("INSERT INTO numeric_probe VALUES (1, 1.5), (2, 1e400)")
    columns = {"k": ColumnInfo("k", 23, -1, 1, None), "n": ColumnInfo("n", 1700, -1, 2, None)}
    table = Relation(1, "pg_temp", "numeric_probe", TablePolicy(epsilon=1.0), columns)
    outcomes = []
    for k in (1, 2):
        sql = backend_sql(plan_aggregate_query(f"SELECT COUNT(*) FROM numeric_probe WHERE k <= {k} AND n = $1", table), 0)
        with psycopg.RawCursor(admin) as cursor:
            outcomes.append(cursor.execute(sql, [1.5]).fetchone())  # a Python float is sent as float8
    assert outcomes == [(1,), (1,)]


@pytest.mark.parametrize(
    "predicate",
    [
        "d = CAST(CAST('2020-01-01' AS text) AS date)",  # a STABLE conversion, per row if left in place
        "d = CAST($1 AS timestamptz)",  # a typed parameter, converted per row if left in place
    ],
)
def test_a_per_row_conversion_is_folded_before_the_query_runs(predicate: str) -> None:
    """Evaluated once by dpproxy's fold query and compared as a date: no conversion left for the rows."""
    table = Relation(1, "public", "t", TablePolicy(epsilon=1.0), {"d": ColumnInfo("d", 1082, -1, 1, None)})
    plan = plan_aggregate_query(f"SELECT COUNT(*) FROM t WHERE {predicate}", table)
    assert plan.folding is not None and [fold.type_name for fold in plan.folding.folds] == ["date"]


@pytest.mark.parametrize(
    "predicate",
    [
        "d = CAST('1' AS public.mydomain)",  # a domain's CHECK, per row
        "sex LIKE 'M%'",  # nondeterministic collation: PostgreSQL ≤ 17 fails per row
        "lower(sex) LIKE 'm%'",
        "b LIKE '\\\\'",  # bytea decodes the valid text pattern \\ to a lone escape
    ],
)
def test_a_per_row_conversion_or_collation_error_is_refused(predicate: str) -> None:
    columns = {
        "d": ColumnInfo("d", 1082, -1, 1, None),
        "sex": ColumnInfo("sex", 25, -1, 2, None, deterministic_collation=False),
        "b": ColumnInfo("b", 17, -1, 3, None),
    }
    table = Relation(1, "public", "t", TablePolicy(epsilon=1.0), columns)
    with pytest.raises(Refusal) as refused:
        plan_aggregate_query(f"SELECT COUNT(*) FROM t WHERE {predicate}", table)
    assert refused.value.rule == "safe-predicate"


# Objects a database owner (or, on PostgreSQL ≤ 14, anyone) can plant in public: each would
# run instead of pg_catalog's under "SET search_path TO public, pg_catalog" if a DP query's
# SQL named it unqualified; each raises, so a DP query that used one would fail.
_PLANTED = """
CREATE SCHEMA IF NOT EXISTS public;
CREATE FUNCTION public.planted_int(a integer, b integer) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'planted operator ran'; END $$;
CREATE FUNCTION public.planted_text(a text, b text) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'planted operator ran'; END $$;
CREATE FUNCTION public.planted_float(a double precision, b bigint) RETURNS double precision LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'planted operator ran'; END $$;
CREATE FUNCTION public.planted_mul(a double precision, b integer) RETURNS double precision LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'planted operator ran'; END $$;
CREATE FUNCTION public.planted_check(v integer) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'planted domain check ran'; END $$;
CREATE FUNCTION public.lower(v text) RETURNS text LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'planted lower ran'; END $$;
CREATE FUNCTION public.lower(v varchar) RETURNS text LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'planted lower ran'; END $$;
CREATE OPERATOR public.= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = public.planted_int);
CREATE OPERATOR public.= (LEFTARG = text, RIGHTARG = text, FUNCTION = public.planted_text);
CREATE OPERATOR public.<= (LEFTARG = integer, RIGHTARG = integer, FUNCTION = public.planted_int);
CREATE OPERATOR public.~~ (LEFTARG = text, RIGHTARG = text, FUNCTION = public.planted_text);
CREATE OPERATOR public./ (LEFTARG = double precision, RIGHTARG = bigint, FUNCTION = public.planted_float);
CREATE OPERATOR public.* (LEFTARG = double precision, RIGHTARG = integer, FUNCTION = public.planted_mul);
CREATE FUNCTION public.planted_oid(a oid, b oid) RETURNS boolean LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'planted operator ran'; END $$;
CREATE FUNCTION public.unnest(v text[]) RETURNS SETOF text LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'planted unnest ran'; END $$;
CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = oid, FUNCTION = public.planted_oid);
CREATE DOMAIN public.int4 AS integer CHECK (public.planted_check(VALUE));
CREATE DOMAIN public.bytea AS text;
"""
_UNPLANT = """
DROP DOMAIN IF EXISTS public.int4, public.bytea;
DROP OPERATOR IF EXISTS public.= (oid, oid), public.= (integer, integer), public.= (text, text), public.<= (integer, integer),
    public.~~ (text, text), public./ (double precision, bigint), public.* (double precision, integer);
DROP FUNCTION IF EXISTS public.planted_int(integer, integer), public.planted_text(text, text), public.planted_float(double precision, bigint),
    public.planted_mul(double precision, integer), public.planted_check(integer), public.lower(text),
    public.lower(varchar), public.planted_oid(oid, oid), public.unnest(text[]);
"""


@pytest.fixture
def planted(admin) -> Iterator[None]:
    admin.execute(_UNPLANT)
    admin.execute(_PLANTED)
    try:
        yield
    finally:
        admin.execute(_UNPLANT)


def test_planted_objects_are_what_an_unqualified_query_would_run(planted, admin) -> None:
    """The fixture is live: bare SQL under the attacker's search_path runs the planted objects."""
    admin.execute("SET search_path TO public, pg_catalog")
    try:
        for sql in ("SELECT 1 WHERE 40 = 40", "SELECT lower('A'::text)", "SELECT CAST('1' AS int4)"):
            with pytest.raises(psycopg.errors.RaiseException):
                admin.execute(sql)
    finally:
        admin.execute("RESET search_path")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM adult WHERE age = 40 AND lower(sex) = 'male'",
        "SELECT COUNT(*) FROM adult WHERE age BETWEEN 20 AND 40 AND sex LIKE 'M%' AND age IN (30, 31)",
        "SELECT COUNT(*) FROM adult WHERE age = '40'::int4 OR age NOT IN (1, 2)",
        "SELECT AVG(age), MAX(hours_per_week) FROM adult WHERE age <= 50",
        "SELECT MODE() WITHIN GROUP (ORDER BY sex) FROM adult",
        "SELECT SUM(capital_gain) FROM adult WHERE sex = 'Female'",
    ],
)
def test_a_dp_query_runs_only_pg_catalog_objects_whatever_the_search_path(planted, proxy, sql: str) -> None:
    with proxy.connect(connect_timeout=10) as conn:
        conn.execute("SET search_path TO public, pg_catalog")
        rows = conn.execute(sql).fetchall()
    assert len(rows) == 1


def test_a_policy_whose_float_bounds_could_overflow_a_sum_is_refused_at_load(test_db, tmp_path) -> None:
    policy = make_policy(test_db, tmp_path / "ledger.sqlite3", TEST_POLICY.replace("[-2.5, 2.5]", "[-1e300, 1e300]"))
    assert "tables.public.clamp_test.columns.ratio: bounds of this column type may be at most 1e+280" in "\n".join(
        refused_at_load(policy))


@pytest.mark.parametrize("predicate", ["lower(nr) < CAST(1.5 AS double precision)", "upper(nr) = 2",
                                       "lower(n) = 'x'", "upper(d) LIKE '2%'"])
def test_lower_and_upper_of_a_column_that_is_not_text_are_refused(admin, predicate: str) -> None:
    """On a range column lower()/upper() are its bounds: a numrange bound of 1e400 compared with a
    double precision is converted per row, and fails only on a table that holds such a row."""
    columns = {"nr": ColumnInfo("nr", 3906, -1, 1, None), "n": ColumnInfo("n", 1700, -1, 2, None),
               "d": ColumnInfo("d", 1082, -1, 3, None)}
    table = Relation(1, "public", "t", TablePolicy(epsilon=1.0), columns)
    with pytest.raises(Refusal) as refused:
        plan_aggregate_query(f"SELECT COUNT(*) FROM t WHERE {predicate}", table)
    assert refused.value.rule == "safe-predicate" and "not of a text type" in refused.value.message
    # Shown on the real server: the comparison fails only when such a row is reached.
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        admin.execute("SELECT count(*) FROM (VALUES ('[1e400,1e401)'::numrange)) AS t(nr) "
                      "WHERE lower(nr) < CAST(1.5 AS double precision)")
