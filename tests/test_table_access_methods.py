"""A protected table stored through a table access method other than heap is refused.

dpproxy's bounds on what one row can add to a DP statement's time were measured on heap: the value
bound and the stored-form check (rewriter/text_bounds.py) read heap's value headers
(``octet_length``, ``pg_column_size``, ``pg_column_compression``), and the work limit's weights are
heap's costs a byte. A table whose ``relam`` names another handler (a columnar extension's, or any
C function a superuser names a handler) is read by code nobody measured, whose time on one row's
value, or failure on it, would tell whether the row is there. Found: such a table loaded as any
other. Now ``serve``, a reload and ``check-config`` refuse a protected relation that reads one (its
own storage, a partition's, a protected view's base table), and the periodic re-check refuses the
statements on one altered so since, before the charge (proxy/backend/row_failures.py). An access
method that is heap's handler under another name is heap, and loads.

The backends under test have no other table access method (PostgreSQL ships only heap); the tests
make one from heap's own C function under another name (``LANGUAGE internal``), a handler dpproxy
cannot know to be heap's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from conftest import (ATTACK_POLICY_HEAD, TestDatabase, make_policy, policy_registry, refused_at_load, refused_uncharged,
                      running_proxy)

_POLICY = ATTACK_POLICY_HEAD + """\
  public.am_rows:
    access: protected
    epsilon: 1.0
    columns:
      id: {{bounds: [0, 1000]}}
"""


@contextmanager
def _table(test_db: TestDatabase, *setup: str) -> Iterator[psycopg.Connection]:
    """An access method ``am_other`` whose handler is a user's name for heap's C function, one
    ``am_heap`` whose handler is heap's own, the ``setup`` statements (which create ``am_rows``),
    readable by the service role; all dropped on exit."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute("CREATE FUNCTION am_handler(internal) RETURNS table_am_handler LANGUAGE internal "
                      "AS 'heap_tableam_handler'")
        admin.execute("CREATE ACCESS METHOD am_other TYPE TABLE HANDLER am_handler")
        admin.execute("CREATE ACCESS METHOD am_heap TYPE TABLE HANDLER heap_tableam_handler")
        try:
            for statement in setup:
                admin.execute(statement)
            admin.execute("GRANT SELECT ON am_rows TO dpproxy_service")
            yield admin
        finally:
            admin.execute("DROP TABLE IF EXISTS am_rows CASCADE")
            admin.execute("DROP ACCESS METHOD am_other CASCADE")
            admin.execute("DROP ACCESS METHOD am_heap CASCADE")
            admin.execute("DROP FUNCTION am_handler(internal)")


def test_a_protected_table_stored_through_another_access_method_is_refused_at_load(
    test_db: TestDatabase, tmp_path: Path
) -> None:
    with _table(test_db, "CREATE TABLE am_rows USING am_other AS SELECT g AS id FROM generate_series(1, 50) g"):
        problems = refused_at_load(make_policy(test_db, tmp_path / "ledger.sqlite3", _POLICY))
    assert len(problems) == 1, problems
    assert problems[0].startswith("tables.public.am_rows: table am_rows (access method am_other) is stored through "
                                  "a table access method that is not heap's"), problems
    assert "SET ACCESS METHOD heap" in problems[0], problems


def test_a_partition_stored_through_another_access_method_refuses_its_protected_parent(
    test_db: TestDatabase, tmp_path: Path
) -> None:
    setup = ("CREATE TABLE am_rows (id integer) PARTITION BY RANGE (id)",
             "CREATE TABLE am_rows_low PARTITION OF am_rows FOR VALUES FROM (0) TO (100)",
             "CREATE TABLE am_rows_high PARTITION OF am_rows FOR VALUES FROM (100) TO (1001) USING am_other",
             "INSERT INTO am_rows SELECT g FROM generate_series(1, 200) g")
    with _table(test_db, *setup):
        problems = refused_at_load(make_policy(test_db, tmp_path / "ledger.sqlite3", _POLICY))
    assert len(problems) == 1 and "table am_rows_high (access method am_other)" in problems[0], problems


def test_heaps_own_handler_under_another_name_is_heap_and_loads(test_db: TestDatabase, tmp_path: Path) -> None:
    with _table(test_db, "CREATE TABLE am_rows USING am_heap AS SELECT g AS id FROM generate_series(1, 50) g"):
        registry = policy_registry(make_policy(test_db, tmp_path / "ledger.sqlite3", _POLICY))
    assert [relation.name for relation in registry.by_oid.values()] == ["am_rows"]


@pytest.mark.parametrize("access_method", ["am_other", "am_heap"])
def test_the_check_asks_the_handler_not_the_name(test_db: TestDatabase, tmp_path: Path, access_method: str) -> None:
    """The same table, moved by ``ALTER TABLE ... SET ACCESS METHOD`` (PostgreSQL 15 on): refused on
    the unknown handler, loaded on heap's."""
    setup = ("CREATE TABLE am_rows AS SELECT g AS id FROM generate_series(1, 50) g",
             f"ALTER TABLE am_rows SET ACCESS METHOD {access_method}")
    with _table(test_db, *setup):
        policy = make_policy(test_db, tmp_path / "ledger.sqlite3", _POLICY)
        if access_method == "am_heap":
            assert policy_registry(policy).by_oid
        else:
            (problem,) = refused_at_load(policy)
            assert "(access method am_other)" in problem, problem


def test_a_table_moved_to_another_access_method_while_serving_is_refused_before_the_charge(
    test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The periodic re-check finds ``ALTER TABLE ... SET ACCESS METHOD`` since the load; back on heap
    the table is answered again."""
    from proxy.serving import server

    monkeypatch.setattr(server, "FUNCTION_NAMES_REFRESH_S", 0.2)
    with _table(test_db, "CREATE TABLE am_rows AS SELECT g AS id FROM generate_series(1, 50) g") as admin, \
            running_proxy(test_db, tmp_path_factory, _POLICY) as proxy:
        admin.execute("ALTER TABLE am_rows SET ACCESS METHOD am_other")
        time.sleep(1.0)  # a few re-checks
        refused = refused_uncharged(proxy, "SELECT COUNT(*) FROM am_rows WHERE id > 8")
        assert isinstance(refused, psycopg.errors.ObjectNotInPrerequisiteState), refused
        assert "now reads through a table access method whose reads are unmeasured: table am_rows (access method " \
               "am_other) (rule: row-failure)" in str(refused), str(refused)
        assert "SET ACCESS METHOD heap" in (refused.diag.message_hint or "")
        admin.execute("ALTER TABLE am_rows SET ACCESS METHOD heap")
        time.sleep(1.0)
        with proxy.connect() as conn:
            assert conn.execute("SELECT COUNT(*) FROM am_rows WHERE id > 9").fetchone() is not None
