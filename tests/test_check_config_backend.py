"""``dpproxy check-config`` reports what ``serve`` would refuse, when it can reach the backend.

Run as the real CLI against the test database: tables and columns missing on the backend,
bounds on a text column, categories on a numeric column, each at its file:line; a good policy
passes and says it was checked against the backend; an unreachable backend is said to leave
the check at the file.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TestDatabase

POLICY = """\
backend:
  dsn: "{dsn}"
  connect_timeout_s: 5
users:
  analyst:
    password: secret
    budget: {{epsilon: 10}}
tables:
  public.adult:
    epsilon: 0.5
    columns:
      age: {{bounds: [17, 90]}}
      sex: {{categories: [Male, Female]}}
  lookup:
    access: public
"""


def _check(tmp_path: Path, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "proxy.cli", "check-config", str(path), *args],
                          capture_output=True, text=True, timeout=120)


def test_a_policy_that_fits_the_backend_is_checked_against_it(test_db: TestDatabase, tmp_path: Path):
    run = _check(tmp_path, POLICY.format(dsn=test_db.service_dsn))
    assert run.returncode == 0, run.stderr
    assert "OK (1 user; tables: 1 protected, 1 public;" in run.stdout and "checked against the backend" in run.stdout


def test_what_serve_would_refuse_is_reported_at_its_line(test_db: TestDatabase, tmp_path: Path):
    text = (POLICY.format(dsn=test_db.service_dsn)
            .replace("      sex: {categories: [Male, Female]}",
                     "      sex: {bounds: [0, 1]}\n"            # line 13: bounds on a text column
                     "      education_num: {categories: [a]}\n"  # line 14: categories on a numeric column
                     "      no_such_column: {bounds: [0, 1]}")   # line 15
            + "  public.no_such_table:\n    epsilon: 1\n")       # line 18
    run = _check(tmp_path, text)
    assert run.returncode == 1
    path = tmp_path / "policy.yaml"
    lines = run.stderr.strip().splitlines()
    assert f"{path}:13: tables.public.adult.columns.sex: bounds need a numeric column" in lines[0]
    assert any(line.startswith(f"{path}:14: tables.public.adult.columns.education_num: categories are for a text")
               for line in lines)
    assert f"{path}:15: tables.public.adult.columns.no_such_column: no such column on the backend" in lines
    assert f"{path}:18: tables.public.no_such_table: no such relation on the backend" in lines
    assert len(lines) == 4


def test_a_database_not_in_utf8_is_refused_for_how_it_folds_names(test_db: TestDatabase, tmp_path: Path):
    """In LATIN1 PostgreSQL lowers the non-ASCII letters of an unquoted name (ÉX is éx), where
    dpproxy, as PostgreSQL in UTF8, lowers only ASCII ones (Éx): a name judged as one column
    could denote another. Such a database is refused, at its policy's backend line."""
    import psycopg

    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS dpproxy_latin1")
        admin.execute("CREATE DATABASE dpproxy_latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    try:
        dsn = psycopg.conninfo.make_conninfo(test_db.service_dsn, dbname="dpproxy_latin1")
        run = _check(tmp_path, POLICY.format(dsn=dsn))
        assert run.returncode == 1
        assert f"{tmp_path / 'policy.yaml'}:2: backend.dsn: the database's encoding is LATIN1" in run.stderr, run.stderr
    finally:
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS dpproxy_latin1")


def test_an_unreachable_backend_leaves_the_check_at_the_file(tmp_path: Path):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    run = _check(tmp_path, POLICY.format(dsn=f"postgresql://svc@127.0.0.1:{port}/db"))
    assert run.returncode == 0, run.stderr
    assert "checked the file only, not against the backend" in run.stdout


def test_file_only_does_not_connect(test_db: TestDatabase, tmp_path: Path):
    text = POLICY.format(dsn=test_db.service_dsn) + "  public.no_such_table:\n    epsilon: 1\n"
    run = _check(tmp_path, text, "--file-only")
    assert run.returncode == 0 and "checked the file only" in run.stdout


@pytest.mark.parametrize("line, entry, number", [
    ("      sex: {categories: [Male, Female]}", "      sex: {bounds: [0, 1]}", 13),
    ("      age: {bounds: [17, 90]}", "      age: {categories: ['17']}", 12),
])
def test_serve_refuses_a_column_entry_that_does_not_fit_its_type(test_db: TestDatabase, tmp_path: Path,
                                                                 line: str, entry: str, number: int):
    path = tmp_path / "policy.yaml"
    path.write_text(POLICY.format(dsn=test_db.service_dsn).replace(line, entry))
    serve = subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "-c", str(path), "--port", "0"],
                           capture_output=True, text=True, timeout=60)  # a serve that starts fails here
    assert serve.returncode == 1
    column = entry.split(":")[0].strip()
    # The "dpproxy: " prefix every other start-up failure has (it was missing here).
    assert (f"dpproxy: policy does not match the backend: {path}:{number}: tables.public.adult.columns.{column}:"
            in serve.stderr)


def test_a_time_range_on_a_column_that_is_not_a_date_is_reported(test_db: TestDatabase, tmp_path: Path):
    text = POLICY.format(dsn=test_db.service_dsn).replace(
        "      age: {bounds: [17, 90]}", "      age: {bounds: [2021-01-01, 2024-12-31], group_by: [month]}")
    run = _check(tmp_path, text)
    assert run.returncode == 1
    assert run.stderr.strip() == (f"{tmp_path / 'policy.yaml'}:12: tables.public.adult.columns.age: a time range "
                                  "(bounds of dates) needs a date or timestamp column; on the backend it is not one")


def test_group_by_opt_ins_that_fit_the_backend_pass(test_db: TestDatabase, tmp_path: Path):
    text = (POLICY.format(dsn=test_db.service_dsn)
            .replace("      sex: {categories: [Male, Female]}", "      sex: {categories: [Male, Female], group_by: true}")
            .replace("      age: {bounds: [17, 90]}", "      age: {bounds: [17, 90], group_by: true}\n"
                     "      interview_date: {bounds: [2021-01-01, 2024-12-31], group_by: [month, quarter, year]}"))
    run = _check(tmp_path, text)
    assert run.returncode == 0, run.stderr
    assert "checked against the backend" in run.stdout


def test_a_category_the_columns_type_cannot_read_is_reported(test_db: TestDatabase, tmp_path: Path):
    # A label the type cannot read failed every query comparing with it, or grouping by the
    # column, on the backend: after the query's charge, for nothing.
    import psycopg

    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS label_fit; DROP TYPE IF EXISTS label_mood")
        conn.execute("CREATE TYPE label_mood AS ENUM ('calm', 'happy')")
        conn.execute("CREATE TABLE label_fit (flag boolean, mood label_mood)")
        conn.execute("GRANT SELECT ON label_fit TO dpproxy_service")
    table = ("  label_fit:\n"
             "    epsilon: 1\n"
             "    columns:\n"
             "      flag: {{categories: ['true', 'false'], other: {other}, group_by: true}}\n"  # line 19
             "      mood: {{categories: [calm, {mood}]}}\n")                                 # line 20
    run = _check(tmp_path, POLICY.format(dsn=test_db.service_dsn) + table.format(other="unknown", mood="furious"))
    assert run.returncode == 1
    path = tmp_path / "policy.yaml"
    assert [line.split(" (")[0] for line in run.stderr.strip().splitlines()] == [
        f"{path}:19: tables.label_fit.columns.flag: 'unknown' is not a value of the column's type boolean",
        f"{path}:20: tables.label_fit.columns.mood: 'furious' is not a value of the column's type label_mood",
    ]
    fitting = table.format(other="x", mood="happy").replace(", other: x", "")
    run = _check(tmp_path, POLICY.format(dsn=test_db.service_dsn) + fitting)
    assert run.returncode == 0, run.stderr


def test_a_backend_that_refuses_the_login_fails_the_check_at_the_dsn_line(test_db: TestDatabase, tmp_path: Path):
    # serve stops on this DSN; the check said "OK; checked the file only" and exited 0.
    import psycopg

    dsn = psycopg.conninfo.make_conninfo(test_db.service_dsn, dbname="dpproxy_no_such_database")
    run = _check(tmp_path, POLICY.format(dsn=dsn))
    assert run.returncode == 1, run.stdout
    assert run.stderr.startswith(f"{tmp_path / 'policy.yaml'}:2: backend.dsn: the backend at ")
    assert 'refused the connection: database "dpproxy_no_such_database" does not exist' in run.stderr


def test_a_protected_table_the_service_role_cannot_read_is_reported_with_the_grant(test_db: TestDatabase,
                                                                                   tmp_path: Path):
    # Each DP query on it was charged, then failed with "permission denied": budget for nothing.
    import psycopg

    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS ungranted")
        conn.execute("CREATE TABLE ungranted (a integer, b text)")
    table = "  ungranted:\n    epsilon: 1\n"  # line 16
    run = _check(tmp_path, POLICY.format(dsn=test_db.service_dsn) + table)
    assert run.returncode == 1
    assert run.stderr.strip() == (
        f'{tmp_path / "policy.yaml"}:16: tables.ungranted: the service role cannot read "public"."ungranted" on the '
        'backend, so every DP query on it would be charged and then fail; '
        'GRANT SELECT ON "public"."ungranted" TO "dpproxy_service"')
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("GRANT SELECT (a) ON ungranted TO dpproxy_service")  # one column of two: still not readable
    assert _check(tmp_path, POLICY.format(dsn=test_db.service_dsn) + table).returncode == 1
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("GRANT SELECT (b) ON ungranted TO dpproxy_service")  # every column: readable
    run = _check(tmp_path, POLICY.format(dsn=test_db.service_dsn) + table)
    assert run.returncode == 0, run.stderr


def test_the_example_policy_fits_the_table_it_describes(test_db: TestDatabase):
    # examples/policy.yaml is where a data engineer starts: it must pass as it stands.
    import os

    import psycopg

    example = Path(__file__).resolve().parent.parent / "examples" / "policy.yaml"
    table = "\n".join(line.removeprefix("#  ").strip() for line in example.read_text().splitlines()
                      if line.startswith("#  ") and not line.startswith("#   dpproxy"))
    assert table.startswith("CREATE TABLE public.orders")
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS public.orders")
        conn.execute(table)
    try:
        env = {**os.environ, "DPPROXY_BACKEND_DSN": test_db.service_dsn, "ANALYST_PASSWORD": "secret"}
        run = subprocess.run([sys.executable, "-m", "proxy.cli", "check-config", str(example)],
                             capture_output=True, text=True, timeout=120, env=env)
    finally:
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS public.orders")
    assert run.returncode == 0, run.stderr
    assert "OK (1 user; tables: 1 protected, 0 public; checked against the backend" in run.stdout


_AT = 'connection failed: connection to server at "10.0.0.5", port 5432 failed: '


@pytest.mark.parametrize("error, rejects", [
    (_AT + 'FATAL:  password authentication failed for user "svc"', True),
    (_AT + 'FATAL:  no pg_hba.conf entry for host "10.0.0.9", user "svc", database "db", no encryption', True),
    (_AT + 'FATAL:  database "db" does not exist', True),
    (_AT + "FATAL:  the database system is starting up", False),   # comes back by itself
    (_AT + "FATAL:  sorry, too many clients already", False),
    (_AT + "Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?", False),
    (_AT + "timeout expired", False),
])
def test_only_a_backend_that_answers_no_to_the_login_fails_the_check(error: str, rejects: bool):
    import psycopg

    from proxy.serving.startup import backend_rejects_policy

    assert backend_rejects_policy(psycopg.OperationalError(error)) is rejects


@pytest.mark.parametrize("sqlstate, rejects", [("42501", True), ("57014", False), ("08006", False), ("53300", False)])
def test_a_catalog_query_that_fails_for_the_role_fails_the_check_and_one_cut_short_does_not(sqlstate: str,
                                                                                             rejects: bool):
    from proxy.backend.errors import BackendError
    from proxy.serving.startup import backend_rejects_policy

    assert backend_rejects_policy(BackendError(sqlstate, "x")) is rejects


def test_numeric_bounds_on_a_time_column_are_told_to_be_a_time_range(test_db: TestDatabase, tmp_path: Path):
    # "bounds need a numeric column ... (use categories for a text column)" was no help on a date.
    text = POLICY.format(dsn=test_db.service_dsn).replace("      sex: {categories: [Male, Female]}",
                                                          "      interview_date: {bounds: [0, 100]}")
    run = _check(tmp_path, text)
    assert run.returncode == 1
    assert run.stderr.strip() == (f"{tmp_path / 'policy.yaml'}:13: tables.public.adult.columns.interview_date: bounds "
                                  "of numbers on a date or timestamp column; give it a time range, e.g. bounds: "
                                  "[2021-01-01, 2024-12-31]")


def test_a_table_in_a_schema_the_service_role_cannot_use_is_reported_with_the_grant(test_db: TestDatabase,
                                                                                   tmp_path: Path):
    # Was one line at backend.dsn, "the backend failed a catalog query as the service role:
    # permission denied for schema ...", naming neither the table nor the GRANT.
    import psycopg

    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS unusable CASCADE")
        conn.execute("CREATE SCHEMA unusable")
        conn.execute("CREATE TABLE unusable.visits (n integer)")
        conn.execute("GRANT SELECT ON unusable.visits TO dpproxy_service")
    try:
        tables = ("  unusable.visits:\n    epsilon: 1\n"        # line 16
                  "  no_such_schema.visits:\n    epsilon: 1\n")  # line 18
        run = _check(tmp_path, POLICY.format(dsn=test_db.service_dsn) + tables)
        assert run.returncode == 1
        path = tmp_path / "policy.yaml"
        assert run.stderr.splitlines() == [
            f'{path}:16: tables.unusable.visits: the service role cannot use the schema "unusable" on the backend, '
            'so it can read no table in it; GRANT USAGE ON SCHEMA "unusable" TO "dpproxy_service"',
            f"{path}:18: tables.no_such_schema.visits: no such relation on the backend",
        ]
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
            conn.execute("GRANT USAGE ON SCHEMA unusable TO dpproxy_service")
        run = _check(tmp_path, POLICY.format(dsn=test_db.service_dsn) + tables.split("  no_such_schema")[0])
        assert run.returncode == 0, run.stderr
    finally:
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
            conn.execute("DROP SCHEMA IF EXISTS unusable CASCADE")


def test_a_mistyped_column_is_told_the_column_it_may_mean(test_db: TestDatabase, tmp_path: Path):
    text = POLICY.format(dsn=test_db.service_dsn).replace("      sex: {categories: [Male, Female]}",
                                                          "      sxe: {categories: [Male, Female]}")
    run = _check(tmp_path, text)
    assert run.returncode == 1
    assert run.stderr.strip() == (f"{tmp_path / 'policy.yaml'}:13: tables.public.adult.columns.sxe: "
                                  "no such column on the backend (did you mean sex?)")
