"""``SET dpproxy.epsilon`` behaves as a PostgreSQL setting across transactions: a SET in a block
that is rolled back is undone (also by ROLLBACK TO SAVEPOINT), SET LOCAL lasts until the
transaction's end, and a DP answer is charged and noised at the ε in force when it runs."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import psycopg
import pytest

from conftest import TEST_DATABASE, RunningProxy, spent_epsilon
from proxy.serving import settings as settings_module

COUNT = "SELECT COUNT(*) FROM adult WHERE age > 30"


@pytest.fixture
def conn(proxy: RunningProxy) -> Iterator[psycopg.Connection]:
    with proxy.connect() as connection:
        connection.notices = []  # type: ignore[attr-defined]
        connection.add_notice_handler(lambda d: connection.notices.append((d.severity_nonlocalized, d.message_primary)))  # type: ignore[attr-defined]
        yield connection


def _shown(conn: psycopg.Connection) -> str:
    row = conn.execute("SHOW dpproxy.epsilon").fetchone()
    assert row is not None
    return str(row[0])


def _charged(conn: psycopg.Connection, sql: str = COUNT) -> float:
    """What one fresh DP answer costs now, read from the budget and checked against its notice."""
    before = spent_epsilon(conn)
    conn.notices.clear()  # type: ignore[attr-defined]
    conn.execute(sql)
    charged = spent_epsilon(conn) - before
    assert any(f"ε charged {charged:g}," in text for _, text in conn.notices)  # type: ignore[attr-defined]
    return charged


@pytest.mark.parametrize(("before", "setting", "inside", "end", "after"), [
    ("RESET dpproxy.epsilon", "SET dpproxy.epsilon = 0.25", 0.25, "ROLLBACK", 1.0),
    ("SET dpproxy.epsilon = 0.5", "SET LOCAL dpproxy.epsilon = 0.125", 0.125, "COMMIT", 0.5),
], ids=["a SET in a rolled-back block is undone", "SET LOCAL lasts until the end of the transaction"])
def test_a_dp_answer_is_charged_at_the_epsilon_in_force(conn, before, setting, inside, end, after):
    conn.execute(before)
    conn.execute("BEGIN")
    conn.execute(setting)
    assert _shown(conn) == f"{inside:g}"
    assert _charged(conn) == pytest.approx(inside)
    conn.execute(end)
    assert _shown(conn) == ("default" if after == 1.0 else f"{after:g}")
    assert _charged(conn) == pytest.approx(after)
    conn.execute("RESET dpproxy.epsilon")


# Scripts of statements, each followed by what SHOW dpproxy.epsilon must say after it (None:
# not checked); each leaves the session's ε at its default.
_SCRIPTS = {
    "a SET in a committed block stays": [
        ("BEGIN", None), ("SET SESSION dpproxy.epsilon = 0.25", "0.25"), ("COMMIT", "0.25"),
        ("RESET dpproxy.epsilon", "default"),
    ],
    "SET then SET LOCAL: the commit keeps the SET": [
        ("BEGIN", None), ("SET dpproxy.epsilon = 0.5", None), ("SET LOCAL dpproxy.epsilon = 0.25", "0.25"),
        ("COMMIT", "0.5"), ("RESET dpproxy.epsilon", "default"),
    ],
    "SET LOCAL then SET: the commit keeps the SET": [
        ("BEGIN", None), ("SET LOCAL dpproxy.epsilon = 0.25", None), ("SET dpproxy.epsilon = 0.75", "0.75"),
        ("COMMIT", "0.75"), ("SET dpproxy.epsilon TO DEFAULT", "default"),
    ],
    "ROLLBACK TO SAVEPOINT undoes what was set after it, RELEASE keeps it": [
        ("BEGIN", None), ("SET dpproxy.epsilon = 0.5", None), ("SAVEPOINT a", None),
        ("SET dpproxy.epsilon = 0.25", None), ("SAVEPOINT b", None), ("SET LOCAL dpproxy.epsilon = 0.125", "0.125"),
        ("ROLLBACK TO SAVEPOINT a", "0.5"),
        ("SET dpproxy.epsilon = 0.25", None), ("ROLLBACK TO a", "0.5"),  # the savepoint stays after a rollback to it
        ("SAVEPOINT c", None), ("SET dpproxy.epsilon = 0.375", None), ("RELEASE SAVEPOINT c", "0.375"),
        ("COMMIT", "0.375"), ("RESET dpproxy.epsilon", "default"),
    ],
    "COMMIT AND CHAIN and ROLLBACK AND CHAIN end SET LOCAL": [
        ("BEGIN", None), ("SET LOCAL dpproxy.epsilon = 0.25", None), ("COMMIT AND CHAIN", "default"),
        ("SET LOCAL dpproxy.epsilon = 0.25", None), ("ROLLBACK AND CHAIN", "default"), ("ROLLBACK", "default"),
    ],
    "RESET ALL in a rolled-back block is undone": [
        ("SET dpproxy.epsilon = 0.25", None), ("BEGIN", None), ("RESET ALL", "default"), ("ROLLBACK", "0.25"),
        ("RESET dpproxy.epsilon", "default"),
    ],
    "SET FROM CURRENT changes nothing": [
        ("SET dpproxy.epsilon = 0.25", None), ("SET dpproxy.epsilon FROM CURRENT", "0.25"),
        ("RESET dpproxy.epsilon", "default"),
    ],
}


@pytest.mark.parametrize("script", _SCRIPTS.values(), ids=_SCRIPTS.keys())
def test_dpproxy_epsilon_follows_postgresql_setting_rules_in_transactions(conn, script):
    for statement, shown in script:
        conn.execute(statement)
        if shown is not None:
            assert _shown(conn) == shown, statement


def test_set_local_outside_a_block_warns_and_changes_nothing(conn):
    conn.execute("SET LOCAL dpproxy.epsilon = 0.25")
    assert ("WARNING", "SET LOCAL can only be used in transaction blocks") in conn.notices  # type: ignore[attr-defined]
    assert _shown(conn) == "default"


def test_a_backend_warning_reaches_the_client_as_a_warning_with_its_sqlstate(conn):
    # Before, every notice of the backend went on as a NOTICE with SQLSTATE 00000.
    codes = []
    conn.add_notice_handler(lambda d: codes.append(d.sqlstate))
    conn.execute("COMMIT")
    assert ("WARNING", "there is no transaction in progress") in conn.notices  # type: ignore[attr-defined]
    assert "25P01" in codes


def test_an_error_then_rollback_to_savepoint_undoes_the_set_and_the_block_goes_on(conn):
    conn.execute("BEGIN")
    conn.execute("SAVEPOINT s")
    conn.execute("SET dpproxy.epsilon = 0.25")
    with pytest.raises(psycopg.errors.DivisionByZero):
        conn.execute("SELECT 1/0")
    conn.execute("ROLLBACK TO SAVEPOINT s")
    assert _shown(conn) == "default"
    assert _charged(conn) == pytest.approx(1.0)
    conn.execute("COMMIT")


def test_in_a_failed_block_dpproxy_settings_are_refused_and_commit_rolls_back(conn):
    conn.execute("BEGIN")
    conn.execute("SET dpproxy.epsilon = 0.25")
    with pytest.raises(psycopg.errors.DivisionByZero):
        conn.execute("SELECT 1/0")
    for statement in ("SET dpproxy.epsilon = 0.5", "SHOW dpproxy.epsilon", "RESET dpproxy.epsilon"):
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            conn.execute(statement)
    conn.execute("COMMIT")  # in a failed block, PostgreSQL's COMMIT rolls back
    assert _shown(conn) == "default"


def test_a_query_string_is_one_transaction_for_dpproxy_epsilon_too(conn):
    with pytest.raises(psycopg.errors.DivisionByZero):
        conn.execute("SET dpproxy.epsilon = 0.25; SELECT 1/0")
    assert _shown(conn) == "default"  # the implicit block was rolled back
    before = spent_epsilon(conn)
    conn.execute(f"SET LOCAL dpproxy.epsilon = 0.25; {COUNT}")
    assert spent_epsilon(conn) - before == pytest.approx(0.25)
    assert "SET LOCAL can only be used in transaction blocks" not in [text for _, text in conn.notices]  # type: ignore[attr-defined]
    assert _shown(conn) == "default"  # SET LOCAL ended with the string's transaction


def test_extended_protocol_set_local_in_a_block(proxy: RunningProxy):
    with psycopg.connect(proxy.dsn()) as conn:  # psycopg's own BEGIN, statements prepared
        conn.execute("SET LOCAL dpproxy.epsilon = 0.25", prepare=True)
        assert conn.execute("SHOW dpproxy.epsilon", prepare=True).fetchone() == ("0.25",)
        conn.rollback()
        assert conn.execute("SHOW dpproxy.epsilon", prepare=True).fetchone() == ("default",)


def test_a_dp_answer_in_a_rolled_back_block_stays_charged(conn):
    before = spent_epsilon(conn)
    conn.execute("BEGIN")
    conn.execute(COUNT)
    conn.execute("ROLLBACK")
    assert spent_epsilon(conn) - before == pytest.approx(1.0)  # the answer was released


@pytest.mark.parametrize("value", ["'NaN'", "'nan'", "'abc'", "''", "'0x1p-3'"])
def test_a_dpproxy_epsilon_that_is_no_number_is_refused_and_the_epsilon_in_force_stays(conn, value):
    # NaN passes both range checks (every comparison with it is false): only the positive-and-
    # finite check refuses it, and a text that is no number, which is read as NaN.
    conn.execute("SET dpproxy.epsilon = 0.25")
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        conn.execute(f"SET dpproxy.epsilon = {value}")
    assert refused.value.diag.message_primary == f'invalid value for dpproxy.epsilon: "{value[1:-1]}"'
    assert refused.value.diag.message_hint == "Give a positive number, e.g. SET dpproxy.epsilon = 0.1."
    assert _shown(conn) == "0.25" and _charged(conn) == pytest.approx(0.25)
    conn.execute("RESET dpproxy.epsilon")


def test_current_setting_and_set_config_of_dpproxy_epsilon_are_refused_not_misread(conn):
    conn.execute("SET dpproxy.epsilon = 0.25")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT set_config('dpproxy.epsilon', '0.5', false)")
    with pytest.raises(psycopg.Error):  # the backend knows no such setting: never a stale value
        conn.execute("SELECT current_setting('dpproxy.epsilon')")
    assert _shown(conn) == "0.25"
    conn.execute("RESET dpproxy.epsilon")


def test_dpproxy_epsilon_in_the_startup_packet_is_the_sessions_and_reset_returns_to_it(proxy: RunningProxy):
    # Before, it was dropped without a word: the client asked for ε 0.25 and paid 1 per query.
    async def scenario() -> None:
        conn = await asyncpg.connect(host=proxy.host, port=proxy.port, user="analyst", password="analyst",
                                     database=TEST_DATABASE, server_settings={"dpproxy.epsilon": "0.25"},
                                     statement_cache_size=0)  # DISCARD ALL drops prepared statements
        try:
            assert await conn.fetchval("SHOW dpproxy.epsilon") == "0.25"
            await conn.execute("SET dpproxy.epsilon = 0.5")
            await conn.execute("RESET dpproxy.epsilon")  # back to the startup value, as PostgreSQL's
            assert await conn.fetchval("SHOW dpproxy.epsilon") == "0.25"
            await conn.execute("SET dpproxy.epsilon = 0.5")
            await conn.execute("DISCARD ALL")
            assert await conn.fetchval("SHOW dpproxy.epsilon") == "0.25"
        finally:
            await conn.close()
        with pytest.raises(asyncpg.PostgresError) as refused:
            await asyncpg.connect(host=proxy.host, port=proxy.port, user="analyst", password="analyst",
                                  database=TEST_DATABASE, server_settings={"dpproxy.epsilon": "1000"})
        assert refused.value.sqlstate == "DP003"

    asyncio.run(scenario())


def test_savepoints_beyond_the_limit_are_refused_before_they_reach_the_backend(conn, monkeypatch):
    # Each open savepoint keeps a frame in dpproxy's memory, shared by every session.
    monkeypatch.setattr(settings_module, "MAX_SAVEPOINTS", 3)
    conn.execute("BEGIN")
    for name in ("a", "b", "c"):
        conn.execute(f"SAVEPOINT {name}")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
        conn.execute("SAVEPOINT d")
    # The refusal failed the block, as any error does on PostgreSQL; back to c it goes on.
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        conn.execute("RELEASE c")
    conn.execute("ROLLBACK TO SAVEPOINT c")
    conn.execute("RELEASE c")
    conn.execute("SAVEPOINT d")
    with pytest.raises(psycopg.errors.ProgramLimitExceeded):
        conn.execute("SAVEPOINT e")
    conn.execute("ROLLBACK")
