"""psql, the client analysts type into, against dpproxy: meta-commands, -c, errors, notices."""

from __future__ import annotations

import os
import subprocess

from conftest import RunningProxy, psql_path


def _psql(proxy: RunningProxy, *args: str, input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PGPASSWORD": "analyst", "PGSSLMODE": "prefer", "PGCONNECT_TIMEOUT": "10"}
    return subprocess.run(
        [psql_path(), "-X", "-h", proxy.host, "-p", str(proxy.port), "-U", "analyst", "-d", "dpproxy_test", *args],
        capture_output=True, text=True, env=env, timeout=60, input=input_text,
    )


def test_psql_lists_tables_with_dt(proxy: RunningProxy):
    result = _psql(proxy, "-c", r"\dt")
    assert result.returncode == 0, result.stderr
    assert "adult" in result.stdout and "lookup" in result.stdout


def test_psql_describes_a_protected_table(proxy: RunningProxy):
    result = _psql(proxy, "-c", r"\d adult")
    assert result.returncode == 0, result.stderr
    assert 'Table "public.adult"' in result.stdout
    assert "hours_per_week" in result.stdout and "integer" in result.stdout


def test_psql_lists_databases_and_schemas(proxy: RunningProxy):
    result = _psql(proxy, "-c", r"\l", "-c", r"\dn")
    assert result.returncode == 0, result.stderr
    assert "List of databases" in result.stdout and "dpproxy_test" in result.stdout
    assert "List of schemas" in result.stdout and "public" in result.stdout


def test_psql_prints_a_noised_count_with_a_notice(proxy: RunningProxy):
    result = _psql(proxy, "-At", "-c", "SELECT COUNT(*) FROM adult WHERE age > 40")
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) > 10000
    assert "NOTICE:  dpproxy: ε charged 1" in result.stderr


def test_psql_runs_several_statements_from_one_c(proxy: RunningProxy):
    result = _psql(proxy, "-At", "-c", "BEGIN; SELECT COUNT(*) FROM adult; SELECT 7; COMMIT")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.split()
    assert lines[0] == "BEGIN" and int(lines[1]) > 40000 and lines[2:] == ["7", "COMMIT"]


def test_psql_shows_sqlstate_and_hint_for_a_refusal(proxy: RunningProxy):
    result = _psql(proxy, "-v", "VERBOSITY=verbose", "-c", r"\set VERBOSITY verbose", "-c", "SELECT * FROM adult")
    assert result.returncode == 1
    assert "ERROR:  DP001: SELECT * is not allowed on protected table adult" in result.stderr
    assert "HINT:" in result.stderr


def test_psql_with_sslmode_require_is_told_ssl_is_not_supported(proxy: RunningProxy):
    env = {**os.environ, "PGPASSWORD": "analyst"}
    result = subprocess.run(
        [psql_path(), f"host={proxy.host} port={proxy.port} dbname=dpproxy_test user=analyst sslmode=require",
         "-c", "SELECT 1"],
        capture_output=True, text=True, env=env, timeout=30,
    )
    assert result.returncode != 0
    assert "does not support SSL" in result.stderr


# psql's "+" variants: each lists sizes (pg_table_size, pg_database_size, pg_tablespace_size
# through pg_size_pretty) or function bodies (pg_get_function_sqlbody).
_PLUS_COMMANDS = [r"\dt+", r"\l+", r"\di+", r"\ds+", r"\dv+", r"\dm+", r"\dE+", r"\db+", r"\df+",
                  r"\d+ adult", r"\dn+", r"\du+"]


def test_psql_plus_commands_succeed_and_show_no_size(proxy: RunningProxy):
    for command in _PLUS_COMMANDS:
        # Unaligned, with separators no cell contains (ACL cells span lines).
        result = _psql(proxy, "-A", "-F", "\x1f", "-R", "\x1e", "-c", command)
        assert result.returncode == 0, (command, result.stderr)
        records = [record.split("\x1f") for record in result.stdout.split("\x1e")]
        header = next((record for record in records if len(record) > 1), [])
        if "Size" in header:
            column = header.index("Size")
            sizes = [record[column] for record in records[records.index(header) + 1:] if len(record) == len(header)]
            assert sizes and set(sizes) == {""}, (command, sizes)  # listed, but no size shown
    listed = _psql(proxy, "-A", "-F", "\t", "-c", r"\dt+ adult").stdout
    assert "adult\ttable" in listed


def test_psql_sees_the_analyst_as_current_and_session_user(proxy: RunningProxy):
    result = _psql(proxy, "-A", "-F", ",", "-c",
                   "SELECT current_user, session_user, user, current_role, pg_catalog.\"current_user\"()")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:2] == ["current_user,session_user,user,current_role,current_user",
                                              "analyst,analyst,analyst,analyst,analyst"]


_BLOCK_WITH_A_REFUSAL = """BEGIN;
SET TimeZone = 'Asia/Tokyo';
SELECT * FROM adult;
SHOW TimeZone;
COMMIT;
SHOW TimeZone;
"""


def test_psql_sees_a_block_failed_by_a_refusal_and_its_commit_rolls_back(proxy: RunningProxy):
    """As after any error on PostgreSQL: the next statement is refused (25P02), COMMIT answers
    ROLLBACK and the block's SET is undone (before, the block went on and was committed)."""
    result = _psql(proxy, "-At", "-f", "-", input_text=_BLOCK_WITH_A_REFUSAL)
    assert "current transaction is aborted" in result.stderr
    assert result.stdout.split() == ["BEGIN", "SET", "ROLLBACK", "Etc/UTC"]


def test_psql_on_error_rollback_goes_on_with_the_block_after_a_refusal(proxy: RunningProxy):
    """psql's ON_ERROR_ROLLBACK rolls back to its own savepoint when told the block failed."""
    result = _psql(proxy, "-At", "-v", "ON_ERROR_ROLLBACK=on", "-f", "-", input_text=_BLOCK_WITH_A_REFUSAL)
    assert "current transaction is aborted" not in result.stderr
    assert result.stdout.split() == ["BEGIN", "SET", "Asia/Tokyo", "COMMIT", "Asia/Tokyo"]
