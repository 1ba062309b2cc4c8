"""Attacks on the changes merged in stop 46 (h144, h146, h147, h149): each a neighbouring-table or
session-setting probe of whether an accepted statement's outcome, time or charge depends on more
than its noised values."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from proxy.wire.binary import BYTEA, binary_from_text
from tests.wire import SYNC, Wire, bind, cstr, error_fields, execute, message, parse
from tests.conftest import (ATTACK_POLICY_HEAD, SERVICE_ROLE, RunningProxy, TestDatabase, proxy_over_table, running_proxy,
                            spent_by_plain, spent_epsilon)

_TABLE = "stop46_merged"


# A bytea, a text and a date column of categories, each row in one of two.
_COLUMNS = ("i int4, b bytea, t text, d date",
            "SELECT g, CASE WHEN g % 2 = 0 THEN '\\x01'::bytea ELSE '\\x02'::bytea END, "
            "CASE WHEN g % 3 = 0 THEN 'a' ELSE 'b' END, date '2000-05-01' + g % 2 FROM generate_series(1, 60) g",
            "{i: {bounds: [0, 100]}, b: {categories: ['\\x01', '\\x02']}, t: {categories: [a, b]}, "
            "d: {categories: ['2000-05-01', '2000-05-02']}}")


@pytest.fixture(scope="module")
def proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over ``stop46_merged`` (:data:`_COLUMNS`), 60 rows."""
    with proxy_over_table(test_db, tmp_path_factory, _TABLE, *_COLUMNS) as running:
        yield running


def test_a_bytea_mode_in_a_binary_cursor_under_escape_output_is_answered(proxy: RunningProxy) -> None:
    # h147 answers a bytea MODE over its release in the session, printed as bytea_output says; the
    # conversion to binary read only the hex form, so under escape it failed (0A000) after the charge.
    with proxy.connect(autocommit=True) as conn:
        conn.execute("SET bytea_output = escape")
        spent = spent_epsilon(conn)
        with conn.transaction():
            conn.execute(f"DECLARE c BINARY CURSOR FOR SELECT mode() WITHIN GROUP (ORDER BY b) FROM {_TABLE}")
            rows = conn.execute("FETCH ALL FROM c", binary=True).fetchall()
        assert [len(row) for row in rows] == [1] and rows[0][0] in (b"\x01", b"\x02")
        assert spent_epsilon(conn) == pytest.approx(spent + 1.0)


def test_a_datestyle_set_between_bind_and_execute_is_refused_uncharged(proxy: RunningProxy) -> None:
    # Bind judged the binary date column under DateStyle ISO; a SET in the same transaction before
    # Execute makes the released date print otherwise, which dpproxy cannot convert to binary: held,
    # Execute judges the formats again before the charge (0A000, nothing spent).
    wire = Wire(proxy.host, proxy.port)
    try:
        wire.send(message(b"Q", cstr("BEGIN")))
        wire.read_until(b"Z")
        wire.send(parse("s", f"SELECT mode() WITHIN GROUP (ORDER BY d) AS m, count(*) AS n FROM {_TABLE}"),
                  bind("p", "s", result_formats=(1, 0)), SYNC)
        assert b"E" not in wire.kinds_until(b"Z")
        spent = spent_by_plain(proxy)
        wire.send(message(b"Q", cstr("SET DateStyle = 'SQL, DMY'")))
        wire.read_until(b"Z")
        wire.send(execute("p"), SYNC)
        replies = wire.read_until(b"Z")
        errors = [error_fields(body) for kind, body in replies if kind == b"E"]
        charged = spent_by_plain(proxy) - spent
        assert not errors or charged == 0, (errors, charged)
    finally:
        wire.close()


def test_every_byte_converts_to_binary_from_either_bytea_output(test_db: TestDatabase) -> None:
    every = bytes(range(256)) + b"\\\\000"
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        for output in ("hex", "escape"):
            conn.execute(f"SET bytea_output = {output}")
            (printed,) = conn.execute("SELECT %s::bytea::text", (every,)).fetchone()
            assert binary_from_text(printed.encode(), BYTEA) == every, output


# --------------------------------------------------------------------- h149: the text bound in place
# A neighbour with one long value stored apart in each bounded column (a 1 MB text, a 64 kB numeric);
# while the test holds REINDEX of that table's TOAST index in an open transaction, any statement that
# reads a value stored apart (rather than its header, as the bound does) waits for the lock, and the
# backend's statement_timeout ends it: a read past the bound, shown without timing anything.
_LONG = "stop46_long"
_SHORT = "stop46_short"
_LONG_DDL = "(id int, t text, cat text, n numeric, x int, hours int)"
_LONG_ROWS = ("SELECT g, (ARRAY['a', 'b', 'zz'])[1 + g % 3], (ARRAY['a', 'b', 'q'])[1 + g % 3], g % 7, g % 100, g % 60 "
              "FROM generate_series(1, 120) g")
_LONG_TABLE = """
    access: protected
    epsilon: 1000.0
    delta: 1.0e-6
    partitions: 8
    partitioning: row_hash
    columns:
      x: {{bounds: [0, 100], group_by: true}}
      hours: {{bounds: [0, 99], avg: sample_aggregate}}
      n: {{bounds: [0, 10]}}
      cat: {{categories: [a, b], group_by: true, other: other}}
"""
_READS = (
    "SELECT count(*) FROM {t} WHERE t LIKE '%z%'",
    "SELECT count(*) FROM {t} WHERE t = 'a' OR t LIKE 'b%'",
    "SELECT count(*) FROM {t} WHERE t IN ('a', 'b', 'c')",
    "SELECT count(*) FROM {t} WHERE lower(t) = 'a'",
    "SELECT count(*) FROM {t} WHERE t ILIKE '%Z%'",
    "SELECT count(*) FROM {t} WHERE length(t) > 1",
    "SELECT count(DISTINCT t) FROM {t}",
    "SELECT count(DISTINCT cat) FROM {t}",
    "SELECT cat, count(*) FROM {t} GROUP BY cat",
    "SELECT cat, count(DISTINCT t) FROM {t} GROUP BY cat",
    "SELECT cat, count(*) FROM {t} WHERE t <> 'q' GROUP BY cat HAVING count(*) > 0 ORDER BY cat",
    "SELECT x, count(*) FROM {t} WHERE t LIKE '%z%' GROUP BY x",
    "SELECT mode() WITHIN GROUP (ORDER BY cat) FROM {t}",
    "SELECT mode() WITHIN GROUP (ORDER BY cat) FROM {t} WHERE t LIKE 'a%'",
    "SELECT count(*) FILTER (WHERE t LIKE '%z%'), count(*) FILTER (WHERE cat = 'a') FROM {t}",
    "SELECT avg(hours) FROM {t}",
    "SELECT avg(hours) FROM {t} WHERE t LIKE '%z%'",
    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY x) FROM {t} WHERE t LIKE 'a%'",
    "SELECT sum(n), avg(n) FROM {t}",
    "SELECT count(*) FROM {t} WHERE n > 3",
    "SELECT count(*) FROM (SELECT * FROM {t} WHERE t LIKE 'a%') AS s WHERE cat = 'a'",
    "SELECT cat, sum(x) FROM {t} WHERE cat IN ('a', 'b') GROUP BY cat",
    "SELECT count(*) FROM {t} WHERE t LIKE '%z%' AND t LIKE '%a%' AND cat LIKE 'q%'",
    "SELECT cat, percentile_disc(0.5) WITHIN GROUP (ORDER BY x) FROM {t} WHERE t <> 'b' GROUP BY cat",
    "SELECT cat, avg(hours) FROM {t} WHERE t LIKE 'a%' GROUP BY cat",
    "SELECT count(*) FROM {t} WHERE t = 'a' AND cat = 'a' AND t <> cat",
    "SELECT count(*) FROM {t} WHERE t BETWEEN 'a' AND 'b' OR (t IS NOT NULL AND cat IS NOT DISTINCT FROM 'q')",
    "SELECT count(*), sum(x) FROM {t} WHERE (upper(cat) IN ('A', 'Q') OR t NOT LIKE 'z%') AND coalesce(t, 'a') = 'a'",
)


@pytest.fixture(scope="module")
def long_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over ``stop46_short`` (120 rows) and ``stop46_long`` (the same and one row of long values
    stored apart), both under one policy, its backend statements timed out after 3 s."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        for table in (_SHORT, _LONG):
            admin.execute(f"DROP TABLE IF EXISTS {table}")
            admin.execute(f"CREATE TABLE {table} {_LONG_DDL}")
            for column in ("t", "cat", "n"):
                admin.execute(f"ALTER TABLE {table} ALTER {column} SET STORAGE EXTERNAL")
            admin.execute(f"INSERT INTO {table} {_LONG_ROWS}")
            admin.execute(f"GRANT SELECT ON {table} TO {SERVICE_ROLE}")
        long_text = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 32768) g)"
        admin.execute(f"INSERT INTO {_LONG} VALUES (0, {long_text}, {long_text}, "
                      "('1' || repeat('7', 100000))::numeric, 5, 5)")
    head = ATTACK_POLICY_HEAD.replace("statement_timeout_ms: 10000", "statement_timeout_ms: 3000")
    policy = head + f"  public.{_SHORT}: &L" + _LONG_TABLE + f"  public.{_LONG}: *L\n"
    with running_proxy(test_db, tmp_path_factory, policy) as running:
        yield running


def _outcome(conn: psycopg.Connection, sql: str) -> str:
    try:
        conn.execute(sql).fetchall()
    except psycopg.Error as exc:
        return f"{exc.sqlstate}: {str(exc).splitlines()[0][:120]}"
    return "answered"


@pytest.mark.parametrize("sql", _READS)
def test_no_statement_reads_a_long_value_stored_apart(
        test_db: TestDatabase, long_proxy: RunningProxy, sql: str) -> None:
    with long_proxy.connect(autocommit=True) as conn:
        on_short = _outcome(conn, sql.format(t=_SHORT))
        with psycopg.connect(test_db.admin_dsn) as locker:
            (toast,) = locker.execute("SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = %s::regclass",
                                      (_LONG,)).fetchone()
            locker.execute(f"REINDEX INDEX {toast}_index")  # held until the rollback
            on_long = _outcome(conn, sql.format(t=_LONG))
            locker.rollback()
    assert on_long.replace(_LONG, _SHORT) == on_short


def test_the_held_toast_index_stops_a_read_of_the_long_value(test_db: TestDatabase, long_proxy: RunningProxy) -> None:
    # The probe above shows a read past the bound only if such a read waits: here PostgreSQL reads
    # the long value whole (LIKE), straight from the table, and is stopped.
    with psycopg.connect(test_db.admin_dsn) as locker, psycopg.connect(test_db.admin_dsn, autocommit=True) as direct:
        (toast,) = locker.execute("SELECT reltoastrelid::regclass::text FROM pg_class WHERE oid = %s::regclass",
                                  (_LONG,)).fetchone()
        locker.execute(f"REINDEX INDEX {toast}_index")
        direct.execute("SET statement_timeout = 1000")
        assert _outcome(direct, f"SELECT count(*) FROM {_LONG} WHERE t LIKE '%z%'").startswith("57014")
        assert _outcome(direct, f"SELECT count(*) FROM {_LONG} WHERE n > 3").startswith("57014")
        locker.rollback()


# ------------------------------------------- h144: a view's bound from its tables; the tables' children
# A protected table whose rows sit in an inheritance child (and a simple view over it) was bounded by
# its own pages alone: pg_partition_tree lists a partitioned table's partitions, never an inheritance
# parent's children. Its sorts were granted the ceiling, then spilled at a filter the analyst chose;
# a table of those pages of its own is refused its sorting statements before any charge.
_PARENT, _CHILD, _OVER_PARENT = "stop46_parent", "stop46_child", "stop46_over_parent"
_SORTING = "SELECT count(DISTINCT x) FROM {t}"


@pytest.fixture(scope="module")
def inheritance_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy over a parent with no rows of its own whose child holds 60,000 (~2 MB), and a simple
    view over it, both protected with a 1 MB sort ceiling."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP TABLE IF EXISTS {_PARENT} CASCADE")
        admin.execute(f"CREATE TABLE {_PARENT} (x int)")
        admin.execute(f"CREATE TABLE {_CHILD} () INHERITS ({_PARENT})")
        admin.execute(f"INSERT INTO {_CHILD} SELECT g FROM generate_series(1, 60000) g")
        admin.execute(f"CREATE VIEW {_OVER_PARENT} AS SELECT x FROM {_PARENT}")
        admin.execute(f"GRANT SELECT ON {_PARENT}, {_CHILD}, {_OVER_PARENT} TO {SERVICE_ROLE}")
    table = ("    access: protected\n    epsilon: 1.0\n    delta: 1.0e-6\n    max_sort_memory_mb: 1\n"
             "    columns:\n      x: {{bounds: [0, 100000]}}\n")
    policy = ATTACK_POLICY_HEAD + "".join(f"  public.{name}:\n{table}" for name in (_PARENT, _OVER_PARENT))
    try:
        with running_proxy(test_db, tmp_path_factory, policy) as running:
            yield running
    finally:
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
            admin.execute(f"DROP TABLE IF EXISTS {_PARENT} CASCADE")


@pytest.mark.parametrize("relation", [_PARENT, _OVER_PARENT])
def test_an_inheritance_childs_rows_are_in_its_parents_sort_bound(inheritance_proxy: RunningProxy, relation: str) -> None:
    with inheritance_proxy.connect(autocommit=True) as conn:
        spent = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(_SORTING.format(t=relation))
        assert refused.value.sqlstate == "54000" and "sort-memory" in str(refused.value)
        assert spent_epsilon(conn) == spent
