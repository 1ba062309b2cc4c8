"""A passthrough portal run in row-limited pieces inside a block costs what it costs on PostgreSQL.

pgjdbc with a fetch size and autocommit off, asyncpg's cursor() and others bind a named portal
in a transaction block, Execute it n rows at a time and may stop early. PostgreSQL runs the
portal only as far as it is read and drops it at Close or COMMIT. dpproxy ran the statement to
its end and read the rest for nothing before the next request (COMMIT after a suspended
3,000,000-row portal: 5.5-8 s; after ``generate_series(1, 1e9)``, the statement timeout, which
then failed the block). Now such a portal is a backend cursor of its own
(proxy/serving/backend_portals.py). Each case sends the same raw messages to PostgreSQL directly
and through dpproxy, in the same run, and compares the replies; the backend's own state
(pg_stat_activity) shows that no statement runs on after the client stopped reading.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psycopg
import pytest

from conftest import RunningProxy, TestDatabase, lookup_protected_file, make_policy
from wire import SYNC, Wire, bind, cstr, describe, execute, message, parse, replies, replies_on_both

_ENDLESS = "SELECT g, g::text AS t FROM (SELECT generate_series(1, 1000000000) AS g) s"  # rows as they are made


def _query(sql: str) -> bytes:
    return message(b"Q", cstr(sql))


def _close(portal: str) -> bytes:
    return message(b"C", b"P" + cstr(portal))


def _on_both(test_db: TestDatabase, proxy: RunningProxy, *requests: tuple[bytes, ...]) -> tuple[object, object]:
    """The replies to ``requests`` (row descriptions whole) straight to PostgreSQL, then through dpproxy."""
    return replies_on_both(test_db.admin_dsn, proxy.host, proxy.port, *requests, row_descriptions=True)


def _begin_and_piece(sql: str, portal: str = "c", rows: int = 10) -> tuple[tuple[bytes, ...], ...]:
    """BEGIN, then ``sql`` bound as ``portal`` and run for ``rows`` rows, as pgjdbc sends it
    with a fetch size: Parse, Bind, Describe portal, Execute with a row limit, Sync."""
    return (_query("BEGIN"),), (parse("", sql), bind(portal, ""), describe(b"P", portal), execute(portal, rows), SYNC)


def _backend_states(admin: psycopg.Connection, application: str) -> list[str]:
    rows = admin.execute("SELECT state FROM pg_stat_activity WHERE application_name = %s", (application,)).fetchall()
    return [state for (state,) in rows]


@pytest.mark.parametrize("ending", [
    ((_close("c"), SYNC), (_query("COMMIT"),)),
    ((_query("COMMIT"),),),
    ((_query("ROLLBACK"),),),
    ((_query("SELECT 7"),), (_query("COMMIT"),)),
], ids=["close-commit", "commit", "rollback", "statement-then-commit"])
def test_a_portal_left_in_a_block_ends_as_on_postgresql(proxy: RunningProxy, test_db: TestDatabase,
                                                       ending: tuple[tuple[bytes, ...], ...]) -> None:
    """Before: the rest of a billion rows was read for nothing at the next request, until the
    statement timeout failed the block (57014, COMMIT answered ROLLBACK)."""
    direct, proxied = _on_both(test_db, proxy, *_begin_and_piece(_ENDLESS), *ending)
    assert proxied == direct
    assert direct[-1][-1] == (b"Z", b"I") and all(reply[0] != b"E" for replies in direct for reply in replies)


def test_a_suspended_portal_leaves_no_statement_running_on_the_backend(proxy: RunningProxy, admin) -> None:
    """PostgreSQL runs a suspended portal's statement no further: its backend is idle in the
    block. dpproxy's ran on (active, writing the rows nobody would read)."""
    application = "h141_suspended_portal"
    wire = Wire(proxy.host, proxy.port, startup_params={"application_name": application})
    try:
        replies(wire, *_begin_and_piece(_ENDLESS))
        states = _backend_states(admin, application)
        deadline = time.monotonic() + 10
        while states != ["idle in transaction"] and time.monotonic() < deadline:
            time.sleep(0.1)  # pg_stat_activity's state is written as the backend reaches it
            states = _backend_states(admin, application)
        assert states == ["idle in transaction"]
        assert replies(wire, (execute("c", 3), SYNC))[0][:3] == [(b"D", b"11", b"11"), (b"D", b"12", b"12"),
                                                                 (b"D", b"13", b"13")]
        assert replies(wire, (_query("COMMIT"),))[0] == [(b"C", b"COMMIT"), (b"Z", b"I")]
    finally:
        wire.close()


def test_an_asyncpg_cursor_left_early_in_a_transaction_is_not_computed_to_its_end(proxy: RunningProxy) -> None:
    """asyncpg's cursor() in a transaction: 50 rows fetched, then the transaction commits. On
    PostgreSQL the rest is never computed; through dpproxy it was read at COMMIT, where the
    millionth row's division by zero failed the block and the SET before it was rolled back."""
    asyncpg = pytest.importorskip("asyncpg")
    sql = "SELECT 1 / (g - 1000000) FROM (SELECT pg_catalog.generate_series(1, 2000000) AS g) s"

    async def left_early() -> tuple[int, str]:
        conn = await asyncpg.connect(host=proxy.host, port=proxy.port, user="analyst", password="analyst",
                                     database="dpproxy_test")
        try:
            async with conn.transaction():
                await conn.execute("SET application_name = 'asyncpg_left_early'")
                rows = await (await conn.cursor(sql)).fetch(50)
            return len(rows), await conn.fetchval("SHOW application_name")
        finally:
            await conn.close()

    assert asyncio.run(left_early()) == (50, "asyncpg_left_early")


def test_interleaved_portals_each_go_on_from_where_they_stopped(proxy: RunningProxy, test_db: TestDatabase) -> None:
    """Pipelined Executes of two portals of one statement, interleaved in a block: legal on
    PostgreSQL, each portal its own position, PortalSuspended even when no row is left."""
    sql = "SELECT g FROM generate_series(1, 7) g"
    direct, proxied = _on_both(
        test_db, proxy, (_query("BEGIN"),),
        (parse("s", sql), bind("a", "s"), bind("b", "s"), execute("a", 3), execute("b", 2), execute("a", 4),
         execute("b", 0), execute("a", 2), _close("a"), execute("b", 1), SYNC),
        (_query("COMMIT"),))
    assert proxied == direct
    assert [r for r in direct[1] if r[0] in (b"s", b"C")] == [
        (b"s",), (b"s",), (b"s",), (b"C", b"SELECT 5"), (b"C", b"SELECT 0"), (b"C", b"SELECT 0")]


def test_a_portal_failing_part_way_fails_its_block_as_on_postgresql(proxy: RunningProxy, test_db: TestDatabase) -> None:
    # (Failing at the first row of its Execute: a chunk's rows before an error are not relayed,
    # a passthrough statement's as much as a portal's; see row_stream.py.)
    sql = "SELECT 1 / (g - 4) FROM generate_series(1, 10) g"
    direct, proxied = _on_both(
        test_db, proxy, *_begin_and_piece(sql, rows=3), (execute("c", 3), SYNC), (execute("c", 3), SYNC),
        (_query("COMMIT"),))
    assert proxied == direct
    assert [r[:2] for r in direct[2] if r[0] == b"E"] == [(b"E", b"22012")]
    assert [r[:2] for r in direct[3] if r[0] == b"E"] == [(b"E", b"25P02")]
    assert direct[4][0] == (b"C", b"ROLLBACK")


def test_a_portal_bound_after_a_savepoint_goes_with_it(proxy: RunningProxy, test_db: TestDatabase) -> None:
    direct, proxied = _on_both(
        test_db, proxy, (_query("BEGIN; SAVEPOINT x"),), _begin_and_piece(_ENDLESS)[1],
        (_query("ROLLBACK TO SAVEPOINT x"),), (execute("c", 3), SYNC), (_query("ROLLBACK"),))
    assert proxied == direct
    assert [r[:2] for r in direct[3] if r[0] == b"E"] == [(b"E", b"34000")]


def test_close_all_drops_a_suspended_portal_as_on_postgresql(proxy: RunningProxy, test_db: TestDatabase) -> None:
    """Before: the portal's backend cursor was not among the cursors dpproxy knew, so CLOSE ALL
    did not reach the backend and the portal went on handing out rows."""
    direct, proxied = _on_both(test_db, proxy, *_begin_and_piece(_ENDLESS), (_query("CLOSE ALL"),),
                               (execute("c", 3), SYNC), (_query("ROLLBACK"),))
    assert proxied == direct
    assert [r[:2] for r in direct[3] if r[0] == b"E"] == [(b"E", b"34000")]


def test_a_portal_runs_in_pieces_beside_a_cursor_declared_under_the_name_dpproxy_would_give_it(
        proxy: RunningProxy) -> None:
    wire = Wire(proxy.host, proxy.port)
    try:
        got = replies(wire, (_query("BEGIN; DECLARE dpproxy_portal_1 CURSOR FOR SELECT 'mine'"),),
                      _begin_and_piece("SELECT g FROM generate_series(1, 5) g", rows=2)[1],
                      (_query("FETCH dpproxy_portal_1"),), (_query("COMMIT"),))
        assert [r for r in got[1] if r[0] in (b"D", b"E", b"s")] == [(b"D", b"1"), (b"D", b"2"), (b"s",)]
        assert got[2][0] == (b"D", b"mine") and got[3][0] == (b"C", b"COMMIT")
    finally:
        wire.close()


def test_a_portal_with_more_result_formats_than_columns_fails_08p01_and_its_block(
        proxy: RunningProxy) -> None:
    """As any error in a block on PostgreSQL, the 08P01 fails the block, whose ROLLBACK ends
    the portal's backend cursor (before: the block went on, the cursor closed by dpproxy)."""
    wire = Wire(proxy.host, proxy.port)
    try:
        got = replies(wire, (_query("BEGIN"),), (parse("", "SELECT 1, 2"), bind("c", "", result_formats=(0, 0, 0)),
                                                 describe(b"P", "c"), SYNC),
                      (_query("ROLLBACK"),),
                      (_query("SELECT pg_catalog.count(*) FROM pg_catalog.pg_cursors WHERE name <> ''"),))
        assert [r[:2] for r in got[1] if r[0] == b"E"] == [(b"E", b"08P01")] and got[1][-1] == (b"Z", b"E")
        assert got[2][0] == (b"C", b"ROLLBACK") and got[3][0] == (b"D", b"0")
    finally:
        wire.close()


def test_discard_all_in_a_block_with_a_suspended_portal_is_refused_as_on_postgresql(
        proxy: RunningProxy, test_db: TestDatabase) -> None:
    direct, proxied = _on_both(test_db, proxy, *_begin_and_piece(_ENDLESS), (_query("DISCARD ALL"),),
                               (_query("ROLLBACK"),), (_query("DISCARD ALL"),))
    assert proxied == direct
    assert [r[:2] for r in direct[2] if r[0] == b"E"] == [(b"E", b"25001")]


def test_an_unnamed_portal_run_in_pieces_in_a_block_is_a_backend_cursor_too(
        proxy: RunningProxy, test_db: TestDatabase) -> None:
    """No Describe, the unnamed portal, mixed and binary results: Execute with a row limit decides."""
    direct, proxied = _on_both(
        test_db, proxy, (_query("BEGIN"),), (parse("", _ENDLESS), bind("", "", result_formats=(1, 0)), execute("", 2), SYNC),
        (execute("", 2), SYNC), (bind("b", "", result_formats=(1,)), execute("b", 1), execute("b", 1), SYNC),
        (_query("COMMIT"),))
    assert proxied == direct
    assert [r for r in direct[2] if r[0] == b"D"] == [(b"D", b"\0\0\0\3", b"3"), (b"D", b"\0\0\0\4", b"4")]
    assert [r for r in direct[3] if r[0] == b"D"] == [(b"D", b"\0\0\0\1", b"1"), (b"D", b"\0\0\0\2", b"2")]
    assert direct[4] == [(b"C", b"COMMIT"), (b"Z", b"I")]


def test_a_client_leaving_with_a_suspended_portal_leaves_no_statement_running(proxy: RunningProxy, admin) -> None:
    application = "h141_portal_left"
    wire = Wire(proxy.host, proxy.port, startup_params={"application_name": application})
    replies(wire, *_begin_and_piece(_ENDLESS))
    wire.close()
    deadline = time.monotonic() + 10
    while "active" in _backend_states(admin, application) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "active" not in _backend_states(admin, application)
    other = Wire(proxy.host, proxy.port)
    try:
        assert replies(other, (_query("SELECT 1"),))[0][0] == (b"D", b"1")
    finally:
        other.close()


def test_a_dp_portal_in_a_block_stays_one_released_row(proxy: RunningProxy) -> None:
    """A DP statement's portal is never a backend cursor: its result is one released answer,
    handed out as before (a row limit of 1 suspends it, as on PostgreSQL; the next Execute ends
    it with no row), charged once."""
    wire = Wire(proxy.host, proxy.port)
    try:
        got = replies(wire, *_begin_and_piece("SELECT COUNT(*) FROM adult", rows=1), (execute("c", 1), SYNC),
                           (_query("SELECT pg_catalog.count(*) FROM pg_catalog.pg_cursors WHERE name <> ''"),),
                           (_query("COMMIT"),))
        first = [r[0] for r in got[1]]
        assert first.count(b"D") == 1 and first.count(b"N") == 1 and first[-2:] == [b"s", b"Z"]  # its charge
        assert got[2] == [(b"C", b"SELECT 0"), (b"Z", b"T")]  # no second one
        assert got[3][0] == (b"D", b"0")  # no cursor was declared for it on the backend
    finally:
        wire.close()


def test_a_portal_over_a_table_protected_by_a_reload_hands_out_no_more_rows(test_db: TestDatabase,
                                                                           tmp_path: Path) -> None:
    """Its query is judged again before each piece, as a passthrough cursor's (before: the rest
    of a suspended portal over a table protected since went on being handed out)."""
    ledger = tmp_path / "l.sqlite3"
    reloaded = lookup_protected_file(test_db, ledger)
    proxy = RunningProxy(make_policy(test_db, ledger))
    wire = Wire(proxy.host, proxy.port)
    try:
        first = replies(wire, *_begin_and_piece("SELECT code FROM lookup ORDER BY code", rows=1))
        assert [r for r in first[1] if r[0] == b"D"] == [(b"D", b"F")]
        assert proxy._call(proxy.server.reload(reloaded))
        (after,) = replies(wire, (execute("c", 1), SYNC))
        assert [r[:2] for r in after] == [(b"E", b"55000"), (b"Z", b"E")]  # and the block failed
        assert b"this portal was bound under an earlier policy" in after[0][2] and b"policy-changed" in after[0][2]
        assert replies(wire, (_query("ROLLBACK"),)) == [[(b"C", b"ROLLBACK"), (b"Z", b"I")]]
    finally:
        wire.close()
        proxy.stop()
