"""PostgreSQL 18 reports search_path in ParameterStatus; dpproxy relays it, each session its own.

From 18 on the server sends search_path at startup and after every change, as it sends
TimeZone (connection poolers and drivers read it instead of asking). dpproxy relayed only the
parameters older servers report, so a client saw no search_path through it. Over a pool of
one connection, what one session sets must never be what another is told.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from conftest import RunningProxy, TestDatabase, running_proxy
from test_backend_pool import _policy
_DEFAULT = '"$user", public'


@pytest.fixture(scope="module")
def one18(pg18_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """dpproxy on PostgreSQL 18, with a pool of one backend connection."""
    with running_proxy(pg18_db, tmp_path_factory, _policy(1)) as running:
        yield running


def _reported(conn: psycopg.Connection) -> str | None:
    return conn.info.parameter_status("search_path")


def test_search_path_is_reported_at_startup_and_after_set_as_postgresql_18_reports_it(
        pg18_db: TestDatabase, one18: RunningProxy) -> None:
    seen = []
    for dsn in (pg18_db.admin_dsn, one18.dsn()):
        with psycopg.connect(dsn, autocommit=True) as conn:
            at_start = _reported(conn)
            conn.execute("SET search_path = pg_catalog, public")
            after_set = _reported(conn)
            conn.execute("RESET search_path")
            seen.append((at_start, after_set, _reported(conn)))
    assert seen[0] == seen[1] == (_DEFAULT, "pg_catalog, public", _DEFAULT)


def test_one_sessions_search_path_is_never_reported_to_another_on_the_shared_connection(one18: RunningProxy) -> None:
    with psycopg.connect(one18.dsn(), autocommit=True) as alice:
        alice.execute("SET search_path = pg_catalog")
        assert _reported(alice) == "pg_catalog"
        # A session of a kind not seen yet borrows the one connection at startup, to learn what to report.
        with psycopg.connect(one18.dsn(), autocommit=True, application_name="bob") as bob:
            assert _reported(bob) == _DEFAULT
            assert bob.execute("SHOW search_path").fetchone() == (_DEFAULT,)
            assert _reported(bob) == _DEFAULT
            assert alice.execute("SHOW search_path").fetchone() == ("pg_catalog",)
            assert _reported(alice) == "pg_catalog"
            bob.execute("SET search_path = public")
            assert alice.execute("SELECT 1").fetchone() == (1,)
            assert (_reported(alice), _reported(bob)) == ("pg_catalog", "public")


def test_a_search_path_set_in_a_failed_pipeline_is_reported_back_as_it_was(
        pg18_db: TestDatabase, one18: RunningProxy) -> None:
    seen = []
    for dsn in (pg18_db.admin_dsn, one18.dsn()):
        with psycopg.connect(dsn, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.DivisionByZero):
                with conn.pipeline():
                    conn.execute("SET search_path = pg_catalog")
                    conn.execute("SELECT 1/0")
            seen.append((_reported(conn), conn.execute("SHOW search_path").fetchone()))
    assert seen[0] == seen[1] == (_DEFAULT, (_DEFAULT,))


def test_a_startup_search_path_is_reported_to_its_own_session_only(pg18_db: TestDatabase, one18: RunningProxy) -> None:
    """A search_path given at startup (libpq's options, -c) is reported to that session, as
    PostgreSQL 18 reports it, and the sessions before and after it keep theirs."""
    with psycopg.connect(pg18_db.admin_dsn, options="-c search_path=pg_catalog") as direct:
        assert _reported(direct) == "pg_catalog"
    with psycopg.connect(one18.dsn(), autocommit=True) as before:
        with psycopg.connect(one18.dsn(), autocommit=True, options="-c search_path=pg_catalog") as given:
            assert _reported(given) == "pg_catalog"
            assert given.execute("SHOW search_path").fetchone() == ("pg_catalog",)
            assert before.execute("SHOW search_path").fetchone() == (_DEFAULT,)
            assert (_reported(given), _reported(before)) == ("pg_catalog", _DEFAULT)
        with psycopg.connect(one18.dsn(), autocommit=True) as after:
            assert _reported(after) == _DEFAULT
            assert after.execute("SHOW search_path").fetchone() == (_DEFAULT,)
