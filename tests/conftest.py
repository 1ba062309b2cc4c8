"""Fixtures: a real PostgreSQL, the Adult test data, and a real dpproxy in front of it.

PostgreSQL comes from ``DPPROXY_TEST_DSN`` (a libpq URI of a superuser) if set, else an
embedded server started with pgserver, else testcontainers where Docker runs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import psycopg
import pytest

from policies.loader import PolicyError, parse_policy
from policies.model import Policy
from policies.tables import TableRegistry
from proxy.backend.connection import build_registry, connect
from proxy.demo.embedded import SERVICE_ROLE, prepare_demo_database
from proxy.serving.event_loop import new_event_loop
from proxy.serving.server import Server
from tests.answer_clock import answer_clock  # noqa: F401 - a fixture, for the quantum timing tests
from tests.pg15 import postgresql_15, postgresql_server
from tests.pg_versions import postgresql_binaries
from tests.standby import StandbyPair, primary_and_standby

TEST_DATABASE = "dpproxy_test"

TEST_POLICY = """
backend:
  dsn: "{dsn}"
  statement_timeout_ms: 20000
listen: {{host: 127.0.0.1, port: 0}}
ledger: {{url: "sqlite:///{ledger}"}}
repeats: {{enabled: false}}  # the statistical tests need fresh noise per query
users:
  analyst:
    password: analyst     # SCRAM-SHA-256, the default
    budget: {{epsilon: 1000000, delta: 0.5}}
  plain:
    password: plain
    auth: cleartext       # for the raw-protocol tests, which speak only cleartext
    budget: {{epsilon: 1000000, delta: 0.5}}
tables:
  public.adult:
    access: protected
    epsilon: 1.0
    delta: 1.0e-6
    columns:
      age: {{bounds: [17, 90]}}
      hours_per_week: {{bounds: [1, 99], avg: sample_aggregate}}  # AVG(age): the default, sum_count
      capital_gain: {{bounds: [0, 100000]}}
      sex: {{categories: [Male, Female]}}
  public.clamp_test:
    access: protected
    epsilon: 1.0
    columns:
      value: {{bounds: [0, 10]}}
      ratio: {{bounds: [-2.5, 2.5]}}
  public.lookup:
    access: public
"""


ATTACK_POLICY_HEAD = """
backend: {{dsn: "{dsn}", statement_timeout_ms: 10000}}
listen: {{host: 127.0.0.1, port: 0}}
ledger: {{url: "sqlite:///{ledger}"}}
repeats: {{enabled: true}}
users:
  analyst: {{password: analyst, budget: {{epsilon: 1000000, delta: 0.9}}}}
  plain: {{password: plain, auth: cleartext, budget: {{epsilon: 1000000, delta: 0.9}}}}
tables:
"""
"""The start of a policy for an attack or client test (``running_proxy``'s text): both users
with a budget that never runs out, repeats on; its ``tables:`` follow."""


@pytest.fixture(scope="session")
def pg_admin_dsn() -> Iterator[str]:
    """A superuser libpq URI of a real PostgreSQL for the whole test session."""
    if os.environ.get("DPPROXY_TEST_DSN"):
        yield os.environ["DPPROXY_TEST_DSN"]
        return
    try:
        import pgserver
    except ImportError:  # pragma: no cover - pgserver is a dependency; Docker is the fallback
        yield from _testcontainers_dsn()
        return
    # Not under tmp_path_factory: as root, pgserver runs postgres as the user 'pgserver',
    # and every pytest session that starts (a parallel run) chmods /tmp/pytest-of-root
    # back to 0700, locking that user out of a data directory below it.
    data = Path(tempfile.mkdtemp(prefix="dpproxy-test-pg-"))
    server = pgserver.get_server(data, cleanup_mode="stop")
    try:
        yield server.get_uri("postgres")
    finally:
        server.cleanup()
        shutil.rmtree(data, ignore_errors=True)


def _testcontainers_dsn() -> Iterator[str]:  # pragma: no cover - no Docker engine here
    from testcontainers.postgres import PostgresContainer

    with PostgresContainer("postgres:16") as container:
        yield container.get_connection_url().replace("+psycopg2", "")


@pytest.fixture(scope="session")
def pg_dsn(pg_admin_dsn: str) -> str:
    """A superuser libpq URI, for tests that need a PostgreSQL and nothing else."""
    return pg_admin_dsn


@dataclass(frozen=True)
class TestDatabase:
    __test__ = False  # a fixture value, not a test class

    admin_dsn: str
    service_dsn: str


@pytest.fixture(scope="session")
def test_db(pg_admin_dsn: str) -> TestDatabase:
    """The Adult table (48,842 rows, an index on age), a clamping table, a public table with a
    primary key, and a service role."""
    return _prepare_test_database(pg_admin_dsn)


@pytest.fixture(scope="session")
def pg15_db() -> Iterator[TestDatabase]:
    """``test_db``'s database on PostgreSQL 15 with ICU (tests/pg15.py), started the first time a
    test asks for it; such a test is marked ``pg15`` (and so ``clients``)."""
    with postgresql_15() as admin_dsn:
        yield _prepare_test_database(admin_dsn)


@pytest.fixture(scope="session")
def pg17_db() -> Iterator[TestDatabase]:
    """``test_db``'s database on PostgreSQL 17 (tests/pg_versions.py), started the first time a
    test asks for it."""
    with postgresql_server(postgresql_binaries(17), "pg17") as admin_dsn:
        yield _prepare_test_database(admin_dsn)


@pytest.fixture(scope="session")
def pg18_db() -> Iterator[TestDatabase]:
    """``test_db``'s database on PostgreSQL 18 (tests/pg_versions.py), started the first time a
    test asks for it."""
    with postgresql_server(postgresql_binaries(18), "pg18") as admin_dsn:
        yield _prepare_test_database(admin_dsn)


NEWER_VERSIONS = (17, 18)
"""The PostgreSQL major versions after pgserver's 16 that ``newer_pg_db`` runs a test on."""


@pytest.fixture(scope="module", params=NEWER_VERSIONS, ids=lambda major: f"pg{major}")
def newer_pg_db(request: pytest.FixtureRequest) -> TestDatabase:
    """``pg17_db`` and ``pg18_db`` in turn (each server is still started once per session); a
    test that uses it is marked ``pg_versions`` (and so ``clients``)."""
    database: TestDatabase = request.getfixturevalue(f"pg{request.param}_db")
    return database


@dataclass(frozen=True)
class StandbyDatabase:
    """``test_db``'s database on a primary (where the operator writes) and on its streaming hot
    standby (what dpproxy reads in the read-replica tests), and the pair of servers."""

    __test__ = False  # a fixture value, not a test class

    primary: TestDatabase
    standby: TestDatabase
    pair: StandbyPair


@pytest.fixture(scope="session")
def standby_db() -> Iterator[StandbyDatabase]:
    """A primary and a hot standby of it from pgserver's binaries (tests/standby.py), started the
    first time a test asks for them, with ``test_db``'s database replayed on the standby."""
    with primary_and_standby() as pair:
        primary = _prepare_test_database(pair.primary_dsn)
        pair.wait_for_replay(TEST_DATABASE)
        standby = TestDatabase(pair.on_standby(primary.admin_dsn), pair.on_standby(primary.service_dsn))
        yield StandbyDatabase(primary, standby, pair)


def _prepare_test_database(pg_admin_dsn: str) -> TestDatabase:
    service_dsn = prepare_demo_database(pg_admin_dsn, TEST_DATABASE)
    admin_dsn = urlparse(pg_admin_dsn)._replace(path=f"/{TEST_DATABASE}").geturl()
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS clamp_test, lookup, secret_unlisted")
        conn.execute("CREATE TABLE clamp_test (value integer, ratio double precision)")
        conn.execute("INSERT INTO clamp_test SELECT i % 10, (i % 5) - 2 FROM generate_series(1, 100) i")
        # One outlier far outside the policy bounds: it must be clamped before summing.
        conn.execute("INSERT INTO clamp_test VALUES (1000000000, 1e12)")
        # An index on adult: its reltuples (the exact row count) is what pgjdbc's
        # getIndexInfo reports as CARDINALITY, and what dpproxy must neutralise.
        conn.execute("CREATE INDEX IF NOT EXISTS adult_age_idx ON adult (age)")
        conn.execute("CREATE TABLE lookup (code text PRIMARY KEY, label text)")
        conn.execute("INSERT INTO lookup VALUES ('M', 'Male'), ('F', 'Female')")
        conn.execute("CREATE TABLE secret_unlisted (x integer)")
        conn.execute("INSERT INTO secret_unlisted VALUES (42)")
        for table in ("clamp_test", "lookup", "secret_unlisted"):
            conn.execute(f"GRANT SELECT ON {table} TO {SERVICE_ROLE}")
    return TestDatabase(admin_dsn, service_dsn)


def make_policy(test_db: TestDatabase, ledger: Path, text: str = TEST_POLICY) -> Policy:
    return parse_policy(text.format(dsn=test_db.service_dsn, ledger=ledger), "test-policy.yaml")


def lookup_protected_file(test_db: TestDatabase, ledger: Path, text: str = TEST_POLICY) -> Path:
    """A policy file next to ``ledger``: ``text`` with public.lookup protected (its code a
    category column), for a reload that protects a table a session reads through."""
    protected = text.replace("  public.lookup:\n    access: public\n",
                             "  public.lookup:\n    access: protected\n    epsilon: 1.0\n"
                             "    columns:\n      code: {{categories: [M, F]}}\n")
    assert protected != text
    path = ledger.parent / "policy.yaml"
    path.write_text(protected.format(dsn=test_db.service_dsn, ledger=ledger))
    return path


def policy_registry(policy: Policy) -> TableRegistry:
    """``policy``'s table registry as dpproxy builds it when it starts (from its backend)."""
    async def build() -> TableRegistry:
        session = await connect(policy)
        try:
            return await build_registry(session, policy)
        finally:
            await session.close()

    return asyncio.run(build())


class RunningProxy:
    """A real dpproxy Server on its own event loop thread, listening on a free port."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="dpproxy", daemon=True)
        self._thread.start()
        self.server: Server = self._call(Server.create(policy))
        self.host, self.port = self._call(self.server.start("127.0.0.1", 0))

    def _call(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def dsn(self, user: str = "analyst", password: str = "analyst", database: str = TEST_DATABASE) -> str:
        return f"host={self.host} port={self.port} dbname={database} user={user} password={password}"

    def connect(self, **kwargs: object) -> psycopg.Connection:
        """A psycopg connection in autocommit mode that stays on the simple query protocol."""
        kwargs.setdefault("autocommit", True)
        kwargs.setdefault("prepare_threshold", None)
        return psycopg.connect(self.dsn(), **kwargs)  # type: ignore[arg-type]

    def answer_once(self, sql: str = "SELECT COUNT(*) FROM adult") -> None:
        """Answer one DP statement as the analyst. The first answer of a user waits for the
        ledger's first reservation, a commit synced to disk, which on a busy machine can take a
        second: tests that time answers call this first, to time the proxy and not the disk."""
        with self.connect() as conn:
            conn.execute(sql).fetchall()

    def stop(self) -> None:
        self._call(self.server.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


def refused_at_load(policy: Policy) -> list[str]:
    """The problems dpproxy's start (which checks the policy against the backend) refuses ``policy`` with."""
    loop = new_event_loop()
    try:
        with pytest.raises(PolicyError) as refused:
            loop.run_until_complete(asyncio.wait_for(Server.create(policy), 60))
    finally:
        loop.close()
    return list(refused.value.problems)


@contextmanager
def running_proxy(
    test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, text: str = TEST_POLICY
) -> Iterator[RunningProxy]:
    """A dpproxy under the policy ``text`` with a ledger of its own, stopped on exit."""
    running = RunningProxy(make_policy(test_db, tmp_path_factory.mktemp("ledger") / "ledger.sqlite3", text))
    try:
        yield running
    finally:
        running.stop()


@contextmanager
def proxy_over_table(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory, table: str, ddl: str,
                     rows: str, columns: str) -> Iterator[RunningProxy]:
    """A dpproxy under TEST_POLICY with ``public.<table>`` protected (epsilon 1, ``columns``: its
    policy's columns in YAML flow style), the table made afresh as ``ddl`` and filled by ``rows`` (a
    SELECT), stopped on exit."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP TABLE IF EXISTS {table}")
        admin.execute(f"CREATE TABLE {table} ({ddl})")
        admin.execute(f"INSERT INTO {table} {rows}")
        admin.execute(f"GRANT SELECT ON {table} TO {SERVICE_ROLE}")
    entry = f"  public.{table}: {{access: protected, epsilon: 1.0, delta: 1.0e-6, columns: {columns}}}\n"
    with running_proxy(test_db, tmp_path_factory, TEST_POLICY + entry.replace("{", "{{").replace("}", "}}")) as running:
        yield running


def spent_by_plain(proxy: RunningProxy) -> float:
    """The ε the user ``plain`` (tests.wire's raw connections') has spent through ``proxy``."""
    with psycopg.connect(proxy.dsn(user="plain", password="plain"), autocommit=True, prepare_threshold=None) as conn:
        return spent_epsilon(conn)


@contextmanager
def dropped_around(admin: psycopg.Connection, *names: str) -> Iterator[psycopg.Connection]:
    """``admin``, with the tables ``names`` dropped before and after (a test creates them)."""
    admin.execute(f"DROP TABLE IF EXISTS {', '.join(names)}")
    try:
        yield admin
    finally:
        admin.execute(f"DROP TABLE IF EXISTS {', '.join(names)}")


def memory_kb(field: str = "VmRSS") -> int:
    """This process's memory, in kB, as /proc/self/status reports ``field`` (VmRSS, or VmHWM, the
    peak since ``reset_peak_memory``): the proxies of RunningProxy run in this process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/self/status")


def reset_peak_memory() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the current VmRSS


def spent_epsilon(conn: psycopg.Connection) -> float:
    """The connected user's spent ε, as ``SHOW dpproxy.budget`` reports it."""
    cursor = conn.execute("SHOW dpproxy.budget")
    row = cursor.fetchone()
    assert row is not None and cursor.description is not None
    return float(dict(zip([d.name for d in cursor.description], row))["spent_epsilon"])


def refused_uncharged(proxy: RunningProxy, sql: str) -> psycopg.Error:
    """The error ``sql`` fails with through ``proxy``, once ``SHOW dpproxy.budget`` has shown that
    nothing was charged for it."""
    with proxy.connect(autocommit=True) as conn:
        spent = spent_epsilon(conn)
        with pytest.raises(psycopg.Error) as failed:
            conn.execute(sql)
        assert spent_epsilon(conn) == spent
    return failed.value


def failed_twice(conn: psycopg.Connection, sql: str, epsilon: float) -> tuple[psycopg.Error, psycopg.Error]:
    """``sql`` run twice at ``epsilon`` on ``conn``, failing both times: the two errors, once
    ``SHOW dpproxy.budget`` has shown that the first was charged and the second (a repeat) was not."""
    conn.execute(f"SET dpproxy.epsilon = {epsilon}")
    before = spent_epsilon(conn)
    errors = []
    for _ in range(2):
        with pytest.raises(psycopg.Error) as failed:
            conn.execute(sql)
        errors.append(failed.value)
        assert spent_epsilon(conn) - before == pytest.approx(epsilon)
    return errors[0], errors[1]


@pytest.fixture(scope="session")
def proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    with running_proxy(test_db, tmp_path_factory) as running:
        yield running


HISTOGRAM_POLICY = TEST_POLICY.replace("sex: {{categories: [Male, Female]}}",
                                      "sex: {{categories: [Male, Female], group_by: true}}")
"""The suite's policy with adult's sex opted in as a GROUP BY key, for the clients' histograms."""
assert HISTOGRAM_POLICY != TEST_POLICY


@pytest.fixture(scope="module")
def histogram_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A dpproxy of the module's own under HISTOGRAM_POLICY."""
    with running_proxy(test_db, tmp_path_factory, HISTOGRAM_POLICY) as running:
        yield running


LONG_LIST_POLICY = TEST_POLICY.replace("  public.adult:\n    access: protected\n",
                                      "  public.adult:\n    access: protected\n    answer_quantum_ms: 1\n")
"""The suite's policy with adult's answers on a 1 ms quantum, which lifts the limit on a DP
statement's values and comparisons (rewriter/predicate_terms.py): for the tests of what a long IN
list costs dpproxy itself (its analysis, JIT, statement size limits)."""
assert LONG_LIST_POLICY != TEST_POLICY


@pytest.fixture(scope="session")
def long_list_proxy(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """A dpproxy under LONG_LIST_POLICY."""
    with running_proxy(test_db, tmp_path_factory, LONG_LIST_POLICY) as running:
        yield running


@pytest.fixture
def admin(test_db: TestDatabase) -> Iterator[psycopg.Connection]:
    """A direct superuser connection to the test database: ground truth for exact values."""
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as conn:
        yield conn


def psql_path() -> str:
    path = shutil.which("psql")
    if path is None:
        raise RuntimeError("psql is required by the test suite (./run-tests installs postgresql-client)")
    return path


# Tests that drive a program from a system package rather than from pip (psql, pgbench,
# javac/java, node/npm, psqlODBC, docker-compose, openssl, PostgreSQL 15, PostgreSQL 17 and 18 through npm) or
# Superset's or pgAdmin's own venv: marked
# `clients`, so `./run-tests -m "not clients"` needs nothing but Python. A whole module, or the
# named tests of a module where the others need no such program.
_CLIENT_MODULES = {
    "test_benchmark_smoke",  # pgbench (and pgbouncer), valgrind
    "test_client_jdbc", "test_client_node", "test_client_odbc", "test_client_pgbench", "test_client_postgresjs",
    "test_psql_client", "test_superset", "test_client_pgadmin",
    "test_direct_tls",  # openssl (the certificate), pgjdbc, psql on PostgreSQL 17's libpq
}
_CLIENT_TESTS = {
    "test_auth_tls_cancel": {  # psql; the TLS tests also openssl
        "test_scram_md5_and_stored_verifier_logins_work_with_psql",
        "test_wrong_password_fails_the_same_way_for_every_method_and_unknown_users",
        "test_tls_is_negotiated_when_the_policy_has_a_certificate",
        "test_tls_required_refuses_plaintext_clients",
        "test_without_tls_ssl_is_refused_with_n",
    },
    "test_cli": {"test_serve_answers_in_front_of_a_postgres_given_by_dsn",
                 "test_demo_contract_ctrl_c_and_restart_after_a_crash"},
    "test_container": {"test_compose_file_is_valid_for_the_compose_cli"},
    "test_doc_examples": {"test_doc_example_has_its_documented_outcome_through_psql"},
    "test_copy": {"test_psql_copies_a_dp_aggregate_to_a_local_file",
                  "test_psql_copy_of_a_table_is_refused_and_psql_leaves_its_empty_file"},
    "test_policy_view": {"test_psql_shows_the_policy_columns"},
    "test_readme_session": {"test_readme_session_reproduces_through_dpproxy_with_the_demo_policy"},
    "test_startup_errors": {"test_tls_files_that_cannot_be_loaded"},  # openssl
    "test_attack_stop38_protocol": {  # openssl (the certificate)
        "test_openssl_never_takes_an_alpn_offer_the_reader_did_not_read_as_offered",
        "test_what_is_no_client_hello_is_closed_with_a_log_line_and_no_plaintext_answer",
        "test_a_client_that_stops_in_its_handshake_is_closed_at_the_startup_timeout",
        "test_tls_required_gives_no_session_to_a_startup_in_clear_after_any_request",
        "test_requests_inside_direct_tls_keep_the_session_in_tls_and_are_counted",
    },
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.stem
        name = getattr(item, "originalname", item.name)
        if "pg15_db" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.pg15)  # Debian's PostgreSQL 15 is a system package too
        if {"pg17_db", "pg18_db", "newer_pg_db"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.pg_versions)  # installed with npm, a system package
        if (module in _CLIENT_MODULES or name in _CLIENT_TESTS.get(module, ()) or item.get_closest_marker("pg15")
                or item.get_closest_marker("pg_versions")):
            item.add_marker(pytest.mark.clients)
