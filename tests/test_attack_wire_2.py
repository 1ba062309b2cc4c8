"""Attacks on the wire protocol with raw protocol messages: result formats, pipelines,
portals, COPY and the pool.

Pinned here, each found as a hole:

* dpproxy converts to binary itself the columns it has as text (a DP answer's, and any column
  asked in binary when others are asked in text), a date or time only from DateStyle ISO
  text: a DP answer is never charged and then lost to a conversion that fails (XX000, the
  session ended), whatever DateStyle the session set and whatever year post-processing
  reaches; a passthrough conversion that cannot be made is a clean 0A000;
* after an extended-protocol error a simple Query (and a FunctionCall) up to Sync is ignored,
  as PostgreSQL ignores it, never run and charged;
* Describe of a portal bound with the wrong number of result formats fails the statement,
  not the session; Describe of a COPY portal is NoData and charges nothing;
* a portal ends with its transaction block, and hands out nothing in a failed one;
* a client that never sends Sync keeps no pooled backend connection from the others.

And probes that held: a bad binary parameter fails alike on neighbouring tables, before the
charge.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator

import psycopg
import pytest

from proxy.wire.binary import binary_from_text
from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from tests.wire import SYNC, Wire, bind, cstr, data_row_values, describe, error_fields, execute, message, parse

_POLICY = ATTACK_POLICY_HEAD + """
  public.aw0: &W
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      x: {{bounds: [0, 100], group_by: true}}
      n: {{bounds: [0, 100]}}
      f: {{bounds: [-1.0, 1.0]}}
      t: {{categories: [a, b], group_by: true, other: zz}}
      d: {{bounds: [2000-01-01, 2000-12-31], group_by: true}}
      ts: {{bounds: [2000-01-01, 2000-12-31], group_by: [month]}}
  public.aw1: *W
"""


@pytest.fixture(scope="module")
def wproxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS aw0, aw1")
        for name in ("aw0", "aw1"):
            conn.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, x int, n numeric(10, 2), f float8, t text, "
                         "d date, ts timestamp)")
            conn.execute(f"INSERT INTO {name} SELECT i, i % 50, (i % 13) * 1.25, (i % 7) / 10.0, "
                         "(ARRAY['a', 'b'])[1 + i % 2], DATE '2000-01-01' + (i % 300), "
                         "TIMESTAMP '2000-01-01' + (i % 300) * interval '1 day' FROM generate_series(1, 60) i")
            conn.execute(f"GRANT SELECT ON {name} TO dpproxy_service")
        conn.execute("INSERT INTO aw1 VALUES (1000, 2147483647, 99999999.99, 'NaN', 'zzz', '5874897-12-31', 'infinity')")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _codes(replies: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [error_fields(body)[b"C"] for kind, body in replies if kind == b"E"]


def _query(sql: str) -> bytes:
    return message(b"Q", cstr(sql))


def _extended(wire: Wire, sql: str, formats: tuple[int, ...]) -> list[tuple[bytes, bytes]]:
    wire.send(parse("", sql), bind("", "", (), (), formats), execute(""), SYNC)
    return wire.read_until(b"Z")


def _plain(proxy: RunningProxy) -> psycopg.Connection:
    return psycopg.connect(proxy.dsn(user="plain", password="plain"), autocommit=True)


@pytest.mark.parametrize("sql", [
    "SELECT date_trunc('month', ts) AS k, count(*) FROM {t} WHERE x > 3 GROUP BY 1",
    "SELECT d, count(*) FROM {t} WHERE x > 4 GROUP BY d ORDER BY 2 DESC LIMIT 2",
    "SELECT k + 1, c FROM (SELECT d AS k, count(*) AS c FROM {t} WHERE x > 5 GROUP BY d) s",
])
@pytest.mark.parametrize("style", ["German", "SQL, DMY", "Postgres, MDY"])
def test_a_binary_date_under_another_datestyle_is_refused_before_the_charge(wproxy: RunningProxy, sql: str,
                                                                            style: str) -> None:
    """A date column asked in binary next to one in text: dpproxy converted the German text
    after the charge, failed, and ended the session with XX000; ε spent for nothing."""
    with _plain(wproxy) as conn:
        for table in ("aw0", "aw1"):
            wire = Wire(wproxy.host, wproxy.port)
            wire.send(_query(f"SET DateStyle = '{style}'"))
            wire.read_until(b"Z")
            before = spent_epsilon(conn)
            replies = _extended(wire, sql.replace("{t}", table), (1, 0))
            assert spent_epsilon(conn) == before
            errors = [error_fields(body) for kind, body in replies if kind == b"E"]
            assert [e[b"C"] for e in errors] == [b"0A000"] and errors[0][b"S"] == b"ERROR"
            assert b"DateStyle" in errors[0][b"H"] and replies[-1] == (b"Z", b"I")
            # Text, or binary for every column (the backend's own), is answered.
            for formats in ((0,), (1,)) if "ORDER" in sql or "k + 1" in sql else ((0,),):
                assert _codes(_extended(wire, sql.replace("{t}", table), formats)) == []
            wire.close()


@pytest.mark.parametrize("sql", [
    "SELECT k + 3000000, c FROM (SELECT d AS k, count(*) AS c FROM {t} WHERE x > 6 GROUP BY d) s",
    "SELECT k - 800000, c FROM (SELECT d AS k, count(*) AS c FROM {t} WHERE x > 7 GROUP BY d) s",
    "SELECT k + interval '9000 years', c FROM (SELECT date_trunc('month', ts) AS k, count(*) AS c FROM {t} "
    "WHERE x > 8 GROUP BY 1) s",
])
def test_post_processing_past_year_9999_or_before_year_1_converts_to_binary(wproxy: RunningProxy, sql: str) -> None:
    """ISO prints such years as 10213-… and 0191-… BC, which Python's date cannot hold: the
    conversion failed after the charge and ended the session (XX000)."""
    with _plain(wproxy) as conn:
        wire = Wire(wproxy.host, wproxy.port)
        before = spent_epsilon(conn)
        replies = _extended(wire, sql.replace("{t}", "aw0"), (1, 0))
        assert _codes(replies) == [] and spent_epsilon(conn) == before + 1
        rows = [data_row_values(body) for kind, body in replies if kind == b"D"]
        assert rows and all(len(row[0] or b"") in (4, 8) for row in rows)
        wire.close()


@pytest.mark.parametrize(("type_name", "text"), [
    ("date", "10000-01-01"), ("date", "5874897-12-31"), ("date", "0044-03-15 BC"), ("date", "4713-11-24 BC"),
    ("timestamp", "10000-01-01 00:00:00.5"), ("timestamp", "0001-01-01 00:00:00 BC"),
    ("timestamp", "294276-12-31 23:59:59.999999"), ("timestamptz", "1900-01-01 00:00:00-04:56:02"),
    ("timestamptz", "10000-06-30 12:00:00+05:30"), ("timestamptz", "0100-02-28 23:00:00+01 BC"),
])
def test_dates_and_times_outside_python_s_range_convert_like_postgres(admin: psycopg.Connection, type_name: str,
                                                                      text: str) -> None:
    send = {"date": "date_send", "timestamp": "timestamp_send", "timestamptz": "timestamptz_send"}[type_name]
    admin.execute("SET TimeZone = 'America/New_York'")
    admin.execute("SET DateStyle = 'ISO, MDY'")
    oid, out, sent = admin.execute(f"SELECT pg_typeof(%s::{type_name})::oid, %s::{type_name}::text, "
                                   f"{send}(%s::{type_name})", (text, text, text)).fetchone()
    assert binary_from_text(out.encode(), oid) == bytes(sent), (text, out)


def test_a_passthrough_date_that_cannot_be_converted_fails_cleanly(wproxy: RunningProxy) -> None:
    """Catalog and other passthrough results too: 0A000, and the session goes on (was XX000)."""
    wire = Wire(wproxy.host, wproxy.port)
    wire.send(_query("SET DateStyle = 'German'"))
    wire.read_until(b"Z")
    replies = _extended(wire, "SELECT DATE '2000-01-02' AS d, 1 AS n", (1, 0))
    assert _codes(replies) == [b"0A000"] and replies[-1] == (b"Z", b"I")
    wire.send(_query("SET DateStyle = ISO"))
    wire.read_until(b"Z")
    replies = _extended(wire, "SELECT DATE '2000-01-02' AS d, 1 AS n", (1, 0))
    (row,) = [data_row_values(body) for kind, body in replies if kind == b"D"]
    assert row == [struct.pack("!i", 1), b"1"]
    wire.close()


def test_a_query_or_function_call_after_an_extended_error_is_ignored_until_sync(wproxy: RunningProxy) -> None:
    """PostgreSQL ignores every message up to Sync after an extended-protocol error, a Query
    and a FunctionCall too (no reply at all). dpproxy ran the Query: a DP one was answered and
    charged though PostgreSQL would never have run it."""
    wire = Wire(wproxy.host, wproxy.port)
    with _plain(wproxy) as conn:
        before = spent_epsilon(conn)
        wire.send(parse("", "SELECT * FROM aw0"), bind("", ""), execute(""),
                  _query("SELECT count(*) FROM aw0 WHERE x > 2"),
                  message(b"F", struct.pack("!I", 1) + b"\0\0\0\0\0\0"), SYNC)
        replies = wire.read_until(b"Z")
        assert spent_epsilon(conn) == before
    assert [kind for kind, _ in replies] == [b"E", b"Z"] and _codes(replies) == [b"DP001"]
    wire.send(_query("SELECT count(*) FROM aw0 WHERE x > 2"))  # after Sync, it runs
    assert [kind for kind, _ in wire.read_until(b"Z") if kind != b"N"] == [b"T", b"D", b"C", b"Z"]
    wire.close()


def test_describing_a_dp_portal_bound_with_too_many_result_formats_fails_the_statement_only(
    wproxy: RunningProxy
) -> None:
    """Three result format codes for two columns: Execute failed with an ERROR, Describe of the
    portal ended the session (FATAL 08P01). PostgreSQL fails the Bind with an ERROR."""
    wire = Wire(wproxy.host, wproxy.port)
    wire.send(parse("", "SELECT count(*), sum(n) FROM aw0 WHERE x > 1"), bind("", "", (), (), (1, 0, 1)),
              describe(b"P", ""), execute(""), SYNC)
    replies = wire.read_until(b"Z")
    errors = [error_fields(body) for kind, body in replies if kind == b"E"]
    assert [(e[b"C"], e[b"S"]) for e in errors] == [(b"08P01", b"ERROR")] and replies[-1] == (b"Z", b"I")
    wire.send(_query("SELECT 1"))
    assert _codes(wire.read_until(b"Z")) == []
    wire.close()


@pytest.mark.parametrize("sql", ["SELECT t, count(*) FROM aw0 GROUP BY t", "SELECT * FROM generate_series(1, 100000)"],
                         ids=["histogram", "passthrough-stream"])
def test_a_suspended_portal_ends_with_its_block_and_hands_out_nothing_once_it_failed(wproxy: RunningProxy,
                                                                                    sql: str) -> None:
    """As PostgreSQL: a portal of a transaction block is gone after its COMMIT (34000), and a
    suspended one hands out no more rows in a failed block (25P02); dpproxy kept handing out
    both until a Sync outside a block."""
    wire = Wire(wproxy.host, wproxy.port)
    wire.send(_query("BEGIN"), parse("s", sql), bind("p", "s"), execute("p", 1), SYNC)
    wire.read_until(b"Z")
    assert [kind for kind, _ in wire.read_until(b"Z") if kind != b"N"] == [b"1", b"2", b"D", b"s", b"Z"]
    wire.send(_query("COMMIT"))
    wire.read_until(b"Z")
    wire.send(execute("p", 1), SYNC)
    assert _codes(wire.read_until(b"Z")) == [b"34000"]
    wire.send(_query("BEGIN"), bind("q", "s"), execute("q", 1), SYNC, _query("SELECT 1/0"), execute("q", 1), SYNC)
    for _ in range(4):
        replies = wire.read_until(b"Z")
    assert _codes(replies) == [b"25P02"] and replies[-1] == (b"Z", b"E")
    wire.send(_query("ROLLBACK"), _query("SELECT 5"))
    wire.read_until(b"Z")
    assert [kind for kind, _ in wire.read_until(b"Z")] == [b"T", b"D", b"C", b"Z"]
    wire.close()


_ONE_CONNECTION = ATTACK_POLICY_HEAD.replace(
    "statement_timeout_ms: 10000}}", "statement_timeout_ms: 10000, pool: {{size: 1, checkout_timeout_s: 2}}}}"
) + _POLICY[len(ATTACK_POLICY_HEAD):]


def test_a_client_that_never_sends_sync_keeps_no_pooled_connection(
    wproxy: RunningProxy, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The connection went back to the pool only after Sync, Flush or a Query: a Parse (which
    resolves its names on the backend), Describe or Execute followed by nothing kept it for
    as long as the client liked, and pool.size such clients left every other session 53300."""
    assert _ONE_CONNECTION != _POLICY  # (wproxy: its tables)
    with running_proxy(test_db, tmp_path_factory, _ONE_CONNECTION) as proxy:
        for messages in ([parse("", "SELECT relname FROM pg_class WHERE oid > 5")],
                         [parse("s", "SELECT count(*) FROM aw0 WHERE x > 30"), describe(b"S", "s")],
                         [parse("", "SELECT count(*) FROM aw0 WHERE x > 31"), bind("", ""), execute("")],
                         [parse("", "SELECT 1"), bind("", ""), execute("")]):
            hog = Wire(proxy.host, proxy.port)
            hog.send(*messages)
            time.sleep(0.3)
            other = Wire(proxy.host, proxy.port)
            other.send(_query("SELECT 1"))
            assert _codes(other.read_until(b"Z")) == [], messages
            hog.send(SYNC)  # and the pipeline still completes
            assert _codes(hog.read_until(b"Z")) == []
            for wire in (hog, other):
                wire.close()


def test_describing_a_copy_portal_runs_and_charges_nothing(wproxy: RunningProxy) -> None:
    """Describe of a COPY portal is NoData, as on PostgreSQL, without running it: dpproxy ran
    a DP COPY there, charging ε for an answer that a Close then threw away."""
    sql = "COPY (SELECT count(*) FROM aw0 WHERE x > 9) TO STDOUT"
    wire = Wire(wproxy.host, wproxy.port)
    with _plain(wproxy) as conn:
        before = spent_epsilon(conn)
        wire.send(parse("", sql), bind("", ""), describe(b"P", ""), message(b"C", b"P\0"), SYNC)
        assert [kind for kind, _ in wire.read_until(b"Z")] == [b"1", b"2", b"n", b"3", b"Z"]
        assert spent_epsilon(conn) == before
        wire.send(parse("", sql), bind("", ""), describe(b"P", ""), execute(""), SYNC)
        kinds = [kind for kind, _ in wire.read_until(b"Z") if kind != b"N"]
        assert kinds == [b"1", b"2", b"n", b"H", b"d", b"c", b"C", b"Z"]
        assert spent_epsilon(conn) == before + 1
    wire.close()


@pytest.mark.parametrize(("sql", "types", "value", "sqlstate"), [
    ("SELECT count(*) FROM {t} WHERE x > $1", (23,), b"\x00\x00\x01", b"08P01"),
    ("SELECT count(*) FROM {t} WHERE n > $1", (1700,), b"\x00\x01\x00\x00\x00\x00\x00\x00\xff\xff", b"22P03"),
    ("SELECT count(*) FROM {t} WHERE t = $1", (25,), b"\xff\xfe", b"22021"),
    ("SELECT count(*) FROM {t} WHERE d > $1", (1082,), b"\x7f\xff\xff\xfe", b"22008"),
    ("SELECT date_trunc('month', ts), count(*) FROM {t} WHERE ts > $1 GROUP BY 1", (1114,),
     struct.pack("!q", 0x7FFFFFFFFFFFFFF0), b"22008"),
], ids=["int4-of-3-bytes", "numeric-bad-digit", "text-not-utf8", "date-out-of-range", "timestamp-out-of-range"])
def test_a_bad_binary_parameter_fails_alike_on_neighbours_before_the_charge(
    wproxy: RunningProxy, sql: str, types: tuple[int, ...], value: bytes, sqlstate: bytes
) -> None:
    """Held: PostgreSQL's own error for the value, before the charge, whatever the rows."""
    with _plain(wproxy) as conn:
        for table in ("aw0", "aw1"):
            wire = Wire(wproxy.host, wproxy.port)
            before = spent_epsilon(conn)
            wire.send(parse("", sql.replace("{t}", table), types), bind("", "", (value,), (1,)), execute(""), SYNC)
            replies = wire.read_until(b"Z")
            assert _codes(replies) == [sqlstate] and spent_epsilon(conn) == before
            wire.close()


@pytest.mark.parametrize("malformed", [
    describe(b"X", ""), message(b"C", b"X\0"), message(b"B", b"\0\0\0\x01"), message(b"E", b"\0\0\0\0\0zz"),
    message(b"P", b"\0SELECT 1"),
], ids=["describe-target", "close-target", "truncated-bind", "execute-trailing-bytes", "unterminated-parse"])
def test_a_malformed_extended_message_fails_the_statement_not_the_session(wproxy: RunningProxy,
                                                                          malformed: bytes) -> None:
    """Its length right, its content not: PostgreSQL answers ERROR 08P01, skips to Sync and
    goes on; dpproxy ended the session with FATAL."""
    wire = Wire(wproxy.host, wproxy.port)
    wire.send(parse("", "SELECT 1"), malformed, bind("", ""), execute(""), SYNC)
    replies = wire.read_until(b"Z")
    errors = [error_fields(body) for kind, body in replies if kind == b"E"]
    assert [(e[b"C"], e[b"S"]) for e in errors] == [(b"08P01", b"ERROR")] and replies[-1] == (b"Z", b"I")
    wire.send(_query("SELECT 2"))
    assert [kind for kind, _ in wire.read_until(b"Z")] == [b"T", b"D", b"C", b"Z"]
    wire.close()


@pytest.mark.parametrize("sql", [
    "SELECT count(*), sum(n), avg(n), sum(f), avg(x), sum(x) FROM {t}",
    "SELECT t, count(*), sum(n) FROM {t} GROUP BY t",
    "SELECT round(avg(n), 1) AS r, sum(n)::numeric(12,3) AS s, count(*)::text AS c FROM {t}",
    "SELECT d, count(*) FROM {t} GROUP BY d ORDER BY 2 DESC LIMIT 3",
    "SELECT CASE WHEN count(*) > 30 THEN 'many' ELSE 'few' END AS k FROM {t}",
])
def test_describe_of_statement_and_portal_and_the_query_s_row_description_agree_on_neighbours(
    wproxy: RunningProxy, sql: str
) -> None:
    """Held: types, sizes and typmods come from the statement; Describe (statement and portal,
    neither charged) shows what the simple protocol sends, on both tables."""
    seen = []
    for table in ("aw0", "aw1"):
        wire = Wire(wproxy.host, wproxy.port)
        text = sql.replace("{t}", table)
        wire.send(parse("s", text), describe(b"S", "s"), bind("p", "s"), describe(b"P", "p"), SYNC, _query(text))
        described = [body.replace(table.encode(), b"T") for kind, body in wire.read_until(b"Z") if kind == b"T"]
        sent = [body.replace(table.encode(), b"T") for kind, body in wire.read_until(b"Z") if kind == b"T"]
        assert len(described) == 2 and described[0] == described[1] == sent[0]
        seen.append(sent[0])
        wire.close()
    assert seen[0] == seen[1]
