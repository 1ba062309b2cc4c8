"""An implicit transaction is no transaction block, on PostgreSQL and through dpproxy alike.

PostgreSQL runs an extended-protocol pipeline up to its Sync, and a query string of several
statements, in an implicit transaction; dpproxy runs one as a BEGIN block on the backend
(proxy/serving/implicit_block.py), which accepted what PostgreSQL refuses outside a block
(SAVEPOINT, COMMIT AND CHAIN, in a pipeline a DECLARE without HOLD) and ended a COMMIT's block
without PostgreSQL's warning. After a COMMIT or ROLLBACK among a query string's statements
PostgreSQL runs the rest in a new implicit transaction, which dpproxy autocommitted statement
by statement. A DECLARE ... WITH HOLD in a pipeline that fails is rolled back with it. Each
case sends the same raw messages to PostgreSQL directly and through dpproxy, in the same run.
"""

from __future__ import annotations

import pytest

from conftest import RunningProxy, TestDatabase
from wire import SYNC, Wire, bind, cstr, execute, message, parse, replies, replies_on_both


def _query(sql: str) -> bytes:
    return message(b"Q", cstr(sql))


def _statement(sql: str) -> bytes:
    """Parse, Bind and Execute of ``sql`` (the unnamed statement and portal), without Sync."""
    return parse("", sql) + bind("", "") + execute("")


def _on_both(test_db: TestDatabase, proxy: RunningProxy, *requests: tuple[bytes, ...]) -> tuple[object, object]:
    """The replies to ``requests`` on a raw connection straight to PostgreSQL, then through dpproxy."""
    return replies_on_both(test_db.admin_dsn, proxy.host, proxy.port, *requests)


_SETTINGS = ((_query("SHOW TimeZone"),), (_query("SHOW DateStyle"),), (_query("RESET ALL"),))
_NO_TRANSACTION = (b"N", b"25P01", b"there is no transaction in progress")


@pytest.mark.parametrize("statements", [
    ("SET TimeZone = 'Asia/Tokyo'", "SAVEPOINT a", "SET DateStyle = 'German'", "ROLLBACK TO a"),
    ("SET TimeZone = 'Asia/Tokyo'", "RELEASE SAVEPOINT a"),
    ("SET dpproxy.epsilon = 0.5", "SET TimeZone = 'Asia/Tokyo'", "ROLLBACK TO SAVEPOINT a"),
    ("SET TimeZone = 'Asia/Tokyo'", "COMMIT AND CHAIN"),
    ("SET TimeZone = 'Asia/Tokyo'", "ROLLBACK AND CHAIN"),
], ids=["savepoint", "release", "rollback-to", "commit-and-chain", "rollback-and-chain"])
def test_a_pipelines_savepoints_and_chains_are_refused_outside_a_block_as_on_postgresql(
        proxy: RunningProxy, test_db: TestDatabase, statements: tuple[str, ...]):
    direct, proxied = _on_both(test_db, proxy, (*map(_statement, statements), SYNC), *_SETTINGS)
    assert proxied == direct
    assert direct[0][-2][:2] == (b"E", b"25P01")  # and the SET before it is rolled back
    assert direct[1][0] == (b"D", b"Etc/UTC")


@pytest.mark.parametrize("sql", [
    "SET TimeZone = 'Asia/Tokyo'; SAVEPOINT a; SELECT 1",
    "SELECT 1; RELEASE SAVEPOINT a",
    "SET TimeZone = 'Asia/Tokyo'; COMMIT AND CHAIN; SELECT 1",
], ids=["savepoint", "release", "commit-and-chain"])
def test_a_query_strings_savepoints_and_chains_are_refused_outside_a_block_as_on_postgresql(
        proxy: RunningProxy, test_db: TestDatabase, sql: str):
    direct, proxied = _on_both(test_db, proxy, (_query(sql),), *_SETTINGS)
    assert proxied == direct
    assert direct[0][-2][:2] == (b"E", b"25P01")


@pytest.mark.parametrize("sql", [
    "SET DateStyle = 'German'; COMMIT; SET TimeZone = 'Asia/Tokyo'; SELECT 1/0",
    "SET DateStyle = 'German'; ROLLBACK; SET TimeZone = 'Asia/Tokyo'; SELECT 1/0",
    "SELECT 1; COMMIT; SET TimeZone = 'Asia/Tokyo'; SAVEPOINT a",
    "COMMIT; SET LOCAL TimeZone = 'Asia/Tokyo'; SHOW TimeZone",
    "SELECT 1; ROLLBACK; SET TimeZone = 'Asia/Tokyo'; SELECT 2",
    "SELECT 1; COMMIT; BEGIN; SET TimeZone = 'Asia/Tokyo'",
], ids=["commit", "rollback", "savepoint-after-commit", "set-local-after-commit", "kept", "begin-after-commit"])
def test_what_follows_a_commit_in_a_query_string_runs_in_a_new_implicit_transaction_as_on_postgresql(
        proxy: RunningProxy, test_db: TestDatabase, sql: str):
    """PostgreSQL warns that there is no transaction in progress, ends the implicit one (the
    SET before a COMMIT stays, before a ROLLBACK goes), and runs the rest in a new one: the SET
    after it is undone by the error that follows, and SET LOCAL lasts to the string's end."""
    direct, proxied = _on_both(test_db, proxy, (_query(sql),), (_query("ROLLBACK"),), *_SETTINGS)
    assert proxied == direct
    assert _NO_TRANSACTION in direct[0]


def test_a_commit_or_rollback_in_a_pipeline_that_set_something_warns_as_on_postgresql(
        proxy: RunningProxy, test_db: TestDatabase):
    direct, proxied = _on_both(
        test_db, proxy,
        (_statement("SET TimeZone = 'Asia/Tokyo'"), _statement("ROLLBACK"), _statement("SET DateStyle = 'German'"),
         _statement("COMMIT"), _statement("SET DateStyle = 'SQL'"), SYNC),
        *_SETTINGS)
    assert proxied == direct
    assert direct[0].count(_NO_TRANSACTION) == 2
    assert direct[1][0] == (b"D", b"Etc/UTC") and direct[2][0] == (b"D", b"SQL, DMY")


_HELD = "DECLARE c CURSOR WITH HOLD FOR SELECT code FROM lookup ORDER BY code"
_FAILS_AT_EXECUTE = "SELECT 1 / (count(*) - 2) FROM lookup"  # 22012 (1/0 fails at Bind on PostgreSQL)


@pytest.mark.parametrize("pipeline", [
    (_statement(_HELD), _statement("FETCH 1 FROM c"), SYNC),
    (_statement("SELECT 1"), _statement(_HELD), SYNC),
    (_statement(_HELD), _statement("FETCH 1 FROM c"), _statement(_FAILS_AT_EXECUTE), SYNC),
    (_statement(_HELD), _statement("DECLARE d CURSOR FOR SELECT 1"), SYNC),
    (_statement("SET TimeZone = 'Asia/Tokyo'"), _statement("DECLARE d CURSOR FOR SELECT 1"), SYNC),
    (_statement("DECLARE d CURSOR FOR SELECT 1"), SYNC),
], ids=["held", "held-after-a-read", "held-then-an-error", "without-hold-after-one", "without-hold-after-a-set",
        "without-hold"])
def test_a_cursor_declared_in_a_pipeline_lives_and_dies_with_it_as_on_postgresql(
        proxy: RunningProxy, test_db: TestDatabase, pipeline: tuple[bytes, ...]):
    """WITH HOLD it outlives the pipeline only if the pipeline commits; without, a pipeline's
    implicit transaction being no block, it is refused (25P01), after a SET as well."""
    direct, proxied = _on_both(test_db, proxy, pipeline, (_query("FETCH ALL FROM c"),), (_query("CLOSE c"),))
    assert proxied == direct


def test_a_pipelines_declare_on_a_protected_table_stays_refused(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)
    try:
        (got,) = replies(wire, (_statement("SET TimeZone = 'Asia/Tokyo'"),
                                     _statement("DECLARE c CURSOR WITH HOLD FOR SELECT age FROM adult"), SYNC))
        assert [reply[0] for reply in got] == [b"1", b"2", b"C", b"E", b"Z"]  # refused at its Parse
        assert got[-2][1] == b"DP001"
        (fetched,) = replies(wire, (_query("FETCH 1 FROM c"),))
        assert fetched[0][:2] == (b"E", b"34000")
    finally:
        wire.close()
