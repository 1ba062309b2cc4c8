"""Row-independent WHERE expressions are folded before the charge; LIKE takes a bound pattern (issue 18).

Superset's time filter, ``now() - interval '1 year'``, ``current_date - 30`` are evaluated by
dpproxy in one round trip that reads no table, cast to the column's type, and inlined as typed
literals; their errors are PostgreSQL's and charge nothing. A LIKE pattern bound as a parameter
is checked at Bind as strictly as a literal one. Real PostgreSQL, real dpproxy.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import psycopg
import pytest
from conftest import TEST_POLICY, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from wire import SYNC, Wire, bind, describe, error_fields, execute, parse

from policies.errors import Refusal
from policies.model import TablePolicy
from policies.tables import ColumnInfo, Relation
from proxy.demo.embedded import SERVICE_ROLE
from proxy.dp.folding import _folded
from proxy.wire.encodings import UTF8
from rewriter.constants import fold_query
from rewriter.dp_query import plan_aggregate_query
from rewriter.text_bounds import read_in_place

_TABLES = ("fold_visits", "fold_empty")
_POLICY = TEST_POLICY.replace("repeats: {{enabled: false}}", "repeats: {{enabled: true}}") + "".join(
    f"""  public.{table}:
    access: protected
    epsilon: 1.0
    columns:
      duration: {{{{bounds: [0, 600]}}}}
"""
    for table in _TABLES
)
SUPERSET_FILTER = (
    "visited_at >= TO_TIMESTAMP('2024-01-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US') "
    "AND visited_at < TO_TIMESTAMP('2025-01-01 00:00:00.000000', 'YYYY-MM-DD HH24:MI:SS.US')"
)


@pytest.fixture(scope="module")
def fold_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """fold_visits: 300 visits in 2023-2025 and one at timestamp's upper limit; fold_empty: none."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for table in _TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"CREATE TABLE {table} (id int, name text, visited_at timestamp, visit_date date, duration int, "
                         "visit_time time, visit_timetz timetz)")
            conn.execute(f"GRANT SELECT ON {table} TO {SERVICE_ROLE}")
        conn.execute(
            "INSERT INTO fold_visits SELECT i, 'v' || i, TIMESTAMP '2023-01-01' + i * INTERVAL '3 days', "
            "DATE '2023-01-01' + i * 3, i % 120 FROM generate_series(1, 300) i"
        )
        conn.execute("INSERT INTO fold_visits VALUES (0, 'edge\\', '294276-12-31 23:59:59', '5874897-12-31', 1)")
        # every 4 minutes of the day, in the session's zone and in +05
        conn.execute("UPDATE fold_visits SET visit_time = TIME '00:00' + id * INTERVAL '4 minutes', "
                     "visit_timetz = CAST(CAST(TIME '00:00' + id * INTERVAL '4 minutes' AS text) || '+05' AS timetz)")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _count(conn: psycopg.Connection, where: str, params: tuple[object, ...] | None = None, table: str = "fold_visits") -> float:
    row = conn.execute(f"SELECT COUNT(*) AS count FROM {table} WHERE {where}", params).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return float(row[0])


@pytest.mark.parametrize(
    "where, exact",
    [
        (SUPERSET_FILTER, "visited_at >= '2024-01-01' AND visited_at < '2025-01-01'"),
        ("visited_at >= now() - interval '1 year'", None),
        ("visit_date >= DATE '2024-01-01' + 7", "visit_date >= '2024-01-08'"),
        ("duration > 50 + 1", "duration > 51"),
        ("visited_at >= CAST('2024-01-01' AS date)", "visited_at >= '2024-01-01'"),
        ("visit_date < TO_DATE('2024-01-01', 'YYYY-MM-DD')", "visit_date < '2024-01-01'"),
        ("visit_date > current_date - 30", None),
        ("visited_at < date_trunc('month', now())", None),
        ("visited_at BETWEEN TIMESTAMP '2024-01-01' + interval '1 day' AND now()", None),
        ("visit_time < current_time", None),
        ("visit_time >= localtime - interval '2 hours'", None),
        ("visit_timetz > current_time", None),
        ("visit_time < current_time(0) AND visit_timetz <= localtime", None),
    ],
)
def test_bi_tool_time_filters_are_answered(fold_proxy: RunningProxy, admin, where: str, exact: str | None) -> None:
    with fold_proxy.connect() as conn:
        answer = _count(conn, where)
    truth = admin.execute(f"SELECT count(*) FROM fold_visits WHERE {exact or where}").fetchone()[0]
    assert abs(answer - truth) < 60  # Laplace noise of scale 1: a wrong filter is off by far more


def test_the_superset_time_filter_is_answered_with_bound_parameters(fold_proxy: RunningProxy, admin) -> None:
    """Extended protocol: planned at Parse, folded at each execution with that execution's values."""
    where = "visited_at >= TO_TIMESTAMP(%s, 'YYYY-MM-DD') AND visited_at < TO_TIMESTAMP(%s, 'YYYY-MM-DD')"
    with psycopg.connect(fold_proxy.dsn(), autocommit=True) as conn:
        answers = [_count(conn, where, (lo, hi)) for lo, hi in (("2024-01-01", "2025-01-01"), ("2023-01-01", "2023-02-01"))]
    assert abs(answers[0] - 122) < 60 and abs(answers[1] - 10) < 60


@pytest.mark.parametrize(
    "predicate",
    [
        "d >= {t}", "d > {t}", "d <= {t}", "d < {t}", "d = {t}", "NOT (d = {t})", "d <> {t}", "NOT (d <> {t})", "{t} < d",
        "d >= TIMESTAMP '2024-01-05' + interval '0 days'", "d = TIMESTAMP '2024-01-05' + interval '0 days'",
        "a > 40.5 + 0", "a >= 40.5 + 0", "a = 41.0 + 0", "a < 81 / 2.0", "a <= 81 / 2.0", "a <> 40.5 + 0",
        "f >= 0.1 + 0", "f < 0.1 + 0", "f = 0.1 + 0", "ts >= to_timestamp('2024-01-05 06:00', 'YYYY-MM-DD HH24:MI')",
        "ts < TIMESTAMP '2024-01-05' + interval '1 microsecond'", "d >= NULL::date + 1", "a IN (40 + 1, 2 * 1)",
        "a NOT BETWEEN 40 + 0.5 AND 42 - 0.5", "d >= now()", "d < current_date + 1",
    ],
)
def test_a_folded_comparison_selects_the_rows_postgresql_would(admin, predicate: str) -> None:
    """Rounding to the column's type is compensated: same rows, NULLs included, as the unfolded predicate."""
    admin.execute("CREATE TEMP TABLE IF NOT EXISTS fold_probe (d date, a integer, f double precision, ts timestamp)")
    admin.execute("TRUNCATE fold_probe")
    admin.execute(
        "INSERT INTO fold_probe VALUES ('2024-01-04', 40, 0.1, '2024-01-05 05:59:59.999999'), "
        "('2024-01-05', 41, 0.1000000000000001, '2024-01-05 06:00'), ('2024-01-06', 2, 0.09999999999999999, "
        "'2024-01-05'), (NULL, NULL, NULL, NULL), ('infinity', 42, 'NaN', 'infinity'), ('5874897-12-31', 39, 1, "
        "'294276-12-31 23:59:59')"
    )
    columns = {
        "d": ColumnInfo("d", 1082, -1, 1, None), "a": ColumnInfo("a", 23, -1, 2, None),
        "f": ColumnInfo("f", 701, -1, 3, None), "ts": ColumnInfo("ts", 1114, -1, 4, None),
    }
    table = Relation(1, "pg_temp", "fold_probe", TablePolicy(epsilon=1.0), columns)
    predicate = predicate.replace("{t}", "(TIMESTAMP '2024-01-05 12:00' + interval '0 s')")  # rounded to a date
    plan = plan_aggregate_query(f"SELECT COUNT(*) FROM fold_probe WHERE {predicate}", table)
    assert plan.folding is not None and plan.folding.folds
    values = [None if v is None else str(v).encode() if not isinstance(v, bool) else (b"t" if v else b"f")
              for v in admin.execute(fold_query(plan.folding.folds)).fetchone()]
    folded = read_in_place(_folded(plan.folding, values, UTF8), table)
    expected = admin.execute(f"SELECT array_agg(ctid ORDER BY ctid) FROM fold_probe WHERE {predicate}").fetchone()
    actual = admin.execute(f"SELECT array_agg(ctid ORDER BY ctid) FROM fold_probe WHERE {folded}").fetchone()
    assert actual == expected, folded


def test_the_column_is_never_converted_whatever_the_timezone(fold_proxy: RunningProxy, admin) -> None:
    """A timestamp at the type's limit with TimeZone far west: converting the column would fail for that row only."""
    with pytest.raises(psycopg.errors.DatetimeFieldOverflow):
        admin.execute("SET TimeZone = 'Etc/GMT+12'")
        admin.execute("SELECT count(*) FROM fold_visits WHERE visited_at::timestamptz >= to_timestamp('2024', 'YYYY')")
    outcomes = set()
    with fold_proxy.connect() as conn:
        conn.execute("SET TimeZone = 'Etc/GMT+12'")
        for table in _TABLES:
            for where in ("visited_at >= to_timestamp('2024', 'YYYY')", "visit_date >= now()",
                          "visited_at < to_timestamp('2024', 'YYYY') + interval '1 day'"):
                _count(conn, where, table=table)
                outcomes.add("answer")
    assert outcomes == {"answer"}


@pytest.mark.parametrize(
    "where, sqlstate",
    [
        ("visited_at >= to_timestamp('2024-13-45', 'YYYY-MM-DD')", "22008"),
        ("visited_at >= CAST('not a date' AS date) + 1", "22007"),
        ("duration > 1 / 0", "22012"),
        ("visit_date >= TIMESTAMP '2024-01-01' + interval '300000 years'", "22008"),
    ],
)
def test_an_erroring_constant_is_postgresqls_error_before_any_charge(fold_proxy: RunningProxy, where: str, sqlstate: str) -> None:
    """The same error on an empty table and a full one, and nothing charged."""
    with fold_proxy.connect() as conn:
        before = spent_epsilon(conn)
        states = set()
        for table in _TABLES:
            with pytest.raises(psycopg.Error) as failed:
                _count(conn, where, table=table)
            states.add(failed.value.sqlstate)
        assert states == {sqlstate}
        assert spent_epsilon(conn) == before


@pytest.mark.parametrize("where", ["visited_at > random()", "duration > length(name)", "visited_at > clock_timestamp()",
                                   "visited_at > public.now()", "duration > (SELECT 1)", "name = 'a' || 'b'",
                                   "duration > pg_catalog.pg_relation_size('fold_visits')"])
def test_what_is_not_foldable_is_refused_from_the_text(fold_proxy: RunningProxy, where: str) -> None:
    with fold_proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as refused:
            _count(conn, where)
        assert refused.value.sqlstate == "DP001"
        assert refused.value.diag.message_hint


def test_a_repeat_is_recognised_by_the_folded_values(fold_proxy: RunningProxy) -> None:
    """Two now()-based queries at different moments are different queries; a literal one repeats."""
    with fold_proxy.connect() as conn:
        start = spent_epsilon(conn)
        _count(conn, "visited_at >= now() - interval '1 year'")
        _count(conn, "visited_at >= now() - interval '1 year'")
        assert spent_epsilon(conn) == pytest.approx(start + 2.0)
        _count(conn, "visit_date >= DATE '2024-01-01' + 8")
        _count(conn, "visit_date >= DATE '2024-01-01' + 8")
        assert spent_epsilon(conn) == pytest.approx(start + 3.0)


def test_describe_does_not_fold(fold_proxy: RunningProxy) -> None:
    """A statement whose constant fails still describes (nothing is evaluated), and costs nothing."""
    sql = "SELECT COUNT(*) FROM fold_visits WHERE visited_at >= to_timestamp($1, 'YYYY-MM-DD') AND name LIKE $2"
    plain = fold_proxy.dsn(user="plain", password="plain")
    with psycopg.connect(plain, autocommit=True) as conn:
        before = spent_epsilon(conn)
    wire = Wire(fold_proxy.host, fold_proxy.port)
    try:
        wire.send(parse("s", sql), describe(b"S", "s"), SYNC)
        replies = dict(wire.read_until(b"Z"))
        assert b"E" not in replies, error_fields(replies[b"E"])
        count = struct.unpack("!h", replies[b"t"][:2])[0]
        assert struct.unpack(f"!{count}I", replies[b"t"][2:]) == (25, 25)
        wire.send(bind("", "s", (b"2024-13-45", b"v%")), execute(""), SYNC)
        replies = dict(wire.read_until(b"Z"))
        assert error_fields(replies[b"E"])[b"C"] == b"22008"  # the fold fails at execution, before the charge
    finally:
        wire.close()
    with psycopg.connect(plain, autocommit=True) as conn:
        assert spent_epsilon(conn) == before


@pytest.mark.parametrize("pattern", ["v1%", "%\\\\", "v\\_", "", "edge\\\\"])
def test_a_bound_like_pattern_is_answered(fold_proxy: RunningProxy, pattern: str) -> None:
    with psycopg.connect(fold_proxy.dsn(), autocommit=True) as conn:
        _count(conn, "name LIKE %s", (pattern,))
        _count(conn, "name NOT ILIKE %s AND duration > %s", (pattern, 3))


@pytest.mark.parametrize("pattern", ["\\", "abc\\", "a%\\"])
def test_a_bound_like_pattern_ending_in_the_escape_is_refused_before_the_charge(fold_proxy: RunningProxy, pattern: str) -> None:
    """Refused whatever the rows (an empty table too), with the literal's hint, nothing charged."""
    with psycopg.connect(fold_proxy.dsn(), autocommit=True) as conn:
        before = spent_epsilon(conn)
        for table in _TABLES:
            with pytest.raises(psycopg.Error) as refused:
                _count(conn, "name LIKE %s", (pattern,), table=table)
            assert refused.value.sqlstate == "DP001"
            assert "escape" in str(refused.value) and "backslash" in (refused.value.diag.message_hint or "")
        assert spent_epsilon(conn) == before


@pytest.mark.parametrize("pattern", ["%" + "a" * 65, "%v%" + "_" * 65 + "%", "%" + "\\%" * 65])
def test_a_bound_like_pattern_with_a_long_part_after_a_percent_is_refused_before_the_charge(
    fold_proxy: RunningProxy, pattern: str
) -> None:
    """Checked as a literal pattern is (rewriter.like_patterns.costly_pattern_reason), when it is
    bound: the matcher's time on one long value grows with that part."""
    with psycopg.connect(fold_proxy.dsn(), autocommit=True) as conn:
        before = spent_epsilon(conn)
        for table in _TABLES:
            for where in ("name LIKE %s", "name NOT ILIKE %s AND duration > 3"):
                with pytest.raises(psycopg.Error) as refused:
                    _count(conn, where, (pattern,), table=table)
                assert refused.value.sqlstate == "DP001"
                assert "after a %" in str(refused.value) and "at most 64" in (refused.value.diag.message_hint or "")
        assert spent_epsilon(conn) == before
        _count(conn, "name LIKE %s", (pattern[:65],))


@pytest.mark.parametrize("where, params, refused", [
    ("name ILIKE %s", ("v" * 4096,), False),
    ("name ILIKE %s", ("v" * 4097,), True),
    ("name ILIKE %s OR name ILIKE %s", ("v" * 2048, "v" * 2049), True),
    ("name ILIKE %s OR name NOT ILIKE '" + "v" * 3000 + "'", ("v" * 1097,), True),  # literal and parameter
    ("name LIKE %s", ("v" * 20_000,), False),  # LIKE lowers nothing
])
def test_bound_ilike_patterns_count_toward_the_statements_limit(
    fold_proxy: RunningProxy, where: str, params: tuple[str, ...], refused: bool
) -> None:
    """Bound ILIKE patterns are lowered for each row as literal ones are: their characters are added to
    the literal patterns' when they are bound, and refused over the limit before the charge."""
    with psycopg.connect(fold_proxy.dsn(), autocommit=True) as conn:
        before = spent_epsilon(conn)
        for table in _TABLES:
            if not refused:
                _count(conn, where, params, table=table)
                continue
            with pytest.raises(psycopg.Error) as error:
                _count(conn, where, params, table=table)
            assert error.value.sqlstate == "DP001"
            assert "lowers an ILIKE pattern" in (error.value.diag.message_hint or "")
        if refused:
            assert spent_epsilon(conn) == before


def test_a_like_pattern_parameter_must_be_text(fold_proxy: RunningProxy) -> None:
    with psycopg.connect(fold_proxy.dsn(), autocommit=True) as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as refused:
            _count(conn, "name LIKE %s", (b"abc\\\\",))  # sent as bytea
        assert refused.value.sqlstate == "DP001"
        assert spent_epsilon(conn) == before


def test_a_like_pattern_parameter_that_is_not_valid_in_the_client_encoding_is_refused_before_the_charge(
    fold_proxy: RunningProxy,
) -> None:
    # Read with replacement characters it looked valid, was charged, and the backend then refused
    # its bytes (22021) for a reason no row decides.
    with psycopg.connect(fold_proxy.dsn(), autocommit=True) as conn:
        before = spent_epsilon(conn)
        result = conn.pgconn.exec_params(b"SELECT COUNT(*) FROM fold_visits WHERE name LIKE $1", [b"ab\xff%"], [25])
        assert result.error_field(psycopg.pq.DiagnosticField.SQLSTATE) == b"DP001"
        assert spent_epsilon(conn) == before


def test_the_pattern_rule_of_a_parameter_is_the_literal_rule() -> None:
    columns = {"name": ColumnInfo("name", 25, -1, 1, None)}
    table = Relation(1, "public", "t", TablePolicy(epsilon=1.0), columns)
    plan = plan_aggregate_query("SELECT COUNT(*) FROM t WHERE name LIKE $1 OR name ILIKE $2", table)
    assert plan.folding is not None and plan.folding.like_parameters == (1, 2) and not plan.folding.folds
    with pytest.raises(Refusal):
        plan_aggregate_query("SELECT COUNT(*) FROM t WHERE name LIKE $1 || 'x'", table)


@pytest.mark.parametrize("where", ["duration > %s AND name <> ''", "name LIKE %s AND name <> 'it''s' AND name <> ''"])
def test_a_parameter_before_an_empty_string_is_analysed(fold_proxy: RunningProxy, where: str) -> None:
    """sqlglot's tokenizer failed on "$1 ... ''"; parameters now reach it as placeholders."""
    with psycopg.connect(fold_proxy.dsn(), autocommit=True) as conn:
        _count(conn, where, (3,) if "duration" in where else ("v%",))


def test_a_folded_value_takes_the_columns_own_type() -> None:
    """The rows are compared with a value of their own type (integers: numeric), never converted to the value's."""
    columns = {
        "d": ColumnInfo("d", 1082, -1, 1, None), "ts": ColumnInfo("ts", 1114, -1, 2, None),
        "tz": ColumnInfo("tz", 1184, -1, 3, None), "a": ColumnInfo("a", 23, -1, 4, None),
        "f": ColumnInfo("f", 700, -1, 5, None), "n": ColumnInfo("n", 1700, -1, 6, None),
    }
    table = Relation(1, "public", "t", TablePolicy(epsilon=1.0), columns)
    where = ("d >= now() AND ts >= to_timestamp(0) AND tz >= localtimestamp AND a > 1 + 0.5 AND f < 1 / 3.0 "
             "AND n = 2 * 2")
    plan = plan_aggregate_query(f"SELECT COUNT(*) FROM t WHERE {where}", table)
    assert plan.folding is not None
    assert [fold.type_name for fold in plan.folding.folds] == ["date", "timestamp", "timestamptz", "numeric", "float8", "numeric"]


@pytest.mark.parametrize("zone", ["UTC", "Pacific/Kiritimati", "Etc/GMT+12", "America/St_Johns", "<-1559>+15:59"])
def test_current_time_compared_with_a_time_column_is_folded_to_the_rows_postgresql_keeps(
        fold_proxy: RunningProxy, admin, zone: str) -> None:
    """``t < current_time`` is PostgreSQL's ``t::timetz < current_time``, both in the session's offset of
    today: folded to a ``time`` (and a ``timetz`` column's ``localtime`` to a ``timetz``), it keeps the
    same rows, in one transaction (one ``current_time``) under each zone, its offset ±15:59 included.
    sqlglot wrote ``current_time`` back as ``CURRENT_TIME()``, which dpproxy refused as unreadable, and
    a time column took no folded value."""
    columns = {"visit_time": ColumnInfo("visit_time", 1083, -1, 1, None),
               "visit_timetz": ColumnInfo("visit_timetz", 1266, -1, 2, None)}
    relation = Relation(1, "public", "fold_visits", TablePolicy(epsilon=1.0), columns)
    with admin.transaction():
        admin.execute(f"SET LOCAL TimeZone = '{zone}'")
        for where in ("visit_time < current_time", "visit_time >= current_time", "visit_time = current_time",
                      "visit_timetz > localtime", "visit_timetz < current_time"):
            plan = plan_aggregate_query(f"SELECT count(*) FROM fold_visits WHERE {where}", relation)
            assert plan.folding is not None and len(plan.folding.folds) == 1, where
            (fold,) = plan.folding.folds
            value = admin.execute(f"SELECT CAST(({fold.expression}) AS pg_catalog.{fold.type_name})::text").fetchone()
            folded = admin.execute(f"SELECT count(*) FROM fold_visits WHERE {read_in_place(fold.column_sql, relation)} {fold.op} %s::{fold.type_name}",
                                   value).fetchone()
            assert folded == admin.execute(f"SELECT count(*) FROM fold_visits WHERE {where}").fetchone(), (where, value)
