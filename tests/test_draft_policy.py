"""``dpproxy draft-policy``: a newcomer's first policy, drafted from the catalog and never from rows.

On a real PostgreSQL (the suite's): a schema with integer, numeric, float, text, varchar, enum,
date, timestamptz, boolean, jsonb and domain columns and CHECK constraints is drafted by a role
that may SELECT none of its tables (so the command can have read no row); the draft's
placeholders are refused by ``check-config`` at their lines; once the test fills them in,
``check-config`` passes against the backend and ``dpproxy serve`` answers DP aggregates on it.
Bad input (an unreachable server, a table or schema that does not exist, an empty schema, an
output file that exists) is one line and exit status 1.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlparse

import psycopg
import pytest

from conftest import TestDatabase
from policies.loader import PolicyError, parse_policy
from policies.relation_keys import key_parts, policy_key
from proxy.backend.check_domains import declared_by_checks
from proxy.backend.schema_catalog import CatalogColumn, CatalogTable
from proxy.cli.draft_policy import draft_text

DATABASE = "dpproxy_draft"
READER = "dpproxy_draft_reader"  # may read the catalog, and no table

SCHEMA = """
CREATE TYPE plan AS ENUM ('free', 'pro', 'team');
CREATE DOMAIN percent AS numeric CHECK (VALUE BETWEEN 0 AND 100);
CREATE DOMAIN country_code AS varchar(2) CHECK (VALUE IN ('FR', 'DE', 'US'));
CREATE TABLE customers (
    id serial PRIMARY KEY,
    age integer NOT NULL CHECK (age BETWEEN 18 AND 120),
    visits integer NOT NULL,
    spend numeric(10,2) CHECK (spend >= 0 AND spend <= 5000),
    rating double precision CHECK (rating >= 0),
    note text,
    status varchar(10) NOT NULL CHECK (status IN ('active', 'paused', 'closed')),
    plan plan NOT NULL,
    signed_up date NOT NULL CHECK (signed_up BETWEEN '2020-01-01' AND '2025-12-31'),
    last_seen timestamptz,
    newsletter boolean NOT NULL,
    prefs jsonb,
    discount percent,
    country country_code,
    shipped timestamp CHECK (shipped >= '2022-01-01' AND shipped < '2026-01-01'),
    paid_at timestamptz CHECK (paid_at >= '2022-01-01')
);
INSERT INTO customers (age, visits, spend, rating, note, status, plan, signed_up, last_seen, newsletter, prefs,
                       discount, country)
SELECT 18 + i % 60, i % 40, (i % 500) * 1.5, (i % 6)::float8, 'n' || i, (ARRAY['active', 'paused', 'closed'])[1 + i % 3],
       (ARRAY['free', 'pro', 'team'])[1 + i % 3]::plan, DATE '2021-01-01' + i % 1000, TIMESTAMPTZ '2024-01-01' + i * INTERVAL '1 hour',
       i % 2 = 0, '{}'::jsonb, i % 50, (ARRAY['FR', 'DE', 'US'])[1 + i % 3]
FROM generate_series(1, 3000) AS i;
CREATE SCHEMA empty_schema;

-- A table whose name holds a dot, beside a decoy that the name split at its last dot would be.
CREATE SCHEMA "Sales";
CREATE SCHEMA "Sales.Order";
CREATE TABLE "Sales"."Order.Items" ("Qty" integer NOT NULL CHECK ("Qty" BETWEEN 1 AND 10),
                                    "Region" text CHECK ("Region" IN ('North', 'South')));
CREATE TABLE "Sales.Order"."Items" ("Qty" integer NOT NULL CHECK ("Qty" BETWEEN 1 AND 10),
                                    "Region" text CHECK ("Region" IN ('North', 'South')));
INSERT INTO "Sales"."Order.Items" SELECT 1 + i % 10, (ARRAY['North', 'South'])[1 + i % 2] FROM generate_series(1, 2000) i;
INSERT INTO "Sales.Order"."Items" SELECT 1, 'North' FROM generate_series(1, 10) i;

-- Categories a CHECK declares: 150 of them, one longer than the default max_text_bytes, one with a line break.
CREATE SCHEMA codes;
CREATE TABLE codes.items (code text CHECK (code IN (CODES)),
                          label text CHECK (label IN ('short', LONG_LABEL, E'two\nlines')));
INSERT INTO codes.items SELECT 'c' || (i % 150), CASE WHEN i % 2 = 0 THEN LONG_LABEL ELSE 'short' END
FROM generate_series(1, 2000) i;
CREATE VIEW codes.short_items AS SELECT code FROM codes.items WHERE label = 'short';
CREATE SCHEMA views_only;
CREATE VIEW views_only.v AS SELECT 1 AS a;
""".replace("CODES", ", ".join(f"'c{i}'" for i in range(150))).replace("LONG_LABEL", "'" + "é" * 150 + "'")


@pytest.fixture(scope="module")
def shop(test_db: TestDatabase) -> Iterator[tuple[str, str, str]]:
    """(a DSN of the shop database as the role that may read no table, the service role's DSN,
    the superuser's), the database made afresh."""
    admin_url = urlparse(test_db.admin_dsn)
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {DATABASE}")
        if admin.execute("SELECT FROM pg_roles WHERE rolname = %s", (READER,)).fetchone() is None:
            admin.execute(f"CREATE ROLE {READER} LOGIN")
    shop_admin = admin_url._replace(path=f"/{DATABASE}").geturl()
    with psycopg.connect(shop_admin, autocommit=True) as conn:
        conn.execute(SCHEMA)
        conn.execute("GRANT SELECT ON customers TO dpproxy_service")
        conn.execute('GRANT USAGE ON SCHEMA "Sales", "Sales.Order", codes TO dpproxy_service')
        conn.execute('GRANT SELECT ON ALL TABLES IN SCHEMA "Sales", "Sales.Order", codes TO dpproxy_service')
        conn.execute(f"REVOKE ALL ON customers FROM {READER}, PUBLIC")
    service = urlparse(test_db.service_dsn)._replace(path=f"/{DATABASE}").geturl()
    reader = urlparse(test_db.service_dsn)._replace(path=f"/{DATABASE}", netloc=f"{READER}@").geturl()
    yield reader, service, shop_admin
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")


def _dpproxy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def _line_of(text: str, needle: str) -> int:
    (number,) = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    return number


def _draft(shop: tuple[str, str, str], tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "policy.yaml"
    run = _dpproxy("draft-policy", "--dsn", shop[0], "-o", str(path))
    assert run.returncode == 0, run.stderr
    assert f"wrote {path} (1 table; 5 columns with FILL_IN to decide)" in run.stderr and "check-config" in run.stderr
    return path, path.read_text()


def test_the_draft_is_read_by_a_role_that_can_read_no_row(shop: tuple[str, str, str], tmp_path: Path):
    """The role drafting it may SELECT none of the tables: had the command read a row (a MIN, a
    DISTINCT), it would have failed with permission denied. It read the catalog only."""
    with psycopg.connect(shop[2]) as admin:
        (allowed,) = admin.execute("SELECT has_table_privilege(%s, 'customers', 'SELECT')", (READER,)).fetchone()
    assert allowed is False
    with psycopg.connect(shop[0]) as reader, pytest.raises(psycopg.errors.InsufficientPrivilege):
        reader.execute("SELECT min(age) FROM customers")
    _, text = _draft(shop, tmp_path)
    assert "public.customers:" in text and "access: protected" in text


def test_bounds_and_categories_come_only_from_what_the_schema_declares(shop: tuple[str, str, str], tmp_path: Path):
    _, text = _draft(shop, tmp_path)
    lines = {line.split(":", 1)[0].strip("# "): line for line in text.splitlines() if line.startswith(("      ", "      #"))}
    assert "{bounds: [18, 120]}" in lines["age"] and "from the schema: CHECK customers_age_check" in lines["age"]
    assert "{bounds: [0, 5000]}" in lines["spend"] and "numeric(10,2)" in lines["spend"]
    assert "{bounds: [0, FILL_IN]}" in lines["rating"] and "one end" in lines["rating"]
    assert "{bounds: [FILL_IN, FILL_IN]}" in lines["visits"] and "integer NOT NULL" in lines["visits"]
    assert "{categories: [FILL_IN]}" in lines["note"]
    assert "{categories: [active, paused, closed], group_by: true}" in lines["status"]
    assert "character varying(10)" in lines["status"]
    assert "{categories: [free, pro, team], group_by: true}" in lines["plan"] and "enum" in lines["plan"]
    assert "{bounds: [2020-01-01, 2025-12-31]}" in lines["signed_up"]
    assert "{bounds: [FILL_IN, FILL_IN]}" in lines["last_seen"] and "timestamp with time zone" in lines["last_seen"]
    assert "{categories: ['true', 'false'], group_by: true}" in lines["newsletter"]
    assert lines["prefs"].lstrip().startswith("# prefs: jsonb: only counted")
    assert lines["id"].lstrip().startswith("# id: integer NOT NULL, in the primary key")
    assert lines["discount"].lstrip().startswith("# discount: percent (domain percent): counted only")
    assert "its domain declares [0, 100]" in lines["discount"]
    assert "{categories: [FR, DE, US], group_by: true}" in lines["country"] and "domain country_code" in lines["country"]
    assert "{bounds: [2022-01-01 00:00:00, 2026-01-01 00:00:00]}" in lines["shipped"]
    # A timestamptz constant is a wall-clock time only in some time zone: nothing is taken from it.
    assert "{bounds: [FILL_IN, FILL_IN]}" in lines["paid_at"]
    # The header says why no value was taken from the rows, and the users and backend are as the example's.
    assert "not derived from the data (bounds computed from the current MIN/MAX leak them" in " ".join(
        line.lstrip("# ") for line in text.splitlines()[:6])
    assert "dsn_env: DPPROXY_BACKEND_DSN" in text and "password_env: ANALYST_PASSWORD" in text
    assert "dpproxy_draft_reader@" in text or "user=dpproxy_draft_reader" in text


def test_placeholders_are_refused_at_their_lines_until_filled_in_then_serve_answers(
    shop: tuple[str, str, str], tmp_path: Path
):
    path, text = _draft(shop, tmp_path)
    env = {"DPPROXY_BACKEND_DSN": shop[1], "ANALYST_PASSWORD": "analyst"}
    run = _dpproxy("check-config", str(path), env=env)
    assert run.returncode == 1
    problems = run.stderr.strip().splitlines()
    expected = [(column, _line_of(text, f"      {column}: "))
                for column in ("visits", "rating", "note", "last_seen", "paid_at")]
    assert [line.split(": a placeholder")[0] for line in problems] == [
        f"{path}:{line}: tables.public.customers.columns.{column}.{'categories' if column == 'note' else 'bounds'}"
        for column, line in expected
    ]
    assert all("replace FILL_IN with" in line and "never from its rows" in line for line in problems)

    filled = (text.replace("visits: {bounds: [FILL_IN, FILL_IN]}", "visits: {bounds: [0, 100]}")
              .replace("rating: {bounds: [0, FILL_IN]}", "rating: {bounds: [0, 5]}")
              .replace("last_seen: {bounds: [FILL_IN, FILL_IN]}", "last_seen: {bounds: [2024-01-01, 2024-12-31]}")
              .replace("paid_at: {bounds: [FILL_IN, FILL_IN]}", "paid_at: {bounds: [2022-01-01, 2026-12-31]}"))
    filled = "\n".join(line for line in filled.splitlines() if not line.startswith("      note:")) + "\n"
    with _checked_and_served(path, filled, tmp_path, env) as conn:
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        (count,) = conn.execute("SELECT COUNT(*) FROM customers").fetchone()
        assert abs(count - 3000) < 100
        (avg,) = conn.execute("SELECT AVG(age) FROM customers").fetchone()
        assert 18 <= float(avg) <= 120
        assert len(notices) == 2 and all(notice.startswith("dpproxy: ε charged 1") for notice in notices)
        plans = conn.execute("SELECT plan, COUNT(*) FROM customers GROUP BY plan").fetchall()
        assert [row[0] for row in plans] == ["free", "pro", "team"]
        assert len(conn.execute("SELECT newsletter, COUNT(*) FROM customers GROUP BY newsletter").fetchall()) == 2
        with pytest.raises(psycopg.Error, match="not allowed"):
            conn.execute("SELECT * FROM customers")


@contextmanager
def _checked_and_served(path: Path, text: str, tmp_path: Path, env: dict[str, str]) -> Iterator[psycopg.Connection]:
    """``text`` (a draft with no placeholder left) written to ``path`` with its ledger and audit
    log in ``tmp_path``, passed by ``check-config`` against the backend, then served: an analyst's
    connection to it."""
    path.write_text(text.replace("sqlite:///dpproxy-ledger.sqlite3", f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
                    .replace("path: audit.jsonl", f"path: {tmp_path / 'audit.jsonl'}"))
    run = _dpproxy("check-config", str(path), env=env)
    assert run.returncode == 0, run.stderr
    assert "checked against the backend" in run.stdout

    process = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "-c", str(path), "--port", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, **env})
    try:
        port = _listening_port(process)
        with psycopg.connect(host="127.0.0.1", port=port, dbname=DATABASE, user="analyst", password="analyst",
                             autocommit=True) as conn:
            yield conn
    finally:
        process.terminate()
        process.wait(timeout=60)


def _listening_port(process: subprocess.Popen[str]) -> int:
    assert process.stdout is not None
    output = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        output.append(line)
        found = re.search(r"dpproxy listening on .*:(\d+) for database ", line)
        if found:
            return int(found.group(1))
    raise AssertionError("serve did not listen:\n" + "".join(output))


def test_a_table_whose_name_holds_a_dot_is_drafted_checked_and_served_as_itself(shop: tuple[str, str, str],
                                                                               tmp_path: Path):
    """``"Sales"."Order.Items"`` split at its last dot would be ``"Sales.Order"."Items"``, a table
    of the same columns here: the draft's key quotes each part, so the policy protects the table
    drafted, and its decoy stays out of the policy."""
    path = tmp_path / "policy.yaml"
    run = _dpproxy("draft-policy", "--dsn", shop[0], "--schema", "Sales", "-o", str(path))
    assert run.returncode == 0, run.stderr
    text = path.read_text()
    assert "\n  '\"Sales\".\"Order.Items\"':   # a table" in text
    assert "      Qty: {bounds: [1, 10]}" in text and "      Region: {categories: [North, South], group_by: true}" in text
    env = {"DPPROXY_BACKEND_DSN": shop[1], "ANALYST_PASSWORD": "analyst"}
    with _checked_and_served(path, text, tmp_path, env) as conn:
        (count,) = conn.execute('SELECT COUNT(*) FROM "Sales"."Order.Items"').fetchone()
        assert abs(count - 2000) < 100  # the decoy holds 10 rows
        regions = conn.execute('SELECT "Region", COUNT(*) FROM "Sales"."Order.Items" GROUP BY "Region"').fetchall()
        assert [row[0] for row in regions] == ["North", "South"]
        with pytest.raises(psycopg.Error, match="Items"):
            conn.execute('SELECT COUNT(*) FROM "Sales.Order"."Items"')


def test_a_key_of_several_dots_naming_no_relation_is_told_how_to_quote_its_parts(shop: tuple[str, str, str],
                                                                                tmp_path: Path):
    path = tmp_path / "policy.yaml"
    run = _dpproxy("draft-policy", "--dsn", shop[0], "--schema", "Sales", "-o", str(path))
    assert run.returncode == 0, run.stderr
    text = path.read_text().replace("'\"Sales\".\"Order.Items\"':", "Sales.Order.Lines:")
    path.write_text(text)
    run = _dpproxy("check-config", str(path), env={"DPPROXY_BACKEND_DSN": shop[1], "ANALYST_PASSWORD": "analyst"})
    assert run.returncode == 1
    assert run.stderr == (f"{path}:{_line_of(text, 'Sales.Order.Lines:')}: tables.Sales.Order.Lines: no such relation "
                          "on the backend (a schema or table whose name holds a dot is written with each part in "
                          "double quotes, as SQL writes it: '\"Sales\".\"Order.Items\"' (a \"\" for a quote inside one))\n")


def test_long_category_lists_are_drafted_so_that_the_policy_loads_and_every_category_is_read(
    shop: tuple[str, str, str], tmp_path: Path
):
    """150 categories from one CHECK, one of 300 bytes (past the default max_text_bytes, 256, which
    the policy would refuse) and one with a line break: the draft raises the table's
    max_text_bytes to the longest and keeps each entry on its line; the long category is then a
    value rows match, not one read as NULL."""
    path = tmp_path / "policy.yaml"
    run = _dpproxy("draft-policy", "--dsn", shop[0], "--schema", "codes", "-o", str(path))
    assert run.returncode == 0, run.stderr
    text = path.read_text()
    long_label = "é" * 150
    assert "    max_text_bytes: 300   # not 256: the schema declares a category of label this long" in text
    (code,) = [line for line in text.splitlines() if line.startswith("      code: ")]
    assert code.startswith("      code: {categories: [c0, c1, c2, ") and "c149], group_by: true}" in code
    (label,) = [line for line in text.splitlines() if line.startswith("      label: ")]
    assert label.startswith(f'      label: {{categories: [short, {long_label}, "two\\nlines"], group_by: true}}')
    env = {"DPPROXY_BACKEND_DSN": shop[1], "ANALYST_PASSWORD": "analyst"}
    with _checked_and_served(path, text, tmp_path, env) as conn:
        (count,) = conn.execute("SELECT COUNT(*) FROM codes.items WHERE label = %s", (long_label,)).fetchone()
        assert abs(count - 1000) < 100
        assert len(conn.execute("SELECT code, COUNT(*) FROM codes.items GROUP BY code").fetchall()) == 150


def test_a_table_named_is_found_by_a_role_without_usage_on_its_schema_and_unqualified_in_schema(
    shop: tuple[str, str, str]
):
    """The reader has no USAGE on "Sales" (to_regclass would refuse it: permission denied for
    schema), yet a draft reads the catalog only; and a quoted name holding a dot is a name in
    --schema, not a qualified one."""
    with psycopg.connect(shop[2]) as admin:
        (usage,) = admin.execute("SELECT has_schema_privilege(%s, 'Sales', 'USAGE')", (READER,)).fetchone()
    assert usage is False
    for args in (['"Sales"."Order.Items"'], ["--schema", "Sales", '"Order.Items"']):
        run = _dpproxy("draft-policy", "--dsn", shop[0], *args)
        assert run.returncode == 0, run.stderr
        assert "\n  '\"Sales\".\"Order.Items\"':   # a table" in run.stdout


def test_the_views_of_a_schema_drafted_whole_are_named_as_left_out(shop: tuple[str, str, str], tmp_path: Path):
    """A view is protected only if it computes nothing that can fail on a row, which the catalog
    does not say: a draft of a whole schema leaves its views out, and says so, rather than
    letting them look forgotten."""
    path = tmp_path / "policy.yaml"
    run = _dpproxy("draft-policy", "--dsn", shop[0], "--schema", "codes", "-o", str(path))
    assert run.returncode == 0, run.stderr
    assert "(1 table; 0 columns with FILL_IN to decide; 1 view left out: name it as a TABLE to draft it)" in run.stderr
    assert path.read_text().endswith("\n#\n# Not drafted, views and foreign tables of the schema: short_items. A "
                                     "protected view must compute\n# nothing that can fail on a row (docs/policy.md, "
                                     "tables); to draft one, name it as a TABLE\n# argument.\n")
    run = _dpproxy("draft-policy", "--dsn", shop[0], "codes.short_items")
    assert run.returncode == 0 and "  codes.short_items:   # a view" in run.stdout
    run = _dpproxy("draft-policy", "--dsn", shop[0], "--schema", "views_only")
    assert run.returncode == 1
    assert run.stderr == ("dpproxy draft-policy: the schema views_only holds no table; 1 view left out: name it as a "
                          "TABLE to draft it — name another with --schema, or the tables as TABLE arguments "
                          "(schema.table)\n")


def test_the_dsn_is_read_from_the_variable_dsn_env_names_and_its_passwords_are_never_written(
    shop: tuple[str, str, str]
):
    """``--dsn-env VAR`` keeps the DSN (and a password in it) out of the command line and out of
    what the command writes. The suite's server trusts its local connections, so the passwords
    given are not checked."""
    reader = urlparse(shop[0])
    dsn = reader._replace(netloc=f"{READER}:pw-of-the-reader@{reader.netloc.split('@')[1]}",
                          query=f"{reader.query}&sslpassword=passphrase-of-the-key").geturl()
    run = _dpproxy("draft-policy", "--dsn-env", "DRAFT_DSN", "customers", env={"DRAFT_DSN": dsn})
    assert run.returncode == 0, run.stderr
    assert "public.customers:" in run.stdout and f"user={READER}" in run.stdout
    assert "pw-of-the-reader" not in run.stdout + run.stderr
    assert "passphrase-of-the-key" not in run.stdout + run.stderr

    run = _dpproxy("draft-policy", "--dsn-env", "DRAFT_DSN", env={"DRAFT_DSN": ""})
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr == ("dpproxy draft-policy: the environment variable DRAFT_DSN is not set or empty — export the "
                          "database's DSN in it (--dsn-env names the variable, not the DSN)\n")


def test_the_example_dsn_leaves_out_the_password_and_the_key_files_passphrase():
    text = draft_text([], "postgresql://reader:pw-of-the-reader@db.internal/shop?sslpassword=passphrase&sslmode=require")
    (line,) = [line for line in text.splitlines() if "dsn_env:" in line]
    assert line == "  dsn_env: DPPROXY_BACKEND_DSN   # e.g. user=reader dbname=shop host=db.internal sslmode=require"


def test_a_draft_with_nothing_left_to_decide_says_check_config_is_next(shop: tuple[str, str, str], tmp_path: Path):
    path = tmp_path / "policy.yaml"
    run = _dpproxy("draft-policy", "--dsn", shop[0], "--schema", "Sales", "-o", str(path))
    assert run.returncode == 0
    assert run.stderr == (f"dpproxy draft-policy: wrote {path} (1 table; 0 columns with FILL_IN to decide). "
                          f"Next: dpproxy check-config {path}\n")


def test_a_failure_to_connect_names_the_variable_the_dsn_came_from(tmp_path: Path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        run = _dpproxy("draft-policy", "--dsn-env", "DRAFT_DSN", env={"DRAFT_DSN": f"postgresql://u:pw@127.0.0.1:{port}/db"})
    assert run.returncode == 1 and run.stderr.count("\n") == 1
    assert run.stderr.startswith(f"dpproxy draft-policy: cannot reach the PostgreSQL server at 127.0.0.1:{port}")
    assert run.stderr.rstrip().endswith("— check $DRAFT_DSN")


def test_named_tables_only_and_to_stdout(shop: tuple[str, str, str]):
    run = _dpproxy("draft-policy", "--dsn", shop[0], "customers")
    assert run.returncode == 0, run.stderr
    assert "public.customers:" in run.stdout and run.stdout.startswith("# A draft policy")
    with pytest.raises(PolicyError) as caught:  # its only problems are the placeholders
        parse_policy(run.stdout, "draft.yaml", secrets=False)
    assert caught.value.problems and all("a placeholder left by dpproxy draft-policy" in problem
                                         for problem in caught.value.problems)


def test_an_unreachable_server_is_one_line_naming_the_option(tmp_path: Path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: refused
        run = _dpproxy("draft-policy", "--dsn", f"postgresql://u@127.0.0.1:{port}/db", "-o", str(tmp_path / "p.yaml"))
    assert run.returncode == 1
    assert run.stderr.count("\n") == 1
    assert run.stderr.startswith(f"dpproxy draft-policy: cannot reach the PostgreSQL server at 127.0.0.1:{port}")
    assert run.stderr.rstrip().endswith("— check --dsn")
    assert not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize(("args", "said"), [
    (["no_such_table"], "no table no_such_table on the backend — check the name"),
    (["--schema", "no_such_schema"], "there is no schema no_such_schema on the backend — check the name (psql's \\dn "
                                     "lists the schemas)"),
    # A name that differs only in case or quotes from one the catalog holds: that one, as SQL writes it.
    (["--schema", "sales"], "there is no schema sales on the backend — did you mean --schema Sales? (--schema takes the "
                            "name as stored, case and all)"),
    (["--schema", "Sales", "Order.Items"], "no table Order.Items on the backend — did you mean "
                                           "'\"Sales\".\"Order.Items\"'? (SQL folds an unquoted name to lower case: a "
                                           "part with capitals or a dot is written in double quotes)"),
    (["--schema", "empty_schema"], "the schema empty_schema holds no table — name another with --schema"),
])
def test_a_table_or_schema_that_is_not_there_is_one_line(shop: tuple[str, str, str], args: list[str], said: str):
    run = _dpproxy("draft-policy", "--dsn", shop[0], *args)
    assert run.returncode == 1
    assert run.stdout == ""
    assert run.stderr.count("\n") == 1 and said in run.stderr, run.stderr


def test_an_existing_output_is_not_overwritten_without_force(shop: tuple[str, str, str], tmp_path: Path):
    path = tmp_path / "policy.yaml"
    path.write_text("# edited by hand\n")
    run = _dpproxy("draft-policy", "--dsn", shop[0], "-o", str(path))
    assert run.returncode == 1 and "exists" in run.stderr and "--force" in run.stderr
    assert path.read_text() == "# edited by hand\n"
    run = _dpproxy("draft-policy", "--dsn", shop[0], "-o", str(path), "--force")
    assert run.returncode == 0 and path.read_text().startswith("# A draft policy")


def test_bounds_on_a_domain_over_a_number_are_refused_saying_it_is_a_domain(shop: tuple[str, str, str],
                                                                              tmp_path: Path):
    """The draft lists such a column as counted only; a user who gives it bounds anyway is told why
    they are refused, not that the column is no number."""
    path, text = _draft(shop, tmp_path)
    text = text.replace("      # discount:", "      discount: {bounds: [0, 100]}   #")
    text = re.sub(r"\{bounds: \[[^]]*FILL_IN[^]]*\]\}", "{bounds: [0, 5]}", text).replace(
        "last_seen: {bounds: [0, 5]}", "last_seen: {bounds: [2024-01-01, 2024-12-31]}").replace(
        "paid_at: {bounds: [0, 5]}", "paid_at: {bounds: [2024-01-01, 2024-12-31]}")
    text = "\n".join(line for line in text.splitlines() if "FILL_IN]" not in line) + "\n"
    path.write_text(text)
    run = _dpproxy("check-config", str(path), env={"DPPROXY_BACKEND_DSN": shop[1], "ANALYST_PASSWORD": "analyst"})
    assert run.returncode == 1
    assert run.stderr == (f"{path}:{_line_of(text, 'discount:')}: tables.public.customers.columns.discount: bounds need "
                          "a column of a numeric type itself (smallint, integer, bigint, real, double precision or "
                          "numeric); on the backend it is of a domain over one, which is only counted: leave it out of "
                          "the policy's columns\n")


def test_a_domain_of_more_keys_than_max_cells_is_declared_without_group_by():
    """An enum of 1,001 labels is a valid list of categories, but not a GROUP BY domain under the
    default max_cells: the draft opts it out, so that the file it writes loads."""
    labels = tuple(f"l{i}" for i in range(1001))
    table = CatalogTable("public", "t", "table", [
        CatalogColumn("big", "big_enum", "enum", None, True, False, labels),
        CatalogColumn("small", "small_enum", "enum", None, True, False, ("a", "b")),
    ])
    text = draft_text([table], "postgresql://u@h/db")
    policy = parse_policy(text, "draft.yaml", secrets=False)
    columns = policy.tables["public.t"].columns
    assert columns["big"].categories == labels and columns["big"].group_by is False
    assert columns["small"].group_by is True


# ---------------------------------------------------------------- the loader's placeholders

POLICY = """\
backend: {dsn: "postgresql://x@/db"}
users:
  analyst: {password: secret, budget: {epsilon: 10}}
tables:
  public.t:
    epsilom: 1
    columns:
      age: {bounds: [FILL_IN, 90]}
      kind: {categories: [FILL_IN]}
      label: {categories: ["FILL_IN", other]}
"""


def test_a_placeholder_is_a_problem_at_its_line_with_the_rest_of_the_policy_still_checked():
    with pytest.raises(PolicyError) as caught:
        parse_policy(POLICY, "p.yaml")
    problems = caught.value.problems
    assert [problem.split(": ", 2)[:2] for problem in problems] == [
        ["p.yaml:6", "tables.public.t.epsilom"],
        ["p.yaml:8", "tables.public.t.columns.age.bounds"],
        ["p.yaml:9", "tables.public.t.columns.kind.categories"],
    ]
    assert "a placeholder left by dpproxy draft-policy: replace FILL_IN with the column's least and greatest" in problems[1]


def test_a_quoted_fill_in_is_a_value_not_a_placeholder():
    policy = parse_policy(POLICY.replace("    epsilom: 1\n", "    epsilon: 1\n")
                          .replace("      age: {bounds: [FILL_IN, 90]}\n", "").replace("      kind: {categories: [FILL_IN]}\n", ""))
    assert policy.tables["public.t"].columns["label"].categories == ("FILL_IN", "other")


# ---------------------------------------------------------------- CHECK constraints read

@pytest.mark.parametrize(("definition", "lower", "upper"), [
    ("CHECK (((age >= 0) AND (age <= 120)))", 0, 120),
    ("CHECK (((0 < age) AND (age < 120)))", 0, 120),          # a constant first is mirrored
    ("CHECK (((age >= '-5'::integer) AND (age <= 5)))", -5, 5),
    ("CHECK (((age >= 0) OR (age <= 120)))", None, None),      # an OR bounds nothing
    ("CHECK ((abs(age) <= 10))", None, None),                  # nor a function of the column
    ("CHECK ((age >= other))", None, None),                    # nor another column
    ("CHECK ((age >= 0)) NOT VALID", None, None),              # nor a constraint the rows were not checked by
])
def test_only_a_conjunction_of_comparisons_with_constants_declares_bounds(definition: str, lower: int | None,
                                                                          upper: int | None):
    found = declared_by_checks([("c", definition)]).get("age")
    assert (None if found is None or found.lower is None else int(found.lower)) == lower
    assert (None if found is None or found.upper is None else int(found.upper)) == upper


# ---------------------------------------------------------------- relation names as keys

@pytest.mark.parametrize(("schema", "table", "key"), [
    ("public", "adult", "public.adult"),
    ("Sales", "Orders", "Sales.Orders"),              # case is kept: the name as stored
    ("Sales", "Order.Items", '"Sales"."Order.Items"'),
    ("Sales.Order", "Items", '"Sales.Order"."Items"'),
    ('say "hi"', "t", '"say ""hi"""."t"'),
])
def test_a_relation_key_names_its_relation_and_is_quoted_only_where_a_dot_or_quote_would_mislead(
    schema: str, table: str, key: str
):
    assert policy_key(schema, table) == key
    assert key_parts(key) == (schema, table)


def test_a_key_with_a_quote_is_read_part_by_part_and_one_not_wholly_quoted_is_refused_at_its_line():
    text = POLICY.replace("    epsilom: 1\n", "    epsilon: 1\n").replace(
        "      age: {bounds: [FILL_IN, 90]}\n", "").replace("      kind: {categories: [FILL_IN]}\n", "")
    policy = parse_policy(text + "  '\"Sales\".\"Order.Items\"': {epsilon: 1}\n", "p.yaml")
    assert key_parts(list(policy.tables)[1]) == ("Sales", "Order.Items")
    with pytest.raises(PolicyError) as caught:
        parse_policy(text + "  Sales.\"Order.Items\": {epsilon: 1}\n", "p.yaml")
    assert caught.value.problems == [
        'p.yaml:9: tables.Sales."Order.Items": not a relation\'s name: a key with a double quote in it has each '
        'part in double quotes, as SQL writes it: \'"Sales"."Order.Items"\' (a "" for a quote inside one)'
    ]

