"""Whether dpproxy and PostgreSQL agree on which object a name denotes.

Attacks found: dpproxy folded an unquoted column name with Python's ``str.lower``, which
lowers ``É``; PostgreSQL (UTF8) lowers ASCII letters only, so ``sum(ÉX)`` was answered for
column ``"éx"`` while the analyst, and PostgreSQL, meant ``"Éx"``. And a relation the policy
marks public that is a view of a protected table, or its inheritance or partition parent,
passed the protected rows through exactly: such a policy is now refused at load.

Probes that held: relation names (non-ASCII, quoted, ``U&""``, NFD, longer than 63 bytes)
are resolved by PostgreSQL's own parser and ``to_regclass``, under the session's search_path,
again after anything that may move it; analysts cannot create temporary tables.
"""

from __future__ import annotations

import asyncio
import unicodedata
from collections.abc import Iterator

import psycopg
import pytest
import wire
from conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy, running_proxy, spent_epsilon

from policies.loader import PolicyError
from proxy.demo.embedded import SERVICE_ROLE
from proxy.serving.server import Server

_LONG = "p" * 60 + "éé"  # 64 bytes: PostgreSQL keeps 62, "p"*60 + "é", cutting at a character boundary

_SETUP = f"""
DROP SCHEMA IF EXISTS id_hr CASCADE;
DROP TABLE IF EXISTS "Émp", "émp", id_cols, id_emp, "{_LONG}", id_parent, id_part CASCADE;
DROP VIEW IF EXISTS id_view, id_calls, id_builtin CASCADE;
DROP MATERIALIZED VIEW IF EXISTS id_matview;
DROP FUNCTION IF EXISTS id_leak();
DROP FOREIGN DATA WRAPPER IF EXISTS id_wrapper CASCADE;
CREATE SCHEMA id_hr;
CREATE TABLE "Émp" (salary integer);
INSERT INTO "Émp" SELECT 50 FROM generate_series(1, 100);
CREATE TABLE "émp" (salary integer);
INSERT INTO "émp" VALUES (1);
CREATE TABLE id_cols ("éx" integer, "Éx" integer, "{"l" * 62 + "é"}" integer);
INSERT INTO id_cols SELECT 1, 9, 5 FROM generate_series(1, 1000);
CREATE TABLE id_hr.id_emp (salary integer);
INSERT INTO id_hr.id_emp SELECT 77 FROM generate_series(1, 100);
CREATE TABLE public.id_emp (salary integer);
INSERT INTO public.id_emp VALUES (1);
CREATE TABLE "{_LONG}" (salary integer);
CREATE TABLE id_parent (salary integer);
CREATE TABLE id_child (extra integer) INHERITS (id_parent);
INSERT INTO id_child SELECT 66, 1 FROM generate_series(1, 100);
CREATE VIEW id_view AS SELECT salary FROM id_hr.id_emp;
CREATE VIEW id_view_of_view AS SELECT * FROM id_view;
CREATE MATERIALIZED VIEW id_matview AS SELECT salary FROM id_hr.id_emp;
CREATE FUNCTION id_leak() RETURNS bigint LANGUAGE sql STABLE AS 'SELECT sum(salary) FROM id_hr.id_emp';
CREATE VIEW id_calls AS SELECT id_leak() AS salary;
CREATE VIEW id_builtin AS SELECT pg_catalog.upper('x') AS label;
CREATE FOREIGN DATA WRAPPER id_wrapper;
CREATE SERVER id_elsewhere FOREIGN DATA WRAPPER id_wrapper;
CREATE FOREIGN TABLE id_foreign (salary integer) SERVER id_elsewhere;
CREATE VIEW id_view_of_foreign AS SELECT salary FROM id_foreign;
CREATE TABLE id_part (salary integer) PARTITION BY RANGE (salary);
CREATE TABLE id_part_hi PARTITION OF id_part FOR VALUES FROM (0) TO (1000);
INSERT INTO id_part SELECT 55 FROM generate_series(1, 100);
GRANT USAGE ON SCHEMA id_hr TO {SERVICE_ROLE};
GRANT SELECT ON ALL TABLES IN SCHEMA public, id_hr TO {SERVICE_ROLE};
"""

_PROTECTED = "{{access: protected, epsilon: 1.0, columns: {{salary: {{bounds: [0, 100]}}}}}}"
POLICY = ATTACK_POLICY_HEAD + f"""\
  public.Émp: {_PROTECTED}
  public.émp: {{{{access: public}}}}
  public.id_cols: {{{{access: protected, epsilon: 1.0, columns: {{{{"éx": {{{{bounds: [0, 10]}}}}, "Éx": {{{{bounds: [0, 10]}}}}, "{"l" * 62}": {{{{bounds: [0, 10]}}}}}}}}}}}}
  id_hr.id_emp: {_PROTECTED}
  public.id_emp: {{{{access: public}}}}
  public.{"p" * 60 + "é"}: {_PROTECTED}
"""


@pytest.fixture(scope="module")
def setup(test_db: TestDatabase) -> None:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(_SETUP)


@pytest.fixture(scope="module")
def colliding(setup: None, test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with running_proxy(test_db, tmp_path_factory, POLICY) as running:
        yield running


def _one(proxy: RunningProxy, *statements: str) -> tuple:
    """The one row the last of ``statements`` answers, all sent on one connection."""
    with proxy.connect() as conn:
        for sql in statements[:-1]:
            conn.execute(sql)
        row = conn.execute(statements[-1]).fetchone()
    assert row is not None
    return row


# ---------------------------------------------------------------- columns: ASCII-only folding

def test_an_unquoted_non_ascii_column_is_the_one_postgresql_folds_it_to(colliding):
    # "éx" holds 1, "Éx" 9 on each of 1000 rows; ÉX is "Éx" for PostgreSQL. Was ~1000 ("éx").
    (unquoted, quoted) = _one(colliding, 'SELECT sum(ÉX), sum("Éx") FROM id_cols')
    assert unquoted > 6000 and quoted > 6000


def test_an_unquoted_non_ascii_name_in_where_is_the_one_postgresql_folds_it_to(colliding):
    (count,) = _one(colliding, "SELECT count(*) FROM id_cols WHERE ÉX = 9")
    assert count > 700  # every row; "éx" = 9 holds on none


def test_a_subquerys_non_ascii_output_name_is_matched_as_postgresql_folds_it(colliding):
    (total,) = _one(colliding, 'SELECT sum(É) FROM (SELECT "Éx" AS "É", "éx" AS "é" FROM id_cols) AS s')
    assert total > 6000  # "É" is "Éx"; was the sum of "é"


def test_a_column_name_past_63_bytes_is_truncated_as_postgresql_truncates_it(colliding):
    # The column is "l"*62 (the é did not fit in 63 bytes); PostgreSQL reads any longer name
    # starting so as that column. Was 42703: dpproxy compared the whole name.
    for name in ("l" * 62 + "é", "l" * 62 + "éxyz", '"' + "l" * 62 + 'éé"'):
        (total,) = _one(colliding, f"SELECT sum({name}) FROM id_cols WHERE {name} = 5")
        assert total > 3000, name


# ---------------------------------------------------------------- relations: PostgreSQL's own resolution

def test_an_unquoted_non_ascii_relation_is_the_protected_one_postgresql_reads(colliding):
    with colliding.connect() as conn:
        with pytest.raises(psycopg.Error, match="no-row-access"):
            conn.execute("SELECT * FROM ÉMP")  # "Émp", protected; "émp" is public
        # named as quote_ident writes it; sqlglot cannot read U&"": refused
        with pytest.raises(psycopg.Error, match='protected table "Émp"'):
            conn.execute('SELECT * FROM U&"\\00C9mp"')
        assert conn.execute("SELECT * FROM émp").fetchall() == [(1,)]
        assert conn.execute("SELECT count(*) FROM ÉMP").fetchone()[0] > 50  # noised, ~100


def test_a_quoted_or_decomposed_name_denotes_no_other_relation(colliding):
    nfd = unicodedata.normalize("NFD", "Émp")
    with colliding.connect() as conn:
        for name in ('"ÉMP"', f'"{nfd}"'):
            with pytest.raises(psycopg.errors.UndefinedTable):
                conn.execute(f"SELECT * FROM {name}")


def test_a_name_past_63_bytes_is_truncated_as_postgresql_truncates_it(colliding):
    with colliding.connect() as conn:
        for tail in ("", "é", "zzzz"):
            with pytest.raises(psycopg.Error, match="no-row-access"):
                conn.execute(f'SELECT * FROM "{_LONG}{tail}"')


@pytest.mark.parametrize("statements", [
    ("SET search_path TO id_hr, public; SELECT * FROM id_emp",),
    ("SELECT * FROM id_emp; SET search_path TO id_hr, public; SELECT * FROM id_emp",),
    ("SELECT * FROM id_emp", "SET search_path TO id_hr, public", "SELECT * FROM id_emp"),
    ("BEGIN", "SET LOCAL search_path TO id_hr, public", "SELECT * FROM id_emp"),
    ("SELECT set_config('search_path', 'id_hr, public', false)", "SELECT * FROM id_emp"),
])
def test_a_name_is_resolved_under_the_search_path_it_runs_with(colliding, statements):
    with colliding.connect() as conn:
        with pytest.raises(psycopg.Error, match="no-row-access"):
            for sql in statements:
                conn.execute(sql)


def test_a_name_planned_before_a_search_path_change_is_planned_again_before_it_runs(colliding):
    with colliding.connect(prepare_threshold=0) as conn:  # server-side prepared statements
        assert conn.execute("SELECT * FROM id_emp").fetchall() == [(1,)]
        assert conn.execute("SELECT * FROM id_emp").fetchall() == [(1,)]
        conn.execute("SET search_path TO id_hr, public")
        with pytest.raises(psycopg.Error, match="no-row-access"):
            conn.execute("SELECT * FROM id_emp")
        conn.execute("RESET search_path")
        assert conn.execute("SELECT * FROM id_emp").fetchall() == [(1,)]


def test_an_analyst_cannot_create_a_temporary_table_to_shadow_a_name(colliding):
    with colliding.connect() as conn:
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            conn.execute("CREATE TEMP TABLE id_emp (salary integer)")
        conn.execute("SET search_path TO pg_temp, id_hr, public")
        with pytest.raises(psycopg.Error, match="no-row-access"):
            conn.execute("SELECT * FROM id_emp")


# ---------------------------------------------------------------- public relations reading protected ones

@pytest.mark.parametrize("public, protected", [
    ("public.id_parent", "public.id_child"),      # inheritance: SELECT * FROM id_parent reads id_child's rows
    ("public.id_part", "public.id_part_hi"),      # a partitioned table reads its partitions
    ("public.id_view", "id_hr.id_emp"),           # a view of a protected table
    ("public.id_view_of_view", "id_hr.id_emp"),   # ... through another view
    ("public.id_matview", "id_hr.id_emp"),        # a materialized view of it
])
def test_a_policy_whose_public_relation_reads_a_protected_one_is_refused(setup, test_db, tmp_path, public, protected):
    # Passed through before: SELECT count(*), sum(salary) FROM id_parent answered (100, 6600), exactly.
    text = ATTACK_POLICY_HEAD + f"  {protected}: {_PROTECTED}\n  {public}: {{{{access: public}}}}\n"
    with pytest.raises(PolicyError) as refused:
        asyncio.run(Server.create(make_policy(test_db, tmp_path / "ledger.sqlite3", text)))
    (problem,) = refused.value.problems
    assert problem.startswith(f"tables.{public}: a public relation that reads protected table {protected}"), problem


@pytest.mark.parametrize("protected, public", [
    ("public.id_parent", "public.id_child"),      # the child's rows are rows of the parent
    ("public.id_part", "public.id_part_hi"),      # a partition's rows are rows of the partitioned table
])
def test_a_policy_whose_public_relation_holds_rows_of_a_protected_one_is_refused(setup, test_db, tmp_path,
                                                                                  protected, public):
    text = ATTACK_POLICY_HEAD + f"  {protected}: {_PROTECTED}\n  {public}: {{{{access: public}}}}\n"
    with pytest.raises(PolicyError) as refused:
        asyncio.run(Server.create(make_policy(test_db, tmp_path / "ledger.sqlite3", text)))
    (problem,) = refused.value.problems
    assert problem.startswith(f"tables.{public}: a public inheritance child or partition of protected table {protected}")


def test_a_public_view_that_calls_a_function_dpproxy_cannot_follow_is_refused(setup, test_db, tmp_path):
    # pg_depend names the functions a view calls, not what their bodies read: id_leak() returns
    # the protected table's exact sum, so a public view calling a function outside pg_catalog is
    # refused whatever the function reads. Passed through before: SELECT * FROM id_calls → 7700.
    text = ATTACK_POLICY_HEAD + f"  id_hr.id_emp: {_PROTECTED}\n  public.id_calls: {{{{access: public}}}}\n"
    with pytest.raises(PolicyError) as refused:
        asyncio.run(Server.create(make_policy(test_db, tmp_path / "ledger.sqlite3", text)))
    (problem,) = refused.value.problems
    assert problem.startswith("tables.public.id_calls: a public relation that reads through function id_leak(), "
                              "which dpproxy cannot follow"), problem


@pytest.mark.parametrize("public", ["public.id_foreign", "public.id_view_of_foreign"])
def test_a_public_foreign_table_or_a_view_of_one_is_refused(setup, test_db, tmp_path, public):
    # A foreign table's rows come from its server, which may be this database (postgres_fdw
    # pointing back at the protected table): dpproxy cannot follow it, so it is not published.
    text = ATTACK_POLICY_HEAD + f"  id_hr.id_emp: {_PROTECTED}\n  {public}: {{{{access: public}}}}\n"
    with pytest.raises(PolicyError) as refused:
        asyncio.run(Server.create(make_policy(test_db, tmp_path / "ledger.sqlite3", text)))
    (problem,) = refused.value.problems
    assert problem.startswith(f"tables.{public}: a public relation that reads through foreign table id_foreign"), problem


def test_a_public_view_that_calls_only_built_in_functions_is_accepted(setup, test_db, tmp_path_factory):
    text = ATTACK_POLICY_HEAD + f"  id_hr.id_emp: {_PROTECTED}\n  public.id_builtin: {{{{access: public}}}}\n"
    with running_proxy(test_db, tmp_path_factory, text) as running:
        assert _one(running, "SELECT * FROM id_builtin") == ("X",)


def test_a_public_relation_beside_a_protected_one_it_does_not_read_is_accepted(setup, test_db, tmp_path_factory):
    text = ATTACK_POLICY_HEAD + f"  public.id_child: {_PROTECTED}\n  public.id_emp: {{{{access: public}}}}\n" \
        "  public.id_view: {{access: protected, epsilon: 1.0, columns: {{salary: {{bounds: [0, 100]}}}}}}\n"
    with running_proxy(test_db, tmp_path_factory, text) as running:
        assert _one(running, "SELECT * FROM id_emp") == (1,)



def _replies(conn: wire.Wire, *messages: bytes) -> list[tuple[str, object]]:
    """Commands, rows and errors (SQLSTATE) until ReadyForQuery."""
    conn.send(*messages)
    shown: list[tuple[str, object]] = []
    for kind, body in conn.read_until(b"Z"):
        if kind == b"E":
            shown.append(("E", wire.error_fields(body)[b"C"].decode()))
        elif kind == b"D":
            shown.append(("D", wire.data_row_values(body)))
    return shown


def _query(sql: str) -> bytes:
    return wire.message(b"Q", wire.cstr(sql))


def _extended(sql: str) -> tuple[bytes, ...]:
    return wire.parse("", sql), wire.bind("", ""), wire.execute("")


@pytest.mark.parametrize("failing", [
    (_query("SET search_path TO public; SELECT * FROM id_emp; SELECT 1/0"),),
    (*_extended("SET search_path TO public"), *_extended("SELECT * FROM id_emp"), *_extended("SELECT 1/0"),
     wire.message(b"S")),
])
def test_a_search_path_an_error_rolls_back_leaves_no_stale_resolution(colliding, failing):
    # The SET and the public id_emp's resolution happen in one implicit transaction that the
    # error ends: whichever search_path the session is left with, id_emp is resolved under it.
    conn = wire.Wire(colliding.host, colliding.port)
    try:
        assert _replies(conn, _query("SET search_path TO id_hr, public")) == []
        assert _replies(conn, *failing) == [("D", [b"1"]), ("E", "22012")]
        (_, (path,)), = _replies(conn, _query("SHOW search_path"))
        expected = [("D", [b"1"])] if path == b"public" else [("E", "DP001")]
        assert _replies(conn, _query("SELECT * FROM id_emp")) == expected
    finally:
        conn.close()




# ---------------------------------------------------------------- client encodings whose codecs misread

# A protected table whose two columns differ only in the character EUC_JP's A1C1 is for
# Python (U+301C) and for PostgreSQL (U+FF5E); only the first has a policy.
_JP_SETUP = f"""
DROP TABLE IF EXISTS id_jp;
CREATE TABLE id_jp ("\u301cx" double precision, "\uff5ex" numeric);
INSERT INTO id_jp SELECT 1, 5 FROM generate_series(1, 100);
GRANT SELECT ON id_jp TO {SERVICE_ROLE};
"""
_JP_POLICY = ATTACK_POLICY_HEAD + \
    '  public.id_jp: {{access: protected, epsilon: 1.0, columns: {{"\u301cx": {{bounds: [0, 10]}}}}}}\n'


@pytest.fixture(scope="module")
def misread(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute(_JP_SETUP)
    with running_proxy(test_db, tmp_path_factory, _JP_POLICY) as running:
        yield running


@pytest.mark.parametrize("encoding", ["EUC_JP", "EUC_JIS_2004", "EUC_KR", "eucjp"])
def test_an_encoding_whose_codec_misreads_characters_is_refused(misread, encoding):
    # In EUC_JP, sum("<A1C1>x") was judged as "〜x" (bounds [0, 10], double precision) and run by
    # PostgreSQL on "～x" (numeric): ~500, not ~100; one row with "～x" = 1e400 then made the
    # charged statement fail (its numeric compared as a double), an oracle on that row.
    conn = wire.Wire(misread.host, misread.port)
    try:
        assert _replies(conn, _query(f"SET client_encoding TO {encoding}")) == [("E", "22023")]
        assert _replies(conn, _query("SHOW client_encoding")) == [("D", [b"UTF8"])]
    finally:
        conn.close()


def test_a_misreading_encoding_in_the_startup_packet_is_refused(misread):
    error = wire.startup_error(misread.host, misread.port, client_encoding="EUC_JP")
    assert (error[b"S"], error[b"C"]) == (b"FATAL", b"22023"), error


def test_euc_cn_whose_codec_agrees_with_postgresql_is_still_read(misread):
    conn = wire.Wire(misread.host, misread.port)
    try:
        assert _replies(conn, _query("SET client_encoding TO EUC_CN")) == []
        (_, (value,)), = _replies(conn, wire.message(b"Q", "SELECT '中文' AS v".encode("gb2312") + b"\0"))
        assert value.decode("gb2312") == "中文"
    finally:
        conn.close()


def test_every_accepted_encodings_codec_reads_each_character_as_postgresql_does(admin):
    # Each character dpproxy writes in the session's encoding must be that character for
    # PostgreSQL (so is each it reads: its codecs read back what they write).
    from proxy.wire.encodings import _CODECS
    from rewriter.catalog import ascii_safe_encoding

    admin.execute("""CREATE OR REPLACE FUNCTION pg_temp.read_as(b bytea, e name) RETURNS text LANGUAGE plpgsql AS $$
        BEGIN RETURN convert_from(b, e); EXCEPTION WHEN others THEN RETURN NULL; END $$""")
    misread = {}
    for name, codec in _CODECS.items():
        if codec == "utf-8" or not ascii_safe_encoding(name):
            continue
        written = {}
        for point in [*range(0x80, 0xD800), *range(0xE000, 0x10000)]:
            try:
                written[chr(point)] = chr(point).encode(codec)
            except UnicodeEncodeError:
                pass
        rows = admin.execute("SELECT pg_temp.read_as(b, %s) FROM unnest(%s::bytea[]) AS b", (name, list(written.values())))
        wrong = [char for char, (read,) in zip(written, rows) if read is not None and read != char]
        if wrong:
            misread[name] = wrong[:5]
    assert misread == {}



# ---------------------------------------------------------------- startup parameters and options

@pytest.mark.parametrize("params", [
    {"application_name": "x\t-c\textra_float_digits=-15\t-c\tdefault_transaction_read_only=off"},
    {"options": "-c application_name=y\\\t-c\\\textra_float_digits=-15"},  # an escaped tab inside the value
    {"options": "-c application_name=y\\ -c\\ statement_timeout=1"},
])
def test_whitespace_in_a_startup_value_adds_no_backend_setting(colliding, params):
    # PostgreSQL splits a connection's options at any ASCII space (pg_split_opts): a client's
    # value written into them unescaped would set what dpproxy refuses. They are applied with
    # set_config on a pooled connection instead, a value being one value whatever it holds.
    conn = wire.Wire(colliding.host, colliding.port, startup_params=params)
    try:
        assert _replies(conn, _query("SELECT current_setting('extra_float_digits'), "
                                     "current_setting('default_transaction_read_only'), "
                                     "current_setting('statement_timeout')")) == [("D", [b"1", b"on", b"10s"])]
    finally:
        conn.close()



def test_a_remembered_resolution_cannot_let_a_relation_created_since_be_read(colliding, admin):
    # The session resolves id_emp to public.id_emp and remembers it; an administrator then
    # creates id_new.id_emp, earlier on the session's search_path and in no policy. Sent as
    # written, the remembered passthrough read it: [(99,)]. It now names public.id_emp.
    admin.execute(f"DROP SCHEMA IF EXISTS id_new CASCADE; CREATE SCHEMA id_new; GRANT USAGE ON SCHEMA id_new TO {SERVICE_ROLE}")
    try:
        with colliding.connect() as conn:
            conn.execute("SET search_path TO id_new, public")
            assert conn.execute("SELECT * FROM id_emp").fetchall() == [(1,)]
            admin.execute(f"CREATE TABLE id_new.id_emp AS SELECT 99 AS salary; GRANT SELECT ON id_new.id_emp TO {SERVICE_ROLE}")
            assert conn.execute("SELECT * FROM id_emp").fetchall() == [(1,)]
            conn.execute("SET search_path TO id_new, public")  # looked up again: not in the policy
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="default-deny"):
                conn.execute("SELECT * FROM id_emp")
    finally:
        admin.execute("DROP SCHEMA id_new CASCADE")


def test_pinned_relations_keep_pg_class_neutralised_and_ctes_unqualified(colliding):
    with colliding.connect() as conn:
        (reltuples,) = conn.execute("SELECT reltuples FROM pg_class WHERE relname = 'Émp'").fetchone()
        assert reltuples == -1  # neutralised, also when pinned to pg_catalog.pg_class
        assert conn.execute("WITH id_emp_cte AS (SELECT 2 AS s) SELECT * FROM id_emp_cte, id_emp").fetchall() == [(2, 1)]


# ---------------------------------------------------------------- the pre-charge checks' memory

def test_a_values_check_passed_before_a_reload_is_run_again_after_it(test_db, tmp_path):
    # x was text when "x = 'abc'" passed its check; an administrator makes it an integer and
    # reloads. The backend SQL is the same text, so the remembered pass skipped the check:
    # ε charged, then 22P02 from the literal alone (reported as DP004).
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS id_retype; CREATE TABLE id_retype (x text, v integer);"
                     "INSERT INTO id_retype SELECT 'a', 1 FROM generate_series(1, 100);"
                     f"GRANT SELECT ON id_retype TO {SERVICE_ROLE}")
    text = (ATTACK_POLICY_HEAD.replace("repeats: {{enabled: true}}", "repeats: {{enabled: false}}")
            + "  public.id_retype: {{access: protected, epsilon: 1.0, columns: {{v: {{bounds: [0, 10]}}}}}}\n")
    ledger = tmp_path / "ledger.sqlite3"
    path = tmp_path / "policy.yaml"
    path.write_text(text.format(dsn=test_db.service_dsn, ledger=ledger))
    proxy = RunningProxy(make_policy(test_db, ledger, text))
    try:
        with proxy.connect() as conn:
            conn.execute("SELECT count(*) FROM id_retype WHERE x = 'abc'").fetchone()
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin_conn:
            admin_conn.execute("ALTER TABLE id_retype ALTER x TYPE integer USING 0")
        assert proxy._call(proxy.server.reload(path))
        with proxy.connect() as conn:
            before = spent_epsilon(conn)
            with pytest.raises(psycopg.errors.InvalidTextRepresentation):
                conn.execute("SELECT count(*) FROM id_retype WHERE x = 'abc'")
            assert spent_epsilon(conn) == before
    finally:
        proxy.stop()



@pytest.mark.parametrize("statements", [
    ("BEGIN", "SET client_encoding TO LATIN1", "ROLLBACK"),
    ("BEGIN", "SET LOCAL client_encoding TO LATIN1", "COMMIT"),
    ("BEGIN", "SELECT set_config('client_encoding', 'LATIN1', true)", "COMMIT"),
])
def test_a_client_encoding_a_transaction_undoes_is_undone_for_dpproxy_too(colliding, statements):
    conn = wire.Wire(colliding.host, colliding.port)
    try:
        for sql in statements:
            _replies(conn, _query(sql))
        assert _replies(conn, _query("SHOW client_encoding")) == [("D", [b"UTF8"])]
        assert _replies(conn, wire.message(b"Q", "SELECT 'é' AS v".encode() + b"\0")) == [("D", ["é".encode()])]
    finally:
        conn.close()
