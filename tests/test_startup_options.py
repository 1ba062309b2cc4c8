"""The ``options`` startup parameter (PGOPTIONS, pgjdbc's ``options``): its settings apply as
PostgreSQL applies them, or the session is refused with a hint; never dropped without a word."""

from __future__ import annotations

import os
import subprocess

import psycopg
import pytest

from proxy.serving.startup_options import _split
from tests.conftest import RunningProxy, psql_path


def test_options_split_as_postgresql_splits_them():
    assert _split(r"-c search_path=a\ b  --DateStyle=ISO,\ DMY") == ["-c", "search_path=a b", "--DateStyle=ISO, DMY"]
    assert _split("") == [] and _split(r"\ ") == [" "]


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
    ("-c statement_timeout=1", 'setting "statement_timeout" in the startup options is not passed through dpproxy'),
    ("-c default_transaction_read_only=off", "is not passed through dpproxy"),
    ("-B 100", "invalid command-line argument"),
    ("-c extra_float_digits=0", "extra_float_digits"),
])
def test_options_dpproxy_does_not_take_refuse_the_session_with_a_hint(proxy: RunningProxy, options: str, message: str):
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(proxy.dsn(), autocommit=True, options=options)
    assert message in str(refused.value)


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
