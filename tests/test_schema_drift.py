"""A protected table altered on the backend after dpproxy loaded its policy.

Found: dpproxy read each protected table's column facts (type, collation, what the type holds)
once, at start and reload, and judged every statement by them. Altered since (``ALTER TABLE ...
ALTER COLUMN ... TYPE point[]``), the column was still taken for text: ``s = '{"(1,1)"}'`` was
accepted, charged, and then failed with 42883 exactly when some row held a one-point array to
compare it with, an error oracle on neighbouring tables. The periodic re-check now reads the facts
again (proxy.backend.column_facts) and a table whose definition changed is refused before the
charge (55000, rule ``schema-changed``) until a reload, or until it is back as loaded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy

_POLICY = ATTACK_POLICY_HEAD + """\
  public.drifted:
    access: protected
    epsilon: 1.0
    columns:
      a: {{bounds: [0, 10]}}
"""
_ONE_POINT = "'{\"(1,1)\"}'"


def _remaining(proxy: RunningProxy) -> float:
    return float(proxy._call(proxy.server.budget.balance("analyst")).remaining_epsilon)


@contextmanager
def _drifting(test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              columns: str = "g % 7 AS a, 'y' || g AS s", policy: str = _POLICY,
              ) -> Iterator[tuple[psycopg.Connection, RunningProxy, Path]]:
    """The protected table ``drifted`` (500 rows of ``columns``), an admin connection, a dpproxy
    re-checking every 0.2 s, and the policy's file (to reload it)."""
    from proxy.serving import server

    monkeypatch.setattr(server, "FUNCTION_NAMES_REFRESH_S", 0.2)
    text = policy.replace("repeats: {{enabled: true}}", "repeats: {{enabled: false}}")
    ledger, path = tmp_path / "ledger.sqlite3", tmp_path / "policy.yaml"
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS drifted")
        admin.execute(f"CREATE TABLE drifted AS SELECT {columns} FROM generate_series(1, 500) g")
        admin.execute("GRANT SELECT ON drifted TO dpproxy_service")
        path.write_text(text.format(dsn=test_db.service_dsn, ledger=ledger))
        proxy = RunningProxy(make_policy(test_db, ledger, text))
        try:
            yield admin, proxy, path
        finally:
            proxy.stop()
            admin.execute("DROP TABLE IF EXISTS drifted")
            admin.execute("DROP DOMAIN IF EXISTS drift_small")
            admin.execute("DROP TYPE IF EXISTS drift_pair")
            admin.execute("DROP TYPE IF EXISTS drift_mood")


def _assert_refused(conn: psycopg.Connection, sql: str, change: str) -> None:
    with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
        conn.execute(sql)
    assert f"protected relation drifted changed since dpproxy loaded its policy: {change} (rule: schema-changed)" \
        in str(refused.value), str(refused.value)
    hint = refused.value.diag.message_hint or ""
    assert "definition changed since the policy was loaded" in hint and "reload dpproxy (SIGHUP)" in hint, hint


def test_an_array_comparison_on_a_column_altered_to_point_arrays_is_refused_before_the_charge_not_an_oracle(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On the code before: charged, then answered on the table whose arrays are all empty and
    failed with 42883 on its neighbour holding one one-point array."""
    caplog.set_level(logging.ERROR, logger="dpproxy.server")
    with _drifting(test_db, tmp_path, monkeypatch) as (admin, proxy, path), proxy.connect() as conn:
        conn.execute(f"SELECT COUNT(*) FROM drifted WHERE s = {_ONE_POINT}")  # text, as loaded
        prepared = proxy.connect(prepare_threshold=0)  # planned before the ALTER, run after
        prepared.execute(f"SELECT COUNT(*) FROM drifted WHERE a = 3 AND s = {_ONE_POINT}")
        admin.execute("ALTER TABLE drifted ALTER COLUMN s TYPE point[] USING ARRAY[]::point[]")
        time.sleep(1.0)  # a few re-checks
        before = _remaining(proxy)
        asked = [(conn, f"SELECT COUNT(*) FROM drifted WHERE a = 2 AND s = {_ONE_POINT}"),
                 (prepared, f"SELECT COUNT(*) FROM drifted WHERE a = 3 AND s = {_ONE_POINT}")]
        for session, sql in asked:
            _assert_refused(session, sql, "column s was altered (its type)")
        admin.execute("UPDATE drifted SET s = ARRAY[point(0, 0)] WHERE a = 3")  # the neighbour
        for session, sql in asked:
            _assert_refused(session, sql, "column s was altered (its type)")
        assert _remaining(proxy) == before  # nothing charged
        assert any("protected table drifted changed since the policy was loaded: column s was altered (its type)"
                   in record.getMessage() for record in caplog.records), caplog.text

        assert proxy._call(proxy.server.reload(path))  # judged by the definition in force: a point[] column
        for session, sql in asked:
            with pytest.raises(psycopg.Error) as refused:
                session.execute(sql)
            assert refused.value.sqlstate != "42883" and "schema-changed" not in str(refused.value)
        assert _remaining(proxy) == before
        assert conn.execute("SELECT COUNT(*) FROM drifted WHERE a = 3").fetchone() is not None  # the table answers
        prepared.close()


def test_like_on_a_column_made_nondeterministic_is_refused_before_the_charge(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL ≤ 17 raises on the first row that reaches a LIKE on a nondeterministic collation:
    judged as loaded (deterministic), the error told whether any row passed the other predicates."""
    with _drifting(test_db, tmp_path, monkeypatch) as (admin, proxy, _), proxy.connect() as conn:
        try:
            admin.execute("CREATE COLLATION IF NOT EXISTS drift_nocase "
                          "(provider = icu, locale = 'und-u-ks-level2', deterministic = false)")
        except psycopg.errors.FeatureNotSupported:
            pytest.skip("this PostgreSQL is built without ICU")
        conn.execute("SELECT COUNT(*) FROM drifted WHERE a = 3 AND s LIKE 'y1%'")
        admin.execute("ALTER TABLE drifted ALTER COLUMN s SET DATA TYPE text COLLATE drift_nocase")
        time.sleep(1.0)
        before = _remaining(proxy)
        for row in (3, 8):  # a row reaches the LIKE, none does
            _assert_refused(conn, f"SELECT COUNT(*) FROM drifted WHERE a = {row} AND s LIKE 'y1%'",
                            "column s was altered (its collation)")
        assert _remaining(proxy) == before


def test_a_widening_type_change_is_refused_too_until_a_reload(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """integer to bigint is harmless for most statements, but which changes are is a judgement
    dpproxy would have to get right for every shape: any change refuses until the reload."""
    with _drifting(test_db, tmp_path, monkeypatch) as (admin, proxy, path), proxy.connect() as conn:
        admin.execute("ALTER TABLE drifted ALTER COLUMN a TYPE bigint")
        time.sleep(1.0)
        before = _remaining(proxy)
        _assert_refused(conn, "SELECT SUM(a) FROM drifted", "column a was altered (its type)")
        assert _remaining(proxy) == before
        assert proxy._call(proxy.server.reload(path))
        assert conn.execute("SELECT SUM(a) FROM drifted").fetchone() is not None
        assert _remaining(proxy) == before - 1
        time.sleep(1.0)  # and the looks after the reload find nothing changed
        assert not proxy.server.registry.redefined


def test_a_domain_constraint_added_refuses_until_it_is_dropped_again(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Back as loaded, the table answers again without a reload."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS drifted; DROP DOMAIN IF EXISTS drift_small; "
                      "CREATE DOMAIN drift_small AS integer")
    with _drifting(test_db, tmp_path, monkeypatch, "g % 7 AS a, (g % 7)::drift_small AS d") as (admin, proxy, _), \
            proxy.connect() as conn:
        admin.execute("ALTER DOMAIN drift_small ADD CONSTRAINT drift_positive CHECK (VALUE > 0) NOT VALID")
        time.sleep(1.0)
        _assert_refused(conn, "SELECT SUM(a) FROM drifted", "column d was altered (a constraint of its domain)")
        admin.execute("ALTER DOMAIN drift_small DROP CONSTRAINT drift_positive")
        time.sleep(1.0)
        assert conn.execute("SELECT SUM(a) FROM drifted").fetchone() is not None


@pytest.mark.parametrize(("ddl", "change"), [
    ("ALTER TABLE drifted DROP COLUMN s; ALTER TABLE drifted ADD COLUMN s text", "column s was altered (dropped and added again)"),
    ("ALTER TABLE drifted RENAME COLUMN s TO t", "column s was dropped or renamed"),
    ("ALTER TABLE drifted ADD COLUMN n integer", "column n was added"),
    ("ALTER TYPE drift_pair ADD ATTRIBUTE p point CASCADE", "column pair was altered (the types its values hold)"),
])
def test_each_kind_of_redefinition_is_found_and_named(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ddl: str, change: str
) -> None:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS drifted; DROP TYPE IF EXISTS drift_pair; "
                      "CREATE TYPE drift_pair AS (k integer)")
    columns = "g % 7 AS a, 'y' || g AS s, ROW(g)::drift_pair AS pair"
    with _drifting(test_db, tmp_path, monkeypatch, columns) as (admin, proxy, _), proxy.connect() as conn:
        admin.execute(ddl)
        time.sleep(1.0)
        _assert_refused(conn, "SELECT COUNT(*) FROM drifted", change)


def test_a_table_dropped_and_created_again_is_never_answered_by_the_facts_of_the_old_one(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new table is another relation (OID): once a look has seen the old one gone, every
    session resolves the name afresh and finds a relation the policy does not name (default-deny),
    until a reload resolves the policy's name to it."""
    with _drifting(test_db, tmp_path, monkeypatch) as (admin, proxy, path), proxy.connect() as conn:
        conn.execute("SELECT COUNT(*) FROM drifted WHERE a = 3")
        admin.execute("DROP TABLE drifted")
        admin.execute("CREATE TABLE drifted AS SELECT g % 5 AS a, 'x' || g AS s FROM generate_series(1, 500) g")
        admin.execute("GRANT SELECT ON drifted TO dpproxy_service")
        time.sleep(1.0)
        before = _remaining(proxy)
        with proxy.connect() as fresh:
            for session in (conn, fresh):
                with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                    session.execute("SELECT COUNT(*) FROM drifted WHERE a = 3")
                assert "(rule: default-deny)" in str(refused.value)
        assert _remaining(proxy) == before
        assert proxy._call(proxy.server.reload(path))
        assert conn.execute("SELECT COUNT(*) FROM drifted").fetchone() is not None


def test_an_unchanged_table_of_every_kind_of_column_is_never_taken_for_changed(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Domains with constraints, composites, arrays, enums and collations read the same at every look."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS drifted; DROP DOMAIN IF EXISTS drift_small; "
                      "DROP TYPE IF EXISTS drift_pair; CREATE DOMAIN drift_small AS integer CHECK (VALUE >= 0); "
                      "CREATE TYPE drift_pair AS (k integer, p point); DROP TYPE IF EXISTS drift_mood; "
                      "CREATE TYPE drift_mood AS ENUM ('calm', 'wild')")
    columns = ("g % 7 AS a, (g % 7)::drift_small AS d, ('y' || g) COLLATE \"C\" AS s, ROW(g, point(0, 0))::drift_pair AS pair, "
               "ARRAY[g] AS arr, ARRAY[(g % 7)::drift_small] AS smalls, (g % 2 = 0) AS flag, now() AS at, "
               "(CASE WHEN g % 2 = 0 THEN 'calm' ELSE 'wild' END)::drift_mood AS mood")
    with _drifting(test_db, tmp_path, monkeypatch, columns) as (_, proxy, _path), proxy.connect() as conn:
        assert proxy.server.registry.definitions  # the facts as loaded, for the looks to compare with
        time.sleep(1.0)
        assert not proxy.server.registry.redefined
        assert conn.execute("SELECT SUM(a) FROM drifted").fetchone() is not None


def test_each_fact_of_a_column_counts_and_nothing_else_does() -> None:
    """Without ICU in the test server, a collation made nondeterministic is checked here."""
    from policies.tables import ColumnFacts
    from proxy.backend.column_facts import definition_change

    text = ColumnFacts("s", 25, -1, 2, True, 1009, False, False, (25,), ())
    loaded = (ColumnFacts("a", 23, -1, 1, True, 1007, False, False, (23,), ()), text)
    assert definition_change(loaded, loaded) is None
    assert definition_change((), ()) is None  # a relation without columns, still there
    assert definition_change(loaded, (loaded[0], text._replace(deterministic_collation=False))) \
        == "column s was altered (its collation)"
    assert definition_change(loaded, (loaded[0], text._replace(type_modifier=12))) == "column s was altered (its type)"
    assert definition_change(loaded, None) == \
        "it was dropped (a table created under its name since is another relation)"
