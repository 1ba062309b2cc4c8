"""A statement dpproxy refuses inside a transaction block fails the block, as any error does on
PostgreSQL.

PostgreSQL, after an error in a block, reports the block failed (ReadyForQuery 'E'), refuses
every statement but ROLLBACK, COMMIT and ROLLBACK TO SAVEPOINT (25P02), and answers a COMMIT
with ROLLBACK. dpproxy's own refusals (a SELECT of a protected table's rows, a portal's name
clash) never reached the backend, whose block stayed usable: the client was told 'T', the
statements after the refusal ran, and a COMMIT kept the settings the client's own code (psql's
``\\set ON_ERROR_STOP``, psycopg's transaction, pgjdbc's) took for undone. Each case sends the
same messages to PostgreSQL directly, failing there with ``SELECT 1/0``, and through dpproxy,
failing with a refused statement, in the same run; the replies after the failure must match.
"""

from __future__ import annotations

import psycopg
import pytest

from conftest import TEST_POLICY, RunningProxy, TestDatabase, running_proxy, spent_epsilon
from wire import SYNC, Reply, Wire, bind, cstr, execute, message, parse, replies

_REFUSED = "SELECT * FROM adult"  # a protected table's rows: refused by dpproxy, never sent
_FAILS = "SELECT 1/0"  # an error PostgreSQL's own block fails on


def _query(sql: str) -> bytes:
    return message(b"Q", cstr(sql))


def _statement(sql: str) -> bytes:
    return parse("", sql) + bind("", "") + execute("")


def _after_failure(test_db: TestDatabase, proxy: RunningProxy, before: tuple[tuple[bytes, ...], ...],
                   extended: bool, after: tuple[tuple[bytes, ...], ...]
                   ) -> tuple[list[list[Reply]], list[list[Reply]], list[Reply]]:
    """The replies to ``after`` on PostgreSQL (``before``, then ``SELECT 1/0`` as a simple Query,
    or with ``extended`` as Parse, Bind, Execute and Sync) and through dpproxy (the refused
    statement in its place), and dpproxy's replies to the refused statement itself."""
    def run(wire: Wire, sql: str) -> tuple[list[list[Reply]], list[Reply]]:
        request = (_statement(sql), SYNC) if extended else (_query(sql),)
        answered = replies(wire, *before, request, *after)
        return answered[len(before) + 1:], answered[len(before)]

    direct_wire, proxied_wire = Wire.direct(test_db.admin_dsn), Wire(proxy.host, proxy.port)
    try:
        direct, direct_failure = run(direct_wire, _FAILS)
        proxied, refusal = run(proxied_wire, _REFUSED)
    finally:
        direct_wire.close()
        proxied_wire.close()
    assert direct_failure[-1] == (b"Z", b"E")
    return direct, proxied, refusal


def _without_reports(answered: list[list[Reply]]) -> list[list[Reply]]:
    """``answered`` without ParameterStatus: PostgreSQL reports no setting that a rollback of a
    failed block restores; dpproxy reports the value its client now has."""
    return [[reply for reply in replies if reply[0] != b"S"] for replies in answered]


_ABORTED = (b"E", b"25P02", b"current transaction is aborted, commands ignored until end of transaction block")


@pytest.mark.parametrize("extended", [False, True], ids=["simple", "extended"])
def test_a_refusal_in_a_block_fails_the_block_and_commit_answers_rollback_as_on_postgresql(
        proxy: RunningProxy, test_db: TestDatabase, extended: bool):
    direct, proxied, refusal = _after_failure(
        test_db, proxy, ((_query("BEGIN"),), (_query("SET TimeZone = 'Asia/Tokyo'"),)),
        extended,
        ((_query("SELECT 1"),), (_statement("SELECT 2"), SYNC), (_query("COMMIT"),), (_query("SHOW TimeZone"),)))
    assert refusal[0][0] == b"E" and refusal[-1] == (b"Z", b"E")
    # PostgreSQL refuses the Parse in a failed block; dpproxy answers Parse and Bind and
    # refuses the Execute: the same error, one message later.
    assert [r for r in proxied[1] if r[0] not in (b"1", b"2")] == direct[1]
    assert _without_reports(proxied[:1] + proxied[2:]) == _without_reports(direct[:1] + direct[2:])
    assert direct[0] == [_ABORTED, (b"Z", b"E")]
    assert direct[2] == [(b"C", b"ROLLBACK"), (b"Z", b"I")]
    assert direct[3][0] == (b"D", b"Etc/UTC")  # the block's SET is undone


_IN_A_FAILED_BLOCK = [
    "SELECT 1", "SHOW TimeZone", "SET TimeZone = 'Asia/Tokyo'", "SET LOCAL TimeZone = 'Asia/Tokyo'",
    "SET dpproxy.epsilon = 0.5", "RESET dpproxy.epsilon", "SHOW dpproxy.epsilon",
    "DECLARE c CURSOR FOR SELECT 1", "FETCH c", "CLOSE c", "DEALLOCATE ALL",
    "SELECT COUNT(*) FROM adult", "SAVEPOINT b", "RELEASE SAVEPOINT a", "BEGIN",
]


@pytest.mark.parametrize("sql", _IN_A_FAILED_BLOCK)
def test_a_block_failed_by_a_refusal_refuses_what_postgresql_refuses_in_a_failed_block(
        proxy: RunningProxy, test_db: TestDatabase, sql: str):
    direct, proxied, _ = _after_failure(
        test_db, proxy, ((_query("BEGIN"),), (_query("SAVEPOINT a"),)), False,
        ((_query(sql),), (_query("ROLLBACK"),), (_query("SELECT 1"),)))
    assert proxied == direct
    assert direct[0][-2][:2] == (b"E", b"25P02")


def test_rollback_to_a_savepoint_restores_a_block_failed_by_a_refusal_as_on_postgresql(
        proxy: RunningProxy, test_db: TestDatabase):
    direct, proxied, _ = _after_failure(
        test_db, proxy, ((_query("BEGIN"),), (_query("SAVEPOINT a"),), (_query("SET LOCAL TimeZone = 'Asia/Tokyo'"),)),
        False,
        ((_query("SHOW TimeZone"),), (_query("ROLLBACK TO SAVEPOINT a"),), (_query("SHOW TimeZone"),),
         (_query("SET LOCAL DateStyle = 'German'"),), (_query("COMMIT"),), (_query("SHOW DateStyle"),)))
    assert _without_reports(proxied) == _without_reports(direct)
    assert direct[0] == [_ABORTED, (b"Z", b"E")]
    assert direct[2][0] == (b"D", b"Etc/UTC") and direct[4][0] == (b"C", b"COMMIT")


def test_a_refusal_in_a_block_closes_its_cursors_and_charges_nothing(proxy: RunningProxy):
    wire = Wire(proxy.host, proxy.port)
    with psycopg.connect(proxy.dsn(user="plain", password="plain"), autocommit=True) as conn:
        before = spent_epsilon(conn)
        answered = replies(wire, (_query("BEGIN"),), (_query("DECLARE c CURSOR FOR SELECT 1"),), (_query(_REFUSED),),
                           (_query("SELECT COUNT(*) FROM adult"),), (_query("COMMIT"),), (_query("FETCH c"),))
        assert spent_epsilon(conn) == before
    wire.close()
    assert answered[2][-1] == (b"Z", b"E") and answered[3] == [_ABORTED, (b"Z", b"E")]
    assert answered[4] == [(b"C", b"ROLLBACK"), (b"Z", b"I")]
    assert answered[5][0][:2] == (b"E", b"34000")  # the cursor went with the block


def test_a_portal_name_clash_in_a_block_fails_the_block_as_on_postgresql(proxy: RunningProxy, test_db: TestDatabase):
    clash = (parse("s", "SELECT 1"), bind("p", "s"), bind("p", "s"), SYNC)
    requests = ((_query("BEGIN"),), clash, (_query("SELECT 1"),), (_query("COMMIT"),))
    direct_wire, proxied_wire = Wire.direct(test_db.admin_dsn), Wire(proxy.host, proxy.port)
    try:
        direct, proxied = replies(direct_wire, *requests), replies(proxied_wire, *requests)
    finally:
        direct_wire.close()
        proxied_wire.close()
    assert proxied == direct
    assert direct[1][-2][:2] == (b"E", b"42P03") and direct[1][-1] == (b"Z", b"E")
    assert direct[3] == [(b"C", b"ROLLBACK"), (b"Z", b"I")]


def test_psycopg_sees_a_block_failed_by_a_refusal_as_failed(proxy: RunningProxy):
    """psycopg, autocommit off, after the refusal: the connection is INERROR, the next statement
    fails with InFailedSqlTransaction, and its rollback makes the connection usable again."""
    with psycopg.connect(proxy.dsn(user="plain", password="plain")) as conn:
        conn.execute("SET TimeZone = 'Asia/Tokyo'")
        with pytest.raises(psycopg.Error):
            conn.execute(_REFUSED)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute("SELECT 1")
        conn.rollback()
        assert conn.execute("SHOW TimeZone").fetchone() == ("Etc/UTC",)


@pytest.mark.parametrize("declared", ["SELECT 1", "SELECT COUNT(*) FROM adult"], ids=["passthrough", "dp"])
def test_a_declare_named_like_an_open_protocol_portal_is_refused_as_on_postgresql_before_any_charge(
        proxy: RunningProxy, test_db: TestDatabase, declared: str):
    """In PostgreSQL a SQL cursor is a portal: DECLARE p while the client's portal p is open
    is refused (42P03). dpproxy declared it (a DP one charged), two portals of one name."""
    def requests(sql: str) -> tuple[tuple[bytes, ...], ...]:
        return ((_query("BEGIN"),), (parse("s", "SELECT 1"), bind("p", "s"), SYNC),
                (_query(f"DECLARE p CURSOR FOR {sql}"),), (_query("COMMIT"),))

    direct_wire, proxied_wire = Wire.direct(test_db.admin_dsn), Wire(proxy.host, proxy.port)
    try:
        direct = replies(direct_wire, *requests("SELECT 1"))
        with psycopg.connect(proxy.dsn(user="plain", password="plain"), autocommit=True) as conn:
            before = spent_epsilon(conn)
            proxied = replies(proxied_wire, *requests(declared))
            assert spent_epsilon(conn) == before
    finally:
        direct_wire.close()
        proxied_wire.close()
    assert proxied == direct
    assert direct[2] == [(b"E", b"42P03", b'cursor "p" already exists'), (b"Z", b"E")]


_SMALL_BUDGET = TEST_POLICY.replace(
    "    auth: cleartext       # for the raw-protocol tests, which speak only cleartext\n"
    "    budget: {{epsilon: 1000000, delta: 0.5}}",
    "    auth: cleartext\n    budget: {{epsilon: 1.5, delta: 0.5}}")


def test_a_dp_query_over_budget_in_a_block_fails_the_block_and_is_charged_once(
        test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory):
    assert _SMALL_BUDGET != TEST_POLICY
    with running_proxy(test_db, tmp_path_factory, _SMALL_BUDGET) as small:
        wire = Wire(small.host, small.port)
        try:
            answered = replies(wire, (_query("BEGIN"),), (_query("SELECT COUNT(*) FROM adult"),),
                               (_query("SELECT COUNT(*) FROM adult WHERE age > 30"),),
                               (_query("SELECT COUNT(*) FROM adult WHERE age > 40"),), (_query("COMMIT"),))
        finally:
            wire.close()
        with psycopg.connect(small.dsn(user="plain", password="plain"), autocommit=True) as conn:
            assert spent_epsilon(conn) == 1.0  # the answered one alone
    assert answered[1][-1] == (b"Z", b"T")
    assert answered[2][0][0] == b"E" and answered[2][-1] == (b"Z", b"E")  # over budget: the block fails
    assert answered[3] == [_ABORTED, (b"Z", b"E")]
    assert answered[4] == [(b"C", b"ROLLBACK"), (b"Z", b"I")]
