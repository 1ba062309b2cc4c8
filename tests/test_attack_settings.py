"""Session and transaction state an analyst controls, attacked on neighbouring tables.

The analyst may change what dpproxy lets through to the backend: the safe SET list
(``rewriter.catalog.SAFE_SETTINGS``), ``set_config(…, false/true)``, ``SET SESSION
CHARACTERISTICS``, ``SET TRANSACTION`` (sent as SET LOCAL), the startup parameters and ``-c``
options dpproxy forwards, transaction blocks, isolation levels, savepoints and ``DISCARD``. Each
probe here asks whether such state lets one row decide whether an accepted DP statement fails,
what it returns beyond the noised values (columns, types, rows, keys, notices) or whether it is
charged for a failure.

Found and fixed: a ``SERIALIZABLE`` transaction (``BEGIN ISOLATION LEVEL SERIALIZABLE``, ``SET
SESSION CHARACTERISTICS``, ``default_transaction_isolation``) made a DP query fail (DP004, after
its charge) exactly when a concurrent serializable writer of the operator's had changed a row
the query's WHERE selects, and committed after a transaction it depended on (PostgreSQL's
read-only anomaly: a read-only serializable transaction that is not deferrable is aborted with
40001 to keep the writers serializable). ``SELECT COUNT(*) … WHERE id = 42`` failed, ``… WHERE
id = 43`` was answered: a per-row oracle of what is being written (privacy); and the analyst's
predicate locks made those writers fail instead (availability of the operator's application).
Backend connections now open with ``default_transaction_deferrable = on`` and ``NOT
DEFERRABLE`` is refused (``0A000``, rule ``deferrable``): a serializable transaction waits for
a safe snapshot, then takes no predicate locks and cannot fail so. Also fixed
(compatibility): ``set_config()`` in the ORDER BY of a one-row DP answer was accepted and never
run (the ORDER BY is dropped), so a setting the client asked for was silently not made; a
function that changes the session is now refused anywhere in a statement on a protected table.
A folded time value (``current_date - 10``, ``now() - interval '3000 days'``) went to the DP query
as PostgreSQL's text of it in the session's DateStyle, which some DateStyles cannot read back:
under 'SQL, YMD', 'Postgres, YMD' and 'German, YMD' it failed with 22008 (uncharged) where
PostgreSQL compares without a round trip, and under 'German, MDY' 02.01.0099 (2 January) read
back as 1 February, taken for a rounded value (``=`` matched no row, ``>=`` started a month
late; compatibility, not a leak: the value depends on the statement and settings only). Folded
times are now written in ISO's field order with the era, a timestamptz in UTC, which every
DateStyle and TimeZone reads back as the same value. dpproxy's backend connections also pin
``standard_conforming_strings`` on (with a legacy backend default of off, PostgreSQL read
``'\\'' UNION ALL SELECT s FROM st0 --'``, one literal to dpproxy, as a UNION returning every
protected value: privacy, given that configuration) and default ``extra_float_digits`` to 1
(``RESET extra_float_digits`` went back to a backend default below 1; defence in depth).

Held (regression tests): on ``st0`` and neighbours that each add one adversarial row (NULLs,
±Infinity, NaN, numeric 1e100 and 1e-400, float extremes and subnormals, a 5,000-emoji text,
dates and timestamps at their types' limits, a timestamptz whose UTC day differs from its day
east of UTC, the declared range's first and last microsecond, bytea with a backslash and a
quote), every accepted form — COUNT/SUM/AVG (noisy sum and count, sample and aggregate),
MIN/MAX, COUNT(DISTINCT), MODE, shares, post-processing, histograms over categories, integers,
``width_bucket`` bins, ``DATE_TRUNC`` day/week/month/year of date, timestamp and timestamptz,
date parts, ``CAST(… AS DATE)`` and Grafana's epoch buckets, folded ``now()``/``CURRENT_DATE``/
``TO_TIMESTAMP`` values, DateStyle-dependent literals with two-digit years, typed time parameters
across date/timestamp/timestamptz — gives the same outcome under TimeZone far east, far west and
POSIX offsets of ±15:59, every DateStyle and IntervalStyle, extra_float_digits 1 and 3,
lc_numeric, lc_time, bytea_output, client_min_messages from debug5 to error, jit,
xmloption, search_path, LATIN1, repeatable read and serializable blocks with SET LOCAL and a
savepoint rolled back, and set_config, in text, in binary and in COPY; a histogram's portal
executed a few rows at a time holds one release whatever is SET between its Executes. The
reasons it holds: every function, operator and type of a DP query's backend SQL is
``pg_catalog``'s; literals and folded values are read back in the analyst's own session before
the charge (so a DateStyle or TimeZone reading is the one the DP query uses); keys are cell
numbers or ``to_char`` of buckets inside the declared range; partition values are hashed, not
printed; no backend notice of a DP statement reaches the client (not even the LOG lines
``log_min_duration_statement`` writes, which ``client_min_messages = log`` sends to clients).
``set_config`` inside a DP statement is refused; startup ``options`` apply only the settings dpproxy forwards; every safe setting,
SET LOCAL after a savepoint's rollback included, is reset for the next client of a pooled
connection.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest
from psycopg.types.string import TextLoader

from rewriter.constants import Fold, fold_query
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.neighbour_outcome import binary_copy_cells, create_neighbours, masked_outcome
from tests.wire import SYNC, Wire, bind, data_row_values, error_fields, execute, parse

_DDL = "(id int8 PRIMARY KEY, i int4, n numeric, f float8, s text, d date, tz timestamptz, ts timestamp, b bytea)"
_BASE_ROWS = (
    "SELECT g, g % 90, (g % 700)::numeric / 7, (g % 13)::float8 - 4, (ARRAY['a', 'b'])[1 + g % 2], "
    "DATE '2020-01-01' + (g % 366), TIMESTAMPTZ '2020-01-01 12:00+00' + (g % 366) * interval '1 day', "
    "TIMESTAMP '2020-01-01 12:00' + (g % 366) * interval '1 day', '\\x00ff'::bytea FROM generate_series(1, 300) g"
)
_NEIGHBOURS = {
    "st1": "(1001, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "st2": "(1002, 2147483647, 'NaN', 'Infinity', 'zz', 'infinity', 'infinity', '-infinity', '\\xff')",
    "st3": "(1003, -2147483648, 1e100, 'NaN', repeat('😀', 5000), '4713-01-01 BC', '4713-01-01 00:00+00 BC', "
           "'294276-12-31 23:59:59', '\\x5c27')",
    "st4": "(1004, 0, '-Infinity', -1.7976931348623157e308, E'a\\\\', '5874897-12-31', '294276-12-31 23:59:59+00', "
           "'4713-01-01 BC', '')",
    "st5": "(1005, 89, 1e-400, 5e-324, 'b', '2020-12-31', '2020-12-31 23:59:59.999999+00', '2020-12-31 23:59:59.999999', "
           "NULL)",
    "st6": "(1006, 1, -1e-100, '-Infinity', 'a', '2020-01-01', '2019-12-31 10:00+00', '2020-01-01 00:00', '\\x00')",
    "st7": "(1007, 1, 0, 1e308, 'a', '2000-01-01', '2020-01-01 00:00+14', '1999-12-31 23:59:59', '\\x00')",
}
_POLICY = ATTACK_POLICY_HEAD.replace("repeats: {{enabled: true}}", "repeats: {{enabled: false}}") + """
  public.sr0:
    access: protected
    epsilon: 1.0
    columns:
      v: {{bounds: [0, 100]}}
  public.st0: &T
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      i: {{bounds: [0, 100], group_by: true}}
      n: {{bounds: [0, 1000]}}
      f: {{bounds: [-5, 10], avg: sample_aggregate, group_by: true}}
      s: {{categories: [a, b], group_by: true}}
      d: {{bounds: [2020-01-01, 2020-12-31], group_by: [month, week]}}
      tz: {{bounds: [2020-01-01, 2020-12-31], group_by: [day]}}
      ts: {{bounds: [2020-01-01, 2020-12-31], group_by: [day]}}
""" + "".join(f"  public.{name}: *T\n" for name in _NEIGHBOURS)


@pytest.fixture(scope="module")
def settings_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    yield from _settings_proxy(test_db, tmp_path_factory)


@pytest.fixture(scope="module")
def settings_proxy_pg15(pg15_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The same tables and dpproxy on PostgreSQL 15 with ICU and JIT (tests/pg15.py)."""
    yield from _settings_proxy(pg15_db, tmp_path_factory)


@pytest.fixture(scope="module")
def settings_proxy_newer(newer_pg_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The same tables and dpproxy on PostgreSQL 17, then 18 (tests/pg_versions.py)."""
    yield from _settings_proxy(newer_pg_db, tmp_path_factory)


def _settings_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    create_neighbours(test_db.admin_dsn, "st0", _NEIGHBOURS, _DDL, _BASE_ROWS)
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        # sr0: large enough that WHERE id = k is an index scan, whose predicate locks cover row k only.
        admin.execute("DROP TABLE IF EXISTS sr0, srx")
        admin.execute("CREATE TABLE sr0 (id int8 PRIMARY KEY, v int4)")
        admin.execute("INSERT INTO sr0 SELECT g, g % 100 FROM generate_series(1, 20000) g")
        admin.execute("CREATE TABLE srx (id int PRIMARY KEY, v int)")
        admin.execute("INSERT INTO srx VALUES (1, 0)")
        admin.execute("GRANT SELECT ON sr0, srx TO dpproxy_service")
        admin.execute("ANALYZE sr0, srx")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _dates_as_text(conn: psycopg.Connection) -> None:
    """Read dates and times as their text: psycopg parses only some DateStyles."""
    for name in ("date", "timestamp", "timestamptz", "interval"):
        conn.adapters.register_loader(name, TextLoader)


def _same_on_neighbours(conn: psycopg.Connection, sql: str) -> tuple[object, ...]:
    """``sql``'s one outcome on ``st0`` and every neighbour (keys compared value for value), an
    error uncharged."""
    keys = 1 if "GROUP BY" in sql else 0
    base: tuple[object, ...] = ()
    for name in ("st0", *_NEIGHBOURS):
        before = spent_epsilon(conn)
        outcome = masked_outcome(conn, sql, name, keys=keys)
        base = base or outcome
        assert outcome == base, (name, sql, base)
        assert outcome[0] == "answer" or spent_epsilon(conn) == before, (name, sql, outcome)
    return base


# ---------------------------------------------------------------- every accepted form under every state

ACCEPTED_FORMS = [
    "SELECT COUNT(*) FROM {t} WHERE i > 50",
    "SELECT SUM(i), SUM(n), SUM(f) FROM {t}",
    "SELECT AVG(i), AVG(n) FROM {t} WHERE f > 0",
    "SELECT AVG(f), MIN(f), MAX(f) FROM {t}",
    "SELECT COUNT(DISTINCT s), MODE() WITHIN GROUP (ORDER BY s) FROM {t}",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY f), percentile_disc(0.9) WITHIN GROUP (ORDER BY f DESC) FROM {t}",
    "SELECT s, percentile_disc(0.25) WITHIN GROUP (ORDER BY n), COUNT(*) FROM {t} GROUP BY s",
    "SELECT stddev(f), var_pop(n), variance(i) FROM {t}",
    "SELECT s, stddev_pop(f), var_samp(n) FROM {t} GROUP BY s",
    "SELECT s, COUNT(*), SUM(i) FROM {t} GROUP BY s",
    "SELECT i, COUNT(*) FROM {t} GROUP BY i",
    "SELECT width_bucket(f, -5, 10, 5) AS w, COUNT(*) FROM {t} GROUP BY 1",
    "SELECT DATE_TRUNC('month', d) AS m, COUNT(*), AVG(f) FROM {t} GROUP BY 1",
    "SELECT DATE_TRUNC('week', d) AS m, COUNT(*) FROM {t} GROUP BY 1",
    "SELECT DATE_TRUNC('day', tz) AS m, COUNT(*) FROM {t} WHERE tz >= '2020-03-01' AND tz < '2020-03-05' GROUP BY 1",
    "SELECT DATE_TRUNC('month', tz) AS m, COUNT(*) FROM {t} GROUP BY 1",
    "SELECT DATE_TRUNC('year', ts) AS m, COUNT(*) FROM {t} GROUP BY 1",
    "SELECT EXTRACT(MONTH FROM tz) AS m, COUNT(*) FROM {t} GROUP BY 1",
    "SELECT CAST(tz AS DATE) AS m, COUNT(*) FROM {t} WHERE tz < '2020-01-05' GROUP BY 1",
    "SELECT floor(extract(epoch from tz)/86400)*86400 AS t, COUNT(*) FROM {t} WHERE tz < '2020-01-05' GROUP BY 1",
    "SELECT COUNT(*) FROM {t} WHERE tz > now() - interval '30 days'",
    "SELECT COUNT(*) FROM {t} WHERE ts > now() - interval '3000 days' AND d < current_date - 10",
    "SELECT COUNT(*) FROM {t} WHERE tz >= TO_TIMESTAMP('2020-03-01 00:00:00', 'YYYY-MM-DD HH24:MI:SS')",
    "SELECT COUNT(*) FROM {t} WHERE d > '01/02/03' AND ts < '03/04/20 10:00'",
    "SELECT COUNT(*) FROM {t} WHERE ts > '2020-06-01 12:00' AND tz < '2020-06-01 12:00'",
    "SELECT COUNT(*) FROM {t} WHERE ts > LOCALTIMESTAMP - interval '1 year' OR tz < CURRENT_TIMESTAMP",
    "SELECT COUNT(*) FROM {t} WHERE d < TIMESTAMPTZ '2020-06-01 00:00+00' AND ts <> TIMESTAMPTZ '2020-06-01 00:00+14'",
    "SELECT 100.0 * COUNT(*) FILTER (WHERE i > 50) / COUNT(*) AS share FROM {t}",
    "SELECT ROUND(AVG(f)::numeric, 2), SUM(n) / 7 FROM {t}",
    "SELECT s, COUNT(*) FROM {t} WHERE b = '\\x00ff' GROUP BY s",
    "SELECT COUNT(*) FROM {t} WHERE s = 'a' AND n < 1e-50",
]

SESSION_STATES = {
    "default": (),
    "time zone far east": ("SET TimeZone = 'Pacific/Kiritimati'",),
    "time zone far west": ("SET TIME ZONE 'Etc/GMT+12'",),
    "posix offsets": ("SET TimeZone = '<-1559>+15:59'",),
    "interval offset": ("SET TIME ZONE INTERVAL '-15:59' HOUR TO MINUTE",),
    "SQL DMY": ("SET DateStyle = 'SQL, DMY'",),
    "German": ("SET DateStyle = German",),
    "Postgres YMD": ("SET datestyle TO 'Postgres, YMD'",),
    "interval styles": ("SET IntervalStyle = sql_standard", "SET intervalstyle = iso_8601"),
    "verbose intervals": ("SET intervalstyle = postgres_verbose",),
    "float digits": ("SET extra_float_digits = 3",),
    "locale and bytes": ("SET lc_numeric = 'C'", "SET lc_time = 'C'", "SET bytea_output = escape", "SET xmloption = document"),
    "debug messages": ("SET client_min_messages = debug5",),
    "errors only": ("SET client_min_messages = error",),
    "planner": ("SET jit = on",),
    "search path": ("SET search_path = pg_temp, public, pg_catalog",),
    "latin1": ("SET client_encoding = 'LATIN1'",),
    "repeatable read": ("SET default_transaction_isolation = 'repeatable read'",),
    "serializable": ("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY, DEFERRABLE",),
    "repeatable read block": ("BEGIN ISOLATION LEVEL REPEATABLE READ", "SAVEPOINT p", "SET LOCAL TimeZone = 'Etc/GMT+12'",
                              "ROLLBACK TO SAVEPOINT p", "SET LOCAL DateStyle = 'SQL, DMY'"),
    "serializable block": ("BEGIN ISOLATION LEVEL SERIALIZABLE", "SET TRANSACTION READ ONLY",
                           "SELECT set_config('TimeZone', 'Pacific/Kiritimati', true)"),
    "set_config": ("SELECT set_config('TimeZone', 'America/Caracas', false), set_config('DateStyle', 'SQL, MDY', false)",),
}


@pytest.mark.parametrize("state", SESSION_STATES)
def test_no_session_state_lets_one_row_decide_an_outcome(settings_proxy: RunningProxy, state: str) -> None:
    with settings_proxy.connect() as conn:
        _dates_as_text(conn)
        for statement in SESSION_STATES[state]:
            conn.execute(statement)
        for sql in ACCEPTED_FORMS:
            _same_on_neighbours(conn, sql)


# A slice of the states on PostgreSQL 15: JIT is there (pgserver's 16 has none), and the time
# and text handling that differs most between versions.
_PG15_STATES = ["default", "planner", "posix offsets", "German", "latin1", "serializable block"]


@pytest.mark.parametrize("state", _PG15_STATES)
def test_no_session_state_lets_one_row_decide_an_outcome_on_postgresql_15(settings_proxy_pg15: RunningProxy,
                                                                          state: str) -> None:
    test_no_session_state_lets_one_row_decide_an_outcome(settings_proxy_pg15, state)


# On PostgreSQL 17 and 18: 15's slice and the time zones, interval styles, float digits and
# blocks, whose handling of times and text a new major version could change.
_NEWER_STATES = [*_PG15_STATES, "time zone far east", "time zone far west", "interval styles", "float digits",
                 "repeatable read block", "set_config"]


@pytest.mark.parametrize("state", _NEWER_STATES)
def test_no_session_state_lets_one_row_decide_an_outcome_on_postgresql_17_and_18(settings_proxy_newer: RunningProxy,
                                                                                 state: str) -> None:
    test_no_session_state_lets_one_row_decide_an_outcome(settings_proxy_newer, state)


def _answer_form(conn: psycopg.Connection, sql: str) -> tuple[object, ...]:
    """``sql`` asked with every result column in binary (or, for COPY, its data): an error's
    SQLSTATE and whether it went uncharged, or the columns, the row count and the first column
    of each row when that is a key."""
    before = spent_epsilon(conn)
    try:
        if sql.startswith("COPY"):
            with conn.cursor().copy(sql) as copy:
                data = b"".join(bytes(block) for block in copy)
            if "FORMAT binary" in sql:
                return "copy", binary_copy_cells(data)
            lines = data.split(b"\n")
            return "copy", len(lines), tuple(line.split(b"\t")[0] for line in lines if b"\t" in line)
        cursor = conn.cursor(binary=True)
        cursor.execute(sql)
        rows = cursor.fetchall()
        keys = tuple(row[0] for row in rows) if "GROUP BY" in sql else ()
        return "answer", tuple((c.name, c.type_code) for c in cursor.description or ()), len(rows), keys
    except psycopg.Error as exc:
        return "error", exc.sqlstate, spent_epsilon(conn) == before


_BINARY_AND_COPY = [sql for sql in ACCEPTED_FORMS if "GROUP BY" in sql or "now()" in sql or "AVG(f)" in sql] + [
    "COPY (SELECT DATE_TRUNC('day', tz) AS m, COUNT(*) FROM {t} WHERE tz < '2020-01-05' GROUP BY 1) TO STDOUT",
    "COPY (SELECT s, AVG(f), SUM(n) FROM {t} GROUP BY s) TO STDOUT WITH (FORMAT csv, HEADER)",
    "COPY (SELECT s, AVG(f), SUM(n) FROM {t} GROUP BY s) TO STDOUT (FORMAT binary)",  # connectorx, ADBC
    "COPY (SELECT COUNT(*), AVG(f), MIN(n) FROM {t} WHERE n > 0) TO STDOUT (FORMAT binary)",
]


@pytest.mark.parametrize("state", SESSION_STATES)
def test_no_session_state_lets_one_row_decide_a_binary_or_copy_answer(settings_proxy: RunningProxy,
                                                                       state: str) -> None:
    with settings_proxy.connect() as conn:
        for statement in SESSION_STATES[state]:
            conn.execute(statement)
        for sql in _BINARY_AND_COPY:
            outcomes = {table: _answer_form(conn, sql.replace("{t}", table)) for table in ("st0", *_NEIGHBOURS)}
            assert len(set(outcomes.values())) == 1, (sql, outcomes)


@pytest.mark.parametrize("state", ["default", "German", "latin1"])
def test_no_session_state_lets_one_row_decide_a_binary_or_copy_answer_on_postgresql_17_and_18(
        settings_proxy_newer: RunningProxy, state: str) -> None:
    test_no_session_state_lets_one_row_decide_a_binary_or_copy_answer(settings_proxy_newer, state)


_TYPED_TIMES = [  # (statement, parameter values, their declared types: timestamptz, timestamp, date)
    ("SELECT COUNT(*) FROM {t} WHERE ts > $1", [b"2020-06-01 00:00+14"], [1184]),
    ("SELECT COUNT(*) FROM {t} WHERE d = $1", [b"2020-06-01 00:00-12"], [1184]),
    ("SELECT COUNT(*) FROM {t} WHERE tz > $1", [b"2020-06-01 00:00"], [1114]),
    ("SELECT COUNT(*) FROM {t} WHERE tz > $1", [b"2020-06-01"], [1082]),
    ("SELECT COUNT(*) FROM {t} WHERE ts BETWEEN $1 AND $2", [b"2020-06-01 00:00+14", b"2020-07-01 00:00-12"], [1184, 1184]),
    ("SELECT COUNT(*) FROM {t} WHERE d IN ($1, $2)", [b"2020-06-01 00:00+14", b"2020-07-01 00:00-12"], [1184, 1184]),
]


@pytest.mark.parametrize("zone", ["Etc/GMT+12", "Pacific/Kiritimati", "<-1559>+15:59", "<+1559>-15:59"])
def test_a_time_parameter_of_another_time_type_is_no_oracle_in_any_time_zone(settings_proxy: RunningProxy,
                                                                              zone: str) -> None:
    # A timestamp at its type's limit converted per row to timestamptz far west fails; the
    # comparisons across time types convert without failing (PostgreSQL's *_opt_overflow).
    with settings_proxy.connect() as conn:
        conn.execute(f"SET TimeZone = '{zone}'")
        for sql, values, types in _TYPED_TIMES:
            outcomes = set()
            for table in ("st0", *_NEIGHBOURS):
                result = conn.pgconn.exec_params(sql.replace("{t}", table).encode(), values, types)
                outcomes.add((result.status, result.error_field(psycopg.pq.DiagnosticField.SQLSTATE)))
            assert outcomes == {(psycopg.pq.ExecStatus.TUPLES_OK, None)}, (sql, outcomes)


# ---------------------------------------------------------------- serializable transactions and concurrent writers

def _dp_query_beside_a_serializable_writer(proxy: RunningProxy, admin_dsn: str, row: int) -> tuple[str, object]:
    """PostgreSQL's read-only anomaly: the operator's serializable writer W2 reads what W3 then
    changes and commits; the analyst's serializable block takes its snapshot; W2 changes row 42
    of sr0 and commits; the analyst counts row ``row``. The outcome of that DP query."""
    with psycopg.connect(admin_dsn) as w2, psycopg.connect(admin_dsn) as w3, proxy.connect() as analyst:
        for writer in (w2, w3):
            writer.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        w2.execute("SELECT v FROM srx WHERE id = 1").fetchall()
        w3.execute("UPDATE srx SET v = v + 1 WHERE id = 1")
        w3.commit()
        snapshot_taken = threading.Event()

        def begin() -> None:
            analyst.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
            analyst.execute("SELECT 1")  # a deferrable block waits here until W2 is done
            snapshot_taken.set()

        beginning = threading.Thread(target=begin, daemon=True)
        beginning.start()
        snapshot_taken.wait(0.5)
        w2.execute("UPDATE sr0 SET v = v WHERE id = 42")
        w2.commit()
        beginning.join(10)
        assert snapshot_taken.is_set()
        try:
            return "answer", analyst.execute(f"SELECT COUNT(*) FROM sr0 WHERE id = {row}").fetchall()[0][0] is not None
        except psycopg.Error as exc:
            return "error", exc.sqlstate


@pytest.mark.parametrize("row", [42, 43])
def test_a_concurrent_serializable_writer_does_not_decide_whether_a_dp_query_fails(
        settings_proxy: RunningProxy, test_db: TestDatabase, row: int) -> None:
    # Before, the block was not deferrable: the count of row 42 (the one W2 wrote) failed with
    # DP004 (40001 on the backend), the count of row 43 was answered.
    assert _dp_query_beside_a_serializable_writer(settings_proxy, test_db.admin_dsn, row) == ("answer", True)


@pytest.mark.parametrize("statement", [
    "BEGIN ISOLATION LEVEL SERIALIZABLE, NOT DEFERRABLE",
    "START TRANSACTION READ ONLY NOT DEFERRABLE",
    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE NOT DEFERRABLE",
])
def test_not_deferrable_is_refused(settings_proxy: RunningProxy, statement: str) -> None:
    with settings_proxy.connect() as conn:
        with pytest.raises(psycopg.errors.FeatureNotSupported, match=r"rule: deferrable") as refused:
            conn.execute(statement)
        assert refused.value.diag.message_hint
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_set_transaction_not_deferrable_is_refused_inside_a_block(settings_proxy: RunningProxy) -> None:
    with settings_proxy.connect() as conn:
        conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        with pytest.raises(psycopg.errors.FeatureNotSupported, match=r"rule: deferrable"):
            conn.execute("SET TRANSACTION NOT DEFERRABLE")
        conn.execute("ROLLBACK")


@pytest.mark.parametrize("setup", [(), ("RESET ALL",), ("DISCARD ALL",),
                                   ("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",)])
def test_backend_transactions_stay_deferrable(settings_proxy: RunningProxy, setup: tuple[str, ...]) -> None:
    with settings_proxy.connect() as conn:
        for statement in setup:
            conn.execute(statement)
        conn.execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        assert conn.execute("SHOW transaction_deferrable").fetchone() == ("on",)
        conn.execute("SELECT COUNT(*) FROM st0")
        conn.execute("COMMIT")


# ---------------------------------------------------------------- other paths a setting could take

@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*), set_config('jit', 'on', false) FROM st0",
    "SELECT COUNT(*) FROM st0 WHERE tz > CAST(set_config('TimeZone', 'UTC', false) AS timestamptz)",
    "SELECT COUNT(*) FILTER (WHERE set_config('jit', 'on', false) = 'on') FROM st0",
    "SELECT c FROM (SELECT COUNT(*) AS c FROM st0) q WHERE set_config('jit', 'on', false) = 'on'",
    "SELECT COUNT(*) FROM st0 HAVING set_config('jit', 'on', false) = 'on'",
    "SELECT s, COUNT(*) FROM st0 GROUP BY s ORDER BY set_config('extra_float_digits', '-15', false)",
    "WITH x AS (SELECT set_config('jit', 'on', false)) SELECT COUNT(*) FROM st0",
])
def test_set_config_is_refused_inside_a_dp_statement(settings_proxy: RunningProxy, sql: str) -> None:
    with settings_proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql)
        assert refused.value.sqlstate == "DP001"


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM st0 ORDER BY set_config('extra_float_digits', '3', false)",
    "SELECT COUNT(*) FROM st0 ORDER BY pg_catalog.pg_advisory_unlock_all()",
])
def test_a_session_changing_function_in_a_dropped_order_by_is_refused(settings_proxy: RunningProxy, sql: str) -> None:
    # A one-row answer's ORDER BY is dropped unrun: answered, the setting the client asked for
    # was silently never made.
    with settings_proxy.connect() as conn:
        with pytest.raises(psycopg.Error, match=r"changes the session.*rule: function-allowlist") as refused:
            conn.execute(sql)
        assert refused.value.sqlstate == "DP001"
        assert conn.execute("SHOW extra_float_digits").fetchone() == ("1",)


@pytest.mark.parametrize("options", [
    "-c work_mem=64kB -c jit_above_cost=0", "--enable-seqscan=off", "-c default_transaction_read_only=off",
    "-c default_transaction_deferrable=off", "-c default_transaction_isolation=serializable",
    "-c idle_in_transaction_session_timeout=1 -c statement_timeout=1", "-c row_security=off -c lc_monetary=C",
])
def test_startup_options_apply_only_the_settings_dpproxy_forwards(settings_proxy: RunningProxy, options: str) -> None:
    names = ("work_mem", "jit_above_cost", "enable_seqscan", "default_transaction_read_only",
             "default_transaction_deferrable", "default_transaction_isolation", "idle_in_transaction_session_timeout",
             "statement_timeout", "row_security", "lc_monetary")
    query = "SELECT " + ", ".join(f"current_setting('{name}')" for name in names)
    with settings_proxy.connect() as plain, psycopg.connect(settings_proxy.dsn(), options=options, autocommit=True) as conn:
        assert conn.execute(query).fetchone() == plain.execute(query).fetchone()


@contextmanager
def _service_role_default(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, setting: str,
                          value: str) -> Iterator[RunningProxy]:
    """A dpproxy whose backend connections start under the service role's default ``setting =
    value`` (an operator's ``ALTER ROLE ... SET``), reset again afterwards."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(f"ALTER ROLE dpproxy_service SET {setting} = {value}")
        try:
            with running_proxy(test_db, tmp_path_factory, _POLICY) as proxy:
                yield proxy
        finally:
            admin.execute(f"ALTER ROLE dpproxy_service RESET {setting}")


def test_no_backend_log_line_reaches_the_client_during_a_dp_statement(
        settings_proxy: RunningProxy, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # client_min_messages = log sends the backend's LOG lines to the client: with the operator's
    # log_min_duration_statement they carry the DP query's backend SQL (its partition seed) and
    # how long the rows took.
    with _service_role_default(test_db, tmp_path_factory, "log_min_duration_statement", "0") as logged, \
            logged.connect() as conn:
        conn.execute("SET client_min_messages = log")
        for sql in ("SELECT COUNT(*) FROM {t} WHERE i > 50", "SELECT s, AVG(f) FROM {t} GROUP BY s"):
            assert _same_on_neighbours(conn, sql)[-1] != ()  # dpproxy's own notice ...
            assert not any("duration" in notice for notice in _same_on_neighbours(conn, sql)[-1])  # ... alone


_SAFE_VALUES = [
    "SET application_name = 'x'", "SET client_encoding = 'LATIN1'", "SET DateStyle = 'German'",
    "SET IntervalStyle = 'iso_8601'", "SET TimeZone = 'Pacific/Kiritimati'", "SET extra_float_digits = 3",
    "SET search_path = pg_temp", "SET bytea_output = escape", "SET client_min_messages = debug5",
    "SET lc_numeric = 'C'", "SET lc_time = 'C'", "SET jit = off", "SET xmloption = document",
    "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
]
_SHOWN = ("application_name", "client_encoding", "DateStyle", "IntervalStyle", "TimeZone", "extra_float_digits",
          "search_path", "bytea_output", "client_min_messages", "lc_numeric", "lc_time", "jit",
          "xmloption", "default_transaction_isolation", "default_transaction_deferrable")


def test_every_safe_setting_is_reset_for_the_next_client_of_a_pooled_connection(
        settings_proxy: RunningProxy, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    one = _POLICY.replace("statement_timeout_ms: 10000}}", "statement_timeout_ms: 10000, pool: {{size: 1}}}}")
    shown = "SELECT " + ", ".join(f"pg_catalog.current_setting('{name}')" for name in _SHOWN)
    with running_proxy(test_db, tmp_path_factory, one) as pooled:
        with pooled.connect() as fresh:
            defaults = fresh.execute(shown).fetchone()
        with pooled.connect() as first:
            for statement in _SAFE_VALUES:
                first.execute(statement)
            first.execute("BEGIN")
            first.execute("SET LOCAL TimeZone = 'Etc/GMT+12'")
            first.execute("SAVEPOINT p")
            first.execute("SET LOCAL DateStyle = 'SQL'")
            first.execute("ROLLBACK TO SAVEPOINT p")
            assert first.info.parameter_status("DateStyle") == "German, DMY"
            first.execute("COMMIT")
            assert first.info.parameter_status("TimeZone") == "Pacific/Kiritimati"
            changed = first.execute(shown).fetchone()
            assert changed is not None and defaults is not None
            assert [name for name, a, b in zip(_SHOWN, defaults, changed) if a == b] == ["default_transaction_deferrable"]
            with pooled.connect() as second:  # on the pool's one connection, in turn
                assert second.execute(shown).fetchone() == defaults
            assert first.execute(shown).fetchone() == changed
        with pooled.connect() as third:
            assert third.execute(shown).fetchone() == defaults


@pytest.mark.parametrize("statement", [
    "SET transaction_timeout = 1", "SET LOCAL transaction_timeout = 1", "SELECT set_config('transaction_timeout', '1', false)",
    "SET restrict_nonsystem_relation_kind = view"])
def test_the_settings_postgresql_17_pins_cannot_be_set(settings_proxy_newer: RunningProxy, statement: str) -> None:
    """transaction_timeout ends a DP statement's connection when its rows take long (and, in a
    block, the rows and a quantised answer's wait together); restrict_nonsystem_relation_kind
    fails every statement on a protected view. Refused before anything is charged; the backend's
    are pinned (proxy.backend.pool.PINNED_WHERE_KNOWN)."""
    _refused_and_pinned(settings_proxy_newer, statement, {"transaction_timeout": "0", "restrict_nonsystem_relation_kind": ""})


def test_the_settings_postgresql_17_pins_are_not_forwarded_from_startup_options(
        settings_proxy_newer: RunningProxy) -> None:
    options = "-c transaction_timeout=1 -c restrict_nonsystem_relation_kind=view"
    with psycopg.connect(settings_proxy_newer.dsn(), options=options, autocommit=True) as conn:
        shown = "SELECT current_setting('transaction_timeout'), current_setting('restrict_nonsystem_relation_kind')"
        assert conn.execute(shown).fetchone() == ("0", "")
        assert conn.execute("SELECT COUNT(*) FROM st0 WHERE i > 50").fetchone() is not None


@pytest.mark.parametrize("statement", ["SET lock_timeout = 1", "SET LOCAL lock_timeout = 1",
                                       "SELECT set_config('lock_timeout', '1', false)"])
def test_lock_timeout_cannot_be_set(settings_proxy: RunningProxy, statement: str) -> None:
    """A wait for the operator's lock on a table's TOAST relation happens only when a row read has
    a long value stored apart: ended by lock_timeout, it failed the statement on exactly that
    neighbour (tests/test_standby.py). Refused, before anything is charged; the backend's is 0."""
    _refused_and_pinned(settings_proxy, statement, {"lock_timeout": "0"})


def _refused_and_pinned(proxy: RunningProxy, statement: str, pinned: dict[str, str]) -> None:
    """``statement`` refused (rule ``safe-settings``) before any charge, and the settings still
    ``pinned``'s values."""
    with proxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            conn.execute(statement)
        assert "(rule: safe-settings)" in str(refused.value), str(refused.value)
        assert spent_epsilon(conn) == before
        for name, value in pinned.items():
            assert conn.execute(f"SHOW {name}").fetchone() == (value,)


# ---------------------------------------------------------------- settings the parser depends on, pinned

_SMUGGLED = "SELECT relname::text FROM pg_catalog.pg_class WHERE relname = '\\'' UNION ALL SELECT s FROM st0 --'"


def test_a_backend_default_of_non_standard_strings_does_not_change_how_a_statement_reads(
        settings_proxy: RunningProxy, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # dpproxy reads '\'' UNION ALL … --' as one string literal (a catalog query); with
    # standard_conforming_strings off PostgreSQL read \' as a quote, ended the literal there and
    # ran the UNION: all 300 values of the protected column came back.
    with _service_role_default(test_db, tmp_path_factory, "standard_conforming_strings", "off") as legacy, \
            legacy.connect() as conn:
        for reset in ((), ("RESET standard_conforming_strings",), ("RESET ALL",), ("DISCARD ALL",)):
            for statement in reset:
                conn.execute(statement)
            assert conn.execute(_SMUGGLED).fetchall() == []
            assert conn.execute("SHOW standard_conforming_strings").fetchone() == ("on",)
            assert conn.info.parameter_status("standard_conforming_strings") == "on"


def test_a_backend_default_of_rounded_floats_is_not_what_reset_returns_to(
        settings_proxy: RunningProxy, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> None:
    # SET extra_float_digits below 1 is refused (rule: exact-floats); RESET went back to the
    # role's default, -15 here. (Defence in depth: today's DP answers read float partition values
    # in binary and float sums as numeric, so no exact aggregate dpproxy reads was rounded.)
    with _service_role_default(test_db, tmp_path_factory, "extra_float_digits", "-15") as legacy:
        with legacy.connect() as conn:
            for reset in ((), ("RESET extra_float_digits",), ("RESET ALL",), ("DISCARD ALL",)):
                for statement in reset:
                    conn.execute(statement)
                assert conn.execute("SHOW extra_float_digits").fetchone() == ("1",)
        with psycopg.connect(legacy.dsn(), options="-c extra_float_digits=3", autocommit=True) as given:
            given.execute("RESET extra_float_digits")
            assert given.execute("SHOW extra_float_digits").fetchone() == ("3",)



# ---------------------------------------------------------------- folded values under every DateStyle

_DATE_STYLES = ["ISO, MDY", "ISO, DMY", "ISO, YMD", "SQL, MDY", "SQL, DMY", "SQL, YMD", "Postgres, MDY",
                "Postgres, DMY", "Postgres, YMD", "German, DMY", "German, MDY", "German, YMD"]
_FOLDED_TIMES = [  # (the type a fold takes, its expression, the text every style must read back)
    ("date", "CAST('2026-11-26' AS pg_catalog.date) - 10", "2026-11-16 AD"),
    ("date", "CAST('0044-03-15 BC' AS pg_catalog.date) + 0", "0044-03-15 BC"),
    ("date", "CAST('5874897-12-31' AS pg_catalog.date) - 0", "5874897-12-31 AD"),
    ("date", "CAST('infinity' AS pg_catalog.date) - 0", "infinity"),
    ("timestamp", "CAST('0099-01-02 03:04' AS pg_catalog.timestamp) + CAST('0 days' AS pg_catalog.interval)",
     "0099-01-02 03:04:00.000000 AD"),
    ("timestamp", "CAST('294276-12-31 23:59:59.999999' AS pg_catalog.timestamp) + CAST('0 days' AS pg_catalog.interval)",
     "294276-12-31 23:59:59.999999 AD"),
    ("timestamptz", "CAST('2026-11-26 20:06:53.5+00' AS pg_catalog.timestamptz) - CAST('1 day' AS pg_catalog.interval)",
     "2026-11-25 20:06:53.500000+00 AD"),
    ("timestamptz", "CAST('4713-11-24 00:00+00 BC' AS pg_catalog.timestamptz) + CAST('0 days' AS pg_catalog.interval)",
     "4713-11-24 00:00:00.000000+00 BC"),
    ("timestamptz", "CAST('-infinity' AS pg_catalog.timestamptz) + CAST('0 days' AS pg_catalog.interval)", "-infinity"),
]


@pytest.mark.parametrize("style", _DATE_STYLES)
def test_a_folded_time_value_reads_back_as_itself_in_every_date_style(test_db: TestDatabase, style: str) -> None:
    # PostgreSQL's own text of a date under 'SQL, YMD' (11/26/2026) is the 26th month to YMD:
    # the fold failed with 22008 where PostgreSQL compares without a round trip; under 'German,
    # MDY' 02.01.0099 (2 January) read back as 1 February, and the fold was taken for a rounded
    # value, so `= value` matched no row and `>= value` the rows from 1 February.
    folds = tuple(Fold("c", ">=", expression, type_name, f"\x00{i}\x00")
                  for i, (type_name, expression, _) in enumerate(_FOLDED_TIMES))
    with psycopg.connect(test_db.service_dsn, autocommit=True) as conn:
        for zone in ("Pacific/Kiritimati", "Europe/Paris"):
            conn.execute(f"SET DateStyle = '{style}'")
            conn.execute(f"SET TimeZone = '{zone}'")
            row = conn.execute(fold_query(folds)).fetchone()
            assert row is not None
            for i, (_, _, text) in enumerate(_FOLDED_TIMES):
                assert row[3 * i] == text, (style, zone, _FOLDED_TIMES[i])
                assert row[3 * i + 1:3 * i + 3] == (False, False), (style, zone, _FOLDED_TIMES[i])


@pytest.mark.parametrize("style", ["SQL, YMD", "Postgres, YMD", "German, YMD", "German, MDY"])
def test_folded_time_values_are_answered_in_date_styles_whose_output_their_field_order_misreads(
        settings_proxy: RunningProxy, style: str) -> None:
    with settings_proxy.connect() as conn:
        _dates_as_text(conn)
        conn.execute(f"SET DateStyle = '{style}'")
        for sql in ("SELECT COUNT(*) FROM {t} WHERE ts > now() - interval '3000 days' AND d < current_date - 10",
                    "SELECT COUNT(*) FROM {t} WHERE tz >= TO_TIMESTAMP('2020-03-01 00:00:00', 'YYYY-MM-DD HH24:MI:SS')"):
            assert _same_on_neighbours(conn, sql)[0] == "answer"



def _suspended_histogram(proxy: RunningProxy, table: str) -> list[tuple[bytes, ...]]:
    """A pipeline: SET TimeZone, a histogram's portal in binary executed two rows at a time, SET
    DateStyle = German between its Executes, one Sync. The messages, a DataRow by its key."""
    wire = Wire(proxy.host, proxy.port)
    wire.send(parse("", "SET TimeZone = 'Etc/GMT+12'"), bind("", ""), execute(""),
              parse("q", f"SELECT DATE_TRUNC('day', tz) AS m, COUNT(*) FROM {table} WHERE tz < '2020-01-08' GROUP BY 1"),
              bind("p", "q", result_formats=(1, 1)), execute("p", 2),
              parse("", "SET DateStyle = German"), bind("", ""), execute(""), execute("p", 3), execute("p", 0), SYNC)
    replies = wire.read_until(b"Z")
    wire.close()
    seen: list[tuple[bytes, ...]] = []
    for kind, body in replies:
        if kind == b"D":
            seen.append((kind, data_row_values(body)[0] or b""))
        elif kind == b"E":
            seen.append((kind, error_fields(body).get(b"C", b"")))
        elif kind != b"N":
            seen.append((kind,))
    return seen


def test_a_suspended_histogram_portal_is_one_release_whatever_is_set_between_its_executes(
        settings_proxy: RunningProxy) -> None:
    outcomes = {table: _suspended_histogram(settings_proxy, table) for table in ("st0", *_NEIGHBOURS)}
    assert len({tuple(seen) for seen in outcomes.values()}) == 1, outcomes
    kinds = [seen[0] for seen in outcomes["st0"]]
    assert kinds.count(b"D") == 7 and kinds.count(b"s") == 2 and b"E" not in kinds
