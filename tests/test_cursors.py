"""SQL cursors through dpproxy: DECLARE, FETCH, MOVE, CLOSE answered where the cursor's SELECT is.

A cursor over a DP query is the query's release, made (and charged) once at DECLARE and kept;
FETCH and MOVE hand its rows out as PostgreSQL's portal would. A cursor over a passthrough
query lives on the backend. psql's FETCH_COUNT and psycopg's named cursors use them.
"""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pandas as pd
import psycopg
import pytest
import sqlalchemy
from wire import SYNC, Wire, bind, data_row_values, describe, execute, parse

from conftest import (
    TEST_DATABASE, TEST_POLICY, RunningProxy, TestDatabase, lookup_protected_file, make_policy, psql_path, running_proxy,
    spent_epsilon,
)

# Histograms over declared keys: sex (2 cells) and age (17..90, 74 cells).
POLICY = TEST_POLICY.replace(
    "sex: {{categories: [Male, Female]}}", "sex: {{categories: [Male, Female], group_by: true}}"
).replace("age: {{bounds: [17, 90]}}", "age: {{bounds: [17, 90], group_by: true}}")
REPEATING = POLICY.replace("repeats: {{enabled: false}}", "repeats: {{enabled: true}}")

HISTOGRAM = "SELECT age, count(*) FROM adult GROUP BY age ORDER BY age"


@pytest.fixture(scope="module")
def cproxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """Fresh noise per query: each DECLARE is a charge of its own."""
    with running_proxy(test_db, tmp_path_factory, POLICY) as running:
        yield running


@pytest.fixture(scope="module")
def rproxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """Repeats on: the same query (a cursor's or not) gets the same released values."""
    with running_proxy(test_db, tmp_path_factory, REPEATING) as running:
        yield running


def _psql(proxy: RunningProxy, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PGPASSWORD": "analyst", "PGSSLMODE": "prefer", "PGCONNECT_TIMEOUT": "10"}
    return subprocess.run(
        [psql_path(), "-X", "-h", proxy.host, "-p", str(proxy.port), "-U", "analyst", "-d", "dpproxy_test",
         "-v", "ON_ERROR_STOP=1", *args],
        input=script, capture_output=True, text=True, env=env, timeout=60,
    )


def _error(conn: psycopg.Connection, sql: str) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as raised:
        conn.execute(sql)
    return raised.value


def _sqlstate(conn: psycopg.Connection, sql: str) -> tuple[str | None, str | None]:
    error = _error(conn, sql)
    return error.diag.sqlstate, error.diag.message_primary


# ------------------------------------------------------------------ psql FETCH_COUNT


PSQL_QUERIES = [
    "SELECT count(*) FROM adult WHERE age > 40;",
    HISTOGRAM + ";",
    "SELECT c.relname, c.relkind FROM pg_catalog.pg_class c WHERE c.relname IN ('adult', 'lookup', 'pg_type') ORDER BY 1;",
    "SELECT 1;",
]


@pytest.mark.parametrize("query", PSQL_QUERIES, ids=["dp-count", "dp-histogram", "catalog", "select-1"])
def test_psql_fetch_count_answers_as_without_it(rproxy: RunningProxy, query: str):
    # psql then sends BEGIN; DECLARE _psql_cursor NO SCROLL CURSOR FOR ...; FETCH FORWARD 2 ...; CLOSE; COMMIT.
    plain = _psql(rproxy, query, "-A")
    fetched = _psql(rproxy, query, "-A", "-v", "FETCH_COUNT=2")
    assert plain.returncode == 0 and fetched.returncode == 0, (plain.stderr, fetched.stderr)
    assert fetched.stdout == plain.stdout  # a repeat: the same released values, in the same rows
    assert "(1 row)" in plain.stdout or "rows)" in plain.stdout


def test_psql_fetch_count_in_aligned_output_prints_every_histogram_row(rproxy: RunningProxy):
    result = _psql(rproxy, HISTOGRAM + ";", "-v", "FETCH_COUNT=2")
    assert result.returncode == 0, result.stderr
    assert "(74 rows)" in result.stdout
    assert "dpproxy: ε charged" in result.stderr


# ------------------------------------------------------------------ psycopg named cursors


@pytest.mark.parametrize("hold", [False, True], ids=["without-hold", "with-hold"])
@pytest.mark.parametrize("query", [HISTOGRAM, "SELECT code, label FROM lookup ORDER BY code"], ids=["dp", "public"])
def test_psycopg_named_cursor_iterates_as_the_plain_select(rproxy: RunningProxy, query: str, hold: bool):
    with rproxy.connect(autocommit=False) as conn:
        plain = conn.execute(query).fetchall()
        conn.commit()
        with conn.cursor(name="stream", withhold=hold) as cur:
            cur.itersize = 3  # FETCH FORWARD 3 at a time
            cur.execute(query)
            streamed = list(cur)
        conn.commit()
    assert streamed == plain and len(plain) >= 2


def test_psycopg_named_cursor_takes_parameters_as_the_plain_select(rproxy: RunningProxy):
    query = "SELECT count(*), sum(hours_per_week) FROM adult WHERE age > %s"
    with rproxy.connect(autocommit=False) as conn:
        plain = conn.execute(query, [40]).fetchall()
        with conn.cursor(name="param") as cur:
            cur.execute(query, [40])
            assert cur.fetchall() == plain
        with conn.cursor(name="binary_param", binary=True) as cur:  # FETCH in binary format
            cur.execute(query, [40])
            assert cur.fetchall() == plain
        with conn.cursor(name="public_param") as cur:
            cur.execute("SELECT label FROM lookup WHERE code = %s", ["M"])
            assert cur.fetchall() == [("Male",)]
        conn.commit()


def test_psycopg_named_cursor_scrolls_a_dp_histogram(rproxy: RunningProxy):
    with rproxy.connect(autocommit=False) as conn:
        plain = conn.execute(HISTOGRAM).fetchall()
        with conn.cursor(name="scroll", scrollable=True) as cur:
            cur.execute(HISTOGRAM)
            assert cur.fetchmany(2) == plain[:2]
            cur.scroll(10, mode="absolute")
            assert cur.fetchone() == plain[10]
            cur.scroll(-3)
            assert cur.fetchone() == plain[8]
        conn.rollback()


def test_sqlalchemy_stream_results_and_pandas_chunks_read_a_dp_histogram(rproxy: RunningProxy):
    url = sqlalchemy.URL.create("postgresql+psycopg", username="analyst", password="analyst", host=rproxy.host,
                                port=rproxy.port, database=TEST_DATABASE)
    engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 10})
    try:
        with engine.connect() as conn:
            plain = [tuple(row) for row in conn.execute(sqlalchemy.text(HISTOGRAM))]
            streamed = conn.execution_options(stream_results=True, max_row_buffer=5).execute(sqlalchemy.text(HISTOGRAM))
            assert [tuple(row) for row in streamed] == plain
            chunks = list(pd.read_sql(sqlalchemy.text(HISTOGRAM), conn, chunksize=20))
            assert [len(chunk) for chunk in chunks] == [20, 20, 20, 14]
            assert [tuple(row) for chunk in chunks for row in chunk.itertuples(index=False)] == plain
    finally:
        engine.dispose()


@pytest.mark.parametrize("query", ["SELECT count(*) FROM adult WHERE age > $1",
                                   "SELECT count(*) FROM lookup WHERE code > $1::text"], ids=["dp", "public"])
def test_declare_and_fetch_by_parse_bind_describe_execute(cproxy: RunningProxy, query: str):
    wire = Wire(cproxy.host, cproxy.port)
    wire.send(parse("d", f"DECLARE c CURSOR WITH HOLD FOR {query}"), describe(b"S", "d"),
              bind("", "d", (b"40",)), describe(b"P", ""), execute(""), SYNC)
    # ParseComplete, ParameterDescription, NoData (DECLARE has no rows), BindComplete, NoData,
    # (a DP one's NOTICE of its charge) CommandComplete.
    assert [kind for kind, _ in wire.read_until(b"Z") if kind != b"N"] == [b"1", b"t", b"n", b"2", b"n", b"C", b"Z"]
    wire.send(parse("f", "FETCH ALL FROM c"), describe(b"S", "f"), bind("", "f"), describe(b"P", ""),
              execute(""), describe(b"P", "c"), SYNC)
    replies = wire.read_until(b"Z")
    assert [kind for kind, _ in replies] == [b"1", b"t", b"T", b"2", b"T", b"D", b"C", b"T", b"Z"]
    (row,) = [data_row_values(body) for kind, body in replies if kind == b"D"]
    assert int(row[0] or b"0") >= 0 and replies[-3][1].startswith(b"FETCH 1")
    wire.close()


# ------------------------------------------------------------------ FETCH and MOVE against PostgreSQL's


def _directions(rng: random.Random) -> str:
    n = rng.choice([0, 1, 2, 5, 73, 74, 75, 200])
    signed = rng.choice([n, -n])
    return rng.choice([
        "", "NEXT", "PRIOR", "FIRST", "LAST", f"ABSOLUTE {signed}", f"RELATIVE {signed}", f"{signed}", "ALL",
        "FORWARD", f"FORWARD {signed}", "FORWARD ALL", "BACKWARD", f"BACKWARD {signed}", "BACKWARD ALL",
    ])


def _step(conn: psycopg.Connection, sql: str) -> tuple[str, list[object]]:
    cur = conn.execute(sql)
    rows = [row[0] for row in cur.fetchall()] if cur.description else []
    return cur.statusmessage or "", rows


def test_every_fetch_direction_on_a_scroll_dp_cursor_moves_as_postgresql_s(cproxy: RunningProxy, test_db: TestDatabase):
    """The DP cursor's rows are ages 17..90 (one cell each); PostgreSQL's own cursor over those
    ages must give the same rows and tags for every FETCH and MOVE, and so must the same
    passthrough cursor through dpproxy."""
    rng = random.Random(7)
    ages = "SELECT g FROM generate_series(17, 90) AS g ORDER BY g"
    with cproxy.connect(autocommit=False) as conn, psycopg.connect(test_db.admin_dsn, autocommit=False) as pg:
        conn.execute(f"DECLARE c SCROLL CURSOR FOR {HISTOGRAM}")
        conn.execute(f"DECLARE p SCROLL CURSOR FOR {ages}")  # passthrough: FETCH and MOVE as dpproxy writes them
        pg.execute(f"DECLARE c SCROLL CURSOR FOR {ages}")
        for _ in range(400):
            sql = f"{rng.choice(['FETCH', 'MOVE'])} {_directions(rng)} FROM "
            expected = _step(pg, sql + "c")
            assert _step(conn, sql + "c") == expected, sql
            assert _step(conn, sql + "p") == expected, sql
        conn.rollback()
        pg.rollback()


@pytest.mark.parametrize("backward", ["FETCH PRIOR FROM c", "FETCH ABSOLUTE 1 FROM c", "MOVE BACKWARD 1 FROM c",
                                      "FETCH FIRST FROM c", "FETCH RELATIVE -1 FROM c", "MOVE BACKWARD ALL IN c"])
def test_a_no_scroll_dp_cursor_refuses_backward_moves_as_postgresql(cproxy: RunningProxy, test_db: TestDatabase, backward: str):
    with cproxy.connect(autocommit=False) as conn, psycopg.connect(test_db.admin_dsn, autocommit=False) as pg:
        conn.execute(f"DECLARE c NO SCROLL CURSOR FOR {HISTOGRAM}")
        pg.execute("DECLARE c NO SCROLL CURSOR FOR SELECT g FROM generate_series(17, 90) AS g ORDER BY g")
        for sql in ("FETCH 3 FROM c", "FETCH ABSOLUTE 5 FROM c"):  # forward moves pass
            assert _step(conn, sql) == _step(pg, sql)
        ours, theirs = _error(conn, backward), _error(pg, backward)
        for field in ("sqlstate", "message_primary", "message_hint"):
            assert getattr(ours.diag, field) == getattr(theirs.diag, field)
        assert ours.diag.sqlstate == "55000"


def test_a_binary_dp_cursor_fetches_binary_in_a_simple_query(cproxy: RunningProxy):
    with cproxy.connect() as conn:
        conn.execute("DECLARE b BINARY CURSOR WITH HOLD FOR SELECT count(*) AS n FROM adult")
        conn.execute("DECLARE p BINARY CURSOR WITH HOLD FOR SELECT 48842::bigint AS n")
        dp, public = conn.execute("FETCH b"), conn.execute("FETCH p")
        assert dp.pgresult is not None and public.pgresult is not None
        assert dp.pgresult.fformat(0) == public.pgresult.fformat(0) == 1
        assert abs(dp.fetchone()[0] - 48842) < 100 and public.fetchone() == (48842,)
        conn.execute("CLOSE ALL")


def test_a_binary_dp_cursor_of_a_type_dpproxy_cannot_send_as_binary_is_refused_before_the_charge(cproxy: RunningProxy):
    # One column, post-processed: the backend's own binary would have served a plain SELECT's
    # single format code, but a cursor's kept text rows are converted by dpproxy at each FETCH.
    with cproxy.connect() as conn:
        before = spent_epsilon(conn)
        error = _error(conn, "DECLARE b BINARY CURSOR WITH HOLD FOR SELECT count(*) * interval '1 second' FROM adult")
        assert error.diag.sqlstate == "0A000" and error.diag.message_hint
        assert spent_epsilon(conn) == before
        assert _sqlstate(conn, "FETCH b")[0] == "34000"
        conn.execute("DECLARE t CURSOR WITH HOLD FOR SELECT count(*) * interval '1 second' FROM adult")
        assert conn.execute("FETCH t").fetchone()[0].total_seconds() > 40000
        conn.execute("CLOSE t")


# ------------------------------------------------------------------ budget and refusals


def test_a_dp_cursor_is_charged_once_at_declare_not_per_fetch(cproxy: RunningProxy):
    with cproxy.connect(autocommit=False) as conn:
        before = spent_epsilon(conn)
        conn.commit()
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        conn.execute(f"DECLARE c SCROLL CURSOR FOR {HISTOGRAM}")
        assert len(notices) == 1 and "ε charged 1" in notices[0]
        for sql in ("FETCH 10 FROM c", "FETCH ALL FROM c", "MOVE ABSOLUTE 0 IN c", "FETCH ALL FROM c", "FETCH PRIOR c"):
            conn.execute(sql)
        conn.execute("CLOSE c")
        assert len(notices) == 1
        assert spent_epsilon(conn) == pytest.approx(before + 1)
        conn.rollback()  # a rollback does not give the charge back: the rows were released


REFUSED = [
    ("SELECT * FROM adult", "DP001", "SELECT * is not allowed on protected table adult"),
    ("SELECT age FROM adult", "DP001", "not allowed on protected table adult"),
    ("SELECT count(*) FROM adult a JOIN lookup l ON true", "DP001", "JOIN is not allowed"),
    ("SELECT * FROM pg_statistic", "42501", "catalog-allowlist"),
    ("SELECT set_config('search_path', 'x', false)", "0A000", "changes the session"),
]


@pytest.mark.parametrize("query,sqlstate,message", REFUSED, ids=[r[0][:40] for r in REFUSED])
def test_a_refused_declare_is_refused_as_its_query_and_leaves_no_cursor(cproxy: RunningProxy, query: str,
                                                                         sqlstate: str, message: str):
    with cproxy.connect() as conn:
        before = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as raised:
            conn.execute(f"DECLARE c CURSOR WITH HOLD FOR {query}")
        assert raised.value.diag.sqlstate == sqlstate and message in str(raised.value)
        assert raised.value.diag.message_hint
        assert _sqlstate(conn, "FETCH c")[0] == "34000"
        assert spent_epsilon(conn) == before


# ------------------------------------------------------------------ errors and lifetimes


def test_cursor_errors_are_postgresql_s(cproxy: RunningProxy, test_db: TestDatabase):
    with cproxy.connect() as conn, psycopg.connect(test_db.admin_dsn, autocommit=True) as pg:
        for sql in ("FETCH nothing", "MOVE nothing", "CLOSE nothing",
                    "DECLARE c CURSOR FOR SELECT 1", "DECLARE c CURSOR FOR SELECT count(*) FROM lookup"):
            assert _sqlstate(conn, sql) == _sqlstate(pg, sql), sql
        assert _sqlstate(conn, "DECLARE c CURSOR FOR SELECT count(*) FROM adult") == (
            "25P01", "DECLARE CURSOR can only be used in transaction blocks")
        before = spent_epsilon(conn)
        for first, second in [("SELECT count(*) FROM adult", "SELECT 1"), ("SELECT 1", "SELECT count(*) FROM adult")]:
            conn.execute(f"DECLARE c CURSOR WITH HOLD FOR {first}")
            assert _sqlstate(conn, f"DECLARE c CURSOR WITH HOLD FOR {second}") == (
                "42P03", 'cursor "c" already exists')
            conn.execute("CLOSE c")
        assert spent_epsilon(conn) == pytest.approx(before + 1)  # the duplicate DP one was not charged


def test_a_failed_block_refuses_fetch_as_postgresql(cproxy: RunningProxy):
    with cproxy.connect(autocommit=False) as conn:
        conn.execute("DECLARE c CURSOR FOR SELECT count(*) FROM adult")
        _sqlstate(conn, "SELECT 1/0")
        before = None
        for sql in ("FETCH c", "CLOSE c", "DECLARE d CURSOR FOR SELECT count(*) FROM adult"):
            assert _sqlstate(conn, sql)[0] == "25P02"
        conn.rollback()
        assert _sqlstate(conn, "FETCH c")[0] == "34000"
        assert before is None


def test_cursors_end_with_their_transaction_as_in_postgresql(cproxy: RunningProxy):
    with cproxy.connect(autocommit=False) as conn:
        conn.execute("DECLARE dp CURSOR FOR SELECT count(*) FROM adult")
        conn.execute("DECLARE pub CURSOR FOR SELECT code FROM lookup ORDER BY code")
        conn.execute("DECLARE dp_held CURSOR WITH HOLD FOR SELECT sex, count(*) FROM adult GROUP BY sex")
        assert conn.execute("FETCH pub").fetchall() == [("F",)]  # mixed in one block
        assert len(conn.execute("FETCH ALL dp").fetchall()) == 1
        conn.commit()
        for gone in ("dp", "pub"):
            assert _sqlstate(conn, f"FETCH {gone}")[0] == "34000"
            conn.rollback()
        assert [row[0] for row in conn.execute("FETCH ALL dp_held").fetchall()] == ["Male", "Female"]
        conn.execute("DECLARE rolled CURSOR WITH HOLD FOR SELECT count(*) FROM adult")
        conn.rollback()  # declared in a transaction rolled back: gone, WITH HOLD or not
        assert _sqlstate(conn, "FETCH rolled")[0] == "34000"
        conn.rollback()
        conn.execute("DECLARE before CURSOR FOR SELECT count(*) FROM adult")
        conn.execute("SAVEPOINT s")
        conn.execute("DECLARE after CURSOR FOR SELECT count(*) FROM adult")
        conn.execute("DECLARE after_pub CURSOR FOR SELECT 1")
        conn.execute("ROLLBACK TO SAVEPOINT s")
        assert len(conn.execute("FETCH before").fetchall()) == 1
        for gone in ("after", "after_pub"):
            conn.execute("SAVEPOINT t")
            assert _sqlstate(conn, f"FETCH {gone}")[0] == "34000"
            conn.execute("ROLLBACK TO SAVEPOINT t")
        conn.execute("CLOSE dp_held")
        conn.commit()


def test_a_multi_statement_query_s_cursor_ends_with_its_implicit_block(cproxy: RunningProxy):
    with cproxy.connect() as conn:
        cur = conn.execute("DECLARE i CURSOR FOR SELECT count(*) FROM adult; FETCH ALL i")
        assert cur.statusmessage == "DECLARE CURSOR" and cur.nextset()
        assert cur.statusmessage == "FETCH 1" and len(cur.fetchall()) == 1
        assert _sqlstate(conn, "FETCH i")[0] == "34000"


def test_a_held_public_cursor_pins_its_backend_and_leaves_nothing_for_the_next_session(cproxy: RunningProxy):
    with cproxy.connect() as conn:
        conn.execute("DECLARE held CURSOR WITH HOLD FOR SELECT code FROM lookup ORDER BY code")
        # Other statements, between which the connection would go back to the pool unpinned.
        assert conn.execute("SELECT count(*) FROM adult").fetchone()[0] > 40000
        assert conn.execute("FETCH held").fetchall() == [("F",)]
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.execute("FETCH held").fetchall() == [("M",)]
        conn.execute("CLOSE held")
        conn.execute("DECLARE left_open CURSOR WITH HOLD FOR SELECT 1")
    for _ in range(3):  # the session ended with it open: its connection was closed, not pooled
        with cproxy.connect() as other:
            assert other.execute("SELECT count(*) FROM pg_cursors WHERE name <> ''").fetchone() == (0,)


def test_discard_all_closes_every_cursor(cproxy: RunningProxy):
    with cproxy.connect() as conn:
        conn.execute("DECLARE a CURSOR WITH HOLD FOR SELECT count(*) FROM adult")
        conn.execute("DECLARE b CURSOR WITH HOLD FOR SELECT 1")
        conn.execute("DISCARD ALL")
        for name in ("a", "b"):
            assert _sqlstate(conn, f"FETCH {name}")[0] == "34000"


def test_a_passthrough_cursor_over_a_table_protected_by_a_reload_hands_out_no_more_rows(
    test_db: TestDatabase, tmp_path: Path
):
    ledger = tmp_path / "l.sqlite3"
    reloaded = lookup_protected_file(test_db, ledger, POLICY)
    proxy = RunningProxy(make_policy(test_db, ledger, POLICY))
    try:
        with proxy.connect() as conn:
            conn.execute("DECLARE held SCROLL CURSOR WITH HOLD FOR SELECT code FROM lookup ORDER BY code")
            assert conn.execute("FETCH held").fetchall() == [("F",)]
            assert proxy._call(proxy.server.reload(reloaded))
            for sql in ("FETCH held", "MOVE BACKWARD 1 IN held", "FETCH ALL held"):
                error = _error(conn, sql)
                assert error.diag.sqlstate == "55000" and error.diag.message_hint
                assert (error.diag.message_primary or "").startswith('cursor "held" was declared under an earlier policy')
                assert "not allowed on protected table lookup" in str(error) and "(rule: policy-changed)" in str(error)
            conn.execute("CLOSE held")
            assert _sqlstate(conn, "DECLARE again CURSOR WITH HOLD FOR SELECT code FROM lookup")[0] == "DP001"
    finally:
        proxy.stop()


def test_a_session_keeps_a_bounded_number_of_cursors(cproxy: RunningProxy, monkeypatch: pytest.MonkeyPatch):
    import proxy.serving.cursors as cursors

    monkeypatch.setattr(cursors, "MAX_CURSORS", 3)
    with cproxy.connect() as conn:
        for i in range(3):
            conn.execute(f"DECLARE c{i} CURSOR WITH HOLD FOR SELECT count(*) FROM adult")
        before = spent_epsilon(conn)
        for sql in ("DECLARE c3 CURSOR WITH HOLD FOR SELECT count(*) FROM adult", "DECLARE c3 CURSOR WITH HOLD FOR SELECT 1"):
            error = _error(conn, sql)
            assert error.diag.sqlstate == "54000" and "CLOSE" in (error.diag.message_hint or "")
        assert spent_epsilon(conn) == before
        conn.execute("CLOSE c0")
        conn.execute("DECLARE c3 CURSOR WITH HOLD FOR SELECT 1")
        conn.execute("CLOSE ALL")


def test_a_session_pinning_its_connection_with_a_held_cursor_is_timed_out_as_one_idle_in_a_block(
    test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory
):
    timed = POLICY.replace("listen: {{host: 127.0.0.1, port: 0}}",
                           "listen: {{host: 127.0.0.1, port: 0, idle_in_transaction_timeout_s: 1}}")
    assert timed != POLICY
    with running_proxy(test_db, tmp_path_factory, timed) as proxy, proxy.connect() as conn:
        conn.execute("DECLARE dp CURSOR WITH HOLD FOR SELECT count(*) FROM adult")  # kept in dpproxy: no pin
        time.sleep(1.5)
        assert len(conn.execute("FETCH dp").fetchall()) == 1
        conn.execute("DECLARE held CURSOR WITH HOLD FOR SELECT 1")
        time.sleep(1.5)
        assert _error(conn, "FETCH held").diag.sqlstate == "25P03"
