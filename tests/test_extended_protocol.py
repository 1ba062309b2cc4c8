"""The extended query protocol through dpproxy: real drivers, and the traps clients set."""

from __future__ import annotations

import asyncio
import struct

import asyncpg
import psycopg
import pytest
from prometheus_client import REGISTRY

from conftest import RunningProxy
from proxy.ops import metrics
from wire import FLUSH, SYNC, Wire, bind, data_row_values, describe, error_fields, execute, parse


def test_psycopg_parameters_auto_prepare_and_prepare_true(proxy: RunningProxy, admin):
    (exact,) = admin.execute("SELECT COUNT(*) FROM adult WHERE age > 40 AND sex = 'Female'").fetchone()
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:  # default prepare_threshold: 5
        answers = [conn.execute("SELECT COUNT(*) FROM adult WHERE age > %s AND sex = %s", (40, "Female")).fetchone()[0]
                   for _ in range(8)]
        prepared = conn.execute("SELECT COUNT(*) FROM adult WHERE age > %s", (40,), prepare=True).fetchone()
    assert all(abs(a - exact) < 30 for a in answers)
    assert prepared[0] > 10000


def test_psycopg_binary_results_for_dp_and_catalog(proxy: RunningProxy):
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        count, total = conn.execute("SELECT COUNT(*), SUM(age) FROM adult WHERE age > %s", (30,), binary=True).fetchone()
        relname, kind = conn.execute("SELECT relname, relkind FROM pg_class WHERE relname = %s", ("adult",),
                                     binary=True).fetchone()
    assert isinstance(count, int) and isinstance(total, int) and count > 10000
    assert (relname, kind) == ("adult", "r")


def test_psycopg_refusal_through_extended_protocol_keeps_connection_usable(proxy: RunningProxy):
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute("SELECT * FROM adult WHERE age > %s", (3,))
        assert info.value.diag.sqlstate == "DP001"
        assert conn.execute("SELECT %s::int + 1", (1,)).fetchone() == (2,)


def test_asyncpg_fetchval_fetchrow_transaction_and_pool(proxy: RunningProxy):
    async def main() -> None:
        conn = await asyncpg.connect(host=proxy.host, port=proxy.port, user="analyst", password="analyst",
                                     database="dpproxy_test")
        assert await conn.fetchval("SELECT COUNT(*) FROM adult WHERE age > $1", 40) > 10000
        row = await conn.fetchrow("SELECT COUNT(*) AS n, SUM(age) AS s FROM adult WHERE sex = $1", "Male")
        assert row["n"] > 20000 and row["s"] > 0
        async with conn.transaction():
            assert await conn.fetchval("SELECT COUNT(*) FROM adult") > 40000
        await conn.close()
        pool = await asyncpg.create_pool(host=proxy.host, port=proxy.port, user="analyst", password="analyst",
                                         database="dpproxy_test", min_size=2, max_size=4)
        results = await asyncio.gather(*(pool.fetchval("SELECT COUNT(*) FROM adult WHERE age < $1", 30)
                                         for _ in range(8)))
        assert all(r > 5000 for r in results)
        await pool.close()

    asyncio.run(main())


def test_asyncpg_introspects_an_unknown_type_with_its_recursive_catalog_query(proxy: RunningProxy):
    """pg_index.indkey (int2vector) is not an asyncpg built-in: it runs WITH RECURSIVE typeinfo_tree."""

    async def main() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(host=proxy.host, port=proxy.port, user="analyst", password="analyst",
                                     database="dpproxy_test")
        try:
            return await conn.fetch("SELECT c.relname, i.indisprimary, i.indkey, i.indclass FROM pg_catalog.pg_index i "
                                    "JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = $1::regclass",
                                    "adult")
        finally:
            await conn.close()

    rows = asyncio.run(main())
    assert [(r["relname"], r["indisprimary"]) for r in rows] == [("adult_age_idx", False)]


def test_flush_before_sync_gets_replies_without_ready_for_query(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)
    wire.send(parse("s1", "SELECT COUNT(*) FROM adult WHERE age > $1"), describe(b"S", "s1"), FLUSH)
    kinds = wire.kinds_until(b"T")
    assert kinds == [b"1", b"t", b"T"]
    wire.send(bind("", "s1", (b"40",)), execute("", 1), SYNC)
    kinds = wire.kinds_until(b"Z")
    assert kinds == [b"2", b"N", b"D", b"s", b"Z"]  # one row, then PortalSuspended (max_rows = 1)
    wire.close()


def test_parameter_description_comes_from_the_backend(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)
    wire.send(parse("", "SELECT COUNT(*) FROM adult WHERE age > $1 AND sex = $2"), describe(b"S", ""), SYNC)
    replies = wire.read_until(b"Z")
    (body,) = [b for k, b in replies if k == b"t"]
    assert struct.unpack("!hII", body) == (2, 23, 25)  # int4 for age, text for sex
    wire.close()


def _backend_round_trips() -> float:
    """The backend round trips this process has made, as ``/metrics`` counts them."""
    metrics.flush()
    return REGISTRY.get_sample_value("dpproxy_backend_duration_seconds_count") or 0.0


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM adult WHERE age > $1",  # a DP statement: its backend SQL is described
    "SELECT relname FROM pg_class WHERE relname = $1",  # a passthrough statement: itself
])
def test_a_described_statement_is_parsed_and_described_on_the_backend_in_one_round_trip(proxy: RunningProxy,
                                                                                         sql: str):
    wire = Wire(proxy.host, proxy.port)
    wire.send(parse("first", sql), describe(b"S", "first"), SYNC)  # resolves the names the statement reads
    assert wire.kinds_until(b"Z") == [b"1", b"t", b"T", b"Z"]
    before = _backend_round_trips()
    wire.send(parse("second", sql), describe(b"S", "second"), SYNC)
    assert wire.kinds_until(b"Z") == [b"1", b"t", b"T", b"Z"]
    assert _backend_round_trips() - before == 1  # the Parse and the Describe in one pipeline
    wire.close()


def test_a_column_probe_sent_as_a_simple_query_is_described_in_one_round_trip(proxy: RunningProxy):
    # A BI tool's LIMIT 0 probe of a protected table: dpproxy answers it from its own Parse and
    # Describe on the backend (rewriter.classify.ColumnsOnly), whatever protocol the client spoke.
    with psycopg.connect(proxy.dsn(), autocommit=True) as conn:
        conn.execute("SELECT * FROM adult LIMIT 0")  # resolves the names
        before = _backend_round_trips()
        cursor = conn.execute("SELECT age, sex FROM adult WHERE age > 30 LIMIT 0")
        assert [c.name for c in cursor.description or []] == ["age", "sex"] and cursor.fetchall() == []
    assert _backend_round_trips() - before == 1


def test_a_statement_the_backend_cannot_parse_fails_its_describe_and_the_session_goes_on(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)
    wire.send(parse("bad", "SELECT relname FROM pg_class WHERE relname = $1 + no_such_column"),
              describe(b"S", "bad"), SYNC)
    replies = wire.read_until(b"Z")
    assert [k for k, _ in replies] == [b"1", b"E", b"Z"]
    assert error_fields(replies[1][1])[b"C"] == b"42703"
    wire.send(parse("", "SELECT relname FROM pg_class WHERE relname = $1"), describe(b"S", ""), SYNC)
    assert wire.kinds_until(b"Z") == [b"1", b"t", b"T", b"Z"]
    wire.close()


def test_error_skips_to_sync_then_the_connection_goes_on(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)
    wire.send(parse("", "SELECT * FROM adult"), bind("", ""), execute(""),
              parse("", "SELECT 1"), bind("", ""), execute(""), SYNC)
    replies = wire.read_until(b"Z")
    assert [k for k, _ in replies] == [b"E", b"Z"]
    assert error_fields(replies[0][1])[b"C"] == b"DP001"
    wire.send(parse("", "SELECT 1"), bind("", ""), execute(""), SYNC)
    assert wire.kinds_until(b"Z") == [b"1", b"2", b"D", b"C", b"Z"]
    wire.close()


def test_named_statement_reexecuted_without_describe_in_binary(proxy: RunningProxy):
    """pgjdbc's pattern: Describe once, later Bind asks binary for int8 and numeric columns."""
    wire = Wire(proxy.host, proxy.port)
    sql = "SELECT COUNT(*), SUM(capital_gain) FROM adult WHERE age > $1"
    wire.send(parse("S_1", sql, (23,)), bind("", "S_1", (b"30",)), describe(b"P", ""), execute(""), SYNC)
    assert wire.kinds_until(b"Z")[:3] == [b"1", b"2", b"T"]
    wire.send(bind("", "S_1", (struct.pack("!i", 30),), (1,), (1, 0)), execute(""), SYNC)
    replies = wire.read_until(b"Z")
    (row,) = [data_row_values(b) for k, b in replies if k == b"D"]
    assert len(row[0]) == 8 and struct.unpack("!q", row[0])[0] > 10000  # int8, binary
    assert int(row[1]) > 0  # the text column stays text
    wire.close()


def test_close_and_unknown_statement(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)
    wire.send(parse("a", "SELECT 1"), message_close(b"S", "a"), bind("", "a"), SYNC)
    replies = wire.read_until(b"Z")
    assert [k for k, _ in replies] == [b"1", b"3", b"E", b"Z"]
    assert error_fields(replies[2][1])[b"C"] == b"26000"
    wire.close()


def message_close(kind: bytes, name: str) -> bytes:
    from wire import cstr, message

    return message(b"C", kind + cstr(name))


def test_pipelined_simple_begin_then_extended_query(proxy: RunningProxy):
    """pgjdbc writes BEGIN (simple) and P/B/D/E/S in one go before reading anything."""
    from wire import cstr, message

    wire = Wire(proxy.host, proxy.port)
    wire.send(message(b"Q", cstr("BEGIN")), parse("", "SELECT COUNT(*) FROM adult"), bind("", ""),
              describe(b"P", ""), execute(""), SYNC)
    first = wire.read_until(b"Z")
    assert first[-1] == (b"Z", b"T")
    second = wire.read_until(b"Z")
    assert [k for k, _ in second][-3:] == [b"D", b"C", b"Z"] and second[-1][1] == b"T"
    wire.send(message(b"Q", cstr("COMMIT")))
    assert wire.read_until(b"Z")[-1] == (b"Z", b"I")
    wire.close()
