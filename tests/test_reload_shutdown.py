"""A running ``dpproxy serve``: SIGHUP reloads the policy, SIGTERM shuts down gracefully."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from conftest import TEST_POLICY, TestDatabase
from test_cli import _listening_port

# Catalog statements pass through dpproxy; these keep the backend busy for a while.
SLOW_QUERY = "SELECT count(*) FROM generate_series(1, 10000) a, generate_series(1, 10000) b"  # ~1-3 s
ENDLESS_QUERY = "SELECT count(*) FROM pg_attribute a, pg_attribute b, pg_attribute c"  # hours
COUNT = "SELECT COUNT(*) FROM adult WHERE age > 40"


class Served:
    """``dpproxy serve -c config --port 0`` in a subprocess, its log in a file."""

    def __init__(self, config: Path, log: Path):
        self.config, self.log = config, log
        with open(log, "w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "proxy.cli", "serve", "-c", str(config), "--port", "0"],
                stdout=out, stderr=subprocess.STDOUT,
            )
        self.port = _listening_port(self.wait_for("listening on"))

    def text(self) -> str:
        return self.log.read_text(encoding="utf-8")

    def wait_for(self, needle: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in (text := self.text()):
                return text
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{needle!r} not in the log:\n{self.text()}")

    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} dbname=dpproxy_test user=analyst password=analyst"

    def connect(self, notices: list[str] | None = None) -> psycopg.Connection:
        conn = psycopg.connect(self.dsn(), autocommit=True)
        if notices is not None:
            conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        return conn

    def signal(self, sig: signal.Signals) -> None:
        self.process.send_signal(sig)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def _policy(test_db: TestDatabase, tmp_path: Path, text: str = TEST_POLICY) -> str:
    return text.format(dsn=test_db.service_dsn, ledger=tmp_path / "ledger.sqlite3")


@pytest.fixture
def served(test_db: TestDatabase, tmp_path: Path) -> Iterator[Served]:
    config = tmp_path / "policy.yaml"
    config.write_text(_policy(test_db, tmp_path, TEST_POLICY.replace(
        "listen: {{host: 127.0.0.1, port: 0}}", "listen: {{host: 127.0.0.1, port: 0, shutdown_grace_s: 20}}"
    )))
    running = Served(config, tmp_path / "dpproxy.log")
    yield running
    running.stop()


def _reload(served: Served, text: str, outcome: str) -> str:
    """Write ``text`` as the policy, send SIGHUP, and wait for the reload's outcome in the log."""
    before = served.text().count(outcome)
    served.config.write_text(text)
    served.signal(signal.SIGHUP)
    deadline = time.monotonic() + 30
    while served.text().count(outcome) == before:
        assert time.monotonic() < deadline, served.text()
        time.sleep(0.05)
    return served.text()


def test_sighup_with_a_broken_policy_keeps_the_old_one_and_logs_why(served: Served, test_db, tmp_path: Path):
    valid = served.config.read_text()
    notices: list[str] = []
    with served.connect(notices) as conn:
        broken = valid.replace("    epsilon: 1.0\n    delta: 1.0e-6", "    epsilon: -1\n    delta: 1.0e-6")
        log = _reload(served, broken, "was not reloaded")
        assert f"reload refused: {served.config}:" in log and "tables.public.adult.epsilon" in log

        misfit = valid.replace("hours_per_week: {bounds", "hours_per_wek: {bounds")
        log = _reload(served, misfit, "was not reloaded")
        assert "tables.public.adult.columns.hours_per_wek: no such column on the backend" in log

        conn.execute(COUNT)  # the open connection is still served, under the old policy
    assert notices and "ε charged 1," in notices[-1]
    with served.connect() as conn:  # and new ones are accepted
        assert conn.execute(COUNT).fetchone()[0] > 10000
    assert served.process.poll() is None


def test_sighup_puts_a_new_epsilon_in_force_on_an_open_connection(served: Served):
    notices: list[str] = []
    with served.connect(notices) as conn:
        conn.execute(COUNT)
        conn.execute(COUNT + " AND sex = 'Female'", prepare=True)  # a prepared statement, planned now
        assert all("ε charged 1," in notice for notice in notices[-2:])

        lowered = served.config.read_text().replace("    epsilon: 1.0\n    delta: 1.0e-6", "    epsilon: 0.25\n    delta: 1.0e-6")
        assert "epsilon: 0.25" in lowered
        _reload(served, lowered, "reloaded: ")

        conn.execute(COUNT)
        assert "ε charged 0.25," in notices[-1]
        conn.execute(COUNT + " AND sex = 'Female'", prepare=True)
        assert "ε charged 0.25," in notices[-1]


def test_sighup_with_new_bounds_releases_an_avg_on_the_new_bounds_grid_and_centre(served: Served):
    # AVG(age) is a noisy sum and count centred on the bounds' midpoint; the grid, the centre and
    # the sensitivity are kept per bounds (mechanisms.sum_count). Kept under the old bounds, the
    # centred sum (Σx − n·53.5) would be read around the new centre 100 and answer ~85.
    avg = "SELECT AVG(age) FROM adult"
    with served.connect() as conn:
        before = float(conn.execute(avg).fetchone()[0])
        widened = served.config.read_text().replace("age: {bounds: [17, 90]}", "age: {bounds: [0, 200]}")
        assert "age: {bounds: [0, 200]}" in widened
        _reload(served, widened, "reloaded: ")
        after = float(conn.execute(avg).fetchone()[0])
    assert abs(after - before) < 1.0, (before, after)  # both within the noise of the true mean (~38.6)


def test_sighup_ends_the_sessions_of_a_user_the_new_policy_drops(served: Served):
    plain = psycopg.connect(served.dsn().replace("user=analyst password=analyst", "user=plain password=plain"),
                            autocommit=True)
    with plain, served.connect() as analyst:
        plain.execute("SELECT 1")
        text = served.config.read_text()
        start = text.index("  plain:\n")
        dropped = text[:start] + text[text.index("tables:\n"):]
        _reload(served, dropped, "reloaded: ")
        with pytest.raises(psycopg.OperationalError):
            plain.execute("SELECT 1")
        assert analyst.execute("SELECT 1").fetchone() == (1,)


def _run_in_thread(served: Served, sql: str) -> tuple[threading.Thread, dict[str, object]]:
    """Run ``sql`` on a new connection in a thread; the outcome lands in the returned dict."""
    outcome: dict[str, object] = {}
    connected = threading.Event()

    def run() -> None:
        try:
            with served.connect() as conn:
                connected.set()
                outcome["result"] = conn.execute(sql).fetchone()
                try:
                    conn.execute("SELECT 1")
                except psycopg.Error as exc:
                    outcome["next"] = exc
        except psycopg.Error as exc:
            outcome["error"] = exc
        finally:
            connected.set()

    thread = threading.Thread(target=run)
    thread.start()
    assert connected.wait(30)
    time.sleep(0.5)  # the statement is now running on the backend
    return thread, outcome


def _connection_refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def test_sigterm_lets_a_running_statement_finish_then_exits(served: Served):
    idle = served.connect()
    thread, outcome = _run_in_thread(served, SLOW_QUERY)
    started = time.monotonic()
    served.signal(signal.SIGTERM)
    served.wait_for("shutting down")
    assert _connection_refused(served.port)
    thread.join(30)
    assert outcome.get("result") == (10000 * 10000,), outcome
    next_error = outcome["next"]
    assert isinstance(next_error, psycopg.Error) and (next_error.sqlstate in (None, "57P01"))
    assert served.process.wait(timeout=20) == 0
    assert time.monotonic() - started < 20
    with pytest.raises(psycopg.OperationalError):
        idle.execute("SELECT 1")  # an idle session was ended at once
    idle.close()


def test_sigterm_cancels_a_statement_that_outlasts_the_grace_period(test_db: TestDatabase, tmp_path: Path):
    config = tmp_path / "policy.yaml"
    config.write_text(_policy(test_db, tmp_path, TEST_POLICY.replace(
        "listen: {{host: 127.0.0.1, port: 0}}", "listen: {{host: 127.0.0.1, port: 0, shutdown_grace_s: 1}}"
    )))
    served = Served(config, tmp_path / "dpproxy.log")
    try:
        thread, outcome = _run_in_thread(served, ENDLESS_QUERY)
        started = time.monotonic()
        served.signal(signal.SIGTERM)
        assert served.process.wait(timeout=15) == 0
        assert time.monotonic() - started < 1 + 8
        thread.join(15)
        error = outcome.get("error")
        assert isinstance(error, psycopg.Error), outcome
        assert error.sqlstate in ("57P01", "57014", None), error  # None: the FATAL closed the socket first
        assert "grace period over: cancelling 1 running statements" in served.text()
    finally:
        served.stop()
