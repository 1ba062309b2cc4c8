"""A data-modifying statement nested in another (WITH, subquery) is refused by dpproxy itself (25006)."""

from __future__ import annotations

import psycopg
import pytest

from conftest import RunningProxy

NESTED_WRITES = [
    "WITH d AS (DELETE FROM lookup RETURNING code) SELECT * FROM d",
    "WITH d AS (DELETE FROM adult WHERE age = 40 RETURNING age) SELECT COUNT(*) FROM d",
    "WITH u AS (UPDATE lookup SET label = 'x' RETURNING 1) SELECT 1",
    "WITH i AS (INSERT INTO lookup VALUES ('Z', 'z') RETURNING code) SELECT code FROM i",
    "WITH m AS (MERGE INTO lookup l USING lookup s ON l.code = s.code WHEN MATCHED THEN DELETE RETURNING l.code) "
    "SELECT * FROM m",
    "SELECT * FROM lookup WHERE code IN (WITH d AS (DELETE FROM lookup RETURNING code) SELECT code FROM d)",
    "SELECT (WITH d AS (DELETE FROM lookup RETURNING 1) SELECT count(*) FROM d)",
    "WITH a AS (WITH d AS (DELETE FROM lookup RETURNING code) SELECT code FROM d) SELECT * FROM a",
    "SELECT * FROM (WITH d AS (DELETE FROM lookup RETURNING code) SELECT code FROM d) s",
    "WITH d AS (DELETE FROM lookup RETURNING code) DELETE FROM lookup",
]


@pytest.mark.parametrize("sql", NESTED_WRITES, ids=[s[:50] for s in NESTED_WRITES])
def test_nested_data_modifying_statement_is_refused_by_dpproxy(proxy: RunningProxy, admin, sql: str) -> None:
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(sql)
        assert refused.value.sqlstate == "25006"
        # dpproxy's own refusal (the backend's read-only error names no rule and gives no hint).
        assert "(rule: read-only)" in (refused.value.diag.message_primary or "")
        assert refused.value.diag.message_hint
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert admin.execute("SELECT count(*), min(label) FROM lookup").fetchone() == (2, "Female")


def test_nested_data_modifying_statement_is_refused_on_the_extended_protocol(proxy: RunningProxy) -> None:
    with proxy.connect() as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("WITH d AS (DELETE FROM lookup WHERE code = %s RETURNING code) SELECT * FROM d", ("M",))
        assert refused.value.sqlstate == "25006"
        assert "(rule: read-only)" in (refused.value.diag.message_primary or "")
