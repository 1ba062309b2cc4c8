"""listen.workers: several serving processes on one port, sharing ledger, repeats, cancels and metrics."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from conftest import TEST_POLICY, TestDatabase
from proxy.dp.repeats import SharedRepeatCache
from proxy.serving.workers import MAX_WORKERS, session_pid, worker_of
from test_cli import _listening_port
from wire import assert_cancel_stops_a_slow_query

POLICY = (
    TEST_POLICY
    .replace("listen: {{host: 127.0.0.1, port: 0}}", "listen: {{host: 127.0.0.1, port: {port}, workers: 2}}\n"
             "metrics: {{host: 127.0.0.1, port: 0}}")
    .replace('ledger: {{url: "sqlite:///{ledger}"}}', 'ledger: {{url: "sqlite:///{ledger}", reserve: 1}}')
    .replace("repeats: {{enabled: false}}", 'repeats: {{enabled: true}}\naudit: {{path: "{audit}"}}')
    .replace("users:\n", "users:\n  tight:\n    password: tight\n    budget: {{epsilon: 5, delta: 0.001}}\n")
)


class Group:
    """A ``dpproxy serve --port-file`` with two workers; its output is collected as it comes.

    ``port``: the one its workers share, from the port file; ``metrics_port``: where the
    supervisor serves /metrics, if the policy asks for it (its log line tells).
    """

    def __init__(self, config: Path):
        self.config, self.port_file = config, config.parent / "dpproxy.port"
        self.process = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "-c", str(config),
                                         "--port-file", str(self.port_file)],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            self.wait_for("with 2 workers")
            deadline = time.monotonic() + 30
            while not self.port_file.exists():  # written just after that line
                assert time.monotonic() < deadline and self.process.poll() is None, self.output()
                time.sleep(0.01)
        except BaseException:
            self.stop()  # a group that did not start is nobody's to stop later
            raise
        self.port = int(self.port_file.read_text())
        metrics = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", self.output())
        self.metrics_port = int(metrics.group(1)) if metrics else None

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def wait_for(self, text: str, times: int = 1, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.count(text) < times:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise AssertionError(f"no {text!r} in the output:\n{self.output()}")
            time.sleep(0.05)

    def dsn(self, user: str = "analyst") -> str:
        return f"host=127.0.0.1 port={self.port} dbname=dpproxy_test user={user} password={user}"

    def connect(self, user: str = "analyst") -> psycopg.Connection:
        return psycopg.connect(self.dsn(user), autocommit=True, prepare_threshold=None)

    def connect_to(self, worker: int, user: str = "analyst") -> psycopg.Connection:
        """A connection the kernel happened to give to ``worker`` (connects until one is)."""
        for _ in range(200):
            conn = self.connect(user)
            if worker_of(conn.info.backend_pid) == worker:
                return conn
            conn.close()
        raise AssertionError(f"200 connections and none reached worker {worker}")

    def workers(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children()

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)


def _write_policy(path: Path, test_db: TestDatabase, epsilon: str = "1.0", port: int = 0) -> None:
    text = POLICY.format(dsn=test_db.service_dsn, ledger=path.parent / "ledger.sqlite3", port=port,
                         audit=path.parent / "audit.jsonl")
    path.write_text(text.replace("epsilon: 1.0\n    delta: 1.0e-6", f"epsilon: {epsilon}\n    delta: 1.0e-6"))


@pytest.fixture(scope="module")
def group(test_db: TestDatabase, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Group]:
    config = tmp_path_factory.mktemp("workers") / "policy.yaml"
    _write_policy(config, test_db)
    running = Group(config)
    try:
        yield running
    finally:
        running.stop()
        print(running.output())


def _noised(conn: psycopg.Connection, sql: str) -> tuple[float, list[str]]:
    notices: list[str] = []
    conn.add_notice_handler(lambda diagnostic: notices.append(diagnostic.message_primary or ""))
    row = conn.execute(sql).fetchone()
    assert row is not None
    return row[0], notices


# ------------------------------------------------------------------ one process's parts


def test_port_0_is_one_port_that_every_worker_serves_and_the_port_file_tells(group: Group):
    # The supervisor binds port 0 once and passes the port it got to every worker.
    assert group.port > 0 and _listening_port(group.output()) == group.port
    assert group.count(f"worker 0 listening on 127.0.0.1:{group.port}\n") >= 1
    assert group.count(f"worker 1 listening on 127.0.0.1:{group.port}\n") >= 1
    with group.connect_to(0) as first, group.connect_to(1) as second:
        assert first.execute("SELECT 1").fetchone() == second.execute("SELECT 1").fetchone() == (1,)


def test_a_session_pid_names_its_worker():
    for worker in (0, 1, MAX_WORKERS - 1):
        pids = {session_pid(worker) for _ in range(100)}
        assert {worker_of(pid) for pid in pids} == {worker}
        assert all(0 < pid < 2**31 for pid in pids) and len(pids) > 90
    assert all(0 < session_pid(None) < 2**31 for _ in range(100))


def test_the_shared_repeat_store_is_one_store_for_every_process(tmp_path: Path):
    path = tmp_path / "repeats.sqlite3"
    first, second = SharedRepeatCache(path, 60, 100), SharedRepeatCache(path, 60, 100)
    key = ("analyst", "SELECT count(*) FROM adult", (b"1", None), (0,), 1.0)
    assert second.get(key) is None
    first.put(key, {"released": 42.5})
    assert second.get(key) == {"released": 42.5}
    second.ttl_s = 0.0
    time.sleep(0.01)
    assert second.get(key) is None  # older than the TTL
    second.enabled = False
    second.put(("other",), 1)
    assert first.get(("other",)) is None
    first.close(), second.close()


def test_the_shared_repeat_store_keeps_at_most_max_entries_newest(tmp_path: Path):
    store: SharedRepeatCache[int] = SharedRepeatCache(tmp_path / "repeats.sqlite3", 60, 10)
    for i in range(SharedRepeatCache._TRIM_EVERY):
        store.put(("query", i), i)
    kept = [i for i in range(SharedRepeatCache._TRIM_EVERY) if store.get(("query", i)) is not None]
    assert kept == list(range(SharedRepeatCache._TRIM_EVERY - 10, SharedRepeatCache._TRIM_EVERY))
    store.close()


def test_the_supervisor_holds_a_port_on_every_interface_as_asyncio_binds_it(test_db: TestDatabase, tmp_path: Path):
    import shutil

    from conftest import make_policy
    from proxy.serving.supervisor import Supervisor

    supervisor = Supervisor(make_policy(test_db, tmp_path / "ledger.sqlite3"), tmp_path / "policy.yaml", "", 0)
    try:
        supervisor._hold_port()
        assert supervisor.port > 0
        with socket.socket() as lone:  # a program without SO_REUSEPORT cannot take it
            with pytest.raises(OSError):
                lone.bind(("127.0.0.1", supervisor.port))
    finally:
        if supervisor._holder is not None:
            supervisor._holder.close()
        shutil.rmtree(supervisor.directory)


def test_more_workers_than_cores_is_worth_a_warning():
    from proxy.serving.supervisor import cores_warning

    assert cores_warning(2, 2) is None and cores_warning(1, 8) is None
    warning = cores_warning(4, 2)
    assert warning is not None and "listen.workers is 4 but dpproxy may use 2 cores" in warning


def test_a_platform_without_so_reuseport_is_told_in_one_line(test_db: TestDatabase, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch):
    import shutil

    from conftest import make_policy
    from proxy.serving.startup import StartupError
    from proxy.serving.supervisor import Supervisor

    monkeypatch.delattr(socket, "SO_REUSEPORT")
    supervisor = Supervisor(make_policy(test_db, tmp_path / "ledger.sqlite3"), tmp_path / "policy.yaml", None, 0)
    try:
        with pytest.raises(StartupError, match="needs SO_REUSEPORT") as raised:
            supervisor._hold_port()
        assert raised.value.key == ("listen", "workers")
    finally:
        shutil.rmtree(supervisor.directory)


# ------------------------------------------------------------------ a running group


def test_both_workers_serve_clients_on_one_port(group: Group):
    seen = set()
    for _ in range(60):
        with group.connect() as conn:
            seen.add(worker_of(conn.info.backend_pid))
            value, notices = _noised(conn, "SELECT COUNT(*) FROM adult WHERE age > 20")
            assert value > 0 and "ε charged" in notices[0]
        if seen == {0, 1}:
            break
    assert seen == {0, 1}
    assert len(group.workers()) == 2


def test_a_cancel_reaches_the_query_whichever_worker_takes_it(group: Group):
    """A CancelRequest lands on any worker; one for a sibling's session is passed on to it."""
    before, tries = group.count("passed on to worker"), 0
    while not 0 < group.count("passed on to worker") - before < tries:  # both paths taken
        tries += 1
        assert tries <= 40, "40 cancels and all landed on the same kind of worker"
        with group.connect() as conn:
            assert_cancel_stops_a_slow_query(conn)  # statement_timeout is 20 s


def test_a_wrong_secret_cancels_nothing_on_either_worker(group: Group):
    import struct

    with group.connect_to(1) as conn:
        pid = conn.info.backend_pid
        for _ in range(20):  # from whichever workers the kernel picks
            with socket.create_connection(("127.0.0.1", group.port), timeout=5) as bogus:
                bogus.sendall(struct.pack("!iiii", 16, 80877102, pid, 12345))
        assert conn.execute("SELECT count(*) FROM pg_attribute a, pg_attribute b LIMIT 1").fetchone()


def test_a_repeat_is_answered_alike_by_either_worker(group: Group):
    sql = "SELECT COUNT(*) FROM adult WHERE age > 37 AND hours_per_week > 12"
    with group.connect_to(0) as first:
        value, notices = _noised(first, sql)
        assert "ε charged 1" in notices[0]
    with group.connect_to(1) as second:
        again, notices = _noised(second, sql)
    assert again == value
    assert "a repeat of an earlier answer" in notices[0]


def test_the_budget_is_one_ledger_for_both_workers(group: Group):
    """`tight` may spend ε 5 at ε 1 a query: five answers in all, whichever worker serves them."""
    answered, refused, workers = 0, 0, set()
    for i in range(8):
        with group.connect_to(i % 2, "tight") as conn:
            workers.add(worker_of(conn.info.backend_pid))
            try:
                conn.execute(f"SELECT COUNT(*) FROM adult WHERE age > {20 + i}")
                answered += 1
            except psycopg.Error as exc:
                assert exc.sqlstate == "DP002", exc
                refused += 1
    assert (answered, refused, workers) == (5, 3, {0, 1})


def test_both_workers_append_whole_lines_to_one_audit_file(group: Group):
    import json

    path = group.config.parent / "audit.jsonl"
    before = len(path.read_text().splitlines())
    held = [group.connect_to(worker) for worker in (0, 1, 0, 1)]
    try:
        threads = [threading.Thread(target=lambda c=conn: [c.execute("SELECT 1") for _ in range(50)])
                   for conn in held]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for conn in held:
            conn.close()
    time.sleep(0.5)  # the audit writers batch lines for 20 ms
    entries = [json.loads(line) for line in path.read_text().splitlines()]  # every line whole
    assert len(entries) - before >= 200


def test_metrics_add_up_over_the_workers(group: Group):
    def scrape() -> dict[str, float]:
        text = urllib.request.urlopen(f"http://127.0.0.1:{group.metrics_port}/metrics", timeout=10).read().decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines() if line and not line.startswith("#")}

    counted = ('dpproxy_statements_total{decision="dp",reason=""}',
               'dpproxy_statement_duration_seconds_count{decision="dp"}',
               'dpproxy_epsilon_charged_total{user="analyst"}')
    first = scrape()
    before = {name: first.get(name, 0.0) for name in counted}
    held = [group.connect_to(0), group.connect_to(1)]
    try:
        for conn in held:
            conn.execute("SELECT COUNT(*) FROM adult WHERE age > 50")
        for _ in range(100):  # each worker applies its observations in batches of 20 ms, each series apart
            after = scrape()
            if all(after.get(name, 0.0) == before[name] + 2 for name in counted[:2]):
                break
            time.sleep(0.1)
        for name in counted[:2]:
            assert after[name] == before[name] + 2, name
        assert after[counted[2]] > before[counted[2]]  # both charges, whatever ε a COUNT costs
        assert after["dpproxy_open_connections"] == 2
        time.sleep(1.2)  # the pool gauges are written every second
        scraped = scrape()
        assert scraped['dpproxy_backend_pool_connections{state="idle"}'] >= 2
        # Process series cannot be summed: each process has its own, labelled.
        for worker in ("supervisor", "0", "1"):
            assert scraped[f'process_resident_memory_bytes{{worker="{worker}"}}'] > 1e6
            assert scraped[f'process_open_fds{{worker="{worker}"}}'] > 0
            assert scraped[f'process_cpu_seconds_total{{worker="{worker}"}}'] > 0
    finally:
        for conn in held:
            conn.close()


def test_sighup_reloads_every_worker(group: Group, test_db: TestDatabase):
    text = group.config.read_text()
    try:
        group.config.write_text(text.replace("epsilon: 1.0\n    delta: 1.0e-6", "epsilon: 0.5\n    delta: 1.0e-6"))
        reloaded = group.count("reloaded:")
        group.process.send_signal(signal.SIGHUP)
        group.wait_for("reloaded:", reloaded + 2)
        for worker in (0, 1):
            with group.connect_to(worker) as conn:
                _, notices = _noised(conn, f"SELECT COUNT(*) FROM adult WHERE age > {60 + worker}")
                assert "ε charged 0.5" in notices[0]
    finally:
        group.config.write_text(text)
        reloaded = group.count("reloaded:")
        group.process.send_signal(signal.SIGHUP)
        group.wait_for("reloaded:", reloaded + 2)


def test_a_killed_worker_is_started_again(group: Group):
    (victim, *_) = group.workers()
    serving_again = group.count("is serving again")
    victim.kill()
    group.wait_for("is serving again", serving_again + 1, timeout=60)
    assert victim.pid not in [w.pid for w in group.workers()] and len(group.workers()) == 2
    with group.connect_to(0) as a, group.connect_to(1) as b:
        assert a.execute("SELECT 1").fetchone() == b.execute("SELECT 1").fetchone() == (1,)


# ------------------------------------------------------------------ starting and stopping


def _started(test_db: TestDatabase, tmp_path: Path) -> Group:
    config = tmp_path / "policy.yaml"
    _write_policy(config, test_db)
    return Group(config)


def _gone(processes: list[psutil.Process], timeout: float = 30) -> bool:
    _, alive = psutil.wait_procs(processes, timeout=timeout)
    return not alive


def test_sigterm_stops_every_worker_and_cleans_up(test_db: TestDatabase, tmp_path: Path):
    running = _started(test_db, tmp_path)
    workers = running.workers()
    command = workers[0].cmdline()
    directory = Path(command[command.index("--directory") + 1])
    assert (directory / "repeats.sqlite3").exists()
    assert running.port_file.exists()
    assert running.stop() == 0
    assert _gone(workers, 5)
    assert "dpproxy stopped" in running.output()
    assert not directory.exists() and not running.port_file.exists()


def test_the_workers_stop_when_the_supervisor_is_killed(test_db: TestDatabase, tmp_path: Path):
    running = _started(test_db, tmp_path)
    workers = running.workers()
    running.process.kill()
    running.process.wait(timeout=10)
    assert _gone(workers, 30)
    assert running.count("the supervisor is gone") == 2


def test_a_startup_failure_is_told_once(test_db: TestDatabase, tmp_path: Path):
    config = tmp_path / "policy.yaml"
    _write_policy(config, test_db)
    config.write_text(config.read_text().replace(test_db.service_dsn, "postgresql://nobody@127.0.0.1:1/nowhere"))
    result = subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "-c", str(config)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    told = [line for line in result.stderr.splitlines() if line.startswith("dpproxy: ")]
    assert len(told) == 1 and "cannot reach the backend at 127.0.0.1:1" in told[0], result.stderr
    assert "dsn in " in told[0]


def test_a_port_another_program_listens_on_is_refused(test_db: TestDatabase, tmp_path: Path):
    config = tmp_path / "policy.yaml"
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        _write_policy(config, test_db, port=port)
        result = subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "-c", str(config)],
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert f"dpproxy: cannot listen on 127.0.0.1:{port}: address already in use" in result.stderr


def test_listen_workers_must_be_between_1_and_64(test_db: TestDatabase, tmp_path: Path):
    config = tmp_path / "policy.yaml"
    _write_policy(config, test_db)
    config.write_text(config.read_text().replace("workers: 2", "workers: 65"))
    result = subprocess.run([sys.executable, "-m", "proxy.cli", "check-config", "--file-only", str(config)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "listen.workers" in result.stderr

