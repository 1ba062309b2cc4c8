"""``dpproxy scram-verifier``: the verifier an operator puts in a user's ``scram_verifier``.

It must be what PostgreSQL stores (PostgreSQL takes it as a verifier, not as a password to
hash), of the password given, and let that password log in through dpproxy.
"""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from conftest import TEST_DATABASE, TEST_POLICY, RunningProxy, TestDatabase, make_policy
from scramp import ScramMechanism

from policies.credentials import parse_scram_verifier


def _verifier(password: str | None, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy.cli", "scram-verifier", *args], input=password,
                          capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


def test_the_verifier_printed_is_of_the_password_on_stdin():
    run = _verifier("s3cret pass\n")
    assert run.returncode == 0, run.stderr
    salt, stored, server, rounds = parse_scram_verifier(run.stdout.strip())
    assert rounds == 4096
    assert ScramMechanism("SCRAM-SHA-256").make_auth_info("s3cret pass", iteration_count=rounds, salt=salt)[1:3] \
        == (stored, server)


def test_postgresql_stores_the_verifier_as_it_is(test_db: TestDatabase):
    # A text PostgreSQL did not recognise as a verifier would be hashed as a password.
    verifier = _verifier(None, "--password-env", "DPPROXY_TEST_PASSWORD",
                         env={"DPPROXY_TEST_PASSWORD": "pw"}).stdout.strip()
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS verifier_check")
        conn.execute(f"CREATE ROLE verifier_check PASSWORD '{verifier}'")
        (stored,) = conn.execute("SELECT rolpassword FROM pg_authid WHERE rolname = 'verifier_check'").fetchone()
        conn.execute("DROP ROLE verifier_check")
    assert stored == verifier


def test_a_user_with_the_verifier_logs_in_through_dpproxy_with_the_password(test_db: TestDatabase, tmp_path):
    verifier = _verifier("their password\n").stdout.strip()
    users = f'users:\n  newcomer:\n    scram_verifier: "{verifier}"\n    budget: {{{{epsilon: 10}}}}\n'
    proxy = RunningProxy(make_policy(test_db, tmp_path / "l.sqlite3", TEST_POLICY.replace("users:\n", users, 1)))
    try:
        dsn = f"host={proxy.host} port={proxy.port} dbname={TEST_DATABASE} user=newcomer"
        with psycopg.connect(dsn, password="their password") as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(dsn, password="another").close()
    finally:
        proxy.stop()


@pytest.mark.parametrize("stdin, args, env, message", [
    ("\n", (), {}, "no password given"),
    (None, ("--password-env", "DPPROXY_TEST_UNSET"), {}, "environment variable DPPROXY_TEST_UNSET is not set"),
])
def test_no_password_is_one_line_and_status_1(stdin: str | None, args: tuple[str, ...], env: dict[str, str],
                                              message: str):
    run = _verifier(stdin, *args, env=env)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.startswith(f"dpproxy scram-verifier: {message}") and run.stderr.count("\n") == 1
