"""Fault injection: the backend restarts or drops connections under open sessions.

Each test runs a real dpproxy in front of its own PostgreSQL (restarting the suite's shared
one would disturb other tests) and asserts: every client call returns within a bound; a
session whose statement or transaction was running on a backend connection when it was lost
ends with FATAL 57P01 or 08006, and a new one works; a session idle at the time holds no
backend connection (they are pooled, proxy/backend/pool.py) and goes on; a DP query that
never reached the backend is not charged, one that did stays charged; and afterwards the
budget keeper, the audit log, the ε metric and the ledger agree.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

import psycopg
import pytest
from conftest import RunningProxy
from own_postgres import own_postgres
from post_charge_wait import create_gated, hold_gate, waiting_at_gate
from reconcile import assert_reconciled, audit_lines, charged_metric, spend_while_running

from policies.loader import parse_policy
from proxy.backend.connection import BackendLost, connect
from proxy.demo.embedded import SERVICE_ROLE
from proxy.serving.event_loop import run

T = TypeVar("T")

BOUND_S = 20.0  # no client call may take longer
LOST = {"57P01", "08006"}
# ``people`` is a view behind the gate (tests/post_charge_wait.py): a run on it waits there,
# after its charge, while ``lock_after_the_charge`` holds the gate.
QUERY = "SELECT COUNT(*) FROM people WHERE age > 30"

POLICY = """
backend:
  dsn: "{dsn}"
  statement_timeout_ms: {timeout_ms}
  connect_timeout_s: 5
listen: {{host: 127.0.0.1, port: 0}}
ledger: {{url: "sqlite:///{ledger}", reserve: 10}}
audit: {{path: "{audit}"}}
repeats: {{enabled: false}}
users:
  {user}:
    password: secret
    budget: {{epsilon: 1000000, delta: 0.5}}
tables:
  public.people:
    access: protected
    epsilon: 1.0
    columns:
      age: {{bounds: [0, 100]}}
      amount: {{bounds: [0, 100]}}
"""


@dataclass(frozen=True)
class OwnPostgres:
    """A PostgreSQL for this module only, which the tests may restart."""

    data: Path
    system_user: str | None
    admin_dsn: str
    service_dsn: str

    def restart(self) -> None:
        from pgserver._commands import pg_ctl  # type: ignore[attr-defined]

        pg_ctl(["-w", "-m", "fast", "-l", str(self.data / "log"), "restart"], pgdata=self.data,
               user=self.system_user, timeout=60)

    def admin(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.admin_dsn, autocommit=True, connect_timeout=10)

    def terminate_service_backends(self) -> int:
        with self.admin() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (SERVICE_ROLE,)
            ).fetchall()
        return len(rows)


@pytest.fixture(scope="module")
def own_pg() -> Iterator[OwnPostgres]:
    with own_postgres("faults", "dpproxy-fault-pg-") as server:
        with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
            create_gated(conn, "people", SERVICE_ROLE)
        yield OwnPostgres(server.data, server.system_user, server.admin_dsn, server.service_dsn)


@dataclass
class Setup:
    proxy: RunningProxy
    audit: Path
    user: str
    metric_before: float

    def connect(self, **kwargs: Any) -> psycopg.Connection[Any]:
        dsn = f"host={self.proxy.host} port={self.proxy.port} dbname=faults user={self.user} password=secret"
        return bounded(lambda: psycopg.connect(dsn, autocommit=True, prepare_threshold=None,
                                               connect_timeout=10, **kwargs))

    def spent(self) -> float:
        return spend_while_running(self.proxy, self.user).keeper


_users = iter(range(1_000_000))


@pytest.fixture
def setup(own_pg: OwnPostgres, tmp_path: Path) -> Iterator[Setup]:
    yield from _setup(own_pg, tmp_path, 20000)


def _setup(own_pg: OwnPostgres, tmp_path: Path, timeout_ms: int) -> Iterator[Setup]:
    user = f"fault{next(_users)}"  # the metric is per process: a fresh label per test
    audit = tmp_path / "audit.jsonl"
    text = POLICY.format(dsn=own_pg.service_dsn, timeout_ms=timeout_ms, ledger=tmp_path / "ledger.sqlite3",
                         audit=audit, user=user)
    proxy = RunningProxy(parse_policy(text, "faults.yaml"))
    state = Setup(proxy, audit, user, charged_metric(user))
    try:
        yield state
    finally:
        if proxy.loop.is_running():
            proxy.stop()


def bounded(call: Callable[[], T], timeout_s: float = BOUND_S) -> T:
    """``call()``'s result or exception, failing the test if it has not returned in ``timeout_s``."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the test thread
            outcome.append((False, exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        pytest.fail(f"a client call hung for more than {timeout_s} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def query(conn: psycopg.Connection[Any], sql: str = QUERY) -> Any:
    return bounded(lambda: conn.execute(sql).fetchone())


def assert_ended_with_lost_backend(conn: psycopg.Connection[Any]) -> None:
    """The next DP query fails with FATAL 57P01/08006, naming no path or port, and ends the session."""
    with pytest.raises(psycopg.OperationalError) as raised:
        query(conn)
    assert raised.value.sqlstate in LOST, raised.value
    assert "port" not in str(raised.value) and "/" not in str(raised.value)
    assert bounded(lambda: conn.closed) or bounded(lambda: conn.info.status) == psycopg.pq.ConnStatus.BAD


def wait_until(condition: Callable[[], bool], timeout_s: float = BOUND_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail("condition not reached in time")
        time.sleep(0.05)


def test_backend_restart_leaves_idle_sessions_working_and_charges_nothing_unanswered(
    setup: Setup, own_pg: OwnPostgres
) -> None:
    """Before the pool, each session kept its backend connection and a restart ended every
    session that had queried. Now idle sessions hold none: they go on, on new connections."""
    connected = [setup.connect() for _ in range(6)]  # each has used a pooled connection
    for conn in connected:
        query(conn)
    lazy = [setup.connect() for _ in range(2)]  # none used yet
    spent = setup.spent()
    assert spent == pytest.approx(6.0)

    own_pg.restart()
    time.sleep(0.5)  # the proxy's loop sees the closed sockets

    for conn in connected + lazy:  # idle at the restart: the lost pooled connections are skipped
        assert query(conn) is not None
    assert setup.spent() == pytest.approx(spent + 8), "only answered queries are charged"
    with setup.connect() as fresh:
        assert query(fresh) is not None
    for conn in connected + lazy:
        conn.close()
    assert assert_reconciled(setup.proxy, setup.audit, setup.user, setup.metric_before) == pytest.approx(spent + 9)


def test_backend_restart_mid_query_charges_the_reached_query_once_and_ends_only_that_session(
    setup: Setup, own_pg: OwnPostgres
) -> None:
    admin = own_pg.admin()  # not a context manager: the restart ends it, mid-transaction
    with setup.connect() as conn, setup.connect() as idle:
        query(conn)
        query(idle)
        outcome_of = query_while_locked(admin, conn)  # the DP query waits for the lock: mid-query
        own_pg.restart()  # ends the admin's lock too
        outcome = outcome_of()
        assert isinstance(outcome, psycopg.OperationalError) and outcome.sqlstate in LOST, outcome
        time.sleep(0.3)
        assert query(idle) is not None  # idle at the restart: it held no backend connection
        assert setup.spent() == pytest.approx(4.0), "the query that reached the backend stays charged, once"
    admin.close()
    lines = audit_lines(setup.audit, setup.user, at_least=4)
    assert [line["epsilon"] for line in lines if line["decision"] == "error"] == [1.0]
    assert assert_reconciled(setup.proxy, setup.audit, setup.user, setup.metric_before) == pytest.approx(4.0)


def test_terminated_backends_between_queries_leave_the_sessions_working(setup: Setup, own_pg: OwnPostgres) -> None:
    conns = [setup.connect() for _ in range(4)]
    for conn in conns:
        query(conn)
    assert own_pg.terminate_service_backends() >= 1  # the pool's idle connections
    time.sleep(0.3)
    for conn in conns:
        assert query(conn) is not None
        conn.close()
    assert setup.spent() == pytest.approx(8.0)
    with setup.connect() as fresh:
        assert query(fresh) is not None
    assert assert_reconciled(setup.proxy, setup.audit, setup.user, setup.metric_before) == pytest.approx(9.0)


def test_terminated_backend_in_a_transaction_ends_that_session(setup: Setup, own_pg: OwnPostgres) -> None:
    """A session inside a transaction block holds its connection; losing it loses the
    transaction, so the session ends (57P01/08006), as on PostgreSQL."""
    with setup.connect() as conn, setup.connect() as other:
        bounded(lambda: conn.execute("BEGIN"))
        query(conn)
        query(other)
        assert own_pg.terminate_service_backends() >= 1
        time.sleep(0.3)
        assert_ended_with_lost_backend(conn)
        assert query(other) is not None


def test_a_block_whose_backend_ended_while_dpproxy_was_busy_is_not_charged_for_the_next_query(
        setup: Setup, own_pg: OwnPostgres) -> None:
    """The backend's last words (its FATAL, then the end of the stream) can be read by the event
    loop in two turns: the FATAL was read in one, the next DP query of the block arrived in the
    same one and found the connection still "OK", was charged, and then met the lost backend (seen
    on a standby whose recovery conflict ended the backend, on a loaded machine). Here the loop is
    held busy while the backend is terminated and the query arrives, so both come in one turn."""
    with setup.connect() as conn:
        bounded(lambda: conn.execute("BEGIN"))
        query(conn)
        before = setup.spent()
        released = threading.Event()
        setup.proxy.loop.call_soon_threadsafe(released.wait, BOUND_S)  # the loop, busy
        try:
            assert own_pg.terminate_service_backends() == 1
            with own_pg.admin() as admin:  # gone, its FATAL and its close sent
                wait_until(lambda: admin.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s",
                                                 (SERVICE_ROLE,)).fetchone() == (0,))
            outcome: list[BaseException | None] = []
            sender = threading.Thread(target=lambda: outcome.append(_raised(lambda: conn.execute(QUERY))))
            sender.start()
            time.sleep(0.2)  # the query in dpproxy's socket (the loop cannot take it yet)
        finally:
            released.set()
        sender.join(BOUND_S)
        assert outcome and isinstance(outcome[0], psycopg.OperationalError) and outcome[0].sqlstate in LOST, outcome
    assert setup.spent() == before


def _raised(call: Callable[[], object]) -> BaseException | None:
    try:
        call()
    except BaseException as exc:  # handed to the test thread
        return exc
    return None


def test_terminated_backend_mid_query_stays_charged_and_is_audited_with_its_epsilon(
    setup: Setup, own_pg: OwnPostgres
) -> None:
    with own_pg.admin() as admin, setup.connect() as conn:
        outcome_of = query_while_locked(admin, conn)  # the DP query waits for the lock: mid-query
        with own_pg.admin() as killer:
            killer.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE usename = %s AND wait_event_type = 'Lock'", (SERVICE_ROLE,))
        outcome = outcome_of()
        admin.execute("ROLLBACK")
        assert isinstance(outcome, psycopg.OperationalError) and outcome.sqlstate in LOST, outcome
    (line,) = audit_lines(setup.audit, setup.user, at_least=1)
    assert line["decision"] == "error" and line["reason"] == outcome.sqlstate and line["epsilon"] == 1.0
    assert assert_reconciled(setup.proxy, setup.audit, setup.user, setup.metric_before) == pytest.approx(1.0)


@pytest.fixture
def short_timeout(own_pg: OwnPostgres, tmp_path: Path) -> Iterator[Setup]:
    yield from _setup(own_pg, tmp_path, 300)


def test_dp_query_failing_after_its_charge_is_audited_and_counted_with_its_epsilon(
    short_timeout: Setup, own_pg: OwnPostgres
) -> None:
    setup = short_timeout
    with own_pg.admin() as admin, setup.connect() as conn:
        query(conn)
        lock_after_the_charge(admin)  # the next one runs into statement_timeout, charged
        with pytest.raises(psycopg.Error) as raised:
            query(conn)
        admin.execute("ROLLBACK")
        assert raised.value.sqlstate == "57014"
        query(conn)
    lines = audit_lines(setup.audit, setup.user, at_least=3)
    assert [(line["decision"], line["reason"], line["epsilon"]) for line in lines] == [
        ("dp", None, 1.0), ("error", "57014", 1.0), ("dp", None, 1.0)
    ]
    assert assert_reconciled(setup.proxy, setup.audit, setup.user, setup.metric_before) == pytest.approx(3.0)


def test_refused_backend_connection_names_no_host_port_role_or_path(setup: Setup, own_pg: OwnPostgres) -> None:
    with setup.connect() as conn:
        query(conn)  # the proxy now knows this startup's parameters: later sessions connect lazily
    with own_pg.admin() as admin:
        admin.execute(f"ALTER ROLE {SERVICE_ROLE} CONNECTION LIMIT 0")
    own_pg.terminate_service_backends()  # the pool's idle connection: the next one is refused
    time.sleep(0.3)
    try:
        with setup.connect() as lazy:  # the refusal comes at its first statement
            with pytest.raises(psycopg.Error) as at_statement:
                query(lazy)
        with pytest.raises(psycopg.OperationalError) as at_startup:  # a new startup: connects at once
            setup.connect(client_encoding="LATIN1")
    finally:
        with own_pg.admin() as admin:
            admin.execute(f"ALTER ROLE {SERVICE_ROLE} CONNECTION LIMIT -1")
    assert at_statement.value.sqlstate == "53300", at_statement.value
    # libpq prefixes a refused startup with the address the client dialled (dpproxy's own).
    told_at_startup = str(at_startup.value).split("FATAL:", 1)[1]
    assert "too many connections" in told_at_startup
    host = urlparse(own_pg.admin_dsn).query
    for text in (str(at_statement.value), told_at_startup):
        for secret in (SERVICE_ROLE, "port", "/", str(own_pg.data), host.rpartition("=")[2]):
            assert secret not in text, f"{secret!r} reached the analyst: {text}"
    assert spend_while_running(setup.proxy, setup.user).keeper == pytest.approx(1.0)


def lock_after_the_charge(admin: psycopg.Connection[Any]) -> None:
    """In ``admin``'s new transaction, hold the gate, which a DP query on ``people`` meets only
    after its charge (``post_charge_wait``; a lock on the table or its indexes is waited for
    before the charge, uncharged: ``tests/test_lock_wait_before_charge.py``)."""
    hold_gate(admin)


def query_while_locked(admin: psycopg.Connection[Any], conn: psycopg.Connection[Any]) -> Callable[[], Any]:
    """Hold a lock in ``admin``'s new transaction (``lock_after_the_charge``), start a DP query on
    ``conn`` in a thread and return once it waits for the lock, charged; the function returned
    gives the query's result or exception, failing the test if it does not come within the bound."""
    lock_after_the_charge(admin)
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(conn.execute(QUERY).fetchone())
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    wait_until(lambda: bool(waiting_at_gate(admin, role=SERVICE_ROLE)) or bool(outcome))
    assert not outcome, f"the DP query ended without waiting at the gate: {outcome}"

    def result() -> Any:
        worker.join(BOUND_S)
        if not outcome:
            pytest.fail("a session running a DP query through the fault hung")
        return outcome[0]

    return result


def test_connection_lost_during_dpproxys_own_query_never_steals_the_socket_of_the_next_connection(
    own_pg: OwnPostgres, tmp_path: Path
) -> None:
    """libpq closes a lost connection's socket, and the next connection gets its number: the
    lost one's waiter must not watch that number again (that left other sessions hung)."""
    text = POLICY.format(dsn=own_pg.service_dsn, timeout_ms=20000, ledger=tmp_path / "l.sqlite3",
                         audit=tmp_path / "a.jsonl", user="fault_fd")
    policy = parse_policy(text, "faults.yaml")

    async def scenario() -> None:
        lost = await connect(policy)
        killer = await connect(policy)
        (pid,) = await lost.fetch_row("SELECT pg_backend_pid()")
        await lost.execute("SELECT 1")  # its waiter now watches the socket
        old_fd = lost._held.waiter._fd  # type: ignore[union-attr]
        own_query = asyncio.ensure_future(lost.fetch_all("SELECT pg_sleep(30)"))
        while not await killer.fetch_all(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event = 'PgSleep'", (pid,)
        ):
            await asyncio.sleep(0.02)
        await killer.fetch_all("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(BackendLost):
            await asyncio.wait_for(own_query, BOUND_S)
        await killer.close()
        successor = await connect(policy)
        assert successor._held.waiter._fd == old_fd, "precondition: the socket number is reused"  # type: ignore[union-attr]
        await lost.close()  # the lost session ends (its client left)
        result = await asyncio.wait_for(successor.execute("SELECT 1"), BOUND_S)
        assert result.rows == [[b"1"]]
        await successor.close()

    try:
        run(scenario())
    except TimeoutError:
        pytest.fail("the next connection's statement hung: its socket was unwatched by a lost one")


def test_shutdown_mid_query_audits_and_counts_the_charge_of_the_cut_off_query(
    setup: Setup, own_pg: OwnPostgres
) -> None:
    with own_pg.admin() as admin, setup.connect() as conn:
        query(conn)
        outcome_of = query_while_locked(admin, conn)  # the DP query waits for the lock: mid-query
        running = spend_while_running(setup.proxy, setup.user)  # the waiting query is charged already
        assert running.keeper == pytest.approx(2.0)
        bounded(setup.proxy.stop)  # no grace: the running statement is cut off
        outcome = outcome_of()
        admin.execute("ROLLBACK")
        # Cancelled on the backend (57014), then the session ends with FATAL 57P01 (Server.close).
        assert isinstance(outcome, psycopg.OperationalError) and outcome.sqlstate in {"57014", "57P01"}, outcome
    lines = audit_lines(setup.audit, setup.user, at_least=2)
    assert [(line["decision"], line["epsilon"]) for line in lines] == [("dp", 1.0), ("error", 1.0)]
    assert assert_reconciled(setup.proxy, setup.audit, setup.user, setup.metric_before, running) == pytest.approx(2.0)


def test_lost_backend_between_syncs_leaves_an_extended_protocol_session_and_its_statements_working(
    setup: Setup, own_pg: OwnPostgres
) -> None:
    conn = setup.connect()
    conn.prepare_threshold = 0  # every statement through Parse/Bind/Execute; psycopg keeps it prepared
    extended = "SELECT COUNT(*) FROM people WHERE age > %s"
    assert bounded(lambda: conn.execute(extended, (30,)).fetchone()) is not None
    assert bounded(lambda: conn.execute(extended, (30,)).fetchone()) is not None  # now a named statement
    assert own_pg.terminate_service_backends() >= 1
    time.sleep(0.3)
    assert bounded(lambda: conn.execute(extended, (31,)).fetchone()) is not None  # the same named statement
    conn.close()
    assert assert_reconciled(setup.proxy, setup.audit, setup.user, setup.metric_before) == pytest.approx(3.0)


def test_backend_restart_under_load_strands_no_session_and_burns_no_budget(setup: Setup, own_pg: OwnPostgres) -> None:
    """Twenty sessions query without pause through a restart: none hangs, each either keeps
    answering or ends with 57P01/08006 and reconnects, and only answers and queries the
    backend was running are charged (not the 5,174 ε of issue 17)."""
    sessions, stop = 20, threading.Event()
    answered: list[int] = [0] * sessions
    lost: list[str] = []
    failures: list[BaseException] = []

    def client(i: int) -> None:
        conn = setup.connect()
        try:
            while not stop.is_set():
                try:
                    query(conn)
                    answered[i] += 1
                except psycopg.OperationalError as exc:
                    if exc.sqlstate == "57P03" and not conn.closed:  # not connected yet; the session stays
                        time.sleep(0.05)
                        continue
                    if exc.sqlstate not in LOST:
                        raise
                    lost.append(exc.sqlstate)
                    conn.close()
                    conn = _reconnect(setup)
        except BaseException as exc:  # reported below, with the hang check's
            failures.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(sessions)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    own_pg.restart()
    time.sleep(1.0)
    stop.set()
    for thread in threads:
        thread.join(BOUND_S)
    assert not any(thread.is_alive() for thread in threads), "a session hung through the restart"
    assert not failures, failures
    assert lost, "the restart ended no session"
    lines = audit_lines(setup.audit, setup.user, at_least=sum(answered))
    charged_failures = [line for line in lines if line["decision"] == "error" and line["epsilon"]]
    assert all(line["reason"] in LOST for line in charged_failures)  # only queries the backend was running
    assert len(charged_failures) <= sessions
    spent = assert_reconciled(setup.proxy, setup.audit, setup.user, setup.metric_before)
    assert spent == pytest.approx(sum(answered) + len(charged_failures))


def _reconnect(setup: Setup) -> psycopg.Connection[Any]:
    """A new session once the backend accepts connections again (it may still be starting)."""
    deadline = time.monotonic() + BOUND_S
    while True:
        try:
            return setup.connect()
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_service_role_refused_by_the_backend_is_not_named_to_the_analyst(
    setup: Setup, own_pg: OwnPostgres, tmp_path: Path
) -> None:
    with setup.connect() as conn:
        query(conn)  # later sessions with these startup settings connect at their first statement
    policy = setup.proxy.server.policy
    ghost = own_pg.service_dsn.replace(f"{SERVICE_ROLE}@", "dpproxy_ghost_role@")
    setup.proxy.server.policy = parse_policy(
        POLICY.format(dsn=ghost, timeout_ms=20000, ledger=tmp_path / "ledger.sqlite3", audit=setup.audit,
                      user=setup.user),
        "faults.yaml",
    )
    try:
        with setup.connect() as conn, pytest.raises(psycopg.Error) as raised:
            query(conn)
    finally:
        setup.proxy.server.policy = policy
    assert raised.value.sqlstate == "08006", raised.value
    assert "dpproxy_ghost_role" not in str(raised.value) and "/" not in str(raised.value)
    assert "could not connect to the backend database" in str(raised.value)


def test_dp_query_cancelled_by_its_client_stays_charged_and_reconciles(setup: Setup, own_pg: OwnPostgres) -> None:
    with own_pg.admin() as admin, setup.connect() as conn:
        outcome_of = query_while_locked(admin, conn)
        bounded(conn.cancel_safe)  # a CancelRequest, as psql's Ctrl-C sends
        outcome = outcome_of()
        admin.execute("ROLLBACK")
        assert isinstance(outcome, psycopg.errors.QueryCanceled), outcome
        assert query(conn) is not None  # the session goes on
    lines = audit_lines(setup.audit, setup.user, at_least=2)
    assert [(line["decision"], line["reason"], line["epsilon"]) for line in lines] == [
        ("error", "57014", 1.0), ("dp", None, 1.0)
    ]
    assert assert_reconciled(setup.proxy, setup.audit, setup.user, setup.metric_before) == pytest.approx(2.0)
