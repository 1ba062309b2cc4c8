"""Clients in other encodings than UTF-8 (psqlODBC's ANSI driver under Windows sends WIN1252,
psql under a latin1 locale LATIN1): dpproxy reads their statements, names and parameters in
the session's client_encoding, and writes its own text (errors, notices, column names,
category labels) in it, as PostgreSQL does.

The text dpproxy analyses must be the text PostgreSQL runs: dpproxy sends the backend its text
in the same encoding as the client, so what it decoded is exactly what PostgreSQL decodes.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Iterator

import psycopg
import pytest
import wire

from tests.conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, psql_path, running_proxy

_POLICY = ATTACK_POLICY_HEAD + """
  public.städte:
    access: protected
    epsilon: 1.0
    columns:
      einwohner: {{bounds: [0, 1000]}}
      stadt: {{categories: [Zürich, Genève, Köln], group_by: true, other: Übrige}}
  public.miasta:
    access: protected
    epsilon: 1.0
    columns:
      miasto: {{categories: [Łódź, Kraków], group_by: true}}
  public.orte:
    access: public
"""


@pytest.fixture(scope="module")
def latin_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute('DROP TABLE IF EXISTS "städte", miasta, orte')
        conn.execute('CREATE TABLE "städte" (stadt text, einwohner int)')
        conn.execute("""INSERT INTO "städte" SELECT (ARRAY['Zürich', 'Genève', 'Köln', 'Bern'])[1 + i % 4], i % 1000
                        FROM generate_series(1, 4000) i""")
        conn.execute("CREATE TABLE miasta (miasto text)")
        conn.execute("INSERT INTO miasta SELECT 'Łódź' FROM generate_series(1, 100)")
        conn.execute("CREATE TABLE orte (name text)")
        conn.execute("INSERT INTO orte VALUES ('Zürich'), ('Genève')")
        for table in ('"städte"', "miasta", "orte"):
            conn.execute(f"GRANT SELECT ON {table} TO dpproxy_service")
    with running_proxy(test_db, tmp_path_factory, _POLICY) as running:
        yield running


def _connect(proxy: RunningProxy, encoding: str) -> psycopg.Connection:
    return psycopg.connect(proxy.dsn(), autocommit=True, client_encoding=encoding)


def _count(notice_text: str) -> float:
    match = re.search(r"-?\d+(\.\d+)?", notice_text)
    assert match is not None
    return float(match.group())


@pytest.mark.parametrize("encoding", ["LATIN1", "WIN1252", "LATIN9", "UTF8"])
def test_a_passthrough_statement_in_the_clients_encoding_round_trips(latin_proxy: RunningProxy, encoding: str):
    with _connect(latin_proxy, encoding) as conn:
        assert conn.execute("SELECT 'Zürich' AS ort, %s::text AS bound", ("Genève",)).fetchone() == ("Zürich", "Genève")
        assert conn.execute("SELECT name FROM orte ORDER BY name").fetchall() == [("Genève",), ("Zürich",)]
        assert conn.execute("SHOW client_encoding").fetchone() == (encoding,)


@pytest.mark.parametrize("encoding", ["LATIN1", "WIN1252"])
def test_a_dp_count_filtered_on_a_non_ascii_value_counts_that_value(latin_proxy: RunningProxy, encoding: str):
    with _connect(latin_proxy, encoding) as conn:
        (zurich,) = conn.execute('SELECT count(*) FROM "städte" WHERE stadt = \'Zürich\'').fetchone()
        (bound,) = conn.execute('SELECT count(*) FROM "städte" WHERE stadt = %s', ("Genève",)).fetchone()
        (nothing,) = conn.execute('SELECT count(*) FROM "städte" WHERE stadt = \'Zurich\'').fetchone()
    # 1,000 rows each, ε = 1: the noise is a few units, never hundreds.
    assert abs(zurich - 1000) < 100 and abs(bound - 1000) < 100 and abs(nothing) < 100


def test_a_histogram_over_non_ascii_categories_comes_back_in_the_clients_encoding(latin_proxy: RunningProxy):
    with _connect(latin_proxy, "LATIN1") as conn:
        rows = conn.execute('SELECT stadt, count(*) AS n FROM "städte" GROUP BY stadt ORDER BY stadt').fetchall()
        columns = [c.name for c in conn.execute('SELECT stadt AS "Größe", count(*) FROM "städte" GROUP BY stadt').description]
    assert [r[0] for r in rows] == ["Genève", "Köln", "Zürich", "Übrige"]
    assert columns == ["Größe", "count"]


def test_a_label_the_clients_encoding_cannot_write_is_refused_before_any_charge(latin_proxy: RunningProxy):
    with _connect(latin_proxy, "LATIN1") as conn:
        before = conn.execute("SHOW dpproxy.budget").fetchone()
        with pytest.raises(psycopg.errors.UntranslatableCharacter) as failed:
            conn.execute("SELECT miasto, count(*) FROM miasta GROUP BY miasto")
        assert "LATIN1" in str(failed.value)
        assert conn.execute("SHOW dpproxy.budget").fetchone() == before
    with _connect(latin_proxy, "LATIN2") as conn:
        rows = conn.execute("SELECT miasto, count(*) FROM miasta GROUP BY miasto ORDER BY 1").fetchall()
    assert [r[0] for r in rows] == ["Kraków", "Łódź"]


def test_an_error_about_a_non_ascii_name_reads_in_the_clients_encoding(latin_proxy: RunningProxy):
    with _connect(latin_proxy, "LATIN1") as conn:
        with pytest.raises(psycopg.errors.UndefinedTable) as missing:
            conn.execute('SELECT count(*) FROM "größe"')
        assert '"größe"' in str(missing.value)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute('SELECT stadt FROM "städte"')
        assert "städte" in str(refused.value)


def test_set_client_encoding_switches_how_the_next_statement_is_read(latin_proxy: RunningProxy):
    with _connect(latin_proxy, "UTF8") as conn:
        conn.execute("SET client_encoding = 'LATIN1'")
        # psycopg follows the ParameterStatus: it now encodes in LATIN1, as dpproxy reads.
        assert conn.execute("SELECT 'Köln'").fetchone() == ("Köln",)
        (koeln,) = conn.execute('SELECT count(*) FROM "städte" WHERE stadt = \'Köln\'').fetchone()
        assert abs(koeln - 1000) < 100
        conn.execute("RESET client_encoding")
        assert conn.execute("SELECT 'Köln'").fetchone() == ("Köln",)


def test_bytes_the_clients_encoding_does_not_have_fail_the_statement_and_the_session_goes_on(latin_proxy: RunningProxy):
    with _connect(latin_proxy, "WIN1252") as conn:
        # 0x81 is unassigned in WIN1252: PostgreSQL fails such a statement too.
        with pytest.raises(psycopg.errors.DataError):
            conn.execute(b"SELECT 'a\x81b'")
        assert conn.execute("SELECT 'ok'").fetchone() == ("ok",)


def test_a_simple_query_in_latin1_bytes_is_read_as_latin1(latin_proxy: RunningProxy):
    conn = wire.Wire.__new__(wire.Wire)
    conn.sock = socket.create_connection((latin_proxy.host, latin_proxy.port), timeout=15)
    conn.buffer = b""
    try:
        conn.sock.sendall(wire.startup(user="plain", database="dpproxy_test", client_encoding="LATIN1"))
        conn.read_until(b"R")
        conn.sock.sendall(wire.message(b"p", wire.cstr("plain")))
        conn.read_until(b"Z")
        conn.send(wire.message(b"Q", "SELECT 'Z\u00fcrich' AS \"Gr\u00f6\u00dfe\"".encode("latin-1") + b"\0"))
        replies = conn.read_until(b"Z")
        assert not [body for kind, body in replies if kind == b"E"], replies
        (row,) = [wire.data_row_values(body) for kind, body in replies if kind == b"D"]
        assert row == [b"Z\xfcrich"]
        (description,) = [body for kind, body in replies if kind == b"T"]
        assert b"Gr\xf6\xdfe\0" in description
    finally:
        conn.close()


def test_a_released_mode_and_a_like_pattern_parameter_are_in_the_clients_encoding(latin_proxy: RunningProxy):
    with _connect(latin_proxy, "WIN1252") as conn:
        (mode,) = conn.execute('SELECT mode() WITHIN GROUP (ORDER BY stadt) FROM "städte"').fetchone()
        (liked,) = conn.execute('SELECT count(*) FROM "städte" WHERE stadt LIKE %s', ("Zü%",)).fetchone()
    assert mode in ("Zürich", "Genève", "Köln")
    assert abs(liked - 1000) < 100


def test_copy_of_a_histogram_is_written_in_the_clients_encoding(latin_proxy: RunningProxy):
    with _connect(latin_proxy, "LATIN1") as conn:
        with conn.cursor().copy('COPY (SELECT stadt, count(*) FROM "städte" GROUP BY stadt) TO STDOUT') as copy:
            lines = b"".join(bytes(block) for block in copy)
    labels = [line.split(b"\t")[0] for line in lines.splitlines()]
    assert labels == [label.encode("latin-1") for label in ("Zürich", "Genève", "Köln", "Übrige")]


def test_a_repeated_histogram_is_not_handed_to_a_session_in_another_encoding(latin_proxy: RunningProxy):
    statement = 'SELECT stadt, count(*) FROM "städte" WHERE einwohner > 17 GROUP BY stadt ORDER BY 1'
    with _connect(latin_proxy, "UTF8") as utf8, _connect(latin_proxy, "LATIN1") as latin:
        first = [row[0] for row in utf8.execute(statement).fetchall()]
        second = [row[0] for row in latin.execute(statement).fetchall()]
    assert first == second == ["Genève", "Köln", "Zürich", "Übrige"]


@pytest.mark.clients
def test_psql_in_latin1_gets_a_histogram_with_its_labels(latin_proxy: RunningProxy):
    statement = 'SELECT stadt, count(*) > 0 AS ok FROM "städte" WHERE stadt <> \'Köln\' GROUP BY stadt ORDER BY 1;\n'
    result = subprocess.run(
        [psql_path(), "-X", "-A", "-t", "-h", latin_proxy.host, "-p", str(latin_proxy.port), "-U", "analyst",
         "-d", "dpproxy_test"],
        input=statement.encode("latin-1"), capture_output=True, timeout=60,
        env={**os.environ, "PGPASSWORD": "analyst", "PGCLIENTENCODING": "LATIN1"},
    )
    assert result.returncode == 0, result.stderr
    labels = [line.split(b"|")[0].decode("latin-1") for line in result.stdout.splitlines()]
    assert labels == ["Genève", "Köln", "Zürich", "Übrige"]  # every declared key, whatever the WHERE


def test_a_value_list_and_a_series_limit_come_back_in_the_clients_encoding(latin_proxy: RunningProxy):
    """A filter's list of values (the declared keys, ε 0) and a series limit (two releases whose
    cells are matched by their keys) write their labels in the session's encoding."""
    with _connect(latin_proxy, "LATIN1") as conn:
        listed = conn.execute('SELECT DISTINCT stadt FROM "städte" ORDER BY stadt').fetchall()
        ranked = conn.execute('SELECT stadt, count(*) AS n FROM "städte" JOIN (SELECT stadt AS s, count(*) AS m '
                              'FROM "städte" GROUP BY stadt ORDER BY stadt DESC LIMIT 2) AS l ON stadt = s '
                              'GROUP BY stadt ORDER BY stadt').fetchall()
        with pytest.raises(psycopg.errors.UntranslatableCharacter):
            conn.execute("SELECT miasto FROM miasta GROUP BY miasto")
    assert [r[0] for r in listed] == ["Genève", "Köln", "Zürich", "Übrige"]
    assert {r[0] for r in ranked} == {"Zürich", "Übrige"}  # the last two in any collation
