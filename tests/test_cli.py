"""The dpproxy command as users run it: serve -c, and the demo's contract."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest

from conftest import TEST_POLICY, TestDatabase, psql_path


LISTENING = re.compile(r"dpproxy listening on (.*):(\d+) for database ")


def _listening_port(output: str) -> int:
    """The port in serve's documented "dpproxy listening on HOST:PORT for database NAME" line."""
    found = LISTENING.search(output)
    assert found, f"no listening line in:\n{output}"
    return int(found.group(2))


def _start(args: list[str], ready: str, timeout: float = 120) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    output = []
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        output.append(line)
        if ready in line:
            return process, "".join(output)
    process.kill()
    raise AssertionError("did not become ready:\n" + "".join(output))


def _start_serving(config: Path, *options: str) -> tuple[subprocess.Popen[str], int]:
    """``dpproxy serve -c config --port 0 *options``, once listening, and the port it bound."""
    process, output = _start(["serve", "-c", str(config), "--port", "0", *options], "listening on")
    return process, _listening_port(output)


def _psql(port: int, database: str, sql: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [psql_path(), "-X", "-At", f"host=127.0.0.1 port={port} dbname={database} user=analyst", "-c", sql],
        capture_output=True, text=True, env={**os.environ, "PGPASSWORD": "analyst"}, timeout=60,
    )


def _postgres_running_in(data_dir: Path) -> bool:
    needle = str(data_dir)
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if proc.info["name"] == "postgres" and any(needle in part for part in proc.info["cmdline"] or []):
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


def test_serve_answers_in_front_of_a_postgres_given_by_dsn(test_db: TestDatabase, tmp_path: Path):
    config = tmp_path / "policy.yaml"
    config.write_text(TEST_POLICY.format(dsn=test_db.service_dsn, ledger=tmp_path / "l.sqlite3"))
    process, port = _start_serving(config)
    try:
        result = _psql(port, "dpproxy_test", "SELECT COUNT(*) FROM adult")
        assert result.returncode == 0, result.stderr
        assert int(result.stdout) > 40000
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    assert process.stdout is not None
    # Each connection's line, at INFO, in the configured format (records leave out the source
    # location, thread and process the format does not name: proxy.cli.main.configure_logging).
    assert re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO dpproxy\.session: session 127\.0\.0\.1:\d+ "
                     r"user=analyst connected$", process.stdout.read(), re.MULTILINE)


def _answers(host: str, port: int) -> int:
    """The number of rows ``dpproxy`` at (host, port) gives analyst for a catalog query."""
    with psycopg.connect(host=host, port=port, dbname="dpproxy_test", user="analyst", password="analyst",
                         autocommit=True, connect_timeout=20) as conn:
        return len(conn.execute("SELECT 1").fetchall())


def test_port_0_on_every_address_is_one_port_that_the_listening_line_tells(test_db: TestDatabase, tmp_path: Path):
    # listen.host "" is every IPv4 and every IPv6 address: asyncio bound each with a port of its
    # own, and the listening line told only the IPv4 one, so an IPv6 client found nothing there.
    config = tmp_path / "policy.yaml"
    config.write_text(TEST_POLICY.format(dsn=test_db.service_dsn, ledger=tmp_path / "l.sqlite3")
                      .replace("listen: {host: 127.0.0.1, port: 0}", 'listen: {host: "", port: 0}'))
    process, port = _start_serving(config)
    try:
        assert port > 0
        assert _answers("127.0.0.1", port) == _answers("::1", port) == 1
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0


def test_the_port_file_appears_once_the_port_accepts_and_goes_when_serve_stops(test_db: TestDatabase,
                                                                               tmp_path: Path):
    config, port_file = tmp_path / "policy.yaml", tmp_path / "run" / "dpproxy.port"
    config.write_text(TEST_POLICY.format(dsn=test_db.service_dsn, ledger=tmp_path / "l.sqlite3"))
    port_file.parent.mkdir()
    process = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "-c", str(config), "--port", "0",
                                "--port-file", str(port_file)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():  # what a script does: wait for the file, then connect at once
            assert process.poll() is None and time.monotonic() < deadline, "serve ended or never wrote the file"
            time.sleep(0.01)
        text = port_file.read_text()
        assert re.fullmatch(r"[1-9]\d*\n", text), text  # whole: written beside it and renamed
        port = int(text)
        with socket.create_connection(("127.0.0.1", port), timeout=20):
            pass  # no wait, no retry: the port accepted before the file appeared
        assert _answers("127.0.0.1", port) == 1
        assert [entry.name for entry in port_file.parent.iterdir()] == ["dpproxy.port"]  # no temporary left
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert _listening_port(output) == port
    assert not port_file.exists()


def test_log_records_leave_out_what_the_format_does_not_name():
    script = """
import logging
from proxy.cli.main import configure_logging
configure_logging(False, "%(message)s")
records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger().addHandler(handler)
logging.getLogger("dpproxy.session").info("session %s connected", "peer")
(record,) = records
print(record.getMessage(), record.lineno, record.thread, record.process, record.processName)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (result.stdout, result.stderr) == ("session peer connected 0 None None None\n", "session peer connected\n")


def test_serve_refuses_a_policy_that_does_not_match_the_backend(test_db: TestDatabase, tmp_path: Path):
    config = tmp_path / "policy.yaml"
    config.write_text(TEST_POLICY.format(dsn=test_db.service_dsn, ledger=tmp_path / "l.sqlite3")
                      .replace("hours_per_week: {bounds", "hours_per_wek: {bounds"))
    result = subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "-c", str(config), "--port", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "tables.public.adult.columns.hours_per_wek: no such column on the backend" in result.stderr


@pytest.fixture
def demo_dir() -> Iterator[Path]:
    """A demo data directory outside /tmp/pytest-of-root (see conftest's pg_admin_dsn)."""
    data_dir = Path(tempfile.mkdtemp(prefix="dpproxy-test-demo-"))
    try:
        yield data_dir
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _demo_port(banner: str) -> int:
    """The port the demo's banner tells the newcomer to connect to."""
    found = re.search(r'psql "host=127\.0\.0\.1 port=(\d+) dbname=demo user=analyst"', banner)
    assert found, banner
    return int(found.group(1))


def test_demo_contract_ctrl_c_and_restart_after_a_crash(demo_dir: Path):
    data_dir, port_file = demo_dir, demo_dir / "port"
    args = ["demo", "--data-dir", str(data_dir), "--port", "0", "--port-file", str(port_file)]
    process, banner = _start(args, "Press Ctrl-C")
    try:
        # --port 0: the banner tells the port the kernel chose, not 0, and so does --port-file.
        port = _demo_port(banner)
        assert port > 0 and f"serving the adult table on 127.0.0.1:{port} " in banner
        assert port_file.read_text() == f"{port}\n"
        # The banner names the demo's PostgreSQL, which draft-policy reads as a newcomer's own database.
        found = re.search(r"Its PostgreSQL, as dpproxy's service role: (\S+)", banner)
        assert found, banner
        draft = subprocess.run([sys.executable, "-m", "proxy.cli", "draft-policy", "--dsn", found.group(1)],
                               capture_output=True, text=True, timeout=60)
        assert draft.returncode == 0 and "public.adult:" in draft.stdout, draft.stderr
        result = _psql(port, "demo", "SELECT COUNT(*) FROM adult WHERE age > 40")
        assert result.returncode == 0, result.stderr
        assert 15000 < int(result.stdout) < 25000
        assert "ε charged 1" in result.stderr
    finally:
        process.send_signal(signal.SIGINT)
        rest, _ = process.communicate(timeout=30)
        assert process.returncode == 0
    assert not _postgres_running_in(data_dir)
    # The audit log goes to the demo's file, not into the terminal the newcomer watches.
    audited = [json.loads(line) for line in (data_dir / "audit.jsonl").read_text().splitlines()]
    assert [entry["decision"] for entry in audited] == ["dp"] and '"fingerprint"' not in rest

    assert not port_file.exists()

    # A crash leaves PostgreSQL running; the next demo must take over cleanly.
    process, _ = _start(args, "Press Ctrl-C")
    process.kill()
    process.wait(timeout=10)
    process, banner = _start(args, "Press Ctrl-C")
    try:
        assert _psql(_demo_port(banner), "demo", "SELECT COUNT(*) FROM adult").returncode == 0
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    assert not _postgres_running_in(data_dir)


def test_a_second_demo_on_the_data_directory_of_a_running_one_is_refused(demo_dir: Path):
    # It rewrote the running demo's policy.yaml with its own port, and shared (then stopped) its PostgreSQL.
    process, banner = _start(["demo", "--data-dir", str(demo_dir), "--port", "0"], "Press Ctrl-C")
    port = _demo_port(banner)
    try:
        policy = (demo_dir / "policy.yaml").read_text()
        second = subprocess.run([sys.executable, "-m", "proxy.cli", "demo", "--data-dir", str(demo_dir),
                                 "--port", "0"], capture_output=True, text=True, timeout=60)
        assert second.returncode == 1
        assert second.stderr == (f"dpproxy: a dpproxy demo is already running on the data directory {demo_dir} "
                                 f"(pid {process.pid}) — stop that demo first, or choose another --data-dir\n")
        assert (demo_dir / "policy.yaml").read_text() == policy
        assert _psql(port, "demo", "SELECT COUNT(*) FROM adult").returncode == 0  # the first serves on
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    assert not _postgres_running_in(demo_dir)
