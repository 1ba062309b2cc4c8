"""The passthrough fast path: a passthrough result's rows go to the client as DataRows built
straight from libpq's result (proxy/backend/data_rows.py), never decoded into values.

Pinned here: the DataRows are byte for byte those of the decoded path (NULLs, empty values,
binary format, large results); a client reads the same rows through dpproxy as directly, in
both protocols, text and binary, with row-limited Execute; a backend error part-way through
a result sends no row and keeps its SQLSTATE, message, detail and hint as before; and the
fast path runs only after classify said Passthrough, on the rewritten SQL, never for a DP
answer or a COPY.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from proxy.backend.connection import BackendSession, ResultSet
from proxy.backend.unread_rows import text_rows
from proxy.backend.data_rows import data_rows
from proxy.wire import protocol
from tests.conftest import RunningProxy

CATALOG = (
    "SELECT t.oid, t.typname, t.typarray, NULL::text AS nothing, '' AS empty, t.typlen "
    "FROM pg_catalog.pg_type t ORDER BY t.oid"
)


def _result(dsn: str, sql: str, result_format: int = 0) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        pgconn = conn.pgconn
        pgconn.send_query_params(sql.encode(), None, result_format=result_format)
        last = None
        while (result := pgconn.get_result()) is not None:
            last = result
        return last


@pytest.mark.parametrize("result_format", [0, 1], ids=["text", "binary"])
def test_data_rows_are_those_of_the_decoded_path(pg_dsn: str, result_format: int) -> None:
    result = _result(pg_dsn, CATALOG, result_format)
    assert result.ntuples > 400  # a large catalog result, with NULLs and empty values
    assert data_rows(result) == [protocol.data_row(row) for row in text_rows(result)]


def test_data_rows_of_no_rows_and_of_no_columns(pg_dsn: str) -> None:
    assert data_rows(_result(pg_dsn, "SELECT 1 WHERE false")) == []
    assert data_rows(_result(pg_dsn, "SELECT")) == [protocol.data_row([])]


def test_result_set_hands_out_slices_either_way() -> None:
    rows: list[list[bytes | None]] = [[b"1", None], [b"", b"x"], [b"3", b"y"]]
    decoded = ResultSet([], rows, "SELECT 3")
    relayed = ResultSet([], [], "SELECT 3", relayed=[protocol.data_row(row) for row in rows])
    for result in (decoded, relayed):
        assert result.row_count == 3
        assert result.data_rows() == [protocol.data_row(row) for row in rows]
        assert result.data_rows(1, 2) == [protocol.data_row(rows[1])]
        assert result.data_rows(3) == []


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
@pytest.mark.parametrize("prepare", [None, 0], ids=["simple", "extended"])
def test_large_catalog_result_arrives_intact(proxy: RunningProxy, admin, binary: bool, prepare: int | None) -> None:
    expected = admin.execute(CATALOG).fetchall()
    with proxy.connect(prepare_threshold=prepare) as conn:
        got = conn.cursor(binary=binary).execute(CATALOG).fetchall()
    assert got == expected and len(got) > 400


def test_row_limited_execute_hands_out_the_relayed_rows_in_pieces(proxy: RunningProxy, admin) -> None:
    asyncpg = pytest.importorskip("asyncpg")
    sql = "SELECT oid, typname::text, NULL::text FROM pg_type ORDER BY oid"
    expected = [tuple(r) for r in admin.execute(sql)]

    async def fetch() -> list[tuple[Any, ...]]:
        conn = await asyncpg.connect(host=proxy.host, port=proxy.port, user="analyst", password="analyst",
                                     database="dpproxy_test")
        try:
            async with conn.transaction():  # Execute with a row limit: PortalSuspended between pieces
                return [tuple(r) async for r in conn.cursor(sql, prefetch=37)]
        finally:
            await conn.close()

    assert asyncio.run(fetch()) == expected


def test_asyncpg_binary_rows_through_the_fast_path(proxy: RunningProxy, admin) -> None:
    asyncpg = pytest.importorskip("asyncpg")
    expected = [tuple(r) for r in admin.execute("SELECT oid, typname::text, typlen FROM pg_type ORDER BY oid")]

    async def fetch() -> list[tuple[Any, ...]]:
        conn = await asyncpg.connect(host=proxy.host, port=proxy.port, user="analyst", password="analyst",
                                     database="dpproxy_test")
        try:
            rows = await conn.fetch("SELECT oid, typname::text, typlen FROM pg_type ORDER BY oid")
            limited = await conn.fetch("SELECT oid FROM pg_type ORDER BY oid LIMIT $1", 5)
        finally:
            await conn.close()
        assert [r[0] for r in limited] == [r[0] for r in rows[:5]]
        return [tuple(r) for r in rows]

    assert asyncio.run(fetch()) == expected


ERRORS = [
    # division by zero on the 500th row, before a chunk had to be waited for: no row goes out
    # (a larger result sends its rows and then the error: test_passthrough_streaming.py)
    "SELECT 1 / (i - 500) FROM pg_catalog.generate_series(1, 1000) AS g(i)",
    # an error with a hint
    "SELECT pg_catalog.length(1)",
    # an error with a detail
    "SELECT '{1,2'::int[]",
]


@pytest.mark.parametrize("sql", ERRORS)
@pytest.mark.parametrize("prepare", [None, 0], ids=["simple", "extended"])
def test_backend_errors_reach_the_client_as_before(proxy: RunningProxy, admin, sql: str, prepare: int | None) -> None:
    with pytest.raises(psycopg.Error) as direct:
        admin.execute(sql)
    with proxy.connect(prepare_threshold=prepare) as conn:
        with pytest.raises(psycopg.Error) as proxied:
            conn.execute(sql)
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the session goes on
    ours, theirs = proxied.value.diag, direct.value.diag
    assert (ours.sqlstate, ours.message_primary, ours.message_detail, ours.message_hint) == (
        theirs.sqlstate, theirs.message_primary, theirs.message_detail, theirs.message_hint)


@pytest.fixture
def relayed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL of every statement that takes the fast path while the test runs."""
    seen: list[str] = []
    original = BackendSession.relay

    async def relay(self: BackendSession, sql: str, *args: Any, **kwargs: Any) -> ResultSet:
        seen.append(sql)
        return await original(self, sql, *args, **kwargs)

    monkeypatch.setattr(BackendSession, "relay", relay)
    return seen


def test_fast_path_only_for_passthrough(proxy: RunningProxy, relayed: list[str]) -> None:
    with proxy.connect() as conn:
        conn.execute("SELECT COUNT(*) FROM adult WHERE age > 40").fetchall()  # a DP answer
        assert relayed == []
        with pytest.raises(psycopg.Error):
            conn.execute("SELECT age FROM adult")  # refused: nothing runs
        assert relayed == []
        with conn.cursor().copy("COPY (SELECT typname FROM pg_type LIMIT 3) TO STDOUT") as copy:
            assert len(list(copy.rows())) == 3  # COPY reads the decoded rows
        assert relayed == []
        conn.execute("SELECT typname FROM pg_type LIMIT 1").fetchall()
        assert relayed == ["SELECT typname FROM pg_catalog.pg_type LIMIT 1"]  # pinned to the relation resolved


def test_fast_path_runs_the_neutralised_sql(proxy: RunningProxy, admin, relayed: list[str]) -> None:
    admin.execute("ANALYZE adult")
    with proxy.connect() as conn:
        rows = conn.execute(_NEUTRALISED).fetchall()
    assert rows == [("adult", -1.0)]  # not the row count
    assert len(relayed) == 1 and relayed[0] != _NEUTRALISED and "-1" in relayed[0]


_NEUTRALISED = "SELECT relname, reltuples FROM pg_class WHERE oid = 'public.adult'::regclass"

