"""What an accepted (or refused) statement shows must not depend on one row beyond the noise.

Found by attacking the outputs of DP statements (post-processing, repeats, extended protocol,
COPY, histograms) on neighbouring tables that differ in one row; each test pins one behaviour:

* comparisons on array (and composite) columns: PostgreSQL looks up the element type's
  equality or ordering only when a row with the literal's shape reaches the comparison, so
  ``pa = '{"(0,0)"}'`` on a ``point[]`` column failed with 42883 (message and all) on a table
  holding such a row and was answered on its neighbour without it;
* the repeat store: two statements with different aggregates can have the same backend SQL
  (``sum(x), avg(x)`` and ``sum(x), sum(x), count(x)``); a repeat must be the same release,
  never an earlier answer with other columns (a malformed row, or XX000 ending the session);
* and neighbouring-table probes of the outer statement, the extended protocol's Describe,
  row-limited Execute and binary results, COPY and histogram narrowing, which must show the
  same shape on both tables.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import psycopg
import pytest

from tests.neighbour_outcome import NUMBER, masked_outcome
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.wire import SYNC, Wire, bind, describe, error_fields, execute, parse

_TABLES = {
    # arr0 has no row, arr1 one row whose arrays have one element: a neighbour of arr0.
    "arr0": [],
    "arr1": ["(1, 1, ARRAY[point(1, 1)], ARRAY['{}'::json], 'a')"],
    # nb0 / nb1: 60 ordinary rows; nb1 has one adversarial row more.
    "nb0": [],
    "nb1": ["(1000, 2147483647, 'NaN', 99999999.99, 'zzz', '5874897-12-31', 'infinity')"],
    # tiny0 / tiny1: 40 rows of zeros; tiny1 has one row more, too close to 0 for a double.
    "tiny0": [],
    "tiny1": ["(1000, 1e-400, 5e-324)"],
}
_NB_ROWS = (
    "SELECT i, i % 50, (i % 7) / 10.0, (i % 13) * 1.25, (ARRAY['a', 'b', 'c'])[1 + i % 3], "
    "DATE '2000-01-01' + (i % 300), TIMESTAMP '2000-01-01' + (i % 300) * interval '1 day' "
    "FROM generate_series(1, 60) i"
)

_POLICY = ATTACK_POLICY_HEAD + """
  public.arr0: &A
    access: protected
    epsilon: 1.0
    columns:
      x: {{bounds: [0, 10]}}
  public.arr1: *A
  public.nb0: &N
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    partitions: 4
    columns:
      x: {{bounds: [0, 100], group_by: true}}
      f: {{bounds: [-1.0, 1.0], group_by: true}}
      n: {{bounds: [0, 100]}}
      t: {{categories: [a, b], group_by: true, other: zz}}
      d: {{bounds: [2000-01-01, 2000-12-31], group_by: true}}
      ts: {{bounds: [2000-01-01, 2000-12-31], group_by: [month, week]}}
  public.nb1: *N
  public.tiny0: &Z
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    partitions: 4
    avg: sample_aggregate
    columns:
      nn: {{bounds: [0, 1000]}}
      f: {{bounds: [-1.0, 1.0]}}
  public.tiny1: *Z
"""


@pytest.fixture(scope="module")
def attack_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS arr0, arr1, nb0, nb1, tiny0, tiny1")
        for name in ("arr0", "arr1"):
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, x int, pa point[], ja json[], s text)")
        for name in ("nb0", "nb1"):
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, x int, f float8, n numeric(10, 2), t text, "
                         "d date, ts timestamp) WITH (autovacuum_enabled = off)")
            conn.execute(f"INSERT INTO {name} {_NB_ROWS}")
        for name in ("tiny0", "tiny1"):
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, nn numeric, f float8)")
            conn.execute(f"INSERT INTO {name} SELECT i, 0, 0 FROM generate_series(1, 40) i")
        for name, rows in _TABLES.items():
            if rows:
                conn.execute(f"INSERT INTO {name} VALUES {', '.join(rows)}")
            conn.execute(f"GRANT SELECT ON {name} TO dpproxy_service")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running




@pytest.mark.parametrize("predicate", [
    "pa = '{\"(0,0)\"}'",
    "pa < '{\"(0,0)\"}'",
    "pa BETWEEN '{\"(0,0)\"}' AND '{\"(9,9)\"}'",
    "ja <> '{\"1\"}'",
    "ja IN ('{\"1\"}', '{}')",
    "pa = pa",
])
def test_a_comparison_on_an_array_column_fails_or_not_whatever_the_rows(
    attack_proxy: RunningProxy, predicate: str
) -> None:
    """point and json have no equality or ordering: PostgreSQL raises 42883 only when it
    compares a row's array of the literal's shape. One row must not decide that."""
    sql = f"SELECT count(*) FROM {{t}} WHERE {predicate}"
    with attack_proxy.connect() as conn:
        empty, neighbour = masked_outcome(conn, sql, "arr0"), masked_outcome(conn, sql, "arr1")
    assert empty == neighbour, f"{sql}: {empty} on the empty table, {neighbour} with one row"


def test_a_repeat_answers_only_the_same_aggregates(attack_proxy: RunningProxy) -> None:
    """``sum(x), avg(x)`` and ``sum(x), sum(x), count(x)`` have the same backend SQL (sum_count
    AVG is a clamped sum and a count); the second is a new release, not the first's two values
    under three columns (a DataRow of the wrong width)."""
    with attack_proxy.connect() as conn:
        first = conn.execute("SELECT sum(x), avg(x) FROM nb0 WHERE id < 40").fetchall()
        assert len(first[0]) == 2
        cursor = conn.execute("SELECT sum(x), sum(x), count(x) FROM nb0 WHERE id < 40")
        row = cursor.fetchone()
        assert row is not None and len(row) == 3 and isinstance(row[2], int)
        # A true repeat is still one: the same aggregates under other names.
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        conn.execute("SELECT sum(x) AS s, avg(x) AS a FROM nb0 WHERE id < 40").fetchall()
        assert "a repeat of an earlier answer" in notices[-1]


def test_a_repeat_reads_its_date_literals_under_the_sessions_date_style(attack_proxy: RunningProxy) -> None:
    """'01/02/2000' is January 2 under MDY and February 1 under DMY: the same text, two
    questions. Only an answer asked under the same settings is a repeat, and a SET earlier in
    the same message counts."""
    sql = "SELECT count(*) FROM nb0 WHERE d >= '01/02/2000'"
    with attack_proxy.connect() as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))

        def repeat(statement: str) -> bool:
            conn.execute(statement)
            return "a repeat of an earlier answer" in notices[-1]

        conn.execute("SET DateStyle = 'ISO, MDY'")
        repeat(sql)
        assert repeat(sql)
        conn.execute("SET DateStyle = 'ISO, DMY'")
        assert not repeat(sql)
        assert repeat(sql)
        conn.execute("SET DateStyle = 'ISO, MDY'")
        assert repeat(sql)
        assert repeat(f"SET DateStyle = 'ISO, DMY'; {sql}")  # the DMY answer
        assert not repeat(f"SET DateStyle = 'ISO, YMD'; {sql.replace('01/02/2000', '2000/01/02')}")
        assert not repeat(f"SET DateStyle = 'ISO, MDY'; {sql.replace('01/02/2000', '2000/01/02')}")


def test_a_grouped_repeat_answers_only_the_same_aggregates(attack_proxy: RunningProxy) -> None:
    """Per cell, AVG is a sum and a count: ``t, avg(x)`` then ``t, sum(x), count(x)`` once
    ended the session with XX000 (the earlier cells had one aggregate, the plan two)."""
    with attack_proxy.connect() as conn:
        conn.execute("SELECT t, avg(x) FROM nb0 WHERE id < 30 GROUP BY t").fetchall()
        rows = conn.execute("SELECT t, sum(x), count(x) FROM nb0 WHERE id < 30 GROUP BY t").fetchall()
        assert [len(row) for row in rows] == [3, 3, 3]
        assert [row[0] for row in rows] == ["a", "b", "zz"]
        rows = conn.execute("SELECT t, avg(x) FROM nb0 WHERE id < 30 GROUP BY t ORDER BY 1").fetchall()
        assert [len(row) for row in rows] == [2, 2, 2]


@pytest.mark.parametrize("sql", [
    "SELECT max(nn) FROM {t} WHERE nn < 1",
    "SELECT min(nn) FROM {t} WHERE nn > 0",
    "SELECT avg(nn) FROM {t}",
    "SELECT avg(f), count(*) FROM {t}",
])
def test_sample_and_aggregate_never_fails_on_values_too_close_to_zero(attack_proxy: RunningProxy, sql: str) -> None:
    """A partition's value is a double: casting a numeric 1e-400 to one, or dividing a sum of
    5e-324 by a count of 2, raised "out of range" on the backend (DP004 for the analyst) on the
    table that holds such a row, and only there."""
    with attack_proxy.connect() as conn:
        base, neighbour = masked_outcome(conn, sql, "tiny0"), masked_outcome(conn, sql, "tiny1")
    assert base == neighbour
    assert base[0] == "answer"


@pytest.mark.parametrize(("type_name", "values"), [
    ("numeric", ["1e-400", "-1e-400", "0", "1e-320", "2e-308"]),
    ("double precision", ["5e-324", "0", "-5e-324", "1e-310"]),
])
def test_partition_values_of_tiny_values_are_computed_without_error(admin: psycopg.Connection, type_name: str,
                                                                  values: list[str]) -> None:
    """Every pair of values in one partition: AVG, MIN and MAX come back (0 where a double
    cannot hold them), never a backend error."""
    from policies.model import ColumnPolicy
    from policies.tables import ColumnInfo
    from rewriter.rewrite import per_partition
    from rewriter.text_bounds import read_through

    column = ColumnInfo("y", 1700 if type_name == "numeric" else 701, -1, 1, ColumnPolicy(bounds=(-1.0, 1.0)))
    parts = read_through(", ".join(per_partition(kind, column) for kind in ("avg", "min", "max")))
    pairs = [(g, v) for g, (a, b) in enumerate((a, b) for a in values for b in values) for v in (a, b)]
    rows = admin.execute(
        f"SELECT g, {parts} FROM (VALUES " + ", ".join(f"({g}, CAST('{v}' AS {type_name}))" for g, v in pairs)
        + ") AS t(g, y) GROUP BY g ORDER BY g"
    ).fetchall()
    assert len(rows) == len(values) ** 2
    for _, avg, low, high in rows:
        assert all(isinstance(v, float) and abs(v) < 1e-300 for v in (avg, low, high))


# Post-processing and histogram shapes whose outcome must not depend on nb1's extra row (NaN,
# the int4 maximum, a date beyond timestamp's range, an undeclared category, infinity).
_NEIGHBOUR_STATEMENTS = [
    "SELECT t, count(*), sum(x), avg(n) FROM {t} GROUP BY t HAVING count(*) >= 0 ORDER BY 2 DESC, 1 LIMIT 2 OFFSET 1",
    "SELECT * FROM (SELECT t AS k, count(*) AS c FROM {t} GROUP BY t) s WHERE c >= 0 ORDER BY k",
    "SELECT width_bucket(f, -1, 1, 4) AS b, count(*), avg(f) FROM {t} GROUP BY 1",
    "SELECT CAST(date_trunc('month', d) AS date) AS m, count(*) FROM {t} WHERE d >= '2000-03-10' GROUP BY 1",
    "SELECT date_trunc('week', ts) AS w, count(*) FROM {t} WHERE ts BETWEEN '2000-02-01' AND '2000-03-01' GROUP BY 1",
    "SELECT x, count(*) FROM {t} WHERE x < 5 GROUP BY x ORDER BY count(*) DESC, x LIMIT 3",
    "SELECT sum(n)::text AS s, round(avg(n), 1), max(x) - min(x) AS spread, count(*) / 0.5 FROM {t}",
    "SELECT max(c) FROM (SELECT count(*) AS c, avg(f) AS a FROM {t} WHERE t = 'a') AS v LIMIT 1000",
    "SELECT count(*)::int2 / 0 FROM {t}",
]


@pytest.mark.parametrize("sql", _NEIGHBOUR_STATEMENTS)
def test_post_processing_and_histograms_have_the_same_shape_on_neighbours(attack_proxy: RunningProxy, sql: str) -> None:
    with attack_proxy.connect() as conn:
        base, neighbour = masked_outcome(conn, sql, "nb0"), masked_outcome(conn, sql, "nb1")
    assert base == neighbour
    assert base[0] == "answer" or base[1] == "22012"


def _extended(proxy: RunningProxy, sql: str, params: tuple[bytes, ...], formats: tuple[int, ...], limit: int) -> list[object]:
    """Parse, Describe statement, Bind, Describe portal, three row-limited Executes, Sync:
    every message's kind and what it shows besides the noised values."""
    wire = Wire(proxy.host, proxy.port)
    try:
        wire.send(parse("s", sql, (23,)), describe(b"S", "s"), bind("p", "s", params, (1,), formats),
                  describe(b"P", "p"), execute("p", limit), execute("p", limit), execute("p", limit), SYNC)
        shown: list[object] = []
        for kind, body in wire.read_until(b"Z"):
            if kind == b"D":
                shown.append((kind, struct.unpack("!h", body[:2])[0]))
            elif kind in (b"N", b"E"):
                fields = error_fields(body)
                shown.append((kind, fields.get(b"C"), NUMBER.sub("#", (fields.get(b"M") or b"").decode())))
            elif kind == b"d":
                shown.append((kind, body.count(b"\t")))
            else:
                shown.append((kind, body))
        return shown
    finally:
        wire.close()


@pytest.mark.parametrize(("sql", "formats"), [
    ("SELECT t, count(*), avg(n) FROM {t} WHERE x > $1 GROUP BY t", (0, 1, 1)),
    ("SELECT sum(n) * 2 AS s, max(x), avg(f) FROM {t} WHERE x > $1", (1,)),
    ("COPY (SELECT t, sum(n) FROM {t} WHERE x > $1 GROUP BY t) TO STDOUT", ()),
])
def test_extended_protocol_shows_the_same_messages_on_neighbours(attack_proxy: RunningProxy, sql: str,
                                                                 formats: tuple[int, ...]) -> None:
    """Describe before Bind, binary parameters and results, Execute with a row limit (portal
    suspension) and Executes past the end: the same messages on both tables."""
    param = (struct.pack("!i", 3),)
    base = _extended(attack_proxy, sql.replace("{t}", "nb0"), param, formats, 1)
    neighbour = _extended(attack_proxy, sql.replace("{t}", "nb1"), param, formats, 1)
    assert [m for m in base if m[0] != b"T"] == [m for m in neighbour if m[0] != b"T"]
    assert [bytes(m[1]).replace(b"nb0", b"T") for m in base if m[0] == b"T"] == [
        bytes(m[1]).replace(b"nb1", b"T") for m in neighbour if m[0] == b"T"]
    assert not any(m[0] == b"E" for m in base), base



@pytest.mark.parametrize("sql", [
    "SELECT CAST(m AS float8) FROM (SELECT MODE() WITHIN GROUP (ORDER BY t) AS m FROM {t}) AS released",
    "WITH released AS (SELECT count(*) AS c, MODE() WITHIN GROUP (ORDER BY t) AS m FROM {t}) SELECT c, m::int FROM released",
    "SELECT t, CAST(MODE() WITHIN GROUP (ORDER BY t) AS int) FROM {t} GROUP BY t",
    # a filter on the aggregates kept no row of the trial (NULL aggregates): tried without it
    "WITH released AS (SELECT MODE() WITHIN GROUP (ORDER BY t) AS m FROM {t} HAVING count(*) > 0) "
    "SELECT CAST(m AS float8) FROM released",
    "SELECT CAST(m AS int) FROM (SELECT MODE() WITHIN GROUP (ORDER BY t) AS m, count(*) AS c FROM {t}) AS r WHERE c > 0",
    "SELECT CAST(t AS int), count(*) FROM {t} GROUP BY t HAVING count(*) > 0",
    "SELECT CAST(t AS int) FROM {t} GROUP BY t HAVING avg(x) > 0 ORDER BY 1 LIMIT 1",
    # a conjunct over the keys alone stays in the trial; one that reads an aggregate does not
    "SELECT CAST(t AS int), count(*) FROM {t} GROUP BY t HAVING t = 'a' AND count(*) > 0",
    "SELECT CAST(t AS int), count(*) FROM {t} GROUP BY t HAVING t = 'a' OR count(*) > 0",
    "SELECT CAST(t AS int), count(*) FROM {t} GROUP BY t HAVING coalesce(count(*), 0) > 0",
    "SELECT CAST(t AS int), c FROM (SELECT t, count(*) AS c FROM {t} GROUP BY t) AS s WHERE t = 'a' AND c > 0",
])
def test_post_processing_that_fails_on_every_label_or_key_is_refused_before_the_charge(
        attack_proxy: RunningProxy, sql: str) -> None:
    """Found by the neighbour fuzzer: the trial run of the outer statement gave a MODE NULL, so a
    cast of its label failed only after the charge, with the label the noise picked in the
    message (differing by chance between neighbours). Every label a MODE may name is tried
    first; and the trial runs without the filters on aggregates (HAVING, an outer WHERE, LIMIT),
    which over NULL aggregates kept no row to fail on, for a key's label as for a MODE's."""
    with attack_proxy.connect() as conn:
        before = spent_epsilon(conn)
        base, neighbour = masked_outcome(conn, sql, "nb0"), masked_outcome(conn, sql, "nb1")
        assert spent_epsilon(conn) == before
    assert base == neighbour
    assert base[:2] == ("error", "22P02")


def test_post_processing_of_a_release_another_statement_made_is_tried_as_a_fresh_one(
        attack_proxy: RunningProxy) -> None:
    """Found by the neighbour fuzzer (seed 53): a statement whose release an earlier statement had
    made was answered as a repeat without the trial, so its error named the label the noise had
    picked, where on a table with no such earlier release the trial named the first failing label."""
    sql = "WITH released AS (SELECT MODE() WITHIN GROUP (ORDER BY t) AS a FROM {t}) SELECT CAST(a AS float8) FROM released"
    with attack_proxy.connect() as conn:
        conn.execute("SELECT MODE() WITHIN GROUP (ORDER BY t) AS a FROM nb0").fetchall()  # stored for repeats
        before = spent_epsilon(conn)
        base, neighbour = masked_outcome(conn, sql, "nb0"), masked_outcome(conn, sql, "nb1")
        assert spent_epsilon(conn) == before
    assert base == neighbour, (base, neighbour)
    assert base[:2] == ("error", "22P02")


@pytest.mark.parametrize("sql", [
    "SELECT 100 / x, count(n) FROM {t} GROUP BY x HAVING x > 0",
    "SELECT 100 / x AS y, count(n) FROM {t} GROUP BY x HAVING x > 0 AND count(n) > -1000 ORDER BY y LIMIT 500",
    "SELECT 100 / x, c FROM (SELECT x, count(n) AS c FROM {t} GROUP BY x) AS s WHERE x > 0",
    "SELECT CAST(t AS int), count(n) FROM {t} GROUP BY t HAVING t NOT IN ('a', 'b', 'zz')",
])
def test_post_processing_guarded_by_a_filter_on_the_keys_is_answered_as_postgresql_does(
        attack_proxy: RunningProxy, sql: str) -> None:
    """The trial without filters dropped a HAVING (or outer WHERE) on the keys too, so an output
    it keeps from a failing key (``100 / x`` for x = 0) failed the statement with 22012, which
    PostgreSQL answers: a conjunct over the keys alone drops the same cells whatever the noise.
    (``count(n)``: a release of its own, not a repeat of another test's.)"""
    with attack_proxy.connect() as conn:
        outcomes = [masked_outcome(conn, sql, table) for table in ("nb0", "nb1")]
    assert outcomes[0][0] != "error", outcomes[0]
    assert outcomes[0] == outcomes[1], outcomes  # the same cells and form on neighbouring tables

