"""Stop 44: what the last stop newly accepted (a bound ``= $k`` on a declared-size column's raw
column, the view reads bounded whatever the row holds, the single reads weighed in the work limit,
the misreading rules ``interval-form``, ``interval-sum``, ``undefined-operator``,
``constant-position`` and ``typed-literal-cast``), attacked by someone other than their author, as an
analyst who can send any SQL.

Found and fixed, pinned here (each refused before any charge now, rewriter/misreadings.py):

* A comment before a typed literal's ``::`` hid it from ``typed-literal-cast``: PostgreSQL reads a
  comment as a space, so ``numeric '40.5' /* c */ ::int`` is ``(numeric '40.5')::int``, 41, but the
  rule looked for ``::`` as the very next token, and sqlglot's ``CAST(CAST('40.5' AS int) AS
  numeric)`` reached the backend; ``timestamptz '...' -- c`` + newline + ``::text``, which PostgreSQL
  fails (42883, whatever the rows), was answered and charged as a timestamptz.
* ``interval 'N quarters'`` (``quarter``, ``q``, any unit sqlglot reads as a quarter): PostgreSQL has
  no such unit and fails the statement (22007, whatever the rows); sqlglot writes it as ``'3N
  MONTH'``, and dpproxy answered and charged it for N quarters' months.
* ``interval U&'1 d\\0061y'``, one day to PostgreSQL: sqlglot keeps a Unicode string's escapes as
  written (last stop refused only the ``UESCAPE`` form), and PostgreSQL reads ``'1 d\\0061y'`` as
  ``61 years 1 day``: answered and charged for that interval.

* A unary ``+`` (found by the parse differential over hand-written spellings): sqlglot drops it
  wherever it stands, and PostgreSQL reads it. It has ``+`` for numbers only, so ``+sex = 'Male'``,
  ``signed_up > now() - +interval '1 day'``, ``sex = +$1`` and ``signed_up > +$1`` fail (42883,
  whatever the rows) and were answered and charged; and it reads ``+'39.5'`` and ``+$1`` as double
  precision, so ``age > +'39.5'`` counts the ages above 39.5 where dpproxy failed with 22P02.
  Refused now (0A000, rule ``unary-plus``) but before a number literal.

Tried, and held (examined on PostgreSQL 16 by running dpproxy's backend SQL against plain SQL on
a table whose row holds values stored apart and on its neighbour holding NULL there, or by the
parse differential's reading of the statement against the backend SQL; not pinned again here):

* The bound parameter's raw conjunct (``x = $1`` on ``varchar(64)``, ``char(64)``, ``numeric(60,
  0)``, ``int8range``): ``$1`` declared unknown, text, name, bpchar, varchar, ``"char"``, bytea,
  int8, int4, numeric, float8, date, uuid, bool and int8range in a prepared statement, bound to a
  short value, one of the stored-apart value's length, one with trailing blanks, an empty one,
  ``NaN``, ``Infinity``, ``-0``, ``1e200`` and a 60-digit number: the same count (or the same
  error) on the table holding the value apart and on the one holding NULL, and where plain SQL
  answers, its count (a numeric column's parameter declared text is cast to numeric by dpproxy,
  where plain SQL fails 42883: as before the raw conjunct). No type makes ``=`` resolve
  differently on the raw column and on its bounded value (both have the column's type), and no
  equality it resolves to can fail. The same under ``plan_cache_mode = force_generic_plan``; and
  through dpproxy, with the service role's default set so, ``id = 7 AND n = $1`` with ``$1`` bound
  as text ``'abc'`` (a conversion a generic plan makes per row) failed with 22P02, uncharged, on the
  table holding row 7 and on the one without it alike. The raw conjunct is added under AND and
  parentheses only (not under ``NOT NOT``, ``IS [NOT] TRUE/FALSE``, OR, ``BETWEEN``, a list of two
  parameters; CASE, COALESCE and ``(v = $1) = true`` are refused).
* The view reads accepted last stop, measured in buffers on 1,000 rows with and without a row of
  3.2 MB values stored apart (uncompressed and compressed): ``COALESCE(note, other, 'zz') =
  'x'``, ``COALESCE(note, other, b::text) = 'x'``, ``COALESCE(NULLIF(note, 'q'), other) = 'x'``,
  ``NULLIF(COALESCE(note, other), 'x') IS NULL``, a CASE's result ``= 'x'``, ``(note, id) = ('x',
  1)``, ``ROW(note) = ROW('x')``, ``note IN ('x')``, ``NOT (note IS DISTINCT FROM 'x')``,
  ``NULLIF(note COLLATE "C", 'x') IS NULL``, ``octet_length(COALESCE(note, other))``: +0 buffers,
  each accepted at load; ``NULLIF(note, other) IS NULL`` (+814) and ``COALESCE(note, other) =
  other`` (+1,628) read the value whole and are refused at load, as are ``NULLIF`` of a cast,
  ``|| ''`` or ``lower()``, a nested NULLIF, ``note IN ('x', 'y')`` and ``= ANY``.
* Single reads: ``COUNT(DISTINCT)`` and MODE of an expression (``lower(t)``, ``t || 'x'``, a cast)
  and GROUP BY ``lower(t)``, ROLLUP, CUBE and GROUPING SETS are refused; GROUP BY ``t::text`` and
  ``DISTINCT t`` are weighed as ``GROUP BY t``, two text keys and a key beside ``COUNT(DISTINCT)``
  of the same column each once, a Superset-style outer query over a grouped release as its inner
  key.
* A unary ``-`` is kept by sqlglot: ``-sex``, ``-signed_up`` and ``-age`` are refused (a computed
  column), ``-'39.5'`` and ``-$1`` fail as PostgreSQL fails them (42725, uncharged), ``- -40``,
  ``-CAST(...)`` and ``- $1::numeric`` are answered for PostgreSQL's values. String literals with
  backslashes (``'a\\%'`` in LIKE, ``'a\\'`` beside a ``varchar``'s hashed conjunct, ``'it''s'``)
  reach the backend as PostgreSQL reads them (``E'a\\\\%'``).
* ORDER BY and GROUP BY constants: ``ORDER BY -2``, ``'2'``, ``2.0``, ``1e0``, ``NULL``, ``true``,
  ``0``, ``3`` and ``9999999999`` fail as PostgreSQL fails them (42P10 or 42601, uncharged);
  ``ORDER BY - - 2`` and ``(2)`` are position 2 to both; ``GROUP BY -1``, ``'1'``, ``(1)`` and
  ``NULL`` are refused.
* Interval spellings sqlglot keeps alike: ``'1 mon'``, ``'1 millennium'``, ``'1 week 2 days'``,
  ``'1 day -2 hours'``, every unit abbreviation PostgreSQL or sqlglot knows (``mins``, ``yrs``,
  ``msec``, ``c``, ``dec``, ``mil``, ``w``…) with ``3``, ``-2`` and ``1.5``, ``E''`` escapes
  (``\\x61``, ``\\141``, ``\\u0061``), dollar quotes, ``day to second`` forms, ``second(0)``,
  ``interval '1 day' - '...'``; typed literals ``date 'epoch'``, ``timestamp 'allballs'``,
  ``'infinity'``, ``'today'``, ``timestamp(0) '...'``, ``AT TIME ZONE`` of a constant; operators
  ``>=-5``, ``<>-5``, ``=+5``, ``>=/* c */-5`` and ``>=-- c`` + newline + ``-5`` read alike, ``>/**/=``
  and ``< >`` are syntax errors to both.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.bi_data import PEOPLE_POLICY, create_people
from tests.conftest import RunningProxy, TestDatabase, refused_uncharged, running_proxy, spent_epsilon


@pytest.fixture(scope="module")
def people_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over ``people`` (``signed_up`` a timestamp, tests/bi_data.py) and ``adult``."""
    create_people(test_db)
    with running_proxy(test_db, tmp_path_factory, PEOPLE_POLICY) as running:
        yield running


def _read_by_postgresql(test_db: TestDatabase, expression: str) -> str:
    """``expression`` as PostgreSQL reads it, as text."""
    with psycopg.connect(test_db.admin_dsn) as admin:
        return str(admin.execute(f"SELECT ({expression})::text").fetchone()[0])


@pytest.mark.parametrize(("sql", "table"), [
    ("SELECT count(*) FROM adult WHERE age > numeric '40.5' /* c */ ::int", "adult"),
    ("SELECT count(*) FILTER (WHERE age > numeric '40.5'/**/::int) FROM adult", "adult"),
    ("SELECT count(*) FROM people WHERE signed_up > timestamptz '2024-06-01 00:00:00+05:30' -- c\n::text", "people"),
])
def test_a_typed_literal_cast_again_after_a_comment_is_refused_before_any_charge(
        people_proxy: RunningProxy, test_db: TestDatabase, sql: str, table: str) -> None:
    # PostgreSQL reads a comment as a space: numeric '40.5' /* c */ ::int is (numeric '40.5')::int,
    # 41. The rule looked for :: as the very next token, so sqlglot's CAST(CAST('40.5' AS int) AS
    # numeric) reached the backend, and timestamptz '...' -- c ::text (42883 to PostgreSQL) was
    # answered as a timestamptz.
    assert _read_by_postgresql(test_db, "numeric '40.5' /* c */ ::int") == "41"
    error = refused_uncharged(people_proxy, sql)
    assert (error.diag.sqlstate, error.diag.message_primary.split(" is not supported")[1]) == (
        "0A000", f" on protected table {table} (rule: typed-literal-cast)"), error.diag.message_primary


@pytest.mark.parametrize("interval", [
    "interval '3 quarters'", "interval '1 quarter'", "INTERVAL '2 Q'", "(interval '1 day' + '3 quarter')",
])
def test_an_interval_of_quarters_is_refused_before_any_charge(people_proxy: RunningProxy, test_db: TestDatabase,
                                                                interval: str) -> None:
    # PostgreSQL has no quarter unit (22007 whatever the rows); sqlglot writes interval '3 quarters'
    # as interval '9 MONTH', which was answered and charged.
    with psycopg.connect(test_db.admin_dsn) as admin, pytest.raises(psycopg.errors.InvalidDatetimeFormat):
        admin.execute(f"SELECT {interval}")
    error = refused_uncharged(people_proxy, f"SELECT count(*) FROM people WHERE signed_up > now() - {interval}")
    assert (error.diag.sqlstate, error.diag.message_primary.split(", which")[0]) == (
        "0A000", f"the interval literal {interval.strip('()')}")
    assert "(rule: interval-form)" in error.diag.message_primary
    assert "no quarter" in (error.diag.message_hint or ""), error.diag.message_hint


@pytest.mark.parametrize("interval", ["interval U&'1 d\\0061y'", "interval U&'1 d\\+000061y'",
                                      "(interval '1 hour' + U&'1 d\\0061y')"])
def test_an_interval_literal_with_a_unicode_escape_is_refused_before_any_charge(
        people_proxy: RunningProxy, test_db: TestDatabase, interval: str) -> None:
    # sqlglot keeps a U&'...' string's escapes as written, and PostgreSQL reads '1 d\0061y' as
    # 61 years and a day: one day back was answered, and charged, as 61 years back.
    assert _read_by_postgresql(test_db, "interval U&'1 d\\0061y'") == "1 day"
    assert _read_by_postgresql(test_db, "interval '1 d\\0061y'") == "61 years 1 day"
    error = refused_uncharged(people_proxy, f"SELECT count(*) FROM people WHERE signed_up > now() - {interval}")
    assert error.diag.sqlstate == "0A000", error.diag.message_primary
    assert error.diag.message_primary.endswith("(rule: interval-form)"), error.diag.message_primary


_UNARY_PLUS = [
    ("SELECT count(*) FROM people WHERE +sex = 'Male'", None, "42883"),
    ("SELECT count(*) FROM people WHERE signed_up > now() - +interval '1 day'", None, "42883"),
    ("SELECT count(*) FROM people WHERE sex = +%s", ["Male"], "42883"),
    ("SELECT count(*) FROM people WHERE signed_up > +%s", ["2023-06-01"], "42883"),
    ("SELECT count(*) FILTER (WHERE age > +'39.5') FROM adult", None, None),
    ("SELECT count(*) FROM adult WHERE age > +%s", ["39.5"], None),
]


@pytest.mark.parametrize(("sql", "params", "postgresql"), _UNARY_PLUS)
def test_a_unary_plus_before_anything_but_a_number_is_refused_before_any_charge(
        people_proxy: RunningProxy, test_db: TestDatabase, sql: str, params: list[object] | None,
        postgresql: str | None) -> None:
    # sqlglot dropped the +: +sex = 'Male', which PostgreSQL fails (42883: no + for text), was
    # answered and charged as sex = 'Male'; age > +'39.5', ages above 39.5 to PostgreSQL (+ reads
    # the string as double precision), failed as age > '39.5' (22P02).
    with psycopg.connect(test_db.admin_dsn) as admin:
        if postgresql is None:
            assert admin.execute(sql, params).fetchone() is not None
        else:
            with pytest.raises(psycopg.Error) as failed:
                admin.execute(sql, params)
            assert failed.value.sqlstate == postgresql
    with people_proxy.connect(autocommit=True) as conn:
        spent = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql, params)
        assert spent_epsilon(conn) == spent
    assert (refused.value.sqlstate, refused.value.diag.message_primary.split(" on protected table ")[0]) == (
        "0A000", "a unary + before anything but a number is not supported"), refused.value.diag.message_primary
    assert refused.value.diag.message_primary.endswith("(rule: unary-plus)")


@pytest.mark.parametrize("condition", ["age > +40", "age > +40.5", "age > + -5", "age > +(41)", "age > - +40"])
def test_a_unary_plus_before_a_number_is_answered(people_proxy: RunningProxy, test_db: TestDatabase,
                                                  condition: str) -> None:
    # Before a number literal the + changes neither its value nor its type.
    with people_proxy.connect(autocommit=True) as conn:
        assert conn.execute(f"SELECT count(*) FROM adult WHERE {condition}").fetchone() is not None
