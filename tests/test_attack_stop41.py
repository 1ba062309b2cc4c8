"""Stop 41: the lock step's SQL against what the run plans, and the planner's statistics.

The DP statements run on a base table and on neighbours that each add one adversarial row (a
numeric of 1e400 and of 1e-400, NaN, ±Infinity, dates and timestamps at infinity and at their
types' limits, integers at their limits, a text of 300 bytes and one of multibyte characters,
NULLs); what the analyst sees but the noised values must be the same on all, and a refusal
costs nothing. Real dpproxy, real PostgreSQL. The tables are analysed, so the planner's
statistics (the histogram's bounds, the most common values) hold the adversarial row.

Found and fixed, pinned here:

* A constant PostgreSQL's planner folds and fails on (``CAST(5000000000 AS int)``, ``CAST(1e400
  AS float8)``, ``CAST(40000 AS int2)``) inside an IN list, an OR or a BETWEEN of a FILTER
  (``count(*) FILTER (WHERE i IN (1, CAST(5000000000 AS int)))``) passed the lock step and failed
  the run after the charge, with DP004, on every table: charged for a statement that fails
  whatever the rows. dpproxy's own folding takes a FILTER's computed values, not such a literal
  cast beside others; in WHERE the lock step's planning raised it (uncharged: before the charge,
  and since the step goes in one pipeline with the run, refunded), but the step
  (``SELECT 1 FROM (<backend SQL>) AS locked LIMIT 0``) left the backend SQL's output columns,
  where a FILTER stands, unreferenced, and PostgreSQL replaces an unreferenced output of a
  subquery with a NULL before planning it, so the FILTER was never folded. The step selected the
  whole row then (``SELECT locked FROM …``), which plans every output column; it is the backend SQL
  itself under ``LIMIT 0`` now, which plans them as the run does. The same for a
  series limit's ranking (its FILTER, or the plan's, failed after the charge alike). The neighbour fuzzer
  now counts a DP004 on its empty table as a failure (no row decided it) and draws such casts
  among its literals: without the fix it finds this with DPPROXY_FUZZ_SEED=4105 (``NOT (i2 > CAST(40000 AS
  smallint))`` in a FILTER) and 4106 (``CAST(1e400 AS double precision)`` in a CASE of MODE's
  ORDER BY).
* The stored-form check (rewriter/text_bounds.py) in an index-only scan: an index holds a value
  the table stores apart (a wide row, ``STORAGE EXTERNAL``) in line in its own tuple, so where a
  statement needed only an indexed text or numeric column of a vacuumed table (``COUNT(t) WHERE
  t > 'a'``, ``COUNT(DISTINCT t)``, ``n BETWEEN …``) PostgreSQL served it from the index and the
  check read such a value as one in the row: 600 counted where ``COUNT(t)`` alone counted 300 on
  the same table. The plan, chosen by the table's statistics and visibility map, decided whether a
  row was read. dpproxy's backend connections now never scan index-only (``enable_indexonlyscan``
  pinned off, proxy/backend/pool.py), on tables and views alike.

Tried, and held:

* The planner's statistics, read by the lock step, whose failure is uncharged (``eqsel`` and
  ``scalarineqsel`` on the histogram and most common values, an IN list's estimate against
  them, ``patternsel`` for LIKE and ILIKE): on analysed neighbours whose row is 1e400, 1e-400,
  NaN, ±Infinity, integers and dates at their types' limits and at infinity, a 300-byte text
  and one of 200 two-byte characters, ``''`` and NULL, 32 conditions on every column kind in
  WHERE and in a FILTER (cross-type date/timestamptz and column-to-column comparisons too),
  with and without an answer quantum (under which text equality and a numeric's comparisons
  read the raw column, whose statistics the planner reads): the same outcome and charge. A
  text or numeric without a quantum is read through its bound, a ``CASE`` the planner has no
  statistics for; PostgreSQL 13 and later compare a date or timestamp beyond the other type's
  range without failing.
* A series limit (Superset's ranked subquery) over neighbours adding an infinite, a NULL and a
  DST-edge row, under UTC, America/Sao_Paulo and Asia/Kathmandu: the same months, series and
  charge; parameters in one are refused before the charge.
* Constants the planner would fold in WHERE (``CAST(5000000000 AS int)`` in an IN list or OR) and
  stable ones in a FILTER (``now() + interval '300000 years'``, ``CAST(DATE '5874897-12-31' AS
  timestamptz)``, ``make_timestamptz(2020, 13, …)``): dpproxy's folding or the lock step raise
  them uncharged. Casts of a column, arithmetic on one, ``date_part``/``date_trunc``/
  ``timezone`` of one, ``AT TIME ZONE`` and ``= ANY(array)`` in WHERE are refused; column-to-column
  comparisons are answered only within one type family (``d > ts`` answered alike above).
* Metabase's numeric binning (rewriter/floor_bins.py) over these rows, on both sets: integer,
  numeric and double precision arithmetic, exponent literals (``1.0E+1``, ``1e300``, ``1e-100``),
  negative zero, 38-digit widths, A far from the bounds, W from 1e-200 (refused, indices past
  2^53) to 1e300, a source wrapper, HAVING on the key, ORDER BY and LIMIT, beside a category,
  a percentile, MODE and ``COUNT(DISTINCT)``: the same bins, printed alike, and charge; on a
  second table also ``real``, ``smallint``, ``bigint`` and ``numeric(12,3)`` columns and rows
  of -0, the smallest subnormal, 99.99999999999999 and a quotient rounded up to an integer by
  numeric division's scale. A parameter as A or W, ``floor()`` in WHERE or a FILTER, ROLLUP are
  refused before the charge; a domain over a number takes no bounds, so it is never binned.
* The lock step in every form that carries a DP statement: a cursor (with and without HOLD),
  COPY (…) TO STDOUT, a transaction block, a prepared statement, binary results: a constant
  the planner fails to fold fails before the charge in each. Parameters at Bind: unspecified
  and declared text, a value their type cannot read (``'abc'`` for an integer, ``1e400`` for a
  double, 40000 for a smallint), a text parameter cast in the statement to a date, timestamp,
  timestamptz or numeric (a stable input function the planner does not fold, which would fail
  only on a row that reaches it): dpproxy folds it before the charge, on every table alike.
  ``percentile_cont($1)`` out of [0, 1] or NaN is refused before the charge.
* Domains over ``numeric(6,2)``, ``numeric`` and text on a table with an answer quantum, with
  rows of 9999.99, NaN, 200 digits, 1e-200 and NULL: counted and compared alike (bounds,
  binning and sums are refused for a domain over a number).
* OpenDP's calls (mechanisms/opendp_calls.py) on the values the mechanisms can pass: the
  exponential draw with scores of 0, 1e6 and 2^60 at scales from 5e-324 to 1e308, padded or not,
  returns an index; Laplace on a float takes NaN and ±inf without failing (smooth median clamps
  its result, and its input is a clamped median, never NaN).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg.types.string import StrDumper

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import create_neighbours, same_on_neighbours

_DDL = "(id int, i int, b bigint, f float8, n numeric, d date, ts timestamptz, t text)"
_BASE_ROWS = ("SELECT g, g % 10, g, g, g % 100, '2020-01-01'::date + g, '2020-01-01'::timestamptz + g * interval '1 hour', "
              "'v' || (g % 7) FROM generate_series(1, 500) g")
# One adversarial row each (columns as _DDL).
_ROWS = {
    "1": "(1001, 2147483647, 9223372036854775807, 1e308, CAST('1e400' AS numeric), '5874897-12-31', "
         "'294276-12-31 23:59:59+00', repeat('x', 300))",
    "2": "(1002, -2147483648, -9223372036854775808, 'NaN', CAST('1e-400' AS numeric), '4713-01-01 BC', "
         "'4713-01-01 00:00+00 BC', repeat('é', 200))",
    "3": "(1003, 0, 0, 'Infinity', 'NaN', 'infinity', '-infinity', '')",
    "4": "(1004, 0, 0, '-Infinity', '-Infinity', '-infinity', 'infinity', 'v1' || repeat(' ', 250))",
    "5": "(1005, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
}
_TABLE = """
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      i: {{bounds: [0, 100], group_by: true}}
      n: {{bounds: [0, 100], group_by: true}}
      f: {{bounds: [0, 100], group_by: true}}
"""
# Each set: a base table and its neighbours; "q" has an answer quantum, under which text equality
# and a numeric's comparisons read the raw column (rewriter/raw_equality.py), whose statistics the
# planner reads.
_SETS = {"s41": "", "s41q": "    answer_quantum_ms: 20\n"}
_NAMES = {prefix: (f"{prefix}_0", *(f"{prefix}_{k}" for k in _ROWS)) for prefix in _SETS}
# For a series limit: a category key and a time key.
_SERIES_DDL = "(c text, ts timestamptz, i int)"
_SERIES_ROWS = ("SELECT CASE WHEN g % 3 = 0 THEN 'a' ELSE 'b' END, '2020-01-01'::timestamptz + g * interval '13 hours', "
                "g % 10 FROM generate_series(1, 500) g")
_SERIES_NEIGHBOURS = {"s41s_1": "('a', 'infinity', 2147483647)", "s41s_2": "(NULL, NULL, NULL)",
                      "s41s_3": "('a', '2020-03-29 01:30+00', -2147483648)"}
_SERIES_TABLE = """
    access: protected
    epsilon: 1.0
    columns:
      c: {{categories: [a, b], group_by: true}}
      ts: {{bounds: [2020-01-01, 2020-12-31], group_by: [month]}}
      i: {{bounds: [0, 100]}}
"""
# Values stored apart (a wide row, STORAGE EXTERNAL) beside values in the row, an index on each
# column, vacuumed: PostgreSQL reads ``t`` and ``n`` by an index-only scan where a statement needs
# no other column, and an index holds every value in its own tuple.
_APART_TABLE = """
    access: protected
    epsilon: 100000.0
    columns:
      n: {{bounds: [0, 1e70]}}
"""
_APART_SQL = """
DROP TABLE IF EXISTS s41apart;
CREATE TABLE s41apart (t text, n numeric, pad text);
ALTER TABLE s41apart ALTER t SET STORAGE EXTERNAL, ALTER n SET STORAGE EXTERNAL, ALTER pad SET STORAGE PLAIN;
INSERT INTO s41apart SELECT 'apart ' || g || repeat('z', 40), CAST(repeat('7', 60) AS numeric) + g, repeat('p', 3000)
FROM generate_series(1, 300) g;
INSERT INTO s41apart SELECT 'in the row ' || g, g, 'x' FROM generate_series(1, 300) g;
CREATE INDEX ON s41apart (t);
CREATE INDEX ON s41apart (n);
GRANT SELECT ON s41apart TO dpproxy_service;
"""
_POLICY = ATTACK_POLICY_HEAD + "".join(
    f"  public.{name}:" + _TABLE + quantum for prefix, quantum in _SETS.items() for name in _NAMES[prefix]) + "".join(
    f"  public.{name}:" + _SERIES_TABLE for name in ("s41s_0", *_SERIES_NEIGHBOURS)) + "  public.s41apart:" + _APART_TABLE


@pytest.fixture(scope="module")
def stop41_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    for prefix in _SETS:
        create_neighbours(test_db.admin_dsn, f"{prefix}_0", {f"{prefix}_{k}": row for k, row in _ROWS.items()},
                          _DDL, _BASE_ROWS)
    create_neighbours(test_db.admin_dsn, "s41s_0", _SERIES_NEIGHBOURS, _SERIES_DDL, _SERIES_ROWS)
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        for names in _NAMES.values():
            for name in names:
                admin.execute(f"ANALYZE {name}")
        admin.execute(_APART_SQL)
        admin.execute("VACUUM ANALYZE s41apart")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _outcome(proxy: RunningProxy, sql: str, prefix: str = "s41") -> tuple[object, ...]:
    """``sql``'s masked outcome, the same on every table of the set ``prefix``, an error charged nothing."""
    with proxy.connect() as conn:
        return same_on_neighbours(conn, sql, _NAMES[prefix], spent_epsilon)


@pytest.mark.parametrize("statement", [
    "SELECT count(*) FILTER (WHERE i IN (1, CAST(5000000000 AS int))) FROM {t}",
    "SELECT count(*) FILTER (WHERE i > 10 OR i > CAST(5000000000 AS int)) FROM {t}",
    "SELECT count(*) FILTER (WHERE i BETWEEN 1 AND CAST(5000000000 AS int)) FROM {t}",
    "SELECT count(*) FILTER (WHERE f IN (1, CAST(1e400 AS float8))) FROM {t}",
    "SELECT sum(i) FILTER (WHERE i IN (1, CAST(40000 AS int2))), count(*) FROM {t}",
    "SELECT count(*), avg(n) FILTER (WHERE b IN (1, CAST(1e20 AS bigint))) FROM {t} WHERE i > 3",
    "SELECT avg(i) FILTER (WHERE 42 < i OR NOT (i > CAST(40000 AS smallint))), count(*) FROM {t}",
    "SELECT count(CASE WHEN f NOT BETWEEN CAST(1e400 AS double precision) AND 2 THEN 1 END) FROM {t}",
])
@pytest.mark.parametrize("prefix", list(_SETS))
def test_a_constant_the_planner_fails_to_fold_in_a_filter_fails_before_the_charge(
        stop41_proxy: RunningProxy, statement: str, prefix: str) -> None:
    """The planner's folding fails whatever the rows: in the lock step, uncharged, on every table."""
    outcome = _outcome(stop41_proxy, statement, prefix)
    assert outcome[:2] == ("error", "22003"), outcome


_SERIES_RANGE = "ts >= '2020-01-01 00:00+00' AND ts < '2020-07-01 00:00+00'"


@pytest.mark.parametrize("inner, outer", [
    ("COUNT(*) FILTER (WHERE i IN (1, CAST(5000000000 AS int)))", "COUNT(*)"),
    ("COUNT(*)", "SUM(i) FILTER (WHERE i BETWEEN 1 AND CAST(40000 AS smallint))"),
])
def test_a_series_limits_constant_the_planner_fails_to_fold_fails_before_the_charge(
        stop41_proxy: RunningProxy, inner: str, outer: str) -> None:
    """Superset's series limit: the ranking's lock step and the plan's both plan their FILTERs."""
    with stop41_proxy.connect() as conn:
        outcome = same_on_neighbours(conn, _series_limited(inner, outer), ("s41s_0", *_SERIES_NEIGHBOURS),
                                     spent_epsilon)
    assert outcome[:2] == ("error", "22003"), outcome


def _series_limited(inner: str, outer: str) -> str:
    return (f"SELECT DATE_TRUNC('MONTH', ts) AS m, c AS c, {outer} AS v FROM {{t}} JOIN (SELECT c AS c__, "
            f"{inner} AS mme_inner__ FROM {{t}} WHERE {_SERIES_RANGE} GROUP BY c ORDER BY {inner} DESC LIMIT 1) "
            f"AS series_limit ON c = c__ WHERE {_SERIES_RANGE} GROUP BY DATE_TRUNC('MONTH', ts), c")


@pytest.mark.parametrize("timezone", ["UTC", "America/Sao_Paulo", "Asia/Kathmandu"])
def test_a_series_limit_is_answered_alike_on_neighbours_in_any_time_zone(stop41_proxy: RunningProxy,
                                                                         timezone: str) -> None:
    """An infinite, a NULL and a DST-edge row: the same months, series and charge."""
    with stop41_proxy.connect() as conn:
        conn.execute(f"SET TimeZone = '{timezone}'")
        outcome = same_on_neighbours(conn, _series_limited("COUNT(*)", "SUM(i)"), ("s41s_0", *_SERIES_NEIGHBOURS),
                                     spent_epsilon, keys=2)
    assert outcome[0] == "answer", outcome


_IN_120 = ", ".join(str(k) for k in range(120))
_TEXTS_64 = ", ".join(f"'v{k}'" for k in range(64))


@pytest.mark.parametrize("condition", [
    "i = 5", "i > 2147483646", "i < -2147483647", f"i IN ({_IN_120})", "b > 9223372036854775806",
    "b BETWEEN -9223372036854775808 AND 0", "n > 5", "n = 'NaN'", "n < CAST('1e400' AS numeric)",
    f"n IN ({_IN_120})", "n > CAST('-Infinity' AS numeric)", "f > 1e308", "f = 'NaN'", "f < '-Infinity'",
    "d > '5874897-12-30'", "d < '4713-01-02 BC'", "d = 'infinity'", "d > CAST('2020-01-01' AS timestamptz)",
    "ts > '294276-12-31 23:59:58+00'", "ts < '-infinity'", "ts > CAST('2020-02-01' AS date)", "ts > d", "d < ts",
    "t = 'v1'", f"t IN ({_TEXTS_64})", "t > 'v3'", "t LIKE 'v%'", "t LIKE '%x%x%x%x%'", "t ILIKE '%É%'",
    "t = ''", "t < 'w' AND t > ''", "t = 'v1' OR t IS NULL",
])
@pytest.mark.parametrize("prefix", list(_SETS))
def test_statistics_holding_the_adversarial_row_decide_nothing_the_analyst_sees(
        stop41_proxy: RunningProxy, condition: str, prefix: str) -> None:
    """The lock step plans, uncharged if it fails, reading pg_statistic: the adversarial row at a
    histogram's end or among the most common values changes neither the outcome nor the charge."""
    outcome = _outcome(stop41_proxy, f"SELECT count(*), count(*) FILTER (WHERE {condition}), sum(i), avg(n) "
                                     f"FROM {{t}} WHERE {condition} OR i IS NULL", prefix)
    assert outcome[0] == "answer", outcome


@pytest.mark.parametrize("statement", [
    "SELECT count(t), count(n) FROM s41apart",
    "SELECT count(t) FROM s41apart WHERE t > 'a'",
    "SELECT count(*) FILTER (WHERE t >= '') FROM s41apart WHERE t > 'a'",
    "SELECT count(DISTINCT t) FROM s41apart WHERE t > ''",
    "SELECT count(n) FROM s41apart WHERE n > 0",
    "SELECT count(*) FROM s41apart WHERE n BETWEEN 0 AND 1e70",
])
def test_a_value_stored_apart_reads_as_null_in_an_index_only_scan_too(
        stop41_proxy: RunningProxy, admin: psycopg.Connection, statement: str) -> None:
    """300 values stored apart, 300 in the row: only the 300 are read, whatever the plan. An
    index holds a value stored apart in its own tuple, in line, so the stored-form check read it
    there as a value in the row, and a plan's choice (the planner's statistics, the visibility map:
    the table's, not the row's) decided whether a row was counted."""
    projection = ("(SELECT CASE WHEN pg_column_size(t) > octet_length(t) THEN t END AS t FROM s41apart) AS s41apart")
    plan = "\n".join(row for (row,) in admin.execute(f"EXPLAIN SELECT count(t) FROM {projection} WHERE t > 'a'"))
    assert "Index Only Scan" in plan  # the premise: the check alone is served from the index
    with stop41_proxy.connect() as conn:
        counts = conn.execute(statement).fetchone()
    assert counts is not None and all(abs(count - 300) <= 1 for count in counts), (statement, counts)


@pytest.mark.parametrize("key", [
    "floor((i - 10.0) / 10.0) * 10.0 + 10.0", "floor((i - 3) / 7) * 7 + 3", "floor(i / 25)",
    "floor(n / 7.0) * 7.0", "floor((n - 1e-100) / 33.333333333333333333333333333333333333)", "floor(n / 1e100)",
    "floor(f / 2.5) * 2.5", "floor((f - -0.0) / 1.0E+1) * 1.0E+1 + -0.0", "floor((f - 1e300) / 1e290)",
])
@pytest.mark.parametrize("prefix", list(_SETS))
def test_metabase_binning_gives_the_same_bins_and_charge_beside_any_row(
        stop41_proxy: RunningProxy, key: str, prefix: str) -> None:
    """Metabase's numeric binning over rows at the types' limits, NaN, ±Infinity, 1e400 and
    1e-400: the same bins, printed alike, and no error, with a category, a percentile, HAVING
    and LIMIT beside it."""
    with stop41_proxy.connect() as conn:
        for sql in (f"SELECT {key} AS k, count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY i) FROM {{t}} "
                    f"GROUP BY {key} ORDER BY {key}",
                    f"SELECT {key} AS k, sum(n) FROM {{t}} GROUP BY 1 HAVING {key} >= 0 ORDER BY 1 DESC LIMIT 3"):
            outcome = same_on_neighbours(conn, sql, _NAMES[prefix], spent_epsilon, keys=1)
            assert outcome[0] == "answer", outcome


_FOLDED = "SELECT count(*) FILTER (WHERE i IN (1, CAST(5000000000 AS int))) FROM {t}"


@pytest.mark.parametrize("form", ["cursor", "cursor with hold", "copy", "block", "prepared", "binary"])
def test_a_constant_the_planner_fails_to_fold_fails_before_the_charge_in_every_form(
        stop41_proxy: RunningProxy, form: str) -> None:
    """The lock step plans the statement whatever carries it: a cursor (DECLARE … FETCH), COPY
    (…) TO STDOUT, a transaction block, a prepared statement, binary results."""
    with stop41_proxy.connect() as conn:
        conn.autocommit = True
        for name in _NAMES["s41"]:
            before = spent_epsilon(conn)
            sql = _FOLDED.replace("{t}", name)
            with pytest.raises(psycopg.errors.NumericValueOutOfRange):
                if form.startswith("cursor"):
                    with conn.transaction():
                        conn.execute(f"DECLARE c41 CURSOR {'WITH HOLD ' if 'hold' in form else ''}FOR {sql}")
                        conn.execute("FETCH ALL FROM c41")
                elif form == "copy":
                    with conn.cursor() as cursor, cursor.copy(f"COPY ({sql}) TO STDOUT") as copy:
                        list(copy)
                elif form == "block":
                    with conn.transaction():
                        conn.execute(sql)
                else:
                    conn.execute(sql, prepare=form == "prepared", binary=form == "binary")
            assert spent_epsilon(conn) == before, (form, name)


@pytest.mark.parametrize("condition", ["d > CAST(%s AS date)", "ts > CAST(%s AS timestamptz) + interval '1 day'",
                                       "ts > CAST(CAST(%s AS text) AS timestamp)", "n > CAST(%s AS numeric)"])
def test_a_text_parameter_cast_in_the_run_fails_before_the_charge_whether_a_row_reaches_it(
        stop41_proxy: RunningProxy, condition: str) -> None:
    """A parameter sent as text and cast in the statement (a stable input function, which the
    planner does not fold) would fail on the first row that reaches it: behind ``i =
    2147483647`` only neighbour 1 has one. It fails before the charge on every table alike."""
    with stop41_proxy.connect() as conn:
        conn.adapters.register_dumper(str, StrDumper)  # declared text (25), not unspecified
        outcome = same_on_neighbours(conn, f"SELECT count(*) FROM {{t}} WHERE i = 2147483647 AND {condition}",
                                     _NAMES["s41"], spent_epsilon, params=("garbage",))
    assert outcome[0] == "error" and outcome[1] in ("22007", "22P02"), outcome
