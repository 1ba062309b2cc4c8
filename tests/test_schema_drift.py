"""A protected table altered on the backend after dpproxy loaded its policy.

Found: dpproxy read each protected table's column facts (type, collation, what the type holds)
once, at start and reload, and judged every statement by them. Altered since (``ALTER TABLE ...
ALTER COLUMN ... TYPE point[]``), the column was still taken for text: ``s = '{"(1,1)"}'`` was
accepted, charged, and then failed with 42883 exactly when some row held a one-point array to
compare it with, an error oracle on neighbouring tables. The periodic re-check now reads the facts
again (proxy.backend.column_facts); when a table's definition changed, dpproxy resolves the policy
in force against the backend again, as a reload of the same file would: if it still fits, the new
definition is in force at once (a migration needs no signal); if not, the table is refused before
the charge (55000, rule ``schema-changed``) until a reload of a policy that fits, or until it is
back as loaded. Where the whole policy does not resolve, each changed table is resolved alone, so
that a problem of another table keeps no table refused that still fits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, make_policy

from policies.tables import TableRegistry

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
              replayed: Callable[[], None] = lambda: None,
              ) -> Iterator[tuple[psycopg.Connection, RunningProxy, Path]]:
    """The protected table ``drifted`` (500 rows of ``columns``), an admin connection, a dpproxy
    re-checking every 0.2 s, and the policy's file (to reload it). ``replayed`` returns once
    dpproxy's backend has the table (a standby's replay of the admin's primary)."""
    from proxy.serving import server

    monkeypatch.setattr(server, "FUNCTION_NAMES_REFRESH_S", 0.2)
    text = policy.replace("repeats: {{enabled: true}}", "repeats: {{enabled: false}}")
    ledger, path = tmp_path / "ledger.sqlite3", tmp_path / "policy.yaml"
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("DROP TABLE IF EXISTS drifted")
        admin.execute(f"CREATE TABLE drifted AS SELECT {columns} FROM generate_series(1, 500) g")
        admin.execute("GRANT SELECT ON drifted TO dpproxy_service")
        replayed()
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
    caplog.set_level(logging.WARNING, logger="dpproxy.server")
    with _drifting(test_db, tmp_path, monkeypatch) as (admin, proxy, path), proxy.connect() as conn:
        conn.execute(f"SELECT COUNT(*) FROM drifted WHERE s = {_ONE_POINT}")  # text, as loaded
        prepared = proxy.connect(prepare_threshold=0)  # planned before the ALTER, run after
        prepared.execute(f"SELECT COUNT(*) FROM drifted WHERE a = 3 AND s = {_ONE_POINT}")
        admin.execute("ALTER TABLE drifted ALTER COLUMN s TYPE point[] USING ARRAY[]::point[]")
        time.sleep(1.0)  # a few re-checks: the policy (which names only a) fits, so it is resolved again
        before = _remaining(proxy)
        asked = [(conn, f"SELECT COUNT(*) FROM drifted WHERE a = 2 AND s = {_ONE_POINT}"),
                 (prepared, f"SELECT COUNT(*) FROM drifted WHERE a = 3 AND s = {_ONE_POINT}")]
        for neighbour in (False, True):
            if neighbour:
                admin.execute("UPDATE drifted SET s = ARRAY[point(0, 0)] WHERE a = 3")
            for session, sql in asked:  # judged by the definition in force: a point[] column
                with pytest.raises(psycopg.Error) as refused:
                    session.execute(sql)
                assert refused.value.sqlstate == "DP001", str(refused.value)
        assert _remaining(proxy) == before  # nothing charged
        assert any("protected table drifted changed (column s was altered (its type))" in record.getMessage()
                   for record in caplog.records), caplog.text
        assert not proxy.server.registry.redefined
        assert conn.execute("SELECT COUNT(*) FROM drifted WHERE a = 3").fetchone() is not None  # the table answers
        prepared.close()


def test_like_on_a_column_made_nondeterministic_is_refused_before_the_charge(
    pg15_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL ≤ 17 raises on the first row that reaches a LIKE on a nondeterministic collation:
    judged as loaded (deterministic), the error told whether any row passed the other predicates.
    On PostgreSQL 15 (tests/pg15.py): pgserver's 16 is built without ICU."""
    with _drifting(pg15_db, tmp_path, monkeypatch) as (admin, proxy, _), proxy.connect() as conn:
        admin.execute("CREATE COLLATION IF NOT EXISTS drift_nocase "
                      "(provider = icu, locale = 'und-u-ks-level2', deterministic = false)")
        conn.execute("SELECT COUNT(*) FROM drifted WHERE a = 3 AND s LIKE 'y1%'")
        admin.execute("ALTER TABLE drifted ALTER COLUMN s SET DATA TYPE text COLLATE drift_nocase")
        time.sleep(1.0)
        before = _remaining(proxy)
        for row in (3, 8):  # a row reaches the LIKE, none does: judged by the collation in force
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(f"SELECT COUNT(*) FROM drifted WHERE a = {row} AND s LIKE 'y1%'")
            assert refused.value.sqlstate == "DP001", str(refused.value)
        assert _remaining(proxy) == before


def test_a_widening_type_change_is_answered_by_the_new_definition_without_a_reload(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the code before the re-check, integer made bigint charged every SUM and then failed it
    (``int4larger(bigint, integer)``); now the policy is resolved against the new definition."""
    with _drifting(test_db, tmp_path, monkeypatch) as (admin, proxy, _), proxy.connect() as conn:
        admin.execute("ALTER TABLE drifted ALTER COLUMN a TYPE bigint")
        time.sleep(1.0)
        before = _remaining(proxy)
        assert conn.execute("SELECT SUM(a) FROM drifted").fetchone() is not None
        assert _remaining(proxy) == before - 1
        assert not proxy.server.registry.redefined


def test_a_change_the_policy_no_longer_fits_is_refused_until_the_table_is_back(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``bounds`` on a column made text: a reload of the same file would be refused, so the
    table's statements are, before the charge, with the reason in the log."""
    caplog.set_level(logging.ERROR, logger="dpproxy.server")
    with _drifting(test_db, tmp_path, monkeypatch) as (admin, proxy, _), proxy.connect() as conn:
        admin.execute("ALTER TABLE drifted ALTER COLUMN a TYPE text")
        time.sleep(1.0)
        before = _remaining(proxy)
        _assert_refused(conn, "SELECT COUNT(*) FROM drifted", "column a was altered (its type)")
        assert _remaining(proxy) == before
        assert any("the policy in force no longer fits" in record.getMessage() for record in caplog.records), \
            caplog.text
        admin.execute("ALTER TABLE drifted ALTER COLUMN a TYPE integer USING a::integer")
        time.sleep(1.0)
        assert conn.execute("SELECT SUM(a) FROM drifted").fetchone() is not None


def test_a_domain_constraint_added_is_taken_in_without_a_reload(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS drifted; DROP DOMAIN IF EXISTS drift_small; "
                      "CREATE DOMAIN drift_small AS integer")
    with _drifting(test_db, tmp_path, monkeypatch, "g % 7 AS a, (g % 7)::drift_small AS d") as (admin, proxy, _), \
            proxy.connect() as conn:
        loaded = proxy.server.registry
        admin.execute("ALTER DOMAIN drift_small ADD CONSTRAINT drift_positive CHECK (VALUE > 0) NOT VALID")
        time.sleep(1.0)
        assert proxy.server.registry is not loaded and not proxy.server.registry.redefined
        assert conn.execute("SELECT SUM(a) FROM drifted").fetchone() is not None


@pytest.mark.parametrize(("ddl", "change"), [
    ("ALTER TABLE drifted DROP COLUMN s; ALTER TABLE drifted ADD COLUMN s text", "column s was altered (dropped and added again)"),
    ("ALTER TABLE drifted RENAME COLUMN s TO t", "column s was dropped or renamed"),
    ("ALTER TABLE drifted ADD COLUMN n integer", "column n was added"),
    ("ALTER TYPE drift_pair ADD ATTRIBUTE p point CASCADE", "column pair was altered (the types its values hold)"),
])
def test_each_kind_of_redefinition_is_found_named_and_resolved_again(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    ddl: str, change: str
) -> None:
    caplog.set_level(logging.WARNING, logger="dpproxy.server")
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS drifted; DROP TYPE IF EXISTS drift_pair; "
                      "CREATE TYPE drift_pair AS (k integer)")
    columns = "g % 7 AS a, 'y' || g AS s, ROW(g)::drift_pair AS pair"
    with _drifting(test_db, tmp_path, monkeypatch, columns) as (admin, proxy, _), proxy.connect() as conn:
        loaded = proxy.server.registry
        admin.execute(ddl)
        time.sleep(1.0)
        assert any(f"protected table drifted changed ({change})" in record.getMessage() for record in caplog.records), \
            caplog.text
        assert proxy.server.registry is not loaded and not proxy.server.registry.redefined
        assert conn.execute("SELECT COUNT(*) FROM drifted").fetchone() is not None


def test_a_table_dropped_and_created_again_is_never_answered_by_the_facts_of_the_old_one(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new table is another relation (OID). Before, an open session kept the old one's facts
    for it; now the look that sees the old one gone resolves the policy's name again, to it."""
    with _drifting(test_db, tmp_path, monkeypatch) as (admin, proxy, _), proxy.connect() as conn:
        conn.execute("SELECT COUNT(*) FROM drifted WHERE a = 3")
        admin.execute("DROP TABLE drifted")
        admin.execute("CREATE TABLE drifted AS SELECT 'x' || g AS a FROM generate_series(1, 500) g")
        admin.execute("GRANT SELECT ON drifted TO dpproxy_service")
        time.sleep(1.0)
        before = _remaining(proxy)
        with proxy.connect() as fresh:
            for session in (conn, fresh):  # bounds on a text column: the policy does not fit this one
                with pytest.raises(psycopg.Error) as refused:
                    session.execute("SELECT SUM(a) FROM drifted")
                assert refused.value.sqlstate in ("55000", "42501"), str(refused.value)
        assert _remaining(proxy) == before
        admin.execute("DROP TABLE drifted")  # created again, as the policy has it: taken in at the next look
        admin.execute("CREATE TABLE drifted AS SELECT g % 5 AS a FROM generate_series(1, 500) g")
        admin.execute("GRANT SELECT ON drifted TO dpproxy_service")
        time.sleep(1.0)
        new_oid = admin.execute("SELECT 'drifted'::regclass::oid").fetchone()[0]
        assert new_oid in proxy.server.registry.by_oid
        assert conn.execute("SELECT SUM(a) FROM drifted").fetchone() is not None


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
    """A collation made nondeterministic, checked without a backend (and on PostgreSQL 15 above)."""
    from policies.tables import ColumnFacts
    from proxy.backend.column_facts import definition_change

    text = ColumnFacts("s", 25, -1, 2, True, 1009, False, False, (25,), ())
    loaded = (ColumnFacts("a", 23, -1, 1, True, 1007, False, False, (23,), ()), text)
    assert definition_change(loaded, loaded) is None
    assert definition_change((), ()) is None  # a relation without columns, still there
    assert definition_change(loaded, (loaded[0], text._replace(deterministic_collation=False))) \
        == "column s was altered (its collation)"
    assert definition_change(loaded, (loaded[0], text._replace(type_modifier=12))) == "column s was altered (its type)"
    assert definition_change(loaded, (loaded[0], text._replace(enum_labels=("calm",)))) \
        == "column s was altered (the labels of its enum)"
    assert definition_change(loaded, None) == \
        "it was dropped (a table created under its name since is another relation)"


def test_an_enum_label_renamed_is_refused_before_the_charge_not_charged_and_failed(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ALTER TYPE ... RENAME VALUE`` changes no OID: the facts compared the same, and a
    histogram or MODE over the policy's categories sent the old label, was charged and then
    failed with 22P02 on every table."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS drifted; DROP TYPE IF EXISTS drift_mood; "
                      "CREATE TYPE drift_mood AS ENUM ('happy', 'sad')")
    policy = _POLICY + "      m: {{categories: [happy, sad], group_by: true}}\n"
    columns = "g % 7 AS a, (CASE WHEN g % 2 = 0 THEN 'happy' ELSE 'sad' END)::drift_mood AS m"
    with _drifting(test_db, tmp_path, monkeypatch, columns, policy) as (admin, proxy, _), proxy.connect() as conn:
        assert conn.execute("SELECT m, COUNT(*) FROM drifted GROUP BY m").fetchall()
        admin.execute("ALTER TYPE drift_mood RENAME VALUE 'sad' TO 'blue'")
        time.sleep(1.0)
        before = _remaining(proxy)
        for sql in ("SELECT m, COUNT(*) FROM drifted GROUP BY m",
                    "SELECT MODE() WITHIN GROUP (ORDER BY m) FROM drifted"):
            _assert_refused(conn, sql, "column m was altered (the labels of its enum)")
        assert _remaining(proxy) == before


# ---------------------------------------------------------------- one table at a time

_TWO_TABLES = _POLICY + """\
  public.drift_other:
    access: protected
    epsilon: 1.0
    columns:
      a: {{bounds: [0, 10]}}
"""


@contextmanager
def _two_drifting(test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                  ) -> Iterator[tuple[psycopg.Connection, RunningProxy, int, int]]:
    """``_drifting`` with a second protected table, ``drift_other``; and both tables' OIDs."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS drift_other")
        setup.execute("CREATE TABLE drift_other AS SELECT g % 7 AS a FROM generate_series(1, 500) g")
        setup.execute("GRANT SELECT ON drift_other TO dpproxy_service")
    try:
        with _drifting(test_db, tmp_path, monkeypatch, policy=_TWO_TABLES) as (admin, proxy, _):
            oids = admin.execute("SELECT 'drifted'::regclass::oid, 'drift_other'::regclass::oid").fetchone()
            assert oids is not None
            yield admin, proxy, oids[0], oids[1]
    finally:
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as teardown:
            teardown.execute("DROP TABLE IF EXISTS drift_other")


def _until_looked(proxy: RunningProxy, seen: Callable[[TableRegistry], bool], seconds: float = 60.0) -> TableRegistry:
    """The registry in force once ``seen`` holds of it (the re-check took in the changes made)."""
    deadline = time.monotonic() + seconds
    while not seen(registry := proxy.server.registry):
        assert time.monotonic() < deadline, f"the re-check did not take the changes in within {seconds} s"
        time.sleep(0.1)
    return registry


def test_a_harmless_change_is_taken_in_while_another_table_lost_its_select(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole policy no longer resolves (drift_other is unreadable), which kept drifted, only
    made bigint, refused (schema-changed) until a reload: each table is now resolved alone."""
    with _two_drifting(test_db, tmp_path, monkeypatch) as (admin, proxy, drifted, other), proxy.connect() as conn:
        loaded = proxy.server.registry.definitions[drifted]
        admin.execute("REVOKE SELECT ON drift_other FROM dpproxy_service")
        admin.execute("ALTER TABLE drifted ALTER COLUMN a TYPE bigint")
        registry = _until_looked(proxy, lambda r: other in r.unreadable
                                 and (drifted in r.redefined or r.definitions[drifted] != loaded))
        assert drifted not in registry.redefined and other not in registry.redefined
        before = _remaining(proxy)
        assert conn.execute("SELECT SUM(a) FROM drifted").fetchone() is not None
        assert _remaining(proxy) == before - 1
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            conn.execute("SELECT COUNT(*) FROM drift_other")
        assert "(rule: service-role-grant)" in str(refused.value)
        assert _remaining(proxy) == before - 1


def test_a_table_the_policy_no_longer_fits_stays_refused_while_another_changed_one_recovers(
    test_db: TestDatabase, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with _two_drifting(test_db, tmp_path, monkeypatch) as (admin, proxy, drifted, other), proxy.connect() as conn:
        loaded = proxy.server.registry.definitions[drifted]
        admin.execute("ALTER TABLE drift_other ALTER COLUMN a TYPE text")  # bounds on text: no longer fits
        admin.execute("ALTER TABLE drifted ALTER COLUMN a TYPE bigint")
        registry = _until_looked(proxy, lambda r: other in r.redefined
                                 and (drifted in r.redefined or r.definitions[drifted] != loaded))
        assert drifted not in registry.redefined
        before = _remaining(proxy)
        assert conn.execute("SELECT SUM(a) FROM drifted").fetchone() is not None
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState) as refused:
            conn.execute("SELECT COUNT(*) FROM drift_other")
        assert "protected relation drift_other changed since dpproxy loaded its policy: column a was altered " \
               "(its type) (rule: schema-changed)" in str(refused.value)
        assert _remaining(proxy) == before - 1
        admin.execute("ALTER TABLE drift_other ALTER COLUMN a TYPE integer USING a::integer")
        _until_looked(proxy, lambda r: other not in r.redefined)
        assert conn.execute("SELECT SUM(a) FROM drift_other").fetchone() is not None
