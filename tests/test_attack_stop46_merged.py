"""Attacks on the changes merged in stop 46 (h144, h146, h147, h149): each a neighbouring-table or
session-setting probe of whether an accepted statement's outcome, time or charge depends on more
than its noised values."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from proxy.wire.binary import BYTEA, binary_from_text
from tests.conftest import RunningProxy, TestDatabase, proxy_over_table, spent_epsilon

_TABLE = "stop46_merged"


@pytest.fixture(scope="module")
def proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over ``stop46_merged`` (i int4, b bytea, t text), 60 rows."""
    with proxy_over_table(test_db, tmp_path_factory, _TABLE, "i int4, b bytea, t text",
                          "SELECT g, CASE WHEN g % 2 = 0 THEN '\\x01'::bytea ELSE '\\x02'::bytea END, "
                          "CASE WHEN g % 3 = 0 THEN 'a' ELSE 'b' END FROM generate_series(1, 60) g",
                          "{i: {bounds: [0, 100]}, b: {categories: ['\\x01', '\\x02']}, t: {categories: [a, b]}}"
                          ) as running:
        yield running


def test_a_bytea_mode_in_a_binary_cursor_under_escape_output_is_answered(proxy: RunningProxy) -> None:
    # h147 answers a bytea MODE over its release in the session, printed as bytea_output says; the
    # conversion to binary read only the hex form, so under escape it failed (0A000) after the charge.
    with proxy.connect(autocommit=True) as conn:
        conn.execute("SET bytea_output = escape")
        spent = spent_epsilon(conn)
        with conn.transaction():
            conn.execute(f"DECLARE c BINARY CURSOR FOR SELECT mode() WITHIN GROUP (ORDER BY b) FROM {_TABLE}")
            rows = conn.execute("FETCH ALL FROM c", binary=True).fetchall()
        assert [len(row) for row in rows] == [1] and rows[0][0] in (b"\x01", b"\x02")
        assert spent_epsilon(conn) == pytest.approx(spent + 1.0)


def test_every_byte_converts_to_binary_from_either_bytea_output(test_db: TestDatabase) -> None:
    every = bytes(range(256)) + b"\\\\000"
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for output in ("hex", "escape"):
            conn.execute(f"SET bytea_output = {output}")
            (printed,) = conn.execute("SELECT %s::bytea::text", (every,)).fetchone()
            assert binary_from_text(printed.encode(), BYTEA) == every, output
