"""The service role's SELECT on a protected table, revoked while dpproxy runs.

At start and reload such a policy is refused (test_check_config_backend.py). Revoked later, each DP
query on the table was charged, then failed with 42501: budget spent on answers never given, for a
reason no row decides. The periodic re-check (server.FUNCTION_NAMES_REFRESH_S) now finds it: the
table's statements are refused before the charge until a re-check finds the privilege back.
"""

from __future__ import annotations

import time

import psycopg
import pytest

from conftest import ATTACK_POLICY_HEAD, RunningProxy, TestDatabase, dropped_around, running_proxy

_POLICY = ATTACK_POLICY_HEAD + """\
  public.regranted:
    access: protected
    epsilon: 1.0
    columns:
      a: {{bounds: [0, 10]}}
"""


def _remaining(proxy: RunningProxy) -> float:
    return float(proxy._call(proxy.server.budget.balance("analyst")).remaining_epsilon)


def test_a_protected_table_whose_select_is_revoked_is_refused_before_the_charge_until_granted_again(
    test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from proxy.serving import server

    monkeypatch.setattr(server, "FUNCTION_NAMES_REFRESH_S", 0.2)
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin, dropped_around(admin, "regranted"):
        admin.execute("CREATE TABLE regranted AS SELECT g % 10 AS a FROM generate_series(1, 500) g")
        admin.execute("GRANT SELECT ON regranted TO dpproxy_service")
        with running_proxy(test_db, tmp_path_factory, _POLICY) as proxy, proxy.connect() as conn:
            conn.execute("SELECT COUNT(*) FROM regranted")
            prepared = proxy.connect(prepare_threshold=0)  # planned before the revocation, run after
            prepared.execute("SELECT SUM(a) FROM regranted")
            admin.execute("REVOKE SELECT ON regranted FROM dpproxy_service")
            time.sleep(1.0)  # a few re-checks
            before = _remaining(proxy)
            asked = [(conn, "SELECT COUNT(*) FROM regranted WHERE a > 5"), (conn, "SELECT SUM(a) FROM regranted"),
                     (prepared, "SELECT SUM(a) FROM regranted")]  # a new query, a repeat, a prepared statement
            for session, sql in asked:
                with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
                    session.execute(sql)
                assert "lost its SELECT privilege on protected table regranted (rule: service-role-grant)" \
                    in str(refused.value)
                hint = refused.value.diag.message_hint or ""
                assert 'GRANT SELECT ON "public"."regranted" TO "dpproxy_service"' in hint, hint
            assert _remaining(proxy) == before  # nothing charged

            admin.execute("GRANT SELECT ON regranted TO dpproxy_service")
            time.sleep(1.0)
            assert prepared.execute("SELECT SUM(a) FROM regranted").fetchone() is not None  # a repeat: free
            assert conn.execute("SELECT COUNT(*) FROM regranted WHERE a > 2").fetchone() is not None
            assert _remaining(proxy) == before - 1
            prepared.close()


def test_the_periodic_recheck_connection_is_named_dpproxy_so_it_is_not_taken_for_a_clients(
    test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The re-check opens a connection of its own for a moment; pg_stat_activity names it, so an
    operator (and benchmarks/idle.py, counting the backends idle clients hold) can tell it apart."""
    from proxy.backend.connection import OWN_APPLICATION_NAME
    from proxy.serving import server

    monkeypatch.setattr(server, "FUNCTION_NAMES_REFRESH_S", 0.01)
    names = "SELECT application_name FROM pg_stat_activity WHERE usename = 'dpproxy_service'"
    seen: set[str] = set()
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin, dropped_around(admin, "regranted"):
        admin.execute("CREATE TABLE regranted (a int)")
        admin.execute("GRANT SELECT ON regranted TO dpproxy_service")
        with running_proxy(test_db, tmp_path_factory, _POLICY) as proxy:
            deadline = time.monotonic() + 10
            while OWN_APPLICATION_NAME not in seen and time.monotonic() < deadline:
                seen.update(name for (name,) in admin.execute(names))
            with proxy.connect(application_name="a client") as conn:
                conn.execute("SELECT 1")
                seen.update(name for (name,) in admin.execute(names))
    assert {OWN_APPLICATION_NAME, "a client"} <= seen, seen
