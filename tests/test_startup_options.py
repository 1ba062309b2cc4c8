"""The ``options`` startup parameter (PGOPTIONS, pgjdbc's ``options``): its settings apply as
PostgreSQL applies them, or the session is refused with a hint; never dropped without a word."""

from __future__ import annotations

import os
import socket
import subprocess

import psycopg
import pytest
import wire

from proxy.serving.startup_options import _split
from tests.conftest import RunningProxy, psql_path


def test_options_split_as_postgresql_splits_them():
    assert _split(r"-c search_path=a\ b  --DateStyle=ISO,\ DMY") == ["-c", "search_path=a b", "--DateStyle=ISO, DMY"]
    assert _split("") == [] and _split(r"\ ") == [" "]


@pytest.mark.parametrize("space", ["\u00a0", "\u2003", "\x1c", "\x85"])
def test_options_split_only_at_the_spaces_postgresql_splits_at(space):
    # Python's isspace split "-c<NBSP>search_path=x" into a setting PostgreSQL reads as one
    # word, a parameter named "<NBSP>search_path" that does not exist.
    assert _split(f"-c{space}search_path=x\t-cTimeZone=UTC") == [f"-c{space}search_path=x", "-cTimeZone=UTC"]


def test_settings_in_options_are_the_sessions(proxy: RunningProxy):
    options = r"-c search_path=pg_catalog,public --TimeZone=Asia/Kathmandu -cdpproxy.epsilon=0.25"
    with psycopg.connect(proxy.dsn(), autocommit=True, options=options) as conn:
        assert conn.execute("SHOW search_path").fetchone() == ("pg_catalog,public",)  # as given, as PostgreSQL keeps it
        assert conn.execute("SHOW TimeZone").fetchone() == ("Asia/Kathmandu",)
        assert conn.execute("SHOW dpproxy.epsilon").fetchone()[0] == "0.25"
        notices: list[str] = []
        conn.add_notice_handler(lambda notice: notices.append(notice.message_primary or ""))
        conn.execute("SELECT COUNT(*) FROM adult").fetchone()
        assert any("ε charged 0.25" in notice for notice in notices), notices


def test_a_parameter_named_outright_wins_over_options(proxy: RunningProxy):
    with psycopg.connect(proxy.dsn(), autocommit=True, options="-c application_name=from_options",
                         application_name="named") as conn:
        assert conn.execute("SHOW application_name").fetchone() == ("named",)


@pytest.mark.parametrize("options, message", [
    ("-c statement_timeout=1", b'the setting "statement_timeout" in the startup options is not applied by dpproxy'),
    ("-c default_transaction_read_only=off", b"is not applied by dpproxy"),
    ("-B 100", b'the startup option "-B" is not a setting'),
])
def test_options_dpproxy_does_not_apply_are_told_in_a_warning(proxy: RunningProxy, options: str, message: bytes):
    # A client's options can hold settings dpproxy sets itself (statement_timeout): the session
    # goes on without them, and says so at startup, rather than dropping them without a word.
    conn = wire.Wire.__new__(wire.Wire)
    conn.sock = socket.create_connection((proxy.host, proxy.port), timeout=15)
    conn.buffer = b""
    try:
        conn.sock.sendall(wire.startup(user="plain", database="dpproxy_test", options=options))
        conn.read_until(b"R")
        conn.sock.sendall(wire.message(b"p", wire.cstr("plain")))
        replies = conn.read_until(b"Z")
        warnings = [wire.error_fields(body) for kind, body in replies if kind == b"N"]
        assert warnings and all(w[b"S"] == b"WARNING" for w in warnings), replies
        assert any(message in w[b"M"] for w in warnings), warnings
        conn.send(wire.message(b"Q", wire.cstr("SHOW default_transaction_read_only")))
        rows = [wire.data_row_values(body) for kind, body in conn.read_until(b"Z") if kind == b"D"]
        assert rows == [[b"on"]]
    finally:
        conn.close()


def test_a_setting_from_options_is_checked_as_from_the_startup_packet(proxy: RunningProxy):
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(proxy.dsn(), autocommit=True, options="-c extra_float_digits=0")
    assert "extra_float_digits" in str(refused.value)


@pytest.mark.clients
def test_psql_with_pgoptions_gets_its_search_path(proxy: RunningProxy):
    result = subprocess.run(
        [psql_path(), "-X", "-A", "-t", "-h", proxy.host, "-p", str(proxy.port), "-U", "analyst", "-d", "dpproxy_test",
         "-c", "SHOW search_path"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "PGPASSWORD": "analyst", "PGOPTIONS": "-c search_path=public,pg_catalog"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "public,pg_catalog"
