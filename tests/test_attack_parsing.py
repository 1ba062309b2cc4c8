"""Parser and encoding differentials: PostgreSQL must read exactly the statement dpproxy analysed.

A reader that splits a text into characters otherwise than PostgreSQL reads another statement.
dpproxy reads a client's text in the session's client_encoding, by Python's codec of it
(proxy/wire/encodings.py; UTF-8 for encodings without one), and PostgreSQL in its own. In its
client-only encodings (SJIS,
SHIFT_JIS_2004, BIG5, GBK, GB18030, UHC, JOHAB) the second byte of a character can be an ASCII
byte — a backslash among them — so the last byte of a UTF-8 character can swallow the
backslash after it. ``E'ā\\'`` is then, for PostgreSQL, a string that ends at the quote dpproxy
read as escaped, and whatever dpproxy read as the rest of the string runs as SQL: SET and SHOW
statements reach the backend as the client wrote them, through the simple query protocol,
which runs every statement of the text.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import psycopg
import pytest
import wire
from conftest import RunningProxy, running_proxy

# A UTF-8 character whose last byte (0x81) is a lead byte in SJIS: 0xC4 0x81 0x5C is, for
# PostgreSQL, "ﾄ" then the two-byte character 0x81 0x5C.
SWALLOWS_BACKSLASH = {
    "SJIS": "\u0101", "Shift_JIS": "\u0101", "win932": "\u0101", "SHIFT_JIS_2004": "\u0101",
    "BIG5": "\u3865", "GBK": "\u3007", "GB18030": "\u3007",
}
HIDDEN = "SELECT count(*) AS leaked, min(age) FROM adult"


def _smuggle(character: str) -> str:
    """One SET statement for dpproxy (its value holds everything up to the last quote)."""
    return f"SET application_name = E'{character}\\'; {HIDDEN}; --'"


@pytest.fixture(scope="module")
def one(test_db, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with running_proxy(test_db, tmp_path_factory) as running:
        yield running


def _raw(proxy: RunningProxy, **params: str) -> tuple[wire.Wire, list[tuple[bytes, bytes]]]:
    """A raw connection with startup ``params``; the replies to its password."""
    conn = wire.Wire.__new__(wire.Wire)
    conn.sock = socket.create_connection((proxy.host, proxy.port), timeout=15)
    conn.buffer = b""
    conn.sock.sendall(wire.startup(user="plain", database="dpproxy_test", **params))
    first = conn.read_until(b"R")
    if first[-1][0] != b"R":
        return conn, first
    conn.sock.sendall(wire.message(b"p", wire.cstr("plain")))
    return conn, conn.read_until(b"Z")


def _rows(conn: wire.Wire, sql: str) -> tuple[list[list[bytes | None]], list[bytes]]:
    conn.send(wire.message(b"Q", wire.cstr(sql)))
    replies = conn.read_until(b"Z")
    rows = [wire.data_row_values(body) for kind, body in replies if kind == b"D"]
    errors = [wire.error_fields(body)[b"C"] for kind, body in replies if kind == b"E"]
    return rows, errors


@pytest.mark.parametrize("encoding", sorted(SWALLOWS_BACKSLASH))
def test_a_client_only_encoding_in_the_startup_packet_is_refused(one: RunningProxy, encoding: str):
    conn, replies = _raw(one, client_encoding=encoding)
    try:
        errors = [wire.error_fields(body) for kind, body in replies if kind == b"E"]
        if not errors:  # let in: then the smuggled statement must not run
            rows, _ = _rows(conn, _smuggle(SWALLOWS_BACKSLASH[encoding]))
            assert rows == [], f"{HIDDEN} ran on the backend under client_encoding {encoding}: {rows}"
        assert errors and errors[0][b"C"] == b"22023", replies
        assert b"client_encoding" in errors[0][b"M"]
    finally:
        conn.close()


@pytest.mark.parametrize("statement", [
    "SET client_encoding = 'SJIS'", "SET client_encoding TO sjis", "SET NAMES 'Shift-JIS'",
    "SET LOCAL client_encoding = 'GBK'", "SET SESSION client_encoding = 'win950'", "SET client_encoding = 'UHC'",
    "SET client_encoding = 'Johab'", "SET client_encoding = 'GB-18030'", "SET client_encoding = 'windows_932'",
    "SELECT set_config('client_encoding', 'SJIS', false)", "SELECT pg_catalog.set_config('CLIENT_ENCODING', 'big5', true)",
    "SELECT set_config('client_encoding', 'SJ' || 'IS', false)",
    "SET client_encoding = 'sj\u00e9is'",
])
def test_set_of_a_client_only_encoding_is_refused_and_nothing_is_smuggled(one: RunningProxy, statement: str):
    with one.connect() as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(statement)
        assert refused.value.sqlstate == "22023", refused.value
        assert conn.execute("SHOW client_encoding").fetchone() == ("UTF8",)


def test_a_bound_client_encoding_in_set_config_is_refused(one: RunningProxy):
    with one.connect(prepare_threshold=0) as conn:
        with pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT set_config('client_encoding', %s, false)", ("SJIS",), prepare=True)
        assert refused.value.sqlstate == "22023", refused.value
        assert conn.execute("SHOW client_encoding").fetchone() == ("UTF8",)


def test_sjis_cannot_hide_a_statement_in_a_set_value(one: RunningProxy):
    conn, _ = _raw(one)
    try:
        rows, errors = _rows(conn, "SET client_encoding = 'SJIS'; " + _smuggle("\u0101"))
        assert rows == [], f"{HIDDEN} ran on the backend: {rows}"
        assert errors == [b"22023"]
    finally:
        conn.close()


def test_a_second_statement_hidden_from_dpproxy_is_refused_by_the_backend(one: RunningProxy, monkeypatch):
    """Defence in depth: were a reader one day to see one statement where PostgreSQL sees two
    (as SJIS did, now refused), a passthrough text runs as one statement only, so the hidden
    one fails (42601) instead of running. Shown by letting the encoding through again."""
    monkeypatch.setattr("rewriter.classify.ascii_safe_encoding", lambda value: True)
    monkeypatch.setattr("proxy.serving.session.ascii_safe_encoding", lambda value: True)
    conn, _ = _raw(one)
    try:
        rows, errors = _rows(conn, "SET client_encoding = 'SJIS'")
        assert errors == []
        rows, errors = _rows(conn, _smuggle("\u0101"))
        assert rows == [], f"{HIDDEN} ran on the backend: {rows}"
        assert errors == [b"42601"]  # cannot insert multiple commands into a prepared statement
    finally:
        conn.close()


@pytest.mark.parametrize("encoding", ["UTF8", "unicode", "SQL_ASCII", "LATIN1", "ISO-8859-5", "WIN1252", "EUC_CN", "KOI8R"])
def test_ascii_safe_encodings_are_accepted_and_read_every_ascii_byte_as_dpproxy_does(one: RunningProxy, encoding: str):
    conn, replies = _raw(one, client_encoding=encoding)
    try:
        assert not [body for kind, body in replies if kind == b"E"], replies
        # Every character of the value is ASCII-safe here: the backslash is the backslash.
        rows, errors = _rows(conn, f"SET application_name = E'x\\'; {HIDDEN}; --'")
        assert rows == [] and errors == [], (rows, errors)
        rows, errors = _rows(conn, f"SET client_encoding = '{encoding}'")
        assert errors == []
    finally:
        conn.close()


# What PostgreSQL stored is the ground truth: the value of each SET, read back with
# current_setting, must be the value dpproxy's parser (pglast) read, in every client encoding
# dpproxy accepts. The values are ASCII (in LATIN1 or EUC_CN a non-ASCII character is another
# character by design), and each tries to end its string early for one reader only.
_TRICKY_SET_VALUES = [
    "E'x\\'; SELECT 1; --'", "$$x'$$", "$a$x$$'$a$", "'a' /* '; SELECT 1; /* nested */ ' */",
    "U&'d\\0061t\\+000061'", "U&'x!0027' UESCAPE '!'", "E'\\x27\\047\\u0027'", "'a''b' 'c'",
    "'a'\n'b'", "'a' -- x\r'b'",
]


@pytest.mark.parametrize("encoding", ["UTF8", "SQL_ASCII", "LATIN1", "EUC_CN"])
def test_a_set_passed_through_as_written_stores_the_value_dpproxy_parsed(one: RunningProxy, encoding: str):
    from pglast import parse_sql

    conn, replies = _raw(one, client_encoding=encoding)
    try:
        assert not [body for kind, body in replies if kind == b"E"], replies
        for value in _TRICKY_SET_VALUES:
            statement = f"SET application_name = {value}"
            try:
                (parsed,) = parse_sql(statement)
            except Exception:
                _, errors = _rows(conn, statement)
                assert errors, f"{statement!r}: dpproxy's parser refuses it, the backend must not run it"
                continue
            expected = parsed.stmt.args[0].val.sval
            rows, errors = _rows(conn, statement + "; SELECT current_setting('application_name')")
            assert errors == [], (statement, errors)
            # application_name keeps printable ASCII only (others become ?): the same on both sides.
            stored = rows[-1][0].decode("ascii")
            assert stored == "".join(c if " " <= c <= "~" else "?" for c in expected), statement
    finally:
        conn.close()


@pytest.mark.parametrize("literal, value", [
    ("0x10", 16), ("0X1f", 31), ("0b101", 5), ("0o17", 15), ("1_0", 10), ("0x10 AND age < 0x50", 16),
])
def test_a_non_decimal_integer_never_reaches_the_backend_as_another_value(one: RunningProxy, literal: str, value: int):
    """PostgreSQL 16 reads 0x10 as 16; sqlglot reads it as a bit string x'10'. Whatever dpproxy
    makes of it, no statement it sends may read adult comparing age with anything but ``value``."""
    import json

    from pglast import parser
    from test_attacks import BackendSpy

    with BackendSpy() as spy, one.connect() as conn:
        try:
            conn.execute(f"SELECT count(*) FROM adult WHERE age > {literal}").fetchone()
        except psycopg.Error:
            pass
    for sql in spy.sent:
        if "adult" not in sql:
            continue
        tree = json.loads(parser.parse_sql_json(sql))
        constants = [node["ival"].get("ival", 0) for node in _walk(tree) if isinstance(node, dict) and "ival" in node
                     and isinstance(node["ival"], dict)]
        assert value in constants, f"adult read with age compared to {constants}, not {value}: {sql}"


def _walk(node: object) -> Iterator[object]:
    yield node
    if isinstance(node, dict):
        for item in node.values():
            yield from _walk(item)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)
