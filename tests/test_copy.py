"""COPY (SELECT ...) TO STDOUT through dpproxy: the SELECT's release in COPY's framing; other COPYs refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from conftest import TEST_POLICY, RunningProxy, make_policy, psql_path, spent_epsilon

from proxy.ops.audit import fingerprint as audit_fingerprint

# Passthrough values that exercise every escaping rule: tab, newline, backslash, quote,
# the delimiters used below, an empty string and a NULL.
_AWKWARD = "SELECT E'a\\tb' AS \"Ünï;ab\", NULL::text AS n, 'x\"y' AS q, 'p;q|r,s' AS d, '' AS e, E'b\\\\s\\nl' AS bs"
_OPTIONS = ["", "(FORMAT csv)", "(FORMAT csv, HEADER)", "(FORMAT text, HEADER true)", "(DELIMITER ';')",
            "(FORMAT csv, DELIMITER '|', NULL 'NULL')", "(NULL '')", "csv header", "(FORMAT csv, NULL '', HEADER false)"]


def _copy(conn: psycopg.Connection, sql: str) -> bytes:
    with conn.cursor() as cur, cur.copy(sql) as copy:
        return b"".join(bytes(chunk) for chunk in copy)


@pytest.mark.parametrize("options", _OPTIONS)
def test_copy_writes_values_exactly_as_postgresql_does(proxy: RunningProxy, admin: psycopg.Connection, options: str):
    sql = f"COPY ({_AWKWARD}) TO STDOUT {options}"
    with proxy.connect(autocommit=True) as conn:
        assert _copy(conn, sql) == _copy(admin, sql)


@pytest.mark.parametrize("options", ["(FORMAT binary)", "WITH BINARY", "(FORMAT binary, HEADER false)"])
def test_binary_copy_writes_bytes_exactly_as_postgresql_does(proxy: RunningProxy, admin: psycopg.Connection,
                                                             options: str):
    sql = (f"COPY (SELECT 1::int2 AS a, -7::int4 AS b, 2::int8 AS c, 1.25::float8 AS d, 12.50::numeric AS e, "
           f"true AS f, 'Ünï'::text AS g, NULL::int8 AS h, 'x'::varchar AS i) TO STDOUT {options}")
    with proxy.connect(autocommit=True) as conn:
        assert _copy(conn, sql) == _copy(admin, sql)


def test_binary_copy_of_no_rows_is_the_header_and_trailer(proxy: RunningProxy, admin: psycopg.Connection):
    sql = "COPY (SELECT 1 AS a WHERE false) TO STDOUT (FORMAT binary)"
    with proxy.connect(autocommit=True) as conn:
        assert _copy(conn, sql) == _copy(admin, sql)


def test_binary_copy_of_a_dp_aggregate_is_charged_once_in_send_format(proxy: RunningProxy, admin: psycopg.Connection):
    """connectorx and Arrow's ADBC driver read every result this way: ``COPY (query) TO STDOUT WITH BINARY``."""
    exact_n, exact_avg = admin.execute("SELECT count(*), avg(age) FROM adult WHERE age > 37").fetchone()
    with proxy.connect(autocommit=True) as conn:
        spent = spent_epsilon(conn)
        with conn.cursor() as cur:
            with cur.copy("COPY (SELECT count(*) AS n, avg(age) AS a FROM adult WHERE age > 37) TO STDOUT WITH BINARY") as copy:
                copy.set_types(["int8", "numeric"])
                rows = list(copy.rows())
        assert spent_epsilon(conn) == pytest.approx(spent + 1)
    ((n, avg),) = rows
    assert abs(n - exact_n) < 50 and abs(float(avg) - float(exact_avg)) < 1


def test_binary_copy_of_a_post_processed_answer_is_in_the_backend_s_send_format(proxy: RunningProxy):
    """An outer expression over the released count (an interval, which dpproxy does not encode
    itself) is computed by the backend in binary, as for a Bind asking for one format."""
    with proxy.connect(autocommit=True) as conn:
        spent = spent_epsilon(conn)
        with conn.cursor() as cur:
            with cur.copy("COPY (SELECT count(*) * interval '1 second' AS t FROM adult) TO STDOUT WITH BINARY") as copy:
                copy.set_types(["interval"])
                ((duration,),) = list(copy.rows())
        assert spent_epsilon(conn) == pytest.approx(spent + 1)
    assert abs(duration.total_seconds() - 48842) < 50


def test_copy_of_a_dp_aggregate_is_the_select_s_release_charged_once(test_db, admin: psycopg.Connection,
                                                                      tmp_path: Path):
    exact = admin.execute("SELECT count(*) FROM adult WHERE age > 37").fetchone()[0]
    text = TEST_POLICY.replace("repeats: {{enabled: false}}", "repeats: {{ttl_s: 600}}")
    proxy = RunningProxy(make_policy(test_db, tmp_path / "l.sqlite3", text))
    notices: list[str] = []
    try:
        with proxy.connect(autocommit=True) as conn:
            conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
            spent = conn.execute("SHOW dpproxy.budget").fetchone()[1]
            copied = _copy(conn, "COPY (SELECT count(*) AS n FROM adult WHERE age > 37) TO STDOUT WITH (FORMAT csv, HEADER)")
            header, value, end = copied.decode().split("\n")
            assert header == "n" and end == "" and abs(int(value) - exact) < 50
            assert "ε charged 1" in notices[-1]
            again = conn.execute("SELECT count(*) AS n FROM adult WHERE age > 37").fetchone()[0]
            assert again == int(value) and "ε charged 0, δ 0 (a repeat of an earlier answer: the same noised values)" in notices[-1] and "remaining ε" in notices[-1], notices
            assert conn.execute("SHOW dpproxy.budget").fetchone()[1] == pytest.approx(spent + 1)
    finally:
        proxy.stop()


REFUSED = [
    ("COPY adult TO STDOUT", "0A000", "COPY of a table"),
    ("COPY lookup TO STDOUT", "0A000", "COPY of a table"),
    ("COPY adult FROM STDIN", "0A000", "COPY FROM"),
    ("COPY (SELECT count(*) FROM adult) TO '/tmp/dpproxy-copy'", "0A000", "server file or program"),
    ("COPY (SELECT count(*) FROM adult) TO PROGRAM 'cat'", "0A000", "server file or program"),
    ("COPY (SELECT count(*) FROM adult) TO STDOUT (FORMAT xml)", "0A000", "format xml"),
    ("COPY (SELECT count(*) FROM adult) TO STDOUT (FORMAT binary, DELIMITER ',')", "42601", "DELIMITER in BINARY"),
    ("COPY (SELECT count(*) FROM adult) TO STDOUT (FORMAT binary, NULL '')", "42601", "NULL in BINARY"),
    ("COPY (SELECT count(*) FROM adult) TO STDOUT (FORMAT binary, HEADER)", "0A000", "HEADER in BINARY"),
    ("COPY (SELECT count(*) FROM adult) TO STDOUT (FORMAT csv, FORCE_QUOTE *)", "0A000", "FORCE_QUOTE"),
    ("COPY (SELECT count(*) FROM adult) TO STDOUT (DELIMITER ';;')", "22023", "single one-byte character"),
    ("COPY (VALUES (1)) TO STDOUT", "0A000", "a SELECT only"),
    ("COPY (SELECT age FROM adult) TO STDOUT", "DP001", "not allowed on protected table"),
]


@pytest.mark.parametrize("sql,sqlstate,message", REFUSED, ids=[r[0][:50] for r in REFUSED])
def test_other_copies_are_refused_with_sqlstate_and_hint(proxy: RunningProxy, sql: str, sqlstate: str, message: str):
    spent_before = None
    with proxy.connect(autocommit=True) as conn:
        spent_before = conn.execute("SHOW dpproxy.budget").fetchone()[1]
        with pytest.raises(psycopg.Error) as info:
            _copy(conn, sql)
        assert info.value.diag.sqlstate == sqlstate and message in (info.value.diag.message_primary or "")
        assert info.value.diag.message_hint
        assert conn.execute("SHOW dpproxy.budget").fetchone()[1] == spent_before


def _psql(proxy: RunningProxy, command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PGPASSWORD": "analyst", "PGSSLMODE": "prefer", "PGCONNECT_TIMEOUT": "10"}
    return subprocess.run(
        [psql_path(), "-X", "-h", proxy.host, "-p", str(proxy.port), "-U", "analyst", "-d", "dpproxy_test",
         "-c", command], capture_output=True, text=True, env=env, timeout=60,
    )


def test_psql_copies_a_dp_aggregate_to_a_local_file(proxy: RunningProxy, tmp_path: Path):
    target = tmp_path / "count.csv"
    result = _psql(proxy, f"\\copy (SELECT count(*) AS n FROM adult WHERE age > 52) TO '{target}' csv header")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "COPY 1" and "ε charged" in result.stderr
    header, value = target.read_text().splitlines()
    assert header == "n" and int(value) > 1000


def test_psql_copy_of_a_table_is_refused_and_psql_leaves_its_empty_file(proxy: RunningProxy, tmp_path: Path):
    target = tmp_path / "rows.txt"
    result = _psql(proxy, f"\\copy adult TO '{target}'")
    assert result.returncode == 1
    assert "COPY of a table is not supported through dpproxy" in result.stderr
    assert "\\copy (SELECT count(*)" in result.stderr  # the hint shows what to copy instead
    # psql opened the file before sending COPY; dpproxy never hears of it (documented in the hint).
    assert target.read_bytes() == b""


def _hint(stderr: str) -> str:
    return next(line.removeprefix("HINT:  ") for line in stderr.splitlines() if line.startswith("HINT:"))


def test_a_refused_copy_hint_is_true_of_psql_s_copy_to_stdout_and_to_a_file_alike(proxy: RunningProxy, tmp_path: Path):
    """psql sends ``COPY adult TO STDOUT`` for both: the hint cannot claim a file was left behind,
    only say what psql did if a file was named."""
    to_stdout = _psql(proxy, "\\copy adult TO STDOUT")
    to_file = _psql(proxy, f"\\copy adult TO '{tmp_path / 'rows.txt'}'")
    assert to_stdout.returncode == to_file.returncode == 1
    hint = _hint(to_stdout.stderr)
    assert hint == _hint(to_file.stderr)
    assert "a refused \\copy leaves an empty file behind" not in hint
    assert "Nothing was copied. If this was psql's \\copy ... TO 'file', psql had already created" in hint


@pytest.mark.parametrize("command", ["\\copy adult FROM STDIN", "COPY adult FROM '/tmp/x'",
                                     "COPY (SELECT count(*) FROM adult) TO '/tmp/x'",
                                     "COPY (SELECT count(*) FROM adult) TO PROGRAM 'cat'"])
def test_a_refused_copy_that_psql_opened_no_file_for_writing_says_nothing_of_an_empty_file(
        proxy: RunningProxy, command: str):
    result = _psql(proxy, command)
    assert result.returncode == 1 and "(rule: statement-not-allowed)" in result.stderr, result.stderr
    assert "empt" not in _hint(result.stderr)


_EXTENDED = '''
import sys
import psycopg
conn = psycopg.connect(sys.argv[1], autocommit=True)
pg = conn.pgconn
pg.prepare(b"", b"COPY (SELECT count(*) AS n FROM adult WHERE age > 61) TO STDOUT (FORMAT csv, HEADER)")
described = pg.describe_prepared(b"")
result = pg.exec_prepared(b"", [])
chunks = []
while True:
    size, data = pg.get_copy_data(0)
    if size < 0:
        break
    chunks.append(bytes(data))
final = pg.get_result()
print(described.nfields, result.status, b"".join(chunks).decode(), final.command_status.decode(), sep="|")
'''


def test_copy_through_the_extended_protocol(proxy: RunningProxy):
    # libpq's blocking calls hold the GIL, and the proxy runs in this process: a subprocess drives it.
    result = subprocess.run([sys.executable, "-c", _EXTENDED, proxy.dsn()], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    fields, status, copied, tag = result.stdout.rstrip("\n").split("|")
    assert fields == "0" and status == str(int(psycopg.pq.ExecStatus.COPY_OUT)) and tag == "COPY 1"
    header, value = copied.splitlines()
    assert header == "n" and int(value) > 1000


def test_copy_is_charged_and_audited_under_the_copy_statement(proxy: RunningProxy):
    """The ledger's charge carries the audit line's fingerprint, so the two can be joined."""
    sql = "COPY (SELECT count(*) FROM adult WHERE age > 44) TO STDOUT"
    budget = proxy.server.budget
    original = budget.charge
    fingerprints: list[str | None] = []

    async def charge(user: str, epsilon: float, delta: float, fingerprint: str | None = None):  # type: ignore[no-untyped-def]
        fingerprints.append(fingerprint)
        return await original(user, epsilon, delta, fingerprint)

    budget.charge = charge  # type: ignore[method-assign]
    try:
        with proxy.connect(autocommit=True) as conn:
            _copy(conn, sql)
    finally:
        del budget.charge
    assert fingerprints == [audit_fingerprint(sql)]
