"""Budget faults with real `dpproxy serve` processes: a reload lowering a budget under load,
two replicas on one ledger near exhaustion, and a ledger that becomes unreachable.

After each, the books reconcile: the ledger's spend is the sum of the charges of the
answers returned, and so is the audit log's ε sum.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from conftest import TEST_POLICY, TestDatabase
from policies.ledger import Budget, Ledger
from test_cli import _start_serving

QUERY = "SELECT COUNT(*) FROM adult WHERE age > {i}"  # ε = 1 each (the table's ε), δ = 0


def _policy(test_db: TestDatabase, tmp_path: Path, epsilon: float, ledger: str | None = None,
            extra_ledger: str = "") -> str:
    """The test policy plus a user ``tight`` with ``epsilon``, an audit file, and ``ledger``."""
    url = ledger or f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    text = TEST_POLICY.replace(
        "users:\n",
        f"audit: {{{{path: \"{tmp_path / 'audit.jsonl'}\"}}}}\n"
        f"users:\n  tight:\n    password: tight\n    budget: {{{{epsilon: {epsilon}, delta: 0.001}}}}\n",
    ).replace('ledger: {{url: "sqlite:///{ledger}"}}', f'ledger: {{{{url: "{url}"{extra_ledger}}}}}')
    return text.format(dsn=test_db.service_dsn)


class Replica:
    """A `dpproxy serve` process; its output is read on a thread so that it never blocks."""

    def __init__(self, config: Path):
        self.process, self.port = _start_serving(config)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                if text in self.lines.get(timeout=left):
                    return
            except queue.Empty:
                break
        raise AssertionError(f"dpproxy did not log {text!r} within {timeout} s")

    def query(self, sql: str) -> str:
        """``sql`` on a new session as ``tight``: "ok" or the SQLSTATE."""
        dsn = f"host=127.0.0.1 port={self.port} dbname=dpproxy_test user=tight password=tight connect_timeout=10"
        with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
            try:
                conn.execute(sql).fetchall()
                return "ok"
            except psycopg.Error as exc:
                return exc.diag.sqlstate or "?"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@pytest.fixture
def replicas() -> Iterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        replica.stop()


def _ledger_spent(url: str, epsilon: float) -> float:
    with Ledger.from_url(url) as ledger:
        return ledger.balance("tight", Budget(epsilon, 0.001)).spent_epsilon


def _audit_epsilon(path: Path) -> float:
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sum(line.get("epsilon") or 0.0 for line in lines if line.get("user") == "tight")


def test_a_reload_lowering_a_budget_stops_answers_at_the_new_limit_under_load(
    test_db: TestDatabase, tmp_path: Path, replicas: list[Replica]
) -> None:
    config = tmp_path / "policy.yaml"
    config.write_text(_policy(test_db, tmp_path, 1000))
    replica = Replica(config)
    replicas.append(replica)
    assert replica.query(QUERY.format(i=0)) == "ok"  # spends 1, reserves 9 more in the ledger
    config.write_text(_policy(test_db, tmp_path, 3))
    replica.process.send_signal(signal.SIGHUP)
    replica.wait_for("reloaded")
    with ThreadPoolExecutor(6) as pool:  # six sessions at once, five queries each
        outcomes = list(pool.map(replica.query, [QUERY.format(i=i) for i in range(1, 31)], timeout=120))
    assert outcomes.count("ok") == 2 and outcomes.count("DP002") == 28, outcomes
    # What this process reserved under the limit of 1000 was given back before the answers.
    assert _ledger_spent(f"sqlite:///{tmp_path / 'ledger.sqlite3'}", 3) <= 3.0
    _books_balance(tmp_path, [replica], 3, 3.0)


def _two_replicas(test_db: TestDatabase, tmp_path: Path, replicas: list[Replica], epsilon: float,
                  release_idle_s: float) -> tuple[Replica, Replica]:
    """Two `dpproxy serve` processes on one SQLite ledger, ``tight`` having ``epsilon``."""
    config = tmp_path / "policy.yaml"
    config.write_text(_policy(test_db, tmp_path, epsilon, extra_ledger=f", release_idle_s: {release_idle_s}"))
    a, b = Replica(config), Replica(config)
    replicas.extend([a, b])
    return a, b


def _books_balance(tmp_path: Path, replicas: list[Replica], epsilon: float, answered: float) -> None:
    """After a clean stop: ledger spend = audit ε = the charges of the answers (ε 1 each)."""
    for replica in replicas:
        replica.stop()
    assert _ledger_spent(f"sqlite:///{tmp_path / 'ledger.sqlite3'}", epsilon) == pytest.approx(answered)
    assert _audit_epsilon(tmp_path / "audit.jsonl") == pytest.approx(answered)


def test_a_replica_idle_reservation_comes_back_so_another_replica_can_spend_the_whole_budget(
    test_db: TestDatabase, tmp_path: Path, replicas: list[Replica]
) -> None:
    a, b = _two_replicas(test_db, tmp_path, replicas, 20, release_idle_s=0.5)
    answered = int(a.query(QUERY.format(i=0)) == "ok")  # A reserves 10 (9 left over)
    deadline = time.monotonic() + 30
    i = 1
    while answered < 20 and time.monotonic() < deadline:
        outcome = b.query(QUERY.format(i=i))  # the rest of the budget, all through B
        i += 1
        if outcome == "ok":
            answered += 1
        else:
            assert outcome == "DP002", outcome
            time.sleep(0.2)  # A's reservation is given back once idle for 0.5 s
    assert answered == 20, f"only {answered} of 20 ε spendable through B"
    assert [a.query(QUERY.format(i=99)), b.query(QUERY.format(i=99))] == ["DP002", "DP002"]  # never more
    _books_balance(tmp_path, [a, b], 20, 20.0)


def test_near_exhaustion_a_first_query_on_one_replica_holds_nothing_back_from_another(
    test_db: TestDatabase, tmp_path: Path, replicas: list[Replica]
) -> None:
    # release_idle_s at its maximum: what B can spend here owes nothing to A giving back.
    a, b = _two_replicas(test_db, tmp_path, replicas, 10, release_idle_s=3600)
    assert a.query(QUERY.format(i=0)) == "ok"
    outcomes = [b.query(QUERY.format(i=i)) for i in range(1, 11)]
    assert outcomes == ["ok"] * 9 + ["DP002"], outcomes
    _books_balance(tmp_path, [a, b], 10, 10.0)


def test_an_unreachable_ledger_refuses_with_dp005_answers_nothing_uncharged_and_recovers(
    test_db: TestDatabase, tmp_path: Path, replicas: list[Replica]
) -> None:
    role = "h3_ledger_fault"
    with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA IF EXISTS {role} CASCADE")
        admin.execute(f"DROP ROLE IF EXISTS {role}")
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{role}'")
        admin.execute(f"CREATE SCHEMA {role} AUTHORIZATION {role}")
    admin = urlsplit(test_db.admin_dsn)  # the same server and database, as the ledger's own role
    url = urlunsplit(admin._replace(scheme="postgresql+psycopg", netloc=f"{role}:{role}@{admin.netloc.split('@')[-1]}"))
    config = tmp_path / "policy.yaml"
    config.write_text(_policy(test_db, tmp_path, 1000, ledger=url, extra_ledger=f", schema: {role}, reserve: 1"))
    replica = Replica(config)
    replicas.append(replica)
    try:
        assert replica.query(QUERY.format(i=0)) == "ok"
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:  # the ledger goes away
            admin.execute(f"ALTER ROLE {role} NOLOGIN")
            admin.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
        during = [replica.query(QUERY.format(i=i)) for i in range(1, 4)]
        assert during == ["DP005"] * 3
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:  # and comes back
            admin.execute(f"ALTER ROLE {role} LOGIN")
        assert [replica.query(QUERY.format(i=i)) for i in range(4, 6)] == ["ok", "ok"]
        replica.stop()
        with Ledger(url, role) as ledger:
            assert ledger.balance("tight", Budget(1000, 0.001)).spent_epsilon == pytest.approx(3.0)
        assert _audit_epsilon(tmp_path / "audit.jsonl") == pytest.approx(3.0)
    finally:
        replica.stop()
        with psycopg.connect(test_db.admin_dsn, autocommit=True) as admin:
            admin.execute(f"ALTER ROLE {role} LOGIN")
            admin.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'")
            admin.execute(f"DROP SCHEMA IF EXISTS {role} CASCADE")
            admin.execute(f"DROP ROLE IF EXISTS {role}")
